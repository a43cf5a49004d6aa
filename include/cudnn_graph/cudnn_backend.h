/*
 * cudnn_graph: the part of the cuDNN 9 backend ABI that cudnn_graph calls.
 *
 * libcudnn is never linked: cudnn_graph/_loader.pyx dlopen's it at first use and resolves each
 * entry point below into a function pointer. So this header, not cuDNN's, is what the build sees,
 * and the build needs neither the CUDA toolkit nor cuDNN headers.
 *
 * ABI notes
 *   - Every cuDNN enum crosses the C ABI as a 32-bit int: all members fit in int32_t (the only
 *     negative one is CUDNN_OPERATIONGRAPH_MODE_AUTO = -1). So each enum type is declared here as
 *     int32_t and its members as plain enum constants; no compiler can choose another width.
 *   - Handles, descriptors, CUDA streams and CUDA graphs are opaque pointers (void *), so no CUDA
 *     header is needed either.
 *   - Values were read from the cuDNN 9.28.0 headers. cuDNN appends members within 9.x and never
 *     renumbers them (checked against 9.19.0's headers: all 612 names 9.19 has carry the same
 *     values). What differs is whether the loaded library knows a member: "since 9.N.0" marks those
 *     newer than 9.0.0, as the official header records it; unmarked members exist in every 9.x.
 *     A member newer than the loaded library is refused with a BAD_PARAM / NOT_SUPPORTED status,
 *     so callers gate on cudnnGetVersion() first.
 *   - The *_COUNT / *_COUNTS members are sentinels equal to that release's member count and do grow
 *     (CUDNN_KNOB_TYPE_COUNTS is 44 in 9.19, 46 in 9.28): never send one to the library, never size
 *     a table with one.
 */
#ifndef CUDNN_GRAPH_CUDNN_BACKEND_H
#define CUDNN_GRAPH_CUDNN_BACKEND_H

/* The official headers declare the same names with other types: one translation unit gets one of them. */
#if defined(CUDNN_GRAPH_H_) || defined(CUDNN_H_)
#error "cudnn_graph/cudnn_backend.h replaces cudnn.h / cudnn_graph.h; include only one of them"
#endif

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The cuDNN release these declarations were checked against, encoded like cudnnGetVersion():
 * major * 10000 + minor * 100 + patch. */
#define CG_CUDNN_DECLARED_VERSION 92800
/* The ABI generation this header describes; the loader refuses a library of any other major. */
#define CG_CUDNN_ABI_MAJOR 9

/* Releases that introduced the optional entry points (see cudnn_graph/_loader.pyx). */
#define CG_CUDNN_VERSION_CUDA_GRAPH_API 90500             /* cudnnBackendPopulate/UpdateCudaGraph */
#define CG_CUDNN_VERSION_PLAN_WORKSPACE_QUERY 92300       /* cudnnGetExecutionPlanWorkspaceSize */

/* ---- Opaque objects ---------------------------------------------------------------------- */

typedef void *cudnnHandle_t;              /* struct cudnnContext * in cuDNN */
typedef void *cudnnBackendDescriptor_t;
typedef void *cg_cudaStream_t;            /* cudaStream_t == CUstream */
typedef void *cg_cudaGraph_t;             /* cudaGraph_t == CUgraph */

/* Element of CUDNN_TYPE_FRACTION attributes (resample strides, paddings, window dims as ratios). */
typedef struct cudnnFractionStruct {
    int64_t numerator;
    int64_t denominator;
} cudnnFraction_t;

/* ---- Enumerations ------------------------------------------------------------------------ */

/* cudnnStatus_t: category * 1000 + specific error; 0 is success, the deprecated aliases come last */
typedef int32_t cudnnStatus_t;
enum {
    CUDNN_STATUS_SUCCESS                                    = 0,

    CUDNN_STATUS_NOT_INITIALIZED                            = 1001,
    CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH                = 1002,
    CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH             = 1003,
    CUDNN_STATUS_DEPRECATED                                 = 1004,
    CUDNN_STATUS_LICENSE_ERROR                              = 1005,
    CUDNN_STATUS_RUNTIME_IN_PROGRESS                        = 1006,
    CUDNN_STATUS_RUNTIME_FP_OVERFLOW                        = 1007,
    CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED                  = 1008,  /* since 9.2.0 */

    CUDNN_STATUS_BAD_PARAM                                  = 2000,
    CUDNN_STATUS_BAD_PARAM_NULL_POINTER                     = 2002,
    CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER               = 2003,
    CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED                    = 2004,
    CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND                     = 2005,
    CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT                = 2006,
    CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH                  = 2007,
    CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH                   = 2008,
    CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES               = 2009,
    CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE                   = 2010,
    CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH              = 2011,  /* since 9.5.0 */
    CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE                  = 2012,  /* since 9.6.0 */

    CUDNN_STATUS_NOT_SUPPORTED                              = 3000,
    CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN                = 3001,
    CUDNN_STATUS_NOT_SUPPORTED_SHAPE                        = 3002,
    CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE                    = 3003,
    CUDNN_STATUS_NOT_SUPPORTED_LAYOUT                       = 3004,
    CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER     = 3005,
    CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART          = 3006,
    CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH                = 3007,
    CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING = 3008,
    CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE       = 3009,
    CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT   = 3010,
    CUDNN_STATUS_NOT_SUPPORTED_PADDING                      = 3011,
    CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM             = 3012,
    CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API        = 3013,  /* since 9.5.0 */
    CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE        = 3014,  /* since 9.18.0 */

    CUDNN_STATUS_INTERNAL_ERROR                             = 4000,
    CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED          = 4001,
    CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE            = 4002,
    CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED      = 4003,
    CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED    = 4004,
    CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM            = 4005,
    CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED     = 4006,

    CUDNN_STATUS_EXECUTION_FAILED                           = 5000,
    CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER               = 5001,
    CUDNN_STATUS_EXECUTION_FAILED_CUBLAS                    = 5002,
    CUDNN_STATUS_EXECUTION_FAILED_CUDART                    = 5003,
    CUDNN_STATUS_EXECUTION_FAILED_CURAND                    = 5004,

    CUDNN_STATUS_VERSION_MISMATCH                           = 1002,  /* deprecated */
    CUDNN_STATUS_INVALID_VALUE                              = 2001,  /* deprecated */
    CUDNN_STATUS_ARCH_MISMATCH                              = 3007,  /* deprecated */
    CUDNN_STATUS_RUNTIME_PREREQUISITE_MISSING               = 3008,  /* deprecated */
    CUDNN_STATUS_ALLOC_FAILED                               = 4003,  /* deprecated */
    CUDNN_STATUS_MAPPING_ERROR                              = 4006,  /* deprecated */
};

/* cudnnDataType_t: element types (CUDNN_TYPE_DATA_TYPE) */
typedef int32_t cudnnDataType_t;
enum {
    CUDNN_DATA_FLOAT              = 0,
    CUDNN_DATA_DOUBLE             = 1,
    CUDNN_DATA_HALF               = 2,
    CUDNN_DATA_INT8               = 3,
    CUDNN_DATA_INT32              = 4,
    CUDNN_DATA_INT8x4             = 5,     /* deprecated */
    CUDNN_DATA_UINT8              = 6,
    CUDNN_DATA_UINT8x4            = 7,     /* deprecated */
    CUDNN_DATA_INT8x32            = 8,     /* deprecated */
    CUDNN_DATA_BFLOAT16           = 9,
    CUDNN_DATA_INT64              = 10,
    CUDNN_DATA_BOOLEAN            = 11,
    CUDNN_DATA_FP8_E4M3           = 12,
    CUDNN_DATA_FP8_E5M2           = 13,
    CUDNN_DATA_FAST_FLOAT_FOR_FP8 = 14,
    CUDNN_DATA_FP8_E8M0           = 15,    /* since 9.7.0 */
    CUDNN_DATA_FP4_E2M1           = 16,    /* since 9.7.0 */
    CUDNN_DATA_INT4               = 17,    /* since 9.11.0 */
    CUDNN_DATA_UINT4              = 18,    /* since 9.11.0 */
    CUDNN_DATA_UINT32             = 19,    /* since 9.11.0 */
    CUDNN_DATA_COMPLEX_FP32       = 20,    /* since 9.14.0 */
    CUDNN_DATA_COMPLEX_FP64       = 21,    /* since 9.14.0 */
    CUDNN_DATA_BYTE_BOOLEAN       = 22,    /* since 9.25.0 */
    CUDNN_DATA_FP8_E5M3           = 23,    /* since 9.26.0 */
};

