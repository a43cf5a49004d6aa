"""VariantPack: a call's buffers normalised once into slots, uids ascending, with C pointer arrays.

``PackLayout`` is the per-plan, immutable description of what a call must supply (a ``TensorSpec`` per
uid); it is shared by every thread that executes the plan. A ``VariantPack`` is per call: its slots
and arrays belong to that call alone, so concurrent calls never see each other's pointers.
"""
cimport cython
from libc.stdint cimport int32_t, int64_t, intptr_t, uintptr_t, uint8_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset, memcpy
import weakref
from cpython.number cimport PyNumber_Index
from cpython.long cimport PyLong_AsLongAndOverflow

from cudnn_graph._dlpack cimport DLTensor, DLDataType, DLDevice, kDLCUDA, kDLCUDAManaged
from cudnn_graph._dtypes cimport parse_dtype, dtype_name
from cudnn_graph._ir cimport Tensor
from cudnn_graph._slot cimport Slot, slot_from_object, slot_or_view, slot_from_address, SLOT_MAX_NDIM, SLOT_INLINE_DIMS
from cudnn_graph._slot import device_name, _parse_device
from cudnn_graph._layout import row_major_strides

from cudnn_graph.errors import (
    DataTypeMismatchError, ShapeMismatchError, StrideMismatchError, DeviceMismatchError,
    AlignmentError, ReadOnlyOutputError, MissingTensorError, UnknownTensorError, BufferImportError,
    HostAddressError)
