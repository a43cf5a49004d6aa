"""The execute hot path: the variant-pack cache and CUDA graph replay.

``execute_plan`` builds (or reuses) the variant pack from the operands' C arrays (``Operands``: a
VariantPack's, or arrays a caller filled) and runs ``cudnnBackendExecute`` with the GIL released. The
finalized packs are cached per thread (cudnn_graph._cudnn_handle.ThreadState), keyed by content.

CUDA graph replay (``set_cuda_graph_replay``, ``$CUDNN_GRAPH_CUDA_GRAPHS``): when a plan runs again on
a cached variant pack (same uids, pointers and workspace, on this thread), cuDNN populates a CUDA graph
for it once (cudnnBackendPopulateCudaGraph, cuDNN >= 9.5) and later calls launch that graph on the
caller's stream (cuGraphLaunch) instead of calling cudnnBackendExecute. A graph reads its operands'
memory when it runs, as an execute does; packs holding host (pass-by-value) operands, whose values a
graph would freeze, are never replayed. A plan cuDNN cannot populate (cuDNN 9.19 refuses most of them:
CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API) has its execute recorded instead, by a thread-local
stream capture on a private stream (``set_cuda_graph_capture``, ``$CUDNN_GRAPH_CUDA_GRAPH_CAPTURE``); a
plan neither way works for is marked and executes as before.
"""
from libc.stdint cimport int64_t, intptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memcmp, memset

from cudnn_graph._cudnn_abi cimport *
from cudnn_graph._loader cimport CudnnApi, cudnn_api, loaded_api, raise_status
from cudnn_graph._cudnn_handle cimport (
    ThreadState, VariantPackCacheEntry, VARIANT_PACK_CACHE_ENTRIES, VARIANT_PACK_CACHE_OPERANDS,
    variant_pack_cache_enabled, cuda_graph_capture_on,
)
from cudnn_graph._driver cimport (
    CAPTURING_STREAM, graphs_available, graph_create, graph_instantiate, graph_destroy, graph_exec_destroy,
    graph_launch, device_memory, stream_capturing, capture_available, capture_begin, capture_end, EMPTY_CAPTURE,
)

import logging

from cudnn_graph._driver import result_text as _driver_result_text
from cudnn_graph._loader import error_string as _error_string, get_last_error_string as _last_error_string

_logger = logging.getLogger(__name__)

cdef int _replay_capable = 0           # 0: not yet known; 1: cuDNN can populate and the driver launch; -1: no

cdef enum:
    _STAGE_CREATE = 1
    _STAGE_UIDS = 2
    _STAGE_POINTERS = 3
    _STAGE_WORKSPACE = 4
    _STAGE_FINALIZE = 5
    _STAGE_EXECUTE = 6
    _STAGE_OVERRIDES = 7
    _STAGE_POPULATE = 8
    _STAGE_SET_STREAM = 9

cdef const char* _STAGE_NAMES[10]
_STAGE_NAMES[0] = b"cudnnBackendExecute"
_STAGE_NAMES[1] = b"cudnnBackendCreateDescriptor(VARIANT_PACK)"
_STAGE_NAMES[2] = b"cudnnBackendSetAttribute(VARIANT_PACK_UNIQUE_IDS)"
_STAGE_NAMES[3] = b"cudnnBackendSetAttribute(VARIANT_PACK_DATA_POINTERS)"
_STAGE_NAMES[4] = b"cudnnBackendSetAttribute(VARIANT_PACK_WORKSPACE)"
_STAGE_NAMES[5] = b"cudnnBackendFinalize(VARIANT_PACK)"
_STAGE_NAMES[6] = b"cudnnBackendExecute"
_STAGE_NAMES[7] = b"cudnnBackendSetAttribute(VARIANT_PACK_OVERRIDE_*)"
_STAGE_NAMES[8] = b"cudnnBackendPopulateCudaGraph"
_STAGE_NAMES[9] = b"cudnnSetStream"


cdef const char* stage_name(int stage) noexcept nogil:
    return _STAGE_NAMES[stage]


