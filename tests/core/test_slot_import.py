"""Slot import on a CPU: every producer path that a machine without a GPU can exercise.

NumPy ``__dlpack__`` (versioned, and the legacy fallback of a producer that refuses ``max_version``),
the exchange-API producer types of ``cudnn_graph._testing.exchange_producer``, CUDA-array-interface
dicts, raw addresses and slot-to-slot; geometry edge cases (byte_offset, negative / zero / overlapping
strides, 0-d and zero-size tensors); deleter and refcount accounting on every path.
"""
from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

import cudnn_graph
from cudnn_graph import BufferImportError, MalformedBufferError, Slot
from cudnn_graph._testing import exchange_producer as ep

kDLCPU, kDLCUDA, kDLCUDAHost = 1, 2, 3


@pytest.fixture(autouse=True)
def _balanced_deleters():
    """Every managed tensor the test producer made is deleted exactly once by the end of the test."""
    ep.reset_counts()
    yield
    made, deleted = ep.counts()
    if made != deleted:               # a traceback cycle may still hold a slot: collect, then judge
        gc.collect()
        made, deleted = ep.counts()
    assert made == deleted, f"{made} managed tensors made, {deleted} deleter calls"


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _elem_strides(a: np.ndarray) -> tuple:
    return tuple(s // a.itemsize for s in a.strides)


class CAI:
    """An object that publishes a given ``__cuda_array_interface__`` dict (and keeps ``keep`` alive)."""

    def __init__(self, interface, keep=None):
        self.__cuda_array_interface__ = interface
        self.keep = keep


# ---- NumPy __dlpack__ -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int16", "int32", "int64",
                                   "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128"])
def test_numpy_dlpack_geometry(dtype):
    a = np.zeros((3, 5), dtype=dtype)
    s = Slot.from_object(a)
    assert s.shape == (3, 5)
    assert s.strides == (5, 1)
    assert s.dtype == np.dtype(dtype).name
    assert s.device == ("cpu", 0)
    assert s.data_ptr == _ptr(a)
    assert not s.readonly
    assert s.numel == 15
    assert s.nbytes == a.nbytes


def test_numpy_asks_for_a_versioned_capsule_and_it_is_renamed():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    made = []

    def factory(**kwargs):
        cap = a.__dlpack__(**kwargs)
        made.append(cap)
        return cap

    p = ep.CapsuleProducer(factory, device=(kDLCPU, 0))
    s = Slot.from_object(p)
    assert p.calls == [{"max_version": (1, 3)}]
    assert "used_dltensor_versioned" in repr(made[0])
    assert s.data_ptr == _ptr(a) and s.shape == (2, 3)


def test_legacy_fallback_when_max_version_is_refused():
    a = np.arange(6, dtype=np.float32)
    made = []

    def factory(**kwargs):
        cap = ep.make_capsule(a, versioned=False)
        made.append(cap)
        return cap

    cudnn_graph.refresh_exchange_api_cache()
    p = ep.LegacyCapsuleProducer(factory, device=(kDLCPU, 0))
    s = Slot.from_object(p)
    # First try with max_version (refused with TypeError), then the pre-1.0 call.
    assert p.calls == [{"max_version": (1, 3)}, {}]
    assert "used_dltensor" in repr(made[0]) and "versioned" not in repr(made[0])
    assert s.shape == (6,) and s.strides == (1,) and s.data_ptr == _ptr(a)
    assert ep.counts() == (1, 0)
    del s
    assert ep.counts() == (1, 1)


def test_legacy_fallback_through_numpy_itself():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    p = ep.LegacyCapsuleProducer(lambda **kw: a.__dlpack__(**kw), device=(kDLCPU, 0))
    s = Slot.from_object(p)
    assert s.shape == (3, 2) and s.strides == (4, 2) and s.dtype == "int32"
    np.testing.assert_array_equal(np.from_dlpack(s), a)


def test_a_type_that_refused_max_version_is_asked_once_per_import_afterwards():
    a = np.arange(4, dtype=np.float32)
    cudnn_graph.refresh_exchange_api_cache()
    p = ep.LegacyCapsuleProducer(lambda **kw: a.__dlpack__(**kw), device=(kDLCPU, 0))
    Slot.from_object(p)
    p.calls.clear()
    Slot.from_object(p)
    assert p.calls == [{}]


