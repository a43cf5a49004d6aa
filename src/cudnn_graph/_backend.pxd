# cuDNN backend objects: descriptors, handles, per-thread state and the execute hot path.
#
# Everything here runs on the dlopen'ed API of cudnn_graph._loader; nothing links against cuDNN.
from libc.stdint cimport int32_t, int64_t, intptr_t, uint8_t
from cudnn_graph._variant_pack cimport VariantPack, PackLayout

cdef enum:
    BACKEND_MAX_DEVICES = 64            # handles per thread are kept in a list indexed by ordinal
    VARIANT_PACK_CACHE_ENTRIES = 4      # finalized variant packs kept per thread (content-keyed)
    VARIANT_PACK_CACHE_OPERANDS = 32    # larger packs are built per call and never cached
    PLAN_MAX_CONSTANTS = 16             # pass-by-value scalars a plan can supply itself
    PLAN_MAX_ALIASES = 16               # views a plan feeds from another operand's pointer
    PLAN_MAX_FIXED = 16                 # operands a plan always supplies (its own constants)
    PLAN_MAX_SCRATCH = 16               # plan-owned tensors carved from the workspace
    PLAN_MAX_EXTRA = 64                 # the sum of the four above


cdef class Descriptor:
    cdef void* ptr                      # cudnnBackendDescriptor_t, destroyed in __dealloc__
    cdef readonly int descriptor_type
    cdef readonly bint finalized
    cdef object _children               # descriptors this one references (kept alive with it)

    cdef int set_raw(self, int32_t attribute, int32_t attribute_type, int64_t count,
                     const void* elements) except -1
    cdef int64_t get_raw(self, int32_t attribute, int32_t attribute_type, int64_t capacity,
                         void* elements) except -1
    cdef int finalize_raw(self) except -1
    cdef list _get_numbers(self, object attribute, int32_t kind, Py_ssize_t capacity)


cdef class Handle:
    cdef void* ptr                      # cudnnHandle_t
    cdef readonly int device
    cdef intptr_t _stream               # the stream last set on it through cudnn_graph
    cdef bint _owned                    # destroyed with the object (handles we created)

    cdef int bind_stream(self, intptr_t stream) except -1


ctypedef struct VariantPackCacheEntry:
    void* descriptor                    # a finalized CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, or NULL
    void* workspace
    int count
    int64_t uids[VARIANT_PACK_CACHE_OPERANDS]
    void* ptrs[VARIANT_PACK_CACHE_OPERANDS]
    void* last_plan                     # the plan that last ran with this pack: a repeat earns a graph
    void* graph_exec                    # CUgraphExec replaying graph_plan on this pack, or NULL
    void* graph_plan                    # set with graph_exec (ThreadState._graph_plans keeps it alive)
    bint no_graph                       # the pack reads host memory (by-value operands): never replayed


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


cdef class ThreadState:
    cdef list _handles                  # device ordinal -> Handle (None until first use)
    cdef VariantPackCacheEntry _entries[VARIANT_PACK_CACHE_ENTRIES]
    cdef int _next_victim
    cdef list _graph_plans              # per entry: the plan Descriptor its graph replays, or None

    cdef Handle handle_for(self, int device)
    cdef void _drop_graph(self, int at) noexcept


# This thread's ThreadState (created on first use; kept in the interpreter's per-thread dict, so it goes
# when the thread does).
cdef ThreadState thread_state()


# The operands of one execute as C arrays, uids ascending (a VariantPack's, or arrays a caller filled).
ctypedef struct Operands:
    int n
    const int64_t* uids
    void* const* ptrs

# Build the variant pack from the operands' uid / pointer arrays (plus ``extra`` operands the plan
# supplies itself) and run cudnnBackendExecute with the GIL released. ``state`` (may be None)
# holds this thread's cache of finalized variant packs; ``replay`` (may be NULL) lets a repeated
# pack run as a CUDA graph.
cdef int execute_plan(void* handle, void* plan, const Operands* operands, void* workspace,
                      const int64_t* extra_uids, void* const* extra_ptrs, int n_extra,
                      ThreadState state, const OverrideArrays* overrides=*,
                      GraphReplay* replay=*) except -1


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


