"""A built graph as an XLA custom call: the typed-FFI handler and the table of registered plans.

XLA calls ``plan_handler`` (or ``plan_handler_command_buffer``, the same handler reporting the
command-buffer trait) with a call frame: the argument buffers (the graph's inputs, in the order the
caller registered them), the result buffers (its outputs, then the plan's workspace as a uint8 buffer
when it needs one: XLA owns that memory and reuses it) and an int64 attribute ``plan_id``.

The handler answers XLA's metadata query (API version, traits), does nothing in the instantiate /
prepare / initialize stages (everything a plan needs was prepared when it was registered), and in the
execute stage looks the plan up, checks every buffer against the geometry the plan declares (an FFI
error naming the tensor on a mismatch) and runs it:

- a cuDNN plan runs here, in C, with no Python and no GIL: the operands' uid / pointer arrays plus the
  operands the plan supplies itself (its constants, views, scratch carved from the workspace) go into
  a variant pack (cudnn_graph._graph_replay.build_variant_pack, the one execute() uses; reused while
  the addresses repeat) and cudnnBackendExecute runs on XLA's stream;
- a DSL plan with a C launch (the CuTe GEMM's PackedLaunch) runs here too: dsl_fill packs the buffers'
  addresses and the stream, and its compiled host entry is called with no GIL;
- any other Python engine's plan (cuTile; the reference engine of a host graph; a CuTe plan without a C
  launch) has no C launch path: the handler takes the GIL and calls the graph's execute() with the
  buffers as raw-pointer operands (host graphs: ``Slot.from_address``), on XLA's stream.

Devices. Every plan is built for one device and never runs on another device's buffers: the handler
finds the device a call runs on (CUDA: the device whose context owns XLA's stream, asked of the
driver; else, and on the host, XLA_FFI_DeviceOrdinal_Get) and refuses a plan of another device with an
INVALID_ARGUMENT error naming both. Under ``shard_map`` one custom call (one ``plan_id``, fixed when it
is traced) runs on every device of the mesh, so the id may name a *family* (``register_family``): one
registered plan per device ordinal, of which the handler runs the call's device's. Nothing can be
built here (that needs the GIL and seconds): cudnn_graph.jax registers every device's plan before the
call is emitted.

Plans are registered from Python (``register_graph``) and removed when their graph is released. One
lock serialises the table and the cuDNN launches (they share one cuDNN handle per device).

The API version: XLA registers a handler only when the version it reports is the framework's own
(jaxlib 0.10.2: 0.3). The handler reports CG_XLA_FFI_API_MAJOR.MINOR of the header, or what
``set_reported_api_version`` set (cudnn_graph.jax reads the installed jaxlib's header), and checks at
execute time that the framework's function table has the major version and the entries it calls.
"""
cimport cython
from cpython.pycapsule cimport PyCapsule_New
from libc.stdint cimport int32_t, int64_t, intptr_t, uintptr_t, uint32_t
from libc.stdio cimport snprintf
from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memcmp, memcpy, strncpy

from cudnn_graph._loader cimport CudnnApi, loaded_api, cudnn_api
from cudnn_graph._plan_runner cimport PlanRunner
from cudnn_graph._graph_replay cimport build_variant_pack, stage_name
from cudnn_graph._driver cimport (zero_async_nogil, enter_device, leave_device, enter_device_nogil,
                                  leave_device_nogil, stream_device_nogil)
from cudnn_graph._dsl_launch cimport (DSL_FILL_OK, DSL_FILL_MISALIGNED, DslFillFailure, LaunchCells, PackedLaunch,
                                      dsl_fill)
from cudnn_graph._cudnn_handle cimport interpreter_finalizing

import logging
import threading
import weakref

from cudnn_graph._xla_operands import XLA_DTYPE_CODES, PlanRegistration, PythonPlan, tensor_entry
from cudnn_graph.errors import FfiRegistrationError

_logger = logging.getLogger(__name__)


cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_init(pthread_mutex_t* mutex, const void* attr)
    int pthread_mutex_lock(pthread_mutex_t* mutex)
    int pthread_mutex_unlock(pthread_mutex_t* mutex)


cdef enum:
    _MAX_DEVICES = 64
    _MESSAGE_BYTES = 768
    _ALIGNMENT = 16                      # what cuDNN's tensor descriptors promise for device operands

cdef pthread_mutex_t _lock
pthread_mutex_init(&_lock, NULL)
cdef FfiPlan** _table = NULL             # plan id -> entry (NULL: never registered, or released)
cdef int64_t _table_size = 0
cdef int64_t _next_id = 1                # ids are never reused: a stale id is an error, not another plan
cdef void* _device_handles[_MAX_DEVICES]  # the cuDNN handle FFI launches use, per device
cdef intptr_t _handle_streams[_MAX_DEVICES]
cdef bint _handle_stream_known[_MAX_DEVICES]
cdef int _reported_major = CG_XLA_FFI_API_MAJOR
cdef int _reported_minor = CG_XLA_FFI_API_MINOR
# The call's device, as the handler last found it, and how (diagnostics: last_call_device()).
cdef enum:
    _NO_OVERRIDE = -1000
    _SOURCE_NONE = 0
    _SOURCE_STREAM = 1                    # the driver: the device whose context owns XLA's stream
    _SOURCE_FRAMEWORK = 2                 # XLA_FFI_DeviceOrdinal_Get
    _SOURCE_DEFAULT = 3                   # a host call in a framework without that entry: 0
    _SOURCE_OVERRIDE = 4                  # a test forged it (override_call_device)
cdef int _device_override = _NO_OVERRIDE
cdef int _last_device = -1
cdef int _last_device_source = _SOURCE_NONE
cdef int64_t _device_calls[FFI_MAX_DEVICES]   # calls resolved per device (diagnostics: calls_by_device())

cdef const char* _C_DTYPE_NAMES[21]
for _i in range(21):
    _C_DTYPE_NAMES[_i] = "?"
