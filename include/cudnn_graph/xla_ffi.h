/* The part of XLA's typed FFI C ABI (xla/ffi/api/c_api.h) that cudnn_graph's custom-call handler uses,
 * declared here from the ABI's documented layout: the project's one source of these facts.
 *
 * Facts relied on (read from jaxlib 0.10.2's shipped header, API version 0.3):
 * - every struct begins with `size_t struct_size`; the framework fills it with the size it knows, so a
 *   field past the end of the framework's struct must not be read (the XLA_FFI_Api table grows at its
 *   end with each minor version; fields are never reordered within a major version);
 * - a handler is `XLA_FFI_Error* handler(XLA_FFI_CallFrame*)`; NULL means success;
 * - XLA asks a handler for its metadata (API version, traits) by calling it with a call frame whose
 *   extension chain holds an XLA_FFI_Metadata_Extension and whose `api` is NULL;
 * - the framework registers a handler only when the version the handler reports matches its own (a
 *   handler therefore reports the version of the framework that loads it, see cudnn_graph._xla_ffi).
 */
#ifndef CUDNN_GRAPH_XLA_FFI_H_
#define CUDNN_GRAPH_XLA_FFI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The API version these declarations were written against. */
#define CG_XLA_FFI_API_MAJOR 0
#define CG_XLA_FFI_API_MINOR 3

typedef enum {
  XLA_FFI_Extension_Metadata = 1
} XLA_FFI_Extension_Type;

typedef struct XLA_FFI_Extension_Base {
  size_t struct_size;
  XLA_FFI_Extension_Type type;
  struct XLA_FFI_Extension_Base* next;
} XLA_FFI_Extension_Base;

typedef struct XLA_FFI_Api_Version {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int major_version;
  int minor_version;
} XLA_FFI_Api_Version;

typedef struct XLA_FFI_Error XLA_FFI_Error;                      /* opaque, owned by the framework */
typedef struct XLA_FFI_ExecutionContext XLA_FFI_ExecutionContext;  /* opaque */
typedef struct XLA_FFI_Future XLA_FFI_Future;                    /* opaque */

typedef enum {
  XLA_FFI_Error_Code_OK = 0,
  XLA_FFI_Error_Code_UNKNOWN = 2,
  XLA_FFI_Error_Code_INVALID_ARGUMENT = 3,
  XLA_FFI_Error_Code_NOT_FOUND = 5,
  XLA_FFI_Error_Code_RESOURCE_EXHAUSTED = 8,
  XLA_FFI_Error_Code_FAILED_PRECONDITION = 9,
  XLA_FFI_Error_Code_UNIMPLEMENTED = 12,
  XLA_FFI_Error_Code_INTERNAL = 13
} XLA_FFI_Error_Code;

typedef struct XLA_FFI_Error_Create_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  const char* message;           /* copied by the framework */
  XLA_FFI_Error_Code errc;
} XLA_FFI_Error_Create_Args;

/* Element types: the ABI's numbering (not the DLPack one). */
typedef enum {
  XLA_FFI_DataType_INVALID = 0,
  XLA_FFI_DataType_PRED = 1,
  XLA_FFI_DataType_S8 = 2,
  XLA_FFI_DataType_S16 = 3,
  XLA_FFI_DataType_S32 = 4,
  XLA_FFI_DataType_S64 = 5,
  XLA_FFI_DataType_U8 = 6,
  XLA_FFI_DataType_U16 = 7,
  XLA_FFI_DataType_U32 = 8,
  XLA_FFI_DataType_U64 = 9,
  XLA_FFI_DataType_F16 = 10,
  XLA_FFI_DataType_F32 = 11,
  XLA_FFI_DataType_F64 = 12,
  XLA_FFI_DataType_BF16 = 16,
  XLA_FFI_DataType_F8E5M2 = 19,
  XLA_FFI_DataType_F8E4M3FN = 20
} XLA_FFI_DataType;

typedef struct XLA_FFI_Buffer {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_DataType dtype;
  void* data;
  int64_t rank;
  int64_t* dims;                 /* rank entries; the layout is dense row-major */
} XLA_FFI_Buffer;

typedef enum { XLA_FFI_ArgType_BUFFER = 1 } XLA_FFI_ArgType;
typedef enum { XLA_FFI_RetType_BUFFER = 1 } XLA_FFI_RetType;
typedef enum {
  XLA_FFI_AttrType_ARRAY = 1,
  XLA_FFI_AttrType_DICTIONARY = 2,
  XLA_FFI_AttrType_SCALAR = 3,
  XLA_FFI_AttrType_STRING = 4
} XLA_FFI_AttrType;

typedef struct XLA_FFI_ByteSpan {
  const char* ptr;
  size_t len;
} XLA_FFI_ByteSpan;

typedef struct XLA_FFI_Scalar {
  XLA_FFI_DataType dtype;
  void* value;
} XLA_FFI_Scalar;

