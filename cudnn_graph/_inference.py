"""Shape and data-type inference over the graph IR: every output's dims, strides and data type.

The IR (``cudnn_graph._ir.Graph``) runs this lazily, when a tensor getter needs an inferred value
after a change, and ``pygraph.validate()`` runs it before its checks. Data-type resolution happens
here and only here: a tensor's type is the user's, else the one its op's schema infers, else the
graph's default for it (``default_type``); what inference decides is recorded on the tensor, so
``Tensor.data_type`` reports it.
"""
from __future__ import annotations

from .data_type import DataType
from .errors import GraphValidationError
from .ops.schema import InferContext, TensorInfo

__all__ = ["infer_graph", "default_type"]


def default_type(context, virtual: bool) -> DataType:
    """The type of a tensor that nothing else gives one: graph inputs and outputs take the io type;
    intermediates the intermediate type, else the compute type, else FLOAT (what cuDNN's fused
    engines keep them in)."""
    if not virtual:
        return context.io_data_type
    for dt in (context.intermediate_data_type, context.compute_data_type):
        if dt != DataType.NOT_SET:
            return dt
    return DataType.FLOAT


def infer_graph(graph) -> None:
    """Infer every tensor of ``graph`` (in node order) and mark the graph inferred.

    A failure leaves the graph marked not inferred and propagates (naming node and port).
    """
    # Marked done first: the tensor getters used below must not re-enter inference.
    graph._inferred = True
    # Inference runs again only after a change, which a later validate() must see: a graph
    # validated, then changed, is not valid any more until validate() passes again.
    graph._validated = False
    context = graph.context
    try:
        # Graph inputs take the graph's io (virtual: intermediate) type when the user set none, as
        # cudnn.pygraph's validate() fills them from the context; the nodes reading them see it.
        for t in graph.tensors:
            if t.producer is None and not t.data_type_set_by_user:
                t._set_inferred(None, None, default_type(context, t.is_virtual))
        _infer_nodes(graph, context)
    except BaseException:
        graph._inferred = False
        raise


def _info(t, node, port) -> TensorInfo:
    if not t.dim_set_by_user and t.producer is None:
        raise GraphValidationError(node.name, node.op, port, f"tensor '{t.name}' has no dims")
    dims = t._raw_dim()
    if dims is None:
        raise GraphValidationError(node.name, node.op, port,
                                   f"tensor '{t.name}' has no dims (set them with set_dim)")
    return TensorInfo(tuple(dims), tuple(t.stride), t.data_type, t.is_virtual, t.is_pass_by_value, t.name)


def _infer_nodes(graph, ctx_types) -> None:
    for node in graph.nodes:
        schema = node.schema
        infos = {}
        for port, value in node.inputs.items():
            if value is None:
                infos[port] = None
            elif isinstance(value, tuple):
                infos[port] = [_info(v, node, port) for v in value]
            else:
                infos[port] = _info(value, node, port)
        compute = DataType(node.compute_data_type) if node.compute_data_type != -1 else ctx_types.compute_data_type
        ictx = InferContext(node.name, node.op, infos, node.params, compute,
                            ctx_types.intermediate_data_type, ctx_types.io_data_type)
        result = schema.infer(ictx)
        for oname, t in node.outputs.items():
            info = result.get(oname)
            if info is None:
                if not t.data_type_set_by_user:
                    t._set_inferred_type(default_type(ctx_types, t.is_virtual))
                continue
            dtype = info.data_type
            if dtype is None or dtype == DataType.NOT_SET:
                dtype = default_type(ctx_types, t.is_virtual)
            t._set_inferred(info.dim, info.stride, dtype)
        check = schema.validate_outputs
        if check is not None:
            pending = {o: t._raw_dim() for o, t in node.outputs.items()
                       if result.get(o) is not None and result[o].dim is None}
            if pending:
                missing = [o for o, d in pending.items() if d is None]
                if missing:
                    raise GraphValidationError(node.name, node.op, missing[0],
                                               "output dims must be set by the caller (set_dim)")
                check(ictx, pending)