_C_DTYPE_NAMES[1] = b"bool"
_C_DTYPE_NAMES[2] = b"int8"
_C_DTYPE_NAMES[3] = b"int16"
_C_DTYPE_NAMES[4] = b"int32"
_C_DTYPE_NAMES[5] = b"int64"
_C_DTYPE_NAMES[6] = b"uint8"
_C_DTYPE_NAMES[7] = b"uint16"
_C_DTYPE_NAMES[8] = b"uint32"
_C_DTYPE_NAMES[9] = b"uint64"
_C_DTYPE_NAMES[10] = b"float16"
_C_DTYPE_NAMES[11] = b"float32"
_C_DTYPE_NAMES[12] = b"float64"
_C_DTYPE_NAMES[16] = b"bfloat16"
_C_DTYPE_NAMES[19] = b"float8_e5m2"
_C_DTYPE_NAMES[20] = b"float8_e4m3fn"


cdef inline const char* _dtype_name(int code) noexcept nogil:
    if 0 <= code < 21:
        return _C_DTYPE_NAMES[code]
    return _C_DTYPE_NAMES[0]


# ---- the handler ---------------------------------------------------------------------------------------

cdef XLA_FFI_Error* plan_handler(XLA_FFI_CallFrame* frame) noexcept nogil:
    return _handle(frame, 0)


cdef XLA_FFI_Error* plan_handler_command_buffer(XLA_FFI_CallFrame* frame) noexcept nogil:
    return _handle(frame, XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE)


cdef XLA_FFI_Error* _error(const XLA_FFI_Api* api, XLA_FFI_Error_Code code, const char* message) noexcept nogil:
    cdef XLA_FFI_Error_Create_Args args
    if api == NULL or not CG_XLA_FFI_API_HAS_ERROR_CREATE(api):
        return NULL     # a framework without Error_Create cannot be told; _handle refuses to run then
    args.struct_size = sizeof(XLA_FFI_Error_Create_Args)
    args.extension_start = NULL
    args.message = message      # the framework copies it
    args.errc = code
    return api.XLA_FFI_Error_Create(&args)


cdef XLA_FFI_Error* _handle(XLA_FFI_CallFrame* frame, uint32_t traits) noexcept nogil:
    cdef XLA_FFI_Extension_Base* extension = frame.extension_start
    cdef XLA_FFI_Metadata* metadata
    # The metadata query: XLA passes a Metadata extension (and no api) and reads what is filled in.
    while extension != NULL:
        if extension.type == XLA_FFI_Extension_Metadata:
            metadata = (<XLA_FFI_Metadata_Extension*>extension).metadata
            metadata.api_version.major_version = _reported_major
            metadata.api_version.minor_version = _reported_minor
            metadata.traits = traits
            return NULL
        extension = extension.next
    cdef const XLA_FFI_Api* api = frame.api
    if api == NULL or not CG_XLA_FFI_API_HAS_ERROR_CREATE(api):
        return NULL     # cannot happen with a framework that passed the metadata check; nothing to report with
    if api.api_version.major_version != CG_XLA_FFI_API_MAJOR or not CG_XLA_FFI_API_HAS_STREAM_GET(api):
        return _error(api, XLA_FFI_Error_Code_UNIMPLEMENTED,
                      b"cudnn_graph: the XLA FFI of this framework is not one cudnn_graph was written for "
                      b"(it needs API major version 0 with XLA_FFI_Stream_Get)")
    if frame.stage != XLA_FFI_ExecutionStage_EXECUTE:
        return NULL     # instantiate / prepare / initialize: a registered plan is ready already
    cdef char message[_MESSAGE_BYTES]
    cdef int64_t plan_id = 0
    cdef intptr_t stream = 0
    cdef int device = -1
    if not _plan_id_attribute(frame, &plan_id):
        return _error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                      b"cudnn_graph: the custom call has no int64 attribute 'plan_id'")
    pthread_mutex_lock(&_lock)
    cdef FfiPlan* plan = NULL
    cdef XLA_FFI_Error_Code code = _resolve(plan_id, api, frame, &plan, &stream, &device, message)
    if code == XLA_FFI_Error_Code_OK:
        code = _check_buffers(plan, frame, message)
    if code != XLA_FFI_Error_Code_OK:
        pthread_mutex_unlock(&_lock)
        return _error(api, code, message)
    if plan.kind == PLAN_KIND_CUDNN:
        code = _run_cudnn(plan, frame, stream, message)
        pthread_mutex_unlock(&_lock)
    elif plan.kind == PLAN_KIND_DSL:
        code = _run_dsl(plan, frame, stream, message)
        pthread_mutex_unlock(&_lock)
    else:
        # The Python engine's execute takes the GIL: the table lock must not be held meanwhile (a
        # thread holding the GIL may be waiting for it to register or release a plan).
        plan_id = plan.plan_id
        pthread_mutex_unlock(&_lock)
        code = _run_python(plan_id, frame, stream, message)
    if code != XLA_FFI_Error_Code_OK:
        return _error(api, code, message)
    return NULL


cdef XLA_FFI_Error_Code _resolve(int64_t plan_id, const XLA_FFI_Api* api, XLA_FFI_CallFrame* frame,
                                 FfiPlan** found, intptr_t* stream, int* device, char* message) noexcept nogil:
    """The plan this call runs (the table lock is held): ``plan_id``'s, or for a family its member for the
    call's device; with XLA's stream (device plans) and the call's device (-1 where none was asked). A plan
    of another device than the call's is refused: it never runs on another device's buffers."""
    cdef FfiPlan* entry = _table[plan_id] if 0 < plan_id < _table_size else NULL
    cdef FfiPlan* plan
    cdef XLA_FFI_Error_Code code
    cdef int64_t member
    cdef bint on_cuda
    cdef char held[160]
    if entry == NULL:
        snprintf(message, _MESSAGE_BYTES, b"cudnn_graph: plan id %lld is not registered (its graph was "
                 b"released, or the id comes from another process)", <long long>plan_id)
        return XLA_FFI_Error_Code_NOT_FOUND
    on_cuda = entry.on_cuda if entry.kind == PLAN_KIND_FAMILY else entry.device >= 0
    if on_cuda and _device_override == _NO_OVERRIDE:
        code = _stream(api, frame, stream, message)     # the driver tells the call's device from it
        if code != XLA_FFI_Error_Code_OK:
            return code
    if entry.kind == PLAN_KIND_FAMILY or entry.device >= 0:
        code = _call_device(api, frame, on_cuda, stream[0], device, message)
        if code != XLA_FFI_Error_Code_OK:
            return code
    plan = entry
    if entry.kind == PLAN_KIND_FAMILY:
        member = entry.members[device[0]] if 0 <= device[0] < FFI_MAX_DEVICES else 0
        plan = _table[member] if 0 < member < _table_size else NULL
        if plan == NULL:
            _format_members(held, 160, entry)
            snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan family %lld has no plan for %s%d, where XLA "
                     b"runs this call (it holds plans for %s; a member's graph may have been released): build "
                     b"the function for every device it runs on", <long long>plan_id,
                     b"cuda:" if on_cuda else b"host device ", device[0], held)
            return XLA_FFI_Error_Code_NOT_FOUND
    if plan.device >= 0 and plan.device != device[0]:
        snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld was built for cuda:%d; XLA runs this call on "
                 b"cuda:%d, whose buffers it must not touch (register a plan per device: cudnn_graph.jax."
                 b"function builds one for every local GPU)", <long long>plan.plan_id, plan.device, device[0])
        return XLA_FFI_Error_Code_INVALID_ARGUMENT
    if on_cuda and _device_override != _NO_OVERRIDE:
        code = _stream(api, frame, stream, message)
        if code != XLA_FFI_Error_Code_OK:
            return code
    if 0 <= device[0] < FFI_MAX_DEVICES:
        _device_calls[device[0]] += 1
    found[0] = plan
    return XLA_FFI_Error_Code_OK


