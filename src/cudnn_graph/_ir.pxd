from libc.stdint cimport int64_t

cdef class Tensor:
    cdef readonly object graph
    cdef int64_t _uid
    cdef bint _uid_user
    cdef str _name
    cdef tuple _dim
    cdef tuple _stride
    cdef bint _dim_user
    cdef bint _stride_user
    cdef int _data_type
    cdef int _dtype_inferred
    cdef bint _virtual
    cdef bint _virtual_user
    cdef bint _pass_by_value
    cdef object _value
    cdef object _ragged_offset
    cdef object _producer
    cdef int _reordering
    cdef object _device

    cdef int _mutable(self) except -1


cdef class Node:
    cdef readonly str op
    cdef readonly str name
    cdef readonly object schema
    cdef readonly int index
    cdef dict _inputs
    cdef dict _outputs
    cdef dict _params
    cdef readonly int compute_data_type


cdef class Graph:
    cdef readonly object context
    cdef list _tensors
    cdef list _nodes
    cdef dict _uids
    cdef int64_t _next_uid
    cdef readonly bint frozen
    cdef object _device
    cdef readonly bint device_explicit
    cdef public object handle
    cdef object _router
    # The selected plan's one-call executor, read at C speed by cudnn_graph._execute.execute (None: not
    # looked up yet; False: the plan has none). Set by the lifecycle (cudnn_graph.graph), never here.
    cdef public object _hot
    cdef public bint _inferred       # cleared by every change; set by cudnn_graph._inference
    cdef public bint _validated      # validate() passed since the last inference (cudnn_graph.graph)

    cdef int _mutable(self) except -1
    cdef int64_t _claim_uid(self, Tensor t, int64_t uid) except -1
    cdef Tensor _new_tensor(self)
