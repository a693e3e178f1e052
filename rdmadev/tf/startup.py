"""Importing TensorFlow in rdmadev's own programs (`rdmadev doctor`, `rdmadev serve`, the
examples) without the start-up lines TF_CPP_MIN_LOG_LEVEL does not reach.

TF 2.21's wheel logs a few lines while it loads, before it has read TF_CPP_MIN_LOG_LEVEL
(absl writes them to stderr ahead of its own initialization: tensorflow/tensorflow#100442),
so they come whatever the variable says: "oneDNN custom operations are on", "Could not find
cuda drivers" twice and, on a machine without CUDA drivers, "E... failed call to cuInit:
INTERNAL: CUDA error: ... UNKNOWN ERROR (303)", an ERROR line that reads like a failure of
the job. import_tensorflow() imports TF with stderr captured, then writes back every line
but those the variable would have dropped (absl's format: I, W, E, F for levels 0-3), and
the cuInit error when TF also found no CUDA driver (nothing to initialize); it lists the
devices before it returns, as TF looks for CUDA then. A line of any other form (rdmadev's
plugin loader, Python's warnings) passes unchanged, and when the import fails everything it
printed does.

Example:
    >>> tf = import_tensorflow()  # TF_CPP_MIN_LOG_LEVEL=2: nothing printed on a CPU machine
"""
import contextlib
import os
import re
import sys
import tempfile

__all__ = ["import_tensorflow", "startup_lines_kept"]

#: An absl log line: severity letter, MMDD date, then the rest.
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} ")
#: absl's banner ahead of the lines it logs before its initialization.
_ABSL_BANNER = "WARNING: All log messages before absl::InitializeLog() is called"
#: What TF logs when it finds no CUDA driver; its cuInit error is then expected.
_NO_CUDA_DRIVER = "Could not find cuda drivers"
_CUINIT_FAILED = "failed call to cuInit"
_LEVELS = "IWEF"


def startup_lines_kept(text, min_level):
    """The lines of `text` (what TF printed while it loaded) that TF_CPP_MIN_LOG_LEVEL
    `min_level` keeps, as one string: see the module docstring."""
    no_driver = _NO_CUDA_DRIVER in text
    kept = []
    for line in text.splitlines(keepends=True):
        absl = _ABSL_LINE.match(line)
        if absl:
            if _LEVELS.index(absl.group(1)) < min_level:
                continue
            if no_driver and _CUINIT_FAILED in line:
                continue
        elif line.startswith(_ABSL_BANNER):
            continue  # written back below only if an absl line is
        kept.append(line)
    if any(_ABSL_LINE.match(line) for line in kept) and _ABSL_BANNER in text:
        kept.insert(0, text[text.index(_ABSL_BANNER):].splitlines(keepends=True)[0])
    return "".join(kept)


@contextlib.contextmanager
def _stderr_captured():
    """Redirects file descriptor 2 (TF's C++ logging writes there directly) to a temporary
    file for the block; yields a callable returning what was written."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield lambda: (f.seek(0), f.read().decode(errors="replace"))[1]
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def import_tensorflow():
    """Imports and returns the tensorflow module, dropping the start-up lines
    TF_CPP_MIN_LOG_LEVEL does not reach (see the module docstring). Already imported: just
    returns it."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    try:
        min_level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        min_level = 0
    failed = None
    with _stderr_captured() as printed:
        try:
            import tensorflow as tf
            # TF looks for CUDA when it first lists the devices: during the import when it
            # runs from a site-packages folder (it loads tensorflow-plugins/ then), else at
            # the program's first op, past this capture (TF on PYTHONPATH, a Bazel build).
            # Listing them here keeps the cuInit error inside the capture either way; it
            # fixes nothing a program may still configure (visible devices, memory growth).
            tf.config.list_physical_devices()
        except BaseException as e:  # written back whole once stderr is restored
            failed = e
        text = printed()
    if failed is not None:
        sys.stderr.write(text)
        raise failed
    sys.stderr.write(startup_lines_kept(text, min_level))
    sys.stderr.flush()
    return tf
