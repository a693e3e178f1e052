"""A wire-compatible subset of TF's GraphDef / RunMetadata protos, so graph_pass never imports TF.

Serialized GraphDef bytes (what the native pass hands over) and RunMetadata bytes (saved by a user)
parse with these classes; the field names and numbers are TF's own (tensorflow/core/framework/
graph.proto, node_def.proto, attr_value.proto, tensor_shape.proto, tensor.proto and
core/protobuf/config.proto), so the same attribute-reading code works on TF's message objects and
on ours. Fields left out of the subset are skipped when parsing. DataType enums are declared as
int32, which is the same varint on the wire. A test compares every field with TF's descriptors.

The classes live in a private descriptor pool, so they never clash with TF's ``tensorflow.*`` types.
"""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["GraphDef", "NodeDef", "AttrValue", "TensorShapeProto", "TensorProto", "RunMetadata",
           "PACKAGE"]

#: Proto package of the subset (distinct from TF's "tensorflow" package).
PACKAGE = "rdmadev_graph_pass.tf"

_F = descriptor_pb2.FieldDescriptorProto
_T = {"int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64, "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES,
      "bool": _F.TYPE_BOOL, "float": _F.TYPE_FLOAT, "msg": _F.TYPE_MESSAGE}

# message name -> [(field name, number, type, repeated, message type name or None, oneof or None)]
_SCHEMA = {
    "TensorShapeProto.Dim": [("size", 1, "int64", False, None, None), ("name", 2, "string", False, None, None)],
    "TensorShapeProto": [("dim", 2, "msg", True, "TensorShapeProto.Dim", None),
                         ("unknown_rank", 3, "bool", False, None, None)],
    "TensorProto": [("dtype", 1, "int32", False, None, None),
                    ("tensor_shape", 2, "msg", False, "TensorShapeProto", None),
                    ("tensor_content", 4, "bytes", False, None, None),
                    ("int_val", 7, "int32", True, None, None), ("int64_val", 10, "int64", True, None, None)],
    "AttrValue.ListValue": [("s", 2, "bytes", True, None, None), ("i", 3, "int64", True, None, None),
                            ("f", 4, "float", True, None, None), ("b", 5, "bool", True, None, None),
                            ("type", 6, "int32", True, None, None),
                            ("shape", 7, "msg", True, "TensorShapeProto", None),
                            ("tensor", 8, "msg", True, "TensorProto", None)],
    "AttrValue": [("list", 1, "msg", False, "AttrValue.ListValue", "value"),
                  ("s", 2, "bytes", False, None, "value"), ("i", 3, "int64", False, None, "value"),
                  ("f", 4, "float", False, None, "value"), ("b", 5, "bool", False, None, "value"),
                  ("type", 6, "int32", False, None, "value"),
                  ("shape", 7, "msg", False, "TensorShapeProto", "value"),
                  ("tensor", 8, "msg", False, "TensorProto", "value"),
                  ("placeholder", 9, "string", False, None, "value")],
    "NodeDef.AttrEntry": [("key", 1, "string", False, None, None), ("value", 2, "msg", False, "AttrValue", None)],
    "NodeDef": [("name", 1, "string", False, None, None), ("op", 2, "string", False, None, None),
                ("input", 3, "string", True, None, None), ("device", 4, "string", False, None, None),
                ("attr", 5, "msg", True, "NodeDef.AttrEntry", None)],
    "GraphDef": [("node", 1, "msg", True, "NodeDef", None)],
    "RunMetadata.FunctionGraphs": [("partition_graphs", 1, "msg", True, "GraphDef", None),
                                   ("pre_optimization_graph", 2, "msg", False, "GraphDef", None),
                                   ("post_optimization_graph", 3, "msg", False, "GraphDef", None)],
    "RunMetadata": [("partition_graphs", 3, "msg", True, "GraphDef", None),
                    ("function_graphs", 4, "msg", True, "RunMetadata.FunctionGraphs", None)],
}


def _build():
    fdp = descriptor_pb2.FileDescriptorProto(name="rdmadev_graph_pass_tf_subset.proto", package=PACKAGE,
                                             syntax="proto3")
    protos = {}
    for full in sorted(_SCHEMA, key=lambda n: n.count(".")):  # parents before their nested types
        outer, _, inner = full.rpartition(".")
        parent = protos[outer].nested_type if outer else fdp.message_type
        protos[full] = parent.add(name=inner)
    protos["NodeDef.AttrEntry"].options.map_entry = True
    for full, fields in _SCHEMA.items():
        msg = protos[full]
        oneofs = {}
        for name, number, kind, repeated, type_name, oneof in fields:
            f = msg.field.add(name=name, number=number, type=_T[kind],
                              label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
            if type_name:
                f.type_name = f".{PACKAGE}.{type_name}"
            if oneof:
                if oneof not in oneofs:
                    oneofs[oneof] = len(msg.oneof_decl)
                    msg.oneof_decl.add(name=oneof)
                f.oneof_index = oneofs[oneof]
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {full: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{full}"))
            for full in ("GraphDef", "NodeDef", "AttrValue", "TensorShapeProto", "TensorProto", "RunMetadata")}


_CLASSES = _build()
GraphDef = _CLASSES["GraphDef"]
NodeDef = _CLASSES["NodeDef"]
AttrValue = _CLASSES["AttrValue"]
TensorShapeProto = _CLASSES["TensorShapeProto"]
TensorProto = _CLASSES["TensorProto"]
RunMetadata = _CLASSES["RunMetadata"]
