"""The fuzz targets of tests/fuzz/: what a hostile peer reaches, under coverage-guided fuzzing.

Native targets (libFuzzer + AddressSanitizer + UBSan, built by tests/fuzz/build_targets.py
from the core sources): "frames" (the tcp fabric's serving side), "client" (a READ_RESPONSE
and a region descriptor as a connecting side parses them), "handshake" (both roles, every tag).
Python target (atheris): "control" (the control service's request loop).

Default suite: every seed (tests/fuzz/corpus/<target>/) and every regression input
(tests/fuzz/regressions/<target>/: each an input that once found a bug) replayed once through
its target: the native ones through their sanitizer builds (about 10 s to build them cold, under
a second with ccache warm), the control one in-process. Without clang the native replays skip,
naming the fix (they fail instead under RDMADEV_REQUIRE_FUZZ=1, as .ci/run sets); the fuzz
tier fails.

Fuzz tier (-m fuzz): each target fuzzed from a copy of its seeds for a fixed number of inputs
(INPUTS, about 8 s of each alone here; times $RDMADEV_FUZZ_SCALE, default 1), not for a time:
how much is fuzzed does not depend on how loaded the machine is. It must end without a finding,
execute all its inputs within a bound ten times their time alone, and grow coverage beyond the
seeds. A finding leaves its input in the test's tmp dir: fix the bug, then add the
input under tests/fuzz/regressions/<target>/ (the replay above keeps it fixed).
"""
import glob
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from rdmadev.cluster import control
from rdmadev.errors import ProtocolError

HERE = os.path.dirname(os.path.abspath(__file__))
FUZZ = os.path.join(HERE, "fuzz")
sys.path.insert(0, FUZZ)

import build_targets as build  # noqa: E402  (not "build": that is PyPA's package)
import fuzz_control  # noqa: E402

NATIVE = sorted(build.TARGETS)
TARGETS = NATIVE + ["control"]
# Inputs each target is fuzzed for, and how many a second it executes alone on this 2-core machine
# (2026-12-05, -max_total_time=8 from its seeds): about 8 s each. A run may take ten times that
# (SLOWDOWN) before it fails as too slow: CI's run of 4379bf9 fuzzed control at 240 a second
# beside the ASan targets, a quarter of its rate alone.
INPUTS = {"client": 600_000, "frames": 100_000, "handshake": 120_000, "control": 8_000}
RATE_ALONE = {"client": 83_000, "frames": 13_000, "handshake": 15_000, "control": 900}
SLOWDOWN = 10
SCALE = float(os.environ.get("RDMADEV_FUZZ_SCALE", "1"))
# Flags of every fuzzing run: a unit slower than 10 s is a hang; ASan's shadow memory and the
# regions make ~0.5 GB the usual peak.
FLAGS = ["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"]


def inputs(target):
    """Every seed and regression input of `target`, sorted."""
    return sorted(p for kind in ("corpus", "regressions")
                  for p in glob.glob(os.path.join(FUZZ, kind, target, "*")) if os.path.isfile(p))


def native_build(target, must):
    """The target's executable; skips without clang unless `must` (then fails), naming the fix."""
    try:
        return build.build(target)
    except build.FuzzToolchainMissing as e:
        if must:
            pytest.fail(str(e))
        pytest.skip(str(e))


