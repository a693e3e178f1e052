"""Run paths of shared libraries, read with readelf: where the dynamic loader looks for what
a library needs before the system's folders."""
import re
import subprocess
import sysconfig

__all__ = ["run_paths_outside_origin"]


def _interpreter_rpaths():
    """The run paths this interpreter's own link flags give every extension (pyenv's lib)."""
    flags = " ".join(sysconfig.get_config_vars().get(v) or "" for v in ("LDFLAGS", "LDSHARED"))
    return set(re.findall(r"-Wl,-rpath[,=]([^\s,]+)", flags))


def run_paths_outside_origin(lib, timeout_s=60):
    """The run path entries of `lib` that are neither $ORIGIN-relative nor the interpreter's
    own: folders outside the package that the loader would search."""
    dynamic = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, timeout=timeout_s,
                             check=True).stdout
    allowed = _interpreter_rpaths()
    return [p for paths in re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dynamic)
            for p in paths.split(":") if not p.startswith("$ORIGIN") and p not in allowed]
