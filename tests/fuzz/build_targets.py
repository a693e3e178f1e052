"""Builds the native fuzz targets of tests/fuzz/ with libFuzzer, AddressSanitizer and
UndefinedBehaviorSanitizer (clang), straight from the core sources they exercise: no setup.py,
nothing installed. Objects are shared between targets and rebuilt only when a source or a
header is newer (and through ccache when it is on PATH), so a warm rebuild links and returns.

The build directory lies outside the source tree: $RDMADEV_FUZZ_BUILD, else
$TMPDIR/rdmadev-fuzz-<hash of this checkout and the flags>.

Example:
    >>> import build_targets
    >>> build_targets.build("frames")          # the path of the executable
    $ python3 tests/fuzz/build_targets.py      # builds every target, prints their paths
    $ $(python3 tests/fuzz/build_targets.py frames) -max_total_time=30 w/ tests/fuzz/corpus/frames
"""
import concurrent.futures
import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

__all__ = ["TARGETS", "FuzzToolchainMissing", "build", "build_dir", "compiler"]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORE = os.path.join(ROOT, "_native", "core")

#: Each target: its harness in tests/fuzz/ and the core sources it links (paths in CORE).
TARGETS = {
    # The tcp fabric's serving side: ServeFrames over real regions.
    "frames": ("fuzz_frames.cc", ["tcp/frame.cc", "region.cc", "common.cc"]),
    # What a connecting side parses: the READ_RESPONSE in TcpEndpoint::Read (the harness
    # includes tcp.cc to reach the endpoint class) and RegionDesc::Decode.
    "client": ("fuzz_client.cc", ["tcp/frame.cc", "region.cc", "common.cc", "sockio.cc", "hmac.cc",
                             "handshake.cc", "acceptor.cc", "fabric.cc", "completion.cc",
                             "domain.cc", "arena.cc"]),
    # The handshake of every authenticated service, both roles.
    # region.cc is left out: the harness defines RandomBytes (its nonces are fixed).
    "handshake": ("fuzz_handshake.cc", ["handshake.cc", "sockio.cc", "hmac.cc", "common.cc"]),
}

SANITIZE = "-fsanitize=fuzzer,address,undefined"
CXXFLAGS = ["-std=c++17", "-g", "-O1", SANITIZE, "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer", "-Wall", "-Wno-unused-parameter", "-I", CORE]
FIX = "apt-get install clang-14 libclang-rt-14-dev"


class FuzzToolchainMissing(RuntimeError):
    """clang or its libFuzzer / sanitizer runtimes are not installed."""


def compiler():
    """The clang++ to build with ($RDMADEV_FUZZ_CXX, else clang++-14, else clang++), checked
    to have the libFuzzer runtime. Raises FuzzToolchainMissing naming the fix."""
    names = [os.environ["RDMADEV_FUZZ_CXX"]] if os.environ.get("RDMADEV_FUZZ_CXX") else \
        ["clang++-14", "clang++"]
    cxx = next((shutil.which(n) for n in names if shutil.which(n)), None)
    if not cxx:
        raise FuzzToolchainMissing(f"no clang++ found (tried {', '.join(names)}); fix: {FIX}")
    rt = subprocess.run([cxx, "--print-runtime-dir"], capture_output=True, text=True).stdout.strip()
    for lib in ("fuzzer", "asan", "ubsan_standalone"):
        if not glob.glob(os.path.join(rt, f"libclang_rt.{lib}-*.a")):
            raise FuzzToolchainMissing(f"{cxx} has no {lib} runtime in {rt or '?'}; fix: {FIX}")
    return cxx


def build_dir(cxx):
    """Where objects and executables go (see the module docstring)."""
    if os.environ.get("RDMADEV_FUZZ_BUILD"):
        return os.environ["RDMADEV_FUZZ_BUILD"]
    key = hashlib.sha256(repr((ROOT, cxx, CXXFLAGS)).encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"rdmadev-fuzz-{key}")


def _newest_header():
    headers = glob.glob(os.path.join(CORE, "**", "*.h"), recursive=True) + \
        glob.glob(os.path.join(HERE, "*.h"))
    return max(os.path.getmtime(h) for h in headers + [os.path.abspath(__file__)])


def _stale(out, inputs, newest_header):
    if not os.path.exists(out):
        return True
    t = os.path.getmtime(out)
    return any(os.path.getmtime(i) > t for i in inputs) or newest_header > t


def _compile(cxx, src, obj, extra_inputs, newest_header):
    if not _stale(obj, [src] + extra_inputs, newest_header):
        return
    launcher = [shutil.which("ccache")] if shutil.which("ccache") else []
    tmp = f"{obj}.{os.getpid()}.tmp.o"
    cmd = launcher + [cxx] + CXXFLAGS + ["-c", src, "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"Failed to compile {src}:\n{' '.join(cmd)}\n{proc.stderr}")
    os.replace(tmp, obj)


def build(*names, jobs=None):
    """Builds the named targets (all when none is named) and returns the path of the first
    (with one name) or a dict name -> path. Raises FuzzToolchainMissing without clang."""
    names = names or tuple(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        raise ValueError(f"no fuzz target {unknown}; the targets are {sorted(TARGETS)}")
    cxx = compiler()
    out_dir = build_dir(cxx)
    os.makedirs(os.path.join(out_dir, "obj"), exist_ok=True)
    newest_header = _newest_header()
    jobs = jobs or int(os.environ.get("RDMADEV_FUZZ_JOBS", "0")) or min(2, os.cpu_count() or 1)
    # One object per source file; a harness is also rebuilt when a core .cc it includes is.
    objects, work = {}, {}
    for name in names:
        harness, sources = TARGETS[name]
        objs = []
        for rel in sources:
            obj = os.path.join(out_dir, "obj", "core_" + rel.replace("/", "_") + ".o")
            work[obj] = (os.path.join(CORE, rel), [])
            objs.append(obj)
        obj = os.path.join(out_dir, "obj", harness + ".o")
        work[obj] = (os.path.join(HERE, harness), [os.path.join(CORE, "tcp", "tcp.cc")])
        objects[name] = [obj] + objs
    with open(os.path.join(out_dir, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes building at once wait in turn
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            for f in [pool.submit(_compile, cxx, src, obj, extra, newest_header)
                      for obj, (src, extra) in work.items()]:
                f.result()
        paths = {}
        for name in names:
            exe = os.path.join(out_dir, name)
            if _stale(exe, objects[name], 0):
                cmd = [cxx, SANITIZE] + objects[name] + ["-o", exe + ".tmp", "-ldl", "-pthread"]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise RuntimeError(f"Failed to link {name}:\n{' '.join(cmd)}\n{proc.stderr}")
                os.replace(exe + ".tmp", exe)
            paths[name] = exe
    return paths[names[0]] if len(names) == 1 else paths


def main(argv):
    try:
        paths = build(*argv[1:])
    except FuzzToolchainMissing as e:
        print(f"build_targets.py: {e}", file=sys.stderr)
        return 2
    for path in [paths] if isinstance(paths, str) else paths.values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
