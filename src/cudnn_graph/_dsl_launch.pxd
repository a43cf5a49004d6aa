from libc.stdint cimport int32_t, int64_t, intptr_t
from cudnn_graph._variant_pack cimport PackLayout

cdef enum:
    DSL_MAX_ARGS = 32            # the DSL's packed-argument array: base arguments + result + kernels
    DSL_MAX_POINTERS = 8
    DSL_MAX_FLOATS = 4
    DSL_MAX_INTS = 4
    DSL_REPLAY_GRAPHS = 16       # CUDA graphs a launch keeps (one per argument set seen twice); never evicted

# What dsl_fill reports (DslFillFailure.what).
cdef enum:
    DSL_FILL_OK = 0
    DSL_FILL_MISALIGNED = 1      # an operand's address is not aligned as the kernel needs
    DSL_FILL_NO_SCALAR = 2       # a host scalar with no operand and no value in the graph

# A DSL-compiled host entry: takes the packed-argument array (each entry the address of one argument's
# value, then the result cell and, in the DSL's JIT, the module's kernel handles) and its length. The
# JIT's entry reads only the array (the length, an extra register argument, is ignored by the C calling
# convention); an exported entry (``export_to_c``, loaded as a shared object) takes both.
ctypedef int32_t (*dsl_entry_t)(void** args, int32_t num_args) noexcept nogil

# One call's argument values and the packed array pointing at them: on the caller's C stack.
cdef struct LaunchCells:
    void* pointers[DSL_MAX_POINTERS]
    float floats[DSL_MAX_FLOATS]
    int32_t ints[DSL_MAX_INTS]
    intptr_t stream
    int32_t result
    void* args[DSL_MAX_ARGS]

# Everything a launch needs, as plain C: what a caller without the GIL (the XLA FFI handler) reads.
cdef struct DslLaunch:
    dsl_entry_t entry
    int nargs                            # entries of the template
    void* template[DSL_MAX_ARGS]
    int n_pointers                       # operands the plan binds, in the first pointer slots
    int pointer_slots                    # pointer arguments of the entry (>= n_pointers)
    int64_t pointer_uids[DSL_MAX_POINTERS]
    int64_t pointer_align[DSL_MAX_POINTERS]
    int n_floats                         # float arguments of the entry (the scalars' slots)
    int n_scalars                        # of those, read from host scalar operands
    int64_t scalar_uids[DSL_MAX_FLOATS]
    bint scalar_is_double[DSL_MAX_FLOATS]
    bint scalar_has_default[DSL_MAX_FLOATS]   # a pass-by-value tensor with a value: the operands
    float scalar_default[DSL_MAX_FLOATS]       # may leave it out
    int n_ints
    int32_t ints[DSL_MAX_INTS]           # fixed int32 arguments (a shape class's extents)
    int result_index                     # where the CUDA-result cell goes, -1: none

# Which operand a failed fill is about.
cdef struct DslFillFailure:
    int what                             # DSL_FILL_*
    int index                            # the pointer argument (MISALIGNED) or scalar (NO_SCALAR)
    int64_t uid
    int64_t align
    void* address


# Pack raw (uid, address) operands and the stream into ``cells`` for ``launch``: DSL_FILL_OK, or what
# failed (described in ``failure``). The caller checked the operands' geometry; an operand missing from
# the arrays gets a NULL address (only an empty extent can be missing). Host scalars are read through
# their addresses.
cdef int dsl_fill(const DslLaunch* launch, const int64_t* uids, void** ptrs, Py_ssize_t n, intptr_t stream,
                  LaunchCells* cells, DslFillFailure* failure) noexcept nogil


# The arguments one CUDA graph of a launch was recorded with (operand addresses and f32 scalars: the values
# a graph freezes; the extents and the result cell are the launch's own).
cdef struct ReplayArgs:
    void* pointers[DSL_MAX_POINTERS]
    float floats[DSL_MAX_FLOATS]


cdef class PackedLaunch:
    cdef DslLaunch _launch
    cdef PackLayout _layout
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
    # The launch as plain C, valid while this object lives (callers without the GIL keep a reference).
    cdef const DslLaunch* c_launch(self) noexcept nogil
    cdef _raise_failure(self, DslFillFailure* failure)   # the typed error execute() raises for it
