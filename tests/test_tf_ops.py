"""The TensorFlow write/wait ops over a real channel (two Domains in this process, every
fabric): values identical, zero-copy aliasing returns the slot on release, clear errors."""
import dataclasses
import gc
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

import rdmadev  # noqa: E402
from rdmadev import _core  # noqa: E402
from rdmadev.testing.pair import bind_local, ring_layout  # noqa: E402
from rdmadev.testing.timing import wait_until  # noqa: E402
from rdmadev.tf import ops  # noqa: E402
from tf_steps import (CANCEL_GUARD_S, failed_as_planned, fails_when_run,  # noqa: E402
                      failure_of_cancelled, sending, through)

SLOTS = 2


@pytest.fixture
def channel(fabric, secret, request):
    """Returns bind(name, capacity) -> (sender, receiver) bound under `name`. Parametrized
    indirectly: Config fields of the sending domain."""
    cfg = rdmadev.Config(fabric=fabric, secret=secret)
    tx_cfg = dataclasses.replace(cfg, **getattr(request, "param", {}))
    a, b = rdmadev.open_domain("tx", tx_cfg), rdmadev.open_domain("rx", cfg)
    names = []

    def bind(name, capacity, rank=None, slots=SLOTS, leased=False):
        key = f"{request.node.name}:{name}"
        tx, rx = bind_local(a, b, key, ring_layout(slots, capacity, rank=rank), leased)
        names.append(key)
        return key, tx, rx

    bind.sender_domain, bind.receiver_domain = a, b  # for tests that look at a domain
    yield bind
    for key in names:
        _core.unbind_channel(key)
    a.close()
    b.close()


@pytest.mark.parametrize("dtype, shape", [(tf.float32, [4]), (tf.int64, [3, 5]),
                                          (tf.float16, [256, 1024]), (tf.bool, [7]),
                                          (tf.float32, [0])])
def test_values_arrive_identical(channel, dtype, shape):
    n = int(np.prod(shape)) * dtype.size
    key, _, _ = channel("t", n)
    for step in range(6):
        x = tf.cast(tf.random.stateless_uniform(shape, [step, 1]) * 100, dtype)
        ops.send(x, key)
        y = ops.recv(dtype, shape, key)
        np.testing.assert_array_equal(x.numpy(), y.numpy())


BUNDLE = [(tf.float32, [4, 8]), (tf.bool, [5]), (tf.float16, [3]), (tf.int64, [2]), (tf.int32, [0])]
BUNDLE_OFFSETS = [0, 128, 192, 256, 320]  # each 64-aligned after the one before
BUNDLE_BYTES = 320  # the int64s end at 272, the empty int32 is at 320


def test_a_bundle_moves_its_tensors_in_one_slot(channel):
    key, tx, rx = channel("bundle", BUNDLE_BYTES, slots=1)
    for step in range(4):
        xs = [tf.cast(tf.random.stateless_uniform(shape, [step, i]) * 100 - 50, dtype)
              for i, (dtype, shape) in enumerate(BUNDLE)]
        ops.send_bundle(xs, BUNDLE_OFFSETS, key)
        ys = ops.recv_bundle([d for d, _ in BUNDLE], [s for _, s in BUNDLE], BUNDLE_OFFSETS, key)
        assert len(ys) == len(xs) and rx.held == 0  # copied out, the slot given back
        for x, y in zip(xs, ys):
            assert y.dtype == x.dtype and y.shape == x.shape
            np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_a_bundles_gaps_carry_zeros_not_the_senders_memory(channel):
    key, _, _ = channel("gaps", 128 + 4, slots=1)
    ops.send_bundle([tf.fill([3], 7.0), tf.constant([1], tf.int32)], [0, 128], key)
    raw = ops.recv(tf.uint8, [132], key).numpy()
    assert raw[:12].view(np.float32).tolist() == [7.0] * 3 and raw[128:].view(np.int32).tolist() == [1]
    assert not raw[12:128].any()


def test_a_bundle_that_does_not_match_the_plan_is_a_clear_error(channel):
    key, _, _ = channel("mismatch", BUNDLE_BYTES, slots=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="cannot go at offset 0 after 128 bytes"):
        ops.send_bundle([tf.ones([32]), tf.ones([4])], [0, 0], key)  # overlapping
    with pytest.raises(tf.errors.InvalidArgumentError, match="exceed the channel's planned slot capacity"):
        ops.send_bundle([tf.ones([32]), tf.ones([100])], [0, 128], key)  # more than the slot holds
    ops.send_bundle([tf.ones([32]), tf.ones([4])], [0, 128], key)  # 144 of the 320 B planned
    with pytest.raises(tf.errors.InvalidArgumentError, match="delivered 144 bytes where its tensors span 320"):
        ops.recv_bundle([d for d, _ in BUNDLE], [s for _, s in BUNDLE], BUNDLE_OFFSETS, key)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="not a static plain-bytes tensor"):
        ops.recv_bundle([tf.float32], [[None]], [0], key)


