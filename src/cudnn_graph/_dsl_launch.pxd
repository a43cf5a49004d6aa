from libc.stdint cimport int32_t, int64_t, intptr_t
from cudnn_graph._variant_pack cimport PackLayout

cdef enum:
    DSL_MAX_ARGS = 32            # the DSL's packed-argument array: base arguments + result + kernels
    DSL_MAX_POINTERS = 8
    DSL_MAX_FLOATS = 4
    DSL_MAX_INTS = 4
    DSL_REPLAY_GRAPHS = 16       # CUDA graphs a launch keeps (one per argument set seen twice); never evicted

# A DSL-compiled host entry: takes the packed-argument array (each entry the address of one argument's
# value, then the result cell and, in the DSL's JIT, the module's kernel handles) and its length. The
# JIT's entry reads only the array (the length, an extra register argument, is ignored by the C calling
# convention); an exported entry (``export_to_c``) takes both.
ctypedef int32_t (*dsl_entry_t)(void** args, int32_t num_args) noexcept nogil

# One call's argument values and the packed array pointing at them: on the caller's C stack.
cdef struct LaunchCells:
    void* pointers[DSL_MAX_POINTERS]
    float floats[DSL_MAX_FLOATS]
    int32_t ints[DSL_MAX_INTS]
    intptr_t stream
    int32_t result
    void* args[DSL_MAX_ARGS]


# The arguments one CUDA graph of a launch was recorded with (operand addresses and f32 scalars: the values
# a graph freezes; the extents and the result cell are the launch's own).
cdef struct ReplayArgs:
    void* pointers[DSL_MAX_POINTERS]
    float floats[DSL_MAX_FLOATS]


cdef class PackedLaunch:
    cdef PackLayout _layout
    cdef dsl_entry_t _entry
    cdef int _nargs                          # entries of the template
    cdef void* _template[DSL_MAX_ARGS]
    cdef int _n_pointers                     # operands the plan binds, in the first pointer slots
    cdef int _pointer_slots                  # pointer arguments of the entry (>= _n_pointers)
    cdef int64_t _pointer_uids[DSL_MAX_POINTERS]
    cdef int64_t _pointer_align[DSL_MAX_POINTERS]
    cdef int _n_floats                       # float arguments of the entry (the scalars' slots)
    cdef int _n_scalars                      # of those, read from host scalar operands
    cdef int64_t _scalar_uids[DSL_MAX_FLOATS]
    cdef bint _scalar_is_double[DSL_MAX_FLOATS]
    cdef bint _scalar_has_default[DSL_MAX_FLOATS]   # a pass-by-value tensor with a value: the mapping
    cdef float _scalar_default[DSL_MAX_FLOATS]       # may leave it out
    cdef int _n_ints
    cdef int32_t _ints[DSL_MAX_INTS]         # fixed int32 arguments (a shape class's extents)
    cdef int _result_index                   # where the CUDA-result cell goes, -1: none
    cdef tuple _names                        # per pointer argument, for messages
    cdef object _keepalive                   # the executor that owns the loaded module
    # CUDA-graph replay (the cuDNN path's policy, cudnn_graph._graph_replay): arguments seen a second time
    # in a row are recorded once as a graph, later calls with them launch it.
    cdef ReplayArgs _last                    # the arguments of the last call that ran the entry directly
    cdef bint _has_last
    cdef int _n_graphs
    cdef ReplayArgs _graph_args[DSL_REPLAY_GRAPHS]
    cdef void* _graphs[DSL_REPLAY_GRAPHS]    # CUgraphExec, launched without the GIL: destroyed only with self
    cdef bint _replay_off                    # a recording failed: this launch runs the entry from now on

    # Pack ``mapping`` into ``cells`` (every check of execute()); returns what must stay alive until the
    # entry has been called.
    cdef object fill(self, object mapping, object stream, LaunchCells* cells)
    cdef dsl_entry_t entry(self) noexcept nogil
    cdef int nargs(self) noexcept nogil
    cdef bint _same(self, const ReplayArgs* a, LaunchCells* cells) noexcept nogil
    cdef int _find_graph(self, LaunchCells* cells) noexcept nogil
    cdef bint _repeats_last(self, LaunchCells* cells) noexcept nogil
    cdef void _remember(self, LaunchCells* cells) noexcept nogil
    cdef int _record(self, LaunchCells* cells) noexcept
