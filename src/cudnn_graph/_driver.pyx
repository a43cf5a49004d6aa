"""The few CUDA driver calls cudnn_graph needs, resolved from libcuda at first use.

The DLPack boundary asks where a pointer lives; the cuDNN backend makes a device's primary context
current (handle creation) and allocates cached workspaces. Nothing here links against CUDA:
libcuda.so.1 is dlopen'ed when first needed, and a machine without a driver simply reports
"no driver" (CPU machines, CI).
"""
import atexit
import sys

from libc.stdint cimport int32_t, intptr_t, uintptr_t
from libc.stdlib cimport malloc, free
from cudnn_graph._dlpack cimport kDLCUDA, kDLCUDAHost, kDLCUDAManaged

from cudnn_graph.errors import CudaDriverError, DeviceMemoryError

cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flag)
    void* dlsym(void* handle, const char* symbol)
    int RTLD_NOW
    int RTLD_LOCAL

# CUpointer_attribute and CUmemorytype values (CUDA driver API facts).
cdef enum:
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
    CU_MEMORYTYPE_HOST = 1
    CU_MEMORYTYPE_DEVICE = 2

ctypedef int (*cuInit_t)(unsigned int) noexcept nogil
ctypedef int (*cuPointerGetAttribute_t)(void* data, int attribute, uintptr_t ptr) noexcept nogil

ctypedef int (*cuDeviceGetCount_t)(int* count) noexcept nogil
ctypedef int (*cuDeviceGetName_t)(char* name, int length, int device) noexcept nogil
ctypedef int (*cuDeviceGetAttribute_t)(int* value, int attribute, int device) noexcept nogil
ctypedef int (*cuDriverGetVersion_t)(int* version) noexcept nogil

# Contexts and memory. The _v2 symbols are the 64-bit entry points cuda.h maps the plain names to.
ctypedef int (*cuDeviceGet_t)(int* device, int ordinal) noexcept nogil
ctypedef int (*cuDevicePrimaryCtxRetain_t)(void** context, int device) noexcept nogil
ctypedef int (*cuCtxGetCurrent_t)(void** context) noexcept nogil
ctypedef int (*cuCtxSetCurrent_t)(void* context) noexcept nogil
ctypedef int (*cuCtxPushCurrent_t)(void* context) noexcept nogil
ctypedef int (*cuCtxPopCurrent_t)(void** context) noexcept nogil
ctypedef int (*cuMemAlloc_t)(uintptr_t* address, size_t nbytes) noexcept nogil
ctypedef int (*cuMemFree_t)(uintptr_t address) noexcept nogil
ctypedef int (*cuGetErrorName_t)(int error, const char** name) noexcept nogil
ctypedef int (*cuMemsetD8Async_t)(uintptr_t dst, unsigned char value, size_t n, void* stream) noexcept nogil
ctypedef int (*cuMemcpyHtoD_t)(uintptr_t dst, const void* src, size_t nbytes) noexcept nogil

# CUDA graphs: CUgraph and CUgraphExec are opaque pointers (the runtime's cudaGraph_t is the same
# handle, which is what cuDNN's populate call takes).
ctypedef int (*cuGraphCreate_t)(void** graph, unsigned int flags) noexcept nogil
ctypedef int (*cuGraphInstantiateWithFlags_t)(void** graph_exec, void* graph,
                                              unsigned long long flags) noexcept nogil
ctypedef int (*cuGraphDestroy_t)(void* graph) noexcept nogil
ctypedef int (*cuGraphExecDestroy_t)(void* graph_exec) noexcept nogil
ctypedef int (*cuGraphLaunch_t)(void* graph_exec, void* stream) noexcept nogil
ctypedef int (*cuStreamIsCapturing_t)(void* stream, int* status) noexcept nogil
# Stream capture: the graph of an execute cuDNN cannot populate natively is recorded from a private stream.
ctypedef int (*cuStreamCreate_t)(void** stream, unsigned int flags) noexcept nogil
ctypedef int (*cuStreamDestroy_t)(void* stream) noexcept nogil
ctypedef int (*cuStreamBeginCapture_t)(void* stream, int mode) noexcept nogil
ctypedef int (*cuStreamEndCapture_t)(void* stream, void** graph) noexcept nogil
ctypedef int (*cuGraphGetNodes_t)(void* graph, void** nodes, size_t* count) noexcept nogil

cdef enum:
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
    CU_STREAM_NON_BLOCKING = 1
    # Thread-local: a call this thread may not make while capturing (a synchronous copy, a sync) fails
    # the capture instead of running outside the graph.
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1

cdef cuPointerGetAttribute_t _get_attribute = NULL
cdef cuDeviceGetCount_t _device_count = NULL
cdef cuDeviceGetName_t _device_name = NULL
cdef cuDeviceGetAttribute_t _device_attribute = NULL
cdef cuDriverGetVersion_t _driver_version = NULL
cdef cuDeviceGet_t _device_get = NULL
cdef cuDevicePrimaryCtxRetain_t _primary_ctx_retain = NULL
cdef cuCtxGetCurrent_t _ctx_get_current = NULL
cdef cuCtxSetCurrent_t _ctx_set_current = NULL
cdef cuCtxPushCurrent_t _ctx_push = NULL
cdef cuCtxPopCurrent_t _ctx_pop = NULL
cdef cuMemAlloc_t _mem_alloc = NULL
cdef cuMemFree_t _mem_free = NULL
cdef cuGetErrorName_t _error_name = NULL
cdef cuMemsetD8Async_t _memset_async = NULL
cdef cuMemcpyHtoD_t _copy_to_device = NULL
cdef cuGraphCreate_t _graph_create = NULL
cdef cuGraphInstantiateWithFlags_t _graph_instantiate = NULL
cdef cuGraphDestroy_t _graph_destroy = NULL
cdef cuGraphExecDestroy_t _graph_exec_destroy = NULL
cdef cuGraphLaunch_t _graph_launch = NULL
cdef cuStreamIsCapturing_t _stream_is_capturing = NULL
cdef cuStreamCreate_t _stream_create = NULL
cdef cuStreamDestroy_t _stream_destroy = NULL
cdef cuStreamBeginCapture_t _begin_capture = NULL
cdef cuStreamEndCapture_t _end_capture = NULL
cdef cuGraphGetNodes_t _graph_nodes = NULL
cdef int _load_state = 0   # 0: not tried, 1: loaded, -1: no driver

