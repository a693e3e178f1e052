"""What `pip install rdmadev` gives a user: a source distribution of this tree, the wheel pip
builds from it, installed into a fresh virtualenv that cannot see the tree or its editable
install, runs the main job from outside the tree and goes away with `pip uninstall`.

The virtualenv reaches this interpreter's other packages (TensorFlow, numpy, networkx, ...)
through a folder of links named `site-packages`, as TF looks for its plugins only when it runs
from a folder of that name; the folder leaves out rdmadev, its editable finder and its
`tensorflow-plugins/`, so the only rdmadev the job can load is the wheel's.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

from elf import run_paths_outside_origin

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Compiling the native library and the bindings: ~1.5 min on 2 idle cores, for the sdist
#: (setup.py imports TF) and again for the wheel; many times that on a loaded machine.
BUILD_TIMEOUT_S = 1800
#: Three TF servers on 2 cores plus two traces (tests/test_example.py's allowance).
JOB_TIMEOUT_S = 600
PLUGIN = "tensorflow-plugins/librdmadev_plugin.so"
#: What a fresh environment must not see of this interpreter's site-packages.
_NOT_LINKED = re.compile(r"^(rdmadev|__editable__|graph_pass|tensorflow-plugins$|.*\.pth$)")


def _run(cmd, timeout, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, f"{cmd}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def _tracked(prefixes):
    """The tree's tracked files under `prefixes` (the working copy's, edits included; one
    deleted and not yet committed is left out)."""
    out = _run(["git", "ls-files", "-z", *prefixes], 60, cwd=ROOT).stdout
    return [f for f in out.split("\0") if f and os.path.lexists(os.path.join(ROOT, f))]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """The source distribution, built from a copy of the tracked files (the build writes
    build/ and never touches this tree's in-place libraries, which other tests load)."""
    if not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("builds from the tracked files of a git checkout")
    base = tmp_path_factory.mktemp("sdist")
    src = base / "src"
    for f in _tracked([]):
        dst = src / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), dst, follow_symlinks=False)
    # Without isolation: this interpreter's TF (`tensorflow`, where pyproject's build
    # requirement names the same build's `tensorflow-cpu`) and Cython serve the build.
    _run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--skip-dependency-check",
          "-o", str(base / "dist"), str(src)], BUILD_TIMEOUT_S)
    (path,) = glob.glob(str(base / "dist" / "rdmadev-*.tar.gz"))
    return path


@pytest.fixture(scope="module")
def wheel(sdist, tmp_path_factory):
    """The wheel pip builds from the sdist (what `pip install rdmadev-<version>.tar.gz` does)."""
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(out), sdist], BUILD_TIMEOUT_S)
    (path,) = glob.glob(str(out / "rdmadev-*.whl"))
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A virtualenv with the wheel installed; returns (python, its site-packages)."""
    base = tmp_path_factory.mktemp("venv")
    others = base / "deps" / "site-packages"
    others.mkdir(parents=True)
    for folder in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for name in os.listdir(folder):
            if not _NOT_LINKED.match(name) and not (others / name).exists():
                (others / name).symlink_to(os.path.join(folder, name))
    env_dir = base / "env"
    _run([sys.executable, "-m", "venv", str(env_dir)], 300)
    python = str(env_dir / "bin" / "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                60).stdout.strip()
    with open(os.path.join(site, "others.pth"), "w") as f:
        f.write(f"{others}\n")
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], 600)
    return python, site


def _in_venv(python):
    """Environment of a process of the virtualenv: its bin first, nothing of this tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    return env


def test_the_sdist_holds_every_source_the_build_needs(sdist):
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    needed = _tracked(["_native", "rdmadev", "graph_pass"]) + [
        "setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE"]
    assert len(needed) > 100, needed
    assert sorted(set(needed) - names) == [], "left out of the sdist (MANIFEST.in?)"
    assert not [n for n in names if n.endswith((".so", ".o"))], sorted(names)


