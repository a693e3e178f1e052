"""ParameterServerStrategy behaviours that TF's own tests check (scheduling, datasets, per-worker
and sharded variables, embedding lookups, strategy.run inside a scheduled function, variable
aggregation, cached reads, errors and cancellation), run unchanged over any protocol on one
in-process cluster (2 workers, 2 ps and this coordinator, built by TF's multi_worker_test_base):
``python pss_behaviours.py PROTOCOL``. Written for this project after what TF's
cluster_coordinator and parameter_server_strategy_v2 tests cover; none of their code.

Each behaviour returns what it computed (hex bytes, error types), made independent of which
worker ran which closure, so two protocols can be compared bitwise. Variables are sharded
over both ps (FixedShardsPartitioner(2)) wherever their first axis allows. Prints one line
per behaviour, ``BEHAVIOUR <name> {"ok": bool, "result": ... | "error": "...", "swapped": n}``,
n the cross-task tensors rdmadev swapped in the instantiations the behaviour made.
"""
import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.distribute import distribute_utils  # noqa: E402

from in_process_client import in_process_pss  # noqa: E402

BEHAVIOURS = []


def behaviour(fn):
    BEHAVIOURS.append(fn)
    return fn


def _hex(value):
    """A fetched value (nested structures too) as hex bytes, for a bitwise comparison."""
    return tf.nest.map_structure(lambda t: np.asarray(t).tobytes().hex(), value)


@behaviour
def nested_return_values(strategy, coordinator):
    with strategy.scope():
        v = tf.Variable(tf.reshape(tf.range(24, dtype=tf.float32), [6, 4]))

    @tf.function
    def fn(x):
        rows = v * x
        return {"sum": tf.reduce_sum(rows), "parts": (rows[:3], [rows[3:], tf.shape(rows)])}

    remote = coordinator.schedule(fn, args=(tf.constant(2.0),))
    coordinator.join()
    return _hex(remote.fetch())


@behaviour
def per_worker_dataset_and_repeated_iterators(strategy, coordinator):
    with strategy.scope():
        scale = tf.Variable(tf.fill([4], 3.0))
    dataset = coordinator.create_per_worker_dataset(
        lambda: tf.data.Dataset.range(1, 41).map(lambda x: tf.cast(x, tf.float32)).batch(4).repeat())

    @tf.function
    def fn(iterator):
        return next(iterator) * scale

    out = []
    for _ in range(2):  # a fresh iterator starts the dataset again on every worker
        out.append(coordinator.schedule(fn, args=(iter(dataset),)).fetch())
    return _hex(out)


@behaviour
def distributed_datasets(strategy, coordinator):
    with strategy.scope():
        bias = tf.Variable(tf.fill([2], 0.5))

    def from_function():
        return strategy.distribute_datasets_from_function(
            lambda _: tf.data.Dataset.range(1, 11).map(lambda x: tf.cast(x, tf.float32)).batch(2))

    def from_dataset():
        return strategy.experimental_distribute_dataset(
            tf.data.Dataset.range(1, 11).map(lambda x: tf.cast(x, tf.float32)).batch(2))

    @tf.function
    def fn(iterator):
        return strategy.experimental_local_results(
            strategy.run(lambda x: x + bias, args=(next(iterator),)))

    return _hex([coordinator.schedule(fn, args=(iter(coordinator.create_per_worker_dataset(f)),)).fetch()
                 for f in (from_function, from_dataset)])


@behaviour
def per_worker_variables(strategy, coordinator):
    with strategy.scope():
        shared = tf.Variable(tf.fill([8], 2.0))
        counter = tf.Variable(tf.zeros([8]), per_worker_variable=True)

    @tf.function
    def fn():
        counter.assign_add(shared)  # each worker's own copy
        return tf.convert_to_tensor(counter)

    values = sorted(float(coordinator.schedule(fn).fetch()[0]) for _ in range(4))
    # every closure adds 2 to the copy of the worker that ran it; TF 2.21 reads a per-worker
    # variable here before the step's own add (measured on gRPC: 0, 0, 2, 2 over 2 workers),
    # so each worker's first read is 0, and how many reads follow depends on the worker
    return {"first_reads": values[0], "all_even": all(v % 2 == 0 for v in values)}


@behaviour
def sharded_embedding_lookups(strategy, coordinator):
    with strategy.scope():
        table = tf.Variable(tf.reshape(tf.range(10 * 4, dtype=tf.float32), [10, 4]) / 8.0)
    ids = tf.constant([0, 3, 7, 9, 3])
    sparse = tf.sparse.SparseTensor(indices=[[0, 0], [0, 1], [1, 0], [2, 0]], values=[1, 8, 9, 4],
                                    dense_shape=[3, 2])

    @tf.function
    def fn(ids, sp_ids):
        dense = tf.nn.embedding_lookup(table, ids)
        summed = tf.nn.embedding_lookup_sparse(table, sp_ids, None, combiner="sum")
        safe = tf.nn.safe_embedding_lookup_sparse(table, sp_ids, combiner="mean")
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) ** 2)
        for shard, grad in zip(table.variables, tape.gradient(loss, table.variables)):
            shard.assign_sub(0.01 * tf.convert_to_tensor(grad))  # sparse rows, shard by shard
        return dense, summed, safe

    result = coordinator.schedule(fn, args=(ids, sparse)).fetch()
    return {"sharded": len(table.variables), "lookups": _hex(result),
            "table": _hex(tf.convert_to_tensor(table))}


