"""cuDNN backend descriptors: ``Descriptor`` owns one ``cudnnBackendDescriptor_t``.

``Descriptor(kind)`` creates it (destroyed with the object) and sets / gets its attributes with typed
helpers; the lowering builds operation graphs, heuristics and execution plans out of them. Names are
looked up in the tables cudnn_graph._cudnn_names holds (generated from the header at build time);
every call also takes the int value.

Example (on a machine with cuDNN and a GPU):
    >>> from cudnn_graph import _cudnn_descriptor
    >>> d = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_MATMUL_DESCRIPTOR")   # doctest: +SKIP
    >>> d.set("CUDNN_ATTR_MATMUL_COMP_TYPE", "CUDNN_TYPE_DATA_TYPE", 0).finalize()  # doctest: +SKIP
"""
cimport cython
from cpython.number cimport PyNumber_Index
from libc.stdint cimport int32_t, int64_t, uintptr_t, uint8_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset

from cudnn_graph._cudnn_abi cimport *
from cudnn_graph._loader cimport CudnnApi, cudnn_api, loaded_api, check, raise_status
from cudnn_graph._cudnn_handle cimport Handle, interpreter_finalizing

from cudnn_graph._cudnn_names import ATTRIBUTE_TYPES, ATTRIBUTES, DESCRIPTOR_TYPES

# Capacities for attribute queries: generous bounds on what cuDNN returns (an engine has fewer
# knobs than there are knob types; 9.28 has 46 types).
cdef enum:
    _NOTES_CAPACITY = 32
    _KNOBS_CAPACITY = 64


cdef int32_t _resolve(object value, dict table, str what) except? -1:
    """A table name (str) or its int value."""
    if isinstance(value, str):
        found = table.get(value)
        if found is None:
            raise ValueError(f"unknown {what} {value!r}")
        return found
    return PyNumber_Index(value)


cdef inline int _element_size(int32_t attribute_type) noexcept:
    """Bytes of one element of an attribute array (every enum crosses the ABI as int32)."""
    if attribute_type == CUDNN_TYPE_INT64:
        return 8
    if attribute_type == CUDNN_TYPE_DOUBLE:
        return 8
    if attribute_type == CUDNN_TYPE_FLOAT or attribute_type == CUDNN_TYPE_INT32:
        return 4
    if attribute_type == CUDNN_TYPE_BOOLEAN or attribute_type == CUDNN_TYPE_CHAR:
        return 1      # C bool
    if (attribute_type == CUDNN_TYPE_HANDLE or attribute_type == CUDNN_TYPE_VOID_PTR
            or attribute_type == CUDNN_TYPE_BACKEND_DESCRIPTOR):
        return sizeof(void*)
    if attribute_type == CUDNN_TYPE_FRACTION:
        return sizeof(cudnnFraction_t)
    return 4


cdef dict _ATTRIBUTE_NAMES = {value: name for name, value in ATTRIBUTES.items()}
cdef dict _DESCRIPTOR_NAMES = {value: name for name, value in DESCRIPTOR_TYPES.items()}


cdef str _attribute_label(int32_t attribute):
    return _ATTRIBUTE_NAMES.get(attribute, f"attribute {attribute}")


cdef str _descriptor_label(int32_t kind):
    return _DESCRIPTOR_NAMES.get(kind, f"descriptor type {kind}")


cdef int _raise_described(int status, str where) except -1:
    encoded = where.encode()
    return raise_status(status, encoded)


# ---- descriptors ------------------------------------------------------------------------------------

