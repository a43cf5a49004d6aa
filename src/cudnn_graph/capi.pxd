# cudnn_graph's in-process C API for Cython extension modules: the declarations of
# include/cudnn_graph/cudnn_graph_capi.h (installed as cudnn_graph/capi.pxd; docs/c_api.md).
#
#     from cudnn_graph.capi cimport cg_capi_t, cg_capi_import, cg_graph_plan_t, CG_STATUS_SUCCESS
#     cdef const cg_capi_t* api = cg_capi_import()      # raises ImportError on a version mismatch
#     cdef cg_graph_plan_t plan
#     if api.plan_from_graph(<PyObject*>graph, &plan) != CG_STATUS_SUCCESS:
#         raise RuntimeError(api.last_error().decode())
#     with nogil:
#         status = api.execute(plan, stream, n, uids, pointers, workspace)
#
# Compile with the include folder `python -m cudnn_graph --c-flags` prints (the header lives there).
# The package's own src/cudnn_graph/_capi.pyx implements the table from these declarations.
from libc.stdint cimport int32_t, int64_t, uint32_t
from cpython.object cimport PyObject

cdef extern from "cudnn_graph/cudnn_graph_capi.h":
    ctypedef enum cg_status_t:
        CG_STATUS_SUCCESS
        CG_STATUS_INVALID_ARGUMENT
        CG_STATUS_BAD_BLOB
        CG_STATUS_VERSION_MISMATCH
        CG_STATUS_NOT_SUPPORTED
        CG_STATUS_LIBRARY_NOT_FOUND
        CG_STATUS_INVALID_DEVICE
        CG_STATUS_NULL_POINTER
        CG_STATUS_MISALIGNED
        CG_STATUS_UNKNOWN_UID
        CG_STATUS_MISSING_TENSOR
        CG_STATUS_DUPLICATE_UID
        CG_STATUS_CUDNN_ERROR
        CG_STATUS_CUDA_ERROR
        CG_STATUS_OUT_OF_MEMORY
        CG_STATUS_NOT_BUILT
        CG_STATUS_PYTHON_ERROR

    ctypedef enum cg_engine_family_t:
        CG_ENGINE_CUDNN
        CG_ENGINE_NATIVE
        CG_ENGINE_PYTHON
        CG_ENGINE_EXTERNAL

    ctypedef struct cg_tensor_info_t:
        int64_t uid
        const char* name
        int32_t data_type
        int32_t rank
        const int64_t* dims
        const int64_t* strides
        uint32_t alignment
        int32_t is_pass_by_value

    cdef struct cg_graph_plan
    ctypedef cg_graph_plan* cg_graph_plan_t

    ctypedef struct cg_capi_t:
        uint32_t version
        uint32_t size
        cg_status_t (*plan_from_graph)(PyObject* graph, cg_graph_plan_t* out) noexcept
        void (*plan_free)(cg_graph_plan_t plan) noexcept nogil
        cg_status_t (*plan_tensor_count)(cg_graph_plan_t plan, int* count) noexcept nogil
        cg_status_t (*plan_tensor)(cg_graph_plan_t plan, int index, cg_tensor_info_t* info) noexcept nogil
        cg_status_t (*plan_tensor_index)(cg_graph_plan_t plan, int64_t uid, int* index) noexcept nogil
        cg_status_t (*plan_workspace_size)(cg_graph_plan_t plan, size_t* size) noexcept nogil
        cg_status_t (*plan_engine_family)(cg_graph_plan_t plan, cg_engine_family_t* family) noexcept nogil
        cg_status_t (*plan_engine_id)(cg_graph_plan_t plan, int64_t* engine_id) noexcept nogil
        cg_status_t (*plan_device)(cg_graph_plan_t plan, int* device) noexcept nogil
        cg_status_t (*execute)(cg_graph_plan_t plan, void* stream, int count, const int64_t* uids,
                               void* const* pointers, void* workspace) noexcept nogil
        const char* (*last_error)() noexcept nogil
        const char* (*status_name)(cg_status_t status) noexcept nogil

    int CG_CAPI_VERSION
    int CG_CAPI_VERSION_MAJOR
    int CG_CAPI_VERSION_MINOR
    const char* CG_CAPI_CAPSULE_NAME

    # The package's table checked against this header (ImportError on another major or a shorter table).
    const cg_capi_t* cg_capi_import() except NULL
    const cg_capi_t* cg_capi_import_version(int major, size_t size) except NULL
