# The XLA FFI custom-call handler: the ABI declarations (include/cudnn_graph/xla_ffi.h, the one source)
# and the process-wide table of registered plans the handler runs (plan id -> operands, geometry, plan).
from libc.stdint cimport int32_t, int64_t, intptr_t, uint32_t

from cudnn_graph._dsl_launch cimport DslLaunch


cdef extern from "cudnn_graph/xla_ffi.h" nogil:
    int CG_XLA_FFI_API_MAJOR
    int CG_XLA_FFI_API_MINOR
    uint32_t XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE

    ctypedef enum XLA_FFI_Extension_Type:
        XLA_FFI_Extension_Metadata

    ctypedef struct XLA_FFI_Extension_Base:
        size_t struct_size
        XLA_FFI_Extension_Type type
        XLA_FFI_Extension_Base* next

    ctypedef struct XLA_FFI_Api_Version:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        int major_version
        int minor_version

    ctypedef struct XLA_FFI_Error
    ctypedef struct XLA_FFI_ExecutionContext

    ctypedef enum XLA_FFI_Error_Code:
        XLA_FFI_Error_Code_OK
        XLA_FFI_Error_Code_UNKNOWN
        XLA_FFI_Error_Code_INVALID_ARGUMENT
        XLA_FFI_Error_Code_NOT_FOUND
        XLA_FFI_Error_Code_RESOURCE_EXHAUSTED
        XLA_FFI_Error_Code_FAILED_PRECONDITION
        XLA_FFI_Error_Code_UNIMPLEMENTED
        XLA_FFI_Error_Code_INTERNAL

    ctypedef struct XLA_FFI_Error_Create_Args:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        const char* message
        XLA_FFI_Error_Code errc

    ctypedef enum XLA_FFI_DataType:
        XLA_FFI_DataType_INVALID
        XLA_FFI_DataType_S64

    ctypedef struct XLA_FFI_Buffer:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        int dtype
        void* data
        int64_t rank
        int64_t* dims

    ctypedef enum XLA_FFI_ArgType:
        XLA_FFI_ArgType_BUFFER
    ctypedef enum XLA_FFI_RetType:
        XLA_FFI_RetType_BUFFER
    ctypedef enum XLA_FFI_AttrType:
        XLA_FFI_AttrType_SCALAR

    ctypedef struct XLA_FFI_ByteSpan:
        const char* ptr
        size_t len

    ctypedef struct XLA_FFI_Scalar:
        int dtype
        void* value

    ctypedef enum XLA_FFI_ExecutionStage:
        XLA_FFI_ExecutionStage_INSTANTIATE
        XLA_FFI_ExecutionStage_PREPARE
        XLA_FFI_ExecutionStage_INITIALIZE
        XLA_FFI_ExecutionStage_EXECUTE

    ctypedef struct XLA_FFI_Args:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        int64_t size
        int* types
        void** args

    ctypedef struct XLA_FFI_Rets:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        int64_t size
        int* types
        void** rets

    ctypedef struct XLA_FFI_Attrs:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        int64_t size
        int* types
        XLA_FFI_ByteSpan** names
        void** attrs

    ctypedef struct XLA_FFI_Stream_Get_Args:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        XLA_FFI_ExecutionContext* ctx
        void* stream

    ctypedef struct XLA_FFI_DeviceOrdinal_Get_Args:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        XLA_FFI_ExecutionContext* ctx
        int32_t device_ordinal

    ctypedef XLA_FFI_Error* (*XLA_FFI_Error_Create_Fn)(XLA_FFI_Error_Create_Args* args)
    ctypedef XLA_FFI_Error* (*XLA_FFI_Stream_Get_Fn)(XLA_FFI_Stream_Get_Args* args)
    ctypedef XLA_FFI_Error* (*XLA_FFI_DeviceOrdinal_Get_Fn)(XLA_FFI_DeviceOrdinal_Get_Args* args)

    ctypedef struct XLA_FFI_Api:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        XLA_FFI_Api_Version api_version
        XLA_FFI_Error_Create_Fn XLA_FFI_Error_Create
        XLA_FFI_Stream_Get_Fn XLA_FFI_Stream_Get
        XLA_FFI_DeviceOrdinal_Get_Fn XLA_FFI_DeviceOrdinal_Get

    ctypedef struct XLA_FFI_CallFrame:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        const XLA_FFI_Api* api
        XLA_FFI_ExecutionContext* ctx
        XLA_FFI_ExecutionStage stage
        XLA_FFI_Args args
        XLA_FFI_Rets rets
        XLA_FFI_Attrs attrs

    ctypedef struct XLA_FFI_Metadata:
        size_t struct_size
        XLA_FFI_Api_Version api_version
        uint32_t traits

    ctypedef struct XLA_FFI_Metadata_Extension:
        XLA_FFI_Extension_Base extension_base
        XLA_FFI_Metadata* metadata

    # Whether the framework's function table reaches an entry (C macros over offsetof).
    bint CG_XLA_FFI_API_HAS_ERROR_CREATE(const XLA_FFI_Api* api)
    bint CG_XLA_FFI_API_HAS_STREAM_GET(const XLA_FFI_Api* api)
    bint CG_XLA_FFI_API_HAS_DEVICE_ORDINAL_GET(const XLA_FFI_Api* api)


