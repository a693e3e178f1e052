"""Builds rdmadev's native layer.

librdmadev_core.so is the C++ core (regions, fabrics, completion, channels). It is a
plain shared library so that every consumer in a process (the Cython bindings
rdmadev._core, and the TensorFlow op library) links the same copy and shares one
registry of regions and fabrics. Python extensions find it through an $ORIGIN rpath.
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = os.path.join("_native", "core")
CORE_SOURCES = [
    os.path.join(CORE, f)
    for f in ("common.cc", "hmac.cc", "region.cc", "completion.cc", "fabric.cc", "domain.cc",
              "channel.cc", "bench.cc", os.path.join("shm", "shm.cc"),
              os.path.join("tcp", "frame.cc"), os.path.join("tcp", "tcp.cc"))
]
CXXFLAGS = ["-std=c++17", "-O2", "-fvisibility=default", "-Wall", "-Wno-unused-parameter"]
CORE_LIB = "librdmadev_core.so"


class BuildNative(build_ext):
    """Builds the core library first, then the extensions that link it."""

    def get_ext_filename(self, fullname):
        # distutils asks with the full dotted name or with its last part only.
        parts = fullname.split(".")
        if parts[-1] == "librdmadev_core":
            return os.path.join(*parts[:-1], CORE_LIB)
        return super().get_ext_filename(fullname)

    def build_extensions(self):
        # setuptools compiles with the C compiler's flags; -Wstrict-prototypes is C-only.
        if "-Wstrict-prototypes" in self.compiler.compiler_so:
            self.compiler.compiler_so.remove("-Wstrict-prototypes")
        core = [e for e in self.extensions if e.name == "rdmadev.librdmadev_core"]
        rest = [e for e in self.extensions if e.name != "rdmadev.librdmadev_core"]
        for ext in core + rest:
            if ext is not core[0]:
                libdir = os.path.dirname(self.get_ext_fullpath(core[0].name))
                ext.library_dirs = [libdir]
                ext.runtime_library_dirs = []
                ext.extra_link_args = ext.extra_link_args + [
                    "-L" + libdir, "-l:" + CORE_LIB, "-Wl,-rpath,$ORIGIN"]
            self.build_extension(ext)


def extensions():
    from Cython.Build import cythonize

    core = Extension(
        "rdmadev.librdmadev_core", CORE_SOURCES, language="c++",
        extra_compile_args=CXXFLAGS, extra_link_args=["-pthread"])
    bindings = cythonize(
        [Extension("rdmadev._core", [os.path.join("_native", "python", "_core.pyx")],
                   include_dirs=[CORE, os.path.join("_native", "python")], language="c++",
                   extra_compile_args=CXXFLAGS)],
        include_path=[os.path.join("_native", "python")],
        compiler_directives={"language_level": 3}, quiet=True)
    return [core] + bindings


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildNative})
