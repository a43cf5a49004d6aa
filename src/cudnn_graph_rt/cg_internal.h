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

/* docs/plan_format.md: version 1, version 2 (version 1 plus the plan-operand section), version 3
 * (version 2 plus the DSL launch section) and version 4 (version 3 whose DSL launch section may hold cuTile
 * kernels and more than 8 kernels) */
#define CG_BLOB_FORMAT_VERSION 1
#define CG_BLOB_FORMAT_VERSION_PLAN_OPERANDS 2
#define CG_BLOB_FORMAT_VERSION_DSL_LAUNCH 3
#define CG_BLOB_FORMAT_VERSION_TILE_LAUNCH 4
#define CG_BLOB_FORMAT_VERSION_NEWEST CG_BLOB_FORMAT_VERSION_TILE_LAUNCH
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
#define CG_CONVENTION_CUTILE_PARAMS 2  /* a cubin's kernel, cuLaunchKernel(kernelParams): a cuTile plan's */
#define CG_DSL_MAX_KERNELS 32
#define CG_DSL_MAX_KERNELS_V3 8        /* a format-3 blob's bound */
#define CG_DSL_MAX_SYMBOL 1024
#define CG_DSL_MAX_HINT 4096
#define CG_DSL_MAX_NAME 256
#define CG_DSL_SCALAR_OPERAND 1
#define CG_DSL_SCALAR_FIXED 2
#define CG_DSL_FLAG_CODE_IN_KERNELS 1
#define CG_DSL_FLAG_POINTER_BOUND 1
/* Convention 2's launch (the bounds of _plan_launch). */
#define CG_TILE_HEAD_SIZE 48
#define CG_TILE_ADDRESS_SIZE 32
#define CG_TILE_MAX_IMAGE 4096
#define CG_TILE_MAX_PARAMETERS 256
#define CG_TILE_MAX_ADDRESSES 64
#define CG_TILE_MAX_GRID_X 2147483647u
#define CG_TILE_MAX_GRID_YZ 65535u
#define CG_TILE_MAX_BLOCK_THREADS 1024u
#define CG_TILE_MAX_SHARED_BYTES (1u << 20)
/* A launch may ask for this much dynamic shared memory unless its kernel opted in to more (a CUDA fact). */
#define CG_SHARED_BYTES_WITHOUT_OPT_IN (48u * 1024u)
#define CG_TILE_ADDRESS_OPERAND 1      /* an operand's pointer */
#define CG_TILE_ADDRESS_WORKSPACE 2    /* the workspace plus `add` bytes */

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

/* A cuTile kernel's call-supplied address: 8 bytes at `offset` of the parameter image. */
typedef struct cg_tile_address {
    int64_t uid;            /* CG_TILE_ADDRESS_OPERAND: the operand's */
    int64_t add;            /* CG_TILE_ADDRESS_WORKSPACE: bytes past the workspace's start */
    uint32_t offset;
    uint32_t alignment;     /* what the kernel assumes of the address (0: nothing) */
    uint16_t source;        /* CG_TILE_ADDRESS_* */
    char *name;             /* NUL-terminated copy ("q", "workspace") */
} cg_tile_address_t;

/* Convention 2's launch: grid, block, the parameter image (extents and strides written) and where each
 * parameter and address is in it. */
typedef struct cg_tile_params {
    uint32_t grid[3], block[3];
    uint32_t shared_bytes;
    uint32_t image_size;
    uint16_t n_parameters, n_addresses;
    uint64_t workspace_size;        /* the bytes the workspace addresses index into */
    uint32_t *parameters;           /* n_parameters offsets, then n_parameters sizes, one allocation */
    cg_tile_address_t *addresses;
    uint8_t *image;                 /* owned copy */
} cg_tile_params_t;

