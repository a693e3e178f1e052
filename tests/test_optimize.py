"""rdmadev.optimize without a cluster: what it returns and what it refuses (the cluster behaviour
is in tests/e2e: ParameterServerStrategy, strategy.run, Keras, export)."""
import copy
import pickle
import re

import pytest

import tensorflow as tf
import rdmadev  # noqa: E402
from rdmadev.tf import api, serving  # noqa: E402


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    """These tests are about one process with no cluster, whatever other tests in this
    process connected to."""
    monkeypatch.setattr(serving, "connected_cluster", lambda: None)
    monkeypatch.delenv("TF_CONFIG", raising=False)


def test_the_mark_is_the_one_the_pass_defines():
    assert api.opt_in_marker() == "__rdmadev_"


def test_a_tf_function_keeps_its_class_options_and_signature():
    spec = [tf.TensorSpec([None, 3], tf.float32)]
    f = tf.function(lambda x: x * 2.0, input_signature=spec, reduce_retracing=True)
    g = rdmadev.optimize(f)
    assert isinstance(g, type(f)) and isinstance(g, tf.types.experimental.PolymorphicFunction)
    assert g.input_signature == f.input_signature
    assert g._reduce_retracing and g._jit_compile is None  # pylint: disable=protected-access
    assert re.fullmatch(r"<lambda>__rdmadev_[0-9a-f]{8}", g._name)  # pylint: disable=protected-access
    assert rdmadev.optimize(g) is g
    assert rdmadev.optimize(f).rdmadev_token != g.rdmadev_token  # one token per optimize call


def test_a_python_function_and_the_decorator_forms():
    @rdmadev.optimize
    def double(x):
        """Doubles."""
        return x * 2

    @rdmadev.optimize(cluster={"worker": ["127.0.0.1:1"]})
    def triple(x):
        return x * 3

    assert double.__name__ == "double" and double.__doc__ == "Doubles."
    assert re.match(r"double__rdmadev_", double.get_concrete_function(tf.TensorSpec([], tf.int32)).name.decode()
                    .removeprefix("__inference_"))
    assert triple._rdmadev_cluster == {"worker": ["127.0.0.1:1"]}  # pylint: disable=protected-access


def test_a_method_stays_marked_when_bound():
    class Model(tf.Module):
        @rdmadev.optimize
        def step(self, x):
            return x + 1

    bound = Model().step
    assert api.opt_in_marker() in bound._name  # pylint: disable=protected-access
    assert type(bound) is type(Model.__dict__["step"])  # with report and reports


def test_called_while_another_function_is_traced_it_is_traced_inline_under_its_mark():
    """Keras calls train_step inside its own train function, inside strategy.run: a nested
    tf.function could not aggregate gradients there, so the optimized function is traced into
    its caller, autograph included, under a name scope carrying the mark (which opts the
    caller in: pass.cc AddMarkedScope)."""
    @rdmadev.optimize
    def clip(x):
        if tf.reduce_sum(x) > 0:  # autograph: a tf.cond, as tf.function would trace it
            return x * 2.0
        return x * 0.0

    @tf.function
    def outer(x):
        return clip(x) + clip(-x)

    graph = outer.get_concrete_function(tf.TensorSpec([3], tf.float32)).graph
    names = [op.name for op in graph.get_operations()]
    scope = f"clip__rdmadev_{clip.rdmadev_token}"
    assert any(n.startswith(scope + "/") for n in names)
    assert any(n.startswith(scope + "_1/") for n in names)  # the pass strips the "_1"
    assert not any(op.type in ("PartitionedCall", "StatefulPartitionedCall")
                   for op in graph.get_operations())
    assert any(op.type in ("If", "StatelessIf") for op in graph.get_operations())
    assert outer(tf.constant([1.0, 2.0, 3.0])).numpy().tolist() == [2.0, 4.0, 6.0]
    assert clip.experimental_get_tracing_count() == 0  # never a function of its own


def test_without_a_cluster_it_runs_and_exports_like_the_tf_function(tmp_path):
    module = tf.Module()
    module.double = rdmadev.optimize(tf.function(lambda x: x * 2.0,
                                                 input_signature=[tf.TensorSpec([None], tf.float32)]))
    assert module.double(tf.ones([2])).numpy().tolist() == [2.0, 2.0]
    tf.saved_model.save(module, str(tmp_path))
    assert tf.saved_model.load(str(tmp_path)).double(tf.ones([3])).numpy().tolist() == [2.0] * 3


def halve(x):
    """A module-level function: pickle refers to it by name."""
    return x / 2.0


def test_a_copy_or_a_pickled_one_is_the_same_function_and_prepares_again():
    """Optimized is TF's class, so it copies and pickles as a tf.function does (until it is
    traced: TF's FuncGraph does not pickle). What holds only in the process that prepared it
    (the pass loaded there, its tasks checked, the traces it watches) is not carried along, so
    a copy loaded in another process checks its cluster at its first call instead of running
    on gRPC silently."""
    g = rdmadev.optimize(tf.function(halve))
    # As once prepared in a process with a cluster (here there is none to prepare for).
    g._rdmadev_ready, g._rdmadev_traced = True, 1  # pylint: disable=protected-access
    for other in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g)):
        assert type(other) is type(g) and other._name == g._name  # pylint: disable=protected-access
        assert other.rdmadev_token == g.rdmadev_token
        assert not other._rdmadev_ready and other._rdmadev_traced == 0  # pylint: disable=protected-access
        assert other(tf.constant(5.0)).numpy() == 2.5
    assert g._rdmadev_ready  # pylint: disable=protected-access


@pytest.mark.parametrize("bad, named", [(None, "NoneType"), (3, "int")])
def test_what_is_not_a_function_is_refused(bad, named):
    with pytest.raises(TypeError, match=f"tf.function or a Python function, not {named}"):
        rdmadev.optimize(bad)


def test_a_concrete_function_is_refused_with_the_fix():
    cf = tf.function(lambda x: x).get_concrete_function(tf.TensorSpec([], tf.float32))
    with pytest.raises(TypeError, match="pass the tf.function it came from"):
        rdmadev.optimize(cf)