def test_stream_is_passed_to_cuda_producers_and_not_to_cpu_ones():
    a = np.zeros(4, np.float32)
    gpu = ep.CapsuleProducer(lambda **kw: ep.make_capsule(a, device=(kDLCUDA, 0)), device=(kDLCUDA, 0))
    s = Slot.from_object(gpu, stream=7)
    assert gpu.calls == [{"stream": 7, "max_version": (1, 3)}]
    assert s.device == ("cuda", 0)
    # Our "0" (the legacy default stream) is spelled 1 in the DLPack protocol (0 is disallowed there).
    gpu.calls.clear()
    Slot.from_object(gpu, stream=0)
    assert gpu.calls == [{"stream": 1, "max_version": (1, 3)}]

    class Stream:
        def __cuda_stream__(self):
            return (0, 99)

    gpu.calls.clear()
    Slot.from_object(gpu, stream=Stream())
    assert gpu.calls == [{"stream": 99, "max_version": (1, 3)}]
    cpu = ep.CapsuleProducer(lambda **kw: ep.make_capsule(a), device=(kDLCPU, 0))
    Slot.from_object(cpu, stream=7)
    assert cpu.calls == [{"max_version": (1, 3)}]


def test_instance_level_dlpack_attribute_is_honoured():
    a = np.arange(4, dtype=np.float32)

    class Holder:
        pass

    h = Holder()
    h.__dlpack__ = lambda **kw: a.__dlpack__(**kw)
    h.__dlpack_device__ = lambda: (kDLCPU, 0)
    assert Slot.from_object(h).data_ptr == _ptr(a)


# ---- exchange-API producers -------------------------------------------------------------------


def test_exchange_full_table_reads_a_borrowed_view():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = ep.ExchangeProducer(a)
    s = Slot.from_object(p)
    assert (s.shape, s.strides, s.dtype, s.device) == ((3, 4), (4, 1), "float32", ("cpu", 0))
    assert s.data_ptr == _ptr(a)
    assert s.owner is p                       # the borrowed view keeps the producer alive
    assert ep.counts() == (0, 0)              # no managed tensor made
    np.testing.assert_array_equal(np.from_dlpack(s), a)


def test_exchange_managed_only_table_owns_a_managed_tensor():
    a = np.arange(12, dtype=np.float64).reshape(4, 3)[::2]
    p = ep.ManagedOnlyProducer(a, readonly=True)
    s = Slot.from_object(p)
    assert s.shape == (2, 3) and s.strides == (6, 1) and s.dtype == "float64"
    assert s.readonly                         # the managed tensor's READ_ONLY flag
    assert ep.counts() == (1, 0)
    del s
    assert ep.counts() == (1, 1)


def test_exchange_chained_prev_api_reaches_the_1x_table():
    a = np.arange(5, dtype=np.int64)
    s = Slot.from_object(ep.ChainedProducer(a))
    assert s.data_ptr == _ptr(a) and s.dtype == "int64"
    assert cudnn_graph._slot._exchange_table_address(ep.ChainedProducer) == \
        cudnn_graph._slot._exchange_table_address(ep.ExchangeProducer)


def test_exchange_2x_only_table_is_a_typed_error_every_time():
    p = ep.FutureMajorProducer(np.zeros(3, np.float32))
    messages = []
    for _ in range(3):
        with pytest.raises(MalformedBufferError) as info:
            Slot.from_object(p)
        assert info.type is MalformedBufferError
        messages.append(str(info.value))
    assert "major version 1" in messages[0]
    assert len(set(messages)) == 1, messages


def test_exchange_wrong_capsule_name_is_a_typed_error_every_time():
    p = ep.WrongCapsuleNameProducer(np.zeros(3, np.float32))
    for _ in range(2):
        with pytest.raises(MalformedBufferError, match="dlpack_exchange_api") as info:
            Slot.from_object(p)
        assert info.type is MalformedBufferError


