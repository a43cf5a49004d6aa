from libc.stdint cimport int32_t, int64_t, intptr_t
from cudnn_graph._dlpack cimport (DLTensor, DLDataType, DLDevice, DLManagedTensor,
                                  DLManagedTensorVersioned)

cdef enum:
    SLOT_INLINE_DIMS = 6       # shapes up to this rank need no heap storage
    SLOT_MAX_NDIM = 64         # anything larger is treated as a malformed tensor

cdef class Slot:
    # data has the producer's byte_offset folded in; tensor.byte_offset is always 0.
    cdef DLTensor tensor
    cdef int64_t _inline[2 * SLOT_INLINE_DIMS]
    cdef int64_t* _heap
    cdef object _owner                  # the producer object keeping the memory alive, or None
    # An imported managed tensor the slot owns (at most one is set): its deleter runs exactly once,
    # when the slot dies. Held here rather than in a separate owner object: one allocation less.
    cdef DLManagedTensorVersioned* _managed_v
    cdef DLManagedTensor* _managed_l
    cdef bint _readonly
    cdef intptr_t _producer_stream      # CUDA-array-interface v3 stream, 0 when none

    cdef int _alloc_geometry(self, int ndim) except -1
    cdef int _fill(self, const DLTensor* src, bint null_strides_are_row_major, object what) except -1
    cdef void _release(self) noexcept


cdef Slot slot_from_object(object obj, object stream)
cdef Slot slot_from_address(intptr_t ptr, object shape, object strides, DLDataType dtype,
                            DLDevice device, bint readonly)
cdef int64_t slot_numel(Slot s) noexcept
cdef Slot slot_or_view(object obj, object stream, DLTensor* view)
