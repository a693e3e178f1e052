"""Pieces of TF steps the op tests share."""
import threading

import tensorflow as tf

from rdmadev.tf import ops

#: Seconds a step that should be cancelled may take before the test calls it hung: a hang
#: guard, not a timing check (the waits it cancels have deadlines of 600 s).
CANCEL_GUARD_S = 120


def failed_as_planned(e):
    """Whether exception `e` is how a step with fails_when_run() ends: the gather's error, or
    the cancellation it caused."""
    return isinstance(e, tf.errors.CancelledError) or (
        isinstance(e, tf.errors.InvalidArgumentError) and "indices = 5 is not in [0, 2)" in str(e))


def fails_when_run():
    """A tensor whose op fails (InvalidArgument) when the step runs, which cancels the step.
    The step must use it (return it). A constant would not do (`tf.debugging.assert_equal(1,
    2)` fails while the function is traced, before any op runs), nor a stateful op such as an
    assertion: tf.function orders stateful ops as written, so it would wait for the op the
    test wants cancelled. A gather is neither; its index, out of range, is known only when it
    runs."""
    five = tf.random.uniform([], 5, 6, tf.int32)
    return tf.gather(tf.zeros([2]), five)


def failure_of_cancelled(step):
    """Runs `step()` (which uses fails_when_run()) on a thread and returns what it raised;
    fails the test when it has not returned within CANCEL_GUARD_S (a wait was not cancelled)
    or returned without raising."""
    outcome = []

    def run():
        try:
            step()
            outcome.append(None)
        except Exception as e:  # the caller inspects which
            outcome.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(CANCEL_GUARD_S)
    assert outcome, f"the step still waits after {CANCEL_GUARD_S} s: its wait was not cancelled"
    assert outcome[0] is not None, "the step did not fail"
    return outcome[0]


def sending(x, key, timeout_s=30):
    """Starts sending `x` on channel `key` from a thread (a send may wait for the receiver's
    credits); returns (thread, errors it raised)."""
    errors = []

    def send():
        try:
            ops.send(x, key, timeout_s=timeout_s)
        except Exception as e:  # reported by the caller, with the receiver's outcome
            errors.append(e)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender, errors


def through(key, x, dtype, shape, timeout_s=30):
    """Sends `x` from a thread and receives it here."""
    sender, errors = sending(x, key, timeout_s)
    y = ops.recv(dtype, shape, key, timeout_s=timeout_s)
    sender.join(timeout_s)
    assert not sender.is_alive() and not errors, errors
    return y
