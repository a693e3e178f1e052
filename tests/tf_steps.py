"""Pieces of TF steps the op tests share."""
import tensorflow as tf


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
