"""A step that fails (its receive times out or is cancelled) leaves the channel in step: the
next steps get exactly their own tensors, a transfer the failed step left behind is
discarded unread (two Domains in this process, every fabric). The channel is bound as the
control plane binds an instantiation's (naming a peer), so its halves go with their last
kernel: the tests keep every function alive."""
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

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

    def bind_one(peer):
        key = f"{request.node.name}:{len(keys)}"
        layout = ring_layout(SLOTS, N * 4)
        ring, credit = b.allocate(layout.bytes), a.allocate(rdmadev.CREDIT_BYTES)
        rdmadev.RingSender(ab, ab.attach(ring.descriptor), layout, credit).bind(
            key, peer=peer and "rx")
        rdmadev.RingReceiver(ring, layout, ba, ba.attach(credit.descriptor)).bind(
            key, peer=peer and "tx")
        keys.append(key)
        return key

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
