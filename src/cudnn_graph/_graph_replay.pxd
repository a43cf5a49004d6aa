# The execute of a plan on a variant pack: the per-thread variant-pack cache (fill, reuse, evict) and
# CUDA graph replay of a repeated pack (populate or capture once, then launch), with the GIL released.
from libc.stdint cimport int64_t, intptr_t
from cudnn_graph._loader cimport CudnnApi
from cudnn_graph._cudnn_handle cimport ThreadState


# How a plan's CUDA graphs are recorded (PlanRunner._graph_support).
cdef enum:
    GRAPH_UNTRIED = 0
    GRAPH_BY_POPULATE = 1               # cudnnBackendPopulateCudaGraph
    GRAPH_BY_CAPTURE = 2                # cuDNN refused to populate: a stream capture of its execute
    GRAPH_NONE = -1                     # neither works: the plan always executes

# What the execute path needs to replay a CUDA graph instead of calling cudnnBackendExecute.
ctypedef struct GraphReplay:
    intptr_t stream                     # where the caller asked the work to go
    int* plan_support                   # PlanRunner._graph_support: how (or whether) graphs are recorded
    void* plan_owner                    # PyObject* (borrowed) of the plan Descriptor, kept by the entry


# The operands of one execute as C arrays, uids ascending (a VariantPack's, or arrays a caller filled).
ctypedef struct Operands:
    int n
    const int64_t* uids
    void* const* ptrs


# The backend reads override shapes / strides (VARIANT_PACK_OVERRIDE_SHAPES / _STRIDES, one VOID_PTR
# element each) as a vector of int64 vectors in the libstdc++ layout: three pointers (begin, end,
# capacity end) for the outer vector, whose elements are three-pointer int64 vectors, one per uid.
ctypedef struct Int64Row:
    int64_t* begin
    int64_t* end
    int64_t* capacity_end

ctypedef struct Int64Rows:
    Int64Row* begin
    Int64Row* end
    Int64Row* capacity_end

ctypedef struct OverrideArrays:
    int n
    const int64_t* uids
    Int64Rows* shapes
    Int64Rows* strides


# Build the variant pack from the operands' uid / pointer arrays (plus ``extra`` operands the plan
# supplies itself) and run cudnnBackendExecute with the GIL released. ``state`` (may be None)
# holds this thread's cache of finalized variant packs; ``replay`` (may be NULL) lets a repeated
# pack run as a CUDA graph.
cdef int execute_plan(void* handle, void* plan, const Operands* operands, void* workspace,
                      const int64_t* extra_uids, void* const* extra_ptrs, int n_extra,
                      ThreadState state, const OverrideArrays* overrides=*,
                      GraphReplay* replay=*) except -1

# execute_plan on operands given as separate arrays.
cdef int execute_operands(void* handle, void* plan, int n, const int64_t* uids, void* const* ptrs,
                          void* workspace, const int64_t* extra_uids, void* const* extra_ptrs, int n_extra,
                          ThreadState state, const OverrideArrays* overrides,
                          GraphReplay* replay=*) except -1

# The pieces the measurement helpers (cudnn_graph._bench_timing) time on their own.
cdef int build_variant_pack(CudnnApi* api, int n, const int64_t* uids, void* const* ptrs,
                            void* workspace, void** out, int* stage,
                            const OverrideArrays* overrides=*) noexcept nogil
cdef int record_graph(CudnnApi* api, void* handle, void* plan, void* vp, intptr_t stream, int* method,
                      void** graph_exec, int* status, int* stage) noexcept nogil
cdef bint capture_allowed() noexcept nogil
cdef const char* stage_name(int stage) noexcept nogil     # what failed, for a ``stage`` set above