cdef enum:
    _MAX_PRIMARY_CONTEXTS = 64
ctypedef int (*cuStreamGetCtx_t)(void* stream, void** context) noexcept nogil
ctypedef int (*cuCtxGetDevice_t)(int* device) noexcept nogil
cdef cuStreamGetCtx_t _stream_get_ctx = NULL
cdef cuCtxGetDevice_t _ctx_get_device = NULL
cdef void* _primary_contexts[_MAX_PRIMARY_CONTEXTS]   # retained once per device, never released
cdef bint _finalizing = False                          # set at interpreter exit: frees are skipped


cdef int _load() noexcept nogil:
    global _get_attribute, _load_state, _device_count, _device_name, _device_attribute, _driver_version
    global _device_get, _primary_ctx_retain, _ctx_get_current, _ctx_set_current, _ctx_push, _ctx_pop
    global _mem_alloc, _mem_free, _error_name, _stream_get_ctx, _ctx_get_device, _memset_async, _copy_to_device
    global _graph_create, _graph_instantiate, _graph_destroy, _graph_exec_destroy, _graph_launch
    global _stream_is_capturing, _stream_create, _stream_destroy, _begin_capture, _end_capture, _graph_nodes
    if _load_state != 0:
        return _load_state
    cdef void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)
    if lib == NULL:
        _load_state = -1
        return _load_state
    cdef cuInit_t init = <cuInit_t>dlsym(lib, "cuInit")
    _get_attribute = <cuPointerGetAttribute_t>dlsym(lib, "cuPointerGetAttribute")
    _device_count = <cuDeviceGetCount_t>dlsym(lib, "cuDeviceGetCount")
    _device_name = <cuDeviceGetName_t>dlsym(lib, "cuDeviceGetName")
    _device_attribute = <cuDeviceGetAttribute_t>dlsym(lib, "cuDeviceGetAttribute")
    _driver_version = <cuDriverGetVersion_t>dlsym(lib, "cuDriverGetVersion")
    _device_get = <cuDeviceGet_t>dlsym(lib, "cuDeviceGet")
    _primary_ctx_retain = <cuDevicePrimaryCtxRetain_t>dlsym(lib, "cuDevicePrimaryCtxRetain")
    _ctx_get_current = <cuCtxGetCurrent_t>dlsym(lib, "cuCtxGetCurrent")
    _ctx_set_current = <cuCtxSetCurrent_t>dlsym(lib, "cuCtxSetCurrent")
    _ctx_push = <cuCtxPushCurrent_t>dlsym(lib, "cuCtxPushCurrent_v2")
    _ctx_pop = <cuCtxPopCurrent_t>dlsym(lib, "cuCtxPopCurrent_v2")
    _mem_alloc = <cuMemAlloc_t>dlsym(lib, "cuMemAlloc_v2")
    _mem_free = <cuMemFree_t>dlsym(lib, "cuMemFree_v2")
    _error_name = <cuGetErrorName_t>dlsym(lib, "cuGetErrorName")
    _memset_async = <cuMemsetD8Async_t>dlsym(lib, "cuMemsetD8Async")
    _copy_to_device = <cuMemcpyHtoD_t>dlsym(lib, "cuMemcpyHtoD_v2")
    _stream_get_ctx = <cuStreamGetCtx_t>dlsym(lib, "cuStreamGetCtx")
    _ctx_get_device = <cuCtxGetDevice_t>dlsym(lib, "cuCtxGetDevice")
    # The plain names are the legacy-default-stream entry points (stream 0 means the legacy stream, as
    # it does for cudnnSetStream); cuGraphInstantiateWithFlags is what cuda.h maps cuGraphInstantiate to.
    _graph_create = <cuGraphCreate_t>dlsym(lib, "cuGraphCreate")
    _graph_instantiate = <cuGraphInstantiateWithFlags_t>dlsym(lib, "cuGraphInstantiateWithFlags")
    _graph_destroy = <cuGraphDestroy_t>dlsym(lib, "cuGraphDestroy")
    _graph_exec_destroy = <cuGraphExecDestroy_t>dlsym(lib, "cuGraphExecDestroy")
    _graph_launch = <cuGraphLaunch_t>dlsym(lib, "cuGraphLaunch")
    _stream_is_capturing = <cuStreamIsCapturing_t>dlsym(lib, "cuStreamIsCapturing")
    _stream_create = <cuStreamCreate_t>dlsym(lib, "cuStreamCreate")
    _stream_destroy = <cuStreamDestroy_t>dlsym(lib, "cuStreamDestroy_v2")
    _begin_capture = <cuStreamBeginCapture_t>dlsym(lib, "cuStreamBeginCapture_v2")
    _end_capture = <cuStreamEndCapture_t>dlsym(lib, "cuStreamEndCapture")
    _graph_nodes = <cuGraphGetNodes_t>dlsym(lib, "cuGraphGetNodes")
    # The context calls run unchecked on hot paths: a driver without them is treated as no driver.
    if init == NULL or _get_attribute == NULL or _ctx_get_current == NULL or _ctx_set_current == NULL \
            or _ctx_push == NULL or _ctx_pop == NULL or init(0) != 0:
        _load_state = -1
    else:
        _load_state = 1
    return _load_state


