"""Layers for the benchmark models: functions over a ``Params`` store of tf.Variables.

The store creates each variable on first use (one eager dry run), on the device the harness
chose for it (greedy by size over the ps tasks, as tf_cnn_benchmarks' greedy placement), and
returns the same variable on every later call, so the traced training step reads exactly the
variables that were built. Padding is SAME everywhere so small image sizes (32 px) keep every
model valid; batch norm uses batch statistics (no moving averages), so no extra assign per step.
"""
import hashlib
import math

__all__ = ["Params", "conv", "dense", "max_pool", "avg_pool", "global_pool", "flatten"]


class Params:
    """Named variables of one model, created on first use on the least-loaded device.

    Args:
        tf: the tensorflow module.
        devices: device strings the variables are spread over (greedy by bytes).
        bias_op: "add" (conv bias as ``x + b``, the default, so results compare with the runs
            recorded in BENCHMARKS.md) or "bias_add" (``tf.nn.bias_add``). With bias_add, oneDNN
            fuses the bias gradient into ``_MklNativeConv2DBackpropFilterWithBias``, whose
            registered shape function gives output 1 the conv's *input* channels; the pass does
            not trust ``_Mkl*`` shape functions past output 0 (commit 3601043, e2e regression
            test ``test_conv_with_bias_gradient``), so both work.
    """

    def __init__(self, tf, devices, bias_op="add"):
        self.tf = tf
        self.bias_op = bias_op
        self.devices = list(devices)
        self.load = {d: 0 for d in self.devices}
        self.vars = {}
        self.order = []
        self._count = 0

    def begin(self):
        """Starts a forward pass: layer names are assigned in call order."""
        self._count = 0

    def name(self, kind):
        self._count += 1
        return f"{kind}{self._count}"

    def get(self, name, shape, fan_in=None, zeros=False, ones=False):
        tf = self.tf
        if name in self.vars:
            return self.vars[name]
        device = min(self.devices, key=lambda d: (self.load[d], self.devices.index(d)))
        nbytes = 4 * math.prod(shape)
        self.load[device] += nbytes
        seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
        with tf.device(device):
            if zeros:
                init = tf.zeros(shape)
            elif ones:
                init = tf.ones(shape)
            else:  # He init; deterministic per name so every run starts from the same weights
                init = tf.random.stateless_normal(shape, [seed, 0]) * math.sqrt(2.0 / fan_in)
            v = tf.Variable(init, name=name)
        self.vars[name] = v
        self.order.append(v)
        return v

    @property
    def nbytes(self):
        return sum(self.load.values())


def conv(p, x, filters, kh, kw=None, stride=1, bn=False, relu=True):
    """Conv2D (SAME) + bias, or + batch norm (batch statistics), then ReLU."""
    tf = p.tf
    kw = kw or kh
    name = p.name("conv")
    cin = x.shape[-1]
    w = p.get(name + "/w", [kh, kw, cin, filters], fan_in=kh * kw * cin)
    y = tf.nn.conv2d(x, w, stride, "SAME")
    if bn:
        scale = p.get(name + "/gamma", [filters], ones=True)
        offset = p.get(name + "/beta", [filters], zeros=True)
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(y, scale, offset, is_training=True)
    elif p.bias_op == "bias_add":
        y = tf.nn.bias_add(y, p.get(name + "/b", [filters], zeros=True))
    else:  # same math; its gradient is Sum + Reshape, which oneDNN does not fuse
        y = y + p.get(name + "/b", [filters], zeros=True)
    return tf.nn.relu(y) if relu else y


def dense(p, x, units, relu=True):
    tf = p.tf
    name = p.name("fc")
    w = p.get(name + "/w", [x.shape[-1], units], fan_in=x.shape[-1])
    y = tf.matmul(x, w) + p.get(name + "/b", [units], zeros=True)
    return tf.nn.relu(y) if relu else y


def max_pool(p, x, k=3, stride=2):
    return p.tf.nn.max_pool2d(x, k, stride, "SAME")


def avg_pool(p, x, k=3, stride=1):
    return p.tf.nn.avg_pool2d(x, k, stride, "SAME")


def global_pool(p, x):
    return p.tf.reduce_mean(x, axis=[1, 2])


def flatten(p, x):
    return p.tf.reshape(x, [-1, math.prod(x.shape[1:])])
