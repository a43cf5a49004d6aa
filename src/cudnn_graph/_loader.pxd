# libcudnn, dlopen'ed at first use: the resolved entry points and the status check every cuDNN call
# goes through. Nothing here is linked against cuDNN; see _loader.pyx for the search order.
from cudnn_graph._cudnn_abi cimport (
    CUDNN_STATUS_SUCCESS,
    cg_cudnnGetVersion_t, cg_cudnnGetCudartVersion_t, cg_cudnnGetErrorString_t,
    cg_cudnnGetLastErrorString_t, cg_cudnnCreate_t, cg_cudnnDestroy_t, cg_cudnnSetStream_t,
    cg_cudnnGetStream_t, cg_cudnnBackendCreateDescriptor_t, cg_cudnnBackendDestroyDescriptor_t,
    cg_cudnnBackendInitialize_t, cg_cudnnBackendFinalize_t, cg_cudnnBackendSetAttribute_t,
    cg_cudnnBackendGetAttribute_t, cg_cudnnBackendExecute_t, cg_cudnnBackendPopulateCudaGraph_t,
    cg_cudnnBackendUpdateCudaGraph_t, cg_cudnnGetExecutionPlanWorkspaceSize_t,
)


cdef struct CudnnApi:
    size_t version           # cudnnGetVersion(): major * 10000 + minor * 100 + patch, e.g. 91900
    size_t cudart_version    # cudnnGetCudartVersion(): the CUDA runtime cuDNN was built against

    # Required: loading fails without any of them.
    cg_cudnnGetVersion_t cudnnGetVersion
    cg_cudnnGetCudartVersion_t cudnnGetCudartVersion
    cg_cudnnGetErrorString_t cudnnGetErrorString
    cg_cudnnCreate_t cudnnCreate
    cg_cudnnDestroy_t cudnnDestroy
    cg_cudnnSetStream_t cudnnSetStream
    cg_cudnnGetStream_t cudnnGetStream
    cg_cudnnBackendCreateDescriptor_t cudnnBackendCreateDescriptor
    cg_cudnnBackendDestroyDescriptor_t cudnnBackendDestroyDescriptor
    cg_cudnnBackendFinalize_t cudnnBackendFinalize
    cg_cudnnBackendSetAttribute_t cudnnBackendSetAttribute
    cg_cudnnBackendGetAttribute_t cudnnBackendGetAttribute
    cg_cudnnBackendExecute_t cudnnBackendExecute

    # Optional: NULL when the library predates them (version gate) or does not export them. Test the
    # pointer, or call require_version() first for a typed error naming the feature.
    cg_cudnnGetLastErrorString_t cudnnGetLastErrorString
    cg_cudnnBackendInitialize_t cudnnBackendInitialize                    # deprecated since 9.2
    cg_cudnnBackendPopulateCudaGraph_t cudnnBackendPopulateCudaGraph      # >= 9.5.0
    cg_cudnnBackendUpdateCudaGraph_t cudnnBackendUpdateCudaGraph          # >= 9.5.0
    cg_cudnnGetExecutionPlanWorkspaceSize_t cudnnGetExecutionPlanWorkspaceSize  # >= 9.23.0


# The resolved API, loading libcudnn on the first call (CudnnNotFoundError when there is none).
# Needs the GIL; take the pointer once, then call through it with the GIL released.
cdef CudnnApi* cudnn_api() except NULL

# The API if libcudnn is already loaded, else NULL; never loads.
cdef CudnnApi* loaded_api() noexcept nogil

# Raises the typed CudnnStatusError for a failed status (reading cuDNN's last-error text of this
# thread). Only the cold path: call check() / check_nogil() instead.
cdef int raise_status(int status, const char* where) except -1


cdef inline int check(int status, const char* where) except -1:
    """0 for success; otherwise raises the typed error. ``where`` names the call (a C literal)."""
    if status == CUDNN_STATUS_SUCCESS:
        return 0
    return raise_status(status, where)


cdef inline int check_nogil(int status, const char* where) except -1 nogil:
    """check() for code running without the GIL: it takes the GIL only on failure."""
    if status == CUDNN_STATUS_SUCCESS:
        return 0
    with gil:
        return raise_status(status, where)