@pytest.mark.parametrize("producer", [ep.ExchangeProducer, ep.ManagedOnlyProducer])
def test_exchange_producer_exception_propagates(producer):
    p = producer(np.zeros(3, np.float32), fail_with=RuntimeError("device lost"))
    with pytest.raises(RuntimeError, match="device lost") as info:
        Slot.from_object(p)
    assert info.type is RuntimeError


@pytest.mark.parametrize("producer", [ep.ExchangeProducer, ep.ManagedOnlyProducer])
def test_exchange_producer_failing_without_an_error_is_a_typed_error(producer):
    p = producer(np.zeros(3, np.float32), fail_with="silent")
    with pytest.raises(BufferImportError, match="failed without an error") as info:
        Slot.from_object(p)
    assert info.type is BufferImportError


def test_table_installed_later_is_found_after_refresh():
    class Late(ep.PlainProducer):
        pass

    a = np.arange(4, dtype=np.float32)
    p = Late(a)
    with pytest.raises(BufferImportError):
        Slot.from_object(p)                   # negative lookup, cached
    Late.__dlpack_c_exchange_api__ = ep.table_capsule("full")
    cudnn_graph.refresh_exchange_api_cache()
    s = Slot.from_object(p)
    assert s.owner is p and s.data_ptr == _ptr(a)


def test_table_installed_later_is_found_without_refresh_after_recheck_lookups():
    """A type with a working __dlpack__ caches 'no table'; the miss is re-probed every _RECHECK calls."""

    class LateWithDlpack(ep.PlainProducer):
        dlpack_calls = 0

        def __dlpack__(self, **kwargs):
            type(self).dlpack_calls += 1
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return (kDLCPU, 0)

    a = np.arange(4, dtype=np.float32)
    p = LateWithDlpack(a)
    assert Slot.from_object(p).owner is not p          # through __dlpack__ (a managed tensor)
    LateWithDlpack.__dlpack_c_exchange_api__ = ep.table_capsule("full")
    switched_after = None
    for i in range(1, 1000):
        s = Slot.from_object(p)
        if s.owner is p:                                # through the table (a borrowed view)
            switched_after = i
            break
    assert switched_after is not None, "a table installed later was never found"
    assert 1 <= switched_after <= 257                   # _RECHECK = 256 in _slot.pyx
    calls = LateWithDlpack.dlpack_calls
    for _ in range(50):
        assert Slot.from_object(p).owner is p          # the positive answer is kept
    assert LateWithDlpack.dlpack_calls == calls


def test_table_installed_later_on_a_type_with_no_other_path_is_found_on_the_next_call():
    class Late2(ep.PlainProducer):
        pass

    p = Late2(np.arange(3, dtype=np.int32))
    with pytest.raises(BufferImportError):
        Slot.from_object(p)
    Late2.__dlpack_c_exchange_api__ = ep.table_capsule("managed_only")
    s = Slot.from_object(p)                             # refusal re-probes before it refuses
    assert s.dtype == "int32" and ep.counts() == (1, 0)
    del s


# ---- CUDA array interface ---------------------------------------------------------------------


def test_cai_v2_row_major():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = Slot.from_object(CAI({"version": 2, "shape": (2, 3), "typestr": "<f4",
                              "data": (_ptr(a), False), "strides": None}, a))
    assert s.shape == (2, 3) and s.strides == (3, 1) and s.dtype == "float32"
    assert s.data_ptr == _ptr(a) and not s.readonly and s.producer_stream == 0
    # Host memory the driver does not know is reported where a CAI pointer is assumed to live.
    assert s.device == ("cuda", 0)


def test_cai_v3_stream_and_byte_strides():
    a = np.zeros((4, 6), dtype=np.float64)[:, ::2]
    obj = CAI({"version": 3, "shape": a.shape, "typestr": "<f8", "data": (_ptr(a), False),
               "strides": a.strides, "stream": 12345}, a)
    s = Slot.from_object(obj)
    assert s.strides == (6, 2)                      # bytes (48, 16) -> elements
    assert s.producer_stream == 12345
    assert s.owner is obj


