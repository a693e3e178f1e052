"""rdmadev/tf/startup.py: TensorFlow imported by rdmadev's programs without the start-up lines
TF_CPP_MIN_LOG_LEVEL does not reach, in fresh interpreters importing the real TF."""
import importlib.util
import os
import subprocess
import sys
import textwrap

from rdmadev.tf.startup import startup_lines_kept

#: What TF 2.21 printed while it loaded on this machine (no CUDA driver), TF_CPP_MIN_LOG_LEVEL 0.
PRINTED = textwrap.dedent("""\
    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1795916373.640864   13532 port.cc:153] oneDNN custom operations are on.
    I0000 00:00:1795916373.641320   13532 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
    rdmadev: TF plugin left inactive: why (set RDMADEV_PLUGIN=0 to silence this)
    W0000 00:00:1795916375.587563   13532 some.cc:1] a warning
    E0000 00:00:1795916375.616461   13532 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
    E0000 00:00:1795916375.616462   13532 other.cc:2] another error
    """)
#: Seconds a fresh interpreter may take to import TF on a loaded 2-core machine.
IMPORT_TIMEOUT_S = 300


def test_the_level_drops_what_it_names_and_no_driver_drops_the_cuinit_error():
    kept = startup_lines_kept(PRINTED, 2).splitlines()
    assert kept == [PRINTED.splitlines()[0], PRINTED.splitlines()[3], PRINTED.splitlines()[6]]
    everything_but_cuinit = [l for l in PRINTED.splitlines() if "cuInit" not in l]
    assert startup_lines_kept(PRINTED, 0).splitlines() == everything_but_cuinit
    assert startup_lines_kept(PRINTED, 3).splitlines() == [PRINTED.splitlines()[3]]  # no banner


def test_a_cuinit_error_with_a_driver_present_is_kept():
    with_driver = PRINTED.replace("Could not find cuda drivers", "Found cuda drivers")
    assert "cuInit" in startup_lines_kept(with_driver, 2)


def _fresh(code, level, path=None):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": level}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=IMPORT_TIMEOUT_S, env=env)


def test_tensorflow_imported_at_level_2_prints_nothing():
    """The real import: nothing on stderr where plain `import tensorflow` prints TF's lines."""
    plain = _fresh("import tensorflow", "2")
    quiet = _fresh("from rdmadev.tf.startup import import_tensorflow as i; "
                   "print(i().__version__, i() is i())", "2")
    assert plain.returncode == 0 and quiet.returncode == 0, quiet.stderr
    version, same = quiet.stdout.split()
    assert version.startswith("2.") and same == "True", quiet.stdout
    if "Could not find cuda drivers" in plain.stderr:  # a machine without CUDA, as CI's
        assert "cuInit" in plain.stderr
    messages = lambda text: [line.split("] ", 1)[-1] for line in text.splitlines()]  # no times
    assert messages(startup_lines_kept(plain.stderr, 2)) == messages(quiet.stderr), quiet.stderr


def test_tensorflow_outside_site_packages_prints_nothing_at_its_first_op_either(tmp_path):
    """TF run from a folder not named site-packages (PYTHONPATH, a Bazel build) loads no
    plugins during its import and so looks for CUDA only when it first lists the devices."""
    (tmp_path / "tensorflow").symlink_to(
        os.path.dirname(importlib.util.find_spec("tensorflow").origin))
    probe = ("from rdmadev.tf.startup import import_tensorflow; tf = import_tensorflow(); "
             "print(tf.__file__); "
             "print(any('librdmadev_plugin' in l for l in open('/proc/self/maps'))); "
             "tf.constant(1.0) + 1.0")
    plain = _fresh(probe.replace("import_tensorflow()", "__import__('tensorflow')"), "2",
                   path=str(tmp_path))
    quiet = _fresh(probe, "2", path=str(tmp_path))
    assert plain.returncode == 0 and quiet.returncode == 0, quiet.stderr
    where, plugins = quiet.stdout.split()
    assert where.startswith(str(tmp_path)) and plugins == "False", quiet.stdout  # TF's other path
    if "Could not find cuda drivers" in plain.stderr:  # a machine without CUDA, as CI's
        assert "cuInit" in plain.stderr  # printed at the first op, past the import
    assert quiet.stderr == "", quiet.stderr


def test_an_import_that_fails_shows_all_it_printed(tmp_path):
    broken = tmp_path / "tensorflow"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        "import os\n"
        "os.write(2, b'I0000 00:00:1.0 1 x.cc:1] an info line\\n')\n"
        "raise ImportError('libtensorflow_framework.so.2: cannot open shared object file')\n")
    r = _fresh("from rdmadev.tf.startup import import_tensorflow; import_tensorflow()", "2",
               path=str(tmp_path))
    assert r.returncode != 0
    assert "an info line" in r.stderr and "cannot open shared object file" in r.stderr, r.stderr