@cython.final
cdef class Descriptor:
    """One cuDNN backend descriptor, destroyed when the object goes away.

    ``Descriptor(kind)`` creates it (``kind`` a ``CUDNN_BACKEND_*_DESCRIPTOR`` name or value);
    ``set(attribute, attribute_type, value)`` and the ``get_*`` methods take names or values;
    ``finalize()`` finalizes it. A descriptor set as another's attribute is kept alive with it.
    """

    def __cinit__(self, descriptor_type):
        cdef CudnnApi* api = cudnn_api()
        cdef void* created = NULL
        cdef int32_t kind = _resolve(descriptor_type, DESCRIPTOR_TYPES, "descriptor type")
        self.ptr = NULL
        self.descriptor_type = kind
        self.finalized = False
        self._children = None
        check(api.cudnnBackendCreateDescriptor(kind, &created), b"cudnnBackendCreateDescriptor")
        self.ptr = created

    def __dealloc__(self):
        cdef CudnnApi* api
        if self.ptr != NULL and not interpreter_finalizing:
            api = loaded_api()
            if api != NULL:
                api.cudnnBackendDestroyDescriptor(self.ptr)
        self.ptr = NULL

    @property
    def ptr(self) -> int:
        """The raw cudnnBackendDescriptor_t."""
        return <uintptr_t>self.ptr

    cdef int set_raw(self, int32_t attribute, int32_t attribute_type, int64_t count,
                     const void* elements) except -1:
        cdef CudnnApi* api = cudnn_api()
        cdef int status = api.cudnnBackendSetAttribute(self.ptr, attribute, attribute_type, count, elements)
        if status != CUDNN_STATUS_SUCCESS:
            _raise_described(status, f"cudnnBackendSetAttribute({_attribute_label(attribute)}, type "
                                     f"{attribute_type}) on {_descriptor_label(self.descriptor_type)}")
        return 0

    cdef int64_t get_raw(self, int32_t attribute, int32_t attribute_type, int64_t capacity,
                         void* elements) except -1:
        cdef CudnnApi* api = cudnn_api()
        cdef int64_t count = 0
        cdef int status = api.cudnnBackendGetAttribute(self.ptr, attribute, attribute_type, capacity,
                                                       &count, elements)
        if status != CUDNN_STATUS_SUCCESS:
            _raise_described(status, f"cudnnBackendGetAttribute({_attribute_label(attribute)}, type "
                                     f"{attribute_type}) on {_descriptor_label(self.descriptor_type)}")
        return count

    cdef int finalize_raw(self) except -1:
        cdef CudnnApi* api = cudnn_api()
        cdef int status
        with nogil:   # finalizing a plan can compile kernels for seconds
            status = api.cudnnBackendFinalize(self.ptr)
        if status != CUDNN_STATUS_SUCCESS:
            _raise_described(status, f"cudnnBackendFinalize({_descriptor_label(self.descriptor_type)})")
        self.finalized = True
        return 0

    def finalize(self):
        """Finalize; returns self. cuDNN's refusal raises the typed CudnnStatusError."""
        self.finalize_raw()
        return self

    def set(self, attribute, attribute_type, value):
        """Set an attribute; returns self (calls chain).

        ``value`` is a scalar or a sequence, as the type wants: ints for INT64 / INT32 / every enum
        type, floats for FLOAT / DOUBLE, bools for BOOLEAN, Descriptors for BACKEND_DESCRIPTOR, a
        Handle or an int for HANDLE, an int address for VOID_PTR.
        """
        cdef int32_t name = _resolve(attribute, ATTRIBUTES, "attribute")
        cdef int32_t kind = _resolve(attribute_type, ATTRIBUTE_TYPES, "attribute type")
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        cdef Py_ssize_t n = len(values), i
        cdef int size = _element_size(kind)
        cdef char* buffer = <char*>malloc(max(n, 1) * size)
        if buffer == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                _store_element(buffer + i * size, kind, values[i])
            self.set_raw(name, kind, n, buffer)
        finally:
            free(buffer)
        if kind == CUDNN_TYPE_BACKEND_DESCRIPTOR:
            if self._children is None:
                self._children = []
            self._children.extend(values)
        return self

    def get_int64s(self, attribute, Py_ssize_t capacity=1) -> list:
        return self._get_numbers(attribute, CUDNN_TYPE_INT64, capacity)

    def get_int64(self, attribute) -> int:
        values = self._get_numbers(attribute, CUDNN_TYPE_INT64, 1)
        return values[0] if values else 0

    def get_enums(self, attribute, attribute_type, Py_ssize_t capacity=_NOTES_CAPACITY) -> list:
        """An attribute of an enum type (notes, knob types, modes) as a list of ints."""
        return self._get_numbers(attribute, _resolve(attribute_type, ATTRIBUTE_TYPES, "attribute type"),
                                 capacity)

    def get_double(self, attribute) -> float:
        values = self._get_numbers(attribute, CUDNN_TYPE_DOUBLE, 1)
        return values[0] if values else 0.0

    def get_text(self, attribute, Py_ssize_t capacity=1 << 20) -> str:
        cdef int32_t name = _resolve(attribute, ATTRIBUTES, "attribute")
        cdef char* buffer = <char*>malloc(capacity + 1)
        cdef int64_t count
        if buffer == NULL:
            raise MemoryError()
        try:
            count = self.get_raw(name, CUDNN_TYPE_CHAR, capacity, buffer)
            buffer[min(count, capacity)] = 0
            return buffer.decode("utf-8", "replace")
        finally:
            free(buffer)

    def get_descriptors(self, attribute, descriptor_type, Py_ssize_t capacity=1) -> list:
        """A BACKEND_DESCRIPTOR attribute: ``capacity`` descriptors of ``descriptor_type`` are made
        for cuDNN to fill; the ones it filled come back."""
        cdef int32_t name = _resolve(attribute, ATTRIBUTES, "attribute")
        made = [Descriptor(descriptor_type) for _ in range(capacity)]
        cdef void** raw = <void**>malloc(max(capacity, 1) * sizeof(void*))
        cdef Py_ssize_t i
        cdef int64_t count
        if raw == NULL:
            raise MemoryError()
        try:
            for i in range(capacity):
                raw[i] = (<Descriptor>made[i]).ptr
            count = self.get_raw(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, capacity, raw)
        finally:
            free(raw)
        return made[:min(count, capacity)]

    def count(self, attribute, attribute_type) -> int:
        """How many elements an attribute holds (asks with capacity 0)."""
        cdef int32_t name = _resolve(attribute, ATTRIBUTES, "attribute")
        cdef int32_t kind = _resolve(attribute_type, ATTRIBUTE_TYPES, "attribute type")
        return self.get_raw(name, kind, 0, NULL)

    cdef list _get_numbers(self, object attribute, int32_t kind, Py_ssize_t capacity):
        cdef int32_t name = _resolve(attribute, ATTRIBUTES, "attribute")
        cdef int size = _element_size(kind)
        cdef char* buffer = <char*>malloc(max(capacity, 1) * size)
        cdef int64_t count, i
        if buffer == NULL:
            raise MemoryError()
        try:
            memset(buffer, 0, max(capacity, 1) * size)
            count = min(self.get_raw(name, kind, capacity, buffer), capacity)
            return [_load_element(buffer + i * size, kind) for i in range(count)]
        finally:
            free(buffer)

    def __repr__(self):
        return (f"Descriptor(type={self.descriptor_type}, ptr=0x{<uintptr_t>self.ptr:x}"
                f"{', finalized' if self.finalized else ''})")


