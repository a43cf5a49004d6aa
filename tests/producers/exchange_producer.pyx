"""Hand-made DLPack producers for the tests: exchange-API types and capsules built field by field.

Every managed tensor made here counts its deleter calls, so tests can prove that a consumer calls
each deleter exactly once and never on a tensor it did not take.
"""
cimport cython
from cpython.pycapsule cimport (PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer, PyCapsule_GetName,
                                PyCapsule_SetName, PyCapsule_Destructor)
from cpython.ref cimport Py_INCREF, Py_DECREF
from cpython.exc cimport PyErr_SetObject
from libc.stdint cimport int32_t, int64_t, uint64_t, intptr_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset, strcmp, strncmp

from cudnn_graph._dlpack cimport *

cdef long _deleter_calls = 0
cdef long _tensors_made = 0
cdef long _generation = 0      # a tensor counts only in the generation it was made in


def counts():
    """(managed tensors made, deleter calls) since the last reset.

    Only tensors made since the reset are counted when deleted, so a tensor that an earlier test
    left in a reference cycle (collected whenever the GC runs) cannot skew a later test's counts.
    """
    return (_tensors_made, _deleter_calls)


def reset_counts():
    global _deleter_calls, _tensors_made, _generation
    _deleter_calls = 0
    _tensors_made = 0
    _generation += 1


# A managed tensor and its geometry in one block; manager_ctx holds a reference to the owner array.
ctypedef struct VersionedBlock:
    DLManagedTensorVersioned m
    int64_t geometry[128]
    long generation

ctypedef struct LegacyBlock:
    DLManagedTensor m
    int64_t geometry[128]
    long generation


cdef void _count_and_release(long generation, void* manager_ctx) noexcept with gil:
    """A deleter's work before free: count the call (tensors of the current generation only) and drop the
    owner's reference."""
    global _deleter_calls
    if generation == _generation:
        _deleter_calls += 1
    if manager_ctx != NULL:
        Py_DECREF(<object>manager_ctx)


cdef void _count_versioned(DLManagedTensorVersioned* m) noexcept with gil:
    _count_and_release((<VersionedBlock*>m).generation, m.manager_ctx)
    free(m)


cdef void _count_legacy(DLManagedTensor* m) noexcept with gil:
    _count_and_release((<LegacyBlock*>m).generation, m.manager_ctx)
    free(m)


# An unconsumed capsule (any name but used_*: the tests also make misnamed ones) frees its tensor.
cdef void* _unconsumed(object cap) noexcept:
    cdef const char* name = PyCapsule_GetName(cap)
    if name != NULL and strncmp(name, "used_", 5) == 0:
        return NULL
    return PyCapsule_GetPointer(cap, name)


cdef long _destructor_calls = 0


def destructor_calls():
    """How often a capsule destructor of this module ran (consumed capsules included); never reset."""
    return _destructor_calls


cdef void* _counted_unconsumed(object cap) noexcept:
    """``_unconsumed(cap)``, counting the destructor call."""
    global _destructor_calls
    _destructor_calls += 1
    return _unconsumed(cap)


cdef void _capsule_versioned_dtor(object cap) noexcept:
    cdef DLManagedTensorVersioned* m = <DLManagedTensorVersioned*>_counted_unconsumed(cap)
    if m != NULL and m.deleter != NULL:
        m.deleter(m)


cdef void _capsule_legacy_dtor(object cap) noexcept:
    cdef DLManagedTensor* m = <DLManagedTensor*>_counted_unconsumed(cap)
    if m != NULL and m.deleter != NULL:
        m.deleter(m)


# PyCapsule keeps the name pointer it is given: custom names must outlive their capsules.
cdef dict _capsule_names = {}


cdef bytes _capsule_name(object name):
    key = name if isinstance(name, bytes) else str(name).encode()
    return _capsule_names.setdefault(key, key)


