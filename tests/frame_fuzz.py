"""A builder of plausible frame streams for the tcp fabric's receiving side (the frame loop
in tcp/frame.cc), run by tests/test_frame_fuzz.py's hypothesis property test in the default
suite.

Each input becomes a byte stream fed through Domain.feed_frames() as if it had arrived
from the authenticated peer "fuzzer": mostly structured frames (valid magic, real region
ids and keys, offsets near the edges) so that inputs reach the bounds checks, mixed with
raw bytes. After every input: the region granted to someone else is unchanged, and the
process is alive (a crash fails the run). This goes through the shipped library, without
sanitizers; the coverage-guided, sanitized fuzzing of the same parser is
tests/fuzz/fuzz_frames.cc (the fuzz tier).
"""
import hashlib
import struct

import rdmadev

FRAME = struct.Struct("<IHHQQQQQQQ")
MAGIC = 0x464D4452
SIZE = 8192
# Offsets and lengths worth trying: region edges, page edges, and values near 2**64.
EDGES = (0, 1, 7, 8, 15, 16, 4095, 4096, SIZE - 16, SIZE - 8, SIZE - 1, SIZE, SIZE + 1,
         2**32, 2**63, 2**64 - 16, 2**64 - 8, 2**64 - 1)


class Target:
    def __init__(self):
        self.dom = rdmadev.open_domain("fuzz-target", rdmadev.Config(fabric="shm"))
        self.granted = self.dom.allocate(SIZE, grant=["fuzzer"])
        self.other = self.dom.allocate(SIZE, grant=["someone-else"])
        memoryview(self.other)[:] = bytes(range(256)) * (SIZE // 256)
        self.other_digest = self._digest(self.other)
        self.regions = [(self.granted.id, *self._key(self.granted)),
                        (self.other.id, *self._key(self.other)), (999, 0, 0)]

    @staticmethod
    def _digest(region):
        return hashlib.sha256(memoryview(region)).digest()

    @staticmethod
    def _key(region):
        _, _, _, size, rkey = struct.unpack_from("<IIQQQ", region.descriptor)
        return size, rkey

    def build(self, fdp):
        """Turns fuzzer bytes into a stream of mostly plausible frames."""
        out = b""
        for _ in range(fdp.ConsumeIntInRange(1, 6)):
            if fdp.ConsumeIntInRange(0, 9) == 0:
                out += fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 256))
                continue
            rid, size, rkey = self.regions[fdp.ConsumeIntInRange(0, 2)]
            pick = lambda: EDGES[fdp.ConsumeIntInRange(0, len(EDGES) - 1)] if fdp.ConsumeBool() \
                else fdp.ConsumeIntInRange(0, 2**64 - 1)
            offset, length = pick(), pick()
            if fdp.ConsumeBool():
                length = fdp.ConsumeIntInRange(0, 512)
            op = fdp.ConsumeIntInRange(0, 4)
            flags = fdp.ConsumeIntInRange(0, 3)
            if fdp.ConsumeBool():
                rkey ^= fdp.ConsumeIntInRange(0, 2**64 - 1)
            magic = MAGIC if fdp.ConsumeIntInRange(0, 15) else fdp.ConsumeIntInRange(0, 2**32 - 1)
            out += FRAME.pack(magic, op, flags, rid, rkey, offset, length, pick(),
                              fdp.ConsumeIntInRange(0, 2**64 - 1), 0)
            out += fdp.ConsumeBytes(min(length, 600))
        return out

    def run(self, stream):
        self.dom.feed_frames("fuzzer", stream)
        if self._digest(self.other) != self.other_digest:
            raise AssertionError("a frame changed a region not granted to its peer")

