# cuDNN handles and what each thread keeps: its handle per device and its cache of finalized variant
# packs (the cache's logic lives in cudnn_graph._graph_replay), plus the process-wide switches the
# execute path reads.
from libc.stdint cimport int64_t, intptr_t

cdef enum:
    BACKEND_MAX_DEVICES = 64            # handles per thread are kept in a list indexed by ordinal
    VARIANT_PACK_CACHE_ENTRIES = 4      # finalized variant packs kept per thread (content-keyed)
    VARIANT_PACK_CACHE_OPERANDS = 32    # larger packs are built per call and never cached


# Process-wide switches (set through the Python functions of this module; read by the execute path).
cdef bint interpreter_finalizing        # interpreter exit: leave descriptors and handles to the OS
cdef bint variant_pack_cache_enabled    # reuse finalized variant packs when uids/pointers repeat
cdef bint cuda_graph_replay_on          # replay repeated executes as CUDA graphs
cdef bint cuda_graph_capture_on         # record a graph cuDNN cannot populate by capturing its execute


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


cdef class ThreadState:
    cdef list _handles                  # device ordinal -> Handle (None until first use)
    cdef VariantPackCacheEntry _entries[VARIANT_PACK_CACHE_ENTRIES]
    cdef int _next_victim
    cdef list _graph_plans              # per entry: the plan Descriptor its graph replays, or None

    cdef Handle handle_for(self, int device)
    cdef void _drop_graph(self, int at) noexcept
    cdef int _count_entries(self, bint with_graph) noexcept


# This thread's ThreadState (created on first use; kept in the interpreter's per-thread dict, so it goes
# when the thread does).
cdef ThreadState thread_state()