def test_cai_readonly():
    a = np.zeros(3, np.int16)
    s = Slot.from_object(CAI({"version": 3, "shape": (3,), "typestr": "<i2", "data": (_ptr(a), True)}, a))
    assert s.readonly and s.dtype == "int16"


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                  "float8_e5m2fnuz", "float8_e8m0fnu", "float8_e3m4", "float8_e4m3"])
def test_cai_extension_types_via_descr(name):
    bits = 16 if name == "bfloat16" else 8
    a = np.zeros(8, np.uint8)
    s = Slot.from_object(CAI({"version": 3, "shape": (2,), "typestr": f"<V{bits // 8}",
                              "descr": [(name, f"<V{bits // 8}")], "data": (_ptr(a), False)}, a))
    assert s.dtype == name
    assert s.dtype_code[1:] == (bits, 1)


def test_cai_zero_size_with_null_pointer():
    s = Slot.from_object(CAI({"version": 3, "shape": (0, 4), "typestr": "<f4", "data": (0, False)}))
    assert s.shape == (0, 4) and s.numel == 0 and s.data_ptr == 0


# ---- raw addresses and slot to slot ------------------------------------------------------------


def test_from_address_geometry_and_device_forms():
    s = Slot.from_address(0x7F0000001000, (4, 8), dtype="bfloat16", device="cuda:1")
    assert s.strides == (8, 1) and s.dtype == "bfloat16" and s.device == ("cuda", 1)
    assert s.data_ptr == 0x7F0000001000
    s = Slot.from_address(4096, (2, 3), (1, 2), "float32", device="cpu", readonly=True)
    assert s.strides == (1, 2) and s.device == ("cpu", 0) and s.readonly
    assert Slot.from_address(4096, (2,), dtype="int8", device=(kDLCUDAHost, 0)).device == ("cuda_host", 0)
    assert Slot.from_address(4096, (2,), dtype="int8", device=3).device == ("cuda", 3)
    # the (name, ordinal) pairs Slot.device itself returns are accepted back
    assert Slot.from_address(4096, (2,), dtype="int8", device=("cuda", 2)).device == ("cuda", 2)
    with pytest.raises(ValueError, match="unknown device type 'tpu'"):
        Slot.from_address(4096, (2,), dtype="int8", device=("tpu", 0))
    assert Slot.from_address(4096, (2,), dtype=np.float16, device="cpu").dtype == "float16"
    assert Slot.from_address(4096, [np.int64(2)], dtype="int8", device="cpu").shape == (2,)


def test_slot_to_slot_is_the_same_slot():
    s = Slot.from_object(np.zeros(3, np.float32))
    assert Slot.from_object(s) is s


def test_slot_cannot_be_constructed_directly():
    with pytest.raises(TypeError):
        Slot()


def test_bare_int_is_refused_without_a_geometry():
    with pytest.raises(BufferImportError, match="geometry") as info:
        Slot.from_object(0x1000)
    assert info.type is BufferImportError


def test_bare_capsule_is_accepted():
    a = np.arange(3, dtype=np.float32)
    cap = ep.make_capsule(a)
    s = Slot.from_object(cap)
    assert s.data_ptr == _ptr(a)
    assert "used_dltensor_versioned" in repr(cap)


# ---- geometry ----------------------------------------------------------------------------------


@pytest.mark.parametrize("versioned", [True, False])
def test_byte_offset_is_folded_into_data_ptr(versioned):
    a = np.arange(8, dtype=np.float32)
    s = Slot.from_object(ep.make_capsule(a, versioned=versioned, shape=(4,), strides=(1,), byte_offset=16))
    assert s.data_ptr == _ptr(a) + 16
    np.testing.assert_array_equal(np.from_dlpack(s), a[4:])
    # The exported tensor has byte_offset 0 and the folded pointer (a consumer that ignores
    # byte_offset still reads the right elements).
    assert np.from_dlpack(s).__array_interface__["data"][0] == _ptr(a) + 16


def test_negative_strides():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = a[::-1, ::-2]
    s = Slot.from_object(v)
    assert s.strides == (-4, -2)
    assert s.data_ptr == _ptr(a) + (2 * 4 + 3) * 4
    np.testing.assert_array_equal(np.from_dlpack(s), v)