@pytest.mark.parametrize("shape", [[1024, 1024], [4]])
def test_zero_copy_tensor_aliases_its_slot_until_released(channel, shape):
    """zero_copy is the planner's decision (its size threshold is in the plan config): the
    op obeys it as given, for 4 MiB and for 16 bytes alike."""
    n = int(np.prod(shape))
    key, _, rx = channel("big", n * 4)
    ops.send(tf.ones(shape), key)
    y = ops.recv(tf.float32, shape, key, zero_copy=True)
    assert rx.held == 1  # zero-copy: y is the slot
    assert float(tf.reduce_sum(y)) == n
    del y
    gc.collect()
    assert rx.held == 0  # the slot went back to the sender


def test_a_one_slot_channel_aliases_its_slot_every_step(channel):
    """The planner gives a static channel one slot (one tensor per step): the receive still
    aliases it, and each step's write finds the slot that the previous step's tensor freed."""
    key, _, rx = channel("one", 1 << 20, slots=1)
    for step in range(5):
        ops.send(tf.fill([256, 1024], float(step)), key, timeout_s=30)
        y = ops.recv(tf.float32, [256, 1024], key, timeout_s=30, zero_copy=True)
        assert rx.held == 1  # y is the slot
        assert float(tf.reduce_min(y)) == float(tf.reduce_max(y)) == step
        del y
        gc.collect()
        assert rx.held == 0


def test_dynamic_zero_copy_applies_the_size_threshold_to_each_tensor(channel):
    """On a dynamic channel the size is known only when a tensor arrives: with zero_copy the
    op aliases a tensor of at least zero_copy_min_bytes that came in one slot, and copies a
    smaller one or one that came in chunks; the values are the sender's either way."""
    key, _, rx = channel("dyn", 64 << 10, rank=2)
    for rows, aliased in [(256, True), (8, False), (512, False), (128, True)]:  # 64 KiB slots
        x = tf.reshape(tf.range(rows * 64, dtype=tf.float32), [rows, 64])
        ops.send(x, key, timeout_s=30)
        y = ops.recv(tf.float32, [None, 64], key, timeout_s=30, zero_copy=True,
                     zero_copy_min_bytes=32 << 10)
        assert rx.held == int(aliased), (rows, rx.held)
        np.testing.assert_array_equal(x.numpy(), y.numpy())
        del y
        gc.collect()
        assert rx.held == 0


def test_kept_tensors_do_not_stall_the_ring(channel):
    """By default receives copy out of the slot: keeping every tensor is fine."""
    key, _, rx = channel("kept", 1 << 20)
    kept = []
    for step in range(5):
        ops.send(tf.fill([256, 1024], float(step)), key, timeout_s=30)
        kept.append(ops.recv(tf.float32, [256, 1024], key, timeout_s=30))
    assert [float(t[0, 0]) for t in kept] == [0, 1, 2, 3, 4]
    assert rx.held == 0


@pytest.mark.parametrize("slots", [1, 2])
def test_kept_zero_copy_tensors_stall_with_a_clear_error(channel, slots):
    """With zero_copy, a kept tensor holds its slot; credits return in order, so the sender
    stops K transfers later with an error that says why (never a hang), and so does a
    receive that finds every slot held."""
    key, _, rx = channel("kept0", 1 << 20, slots=slots)
    kept = []
    with pytest.raises(tf.errors.DeadlineExceededError, match="zero-copy tensor kept alive"):
        for step in range(slots + 2):
            ops.send(tf.fill([256, 1024], float(step)), key, timeout_s=1)
            kept.append(ops.recv(tf.float32, [256, 1024], key, timeout_s=1, zero_copy=True))
    assert [float(t[0, 0]) for t in kept] == list(range(len(kept)))
    # The receiving side: one more receive while every slot is held names both causes.
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=rf"all {slots} slots are held by earlier receives in this task\. "
                             r"Either two calls of this function overlap.*zero-copy"):
        ops.recv(tf.float32, [256, 1024], key, timeout_s=1, zero_copy=True)


def test_ops_inside_tf_function(channel):
    key, _, _ = channel("fn", 64 * 4)

    @tf.function
    def step(x):
        ops.send(x * 2.0, key)
        return ops.recv(tf.float32, [64], key) + 1.0

    for i in range(3):
        x = tf.fill([64], float(i))
        np.testing.assert_array_equal(step(x).numpy(), np.full(64, 2.0 * i + 1.0))


def test_size_mismatch_is_a_clear_error(channel):
    key, _, _ = channel("mismatch", 64)
    ops.send(tf.ones([8]), key)  # 32 bytes
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not match the plan"):
        ops.recv(tf.float32, [16], key)


def test_tensor_larger_than_planned_is_refused(channel):
    key, _, _ = channel("small", 16)
    with pytest.raises(tf.errors.InvalidArgumentError, match="larger than planned"):
        ops.send(tf.ones([8]), key)


