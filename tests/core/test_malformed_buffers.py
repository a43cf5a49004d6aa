"""Malformed buffers: every one is refused with the exact typed error and a message naming the problem.

Errors subclass ValueError / TypeError (errors.py): MalformedBufferError (ValueError) for a producer that
broke the DLPack / CUDA-array-interface rules, BufferImportError (TypeError) for an object that is not a
buffer, and plain ValueError / TypeError for bad arguments to ``Slot.from_address``. Each case also
proves, through the test producer's deleter counts, that nothing leaks and nothing is freed twice.
"""
from __future__ import annotations

import gc
import re

import numpy as np
import pytest

from cudnn_graph import BufferImportError, MalformedBufferError, Slot
from cudnn_graph._testing import exchange_producer as ep

A = np.arange(64, dtype=np.float32)
PTR = A.__array_interface__["data"][0]


@pytest.fixture(autouse=True)
def _balanced_deleters():
    ep.reset_counts()
    yield
    made, deleted = ep.counts()
    if made != deleted:
        gc.collect()
        made, deleted = ep.counts()
    assert made == deleted, f"{made} managed tensors made, {deleted} deleter calls"


class CAI:
    def __init__(self, interface):
        self.__cuda_array_interface__ = interface


def cai(**overrides):
    """A valid v3 interface over A, with entries replaced (a value of ... removes the key)."""
    d = {"version": 3, "shape": (4,), "typestr": "<f4", "data": (PTR, False)}
    for k, v in overrides.items():
        if v is ...:
            d.pop(k, None)
        else:
            d[k] = v
    return CAI(d)


def capsule(**kwargs):
    kwargs.setdefault("shape", (4,))
    kwargs.setdefault("strides", (1,))
    return ep.make_capsule(A, **kwargs)


def _reused():
    cap = capsule()
    Slot.from_object(cap)
    return Slot.from_object(cap)


def _returns(value):
    return ep.CapsuleProducer(lambda **kw: value, device=(1, 0))