cdef int _store_element(char* slot, int32_t kind, object value) except -1:
    if kind == CUDNN_TYPE_INT64:
        (<int64_t*>slot)[0] = PyNumber_Index(value)
    elif kind == CUDNN_TYPE_DOUBLE:
        (<double*>slot)[0] = value
    elif kind == CUDNN_TYPE_FLOAT:
        (<float*>slot)[0] = value
    elif kind == CUDNN_TYPE_BOOLEAN:
        (<uint8_t*>slot)[0] = 1 if value else 0
    elif kind == CUDNN_TYPE_CHAR:
        (<char*>slot)[0] = value
    elif kind == CUDNN_TYPE_BACKEND_DESCRIPTOR:
        if not isinstance(value, Descriptor):
            raise TypeError(f"a BACKEND_DESCRIPTOR attribute takes Descriptors; got {type(value).__name__}")
        (<void**>slot)[0] = (<Descriptor>value).ptr
    elif kind == CUDNN_TYPE_HANDLE:
        (<void**>slot)[0] = (<Handle>value).ptr if isinstance(value, Handle) else <void*><uintptr_t>PyNumber_Index(value)
    elif kind == CUDNN_TYPE_VOID_PTR:
        (<void**>slot)[0] = <void*><uintptr_t>PyNumber_Index(value)
    elif kind == CUDNN_TYPE_FRACTION:
        (<cudnnFraction_t*>slot)[0].numerator = value[0]
        (<cudnnFraction_t*>slot)[0].denominator = value[1]
    else:   # every enum type, and INT32
        (<int32_t*>slot)[0] = PyNumber_Index(value)
    return 0


cdef object _load_element(const char* slot, int32_t kind):
    if kind == CUDNN_TYPE_INT64:
        return (<const int64_t*>slot)[0]
    if kind == CUDNN_TYPE_DOUBLE:
        return (<const double*>slot)[0]
    if kind == CUDNN_TYPE_FLOAT:
        return (<const float*>slot)[0]
    if kind == CUDNN_TYPE_BOOLEAN:
        return (<const uint8_t*>slot)[0] != 0
    if kind == CUDNN_TYPE_HANDLE or kind == CUDNN_TYPE_VOID_PTR or kind == CUDNN_TYPE_BACKEND_DESCRIPTOR:
        return <uintptr_t>(<void* const*>slot)[0]
    return (<const int32_t*>slot)[0]