/* cudnnBackendDescriptorType_t: what cudnnBackendCreateDescriptor makes */
typedef int32_t cudnnBackendDescriptorType_t;
enum {
    CUDNN_BACKEND_POINTWISE_DESCRIPTOR                             = 0,
    CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR                           = 1,
    CUDNN_BACKEND_ENGINE_DESCRIPTOR                                = 2,
    CUDNN_BACKEND_ENGINECFG_DESCRIPTOR                             = 3,
    CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR                            = 4,
    CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR                        = 5,
    CUDNN_BACKEND_INTERMEDIATE_INFO_DESCRIPTOR                     = 6,
    CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR                           = 7,
    CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR                             = 8,
    CUDNN_BACKEND_LAYOUT_INFO_DESCRIPTOR                           = 9,
    CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR         = 10,
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR = 11,
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR   = 12,
    CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR                   = 13,
    CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR                   = 14,
    CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR                        = 15,
    CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR                          = 16,
    CUDNN_BACKEND_TENSOR_DESCRIPTOR                                = 17,
    CUDNN_BACKEND_MATMUL_DESCRIPTOR                                = 18,
    CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR                      = 19,
    CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR      = 20,
    CUDNN_BACKEND_REDUCTION_DESCRIPTOR                             = 21,
    CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR                   = 22,
    CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR              = 23,
    CUDNN_BACKEND_RESAMPLE_DESCRIPTOR                              = 24,
    CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR                = 25,
    CUDNN_BACKEND_OPERATION_RESAMPLE_BWD_DESCRIPTOR                = 26,
    CUDNN_BACKEND_OPERATION_CONCAT_DESCRIPTOR                      = 27,
    CUDNN_BACKEND_OPERATION_SIGNAL_DESCRIPTOR                      = 28,
    CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR                = 29,
    CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR               = 30,
    CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR                     = 31,
    CUDNN_BACKEND_RNG_DESCRIPTOR                                   = 32,
    CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR                         = 33,
    CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR                          = 34,    /* since 9.4.0 */
    CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR            = 35,    /* since 9.4.0 */
    CUDNN_BACKEND_OPERATION_BLOCK_SCALE_QUANTIZE_DESCRIPTOR        = 36,    /* since 9.7.0 */
    CUDNN_BACKEND_OPERATION_BLOCK_SCALE_DEQUANTIZE_DESCRIPTOR      = 37,    /* since 9.7.0 */
    CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR                            = 38,    /* since 9.8.0 */
    CUDNN_BACKEND_OPERATION_EXPAND_BAND_MATRIX_DESCRIPTOR          = 39,    /* since 9.10.0 */
    CUDNN_BACKEND_OPERATION_CONTRACT_BAND_MATRIX_DESCRIPTOR        = 40,    /* since 9.10.0 */
    CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR                    = 41,    /* since 9.13.0 */
    CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR          = 42,    /* since 9.15.0 */
    CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR                    = 43,    /* since 9.17.0 */
    CUDNN_BACKEND_OPERATION_DIAGONAL_BAND_MASK_DESCRIPTOR          = 44,    /* since 9.20.0 */
    CUDNN_BACKEND_OPERATION_SOFTMAX_DESCRIPTOR                     = 45,    /* since 9.20.0 */
    CUDNN_BACKEND_OPERATION_TRANSPOSE_DESCRIPTOR                   = 46,    /* since 9.22.0 */
    CUDNN_BACKEND_OPERATION_SLICE_DESCRIPTOR                       = 47,    /* since 9.22.0 */
    CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_BWD_DESCRIPTOR      = 48,    /* since 9.22.0 */
    CUDNN_BACKEND_OPERATION_ROPE_FWD_DESCRIPTOR                    = 49,    /* since 9.24.0 */
    CUDNN_BACKEND_OPERATION_ROPE_BWD_DESCRIPTOR                    = 50,    /* since 9.25.0 */
};

/* cudnnBackendAttributeName_t: every attribute, grouped by the descriptor it belongs to */
typedef int32_t cudnnBackendAttributeName_t;
enum {
    CUDNN_ATTR_POINTWISE_MODE                                           = 0,
    CUDNN_ATTR_POINTWISE_MATH_PREC                                      = 1,
    CUDNN_ATTR_POINTWISE_NAN_PROPAGATION                                = 2,     /* deprecated */
    CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP                                = 3,
    CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP                                = 4,
    CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE                          = 5,
    CUDNN_ATTR_POINTWISE_ELU_ALPHA                                      = 6,
    CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA                                  = 7,
    CUDNN_ATTR_POINTWISE_SWISH_BETA                                     = 8,
    CUDNN_ATTR_POINTWISE_AXIS                                           = 9,

    CUDNN_ATTR_CONVOLUTION_COMP_TYPE                                    = 100,
    CUDNN_ATTR_CONVOLUTION_CONV_MODE                                    = 101,
    CUDNN_ATTR_CONVOLUTION_DILATIONS                                    = 102,
    CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES                               = 103,
    CUDNN_ATTR_CONVOLUTION_POST_PADDINGS                                = 104,
    CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS                                 = 105,
    CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS                                 = 106,

    CUDNN_ATTR_ENGINEHEUR_MODE                                          = 200,
    CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH                               = 201,
    CUDNN_ATTR_ENGINEHEUR_RESULTS                                       = 202,
    CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET                               = 203,
    CUDNN_ATTR_ENGINEHEUR_DEVICEPROP                                    = 204,   /* since 9.8.0 */
    CUDNN_ATTR_ENGINEHEUR_SHARED_MEMORY_LIMIT                           = 205,   /* since 9.28.0 */

    CUDNN_ATTR_ENGINECFG_ENGINE                                         = 300,
    CUDNN_ATTR_ENGINECFG_INTERMEDIATE_INFO                              = 301,
    CUDNN_ATTR_ENGINECFG_KNOB_CHOICES                                   = 302,
    CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE                                 = 303,   /* since 9.2.0 */
    CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED                             = 304,   /* since 9.2.0 */

    CUDNN_ATTR_EXECUTION_PLAN_HANDLE                                    = 400,   /* deprecated */
    CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG                             = 401,
    CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE                            = 402,
    CUDNN_ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS                = 403,
    CUDNN_ATTR_EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS                = 404,
    CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION                       = 405,
    CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE                              = 406,   /* since 9.4.0 */
    CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP                                = 407,   /* since 9.8.0 */
    CUDNN_ATTR_EXECUTION_PLAN_CUDA_GRAPH_RETENTION                      = 408,   /* since 9.28.0 */

    CUDNN_ATTR_INTERMEDIATE_INFO_UNIQUE_ID                              = 500,
    CUDNN_ATTR_INTERMEDIATE_INFO_SIZE                                   = 501,
    CUDNN_ATTR_INTERMEDIATE_INFO_DEPENDENT_DATA_UIDS                    = 502,
    CUDNN_ATTR_INTERMEDIATE_INFO_DEPENDENT_ATTRIBUTES                   = 503,

    CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE                                    = 600,
    CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE                                   = 601,

    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA                      = 700,
    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA                       = 701,
    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC                  = 702,
    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W                          = 703,
    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X                          = 704,
    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y                          = 705,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA                     = 706,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA                      = 707,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC                 = 708,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W                         = 709,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX                        = 710,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY                        = 711,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA                   = 712,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA                    = 713,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC               = 714,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW                      = 715,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X                       = 716,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY                      = 717,

    CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR                        = 750,
    CUDNN_ATTR_OPERATION_POINTWISE_XDESC                                = 751,
    CUDNN_ATTR_OPERATION_POINTWISE_BDESC                                = 752,
    CUDNN_ATTR_OPERATION_POINTWISE_YDESC                                = 753,
    CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1                               = 754,
    CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2                               = 755,
    CUDNN_ATTR_OPERATION_POINTWISE_DXDESC                               = 756,
    CUDNN_ATTR_OPERATION_POINTWISE_DYDESC                               = 757,
    CUDNN_ATTR_OPERATION_POINTWISE_TDESC                                = 758,