cdef class ShapeOverrides:
    cdef OverrideArrays arrays
    cdef Int64Rows _shapes
    cdef Int64Rows _strides
    cdef Int64Row* _rows              # n shape rows, then n stride rows
    cdef int64_t* _values             # uids, then every shape, then every stride
    cdef readonly tuple uids
    cdef readonly tuple shapes
    cdef readonly tuple strides


cdef class PlanRunner:
    cdef Descriptor _plan
    cdef readonly int64_t workspace_size
    cdef readonly int device
    cdef readonly str name
    cdef object _keepalive              # the lowered graph the plan was finalized from
    cdef int _n_constants
    cdef int64_t _constant_uids[PLAN_MAX_CONSTANTS]
    cdef void* _constant_ptrs[PLAN_MAX_CONSTANTS]
    cdef object _constant_storage       # host arrays behind _constant_ptrs
    cdef int _n_aliases
    cdef int64_t _alias_views[PLAN_MAX_ALIASES]     # uid cuDNN reads ...
    cdef int64_t _alias_sources[PLAN_MAX_ALIASES]   # ... at this pack operand's pointer ...
    cdef int64_t _alias_offsets[PLAN_MAX_ALIASES]   # ... plus this many bytes
    cdef int _n_fixed
    cdef int64_t _fixed_uids[PLAN_MAX_FIXED]
    cdef void* _fixed_ptrs[PLAN_MAX_FIXED]
    cdef object _fixed_storage          # what keeps _fixed_ptrs alive (host arrays, device allocations)
    cdef int _n_scratch
    cdef int64_t _scratch_uids[PLAN_MAX_SCRATCH]
    cdef int64_t _scratch_offsets[PLAN_MAX_SCRATCH]  # bytes from the workspace's start
    cdef int64_t _scratch_bytes[PLAN_MAX_SCRATCH]
    cdef bint _scratch_zero[PLAN_MAX_SCRATCH]         # zero-filled on the stream before each execute
    cdef readonly int64_t cudnn_workspace_size        # what cuDNN itself asked for
    cdef int _n_omit
    cdef int64_t _omit_uids[PLAN_MAX_ALIASES]         # pack operands no cuDNN operation reads
    cdef dict _workspaces               # stream handle -> DeviceAllocation
    cdef object _workspace_lock
    cdef object _checked_layout         # the PackLayout _device_operand was computed for
    cdef int _n_specs
    cdef uint8_t* _device_operand       # per layout position: 1 for device operands (16-byte aligned)
    cdef int _n_device_uids
    cdef int64_t* _device_uids          # the layout's device-operand uids, ascending
    cdef intptr_t _last_stream          # the stream whose cached workspace _last_workspace is ...
    cdef void* _last_workspace          # ... (NULL: none remembered); a one-entry cache before the dict
    cdef PackLayout _bound_layout       # the graph's layout, for execute_mapping
    cdef int _graph_support             # GRAPH_*: how this plan's graphs are recorded, once known

    cdef int _run(self, VariantPack pack, object handle, object stream, object workspace,
                  ShapeOverrides overrides=*) except -1
    # _run on operands given as C arrays: no VariantPack object is needed (``layout`` may be None).
    cdef int _run_operands(self, PackLayout layout, const Operands* operands, object handle, object stream,
                           object workspace, ShapeOverrides overrides) except -1
    cdef int _extras(self, const Operands* operands, void* ws, int64_t* extra_uids, void** extra_ptrs) except -1
    cdef int _kept_operands(self, const Operands* operands, int64_t* uids, void** ptrs) noexcept
    cdef int _execute_without_omitted(self, void* handle_ptr, const Operands* operands, void* ws,
                                      const int64_t* extra_uids, void* const* extra_ptrs, int n_extra,
                                      ThreadState state, ShapeOverrides overrides,
                                      GraphReplay* replay) except -1
    cdef void* _workspace_pointer(self, object workspace, intptr_t stream_key) except? NULL
    cdef int _check_alignment(self, PackLayout layout, const Operands* operands) except -1
    cdef int _prepare_layout(self, PackLayout layout) except -1
