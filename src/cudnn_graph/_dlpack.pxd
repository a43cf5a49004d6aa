# Cython view of include/cudnn_graph/dlpack.h (the project's declaration of the DLPack 1.3 ABI).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from "cudnn_graph/dlpack.h" nogil:
    int CG_DLPACK_MAJOR
    int CG_DLPACK_MINOR
    const char* CG_CAPSULE_LEGACY
    const char* CG_CAPSULE_LEGACY_USED
    const char* CG_CAPSULE_VERSIONED
    const char* CG_CAPSULE_VERSIONED_USED
    const char* CG_CAPSULE_EXCHANGE_API

    ctypedef struct DLPackVersion:
        uint32_t major
        uint32_t minor

    ctypedef int32_t DLDeviceType
    enum:
        kDLCPU
        kDLCUDA
        kDLCUDAHost
        kDLOpenCL
        kDLVulkan
        kDLMetal
        kDLVPI
        kDLROCM
        kDLROCMHost
        kDLExtDev
        kDLCUDAManaged
        kDLOneAPI
        kDLWebGPU
        kDLHexagon
        kDLMAIA
        kDLTrn

    ctypedef struct DLDevice:
        DLDeviceType device_type
        int32_t device_id

    enum:
        kDLInt
        kDLUInt
        kDLFloat
        kDLOpaqueHandle
        kDLBfloat
        kDLComplex
        kDLBool
        kDLFloat8_e3m4
        kDLFloat8_e4m3
        kDLFloat8_e4m3b11fnuz
        kDLFloat8_e4m3fn
        kDLFloat8_e4m3fnuz
        kDLFloat8_e5m2
        kDLFloat8_e5m2fnuz
        kDLFloat8_e8m0fnu
        kDLFloat6_e2m3fn
        kDLFloat6_e3m2fn
        kDLFloat4_e2m1fn
        CG_DL_TYPE_CODE_COUNT

    ctypedef struct DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes

    ctypedef struct DLTensor:
        void* data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset

    ctypedef struct DLManagedTensor:
        DLTensor dl_tensor
        void* manager_ctx
        void (*deleter)(DLManagedTensor*) noexcept

    uint64_t DLPACK_FLAG_BITMASK_READ_ONLY
    uint64_t DLPACK_FLAG_BITMASK_IS_COPIED
    uint64_t DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED

    ctypedef struct DLManagedTensorVersioned:
        DLPackVersion version
        void* manager_ctx
        void (*deleter)(DLManagedTensorVersioned*) noexcept
        uint64_t flags
        DLTensor dl_tensor


# The exchange functions take Python objects and may run Python code: no nogil on these.
cdef extern from "cudnn_graph/dlpack.h":
    ctypedef void (*DLPackSetError)(void* error_ctx, const char* kind, const char* message) noexcept
    ctypedef int (*DLPackManagedTensorAllocator)(DLTensor* prototype, DLManagedTensorVersioned** out,
                                                 void* error_ctx, DLPackSetError set_error) noexcept
    ctypedef int (*DLPackManagedTensorFromPyObjectNoSync)(void* py_object,
                                                          DLManagedTensorVersioned** out) noexcept
    ctypedef int (*DLPackManagedTensorToPyObjectNoSync)(DLManagedTensorVersioned* tensor,
                                                        void** out_py_object) noexcept
    ctypedef int (*DLPackDLTensorFromPyObjectNoSync)(void* py_object, DLTensor* out) noexcept
    ctypedef int (*DLPackCurrentWorkStream)(DLDeviceType device_type, int32_t device_id,
                                            void** out_current_stream) noexcept

    ctypedef struct DLPackExchangeAPIHeader:
        DLPackVersion version
        DLPackExchangeAPIHeader* prev_api

    ctypedef struct DLPackExchangeAPI:
        DLPackExchangeAPIHeader header
        DLPackManagedTensorAllocator managed_tensor_allocator
        DLPackManagedTensorFromPyObjectNoSync managed_tensor_from_py_object_no_sync
        DLPackManagedTensorToPyObjectNoSync managed_tensor_to_py_object_no_sync
        DLPackDLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync
        DLPackCurrentWorkStream current_work_stream
