/* The name of each cg_status_t: the one table, shared by libcudnn_graph_rt (cg_status_name) and the
 * in-process C API (src/cudnn_graph/_capi.pyx, the table's status_name). */
#ifndef CUDNN_GRAPH_RT_STATUS_NAMES_H
#define CUDNN_GRAPH_RT_STATUS_NAMES_H

#include "cudnn_graph/cudnn_graph.h"

static inline const char *cg_status_text(cg_status_t status) {
    switch (status) {
    case CG_STATUS_SUCCESS: return "CG_STATUS_SUCCESS";
    case CG_STATUS_INVALID_ARGUMENT: return "CG_STATUS_INVALID_ARGUMENT";
    case CG_STATUS_BAD_BLOB: return "CG_STATUS_BAD_BLOB";
    case CG_STATUS_VERSION_MISMATCH: return "CG_STATUS_VERSION_MISMATCH";
    case CG_STATUS_NOT_SUPPORTED: return "CG_STATUS_NOT_SUPPORTED";
    case CG_STATUS_LIBRARY_NOT_FOUND: return "CG_STATUS_LIBRARY_NOT_FOUND";
    case CG_STATUS_INVALID_DEVICE: return "CG_STATUS_INVALID_DEVICE";
    case CG_STATUS_NULL_POINTER: return "CG_STATUS_NULL_POINTER";
    case CG_STATUS_MISALIGNED: return "CG_STATUS_MISALIGNED";
    case CG_STATUS_UNKNOWN_UID: return "CG_STATUS_UNKNOWN_UID";
    case CG_STATUS_MISSING_TENSOR: return "CG_STATUS_MISSING_TENSOR";
    case CG_STATUS_DUPLICATE_UID: return "CG_STATUS_DUPLICATE_UID";
    case CG_STATUS_CUDNN_ERROR: return "CG_STATUS_CUDNN_ERROR";
    case CG_STATUS_CUDA_ERROR: return "CG_STATUS_CUDA_ERROR";
    case CG_STATUS_OUT_OF_MEMORY: return "CG_STATUS_OUT_OF_MEMORY";
    case CG_STATUS_NOT_BUILT: return "CG_STATUS_NOT_BUILT";
    case CG_STATUS_PYTHON_ERROR: return "CG_STATUS_PYTHON_ERROR";
    }
    return "CG_STATUS_UNKNOWN";
}

#endif /* CUDNN_GRAPH_RT_STATUS_NAMES_H */