cdef void _format_members(char* out, int size, FfiPlan* family) noexcept nogil:
    cdef int at = 0, d
    out[0] = 0
    for d in range(FFI_MAX_DEVICES):
        if family.members[d] != 0 and at < size:
            at += snprintf(out + at, size - at, b"%s%s%d", b", " if at else b"",
                           b"cuda:" if family.on_cuda else b"host device ", d)
    if at == 0:
        snprintf(out, size, b"no device")


cdef XLA_FFI_Error_Code _stream(const XLA_FFI_Api* api, XLA_FFI_CallFrame* frame, intptr_t* stream,
                                char* message) noexcept nogil:
    cdef XLA_FFI_Stream_Get_Args args
    cdef XLA_FFI_Error* failed
    args.struct_size = sizeof(XLA_FFI_Stream_Get_Args)
    args.extension_start = NULL
    args.ctx = frame.ctx
    args.stream = NULL
    failed = api.XLA_FFI_Stream_Get(&args)
    if failed != NULL:
        return _forward(failed, message)
    stream[0] = <intptr_t>args.stream
    return XLA_FFI_Error_Code_OK


cdef XLA_FFI_Error_Code _call_device(const XLA_FFI_Api* api, XLA_FFI_CallFrame* frame, bint on_cuda,
                                     intptr_t stream, int* device, char* message) noexcept nogil:
    """The device this call runs on. On CUDA: the device whose context owns XLA's stream (where the
    buffers live; cuda:N numbers as cudnn_graph does), else XLA's device ordinal; on the host: XLA's
    device ordinal (0 where the framework's table has no such entry)."""
    global _last_device, _last_device_source
    cdef XLA_FFI_DeviceOrdinal_Get_Args args
    cdef XLA_FFI_Error* failed
    if _device_override != _NO_OVERRIDE:
        device[0] = _device_override
        _last_device, _last_device_source = device[0], _SOURCE_OVERRIDE
        return XLA_FFI_Error_Code_OK
    if on_cuda:
        device[0] = stream_device_nogil(stream)
        if device[0] >= 0:
            _last_device, _last_device_source = device[0], _SOURCE_STREAM
            return XLA_FFI_Error_Code_OK
    if CG_XLA_FFI_API_HAS_DEVICE_ORDINAL_GET(api):
        args.struct_size = sizeof(XLA_FFI_DeviceOrdinal_Get_Args)
        args.extension_start = NULL
        args.ctx = frame.ctx
        args.device_ordinal = -1
        failed = api.XLA_FFI_DeviceOrdinal_Get(&args)
        if failed != NULL:
            return _forward(failed, message)
        device[0] = args.device_ordinal
        _last_device, _last_device_source = device[0], _SOURCE_FRAMEWORK
        return XLA_FFI_Error_Code_OK
    if not on_cuda:
        device[0] = 0
        _last_device, _last_device_source = 0, _SOURCE_DEFAULT
        return XLA_FFI_Error_Code_OK
    snprintf(message, _MESSAGE_BYTES, b"cudnn_graph: cannot tell which CUDA device this call runs on (the "
             b"driver does not know XLA's stream and the framework gives no device ordinal)")
    return XLA_FFI_Error_Code_INTERNAL


cdef bint _plan_id_attribute(XLA_FFI_CallFrame* frame, int64_t* plan_id) noexcept nogil:
    cdef int64_t i
    cdef XLA_FFI_ByteSpan* name
    cdef XLA_FFI_Scalar* scalar
    for i in range(frame.attrs.size):
        name = frame.attrs.names[i]
        if name.len != 7 or memcmp(name.ptr, b"plan_id", 7) != 0:
            continue
        if frame.attrs.types[i] != XLA_FFI_AttrType_SCALAR:
            return False
        scalar = <XLA_FFI_Scalar*>frame.attrs.attrs[i]
        if scalar.dtype != XLA_FFI_DataType_S64:
            return False
        plan_id[0] = (<int64_t*>scalar.value)[0]
        return True
    return False


cdef int _format_dims(char* out, int size, int dtype, int64_t rank, const int64_t* dims) noexcept nogil:
    cdef int at = snprintf(out, size, b"%s[", _dtype_name(dtype))
    cdef int64_t i
    for i in range(rank):
        if at >= size:
            break
        at += snprintf(out + at, size - at, b"%s%lld", b"," if i else b"", <long long>dims[i])
    if at < size:
        at += snprintf(out + at, size - at, b"]")
    return at