    CUDNN_ATTR_OPERATION_GENSTATS_MODE                                  = 770,
    CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC                             = 771,
    CUDNN_ATTR_OPERATION_GENSTATS_XDESC                                 = 772,
    CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC                               = 773,
    CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC                             = 774,

    CUDNN_ATTR_OPERATION_BN_FINALIZE_STATS_MODE                         = 780,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_MATH_PREC                          = 781,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SUM_DESC                         = 782,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SQ_SUM_DESC                      = 783,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_SCALE_DESC                         = 784,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_BIAS_DESC                          = 785,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC             = 786,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC              = 787,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC          = 788,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC           = 789,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_MEAN_DESC                    = 790,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC                 = 791,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_EQ_SCALE_DESC                      = 792,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_EQ_BIAS_DESC                       = 793,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC                   = 794,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_EPSILON_DESC                       = 795,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC            = 796,

    CUDNN_ATTR_OPERATIONGRAPH_HANDLE                                    = 800,   /* deprecated */
    CUDNN_ATTR_OPERATIONGRAPH_OPS                                       = 801,
    CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT                       = 802,
    CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED                  = 803,   /* since 9.4.0 */
    CUDNN_ATTR_OPERATIONGRAPH_IS_SAME_TOPOLOGY                          = 804,   /* since 9.6.0 */
    CUDNN_ATTR_OPERATIONGRAPH_IS_OVERRIDE_SHAPE_ENABLED                 = 805,   /* since 9.21.0 */
    CUDNN_ATTR_OPERATIONGRAPH_MODE                                      = 806,   /* since 9.23.0 */

    CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT                                    = 900,
    CUDNN_ATTR_TENSOR_DATA_TYPE                                         = 901,
    CUDNN_ATTR_TENSOR_DIMENSIONS                                        = 902,
    CUDNN_ATTR_TENSOR_STRIDES                                           = 903,
    CUDNN_ATTR_TENSOR_VECTOR_COUNT                                      = 904,
    CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION                              = 905,
    CUDNN_ATTR_TENSOR_UNIQUE_ID                                         = 906,
    CUDNN_ATTR_TENSOR_IS_VIRTUAL                                        = 907,
    CUDNN_ATTR_TENSOR_IS_BY_VALUE                                       = 908,
    CUDNN_ATTR_TENSOR_REORDERING_MODE                                   = 909,
    CUDNN_ATTR_TENSOR_CONSTANT_VALUE                                    = 910,   /* since 9.22.0 */
    CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC                                = 913,
    CUDNN_ATTR_TENSOR_RAGGED_OFFSET_MULTIPLIER                          = 914,   /* since 9.24.0 */

    CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS                                  = 1000,
    CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS                               = 1001,
    CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES                               = 1002,
    CUDNN_ATTR_VARIANT_PACK_WORKSPACE                                   = 1003,
    CUDNN_ATTR_VARIANT_PACK_OVERRIDE_UNIQUE_IDS                         = 1010,  /* since 9.18.0 */
    CUDNN_ATTR_VARIANT_PACK_OVERRIDE_SHAPES                             = 1011,  /* since 9.18.0 */
    CUDNN_ATTR_VARIANT_PACK_OVERRIDE_STRIDES                            = 1012,  /* since 9.18.0 */

    CUDNN_ATTR_LAYOUT_INFO_TENSOR_UID                                   = 1100,
    CUDNN_ATTR_LAYOUT_INFO_TYPES                                        = 1101,

    CUDNN_ATTR_KNOB_INFO_TYPE                                           = 1200,
    CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE                                  = 1201,
    CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE                                  = 1202,
    CUDNN_ATTR_KNOB_INFO_STRIDE                                         = 1203,

    CUDNN_ATTR_ENGINE_OPERATION_GRAPH                                   = 1300,
    CUDNN_ATTR_ENGINE_GLOBAL_INDEX                                      = 1301,
    CUDNN_ATTR_ENGINE_KNOB_INFO                                         = 1302,
    CUDNN_ATTR_ENGINE_NUMERICAL_NOTE                                    = 1303,
    CUDNN_ATTR_ENGINE_LAYOUT_INFO                                       = 1304,
    CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE                                     = 1305,
    CUDNN_ATTR_ENGINE_SM_COUNT_TARGET                                   = 1306,
    CUDNN_ATTR_ENGINE_DEVICEPROP                                        = 1307,  /* since 9.8.0 */
    CUDNN_ATTR_ENGINE_DISABLE_CLUSTER_COOPERATIVE                       = 1308,  /* since 9.17.0 */
    CUDNN_ATTR_ENGINE_SHARED_MEMORY_LIMIT                               = 1309,  /* since 9.28.0 */

    CUDNN_ATTR_MATMUL_COMP_TYPE                                         = 1500,
    CUDNN_ATTR_MATMUL_PADDING_VALUE                                     = 1503,

    CUDNN_ATTR_OPERATION_MATMUL_ADESC                                   = 1520,
    CUDNN_ATTR_OPERATION_MATMUL_BDESC                                   = 1521,
    CUDNN_ATTR_OPERATION_MATMUL_CDESC                                   = 1522,
    CUDNN_ATTR_OPERATION_MATMUL_DESC                                    = 1523,
    CUDNN_ATTR_OPERATION_MATMUL_IRREGULARLY_STRIDED_BATCH_COUNT         = 1524,  /* deprecated */
    CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC                    = 1525,
    CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC                    = 1526,
    CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC                    = 1527,

    CUDNN_ATTR_REDUCTION_OPERATOR                                       = 1600,
    CUDNN_ATTR_REDUCTION_COMP_TYPE                                      = 1601,
    CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC                               = 1602,  /* since 9.11.0 */

    CUDNN_ATTR_OPERATION_REDUCTION_XDESC                                = 1610,
    CUDNN_ATTR_OPERATION_REDUCTION_YDESC                                = 1611,
    CUDNN_ATTR_OPERATION_REDUCTION_DESC                                 = 1612,
    CUDNN_ATTR_OPERATION_REDUCTION_GROUP_OFFSET_DESC                    = 1613,  /* since 9.24.0 */

    CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC                       = 1620,
    CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC                       = 1621,
    CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC                     = 1622,
    CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC                   = 1623,
    CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC                          = 1624,
    CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC                         = 1625,
    CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC                  = 1626,
    CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC                   = 1627,
    CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC                = 1628,
    CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC                 = 1629,
    CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS                         = 1630,

    CUDNN_ATTR_OPERATION_REDUCTION_DIMS                                 = 1640,  /* since 9.27.0 */
    CUDNN_ATTR_OPERATION_REDUCTION_INIT_VALUES                          = 1641,  /* since 9.27.0 */
    CUDNN_ATTR_OPERATION_REDUCTION_SUBGRAPH                             = 1642,  /* since 9.27.0 */
    CUDNN_ATTR_OPERATION_REDUCTION_SUBGRAPH_ACCUMULATOR_UIDS            = 1643,  /* since 9.27.0 */
    CUDNN_ATTR_OPERATION_REDUCTION_SUBGRAPH_CURRENT_UIDS                = 1644,  /* since 9.27.0 */
    CUDNN_ATTR_OPERATION_REDUCTION_SUBGRAPH_OUTPUT_UIDS                 = 1645,  /* since 9.27.0 */
    CUDNN_ATTR_OPERATION_REDUCTION_SUBGRAPH_COMPUTE_TYPES               = 1646,  /* since 9.27.0 */

    CUDNN_ATTR_RESAMPLE_MODE                                            = 1700,
    CUDNN_ATTR_RESAMPLE_COMP_TYPE                                       = 1701,
    CUDNN_ATTR_RESAMPLE_SPATIAL_DIMS                                    = 1702,
    CUDNN_ATTR_RESAMPLE_POST_PADDINGS                                   = 1703,
    CUDNN_ATTR_RESAMPLE_PRE_PADDINGS                                    = 1704,
    CUDNN_ATTR_RESAMPLE_STRIDES                                         = 1705,
    CUDNN_ATTR_RESAMPLE_WINDOW_DIMS                                     = 1706,
    CUDNN_ATTR_RESAMPLE_NAN_PROPAGATION                                 = 1707,
    CUDNN_ATTR_RESAMPLE_PADDING_MODE                                    = 1708,

