/*
 * cudnn_graph C runtime (libcudnn_graph_rt): execute a plan serialized by cudnn_graph's Python package
 * (graph.serialize(), docs/plan_format.md) from C or C++, with only libcudnn and the CUDA driver at
 * serve time (a CuTe plan: the CUDA driver and the CuTe DSL's runtime library, libcute_dsl_runtime.so; a
 * cuTile plan: the CUDA driver alone):
 * no Python, no CUDA toolkit headers. docs/c_api.md is the guide.
 *
 *     cg_plan_t plan;
 *     if (cg_plan_load(blob, blob_size, 0, &plan) != CG_STATUS_SUCCESS) {
 *         fprintf(stderr, "%s\n", cg_last_error());
 *         return 1;
 *     }
 *     int64_t uids[] = {1, 2, 3};
 *     void *pointers[] = {a_device, b_device, c_device};
 *     cg_status_t status = cg_execute(plan, stream, 3, uids, pointers, workspace);
 *     cg_plan_free(plan);
 *
 * Rules
 *   - Every function returns a cg_status_t; on anything but CG_STATUS_SUCCESS, cg_last_error() holds a
 *     message for the calling thread that names the field, tensor or library involved.
 *   - A plan is immutable once loaded: cg_execute on one plan from many threads at once is safe (each
 *     thread uses its own cuDNN handle per device). cg_plan_free must not race with any other call on
 *     the same plan.
 *   - The geometry (dims, strides, data types, alignment) is checked at load; cg_execute checks only
 *     what pointers can break: NULL for a tensor with elements, a misaligned address, a uid the plan
 *     does not know, a duplicated uid, an operand left out.
 *
 * C99; no C++ in this header. Opaque handles only, so the structure behind them can grow.
 */
#ifndef CUDNN_GRAPH_C_RUNTIME_H
#define CUDNN_GRAPH_C_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The API this header declares. A minor bump adds functions or status codes; a major bump changes
 * an existing signature. cg_api_version() says what the loaded library implements. */
#define CG_API_VERSION_MAJOR 1
#define CG_API_VERSION_MINOR 1
#define CG_API_VERSION (CG_API_VERSION_MAJOR * 100 + CG_API_VERSION_MINOR)

#if defined(_WIN32)
#define CG_API
#else
#define CG_API __attribute__((visibility("default")))
#endif

typedef enum cg_status {
    CG_STATUS_SUCCESS = 0,
    CG_STATUS_INVALID_ARGUMENT = 1,   /* a NULL out-parameter, a negative count, an index out of range */
    CG_STATUS_BAD_BLOB = 2,           /* not a plan blob, truncated, corrupt (magic, size, checksum, sections) */
    CG_STATUS_VERSION_MISMATCH = 3,   /* another format, cudnn_graph, cuDNN major.minor or GPU architecture */
    CG_STATUS_NOT_SUPPORTED = 4,      /* a plan this runtime cannot run (cuTile's, the reference's) */
    CG_STATUS_LIBRARY_NOT_FOUND = 5,  /* libcudnn, libcuda or the CuTe DSL runtime could not be loaded, or lacks
                                       * an entry point */
    CG_STATUS_INVALID_DEVICE = 6,     /* no such CUDA device */
    CG_STATUS_NULL_POINTER = 7,       /* a NULL buffer (or workspace) where the plan needs memory */
    CG_STATUS_MISALIGNED = 8,         /* a buffer address below the alignment the plan requires */
    CG_STATUS_UNKNOWN_UID = 9,        /* a uid that is not one of the plan's operands */
    CG_STATUS_MISSING_TENSOR = 10,    /* an operand of the plan that the call did not pass */
    CG_STATUS_DUPLICATE_UID = 11,     /* one uid passed twice */
    CG_STATUS_CUDNN_ERROR = 12,       /* cuDNN refused (the message carries its status and last error) */
    CG_STATUS_CUDA_ERROR = 13,        /* the CUDA driver refused */
    CG_STATUS_OUT_OF_MEMORY = 14,     /* host memory */
    CG_STATUS_NOT_BUILT = 15,         /* (1.1) the in-process API: a graph with no built plan */
    CG_STATUS_PYTHON_ERROR = 16       /* (1.1) the in-process API: Python raised (the message is the exception) */
} cg_status_t;