typedef enum {
  XLA_FFI_ExecutionStage_INSTANTIATE = 0,
  XLA_FFI_ExecutionStage_PREPARE = 1,
  XLA_FFI_ExecutionStage_INITIALIZE = 2,
  XLA_FFI_ExecutionStage_EXECUTE = 3
} XLA_FFI_ExecutionStage;

typedef struct XLA_FFI_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_ArgType* types;
  void** args;                   /* XLA_FFI_Buffer* for BUFFER */
} XLA_FFI_Args;

typedef struct XLA_FFI_Rets {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_RetType* types;
  void** rets;                   /* XLA_FFI_Buffer* for BUFFER */
} XLA_FFI_Rets;

typedef struct XLA_FFI_Attrs {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_AttrType* types;
  XLA_FFI_ByteSpan** names;
  void** attrs;                  /* XLA_FFI_Scalar* for SCALAR */
} XLA_FFI_Attrs;

typedef struct XLA_FFI_Api XLA_FFI_Api;

typedef struct XLA_FFI_CallFrame {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  const XLA_FFI_Api* api;
  XLA_FFI_ExecutionContext* ctx;
  XLA_FFI_ExecutionStage stage;
  XLA_FFI_Args args;
  XLA_FFI_Rets rets;
  XLA_FFI_Attrs attrs;
  XLA_FFI_Future* future;
} XLA_FFI_CallFrame;

typedef XLA_FFI_Error* XLA_FFI_Handler(XLA_FFI_CallFrame* call_frame);

/* Handler traits (a bit set). */
#define XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE 1u
typedef uint32_t XLA_FFI_Handler_Traits;

typedef struct XLA_FFI_TypeId {
  int64_t type_id;
} XLA_FFI_TypeId;

typedef struct XLA_FFI_Metadata {
  size_t struct_size;
  XLA_FFI_Api_Version api_version;
  XLA_FFI_Handler_Traits traits;
  XLA_FFI_TypeId state_type_id;  /* present from 0.2 on; left as the framework set it */
} XLA_FFI_Metadata;

typedef struct XLA_FFI_Metadata_Extension {
  XLA_FFI_Extension_Base extension_base;
  XLA_FFI_Metadata* metadata;
} XLA_FFI_Metadata_Extension;

typedef struct XLA_FFI_Stream_Get_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  void* stream;                  /* out: the platform stream (cudaStream_t on CUDA) */
} XLA_FFI_Stream_Get_Args;

typedef struct XLA_FFI_DeviceOrdinal_Get_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  int32_t device_ordinal;        /* out */
} XLA_FFI_DeviceOrdinal_Get_Args;

/* Entries of the function table the handler does not call are declared as plain pointers: only their
 * positions matter. */
typedef XLA_FFI_Error* (*XLA_FFI_Error_Create_Fn)(XLA_FFI_Error_Create_Args* args);
typedef XLA_FFI_Error* (*XLA_FFI_Stream_Get_Fn)(XLA_FFI_Stream_Get_Args* args);
typedef XLA_FFI_Error* (*XLA_FFI_DeviceOrdinal_Get_Fn)(XLA_FFI_DeviceOrdinal_Get_Args* args);

struct XLA_FFI_Api {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Api_Version api_version;
  const void* internal_api;
  XLA_FFI_Error_Create_Fn XLA_FFI_Error_Create;
  void* XLA_FFI_Error_GetMessage;
  void* XLA_FFI_Error_Destroy;
  void* XLA_FFI_Handler_Register;
  XLA_FFI_Stream_Get_Fn XLA_FFI_Stream_Get;
  void* XLA_FFI_Type_Register;
  void* XLA_FFI_ExecutionContext_Get;
  void* XLA_FFI_State_Set;
  void* XLA_FFI_State_Get;
  void* XLA_FFI_DeviceMemory_Allocate;
  void* XLA_FFI_DeviceMemory_Free;
  void* XLA_FFI_ThreadPool_Schedule;
  void* XLA_FFI_ThreadPool_NumThreads;
  void* XLA_FFI_Future_Create;
  void* XLA_FFI_Future_SetAvailable;
  void* XLA_FFI_Future_SetError;
  void* XLA_FFI_RunId_Get;
  XLA_FFI_DeviceOrdinal_Get_Fn XLA_FFI_DeviceOrdinal_Get;
};

/* The table size a framework must report for the handler to call an entry (its end offset). */
#define CG_XLA_FFI_API_HAS(api, field) \
  ((api)->struct_size >= offsetof(XLA_FFI_Api, field) + sizeof(((XLA_FFI_Api*)0)->field))
#define CG_XLA_FFI_API_HAS_ERROR_CREATE(api) CG_XLA_FFI_API_HAS(api, XLA_FFI_Error_Create)
#define CG_XLA_FFI_API_HAS_STREAM_GET(api) CG_XLA_FFI_API_HAS(api, XLA_FFI_Stream_Get)
#define CG_XLA_FFI_API_HAS_DEVICE_ORDINAL_GET(api) CG_XLA_FFI_API_HAS(api, XLA_FFI_DeviceOrdinal_Get)

#ifdef __cplusplus
}
#endif

#endif  /* CUDNN_GRAPH_XLA_FFI_H_ */