cdef XLA_FFI_Error_Code _check_buffers(FfiPlan* plan, XLA_FFI_CallFrame* frame, char* message) noexcept nogil:
    """Every argument and result against the plan's declared geometry; a message naming the tensor."""
    cdef int64_t extra = frame.rets.size - plan.n_outputs
    cdef int i, d
    cdef XLA_FFI_Buffer* buffer
    cdef FfiTensor* tensor
    cdef bint same
    cdef char want[160]
    cdef char got[160]
    # A plan without a workspace tolerates one trailing result (a family's workspace, sized for another
    # member), checked like a workspace below.
    if frame.args.size != plan.n_inputs or not (extra == 1 if plan.workspace_size > 0 else 0 <= extra <= 1):
        snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: the call has %lld arguments and %lld "
                 b"results; the plan takes %d inputs and gives %d outputs%s", <long long>plan.plan_id,
                 <long long>frame.args.size, <long long>frame.rets.size, plan.n_inputs, plan.n_outputs,
                 b" plus its workspace" if plan.workspace_size > 0 else b"")
        return XLA_FFI_Error_Code_INVALID_ARGUMENT
    for i in range(plan.n_inputs + plan.n_outputs):
        tensor = &plan.tensors[i]
        if i < plan.n_inputs:
            if frame.args.types[i] != XLA_FFI_ArgType_BUFFER:
                snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: argument %d (tensor '%s', uid %lld) "
                         b"is not a buffer", <long long>plan.plan_id, i, tensor.name, <long long>tensor.uid)
                return XLA_FFI_Error_Code_INVALID_ARGUMENT
            buffer = <XLA_FFI_Buffer*>frame.args.args[i]
        else:
            if frame.rets.types[i - plan.n_inputs] != XLA_FFI_RetType_BUFFER:
                snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: result %d (tensor '%s', uid %lld) "
                         b"is not a buffer", <long long>plan.plan_id, i - plan.n_inputs, tensor.name,
                         <long long>tensor.uid)
                return XLA_FFI_Error_Code_INVALID_ARGUMENT
            buffer = <XLA_FFI_Buffer*>frame.rets.rets[i - plan.n_inputs]
        same = buffer.dtype == tensor.dtype and buffer.rank == tensor.rank
        if same:
            for d in range(tensor.rank):
                if buffer.dims[d] != tensor.dims[d]:
                    same = False
                    break
        if not same:
            _format_dims(want, 160, tensor.dtype, tensor.rank, tensor.dims)
            _format_dims(got, 160, buffer.dtype, buffer.rank if buffer.rank <= FFI_MAX_RANK * 8 else 0,
                         buffer.dims)
            snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: %s %d, tensor '%s' (uid %lld): expected "
                     b"%s, got %s", <long long>plan.plan_id, b"argument" if i < plan.n_inputs else b"result",
                     i if i < plan.n_inputs else i - plan.n_inputs, tensor.name, <long long>tensor.uid, want, got)
            return XLA_FFI_Error_Code_INVALID_ARGUMENT
        if plan.kind == PLAN_KIND_CUDNN and (<uintptr_t>buffer.data) % _ALIGNMENT != 0:
            snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: tensor '%s' (uid %lld): expected a data "
                     b"address aligned to 16 bytes, got %p", <long long>plan.plan_id, tensor.name,
                     <long long>tensor.uid, buffer.data)
            return XLA_FFI_Error_Code_INVALID_ARGUMENT
    if extra == 1:
        buffer = <XLA_FFI_Buffer*>frame.rets.rets[plan.n_outputs]
        if (frame.rets.types[plan.n_outputs] != XLA_FFI_RetType_BUFFER or buffer.dtype != 6 or buffer.rank != 1
                or buffer.dims[0] < plan.workspace_size):
            snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: the last result must be the plan's "
                     b"workspace, uint8[%lld]", <long long>plan.plan_id, <long long>plan.workspace_size)
            return XLA_FFI_Error_Code_INVALID_ARGUMENT
    return XLA_FFI_Error_Code_OK


cdef inline void* _buffer_data(XLA_FFI_CallFrame* frame, FfiPlan* plan, int i) noexcept nogil:
    if i < plan.n_inputs:
        return (<XLA_FFI_Buffer*>frame.args.args[i]).data
    return (<XLA_FFI_Buffer*>frame.rets.rets[i - plan.n_inputs]).data


cdef XLA_FFI_Error_Code _run_cudnn(FfiPlan* plan, XLA_FFI_CallFrame* frame, intptr_t stream,
                                   char* message) noexcept nogil:
    """cudnnBackendExecute of a registered plan on XLA's stream (the table lock is held), with the plan's
    device's primary context current (cuDNN launches on the current context; XLA's is the primary one)."""
    cdef bint pushed = False
    cdef int result = enter_device_nogil(plan.device, &pushed)
    cdef XLA_FFI_Error_Code code
    if result != 0:
        snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: making cuda:%d's primary context current "
                 b"failed (CUresult %d)", <long long>plan.plan_id, plan.device, result)
        return XLA_FFI_Error_Code_INTERNAL
    code = _execute_cudnn(plan, frame, stream, message)
    leave_device_nogil(pushed)
    return code


