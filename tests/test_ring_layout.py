"""The native ring lays its slots out exactly as the plan does (channel.h's constants are the one
definition; the planner lays slots out with them, graph_pass.layout.Layout from
rdmadev._core.LAYOUT): offsets and sizes byte for byte, and the bytes real transfers leave in the
receiver's region sit where the plan's layout dict says."""
import dataclasses

import numpy as np
import pytest

import rdmadev
import graph_pass.layout
import graph_pass.plan
from rdmadev import _core
from remote_ops import pattern

plan_layout = _core.LAYOUT  # what the planner lays slots out with

CAPACITIES = [0, 1, 63, 64, 65, 127, 4095, 4096, 4097, 65535, 1 << 20, (1 << 20) + 1,
              (3 << 20) + 7]
SLOTS = [2, 3, 4, 8, 17]
OFFSETS = [0, 64, 4096, 12352]


def _plan_layout(slots, capacity, offset=0, rank_capacity=None):
    slot_bytes, payload_offset = plan_layout.slot_bytes(capacity, rank_capacity)
    return slot_bytes, payload_offset, rdmadev.RingLayout(slots, slot_bytes, payload_offset,
                                                          capacity, offset)


@pytest.mark.parametrize("rank_capacity", [None, 0, 4, 8])
def test_native_layout_equals_the_plans(rank_capacity):
    for capacity in CAPACITIES:
        for slots in SLOTS:
            for offset in OFFSETS:
                sb, po, lay = _plan_layout(slots, capacity, offset, rank_capacity)
                assert (lay.slots, lay.slot_bytes, lay.payload_offset, lay.capacity_bytes,
                        lay.offset) == (slots, sb, po, capacity, offset)
                assert lay.bytes == slots * sb
                for i in range(slots):
                    assert lay.header(i) == offset + i * sb
                    assert lay.payload(i) == offset + i * sb + po
                    assert lay.payload(i) + graph_pass.layout.round_up(capacity, 64) == \
                        offset + (i + 1) * sb


def test_layout_of_reads_the_five_fields():
    class Transfer:  # a stand-in with the attribute names of graph_pass.plan.Transfer
        slots, slot_bytes, payload_offset, capacity_bytes, offset = 3, 192, 64, 100, 4096

    assert rdmadev.RingLayout.of(Transfer()) == rdmadev.RingLayout(3, 192, 64, 100, 4096)
    names = {f.name for f in dataclasses.fields(graph_pass.plan.Transfer)}
    assert {"slots", "slot_bytes", "payload_offset", "capacity_bytes", "offset"} <= names


@pytest.mark.parametrize("args, field", [
    ((0, 128, 64, 64), "slots"),
    ((2, 100, 64, 0), "slot_bytes"),
    ((2, 0, 64, 0), "slot_bytes"),
    ((2, 192, 32, 64), "payload_offset"),
    ((2, 192, 0, 64), "payload_offset"),
    ((2, 192, 100, 64), "payload_offset"),
    ((2, 192, 64, 129), "capacity_bytes"),
    ((2, 192, 64, 100, 8), "offset"),
    ((2, 192, 64, -1), "capacity_bytes"),
    ((2, 192, 64, None), "capacity_bytes"),
    ((2, 1 << 50, 64, 64), "slot_bytes"),
])
def test_bad_layouts_are_refused_naming_the_field(args, field):
    with pytest.raises(rdmadev.ConfigError, match=f"{field} = .*Fix: .*layout"):
        rdmadev.RingLayout(*args)


def test_wire_layout_agrees_with_the_plan():
    wire, plan = _core.wire_layout(), plan_layout.to_dict()
    assert wire == {"seq_offset": 0, "seq_bytes": 8, "length_offset": 8, "length_bytes": 8,
                    "alignment": 64, "slot_header_bytes": 64, "shape_block_offset": 64,
                    "shape_rank_offset": 0, "shape_dims_offset": 8, "shape_dim_bytes": 8,
                    "region_alignment": 4096, "byte_order": "little"}
    assert plan == wire  # the planner's layout is the native one, field for field
    assert wire["length_offset"] == wire["seq_offset"] + wire["seq_bytes"]
    assert graph_pass.layout.Layout.from_dict(graph_pass.plan.Plan(layout=plan).layout) == plan_layout


