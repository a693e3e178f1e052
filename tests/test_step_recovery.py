"""A step that fails (its receive times out or is cancelled) leaves the channel in step: the
next steps get exactly their own tensors, a transfer the failed step left behind is
discarded unread (two Domains in this process, every fabric). The channel is bound as the
control plane binds an instantiation's (naming a peer), so its halves go with their last
kernel: the tests keep every function alive."""
import os
import threading
import time

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

import rdmadev  # noqa: E402
from rdmadev import _core  # noqa: E402
from rdmadev.tf import ops  # noqa: E402
from rdmadev.testing.pair import ring_layout  # noqa: E402
from tf_steps import failed_as_planned, fails_when_run, failure_of_cancelled  # noqa: E402

SLOTS = 2
N = 64


@pytest.fixture
def bind(fabric, secret, request):
    """bind(peer) -> a fresh key with a channel of N floats bound under it, both halves in
    this process. `peer` as the control plane names it ("" : bound by hand)."""
    cfg = rdmadev.Config(fabric=fabric, secret=secret)
    a, b = rdmadev.open_domain("tx", cfg), rdmadev.open_domain("rx", cfg)
    ab, ba = a.connect(b.address), b.connect(a.address)
    keys = []

    def bind_one(peer, slots=SLOTS):
        key = f"{request.node.name}:{len(keys)}"
        layout = ring_layout(slots, N * 4)
        ring, credit = b.allocate(layout.bytes), a.allocate(rdmadev.CREDIT_BYTES)
        rdmadev.RingSender(ab, ab.attach(ring.descriptor), layout, credit).bind(
            key, peer=peer and "rx")
        rdmadev.RingReceiver(ring, layout, ba, ba.attach(credit.descriptor)).bind(
            key, peer=peer and "tx")
        keys.append(key)
        return key

    bind_one.receiving = b  # the receiving halves' Domain (its pending waits)
    yield bind_one
    for key in keys:
        _core.unbind_channel(key)
    a.close()
    b.close()


@pytest.fixture
def key(bind):
    """A channel bound as the control plane binds an instantiation's."""
    return bind(peer="planned")


def make_step(key):
    """Both halves in one function: one step, one step tag."""

    @tf.function
    def step(x):
        ops.send(x, key, timeout_s=30)
        return ops.recv(tf.float32, [N], key, timeout_s=30) + 0.0

    return step


def check_steps(step, count=10):
    for i in range(count):
        x = tf.random.stateless_uniform([N], [i, 11])
        np.testing.assert_array_equal(step(x).numpy(), x.numpy())


def lonely_recv(key, timeout_s):
    """A step whose receive has no sender."""

    @tf.function
    def step():
        return ops.recv(tf.float32, [N], key, timeout_s=timeout_s)

    return step


def test_after_a_timed_out_receive_the_next_steps_get_their_own_tensors(key):
    before = _core.transfer_counts()
    lonely = lonely_recv(key, 0.3)
    with pytest.raises(tf.errors.DeadlineExceededError):
        lonely()
    assert _core.transfer_counts()["abandoned"] == before["abandoned"] + 1
    check_steps(make_step(key))  # was: "Channel out of step" from here on


def test_a_late_transfer_of_the_failed_step_is_discarded(key):
    lonely = lonely_recv(key, 0.3)
    with pytest.raises(tf.errors.DeadlineExceededError):
        lonely()
    # The failed step's sender arrives after its receiver gave up (another step's tag).
    stale = np.full([N], -1.0, np.float32)
    _core.channel_send(key, stale.tobytes(), tag=12345)
    before = _core.transfer_counts()
    check_steps(make_step(key))
    assert _core.transfer_counts()["discarded"] == before["discarded"] + 1


