"""Slot as a DLPack producer: ``__dlpack__`` / ``__dlpack_device__`` and the type's C exchange table.

NumPy is the consumer for the Python protocol; ctypes drives the C exchange table the way a DSL
launcher would. A hypothesis property round-trips random shapes, strides (negative and zero too) and
dtypes producer -> Slot -> numpy.from_dlpack.
"""
from __future__ import annotations

import ctypes
import gc
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cudnn_graph import Slot
from cudnn_graph._testing import exchange_producer as ep

c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p = (
    ctypes.c_int, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32,
    ctypes.c_uint64, ctypes.c_void_p)


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(c_int64)), ("strides", ctypes.POINTER(c_int64)),
                ("byte_offset", c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", c_void_p),
                ("flags", c_uint64), ("dl_tensor", DLTensor)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class DLPackExchangeAPI(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("prev_api", c_void_p),
                ("managed_tensor_allocator", c_void_p),
                ("managed_tensor_from_py_object_no_sync", c_void_p),
                ("managed_tensor_to_py_object_no_sync", c_void_p),
                ("dltensor_from_py_object_no_sync", c_void_p),
                ("current_work_stream", c_void_p)]


READ_ONLY = 1
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [c_void_p, ctypes.c_char_p, c_void_p]
_VERSIONED_NAME = ctypes.c_char_p(b"dltensor_versioned")    # must outlive the capsules made with it


def _ptr(a):
    return a.__array_interface__["data"][0]


def _elem_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def _managed_versioned(cap):
    return DLManagedTensorVersioned.from_address(_get_pointer(cap, b"dltensor_versioned"))


# ---- numpy.from_dlpack -----------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: np.arange(24, dtype=np.float32).reshape(4, 6),
    lambda: np.arange(24, dtype=np.int16).reshape(4, 6)[::2, ::-3],
    lambda: np.broadcast_to(np.arange(6, dtype=np.float64), (3, 6)),
    lambda: np.array(7, dtype=np.int64),
    lambda: np.zeros((0, 5), np.complex64),
    lambda: np.arange(2 ** 8, dtype=np.uint8).reshape((2,) * 8).transpose(7, 0, 6, 1, 5, 2, 4, 3),
], ids=["contiguous", "negative-strided", "broadcast", "0-d", "zero-size", "8-d-transposed"])
def test_numpy_round_trip(make):
    a = make()
    s = Slot.from_object(a)
    b = np.from_dlpack(s)
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(b, a)
    if a.size:
        assert b.strides == a.strides
        assert _ptr(b) == _ptr(a)                       # a view, not a copy


def test_dlpack_device():
    assert Slot.from_object(np.zeros(2)).__dlpack_device__() == (1, 0)
    assert Slot.from_address(4096, (2,), dtype="float32", device="cuda:3").__dlpack_device__() == (2, 3)


@pytest.mark.parametrize("max_version, name", [
    (None, b"dltensor"), ((0, 8), b"dltensor"), ((1, 0), b"dltensor_versioned"),
    ((1, 3), b"dltensor_versioned"), ((2, 0), b"dltensor_versioned")])
def test_capsule_kind_follows_max_version(max_version, name):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = Slot.from_object(a)
    cap = s.__dlpack__() if max_version is None else s.__dlpack__(max_version=max_version)
    assert _get_name(cap) == name
    if name == b"dltensor_versioned":
        m = _managed_versioned(cap)
        assert (m.version.major, m.version.minor) == (1, 3)
        assert m.flags == 0
        t = m.dl_tensor
    else:
        t = DLManagedTensor.from_address(_get_pointer(cap, b"dltensor")).dl_tensor
    assert t.data == _ptr(a) and t.ndim == 2 and t.byte_offset == 0
    assert (t.shape[0], t.shape[1], t.strides[0], t.strides[1]) == (2, 3, 3, 1)
    back = Slot.from_object(cap)                        # our own capsules import back
    assert back.shape == (2, 3) and back.data_ptr == _ptr(a)