cdef XLA_FFI_Error_Code _execute_cudnn(FfiPlan* plan, XLA_FFI_CallFrame* frame, intptr_t stream,
                                       char* message) noexcept nogil:
    cdef CudnnApi* cudnn = loaded_api()
    cdef int64_t uids[FFI_MAX_TENSORS + FFI_MAX_EXTRA]
    cdef void* ptrs[FFI_MAX_TENSORS + FFI_MAX_EXTRA]
    cdef int n = 0, i, status, stage = 0, result
    cdef void* workspace = NULL
    cdef void* pack = NULL
    if cudnn == NULL:
        snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: libcudnn is not loaded", <long long>plan.plan_id)
        return XLA_FFI_Error_Code_FAILED_PRECONDITION
    if not _handle_stream_known[plan.device] or _handle_streams[plan.device] != stream:
        status = cudnn.cudnnSetStream(plan.handle, <void*>stream)
        if status != 0:
            snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: cudnnSetStream failed: %s",
                     <long long>plan.plan_id, cudnn.cudnnGetErrorString(status))
            return XLA_FFI_Error_Code_INTERNAL
        _handle_streams[plan.device] = stream
        _handle_stream_known[plan.device] = True
    if plan.workspace_size > 0:
        workspace = (<XLA_FFI_Buffer*>frame.rets.rets[plan.n_outputs]).data
    for i in range(plan.n_inputs + plan.n_outputs):
        if plan.tensors[i].packed:
            uids[n] = plan.tensors[i].uid
            ptrs[n] = _buffer_data(frame, plan, i)
            n += 1
    memcpy(uids + n, plan.fixed_uids, plan.n_fixed * sizeof(int64_t))
    memcpy(ptrs + n, plan.fixed_ptrs, plan.n_fixed * sizeof(void*))
    n += plan.n_fixed
    for i in range(plan.n_aliases):
        uids[n] = plan.alias_uids[i]
        ptrs[n] = <void*>(<char*>_buffer_data(frame, plan, plan.alias_sources[i]) + plan.alias_offsets[i])
        n += 1
    for i in range(plan.n_scratch):
        uids[n] = plan.scratch_uids[i]
        ptrs[n] = <void*>(<char*>workspace + plan.scratch_offsets[i])
        n += 1
        if plan.scratch_zero[i]:
            result = zero_async_nogil(<uintptr_t>ptrs[n - 1], plan.scratch_bytes[i], stream)
            if result != 0:
                snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: zeroing its scratch failed (CUresult "
                         b"%d)", <long long>plan.plan_id, result)
                return XLA_FFI_Error_Code_INTERNAL
    # XLA hands the same buffers to a step's custom call again and again: keep the finalized pack.
    if (plan.cached_pack != NULL and plan.cached_n == n and plan.cached_workspace == workspace
            and memcmp(plan.cached_ptrs, ptrs, n * sizeof(void*)) == 0):
        pack = plan.cached_pack
    else:
        if plan.cached_pack != NULL:
            cudnn.cudnnBackendDestroyDescriptor(plan.cached_pack)
            plan.cached_pack = NULL
        status = build_variant_pack(cudnn, n, uids, ptrs, workspace, &pack, &stage)
        if status != 0:
            snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: %s failed: %s", <long long>plan.plan_id,
                     stage_name(stage), cudnn.cudnnGetErrorString(status))
            return XLA_FFI_Error_Code_INTERNAL
        plan.cached_pack = pack
        plan.cached_n = n
        plan.cached_workspace = workspace
        memcpy(plan.cached_ptrs, ptrs, n * sizeof(void*))
    status = cudnn.cudnnBackendExecute(plan.handle, plan.plan, pack)
    if status != 0:
        snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: cudnnBackendExecute failed: %s",
                 <long long>plan.plan_id, cudnn.cudnnGetErrorString(status))
        return XLA_FFI_Error_Code_INTERNAL
    return XLA_FFI_Error_Code_OK


cdef XLA_FFI_Error_Code _forward(XLA_FFI_Error* failed, char* message) noexcept nogil:
    # The framework's own error cannot be returned through ours without its message API: say it failed.
    snprintf(message, _MESSAGE_BYTES, b"cudnn_graph: the framework refused a query (stream or device ordinal)")
    return XLA_FFI_Error_Code_INTERNAL


cdef XLA_FFI_Error_Code _run_dsl(FfiPlan* plan, XLA_FFI_CallFrame* frame, intptr_t stream,
                                 char* message) noexcept nogil:
    """A DSL plan's compiled host entry, called here (the table lock is held) with the buffers' addresses
    packed by dsl_fill, on XLA's stream with the plan's device's primary context current (the entry
    launches on the current context)."""
    cdef int64_t uids[FFI_MAX_TENSORS]
    cdef void* ptrs[FFI_MAX_TENSORS]
    cdef LaunchCells cells
    cdef DslFillFailure failure
    cdef int i, n = plan.n_inputs + plan.n_outputs, status, result
    cdef bint pushed = False
    for i in range(n):
        uids[i] = plan.tensors[i].uid
        ptrs[i] = _buffer_data(frame, plan, i)
    status = dsl_fill(plan.launch, uids, ptrs, n, stream, &cells, &failure)
    cdef const char* name = b"?"
    if status == DSL_FILL_MISALIGNED:
        i = _tensor_index(plan, failure.uid)
        if i >= 0:
            name = plan.tensors[i].name
        snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: tensor '%s' (uid %lld): expected a data "
                 b"address aligned to %lld bytes (the CuTe kernel's), got %p", <long long>plan.plan_id,
                 name, <long long>failure.uid, <long long>failure.align, failure.address)
        return XLA_FFI_Error_Code_INVALID_ARGUMENT
    if status != DSL_FILL_OK:
        snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: scalar uid %lld has no value (an XLA call "
                 b"passes no host scalars: give it when the graph is built)", <long long>plan.plan_id,
                 <long long>failure.uid)
        return XLA_FFI_Error_Code_INVALID_ARGUMENT
    if plan.device >= 0:
        result = enter_device_nogil(plan.device, &pushed)
        if result != 0:
            snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: making cuda:%d's primary context "
                     b"current failed (CUresult %d)", <long long>plan.plan_id, plan.device, result)
            return XLA_FFI_Error_Code_INTERNAL
    plan.launch.entry(cells.args, plan.launch.nargs)
    if plan.device >= 0:
        leave_device_nogil(pushed)
    if cells.result != 0:
        snprintf(message, _MESSAGE_BYTES, b"cudnn_graph plan %lld: the CuTe DSL kernel launch failed: CUDA "
                 b"error %d", <long long>plan.plan_id, <int>cells.result)
        return XLA_FFI_Error_Code_INTERNAL
    return XLA_FFI_Error_Code_OK


cdef int _tensor_index(FfiPlan* plan, int64_t uid) noexcept nogil:
    cdef int i
    for i in range(plan.n_inputs + plan.n_outputs):
        if plan.tensors[i].uid == uid:
            return i
    return -1


cdef XLA_FFI_Error_Code _run_python(int64_t plan_id, XLA_FFI_CallFrame* frame, intptr_t stream,
                                    char* message) noexcept with gil:
    """The Python-engine fallback: execute() with the GIL held (taken on entry, from any XLA thread) on
    XLA's stream (0 for a host plan: XLA has none to give on the host); an exception becomes the FFI
    error."""
    cdef int64_t i
    cdef bytes text
    try:
        arguments = [<uintptr_t>(<XLA_FFI_Buffer*>frame.args.args[i]).data for i in range(frame.args.size)]
        results = [<uintptr_t>(<XLA_FFI_Buffer*>frame.rets.rets[i]).data for i in range(frame.rets.size)]
        entry = _python_plans.get(plan_id)
        graph = None if entry is None else entry.graph()
        if graph is None:
            raise LookupError(f"plan id {plan_id} is not registered (its graph was released)")
        entry.run(graph, arguments, results, stream)
    except BaseException as exc:
        text = f"cudnn_graph plan {plan_id} ({type(exc).__name__}): {exc}".encode("utf-8", "replace")
        strncpy(message, <const char*>text, _MESSAGE_BYTES - 1)
        message[_MESSAGE_BYTES - 1] = 0
        return XLA_FFI_Error_Code_INTERNAL
    return XLA_FFI_Error_Code_OK