typedef struct cg_dsl_kernel {
    uint16_t convention;    /* CG_CONVENTION_* */
    uint16_t n_pointers, n_scalars, n_ints;
    cg_dsl_pointer_t *pointers;
    cg_dsl_scalar_t *scalars;
    int64_t *ints;
    char *entry_symbol, *function_prefix, *runtime_hint;     /* NUL-terminated copies */
    uint64_t placeholder;   /* the address an unused pointer slot passes */
    const uint8_t *code;    /* the shared object or cubin (inside the caller's bytes: used at load only) */
    size_t code_size;
    cg_tile_params_t tile;  /* CG_CONVENTION_CUTILE_PARAMS */
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
typedef int (*cg_cuLibraryLoadData_t)(void **, const void *, void *, void **, unsigned int, void *, void **,
                                      unsigned int);
typedef int (*cg_cuLibraryGetKernel_t)(void **, void *, const char *);
typedef int (*cg_cuLibraryUnload_t)(void *);
typedef int (*cg_cuKernelSetAttribute_t)(int, int, void *, int);
typedef int (*cg_cuLaunchKernel_t)(void *, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                                   unsigned int, unsigned int, void *, void **, void **);

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
    cg_cuLibraryLoadData_t cuLibraryLoadData;                  /* optional (CUDA 12.0): cuTile plans */
    cg_cuLibraryGetKernel_t cuLibraryGetKernel;                /* optional (CUDA 12.0): cuTile plans */
    cg_cuLibraryUnload_t cuLibraryUnload;                      /* optional (CUDA 12.0): cuTile plans */
    cg_cuKernelSetAttribute_t cuKernelSetAttribute;            /* optional (CUDA 12.0): kernels past 48 KB shared */
    cg_cuLaunchKernel_t cuLaunchKernel;                        /* optional: cuTile plans */
    size_t cudnn_version;
} cg_libs_t;

/* The libraries, loaded once per process; NULL with the message set when they cannot be. cg_libs: libcudnn
 * and libcuda (cuDNN plans); cg_cuda: libcuda alone (its cuDNN fields NULL unless cg_libs succeeded). */
CG_HIDDEN const cg_libs_t *cg_libs(void);
CG_HIDDEN const cg_libs_t *cg_cuda(void);
/* cuDNN's failure as a CG_STATUS_CUDNN_ERROR with its status name and last error. */
CG_HIDDEN cg_status_t cg_cudnn_failure(const cg_libs_t *libs, int status, const char *what);

/* ---- DSL kernels (cg_dsl.c; cuTile kernels in cg_tile.c) ---- */
typedef struct cg_dsl cg_dsl_t;
/* Load the blob's section-7 kernels for `device` (whose primary context is current): a CuTe kernel's DSL
 * runtime library (once per process), shared object and module on the device; a cuTile kernel's cubin;
 * each slot or address bound to one of `operands` (the caller's, by index) or to a section-6 graph scalar. */
CG_HIDDEN cg_status_t cg_dsl_open(const cg_blob_t *blob, const cg_tensor_info_t *operands, int n_operands,
                                  int device, cg_dsl_t **out);
/* Launch every kernel on `stream`; operand k is pointers[position[k]] (checked by cg_execute), the
 * workspace at `workspace` (cuTile kernels' scratch). */
CG_HIDDEN cg_status_t cg_dsl_execute(const cg_dsl_t *dsl, void *stream, void *const *pointers, const int *position,
                                     void *workspace);
CG_HIDDEN void cg_dsl_close(cg_dsl_t *dsl);

typedef struct cg_tile_kernel cg_tile_kernel_t;
/* Load kernel `index` (convention 2) of the blob for `device`: its cubin (cuLibraryLoadData) and its kernel
 * (opted in to its dynamic shared memory past 48 KB), each operand address bound to an index of `operands`. */
CG_HIDDEN cg_status_t cg_tile_open(const cg_dsl_kernel_t *kernel, uint32_t index, const cg_tensor_info_t *operands,
                                   int n_operands, int device, cg_tile_kernel_t **out);
/* Check the workspace addresses of `tile` against `workspace` (CG_STATUS_MISALIGNED), launching nothing. */
CG_HIDDEN cg_status_t cg_tile_check(const cg_tile_kernel_t *tile, int index, void *workspace);
/* Launch on `stream`: the image's parameters with the call's addresses in their place. */
CG_HIDDEN cg_status_t cg_tile_launch(const cg_tile_kernel_t *tile, int index, void *stream, void *const *pointers,
                                     const int *position, void *workspace);
CG_HIDDEN void cg_tile_close(cg_tile_kernel_t *tile);

#endif /* CUDNN_GRAPH_RT_INTERNAL_H */
