"""graph_pass's proto subset and dtype table agree with the installed TensorFlow (no servers needed)."""

import pytest

from graph_pass import _proto
from graph_pass.dtypes import DTYPES, dtype_size

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, tensor_pb2, tensor_shape_pb2  # noqa: E402
from tensorflow.core.framework import types_pb2  # noqa: E402
from tensorflow.core.protobuf import config_pb2  # noqa: E402

PAIRS = [(_proto.GraphDef, graph_pb2.GraphDef), (_proto.NodeDef, node_def_pb2.NodeDef),
         (_proto.AttrValue, attr_value_pb2.AttrValue), (_proto.TensorShapeProto, tensor_shape_pb2.TensorShapeProto),
         (_proto.TensorProto, tensor_pb2.TensorProto), (_proto.RunMetadata, config_pb2.RunMetadata)]


def _check(ours, theirs):
    for f in ours.fields:
        t = theirs.fields_by_name.get(f.name)
        assert t is not None, f"{ours.full_name}.{f.name} is not in TF's {theirs.full_name}"
        assert t.number == f.number, f"{ours.full_name}.{f.name}"
        assert (f.message_type is None) == (t.message_type is None), f"{ours.full_name}.{f.name}"
        if f.type == f.TYPE_INT32 and t.type == t.TYPE_ENUM:
            continue  # DataType enums are varints on the wire, like int32
        assert t.type == f.type, f"{ours.full_name}.{f.name}: {f.type} vs TF {t.type}"
        if f.message_type is not None and f.message_type.full_name != ours.full_name:
            _check(f.message_type, t.message_type)


@pytest.mark.parametrize("ours,theirs", PAIRS, ids=lambda c: getattr(c, "__name__", str(c)))
def test_subset_fields_match_tensorflow(ours, theirs):
    _check(ours.DESCRIPTOR, theirs.DESCRIPTOR)


def test_dtype_table_matches_tensorflow():
    tf_values = {v: k for k, v in types_pb2.DataType.items() if 0 < v < 100}
    assert {v: name for v, (name, _) in DTYPES.items()} == tf_values
    for value, (name, size) in DTYPES.items():
        if size is None:
            assert name in ("DT_STRING", "DT_RESOURCE", "DT_VARIANT")
            continue
        try:
            dt = tf.dtypes.as_dtype(value)
        except TypeError:
            continue  # a few newest types have no Python DType; their C++ size is 1 byte
        assert dt.size == dtype_size(value), name


def test_tf_graphdef_bytes_parse_with_the_subset():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        tf.nn.relu(tf.matmul(x, tf.ones([3, 2])), name="y")
    ours = _proto.GraphDef.FromString(g.as_graph_def().SerializeToString())
    assert [n.name for n in ours.node] == [n.name for n in g.as_graph_def().node]
    x_node = next(n for n in ours.node if n.name == "x")
    assert x_node.attr["dtype"].type == 1 and [d.size for d in x_node.attr["shape"].shape.dim] == [-1, 3]
