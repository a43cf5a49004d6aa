# The in-process C API's implementation (the table of include/cudnn_graph/cudnn_graph_capi.h, published
# as the capsule cudnn_graph._C_API): what one plan handle holds.
from libc.stdint cimport int64_t, uint8_t
from cpython.object cimport PyObject
from cudnn_graph.capi cimport cg_tensor_info_t, cg_engine_family_t

cdef enum:
    CAPI_SORT_INLINE = 64       # operands sorted on the stack (more: malloc)

# A cg_graph_plan_t points at one of these. Everything the queries and execute's checks read is C, so
# they run without the GIL; ``owner`` (a tuple of Python objects) is touched with the GIL only.
cdef struct GraphPlanData:
    PyObject* owner             # (graph, compiled plan, PlanRunner or None, PackLayout, specs, names)
    int n_operands
    cg_tensor_info_t* operands  # the caller's operands, uid ascending
    int64_t* geometry           # every operand's dims then strides, one allocation
    uint8_t* nonempty           # per operand: it has elements (a NULL pointer is then an error)
    size_t workspace_size
    cg_engine_family_t family
    int64_t engine_id
    int device                  # CUDA ordinal; -1 for a host graph
    bint runs_in_c              # a cuDNN plan: execute holds the GIL only around the runner's call