from cudnn_graph.errors import AmbiguousTensorNameError
from cudnn_graph.errors import (
    MalformedBufferError, ForeignTensorError, VirtualTensorError, DuplicateTensorError, OverlappingOutputError,
    _label)


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
        # Extents and strides must be integers: 2.5 is refused, never truncated.
        self.shape = tuple([PyNumber_Index(x) for x in shape])
        self._ndim = len(self.shape)
        if self._ndim > SLOT_MAX_NDIM:
            raise ValueError(f"a {self._ndim}-d tensor exceeds {SLOT_MAX_NDIM} dimensions")
        self.strides = None if strides is None else tuple([PyNumber_Index(x) for x in strides])
        if self.strides is not None and len(self.strides) != self._ndim:
            raise ValueError(f"{len(self.strides)} strides for the {self._ndim}-d shape {self.shape}")
        self._dtype = parse_dtype(dtype)
        device_type, device_id = _parse_device(device)
        self._device.device_type = device_type
        self._device.device_id = device_id
        # The geometry must describe addressable memory (no negative extent, nothing beyond int64):
        # a bare address takes it verbatim, so it is validated once, here.
        try:
            slot_from_address(4096, self.shape, self.strides, self._dtype, self._device, False)
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"{self.label()}: {exc}") from None
        self.alignment = max(1, (self._dtype.bits + 7) // 8) if alignment is None else int(alignment)
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise ValueError(f"alignment must be a positive power of two; got {alignment}")
        self.is_output = bool(is_output)
        self.required = bool(required)
        self._empty = False
        for i in range(self._ndim):
            self._shape[i] = self.shape[i]
            self._strides[i] = self.strides[i] if self.strides is not None else 0
            if self._shape[i] == 0:
                self._empty = True
        # A buffer matching declared strides addresses what they address: decided once, here.
        self._overlapping = (self.strides is not None and not self._empty
                             and strides_overlap(self._shape, self._strides, self._ndim))

    @property
    def dtype(self) -> str:
        return dtype_name(self._dtype)

    @property
    def device(self) -> tuple:
        return (device_name(self._device.device_type, 0).split(":")[0], self._device.device_id)

    @property
    def row_major_strides(self) -> tuple:
        return row_major_strides(self.shape)

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


cdef tuple _dims(const int64_t* values, int n):
    return tuple([values[i] for i in range(n)])


cdef bint _same_bytes(const DLTensor* t, TensorSpec spec) noexcept:
    """Whether ``t`` addresses the same elements at the same offsets as the spec's declared layout,
    although its shape differs: e.g. a (64,) buffer for a (1, 64, 1, 1) tensor. Called only once the
    exact comparison failed, so a buffer of the declared shape costs nothing here.

    Unit extents address nothing, so they (and their strides) are dropped from both sides; what is
    left must be equal extent by extent, and stride by stride where the spec declares strides. A
    zero-size tensor addresses no byte at all: only its remaining extents are compared. A buffer with
    no strides (a row-major producer) is compared only when the spec declares none.
    """
    cdef int i = 0, j = 0
    cdef bint empty = spec._empty
    cdef bint strided = spec.strides is not None
    if t.ndim < 0 or t.ndim > SLOT_MAX_NDIM or (t.ndim > 0 and t.shape == NULL):
        return False
    for j in range(t.ndim):
        if t.shape[j] == 0:
            empty = True
    if strided and not empty and t.ndim > 0 and t.strides == NULL:
        return False
    j = 0
    while True:
        while i < spec._ndim and spec._shape[i] == 1:
            i += 1
        while j < t.ndim and t.shape[j] == 1:
            j += 1
        if i == spec._ndim or j == t.ndim:
            return i == spec._ndim and j == t.ndim
        if t.shape[j] != spec._shape[i]:
            return False
        if strided and not empty and t.strides[j] != spec._strides[i]:
            return False
        i += 1
        j += 1


cdef Slot _spec_shaped_slot(TensorSpec spec):
    """A new Slot with the spec's shape, and its strides where it declares them (no data yet)."""
    cdef int ndim = spec._ndim
    cdef Slot s = Slot.__new__(Slot)
    if ndim > SLOT_INLINE_DIMS:
        s._alloc_geometry(ndim)
    else:
        s.tensor.ndim = ndim
    memcpy(s.tensor.shape, spec._shape, ndim * sizeof(int64_t))
    if spec.strides is not None:
        memcpy(s.tensor.strides, spec._strides, ndim * sizeof(int64_t))
    return s


cdef Slot _slot_as_declared(Slot s, TensorSpec spec):
    """A slot over the same memory as ``s`` with the spec's shape (``_same_bytes`` held), so every engine
    reads the declared geometry; it keeps ``s`` (and so the producer's memory) alive."""
    cdef int i, j, ndim = spec._ndim
    cdef int64_t inner = 1
    cdef Slot out = _spec_shaped_slot(spec)
    if spec.strides is None:
        # The buffer's strides carry over extent by extent; a unit extent gets the row-major step
        # of what follows it (its stride addresses nothing).
        j = s.tensor.ndim - 1
        for i in range(ndim - 1, -1, -1):
            if spec._shape[i] == 1:
                out.tensor.strides[i] = inner
                continue
            while j >= 0 and s.tensor.shape[j] == 1:
                j -= 1
            out.tensor.strides[i] = s.tensor.strides[j] if j >= 0 and s.tensor.strides != NULL else inner
            inner = out.tensor.strides[i] * spec._shape[i]
            j -= 1
    out.tensor.data = s.tensor.data
    out.tensor.dtype = s.tensor.dtype
    out.tensor.device = s.tensor.device
    out._owner = s
    out._readonly = s._readonly
    out._producer_stream = s._producer_stream
    return out


cdef bint strides_overlap(const int64_t* shape, const int64_t* strides, int ndim) noexcept nogil:
    """True unless every index of a (non-empty) ``shape`` maps to its own element under ``strides``.

    Row-major compact strides (the common case) answer in one pass. Otherwise the dims of extent > 1,
    sorted by |stride|, must each step past everything the smaller ones span (a sufficient test:
    a few interleaved layouts that do not overlap are refused too). Spans fit in int64: a Slot's and
    a spec's geometry are validated when made.
    """
    cdef int i, j, n = 0
    cdef int64_t acc = 1, span = 0, step
    cdef int64_t steps[SLOT_MAX_NDIM]
    cdef int64_t extents[SLOT_MAX_NDIM]
    for i in range(ndim - 1, -1, -1):
        if shape[i] != 1 and strides[i] != acc:
            break
        acc *= shape[i]
    else:
        return False
    for i in range(ndim):
        if shape[i] == 1:
            continue
        step = strides[i] if strides[i] >= 0 else -strides[i]
        j = n
        while j > 0 and steps[j - 1] > step:     # insertion sort: ndim is small
            steps[j] = steps[j - 1]
            extents[j] = extents[j - 1]
            j -= 1
        steps[j] = step
        extents[j] = shape[i]
        n += 1
    for i in range(n):
        if steps[i] <= span:
            return True
        span += steps[i] * (extents[i] - 1)
    return False


cdef int check_tensor(const DLTensor* t, void* data, bint readonly, TensorSpec spec) except -1:
    """Raise a typed error naming the tensor unless ``t`` (data at ``data``) matches the spec.

    ``t`` may be a borrowed producer view (shape/strides valid for this call only); only the
    spec's own validated geometry is trusted, so a view that matches it is well formed.
    Returns 0 when the geometry is the declared one, 1 when it differs but addresses the same bytes
    (``_same_bytes``): the caller then hands engines a slot with the declared geometry.
    """
    cdef int i
    cdef bint zero_size = False
    cdef int result = 0
    cdef DLDataType got = t.dtype
    if got.code != spec._dtype.code or got.bits != spec._dtype.bits or got.lanes != spec._dtype.lanes:
        raise DataTypeMismatchError(spec.name, spec.uid, "dtype", spec.dtype, dtype_name(got))
    if t.ndim != spec._ndim or (t.ndim > 0 and t.shape == NULL):
        if not _same_bytes(t, spec):
            raise ShapeMismatchError(spec.name, spec.uid, "shape", spec.shape,
                                     _dims(t.shape, t.ndim) if t.shape != NULL else f"{t.ndim}-d (no shape)")
        result = 1
    for i in range(spec._ndim if result == 0 else 0):
        if t.shape[i] != spec._shape[i]:
            if not _same_bytes(t, spec):
                raise ShapeMismatchError(spec.name, spec.uid, "shape", spec.shape, _dims(t.shape, t.ndim))
            result = 1
            break
        if spec._shape[i] == 0:
            zero_size = True
    if spec.strides is not None and not zero_size and result == 0:
        if t.ndim > 0 and t.strides == NULL:
            raise StrideMismatchError(spec.name, spec.uid, "strides (in elements)", spec.strides, "none")
        for i in range(spec._ndim):
            if spec._shape[i] != 1 and t.strides[i] != spec._strides[i]:
                raise StrideMismatchError(spec.name, spec.uid, "strides (in elements)", spec.strides,
                                          _dims(t.strides, t.ndim))
    if not _same_device(t.device, spec._device):
        raise DeviceMismatchError(
            spec.name, spec.uid, "device",
            device_name(spec._device.device_type, spec._device.device_id),
            device_name(t.device.device_type, t.device.device_id))
    if data == NULL and not spec._empty:
        raise ValueError(f"{spec.label()}: the producer's data pointer is NULL")
    if (<uintptr_t>data) & <uintptr_t>(spec.alignment - 1):      # a power of two (checked by TensorSpec)
        raise AlignmentError(spec.name, spec.uid, f"data address aligned to {spec.alignment} bytes",
                             f"a multiple of {spec.alignment}", f"0x{<uintptr_t>data:x}")
    if spec.is_output and readonly:
        raise ReadOnlyOutputError(spec.name, spec.uid, "a writable buffer (it is an output)",
                                  "writable", "a read-only buffer")
    if spec.is_output and not spec._empty and (
            spec._overlapping if spec.strides is not None
            else t.strides != NULL and strides_overlap(t.shape, t.strides, t.ndim)):
        raise OverlappingOutputError(spec.name, spec.uid, "strides (in elements) of an output",
                                     "strides that give every element its own address",
                                     _dims(t.strides, t.ndim))
    return result


cdef int check_slot(Slot s, TensorSpec spec) except -1:
    """Raise a typed error naming the tensor unless the slot matches what the spec declares."""
    return check_tensor(&s.tensor, s.tensor.data, s._readonly, spec)


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

    def __init__(self, specs, *, graph=None, ignored=()):
        """``graph``: the Graph whose tensors may key a pack (a Tensor of any other graph is refused,
        and virtual tensors are named as such); None accepts any Tensor by its uid. ``ignored``: uids
        and names of tensors that no node reads: keys naming them are skipped, not refused."""
        specs = list(specs)
        for spec in specs:
            if not isinstance(spec, TensorSpec):
                raise TypeError(f"PackLayout takes TensorSpec objects; got {type(spec).__name__}")
        specs.sort(key=lambda s: s.uid)
        self._index = {}
        self._by_name = {}
        memset(self._dense, 0, sizeof(self._dense))
        for i, spec in enumerate(specs):
            if spec.uid in self._index:
                raise ValueError(f"uid {spec.uid} appears twice in the layout")
            self._index[spec.uid] = i
            if 0 <= spec.uid < PACK_DENSE_UIDS:
                self._dense[spec.uid] = i + 1
            if spec.name:
                # Names are labels and may repeat (as in cudnn.pygraph): a shared name maps to the
                # tuple of its uids, which a name-keyed lookup refuses instead of taking the last.
                held = self._by_name.get(spec.name)
                self._by_name[spec.name] = (spec.uid if held is None
                                            else (held if type(held) is tuple else (held,)) + (spec.uid,))
        self.specs = tuple(specs)
        self._ignored = frozenset(ignored)
        self._graph_id = NULL
        self._graph_ref = None
        if graph is not None:
            self._graph_id = <void*>graph
            try:
                self._graph_ref = weakref.ref(graph)
            except TypeError:       # a Graph without weakref support: messages say less
                pass

    @property
    def graph(self):
        """The graph the layout was made for (None: none, or no longer alive)."""
        return None if self._graph_ref is None else self._graph_ref()

    def spec(self, uid) -> TensorSpec:
        return self.specs[self._index[uid]]

    def pack(self, mapping, *, stream=None):
        """Normalise ``{Tensor | uid | name: buffer}`` into a checked VariantPack for one call."""
        return pack_from_mapping(mapping, self, stream)

    def __len__(self):
        return len(self.specs)


cdef object _key_uid(object key, PackLayout layout):
    """A mapping key (Tensor, uid or tensor name) as a Python int uid."""
    if type(key) is int:
        return key
    if type(key) is Tensor:
        return (<Tensor>key)._uid
    uid = getattr(key, "uid", None)
    if uid is not None:
        return PyNumber_Index(uid)
    if isinstance(key, str) and layout is not None:
        found = layout._by_name.get(key)
        if found is None:
            if key in layout._ignored:
                return None            # no position: the caller skips the key
            _raise_not_an_operand(key, None, layout)
        if type(found) is tuple:
            raise AmbiguousTensorNameError(key, found)
        return found
    if isinstance(key, int) and not isinstance(key, bool):
        return int(key)
    if not isinstance(key, (bool, float, str, bytes)) and hasattr(type(key), "__index__"):
        return PyNumber_Index(key)         # NumPy and other integer scalars
    raise TypeError(f"variant pack keys are tensors, uids or tensor names; got {type(key).__name__}")


cdef intptr_t _checked_address(object buffer, TensorSpec spec) except? -1:
    """A bare address for ``spec``: in range, non-NULL unless the tensor is empty, aligned."""
    cdef intptr_t ptr
    if not _device_address_ok(spec):
        # Host memory is dereferenced by this process: an int cannot prove it spans the declared size.
        raise HostAddressError(spec.name, spec.uid, device_name(spec._device.device_type, spec._device.device_id))
    try:
        ptr = buffer
    except OverflowError:
        raise ValueError(f"{spec.label()}: address {buffer} does not fit in a pointer") from None
    if ptr < 0:
        raise ValueError(f"{spec.label()}: address {buffer} is negative")
    if ptr == 0 and not spec._empty:
        raise ValueError(f"{spec.label()}: address 0 (NULL) for a tensor of shape {spec.shape}")
    if (<uintptr_t>ptr) & <uintptr_t>(spec.alignment - 1):
        raise AlignmentError(spec.name, spec.uid, f"data address aligned to {spec.alignment} bytes",
                             f"a multiple of {spec.alignment}", f"0x{<uintptr_t>ptr:x}")
    return ptr


cdef Slot _slot_from_spec_address(object buffer, TensorSpec spec):
    """A bare address shaped by the spec (geometry validated when the spec was made)."""
    cdef intptr_t ptr = _checked_address(buffer, spec)
    cdef int i, ndim = spec._ndim
    cdef int64_t acc
    cdef Slot s = _spec_shaped_slot(spec)
    if spec.strides is None:
        acc = 1
        for i in range(ndim - 1, -1, -1):
            s.tensor.strides[i] = acc
            acc *= spec._shape[i] if spec._shape[i] > 0 else 1
    s.tensor.data = <void*>ptr
    s.tensor.dtype = spec._dtype
    s.tensor.device = spec._device
    return s


cdef Slot _slot_for(object buffer, TensorSpec spec, object stream, DLTensor* view):
    """The checked Slot for a non-address buffer; or None when ``view`` (not NULL) was filled with the
    producer's borrowed view instead (the caller checks it)."""
    cdef Slot s
    if type(buffer) is Slot:
        s = <Slot>buffer
    else:
        try:
            s = slot_or_view(buffer, stream, view)
        except BufferImportError as exc:
            raise BufferImportError(f"{spec.label()}: {exc}") from None
        except MalformedBufferError as exc:    # a misused capsule (reused, misnamed, ...): name the tensor
            raise MalformedBufferError(f"{spec.label()}: {exc}") from None
        if s is None:
            return None
    if check_slot(s, spec):
        s = _slot_as_declared(s, spec)
    return s


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
        self._items = ()
        self._slots = None
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

    @property
    def slots(self) -> tuple:
        """One Slot per operand, uids ascending (bare addresses and borrowed producer views become Slots
        here, on first access)."""
        if self._slots is None:
            self._slots = tuple([
                _slot_from_spec_address(item, <TensorSpec>self.layout.specs[self.layout._index[self._uids[i]]])
                if type(item) is int else (item if type(item) is Slot else slot_from_object(item, None))
                for i, item in enumerate(self._items)])
        return self._slots

    def __getitem__(self, uid) -> Slot:
        for i in range(self._n):
            if self._uids[i] == uid:
                return self.slots[i]
        raise KeyError(uid)


cdef int _alloc_arrays(VariantPack pack, Py_ssize_t n) except -1:
    if n > PACK_INLINE:
        pack._uids = <int64_t*>malloc(n * sizeof(int64_t))
        pack._ptrs = <void**>malloc(n * sizeof(void*))
        if pack._uids == NULL or pack._ptrs == NULL:
            raise MemoryError()
    return 0


cdef Py_ssize_t _position(object key, PackLayout layout) except -2:
    """The layout position of a mapping key (Tensor, uid or tensor name); -1 when it names no operand.

    Tensors and small int uids resolve through the layout's dense array with no Python int made.
    """
    cdef int64_t uid64
    cdef long small
    cdef int overflow
    if type(key) is Tensor:
        if <void*>(<Tensor>key).graph != layout._graph_id and layout._graph_id != NULL:
            _raise_foreign(<Tensor>key, layout)
        uid64 = (<Tensor>key)._uid
        if 0 <= uid64 < PACK_DENSE_UIDS:
            return layout._dense[uid64] - 1
        uid = uid64
    elif type(key) is int:
        uid = key
    else:
        uid = _key_uid(key, layout)
    if type(uid) is int:
        small = PyLong_AsLongAndOverflow(uid, &overflow)    # never raises for an int
        if overflow == 0 and 0 <= small < PACK_DENSE_UIDS:
            return layout._dense[small] - 1
    position = layout._index.get(uid)
    return -1 if position is None else <Py_ssize_t>position


cdef inline bint _device_address_ok(TensorSpec spec) noexcept nogil:
    """A bare int is taken only where a device, not this process, dereferences it."""
    return spec._device.device_type == kDLCUDA or spec._device.device_type == kDLCUDAManaged


cdef inline intptr_t _address(object buffer, TensorSpec spec) except? -1:
    """``_checked_address`` with the common case (a positive, aligned, in-range int) inlined."""
    cdef int overflow
    cdef long ptr = PyLong_AsLongAndOverflow(buffer, &overflow)    # buffer is an int: never raises
    if (overflow == 0 and ptr > 0 and ((<uintptr_t>ptr) & <uintptr_t>(spec.alignment - 1)) == 0
            and _device_address_ok(spec)):
        return <intptr_t>ptr
    return _checked_address(buffer, spec)     # raises the typed error (or allows NULL for empty tensors)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef object _pack_core(object mapping, PackLayout layout, object stream, int64_t* uids, void** ptrs,
                       Py_ssize_t* count, list placed):
    """Check every buffer of ``mapping`` against ``layout`` and write the operands, uids ascending, into
    ``uids`` / ``ptrs`` (room for every spec of the layout); ``*count`` gets how many.

    ``placed`` (a list of one None per spec, or None) receives each operand's item at its spec position
    for a VariantPack: the int, the Slot, or the producer whose borrowed view was checked. Without it,
    the Slots this call made are returned (they own imported tensors; the caller keeps them until its
    launch is issued), or None when there are none: ints and borrowed views need nothing kept, since
    the caller's mapping holds the producers for the whole call.
    """
    cdef Py_ssize_t nspec = len(layout.specs), i, j, n = 0
    cdef TensorSpec spec
    cdef Slot s
    cdef DLTensor view
    cdef void* data
    cdef list made = None
    cdef uint8_t filled_inline[PACK_INLINE]
    cdef uint8_t* filled = filled_inline
    if type(mapping) is not dict and not hasattr(mapping, "items"):
        raise TypeError(f"a variant pack is a mapping {{tensor or uid: buffer}}; got {type(mapping).__name__}")
    if nspec > PACK_INLINE:
        filled = <uint8_t*>malloc(nspec)
        if filled == NULL:
            raise MemoryError()
    memset(filled, 0, nspec)
    try:
        # Each operand lands at its spec's position (specs are sorted by uid): no sort, and a position
        # filled twice is a uid given twice (e.g. by its name and by its uid).
        for key, buffer in mapping.items():
            if key is None:
                # cudnn.pygraph code keys optional tensors it did not make ({bias: b} with bias None).
                continue
            i = _position(key, layout)
            if i < 0:
                if _ignored_key(key, layout):
                    continue
                _raise_not_an_operand(key, _key_uid(key, layout), layout)
            if i >= nspec:
                raise AssertionError(f"corrupt PackLayout index for key {key!r}")
            spec = <TensorSpec>layout.specs[i]
            if filled[i]:
                _raise_duplicate(mapping, i, layout)
            filled[i] = 1
            n += 1
            if type(buffer) is int:
                # Engines that read only pointers never need a Slot for it: .slots makes one on demand.
                ptrs[i] = <void*>_address(buffer, spec)
                if placed is not None:
                    placed[i] = buffer
                continue
            # A producer's borrowed C view is taken only when the spec declares strides: checked against
            # the full declared geometry, the view needs no validation of its own and no Slot is made
            # unless an engine asks for .slots (then the producer is read again).
            s = _slot_for(buffer, spec, stream, &view if spec.strides is not None else NULL)
            if s is None:
                data = <void*>(<char*>view.data + view.byte_offset)
                if check_tensor(&view, data, False, spec) == 0:
                    ptrs[i] = data
                    if placed is not None:
                        placed[i] = buffer
                    continue
                # The same bytes in another shape: engines reading slots get the declared geometry.
                s = _slot_as_declared(slot_from_object(buffer, stream), spec)
            ptrs[i] = s.tensor.data
            if placed is not None:
                placed[i] = s
            elif s is not buffer:
                if made is None:
                    made = [s]
                else:
                    made.append(s)
        if n < nspec:
            for i in range(nspec):
                if not filled[i] and (<TensorSpec>layout.specs[i]).required:
                    raise MissingTensorError("the variant pack lacks " + ", ".join([
                        (<TensorSpec>layout.specs[j]).label() for j in range(nspec)
                        if not filled[j] and (<TensorSpec>layout.specs[j]).required]))
        # Pointers were written at spec positions; close the gaps of optional operands not given.
        j = 0
        for i in range(nspec):
            if filled[i]:
                uids[j] = (<TensorSpec>layout.specs[i]).uid
                ptrs[j] = ptrs[i]
                j += 1
    finally:
        if filled != filled_inline:
            free(filled)
    count[0] = n
    return made


