"""VariantPack, PackLayout, TensorSpec and check(): normalisation and the per-slot contract checks.

Every mismatch raises a typed error that names the tensor (name and uid), what was expected and what
arrived. dtypes are compared by DLPack code, never by Python identity or name: a JAX-style
"must be float32; got float32" is impossible by construction, and a test walks every pair to prove it.
"""
from __future__ import annotations

import ctypes
import itertools

import ml_dtypes
import numpy as np
import pytest

from cudnn_graph import (AlignmentError, BufferImportError, DataType, DataTypeMismatchError,
                         DeviceMismatchError, DuplicateTensorError, MalformedBufferError, MissingTensorError, PackLayout,
                         ReadOnlyOutputError, ShapeMismatchError, Slot, StrideMismatchError, TensorSpec,
                         UnknownTensorError, VariantPack, check)
from cudnn_graph._dtypes import ALL_DTYPE_NAMES
from cudnn_graph._testing import exchange_producer as ep


def _ptr(a):
    return a.__array_interface__["data"][0]


class Tensor:
    """Stands in for an IR tensor: anything with a ``uid``."""

    def __init__(self, uid):
        self.uid = uid


class CAI:
    def __init__(self, interface, keep=None):
        self.__cuda_array_interface__ = interface
        self.keep = keep


