"""Tensor data types: cuDNN's codes, DLPack's codes and every framework's spelling of them.

``DataType`` values are cuDNN's ``cudnnDataType_t`` codes, so a lowering passes them through
unchanged. ``data_type_of(x)`` accepts a ``DataType``, its name, a NumPy / ml_dtypes dtype, or a
framework dtype object (``torch.bfloat16``, ``jnp.float16``, a CuPy dtype), recognised by name so
that no framework is imported.

Example:
    >>> from cudnn_graph.data_type import DataType, data_type_of
    >>> data_type_of("bf16") is DataType.BFLOAT16
    True
"""
from __future__ import annotations

from typing import Any

from .enums import DataType   # defined with the package's other enums; re-exported here

__all__ = ["DataType", "data_type_of", "dlpack_code_of", "data_type_from_dlpack", "itemsize_bits", "numpy_dtype"]


# DLPack type codes (include/cudnn_graph/dlpack.h).
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_COMPLEX, _DL_BOOL = 0, 1, 2, 4, 5, 6
_DL_F8_E4M3FN, _DL_F8_E5M2, _DL_F8_E8M0FNU, _DL_F4_E2M1FN = 10, 12, 14, 17

# DataType -> (DLPack code, bits). cuDNN's FP8_E4M3 is the "fn" variant (no infinities).
_TO_DLPACK: dict[DataType, tuple[int, int]] = {
    DataType.FLOAT: (_DL_FLOAT, 32),
    DataType.DOUBLE: (_DL_FLOAT, 64),
    DataType.HALF: (_DL_FLOAT, 16),
    DataType.INT8: (_DL_INT, 8),
    DataType.INT32: (_DL_INT, 32),
    DataType.UINT8: (_DL_UINT, 8),
    DataType.BFLOAT16: (_DL_BFLOAT, 16),
    DataType.INT64: (_DL_INT, 64),
    DataType.BOOLEAN: (_DL_BOOL, 8),
    DataType.FP8_E4M3: (_DL_F8_E4M3FN, 8),
    DataType.FP8_E5M2: (_DL_F8_E5M2, 8),
    DataType.FP8_E8M0: (_DL_F8_E8M0FNU, 8),
    DataType.FP4_E2M1: (_DL_F4_E2M1FN, 4),
    DataType.INT4: (_DL_INT, 4),
    DataType.UINT4: (_DL_UINT, 4),
    DataType.UINT32: (_DL_UINT, 32),
    DataType.COMPLEX_FP32: (_DL_COMPLEX, 64),
    DataType.COMPLEX_FP64: (_DL_COMPLEX, 128),
}
_FROM_DLPACK = {v: k for k, v in _TO_DLPACK.items()}

_BITS = {dt: bits for dt, (_, bits) in _TO_DLPACK.items()}
_BITS.update({DataType.INT8x4: 32, DataType.UINT8x4: 32, DataType.INT8x32: 256,
              DataType.FAST_FLOAT_FOR_FP8: 32, DataType.NOT_SET: 0})

# Every spelling seen in the wild, lower-cased, with any "torch." / "jnp." / "numpy." prefix removed.
_ALIASES: dict[str, DataType] = {}
for _dt, _names in {
    DataType.FLOAT: ("float", "float32", "fp32", "f4", "<f4", "single"),
    DataType.DOUBLE: ("double", "float64", "fp64", "f8", "<f8"),
    DataType.HALF: ("half", "float16", "fp16", "f2", "<f2"),
    DataType.BFLOAT16: ("bfloat16", "bf16"),
    DataType.INT8: ("int8", "i1", "|i1"),
    DataType.UINT8: ("uint8", "u1", "|u1"),
    DataType.INT32: ("int32", "i4", "<i4", "int"),
    DataType.INT64: ("int64", "i8", "<i8", "long"),
    DataType.UINT32: ("uint32", "u4", "<u4"),
    DataType.BOOLEAN: ("boolean", "bool", "bool_", "b1", "|b1"),
    DataType.FP8_E4M3: ("fp8_e4m3", "float8_e4m3fn", "float8_e4m3"),
    DataType.FP8_E5M2: ("fp8_e5m2", "float8_e5m2"),
    DataType.FP8_E8M0: ("fp8_e8m0", "float8_e8m0fnu", "float8_e8m0"),
    DataType.FP4_E2M1: ("fp4_e2m1", "float4_e2m1fn", "float4_e2m1"),
    DataType.INT4: ("int4",),
    DataType.UINT4: ("uint4",),
    DataType.COMPLEX_FP32: ("complex64", "complex_fp32"),
    DataType.COMPLEX_FP64: ("complex128", "complex_fp64"),
    DataType.FAST_FLOAT_FOR_FP8: ("fast_float_for_fp8",),
    DataType.NOT_SET: ("not_set",),
}.items():
    for _n in _names:
        _ALIASES[_n] = _dt
for _dt in DataType:
    _ALIASES.setdefault(_dt.name.lower(), _dt)

_PREFIXES = ("torch.", "jnp.", "jax.numpy.", "numpy.", "np.", "cupy.", "cp.", "ml_dtypes.",
             "data_type.", "datatype.", "dtype(", "dtype('")


