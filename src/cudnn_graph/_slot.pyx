"""Slot: one operand as a DLTensor that owns its geometry, imported from any producer, exported as DLPack.

Import paths, fastest first: the producer type's C exchange table (``__dlpack_c_exchange_api__``),
``__dlpack__`` (versioned capsule, legacy fallback), ``__cuda_array_interface__`` v2/v3, a bare
address with a declared geometry, another Slot. Every path ends in ``Slot._fill``, which validates
what the producer handed over and copies shape and strides into the slot's own storage.
"""
cimport cython
from cpython.pycapsule cimport (PyCapsule_CheckExact, PyCapsule_GetName, PyCapsule_GetPointer, PyCapsule_Destructor,
                                PyCapsule_SetName, PyCapsule_IsValid, PyCapsule_New, PyCapsule_GetContext,
                                PyCapsule_SetDestructor)
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from cpython.exc cimport PyErr_Occurred
from cpython.number cimport PyNumber_Index
from libc.stdint cimport int32_t, int64_t, uint64_t, intptr_t, uintptr_t, INT64_MAX, INT64_MIN
from libc.stdlib cimport malloc, free
from libc.string cimport strcmp, strncmp, memcpy

from cudnn_graph._dlpack cimport *
from cudnn_graph._dtypes cimport validate_dtype, dtype_name, parse_dtype, parse_typestr, dtype_bits
from cudnn_graph._driver cimport pointer_device
from cudnn_graph._stream cimport stream_handle

from cudnn_graph.errors import BufferImportError, MalformedBufferError

# Device kinds a DLDevice may name (DLPack 1.3).
_DEVICE_NAMES = {
    kDLCPU: "cpu", kDLCUDA: "cuda", kDLCUDAHost: "cuda_host", kDLOpenCL: "opencl",
    kDLVulkan: "vulkan", kDLMetal: "metal", kDLVPI: "vpi", kDLROCM: "rocm", kDLROCMHost: "rocm_host",
    kDLExtDev: "ext_dev", kDLCUDAManaged: "cuda_managed", kDLOneAPI: "oneapi", kDLWebGPU: "webgpu",
    kDLHexagon: "hexagon", kDLMAIA: "maia", kDLTrn: "trn",
}
_DEVICE_CODES = {name: code for code, name in _DEVICE_NAMES.items()}
# The same set as a C table, so the import hot path validates a device without Python objects.
cdef enum:
    _DEVICE_TABLE = 64
cdef bint _DEVICE_OK[_DEVICE_TABLE]
for _code in _DEVICE_NAMES:
    _DEVICE_OK[_code] = True


cdef inline bint _device_ok(int32_t device_type) noexcept nogil:
    return 0 <= device_type < _DEVICE_TABLE and _DEVICE_OK[device_type]


cdef str _describe(object what):
    """``what`` names the producer in messages: a str, or a type (named lazily, on the error path)."""
    if isinstance(what, type):
        return (<type>what).__name__
    return str(what)


cdef int64_t _as_int64(object value, object what, str field, bint malformed) except? -1:
    """An integer field of a caller's or producer's description, with typed errors.

    Non-integers (2.5, '3') are refused instead of truncated; values outside int64 are refused instead
    of surfacing as OverflowError. ``malformed`` picks MalformedBufferError (a producer broke its
    protocol) over TypeError / ValueError (a caller passed a bad argument).
    """
    if type(value) is not int:
        try:
            value = PyNumber_Index(value)
        except TypeError:
            if malformed:
                raise MalformedBufferError(f"{_describe(what)}: {field} {value!r} is not an integer") from None
            raise TypeError(f"{_describe(what)}: {field} {value!r} is not an integer") from None
    try:
        return value
    except OverflowError:
        if malformed:
            raise MalformedBufferError(f"{_describe(what)}: {field} {value} does not fit in int64") from None
        raise ValueError(f"{_describe(what)}: {field} {value} does not fit in int64") from None
_DEVICE_CODES["gpu"] = kDLCUDA
_DEVICE_CODES["host"] = kDLCPU

_MAX_VERSION = (CG_DLPACK_MAJOR, CG_DLPACK_MINOR)


def device_name(int32_t device_type, int32_t device_id) -> str:
    """'cpu', 'cuda:1', ... for messages."""
    name = _DEVICE_NAMES.get(device_type, f"device_type_{device_type}")
    if device_type == kDLCPU:
        return name
    return f"{name}:{device_id}"


cdef DLDevice parse_device(object device) except *:
    """A DLDevice from 'cpu', 'cuda', 'cuda:1', (type, id) with type a DLPack code or a name such as
    'cuda', or a bare CUDA ordinal."""
    cdef DLDevice d
    if isinstance(device, tuple) and len(device) == 2:
        kind = device[0]
        if isinstance(kind, str):
            if kind.strip().lower() not in _DEVICE_CODES:
                raise ValueError(f"unknown device type {kind!r} in {device!r}")
            d.device_type = _DEVICE_CODES[kind.strip().lower()]
        else:
            d.device_type = int(kind)
        d.device_id = int(device[1])
    elif isinstance(device, int) and not isinstance(device, bool):
        d.device_type = kDLCUDA
        d.device_id = device
    elif isinstance(device, str):
        kind, _, ordinal = device.strip().lower().partition(":")
        if kind not in _DEVICE_CODES:
            raise ValueError(f"unknown device {device!r}")
        d.device_type = _DEVICE_CODES[kind]
        d.device_id = int(ordinal) if ordinal else 0
    else:
        raise TypeError(f"device must be 'cpu', 'cuda[:N]', (type, id) or an ordinal; got {device!r}")
    if d.device_type not in _DEVICE_NAMES:
        raise ValueError(f"unknown DLPack device type {d.device_type}")
    if d.device_id < 0:
        raise ValueError(f"device ordinal cannot be negative; got {d.device_id}")
    return d


