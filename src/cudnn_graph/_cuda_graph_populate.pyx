"""cudnnBackendPopulateCudaGraph / cudnnBackendUpdateCudaGraph (cuDNN >= 9.5) on a built cuDNN plan.

``record_plan_graph`` gives cuDNN the plan and a variant pack holding the operands exactly as an
execute passes them (the caller's, less the ones no operation reads, plus what the plan supplies
itself: constants, views, scratch carved from ``workspace``), and lets it fill ``graph`` (populate: an
empty graph) or point the graph it filled at the new operands (update). The caller's CUDA graph gets
the result as a child-graph node (cudnn_graph._cuda_graphs); the runtime's own replay of repeated
executes lives in cudnn_graph._graph_replay.
"""
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport free

from cudnn_graph._cudnn_abi cimport CUDNN_STATUS_SUCCESS, CUDNN_STATUS_NOT_SUPPORTED
from cudnn_graph._loader cimport CudnnApi, cudnn_api, check
from cudnn_graph._variant_pack cimport VariantPack
from cudnn_graph._driver cimport enter_device, leave_device
from cudnn_graph._cudnn_handle cimport Handle, thread_state
from cudnn_graph._graph_replay cimport Operands, build_variant_pack, stage_name
from cudnn_graph._plan_runner cimport PlanRunner, operands_as_executed


def can_record() -> bool:
    """Whether the loaded cuDNN has the populate and update calls (9.5 and later)."""
    cdef CudnnApi* api = cudnn_api()
    return api.cudnnBackendPopulateCudaGraph != NULL and api.cudnnBackendUpdateCudaGraph != NULL


def record_plan_graph(PlanRunner runner, VariantPack pack, uintptr_t workspace, uintptr_t graph,
                      bint update=False) -> None:
    """Populate (``update`` False: ``graph`` must be empty) or update ``graph`` with one execute of
    ``runner``'s plan on ``pack``'s operands, on this thread's handle for the plan's device.

    Raises CudnnStatusError with cuDNN's status when it refuses (e.g.
    CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API for a plan it cannot record).
    """
    cdef CudnnApi* api = cudnn_api()
    cdef Handle h = thread_state().handle_for(runner.device)
    cdef void* ws = <void*>workspace
    cdef void* vp = NULL
    cdef int64_t* uids = NULL
    cdef void** ptrs = NULL
    cdef int n, stage = 0, status
    cdef bint pushed = False
    cdef Operands operands
    operands.n, operands.uids, operands.ptrs = pack._n, pack._uids, pack._ptrs
    if api.cudnnBackendPopulateCudaGraph == NULL or api.cudnnBackendUpdateCudaGraph == NULL:
        check(CUDNN_STATUS_NOT_SUPPORTED, b"cudnnBackendPopulateCudaGraph (cuDNN >= 9.5)")
    n = operands_as_executed(runner, &operands, ws, &uids, &ptrs)
    try:
        with nogil:
            status = build_variant_pack(api, n, uids, ptrs, ws, &vp, &stage)
        check(status, stage_name(stage))
        enter_device(runner.device, &pushed)
        try:
            with nogil:
                if update:
                    status = api.cudnnBackendUpdateCudaGraph(h.ptr, runner._plan.ptr, vp, <void*>graph)
                else:
                    status = api.cudnnBackendPopulateCudaGraph(h.ptr, runner._plan.ptr, vp, <void*>graph)
        finally:
            leave_device(pushed)
        check(status, b"cudnnBackendUpdateCudaGraph" if update else b"cudnnBackendPopulateCudaGraph")
    finally:
        if vp != NULL:
            api.cudnnBackendDestroyDescriptor(vp)
        free(uids)
        free(ptrs)