@pytest.mark.parametrize("dtype, shape", [(tf.float32, [0]), (tf.int64, [3, 5]),
                                          (tf.float32, [17, 16]), (tf.float32, [0, 16]),
                                          (tf.int32, []), (tf.float64, [2, 3, 4, 5])])
@pytest.mark.parametrize("planned", ["dims", "rank"])
def test_a_dynamic_channel_carries_the_shape(channel, dtype, shape, planned):
    """A dynamic channel's slots carry the shape (planned: the rank with unknown dims, or not
    even the rank); a tensor larger than a 256-byte slot arrives in chunks, one of 0
    elements in one empty slot."""
    key, _, rx = channel("dyn", 256, rank=4)
    want = None if planned == "rank" else [None] * len(shape)
    for step in range(3):
        x = tf.cast(tf.random.stateless_uniform(shape, [step, 2]) * 1000, dtype)
        y = through(key, x, dtype, want)
        assert y.shape == x.shape
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert rx.held == 0


def _moved(before):
    """What this process's channels did since transfer_counts() gave `before`."""
    after = _core.transfer_counts()
    return {k: after[k] - before[k] for k in ("received", "staged", "stages")}


@pytest.mark.parametrize("channel, path", [
    ({}, "staged"),
    ({"max_registered_bytes": 1}, "chunks"),  # no room for a stage
    ({"stage_below_slot_bytes": 4096}, "chunks"),  # slots not below the setting
], indirect=["channel"], ids=["staged", "chunks-no-room", "chunks-large-slots"])
def test_a_tensor_many_times_a_slot_arrives_whole(channel, path):
    """1 MiB through 4 KiB slots (K=2), shapes changing from step to step. Staged: the sender
    copies each tensor larger than a slot into its stage and the receiver reads it from there
    in one go, one transfer each, with one stage registered (the first tensor and a quarter
    more holds the later ones). When the sender's RDMADEV_MAX_REGISTERED_BYTES leaves no room
    for a stage (here 1 byte), or its RDMADEV_STAGE_BELOW_SLOT_BYTES is not above the slots,
    the same tensors stream through the two slots in chunks, the sender waiting for each
    credit while the receiver copies them into the output."""
    key, _, rx = channel("stream", 4096, rank=2)
    before = _core.transfer_counts()
    for rows in (4096, 1, 1000, 4096):
        x = tf.random.stateless_uniform([rows, 64], [rows, 3])
        y = through(key, x, tf.float32, [None, 64], timeout_s=60)
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert rx.held == 0
    if path == "staged":
        assert _moved(before) == {"received": 4, "staged": 3, "stages": 1}
    else:  # 1 MiB, 256 B, 250 KiB, 1 MiB in 4 KiB chunks
        assert _moved(before) == {"received": 256 + 1 + 63 + 256, "staged": 0, "stages": 0}


def test_a_stage_is_not_written_again_before_the_receiver_read_it(channel):
    """Two staged tensors in a row, the second sent while the first is still unread: a slot
    is free for it, but its sender waits until the receiver has read the first out of the
    stage (its credit), so each arrives as it was sent."""
    key, _, rx = channel("busy", 4096, rank=1)
    first, second = tf.fill([4096], 1.0), tf.fill([4096], 2.0)
    ops.send(first, key)
    sender, errors = sending(second, key)
    sender.join(0.5)  # gives a sender that would not wait the time to overwrite the stage
    np.testing.assert_array_equal(ops.recv(tf.float32, [None], key).numpy(), first.numpy())
    sender.join(30)
    assert not sender.is_alive() and not errors, errors
    np.testing.assert_array_equal(ops.recv(tf.float32, [None], key).numpy(), second.numpy())
    assert rx.held == 0


def _released_once_credited(domain):
    """Whether the sweep (the control plane's watcher) releases the sending half parked in
    `domain` once its receiver's credit lands (on tcp, a frame the sender serves in its own
    thread, so a little after the receive returned)."""
    def released():
        _core.release_drained()  # what the watcher does every WATCH_INTERVAL_S
        return _core.channel_counts(domain)["parked"] == 0

    return wait_until(released, CANCEL_GUARD_S, 0.01)