cdef int pointer_device(intptr_t ptr, int32_t* device_type, int32_t* ordinal) except -1:
    """Where a CUDA-array-interface pointer lives; (kDLCUDA, 0) when no driver can tell."""
    cdef int memory_type = 0, is_managed = 0, dev = 0
    device_type[0] = kDLCUDA
    ordinal[0] = 0
    if ptr == 0 or _load() != 1:
        return 0
    with nogil:
        if _get_attribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, <uintptr_t>ptr) != 0:
            return 0   # not memory the driver knows (e.g. plain host memory): keep the default
        _get_attribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, <uintptr_t>ptr)
        _get_attribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, <uintptr_t>ptr)
    if is_managed:
        device_type[0] = kDLCUDAManaged
    elif memory_type == CU_MEMORYTYPE_HOST:
        device_type[0] = kDLCUDAHost
    ordinal[0] = dev
    return 0


def driver_available() -> bool:
    """True when libcuda loaded and initialised."""
    return _load() == 1


def device_count() -> int:
    """CUDA devices the driver sees (0 without a driver)."""
    cdef int n = 0
    if _load() != 1 or _device_count == NULL or _device_count(&n) != 0:
        return 0
    return n


def device_info(int ordinal) -> dict:
    """Name and compute capability of one device."""
    cdef char name[256]
    cdef int major = 0, minor = 0
    if _load() != 1:
        raise RuntimeError(f"CUDA device {ordinal} is not available: no CUDA driver")
    if _device_name == NULL or _device_attribute == NULL:
        raise RuntimeError(f"CUDA device {ordinal} cannot be queried: the driver lacks cuDeviceGetName / "
                           "cuDeviceGetAttribute")
    if _device_name(name, 256, ordinal) != 0:
        raise RuntimeError(f"CUDA device {ordinal} is not available")
    _device_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal)
    _device_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal)
    return {"ordinal": ordinal, "name": name.decode(errors="replace"), "compute_capability": (major, minor)}


def driver_version() -> int:
    """The driver's CUDA version as an int (e.g. 13000), 0 without a driver."""
    cdef int v = 0
    if _load() != 1 or _driver_version == NULL or _driver_version(&v) != 0:
        return 0
    return v


# ---- contexts and device memory (cold paths: handle creation, cached workspaces) ------------------

cdef str _result_text(int result):
    cdef const char* name = NULL
    if _error_name != NULL and _error_name(result, &name) == 0 and name != NULL:
        return f"{name.decode()} ({result})"
    return f"CUresult {result}"


cdef int _require_driver(const char* what) except -1:
    if _load() != 1:
        raise CudaDriverError(f"{what.decode()}: no CUDA driver is available")
    return 0


cdef int _primary_context(int device, void** context) except -1:
    """The primary context of ``device``, retained once for the life of the process."""
    cdef int dev = 0, result
    _require_driver(b"primary context")
    if device < 0 or device >= _MAX_PRIMARY_CONTEXTS:
        raise ValueError(f"CUDA device ordinal {device} is out of range")
    if _primary_contexts[device] == NULL:
        if _device_get == NULL or _primary_ctx_retain == NULL:
            raise RuntimeError("the CUDA driver lacks cuDeviceGet / cuDevicePrimaryCtxRetain")
        result = _device_get(&dev, device)
        if result != 0:
            raise CudaDriverError(f"cuDeviceGet({device}) failed: {_result_text(result)}")
        result = _primary_ctx_retain(&_primary_contexts[device], dev)
        if result != 0:
            raise CudaDriverError(f"cuDevicePrimaryCtxRetain({device}) failed: {_result_text(result)}")
    context[0] = _primary_contexts[device]
    return 0


cdef int enter_device(int device, bint* pushed) except -1:
    """Make ``device``'s primary context current on this thread, as cudaSetDevice would.

    A thread with no current context keeps the primary context afterwards (the CUDA runtime inside
    cuDNN then finds the device it was created for); a thread with another context current gets
    this one pushed, and ``leave_device`` pops it again.
    """
    cdef void* wanted = NULL
    cdef void* current = NULL
    cdef int result
    pushed[0] = False
    # Every execute comes here: when the device's context is already known and current, that is
    # one driver call and a compare.
    if (_load_state == 1 and 0 <= device < _MAX_PRIMARY_CONTEXTS and _primary_contexts[device] != NULL
            and _ctx_get_current != NULL and _ctx_get_current(&current) == 0
            and current == _primary_contexts[device]):
        return 0
    if _load() != 1:
        return 0    # no driver: nothing can be made current (cuDNN reports its own error if used)
    _primary_context(device, &wanted)
    if _ctx_get_current == NULL or _ctx_get_current(&current) != 0:
        current = NULL
    if current == wanted:
        return 0
    if current == NULL:
        result = _ctx_set_current(wanted)
        if result != 0:
            raise CudaDriverError(f"cuCtxSetCurrent(device {device}) failed: {_result_text(result)}")
        return 0
    result = _ctx_push(wanted)
    if result != 0:
        raise CudaDriverError(f"cuCtxPushCurrent(device {device}) failed: {_result_text(result)}")
    pushed[0] = True
    return 0


cdef int leave_device(bint pushed) except -1:
    cdef void* popped = NULL
    if pushed:
        _ctx_pop(&popped)
    return 0


