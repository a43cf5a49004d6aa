# A compiled plan's execute: PlanRunner (a finalized execution plan plus everything its execute needs,
# prepared once: handle and stream, workspace, alignment checks, the operands the plan supplies itself)
# and ShapeOverrides (execute-time shapes / strides in the layout cuDNN reads).
from libc.stdint cimport int64_t, intptr_t, uint8_t
from cudnn_graph._variant_pack cimport VariantPack, PackLayout
from cudnn_graph._cudnn_descriptor cimport Descriptor
from cudnn_graph._cudnn_handle cimport ThreadState
from cudnn_graph._graph_replay cimport Operands, OverrideArrays, GraphReplay, Int64Row, Int64Rows

cdef enum:
    PLAN_MAX_CONSTANTS = 16             # pass-by-value scalars a plan can supply itself
    PLAN_MAX_ALIASES = 16               # views a plan feeds from another operand's pointer
    PLAN_MAX_FIXED = 16                 # operands a plan always supplies (its own constants)
    PLAN_MAX_SCRATCH = 16               # plan-owned tensors carved from the workspace
    PLAN_MAX_EXTRA = 64                 # the sum of the four above


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


# The operands exactly as an execute passes them to cuDNN (the pack's, less omitted ones, plus the
# operands the plan supplies), in arrays malloc'ed here (the caller frees them); returns how many.
cdef int operands_as_executed(PlanRunner runner, const Operands* operands, void* ws, int64_t** uids,
                              void*** ptrs) except -1
