"""DLPack data types: validation, names, and parsing of the spellings callers and producers use."""
from libc.stdint cimport int64_t
from cudnn_graph._dlpack cimport (
    DLDataType, kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex, kDLBool, kDLOpaqueHandle,
    kDLFloat8_e3m4, kDLFloat8_e4m3, kDLFloat8_e4m3b11fnuz, kDLFloat8_e4m3fn, kDLFloat8_e4m3fnuz,
    kDLFloat8_e5m2, kDLFloat8_e5m2fnuz, kDLFloat8_e8m0fnu, kDLFloat6_e2m3fn, kDLFloat6_e3m2fn,
    kDLFloat4_e2m1fn, CG_DL_TYPE_CODE_COUNT)

from cudnn_graph.errors import MalformedBufferError

# (code, bits) -> canonical name; the names are NumPy's / ml_dtypes' spellings.
_NAMES = {
    (kDLInt, 4): "int4", (kDLInt, 8): "int8", (kDLInt, 16): "int16", (kDLInt, 32): "int32",
    (kDLInt, 64): "int64",
    (kDLUInt, 4): "uint4", (kDLUInt, 8): "uint8", (kDLUInt, 16): "uint16", (kDLUInt, 32): "uint32",
    (kDLUInt, 64): "uint64",
    (kDLFloat, 16): "float16", (kDLFloat, 32): "float32", (kDLFloat, 64): "float64",
    (kDLBfloat, 16): "bfloat16",
    (kDLComplex, 64): "complex64", (kDLComplex, 128): "complex128",
    (kDLBool, 8): "bool",
    (kDLFloat8_e3m4, 8): "float8_e3m4", (kDLFloat8_e4m3, 8): "float8_e4m3",
    (kDLFloat8_e4m3b11fnuz, 8): "float8_e4m3b11fnuz", (kDLFloat8_e4m3fn, 8): "float8_e4m3fn",
    (kDLFloat8_e4m3fnuz, 8): "float8_e4m3fnuz", (kDLFloat8_e5m2, 8): "float8_e5m2",
    (kDLFloat8_e5m2fnuz, 8): "float8_e5m2fnuz", (kDLFloat8_e8m0fnu, 8): "float8_e8m0fnu",
    (kDLFloat6_e2m3fn, 6): "float6_e2m3fn", (kDLFloat6_e3m2fn, 6): "float6_e3m2fn",
    (kDLFloat4_e2m1fn, 4): "float4_e2m1fn",
}
_BY_NAME = {name: key for key, name in _NAMES.items()}
_BY_NAME.update({
    "bf16": (kDLBfloat, 16), "fp16": (kDLFloat, 16), "half": (kDLFloat, 16), "fp32": (kDLFloat, 32),
    "float": (kDLFloat, 32), "fp64": (kDLFloat, 64), "double": (kDLFloat, 64), "bool_": (kDLBool, 8),
    "boolean": (kDLBool, 8),
})
# NumPy typestr kind + itemsize (bytes) -> (code, bits) for the array-interface protocols.
_TYPESTR = {
    ("i", 1): (kDLInt, 8), ("i", 2): (kDLInt, 16), ("i", 4): (kDLInt, 32), ("i", 8): (kDLInt, 64),
    ("u", 1): (kDLUInt, 8), ("u", 2): (kDLUInt, 16), ("u", 4): (kDLUInt, 32), ("u", 8): (kDLUInt, 64),
    ("f", 2): (kDLFloat, 16), ("f", 4): (kDLFloat, 32), ("f", 8): (kDLFloat, 64),
    ("c", 8): (kDLComplex, 64), ("c", 16): (kDLComplex, 128), ("b", 1): (kDLBool, 8),
}

ALL_DTYPE_NAMES = tuple(_NAMES.values())


cdef inline DLDataType _make(int code, int bits) noexcept:
    cdef DLDataType dt
    dt.code = <unsigned char>code
    dt.bits = <unsigned char>bits
    dt.lanes = 1
    return dt


# _VALID[code][bits]: the (code, bits) pairs _NAMES knows, as a C table for the import hot path.
cdef bint _VALID[CG_DL_TYPE_CODE_COUNT][256]
for (_code, _bits) in _NAMES:
    _VALID[_code][_bits] = True