def test_zero_d_export_has_null_geometry_pointers():
    s = Slot.from_object(np.array(1.5, np.float32))
    m = _managed_versioned(s.__dlpack__(max_version=(1, 3)))
    assert m.dl_tensor.ndim == 0 and not m.dl_tensor.shape and not m.dl_tensor.strides


def test_read_only_flag_is_preserved():
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    s = Slot.from_object(a)
    assert s.readonly
    assert _managed_versioned(s.__dlpack__(max_version=(1, 3))).flags & READ_ONLY
    b = np.from_dlpack(s)
    assert not b.flags.writeable
    with pytest.raises(BufferError, match="read-only Slot can only be exported as a versioned"):
        s.__dlpack__()
    ro = Slot.from_address(_ptr(np.zeros(2)), (2,), dtype="float64", device="cpu", readonly=True)
    assert not np.from_dlpack(ro).flags.writeable


def test_writable_slot_exports_writable_arrays():
    a = np.zeros(4, np.float32)
    b = np.from_dlpack(Slot.from_object(a))
    assert b.flags.writeable
    b[1] = 5
    assert a[1] == 5


def test_managed_tensor_outlives_the_slot():
    a = np.arange(100, dtype=np.float64).reshape(10, 10)[:, ::3]
    expect = a.copy()
    s = Slot.from_object(a)
    b = np.from_dlpack(s)
    del s, a
    gc.collect()
    np.testing.assert_array_equal(b, expect)             # shape/strides were copied, memory kept alive
    assert b.strides == (80, 24)
    b2 = b.copy()
    del b
    np.testing.assert_array_equal(b2, expect)


def test_capsule_outlives_the_slot():
    a = np.arange(8, dtype=np.int32).reshape(2, 4)
    s = Slot.from_object(a)
    cap = s.__dlpack__(max_version=(1, 3))
    del s
    gc.collect()
    back = Slot.from_object(cap)
    assert back.shape == (2, 4) and back.strides == (4, 1)
    np.testing.assert_array_equal(np.from_dlpack(back), a)


@pytest.mark.parametrize("max_version", [None, (1, 3)])
def test_unconsumed_capsule_frees_its_tensor(max_version):
    s = Slot.from_object(np.zeros(3, np.float32))
    base = sys.getrefcount(s)
    caps = [s.__dlpack__(max_version=max_version) for _ in range(4)]
    assert sys.getrefcount(s) == base + 4               # each managed tensor holds the slot
    del caps
    assert sys.getrefcount(s) == base


def test_consumed_capsule_releases_the_slot_when_the_consumer_is_done():
    s = Slot.from_object(np.zeros(3, np.float32))
    base = sys.getrefcount(s)
    b = np.from_dlpack(s)
    assert sys.getrefcount(s) == base + 1
    del b
    assert sys.getrefcount(s) == base


def test_copy_and_device_requests():
    s = Slot.from_object(np.zeros(3, np.float32))
    with pytest.raises(BufferError, match="cannot copy"):
        s.__dlpack__(max_version=(1, 3), copy=True)
    assert _get_name(s.__dlpack__(max_version=(1, 3), copy=False)) == b"dltensor_versioned"
    with pytest.raises(BufferError, match=r"lives on \(1, 0\); cannot export to \(2, 0\)"):
        s.__dlpack__(max_version=(1, 3), dl_device=(2, 0))
    assert _get_name(s.__dlpack__(max_version=(1, 3), dl_device=(1, 0))) == b"dltensor_versioned"
    with pytest.raises(BufferError):
        np.from_dlpack(s, copy=True)


def test_stream_argument():
    s = Slot.from_address(4096, (2,), dtype="float32", device="cuda")
    for stream in (None, 1, 2, 12345, -1):               # -1: the consumer asks for no synchronisation
        s.__dlpack__(max_version=(1, 3), stream=stream)
    with pytest.raises(TypeError):
        s.__dlpack__(max_version=(1, 3), stream="not a stream")