def spec(uid=1, shape=(2, 3), dtype="float32", **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("name", f"t{uid}")
    return TensorSpec(uid, shape, dtype, **kw)


# ---- VariantPack without a layout ---------------------------------------------------------------


def test_from_mapping_sorts_by_uid_and_exposes_c_arrays():
    x, y, z = (np.zeros(4, np.float32) for _ in range(3))
    pack = VariantPack.from_mapping({7: z, 2: y, Tensor(5): x})
    assert pack.uids == (2, 5, 7)
    assert pack.data_ptrs == (_ptr(y), _ptr(x), _ptr(z))
    assert len(pack) == 3 and pack.layout is None
    assert pack[5].data_ptr == _ptr(x)
    with pytest.raises(KeyError):
        pack[3]
    uids = (ctypes.c_int64 * 3).from_address(pack.uid_array_address)
    ptrs = (ctypes.c_void_p * 3).from_address(pack.pointer_array_address)
    assert list(uids) == [2, 5, 7]
    assert [p or 0 for p in ptrs] == [_ptr(y), _ptr(x), _ptr(z)]


def test_many_operands_use_heap_arrays():
    arrays = [np.zeros(2, np.float32) for _ in range(40)]
    pack = VariantPack.from_mapping({100 - i: a for i, a in enumerate(arrays)})
    assert pack.uids == tuple(range(61, 101))
    assert pack.data_ptrs == tuple(_ptr(a) for a in reversed(arrays))
    ptrs = (ctypes.c_void_p * 40).from_address(pack.pointer_array_address)
    assert [p for p in ptrs] == list(pack.data_ptrs)


def test_bare_int_is_refused_without_a_layout():
    with pytest.raises(BufferImportError, match="bare address needs the geometry") as info:
        VariantPack.from_mapping({1: 0x1000})
    assert info.type is BufferImportError


def test_duplicate_uid_without_a_layout():
    a = np.zeros(2, np.float32)
    with pytest.raises(DuplicateTensorError, match="^tensor uid 3 is given twice") as info:
        VariantPack.from_mapping({3: a, Tensor(3): a})
    assert isinstance(info.value, ValueError) and info.value.uid == 3


def test_keys_may_be_numpy_integers():
    a = np.zeros(2, np.float32)
    assert VariantPack.from_mapping({np.int64(4): a}).uids == (4,)


@pytest.mark.parametrize("key", [1.5, None, b"x", True])
def test_bad_keys(key):
    with pytest.raises(TypeError, match="keys are tensors, uids or tensor names"):
        VariantPack.from_mapping({key: np.zeros(2, np.float32)})


def test_not_a_mapping():
    with pytest.raises(TypeError, match="a variant pack is a mapping"):
        VariantPack.from_mapping([np.zeros(2)])
    with pytest.raises(TypeError, match="a variant pack is a mapping"):
        PackLayout([spec()]).pack([np.zeros(2)])


def test_variant_pack_cannot_be_constructed_directly():
    with pytest.raises(TypeError):
        VariantPack()


# ---- PackLayout ---------------------------------------------------------------------------------


def test_layout_packs_by_uid_name_and_tensor():
    layout = PackLayout([spec(3, name="c"), spec(1, name="a"), spec(2, name="b", is_output=True)])
    assert [s.uid for s in layout.specs] == [1, 2, 3] and len(layout) == 3
    assert layout.spec(2).name == "b"
    a, b, c = (np.zeros((2, 3), np.float32) for _ in range(3))
    pack = layout.pack({"c": c, Tensor(1): a, 2: b})
    assert pack.uids == (1, 2, 3)
    assert pack.data_ptrs == (_ptr(a), _ptr(b), _ptr(c))
    assert pack.layout is layout


def test_bare_int_takes_the_geometry_of_the_spec():
    layout = PackLayout([spec(1, (4, 8), "bfloat16", device="cuda:1"),
                         spec(2, (2, 3), "float32", strides=(1, 2), device="cuda")])
    pack = layout.pack({1: 0x7F0000000000, 2: 4096})
    s1, s2 = pack.slots
    assert (s1.shape, s1.strides, s1.dtype, s1.device) == ((4, 8), (8, 1), "bfloat16", ("cuda", 1))
    assert s1.data_ptr == 0x7F0000000000 and not s1.readonly
    assert (s2.shape, s2.strides, s2.dtype, s2.device) == ((2, 3), (1, 2), "float32", ("cuda", 0))
    assert pack.data_ptrs == (0x7F0000000000, 4096)


def test_bare_int_for_a_high_rank_and_a_zero_size_spec():
    layout = PackLayout([spec(1, (1, 2, 1, 2, 1, 2, 1, 2), "int8", device="cuda"),
                         spec(2, (0, 5), "float32", device="cuda")])
    pack = layout.pack({1: 4096, 2: 0})                   # NULL is fine when nothing is addressed
    assert pack.slots[0].strides == (16, 8, 8, 4, 4, 2, 2, 1)
    assert pack.slots[1].numel == 0 and pack.slots[1].data_ptr == 0


@pytest.mark.parametrize("address, error, pattern", [
    (-4096, ValueError, r"tensor 't1' \(uid 1\): address -4096 is negative"),
    (0, ValueError, r"tensor 't1' \(uid 1\): address 0 \(NULL\) for a tensor of shape \(2, 3\)"),
    (4098, AlignmentError, r"data address aligned to 4 bytes expected a multiple of 4; got 0x1002"),
    (2 ** 64, ValueError, r"does not fit in a pointer"),
])
def test_bad_bare_addresses(address, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        PackLayout([spec(1, device="cuda")]).pack({1: address})
    assert info.type is error


def test_bare_int_on_a_host_tensor_is_refused_naming_it():
    # This process would dereference it: an int cannot prove it spans the declared size.
    from cudnn_graph import HostAddressError, CudnnGraphError
    with pytest.raises(HostAddressError, match=r"tensor 't1' \(uid 1\): expected a host buffer .*Slot.from_address.*got an int") as info:
        PackLayout([spec(1)]).pack({1: 4096})
    assert isinstance(info.value, (CudnnGraphError, TypeError))


def test_unknown_and_missing_tensors():
    layout = PackLayout([spec(1, name="x"), spec(2, name="y"), spec(3, name="bias", required=False)])
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(UnknownTensorError, match=r"uid 9 is not a tensor of this graph \(its uids: \[1, 2, 3\]\)"):
        layout.pack({1: a, 2: a, 9: a})
    with pytest.raises(UnknownTensorError, match="the graph has no tensor named 'z'"):
        layout.pack({"z": a})
    with pytest.raises(MissingTensorError, match=r"lacks tensor 'y' \(uid 2\)$") as info:
        layout.pack({1: a})
    assert info.type is MissingTensorError
    pack = layout.pack({1: a, 2: a})                     # the optional tensor may be left out
    assert pack.uids == (1, 2) and len(pack.slots) == 2


def test_duplicate_key_through_a_name_and_a_uid():
    layout = PackLayout([spec(1, name="x")])
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(DuplicateTensorError, match=r"^tensor 'x' \(uid 1\) is given twice in the variant pack "
                                                   r"\(as name 'x' and uid 1\)$") as info:
        layout.pack({"x": a, 1: a})
    assert isinstance(info.value, ValueError) and (info.value.tensor_name, info.value.uid) == ("x", 1)


def test_import_errors_name_the_tensor():
    layout = PackLayout([spec(4, name="weights")])
    with pytest.raises(BufferImportError, match=r"^tensor 'weights' \(uid 4\): list is not a buffer"):
        layout.pack({4: [1, 2, 3]})


def test_a_reused_capsule_names_the_tensor():
    layout = PackLayout([spec(4, name="weights")])
    capsule = np.zeros((2, 3), np.float32).__dlpack__()
    layout.pack({4: capsule})
    with pytest.raises(MalformedBufferError, match=r"^tensor 'weights' \(uid 4\): capsule: the DLPack capsule "
                                                   r"was already consumed"):
        layout.pack({4: capsule})


def test_layout_rejects_bad_specs():
    with pytest.raises(ValueError, match="uid 1 appears twice"):
        PackLayout([spec(1), spec(1)])
    with pytest.raises(TypeError, match="PackLayout takes TensorSpec objects"):
        PackLayout([object()])


def test_stream_reaches_the_producer_through_a_pack():
    a = np.zeros((2, 3), np.float32)
    p = ep.CapsuleProducer(lambda **kw: ep.make_capsule(a, device=(2, 0)), device=(2, 0))
    PackLayout([spec(1, device="cuda")]).pack({1: p}, stream=42)
    assert p.calls == [{"stream": 42, "max_version": (1, 3)}]


def test_slot_in_a_pack_is_checked_too():
    s = Slot.from_object(np.zeros((2, 3), np.float64))
    with pytest.raises(DataTypeMismatchError, match="expected float32; got float64"):
        PackLayout([spec(1)]).pack({1: s})
    assert PackLayout([spec(1, dtype="float64")]).pack({1: s}).slots[0] is s


# ---- TensorSpec ---------------------------------------------------------------------------------


def test_tensor_spec_properties():
    s = TensorSpec(5, (2, 4), "bf16", device="cuda:2", name="q", is_output=True)
    assert (s.uid, s.shape, s.strides, s.dtype, s.device) == (5, (2, 4), None, "bfloat16", ("cuda", 2))
    assert s.is_output and s.required and s.alignment == 2
    assert s.row_major_strides == (4, 1)
    assert s.label() == "tensor 'q' (uid 5)"
    assert TensorSpec(6, (3,), "float32").label() == "tensor uid 6"
    assert "uid=5" in repr(s)


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(shape=(2.5, 3)), TypeError, "integer"),
    (dict(shape=(2, -1)), ValueError, r"shape\[1\] = -1 is negative"),
    (dict(shape=(2, 3), strides=(1,)), ValueError, "1 strides for the 2-d shape"),
    (dict(shape=(2 ** 40, 2 ** 40)), ValueError, "overflows int64"),
    (dict(shape=(1,) * 65), ValueError, "exceeds 64 dimensions"),
    (dict(alignment=3), ValueError, "alignment must be a positive power of two"),
    (dict(dtype="float33"), TypeError, "cannot interpret"),
    (dict(device="tpu"), ValueError, "unknown device"),
])
def test_tensor_spec_rejects(kwargs, error, pattern):
    args = dict(uid=1, shape=(2, 3), dtype="float32")
    args.update(kwargs)
    with pytest.raises(error, match=pattern):
        TensorSpec(args.pop("uid"), args.pop("shape"), args.pop("dtype"), **args)


