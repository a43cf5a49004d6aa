/* The thread-local last-error message and the status names. */
#include <stdarg.h>
#include <stdio.h>

#include "cg_internal.h"

#define CG_ERROR_CAPACITY 1024

static __thread char last_error[CG_ERROR_CAPACITY];

cg_status_t cg_fail(cg_status_t status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(last_error, sizeof last_error, format, args);
    va_end(args);
    return status;
}

const char *cg_last_error(void) { return last_error; }

int cg_api_version(void) { return CG_API_VERSION; }

const char *cg_status_name(cg_status_t status) {
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
