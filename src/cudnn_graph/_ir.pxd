from libc.stdint cimport int64_t

cdef class Tensor:
    cdef readonly object graph
    cdef int64_t _uid
    cdef readonly bint uid_assigned_by_user   # the user set it (set_uid / uid=); auto uids may be renumbered
    cdef str _name
    cdef tuple _dim
    cdef tuple _stride
    cdef readonly bint dim_set_by_user
    cdef readonly bint stride_set_by_user   # only user-assigned strides bind; inferred ones are provisional
    cdef int _data_type
    cdef int _dtype_inferred
    cdef bint _virtual
    cdef bint _virtual_user
    cdef readonly bint is_pass_by_value
    cdef readonly object value          # the host value of a tensor_scalar tensor (None otherwise)
    cdef readonly object ragged_offset  # the ragged-offset Tensor of a packed (THD) layout, or None
    cdef readonly object producer       # the Node that computes this tensor (None for graph inputs)
    cdef readonly int reordering_type
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
    cdef Tensor _new_placed_tensor(self, object name, str prefix, tuple dim, tuple stride, int data_type)