# ---- check(): dtype ------------------------------------------------------------------------------


def test_dtype_mismatch_message_names_both_types_and_the_tensor():
    s = Slot.from_address(4096, (2, 3), dtype="bfloat16", device="cpu")
    with pytest.raises(DataTypeMismatchError) as info:
        check(s, spec(1, name="x"))
    assert str(info.value) == "tensor 'x' (uid 1): dtype expected float32; got bfloat16"
    assert info.type is DataTypeMismatchError
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    e = info.value
    assert (e.tensor_name, e.uid, e.expected, e.got) == ("x", 1, "float32", "bfloat16")


def test_every_dtype_pair_is_compared_by_code():
    """Equal codes pass, different codes fail and the message can never read 'X; got X'."""
    slots = {n: Slot.from_address(4096, (2,), dtype=n, device="cpu") for n in ALL_DTYPE_NAMES}
    specs = {n: TensorSpec(1, (2,), n, device="cpu", alignment=1) for n in ALL_DTYPE_NAMES}
    for got, want in itertools.product(ALL_DTYPE_NAMES, repeat=2):
        if got == want:
            check(slots[got], specs[want])
            continue
        with pytest.raises(DataTypeMismatchError) as info:
            check(slots[got], specs[want])
        msg = str(info.value)
        assert msg.endswith(f"expected {want}; got {got}"), msg
        assert info.value.expected != info.value.got


