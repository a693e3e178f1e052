"""Writes the seed corpora of tests/fuzz/corpus/<target>/: a few valid inputs of each target
and the edge cases next to them, named for what they are. The files are checked in; run this
again after changing a target's input format (it replaces the directories).

    $ python3 tests/fuzz/make_corpus.py

The input formats are described at the top of each target (fuzz_*.cc, fuzz_control.py).
"""
import json
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

FRAME = struct.Struct("<IHHQQQQQQQ")
MAGIC = 0x464D4452  # "RDMF"
WRITE, READ, READ_RESPONSE = 1, 2, 3
U64 = 2**64 - 1


def frame(op, region, rkey, offset, length, flags=0, sig_off=0, seq=0, aux=0, magic=MAGIC):
    return FRAME.pack(magic, op, flags, region, rkey, offset, length, sig_off, seq, aux)


def frames_seeds():
    """fuzz_frames.cc: region 1 (3001 bytes), 6 (20 bytes) and 4 (0 bytes) are the peer's;
    an rkey below 8 becomes the real key of that region."""
    def w(region, off, payload, **kw):
        return frame(WRITE, region, region, off, len(payload), **kw) + payload

    return {
        "write": w(1, 64, b"abc"),
        "write_signal": w(1, 0, b"x" * 16, flags=1, sig_off=16, seq=5, aux=3),
        "write_whole_small": w(6, 0, bytes(range(20))),
        "write_signal_at_end": w(6, 4, b"y" * 16, flags=1, sig_off=0, seq=1, aux=2),
        "write_last_byte": w(1, 3000, b"z"),
        "write_whole_region": w(1, 0, bytes(i % 251 for i in range(3001))),
        "write_then_read": w(1, 8, b"12345678") + frame(READ, 1, 1, 0, 24),
        "read_whole_small": frame(READ, 6, 6, 0, 20),
        "read_empty_region": frame(READ, 4, 4, 0, 0),
        "write_empty_region": frame(WRITE, 4, 4, 0, 0),
        "late_write": frame(WRITE, 3, 0, 0, 5) + b"late!" + w(1, 0, b"after"),
        "not_granted": w(2, 0, b"mine?"),
        "wrong_key": frame(WRITE, 1, 2, 0, 1) + b"k",
        "closed_region": w(5, 0, b"gone"),
        "no_region": w(9, 0, b"none"),
        "range_past_end": w(6, 15, b"x" * 6),
        "range_overflow": frame(WRITE, 1, 1, U64, 2) + b"oo",
        "signal_unaligned": w(1, 0, b"s", flags=1, sig_off=4),
        "read_with_signal": frame(READ, 1, 1, 0, 8, flags=1),
        "bad_magic": frame(WRITE, 1, 1, 0, 1, magic=0x12345678) + b"m",
        "unknown_op": frame(READ_RESPONSE, 1, 1, 0, 0),
        "unknown_flags": frame(WRITE, 1, 1, 0, 0, flags=2),
        "truncated_header": frame(WRITE, 1, 1, 0, 4)[:40],
        "truncated_payload": frame(WRITE, 1, 1, 100, 50) + b"only part",
    }


def client_seeds():
    """fuzz_client.cc: byte 0 even = a READ (offset byte * 16, length byte * 17) and the
    answer; odd = a region descriptor."""
    def answer(off_b, len_b, payload=None, **kw):
        n = len_b * 17
        payload = bytes(i % 256 for i in range(n)) if payload is None else payload
        fields = dict(op=READ_RESPONSE, region=7, rkey=0, offset=0, length=n)
        fields.update(kw)
        return bytes([0, off_b, len_b]) + frame(**fields) + payload

    desc = struct.pack("<IIQQQIiQQQIIQ", 0x524D4452, 3, 7, 4096, 0x1234, 42, 5, 99, 3,
                       0x7F0000001000, 77, 0, 8192)
    return {
        "read": answer(1, 2),
        "read_empty": answer(0, 0),
        "read_whole": answer(0, 240),
        "read_short_payload": answer(2, 3)[:-5],
        "read_wrong_length": answer(0, 1, length=18),
        "read_wrong_op": answer(0, 1, op=WRITE),
        "read_bad_status": answer(0, 1, offset=1),
        "read_out_of_range": answer(255, 255, payload=b""),
        "read_no_answer": bytes([0, 1, 1]),
        "desc": b"\x01" + desc,
        "desc_old_version": b"\x01" + desc[:4] + struct.pack("<I", 1) + desc[8:],
        "desc_short": b"\x01" + desc[:79],
    }