def test_after_a_cancelled_step_the_next_steps_get_their_own_tensors(key):
    """TF cancels the step (another op failed) while the receive waits."""

    @tf.function
    def failing():
        return ops.recv(tf.float32, [N], key, timeout_s=600), fails_when_run()

    e = failure_of_cancelled(failing)
    assert failed_as_planned(e), e
    check_steps(make_step(key))
    del failing


def test_a_channel_bound_by_hand_pairs_halves_of_different_steps(bind):
    """Eager ops run as functions of their own (each its own step): on a channel bound by
    hand (no peer) step tags are not compared, so eager sends and receives pair up."""
    key = bind(peer="")
    for i in range(SLOTS + 3):
        x = tf.fill([N], float(i))
        ops.send(x, key)
        np.testing.assert_array_equal(ops.recv(tf.float32, [N], key).numpy(), x.numpy())


#: Seconds a stale step's receive may wait before its test calls it hung: a hang guard.
STALE_GUARD_S = 120


def _in_background(step):
    """Runs `step()` on a thread; returns (thread, outcome list: its result or exception)."""
    outcome = []

    def run():
        try:
            outcome.append(step())
        except Exception as e:  # the test inspects which
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _until_waiting(domain, waits):
    """Until `domain` has `waits` waits pending on its progress thread (bounded)."""
    deadline = time.monotonic() + STALE_GUARD_S
    while domain.pending_waits < waits:
        assert time.monotonic() < deadline, "the stale step never began waiting"
        time.sleep(0.01)


@pytest.mark.parametrize("slots", [1, 2])
def test_a_receive_of_a_step_its_caller_gave_up_makes_way_for_the_next_step(bind, slots):
    """A step its caller gave up can still be receiving when the next step begins (TF cancels
    the remote part of a failed step by an RPC, lost when it arrives before that part starts).
    The next step's receive takes its place: the stale receive ends at once saying why, and
    the next steps get exactly their own tensors. Before, the stale receive took the next
    step's transfer as a late one and discarded it, and that step waited for its deadline."""
    key = bind(peer="planned", slots=slots)
    before = _core.transfer_counts()
    thread, outcome = _in_background(lonely_recv(key, STALE_GUARD_S))
    _until_waiting(bind.receiving, 1)
    check_steps(make_step(key))
    thread.join(STALE_GUARD_S)
    assert outcome and isinstance(outcome[0], tf.errors.AbortedError), outcome
    assert "a later step's receive on this channel began" in str(outcome[0])
    assert "given up by its caller" in str(outcome[0])
    assert _core.transfer_counts()["superseded"] == before["superseded"] + 1


def test_a_slot_a_given_up_step_still_holds_is_waited_for(bind):
    """A step its caller gave up holds a slot (a zero-copy tensor kept while it waits on
    another channel): the next step's receive waits for the slot to be let go, instead of
    failing at once with "all slots are held", and gets its own tensor."""
    key, other = bind(peer="planned", slots=1), bind(peer="planned", slots=1)

    @tf.function
    def stale(x):  # holds key's only slot (an alias) until its wait on `other` times out
        ops.send(x, key, timeout_s=30)
        y = ops.recv(tf.float32, [N], key, timeout_s=30, zero_copy=True)
        return y + ops.recv(tf.float32, [N], other, timeout_s=3)

    thread, outcome = _in_background(lambda: stale(tf.ones([N])))
    _until_waiting(bind.receiving, 1)
    # The next step, unordered (a TF1 graph: its receive may run before its send), as the
    # halves of a step on two tasks are.
    graph = tf.Graph()
    with graph.as_default():
        x = tf.random.stateless_uniform([N], [7, 11])
        send = ops.send(x, key, timeout_s=30)
        got = ops.recv(tf.float32, [N], key, timeout_s=30)
    with tf.compat.v1.Session(graph=graph) as session:
        sent, received = session.run([x, got, send])[:2]
    np.testing.assert_array_equal(received, sent)
    thread.join(STALE_GUARD_S)
    assert outcome and isinstance(outcome[0], tf.errors.DeadlineExceededError), outcome
