"""Host-time floors for benchmarks: what one execute or one graph launch costs from C.

``c_runtime_execute_ns`` times the C runtime's cg_execute (libcudnn_graph_rt) from the same kind of
loop, so bench/c_api.py compares it with its floor in one process, on one context and one set of buffers.
``execute_floor_ns`` times cudnnBackendExecute issued from a nogil C loop on a pack's operands;
``execute_graph_floor_ns`` times cuGraphLaunch of the plan's recorded CUDA graph. They are the
floors the runtime's execute path is measured against (bench/host_overhead.py, bench/sdpa.py). The
runtime never imports this module.
"""
from libc.stdint cimport int64_t, intptr_t, uintptr_t
from libc.stdlib cimport malloc, free

from cudnn_graph._cudnn_abi cimport CUDNN_STATUS_SUCCESS
from cudnn_graph._loader cimport CudnnApi, cudnn_api, check
from cudnn_graph._variant_pack cimport VariantPack
from cudnn_graph._stream cimport stream_handle
from cudnn_graph._driver cimport enter_device, leave_device, graphs_available, graph_exec_destroy, graph_launch, EMPTY_CAPTURE
from cudnn_graph._cudnn_handle cimport Handle, ThreadState, thread_state
from cudnn_graph._graph_replay cimport (
    Operands, GRAPH_NONE, build_variant_pack, record_graph, capture_allowed, stage_name,
)
from cudnn_graph._plan_runner cimport PlanRunner, operands_as_executed
from cudnn_graph._dsl_launch cimport LaunchCells, PackedLaunch, dsl_entry_t
from cudnn_graph._tile_launch cimport TileLaunch, TileKernel, TILE_MAX_OPERANDS, TILE_MAX_PARAMS, TILE_MAX_PARAM_BYTES
from cudnn_graph._driver cimport tile_launch

from cudnn_graph._driver import result_text as _driver_result_text
from cudnn_graph.errors import CudaDriverError

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clock_id, timespec* tp)
    int CLOCK_MONOTONIC


cdef inline double _now_ns() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec * 1e9 + t.tv_nsec


def execute_floor_ns(PlanRunner runner, VariantPack pack, int iterations, *, bint reuse_variant_pack=True,
                     stream=None) -> float:
    """Host nanoseconds per cudnnBackendExecute issued from a nogil C loop on this pack: the C floor.

    ``reuse_variant_pack`` builds the variant pack once (what the cache achieves); otherwise each
    iteration builds, finalizes and destroys one, as an uncached execute does.
    """
    cdef ThreadState state = thread_state()
    cdef Handle h = state.handle_for(runner.device)
    cdef CudnnApi* api = cudnn_api()
    cdef void* ws = runner._workspace_pointer(None, h._stream)
    cdef void* vp = NULL
    cdef void* plan = runner._plan.ptr
    cdef int status = 0, stage = 0, i
    cdef double start, stop
    cdef Operands operands
    operands.n, operands.uids, operands.ptrs = pack._n, pack._uids, pack._ptrs
    if stream is not None:
        h.bind_stream(stream_handle(stream))
    if iterations <= 0:
        raise ValueError("iterations must be positive")
    cdef int64_t* uids = NULL
    cdef void** ptrs = NULL
    cdef int n = operands_as_executed(runner, &operands, ws, &uids, &ptrs)
    with nogil:
        if reuse_variant_pack:
            status = build_variant_pack(api, n, uids, ptrs, ws, &vp, &stage)
        start = _now_ns()
        for i in range(iterations):
            if status != CUDNN_STATUS_SUCCESS:
                break
            if not reuse_variant_pack:
                status = build_variant_pack(api, n, uids, ptrs, ws, &vp, &stage)
                if status != CUDNN_STATUS_SUCCESS:
                    break
            status = api.cudnnBackendExecute(h.ptr, plan, vp)
            if not reuse_variant_pack:
                api.cudnnBackendDestroyDescriptor(vp)
                vp = NULL
        stop = _now_ns()
        if vp != NULL:
            api.cudnnBackendDestroyDescriptor(vp)
    free(uids)
    free(ptrs)
    check(status, b"execute_floor_ns")
    return (stop - start) / iterations