cdef enum:
    FFI_MAX_RANK = 8                    # buffer ranks a plan's operand may have
    FFI_MAX_TENSORS = 32                # arguments + results of one plan (the workspace not counted)
    FFI_MAX_EXTRA = 64                  # operands a cuDNN plan supplies itself (PlanRunner's PLAN_MAX_EXTRA)
    FFI_NAME_BYTES = 48                 # a tensor's name, as error messages quote it (truncated)
    FFI_MAX_DEVICES = 64                # device ordinals a plan family covers

    PLAN_KIND_CUDNN = 1                 # run here, in C: cudnnBackendExecute with no GIL
    PLAN_KIND_PYTHON = 2                # a Python engine's plan: the GIL is taken, execute() called
    PLAN_KIND_DSL = 3                   # a DSL plan with a C launch (CuTe): dsl_fill + its entry, no GIL
    PLAN_KIND_FAMILY = 4                # no plan: one registered plan per device; the call's device's runs


# One argument or result as the plan declares it (the XLA buffer must match it exactly).
ctypedef struct FfiTensor:
    int64_t uid
    int dtype                           # XLA_FFI_DataType
    int rank
    int64_t dims[FFI_MAX_RANK]
    bint packed                         # enters cuDNN's variant pack (False: a uid no operation reads)
    char name[FFI_NAME_BYTES]


ctypedef struct FfiPlan:
    int64_t plan_id
    int kind                            # PLAN_KIND_*
    int device                          # CUDA ordinal, -1 for a host graph (and for a family)
    # Families only: the member plan id per device ordinal (0: none), and whether the ordinals are CUDA
    # devices (the call's device is the stream's) or the framework's host devices (its device ordinal).
    bint on_cuda
    int64_t members[FFI_MAX_DEVICES]
    int n_inputs                        # tensors[:n_inputs] are the call's arguments ...
    int n_outputs                       # ... tensors[n_inputs:] its results (then the workspace, if any)
    FfiTensor tensors[FFI_MAX_TENSORS]
    int64_t workspace_size              # bytes of the uint8 result that follows the outputs (0: none; a
                                        # uint8 result there is then tolerated: a family's members share
                                        # one result list, sized for the largest workspace)
    # DSL plans only: the launch, owned by the PackedLaunch the table's keepalive holds.
    const DslLaunch* launch
    # cuDNN plans only.
    void* plan                          # the finalized execution plan (PlanRunner keeps it alive)
    void* handle                        # this device's FFI handle (see _device_handles)
    int n_fixed                         # operands at fixed addresses: constants, the plan's own, scalars
    int64_t fixed_uids[FFI_MAX_EXTRA]
    void* fixed_ptrs[FFI_MAX_EXTRA]
    int n_aliases                       # views cuDNN reads at a tensor's address plus an offset
    int64_t alias_uids[FFI_MAX_EXTRA]
    int alias_sources[FFI_MAX_EXTRA]    # index into tensors
    int64_t alias_offsets[FFI_MAX_EXTRA]
    int n_scratch                       # plan-owned tensors carved from the workspace
    int64_t scratch_uids[FFI_MAX_EXTRA]
    int64_t scratch_offsets[FFI_MAX_EXTRA]
    int64_t scratch_bytes[FFI_MAX_EXTRA]
    bint scratch_zero[FFI_MAX_EXTRA]
    # The variant pack of the last call, reused while the addresses repeat (XLA reuses its buffers).
    void* cached_pack
    int cached_n
    void* cached_ptrs[FFI_MAX_TENSORS + FFI_MAX_EXTRA]
    void* cached_workspace


# The handlers XLA calls (one per traits value: XLA reads traits per registered target).
cdef XLA_FFI_Error* plan_handler(XLA_FFI_CallFrame* frame) noexcept nogil
cdef XLA_FFI_Error* plan_handler_command_buffer(XLA_FFI_CallFrame* frame) noexcept nogil