# (id, thunk, exact error class, regex the message must match)
CASES = [
    # ---- DLPack capsules ----
    ("capsule-wrong-name", lambda: Slot.from_object(_returns(ep.table_capsule("full"))),
     MalformedBufferError, r"capsule named 'dlpack_exchange_api' is not a DLPack tensor"),
    ("capsule-reused", _reused, MalformedBufferError, r"already consumed \('used_dltensor_versioned'\)"),
    ("capsule-legacy-reused", lambda: [Slot.from_object(c) for c in [capsule(versioned=False)] * 2],
     MalformedBufferError, r"already consumed \('used_dltensor'\)"),
    ("null-shape", lambda: Slot.from_object(capsule(null_shape=True)),
     MalformedBufferError, r"shape is NULL for a 1-d tensor"),
    ("null-strides-1.3", lambda: Slot.from_object(capsule(null_strides=True)),
     MalformedBufferError, r"strides is NULL for a 1-d tensor \(DLPack >= 1.2 requires strides\)"),
    ("null-strides-1.2", lambda: Slot.from_object(capsule(null_strides=True, version=(1, 2))),
     MalformedBufferError, r"strides is NULL"),
    ("major-version-2", lambda: Slot.from_object(capsule(version=(2, 0))),
     MalformedBufferError, r"DLPack major version 2 is not supported"),
    ("ndim-negative", lambda: Slot.from_object(capsule(ndim=-1)),
     MalformedBufferError, r"ndim -1 is outside \[0, 64\]"),
    ("ndim-65", lambda: Slot.from_object(capsule(ndim=65)), MalformedBufferError, r"ndim 65 is outside"),
    ("ndim-1000", lambda: Slot.from_object(capsule(ndim=1000)), MalformedBufferError, r"ndim 1000 is outside"),
    ("negative-extent", lambda: Slot.from_object(capsule(shape=(2, -3), strides=(1, 1))),
     MalformedBufferError, r"shape\[1\] = -3 is negative"),
    ("shape-overflows-int64", lambda: Slot.from_object(capsule(shape=(2 ** 40, 2 ** 40), strides=(1, 1))),
     MalformedBufferError, r"shape \(1099511627776, 1099511627776\) overflows int64"),
    ("strides-beyond-int64", lambda: Slot.from_object(capsule(shape=(4,), strides=(2 ** 62,))),
     MalformedBufferError, r"strides \(4611686018427387904,\) address beyond int64"),
    ("span-beyond-int64", lambda: Slot.from_object(capsule(shape=(2 ** 55,), strides=(1,))),
     MalformedBufferError, r"spans 36028797018963968 elements of 32 bits"),
    ("strides-2d-beyond-int64", lambda: Slot.from_object(capsule(shape=(3, 2), strides=(2 ** 62, 1))),
     MalformedBufferError, r"strides \(4611686018427387904, 1\) address beyond int64 for shape \(3, 2\)"),
    ("stride-int64-min", lambda: Slot.from_object(capsule(shape=(2,), strides=(-2 ** 63,))),
     MalformedBufferError, r"address beyond int64"),
    ("null-data-nonzero-size", lambda: Slot.from_object(capsule(data=0)),
     MalformedBufferError, r"data is NULL for a tensor of 4 elements"),
    ("absurd-byte-offset", lambda: Slot.from_object(capsule(byte_offset=2 ** 64 - 8)),
     MalformedBufferError, r"byte_offset 18446744073709551608 is absurd"),
    ("unknown-device-type", lambda: Slot.from_object(capsule(device=(99, 0))),
     MalformedBufferError, r"unknown DLPack device type 99"),
    ("unknown-device-type-gap", lambda: Slot.from_object(capsule(device=(5, 0))),
     MalformedBufferError, r"unknown DLPack device type 5"),
    ("negative-device-id", lambda: Slot.from_object(capsule(device=(2, -1))),
     MalformedBufferError, r"negative device ordinal -1"),
    ("unknown-dtype-code", lambda: Slot.from_object(capsule(dtype=(99, 8, 1))),
     MalformedBufferError, r"unknown DLPack type code 99"),
    ("unknown-dtype-code-18", lambda: Slot.from_object(capsule(dtype=(18, 8, 1))),
     MalformedBufferError, r"unknown DLPack type code 18"),
    ("bad-bits-float", lambda: Slot.from_object(capsule(dtype=(2, 17, 1))),
     MalformedBufferError, r"type code 2 cannot have 17 bits"),
    ("bad-bits-bfloat", lambda: Slot.from_object(capsule(dtype=(4, 32, 1))),
     MalformedBufferError, r"type code 4 cannot have 32 bits"),
    ("lanes-4", lambda: Slot.from_object(capsule(dtype=(2, 32, 4))),
     MalformedBufferError, r"vector data types are not supported \(lanes=4; expected 1\)"),
    ("lanes-0", lambda: Slot.from_object(capsule(dtype=(2, 32, 0))), MalformedBufferError, r"lanes=0"),
    ("opaque-handle", lambda: Slot.from_object(capsule(dtype=(3, 64, 1))),
     MalformedBufferError, r"opaque-handle data \(type code 3\)"),
    ("legacy-bad-dtype", lambda: Slot.from_object(capsule(versioned=False, dtype=(2, 12, 1))),
     MalformedBufferError, r"cannot have 12 bits"),
    ("dlpack-returns-non-capsule", lambda: Slot.from_object(_returns(42)),
     BufferImportError, r"__dlpack__ returned int, not a capsule"),
    ("not-a-buffer", lambda: Slot.from_object(object()),
     BufferImportError, r"object is not a buffer: it has no __dlpack__"),
    ("bool-is-not-an-address", lambda: Slot.from_object(True), BufferImportError, r"bool is not a buffer"),
    # ---- exchange tables ----
    ("exchange-2x-only", lambda: Slot.from_object(ep.FutureMajorProducer(A)),
     MalformedBufferError, r"FutureMajorProducer publishes no DLPack exchange table with major version 1"),
    ("exchange-wrong-capsule-name", lambda: Slot.from_object(ep.WrongCapsuleNameProducer(A)),
     MalformedBufferError, r"__dlpack_c_exchange_api__ is not a capsule named 'dlpack_exchange_api'"),
    # ---- CUDA array interface ----
    ("cai-not-a-dict", lambda: Slot.from_object(CAI([1, 2])),
     MalformedBufferError, r"__cuda_array_interface__ is a list, not a dict"),
    ("cai-missing-shape", lambda: Slot.from_object(cai(shape=...)),
     MalformedBufferError, r"missing or malformed entry 'shape'"),
    ("cai-missing-typestr", lambda: Slot.from_object(cai(typestr=...)),
     MalformedBufferError, r"missing or malformed entry 'typestr'"),
    ("cai-missing-data", lambda: Slot.from_object(cai(data=...)),
     MalformedBufferError, r"missing or malformed entry 'data'"),
    ("cai-missing-version", lambda: Slot.from_object(cai(version=...)),
     MalformedBufferError, r"version None is not supported \(expected 2 or 3\)"),
    ("cai-version-1", lambda: Slot.from_object(cai(version=1)),
     MalformedBufferError, r"version 1 is not supported"),
    ("cai-version-4", lambda: Slot.from_object(cai(version=4)),
     MalformedBufferError, r"version 4 is not supported"),
    ("cai-typestr-no-endian", lambda: Slot.from_object(cai(typestr="f4")),
     MalformedBufferError, r"malformed typestr 'f4'"),
    ("cai-typestr-bad-size", lambda: Slot.from_object(cai(typestr="<fz")),
     MalformedBufferError, r"malformed typestr '<fz'"),
    ("cai-typestr-unknown-kind", lambda: Slot.from_object(cai(typestr="<x4")),
     MalformedBufferError, r"unsupported typestr '<x4'"),
    ("cai-typestr-not-str", lambda: Slot.from_object(cai(typestr=4)),
     MalformedBufferError, r"typestr must be a str"),
    ("cai-big-endian", lambda: Slot.from_object(cai(typestr=">f4")),
     MalformedBufferError, r"big-endian data \('>f4'\) is not supported"),
    ("cai-data-not-tuple", lambda: Slot.from_object(cai(data=[PTR, False])),
     MalformedBufferError, r"data must be \(address, readonly\)"),
    ("cai-data-bad-address", lambda: Slot.from_object(cai(data=("0x10", False))),
     MalformedBufferError, r"data address '0x10' is not an integer"),
    ("cai-negative-address", lambda: Slot.from_object(cai(data=(-16, False))),
     MalformedBufferError, r"data address -16 is negative"),
    ("cai-strides-length", lambda: Slot.from_object(cai(strides=(4, 4))),
     MalformedBufferError, r"2 strides for a 1-d shape"),
    ("cai-byte-stride-not-itemsize-multiple", lambda: Slot.from_object(cai(strides=(6,))),
     MalformedBufferError, r"byte stride 6 is not a multiple of the item size 4"),
    ("cai-mask", lambda: Slot.from_object(cai(mask=CAI({}))), MalformedBufferError, r"masked arrays"),
    ("cai-stream-0", lambda: Slot.from_object(cai(stream=0)),
     MalformedBufferError, r"stream 0 is not a valid v3 stream handle"),
    ("cai-stream-in-v2", lambda: Slot.from_object(cai(version=2, stream=5)),
     MalformedBufferError, r"stream 5 is not a valid v3 stream handle"),
    ("cai-v2-no-descr", lambda: Slot.from_object(cai(typestr="<V2")),
     MalformedBufferError, r"typestr '<V2' is raw bytes and descr None names no known 16-bit type"),
    ("cai-v2-descr-wrong-size", lambda: Slot.from_object(cai(typestr="<V2", descr=[("float32", "<V2")])),
     MalformedBufferError, r"names no known 16-bit type"),
    ("cai-shape-not-integer", lambda: Slot.from_object(cai(shape=(2.5,))),
     MalformedBufferError, r"shape\[0\] 2.5 is not an integer"),
    ("cai-shape-huge", lambda: Slot.from_object(cai(shape=(2 ** 70,))),
     MalformedBufferError, r"shape\[0\] 1180591620717411303424 does not fit in int64"),
    ("cai-negative-extent", lambda: Slot.from_object(cai(shape=(-4,))),
     MalformedBufferError, r"shape\[0\] = -4 is negative"),
    ("cai-null-data", lambda: Slot.from_object(cai(data=(0, False))),
     MalformedBufferError, r"data is NULL for a tensor of 4 elements"),
    # ---- Slot.from_address (caller errors: ValueError / TypeError) ----
    ("address-negative", lambda: Slot.from_address(-8, (4,), dtype="float32", device="cpu"),
     ValueError, r"address -8 is negative"),
    ("address-ptr-not-int", lambda: Slot.from_address(4096.0, (4,), dtype="float32", device="cpu"),
     TypeError, r"ptr must be an int address; got float"),
    ("address-ptr-huge", lambda: Slot.from_address(2 ** 64, (4,), dtype="float32", device="cpu"),
     ValueError, r"ptr 18446744073709551616 does not fit in int64"),
    ("address-strides-length", lambda: Slot.from_address(PTR, (4, 2), (1,), "float32", "cpu"),
     ValueError, r"1 strides given for the 2-d shape \(4, 2\)"),
    ("address-null-nonzero-size", lambda: Slot.from_address(0, (4,), dtype="float32", device="cpu"),
     ValueError, r"data is NULL for a tensor of 4 elements"),
    ("address-negative-extent", lambda: Slot.from_address(PTR, (-1,), dtype="float32", device="cpu"),
     ValueError, r"shape\[0\] = -1 is negative"),
    ("address-shape-float", lambda: Slot.from_address(PTR, (2.5,), dtype="float32", device="cpu"),
     TypeError, r"shape\[0\] 2.5 is not an integer"),
    ("address-shape-huge", lambda: Slot.from_address(PTR, (2 ** 70,), dtype="float32", device="cpu"),
     ValueError, r"shape\[0\] 1180591620717411303424 does not fit in int64"),
    ("address-ndim-65", lambda: Slot.from_address(PTR, (1,) * 65, dtype="float32", device="cpu"),
     ValueError, r"ndim 65 is outside"),
    ("address-dtype-unknown-name", lambda: Slot.from_address(PTR, (4,), dtype="float33", device="cpu"),
     TypeError, r"cannot interpret 'float33' as a data type"),
    ("address-dtype-lanes", lambda: Slot.from_address(PTR, (4,), dtype=(2, 32, 4), device="cpu"),
     MalformedBufferError, r"lanes=4"),
    ("address-unknown-device", lambda: Slot.from_address(PTR, (4,), dtype="float32", device="tpu"),
     ValueError, r"unknown device 'tpu'"),
    ("address-negative-ordinal", lambda: Slot.from_address(PTR, (4,), dtype="float32", device="cuda:-1"),
     ValueError, r"device ordinal cannot be negative; got -1"),
    ("address-device-type-unknown", lambda: Slot.from_address(PTR, (4,), dtype="float32", device=(42, 0)),
     ValueError, r"unknown DLPack device type 42"),
]


