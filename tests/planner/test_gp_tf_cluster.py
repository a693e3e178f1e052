"""Real partition graphs from a 1 ps + 2 worker loopback cluster: the planner finds TF's own pairs.

Each workload runs once from this process (the coordinator, /job:localhost) with run metadata on,
so the coordinator partitions it and the metadata holds every partition (both halves of each pair).
Run metadata's partitions carry no shapes; as the native pass does with TF's ShapeRefiner, the
tests first run TF's own shape functions over them (``rdmadev.tools.tf_shapes.annotate``): these
tests are the proof that real graphs plan statically from TF's shapes alone.
Keras 3's ``fit`` under a worker device scope is partitioned on the worker, so its partitions never
reach this process's run metadata; instead the test runs the model's own ``train_step`` (what
``fit`` runs per step) inside a tf.function called from the coordinator, compute on worker0 and all
model and optimizer variables on ps.
"""

import textwrap

import pytest

import graph_pass as gp
from graph_pass.devices import task_of as task
from rdmadev.tools.tf_shapes import annotate
from rdmadev._core import PLANNER_RULES as RULES

import tensorflow as tf
from tensorflow.python.eager import context  # noqa: E402

pytestmark = pytest.mark.tf


def tf_pairs(partitions):
    """TF's own cross-task pairs, read straight from TF's protos: {rendezvous key: (send, recv)}."""
    ends = {}
    for gd in partitions:
        for n in gd.node:
            if n.op not in ("_Send", "_Recv"):
                continue
            a = n.attr
            key = (a["tensor_name"].s.decode(), a["send_device"].s.decode(), a["recv_device"].s.decode(),
                   a["send_device_incarnation"].i)
            if task(key[1]) != task(key[2]):
                ends.setdefault(key, [None, None])[0 if n.op == "_Send" else 1] = n.name
    return {k: tuple(v) for k, v in ends.items()}


def capture(fn, *args):
    """Run ``fn`` once with run metadata; return (result, the partitions of its multi-task function)."""
    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        result = fn(*args)
        md = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    sets = [list(fg.partition_graphs) for fg in md.function_graphs]
    return result, max(sets, key=len), md


def check_one_for_one(partitions, plan):
    """The plan's transfers are exactly TF's cross-task pairs, node for node."""
    expected = tf_pairs(partitions)
    found = {(t.tensor_name, t.send_device, t.recv_device, t.send_device_incarnation): (t.send_node, t.recv_node)
             for t in plan.transfers}
    assert found == expected
    assert len(plan.transfers) == len(expected) and all(None not in v for v in expected.values())


@pytest.fixture(scope="module")
def devices(tf_cluster):
    return {k: tf_cluster.device(*k.split(":")[:1], int(k.split(":")[1])) for k in ("ps:0", "worker:0", "worker:1")}