cdef int build_variant_pack(CudnnApi* api, int n, const int64_t* uids, void* const* ptrs,
                            void* workspace, void** out, int* stage,
                            const OverrideArrays* overrides=NULL) noexcept nogil:
    """A finalized variant pack; on failure the status is returned, ``stage`` says which call."""
    cdef void* vp = NULL
    cdef void* ws = workspace
    cdef int status
    out[0] = NULL
    stage[0] = _STAGE_CREATE
    status = api.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp)
    if status != CUDNN_STATUS_SUCCESS:
        return status
    stage[0] = _STAGE_UIDS
    status = api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids)
    if status == CUDNN_STATUS_SUCCESS:
        stage[0] = _STAGE_POINTERS
        status = api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                              n, ptrs)
    if status == CUDNN_STATUS_SUCCESS:
        stage[0] = _STAGE_WORKSPACE
        status = api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                              1, &ws)
    if status == CUDNN_STATUS_SUCCESS and overrides != NULL:
        stage[0] = _STAGE_OVERRIDES
        status = api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_OVERRIDE_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                              overrides.n, overrides.uids)
        if status == CUDNN_STATUS_SUCCESS:
            status = api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_OVERRIDE_SHAPES,
                                                  CUDNN_TYPE_VOID_PTR, 1, overrides.shapes)
        if status == CUDNN_STATUS_SUCCESS:
            status = api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_OVERRIDE_STRIDES,
                                                  CUDNN_TYPE_VOID_PTR, 1, overrides.strides)
    if status == CUDNN_STATUS_SUCCESS:
        stage[0] = _STAGE_FINALIZE
        status = api.cudnnBackendFinalize(vp)
    if status != CUDNN_STATUS_SUCCESS:
        api.cudnnBackendDestroyDescriptor(vp)
        return status
    out[0] = vp
    return CUDNN_STATUS_SUCCESS


cdef inline int _cached_entry(VariantPackCacheEntry* entries, int n, const int64_t* uids,
                              void* const* ptrs, void* workspace) noexcept nogil:
    """The index of the entry holding these (uids, pointers, workspace), or -1."""
    cdef int i
    cdef VariantPackCacheEntry* e
    for i in range(VARIANT_PACK_CACHE_ENTRIES):
        e = &entries[i]
        if (e.descriptor != NULL and e.count == n and e.workspace == workspace
                and memcmp(e.ptrs, ptrs, n * sizeof(void*)) == 0
                and memcmp(e.uids, uids, n * sizeof(int64_t)) == 0):
            return i
    return -1


cdef int _variant_pack_slot(CudnnApi* api, VariantPackCacheEntry* entries, int* next_victim,
                            int n, const int64_t* uids, void* const* ptrs, void* workspace,
                            int* at, bint* hit, bint* evicted_graph, int* stage) noexcept nogil:
    """The cache slot (``at``) holding a variant pack for these (uids, pointers, workspace), built into
    the oldest slot on a miss. ``evicted_graph`` says the slot's previous entry had a CUDA graph: it is
    destroyed here, and the caller drops the plan reference that kept it valid."""
    cdef int found = _cached_entry(entries, n, uids, ptrs, workspace)
    cdef VariantPackCacheEntry* e
    cdef void* vp = NULL
    cdef int status
    evicted_graph[0] = False
    if found >= 0:
        at[0] = found
        hit[0] = True
        return CUDNN_STATUS_SUCCESS
    hit[0] = False
    status = build_variant_pack(api, n, uids, ptrs, workspace, &vp, stage)
    if status != CUDNN_STATUS_SUCCESS:
        return status
    at[0] = next_victim[0] % VARIANT_PACK_CACHE_ENTRIES
    next_victim[0] = (at[0] + 1) % VARIANT_PACK_CACHE_ENTRIES
    e = &entries[at[0]]
    if e.graph_exec != NULL:
        graph_exec_destroy(e.graph_exec)
        evicted_graph[0] = True
    if e.descriptor != NULL:
        api.cudnnBackendDestroyDescriptor(e.descriptor)
    memset(e, 0, sizeof(VariantPackCacheEntry))
    e.descriptor = vp
    e.workspace = workspace
    e.count = n
    memcpy(e.uids, uids, n * sizeof(int64_t))
    memcpy(e.ptrs, ptrs, n * sizeof(void*))
    return CUDNN_STATUS_SUCCESS