def _float32_from_every_producer():
    a = np.zeros((2, 3), np.float32)
    return {
        "numpy": Slot.from_object(a),
        "capsule": Slot.from_object(ep.make_capsule(a, dtype=(2, 32, 1))),
        "legacy": Slot.from_object(ep.make_capsule(a, versioned=False)),
        "exchange": Slot.from_object(ep.ExchangeProducer(a)),
        "address": Slot.from_address(_ptr(a), (2, 3), dtype=np.float32, device="cpu"),
    }


@pytest.mark.parametrize("spelling", ["float32", "fp32", "float", np.float32, np.dtype("float32"),
                                      DataType.FLOAT, (2, 32), (2, 32, 1), "torch.float32", "jnp.float32"])
def test_same_dtype_from_any_producer_and_any_spelling_matches(spelling):
    for label, s in _float32_from_every_producer().items():
        check(s, TensorSpec(1, (2, 3), spelling, device="cpu"))


def test_bfloat16_from_cai_matches_an_ml_dtypes_spec():
    a = np.zeros(8, np.uint16)
    s = Slot.from_object(CAI({"version": 3, "shape": (8,), "typestr": "<V2",
                              "descr": [("bfloat16", "<V2")], "data": (_ptr(a), False)}, a))
    for spelling in (ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16), "bf16", DataType.BFLOAT16):
        check(s, TensorSpec(1, (8,), spelling, device="cuda"))
    with pytest.raises(DataTypeMismatchError, match="expected float16; got bfloat16"):
        check(s, TensorSpec(1, (8,), "float16", device="cuda"))


# ---- check(): shape, strides -------------------------------------------------------------------


def test_shape_mismatch():
    s = Slot.from_object(np.zeros((2, 4), np.float32))
    with pytest.raises(ShapeMismatchError) as info:
        check(s, spec(1, (2, 3), name="x"))
    assert str(info.value) == "tensor 'x' (uid 1): shape expected (2, 3); got (2, 4)"
    with pytest.raises(ShapeMismatchError, match=r"expected \(8,\); got \(2, 4\)"):
        check(s, spec(1, (8,)))


def test_stride_mismatch():
    a = np.zeros((4, 6), np.float32)
    with pytest.raises(StrideMismatchError) as info:
        check(Slot.from_object(a[:, ::2]), spec(1, (4, 3), strides=(3, 1), name="w"))
    assert str(info.value) == "tensor 'w' (uid 1): strides (in elements) expected (3, 1); got (6, 2)"
    check(Slot.from_object(a[:, ::2]), spec(1, (4, 3)))                # strides=None: any layout
    check(Slot.from_object(a[:, ::2]), spec(1, (4, 3), strides=(6, 2)))