def test_matmul_relu_step_with_variables_on_ps(devices):
    ps, w0, w1 = devices["ps:0"], devices["worker:0"], devices["worker:1"]
    with tf.device(ps):
        w = tf.Variable(tf.ones([4, 8]), name="w")
        b = tf.Variable(tf.zeros([8]), name="b")

    @tf.function
    def step(x):
        with tf.device(w0):
            z = tf.nn.relu(tf.matmul(x, w) + b)
        with tf.device(w1):
            return tf.reduce_sum(z * 2.0)

    y, parts, md = capture(step, tf.ones([2, 4]))
    assert float(y) == pytest.approx(128.0)
    assert len(parts) == 4  # localhost, ps, worker0, worker1
    plan, graph = gp.plan_partitions(annotate(parts), instance_id="mm", return_graph=True, rules=RULES)
    check_one_for_one(parts, plan)
    gp.validate(plan, graph)
    swaps = {(t.src, task(t.send_device), task(t.recv_device)): (t.shape, t.bytes) for t in plan.swapped()}
    assert swaps == {
        ("MatMul/ReadVariableOp", task(ps), task(w0)): ([4, 8], 128),
        ("add/ReadVariableOp", task(ps), task(w0)): ([8], 32),
        ("Relu", task(w0), task(w1)): ([2, 8], 64)}
    assert {t.reason for t in plan.kept()} == {"client_task"}  # x in, the sum out, the returned Identity
    # both reads of ps go to worker 0 at the same level: one bundle, one channel
    reads = [t for t in plan.swapped() if task(t.send_device) == task(ps)]
    assert reads[0].bundle and {t.channel_key for t in reads} == {f"{reads[0].bundle}@mm"}
    first, second = sorted(reads, key=lambda t: t.bundle_offset)
    assert (first.bundle_offset, second.bundle_offset) == (0, -(-first.bytes // 64) * 64)
    assert {t.capacity_bytes for t in reads} == {second.bundle_offset + second.bytes}
    # the same plan from the serialized run metadata (graph_pass's own proto subset)
    (from_bytes,) = [s for s in gp.partition_sets(md.SerializeToString()) if len(s) == 4]
    assert gp.plan_partitions(annotate(from_bytes), instance_id="mm", rules=RULES).to_json() == plan.to_json()
    # TF1-style: each partition planned alone gives the same channel identities
    for gd in parts:
        for t in gp.plan_partitions([gd], rules=RULES).transfers:
            planned = plan.transfer(t.channel_id)
            assert planned.channel_key == f"{planned.bundle or t.channel_id}@mm"


def test_gradient_step_writes_updates_back_to_ps(devices):
    ps, w0 = devices["ps:0"], devices["worker:0"]
    with tf.device(ps):
        w = tf.Variable(tf.ones([4, 8]), name="gw")
        b = tf.Variable(tf.zeros([8]), name="gb")

    @tf.function
    def step(x):
        with tf.device(w0):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.nn.relu(tf.matmul(x, w) + b))
            gw, gb = tape.gradient(loss, [w, b])
        with tf.device(ps):
            w.assign_sub(0.1 * gw)
            b.assign_sub(0.1 * gb)
        return loss

    _, parts, _ = capture(step, tf.ones([2, 4]))
    plan = gp.validate(gp.plan_partitions(annotate(parts), instance_id="g", rules=RULES))
    check_one_for_one(parts, plan)
    up = sorted((t.shape, t.bytes, t.reason) for t in plan.transfers
                if t.send_task.startswith("/job:worker") and t.recv_task.startswith("/job:ps"))
    assert up == [([4, 8], 128, "static"), ([8], 32, "static")]  # the two gradients
    down = sorted((t.shape, t.reason) for t in plan.transfers
                  if t.send_task.startswith("/job:ps") and t.recv_task.startswith("/job:worker"))
    assert down == [([4, 8], "static"), ([8], "static")]  # the two variable reads
    control = [t for t in plan.transfers if t.kind == "control"]
    assert control and all(t.bytes == 0 and t.dtype == "DT_FLOAT" for t in control)
    ps_block = next(b for b in plan.tasks if b.task.startswith("/job:ps"))
    assert ps_block.total_bytes == 4096  # 2 x (64+128) + 2 x (64+64) = 640 B -> one page


def test_keras3_train_step_with_variables_on_ps(devices):
    import keras
    ps, w0 = devices["ps:0"], devices["worker:0"]
    keras.utils.set_random_seed(1)
    with tf.device(ps):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        model.optimizer.build(model.trainable_variables)
    variables = model.variables + model.optimizer.variables
    assert all(v.value.device == ps for v in variables)

    @tf.function
    def train_step(x, y):
        with tf.device(w0):
            return model.train_step((x, y))  # the step Keras 3 fit runs

    x = tf.random.normal([32, 8], seed=1)
    y = tf.random.normal([32, 1], seed=2)
    logs, parts, _ = capture(train_step, x, y)
    assert "loss" in logs
    plan, graph = gp.plan_partitions(annotate(parts), instance_id="k", return_graph=True, rules=RULES)
    check_one_for_one(parts, plan)
    gp.validate(plan, graph)
    between = [t for t in plan.transfers if "localhost" not in t.send_task + t.recv_task]
    assert len(between) > 30  # variable reads down, optimizer updates up
    assert all(t.decision == "swap" and t.reason == "static" for t in between), \
        [(t.label, t.shape, t.reason) for t in between if t.reason != "static"]
    shapes = {tuple(v.shape) for v in variables} | {()}
    assert {tuple(t.shape) for t in between} <= shapes
    reads = {tuple(t.shape) for t in between if t.send_task.startswith("/job:ps")}
    assert {tuple(v.shape) for v in model.trainable_variables} <= reads
    assert {t.dtype for t in between} == {"DT_FLOAT", "DT_INT64"}  # int64: the optimizer's iteration counter
    assert all(t.reason == "client_task" for t in plan.transfers if t not in between)


def test_tf1_session_partitions_planned_per_task(devices, tf_cluster):
    """TF1: each task rewrites only its own partitions; both halves must agree from the attrs alone."""
    ps, w0 = devices["ps:0"], devices["worker:0"]
    g = tf.Graph()
    with g.as_default():
        with tf.device(ps):
            v = tf.compat.v1.get_variable("v1var", initializer=tf.ones([3, 5]), use_resource=True)
        with tf.device(w0):
            x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
            out = tf.matmul(x, v)
        init = tf.compat.v1.global_variables_initializer()
    target = "grpc://" + tf_cluster.spec["worker"][0]
    with tf.compat.v1.Session(target, graph=g) as sess:
        sess.run(init)
        md = tf.compat.v1.RunMetadata()
        sess.run(out, {x: [[1.0] * 3] * 2}, options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                 run_metadata=md)
    parts = list(md.partition_graphs)
    assert {task(n.device) for gd in parts for n in gd.node} >= {task(ps), task(w0)}
    full = gp.plan_partitions(annotate(parts), instance_id="s", rules=RULES)
    check_one_for_one(parts, full)
    by_task = {}
    for gd in parts:
        by_task.setdefault(task(gd.node[0].device), []).append(gd)
    halves = [gp.plan_partitions(gds, rules=RULES) for gds in by_task.values()]
    cross = [t for t in full.transfers if not t.client_terminated]
    assert cross and all(t.channel_key == f"{t.channel_id}@s" for t in cross)
    for t in cross:
        seen = [h.transfer(t.channel_id) for h in halves if any(x.channel_id == t.channel_id for x in h.transfers)]
        assert sorted(x.halves for x in seen) == ["recv", "send"]
        assert {x.reason for x in seen} == {"not_carried_half_pair"}  # same decision on both tasks


def test_cli_runs_a_function_once_and_plans_it(devices, tmp_path, capsys):
    script = tmp_path / "user_step.py"
    script.write_text(textwrap.dedent(f"""
        import tensorflow as tf
        with tf.device("{devices['ps:0']}"):
            v = tf.Variable(tf.ones([16, 16]))

        @tf.function
        def step():
            with tf.device("{devices['worker:1']}"):
                return tf.reduce_sum(tf.matmul(v, v))

        def run():
            step()
    """))
    from rdmadev.tools import plan as cli

    assert cli.main([f"{script}:run", "--out", str(tmp_path / "p.svg")]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "ps:0 -> worker:1" in line)
    assert "[16,16]" in row and "1024" in row and "swap" in row and "static" in row
    assert (tmp_path / "p.svg").exists()


def test_cli_reports_a_failing_function_and_a_missing_one(tmp_path, capsys):
    from rdmadev.tools import plan as cli

    script = tmp_path / "broken_step.py"
    script.write_text("def run():\n    raise ValueError('no data')\n")
    assert cli.main([f"{script}:run"]) == 1
    assert "failed: ValueError: no data" in capsys.readouterr().err
    assert cli.main([f"{script}:missing"]) == 2
    assert "has no callable 'missing'" in capsys.readouterr().err


def test_conv_bias_gradient_is_never_planned_with_a_wrong_size(devices):
    """Regression (commit 3601043): oneDNN fuses the conv filter and bias gradients into one op whose
    TF shape function gives the bias gradient the input channels; that shape is never trusted."""
    ps, w0 = devices["ps:0"], devices["worker:0"]
    with tf.device(ps):
        f = tf.Variable(tf.random.stateless_normal([3, 3, 3, 8], [1, 9]) * 0.1, name="cf")
        bias = tf.Variable(tf.zeros([8]), name="cb")

    @tf.function
    def step(i):
        with tf.device(w0):
            x = tf.random.stateless_uniform([4, 16, 16, 3], [i, 5])
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, f, 1, "SAME"), bias))))
            gf, gb = tape.gradient(loss, [f, bias])
        with tf.device(ps):
            f.assign_sub(0.1 * gf)
            bias.assign_sub(0.1 * gb)
        return loss

    _, parts, _ = capture(step, tf.constant(1, tf.int64))
    plan = gp.validate(gp.plan_partitions(annotate(parts), instance_id="c", rules=RULES))
    check_one_for_one(parts, plan)
    up = [t for t in plan.transfers if t.kind == "data" and t.send_task == task(w0) and t.recv_task == task(ps)]
    assert len(up) == 2
    for t in up:  # each gradient: its variable's exact shape, or unknown and kept; never another size
        assert (t.shape, t.reason) in (([3, 3, 3, 8], "static"), ([8], "static")) or \
            (t.decision == "keep" and t.bytes is None), (t.label, t.shape, t.shape_source)
    assert ([3, 3, 3, 8], "static") in [(t.shape, t.reason) for t in up]
