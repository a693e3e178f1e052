"""The tree's own build (what README's `pip install -e` makes) points at nothing outside the
tree but the interpreter's own folder. pip's editable install builds in a temporary
environment with a TensorFlow of its own, and a run path into its folder, gone once the build
is done, would load whatever anyone puts there later; the libraries need no path to TF, as
only a process whose TF is loaded loads them (setup.py, BuildNative.build_paths)."""
import glob
import os
import sysconfig

from elf import run_paths_outside_origin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(sysconfig.get_paths()["purelib"], "tensorflow-plugins", "librdmadev_plugin.so")


def test_the_trees_libraries_and_its_tf_plugin_have_no_run_path_outside_the_tree():
    libs = glob.glob(os.path.join(ROOT, "rdmadev", "**", "*.so"), recursive=True)
    assert len(libs) > 5, libs
    for lib in libs + ([PLUGIN] if os.path.exists(PLUGIN) else []):
        outside = run_paths_outside_origin(lib)
        assert not outside, f"{lib}: run path {outside}"