    CUDNN_ATTR_OPERATION_RESAMPLE_FWD_XDESC                             = 1710,
    CUDNN_ATTR_OPERATION_RESAMPLE_FWD_YDESC                             = 1711,
    CUDNN_ATTR_OPERATION_RESAMPLE_FWD_IDXDESC                           = 1712,
    CUDNN_ATTR_OPERATION_RESAMPLE_FWD_ALPHA                             = 1713,  /* deprecated */
    CUDNN_ATTR_OPERATION_RESAMPLE_FWD_BETA                              = 1714,  /* deprecated */
    CUDNN_ATTR_OPERATION_RESAMPLE_FWD_DESC                              = 1716,

    CUDNN_ATTR_OPERATION_RESAMPLE_BWD_DXDESC                            = 1720,
    CUDNN_ATTR_OPERATION_RESAMPLE_BWD_DYDESC                            = 1721,
    CUDNN_ATTR_OPERATION_RESAMPLE_BWD_IDXDESC                           = 1722,
    CUDNN_ATTR_OPERATION_RESAMPLE_BWD_ALPHA                             = 1723,  /* deprecated */
    CUDNN_ATTR_OPERATION_RESAMPLE_BWD_BETA                              = 1724,  /* deprecated */
    CUDNN_ATTR_OPERATION_RESAMPLE_BWD_DESC                              = 1725,
    CUDNN_ATTR_OPERATION_RESAMPLE_BWD_XDESC                             = 1726,
    CUDNN_ATTR_OPERATION_RESAMPLE_BWD_YDESC                             = 1727,

    CUDNN_ATTR_OPERATION_CONCAT_AXIS                                    = 1800,
    CUDNN_ATTR_OPERATION_CONCAT_INPUT_DESCS                             = 1801,
    CUDNN_ATTR_OPERATION_CONCAT_INPLACE_INDEX                           = 1802,
    CUDNN_ATTR_OPERATION_CONCAT_OUTPUT_DESC                             = 1803,

    CUDNN_ATTR_OPERATION_SIGNAL_MODE                                    = 1900,
    CUDNN_ATTR_OPERATION_SIGNAL_FLAGDESC                                = 1901,
    CUDNN_ATTR_OPERATION_SIGNAL_VALUE                                   = 1902,
    CUDNN_ATTR_OPERATION_SIGNAL_XDESC                                   = 1903,
    CUDNN_ATTR_OPERATION_SIGNAL_YDESC                                   = 1904,

    CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC                = 1950,  /* since 9.4.0 */
    CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC                         = 1951,  /* since 9.4.0 */
    CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC                 = 1952,  /* since 9.4.0 */
    CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC               = 1953,  /* since 9.4.0 */

    CUDNN_ATTR_OPERATION_NORM_FWD_MODE                                  = 2000,
    CUDNN_ATTR_OPERATION_NORM_FWD_PHASE                                 = 2001,
    CUDNN_ATTR_OPERATION_NORM_FWD_XDESC                                 = 2002,
    CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC                             = 2003,
    CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC                     = 2004,
    CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC                            = 2005,
    CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC                             = 2006,
    CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC                          = 2007,
    CUDNN_ATTR_OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC                   = 2008,
    CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_MEAN_DESC               = 2009,
    CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_VAR_DESC                = 2010,
    CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC              = 2011,
    CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_VAR_DESC               = 2012,
    CUDNN_ATTR_OPERATION_NORM_FWD_YDESC                                 = 2013,
    CUDNN_ATTR_OPERATION_NORM_FWD_PEER_STAT_DESCS                       = 2014,

    CUDNN_ATTR_OPERATION_NORM_BWD_MODE                                  = 2100,
    CUDNN_ATTR_OPERATION_NORM_BWD_XDESC                                 = 2101,
    CUDNN_ATTR_OPERATION_NORM_BWD_MEAN_DESC                             = 2102,
    CUDNN_ATTR_OPERATION_NORM_BWD_INV_VARIANCE_DESC                     = 2103,
    CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC                                = 2104,
    CUDNN_ATTR_OPERATION_NORM_BWD_SCALE_DESC                            = 2105,
    CUDNN_ATTR_OPERATION_NORM_BWD_EPSILON_DESC                          = 2106,
    CUDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC                           = 2107,
    CUDNN_ATTR_OPERATION_NORM_BWD_DBIAS_DESC                            = 2108,
    CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC                                = 2109,
    CUDNN_ATTR_OPERATION_NORM_BWD_PEER_STAT_DESCS                       = 2110,

    CUDNN_ATTR_OPERATION_RESHAPE_XDESC                                  = 2200,
    CUDNN_ATTR_OPERATION_RESHAPE_YDESC                                  = 2201,
    CUDNN_ATTR_OPERATION_RESHAPE_MODE                                   = 2202,  /* since 9.22.0 */

    CUDNN_ATTR_OPERATION_TRANSPOSE_XDESC                                = 3200,  /* since 9.22.0 */
    CUDNN_ATTR_OPERATION_TRANSPOSE_YDESC                                = 3201,  /* since 9.22.0 */
    CUDNN_ATTR_OPERATION_TRANSPOSE_PERMUTATION                          = 3202,  /* since 9.22.0 */

    CUDNN_ATTR_OPERATION_SLICE_XDESC                                    = 3300,  /* since 9.22.0 */
    CUDNN_ATTR_OPERATION_SLICE_YDESC                                    = 3301,  /* since 9.22.0 */
    CUDNN_ATTR_OPERATION_SLICE_START_INDICES                            = 3302,  /* since 9.22.0 */
    CUDNN_ATTR_OPERATION_SLICE_LIMIT_INDICES                            = 3303,  /* since 9.22.0 */
    CUDNN_ATTR_OPERATION_SLICE_STRIDES                                  = 3304,  /* since 9.22.0 */

    CUDNN_ATTR_OPERATION_ROPE_FWD_XDESC                                 = 3400,  /* since 9.24.0 */
    CUDNN_ATTR_OPERATION_ROPE_FWD_YDESC                                 = 3401,  /* since 9.24.0 */
    CUDNN_ATTR_OPERATION_ROPE_FWD_FREQSDESC                             = 3402,  /* since 9.24.0 */
    CUDNN_ATTR_OPERATION_ROPE_FWD_OUTPUT_SCALE                          = 3403,  /* since 9.24.0 */
    CUDNN_ATTR_OPERATION_ROPE_FWD_ROPE_DIM                              = 3404,  /* since 9.24.0 */

    CUDNN_ATTR_OPERATION_ROPE_BWD_DYDESC                                = 3410,  /* since 9.25.0 */
    CUDNN_ATTR_OPERATION_ROPE_BWD_DXDESC                                = 3411,  /* since 9.25.0 */
    CUDNN_ATTR_OPERATION_ROPE_BWD_FREQSDESC                             = 3412,  /* since 9.25.0 */
    CUDNN_ATTR_OPERATION_ROPE_BWD_OUTPUT_SCALE                          = 3413,  /* since 9.25.0 */
    CUDNN_ATTR_OPERATION_ROPE_BWD_ROPE_DIM                              = 3414,  /* since 9.25.0 */

    CUDNN_ATTR_OPERATION_EXPAND_BAND_MATRIX_XDESC                       = 2250,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_EXPAND_BAND_MATRIX_YDESC                       = 2251,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_EXPAND_BAND_MATRIX_LOWER_BANDWIDTH             = 2252,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_EXPAND_BAND_MATRIX_UPPER_BANDWIDTH             = 2253,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_EXPAND_BAND_MATRIX_AXIS                        = 2254,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_EXPAND_BAND_MATRIX_PAD_VALUE                   = 2255,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_EXPAND_BAND_MATRIX_KV_TOKEN_OFFSET_DESC        = 2256,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_EXPAND_BAND_MATRIX_SPECULATIVE_MASK_DESC       = 2257,  /* since 9.13.0 */