def test_enough_cases():
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("thunk, exc_type, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_input_is_a_typed_error(thunk, exc_type, pattern):
    with pytest.raises(exc_type) as info:
        thunk()
    assert info.type is exc_type, f"expected exactly {exc_type.__name__}, got {info.type.__name__}: {info.value}"
    assert re.search(pattern, str(info.value)), str(info.value)


# Capsules that are taken (renamed used_*) before their content is found malformed: the consumer owns
# them from then on and must call the deleter exactly once, at once.
TAKEN_THEN_REJECTED = [
    dict(null_shape=True), dict(null_strides=True), dict(version=(2, 0)), dict(version=(7, 1)),
    dict(ndim=-1), dict(ndim=65), dict(shape=(2, -3), strides=(1, 1)), dict(data=0),
    dict(device=(99, 0)), dict(dtype=(3, 64, 1)), dict(dtype=(2, 32, 4)),
    dict(versioned=False, dtype=(99, 8, 1)), dict(versioned=False, ndim=-5),
]


@pytest.mark.parametrize("kwargs", TAKEN_THEN_REJECTED, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_rejected_capsule_is_deleted_exactly_once(kwargs):
    cap = capsule(**kwargs)
    assert ep.counts() == (1, 0)
    with pytest.raises(MalformedBufferError):
        Slot.from_object(cap)
    assert ep.counts() == (1, 1)
    assert "used_dltensor" in repr(cap)
    del cap
    assert ep.counts() == (1, 1)


def test_rejected_capsule_with_null_deleter_does_not_crash():
    cap = capsule(null_deleter=True, version=(2, 0))
    with pytest.raises(MalformedBufferError, match="major version 2"):
        Slot.from_object(cap)
    del cap
    assert ep.counts() == (1, 0)
    ep.reset_counts()


def test_wrongly_named_capsule_is_left_to_its_owner():
    """A capsule the consumer does not recognise is not taken: its own destructor frees it."""
    cap = ep.make_capsule(A, name="dltensor_v2")
    with pytest.raises(MalformedBufferError, match="capsule named 'dltensor_v2'"):
        Slot.from_object(cap)
    assert "dltensor_v2" in repr(cap) and "used_" not in repr(cap)
    assert ep.counts() == (1, 0)
    del cap
    assert ep.counts() == (1, 1)