def execute_graph_floor_ns(PlanRunner runner, VariantPack pack, int iterations, *, stream=None) -> float:
    """Host nanoseconds per cuGraphLaunch of this plan's CUDA graph on this pack, from a nogil C loop:
    the floor of graph replay, next to execute_floor_ns's cudnnBackendExecute floor.

    The graph is recorded as replay records it (cuDNN's populate, else a captured execute) and
    instantiated once, outside the timing; each iteration is the launch a replayed execute issues (a
    capture check and cuGraphLaunch). Raises CudnnStatusError when cuDNN fails to record this plan,
    RuntimeError without graph support or when no graph could be recorded.

    Example (on a machine with cuDNN >= 9.5 and a GPU):
        >>> ns = execute_graph_floor_ns(runner, pack, 100)        # doctest: +SKIP
    """
    cdef ThreadState state = thread_state()
    cdef Handle h = state.handle_for(runner.device)
    cdef CudnnApi* api = cudnn_api()
    cdef intptr_t stream_ptr
    cdef void* ws
    cdef void* vp = NULL
    cdef void* graph_exec = NULL
    cdef void* plan = runner._plan.ptr
    cdef int status = 0, stage = 0, result = 0, i, n, method = runner._graph_support
    cdef bint pushed = False
    cdef double start = 0, stop = 0
    cdef Operands operands
    operands.n, operands.uids, operands.ptrs = pack._n, pack._uids, pack._ptrs
    if iterations <= 0:
        raise ValueError("iterations must be positive")
    if api.cudnnBackendPopulateCudaGraph == NULL and not capture_allowed():
        raise RuntimeError(f"cuDNN {api.version} has no cudnnBackendPopulateCudaGraph (it needs >= 9.5) and "
                           f"stream capture is off or unavailable")
    if not graphs_available():
        raise RuntimeError("the CUDA driver lacks the graph entry points (cuGraphCreate, cuGraphLaunch, ...)")
    if stream is not None:
        h.bind_stream(stream_handle(stream))
    stream_ptr = h._stream
    ws = runner._workspace_pointer(None, stream_ptr)
    cdef int64_t* uids = NULL
    cdef void** ptrs = NULL
    n = operands_as_executed(runner, &operands, ws, &uids, &ptrs)
    try:
        enter_device(runner.device, &pushed)
    except BaseException:
        free(uids)
        free(ptrs)
        raise
    try:
        with nogil:
            status = build_variant_pack(api, n, uids, ptrs, ws, &vp, &stage)
            if status == CUDNN_STATUS_SUCCESS:
                result = record_graph(api, h.ptr, plan, vp, stream_ptr, &method, &graph_exec, &status, &stage)
            if status == CUDNN_STATUS_SUCCESS and result == 0 and graph_exec != NULL:
                result = graph_launch(graph_exec, stream_ptr)     # the first launch uploads the graph
                start = _now_ns()
                for i in range(iterations):
                    if result != 0:
                        break
                    result = graph_launch(graph_exec, stream_ptr)
                stop = _now_ns()
            graph_exec_destroy(graph_exec)
            if vp != NULL:
                api.cudnnBackendDestroyDescriptor(vp)
    finally:
        leave_device(pushed)
        free(uids)
        free(ptrs)
    check(status, stage_name(stage))
    if result == EMPTY_CAPTURE:
        raise RuntimeError("execute_graph_floor_ns: the captured execute recorded no work")
    if result != 0:
        raise RuntimeError(f"execute_graph_floor_ns: a CUDA graph call failed: {_driver_result_text(result)}")
    if method == GRAPH_NONE:
        raise RuntimeError("execute_graph_floor_ns: no CUDA graph could be recorded for this plan")
    return (stop - start) / iterations


def dsl_entry_floor_ns(PackedLaunch launch, mapping, int iterations, *, stream=None) -> float:
    """Host nanoseconds per call of a DSL plan's compiled host entry (its TMA encodes and the kernel
    launch) from a nogil C loop, the arguments packed once: the C floor of a CuTe plan's execute."""
    cdef LaunchCells cells
    cdef dsl_entry_t entry = launch.entry()
    cdef int nargs = launch.nargs()
    cdef double start, stop
    cdef int i
    keepalive = launch.fill(mapping, stream, &cells)
    with nogil:
        start = _now_ns()
        for i in range(iterations):
            entry(cells.args, nargs)
        stop = _now_ns()
    del keepalive
    if cells.result != 0:
        raise CudaDriverError(f"the DSL kernel launch failed: CUDA error {cells.result}")
    return (stop - start) / iterations