    CUDNN_ATTR_OPERATION_CONTRACT_BAND_MATRIX_XDESC                     = 2270,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_CONTRACT_BAND_MATRIX_YDESC                     = 2271,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_CONTRACT_BAND_MATRIX_LOWER_BANDWIDTH           = 2272,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_CONTRACT_BAND_MATRIX_UPPER_BANDWIDTH           = 2273,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_CONTRACT_BAND_MATRIX_AXIS                      = 2274,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_CONTRACT_BAND_MATRIX_PAD_VALUE                 = 2275,  /* since 9.10.0 */
    CUDNN_ATTR_OPERATION_CONTRACT_BAND_MAX_TOKEN_VALUE                  = 2276,  /* since 9.10.0 */

    CUDNN_ATTR_RNG_DISTRIBUTION                                         = 2300,
    CUDNN_ATTR_RNG_NORMAL_DIST_MEAN                                     = 2301,
    CUDNN_ATTR_RNG_NORMAL_DIST_STANDARD_DEVIATION                       = 2302,
    CUDNN_ATTR_RNG_UNIFORM_DIST_MAXIMUM                                 = 2303,
    CUDNN_ATTR_RNG_UNIFORM_DIST_MINIMUM                                 = 2304,
    CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY                           = 2305,

    CUDNN_ATTR_OPERATION_RNG_YDESC                                      = 2310,
    CUDNN_ATTR_OPERATION_RNG_SEED                                       = 2311,
    CUDNN_ATTR_OPERATION_RNG_DESC                                       = 2312,
    CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC                                = 2313,

    CUDNN_ATTR_KERNEL_CACHE_OPERATION_GRAPH                             = 2400,  /* since 9.5.0 */
    CUDNN_ATTR_KERNEL_CACHE_IS_ENGINECFG_KERNEL_CACHED                  = 2401,  /* since 9.4.0 */
    CUDNN_ATTR_KERNEL_CACHE_JSON_REPRESENTATION                         = 2402,  /* since 9.10.0 */
    CUDNN_ATTR_KERNEL_CACHE_REVISION                                    = 2403,  /* since 9.27.0 */
    CUDNN_ATTR_KERNEL_CACHE_ENTRY_COUNT                                 = 2404,  /* since 9.27.0 */

    CUDNN_ATTR_OPERATION_BLOCK_SCALE_QUANTIZE_XDESC                     = 2500,  /* since 9.7.0 */
    CUDNN_ATTR_OPERATION_BLOCK_SCALE_QUANTIZE_YDESC                     = 2501,  /* since 9.7.0 */
    CUDNN_ATTR_OPERATION_BLOCK_SCALE_QUANTIZE_SCALE_DESC                = 2502,  /* since 9.7.0 */
    CUDNN_ATTR_OPERATION_BLOCK_SCALE_QUANTIZE_MATH_PREC                 = 2503,  /* since 9.7.0 */
    CUDNN_ATTR_OPERATION_BLOCK_SCALE_QUANTIZE_BLOCK_SIZE                = 2504,  /* since 9.7.0 */

    CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_XDESC                   = 2600,  /* since 9.7.0 */
    CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_SCALE_DESC              = 2601,  /* since 9.7.0 */
    CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_YDESC                   = 2602,  /* since 9.7.0 */
    CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_MATH_PREC               = 2603,  /* since 9.7.0 */
    CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_BLOCK_SIZE              = 2604,  /* since 9.7.0 */
    CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_NEG_SCALE               = 2605,  /* since 9.13.0 */

    CUDNN_ATTR_DEVICEPROP_DEVICE_ID                                     = 2700,  /* since 9.8.0 */
    CUDNN_ATTR_DEVICEPROP_HANDLE                                        = 2701,  /* since 9.8.0 */
    CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION                           = 2702,  /* since 9.8.0 */

    CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC                                 = 2800,  /* since 9.13.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC                                 = 2801,  /* since 9.13.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC                                 = 2802,  /* since 9.13.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC                                 = 2803,  /* since 9.13.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC                             = 2804,  /* since 9.13.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC                             = 2805,  /* since 9.13.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_BLOCK_MASK_DESC                       = 2806,  /* since 9.14.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_KDESC                      = 2807,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_VDESC                      = 2808,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC                         = 2809,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_KVDESC                        = 2810,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH                              = 2811,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH_INPUT_UID                    = 2812,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH_OUTPUT_UID                   = 2813,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_SOFTMAX_DESC                          = 2814,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_DROPOUT_SEED_DESC                     = 2815,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_DROPOUT_OFFSET_DESC                   = 2816,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_DROPOUT_RNG_DUMP_DESC                 = 2817,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_DROPOUT_PROBABILITY                   = 2818,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_UNFUSE_FMA                            = 2819,  /* since 9.22.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_CU_SEQ_LEN_QDESC                      = 2820,  /* since 9.24.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_CU_SEQ_LEN_KVDESC                     = 2821,  /* since 9.24.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_DESCALE_QDESC                         = 2822,  /* since 9.25.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_DESCALE_KDESC                         = 2823,  /* since 9.25.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_DESCALE_VDESC                         = 2824,  /* since 9.25.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_DESCALE_SDESC                         = 2825,  /* since 9.25.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_SCALE_SDESC                           = 2826,  /* since 9.25.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_SCALE_ODESC                           = 2827,  /* since 9.25.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_AMAX_SDESC                            = 2828,  /* since 9.25.0 */
    CUDNN_ATTR_OPERATION_SDPA_FWD_AMAX_ODESC                            = 2829,  /* since 9.25.0 */

    CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC                                 = 2851,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC                                 = 2852,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC                                 = 2853,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC                                 = 2854,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC                             = 2855,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC                             = 2856,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_SEQ_LEN_QDESC                         = 2857,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_SEQ_LEN_KVDESC                        = 2858,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC                                = 2859,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC                                = 2860,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC                                = 2861,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC                               = 2862,  /* since 9.17.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_SINK_DESC                             = 2863,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_DSINK_DESC                            = 2864,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_MAX_TOTAL_SEQ_LEN_Q                   = 2865,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_MAX_TOTAL_SEQ_LEN_KV                  = 2866,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_SUBGRAPH                              = 2867,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_SUBGRAPH_INPUT_UID                    = 2868,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_SUBGRAPH_OUTPUT_UID                   = 2869,  /* since 9.21.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_CU_SEQ_LEN_QDESC                      = 2870,  /* since 9.28.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_CU_SEQ_LEN_KVDESC                     = 2871,  /* since 9.28.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_DROPOUT_SEED_DESC                     = 2872,  /* since 9.28.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_DROPOUT_OFFSET_DESC                   = 2873,  /* since 9.28.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_DROPOUT_PROBABILITY                   = 2874,  /* since 9.28.0 */
    CUDNN_ATTR_OPERATION_SDPA_BWD_DBIAS_DESC                            = 2875,  /* since 9.28.0 */

    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MODE                        = 2900,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MATH_PREC                   = 2901,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_TOKEN_DESC                  = 2902,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_WEIGHT_DESC                 = 2903,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_FIRST_TOKEN_OFFSET_DESC     = 2904,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_OUTPUT_DESC                 = 2905,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_TOKEN_INDEX_DESC            = 2906,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_TOKEN_KS_DESC               = 2907,  /* since 9.15.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_TOP_K                       = 2908,  /* since 9.15.0 */

    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_BWD_MATH_PREC               = 2951,  /* since 9.22.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_BWD_TOKEN_DESC              = 2952,  /* since 9.22.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_BWD_DWEIGHT_DESC            = 2953,  /* since 9.22.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_BWD_FIRST_TOKEN_OFFSET_DESC = 2954,  /* since 9.22.0 */
    CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_BWD_DOUTPUT_DESC            = 2955,  /* since 9.22.0 */

    CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_XDESC                       = 3000,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_SEQ_LEN_KVDESC              = 3001,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_SEQ_LEN_QDESC               = 3002,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_LEFT_BOUND_DESC             = 3003,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_SHIFT_RIGHT_BOUND_DESC      = 3004,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_BDESC                       = 3005,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_YDESC                       = 3006,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_COMPARISON_MODE             = 3007,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_CU_SEQ_LEN_KVDESC           = 3008,  /* since 9.24.0 */
    CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_CU_SEQ_LEN_QDESC            = 3009,  /* since 9.24.0 */

