"""Builds rdmadev's native layer.

librdmadev_core.so is the C++ core (regions, fabrics, completion, channels). It is a
plain shared library so that every consumer in a process (the Cython bindings
rdmadev._core, and the TensorFlow op library) links the same copy and shares one
registry of regions and fabrics. Python extensions find it through an $ORIGIN rpath.
"""
import functools
import glob
import os
import shutil
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # importing TF for its flags is noisy
# Importing TF for its flags would load an installed rdmadev plugin into this process, which
# may be about to replace it.
os.environ["RDMADEV_PLUGIN"] = "0"
CORE = os.path.join("_native", "core")
CORE_SOURCES = [
    os.path.join(CORE, f)
    for f in ("common.cc", "hmac.cc", "sockio.cc", "handshake.cc", "region.cc", "arena.cc",
              "completion.cc", "fabric.cc", "acceptor.cc", "domain.cc", "channel.cc", "stage.cc",
              "registry.cc", "bench.cc",
              os.path.join("shm", "shm.cc"), os.path.join("shm", "shm_factory.cc"),
              os.path.join("tcp", "frame.cc"), os.path.join("tcp", "tcp.cc"),
              os.path.join("tcp", "tcp_factory.cc"), os.path.join("verbs", "verbs_factory.cc"),
              os.path.join("verbs", "ibv_lib.cc"), os.path.join("verbs", "verbs_device.cc"),
              os.path.join("verbs", "verbs_memory.cc"), os.path.join("verbs", "verbs_qp.cc"),
              os.path.join("verbs", "verbs_send_queue.cc"), os.path.join("verbs", "verbs_endpoint.cc"),
              os.path.join("verbs", "verbs.cc"))
]
# Every extension depends on every core header: distutils rebuilds only when a listed file
# is newer, and a stale object built against an old class layout crashes at run time.
HEADERS = sorted(glob.glob(os.path.join("_native", "**", "*.h"), recursive=True))
CXXFLAGS = ["-std=c++17", "-O2", "-fvisibility=default", "-Wall", "-Wno-unused-parameter"]
BINDINGS = os.path.join("_native", "python", "rdmadev", "_native")
BINDING_FAMILIES = ("handle", "domain", "region", "endpoint", "channel", "registry", "crypto",
                    "bench", "rules")
# The TF-facing code, one folder per library: the partition pass (pass/) and the kernels
# (kernels/) make the op library, plugin/ the protocol library and its loader; the headers
# both of the first two include (labelled.h, tf_status.h) sit in TF_DIR itself.
TF_DIR = os.path.join("_native", "tf")
# The partition pass's rules (pass/rules.h), which the planner asks through the "rules" bindings.
PASS_DIR = os.path.join(TF_DIR, "pass")
KERNELS_DIR = os.path.join(TF_DIR, "kernels")
TF_PLUGIN_DIR = os.path.join(TF_DIR, "plugin")
CORE_LIB = "librdmadev_core.so"
TF_OPS_LIB = "_tf_ops.so"
TF_PROTOCOL_LIB = "_tf_protocol.so"
# The loader TensorFlow loads from site-packages/tensorflow-plugins/ at `import tensorflow`
# (plugin_loader.cc); it registers the grpc+rdmadev protocol and nothing else.
PLUGIN_LIB = "librdmadev_plugin.so"
PLUGIN_DIR = "tensorflow-plugins"
# Extensions that do not link the core: the protocol library and its loader start nothing.
WITHOUT_CORE = ("rdmadev._tf_protocol", "rdmadev.librdmadev_plugin")
BUILD_INFO = os.path.join("rdmadev", "_build_info.py")
# Extensions that link libtensorflow_framework, and the loader (plugin_loader.cc), whose
# fallback to the in-place build's package folder is compiled in: where they look depends on
# the build (BuildNative.build_paths).
LINKS_TF = ("rdmadev._tf_ops", "rdmadev._tf_protocol")
LOADER = "rdmadev.librdmadev_plugin"