cdef void _fill_tensor(DLTensor* t, int64_t* geometry, object owner, tuple layout):
    """``t`` over ``owner`` with its geometry in ``geometry``; ``layout``: make_capsule's overrides (data,
    shape, strides, dtype, device, byte_offset, ndim, null_shape, null_strides)."""
    cdef int i
    data, shape, strides, dtype, device, byte_offset, ndim, null_shape, null_strides = layout
    t.data = <void*><uintptr_t>(data if data is not None else owner.__array_interface__["data"][0])
    shape = tuple(owner.shape) if shape is None else tuple(shape)
    if strides is None:
        strides = tuple(s // owner.itemsize for s in owner.strides)
    t.ndim = len(shape) if ndim is None else ndim
    for i in range(min(len(shape), 64)):
        geometry[i] = shape[i]
    for i in range(min(len(strides), 64)):
        geometry[64 + i] = strides[i]
    t.shape = NULL if null_shape else geometry
    t.strides = NULL if null_strides else geometry + 64
    t.dtype.code, t.dtype.bits, t.dtype.lanes = dtype
    t.device.device_type, t.device.device_id = device
    t.byte_offset = byte_offset


cdef object _capsule_over(void* block, DLTensor* t, int64_t* geometry, void** manager_ctx, object owner,
                          tuple layout, bint null_deleter, object name, const char* default_name,
                          PyCapsule_Destructor destructor):
    """Fill the block's tensor, hand it a reference to ``owner`` (none with ``null_deleter``: nobody would
    release it) and wrap the block in a capsule named ``name`` (None: ``default_name``)."""
    cdef bytes name_b
    _fill_tensor(t, geometry, owner, layout)
    if not null_deleter:
        Py_INCREF(owner)
        manager_ctx[0] = <void*>owner
    if name is None:
        return PyCapsule_New(block, default_name, destructor)
    name_b = _capsule_name(name)      # kept alive by _capsule_names
    return PyCapsule_New(block, <char*>name_b, destructor)


def make_capsule(owner, *, versioned=True, name=None, version=(1, 3), data=None, shape=None,
                 strides=None, dtype=(2, 32, 1), device=(1, 0), byte_offset=0, ndim=None,
                 null_shape=False, null_strides=False, null_deleter=False, flags=0):
    """A DLPack capsule over ``owner`` (a NumPy array) with every field overridable."""
    global _tensors_made
    cdef VersionedBlock* vb
    cdef LegacyBlock* lb
    cdef tuple layout = (data, shape, strides, dtype, device, byte_offset, ndim, null_shape, null_strides)
    _tensors_made += 1
    if versioned:
        vb = <VersionedBlock*>malloc(sizeof(VersionedBlock))
        memset(vb, 0, sizeof(VersionedBlock))
        vb.generation = _generation
        vb.m.version.major, vb.m.version.minor = version
        vb.m.flags = flags
        if not null_deleter:
            vb.m.deleter = _count_versioned
        return _capsule_over(<void*>vb, &vb.m.dl_tensor, vb.geometry, &vb.m.manager_ctx, owner, layout,
                             null_deleter, name, "dltensor_versioned", _capsule_versioned_dtor)
    lb = <LegacyBlock*>malloc(sizeof(LegacyBlock))
    memset(lb, 0, sizeof(LegacyBlock))
    lb.generation = _generation
    if not null_deleter:
        lb.m.deleter = _count_legacy
    return _capsule_over(<void*>lb, &lb.m.dl_tensor, lb.geometry, &lb.m.manager_ctx, owner, layout,
                         null_deleter, name, "dltensor", _capsule_legacy_dtor)


class CapsuleProducer:
    """An object whose __dlpack__ hands out whatever capsule the factory makes."""

    def __init__(self, factory, *, device=(1, 0), accepts_max_version=True):
        self._factory = factory
        self._device = device
        self._accepts = accepts_max_version
        self.calls = []

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        if "max_version" in kwargs and not self._accepts:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self._factory(**kwargs)


class LegacyCapsuleProducer(CapsuleProducer):
    """A pre-DLPack-1.0 producer: its __dlpack__ takes no max_version (consumers remember it per type)."""

    def __init__(self, factory, *, device=(1, 0)):
        super().__init__(factory, device=device, accepts_max_version=False)


# ---- exchange-API producer types ------------------------------------------------------------

_KIND_CODES = {"f": kDLFloat, "i": kDLInt, "u": kDLUInt, "b": kDLBool, "c": kDLComplex}


cdef class ProducerBase:
    """Wraps a NumPy array; subclasses publish different exchange tables (or none).

    The DLTensor view is built once, here, so an export costs what a framework's C export costs
    (a struct copy), not Python attribute lookups. ``fail_with``: an exception instance that every
    export raises, or the string "silent" for an export that fails without setting an error.
    """
    cdef public object array
    cdef int64_t shape[64]
    cdef int64_t strides[64]
    cdef DLTensor view
    cdef public bint readonly
    cdef public object fail_with

    def __init__(self, array, readonly=False, fail_with=None):
        self.array = array
        self.readonly = readonly
        self.fail_with = fail_with
        for i in range(array.ndim):
            self.shape[i] = array.shape[i]
            self.strides[i] = array.strides[i] // array.itemsize
        self.view.data = <void*><uintptr_t>array.__array_interface__["data"][0]
        self.view.device.device_type = kDLCPU
        self.view.device.device_id = 0
        self.view.ndim = array.ndim
        self.view.dtype.code = _KIND_CODES[array.dtype.kind]
        self.view.dtype.bits = array.dtype.itemsize * 8
        self.view.dtype.lanes = 1
        self.view.shape = self.shape
        self.view.strides = self.strides
        self.view.byte_offset = 0


cdef inline int _fill_view(ProducerBase p, DLTensor* out) noexcept:
    out[0] = p.view
    return 0


cdef int _fail(ProducerBase p) noexcept with gil:
    """-1 (with the producer's exception set, unless it fails silently) when the producer must fail."""
    if p.fail_with is None:
        return 0
    if isinstance(p.fail_with, BaseException):
        PyErr_SetObject(type(p.fail_with), p.fail_with)
    return -1


cdef int _dltensor_from_py(void* obj, DLTensor* out) noexcept:
    cdef ProducerBase p = <ProducerBase>obj      # the consumer holds the GIL and a reference
    if p.fail_with is not None:
        return _fail(p)
    _fill_view(p, out)
    return 0


cdef int _managed_from_py(void* obj, DLManagedTensorVersioned** out) noexcept with gil:
    global _tensors_made
    cdef ProducerBase p = <ProducerBase><object>obj
    if p.fail_with is not None:
        out[0] = NULL
        return _fail(p)
    cdef int i
    cdef VersionedBlock* vb = <VersionedBlock*>malloc(sizeof(VersionedBlock))
    memset(vb, 0, sizeof(VersionedBlock))
    vb.generation = _generation
    _fill_view(p, &vb.m.dl_tensor)
    # C loop over the view's own ndim: an export costs a framework's C export, not Python lookups.
    for i in range(p.view.ndim):
        vb.geometry[i] = p.shape[i]
        vb.geometry[64 + i] = p.strides[i]
    vb.m.dl_tensor.shape = vb.geometry
    vb.m.dl_tensor.strides = vb.geometry + 64
    vb.m.version.major = 1
    vb.m.version.minor = 3
    vb.m.flags = DLPACK_FLAG_BITMASK_READ_ONLY if p.readonly else 0
    Py_INCREF(p.array)
    vb.m.manager_ctx = <void*>p.array
    vb.m.deleter = _count_versioned
    _tensors_made += 1
    out[0] = &vb.m
    return 0


cdef int _no_alloc(DLTensor* prototype, DLManagedTensorVersioned** out, void* ctx,
                   DLPackSetError set_error) noexcept:
    set_error(ctx, "NotImplementedError", "test producer does not allocate")
    return -1


cdef int _to_py(DLManagedTensorVersioned* t, void** out) noexcept:
    return -1


cdef int _stream(DLDeviceType device_type, int32_t device_id, void** out) noexcept:
    out[0] = NULL
    return 0


cdef DLPackExchangeAPI API_FULL
cdef DLPackExchangeAPI API_MANAGED_ONLY
cdef DLPackExchangeAPI API_FUTURE
cdef DLPackExchangeAPI API_CHAIN


cdef void _init_table(DLPackExchangeAPI* api, int major, DLPackExchangeAPIHeader* prev, bint with_view):
    api.header.version.major = major
    api.header.version.minor = 3 if major == 1 else 0
    api.header.prev_api = prev
    api.managed_tensor_allocator = _no_alloc
    api.managed_tensor_from_py_object_no_sync = _managed_from_py
    api.managed_tensor_to_py_object_no_sync = _to_py
    api.dltensor_from_py_object_no_sync = NULL
    if with_view:
        api.dltensor_from_py_object_no_sync = _dltensor_from_py
    api.current_work_stream = _stream


_init_table(&API_FULL, 1, NULL, True)
_init_table(&API_MANAGED_ONLY, 1, NULL, False)
_init_table(&API_FUTURE, 2, NULL, True)
_init_table(&API_CHAIN, 2, &API_FULL.header, True)


def table_capsule(kind="full"):
    """A capsule over one of the test tables, to install on a type after the fact."""
    tables = {"full": <uintptr_t>&API_FULL, "managed_only": <uintptr_t>&API_MANAGED_ONLY,
              "future": <uintptr_t>&API_FUTURE, "chain": <uintptr_t>&API_CHAIN}
    return PyCapsule_New(<void*><uintptr_t>tables[kind], "dlpack_exchange_api", NULL)


cdef class ExchangeProducer(ProducerBase):
    """Publishes a full DLPack 1.3 table (borrowed-view export)."""
    __dlpack_c_exchange_api__ = PyCapsule_New(<void*>&API_FULL, "dlpack_exchange_api", NULL)


cdef class ManagedOnlyProducer(ProducerBase):
    """Publishes a table without the borrowed-view function: the consumer must use managed export."""
    __dlpack_c_exchange_api__ = PyCapsule_New(<void*>&API_MANAGED_ONLY, "dlpack_exchange_api", NULL)


cdef class FutureMajorProducer(ProducerBase):
    """Publishes only a DLPack 2.x table and no __dlpack__."""
    __dlpack_c_exchange_api__ = PyCapsule_New(<void*>&API_FUTURE, "dlpack_exchange_api", NULL)


cdef class ChainedProducer(ProducerBase):
    """Publishes a 2.x table whose prev_api leads to a 1.x table."""
    __dlpack_c_exchange_api__ = PyCapsule_New(<void*>&API_CHAIN, "dlpack_exchange_api", NULL)


cdef class WrongCapsuleNameProducer(ProducerBase):
    """Publishes the table under a wrong capsule name."""
    __dlpack_c_exchange_api__ = PyCapsule_New(<void*>&API_FULL, "not_dlpack_exchange_api", NULL)


cdef class PlainProducer(ProducerBase):
    """No table at all; a Python subclass may install one later."""
    pass


# ---- producer-side costs, for bench/dlpack_import.py ------------------------------------------
# Each function below does one producer-side operation from C. Timed against ``noop(x)`` (the same call
# with no work), the difference is the producer's own cost, free of any consumer's overhead.

def noop(obj):
    """Does nothing: the call overhead that the functions below share."""
    return None


cdef inline void* _take_if_named(object capsule, const char* name, const char* wanted, const char* used):
    """A capsule's pointer when it is named ``wanted`` (``name``), the capsule then renamed ``used`` as a
    consumer does; NULL otherwise (a capsule never holds NULL)."""
    if name == NULL or strcmp(name, wanted) != 0:
        return NULL
    cdef void* pointer = PyCapsule_GetPointer(capsule, name)
    PyCapsule_SetName(capsule, used)
    return pointer


def consume(capsule):
    """Take and release a DLPack capsule as a minimal conforming consumer does, without using it:
    rename it used_*, then call its deleter. ``consume(None)`` does nothing (the calibration).

    ``consume(x.__dlpack__(...))`` less ``consume(None)`` is what a producer's export costs any
    consumer: the export, the release, and whatever the producer's capsule destructor does with a
    consumed capsule (JAX's raises and clears a ValueError there).
    """
    cdef const char* name
    cdef DLManagedTensorVersioned* v
    cdef DLManagedTensor* m
    if capsule is None:
        return None
    name = PyCapsule_GetName(capsule)
    v = <DLManagedTensorVersioned*>_take_if_named(capsule, name, "dltensor_versioned", "used_dltensor_versioned")
    if v != NULL:
        if v.deleter != NULL:
            v.deleter(v)
        return None
    m = <DLManagedTensor*>_take_if_named(capsule, name, "dltensor", "used_dltensor")
    if m != NULL:
        if m.deleter != NULL:
            m.deleter(m)
        return None
    raise ValueError(f"not an unconsumed DLPack capsule: {capsule!r}")


def managed_export_release(ProducerBase obj):
    """The test producers' managed export through their table, then its deleter."""
    cdef DLManagedTensorVersioned* m = NULL
    if _managed_from_py(<void*>obj, &m) != 0:
        raise RuntimeError("managed export failed")
    m.deleter(m)


def view_export(ProducerBase obj):
    """The test producers' borrowed-view export through their table."""
    cdef DLTensor view
    if _dltensor_from_py(<void*>obj, &view) != 0:
        raise RuntimeError("view export failed")