    CUDNN_ATTR_OPERATION_SOFTMAX_XDESC                                  = 3100,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_SOFTMAX_YDESC                                  = 3101,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_SOFTMAX_STATS_DESC                             = 3102,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_SOFTMAX_MAX_DESC                               = 3103,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_SOFTMAX_SUM_EXP_DESC                           = 3104,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_SOFTMAX_SINK_DESC                              = 3105,  /* since 9.20.0 */
    CUDNN_ATTR_OPERATION_SOFTMAX_STATS_LOG2                             = 3106,  /* since 9.27.0 */
};

/* cudnnBackendAttributeType_t: the element type of an attribute array */
typedef int32_t cudnnBackendAttributeType_t;
enum {
    CUDNN_TYPE_HANDLE                  = 0,
    CUDNN_TYPE_DATA_TYPE               = 1,
    CUDNN_TYPE_BOOLEAN                 = 2,
    CUDNN_TYPE_INT64                   = 3,
    CUDNN_TYPE_FLOAT                   = 4,
    CUDNN_TYPE_DOUBLE                  = 5,
    CUDNN_TYPE_VOID_PTR                = 6,
    CUDNN_TYPE_CONVOLUTION_MODE        = 7,
    CUDNN_TYPE_HEUR_MODE               = 8,
    CUDNN_TYPE_KNOB_TYPE               = 9,
    CUDNN_TYPE_NAN_PROPOGATION         = 10,    /* deprecated */
    CUDNN_TYPE_NUMERICAL_NOTE          = 11,
    CUDNN_TYPE_LAYOUT_TYPE             = 12,
    CUDNN_TYPE_ATTRIB_NAME             = 13,
    CUDNN_TYPE_POINTWISE_MODE          = 14,
    CUDNN_TYPE_BACKEND_DESCRIPTOR      = 15,
    CUDNN_TYPE_GENSTATS_MODE           = 16,
    CUDNN_TYPE_BN_FINALIZE_STATS_MODE  = 17,
    CUDNN_TYPE_REDUCTION_OPERATOR_TYPE = 18,
    CUDNN_TYPE_BEHAVIOR_NOTE           = 19,
    CUDNN_TYPE_TENSOR_REORDERING_MODE  = 20,
    CUDNN_TYPE_RESAMPLE_MODE           = 21,
    CUDNN_TYPE_PADDING_MODE            = 22,
    CUDNN_TYPE_INT32                   = 23,
    CUDNN_TYPE_CHAR                    = 24,
    CUDNN_TYPE_SIGNAL_MODE             = 25,
    CUDNN_TYPE_FRACTION                = 26,
    CUDNN_TYPE_NORM_MODE               = 27,
    CUDNN_TYPE_NORM_FWD_PHASE          = 28,
    CUDNN_TYPE_RNG_DISTRIBUTION        = 29,
    CUDNN_TYPE_MOE_GROUPED_MATMUL_MODE = 30,    /* since 9.15.0 */
    CUDNN_TYPE_RESHAPE_MODE            = 31,    /* since 9.22.0 */
    CUDNN_TYPE_OPERATIONGRAPH_MODE     = 32,    /* since 9.23.0 */
    CUDNN_TYPE_CUDA_GRAPH_RETENTION    = 33,    /* since 9.28.0 */
};

/* cudnnPointwiseMode_t */
typedef int32_t cudnnPointwiseMode_t;
enum {
    CUDNN_POINTWISE_ADD                  = 0,
    CUDNN_POINTWISE_MUL                  = 1,
    CUDNN_POINTWISE_MIN                  = 2,
    CUDNN_POINTWISE_MAX                  = 3,
    CUDNN_POINTWISE_ADD_SQUARE           = 5,
    CUDNN_POINTWISE_DIV                  = 6,
    CUDNN_POINTWISE_MOD                  = 7,
    CUDNN_POINTWISE_POW                  = 8,
    CUDNN_POINTWISE_SUB                  = 9,

    CUDNN_POINTWISE_SQRT                 = 4,
    CUDNN_POINTWISE_ABS                  = 10,
    CUDNN_POINTWISE_CEIL                 = 11,
    CUDNN_POINTWISE_COS                  = 12,
    CUDNN_POINTWISE_EXP                  = 13,
    CUDNN_POINTWISE_FLOOR                = 14,
    CUDNN_POINTWISE_LOG                  = 15,
    CUDNN_POINTWISE_NEG                  = 16,
    CUDNN_POINTWISE_RSQRT                = 17,
    CUDNN_POINTWISE_SIN                  = 18,
    CUDNN_POINTWISE_TAN                  = 19,
    CUDNN_POINTWISE_ERF                  = 20,
    CUDNN_POINTWISE_IDENTITY             = 21,
    CUDNN_POINTWISE_RECIPROCAL           = 22,
    CUDNN_POINTWISE_ATAN2                = 23,    /* since 9.1.0 */
    CUDNN_POINTWISE_FLOOR_MOD            = 24,    /* since 9.27.0 */

    CUDNN_POINTWISE_RELU_FWD             = 100,
    CUDNN_POINTWISE_TANH_FWD             = 101,
    CUDNN_POINTWISE_SIGMOID_FWD          = 102,
    CUDNN_POINTWISE_ELU_FWD              = 103,
    CUDNN_POINTWISE_GELU_FWD             = 104,
    CUDNN_POINTWISE_SOFTPLUS_FWD         = 105,
    CUDNN_POINTWISE_SWISH_FWD            = 106,
    CUDNN_POINTWISE_GELU_APPROX_TANH_FWD = 107,

    CUDNN_POINTWISE_RELU_BWD             = 200,
    CUDNN_POINTWISE_TANH_BWD             = 201,
    CUDNN_POINTWISE_SIGMOID_BWD          = 202,
    CUDNN_POINTWISE_ELU_BWD              = 203,
    CUDNN_POINTWISE_GELU_BWD             = 204,
    CUDNN_POINTWISE_SOFTPLUS_BWD         = 205,
    CUDNN_POINTWISE_SWISH_BWD            = 206,
    CUDNN_POINTWISE_GELU_APPROX_TANH_BWD = 207,

    CUDNN_POINTWISE_CMP_EQ               = 300,
    CUDNN_POINTWISE_CMP_NEQ              = 301,
    CUDNN_POINTWISE_CMP_GT               = 302,
    CUDNN_POINTWISE_CMP_GE               = 303,
    CUDNN_POINTWISE_CMP_LT               = 304,
    CUDNN_POINTWISE_CMP_LE               = 305,

    CUDNN_POINTWISE_LOGICAL_AND          = 400,
    CUDNN_POINTWISE_LOGICAL_OR           = 401,
    CUDNN_POINTWISE_LOGICAL_NOT          = 402,

    CUDNN_POINTWISE_GEN_INDEX            = 501,

    CUDNN_POINTWISE_BINARY_SELECT        = 601,
};

/* cudnnReduceTensorOp_t */
typedef int32_t cudnnReduceTensorOp_t;
enum {
    CUDNN_REDUCE_TENSOR_ADD          = 0,
    CUDNN_REDUCE_TENSOR_MUL          = 1,
    CUDNN_REDUCE_TENSOR_MIN          = 2,
    CUDNN_REDUCE_TENSOR_MAX          = 3,
    CUDNN_REDUCE_TENSOR_AMAX         = 4,
    CUDNN_REDUCE_TENSOR_AVG          = 5,
    CUDNN_REDUCE_TENSOR_NORM1        = 6,
    CUDNN_REDUCE_TENSOR_NORM2        = 7,
    CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS = 8,
};

/* cudnnBackendHeurMode_t */
typedef int32_t cudnnBackendHeurMode_t;
enum {
    CUDNN_HEUR_MODE_INSTANT  = 0,
    CUDNN_HEUR_MODE_B        = 1,
    CUDNN_HEUR_MODE_FALLBACK = 2,
    CUDNN_HEUR_MODE_A        = 3,
    CUDNN_HEUR_MODES_COUNT   = 4,
};

/* cudnnBackendNumericalNote_t */
typedef int32_t cudnnBackendNumericalNote_t;
enum {
    CUDNN_NUMERICAL_NOTE_TENSOR_CORE                 = 0,
    CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS         = 1,
    CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION = 2,
    CUDNN_NUMERICAL_NOTE_FFT                         = 3,
    CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC            = 4,
    CUDNN_NUMERICAL_NOTE_WINOGRAD                    = 5,
    CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4           = 6,
    CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6           = 7,
    CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13         = 8,
    CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP             = 9,     /* since 9.1.0 */
    CUDNN_NUMERICAL_NOTE_TYPE_COUNT                  = 10,
};