@pytest.mark.parametrize("read", [True, False], ids=["read", "never-read"])
def test_a_stage_outlives_its_unbound_sender_until_its_receiver_is_done(channel, read):
    """The control plane may unbind a sending half while the tensor it staged last is unread
    (its step cancelled midway, then the function released): the half is parked, its stage
    and credit region kept for the receiver, which reads the sender's values; the connection
    the task pair's channels share carries on (freeing the stage under the read failed the
    receive, and on tcp and verbs broke that connection). The memory goes at the first sweep
    after the receiver credited the tensor; when it never reads it, once its time parked is up,
    which the receiving task's release notice cuts short (here to 0)."""
    a, b = channel.sender_domain, channel.receiver_domain
    shared = (a.connect(b.address), b.connect(a.address))
    keys = [f"stage-unbound-{read}:{name}" for name in ("unbound", "other")]
    for key in keys:
        bind_local(a, b, key, ring_layout(SLOTS, 4096, rank=1), leased=True, endpoints=shared)
    try:
        regions = a.region_stats[0]  # the two credit regions
        before = _core.transfer_counts()
        x = tf.range(100_000, dtype=tf.float32)  # 400 kB through 4 KiB slots
        ops.send(x, keys[0])
        assert _moved(before)["staged"] == 1
        assert _core.unbind_channel(keys[0], "send") == 1
        assert _core.channel_counts(a) == {"senders": 1, "receivers": 0, "parked": 1, "retired": 0}
        assert a.region_stats[0] == regions + 1  # its credit region and its stage stay
        assert _core.release_drained() == 0  # not read yet, its time not up
        if read:
            y = ops.recv(tf.float32, [None], keys[0], timeout_s=30)
            np.testing.assert_array_equal(x.numpy(), y.numpy())
            assert _released_once_credited(a)
        else:  # the receiver unbinds its half and says so, as its task does (channels.py)
            assert _core.unbind_channel(keys[0], "recv") == 1
            assert _core.unbind_channel(keys[0], "send", park_s=0) == 0  # none bound: parked
            assert _core.release_drained() == 0  # the unbind released it
        assert _core.channel_counts(a) == {"senders": 1, "receivers": 0, "parked": 0, "retired": 0}
        assert a.region_stats[0] == regions - 1  # the stage and the unbound half's credit region
        ops.send(tf.ones([3]), keys[1], timeout_s=30)
        np.testing.assert_array_equal(ops.recv(tf.float32, [None], keys[1], timeout_s=30),
                                      np.ones(3))
    finally:
        for key in keys:
            _core.unbind_channel(key)


def test_a_write_racing_its_receivers_release_lands_nowhere(channel, fabric):
    """A receiving task releases a function (its half unbound) while its sender's last write
    is still on its way, or while a step cut short on the sender still writes: the write lands
    nowhere and the connection the task pair's channels share carries on. On verbs the NIC
    checks the ring's key, and a write to a deregistered ring failed the queue pair every
    channel to that peer uses: there the ring stays registered for a grace after its unbind
    (registry.h). tcp drops a write to a released region; on shm the sender's mapping
    outlives the release."""
    a, b = channel.sender_domain, channel.receiver_domain
    shared = (a.connect(b.address), b.connect(a.address))
    keys = [f"late-write:{name}" for name in ("released", "other")]
    for key in keys:
        bind_local(a, b, key, ring_layout(SLOTS, 4096), leased=True, endpoints=shared)
    try:
        regions = b.region_stats[0]  # the two rings
        assert _core.unbind_channel(keys[0], "recv") == 1
        retired = int(fabric == "verbs")
        assert _core.channel_counts(b) == {"senders": 0, "receivers": 1, "parked": 0,
                                           "retired": retired}
        assert b.region_stats[0] == regions - 1 + retired
        ops.send(tf.ones([1000]), keys[0], timeout_s=30)  # its receiver is gone
        for step in range(3):
            x = tf.fill([1000], float(step))
            ops.send(x, keys[1], timeout_s=30)
            np.testing.assert_array_equal(ops.recv(tf.float32, [1000], keys[1], timeout_s=30),
                                          x.numpy())
        assert _core.release_drained() == 0  # its grace is not up
        # Unbound again with no grace (its peer task died, its Domain closed): it goes.
        assert _core.unbind_channel(keys[0], "recv", park_s=0) == 0
        assert _core.channel_counts(b)["retired"] == 0
        assert b.region_stats[0] == regions - 1
    finally:
        for key in keys:
            _core.unbind_channel(key)


def test_a_write_to_a_task_that_went_names_that_task(secret):
    """tcp: the receiving task's Domain closes (the task died, or the connection broke):
    the write fails naming the task, not only the address the fabric knows, and says what
    happens next."""
    cfg = rdmadev.Config(fabric="tcp", secret=secret)
    a, b = rdmadev.open_domain("tx", cfg), rdmadev.open_domain("rx", cfg)
    layout = ring_layout(SLOTS, 4096)
    ring, credit = b.allocate(layout.bytes, label="ring"), a.allocate(_core.CREDIT_BYTES, label="credit")
    to_rx = a.connect(b.address)
    key = "write-to-a-task-that-went"
    _core.RingSender(to_rx, to_rx.attach(ring.descriptor), layout, credit).bind(
        key, None, peer="/job:ps/replica:0/task:0")
    try:
        b.close()
        with pytest.raises(tf.errors.UnavailableError) as failed:
            for _ in range(20):  # the first may still fit the socket's buffer
                ops.send(tf.ones([1000]), key, timeout_s=30)
                time.sleep(0.1)
        said = str(failed.value)
        assert f"rdmadev channel {key} to task /job:ps/replica:0/task:0: " in said, said
        assert "the channels between the two tasks are set up again" in said, said
    finally:
        _core.unbind_channel(key)
        a.close()