# What the execute path does with a cached variant pack.
cdef enum:
    _RUN_EXECUTE = 0          # cudnnBackendExecute
    _RUN_LAUNCHED = 1         # its CUDA graph was launched: done
    _RUN_BUILD_GRAPH = 2      # the plan repeated on it: populate a graph, then launch it
    _RUN_LAUNCH_FAILED = 3    # cuGraphLaunch failed: drop the graph, execute instead


cdef inline int _replay_action(VariantPackCacheEntry* e, void* plan, GraphReplay* replay,
                               int* launch_result) noexcept nogil:
    if e.graph_plan == plan:
        launch_result[0] = graph_launch(e.graph_exec, replay.stream)
        if launch_result[0] == 0:
            return _RUN_LAUNCHED
        # A capturing stream records the ordinary execute, as it would without replay.
        return _RUN_EXECUTE if launch_result[0] == CAPTURING_STREAM else _RUN_LAUNCH_FAILED
    if e.last_plan == plan and not e.no_graph and replay.plan_support[0] >= 0 and _replay_capable >= 0:
        return _RUN_BUILD_GRAPH
    return _RUN_EXECUTE


cdef int execute_plan(void* handle, void* plan, const Operands* operands, void* workspace,
                      const int64_t* extra_uids, void* const* extra_ptrs, int n_extra,
                      ThreadState state, const OverrideArrays* overrides=NULL,
                      GraphReplay* replay=NULL) except -1:
    return execute_operands(handle, plan, operands.n, operands.uids, operands.ptrs, workspace, extra_uids,
                             extra_ptrs, n_extra, state, overrides, replay)


cdef int execute_operands(void* handle, void* plan, int n, const int64_t* uids, void* const* ptrs,
                          void* workspace, const int64_t* extra_uids, void* const* extra_ptrs, int n_extra,
                          ThreadState state, const OverrideArrays* overrides,
                          GraphReplay* replay=NULL) except -1:
    cdef CudnnApi* api = loaded_api()
    if api == NULL:
        api = cudnn_api()
    cdef int total = n + n_extra
    # Small merged arrays live on the stack; only oversized packs touch the heap.
    cdef int64_t merged_uids[VARIANT_PACK_CACHE_OPERANDS]
    cdef void* merged_ptrs[VARIANT_PACK_CACHE_OPERANDS]
    cdef int64_t* heap_uids = NULL
    cdef void** heap_ptrs = NULL
    cdef int64_t* dst_uids
    cdef void** dst_ptrs
    cdef VariantPackCacheEntry* entries = NULL
    cdef VariantPackCacheEntry* e
    cdef int* next_victim = NULL
    cdef void* vp = NULL
    cdef int status = CUDNN_STATUS_SUCCESS, stage = 0, at = -1, action = _RUN_EXECUTE, launch_result = 0
    cdef bint hit = False, evicted_graph = False
    if n_extra > 0:
        if total <= VARIANT_PACK_CACHE_OPERANDS:
            dst_uids, dst_ptrs = merged_uids, merged_ptrs
        else:
            heap_uids = <int64_t*>malloc(total * sizeof(int64_t))
            heap_ptrs = <void**>malloc(total * sizeof(void*))
            if heap_uids == NULL or heap_ptrs == NULL:
                free(heap_uids)
                free(heap_ptrs)
                raise MemoryError()
            dst_uids, dst_ptrs = heap_uids, heap_ptrs
        memcpy(dst_uids, uids, n * sizeof(int64_t))
        memcpy(dst_ptrs, ptrs, n * sizeof(void*))
        memcpy(dst_uids + n, extra_uids, n_extra * sizeof(int64_t))
        memcpy(dst_ptrs + n, extra_ptrs, n_extra * sizeof(void*))
        uids, ptrs = dst_uids, dst_ptrs
    if state is not None and variant_pack_cache_enabled and total <= VARIANT_PACK_CACHE_OPERANDS and overrides == NULL:
        entries = state._entries
        next_victim = &state._next_victim
    with nogil:
        if entries != NULL:
            status = _variant_pack_slot(api, entries, next_victim, total, uids, ptrs, workspace, &at, &hit,
                                        &evicted_graph, &stage)
            if status == CUDNN_STATUS_SUCCESS:
                e = &entries[at]
                vp = e.descriptor
                if hit and replay != NULL:
                    action = _replay_action(e, plan, replay, &launch_result)
                e.last_plan = plan
        else:
            status = build_variant_pack(api, total, uids, ptrs, workspace, &vp, &stage, overrides)
        if status == CUDNN_STATUS_SUCCESS and action == _RUN_EXECUTE:
            stage = _STAGE_EXECUTE
            status = api.cudnnBackendExecute(handle, plan, vp)
        if entries == NULL and vp != NULL:
            api.cudnnBackendDestroyDescriptor(vp)
    free(heap_uids)
    free(heap_ptrs)
    if evicted_graph:
        state._graph_plans[at] = None    # its graph is gone: the plan may go too
    if action == _RUN_BUILD_GRAPH or action == _RUN_LAUNCH_FAILED:
        if action == _RUN_LAUNCH_FAILED:
            _logger.debug("cuGraphLaunch failed (%s); this variant pack executes without a graph from now on",
                          _driver_result_text(launch_result))
            state._drop_graph(at)
            entries[at].no_graph = True
        elif _graph_for_entry(state, at, handle, plan, n, replay) == _RUN_LAUNCHED:
            return 0
        with nogil:
            stage = _STAGE_EXECUTE
            status = api.cudnnBackendExecute(handle, plan, vp)
    if status != CUDNN_STATUS_SUCCESS:
        return raise_status(status, _STAGE_NAMES[stage])
    return 0


