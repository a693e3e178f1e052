"""The tcp frame parser under random input: a quick property test in the default suite,
and a coverage-guided atheris run in the `fuzz` tier (RDMADEV_FUZZ_SECONDS, default 60)."""
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import frame_fuzz


class _Provider:
    """FuzzedDataProvider's interface over hypothesis draws."""

    def __init__(self, draw):
        self.draw = draw

    def ConsumeIntInRange(self, lo, hi):
        return self.draw(st.integers(lo, hi))

    def ConsumeBool(self):
        return self.draw(st.booleans())

    def ConsumeBytes(self, n):
        return self.draw(st.binary(max_size=n))


TARGET = None


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_frames_never_touch_ungranted_memory(data):
    global TARGET
    TARGET = TARGET or frame_fuzz.Target()
    TARGET.run(TARGET.build(_Provider(data.draw)))


def test_valid_write_applies_and_reports_frames():
    t = frame_fuzz.Target()
    rid, size, rkey = t.regions[0]
    stream = frame_fuzz.FRAME.pack(frame_fuzz.MAGIC, 1, 1, rid, rkey, 64, 3, 0, 5, 3) + b"abc"
    frames, rejected = t.dom.feed_frames("fuzzer", stream)
    assert (frames, rejected) == (1, "")
    assert bytes(memoryview(t.granted)[64:67]) == b"abc" and t.granted.load(0) == 5
    frames, rejected = t.dom.feed_frames("someone-else", stream)
    assert frames == 0 and "not granted" in rejected


@pytest.mark.fuzz
def test_atheris_fuzz_run():
    seconds = int(os.environ.get("RDMADEV_FUZZ_SECONDS", "60"))
    proc = subprocess.run(
        [sys.executable, frame_fuzz.__file__, f"-max_total_time={seconds}", "-rss_limit_mb=4096",
         "-print_final_stats=1"],
        capture_output=True, text=True, timeout=seconds + 300)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    runs = [l for l in tail.splitlines() if "stat::number_of_executed_units" in l]
    assert runs and int(runs[-1].split(":")[-1]) > 1000, tail
