"""Every DLPack data type, by code and by name, through every producer path that can carry it.

The expected table is written out here, independently of the library's own.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cudnn_graph import DataType, MalformedBufferError, Slot, TensorSpec, check
from cudnn_graph._dtypes import ALL_DTYPE_NAMES, _dtype_name_of
from cudnn_graph._testing import exchange_producer as ep

# (DLPack code, bits, canonical name): DLPack 1.3's codes.
TABLE = [
    (0, 4, "int4"), (0, 8, "int8"), (0, 16, "int16"), (0, 32, "int32"), (0, 64, "int64"),
    (1, 4, "uint4"), (1, 8, "uint8"), (1, 16, "uint16"), (1, 32, "uint32"), (1, 64, "uint64"),
    (2, 16, "float16"), (2, 32, "float32"), (2, 64, "float64"),
    (4, 16, "bfloat16"), (5, 64, "complex64"), (5, 128, "complex128"), (6, 8, "bool"),
    (7, 8, "float8_e3m4"), (8, 8, "float8_e4m3"), (9, 8, "float8_e4m3b11fnuz"), (10, 8, "float8_e4m3fn"),
    (11, 8, "float8_e4m3fnuz"), (12, 8, "float8_e5m2"), (13, 8, "float8_e5m2fnuz"),
    (14, 8, "float8_e8m0fnu"), (15, 6, "float6_e2m3fn"), (16, 6, "float6_e3m2fn"),
    (17, 4, "float4_e2m1fn"),
]
BUF = np.zeros(64, np.uint8)


def test_table_matches_the_library():
    assert sorted(ALL_DTYPE_NAMES) == sorted(name for _, _, name in TABLE)


@pytest.mark.parametrize("code, bits, name", TABLE, ids=[t[2] for t in TABLE])
def test_every_code_via_a_capsule(code, bits, name):
    ep.reset_counts()
    for versioned in (True, False):
        s = Slot.from_object(ep.make_capsule(BUF, versioned=versioned, dtype=(code, bits, 1),
                                             shape=(2, 4), strides=(4, 1)))
        assert s.dtype == name and s.dtype_code == (code, bits, 1)
        assert s.nbytes == (8 * bits + 7) // 8
        back = Slot.from_object(s.__dlpack__(max_version=(1, 3)))     # and through our exporter
        assert back.dtype_code == (code, bits, 1)
        del s, back
    assert ep.counts() == (2, 2)


@pytest.mark.parametrize("code, bits, name", TABLE, ids=[t[2] for t in TABLE])
def test_every_name_via_from_address(code, bits, name):
    s = Slot.from_address(4096, (3,), dtype=name, device="cpu")
    assert s.dtype == name and s.dtype_code == (code, bits, 1)
    assert Slot.from_address(4096, (3,), dtype=(code, bits), device="cpu").dtype == name
    check(s, TensorSpec(1, (3,), (code, bits, 1), device="cpu", alignment=1))


ML_DTYPES = ["bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
             "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float6_e2m3fn",
             "float6_e3m2fn", "float4_e2m1fn", "int4", "uint4"]


@pytest.mark.parametrize("name", [n for n in ML_DTYPES if hasattr(ml_dtypes, n)])
def test_ml_dtypes_objects_name_the_same_type(name):
    t = getattr(ml_dtypes, name)
    assert _dtype_name_of(t) == name
    assert _dtype_name_of(np.dtype(t)) == name


@pytest.mark.parametrize("spelling, name", [
    ("bf16", "bfloat16"), ("fp16", "float16"), ("half", "float16"), ("fp32", "float32"),
    ("float", "float32"), ("fp64", "float64"), ("double", "float64"), ("bool_", "bool"),
    ("boolean", "bool"), (" Float32 ", "float32"), ("torch.bfloat16", "bfloat16"), ("jnp.float16", "float16"),
    (np.float16, "float16"), (np.dtype("int8"), "int8"), (np.bool_, "bool"), (np.complex64, "complex64"),
    (DataType.FLOAT, "float32"), (DataType.BFLOAT16, "bfloat16"), (DataType.FP8_E4M3, "float8_e4m3fn"),
    (DataType.FP8_E5M2, "float8_e5m2"), (DataType.INT64, "int64"), ((2, 16), "float16"),
])
def test_aliases(spelling, name):
    assert _dtype_name_of(spelling) == name


@pytest.mark.parametrize("numpy_dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                         "uint64", "float16", "float32", "float64", "complex64",
                                         "complex128", "bool"])
def test_numpy_arrays_and_their_cai_typestr(numpy_dtype):
    a = np.zeros(4, numpy_dtype)
    assert Slot.from_object(a).dtype == np.dtype(numpy_dtype).name

    class CAI:
        __cuda_array_interface__ = {"version": 3, "shape": (4,), "typestr": a.dtype.str,
                                    "data": (a.__array_interface__["data"][0], False)}

    assert Slot.from_object(CAI()).dtype == np.dtype(numpy_dtype).name


@pytest.mark.parametrize("typestr", ["=f4", "|f4"])
def test_cai_native_and_unspecified_byte_order(typestr):
    class CAI:
        __cuda_array_interface__ = {"version": 2, "shape": (1,), "typestr": typestr, "data": (4096, False)}

    assert Slot.from_object(CAI()).dtype == "float32"


@pytest.mark.parametrize("name", ["bfloat16"] + [n for n in ML_DTYPES if n.startswith("float8")])
def test_cai_raw_bytes_named_by_descr(name):
    size = 2 if name == "bfloat16" else 1

    class CAI:
        __cuda_array_interface__ = {"version": 3, "shape": (4,), "typestr": f"<V{size}",
                                    "descr": [(name, f"<V{size}")], "data": (4096, False)}

    assert Slot.from_object(CAI()).dtype == name


REJECTED = [
    ((18, 8, 1), r"unknown DLPack type code 18"), ((99, 32, 1), r"unknown DLPack type code 99"),
    ((255, 8, 1), r"unknown DLPack type code 255"),
    ((3, 64, 1), r"opaque-handle"), ((3, 32, 1), r"opaque-handle"),
    ((0, 12, 1), r"code 0 cannot have 12 bits"), ((1, 2, 1), r"code 1 cannot have 2 bits"),
    ((2, 8, 1), r"code 2 cannot have 8 bits"), ((2, 128, 1), r"code 2 cannot have 128 bits"),
    ((4, 8, 1), r"code 4 cannot have 8 bits"), ((5, 32, 1), r"code 5 cannot have 32 bits"),
    ((6, 1, 1), r"code 6 cannot have 1 bits"), ((10, 16, 1), r"code 10 cannot have 16 bits"),
    ((17, 8, 1), r"code 17 cannot have 8 bits"), ((15, 8, 1), r"code 15 cannot have 8 bits"),
    ((2, 32, 2), r"lanes=2"), ((2, 32, 4), r"lanes=4"), ((2, 32, 0), r"lanes=0"),
    ((6, 8, 65535), r"lanes=65535"),
]


@pytest.mark.parametrize("dtype, pattern", REJECTED, ids=[str(d) for d, _ in REJECTED])
def test_rejected_dtypes(dtype, pattern):
    ep.reset_counts()
    with pytest.raises(MalformedBufferError, match=pattern) as info:
        Slot.from_object(ep.make_capsule(BUF, dtype=dtype, shape=(2,), strides=(1,)))
    assert info.type is MalformedBufferError
    with pytest.raises(MalformedBufferError, match=pattern):
        Slot.from_address(4096, (2,), dtype=dtype, device="cpu")
    del info
    assert ep.counts() == (1, 1)