def _parse_device(device):
    cdef DLDevice d = parse_device(device)
    return (d.device_type, d.device_id)


cdef inline int64_t _abs64(int64_t v) noexcept nogil:
    return -v if v < 0 else v


# Overflow-checked int64 arithmetic (GCC / Clang builtins): no divisions on the import hot path.
cdef extern from *:
    """
    #include <stdint.h>
    static inline int cg_mul_overflows(int64_t a, int64_t b, int64_t* out) {
        return __builtin_mul_overflow(a, b, out);
    }
    static inline int cg_add_overflows(int64_t a, int64_t b, int64_t* out) {
        return __builtin_add_overflow(a, b, out);
    }
    """
    bint cg_mul_overflows(int64_t a, int64_t b, int64_t* out) noexcept nogil
    bint cg_add_overflows(int64_t a, int64_t b, int64_t* out) noexcept nogil

# The largest byte span a tensor may cover (2^56): far beyond any memory, small enough that
# data + offset arithmetic on it can never wrap.
cdef enum:
    _SPAN_LIMIT_SHIFT = 56


cdef tuple _dims_of(const int64_t* values, int n):
    return tuple([values[i] for i in range(n)])


cdef int _raise_shape_overflow(const DLTensor* src, object what) except -1:
    raise MalformedBufferError(f"{_describe(what)}: shape {_dims_of(src.shape, src.ndim)} overflows int64")


cdef int _raise_span_overflow(const DLTensor* t, object what) except -1:
    raise MalformedBufferError(
        f"{_describe(what)}: strides {_dims_of(t.strides, t.ndim)} address beyond int64 for shape "
        f"{_dims_of(t.shape, t.ndim)}")


# The C exchange table Slot publishes, so DSL launchers read slots without Python calls.
cdef int _api_allocate(DLTensor* prototype, DLManagedTensorVersioned** out, void* error_ctx,
                       DLPackSetError set_error) noexcept:
    out[0] = NULL
    if set_error != NULL:
        set_error(error_ctx, "NotImplementedError",
                  "cudnn_graph.Slot views caller memory and does not allocate tensors")
    return -1


cdef int _api_from_py_managed(void* py_object, DLManagedTensorVersioned** out) noexcept with gil:
    try:
        out[0] = export_versioned(<Slot?><object>py_object)
        return 0
    except BaseException:
        out[0] = NULL
        return -1


cdef int _api_to_py(DLManagedTensorVersioned* tensor, void** out_py_object) noexcept with gil:
    cdef Slot s
    try:
        s = _slot_from_managed_versioned(tensor, "managed tensor")
        Py_INCREF(s)
        out_py_object[0] = <void*>s
        return 0
    except BaseException:
        out_py_object[0] = NULL
        return -1


cdef int _api_dltensor(void* py_object, DLTensor* out) noexcept:
    # Borrowed view: valid while the slot lives, which the caller guarantees by holding it.
    out[0] = (<Slot>py_object).tensor
    return 0


cdef int _api_stream(DLDeviceType device_type, int32_t device_id, void** out_stream) noexcept:
    out_stream[0] = NULL    # a slot carries no stream: the consumer's own stream orders the work
    return 0


cdef DLPackExchangeAPI SLOT_EXCHANGE_API
SLOT_EXCHANGE_API.header.version.major = CG_DLPACK_MAJOR
SLOT_EXCHANGE_API.header.version.minor = CG_DLPACK_MINOR
SLOT_EXCHANGE_API.header.prev_api = NULL
SLOT_EXCHANGE_API.managed_tensor_allocator = _api_allocate
SLOT_EXCHANGE_API.managed_tensor_from_py_object_no_sync = _api_from_py_managed
SLOT_EXCHANGE_API.managed_tensor_to_py_object_no_sync = _api_to_py
SLOT_EXCHANGE_API.dltensor_from_py_object_no_sync = _api_dltensor
SLOT_EXCHANGE_API.current_work_stream = _api_stream