@pytest.fixture
def lost_half(secret):
    """A receiving half of channel "half-of-a-lost-ps" whose peer, the ps, the control plane
    unbound (unbind_peer, as the break of its connection does): yields (receiving domain,
    ps task, key)."""
    cfg = rdmadev.Config(fabric="shm", secret=secret)
    a, b = rdmadev.open_domain("tx", cfg), rdmadev.open_domain("rx", cfg)
    layout = ring_layout(SLOTS, 4096)
    ring, credit = b.allocate(layout.bytes, label="ring"), a.allocate(_core.CREDIT_BYTES, label="credit")
    to_tx = b.connect(a.address)
    key, ps = "half-of-a-lost-ps", "/job:ps/replica:0/task:0"
    _core.RingReceiver(ring, layout, to_tx, to_tx.attach(credit.descriptor)).bind(key, None, peer=ps)
    assert _core.unbind_peer(b, ps, f"task {ps} is gone or the connection to it broke") == 1
    try:
        yield b, ps, key
    finally:
        _core.unbind_channel(key)
        a.close()
        b.close()


def _classified(error):
    """ClusterCoordinator's own classifiers of `error`: (a lost ps, a lost worker)."""
    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc

    return cc._is_ps_failure(error), cc._is_worker_failure(error)


def test_a_step_that_finds_its_half_lost_waits_for_the_verdict_and_names_a_gone_peer_as_tfs_grpc_does(lost_half):
    """The control plane's ping finds the ps gone (dead or restarted): a receive that found
    its half lost meanwhile waits for that verdict, then fails naming the task in the words
    TF's ClusterCoordinator reads, so the coordinator raises PSUnavailableError to the user
    instead of running the closure again as a lost worker's."""
    b, ps, key = lost_half
    threading.Timer(0.5, _core.peer_verdict, (b, ps, f"task {ps} is gone: it does not answer")).start()
    t0 = time.monotonic()
    with pytest.raises(tf.errors.UnavailableError) as failed:
        ops.recv(tf.float32, [16], key, timeout_s=30)
    assert 0.4 < time.monotonic() - t0 < 3, "did not wait for the verdict, or waited past it"
    said = str(failed.value)
    assert f"task {ps} is gone: it does not answer (GRPC error information from remote target {ps})" in said, said
    assert _classified(failed.value) == (True, False)
    with pytest.raises(tf.errors.UnavailableError, match="is gone: it does not answer"):
        ops.recv(tf.float32, [16], key, timeout_s=30)  # the next finds the verdict at once


def test_a_step_that_finds_its_half_lost_to_a_cut_connection_fails_as_transient(lost_half):
    """The ping finds the same ps running (a cut connection, set up again): the receive fails
    without naming the ps as a remote target, which TF's ClusterCoordinator would take for a
    lost ps; the closure runs again on the channels set up again."""
    b, ps, key = lost_half
    assert _core.peer_verdict(b, ps, None) == 1
    t0 = time.monotonic()
    with pytest.raises(tf.errors.UnavailableError) as failed:
        ops.recv(tf.float32, [16], key, timeout_s=30)
    assert time.monotonic() - t0 < 1
    assert "is gone or the connection to it broke" in str(failed.value)
    assert _classified(failed.value)[0] is False, failed.value


def test_a_step_that_finds_its_half_lost_fails_as_transient_without_a_verdict(lost_half):
    """No verdict (the ping of a stopped or unreachable peer answers nothing): the receive
    waits at most VERDICT_WAIT_S for it, then fails as a transient failure."""
    _, _, key = lost_half
    t0 = time.monotonic()
    with pytest.raises(tf.errors.UnavailableError, match="is gone or the connection to it broke"):
        ops.recv(tf.float32, [16], key, timeout_s=30)
    assert _core.VERDICT_WAIT_S - 0.5 < time.monotonic() - t0 < _core.VERDICT_WAIT_S + 2


def _block(dims):
    """A shape block claiming `dims` (rank first), as a sender writes it."""
    return struct.pack(f"<{len(dims)}Q", *dims)


def _refused_unallocated(key, rx, write, error, match):
    """`write()` puts a hostile transfer on channel `key`: its receive fails with `error`
    matching `match`, without allocating what was claimed (maxrss), holds no slot, and the
    channel carries the next tensor."""
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    write()
    with pytest.raises(error, match=match):
        ops.recv(tf.float32, [None], key, max_bytes=1 << 20)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB
    assert rx.held == 0
    ops.send(tf.ones([3]), key)
    np.testing.assert_array_equal(ops.recv(tf.float32, [None], key).numpy(), np.ones(3))


def _record(region, offset, length):
    """A staged transfer's record (stage.h): the region's descriptor, offset, length."""
    return region.descriptor + struct.pack("<QQ", offset, length)