cdef object pack_into(object mapping, PackLayout layout, object stream, int64_t* uids, void** ptrs,
                      Py_ssize_t capacity, Py_ssize_t* count):
    if len(layout.specs) > capacity:
        raise ValueError(f"the layout has {len(layout.specs)} operands; the arrays hold {capacity}")
    return _pack_core(mapping, layout, stream, uids, ptrs, count, None)


cdef VariantPack pack_from_mapping(object mapping, PackLayout layout, object stream):
    if layout is None:
        return _pack_unchecked(mapping, stream)
    cdef VariantPack pack = VariantPack.__new__(VariantPack)
    cdef Py_ssize_t nspec = len(layout.specs), n
    cdef list placed = [None] * nspec
    _alloc_arrays(pack, nspec)
    _pack_core(mapping, layout, stream, pack._uids, pack._ptrs, &n, placed)
    pack._n = <int>n
    pack._items = tuple(placed) if n == nspec else tuple([x for x in placed if x is not None])
    pack.layout = layout
    return pack


cdef VariantPack _pack_unchecked(object mapping, object stream):
    """No layout: any buffer with its own geometry; a bare address is refused (it has none)."""
    cdef VariantPack pack = VariantPack.__new__(VariantPack)
    cdef Py_ssize_t n, i
    cdef Slot s
    if not hasattr(mapping, "items"):
        raise TypeError(f"a variant pack is a mapping {{tensor or uid: buffer}}; got {type(mapping).__name__}")
    entries = []
    for key, buffer in mapping.items():
        uid = _key_uid(key, None)
        if type(buffer) is int:
            raise BufferImportError(
                f"tensor uid {uid}: a bare address needs the geometry a graph declares; "
                "pack it through the graph (or a PackLayout) or use Slot.from_address")
        entries.append((uid, slot_from_object(buffer, stream)))
    entries.sort(key=_first)
    n = len(entries)
    for i in range(1, n):
        if entries[i][0] == entries[i - 1][0]:
            raise DuplicateTensorError(None, entries[i][0])
    _alloc_arrays(pack, n)
    for i in range(n):
        uid, item = entries[i]
        s = <Slot>item
        pack._uids[i] = uid
        pack._ptrs[i] = s.tensor.data
    pack._n = <int>n
    pack._items = pack._slots = tuple([e[1] for e in entries])
    return pack