/* cg_plan_engine_family: the blob header's engine family. */
typedef enum cg_engine_family {
    CG_ENGINE_CUDNN = 1,
    CG_ENGINE_NATIVE = 2,
    CG_ENGINE_PYTHON = 3,
    CG_ENGINE_EXTERNAL = 4
} cg_engine_family_t;

typedef struct cg_plan *cg_plan_t;

/* One operand of a plan: a non-virtual tensor of its graph that the caller passes. Operands the plan
 * binds itself (a scalar the graph fixed, lowering constants, views of another operand, scratch in the
 * workspace) are not listed and not passed. The pointers stay valid until cg_plan_free. A
 * pass-by-value operand is passed as a host pointer to its scalar. */
typedef struct cg_tensor_info {
    int64_t uid;
    const char *name;            /* UTF-8, NUL-terminated */
    int32_t data_type;           /* cuDNN's cudnnDataType_t code (cudnn_graph.DataType) */
    int32_t rank;
    const int64_t *dims;         /* rank entries */
    const int64_t *strides;      /* rank entries, in elements */
    uint32_t alignment;          /* bytes the address must be a multiple of (0: none) */
    int32_t is_pass_by_value;    /* 1: a host scalar, not device memory */
} cg_tensor_info_t;

/* What this library implements: CG_API_VERSION of the header it was built with. */
CG_API int cg_api_version(void);
/* The message of the calling thread's most recent failed call ("" when none failed yet); a successful
 * call leaves it as it was. Valid until that thread's next failure. */
CG_API const char *cg_last_error(void);
/* A status's name ("CG_STATUS_BAD_BLOB"); "CG_STATUS_UNKNOWN" for a value not in cg_status_t. */
CG_API const char *cg_status_name(cg_status_t status);

/* Load the serialized plan blob[0..size) for CUDA device `device`; *out is the plan. The blob is
 * copied: the caller may free it on return. */
CG_API cg_status_t cg_plan_load(const void *blob, size_t size, int device, cg_plan_t *out);
/* Release a plan (NULL is accepted and ignored). */
CG_API void cg_plan_free(cg_plan_t plan);

CG_API cg_status_t cg_plan_tensor_count(cg_plan_t plan, int *count);
/* The operand at `index` (0 <= index < count), in the blob's table order. */
CG_API cg_status_t cg_plan_tensor(cg_plan_t plan, int index, cg_tensor_info_t *info);
/* The index of the operand with `uid`; CG_STATUS_UNKNOWN_UID when the plan has none. */
CG_API cg_status_t cg_plan_tensor_index(cg_plan_t plan, int64_t uid, int *index);
/* Bytes of device workspace each cg_execute needs: cuDNN's figure for the loaded plan, plus the
 * scratch regions the plan carves past it. */
CG_API cg_status_t cg_plan_workspace_size(cg_plan_t plan, size_t *bytes);
CG_API cg_status_t cg_plan_engine_family(cg_plan_t plan, cg_engine_family_t *family);
/* The plan's engine id (cuDNN's engine index for a cuDNN plan). */
CG_API cg_status_t cg_plan_engine_id(cg_plan_t plan, int64_t *engine_id);
CG_API cg_status_t cg_plan_device(cg_plan_t plan, int *device);

/* Execute the plan on `stream` (a CUstream / cudaStream_t; NULL is the legacy default stream), with
 * the operand uids[i] at pointers[i] for i < count, and `workspace` (device memory of at least
 * cg_plan_workspace_size bytes; may be NULL when that is 0). Asynchronous, as cuDNN's execute is. */
CG_API cg_status_t cg_execute(cg_plan_t plan, void *stream, int count, const int64_t *uids,
                              void *const *pointers, void *workspace);

/* Release the calling thread's cuDNN handles and cached variant packs now. Optional: a thread's are
 * released when it exits; the main thread (or one about to unload the library) may call this first. */
CG_API void cg_thread_release(void);

#ifdef __cplusplus
}
#endif

#endif /* CUDNN_GRAPH_C_RUNTIME_H */
