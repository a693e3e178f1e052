"""The tcp frame parser under random input through the shipped library: a quick property
test in the default suite. (The coverage-guided fuzzing of the same parser under
AddressSanitizer is tests/test_fuzz.py's, on tests/fuzz/fuzz_frames.cc.)"""
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