class BuildNative(build_ext):
    """Builds the core library first, then the extensions that link it."""

    def get_ext_filename(self, fullname):
        # distutils asks with the full dotted name or with its last part only.
        parts = fullname.split(".")
        if parts[-1] == "librdmadev_core":
            return os.path.join(*parts[:-1], CORE_LIB)
        if parts[-1] == "_tf_ops":
            return os.path.join(*parts[:-1], TF_OPS_LIB)
        if parts[-1] == "_tf_protocol":
            return os.path.join(*parts[:-1], TF_PROTOCOL_LIB)
        if parts[-1] == "librdmadev_plugin":
            return os.path.join(*parts[:-1], PLUGIN_LIB)
        return super().get_ext_filename(fullname)

    def run(self):
        # rdmadev._core was an extension module before it became rdmadev/_core.py; a stale
        # _core*.so left in place would shadow the .py (extensions are found first).
        for stale in glob.glob(os.path.join(HERE, "rdmadev", "_core.*.so")):
            os.remove(stale)
        self.for_tree = self.inplace  # setuptools clears self.inplace while building
        super().run()
        self.install_plugin()

    def build_paths(self):
        """(where LINKS_TF find libtensorflow_framework, or None for no run path; the loader's
        package folder). In a wheel: TF beside rdmadev in site-packages, and no folder (the
        loader looks beside itself only): a wheel points at nothing of the machine it was built
        on, as pip builds in a temporary folder that anyone may create again once it is gone.
        For this tree: the tree's rdmadev, and no run path to TF, for the same reason: pip's
        editable install builds against a TF in such a folder too. None is needed: these
        libraries are only ever loaded into a process whose TF has loaded
        libtensorflow_framework already (tf.load_op_library, TF's plugin loading)."""
        if self.for_tree:
            return None, os.path.join(HERE, "rdmadev")
        return "$ORIGIN/../tensorflow", ""

    def build_extensions(self):
        # setuptools compiles with the C compiler's flags; -Wstrict-prototypes is C-only.
        if "-Wstrict-prototypes" in self.compiler.compiler_so:
            self.compiler.compiler_so.remove("-Wstrict-prototypes")
        core = [e for e in self.extensions if e.name == "rdmadev.librdmadev_core"]
        rest = [e for e in self.extensions if e.name != "rdmadev.librdmadev_core"]
        tf_lib, package_dir = self.build_paths()
        for ext in core + rest:
            if ext.name in LINKS_TF and tf_lib:
                ext.extra_link_args = ext.extra_link_args + ["-Wl,-rpath," + tf_lib]
            if ext.name == LOADER:
                ext.extra_compile_args = ext.extra_compile_args + [
                    f'-DRDMADEV_PACKAGE_DIR="{package_dir}"']
            if ext is not core[0] and ext.name not in WITHOUT_CORE:
                libdir = os.path.dirname(self.get_ext_fullpath(core[0].name))
                ext.library_dirs = [libdir]
                ext.runtime_library_dirs = []
                # $ORIGIN-relative, so the tree can move: rdmadev/_native/*.so -> $ORIGIN/..
                rel = os.path.relpath(libdir, os.path.dirname(self.get_ext_fullpath(ext.name)))
                origin = "$ORIGIN" if rel == "." else "$ORIGIN/" + rel
                ext.extra_link_args = ext.extra_link_args + [
                    "-L" + libdir, "-l:" + CORE_LIB, "-Wl,-rpath," + origin]
            self.build_extension(ext)

    def install_plugin(self):
        """Puts the loader where `import tensorflow` looks for plugins. A wheel carries it in
        its root (site-packages/tensorflow-plugins/, removed again by pip uninstall); an
        in-place (editable) build writes it into this interpreter's site-packages."""
        built = self.get_ext_fullpath("rdmadev.librdmadev_plugin")
        if self.inplace:
            target = os.path.join(sysconfig.get_paths()["platlib"], PLUGIN_DIR)
        else:
            target = os.path.join(self.build_lib, PLUGIN_DIR)
        try:
            os.makedirs(target, exist_ok=True)
            # Always replaced (copy_file skips an older source: the one there may be another
            # tree's loader, which points at that tree), and atomically: running TF processes
            # have the old file mapped, and overwriting it in place crashes them.
            # Staged under a name TF does not take for a plugin (no ".so"): TF loads every
            # shared object in that folder, and a half-written one would fail its import.
            staged = os.path.join(target, f".rdmadev_plugin_{os.getpid()}.tmp")
            try:
                shutil.copy(built, staged)
                os.replace(staged, os.path.join(target, PLUGIN_LIB))
            finally:
                if os.path.exists(staged):
                    os.remove(staged)
            print(f"rdmadev: TF plugin loader installed in {target}")
        except OSError as e:
            print(f"rdmadev: could not install the TF plugin into {target} ({e.strerror}); "
                  "the grpc+rdmadev protocol then needs rdmadev.tf.protocol.load()", file=sys.stderr)


# Where the TF extensions find TF's headers: a link, by a path relative to this folder, to the
# include folder of the TF that builds them. pip's isolated build puts that TF in a new
# temporary folder each time, and ccache keys on the header paths a compile names, so with
# TF's own -I path every build compiled the op library again (164 s of an install, 2026-12-05).
TF_INCLUDE_LINK = os.path.join("build", "tf-include")