@pytest.mark.parametrize("target", NATIVE)
def test_native_corpus_replays_clean(target):
    exe = native_build(target, must=os.environ.get("RDMADEV_REQUIRE_FUZZ") == "1")
    files = inputs(target)
    assert files, f"no seeds under tests/fuzz/corpus/{target}"
    proc = subprocess.run([exe, "-runs=1"] + FLAGS + files, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"Running {len(files)} inputs" in proc.stderr, proc.stderr[-2000:]


def test_control_corpus_replays_clean():
    files = inputs("control")
    assert files
    for path in files:
        with open(path, "rb") as f:
            fuzz_control.run_one(f.read())


def test_control_request_nested_too_deep_is_refused():
    """Regression (tests/fuzz/regressions/control/deep_nesting): a request nested deeper than
    the interpreter's recursion limit made json.loads raise RecursionError, which escaped the
    request loop (a traceback on stderr per request, no budget). It now ends the connection as
    malformed JSON, like any other."""
    a, b = socket.socketpair()
    with a, b:
        body = b"[" * 100000
        b.sendall(struct.pack("<I", len(body)) + body)
        with pytest.raises(ProtocolError, match="RecursionError"):
            control._recv(a)
    with open(os.path.join(FUZZ, "regressions", "control", "deep_nesting"), "rb") as f:
        fuzz_control.run_one(f.read())


def test_control_server_ends_a_hostile_connection_and_serves_on(capfd):
    """End to end through ControlServer: an authenticated connection that sends a request
    nested too deep is closed without a traceback, and the next connection is served."""
    from rdmadev import _core

    secret = b"fuzz-test-secret"
    server = control.ControlServer(("127.0.0.1", 0), secret, lambda r: {"echo": r["op"]})
    try:
        with socket.create_connection(server.server_address, timeout=10) as sock:
            _core.client_handshake(sock.fileno(), control.HANDSHAKE_TAG, secret, "hostile", 10.0)
            with open(os.path.join(FUZZ, "regressions", "control", "deep_nesting"), "rb") as f:
                sock.sendall(f.read())
            assert sock.recv(1) == b""  # closed, nothing answered
        client = control.ControlClient(server.server_address, secret, timeout=10)
        assert client.call({"op": "ping"}) == {"echo": "ping"}
        client.close()
    finally:
        server.close()
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("reply", [[1, 2], {"result": 1}, {"ok": True}, "ok"])
def test_control_client_refuses_a_malformed_reply(reply):
    """The coordinator's side of the same protocol: a task answering with a JSON value that is
    not a reply object made ControlClient.call raise AttributeError or KeyError; it is now a
    ProtocolError, and the connection is not used again."""
    from rdmadev import _core

    listener = socket.create_server(("127.0.0.1", 0))
    secret = b"fuzz-test-secret"

    def hostile_task():
        conn, _ = listener.accept()
        with conn:
            _core.server_handshake(conn.fileno(), control.HANDSHAKE_TAG, secret, "client", 10.0)
            control._recv(conn)
            control._send(conn, reply)
            conn.recv(1)  # until the client hangs up

    thread = threading.Thread(target=hostile_task, daemon=True)
    thread.start()
    with listener:
        client = control.ControlClient(listener.getsockname(), secret, timeout=10)
        with pytest.raises(ProtocolError, match="malformed control reply to ping"):
            client.call({"op": "ping"})
        assert client.broken
        thread.join(10)


def _stat(text, name):
    m = re.findall(rf"stat::{name}:\s+(\d+)", text)
    return int(m[-1]) if m else None


def _coverage(text, event):
    """(cov, ft) of the last status line of `event` (INITED, DONE)."""
    m = re.findall(rf"#\d+\s+{event}\s+cov: (\d+) ft: (\d+)", text)
    return tuple(map(int, m[-1])) if m else None


@pytest.mark.fuzz
@pytest.mark.parametrize("target", TARGETS)
def test_fuzz(target, tmp_path, capsys):
    if target == "control":
        try:
            import atheris  # noqa: F401
        except ImportError:
            pytest.fail("atheris is not installed; fix: pip install -e '.[fuzz]'")
        cmd = [sys.executable, fuzz_control.__file__]
    else:
        cmd = [native_build(target, must=True)]
    work = tmp_path / "corpus"
    shutil.copytree(os.path.join(FUZZ, "corpus", target), work)
    regressions = os.path.join(FUZZ, "regressions", target)
    runs = int(INPUTS[target] * SCALE)
    bound = int(SLOWDOWN * runs / RATE_ALONE[target]) + 1
    cmd += [f"-runs={runs}", f"-max_total_time={bound}", f"-artifact_prefix={tmp_path}/"]
    cmd += FLAGS + [str(work)]
    if os.path.isdir(regressions):
        cmd.append(regressions)  # read, never written: new inputs go to the first directory
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=bound + 300)
    took = time.monotonic() - start
    out = proc.stderr + proc.stdout
    found = sorted(glob.glob(f"{tmp_path}/crash-*") + glob.glob(f"{tmp_path}/leak-*") +
                   glob.glob(f"{tmp_path}/timeout-*") + glob.glob(f"{tmp_path}/oom-*"))
    assert proc.returncode == 0 and not found, (
        f"fuzz target {target} found a bug (exit {proc.returncode}); input: {found}; reproduce "
        f"with {' '.join(cmd[:2] if target == 'control' else cmd[:1])} <input>; once fixed, add "
        f"the input under tests/fuzz/regressions/{target}/\n" + out[-6000:])
    execs = _stat(out, "number_of_executed_units")
    inited, done = _coverage(out, "INITED"), _coverage(out, "DONE")
    assert execs is not None and inited and done, out[-3000:]
    with capsys.disabled():
        print(f"\nfuzz {target}: {execs} inputs in {took:.0f} s, cov {inited[0]} -> {done[0]}, "
              f"ft {inited[1]} -> {done[1]}, {_stat(out, 'new_units_added')} new inputs")
    assert execs >= runs, (
        f"fuzz target {target} executed {execs} of its {runs} inputs in its bound of {bound} s "
        f"({execs / took:.0f} a second, {RATE_ALONE[target]} alone on an idle 2-core machine): "
        f"the target slowed down, or the machine is more than {SLOWDOWN}x loaded\n{out[-3000:]}")
    assert done[1] > inited[1], f"no coverage beyond the seeds ({inited} -> {done})\n{out[-3000:]}"