@pytest.mark.parametrize("record, shape, error, match", [
    (lambda r: _record(r, 0, 400), [1, 1000], tf.errors.InvalidArgumentError,
     "record names 400 bytes at offset 0 of a 8192-byte stage for a tensor of 4000 bytes"),
    (lambda r: _record(r, 8000, 4000), [1, 1000], tf.errors.InvalidArgumentError,
     "names 4000 bytes at offset 8000 of a 8192-byte stage"),
    (lambda r: b"\0" * 96, [1, 1000], tf.errors.InvalidArgumentError,
     "not an rdmadev region descriptor"),
    (lambda r: _record(r, 0, 1 << 42), [1, 1 << 40], tf.errors.ResourceExhaustedError,
     "exceeds RDMADEV_MAX_TENSOR_BYTES=1048576"),
])
def test_a_staged_record_that_does_not_add_up_is_refused(channel, record, shape, error, match):
    """A sender that writes its own stage records (no TF op in between): the receiver checks
    the record against the shape and the stage before it reads or allocates anything, and
    the channel carries the next tensor."""
    key, tx, rx = channel("record", 256, rank=1)
    stage = channel.sender_domain.allocate(8192)
    _refused_unallocated(key, rx, lambda: tx.send_record(record(stage), shape_block=_block(shape)),
                         error, match)


def test_a_dynamic_tensor_past_the_limit_is_refused_by_the_sender(channel):
    key, _, _ = channel("limit", 256, rank=1)
    with pytest.raises(tf.errors.ResourceExhaustedError,
                       match="4096 bytes exceeds RDMADEV_MAX_TENSOR_BYTES=1024"):
        ops.send(tf.ones([1024]), key, max_bytes=1024)


@pytest.mark.parametrize("claim, error, match", [
    ([1, 1 << 40], tf.errors.ResourceExhaustedError, "exceeds RDMADEV_MAX_TENSOR_BYTES=1048576"),
    ([1, 1 << 62], tf.errors.InvalidArgumentError, "overflows"),
    ([1, (1 << 64) - 5], tf.errors.InvalidArgumentError, "not valid"),  # a negative dim
    ([40, 1], tf.errors.InvalidArgumentError, "claims rank 40"),
    ([2, 3, 5], tf.errors.InvalidArgumentError, "does not match the planned"),
])
def test_a_peer_claiming_a_huge_shape_cannot_make_the_receiver_allocate_it(
        channel, claim, error, match):
    """A sender that writes its own shape block (no TF op in between): the receiver refuses
    the claim before allocating anything, and the channel carries the next tensor."""
    key, tx, rx = channel("claim", 256, rank=4)
    src = channel.sender_domain.allocate(4096)
    _refused_unallocated(key, rx, lambda: tx.send(src, 0, 64, shape_block=_block(claim)),
                         error, match)


def test_unsupported_dtype_and_missing_channel(channel):
    key, _, _ = channel("s", 64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="cannot carry string"):
        ops.send(tf.constant(["a"]), key)
    with pytest.raises(tf.errors.DeadlineExceededError, match="No receiver bound for channel 'nope'"):
        ops.recv(tf.float32, [1], "nope", timeout_s=0.2)
    with pytest.raises(tf.errors.DeadlineExceededError, match="Timed out waiting for transfer 1"):
        ops.recv(tf.float32, [1], key, timeout_s=0.2)


def test_version_check_names_the_fix(monkeypatch):
    import rdmadev._build_info as info
    ops.load.cache_clear()
    monkeypatch.setattr(info, "TF_VERSION", "0.0.0")
    try:
        with pytest.raises(rdmadev.ConfigError, match="built against TensorFlow 0.0.0") as e:
            ops.load()
        assert "pip install" in e.value.hint
    finally:
        ops.load.cache_clear()


def test_a_cancelled_step_ends_the_wait(channel):
    """When another op of the step fails, TF cancels the step: the pending wait ends at once
    (Cancelled) instead of at its 600 s deadline."""
    key, _, _ = channel("cancel", 64)

    @tf.function
    def step():
        return ops.recv(tf.float32, [1], key, timeout_s=600), fails_when_run()

    e = failure_of_cancelled(step)
    assert failed_as_planned(e), e


@pytest.mark.parametrize("half", ["recv", "send"])
def test_a_cancelled_step_ends_the_wait_for_an_unbound_half(half, request):
    """A TF1 half pair's kernel waits for its half to be bound (the pair meets in the
    background): a cancelled step ends that wait too, instead of its 600 s deadline."""
    key = f"{request.node.name}:never-bound"

    @tf.function
    def step():
        if half == "recv":
            return ops.recv(tf.float32, [1], key, timeout_s=600), fails_when_run()
        ops.send(tf.ones([1]), key, timeout_s=600)  # kept: stateful
        return fails_when_run()

    e = failure_of_cancelled(step)
    assert failed_as_planned(e), e