@cython.final
@cython.freelist(64)
cdef class Slot:
    """One operand as a DLTensor that owns its shape/stride storage and keeps its memory alive.

    Build one with ``Slot.from_object(buffer)`` (any DLPack / CUDA-array-interface producer) or
    ``Slot.from_address(ptr, shape, strides, dtype, device)``. A Slot is itself a DLPack producer.

    Example:
        >>> import numpy as np
        >>> s = Slot.from_object(np.arange(6, dtype=np.float32).reshape(2, 3))
        >>> s.shape, s.strides, s.dtype, s.device
        ((2, 3), (3, 1), 'float32', ('cpu', 0))
        >>> np.from_dlpack(s).sum()
        np.float32(15.0)
    """

    def __cinit__(self):
        self._heap = NULL
        self.tensor.data = NULL
        self.tensor.ndim = 0
        self.tensor.shape = self._inline
        self.tensor.strides = self._inline + SLOT_INLINE_DIMS
        self.tensor.byte_offset = 0
        self.tensor.device.device_type = kDLCPU
        self.tensor.device.device_id = 0
        self._owner = None
        self._managed_v = NULL
        self._managed_l = NULL
        self._readonly = False
        self._producer_stream = 0

    def __init__(self, *args, **kwargs):
        raise TypeError("use Slot.from_object(buffer) or Slot.from_address(ptr, shape, ...)")

    def __dealloc__(self):
        self._release()
        if self._heap != NULL:
            free(self._heap)
            self._heap = NULL

    cdef void _release(self) noexcept:
        """Run the deleter of the managed tensor this slot imported, if any (once: the field is cleared first)."""
        cdef DLManagedTensorVersioned* v = self._managed_v
        cdef DLManagedTensor* m = self._managed_l
        self._managed_v = NULL
        self._managed_l = NULL
        if v != NULL and v.deleter != NULL:
            v.deleter(v)
        if m != NULL and m.deleter != NULL:
            m.deleter(m)

    cdef int _alloc_geometry(self, int ndim) except -1:
        if ndim <= SLOT_INLINE_DIMS:
            self.tensor.shape = self._inline
            self.tensor.strides = self._inline + SLOT_INLINE_DIMS
        else:
            self._heap = <int64_t*>malloc(2 * ndim * sizeof(int64_t))
            if self._heap == NULL:
                raise MemoryError()
            self.tensor.shape = self._heap
            self.tensor.strides = self._heap + ndim
        self.tensor.ndim = ndim
        return 0

    cdef int _fill(self, const DLTensor* src, bint null_strides_are_row_major, object what) except -1:
        """Validate a producer's DLTensor and copy it in (geometry copied, byte_offset folded).

        ``what`` names the producer in error messages (a str, or a type named only when raising).
        """
        cdef int ndim = src.ndim
        cdef int i
        cdef int64_t extent, numel = 1, span = 0, stride, bits
        if ndim < 0 or ndim > SLOT_MAX_NDIM:
            raise MalformedBufferError(f"{_describe(what)}: ndim {ndim} is outside [0, {SLOT_MAX_NDIM}]")
        if ndim > 0 and src.shape == NULL:
            raise MalformedBufferError(f"{_describe(what)}: shape is NULL for a {ndim}-d tensor")
        if ndim > 0 and src.strides == NULL and not null_strides_are_row_major:
            raise MalformedBufferError(
                f"{_describe(what)}: strides is NULL for a {ndim}-d tensor (DLPack >= 1.2 requires strides)")
        if not _device_ok(src.device.device_type):
            raise MalformedBufferError(
                f"{_describe(what)}: unknown DLPack device type {src.device.device_type}")
        if src.device.device_id < 0:
            raise MalformedBufferError(f"{_describe(what)}: negative device ordinal {src.device.device_id}")
        validate_dtype(src.dtype, what)
        self._alloc_geometry(ndim)
        for i in range(ndim):
            extent = src.shape[i]
            if extent < 0:
                raise MalformedBufferError(f"{_describe(what)}: shape[{i}] = {extent} is negative")
            self.tensor.shape[i] = extent
            if numel != 0 and cg_mul_overflows(numel, extent, &numel):
                _raise_shape_overflow(src, what)
        if src.strides == NULL:
            stride = 1
            for i in range(ndim - 1, -1, -1):
                self.tensor.strides[i] = stride
                extent = self.tensor.shape[i]
                stride *= extent if extent > 0 else 1
        else:
            memcpy(self.tensor.strides, src.strides, ndim * sizeof(int64_t))
        # The farthest element must be addressable: sum((extent - 1) * |stride|) elements, in bytes,
        # stays below 2^56.
        if numel > 0:
            for i in range(ndim):
                stride = self.tensor.strides[i]
                if (stride == INT64_MIN or cg_mul_overflows(self.tensor.shape[i] - 1, _abs64(stride), &extent)
                        or cg_add_overflows(span, extent, &span)):
                    _raise_span_overflow(&self.tensor, what)
            bits = dtype_bits(src.dtype)
            if span >= ((<int64_t>1) << (_SPAN_LIMIT_SHIFT + 3)) // (bits if bits > 0 else 1):
                raise MalformedBufferError(
                    f"{_describe(what)}: the tensor spans {span + 1} elements of {bits} bits, more bytes "
                    "than this consumer addresses (2^56)")
            if src.data == NULL:
                raise MalformedBufferError(
                    f"{_describe(what)}: data is NULL for a tensor of {numel} elements")
        if src.byte_offset > <uint64_t>INT64_MAX:
            raise MalformedBufferError(f"{_describe(what)}: byte_offset {src.byte_offset} is absurd")
        self.tensor.data = <void*>(<char*>src.data + src.byte_offset)
        self.tensor.byte_offset = 0
        self.tensor.dtype = src.dtype
        self.tensor.device = src.device
        return 0

    # ---- construction ---------------------------------------------------------------------

    @staticmethod
    def from_object(obj, *, stream=None):
        """Import any buffer: DLPack (C exchange table or ``__dlpack__``), CUDA array interface, a Slot.

        ``stream`` (None, an int handle or an object with ``__cuda_stream__``) is handed to
        ``__dlpack__`` so the producer can order its pending work before the consumer's stream.
        """
        return slot_from_object(obj, stream)

    @staticmethod
    def from_address(ptr, shape, strides=None, dtype="float32", device="cuda", *,
                     readonly=False):
        """A slot over raw memory with a declared geometry; ``strides`` in elements (None: row-major).

        ``device`` is 'cpu', 'cuda', 'cuda:N', a (DLPack device type, ordinal) pair or an ordinal.
        The caller keeps the memory alive.

        Example:
            >>> s = Slot.from_address(0x7f0000000000, (4, 8), dtype="bfloat16", device="cuda:0")
            >>> s.strides
            (8, 1)
        """
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise TypeError(f"ptr must be an int address; got {type(ptr).__name__}")
        return slot_from_address(<intptr_t>_as_int64(ptr, "address", "ptr", False), shape, strides,
                                 parse_dtype(dtype), parse_device(device), readonly)

    # ---- introspection --------------------------------------------------------------------

    @property
    def data_ptr(self) -> int:
        return <uintptr_t>self.tensor.data

    @property
    def ndim(self) -> int:
        return self.tensor.ndim

    @property
    def shape(self) -> tuple:
        return tuple([self.tensor.shape[i] for i in range(self.tensor.ndim)])

    @property
    def strides(self) -> tuple:
        """Strides in elements."""
        return tuple([self.tensor.strides[i] for i in range(self.tensor.ndim)])

    @property
    def dtype(self) -> str:
        """Canonical name of the element type ('float32', 'bfloat16', 'float8_e4m3fn', ...)."""
        return dtype_name(self.tensor.dtype)

    @property
    def dtype_code(self) -> tuple:
        """The DLPack (code, bits, lanes) triple."""
        return (self.tensor.dtype.code, self.tensor.dtype.bits, self.tensor.dtype.lanes)

    @property
    def device(self) -> tuple:
        """(kind, ordinal), e.g. ('cuda', 0)."""
        return (_DEVICE_NAMES[self.tensor.device.device_type], self.tensor.device.device_id)

    @property
    def readonly(self) -> bool:
        return self._readonly

    @property
    def owner(self):
        """What keeps the memory alive: the producer object (borrowed view, CUDA array interface), the
        slot itself when it owns an imported DLPack managed tensor, or None (a bare address)."""
        if self._owner is None and (self._managed_v != NULL or self._managed_l != NULL):
            return self
        return self._owner

    @property
    def producer_stream(self) -> int:
        """The stream a CUDA-array-interface v3 producer declared (0 when none)."""
        return self._producer_stream

    @property
    def numel(self) -> int:
        return slot_numel(self)

    @property
    def nbytes(self) -> int:
        """Bytes the elements occupy when packed (sub-byte types round up)."""
        return (slot_numel(self) * dtype_bits(self.tensor.dtype) + 7) // 8

    def __repr__(self):
        return (f"Slot(shape={self.shape}, strides={self.strides}, dtype={self.dtype}, "
                f"device={device_name(self.tensor.device.device_type, self.tensor.device.device_id)}, "
                f"data_ptr=0x{self.data_ptr:x}{', readonly' if self._readonly else ''})")

    # ---- DLPack producer ------------------------------------------------------------------

    def __dlpack_device__(self):
        return (self.tensor.device.device_type, self.tensor.device.device_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export as a DLPack capsule: versioned when ``max_version`` allows it, legacy otherwise.

        The managed tensor owns copies of shape and strides and holds a reference to this slot,
        so a consumer may outlive the slot. ``copy=True`` is refused (a slot is a view).
        """
        if copy:
            raise BufferError("a Slot is a view of its producer's memory and cannot copy")
        if dl_device is not None:
            if tuple(dl_device) != (self.tensor.device.device_type, self.tensor.device.device_id):
                raise BufferError(f"a Slot lives on {self.__dlpack_device__()}; "
                                  f"cannot export to {tuple(dl_device)}")
        if stream is not None and not (type(stream) is int and stream == -1):
            # Validate the form (-1 is the protocol's "no synchronisation"); a slot has no pending
            # work of its own to order.
            stream_handle(stream)
        if max_version is not None and max_version[0] >= 1:
            return PyCapsule_New(export_versioned(self), CG_CAPSULE_VERSIONED,
                                 <PyCapsule_Destructor>_versioned_capsule_destructor)
        if self._readonly:
            raise BufferError("a read-only Slot can only be exported as a versioned DLPack capsule "
                              "(the legacy capsule cannot carry the read-only flag)")
        return PyCapsule_New(export_legacy(self), CG_CAPSULE_LEGACY,
                             <PyCapsule_Destructor>_legacy_capsule_destructor)

    __dlpack_c_exchange_api__ = PyCapsule_New(<void*>&SLOT_EXCHANGE_API, CG_CAPSULE_EXCHANGE_API, NULL)


cdef int64_t slot_numel(Slot s) noexcept:
    cdef int64_t n = 1
    cdef int i
    for i in range(s.tensor.ndim):
        n *= s.tensor.shape[i]
    return n


# ---- export ---------------------------------------------------------------------------------

cdef void _versioned_deleter(DLManagedTensorVersioned* m) noexcept with gil:
    if m == NULL:
        return
    Py_DECREF(<object>m.manager_ctx)
    free(m)


cdef void _legacy_deleter(DLManagedTensor* m) noexcept with gil:
    if m == NULL:
        return
    Py_DECREF(<object>m.manager_ctx)
    free(m)


cdef inline void* _unconsumed_pointer(object capsule, const char* name) noexcept:
    """The managed tensor a capsule still owns, or NULL: a consumer renames the capsule it takes, so only
    one still named ``name`` owns its tensor."""
    return PyCapsule_GetPointer(capsule, name) if PyCapsule_IsValid(capsule, name) else NULL


cdef void _versioned_capsule_destructor(object capsule) noexcept:
    # Called when the capsule dies: only an unconsumed capsule still owns its managed tensor.
    cdef DLManagedTensorVersioned* m = <DLManagedTensorVersioned*>_unconsumed_pointer(capsule, CG_CAPSULE_VERSIONED)
    if m != NULL and m.deleter != NULL:
        m.deleter(m)


cdef void _legacy_capsule_destructor(object capsule) noexcept:
    cdef DLManagedTensor* m = <DLManagedTensor*>_unconsumed_pointer(capsule, CG_CAPSULE_LEGACY)
    if m != NULL and m.deleter != NULL:
        m.deleter(m)


cdef inline void* _alloc_export(size_t header, int ndim) except NULL:
    """malloc a managed tensor of ``header`` bytes followed by 2 * ndim int64s for its shape and strides
    (freed with it, in one block, by its deleter)."""
    cdef void* p = malloc(header + 2 * ndim * sizeof(int64_t))
    if p == NULL:
        raise MemoryError()
    return p


cdef inline void _copy_tensor_into(DLTensor* dst, const DLTensor* src, int64_t* geometry) noexcept nogil:
    """``dst`` = ``src`` with shape and strides copied into ``geometry`` (2 * ndim int64s living as long as
    ``dst``): an export must not point into the slot's own arrays, which a later fill of the slot rewrites."""
    cdef int ndim = src.ndim
    dst[0] = src[0]
    dst.shape = geometry if ndim > 0 else NULL
    dst.strides = geometry + ndim if ndim > 0 else NULL
    if ndim > 0:
        memcpy(geometry, src.shape, ndim * sizeof(int64_t))
        memcpy(geometry + ndim, src.strides, ndim * sizeof(int64_t))


cdef DLManagedTensorVersioned* export_versioned(Slot s) except NULL:
    cdef DLManagedTensorVersioned* m = <DLManagedTensorVersioned*>_alloc_export(
        sizeof(DLManagedTensorVersioned), s.tensor.ndim)
    m.version.major = CG_DLPACK_MAJOR
    m.version.minor = CG_DLPACK_MINOR
    m.flags = DLPACK_FLAG_BITMASK_READ_ONLY if s._readonly else 0
    _copy_tensor_into(&m.dl_tensor, &s.tensor, <int64_t*>(<char*>m + sizeof(DLManagedTensorVersioned)))
    Py_INCREF(s)
    m.manager_ctx = <void*>s
    m.deleter = _versioned_deleter
    return m


cdef DLManagedTensor* export_legacy(Slot s) except NULL:
    cdef DLManagedTensor* m = <DLManagedTensor*>_alloc_export(sizeof(DLManagedTensor), s.tensor.ndim)
    _copy_tensor_into(&m.dl_tensor, &s.tensor, <int64_t*>(<char*>m + sizeof(DLManagedTensor)))
    Py_INCREF(s)
    m.manager_ctx = <void*>s
    m.deleter = _legacy_deleter
    return m


# ---- import ---------------------------------------------------------------------------------

cdef int _adopt_versioned(Slot s, DLManagedTensorVersioned* m, object what) except -1:
    """Make ``s`` the owner of a versioned managed tensor, then validate it.

    The slot owns the tensor from the first line on, so its deleter runs exactly once, when the slot
    dies, also when validation fails (the caller drops the slot as the error propagates).
    """
    if m == NULL:
        raise MalformedBufferError(f"{_describe(what)}: the managed tensor pointer is NULL")
    s._managed_v = m
    if m.version.major != CG_DLPACK_MAJOR:
        raise MalformedBufferError(
            f"{_describe(what)}: DLPack major version {m.version.major} is not supported "
            f"(this consumer speaks {CG_DLPACK_MAJOR}.x)")
    s._fill(&m.dl_tensor, m.version.minor < 2, what)
    s._readonly = (m.flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0
    return 0


cdef int _adopt_legacy(Slot s, DLManagedTensor* m, object what) except -1:
    if m == NULL:
        raise MalformedBufferError(f"{_describe(what)}: the managed tensor pointer is NULL")
    s._managed_l = m
    s._fill(&m.dl_tensor, True, what)
    return 0


cdef Slot _slot_from_managed_versioned(DLManagedTensorVersioned* m, object what):
    """Take ownership of a versioned managed tensor handed over already made (its deleter runs exactly
    once, even when no slot can be allocated for it)."""
    cdef Slot s
    try:
        s = Slot.__new__(Slot)
    except BaseException:
        if m != NULL and m.deleter != NULL:
            m.deleter(m)
        raise
    _adopt_versioned(s, m, what)
    return s


cdef inline int _take(object capsule, const char* used_name) except -1:
    """Mark a capsule consumed (renamed used_*, as the protocol requires).

    Its destructor is also dropped when the capsule carries no context: on a consumed capsule the
    protocol leaves that destructor nothing to do, and some producers spend real time doing nothing
    (JAX's asks for the pointer under the unconsumed name and clears the resulting ValueError,
    about 0.5 us). A capsule with a context keeps its destructor, which may own that context.
    """
    PyCapsule_SetName(capsule, used_name)
    if PyCapsule_GetContext(capsule) == NULL:
        PyCapsule_SetDestructor(capsule, NULL)
    return 0


cdef Slot slot_from_capsule(object capsule, object what):
    """Consume a DLPack capsule: check its name, rename it used_*, own its managed tensor."""
    cdef const char* name
    cdef void* pointer
    if not PyCapsule_CheckExact(capsule):
        raise BufferImportError(
            f"{_describe(what)}: __dlpack__ returned {type(capsule).__name__}, not a capsule")
    # Made before the capsule is taken: should the allocation fail, the capsule still owns its tensor.
    cdef Slot s = Slot.__new__(Slot)
    name = PyCapsule_GetName(capsule)
    if name == NULL:
        raise MalformedBufferError(f"{_describe(what)}: the DLPack capsule has no name")
    if strcmp(name, CG_CAPSULE_VERSIONED) == 0:
        pointer = PyCapsule_GetPointer(capsule, name)
        _take(capsule, CG_CAPSULE_VERSIONED_USED)
        _adopt_versioned(s, <DLManagedTensorVersioned*>pointer, what)
        return s
    if strcmp(name, CG_CAPSULE_LEGACY) == 0:
        pointer = PyCapsule_GetPointer(capsule, name)
        _take(capsule, CG_CAPSULE_LEGACY_USED)
        _adopt_legacy(s, <DLManagedTensor*>pointer, what)
        return s
    if strncmp(name, b"used_", 5) == 0:
        raise MalformedBufferError(
            f"{_describe(what)}: the DLPack capsule was already consumed ('{name.decode()}')")
    raise MalformedBufferError(
        f"{_describe(what)}: capsule named '{name.decode(errors='replace')}' is not a DLPack tensor "
        "(expected 'dltensor_versioned' or 'dltensor')")


# Per-type decisions. A type's exchange table is cached for good once found; a miss is re-probed
# every _RECHECK lookups (and whenever an object would otherwise be refused), so a table that a
# producer library installs later is found without a restart. refresh_exchange_api_cache() forces it.
cdef dict _type_cache = {}
cdef enum:
    _RECHECK = 256


@cython.final
cdef class _TypeEntry:
    cdef const DLPackExchangeAPI* api
    cdef int countdown
    cdef bint has_dlpack       # the type defines __dlpack__: call it as a method, no bound object
    cdef bint incompatible     # it publishes a table, but none with our major version
    cdef bint legacy_dlpack    # its __dlpack__ refused max_version once: ask for a legacy capsule


cdef const DLPackExchangeAPI* _find_compatible_table(object capsule, object tp) except? NULL:
    if not PyCapsule_CheckExact(capsule) or not PyCapsule_IsValid(capsule, CG_CAPSULE_EXCHANGE_API):
        raise MalformedBufferError(
            f"{tp.__name__}.__dlpack_c_exchange_api__ is not a capsule named 'dlpack_exchange_api'")
    cdef DLPackExchangeAPIHeader* header = <DLPackExchangeAPIHeader*>PyCapsule_GetPointer(
        capsule, CG_CAPSULE_EXCHANGE_API)
    cdef int hops = 0
    while header != NULL and hops < 64:
        if header.version.major == CG_DLPACK_MAJOR:
            return <const DLPackExchangeAPI*>header
        header = header.prev_api
        hops += 1
    return NULL


cdef _TypeEntry _probe(type tp, _TypeEntry entry):
    """Look at the type afresh and record what it offers (a misnamed table raises, uncached)."""
    cdef const DLPackExchangeAPI* api = NULL
    capsule = getattr(tp, "__dlpack_c_exchange_api__", None)
    if capsule is not None:
        api = _find_compatible_table(capsule, tp)
    if entry is None:
        entry = _TypeEntry.__new__(_TypeEntry)
        _type_cache[tp] = entry
    entry.api = api
    entry.countdown = _RECHECK
    entry.has_dlpack = hasattr(tp, "__dlpack__")
    entry.incompatible = capsule is not None and api == NULL
    return entry


# The last type seen and its entry: a run of buffers of one type skips the dict lookup.
cdef object _last_type = None
cdef _TypeEntry _last_entry = None


cdef inline _TypeEntry _type_entry(type tp):
    global _last_type, _last_entry
    cdef _TypeEntry entry
    if tp is _last_type:
        entry = _last_entry
    else:
        item = _type_cache.get(tp)
        if item is None:
            entry = _probe(tp, None)
        else:
            entry = <_TypeEntry>item
        _last_type = tp
        _last_entry = entry
    if entry.api == NULL:
        if entry.countdown <= 0:
            return _probe(tp, entry)
        entry.countdown -= 1
    return entry


def refresh_exchange_api_cache():
    """Forget every cached per-type decision (exchange tables found or missed)."""
    global _last_type, _last_entry
    _type_cache.clear()
    _last_type = None
    _last_entry = None


def _exchange_table_address(tp) -> int:
    """Address of the exchange table used for ``tp`` (0 when none); for tests and diagnostics."""
    return <uintptr_t>_type_entry(tp).api


cdef int _raise_producer_error(object what) except -1:
    if PyErr_Occurred() != NULL:
        return -1
    raise BufferImportError(
        f"{_describe(what)}: the producer's DLPack exchange function failed without an error")


cdef Slot _slot_from_table(object obj, const DLPackExchangeAPI* api, type tp):
    cdef DLTensor view
    cdef DLManagedTensorVersioned* managed = NULL
    cdef Slot s
    if api.dltensor_from_py_object_no_sync != NULL:
        if api.dltensor_from_py_object_no_sync(<void*>obj, &view) != 0:
            _raise_producer_error(tp)
        s = Slot.__new__(Slot)
        s._fill(&view, False, tp)
        s._owner = obj
        return s
    if api.managed_tensor_from_py_object_no_sync == NULL:
        raise MalformedBufferError(f"{tp.__name__}'s DLPack exchange table has no export function")
    # Made before the export: should the allocation fail, no managed tensor exists yet to release.
    s = Slot.__new__(Slot)
    if api.managed_tensor_from_py_object_no_sync(<void*>obj, &managed) != 0:
        _raise_producer_error(tp)
    _adopt_versioned(s, managed, tp)
    return s


cdef Slot slot_or_view(object obj, object stream, DLTensor* view):
    """A Slot for ``obj``; or None, with ``*view`` filled, when ``view`` is not NULL and obj's type lends
    borrowed C views through its exchange table. One per-type lookup either way.

    A borrowed view is the producer's, unvalidated, and valid only until control returns to the
    producer; its data pointer does not include ``byte_offset``. The caller checks it against a full
    declared geometry (shape and strides), which is what makes it safe to use.
    """
    cdef type tp = type(obj)
    cdef _TypeEntry entry
    if tp is Slot:
        return <Slot>obj
    entry = _type_entry(tp)
    if entry.api != NULL:
        if view != NULL and entry.api.dltensor_from_py_object_no_sync != NULL:
            if entry.api.dltensor_from_py_object_no_sync(<void*>obj, view) != 0:
                _raise_producer_error(tp)
            return None
        return _slot_from_table(obj, entry.api, tp)
    if entry.has_dlpack:
        return _slot_from_dlpack(obj, tp, None, stream, entry)
    return _slot_from_other(obj, tp, entry, stream)


cdef object _MAX_VERSION_ARG = (CG_DLPACK_MAJOR, CG_DLPACK_MINOR)


cdef Slot _slot_from_dlpack(object obj, type tp, object method, object stream, _TypeEntry entry):
    """``__dlpack__``: ask for a versioned capsule, fall back to a legacy one on TypeError.

    ``method`` is None when the type defines ``__dlpack__`` (then it is called as a method, with no
    bound-method object made), or the attribute an instance carries.
    """
    if stream is not None:
        # CPU producers must be given stream=None; CUDA ones get the raw handle (0 means legacy default).
        dev = obj.__dlpack_device__()
        if dev[0] in (kDLCPU, kDLCUDAHost):
            stream = None
        elif type(stream) is not int or stream <= 0:
            stream = stream_handle(stream) or 1     # a positive int handle passes through as it is
    if entry is not None and entry.legacy_dlpack:
        # A producer older than DLPack 1.0 (JAX 0.11): one call, not a refused one and a retry.
        if method is None:
            method = obj.__dlpack__
        capsule = method() if stream is None else method(stream=stream)
        return _capsule_or_fallback(obj, tp, capsule)
    try:
        if method is None:
            if stream is None:
                capsule = obj.__dlpack__(max_version=_MAX_VERSION_ARG)
            else:
                capsule = obj.__dlpack__(stream=stream, max_version=_MAX_VERSION_ARG)
        elif stream is None:
            capsule = method(max_version=_MAX_VERSION_ARG)
        else:
            capsule = method(stream=stream, max_version=_MAX_VERSION_ARG)
    except TypeError:
        # Producers older than DLPack 1.0 take no max_version.
        if method is None:
            method = obj.__dlpack__
        capsule = method() if stream is None else method(stream=stream)
        if entry is not None:
            entry.legacy_dlpack = True
    except BufferError:
        # NumPy cannot export its extension types (ml_dtypes bfloat16, float8_*) through DLPack, but
        # describes them through the array interface; the dtype's name says which type the bytes hold.
        host = _array_interface_of(obj)
        if host is None:
            raise
        return _slot_from_cai(obj, host, True)
    return _capsule_or_fallback(obj, tp, capsule)


cdef Slot _capsule_or_fallback(object obj, type tp, object capsule):
    try:
        return slot_from_capsule(capsule, tp)
    except MalformedBufferError:
        # Some producers describe a geometry through DLPack wrongly that their CUDA array interface
        # gets right (CuPy 14 turns negative strides into huge positive ones, dividing by an unsigned
        # item size). The capsule's deleter has run; read the interface instead when there is one.
        cai = getattr(obj, "__cuda_array_interface__", None)
        if type(cai) is not dict:
            raise
        return _slot_from_cai(obj, <dict>cai)


cdef object _array_interface_of(object obj):
    iface = getattr(obj, "__array_interface__", None)
    dtype_name = getattr(getattr(obj, "dtype", None), "name", None)
    if type(iface) is not dict or not isinstance(dtype_name, str):
        return None
    iface = dict(iface)
    iface["descr"] = [(dtype_name, iface.get("typestr"))]
    iface.setdefault("version", 3)
    if iface["version"] not in (2, 3):
        iface["version"] = 3
    return iface


cdef Slot _slot_from_cai(object obj, dict cai, bint host=False):
    what = f"{type(obj).__name__}.{'__array_interface__' if host else '__cuda_array_interface__'}"
    cdef DLTensor view
    cdef int64_t shape_buf[SLOT_MAX_NDIM]
    cdef int64_t stride_buf[SLOT_MAX_NDIM]
    cdef int64_t itemsize, byte_stride, address
    cdef int i, ndim
    cdef int32_t device_type, ordinal
    version = cai.get("version")
    if type(version) is not int or version not in (2, 3):
        raise MalformedBufferError(f"{what}: version {version!r} is not supported (expected 2 or 3)")
    try:
        shape = tuple(cai["shape"])
        typestr = cai["typestr"]
        data = cai["data"]
    except (KeyError, TypeError) as exc:
        raise MalformedBufferError(f"{what}: missing or malformed entry {exc}") from None
    if cai.get("mask") is not None:
        raise MalformedBufferError(f"{what}: masked arrays are not supported")
    if not isinstance(typestr, str):
        raise MalformedBufferError(f"{what}: typestr must be a str; got {typestr!r}")
    if not (isinstance(data, tuple) and len(data) == 2):
        raise MalformedBufferError(f"{what}: data must be (address, readonly); got {data!r}")
    address = _as_int64(data[0], what, "data address", True)
    if address < 0:
        raise MalformedBufferError(f"{what}: data address {address} is negative")
    ndim = len(shape)
    if ndim > SLOT_MAX_NDIM:
        raise MalformedBufferError(f"{what}: ndim {ndim} is outside [0, {SLOT_MAX_NDIM}]")
    try:
        view.dtype = parse_typestr(typestr, cai.get("descr"))
    except MalformedBufferError as exc:
        raise MalformedBufferError(f"{what}: {exc}") from None
    itemsize = (view.dtype.bits + 7) // 8
    for i in range(ndim):
        shape_buf[i] = _as_int64(shape[i], what, f"shape[{i}]", True)
    strides = cai.get("strides")
    if strides is not None:
        try:
            strides = tuple(strides)
        except TypeError:
            raise MalformedBufferError(f"{what}: strides {strides!r} is not a sequence") from None
        if len(strides) != ndim:
            raise MalformedBufferError(
                f"{what}: {len(strides)} strides for a {ndim}-d shape {shape}")
        for i in range(ndim):
            byte_stride = _as_int64(strides[i], what, f"strides[{i}]", True)
            if byte_stride % itemsize != 0:
                raise MalformedBufferError(
                    f"{what}: byte stride {byte_stride} is not a multiple of the item size {itemsize}")
            stride_buf[i] = byte_stride // itemsize
    if host:
        device_type, ordinal = kDLCPU, 0
    else:
        pointer_device(<intptr_t>address, &device_type, &ordinal)
    view.data = <void*><intptr_t>address
    view.ndim = ndim
    view.shape = shape_buf
    view.strides = stride_buf if strides is not None else NULL
    view.byte_offset = 0
    view.device.device_type = device_type
    view.device.device_id = ordinal
    stream = cai.get("stream")
    if stream is not None:
        if version < 3 or type(stream) is not int or stream == 0:
            raise MalformedBufferError(f"{what}: stream {stream!r} is not a valid v3 stream handle")
    cdef Slot s = Slot.__new__(Slot)
    s._fill(&view, True, what)
    s._readonly = bool(data[1])
    if stream is not None:
        s._producer_stream = stream
    s._owner = obj
    return s


cdef Slot slot_from_address(intptr_t ptr, object shape, object strides, DLDataType dtype,
                            DLDevice device, bint readonly):
    cdef DLTensor view
    cdef int64_t shape_buf[SLOT_MAX_NDIM]
    cdef int64_t stride_buf[SLOT_MAX_NDIM]
    cdef int i, ndim
    if ptr < 0:
        raise ValueError(f"address {ptr} is negative")
    shape = tuple(shape)
    ndim = len(shape)
    if ndim > SLOT_MAX_NDIM:
        raise ValueError(f"ndim {ndim} is outside [0, {SLOT_MAX_NDIM}]")
    for i in range(ndim):
        shape_buf[i] = _as_int64(shape[i], "address", f"shape[{i}]", False)
    if strides is not None:
        strides = tuple(strides)
        if len(strides) != ndim:
            raise ValueError(f"{len(strides)} strides given for the {ndim}-d shape {shape}")
        for i in range(ndim):
            stride_buf[i] = _as_int64(strides[i], "address", f"strides[{i}]", False)
    view.data = <void*>ptr
    view.ndim = ndim
    view.shape = shape_buf
    view.strides = stride_buf if strides is not None else NULL
    view.byte_offset = 0
    view.dtype = dtype
    view.device = device
    cdef Slot s = Slot.__new__(Slot)
    try:
        s._fill(&view, True, "address")
    except MalformedBufferError as exc:
        raise ValueError(str(exc)) from None
    s._readonly = readonly
    return s


cdef Slot slot_from_object(object obj, object stream):
    return slot_or_view(obj, stream, NULL)


cdef Slot _slot_from_other(object obj, type tp, _TypeEntry entry, object stream):
    """The rarer forms: an instance's own __dlpack__, the CUDA array interface, a bare capsule."""
    method = getattr(obj, "__dlpack__", None)
    if method is not None:
        return _slot_from_dlpack(obj, tp, method, stream, None)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        if not isinstance(cai, dict):
            raise MalformedBufferError(
                f"{tp.__name__}.__cuda_array_interface__ is a {type(cai).__name__}, not a dict")
        return _slot_from_cai(obj, <dict>cai)
    if PyCapsule_CheckExact(obj):
        return slot_from_capsule(obj, "capsule")
    # Nothing usable. Before refusing, look at the type again: a table installed since the last
    # probe must not be missed, and a table of another major version must be named, every time.
    entry = _probe(tp, entry)
    if entry.api != NULL:
        return _slot_from_table(obj, entry.api, tp)
    if entry.incompatible:
        raise MalformedBufferError(
            f"{tp.__name__} publishes no DLPack exchange table with major version {CG_DLPACK_MAJOR}, "
            "and has no __dlpack__ or __cuda_array_interface__ to fall back on")
    if isinstance(obj, int) and not isinstance(obj, bool):
        raise BufferImportError(
            "a bare address needs a declared geometry: use Slot.from_address(ptr, shape, ...) "
            "or pass it for a tensor of a graph, which declares one")
    raise BufferImportError(
        f"{tp.__name__} is not a buffer: it has no __dlpack__, no __dlpack_c_exchange_api__ and no "
        "__cuda_array_interface__")
