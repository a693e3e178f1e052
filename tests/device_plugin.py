"""RDMADEV_TEST, the test suite's own PluggableDevice (tests/devices/; test_device.h says what it
is): on these CPU-only machines it gives TensorFlow a device that is not the CPU, whose memory is
host memory and whose copies are memcpys, with float32 kernels for a small training step (MatMul,
Relu, ReluGrad, Square, AddV2, Sub, Mul, Sum) and Identity for numeric dtypes. Ops without a kernel
there fall to the CPU by TF's soft placement. For tests only; nothing ships it.

A PluggableDevice loads when TensorFlow initializes its devices, so only a fresh process can
have it: build it, then start the process with env()::

    device_plugin.build(tmp_path)
    subprocess.run([sys.executable, "-c", code], env=device_plugin.env(tmp_path))
    # in `code`: with tf.device("/device:RDMADEV_TEST:0"): ...

or take the session fixture: `device_env = device_plugin.device_env` in a test module.

build() compiles once per machine and source version: the .so is cached under
$XDG_CACHE_HOME/rdmadev-test-device/<hash>/ (default ~/.cache), the hash covering the sources,
the TF version and TF's location. A cache miss took 5-7 s on the shared 2-core dev box (~4 s
for a fresh python to import TF and print tf.sysconfig's flags, ~1.2 s of g++ -O2); a hit is a
~1 ms file copy.
"""
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

#: The device type the plugin registers; its device is /device:RDMADEV_TEST:0.
DEVICE_TYPE = "RDMADEV_TEST"
DEVICE = f"/device:{DEVICE_TYPE}:0"
LIBRARY = "librdmadev_test_device.so"
SOURCES = sorted((Path(__file__).resolve().parent / "devices").glob("*.cc"))
HEADERS = sorted((Path(__file__).resolve().parent / "devices").glob("*.h"))
# A fresh `import tensorflow` (3-6 s here) plus g++, with room for a loaded machine.
BUILD_TIMEOUT_S = 180


def _cache_root():
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rdmadev-test-device"


def _key():
    spec = importlib.util.find_spec("tensorflow")
    if spec is None:
        raise RuntimeError("device_plugin: TensorFlow is not installed; the RDMADEV_TEST device needs it")
    h = hashlib.sha256()
    h.update(importlib.metadata.version("tensorflow").encode() + b"\0")
    h.update(str(spec.submodule_search_locations[0]).encode() + b"\0")
    for src in SOURCES + HEADERS:
        h.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _compile(out):
    flags = subprocess.run(
        [sys.executable, "-c", "import json, tensorflow as tf; "
         "print(json.dumps([tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()]))"],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if flags.returncode != 0:
        raise RuntimeError("device_plugin: could not read tf.sysconfig's flags:\n" + flags.stderr[-2000:])
    compile_flags, link_flags = json.loads(flags.stdout.splitlines()[-1])
    cmd = ["g++", "-O2", "-shared", "-fPIC", "-Wall", *compile_flags, *map(str, SOURCES), "-o", str(out),
           *link_flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"device_plugin: compiling the RDMADEV_TEST device failed:\n{' '.join(cmd)}\n"
                           + proc.stderr[-4000:])


def build(out_dir):
    """Put the plugin at `out_dir`/site-packages/tensorflow-plugins/librdmadev_test_device.so,
    compiling it only when the cache has no build of these sources for this TensorFlow.

    Returns:
        The path of the .so in `out_dir`.
    """
    cached = _cache_root() / _key() / LIBRARY
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".so.tmp")
        os.close(fd)
        try:
            _compile(tmp)
            os.replace(tmp, cached)  # atomic: a concurrent build writes the same bytes
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    plugins = Path(out_dir) / "site-packages" / "tensorflow-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached, plugins / LIBRARY)
    return plugins / LIBRARY


def env(out_dir, base=None):
    """The environment (`base`, default os.environ, plus PYTHONPATH) of a process that loads the
    plugin built into `out_dir`: TF loads tensorflow-plugins/ of every sys.path entry named
    site-packages, so `out_dir`/site-packages goes first on PYTHONPATH."""
    base = dict(os.environ if base is None else base)
    paths = [str(Path(out_dir) / "site-packages")] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**base, "PYTHONPATH": os.pathsep.join(paths)}


@pytest.fixture(scope="session")
def device_env(tmp_path_factory):
    """The environment of a process with RDMADEV_TEST (built once per session, cached per machine)."""
    out = tmp_path_factory.mktemp("rdmadev-test-device")
    build(out)
    return env(out)