def _first(entry):
    return entry[0]


# ---- the refusals of keys (cold paths: the hot path only compares and indexes) ----------------------

def _graph_label(graph) -> str:
    if graph is None:
        return "the graph this plan was made for"
    name = getattr(getattr(graph, "context", None), "name", "")
    return f"graph '{name}' (id 0x{id(graph):x})" if name else f"an unnamed graph (id 0x{id(graph):x})"


cdef int _raise_foreign(Tensor key, PackLayout layout) except -1:
    raise ForeignTensorError(key._name, key._uid, _graph_label(key.graph), _graph_label(layout.graph))


cdef bint _ignored_key(object key, PackLayout layout) except -1:
    """Whether a key that names no operand names a tensor no node reads (skipped, as cudnn.pygraph does)."""
    if not layout._ignored:
        return False
    if type(key) is Tensor:
        return (<Tensor>key)._uid in layout._ignored
    return (type(key) is int or type(key) is str) and key in layout._ignored


cdef int _raise_not_an_operand(object key, object uid, PackLayout layout) except -1:
    """Refuse a key that names no operand: a virtual tensor of the graph is named as such."""
    graph = layout.graph
    found = None
    if type(key) is Tensor:
        found = key
    elif graph is not None:
        for t in graph.tensors:
            if (t.name == key) if isinstance(key, str) else (uid is not None and t.uid == uid):
                found = t
                break
    if found is not None and found.is_virtual:
        raise VirtualTensorError(found.name, found.uid)
    if found is not None:
        raise UnknownTensorError(f"{_label(found.name, found.uid)} is not an operand of this plan "
                                 f"(its data type has no buffer form); the plan's uids: {sorted(layout._index)}")
    if isinstance(key, str):
        raise UnknownTensorError(f"the graph has no tensor named '{key}'")
    raise UnknownTensorError(f"uid {uid} is not a tensor of this graph (its uids: {sorted(layout._index)})")


def _describe_key(key) -> str:
    if type(key) is Tensor:
        return f"Tensor '{(<Tensor>key)._name}'" if (<Tensor>key)._name else f"Tensor uid {(<Tensor>key)._uid}"
    if isinstance(key, str):
        return f"name '{key}'"
    return f"uid {key!r}"


cdef int _raise_duplicate(object mapping, Py_ssize_t position, PackLayout layout) except -1:
    """Refuse an operand given twice, naming it and the keys that gave it."""
    cdef TensorSpec spec = <TensorSpec>layout.specs[position]
    keys = []
    for key in mapping:
        try:
            if _position(key, layout) == position:
                keys.append(_describe_key(key))
        except Exception:    # another bad key: this error is about the duplicate
            pass
    raise DuplicateTensorError(spec.name or None, spec.uid, keys)