# ---- registration (Python) ----------------------------------------------------------------------------

_python_plans = {}          # plan id -> PythonPlan (cudnn_graph._xla_operands)
_keepalive = {}             # plan id -> what keeps a cuDNN entry's pointers valid
_handles = {}               # device -> the Handle FFI launches use
_registration_lock = threading.Lock()


def handler_capsule(command_buffer_compatible: bool = False):
    """The handler as a PyCapsule for ``jax.ffi.register_ffi_target`` (the one reporting the command-buffer
    trait with ``command_buffer_compatible``).

    Example:
        >>> type(handler_capsule()).__name__
        'PyCapsule'
    """
    if command_buffer_compatible:
        return PyCapsule_New(<void*>plan_handler_command_buffer, NULL, NULL)
    return PyCapsule_New(<void*>plan_handler, NULL, NULL)


def set_reported_api_version(int major, int minor) -> None:
    """The XLA FFI API version the handler reports (the framework's own: XLA registers only that one).

    Example:
        >>> set_reported_api_version(0, 3); reported_api_version()
        (0, 3)
    """
    global _reported_major, _reported_minor
    if major != CG_XLA_FFI_API_MAJOR:
        raise FfiRegistrationError(f"the framework's XLA FFI API is {major}.{minor}; cudnn_graph's handler "
                                   f"is written for major version {CG_XLA_FFI_API_MAJOR}")
    _reported_major = major
    _reported_minor = minor


def reported_api_version() -> tuple:
    """(major, minor) the handler reports to XLA."""
    return (_reported_major, _reported_minor)


def header_api_version() -> tuple:
    """(major, minor) of the declarations the handler was compiled against."""
    return (CG_XLA_FFI_API_MAJOR, CG_XLA_FFI_API_MINOR)


def registered_plans() -> tuple:
    """The ids of the plans registered now."""
    return tuple(sorted(int(i) for i in range(1, _table_size) if _table[i] != NULL))


def register_graph(graph, inputs, outputs, *, command_buffer: bool = True) -> PlanRegistration:
    """Register ``graph``'s built plan for the handler; ``inputs`` / ``outputs`` are its Tensors in the
    order of the custom call's arguments and results. The entry goes when the graph is released.

    A cuDNN plan runs in C; a DSL plan with a C launch (CuTe's PackedLaunch) is called from C; any other
    engine's plan runs through the GIL fallback. ``command_buffer``
    (default True) lets a cuDNN plan report the command-buffer trait (XLA may capture it in a CUDA
    graph); Python-engine plans never report it.

    Example (a built host graph ``g`` with inputs ``a``, ``b`` and output ``y``):
        >>> reg = register_graph(g, [a, b], [y])    # doctest: +SKIP
        >>> reg.kind, reg.device                    # doctest: +SKIP
        ('python', -1)
    """
    compiled = graph.compiled_plan()
    if compiled is None:
        raise FfiRegistrationError("the graph has no built plan: build() it before registering")
    inputs, outputs = list(inputs), list(outputs)
    if len(inputs) + len(outputs) > FFI_MAX_TENSORS:
        raise FfiRegistrationError(f"a plan takes at most {FFI_MAX_TENSORS} arguments and results; got "
                                   f"{len(inputs) + len(outputs)}")
    entries = ([tensor_entry(t, "input", i, FFI_MAX_RANK) for i, t in enumerate(inputs)]
               + [tensor_entry(t, "output", i, FFI_MAX_RANK) for i, t in enumerate(outputs)])
    uids = [e[1] for e in entries]
    if len(set(uids)) != len(uids):
        raise FfiRegistrationError("a tensor appears twice among the inputs and outputs")
    for t, (name, *_rest) in zip(outputs, entries[len(inputs):]):
        if t.producer is None:
            raise FfiRegistrationError(f"output tensor '{name}' is not produced by the graph")
    device_type, ordinal = graph.device_code
    device = -1 if device_type == 1 else int(ordinal)
    workspace_size = int(compiled.workspace_size)
    runner = getattr(compiled, "runner", None)
    launch = None if isinstance(runner, PlanRunner) else _c_launch(compiled, set(uids), workspace_size)
    kind = "cudnn" if isinstance(runner, PlanRunner) else "dsl" if launch is not None else "python"
    specs = {s.uid: s for s in compiled.layout.specs}
    given = set(uids)
    cdef FfiPlan* plan = <FfiPlan*>calloc(1, sizeof(FfiPlan))
    if plan == NULL:
        raise MemoryError()
    try:
        plan.kind = {"cudnn": PLAN_KIND_CUDNN, "dsl": PLAN_KIND_DSL}.get(kind, PLAN_KIND_PYTHON)
        plan.device = device
        plan.n_inputs = len(inputs)
        plan.n_outputs = len(outputs)
        plan.workspace_size = workspace_size
        for i, (name, uid, shape, code, *_) in enumerate(entries):
            if uid not in specs:
                raise FfiRegistrationError(f"tensor '{name}' (uid {uid}) is not an operand of the built plan")
            plan.tensors[i].uid = uid
            plan.tensors[i].dtype = code
            plan.tensors[i].rank = len(shape)
            for d, extent in enumerate(shape):
                plan.tensors[i].dims[d] = extent
            plan.tensors[i].packed = True
            raw = name.encode("utf-8", "replace")[:FFI_NAME_BYTES - 1]
            strncpy(plan.tensors[i].name, raw, FFI_NAME_BYTES - 1)
        keep = []
        if kind == "cudnn":
            if device < 0 or device >= _MAX_DEVICES:
                raise FfiRegistrationError(f"a cuDNN plan on device {device} cannot be registered")
            keep.append(runner)
            _fill_cudnn(plan, <PlanRunner>runner, graph, entries, specs, given, keep)
            if device not in _handles:
                from cudnn_graph._cudnn_handle import create_handle
                cudnn_api()
                _handles[device] = create_handle(device)
            keep.append(_handles[device])
            _device_handles[device] = <void*><uintptr_t>int(_handles[device])
            _retain_primary_context(device)
            plan.handle = _device_handles[device]
            command_buffer_ok = bool(command_buffer) and runner.cuda_graph_support is not False
        else:
            missing = [s.name or f"uid {s.uid}" for u, s in specs.items() if u not in given and s.required]
            if missing:
                raise FfiRegistrationError(f"the graph reads or writes tensors the call does not pass: {missing}")
            if kind == "dsl":
                plan.launch = (<PackedLaunch>launch).c_launch()
                keep.append(launch)
                if device >= 0:
                    _retain_primary_context(device)
            # A DSL entry's capture safety is not verified yet: DSL plans report no command-buffer trait.
            command_buffer_ok = False
        plan_id = _insert(plan)
    except BaseException:
        free(plan)
        raise
    if kind in ("cudnn", "dsl"):
        _keepalive[plan_id] = keep
    else:
        _python_plans[plan_id] = PythonPlan(graph, [(e[1], e[5], e[6], e[4]) for e in entries], workspace_size,
                                             device)
    weakref.finalize(graph, _release, plan_id)
    _logger.debug("registered plan %d (%s, workspace %d bytes, device %d) for the XLA FFI handler", plan_id,
                  kind, workspace_size, device)
    return PlanRegistration(plan_id, kind, workspace_size, device, command_buffer_ok,
                            [(e[0], e[1], e[2], e[4]) for e in entries])