cdef str _describe(object what):
    """``what`` names the producer in messages: a str, or a type (named lazily, on the error path)."""
    if isinstance(what, type):
        return (<type>what).__name__
    return str(what)


cdef int validate_dtype(DLDataType dt, object what) except -1:
    """Reject what no consumer can interpret: unknown codes, vector lanes, impossible widths."""
    if dt.lanes == 1 and dt.code < CG_DL_TYPE_CODE_COUNT and _VALID[dt.code][dt.bits]:
        return 0
    if dt.lanes != 1:
        raise MalformedBufferError(
            f"{_describe(what)}: vector data types are not supported (lanes={dt.lanes}; expected 1)")
    if dt.code == kDLOpaqueHandle:
        raise MalformedBufferError(
            f"{_describe(what)}: opaque-handle data (type code 3) has no element type")
    if dt.code >= CG_DL_TYPE_CODE_COUNT:
        raise MalformedBufferError(f"{_describe(what)}: unknown DLPack type code {dt.code}")
    raise MalformedBufferError(
        f"{_describe(what)}: DLPack type code {dt.code} cannot have {dt.bits} bits")


cdef str dtype_name(DLDataType dt):
    name = _NAMES.get((dt.code, dt.bits))
    if name is None:
        return f"dlpack(code={dt.code}, bits={dt.bits}, lanes={dt.lanes})"
    if dt.lanes != 1:
        return f"{name}x{dt.lanes}"
    return name


cdef int64_t dtype_bits(DLDataType dt) noexcept nogil:
    return <int64_t>dt.bits * dt.lanes


cdef DLDataType parse_dtype(object value) except *:
    """A DLDataType from a name, a (code, bits[, lanes]) tuple, a NumPy/ml_dtypes dtype or a DataType."""
    cdef DLDataType dt
    if isinstance(value, tuple):
        if len(value) not in (2, 3):
            raise TypeError(f"a dtype tuple is (code, bits[, lanes]); got {value!r}")
        dt.code = value[0]
        dt.bits = value[1]
        dt.lanes = value[2] if len(value) == 3 else 1
        validate_dtype(dt, "dtype")
        return dt
    if isinstance(value, str):
        key = _BY_NAME.get(value.strip().lower())
        if key is not None:
            return _make(key[0], key[1])
    # cudnn_graph.DataType (an IntEnum) and every other spelling data_type_of understands.
    from cudnn_graph.data_type import DataType, data_type_of, dlpack_code_of
    if not isinstance(value, (str, int)) or isinstance(value, DataType):
        try:
            import numpy
            name = numpy.dtype(value).name
            key = _BY_NAME.get(name)
            if key is not None:
                return _make(key[0], key[1])
        except Exception:
            pass
    try:
        code, bits = dlpack_code_of(data_type_of(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot interpret {value!r} as a data type: {exc}") from None
    return _make(code, bits)


cdef DLDataType parse_typestr(str typestr, object descr) except *:
    """An array-interface typestr ('<f4', '|b1', '<V2' + descr naming bfloat16) as a DLDataType."""
    if len(typestr) < 3 or typestr[0] not in "<>|=":
        raise MalformedBufferError(f"malformed typestr {typestr!r}")
    if typestr[0] == ">":
        raise MalformedBufferError(f"big-endian data ({typestr!r}) is not supported")
    kind = typestr[1]
    try:
        size = int(typestr[2:])
    except ValueError:
        raise MalformedBufferError(f"malformed typestr {typestr!r}") from None
    key = _TYPESTR.get((kind, size))
    if key is not None:
        return _make(key[0], key[1])
    if kind == "V":
        # Producers describe extension types (bfloat16, float8_*) as raw bytes named in descr.
        name = None
        if isinstance(descr, (list, tuple)) and len(descr) == 1:
            field = descr[0]
            if isinstance(field, (list, tuple)) and len(field) >= 1 and isinstance(field[0], str):
                name = field[0]
        if name:
            key = _BY_NAME.get(name.lower())
            if key is not None and key[1] == size * 8:
                return _make(key[0], key[1])
        raise MalformedBufferError(
            f"typestr {typestr!r} is raw bytes and descr {descr!r} names no known {size * 8}-bit type")
    raise MalformedBufferError(f"unsupported typestr {typestr!r}")


def _dtype_name_of(value) -> str:
    """Canonical DLPack name of any dtype spelling (for tests and error messages)."""
    return dtype_name(parse_dtype(value))
