"""RDMADEV_TEST, the suite's own PluggableDevice (tests/devices/, built by
tests/device_plugin.py): TF lists it, copies to it and back are bitwise, a training step runs
its ops there deterministically, and ops it has no kernel for fall to the CPU.

Each test is a fresh `python -c`: a PluggableDevice loads when TF initializes its devices."""
import json
import subprocess
import sys

import numpy as np
import pytest

import device_plugin
from device_plugin import DEVICE, DEVICE_TYPE

device_env = device_plugin.device_env  # the session fixture: built once, cached per machine

pytestmark = pytest.mark.tf

# One `import tensorflow` (3-6 s here) and a few small steps, with room for a loaded machine.
TIMEOUT_S = 120


def _run(code, env):
    """Run `code` after `import tensorflow as tf` with placement logging on (it must be on
    before TF's context starts); return its RESULT line (JSON) and its stdout."""
    prelude = ("import json, numpy as np, tensorflow as tf\n"
               "tf.debugging.set_log_device_placement(True)\n"
               f"D = {DEVICE!r}\n")
    proc = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(lines[0][7:]), proc.stdout


def _placed(stdout, op_type):
    """The devices the placer put nodes of `op_type` on (its log: `name: (Type): device`)."""
    return {l.rsplit(" ", 1)[1] for l in stdout.splitlines() if f": ({op_type}): " in l}


LISTED = """
names = [d.name for d in tf.config.list_logical_devices()]
try:  # eager ops skip shape inference: the kernel itself sees the bad shapes
    with tf.device(D):
        tf.matmul(tf.ones([2, 3]), tf.ones([4, 5]))
    error = None
except tf.errors.InvalidArgumentError as e:
    error = e.message
print("RESULT " + json.dumps({"names": names, "error": error}))
"""


def test_the_device_is_listed_and_its_kernels_errors_name_the_problem(device_env):
    result, _ = _run(LISTED, device_env)
    assert [n for n in result["names"] if DEVICE_TYPE in n] == [DEVICE]
    assert "/device:CPU:0" in result["names"]
    assert "inner dimensions differ: 3 vs 4" in result["error"], result["error"]


COPY = """
out = []
rng = np.random.default_rng(7)
for dtype in ["float32", "int32", "float64", "int64", "uint8", "float16", "complex64", "bool"]:
    for shape in [(3, 5), (0,), (4, 0, 2), (1 << 20,)]:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if dtype == "bool":
            x = rng.integers(0, 2, size=shape).astype(bool)
        else:  # any bits at all, NaN payloads and denormals included
            x = np.frombuffer(rng.bytes(n), dtype=dtype).reshape(shape)
        with tf.device("/device:CPU:0"):
            host = tf.constant(x)
        with tf.device(D):
            on_device = tf.identity(host)
        with tf.device("/device:CPU:0"):
            back = tf.identity(on_device)
        out.append([dtype, list(shape), on_device.device, back.device, back.numpy().tobytes() == x.tobytes(),
                    back.shape.as_list() == list(shape)])
print("RESULT " + json.dumps(out))
"""


def test_a_tensor_copied_to_the_device_and_back_is_bitwise_equal(device_env):
    result, _ = _run(COPY, device_env)
    assert len(result) == 32
    for dtype, shape, on_device, back, equal, same_shape in result:
        assert on_device.endswith(DEVICE), (dtype, shape, on_device)
        assert back.endswith("/device:CPU:0"), (dtype, shape, back)
        assert equal and same_shape, (dtype, shape)


STEP = """
def run(device):
    rng = np.random.default_rng(3)
    x = tf.constant(rng.standard_normal((64, 32), dtype=np.float32))
    with tf.device(device):
        w = tf.Variable(rng.standard_normal((32, 16), dtype=np.float32) * 0.1)

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                h = tf.nn.relu(tf.matmul(x, w))
                loss = (tf.reduce_sum(tf.square(h - 0.5), axis=[0, 1])
                        + tf.reduce_sum(h, axis=0, keepdims=True)[0, 0])
            g = tape.gradient(loss, w)
            w.assign_sub(0.01 * g)
            return loss, g
        outs = []
        for _ in range(3):
            loss, g = step(x)
            outs.append([loss.numpy(), g.numpy(), w.numpy()])
    return outs

dev1, dev2, cpu = run(D), run(D), run("/device:CPU:0")
bits = lambda outs: [[a.tobytes().hex() for a in o] for o in outs]
print("RESULT " + json.dumps({"dev1": bits(dev1), "dev2": bits(dev2),
                              "dev": [[a.tolist() for a in o] for o in dev1],
                              "cpu": [[a.tolist() for a in o] for o in cpu]}))
"""


def test_a_training_step_runs_on_the_device_deterministically_and_matches_the_cpu(device_env):
    result, stdout = _run(STEP, device_env)
    # Deterministic: the same step from the same start gives the same bits.
    assert result["dev1"] == result["dev2"]
    # Not TF's CPU bits (Eigen/oneDNN block their sums differently), but the same numbers.
    for dev, cpu in zip(result["dev"], result["cpu"]):
        for a, b in zip(dev, cpu):
            assert np.allclose(a, b, rtol=1e-5, atol=1e-5), (a, b)
    for op in ("MatMul", "Relu", "ReluGrad", "Square", "Sum", "Sub", "AddV2", "Mul"):
        assert any(d.endswith(DEVICE) for d in _placed(stdout, op)), (op, _placed(stdout, op))


SOFT = """
seed = tf.constant([1, 2])
with tf.device(D):
    eager = tf.random.stateless_uniform([4, 3], seed=seed)

    @tf.function
    def f(x):
        return tf.matmul(tf.random.stateless_uniform([4, 3], seed=seed), x)
    traced = f(tf.ones([3, 2]))
with tf.device("/device:CPU:0"):
    want = tf.random.stateless_uniform([4, 3], seed=seed)
print("RESULT " + json.dumps({"eager": eager.numpy().tolist(), "want": want.numpy().tolist(),
                              "traced": traced.numpy().tolist(), "traced_on": traced.device}))
"""


def test_an_op_without_a_kernel_on_the_device_falls_to_the_cpu(device_env):
    result, stdout = _run(SOFT, device_env)
    assert result["eager"] == result["want"]
    assert np.allclose(result["traced"], np.array(result["want"]) @ np.ones((3, 2)), rtol=1e-6)
    assert result["traced_on"].endswith(DEVICE)
    assert _placed(stdout, "StatelessRandomUniformV2") == {"/job:localhost/replica:0/task:0/device:CPU:0"}
    assert any(d.endswith(DEVICE) for d in _placed(stdout, "MatMul"))
