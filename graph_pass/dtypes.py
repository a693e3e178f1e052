"""TensorFlow DataType enum values, their names and element sizes (from TF's types.proto).

The `_Send` node carries its dtype in attr ``T`` and the `_Recv` node in ``tensor_type``; both are
the DataType enum as an int. Reference types are the base value + ``REF_OFFSET`` and never cross
tasks as values.
"""

__all__ = ["DTYPES", "UNSUPPORTED", "REF_OFFSET", "dtype_name", "dtype_size"]

#: DataType enum value -> (name, bytes per element). Sizes follow TF's DataTypeSize(); the 4- and
#: 2-bit integer types and FLOAT4 are stored one element per byte in TF tensors, hence 1.
#: DT_STRING, DT_RESOURCE and DT_VARIANT have no fixed size (None): their bytes are host objects.
DTYPES = {
    1: ("DT_FLOAT", 4), 2: ("DT_DOUBLE", 8), 3: ("DT_INT32", 4), 4: ("DT_UINT8", 1),
    5: ("DT_INT16", 2), 6: ("DT_INT8", 1), 7: ("DT_STRING", None), 8: ("DT_COMPLEX64", 8),
    9: ("DT_INT64", 8), 10: ("DT_BOOL", 1), 11: ("DT_QINT8", 1), 12: ("DT_QUINT8", 1),
    13: ("DT_QINT32", 4), 14: ("DT_BFLOAT16", 2), 15: ("DT_QINT16", 2), 16: ("DT_QUINT16", 2),
    17: ("DT_UINT16", 2), 18: ("DT_COMPLEX128", 16), 19: ("DT_HALF", 2), 20: ("DT_RESOURCE", None),
    21: ("DT_VARIANT", None), 22: ("DT_UINT32", 4), 23: ("DT_UINT64", 8), 24: ("DT_FLOAT8_E5M2", 1),
    25: ("DT_FLOAT8_E4M3FN", 1), 26: ("DT_FLOAT8_E4M3FNUZ", 1), 27: ("DT_FLOAT8_E4M3B11FNUZ", 1),
    28: ("DT_FLOAT8_E5M2FNUZ", 1), 29: ("DT_INT4", 1), 30: ("DT_UINT4", 1), 31: ("DT_INT2", 1),
    32: ("DT_UINT2", 1), 33: ("DT_FLOAT4_E2M1FN", 1),
}
#: Offset of reference dtypes (DT_FLOAT_REF = 101).
REF_OFFSET = 100
#: Dtypes that always stay on gRPC: their tensors hold host objects, not flat bytes.
UNSUPPORTED = frozenset({"DT_STRING", "DT_VARIANT", "DT_RESOURCE"})


def dtype_name(value):
    """Return the DataType name of an enum value, e.g. ``1 -> "DT_FLOAT"``.

    Args:
        value: the enum as an int (a `T` / `tensor_type` attr).

    Returns:
        The name; reference types end in ``_REF``; unknown values give ``"DT_UNKNOWN_<n>"``.
    """
    if value > REF_OFFSET and value - REF_OFFSET in DTYPES:
        return DTYPES[value - REF_OFFSET][0] + "_REF"
    entry = DTYPES.get(value)
    return entry[0] if entry else f"DT_UNKNOWN_{value}"


def dtype_size(value):
    """Return bytes per element of a DataType enum value, or None when it has no fixed size.

    Args:
        value: the enum as an int.

    Returns:
        An int, or None for string/resource/variant, reference and unknown types.
    """
    entry = DTYPES.get(value)
    return entry[1] if entry else None