@behaviour
def strategy_run_and_reduce_in_a_scheduled_function(strategy, coordinator):
    with strategy.scope():
        w = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [4, 3]) / 3.0)

    @tf.function
    def fn(x):
        per_replica = strategy.run(lambda x: tf.matmul(x, w), args=(x,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return _hex(coordinator.schedule(fn, args=(tf.ones([2, 4]),)).fetch())


@behaviour
def variable_aggregation_and_cached_reads(strategy, coordinator):
    with strategy.scope():
        mean = tf.Variable(tf.zeros([6]), aggregation=tf.VariableAggregation.MEAN)
        summed = tf.Variable(tf.zeros([6]), aggregation=tf.VariableAggregation.SUM)
        read = tf.Variable(tf.fill([6], 1.5))

    @tf.function
    def fn():
        with distribute_utils.cache_variable_reads():  # each variable read once in the step
            def replica(x):
                mean.assign_add(x + read)
                summed.assign_add(x * read)
                return read + read
            return strategy.experimental_local_results(strategy.run(replica, args=(tf.ones([6]),)))

    out = []
    for _ in range(3):  # one at a time: each adds in order
        out.append(coordinator.schedule(fn).fetch())
    return {"returned": _hex(out), "mean": _hex(tf.convert_to_tensor(mean)),
            "sum": _hex(tf.convert_to_tensor(summed))}


@behaviour
def errors_are_reported_and_cleared(strategy, coordinator):
    with strategy.scope():
        v = tf.Variable(tf.fill([4], 1.0))

    @tf.function
    def good():
        v.assign_add(tf.ones([4]))
        return tf.convert_to_tensor(v)

    @tf.function
    def bad():
        tf.debugging.assert_negative(tf.convert_to_tensor(v), message="rdmadev behaviour: v is not negative")
        return tf.convert_to_tensor(v)

    coordinator.schedule(good)
    coordinator.join()
    coordinator.schedule(bad)
    error = None
    try:
        coordinator.join()
    except tf.errors.InvalidArgumentError as e:
        error = type(e).__name__ + (": the closure's message" if "v is not negative" in str(e) else "")
    # the error is cleared: the coordinator schedules again and the variable is whole
    after = coordinator.schedule(good).fetch()
    return {"error": error, "after": _hex(after)}


@behaviour
def a_failed_closure_cancels_the_others(strategy, coordinator):
    with strategy.scope():
        v = tf.Variable(tf.zeros([4]))

    @tf.function
    def slow():
        total = tf.constant(0.0)
        for _ in tf.range(200):
            total += tf.reduce_sum(tf.sin(tf.random.uniform([256, 256])))
        v.assign_add(tf.ones([4]))
        return total * 0.0

    @tf.function
    def bad():
        tf.debugging.assert_negative(tf.convert_to_tensor(v) + 1.0, message="rdmadev behaviour: cancel the others")
        return tf.convert_to_tensor(v)

    later, raised = [], None
    try:  # the error may reach schedule() already, or join()
        later += [coordinator.schedule(slow) for _ in range(4)]
        coordinator.schedule(bad)
        later += [coordinator.schedule(slow) for _ in range(12)]
        coordinator.join()
    except tf.errors.InvalidArgumentError as e:
        raised = type(e).__name__ + (": the closure's message" if "cancel the others" in str(e) else "")
    outcomes = set()  # each scheduled closure ran, or its fetch raises what stopped it
    for r in later:
        try:
            r.fetch()
            outcomes.add("ran")
        except (tf.errors.CancelledError, tf.errors.InvalidArgumentError) as e:
            outcomes.add(type(e).__name__)
    # the resources stay usable: a new closure reads the variable
    ok = coordinator.schedule(tf.function(lambda: tf.convert_to_tensor(v) * 0.0)).fetch()
    return {"raised": raised, "accounted": outcomes <= {"ran", "CancelledError", "InvalidArgumentError"},
            "usable": _hex(ok)}


def _swapped():
    """Cross-task tensors rdmadev swapped in the instantiations planned in this process so far
    (0 on TF's own gRPC, which never loads rdmadev)."""
    if "rdmadev" not in sys.modules:
        return 0
    from rdmadev.cluster import reports
    return sum(len(r.swapped) for r in reports.reports())


def main(protocol):
    strategy, coordinator = in_process_pss(
        protocol, variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
    names = sys.argv[2:] or [b.__name__ for b in BEHAVIOURS]
    for fn in (b for b in BEHAVIOURS if b.__name__ in names):
        before = _swapped()
        try:
            line = {"ok": True, "result": fn(strategy, coordinator)}
        except Exception as e:  # pylint: disable=broad-except  (reported, compared per protocol)
            traceback.print_exc()
            line = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:800]}"}
        line["swapped"] = _swapped() - before
        print(f"BEHAVIOUR {fn.__name__} {json.dumps(line)}", flush=True)
    os._exit(0)  # in-process servers cannot be stopped; their threads would hold the exit


if __name__ == "__main__":
    main(sys.argv[1])