cdef int enter_device_nogil(int device, bint* pushed) noexcept nogil:
    """enter_device for callers without the GIL (the XLA FFI handler); see the declaration."""
    cdef void* current = NULL
    cdef int result
    pushed[0] = False
    if (_load_state != 1 or not 0 <= device < _MAX_PRIMARY_CONTEXTS or _primary_contexts[device] == NULL
            or _ctx_get_current == NULL):
        return -1
    if _ctx_get_current(&current) != 0:
        current = NULL
    if current == _primary_contexts[device]:
        return 0
    if current == NULL:
        return _ctx_set_current(_primary_contexts[device])
    result = _ctx_push(_primary_contexts[device])
    pushed[0] = result == 0
    return result


cdef void leave_device_nogil(bint pushed) noexcept nogil:
    cdef void* popped = NULL
    if pushed:
        _ctx_pop(&popped)


cdef int stream_device(intptr_t stream) except -2:
    """The ordinal of the device whose context owns ``stream`` (-1: a special handle, or unknown)."""
    cdef void* context = NULL
    cdef void* popped = NULL
    cdef int device = -1
    if stream == 0 or stream == 1 or stream == 2 or _load() != 1:
        return -1
    if _stream_get_ctx == NULL or _ctx_get_device == NULL or _stream_get_ctx(<void*>stream, &context) != 0:
        return -1
    if _ctx_push(context) != 0:
        return -1
    if _ctx_get_device(&device) != 0:
        device = -1
    _ctx_pop(&popped)
    return device


cdef int stream_device_nogil(intptr_t stream) noexcept nogil:
    """stream_device for callers without the GIL; see the declaration."""
    cdef void* context = NULL
    cdef void* popped = NULL
    cdef int device = -1, d
    if stream == 0 or stream == 1 or stream == 2 or _load_state != 1 or _stream_get_ctx == NULL:
        return -1
    if _stream_get_ctx(<void*>stream, &context) != 0 or context == NULL:
        return -1
    for d in range(_MAX_PRIMARY_CONTEXTS):
        if _primary_contexts[d] == context:
            return d
    if _ctx_get_device == NULL or _ctx_push(context) != 0:
        return -1
    if _ctx_get_device(&device) != 0:
        device = -1
    _ctx_pop(&popped)
    return device


cdef uintptr_t device_alloc(size_t nbytes, int device) except 0:
    """cuMemAlloc on ``device`` (its primary context); raises DeviceMemoryError (a MemoryError) when the
    device is full."""
    cdef uintptr_t address = 0
    cdef bint pushed = False
    cdef int result
    _require_driver(b"device allocation")
    if _mem_alloc == NULL:
        raise RuntimeError("libcuda has no cuMemAlloc_v2")
    if nbytes == 0:
        raise ValueError("device_alloc: size 0")
    enter_device(device, &pushed)
    try:
        with nogil:
            result = _mem_alloc(&address, nbytes)
    finally:
        leave_device(pushed)
    if result != 0 or address == 0:
        raise DeviceMemoryError(f"cuMemAlloc({nbytes} bytes) on CUDA device {device} failed: {_result_text(result)}")
    return address


cdef int device_free(uintptr_t address, int device) noexcept:
    """cuMemFree; skipped at interpreter exit (the driver reclaims everything then)."""
    cdef void* wanted = NULL
    cdef void* popped = NULL
    cdef bint pushed = False
    if address == 0 or _finalizing or _load_state != 1:
        return 0
    # The allocation's context must be current: push it (cheap) rather than assume it is.
    if 0 <= device < _MAX_PRIMARY_CONTEXTS and _primary_contexts[device] != NULL:
        wanted = _primary_contexts[device]
        pushed = _ctx_push(wanted) == 0
    with nogil:
        _mem_free(address)
        if pushed:
            _ctx_pop(&popped)
    return 0


cdef int zero_async(uintptr_t address, size_t nbytes, intptr_t stream) except -1:
    """Queue a zero fill of ``nbytes`` at ``address`` on ``stream`` (the current context's device)."""
    cdef int result
    _require_driver(b"device memset")
    if _memset_async == NULL:
        raise RuntimeError("libcuda has no cuMemsetD8Async")
    with nogil:
        result = _memset_async(address, 0, nbytes, <void*>stream)
    if result != 0:
        raise CudaDriverError(f"cuMemsetD8Async({nbytes} bytes) failed: {_result_text(result)}")
    return 0


cdef int zero_async_nogil(uintptr_t address, size_t nbytes, intptr_t stream) noexcept nogil:
    """zero_async without the GIL (the XLA FFI handler): 0 or the failed CUresult, -1 without the entry."""
    if _load() != 1 or _memset_async == NULL:
        return -1
    return _memset_async(address, 0, nbytes, <void*>stream)


# ---- CUDA graphs (the cuDNN backend replays a plan's populated graph when its operands repeat) ----------

cdef bint graphs_available() noexcept nogil:
    """True when the driver loaded and exports every graph entry point used here."""
    return (_load() == 1 and _graph_create != NULL and _graph_instantiate != NULL and _graph_destroy != NULL
            and _graph_exec_destroy != NULL and _graph_launch != NULL and _stream_is_capturing != NULL)


cdef int graph_create(void** graph) noexcept nogil:
    graph[0] = NULL
    if not graphs_available():
        return -1
    return _graph_create(graph, 0)


cdef int graph_instantiate(void** graph_exec, void* graph) noexcept nogil:
    graph_exec[0] = NULL
    if not graphs_available():
        return -1
    return _graph_instantiate(graph_exec, graph, 0)


cdef int graph_destroy(void* graph) noexcept nogil:
    if graph == NULL or _finalizing or _graph_destroy == NULL:
        return 0
    return _graph_destroy(graph)


cdef int graph_exec_destroy(void* graph_exec) noexcept nogil:
    if graph_exec == NULL or _finalizing or _graph_exec_destroy == NULL:
        return 0
    return _graph_exec_destroy(graph_exec)