@pytest.mark.parametrize("capacity, offset", [(1, 0), (100, 4096), (4096 + 1, 192), (1 << 17, 64)])
def test_transfers_land_where_the_plan_says(fabric, secret, capacity, offset):
    """Real transfers through a ring placed inside a bigger region: each slot's sequence
    word, length and payload are found at the plan's offsets, and nothing outside the ring
    is touched."""
    wire = plan_layout.to_dict()
    slots = 3
    _, _, lay = _plan_layout(slots, capacity, offset)
    cfg = rdmadev.Config(fabric=fabric, secret=secret)
    with rdmadev.open_domain("tx", cfg) as a, rdmadev.open_domain("rx", cfg) as b:
        region = b.allocate(offset + lay.bytes + 4096)
        mem = np.frombuffer(region, np.uint8)
        ab, ba = a.connect(b.address), b.connect(a.address)
        credit = a.allocate(rdmadev.CREDIT_BYTES)
        tx = rdmadev.RingSender(ab, ab.attach(region.descriptor), lay, credit)
        rx = rdmadev.RingReceiver(region, lay, ba, ba.attach(credit.descriptor))
        src = a.allocate(max(capacity, 1))
        lengths = [capacity, 0, capacity // 2, capacity, 1 if capacity else 0, capacity]
        for n, length in enumerate(lengths, start=1):
            np.frombuffer(src, np.uint8, length)[:] = pattern(length, n)
            assert tx.send(src, 0, length, timeout=10) == n
            seq, at, got = rx.acquire(timeout=10)
            slot = (n - 1) % slots
            header = offset + slot * lay.slot_bytes
            assert (seq, at, got) == (n, header + lay.payload_offset, length)
            word = int.from_bytes(bytes(mem[header + wire["seq_offset"]:][:wire["seq_bytes"]]),
                                  wire["byte_order"])
            size = int.from_bytes(bytes(mem[header + wire["length_offset"]:]
                                        [:wire["length_bytes"]]), wire["byte_order"])
            assert (word, size) == (n, length)
            assert np.array_equal(mem[header + lay.payload_offset:][:length], pattern(length, n))
            rx.release(seq, timeout=10)
        assert not mem[:offset].any() and not mem[offset + lay.bytes:].any()
        del mem


@pytest.mark.parametrize("rank_capacity", [1, 4, 7])
def test_a_dynamic_slots_shape_block_lands_where_the_plan_says(fabric, secret, rank_capacity):
    """A dynamic channel's sender writes the shape block (u64 rank, u64 dims) and the payload
    before the signal: once the receiver sees the sequence word, both are in place at the
    plan's offsets (the write ordering the TF ops rely on, on every fabric)."""
    wire = plan_layout.to_dict()
    slots, capacity = 2, 4096
    _, payload_offset, lay = _plan_layout(slots, capacity, 0, rank_capacity)
    block_at = wire["shape_block_offset"]
    cfg = rdmadev.Config(fabric=fabric, secret=secret)
    with rdmadev.open_domain("tx", cfg) as a, rdmadev.open_domain("rx", cfg) as b:
        region = b.allocate(lay.bytes)
        mem = np.frombuffer(region, np.uint8)
        ab, ba = a.connect(b.address), b.connect(a.address)
        credit = a.allocate(rdmadev.CREDIT_BYTES)
        tx = rdmadev.RingSender(ab, ab.attach(region.descriptor), lay, credit)
        rx = rdmadev.RingReceiver(region, lay, ba, ba.attach(credit.descriptor))
        src = a.allocate(capacity)
        for n in range(1, 6):
            dims = [n + i for i in range(min(n, rank_capacity))]
            block = b"".join(v.to_bytes(wire["shape_dim_bytes"], wire["byte_order"])
                             for v in [len(dims)] + dims)
            np.frombuffer(src, np.uint8, capacity)[:] = pattern(capacity, n)
            tx.send(src, 0, capacity, timeout=10, shape_block=block)
            seq, at, length = rx.acquire(timeout=10)
            header = at - payload_offset
            shape = mem[header + block_at:][:len(block)]
            rank = int.from_bytes(bytes(shape[wire["shape_rank_offset"]:][:8]), wire["byte_order"])
            got = [int.from_bytes(bytes(shape[wire["shape_dims_offset"] + 8 * i:][:8]),
                                  wire["byte_order"]) for i in range(rank)]
            assert (seq, length, rank, got) == (n, capacity, len(dims), dims)
            assert np.array_equal(mem[at:][:capacity], pattern(capacity, n))
            rx.release(seq, timeout=10)
        too_long = bytes(8 * (rank_capacity + 8))
        with pytest.raises(rdmadev.BoundsError, match="shape block exceeds"):
            tx.send(src, 0, 8, timeout=10, shape_block=too_long)
        del mem, shape