cdef bint _check_replay_capable(CudnnApi* api) noexcept nogil:
    global _replay_capable
    if _replay_capable == 0:
        _replay_capable = 1 if graphs_available() else -1
    return _replay_capable > 0 and (api.cudnnBackendPopulateCudaGraph != NULL or _capture_allowed())


cdef inline bint _capture_allowed() noexcept nogil:
    return cuda_graph_capture_on and capture_available()


cdef bint capture_allowed() noexcept nogil:
    return _capture_allowed()


cdef int record_graph(CudnnApi* api, void* handle, void* plan, void* vp, intptr_t stream, int* method,
                      void** graph_exec, int* status, int* stage) noexcept nogil:
    """Make an executable CUDA graph of one execute of ``plan`` on ``vp``, launchable on ``stream``.

    cuDNN populates it, unless ``method`` already says this plan needs a capture; when it cannot (or
    has no populate call), the execute is captured from a private stream with ``handle`` bound to it,
    then ``handle`` is bound to ``stream`` again. ``method`` becomes the one that worked (GRAPH_*);
    ``status`` and ``stage`` the first failed cuDNN call. Returns 0 or the failed CUresult (or
    EMPTY_CAPTURE when a capture recorded no work: nothing ran on the handle's stream).
    """
    cdef void* graph = NULL
    cdef intptr_t private = 0
    cdef int result = 0, restored
    graph_exec[0] = NULL
    status[0] = CUDNN_STATUS_SUCCESS
    if method[0] != GRAPH_BY_CAPTURE and api.cudnnBackendPopulateCudaGraph != NULL:
        result = graph_create(&graph)
        if result == 0:
            stage[0] = _STAGE_POPULATE
            status[0] = api.cudnnBackendPopulateCudaGraph(handle, plan, vp, graph)
            if status[0] == CUDNN_STATUS_SUCCESS:
                result = graph_instantiate(graph_exec, graph)
            graph_destroy(graph)
            graph = NULL
        if result == 0 and status[0] == CUDNN_STATUS_SUCCESS:
            method[0] = GRAPH_BY_POPULATE
            return 0
        if result != 0 or not _capture_allowed():
            method[0] = GRAPH_NONE
            return result
    elif not _capture_allowed():
        method[0] = GRAPH_NONE
        return 0
    # cuDNN refused to populate (or cannot): record its execute instead. The populate failure is not
    # reported: the capture's outcome is.
    status[0] = CUDNN_STATUS_SUCCESS
    result = capture_begin(&private)
    if result != 0:
        method[0] = GRAPH_NONE
        return result
    stage[0] = _STAGE_SET_STREAM
    status[0] = api.cudnnSetStream(handle, <void*>private)
    if status[0] == CUDNN_STATUS_SUCCESS:
        stage[0] = _STAGE_EXECUTE
        status[0] = api.cudnnBackendExecute(handle, plan, vp)
    result = capture_end(private, &graph)
    # The handle must not stay bound to the private stream, which is gone now.
    restored = api.cudnnSetStream(handle, <void*>stream)
    if restored != CUDNN_STATUS_SUCCESS:
        graph_destroy(graph)
        method[0] = GRAPH_NONE
        stage[0] = _STAGE_SET_STREAM
        status[0] = restored
        return 0
    if status[0] == CUDNN_STATUS_SUCCESS and result == 0:
        result = graph_instantiate(graph_exec, graph)
    graph_destroy(graph)
    method[0] = GRAPH_BY_CAPTURE if (status[0] == CUDNN_STATUS_SUCCESS and result == 0) else GRAPH_NONE
    return result