cdef bint stream_capturing(intptr_t stream) noexcept nogil:
    """True when ``stream`` is being captured, or when the driver cannot say (e.g. the legacy stream
    while another thread captures): either way a graph launch or instantiation must wait."""
    cdef int capture = 0
    if _stream_is_capturing == NULL or _stream_is_capturing(<void*>stream, &capture) != 0:
        return True
    return capture != 0


cdef int graph_launch(void* graph_exec, intptr_t stream) noexcept nogil:
    """cuGraphLaunch on ``stream`` unless stream_capturing(stream).

    A capturing stream gets the caller's ordinary launch path instead, so that a capture records the
    same work it would without replay. Returns 0 when launched, CAPTURING_STREAM when refused, else
    the CUresult of cuGraphLaunch.
    """
    if stream_capturing(stream):
        return CAPTURING_STREAM
    return _graph_launch(graph_exec, <void*>stream)


cdef bint capture_available() noexcept nogil:
    """True when graphs are available and the driver exports the stream-capture entry points."""
    return (graphs_available() and _stream_create != NULL and _stream_destroy != NULL and _begin_capture != NULL
            and _end_capture != NULL and _graph_nodes != NULL)


cdef int capture_begin(intptr_t* stream) noexcept nogil:
    """Create a private non-blocking stream on the current context and begin a thread-local capture on
    it. Returns 0 (``stream`` set) or the failed CUresult (nothing left behind)."""
    cdef void* s = NULL
    cdef int result
    stream[0] = 0
    if not capture_available():
        return -1
    result = _stream_create(&s, CU_STREAM_NON_BLOCKING)
    if result != 0:
        return result
    result = _begin_capture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    if result != 0:
        _stream_destroy(s)
        return result
    stream[0] = <intptr_t>s
    return 0


cdef int capture_end(intptr_t stream, void** graph) noexcept nogil:
    """End capture_begin's capture and destroy its stream. Returns 0 with ``graph`` holding the recorded
    work, EMPTY_CAPTURE when nothing was recorded (no graph), or the failed CUresult (no graph)."""
    cdef size_t nodes = 0
    cdef int result
    graph[0] = NULL
    result = _end_capture(<void*>stream, graph)
    _stream_destroy(<void*>stream)
    if result != 0:
        graph_destroy(graph[0])
        graph[0] = NULL
        return result
    result = _graph_nodes(graph[0], NULL, &nodes)
    if result != 0 or nodes == 0:
        graph_destroy(graph[0])
        graph[0] = NULL
        return result if result != 0 else EMPTY_CAPTURE
    return 0


cdef bint device_memory(const void* ptr) noexcept nogil:
    """True for memory the driver reports as device memory (host and unknown pointers are not)."""
    cdef int memory_type = 0
    if ptr == NULL or _load() != 1:
        return False
    if _get_attribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, <uintptr_t>ptr) != 0:
        return False
    return memory_type == CU_MEMORYTYPE_DEVICE


def result_text(int result) -> str:
    """A CUresult as ``NAME (code)`` when the driver can name it."""
    return _result_text(result)


def copy_to_device(DeviceAllocation destination, source) -> None:
    """Copy the bytes of a host buffer (anything exposing the buffer protocol) to the start of
    ``destination``, synchronously."""
    cdef const unsigned char[::1] data = memoryview(source).cast("B")
    cdef bint pushed = False
    cdef int result
    if <size_t>data.shape[0] > destination.nbytes:
        raise ValueError(f"copy_to_device: {data.shape[0]} bytes do not fit in {destination.nbytes}")
    if data.shape[0] == 0:
        return
    _require_driver(b"host-to-device copy")
    if _copy_to_device == NULL:
        raise RuntimeError("libcuda has no cuMemcpyHtoD_v2")
    enter_device(destination.device, &pushed)
    try:
        with nogil:
            result = _copy_to_device(destination.ptr, &data[0], data.shape[0])
    finally:
        leave_device(pushed)
    if result != 0:
        raise CudaDriverError(f"cuMemcpyHtoD({data.shape[0]} bytes) failed: {_result_text(result)}")


cdef class DeviceAllocation:
    """Device memory from cuMemAlloc, freed (cuMemFree) when the object goes away.

    Example (on a machine with a GPU):
        >>> buf = DeviceAllocation(1 << 20)      # doctest: +SKIP
        >>> buf.ptr != 0, buf.nbytes             # doctest: +SKIP
        (True, 1048576)
    """

    def __cinit__(self, size_t nbytes, int device=0):
        self.ptr = 0
        self.nbytes = nbytes
        self.device = device
        self.ptr = device_alloc(nbytes, device)

    def __dealloc__(self):
        if self.ptr != 0:
            device_free(self.ptr, self.device)
            self.ptr = 0

    def __int__(self):
        return self.ptr

    def __repr__(self):
        return f"DeviceAllocation(ptr=0x{self.ptr:x}, nbytes={self.nbytes}, device={self.device})"


def is_finalizing() -> bool:
    return _finalizing or sys.is_finalizing()


cdef bint finalizing() noexcept nogil:
    return _finalizing


def _mark_finalizing():
    global _finalizing
    _finalizing = True


atexit.register(_mark_finalizing)


# ---- device synchronisation: an OwnedBuffer handed to a consumer that reads on a stream of its own ------

ctypedef int (*cuCtxSynchronize_t)() noexcept nogil
cdef cuCtxSynchronize_t _ctx_synchronize = NULL


