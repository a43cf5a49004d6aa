from libc.stdint cimport int64_t, intptr_t, uintptr_t
from cudnn_graph._variant_pack cimport PackLayout
from cudnn_graph._lanes cimport Lanes

cdef enum:
    TILE_MAX_KERNELS = 64          # launches of one plan
    TILE_MAX_PARAMS = 256          # parameters of one kernel (an array takes 1 + 2 * ndim)
    TILE_MAX_PARAM_BYTES = 4096    # the classic CUDA kernel-parameter limit
    TILE_MAX_OPERANDS = 64         # graph operands one plan binds
    TILE_MAX_WORKSPACES = 8        # streams whose own workspace block is remembered in C

# One kernel of a plan: its prebuilt parameter buffer and where each call's addresses go into it.
cdef struct TileKernel:
    void* function                 # CUkernel (cuLibraryGetKernel); NULL: never launched (tests)
    unsigned int grid[3]
    unsigned int block[3]          # (1, 1, 1) for a tile kernel (the driver sizes it from the cubin)
    unsigned int shared_bytes      # dynamic shared memory (0 for a tile kernel)
    int nbytes
    int nparams
    int npatches
    int* offsets                   # per parameter, its byte offset in the buffer
    unsigned char* image           # the buffer: extents, strides and fixed addresses written once
    int* patch_offset              # per address the call supplies: where it goes,
    int* patch_source              # which operand (an index into the plan's operands; -1: the workspace)
    int64_t* patch_add             # and the bytes added to it (a workspace region's offset)
    int lane                       # 0: the caller's stream; 1: the plan's side stream (_lanes.Lanes)
    int wait_event                 # the event its stream waits on first (-1: none)
    int record_event               # the event recorded on its stream after it (-1: none)


cdef class TileLaunch:
    cdef PackLayout _layout
    cdef int _n_kernels
    cdef TileKernel* _kernels
    cdef int _n_operands
    cdef int64_t _uids[TILE_MAX_OPERANDS]
    cdef int64_t _align[TILE_MAX_OPERANDS]
    cdef tuple _names
    cdef int _ordinal
    cdef int _n_ws
    cdef intptr_t _ws_stream[TILE_MAX_WORKSPACES]
    cdef uintptr_t _ws_base[TILE_MAX_WORKSPACES]
    cdef object _workspaces        # stream -> (base, [(stream, base), ...] of every live block)
    cdef object _keepalive         # what owns the loaded libraries
    cdef object _lanes_for         # stream -> its Lanes; None where every kernel runs on the caller's stream

    # Pack ``mapping`` (every check of execute()) into per-operand addresses; returns what must stay
    # alive until the launches are issued.
    cdef object fill(self, object mapping, object stream, uintptr_t* addresses, intptr_t* stream_out)
    cdef int _check_alignment(self, int i, uintptr_t p) except -1
    cdef uintptr_t workspace_for(self, intptr_t stream) except? 0
    # Kernel ``k``'s parameter buffer for these addresses into ``buffer`` and its parameter pointers.
    cdef void patch(self, int k, const uintptr_t* addresses, uintptr_t workspace, unsigned char* buffer,
                    void** params) noexcept nogil
    cdef Lanes lanes_for(self, intptr_t stream)
    cdef int launch_all(self, const uintptr_t* addresses, uintptr_t workspace, intptr_t stream,
                        Lanes lanes) noexcept nogil
    cdef int n_kernels(self) noexcept nogil
    cdef TileKernel* kernel(self, int k) noexcept nogil