def _normalize_name(name: str) -> str:
    s = name.strip().lower()
    changed = True
    while changed:
        changed = False
        for p in _PREFIXES:
            if s.startswith(p):
                s = s[len(p):]
                changed = True
    return s.strip("')\" ")


def data_type_of(value: Any) -> DataType:
    """Return the ``DataType`` that ``value`` names.

    Accepts a ``DataType`` (or its int code), a name such as ``"bf16"`` or ``"float32"``, a NumPy or
    ml_dtypes dtype (or scalar type), a framework dtype object such as ``torch.float16`` or
    ``jnp.bfloat16`` (recognised by name; the framework is never imported), and any object with a
    ``.dtype`` attribute. Raises ``TypeError`` naming the value when nothing matches.

    Example:
        >>> import numpy as np
        >>> data_type_of(np.float16)
        <DataType.HALF: 2>
    """
    if isinstance(value, DataType):
        return value
    if isinstance(value, bool):
        raise TypeError(f"a data type was expected; got the bool {value!r}")
    if isinstance(value, int):
        try:
            return DataType(value)
        except ValueError:
            raise TypeError(f"{value} is not a cuDNN data type code") from None
    # Enum-like objects from other bindings (e.g. cudnn.data_type.HALF) carry a .name.
    name = getattr(value, "name", None)
    if isinstance(name, str) and type(value).__name__ not in ("dtype",):
        dt = _ALIASES.get(_normalize_name(name))
        if dt is not None:
            return dt
    if isinstance(value, str):
        dt = _ALIASES.get(_normalize_name(value))
        if dt is not None:
            return dt
        raise TypeError(f"unknown data type name {value!r}")
    # NumPy dtypes and scalar types, ml_dtypes, CuPy dtypes: numpy.dtype(x).name.
    np_name = None
    try:
        import numpy

        np_name = numpy.dtype(value).name
    except Exception:
        pass
    if np_name is not None:
        dt = _ALIASES.get(_normalize_name(np_name))
        if dt is not None:
            return dt
    text = str(value)
    dt = _ALIASES.get(_normalize_name(text))
    if dt is not None:
        return dt
    inner = getattr(value, "dtype", None)
    if inner is not None and inner is not value:
        return data_type_of(inner)
    raise TypeError(f"cannot interpret {value!r} (of type {type(value).__name__}) as a data type")


def dlpack_code_of(dt: DataType) -> tuple[int, int]:
    """``(DLPack type code, bits)`` for a DataType; ``ValueError`` when DLPack cannot express it."""
    try:
        return _TO_DLPACK[DataType(dt)]
    except KeyError:
        raise ValueError(f"{DataType(dt).name} has no DLPack equivalent") from None


def data_type_from_dlpack(code: int, bits: int) -> DataType | None:
    """The DataType of a DLPack ``(code, bits)``, or None when cuDNN has no such type."""
    return _FROM_DLPACK.get((int(code), int(bits)))


def itemsize_bits(dt: DataType) -> int:
    """Storage bits of one element (4 for the packed 4-bit types)."""
    return _BITS[DataType(dt)]


# DataType -> the NumPy / ml_dtypes type name that stores it on the host (ml_dtypes for the ones NumPy
# lacks). The packed 4-bit and vectorised types have no host array type.
_NUMPY_NAMES: dict[DataType, str] = {
    DataType.FLOAT: "float32", DataType.DOUBLE: "float64", DataType.HALF: "float16",
    DataType.BFLOAT16: "bfloat16", DataType.INT8: "int8", DataType.UINT8: "uint8",
    DataType.INT32: "int32", DataType.INT64: "int64", DataType.UINT32: "uint32", DataType.BOOLEAN: "bool",
    DataType.FP8_E4M3: "float8_e4m3fn", DataType.FP8_E5M2: "float8_e5m2", DataType.FP8_E8M0: "float8_e8m0fnu",
    DataType.COMPLEX_FP32: "complex64", DataType.COMPLEX_FP64: "complex128",
}
_NUMPY_DTYPES: dict = {}   # filled on first use: importing NumPy / ml_dtypes is left to callers that need it


def numpy_dtype(value: Any):
    """The ``numpy.dtype`` (NumPy's or ml_dtypes') that holds ``value``'s data type on the host.

    ``value`` is anything ``data_type_of`` accepts. Raises ``ValueError`` for a type with no host
    array type (the packed 4-bit and vectorised types, NOT_SET).

    Example:
        >>> numpy_dtype(DataType.HALF)
        dtype('float16')
    """
    dt = data_type_of(value)
    cached = _NUMPY_DTYPES.get(dt)
    if cached is not None:
        return cached
    name = _NUMPY_NAMES.get(dt)
    if name is None:
        raise ValueError(f"{dt.name} has no NumPy host type")
    import numpy
    try:
        made = numpy.dtype(name)
    except TypeError:
        import ml_dtypes
        made = numpy.dtype(getattr(ml_dtypes, name))
    _NUMPY_DTYPES[dt] = made
    return made