/* cudnnBackendBehaviorNote_t */
typedef int32_t cudnnBackendBehaviorNote_t;
enum {
    CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION             = 0,
    CUDNN_BEHAVIOR_NOTE_REQUIRES_FILTER_INT8x32_REORDER = 1,
    CUDNN_BEHAVIOR_NOTE_REQUIRES_BIAS_INT8x32_REORDER   = 2,
    CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API  = 3,     /* since 9.5.0 */
    CUDNN_BEHAVIOR_NOTE_CUBLASLT_DEPENDENCY             = 4,     /* since 9.15.0 */
    CUDNN_BEHAVIOR_NOTE_TYPE_COUNT                      = 5,
};

/* cudnnBackendKnobType_t */
typedef int32_t cudnnBackendKnobType_t;
enum {
    CUDNN_KNOB_TYPE_SPLIT_K               = 0,     /* deprecated */
    CUDNN_KNOB_TYPE_SWIZZLE               = 1,
    CUDNN_KNOB_TYPE_TILE_SIZE             = 2,
    CUDNN_KNOB_TYPE_USE_TEX               = 3,     /* deprecated */
    CUDNN_KNOB_TYPE_EDGE                  = 4,
    CUDNN_KNOB_TYPE_KBLOCK                = 5,     /* deprecated */
    CUDNN_KNOB_TYPE_LDGA                  = 6,     /* deprecated */
    CUDNN_KNOB_TYPE_LDGB                  = 7,     /* deprecated */
    CUDNN_KNOB_TYPE_CHUNK_K               = 8,     /* deprecated */
    CUDNN_KNOB_TYPE_SPLIT_H               = 9,     /* deprecated */
    CUDNN_KNOB_TYPE_WINO_TILE             = 10,    /* deprecated */
    CUDNN_KNOB_TYPE_MULTIPLY              = 11,
    CUDNN_KNOB_TYPE_SPLIT_K_BUF           = 12,
    CUDNN_KNOB_TYPE_TILEK                 = 13,
    CUDNN_KNOB_TYPE_STAGES                = 14,
    CUDNN_KNOB_TYPE_REDUCTION_MODE        = 15,
    CUDNN_KNOB_TYPE_CTA_SPLIT_K_MODE      = 16,    /* deprecated */
    CUDNN_KNOB_TYPE_SPLIT_K_SLC           = 17,
    CUDNN_KNOB_TYPE_IDX_MODE              = 18,    /* since 9.7.0 */
    CUDNN_KNOB_TYPE_SLICED                = 19,    /* deprecated */
    CUDNN_KNOB_TYPE_SPLIT_RS              = 20,    /* deprecated */
    CUDNN_KNOB_TYPE_SINGLEBUFFER          = 21,    /* deprecated */
    CUDNN_KNOB_TYPE_LDGC                  = 22,    /* deprecated */
    CUDNN_KNOB_TYPE_SPECFILT              = 23,
    CUDNN_KNOB_TYPE_KERNEL_CFG            = 24,
    CUDNN_KNOB_TYPE_WORKSPACE             = 25,
    CUDNN_KNOB_TYPE_TILE_CGA              = 26,    /* deprecated */
    CUDNN_KNOB_TYPE_TILE_CGA_M            = 27,
    CUDNN_KNOB_TYPE_TILE_CGA_N            = 28,
    CUDNN_KNOB_TYPE_BLOCK_SIZE            = 29,
    CUDNN_KNOB_TYPE_OCCUPANCY             = 30,
    CUDNN_KNOB_TYPE_ARRAY_SIZE_PER_THREAD = 31,
    CUDNN_KNOB_TYPE_NUM_C_PER_BLOCK       = 32,    /* deprecated */
    CUDNN_KNOB_TYPE_SPLIT_COLS            = 33,
    CUDNN_KNOB_TYPE_TILE_ROWS             = 34,
    CUDNN_KNOB_TYPE_TILE_COLS             = 35,
    CUDNN_KNOB_TYPE_LOAD_SIZE             = 36,
    CUDNN_KNOB_TYPE_CTA_COUNT             = 37,    /* since 9.7.0 */
    CUDNN_KNOB_TYPE_STREAM_K              = 38,    /* since 9.7.0 */
    CUDNN_KNOB_TYPE_SPLIT_P_SLC           = 39,    /* since 9.7.0 */
    CUDNN_KNOB_TYPE_TILE_M                = 40,    /* since 9.7.0 */
    CUDNN_KNOB_TYPE_TILE_N                = 41,    /* since 9.7.0 */
    CUDNN_KNOB_TYPE_WARP_SPEC_CFG         = 42,    /* since 9.7.0 */
    CUDNN_KNOB_TYPE_SWAP_AB               = 43,    /* since 9.18.0 */
    CUDNN_KNOB_TYPE_INPUT_TMA_ENABLE      = 44,    /* since 9.22.0 */
    CUDNN_KNOB_TYPE_OUTPUT_TMA_ENABLE     = 45,    /* since 9.22.0 */
    CUDNN_KNOB_TYPE_COUNTS                = 46,
};

/* cudnnBackendLayoutType_t */
typedef int32_t cudnnBackendLayoutType_t;
enum {
    CUDNN_LAYOUT_TYPE_PREFERRED_NCHW   = 0,
    CUDNN_LAYOUT_TYPE_PREFERRED_NHWC   = 1,
    CUDNN_LAYOUT_TYPE_PREFERRED_PAD4CK = 2,
    CUDNN_LAYOUT_TYPE_PREFERRED_PAD8CK = 3,
    CUDNN_LAYOUT_TYPE_COUNT            = 4,
};

/* cudnnBackendNormMode_t */
typedef int32_t cudnnBackendNormMode_t;
enum {
    CUDNN_LAYER_NORM     = 0,
    CUDNN_INSTANCE_NORM  = 1,
    CUDNN_BATCH_NORM     = 2,
    CUDNN_GROUP_NORM     = 3,
    CUDNN_RMS_NORM       = 4,
    CUDNN_ADA_LAYER_NORM = 5,     /* since 9.7.0 */
};

/* cudnnBackendNormFwdPhase_t */
typedef int32_t cudnnBackendNormFwdPhase_t;
enum {
    CUDNN_NORM_FWD_INFERENCE = 0,
    CUDNN_NORM_FWD_TRAINING  = 1,
};

/* cudnnResampleMode_t */
typedef int32_t cudnnResampleMode_t;
enum {
    CUDNN_RESAMPLE_NEAREST                 = 0,
    CUDNN_RESAMPLE_BILINEAR                = 1,
    CUDNN_RESAMPLE_AVGPOOL                 = 2,
    CUDNN_RESAMPLE_AVGPOOL_INCLUDE_PADDING = 2,
    CUDNN_RESAMPLE_MAXPOOL                 = 3,
    CUDNN_RESAMPLE_AVGPOOL_EXCLUDE_PADDING = 4,
};

/* cudnnPaddingMode_t */
typedef int32_t cudnnPaddingMode_t;
enum {
    CUDNN_ZERO_PAD     = 0,
    CUDNN_NEG_INF_PAD  = 1,
    CUDNN_EDGE_VAL_PAD = 2,
};

/* cudnnRngDistribution_t */
typedef int32_t cudnnRngDistribution_t;
enum {
    CUDNN_RNG_DISTRIBUTION_BERNOULLI = 0,
    CUDNN_RNG_DISTRIBUTION_UNIFORM   = 1,
    CUDNN_RNG_DISTRIBUTION_NORMAL    = 2,
};

/* cudnnConvolutionMode_t */
typedef int32_t cudnnConvolutionMode_t;
enum {
    CUDNN_CONVOLUTION       = 0,
    CUDNN_CROSS_CORRELATION = 1,
};

/* cudnnNanPropagation_t: taken by CUDNN_ATTR_POINTWISE_NAN_PROPAGATION and CUDNN_ATTR_RESAMPLE_NAN_PROPAGATION */
typedef int32_t cudnnNanPropagation_t;
enum {
    CUDNN_NOT_PROPAGATE_NAN = 0,     /* deprecated */
    CUDNN_PROPAGATE_NAN     = 1,     /* deprecated */
};