def test_zero_strides_broadcast():
    a = np.arange(4, dtype=np.int32)
    v = np.broadcast_to(a, (3, 4))
    s = Slot.from_object(v)
    assert s.strides == (0, 1) and s.readonly          # NumPy marks broadcast views read-only
    np.testing.assert_array_equal(np.from_dlpack(s), v)


def test_overlapping_strides():
    base = np.arange(10, dtype=np.float32)
    v = np.lib.stride_tricks.as_strided(base, shape=(4, 3), strides=(4, 4))   # rows overlap
    s = Slot.from_object(v)
    assert s.strides == (1, 1)
    np.testing.assert_array_equal(np.from_dlpack(s), v)


def test_zero_d():
    a = np.array(3.5, dtype=np.float64)
    s = Slot.from_object(a)
    assert s.ndim == 0 and s.shape == () and s.strides == () and s.numel == 1
    assert np.from_dlpack(s) == 3.5
    c = Slot.from_object(ep.make_capsule(np.array(2.0, np.float32), shape=(), strides=()))
    assert c.shape == () and c.numel == 1


def test_zero_size():
    s = Slot.from_object(np.zeros((0, 3), np.float32))
    assert s.shape == (0, 3) and s.numel == 0 and s.nbytes == 0
    # NULL data is legal for a tensor with no elements.
    e = Slot.from_object(ep.make_capsule(np.zeros(1, np.float32), data=0, shape=(2, 0), strides=(0, 1)))
    assert e.data_ptr == 0 and e.numel == 0


def test_more_dims_than_the_inline_storage():
    a = np.zeros((1, 2, 1, 2, 1, 2, 1, 2), np.uint8)
    s = Slot.from_object(a)
    assert s.shape == a.shape and s.strides == _elem_strides(a)
    np.testing.assert_array_equal(np.from_dlpack(s), a)
    big = Slot.from_object(ep.make_capsule(np.zeros(1, np.float32), shape=(1,) * 64, strides=(1,) * 64))
    assert big.ndim == 64


def test_legacy_and_pre_1_2_null_strides_are_row_major():
    a = np.arange(6, dtype=np.float32)
    for kwargs in ({"versioned": False}, {"version": (1, 0)}, {"version": (1, 1)}):
        s = Slot.from_object(ep.make_capsule(a, shape=(2, 3), null_strides=True, **kwargs))
        assert s.strides == (3, 1), kwargs


def test_null_deleter_is_legal():
    a = np.arange(3, dtype=np.float32)
    for versioned in (True, False):
        s = Slot.from_object(ep.make_capsule(a, versioned=versioned, null_deleter=True))
        assert s.data_ptr == _ptr(a)
        del s
    assert ep.counts() == (2, 0)
    ep.reset_counts()


# ---- ownership: deleters and refcounts ----------------------------------------------------------


def test_deleter_runs_once_when_the_slot_dies():
    a = np.arange(3, dtype=np.float32)
    s = Slot.from_object(ep.make_capsule(a))
    assert ep.counts() == (1, 0)
    s2 = Slot.from_object(s)
    del s
    assert ep.counts() == (1, 0)                       # s2 is the same slot
    del s2
    assert ep.counts() == (1, 1)


def test_unconsumed_capsule_is_freed_by_its_own_destructor():
    a = np.arange(3, dtype=np.float32)
    cap = ep.make_capsule(a)
    del cap
    assert ep.counts() == (1, 1)


def _refcount_cases():
    def numpy_path(a):
        return Slot.from_object(a)

    def capsule_path(a):
        return Slot.from_object(ep.make_capsule(a))

    def legacy_path(a):
        return Slot.from_object(ep.make_capsule(a, versioned=False))

    def exchange_view(a):
        return Slot.from_object(ep.ExchangeProducer(a))

    def exchange_managed(a):
        return Slot.from_object(ep.ManagedOnlyProducer(a))

    def cai_path(a):
        return Slot.from_object(CAI({"version": 3, "shape": a.shape, "typestr": a.dtype.str,
                                     "data": (_ptr(a), False)}, a))

    return [numpy_path, capsule_path, legacy_path, exchange_view, exchange_managed, cai_path]