@pytest.mark.parametrize("half", ["recv", "send"])
@pytest.mark.parametrize("run_by", ["eager", "function"])
def test_unbinding_a_half_ends_its_pending_wait(channel, fabric, half, run_by):
    """A step whose peer will never write (its step failed elsewhere, the peer task alive and
    not cancelled) waits on a half the control plane then unbinds (the function released, the
    peer restarted): the wait ends then, naming the channel, not at its 600 s deadline, and
    the half's region (the receiver's ring, the sender's credit line), which the wait held,
    leaves its Domain: the receiver's at once (verbs: at the first sweep after its
    late-write grace), the sender's once the receiver has taken (and credited) the transfer
    it left in the slot, which it may still do.

    The error stays TF's UnavailableError when a function's executor runs the op as well as
    eagerly: the ops are registered as distributed communication, else TF's executor turns
    an op's Unavailable into Internal, which MonitoredTrainingSession and a
    ParameterServerStrategy coordinator do not take for a lost task."""
    key, _, _ = channel("unbound", 64, slots=1, leased=True)
    domain = channel.receiver_domain if half == "recv" else channel.sender_domain
    regions = domain.region_stats[0]
    if half == "send":
        ops.send(tf.ones([16]), key)  # fills the one slot: the next send waits for a credit

    def wait():
        if half == "recv":
            return ops.recv(tf.float32, [16], key, timeout_s=600)
        ops.send(tf.ones([16]), key, timeout_s=600)  # a function keeps it: stateful

    if run_by == "function":
        wait = tf.function(wait)
    outcome = []

    def run():
        try:
            wait()
            outcome.append(None)
        except Exception as e:  # inspected below
            outcome.append(e)

    waiter = threading.Thread(target=run, daemon=True)
    waiter.start()
    assert wait_until(lambda: domain.pending_waits == 1, CANCEL_GUARD_S, 0.01), "the op never waited"
    assert _core.unbind_channel(key, half) == 1
    waiter.join(CANCEL_GUARD_S)
    assert outcome, f"the wait outlived its unbound channel by {CANCEL_GUARD_S} s"
    e = outcome[0]
    assert isinstance(e, tf.errors.UnavailableError), e
    assert f"channel {key}" in str(e) and "unbound" in str(e), e
    assert domain.pending_waits == 0
    if half == "send":  # parked: the receiver still has the first transfer to take
        assert _core.channel_counts(domain)["parked"] == 1
        assert domain.region_stats[0] == regions and _core.release_drained() == 0
        np.testing.assert_array_equal(ops.recv(tf.float32, [16], key).numpy(), np.ones(16))
        assert _released_once_credited(domain)
    elif fabric == "verbs":  # retired: its sender's last write may still be on its way
        assert _core.channel_counts(domain)["retired"] == 1
        assert domain.region_stats[0] == regions and _core.release_drained() == 0

        def released():
            _core.release_drained()  # what the watcher does every WATCH_INTERVAL_S
            return _core.channel_counts(domain)["retired"] == 0

        assert wait_until(released, _core.LATE_WRITE_GRACE_S + 30, 0.1), _core.channel_counts(domain)
    assert wait_until(lambda: domain.region_stats[0] == regions - 1, 30, 0.01), domain.region_stats


# TF's own transfer nodes as the pass labels them for a pair in a conditional's branch
# (pass.cc ApplyLabelled): rendezvous attrs, then rdmadev's settings under `_rdmadev_`.
LOCAL_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def _labelled(g, op, key, dtype, inputs=(), shape=None):
    from tensorflow.core.framework import attr_value_pb2 as av
    attrs = {"tensor_name": av.AttrValue(s=key.encode()), "send_device": av.AttrValue(s=LOCAL_CPU.encode()),
             "send_device_incarnation": av.AttrValue(i=1), "recv_device": av.AttrValue(s=LOCAL_CPU.encode()),
             "client_terminated": av.AttrValue(b=False), "_kernel": av.AttrValue(s=b"rdmadev"),
             "_rdmadev_channel": av.AttrValue(s=key.encode()), "_rdmadev_timeout_s": av.AttrValue(f=30.0),
             "_rdmadev_max_bytes": av.AttrValue(i=0), "_rdmadev_owned": av.AttrValue(b=False),
             ("T" if op == "_Send" else "tensor_type"): av.AttrValue(type=dtype.as_datatype_enum)}
    if op == "_Recv":
        attrs.update({"_rdmadev_shape": av.AttrValue(shape=tf.TensorShape(shape).as_proto()),
                      "_rdmadev_zero_copy": av.AttrValue(b=False),
                      "_rdmadev_zero_copy_min_bytes": av.AttrValue(i=0)})
    return g._create_op_internal(op, list(inputs), [dtype] if op == "_Recv" else [], attrs=attrs,
                                 name=f"labelled{op}_{len(g.get_operations())}")