def _c_launch(compiled, given: set, int workspace_size):
    """The plan's C launch (a PackedLaunch, from the plan's one-call executor) when the handler can run it
    without the GIL: every operand it reads by address is among the call's buffers, every host scalar
    has the graph's value (XLA passes no host scalars) and no workspace is needed; else None (the GIL
    fallback runs the plan)."""
    if workspace_size != 0:
        return None
    executor = compiled.fast_executor(compiled.layout)
    launch = getattr(executor, "__self__", None)
    if not isinstance(launch, PackedLaunch):
        return None
    if not launch.scalars_have_values or not set(launch.pointer_uids) <= given:
        _logger.debug("no C launch from the XLA handler for %r: a scalar without a value or an operand the "
                      "call does not pass", compiled)
        return None
    return launch


cdef int _retain_primary_context(int device) except -1:
    """Have the driver module retain ``device``'s primary context, so the handler can make it current."""
    cdef bint pushed = False
    enter_device(device, &pushed)
    leave_device(pushed)
    return 0


cdef int _fill_cudnn(FfiPlan* plan, PlanRunner runner, graph, list entries, dict specs, set given,
                     list keep) except -1:
    """The operands a cuDNN plan supplies itself, read from its PlanRunner once."""
    import numpy as np
    from cudnn_graph.data_type import numpy_dtype
    cdef int i, n_fixed = 0
    position = {e[1]: i for i, e in enumerate(entries)}
    omitted = {runner._omit_uids[i] for i in range(runner._n_omit)}
    for i in range(plan.n_inputs + plan.n_outputs):
        plan.tensors[i].packed = plan.tensors[i].uid not in omitted
    plan.plan = runner._plan.ptr
    supplied = set()
    for i in range(runner._n_constants):
        plan.fixed_uids[n_fixed] = runner._constant_uids[i]
        plan.fixed_ptrs[n_fixed] = runner._constant_ptrs[i]
        supplied.add(runner._constant_uids[i])
        n_fixed += 1
    for i in range(runner._n_fixed):
        plan.fixed_uids[n_fixed] = runner._fixed_uids[i]
        plan.fixed_ptrs[n_fixed] = runner._fixed_ptrs[i]
        supplied.add(runner._fixed_uids[i])
        n_fixed += 1
    # Pass-by-value scalars whose value the graph holds (execute() fills them in from the tensor).
    for t in graph.tensors:
        uid = int(t.uid)
        if uid in given or uid in supplied or uid in omitted or uid not in specs:
            continue
        if t.is_pass_by_value and t.value is not None:
            if n_fixed >= FFI_MAX_EXTRA:
                raise FfiRegistrationError(f"the plan supplies more than {FFI_MAX_EXTRA} operands itself")
            array = np.full(specs[uid].shape, t.value, dtype=numpy_dtype(t.data_type))
            keep.append(array)
            plan.fixed_uids[n_fixed] = uid
            plan.fixed_ptrs[n_fixed] = <void*><uintptr_t>array.ctypes.data
            supplied.add(uid)
            n_fixed += 1
    plan.n_fixed = n_fixed
    for i in range(runner._n_aliases):
        source = position.get(runner._alias_sources[i])
        if source is None:
            raise FfiRegistrationError(f"the plan reads uid {runner._alias_views[i]} as a view of uid "
                                       f"{runner._alias_sources[i]}, which the call does not pass")
        plan.alias_uids[i] = runner._alias_views[i]
        plan.alias_sources[i] = source
        plan.alias_offsets[i] = runner._alias_offsets[i]
        supplied.add(runner._alias_views[i])
    plan.n_aliases = runner._n_aliases
    for i in range(runner._n_scratch):
        plan.scratch_uids[i] = runner._scratch_uids[i]
        plan.scratch_offsets[i] = runner._scratch_offsets[i]
        plan.scratch_bytes[i] = runner._scratch_bytes[i]
        plan.scratch_zero[i] = runner._scratch_zero[i]
        supplied.add(runner._scratch_uids[i])
    plan.n_scratch = runner._n_scratch
    missing = [s.name or f"uid {s.uid}" for u, s in specs.items()
               if u not in given and u not in supplied and u not in omitted and s.required]
    if missing:
        raise FfiRegistrationError(f"the graph reads or writes tensors the call does not pass: {missing}")
    return 0


cdef int64_t _insert(FfiPlan* plan) except -1:
    global _table, _table_size, _next_id
    cdef FfiPlan** grown
    cdef int64_t plan_id, size
    with nogil:
        pthread_mutex_lock(&_lock)
    try:
        plan_id = _next_id
        if plan_id >= _table_size:
            size = max(64, 2 * _table_size)
            grown = <FfiPlan**>realloc(_table, size * sizeof(FfiPlan*))
            if grown == NULL:
                raise MemoryError()
            for i in range(_table_size, size):
                grown[i] = NULL
            _table, _table_size = grown, size
        plan.plan_id = plan_id
        _table[plan_id] = plan
        _next_id += 1
    finally:
        pthread_mutex_unlock(&_lock)
    return plan_id


