"""VariantPack: a call's buffers normalised once into slots, uids ascending, with C pointer arrays.

``PackLayout`` is the per-plan, immutable description of what a call must supply (a ``TensorSpec`` per
uid); it is shared by every thread that executes the plan. A ``VariantPack`` is per call: its slots
and arrays belong to that call alone, so concurrent calls never see each other's pointers.
"""
cimport cython
from libc.stdint cimport int32_t, int64_t, intptr_t, uintptr_t
from libc.stdlib cimport malloc, free

from cudnn_graph._dlpack cimport DLDataType, DLDevice, kDLCUDA, kDLCUDAManaged
from cudnn_graph._dtypes cimport parse_dtype, dtype_name
from cudnn_graph._slot cimport Slot, slot_from_object, slot_from_address, SLOT_MAX_NDIM
from cudnn_graph._slot import device_name, _parse_device

from cudnn_graph.errors import (
    DataTypeMismatchError, ShapeMismatchError, StrideMismatchError, DeviceMismatchError,
    AlignmentError, ReadOnlyOutputError, MissingTensorError, UnknownTensorError, BufferImportError)


def _row_major(shape):
    strides = []
    acc = 1
    for extent in reversed(shape):
        strides.append(acc)
        acc *= max(extent, 1)
    return tuple(reversed(strides))