def handshake_seeds():
    """fuzz_handshake.cc: byte 0 = role | tag << 1 | forge << 3 | hang up << 4 | name << 5."""
    nonce = bytes(range(32))
    proof = b"\0" * 32
    seeds = {}
    for tag, tag_name in enumerate(("tcp", "control", "verbs")):
        client_msg = struct.pack("<H", 8) + b"worker:0" + nonce + proof
        seeds[f"server_{tag_name}_proved"] = bytes([tag << 1 | 8]) + client_msg
        seeds[f"server_{tag_name}_wrong_proof"] = bytes([tag << 1]) + client_msg
        hello = struct.pack("<II", 0x48444D52, 1) + nonce
        seeds[f"client_{tag_name}_proved"] = bytes([1 | tag << 1 | 8]) + hello + b"\0" + proof
        seeds[f"client_{tag_name}_refused"] = bytes([1 | tag << 1]) + hello + b"\1" + proof
    hello = struct.pack("<II", 0x48444D52, 1) + nonce
    seeds.update({
        "server_no_name": bytes([8]) + struct.pack("<H", 0) + nonce + proof,
        "server_long_name": bytes([8]) + struct.pack("<H", 300) + b"n" * 300 + nonce + proof,
        "server_max_name": bytes([8]) + struct.pack("<H", 255) + b"n" * 255 + nonce + proof,
        "server_truncated": bytes([8]) + struct.pack("<H", 8) + b"worker:0" + nonce[:10],
        "server_hangs_up": bytes([8 | 16]) + struct.pack("<H", 1) + b"w" + nonce + proof,
        "client_wrong_magic": bytes([1]) + struct.pack("<II", 0x48444D53, 1) + nonce,
        "client_version_2": bytes([1]) + struct.pack("<II", 0x48444D52, 2) + nonce,
        "client_no_reply": bytes([1 | 8]) + hello,
        "client_empty_name": bytes([1 | 8 | 1 << 5]) + hello + b"\0" + proof,
        "client_long_name": bytes([1 | 8 | 2 << 5]) + hello + b"\0" + proof,
        "client_odd_name": bytes([1 | 8 | 3 << 5]) + hello + b"\0" + proof,
        "client_hangs_up": bytes([1 | 8 | 16]) + hello + b"\0" + proof,
    })
    return seeds


def control_seeds():
    """fuzz_control.py: one connection's bytes, length-prefixed JSON requests, and replies to
    calls of the served side (a link is used both ways)."""
    def msg(obj):
        return raw(json.dumps(obj).encode())

    def raw(body):
        return struct.pack("<I", len(body)) + body

    return {
        "ping": msg({"op": "ping"}),
        "requests": msg({"op": "plan", "id": 3, "sizes": [1, 2.5, None, True]}) +
                    msg({"op": "fail"}) + msg({"op": "release", "key": "x"}),
        "not_an_object": msg([1, {"op": "x"}]),
        "op_not_a_string": msg({"op": 3}),
        "no_op": msg({"id": 1}),
        "unicode_op": msg({"op": "\u00e9\ud800"}),
        "utf16": raw('{"op": "w"}'.encode("utf-16")),
        "invalid_utf8": raw(b'{"op": "\xff\xfe"}'),
        "not_json": raw(b"{op: ping}"),
        "empty_body": raw(b""),
        "nested_served": raw(b'{"op": "n", "a": ' + b"[" * 20 + b"]" * 20 + b"}"),
        "nested": raw(b'{"op": "n", "a": ' + b"[" * 80 + b"]" * 80 + b"}"),
        "huge_prefix": struct.pack("<I", (1 << 20) + 1) + b"{}",
        "max_prefix": struct.pack("<I", 2**32 - 1),
        "truncated_prefix": b"\x05\x00",
        "truncated_body": struct.pack("<I", 100) + b'{"op": "cut',
        "big_int": raw(b'{"op": "i", "n": ' + b"9" * 5000 + b"}"),
        "replies": msg({"ok": True, "result": 1, "re": 1}) + msg({"ok": False, "re": True}) +
                   msg({"re": [1]}) + msg({"op": "link", "incarnation": "a", "id": 7}),
        "ids": msg({"op": "a", "id": "x"}) + msg({"op": "fail", "id": {"k": [1]}}) +
               msg({"op": 1, "id": 2}),
    }


SEEDS = {"frames": frames_seeds, "client": client_seeds, "handshake": handshake_seeds,
         "control": control_seeds}


def main():
    total = 0
    for target, make in SEEDS.items():
        out = os.path.join(CORPUS, target)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        for name, data in make().items():
            with open(os.path.join(out, name), "wb") as f:
                f.write(data)
            total += len(data)
    print(f"wrote {sum(len(m()) for m in SEEDS.values())} seeds, {total} bytes, under {CORPUS}")


if __name__ == "__main__":
    sys.exit(main())