@functools.lru_cache(maxsize=None)
def tf_compile_flags(tf):
    """TF's compile flags, with its include folder named through TF_INCLUDE_LINK (made once
    a build: both TF extensions take these)."""
    flags = []
    for flag in tf.sysconfig.get_compile_flags():
        if flag.startswith("-I"):
            os.makedirs(os.path.dirname(TF_INCLUDE_LINK), exist_ok=True)
            if os.path.lexists(TF_INCLUDE_LINK):
                os.remove(TF_INCLUDE_LINK)
            os.symlink(flag[2:], TF_INCLUDE_LINK)
            flag = "-I" + TF_INCLUDE_LINK
        flags.append(flag)
    return flags


def tf_ops_extension():
    """The TensorFlow op library, built against the installed TensorFlow with its own
    flags plus -DNDEBUG (without it TF's Node layout differs from the wheel's and a graph
    pass crashes). Records the TF version it was built against for the import check."""
    import tensorflow as tf

    with open(os.path.join(HERE, BUILD_INFO), "w") as f:
        f.write('"""Written by setup.py: what the op library was built against."""\n'
                f"TF_VERSION = {tf.__version__!r}\n")
    return Extension(
        "rdmadev._tf_ops",
        [os.path.join(KERNELS_DIR, f) for f in (
            "ops.cc", "send_op.cc", "send_write.cc", "recv_op.cc", "recv_delivery.cc",
            "recv_output.cc", "tf_path.cc")]
        + [os.path.join(PASS_DIR, f) for f in (
            "pass.cc", "opt_in.cc", "branch_exits.cc", "planner_call.cc", "shapes.cc", "host_hop.cc")],
        include_dirs=[CORE, TF_DIR, sysconfig.get_paths()["include"]], language="c++", depends=HEADERS,
        extra_compile_args=CXXFLAGS + tf_compile_flags(tf) + [
            "-DNDEBUG", "-Wno-sign-compare", "-Wno-deprecated-declarations",
            "-Wno-interference-size", "-Wno-unused-but-set-variable"],
        extra_link_args=tf.sysconfig.get_link_flags())


def tf_protocol_extensions():
    """The grpc+rdmadev ServerFactory (protocol.cc, built against the installed TensorFlow like
    the op library) and the loader that TensorFlow loads from tensorflow-plugins/
    (plugin_loader.cc: links nothing of TensorFlow, so it can never fail `import tensorflow`)."""
    import tensorflow as tf

    protocol = Extension(
        "rdmadev._tf_protocol", [os.path.join(TF_PLUGIN_DIR, "protocol.cc")],
        include_dirs=[sysconfig.get_paths()["include"]], language="c++", depends=HEADERS,
        extra_compile_args=CXXFLAGS + tf_compile_flags(tf) + [
            "-DNDEBUG", "-Wno-sign-compare", "-Wno-deprecated-declarations"],
        extra_link_args=tf.sysconfig.get_link_flags())
    loader = Extension(
        LOADER, [os.path.join(TF_PLUGIN_DIR, "plugin_loader.cc")],
        language="c++", extra_compile_args=CXXFLAGS + [
            f'-DRDMADEV_BUILT_TF_VERSION="{tf.__version__}"'],
        extra_link_args=["-ldl"])
    return [protocol, loader]


def extensions():
    from Cython.Build import cythonize

    core = Extension(
        "rdmadev.librdmadev_core", CORE_SOURCES, language="c++", depends=HEADERS,
        # -ldl only: libibverbs is dlopen()ed at run time (verbs/ibv_lib.h), never linked.
        extra_compile_args=CXXFLAGS, extra_link_args=["-pthread", "-ldl"])
    # One extension module per object family (rdmadev._native.<family>), pyverbs style; the
    # raw declarations are the c_*.pxd files beside them. rdmadev/_core.py re-exports them.
    pydir = os.path.join("_native", "python")
    decls = sorted(glob.glob(os.path.join(BINDINGS, "*.pxd")))
    bindings = cythonize(
        [Extension(f"rdmadev._native.{family}", [os.path.join(BINDINGS, family + ".pyx")],
                   include_dirs=[CORE, pydir] + ([PASS_DIR] if family == "rules" else []),
                   language="c++", depends=HEADERS + decls,
                   extra_compile_args=CXXFLAGS)
         for family in BINDING_FAMILIES],
        include_path=[pydir], compiler_directives={"language_level": 3}, quiet=True)
    return [core] + bindings + [tf_ops_extension()] + tf_protocol_extensions()


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildNative})
