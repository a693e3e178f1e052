"""What rdmadev's TF plugin costs `import tensorflow`, in every TF process once rdmadev is
installed (site-packages/tensorflow-plugins/librdmadev_plugin.so).

    python benchmarks/plugin_import.py [--rounds 7]

Two figures, each a median over `--rounds` with its spread:
- `plugin load`: in one process, TF imported with the plugin switched off (RDMADEV_PLUGIN=0),
  then a copy of the plugin loaded the way TF loads it (tf.load_library) with the switch on:
  the loader's version check and the protocol library's load and registration, timed alone.
- `import tensorflow`: fresh interpreters importing TensorFlow, plugin on and off in
  alternating rounds (the whole import, for scale: its noise is far larger than the plugin).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TIME_PLUGIN = """
import json, os, sys, time
import tensorflow as tf
os.environ["RDMADEV_PLUGIN"] = "1"
t = time.perf_counter()
tf.load_library(sys.argv[1])
took = time.perf_counter() - t
maps = open("/proc/self/maps").read()
print(json.dumps({"ms": took * 1e3, "loaded": "_tf_protocol.so" in maps}))
"""
TIME_IMPORT = "import time; t = time.perf_counter(); import tensorflow; print(time.perf_counter() - t)"


def spread(xs, unit):
    xs = sorted(xs)
    return (f"median {statistics.median(xs):8.2f} {unit}  min {xs[0]:8.2f}  max {xs[-1]:8.2f}  "
            f"({len(xs)} runs)")


def run(code, *args, plugin="1"):
    env = {**os.environ, "RDMADEV_PLUGIN": plugin}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=env, timeout=300, check=True).stdout
    return out.strip().splitlines()[-1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    from rdmadev.tf import protocol

    installed = protocol.plugin_path()
    if installed is None:
        sys.exit("rdmadev's TF plugin is not installed for this interpreter (pip install -e .)")
    tmp = tempfile.mkdtemp(prefix="rdmadev_plugin_")
    try:
        # A copy under another name: the installed one is switched off in these processes.
        copy = shutil.copy(installed, os.path.join(tmp, "librdmadev_plugin_copy.so"))
        loads, on, off = [], [], []
        for _ in range(args.rounds):
            r = json.loads(run(TIME_PLUGIN, copy, plugin="0"))
            if not r["loaded"]:
                sys.exit("the plugin copy did not load the protocol library")
            loads.append(r["ms"])
            on.append(float(run(TIME_IMPORT, plugin="1")) * 1e3)
            off.append(float(run(TIME_IMPORT, plugin="0")) * 1e3)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"rdmadev TF plugin: {installed}")
    print(f"  plugin load                    {spread(loads, 'ms')}")
    print(f"  import tensorflow, plugin on   {spread(on, 'ms')}")
    print(f"  import tensorflow, plugin off  {spread(off, 'ms')}")
    print(f"  plugin load / import: {statistics.median(loads) / statistics.median(off) * 100:.2f} %")


if __name__ == "__main__":
    main()