def tile_launch_floor_ns(TileLaunch launch, mapping, int iterations, *, stream=None) -> float:
    """Host nanoseconds per run of a cuTile plan's launches (cuLaunchKernel per kernel, in order) from a
    nogil C loop, every parameter buffer built once: the C floor of a cuTile plan's execute."""
    cdef uintptr_t addresses[TILE_MAX_OPERANDS]
    cdef intptr_t s = 0
    cdef uintptr_t ws
    cdef int n = launch.n_kernels()
    cdef int i, k, result = 0
    cdef bint pushed = False
    cdef double start, stop
    cdef TileKernel* kern
    keepalive = launch.fill(mapping, stream, addresses, &s)
    ws = launch.workspace_for(s)
    cdef unsigned char* buffers = <unsigned char*>malloc(n * TILE_MAX_PARAM_BYTES)
    cdef void** params = <void**>malloc(n * TILE_MAX_PARAMS * sizeof(void*))
    if buffers == NULL or params == NULL:
        free(buffers)
        free(params)
        raise MemoryError()
    try:
        for k in range(n):
            launch.patch(k, addresses, ws, buffers + k * TILE_MAX_PARAM_BYTES, params + k * TILE_MAX_PARAMS)
        enter_device(launch._ordinal, &pushed)
        try:
            with nogil:
                start = _now_ns()
                for i in range(iterations):
                    for k in range(n):
                        kern = launch.kernel(k)
                        result = tile_launch(kern.function, kern.grid, kern.block, kern.shared_bytes, s,
                                             params + k * TILE_MAX_PARAMS)
                        if result != 0:
                            break
                    if result != 0:
                        break
                stop = _now_ns()
        finally:
            leave_device(pushed)
    finally:
        free(buffers)
        free(params)
    del keepalive
    if result != 0:
        raise CudaDriverError(f"a cuTile kernel launch failed: {_driver_result_text(result)}")
    return (stop - start) / iterations


ctypedef int (*cg_execute_t)(void* plan, void* stream, int count, const int64_t* uids, void* const* pointers,
                             void* workspace) noexcept nogil


def c_runtime_execute_ns(uintptr_t execute, uintptr_t plan, operands, uintptr_t workspace, int iterations, *,
                         stream=None) -> tuple:
    """Host nanoseconds per cg_execute of a loaded C-runtime plan from a nogil C loop, and the last status.

    ``execute`` is the address of libcudnn_graph_rt's cg_execute and ``plan`` a cg_plan_t from its
    cg_plan_load (bench/c_api.py gets both through ctypes); ``operands`` is a list of (uid, address) pairs,
    the arrays built once as a serving loop holds them. Returns ``(ns, status)``: a nonzero status stopped
    the loop at that call (the runtime's cg_last_error says why, on this thread).

    Example (on a machine with a GPU and a plan loaded through ctypes):
        >>> ns, status = c_runtime_execute_ns(execute, plan, [(1, a), (2, b), (3, c)], 0, 200)  # doctest: +SKIP
    """
    cdef int n = len(operands), i, status = 0
    cdef cg_execute_t call = <cg_execute_t>execute
    cdef intptr_t s = stream_handle(stream)
    cdef double start, stop
    if iterations <= 0:
        raise ValueError("iterations must be positive")
    if execute == 0 or plan == 0:
        raise ValueError("c_runtime_execute_ns needs cg_execute's address and a loaded plan")
    cdef int64_t* uids = <int64_t*>malloc((n if n else 1) * sizeof(int64_t))
    cdef void** ptrs = <void**>malloc((n if n else 1) * sizeof(void*))
    if uids == NULL or ptrs == NULL:
        free(uids)
        free(ptrs)
        raise MemoryError()
    for i, (uid, address) in enumerate(operands):
        uids[i] = uid
        ptrs[i] = <void*><uintptr_t>address
    with nogil:
        start = _now_ns()
        for i in range(iterations):
            status = call(<void*>plan, <void*>s, n, uids, ptrs, <void*>workspace)
            if status != 0:
                break
        stop = _now_ns()
    free(uids)
    free(ptrs)
    return (stop - start) / iterations, status