cdef int _graph_for_entry(ThreadState state, int at, void* handle, void* plan, int n_caller,
                          GraphReplay* replay) except -1:
    """Record (populate or capture), instantiate and launch a CUDA graph for cache entry ``at`` (cold:
    once per entry).

    Returns _RUN_LAUNCHED, or _RUN_EXECUTE when the caller must execute instead: the pack reads host
    memory (the entry is marked), no graph can be recorded for this plan (the plan is marked), or the
    stream is being captured.
    """
    cdef CudnnApi* api = loaded_api()
    cdef VariantPackCacheEntry* e = &state._entries[at]
    cdef void* graph_exec = NULL
    cdef int result = 0, status = CUDNN_STATUS_SUCCESS, i
    if api == NULL or not _check_replay_capable(api):
        return _RUN_EXECUTE
    # By-value operands are read from host memory when an execute is issued; a graph would freeze
    # the values of its population. Only the caller's operands can be host memory the caller changes:
    # the plan's own constants never change, and views / scratch point into device memory.
    for i in range(n_caller):
        if not device_memory(e.ptrs[i]):
            e.no_graph = True
            _logger.debug("uid %d is not device memory (a by-value operand?): this variant pack is not "
                          "replayed as a CUDA graph", e.uids[i])
            return _RUN_EXECUTE
    if stream_capturing(replay.stream):
        return _RUN_EXECUTE        # not now: the capture records the execute; a later repeat builds
    if e.graph_exec != NULL:
        state._drop_graph(at)      # another plan's graph: this one repeats now
    cdef int method = replay.plan_support[0], stage = 0
    with nogil:
        result = record_graph(api, handle, plan, e.descriptor, replay.stream, &method, &graph_exec, &status,
                               &stage)
    replay.plan_support[0] = method
    if method == GRAPH_NONE:
        detail = _last_error_string() if status != CUDNN_STATUS_SUCCESS else ""   # read (and so cleared)
        if stage == _STAGE_SET_STREAM and status != CUDNN_STATUS_SUCCESS:
            # Only a failed rebinding gets here: the handle may still name the capture's stream.
            raise_status(status, _STAGE_NAMES[stage])
        if status != CUDNN_STATUS_SUCCESS:
            _logger.debug("%s failed (%s%s); this plan executes without CUDA graphs",
                          _STAGE_NAMES[stage].decode(), _error_string(status), f": {detail}" if detail else "")
        else:
            _logger.debug("recording a CUDA graph failed (%s); this plan executes without CUDA graphs",
                          "the capture recorded no work" if result == EMPTY_CAPTURE
                          else _driver_result_text(result))
        return _RUN_EXECUTE
    e.graph_exec = graph_exec
    e.graph_plan = plan
    state._graph_plans[at] = <object>replay.plan_owner
    with nogil:
        result = graph_launch(graph_exec, replay.stream)
    if result == 0:
        return _RUN_LAUNCHED
    if result != CAPTURING_STREAM:
        _logger.debug("cuGraphLaunch failed (%s); this variant pack executes without a graph from now on",
                      _driver_result_text(result))
        state._drop_graph(at)
        e.no_graph = True
    return _RUN_EXECUTE