def test_extent_one_dims_ignore_strides():
    s = Slot.from_address(4096, (1, 4), (1000, 1), "float32", "cpu")
    check(s, spec(1, (1, 4), strides=(4, 1)))
    s = Slot.from_address(4096, (1, 4, 1), (7, 2, -3), "float32", "cpu")
    check(s, spec(1, (1, 4, 1), strides=(4, 2, 1)))
    with pytest.raises(StrideMismatchError):
        check(Slot.from_address(4096, (1, 4), (4, 2), "float32", "cpu"), spec(1, (1, 4), strides=(4, 1)))


def test_zero_size_ignores_strides():
    s = Slot.from_address(0, (0, 4), (9, 9), "float32", "cpu")
    check(s, spec(1, (0, 4), strides=(4, 1)))


# ---- check(): device, alignment, read-only outputs ---------------------------------------------


def test_device_kind_mismatch():
    s = Slot.from_object(np.zeros((2, 3), np.float32))
    with pytest.raises(DeviceMismatchError) as info:
        check(s, spec(1, device="cuda", name="x"))
    assert str(info.value) == "tensor 'x' (uid 1): device expected cuda:0; got cpu"
    with pytest.raises(DeviceMismatchError, match="expected cpu; got cuda_host:0"):
        check(Slot.from_address(4096, (2, 3), dtype="float32", device=(3, 0)), spec(1, device="cpu"))


def test_device_ordinal_mismatch():
    s = Slot.from_address(4096, (2, 3), dtype="float32", device="cuda:1")
    with pytest.raises(DeviceMismatchError, match="expected cuda:0; got cuda:1"):
        check(s, spec(1, device="cuda:0"))
    check(s, spec(1, device="cuda:1"))


def test_managed_memory_is_accepted_for_its_own_device_only():
    managed = Slot.from_address(4096, (2, 3), dtype="float32", device=(13, 0))
    check(managed, spec(1, device="cuda:0"))
    with pytest.raises(DeviceMismatchError, match="expected cuda:1; got cuda_managed:0"):
        check(managed, spec(1, device="cuda:1"))
    with pytest.raises(DeviceMismatchError):
        check(managed, spec(1, device="cpu"))


def test_misalignment():
    a = np.zeros(16, np.float32)
    s = Slot.from_object(ep.make_capsule(a, shape=(2, 3), strides=(3, 1), byte_offset=2))
    with pytest.raises(AlignmentError) as info:
        check(s, spec(1, name="x"))
    assert info.type is AlignmentError
    assert f"got 0x{_ptr(a) + 2:x}" in str(info.value)
    assert "data address aligned to 4 bytes" in str(info.value)
    ok = Slot.from_address(4096 + 8, (2, 3), dtype="float32", device="cpu")
    check(ok, spec(1))
    with pytest.raises(AlignmentError, match="aligned to 16 bytes"):
        check(ok, spec(1, alignment=16))


def test_read_only_buffer_as_an_output():
    a = np.zeros((2, 3), np.float32)
    a.flags.writeable = False
    s = Slot.from_object(a)                                # a versioned capsule with READ_ONLY
    assert s.readonly
    check(s, spec(1))                                      # fine as an input
    with pytest.raises(ReadOnlyOutputError) as info:
        check(s, spec(1, name="y", is_output=True))
    assert info.type is ReadOnlyOutputError
    assert "tensor 'y' (uid 1)" in str(info.value) and "read-only" in str(info.value)
    with pytest.raises(ReadOnlyOutputError):
        PackLayout([spec(1, name="y", is_output=True)]).pack({"y": a})


def test_pack_checks_each_slot_and_names_it():
    layout = PackLayout([spec(1, name="x"), spec(2, name="y", is_output=True)])
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeMismatchError, match=r"^tensor 'y' \(uid 2\): shape"):
        layout.pack({"x": x, "y": np.zeros((3, 2), np.float32)})
    with pytest.raises(DataTypeMismatchError, match=r"^tensor 'y' \(uid 2\): dtype expected float32; got int32"):
        layout.pack({"x": x, "y": np.zeros((2, 3), np.int32)})
    with pytest.raises(MalformedBufferError):
        layout.pack({"x": x, "y": ep.make_capsule(x, dtype=(2, 32, 2))})


def test_check_takes_slots_and_specs_only():
    with pytest.raises(TypeError):
        check(np.zeros(2), spec(1))