/* cudnnBackendTensorReordering_t */
typedef int32_t cudnnBackendTensorReordering_t;
enum {
    CUDNN_TENSOR_REORDERING_NONE     = 0,
    CUDNN_TENSOR_REORDERING_INT8x32  = 1,
    CUDNN_TENSOR_REORDERING_F16x16   = 2,
    CUDNN_TENSOR_REORDERING_F8_128x4 = 3,     /* since 9.7.0 */
};

/* cudnnGenStatsMode_t */
typedef int32_t cudnnGenStatsMode_t;
enum {
    CUDNN_GENSTATS_SUM_SQSUM = 0,
};

/* cudnnBnFinalizeStatsMode_t */
typedef int32_t cudnnBnFinalizeStatsMode_t;
enum {
    CUDNN_BN_FINALIZE_STATISTICS_TRAINING  = 0,
    CUDNN_BN_FINALIZE_STATISTICS_INFERENCE = 1,
};

/* cudnnSignalMode_t */
typedef int32_t cudnnSignalMode_t;
enum {
    CUDNN_SIGNAL_SET  = 0,
    CUDNN_SIGNAL_WAIT = 1,
};

/* cudnnMoeGroupedMatmulMode_t */
typedef int32_t cudnnMoeGroupedMatmulMode_t;
enum {
    CUDNN_MOE_GROUPED_MATMUL_MODE_NONE    = 0,     /* since 9.15.0 */
    CUDNN_MOE_GROUPED_MATMUL_MODE_GATHER  = 1,     /* since 9.15.0 */
    CUDNN_MOE_GROUPED_MATMUL_MODE_SCATTER = 2,     /* since 9.15.0 */
};

/* cudnnBackendReshapeMode_t */
typedef int32_t cudnnBackendReshapeMode_t;
enum {
    CUDNN_RESHAPE_VIEW_ONLY = 0,     /* since 9.22.0 */
    CUDNN_RESHAPE_LOGICAL   = 1,     /* since 9.22.0 */
};

/* cudnnBackendOperationGraphMode_t: CUDNN_ATTR_OPERATIONGRAPH_MODE (since 9.23.0); AUTO lets finalize detect it */
typedef int32_t cudnnBackendOperationGraphMode_t;
enum {
    CUDNN_OPERATIONGRAPH_MODE_AUTO                     = -1,
    CUDNN_OPERATIONGRAPH_MODE_CONV_FORWARD             = 0,
    CUDNN_OPERATIONGRAPH_MODE_CONV_BWD_DATA            = 1,
    CUDNN_OPERATIONGRAPH_MODE_CONV_BWD_FILTER          = 2,
    CUDNN_OPERATIONGRAPH_MODE_NORM_FWD_INFER           = 17,
    CUDNN_OPERATIONGRAPH_MODE_NORM_FWD_TRAIN           = 18,
    CUDNN_OPERATIONGRAPH_MODE_NORM_BWD                 = 19,
    CUDNN_OPERATIONGRAPH_MODE_GENERIC_CONV_FUSION      = 20,
    CUDNN_OPERATIONGRAPH_MODE_RESAMPLE_FWD             = 22,
    CUDNN_OPERATIONGRAPH_MODE_RESAMPLE_BWD             = 23,
    CUDNN_OPERATIONGRAPH_MODE_BLAS_MATMUL              = 25,
    CUDNN_OPERATIONGRAPH_MODE_GENERIC_MATMUL_FUSION    = 26,
    CUDNN_OPERATIONGRAPH_MODE_GENERIC_POINTWISE_FUSION = 27,
    CUDNN_OPERATIONGRAPH_MODE_SDPA_FWD                 = 28,
    CUDNN_OPERATIONGRAPH_MODE_SDPA_BWD                 = 29,
    CUDNN_OPERATIONGRAPH_MODE_UNIFIED_SDPA_FWD         = 30,
    CUDNN_OPERATIONGRAPH_MODE_UNIFIED_SDPA_BWD         = 31,
};

/* cudnnCudaGraphRetention_t */
typedef int32_t cudnnCudaGraphRetention_t;
enum {
    CUDNN_CUDA_GRAPH_RETENTION_PER_GRAPH = 0,     /* since 9.28.0 */
    CUDNN_CUDA_GRAPH_RETENTION_NONE      = 1,     /* since 9.28.0 */
};

/* ---- Entry points, as function-pointer types ----------------------------------------------
 * Named cg_<cuDNN symbol>_t; _loader.pyx resolves the symbol of the same name with dlsym. */

typedef size_t (*cg_cudnnGetVersion_t)(void);
typedef size_t (*cg_cudnnGetCudartVersion_t)(void);
typedef const char *(*cg_cudnnGetErrorString_t)(cudnnStatus_t status);
/* Copies the calling thread's most recent error message, NUL-terminated, into message. */
typedef void (*cg_cudnnGetLastErrorString_t)(char *message, size_t max_size);

typedef cudnnStatus_t (*cg_cudnnCreate_t)(cudnnHandle_t *handle);
typedef cudnnStatus_t (*cg_cudnnDestroy_t)(cudnnHandle_t handle);
typedef cudnnStatus_t (*cg_cudnnSetStream_t)(cudnnHandle_t handle, cg_cudaStream_t stream);
typedef cudnnStatus_t (*cg_cudnnGetStream_t)(cudnnHandle_t handle, cg_cudaStream_t *stream);

typedef cudnnStatus_t (*cg_cudnnBackendCreateDescriptor_t)(cudnnBackendDescriptorType_t descriptor_type,
                                                           cudnnBackendDescriptor_t *descriptor);
typedef cudnnStatus_t (*cg_cudnnBackendDestroyDescriptor_t)(cudnnBackendDescriptor_t descriptor);
/* Deprecated since 9.2 (cudnnBackendCreateDescriptor replaces it); resolved only if exported. */
typedef cudnnStatus_t (*cg_cudnnBackendInitialize_t)(cudnnBackendDescriptor_t descriptor);
typedef cudnnStatus_t (*cg_cudnnBackendFinalize_t)(cudnnBackendDescriptor_t descriptor);
typedef cudnnStatus_t (*cg_cudnnBackendSetAttribute_t)(cudnnBackendDescriptor_t descriptor,
                                                       cudnnBackendAttributeName_t name,
                                                       cudnnBackendAttributeType_t type,
                                                       int64_t element_count,
                                                       const void *elements);
/* element_count receives how many elements the attribute holds, which may exceed requested_count. */
typedef cudnnStatus_t (*cg_cudnnBackendGetAttribute_t)(cudnnBackendDescriptor_t descriptor,
                                                       cudnnBackendAttributeName_t name,
                                                       cudnnBackendAttributeType_t type,
                                                       int64_t requested_count,
                                                       int64_t *element_count,
                                                       void *elements);
typedef cudnnStatus_t (*cg_cudnnBackendExecute_t)(cudnnHandle_t handle,
                                                  cudnnBackendDescriptor_t execution_plan,
                                                  cudnnBackendDescriptor_t variant_pack);
/* CG_CUDNN_VERSION_CUDA_GRAPH_API and later. */
typedef cudnnStatus_t (*cg_cudnnBackendPopulateCudaGraph_t)(cudnnHandle_t handle,
                                                            cudnnBackendDescriptor_t execution_plan,
                                                            cudnnBackendDescriptor_t variant_pack,
                                                            cg_cudaGraph_t graph);
typedef cudnnStatus_t (*cg_cudnnBackendUpdateCudaGraph_t)(cudnnHandle_t handle,
                                                          cudnnBackendDescriptor_t execution_plan,
                                                          cudnnBackendDescriptor_t variant_pack,
                                                          cg_cudaGraph_t graph);
/* CG_CUDNN_VERSION_PLAN_WORKSPACE_QUERY and later: workspace for a plan given this variant pack. */
typedef cudnnStatus_t (*cg_cudnnGetExecutionPlanWorkspaceSize_t)(cudnnHandle_t handle,
                                                                 cudnnBackendDescriptor_t execution_plan,
                                                                 cudnnBackendDescriptor_t variant_pack,
                                                                 size_t *workspace_size);

#ifdef __cplusplus
}
#endif

#endif /* CUDNN_GRAPH_CUDNN_BACKEND_H */