def _release(int64_t plan_id) -> None:
    """Remove a plan from the table (its graph went); a call naming it then fails with NOT_FOUND."""
    cdef FfiPlan* plan = NULL
    cdef CudnnApi* api = loaded_api()
    with nogil:
        pthread_mutex_lock(&_lock)
        if 0 < plan_id < _table_size:
            plan = _table[plan_id]
            _table[plan_id] = NULL
        pthread_mutex_unlock(&_lock)
    if plan != NULL:
        # At interpreter exit descriptors are left to the OS, as everywhere in the package.
        if plan.cached_pack != NULL and api != NULL and not interpreter_finalizing:
            api.cudnnBackendDestroyDescriptor(plan.cached_pack)
        free(plan)
    _python_plans.pop(plan_id, None)
    _keepalive.pop(plan_id, None)


def release_plan(plan_id: int) -> None:
    """Remove plan ``plan_id`` from the table now (it goes with its graph anyway).

    Example:
        >>> release_plan(10**9)     # an id never registered: nothing to do
    """
    _release(plan_id)


# ---- per-device families ---------------------------------------------------------------------------------

def register_family(members, *, bint on_cuda) -> int:
    """Register a family: one registered plan per device, ``members`` mapping a device ordinal (the CUDA
    ordinal with ``on_cuda``, else XLA's host device ordinal) to a plan id. A custom call naming the
    family's id runs the member of the device XLA runs it on (a device without a member is a NOT_FOUND
    error); members stay registered plans of their own. Returns the family's id (released with
    ``release_plan``; releasing it leaves the members).

    A CUDA member must be a plan of that device; a host member a host plan (several host devices may
    share one: host memory is everyone's).

    Example (``p0``, ``p1``: plans registered for cuda:0 and cuda:1):
        >>> family = register_family({0: p0, 1: p1}, on_cuda=True)     # doctest: +SKIP
    """
    members = {int(d): int(p) for d, p in dict(members).items()}
    if not members:
        raise FfiRegistrationError("a plan family needs at least one member")
    cdef FfiPlan* family = <FfiPlan*>calloc(1, sizeof(FfiPlan))
    cdef FfiPlan* member
    if family == NULL:
        raise MemoryError()
    family.kind = PLAN_KIND_FAMILY
    family.device = -1
    family.on_cuda = on_cuda
    where = "cuda:" if on_cuda else "host device "
    try:
        with _registration_lock:
            for device, plan_id in members.items():
                if not 0 <= device < FFI_MAX_DEVICES:
                    raise FfiRegistrationError(f"device ordinal {device} is out of range [0, {FFI_MAX_DEVICES})")
                member = _table[plan_id] if 0 < plan_id < _table_size else NULL
                if member == NULL or member.kind == PLAN_KIND_FAMILY:
                    raise FfiRegistrationError(f"the member for {where}{device} (id {plan_id}) is not a registered "
                                               f"plan")
                wanted = device if on_cuda else -1
                if member.device != wanted:
                    built = f"cuda:{member.device}" if member.device >= 0 else "the host"
                    raise FfiRegistrationError(f"the member for {where}{device} (plan {plan_id}) was built for "
                                               f"{built}: a plan runs only on its own device's buffers")
                family.members[device] = plan_id
            family_id = _insert(family)
    except BaseException:
        free(family)
        raise
    _logger.debug("registered plan family %d: %s", family_id,
                  ", ".join(f"{where}{d} -> plan {p}" for d, p in sorted(members.items())))
    return family_id


def family_members(int64_t family_id) -> dict:
    """{device ordinal: plan id} of a registered family ({} for anything else).

    Example:
        >>> family_members(10**9)
        {}
    """
    cdef FfiPlan* entry = _table[family_id] if 0 < family_id < _table_size else NULL
    if entry == NULL or entry.kind != PLAN_KIND_FAMILY:
        return {}
    return {d: int(entry.members[d]) for d in range(FFI_MAX_DEVICES) if entry.members[d] != 0}


_SOURCE_NAMES = {_SOURCE_NONE: None, _SOURCE_STREAM: "stream", _SOURCE_FRAMEWORK: "framework",
                 _SOURCE_DEFAULT: "default", _SOURCE_OVERRIDE: "override"}


def last_call_device() -> tuple:
    """(device, how) the handler found for the last call that asked: ``how`` is 'stream' (the device whose
    context owns XLA's stream), 'framework' (XLA_FFI_DeviceOrdinal_Get), 'default' (a host call, no such
    entry), 'override' (override_call_device) or None (no call yet).

    Example:
        >>> device, how = last_call_device()
    """
    return (_last_device, _SOURCE_NAMES[_last_device_source])


def calls_by_device() -> dict:
    """{device ordinal: calls the handler resolved for it} since the process started (or reset=True).

    Example:
        >>> isinstance(calls_by_device(), dict)
        True
    """
    return {d: int(_device_calls[d]) for d in range(FFI_MAX_DEVICES) if _device_calls[d] != 0}


def reset_calls_by_device() -> None:
    """Zero the counts calls_by_device() reports."""
    cdef int d
    with nogil:
        pthread_mutex_lock(&_lock)
        for d in range(FFI_MAX_DEVICES):
            _device_calls[d] = 0
        pthread_mutex_unlock(&_lock)


def override_call_device(device) -> None:
    """For tests: the handler takes ``device`` as the device every call runs on (None: ask the stream and
    the framework again). This forges a call's device to pin the refusal of another device's plan and
    the choice of a family's member on machines with one device or none.

    Example:
        >>> override_call_device(None)
    """
    global _device_override
    _device_override = _NO_OVERRIDE if device is None else int(device)


def set_plan_device_for_tests(int64_t plan_id, int device) -> None:
    """For tests: record ``device`` as the device plan ``plan_id`` was built for (a forged plan; the
    handler must refuse it on any other device's call). Never use it on a plan meant to run."""
    cdef FfiPlan* entry = _table[plan_id] if 0 < plan_id < _table_size else NULL
    if entry == NULL or entry.kind == PLAN_KIND_FAMILY:
        raise FfiRegistrationError(f"plan id {plan_id} is not a registered plan")
    entry.device = device