@cython.final
cdef class TensorSpec:
    """What a graph expects for one operand: uid, dtype, shape, (strides), device, alignment, role.

    ``strides=None`` accepts any layout. Extents of 1 (and zero-size tensors) ignore strides,
    since no element is ever addressed through them.

    Example:
        >>> spec = TensorSpec(3, (2, 4), "float32", device="cpu", name="x")
        >>> spec.dtype, spec.device
        ('float32', ('cpu', 0))
    """

    def __init__(self, uid, shape, dtype, *, strides=None, device="cuda", name="",
                 alignment=None, is_output=False, required=True):
        cdef int i
        self.uid = uid
        self.name = str(name)
        self.shape = tuple(int(x) for x in shape)
        self._ndim = len(self.shape)
        if self._ndim > SLOT_MAX_NDIM:
            raise ValueError(f"a {self._ndim}-d tensor exceeds {SLOT_MAX_NDIM} dimensions")
        self.strides = None if strides is None else tuple(int(x) for x in strides)
        if self.strides is not None and len(self.strides) != self._ndim:
            raise ValueError(f"{len(self.strides)} strides for the {self._ndim}-d shape {self.shape}")
        self._dtype = parse_dtype(dtype)
        device_type, device_id = _parse_device(device)
        self._device.device_type = device_type
        self._device.device_id = device_id
        self.alignment = max(1, (self._dtype.bits + 7) // 8) if alignment is None else int(alignment)
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise ValueError(f"alignment must be a positive power of two; got {alignment}")
        self.is_output = bool(is_output)
        self.required = bool(required)
        for i in range(self._ndim):
            self._shape[i] = self.shape[i]
            self._strides[i] = self.strides[i] if self.strides is not None else 0

    @property
    def dtype(self) -> str:
        return dtype_name(self._dtype)

    @property
    def device(self) -> tuple:
        return (device_name(self._device.device_type, 0).split(":")[0], self._device.device_id)

    @property
    def row_major_strides(self) -> tuple:
        return _row_major(self.shape)

    def label(self) -> str:
        return f"tensor '{self.name}' (uid {self.uid})" if self.name else f"tensor uid {self.uid}"

    def __repr__(self):
        return (f"TensorSpec(uid={self.uid}, name={self.name!r}, shape={self.shape}, "
                f"strides={self.strides}, dtype={self.dtype}, device={self.device}, "
                f"{'output' if self.is_output else 'input'})")


cdef inline bint _same_device(DLDevice got, DLDevice want) noexcept:
    if got.device_id != want.device_id:
        return False
    if got.device_type == want.device_type:
        return True
    # Managed memory is addressable from the device it is bound to.
    return want.device_type == kDLCUDA and got.device_type == kDLCUDAManaged


cdef int check_slot(Slot s, TensorSpec spec) except -1:
    """Raise a typed error naming the tensor unless the slot matches what the spec declares."""
    cdef int i
    cdef bint zero_size = False
    cdef DLDataType got = s.tensor.dtype
    if got.code != spec._dtype.code or got.bits != spec._dtype.bits or got.lanes != spec._dtype.lanes:
        raise DataTypeMismatchError(spec.name, spec.uid, "dtype", spec.dtype, dtype_name(got))
    if s.tensor.ndim != spec._ndim:
        raise ShapeMismatchError(spec.name, spec.uid, "shape", spec.shape, s.shape)
    for i in range(spec._ndim):
        if s.tensor.shape[i] != spec._shape[i]:
            raise ShapeMismatchError(spec.name, spec.uid, "shape", spec.shape, s.shape)
        if spec._shape[i] == 0:
            zero_size = True
    if spec.strides is not None and not zero_size:
        for i in range(spec._ndim):
            if spec._shape[i] != 1 and s.tensor.strides[i] != spec._strides[i]:
                raise StrideMismatchError(spec.name, spec.uid, "strides (in elements)", spec.strides,
                                          s.strides)
    if not _same_device(s.tensor.device, spec._device):
        raise DeviceMismatchError(
            spec.name, spec.uid, "device",
            device_name(spec._device.device_type, spec._device.device_id),
            device_name(s.tensor.device.device_type, s.tensor.device.device_id))
    if (<uintptr_t>s.tensor.data) % <uintptr_t>spec.alignment != 0:
        raise AlignmentError(spec.name, spec.uid, f"data address aligned to {spec.alignment} bytes",
                             f"a multiple of {spec.alignment}", f"0x{<uintptr_t>s.tensor.data:x}")
    if spec.is_output and s._readonly:
        raise ReadOnlyOutputError(spec.name, spec.uid, "a writable buffer (it is an output)",
                                  "writable", "a read-only buffer")
    return 0


def check(Slot slot, TensorSpec expected) -> None:
    """Check one slot against what the graph expects; raises a typed error naming the tensor.

    Example:
        >>> import numpy as np
        >>> check(Slot.from_object(np.zeros((2, 4), np.float32)),
        ...       TensorSpec(1, (2, 4), "float32", device="cpu", name="x"))
    """
    check_slot(slot, expected)


@cython.final
cdef class PackLayout:
    """The immutable, shareable list of operands a plan needs (sorted by uid).

    Example:
        >>> layout = PackLayout([TensorSpec(2, (4,), "float32", device="cpu", name="y", is_output=True),
        ...                      TensorSpec(1, (4,), "float32", device="cpu", name="x")])
        >>> [s.uid for s in layout.specs]
        [1, 2]
    """

    def __init__(self, specs):
        specs = sorted(specs, key=lambda s: s.uid)
        self._index = {}
        self._by_name = {}
        for i, spec in enumerate(specs):
            if not isinstance(spec, TensorSpec):
                raise TypeError(f"PackLayout takes TensorSpec objects; got {type(spec).__name__}")
            if spec.uid in self._index:
                raise ValueError(f"uid {spec.uid} appears twice in the layout")
            self._index[spec.uid] = i
            if spec.name:
                self._by_name[spec.name] = spec.uid
        self.specs = tuple(specs)

    def spec(self, uid) -> TensorSpec:
        return self.specs[self._index[uid]]

    def pack(self, mapping, *, stream=None):
        """Normalise ``{Tensor | uid | name: buffer}`` into a checked VariantPack for one call."""
        return pack_from_mapping(mapping, self, stream)

    def __len__(self):
        return len(self.specs)


cdef inline int64_t _key_uid(object key, PackLayout layout) except? -1:
    if type(key) is int:
        return key
    uid = getattr(key, "uid", None)
    if uid is not None:
        return uid
    if isinstance(key, str) and layout is not None:
        found = layout._by_name.get(key)
        if found is None:
            raise UnknownTensorError(f"the graph has no tensor named '{key}'")
        return found
    if isinstance(key, int) and not isinstance(key, bool):
        return int(key)
    raise TypeError(f"variant pack keys are tensors, uids or tensor names; got {type(key).__name__}")


cdef Slot _slot_for(object buffer, TensorSpec spec, object stream):
    if type(buffer) is int:
        # A bare address takes the geometry the graph declares for the tensor.
        return slot_from_address(buffer, spec.shape,
                                 spec.strides if spec.strides is not None else None,
                                 spec._dtype, spec._device, False)
    try:
        return slot_from_object(buffer, stream)
    except BufferImportError as exc:
        raise BufferImportError(f"{spec.label()}: {exc}") from None


@cython.final
cdef class VariantPack:
    """One call's operands: slots sorted by uid, with C arrays of uids and data pointers.

    Example:
        >>> import numpy as np
        >>> x, y = np.ones(4, np.float32), np.zeros(4, np.float32)
        >>> pack = VariantPack.from_mapping({2: y, 1: x})
        >>> pack.uids
        (1, 2)
    """

    def __cinit__(self):
        self._n = 0
        self._uids = self._uid_inline
        self._ptrs = self._ptr_inline
        self.slots = ()
        self.layout = None

    def __init__(self, *args, **kwargs):
        raise TypeError("use VariantPack.from_mapping(mapping) or PackLayout.pack(mapping)")

    def __dealloc__(self):
        if self._uids != self._uid_inline:
            free(self._uids)
        if self._ptrs != self._ptr_inline:
            free(<void*>self._ptrs)

    @staticmethod
    def from_mapping(mapping, layout=None, *, stream=None):
        """Normalise ``{Tensor | uid: buffer}``; with a layout, also check every slot against it."""
        return pack_from_mapping(mapping, layout, stream)

    @property
    def uids(self) -> tuple:
        return tuple([self._uids[i] for i in range(self._n)])

    @property
    def data_ptrs(self) -> tuple:
        return tuple([<uintptr_t>self._ptrs[i] for i in range(self._n)])

    @property
    def uid_array_address(self) -> int:
        """Address of the int64 uid array (valid while the pack lives)."""
        return <uintptr_t>self._uids

    @property
    def pointer_array_address(self) -> int:
        """Address of the void* data-pointer array (valid while the pack lives)."""
        return <uintptr_t>self._ptrs

    def __len__(self):
        return self._n

    def __getitem__(self, uid) -> Slot:
        for i in range(self._n):
            if self._uids[i] == uid:
                return self.slots[i]
        raise KeyError(uid)


cdef VariantPack pack_from_mapping(object mapping, PackLayout layout, object stream):
    cdef VariantPack pack = VariantPack.__new__(VariantPack)
    cdef int n, i
    cdef int64_t uid
    cdef Slot s
    cdef TensorSpec spec
    if not hasattr(mapping, "items"):
        raise TypeError(f"a variant pack is a mapping {{tensor or uid: buffer}}; got {type(mapping).__name__}")
    n = len(mapping)
    if n > PACK_INLINE:
        pack._uids = <int64_t*>malloc(n * sizeof(int64_t))
        pack._ptrs = <void**>malloc(n * sizeof(void*))
        if pack._uids == NULL or pack._ptrs == NULL:
            raise MemoryError()
    entries = []
    seen = set()
    for key, buffer in mapping.items():
        uid = _key_uid(key, layout)
        if uid in seen:
            raise ValueError(f"tensor uid {uid} is given twice in the variant pack")
        seen.add(uid)
        if layout is not None:
            position = layout._index.get(uid)
            if position is None:
                raise UnknownTensorError(
                    f"uid {uid} is not a tensor of this graph (its uids: {sorted(layout._index)})")
            spec = <TensorSpec>layout.specs[position]
            s = _slot_for(buffer, spec, stream)
            check_slot(s, spec)
        else:
            if type(buffer) is int:
                raise BufferImportError(
                    f"tensor uid {uid}: a bare address needs the geometry a graph declares; "
                    "pack it through the graph (or a PackLayout) or use Slot.from_address")
            s = slot_from_object(buffer, stream)
        entries.append((uid, s))
    if layout is not None and len(entries) < len(layout.specs):
        missing = [sp for sp in layout.specs if sp.required and sp.uid not in seen]
        if missing:
            raise MissingTensorError(
                "the variant pack lacks " + ", ".join((<TensorSpec>sp).label() for sp in missing))
    entries.sort(key=lambda e: e[0])
    for i in range(n):
        uid, s = entries[i]
        pack._uids[i] = uid
        pack._ptrs[i] = s.tensor.data
    pack._n = n
    pack.slots = tuple([e[1] for e in entries])
    pack.layout = layout
    return pack