def test_extension_dtypes_round_trip_through_our_own_capsules():
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "int4"):
        s = Slot.from_address(4096, (2, 8), dtype=name, device="cuda")
        back = Slot.from_object(s.__dlpack__(max_version=(1, 3)))
        assert back.dtype == name and back.dtype_code == s.dtype_code and back.strides == (8, 1)


# ---- the C exchange table --------------------------------------------------------------------


def _slot_api():
    cap = Slot.__dlpack_c_exchange_api__
    assert _get_name(cap) == b"dlpack_exchange_api"
    return DLPackExchangeAPI.from_address(_get_pointer(cap, b"dlpack_exchange_api"))


def test_exchange_table_header():
    api = _slot_api()
    assert (api.version.major, api.version.minor) == (1, 3)
    assert not api.prev_api
    assert all([api.managed_tensor_allocator, api.managed_tensor_from_py_object_no_sync,
                api.managed_tensor_to_py_object_no_sync, api.dltensor_from_py_object_no_sync,
                api.current_work_stream])


def test_exchange_borrowed_view():
    api = _slot_api()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1:]
    s = Slot.from_object(a)
    fn = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, ctypes.POINTER(DLTensor))(api.dltensor_from_py_object_no_sync)
    view = DLTensor()
    assert fn(s, ctypes.byref(view)) == 0
    assert view.data == _ptr(a) and view.ndim == 2
    assert (view.dtype.code, view.dtype.bits, view.dtype.lanes) == (2, 32, 1)
    assert (view.device.device_type, view.device.device_id) == (1, 0)
    assert [view.shape[i] for i in range(2)] == [3, 3] and [view.strides[i] for i in range(2)] == [4, 1]


def test_slot_reimported_through_the_exchange_table():
    """managed_tensor_from_py_object -> a capsule -> Slot.from_object: the managed tensor holds the
    source slot until the re-imported slot dies."""
    api = _slot_api()
    from_py = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, ctypes.POINTER(c_void_p))(
        api.managed_tensor_from_py_object_no_sync)
    a = np.arange(10, dtype=np.int64)[::-2]
    a.flags.writeable = False
    s = Slot.from_object(a)
    base = sys.getrefcount(s)
    out = c_void_p()
    assert from_py(s, ctypes.byref(out)) == 0 and out.value
    m = DLManagedTensorVersioned.from_address(out.value)
    assert (m.version.major, m.version.minor) == (1, 3) and m.flags & READ_ONLY
    assert [m.dl_tensor.shape[0], m.dl_tensor.strides[0]] == [5, -2]
    assert sys.getrefcount(s) == base + 1
    cap = _capsule_new(out.value, _VERSIONED_NAME, None)
    again = Slot.from_object(cap)
    assert (again.shape, again.strides, again.dtype, again.readonly) == ((5,), (-2,), "int64", True)
    assert again.data_ptr == s.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(again), a)
    del again, cap
    gc.collect()
    assert sys.getrefcount(s) == base