def device_synchronize(int device) -> None:
    """Wait on the host until every stream of ``device``'s primary context has finished its work.

    The consumer handshake of a buffer whose writer's stream is not known (``OwnedBuffer.__dlpack__``),
    off any hot path.
    """
    global _ctx_synchronize
    cdef bint pushed = False
    cdef int result
    _require_driver(b"device synchronisation")
    if _ctx_synchronize == NULL:
        _ctx_synchronize = <cuCtxSynchronize_t>dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL),
                                                     "cuCtxSynchronize")
        if _ctx_synchronize == NULL:
            raise CudaDriverError("libcuda has no cuCtxSynchronize")
    enter_device(device, &pushed)
    try:
        with nogil:
            result = _ctx_synchronize()
    finally:
        leave_device(pushed)
    if result != 0:
        raise CudaDriverError(f"cuCtxSynchronize(device {device}) failed: {_result_text(result)}")


# ---- caller-owned CUDA graphs and event timing (populate_cuda_graph / update_cuda_graph, autotune) -------
# Cold paths, called from Python with handles as ints. The symbols are resolved on first use; a driver
# without one raises CudaDriverError naming it.

ctypedef int (*cuGraphAddChildGraphNode_t)(void** node, void* graph, const void** deps, size_t n_deps,
                                           void* child) noexcept nogil
ctypedef int (*cuGraphGetRootNodes_t)(void* graph, void** nodes, size_t* count) noexcept nogil
ctypedef int (*cuGraphNodeGetType_t)(void* node, int* kind) noexcept nogil
ctypedef int (*cuGraphChildGraphNodeGetGraph_t)(void* node, void** graph) noexcept nogil
ctypedef int (*cuGraphDestroyNode_t)(void* node) noexcept nogil
ctypedef struct CUgraphExecUpdateResultInfo:    # cuGraphExecUpdate_v2's report (CUDA >= 12.0)
    int result
    void* errorNode
    void* errorFromNode
ctypedef int (*cuGraphExecUpdate_t)(void* graph_exec, void* graph, CUgraphExecUpdateResultInfo* info) noexcept nogil
ctypedef int (*cuEventCreate_t)(void** event, unsigned int flags) noexcept nogil
ctypedef int (*cuEventRecord_t)(void* event, void* stream) noexcept nogil
ctypedef int (*cuEventSynchronize_t)(void* event) noexcept nogil
ctypedef int (*cuEventElapsedTime_t)(float* ms, void* start, void* end) noexcept nogil
ctypedef int (*cuEventDestroy_t)(void* event) noexcept nogil

cdef enum:
    CU_GRAPH_NODE_TYPE_GRAPH = 4        # CUgraphNodeType of a child-graph node

cdef dict _late_symbols = {}


cdef void* late_symbol(str name, tuple spellings) except NULL:
    """The driver entry point ``name`` (the first of ``spellings`` libcuda exports), resolved once."""
    cdef void* found
    cached = _late_symbols.get(name)
    if cached is not None:
        return <void*><uintptr_t>cached
    _require_driver(b"CUDA graph / event call")
    cdef void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)
    for spelling in spellings:
        found = dlsym(lib, (<str>spelling).encode()) if lib != NULL else NULL
        if found != NULL:
            _late_symbols[name] = <uintptr_t>found
            return found
    raise CudaDriverError(f"libcuda has no {name}")


cdef int _checked(int result, str call) except -1:
    if result != 0:
        raise CudaDriverError(f"{call} failed: {_result_text(result)}")
    return 0


def graph_new() -> int:
    """cuGraphCreate: a new, empty CUDA graph (its handle as an int); free it with graph_free."""
    cdef void* graph = NULL
    _checked(graph_create(&graph), "cuGraphCreate")
    return <uintptr_t>graph


def graph_free(uintptr_t graph) -> None:
    """cuGraphDestroy (0 is ignored)."""
    graph_destroy(<void*>graph)


def graph_node_count(uintptr_t graph) -> int:
    """How many nodes a CUDA graph holds (cuGraphGetNodes)."""
    cdef size_t n = 0
    _require_driver(b"cuGraphGetNodes")
    if _graph_nodes == NULL:
        raise CudaDriverError("libcuda has no cuGraphGetNodes")
    _checked(_graph_nodes(<void*>graph, NULL, &n), "cuGraphGetNodes")
    return n


def graph_root_nodes(uintptr_t graph) -> list:
    """The root nodes of a CUDA graph, as ints (cuGraphGetRootNodes)."""
    cdef cuGraphGetRootNodes_t roots = <cuGraphGetRootNodes_t>late_symbol("cuGraphGetRootNodes",
                                                                           ("cuGraphGetRootNodes",))
    cdef size_t n = 0, i
    _checked(roots(<void*>graph, NULL, &n), "cuGraphGetRootNodes")
    if n == 0:
        return []
    cdef void** nodes = <void**>malloc(n * sizeof(void*))
    if nodes == NULL:
        raise MemoryError()
    try:
        _checked(roots(<void*>graph, nodes, &n), "cuGraphGetRootNodes")
        return [<uintptr_t>nodes[i] for i in range(n)]
    finally:
        free(nodes)


def graph_node_is_child_graph(uintptr_t node) -> bool:
    """Whether a node is a child-graph node (cuGraphNodeGetType == CU_GRAPH_NODE_TYPE_GRAPH)."""
    cdef cuGraphNodeGetType_t get_type = <cuGraphNodeGetType_t>late_symbol("cuGraphNodeGetType",
                                                                            ("cuGraphNodeGetType",))
    cdef int kind = -1
    _checked(get_type(<void*>node, &kind), "cuGraphNodeGetType")
    return kind == CU_GRAPH_NODE_TYPE_GRAPH


def graph_add_child(uintptr_t parent, uintptr_t child) -> int:
    """cuGraphAddChildGraphNode: a root node of ``parent`` running a copy of ``child``; returns the node."""
    cdef cuGraphAddChildGraphNode_t add = <cuGraphAddChildGraphNode_t>late_symbol(
        "cuGraphAddChildGraphNode", ("cuGraphAddChildGraphNode",))
    cdef void* node = NULL
    _checked(add(&node, <void*>parent, NULL, 0, <void*>child), "cuGraphAddChildGraphNode")
    return <uintptr_t>node