def test_the_wheel_holds_every_module_every_library_and_the_tf_plugin(wheel):
    with zipfile.ZipFile(wheel) as w:
        names = set(w.namelist())
        entry_points = w.read(
            next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert PLUGIN in names, sorted(names)
    modules = [f for f in _tracked(["rdmadev", "graph_pass"]) if f.endswith(".py")]
    assert len(modules) > 20, modules
    missing = [f for f in modules if f not in names]
    assert not missing, f"modules left out of the wheel (pyproject's packages?): {missing}"
    # Every library the in-place build made, at the same place in the package.
    libs = glob.glob(os.path.join(ROOT, "rdmadev", "**", "*.so"), recursive=True)
    built = [os.path.relpath(p, ROOT) for p in libs]
    assert built, "the tree has no in-place build to compare with"
    assert sorted(set(built) - names) == [], sorted(names)
    assert re.search(r"^rdmadev = rdmadev\.tools\.cli:main$", entry_points, re.M), entry_points


def test_the_wheels_libraries_point_at_nothing_of_the_machine_it_was_built_on(venv):
    """Run paths are $ORIGIN-relative (TF beside rdmadev in site-packages): pip builds in a
    temporary folder, and a run path into it would load whatever is there later."""
    _, site = venv
    libs = glob.glob(os.path.join(site, "rdmadev", "**", "*.so"), recursive=True)
    assert len(libs) > 5, libs
    for lib in libs:
        outside = run_paths_outside_origin(lib)
        assert not outside, f"{lib}: run path {outside}"


def test_installed_wheel_loads_its_own_libraries_through_tensorflows_plugin(venv, tmp_path):
    python, site = venv
    probe = (
        "from rdmadev.tf.startup import import_tensorflow\n"
        "tf = import_tensorflow()\n"  # TF loads the plugin; the plugin loads the protocol
        "import rdmadev, graph_pass\n"
        "print('module', rdmadev.__file__)\n"
        "print('module', graph_pass.__file__)\n"
        "for p in sorted({l.split()[-1] for l in open('/proc/self/maps') if 'rdmadev' in l}):\n"
        "    print('mapped', p)\n")
    out = _run([python, "-c", probe], JOB_TIMEOUT_S, cwd=tmp_path,
               env=_in_venv(python)).stdout
    paths = re.findall(r"^(?:module|mapped) (.*)$", out, re.M)
    assert all(p.startswith(site) for p in paths), out
    for lib in (PLUGIN, "rdmadev/_tf_protocol.so", "rdmadev/librdmadev_core.so"):
        assert f"mapped {os.path.join(site, lib)}" in out, out


def test_main_job_runs_from_the_installed_wheel_matches_grpc_and_exits_quietly(venv, tmp_path):
    python, _ = venv
    shutil.copy(os.path.join(ROOT, "examples", "train_pss.py"), tmp_path)
    p = _run([python, "train_pss.py", "--steps", "8"], JOB_TIMEOUT_S, cwd=tmp_path,
             env=_in_venv(python))
    assert "losses and weights identical to TF's gRPC path: yes" in p.stdout, p.stdout
    ran = re.findall(r"on /job:worker/replica:0/task:\d\): (.*)$", p.stdout, re.M)
    assert ran and set(ran) == {"11 transfers swapped, 0 stayed on gRPC"}, p.stdout
    assert "cluster stopped" in p.stdout
    # Nothing TF logs at warning level or above, no cuInit error (rdmadev/tf/startup.py).
    assert not re.search(r"^[WEF]\d{4} |failed call to cuInit", p.stderr, re.M), p.stderr[-3000:]


def test_doctor_names_the_wheels_libraries_and_uninstall_removes_the_plugin(venv, tmp_path):
    python, site = venv
    env = _in_venv(python)
    doctor = _run([os.path.join(os.path.dirname(python), "rdmadev"), "doctor"], JOB_TIMEOUT_S,
                  cwd=tmp_path, env=env)
    # The op library and TF's plugin it checks are the wheel's.
    assert re.search(rf"op library +: loads.*\({re.escape(site)}/rdmadev/_tf_ops\.so\)",
                     doctor.stdout), doctor.stdout
    assert re.search(rf"tf plugin +: grpc\+rdmadev registered at import tensorflow "
                     rf"\({re.escape(os.path.join(site, PLUGIN))}\)", doctor.stdout), doctor.stdout
    assert doctor.stdout.rstrip().endswith("healthy"), doctor.stdout
    # With its protocol library gone, the plugin names the one place it looks (beside it),
    # never the folder the wheel was built in.
    protocol_lib = os.path.join(site, "rdmadev", "_tf_protocol.so")
    os.rename(protocol_lib, protocol_lib + ".aside")
    try:
        r = _run([python, "-c", "import tensorflow"], JOB_TIMEOUT_S, cwd=tmp_path, env=env)
    finally:
        os.rename(protocol_lib + ".aside", protocol_lib)
    assert f"rdmadev is not installed at {protocol_lib} any more" in r.stderr, r.stderr[-3000:]
    _run([python, "-m", "pip", "uninstall", "-y", "-q", "rdmadev"], 300, env=env)
    assert not os.path.exists(os.path.join(site, PLUGIN))
    assert not os.path.exists(os.path.join(site, "rdmadev"))
    gone = subprocess.run([python, "-c", "import rdmadev"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=env)
    assert gone.returncode != 0 and "No module named 'rdmadev'" in gone.stderr, gone.stderr