def test_exchange_to_py_object_and_error_reporting():
    api = _slot_api()
    from_py = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, ctypes.POINTER(c_void_p))(
        api.managed_tensor_from_py_object_no_sync)
    to_py = ctypes.PYFUNCTYPE(c_int, c_void_p, ctypes.POINTER(c_void_p))(api.managed_tensor_to_py_object_no_sync)
    s = Slot.from_object(np.arange(6, dtype=np.float32).reshape(2, 3))
    base = sys.getrefcount(s)
    managed, obj = c_void_p(), c_void_p()
    assert from_py(s, ctypes.byref(managed)) == 0
    assert to_py(managed, ctypes.byref(obj)) == 0 and obj.value
    made = ctypes.cast(obj, ctypes.py_object).value
    ctypes.pythonapi.Py_DecRef(ctypes.py_object(made))  # the reference to_py handed over
    assert type(made) is Slot and made.shape == (2, 3) and made.data_ptr == s.data_ptr
    del made
    gc.collect()
    assert sys.getrefcount(s) == base
    # A non-Slot object: the function reports failure, it does not crash.
    assert from_py(np.zeros(2), ctypes.byref(managed)) == -1 and not managed.value

    errors = []
    SetError = ctypes.CFUNCTYPE(None, c_void_p, ctypes.c_char_p, ctypes.c_char_p)
    set_error = SetError(lambda ctx, kind, msg: errors.append((kind, msg)))
    alloc = ctypes.PYFUNCTYPE(c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(c_void_p), c_void_p, SetError)(
        api.managed_tensor_allocator)
    assert alloc(DLTensor(), ctypes.byref(managed), None, set_error) == -1
    assert errors and errors[0][0] == b"NotImplementedError" and not managed.value
    stream = ctypes.PYFUNCTYPE(c_int, c_int32, c_int32, ctypes.POINTER(c_void_p))(api.current_work_stream)
    out = c_void_p(1234)
    assert stream(2, 0, ctypes.byref(out)) == 0 and not out.value


# ---- property: random views round-trip -------------------------------------------------------

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
          "float32", "float64", "complex64", "complex128", "bool"]


@st.composite
def strided_views(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    ndim = draw(st.integers(0, 5))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    strides = tuple(draw(st.lists(st.integers(-7, 7), min_size=ndim, max_size=ndim)))
    live = [(n, s) for n, s in zip(shape, strides) if n > 0]
    lo = sum(min(0, (n - 1) * s) for n, s in live) if all(shape) else 0
    hi = sum(max(0, (n - 1) * s) for n, s in live) if all(shape) else 0
    base = (np.arange(hi - lo + 1) % 120).astype(dtype)
    view = np.lib.stride_tricks.as_strided(base[-lo:], shape=shape,
                                           strides=tuple(s * dtype.itemsize for s in strides))
    if draw(st.booleans()):
        view.flags.writeable = False
    return view, strides


IMPORTERS = {
    "numpy": lambda v: Slot.from_object(v),
    "capsule": lambda v: Slot.from_object(ep.make_capsule(v, dtype=_dl_dtype(v.dtype), flags=_flags(v))),
    "legacy": lambda v: Slot.from_object(ep.make_capsule(v, versioned=False, dtype=_dl_dtype(v.dtype))),
    "exchange": lambda v: Slot.from_object(ep.ExchangeProducer(v)),
}


def _dl_dtype(dt):
    code = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}[dt.kind]
    return (code, dt.itemsize * 8, 1)


def _flags(v):
    return 0 if v.flags.writeable else READ_ONLY


class _LegacyOnly:
    """Re-exports a slot through the pre-1.0 protocol (no max_version): numpy falls back to it."""

    def __init__(self, slot):
        self.slot = slot

    def __dlpack__(self, stream=None):
        return self.slot.__dlpack__()

    def __dlpack_device__(self):
        return self.slot.__dlpack_device__()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strided_views(), st.sampled_from(sorted(IMPORTERS)), st.booleans())
def test_round_trip_property(view_and_strides, importer, legacy_export):
    view, strides = view_and_strides
    s = IMPORTERS[importer](view)
    assert s.shape == view.shape
    assert s.strides == strides
    assert s.dtype == view.dtype.name
    assert s.data_ptr == _ptr(view)
    if importer != "legacy" and importer != "exchange":
        assert s.readonly == (not view.flags.writeable)
    if legacy_export and not s.readonly:
        back = np.from_dlpack(_LegacyOnly(s))
    else:
        back = np.from_dlpack(s)
    assert back.dtype == view.dtype and back.shape == view.shape
    np.testing.assert_array_equal(back, view)
    if view.size:
        assert back.strides == view.strides
        assert _ptr(back) == _ptr(view)
    del s, back