@pytest.mark.parametrize("make", _refcount_cases(), ids=lambda f: f.__name__)
def test_owner_refcount_returns_to_baseline(make):
    a = np.arange(6, dtype=np.float32)
    base = sys.getrefcount(a)
    slots = [make(a) for _ in range(5)]
    assert sys.getrefcount(a) > base                   # the slots keep the memory alive
    del slots
    assert sys.getrefcount(a) == base                  # no cycle involved: freed by refcounting


def test_failed_import_after_taking_the_capsule_calls_the_deleter_once():
    a = np.arange(3, dtype=np.float32)
    base = sys.getrefcount(a)
    cap = ep.make_capsule(a, version=(2, 0))
    with pytest.raises(MalformedBufferError, match="major version 2"):
        Slot.from_object(cap)
    assert ep.counts() == (1, 1)                       # deleted at once, not when a traceback dies
    assert "used_dltensor_versioned" in repr(cap)       # taken: its destructor no longer owns it
    del cap
    assert ep.counts() == (1, 1)                       # and not freed twice
    assert sys.getrefcount(a) == base


def test_slot_keeps_memory_alive_after_the_producer_is_gone():
    s = Slot.from_object(np.arange(1000, dtype=np.float64))
    np.testing.assert_array_equal(np.from_dlpack(s), np.arange(1000, dtype=np.float64))


# ---- ownership of a consumed capsule -------------------------------------------------------------

def test_slot_that_owns_an_imported_managed_tensor_is_its_own_owner_and_releases_it_once():
    a = np.arange(6, dtype=np.float32)
    s = Slot.from_object(ep.make_capsule(a))
    assert s.owner is s
    assert ep.counts() == (1, 0)
    del s
    assert ep.counts() == (1, 1)


def test_managed_table_export_is_released_once_when_the_slot_dies():
    a = np.arange(6, dtype=np.float32)
    s = Slot.from_object(ep.ManagedOnlyProducer(a))
    assert s.owner is s and s.data_ptr == _ptr(a)
    assert ep.counts() == (1, 0)
    del s
    assert ep.counts() == (1, 1)


def test_consumed_capsule_without_context_drops_its_destructor():
    """On a consumed capsule the protocol leaves the destructor nothing to do: it is not run at all."""
    a = np.arange(6, dtype=np.float32)
    cap = ep.make_capsule(a)
    before = ep.destructor_calls()
    s = Slot.from_object(cap)
    assert "used_dltensor_versioned" in repr(cap)
    del cap
    assert ep.destructor_calls() == before
    del s
    assert ep.counts() == (1, 1)


def test_consumed_capsule_with_a_context_keeps_its_destructor():
    """A destructor may own the capsule's context: a capsule that has one keeps its destructor."""
    import ctypes
    set_context = ctypes.pythonapi.PyCapsule_SetContext
    set_context.argtypes = [ctypes.py_object, ctypes.c_void_p]
    set_context.restype = ctypes.c_int
    a = np.arange(6, dtype=np.float32)
    cap = ep.make_capsule(a, versioned=False)
    assert set_context(cap, 1) == 0
    before = ep.destructor_calls()
    s = Slot.from_object(cap)
    assert "used_dltensor" in repr(cap)
    del cap
    assert ep.destructor_calls() == before + 1
    assert ep.counts() == (1, 0)              # the destructor saw a consumed capsule: it freed nothing
    del s
    assert ep.counts() == (1, 1)


def test_bench_consume_helper_takes_and_releases_a_capsule_exactly_once():
    a = np.arange(6, dtype=np.float32)
    cap = ep.make_capsule(a)
    ep.consume(cap)
    assert "used_dltensor_versioned" in repr(cap) and ep.counts() == (1, 1)
    del cap
    assert ep.counts() == (1, 1)
    assert ep.consume(None) is None
    ep.consume(a.__dlpack__())                # a NumPy legacy capsule
    with pytest.raises(ValueError, match="not an unconsumed"):
        ep.consume(ep.make_capsule(a, name="not_dlpack"))     # its own destructor frees it


def test_bench_table_helpers_release_what_they_export():
    a = np.arange(6, dtype=np.float32)
    ep.managed_export_release(ep.ManagedOnlyProducer(a))
    assert ep.counts() == (1, 1)
    ep.view_export(ep.ExchangeProducer(a))
    assert ep.counts() == (1, 1)