def graph_child_of(uintptr_t node) -> int:
    """The graph a child-graph node embeds (cuGraphChildGraphNodeGetGraph: not a copy; the node owns it)."""
    cdef cuGraphChildGraphNodeGetGraph_t get = <cuGraphChildGraphNodeGetGraph_t>late_symbol(
        "cuGraphChildGraphNodeGetGraph", ("cuGraphChildGraphNodeGetGraph",))
    cdef void* graph = NULL
    _checked(get(<void*>node, &graph), "cuGraphChildGraphNodeGetGraph")
    return <uintptr_t>graph


def graph_remove_node(uintptr_t node) -> None:
    """cuGraphDestroyNode."""
    cdef cuGraphDestroyNode_t destroy = <cuGraphDestroyNode_t>late_symbol("cuGraphDestroyNode",
                                                                           ("cuGraphDestroyNode",))
    _checked(destroy(<void*>node), "cuGraphDestroyNode")


def graph_exec_new(uintptr_t graph) -> int:
    """cuGraphInstantiate: an executable graph of ``graph`` (free it with graph_exec_free)."""
    cdef void* graph_exec = NULL
    _checked(graph_instantiate(&graph_exec, <void*>graph), "cuGraphInstantiate")
    return <uintptr_t>graph_exec


def graph_exec_free(uintptr_t graph_exec) -> None:
    """cuGraphExecDestroy (0 is ignored)."""
    graph_exec_destroy(<void*>graph_exec)


def graph_exec_launch(uintptr_t graph_exec, intptr_t stream=0) -> None:
    """cuGraphLaunch on ``stream`` (0: the legacy default stream)."""
    if not graphs_available():
        raise CudaDriverError("cuGraphLaunch: the CUDA driver has no graph support")
    cdef int result
    with nogil:
        result = _graph_launch(<void*>graph_exec, <void*>stream)
    _checked(result, "cuGraphLaunch")


def graph_exec_update(uintptr_t graph_exec, uintptr_t graph) -> bool:
    """cuGraphExecUpdate: give ``graph_exec`` the parameters of ``graph`` (same topology); False when the
    driver refuses the update (instantiate ``graph`` again then)."""
    cdef cuGraphExecUpdate_t update = <cuGraphExecUpdate_t>late_symbol("cuGraphExecUpdate",
                                                                        ("cuGraphExecUpdate_v2",))
    cdef CUgraphExecUpdateResultInfo info
    return update(<void*>graph_exec, <void*>graph, &info) == 0


def capture_start() -> int:
    """Begin a thread-local capture on a new private stream; returns the stream (end it with capture_finish)."""
    cdef intptr_t stream = 0
    if not capture_available():
        raise CudaDriverError("stream capture: the CUDA driver lacks the capture entry points")
    _checked(capture_begin(&stream), "cuStreamBeginCapture")
    return stream


def capture_finish(intptr_t stream) -> int:
    """End capture_start's capture (its stream is destroyed); returns the recorded graph (graph_free it).
    Raises CudaDriverError when the capture failed or recorded nothing."""
    cdef void* graph = NULL
    cdef int result = capture_end(stream, &graph)
    if result == EMPTY_CAPTURE:
        raise CudaDriverError("the stream capture recorded no work (did the execute run on another stream?)")
    _checked(result, "cuStreamEndCapture")
    return <uintptr_t>graph


cdef class TimingEvents:
    """Two CUDA events that time the work queued on a stream between ``start`` and ``stop``.

    Example (on a machine with a GPU):
        >>> events = TimingEvents()                 # doctest: +SKIP
        >>> events.start(0); launch(); events.stop(0)   # doctest: +SKIP
        >>> events.elapsed_ms()                     # doctest: +SKIP
        0.0123
    """
    cdef void* _start
    cdef void* _stop

    def __cinit__(self):
        self._start = NULL
        self._stop = NULL
        cdef cuEventCreate_t create = <cuEventCreate_t>late_symbol("cuEventCreate", ("cuEventCreate",))
        _checked(create(&self._start, 0), "cuEventCreate")
        _checked(create(&self._stop, 0), "cuEventCreate")

    def start(self, intptr_t stream=0) -> None:
        cdef cuEventRecord_t record = <cuEventRecord_t>late_symbol("cuEventRecord", ("cuEventRecord",))
        _checked(record(self._start, <void*>stream), "cuEventRecord")

    def stop(self, intptr_t stream=0) -> None:
        cdef cuEventRecord_t record = <cuEventRecord_t>late_symbol("cuEventRecord", ("cuEventRecord",))
        _checked(record(self._stop, <void*>stream), "cuEventRecord")

    def elapsed_ms(self) -> float:
        """Milliseconds between the two recorded events, once ``stop``'s work has finished (waits for it)."""
        cdef cuEventSynchronize_t sync = <cuEventSynchronize_t>late_symbol("cuEventSynchronize",
                                                                            ("cuEventSynchronize",))
        cdef cuEventElapsedTime_t elapsed = <cuEventElapsedTime_t>late_symbol(
            "cuEventElapsedTime", ("cuEventElapsedTime_v2", "cuEventElapsedTime"))
        cdef float ms = 0
        cdef int result
        with nogil:
            result = sync(self._stop)
        _checked(result, "cuEventSynchronize")
        _checked(elapsed(&ms, self._start, self._stop), "cuEventElapsedTime")
        return ms

    def __dealloc__(self):
        cdef cuEventDestroy_t destroy
        if _finalizing or (self._start == NULL and self._stop == NULL):
            return
        cached = _late_symbols.get("cuEventDestroy")
        if cached is None:
            try:
                late_symbol("cuEventDestroy", ("cuEventDestroy_v2",))
            except Exception:       # noqa: BLE001  (nothing to raise to from a destructor)
                return
            cached = _late_symbols["cuEventDestroy"]
        destroy = <cuEventDestroy_t><uintptr_t>cached
        if self._start != NULL:
            destroy(self._start)
        if self._stop != NULL:
            destroy(self._stop)


