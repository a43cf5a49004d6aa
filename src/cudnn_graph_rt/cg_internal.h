/* libcudnn_graph_rt internals: the parsed blob, the dlopen'ed libraries, the plan object and the
 * thread-local error. Nothing here is public; include/cudnn_graph/cudnn_graph.h is the API. */
#ifndef CUDNN_GRAPH_RT_INTERNAL_H
#define CUDNN_GRAPH_RT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cudnn_graph/cudnn_graph.h"
#include "cudnn_graph/cudnn_backend.h"

#ifndef CG_LIBRARY_VERSION
#error "meson.build defines CG_LIBRARY_VERSION (the package version, major*10000 + minor*100 + patch)"
#endif

#define CG_HIDDEN __attribute__((visibility("hidden")))

/* docs/plan_format.md: version 1, version 2 (version 1 plus the plan-operand section) and version 3
 * (version 2 plus the DSL launch section) */
#define CG_BLOB_FORMAT_VERSION 1
#define CG_BLOB_FORMAT_VERSION_PLAN_OPERANDS 2
#define CG_BLOB_FORMAT_VERSION_DSL_LAUNCH 3
#define CG_BLOB_HEADER_SIZE 64
#define CG_BLOB_SECTION_ENTRY_SIZE 24
#define CG_BLOB_MAX_SECTIONS 64      /* the Python reader's bounds, so both refuse the same blobs */
#define CG_BLOB_MAX_RANK 64
#define CG_SECTION_TENSORS 1
#define CG_SECTION_GRAPH 2
#define CG_SECTION_PLAN 3
#define CG_SECTION_CUDNN_PLAN 4
#define CG_SECTION_KERNELS 5
#define CG_SECTION_PLAN_OPERANDS 6
#define CG_SECTION_DSL_LAUNCH 7

/* Section 6: the operands a plan binds itself (kinds and flags as docs/plan_format.md gives them). */
#define CG_OPERAND_HOST_CONSTANT 1
#define CG_OPERAND_DEVICE_CONSTANT 2
#define CG_OPERAND_ALIAS 3
#define CG_OPERAND_SCRATCH 4
#define CG_OPERAND_WITHHELD 5
#define CG_OPERAND_FLAG_GRAPH_SCALAR 1
#define CG_OPERAND_FLAG_ZERO_FILL 2
#define CG_OPERAND_HEAD_SIZE 40
#define CG_MAX_PLAN_OPERANDS 256       /* the Python reader's bound */
#define CG_MAX_HOST_CONSTANT_BYTES 16
#define CG_MAX_DEVICE_BYTES ((int64_t)1 << 40)
#define CG_SCRATCH_ALIGNMENT 256       /* scratch starts past cuDNN's workspace at multiples of this */

/* Section 7: DSL kernel launches (cudnn_graph/_plan_launch.py is the Python side of the same checks). */
#define CG_CONVENTION_CUTE_PACKED 1    /* int32_t entry(void **args, int32_t num_args): CuTe DSL's export */
#define CG_DSL_MAX_KERNELS 8
#define CG_DSL_MAX_SYMBOL 1024
#define CG_DSL_MAX_HINT 4096
#define CG_DSL_MAX_NAME 256
#define CG_DSL_SCALAR_OPERAND 1
#define CG_DSL_SCALAR_FIXED 2
#define CG_DSL_FLAG_CODE_IN_KERNELS 1
#define CG_DSL_FLAG_POINTER_BOUND 1

/* The flat engine-id space of engines/ids.py (names for refusals only). */
#define CG_ENGINE_ID_REFERENCE 20000
#define CG_ENGINE_ID_CUTE 20100
#define CG_ENGINE_ID_CUTILE 20200

#define CG_MAX_DEVICES 64
#define CG_MAX_OPERANDS 1024

