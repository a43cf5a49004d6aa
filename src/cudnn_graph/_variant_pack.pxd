from libc.stdint cimport int32_t, int64_t, intptr_t
from cudnn_graph._dlpack cimport DLDataType, DLDevice
from cudnn_graph._slot cimport Slot, SLOT_MAX_NDIM

cdef enum:
    PACK_INLINE = 16     # packs up to this many operands keep their arrays inline
    PACK_DENSE_UIDS = 256  # uids below this resolve through an array, not the dict

cdef class TensorSpec:
    cdef readonly str name
    cdef readonly int64_t uid
    cdef readonly tuple shape
    cdef readonly object strides          # tuple, or None when any layout is accepted
    cdef readonly bint is_output
    cdef readonly bint required
    cdef readonly int64_t alignment
    cdef DLDataType _dtype
    cdef DLDevice _device
    cdef int _ndim
    cdef int64_t _shape[SLOT_MAX_NDIM]
    cdef int64_t _strides[SLOT_MAX_NDIM]
    cdef bint _empty                      # some extent is 0: a NULL address is fine
    cdef bint _overlapping                # the declared strides make two indices share an element


cdef class PackLayout:
    cdef readonly tuple specs             # sorted by uid
    cdef dict _index                      # uid -> position
    cdef dict _by_name                    # name -> uid (a tuple of uids for a name several tensors share)
    cdef int32_t _dense[PACK_DENSE_UIDS]  # uid -> position + 1 for small uids (0: not in the layout)
    # The graph the layout was made for, as an identity (never dereferenced): a Tensor key whose graph
    # is another is refused with one pointer compare. NULL: a graph-less layout, Tensor keys by uid.
    cdef void* _graph_id
    cdef object _graph_ref                # a weakref to that graph (for messages), or None
    # uids and names of the graph's tensors that no node reads: a pack may key them (cudnn.pygraph code
    # does) and they are skipped, looked up only for a key that names no operand.
    cdef frozenset _ignored


cdef class VariantPack:
    # Per operand: a Slot, an int address not yet made a Slot, or a producer object whose borrowed
    # exchange-table view was checked (made a Slot only if .slots is read).
    cdef tuple _items
    cdef tuple _slots                     # made on first access of .slots
    cdef readonly PackLayout layout
    cdef int _n
    cdef int64_t _uid_inline[PACK_INLINE]
    cdef void* _ptr_inline[PACK_INLINE]
    cdef int64_t* _uids
    cdef void** _ptrs


cdef int check_slot(Slot s, TensorSpec spec) except -1
cdef VariantPack pack_from_mapping(object mapping, PackLayout layout, object stream)
# pack_from_mapping's checks with no VariantPack: the operands (uids ascending) go into the caller's
# arrays (``capacity`` entries; a layout with more specs is refused), ``*count`` gets how many. Returns
# what the caller must keep alive until its launch is issued (the Slots made here), or None.
cdef object pack_into(object mapping, PackLayout layout, object stream, int64_t* uids, void** ptrs,
                      Py_ssize_t capacity, Py_ssize_t* count)