# ---- cubins loaded as libraries, their kernels launched from C (the cuTile launch path) -----------------
# cuLibraryLoadData loads a cubin once for every context (each gets it at its first use); the CUkernel
# handle launches on the current context's copy (cuLaunchKernel takes a CUkernel where a CUfunction goes).

ctypedef int (*cuLibraryLoadData_t)(void** library, const void* code, void* jit_options, void** jit_values,
                                    unsigned int n_jit, void* lib_options, void** lib_values,
                                    unsigned int n_lib) noexcept nogil
ctypedef int (*cuLibraryGetKernel_t)(void** kernel, void* library, const char* name) noexcept nogil
ctypedef int (*cuLibraryUnload_t)(void* library) noexcept nogil
ctypedef int (*cuLaunchKernel_t)(void* function, unsigned int gx, unsigned int gy, unsigned int gz,
                                 unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared_bytes,
                                 void* stream, void** params, void** extra) noexcept nogil
cdef cuLaunchKernel_t _launch_kernel = NULL


cdef int tile_launch(void* function, const unsigned int* grid, const unsigned int* block, unsigned int shared_bytes,
                     intptr_t stream, void** params) noexcept nogil:
    # A tile kernel's launch has one thread per block and no dynamic shared memory (the driver sizes the
    # block from the cubin), as cuda.tile's own launch issues it; a CuTe DSL kernel in the same plan
    # gives its block and dynamic shared memory.
    if _launch_kernel == NULL:
        return -1
    return _launch_kernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_bytes,
                          <void*>stream, params, NULL)


def library_load(bytes cubin, int device=0) -> int:
    """cuLibraryLoadData of ``cubin`` (made with ``device``'s primary context current); returns the
    CUlibrary as an int (library_unload frees it)."""
    global _launch_kernel
    cdef cuLibraryLoadData_t load = <cuLibraryLoadData_t>late_symbol("cuLibraryLoadData", ("cuLibraryLoadData",))
    if _launch_kernel == NULL:
        _launch_kernel = <cuLaunchKernel_t>late_symbol("cuLaunchKernel", ("cuLaunchKernel",))
    cdef void* library = NULL
    cdef const char* code = cubin
    cdef bint pushed = False
    cdef int result
    enter_device(device, &pushed)
    try:
        with nogil:
            result = load(&library, code, NULL, NULL, 0, NULL, NULL, 0)
    finally:
        leave_device(pushed)
    _checked(result, "cuLibraryLoadData")
    return <uintptr_t>library


def library_kernel(uintptr_t library, str name) -> int:
    """cuLibraryGetKernel: the CUkernel ``name`` of a loaded library, as an int."""
    cdef cuLibraryGetKernel_t get = <cuLibraryGetKernel_t>late_symbol("cuLibraryGetKernel", ("cuLibraryGetKernel",))
    cdef void* kernel = NULL
    _checked(get(&kernel, <void*>library, name.encode()), f"cuLibraryGetKernel({name})")
    return <uintptr_t>kernel


# The dynamic shared memory a launch may ask for without kernel_allow_shared, and the most a block may opt in
# to on sm_80 / sm_90 / sm_100 (227 KB; a device's own limit is checked where the opt-in is set). CUDA facts.
SHARED_BYTES_WITHOUT_OPT_IN = 48 * 1024
SHARED_BYTES_OPT_IN_MAX = 227 * 1024

# CUfunction_attribute: the dynamic shared memory a launch may ask for (SHARED_BYTES_WITHOUT_OPT_IN unless raised)
cdef enum:
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

ctypedef int (*cuKernelSetAttribute_t)(int attribute, int value, void* kernel, int device) noexcept nogil


def kernel_allow_shared(uintptr_t kernel, int shared_bytes, int device=0) -> None:
    """Let launches of the CUkernel ``kernel`` on ``device`` ask for ``shared_bytes`` of dynamic shared memory
    (cuKernelSetAttribute; launches past 48 KB fail without it; nothing to do at or below that). Over the
    device's opt-in limit (227 KB on sm_90): CudaDriverError naming both."""
    cdef int dev = 0, limit = 0
    if shared_bytes <= SHARED_BYTES_WITHOUT_OPT_IN:
        return
    _require_driver(b"kernel shared memory")
    cdef cuKernelSetAttribute_t set_attribute = <cuKernelSetAttribute_t>late_symbol(
        "cuKernelSetAttribute", ("cuKernelSetAttribute",))
    _checked(_device_get(&dev, device), f"cuDeviceGet({device})")
    _checked(_device_attribute(&limit, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
             "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)")
    if shared_bytes > limit:
        raise CudaDriverError(f"a kernel asks for {shared_bytes} bytes of dynamic shared memory; CUDA device "
                              f"{device} allows at most {limit} a block")
    _checked(set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes, <void*>kernel, dev),
             f"cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, {shared_bytes})")


def library_unload(uintptr_t library) -> None:
    """cuLibraryUnload (0, and any call at interpreter exit, does nothing)."""
    if library == 0 or _finalizing:
        return
    cdef cuLibraryUnload_t unload = <cuLibraryUnload_t>late_symbol("cuLibraryUnload", ("cuLibraryUnload",))
    unload(<void*>library)