def _without_grappler():
    """A session config whose Grappler would not meet the transfer nodes (they only exist after
    partitioning otherwise)."""
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def test_a_dead_tensor_crosses_a_labelled_pair(channel):
    """On the branch not taken TF runs the labelled _Send with a dead input: it writes a dead
    transfer, and the labelled _Recv outputs a dead tensor, which the Merge passes over, as TF's
    rendezvous would. Steps that take the branch and skip it, in any order, each get their own
    value; a plain receive given a dead transfer fails, naming the channel."""
    key, _, rx = channel("dead", 16)
    ops.load()
    g = tf.Graph()
    with g.as_default():
        pred = tf.compat.v1.placeholder(tf.bool, [])
        x = tf.compat.v1.placeholder(tf.float32, [4])
        skipped, taken = tf.raw_ops.Switch(data=x, pred=pred)
        send = _labelled(g, "_Send", key, tf.float32, [taken * 2.0])
        with g.control_dependencies([send]):  # one process: the write first
            got = _labelled(g, "_Recv", key, tf.float32, shape=[4]).outputs[0]
        out = tf.raw_ops.Merge(inputs=[got + 1.0, skipped - 1.0])[0]
        lone = _labelled(g, "_Send", key, tf.float32, [taken])
    with tf.compat.v1.Session(graph=g, config=_without_grappler()) as s:
        for step, flag in enumerate([True, False, False, True, False]):
            v = np.full(4, float(step), np.float32)
            np.testing.assert_array_equal(s.run(out, {pred: flag, x: v}), v * 2.0 + 1.0 if flag else v - 1.0)
        assert rx.held == 0
        s.run(lone, {pred: False, x: np.zeros(4, np.float32)})  # a dead transfer, for a plain receive
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"rdmadev channel {key}: the sender's tensor is dead")):
        ops.recv(tf.float32, [4], key)


def test_a_loop_moves_each_iteration_over_a_labelled_pair(channel):
    """What the pass makes of a pair in a while loop (pass.cc: labelled nodes, the loop run
    one iteration at a time): each iteration writes and takes one transfer, and the exit
    iteration, whose tensors are dead, a dead one. Loops of 3, 0 and 5 iterations in turn each
    sum their own values and leave no slot held."""
    key, _, rx = channel("loop", 16)
    ops.load()
    v1 = tf.compat.v1
    v1.disable_control_flow_v2()  # TF1's while_loop: Enter, Merge, Switch, NextIteration, Exit
    try:
        g = tf.Graph()
        with g.as_default():
            n = v1.placeholder(tf.int32, [])
            x = v1.placeholder(tf.float32, [4])

            def body(i, total):
                send = _labelled(g, "_Send", key, tf.float32, [x * tf.cast(i + 1, tf.float32)])
                with g.control_dependencies([send]):  # one process: the write first
                    got = _labelled(g, "_Recv", key, tf.float32, shape=[4]).outputs[0]
                return i + 1, total + tf.ensure_shape(got, [4])  # _Recv has no shape function

            out = v1.while_loop(lambda i, t: i < n, body, [tf.constant(0), tf.zeros([4])],
                                parallel_iterations=1)[1]
    finally:
        v1.enable_control_flow_v2()
    with v1.Session(graph=g, config=_without_grappler()) as s:
        for iterations in (3, 0, 5):
            v = np.arange(4, dtype=np.float32) + iterations
            want = v * float(sum(range(1, iterations + 1)))
            np.testing.assert_array_equal(s.run(out, {n: iterations, x: v}), want)
        assert rx.held == 0


def _warm_receives(fabric, onednn):
    """tests/warm_receives.py run with TF's oneDNN allocator on or off; its RESULT."""
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn}
    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "warm_receives.py"),
                        fabric], env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("fabric", ["shm"])
def test_large_copied_receives_reuse_a_kept_buffer_where_tf_allocates_with_malloc(fabric):
    """TF's plain CPU allocator (oneDNN off) is malloc, which maps and faults in every tensor
    of 32 MiB and more afresh: there a receive that copies such a tensor takes a buffer its
    kernel kept from an earlier step once TF freed it ("warm"), static, staged or in chunks.
    A tensor still held is never handed out again: one kept across two later receives stays
    as it arrived, and those receives take new buffers. With oneDNN's allocator (TF's default
    here), which keeps large blocks itself, the kernel keeps none. The kept buffer is the
    receive's, above the fabric: shm only (tcp's staged reads and chunks: the tests above)."""
    result = _warm_receives(fabric, onednn="0")
    for path, r in result.items():
        assert r["intact"] and r["same"], (path, r)
        assert r["warm_while_held"] == 0, (path, r)
    assert result["static"]["warm"] == 3  # the three receives after the others were freed
    # Tensors of 33-40 MiB: the kept buffer serves the later ones that fit it.
    assert result["staged"]["warm"] >= 2 and result["chunks"]["warm"] >= 2, result
    default = _warm_receives(fabric, onednn="1")
    assert all(r["intact"] and r["same"] and r["warm"] == 0 for r in default.values()), default