/* ---- errors (cg_error.c) ---- */
CG_HIDDEN cg_status_t cg_fail(cg_status_t status, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- the blob (cg_blob.c) ---- */
typedef struct cg_record {
    int64_t uid;
    int32_t data_type;
    uint8_t is_virtual;
    uint8_t is_pass_by_value;
    uint32_t alignment;
    uint32_t rank;
    int64_t *dims;          /* rank entries, then rank strides, in one allocation */
    int64_t *strides;
    char *name;             /* NUL-terminated copy */
} cg_record_t;

/* One row of section 6. */
typedef struct cg_plan_operand {
    uint16_t kind;          /* CG_OPERAND_* */
    uint16_t flags;         /* CG_OPERAND_FLAG_* */
    int32_t data_type;
    int64_t uid;
    int64_t source_uid;     /* an alias: the caller operand it views ... */
    int64_t byte_offset;    /* ... at this many bytes past its pointer */
    int64_t nbytes;         /* a device constant's or scratch region's size */
    uint8_t *data;          /* a constant's bytes (owned copy), size bytes */
    size_t size;
} cg_plan_operand_t;

/* One kernel launch of section 7: its convention, argument slots, entry and code. */
typedef struct cg_dsl_pointer {
    int64_t uid;
    uint32_t alignment;
    int bound;              /* 0: the placeholder address is passed */
    char *name;             /* NUL-terminated copy ("A", "output") */
} cg_dsl_pointer_t;

typedef struct cg_dsl_scalar {
    int64_t uid;
    uint16_t kind;          /* CG_DSL_SCALAR_* */
    int32_t read_type;      /* cudnnDataType_t FLOAT (0) or DOUBLE (1) of the uid's host value */
    double value;           /* CG_DSL_SCALAR_FIXED */
} cg_dsl_scalar_t;

typedef struct cg_dsl_kernel {
    uint16_t convention;    /* CG_CONVENTION_* */
    uint16_t n_pointers, n_scalars, n_ints;
    cg_dsl_pointer_t *pointers;
    cg_dsl_scalar_t *scalars;
    int64_t *ints;
    char *entry_symbol, *function_prefix, *runtime_hint;     /* NUL-terminated copies */
    uint64_t placeholder;   /* the address an unused pointer slot passes */
    const uint8_t *code;    /* the shared object (inside the caller's bytes: used at load only) */
    size_t code_size;
} cg_dsl_kernel_t;

typedef struct cg_blob {
    uint16_t format_version;
    uint32_t flags;
    uint32_t library_version;
    uint32_t cudnn_version;
    uint32_t arch;
    uint16_t engine_family;
    int64_t engine_id;
    uint64_t workspace_size;
    uint32_t n_records;
    cg_record_t *records;
    uint32_t n_plan_operands;
    cg_plan_operand_t *plan_operands;
    const uint8_t *recipe;          /* section 3 (inside the caller's bytes; NULL when absent) */
    size_t recipe_size;
    const uint8_t *cudnn_plan;      /* section 4 */
    size_t cudnn_plan_size;
    uint32_t n_dsl_kernels;         /* section 7 */
    cg_dsl_kernel_t *dsl_kernels;
} cg_blob_t;

CG_HIDDEN uint32_t cg_crc32(const uint8_t *data, size_t size, size_t skip_at);
/* Parse and check data[0..size): CG_STATUS_BAD_BLOB / CG_STATUS_VERSION_MISMATCH with the message set.
 * On success *blob owns its records (cg_blob_release) and points into data for the sections. */
CG_HIDDEN cg_status_t cg_blob_parse(const uint8_t *data, size_t size, cg_blob_t *blob);
CG_HIDDEN void cg_blob_release(cg_blob_t *blob);
/* The recipe's "engine" name into out (empty when absent). */
CG_HIDDEN void cg_blob_engine_name(const cg_blob_t *blob, char *out, size_t capacity);

/* ---- the libraries (cg_libs.c) ---- */
typedef int (*cg_cuInit_t)(unsigned int);
typedef int (*cg_cuDeviceGetCount_t)(int *);
typedef int (*cg_cuDeviceGet_t)(int *, int);
typedef int (*cg_cuDeviceGetAttribute_t)(int *, int, int);
typedef int (*cg_cuDevicePrimaryCtxRetain_t)(void **, int);
typedef int (*cg_cuDevicePrimaryCtxRelease_t)(int);
typedef int (*cg_cuCtxGetCurrent_t)(void **);
typedef int (*cg_cuCtxPushCurrent_t)(void *);
typedef int (*cg_cuCtxPopCurrent_t)(void **);
typedef int (*cg_cuMemAlloc_t)(unsigned long long *, size_t);
typedef int (*cg_cuMemFree_t)(unsigned long long);
typedef int (*cg_cuMemcpyHtoD_t)(unsigned long long, const void *, size_t);
typedef int (*cg_cuMemsetD8Async_t)(unsigned long long, unsigned char, size_t, void *);

typedef struct cg_libs {
    cg_cudnnGetVersion_t cudnnGetVersion;
    cg_cudnnGetErrorString_t cudnnGetErrorString;
    cg_cudnnGetLastErrorString_t cudnnGetLastErrorString;      /* optional */
    cg_cudnnCreate_t cudnnCreate;
    cg_cudnnDestroy_t cudnnDestroy;
    cg_cudnnSetStream_t cudnnSetStream;
    cg_cudnnBackendCreateDescriptor_t cudnnBackendCreateDescriptor;
    cg_cudnnBackendDestroyDescriptor_t cudnnBackendDestroyDescriptor;
    cg_cudnnBackendSetAttribute_t cudnnBackendSetAttribute;
    cg_cudnnBackendGetAttribute_t cudnnBackendGetAttribute;
    cg_cudnnBackendFinalize_t cudnnBackendFinalize;
    cg_cudnnBackendExecute_t cudnnBackendExecute;
    cg_cuInit_t cuInit;
    cg_cuDeviceGetCount_t cuDeviceGetCount;
    cg_cuDeviceGet_t cuDeviceGet;
    cg_cuDeviceGetAttribute_t cuDeviceGetAttribute;
    cg_cuDevicePrimaryCtxRetain_t cuDevicePrimaryCtxRetain;
    cg_cuDevicePrimaryCtxRelease_t cuDevicePrimaryCtxRelease;  /* optional */
    cg_cuCtxGetCurrent_t cuCtxGetCurrent;
    cg_cuCtxPushCurrent_t cuCtxPushCurrent;
    cg_cuCtxPopCurrent_t cuCtxPopCurrent;
    cg_cuMemAlloc_t cuMemAlloc;                                /* optional: plans with device constants */
    cg_cuMemFree_t cuMemFree;                                  /* optional: plans with device constants */
    cg_cuMemcpyHtoD_t cuMemcpyHtoD;                            /* optional: plans with device constants */
    cg_cuMemsetD8Async_t cuMemsetD8Async;                      /* optional: plans with zeroed scratch */
    size_t cudnn_version;
} cg_libs_t;

/* The libraries, loaded once per process; NULL with the message set when they cannot be. cg_libs: libcudnn
 * and libcuda (cuDNN plans); cg_cuda: libcuda alone (its cuDNN fields NULL unless cg_libs succeeded). */
CG_HIDDEN const cg_libs_t *cg_libs(void);
CG_HIDDEN const cg_libs_t *cg_cuda(void);
/* cuDNN's failure as a CG_STATUS_CUDNN_ERROR with its status name and last error. */
CG_HIDDEN cg_status_t cg_cudnn_failure(const cg_libs_t *libs, int status, const char *what);

/* ---- DSL kernels (cg_dsl.c) ---- */
typedef struct cg_dsl cg_dsl_t;
/* Load the blob's section-7 kernels for `device` (whose primary context is current): the DSL runtime
 * library (once per process), each kernel's shared object, its module on the device; each slot bound to
 * one of `operands` (the caller's, by index) or to a section-6 graph scalar. */
CG_HIDDEN cg_status_t cg_dsl_open(const cg_blob_t *blob, const cg_tensor_info_t *operands, int n_operands,
                                  int device, cg_dsl_t **out);
/* Launch every kernel on `stream`; operand k is pointers[position[k]] (checked by cg_execute). */
CG_HIDDEN cg_status_t cg_dsl_execute(const cg_dsl_t *dsl, void *stream, void *const *pointers, const int *position);
CG_HIDDEN void cg_dsl_close(cg_dsl_t *dsl);

#endif /* CUDNN_GRAPH_RT_INTERNAL_H */
