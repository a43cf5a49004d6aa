"""Pointwise op schemas: one builder per ``cudnn.pygraph`` pointwise method, generated from one table.

Every row of ``POINTWISE_OPS`` names the pygraph method, the cuDNN pointwise mode it lowers to, its
input ports (pygraph's keyword names, in pygraph's positional order) and its non-tensor attributes::

    y  = graph.add(a, b)                    # CUDNN_POINTWISE_ADD
    y  = graph.bias(input, bias)            # the same mode under pygraph's other keyword names
    m  = graph.cmp_gt(input, comparison)
    y  = graph.binary_select(input0, input1, mask)   # mask ? input0 : input1
    y  = graph.relu(input, negative_slope=0.01, upper_clip=6.0)
    dx = graph.gelu_backward(loss, input)   # loss is dy, input is the forward input x

Every pointwise op has one output, ``Y``. Its dims are the broadcast of the input dims: all inputs must
have the same rank (cuDNN's tensor descriptors do not broadcast across ranks) and, axis by axis, sizes
must agree or be 1. Its data type is the graph's intermediate type unless the caller sets one; pygraph
sets none either, comparisons included (callers that want BOOLEAN set it, as cudnn-frontend does).

Each schema carries what a lowering needs: ``pointwise_mode`` (a ``pointwise_mode`` member),
``operands`` (the ``CUDNN_ATTR_OPERATION_POINTWISE_*DESC`` each port feeds, in port order), ``attr_map``
(attribute -> ``CUDNN_ATTR_POINTWISE_*``), ``pointwise_kind`` and ``pygraph_positional`` (pygraph's
full positional order, ``compute_data_type`` and ``name`` included).

Two cuDNN modes pygraph has no method for are added as extensions: ``atan2`` (cuDNN >= 9.1) and
``floor_mod`` (>= 9.27); so are the keyword-only ``elu_alpha`` / ``softplus_beta`` attributes that
cudnn-frontend's C++ API has and pygraph does not expose.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable, Optional

from ..enums import pointwise_mode
from .schema import REQUIRED, Attr, InferContext, OpSchema, Output, OutputInfo, Port, register

__all__ = ["POINTWISE_OPS", "broadcast_dims", "pointwise_op"]


def _opt_float(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"a float was expected; got {value!r}")
    out = float(value)
    if math.isnan(out):
        raise ValueError("NaN is not a valid activation parameter")
    return out


def _req_float(value: Any) -> float:
    if value is None:
        raise TypeError("a float was expected; got None")
    return _opt_float(value)


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"an integer was expected; got {value!r}")
    return operator.index(value)


# Attribute sets shared by several methods; defaults are pygraph's (None = cuDNN's own default).
_RELU_ATTRS = (
    Attr("negative_slope", None, _opt_float, "slope below lower_clip (RELU_LOWER_CLIP_SLOPE); cuDNN default 0"),
    Attr("lower_clip", None, _opt_float, "lower clip (RELU_LOWER_CLIP); cuDNN default 0"),
    Attr("upper_clip", None, _opt_float, "upper clip (RELU_UPPER_CLIP); cuDNN default: the type's max"),
)
_LEAKY_ATTRS = (Attr("negative_slope", REQUIRED, _req_float, "slope for x < 0 (required)"),)
_SWISH_ATTRS = (Attr("swish_beta", None, _opt_float, "beta of x * sigmoid(beta * x); cuDNN default 1"),)
# elu_alpha / softplus_beta exist in cudnn-frontend's C++ Pointwise_attributes but pygraph does not
# expose them; they are accepted here as keyword-only extensions (None = cuDNN's default, 1.0).
_ELU_ATTRS = (Attr("elu_alpha", None, _opt_float, "extension: ELU alpha; cuDNN default 1"),)
_SOFTPLUS_ATTRS = (Attr("softplus_beta", None, _opt_float, "extension: softplus beta; cuDNN default 1"),)
_KEYWORD_ONLY = frozenset({"elu_alpha", "softplus_beta"})
_AXIS_ATTRS = (Attr("axis", REQUIRED, _int, "axis whose index GEN_INDEX writes"),)

_ATTR_TO_BACKEND = {
    "negative_slope": "CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE",
    "lower_clip": "CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP",
    "upper_clip": "CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP",
    "swish_beta": "CUDNN_ATTR_POINTWISE_SWISH_BETA",
    "elu_alpha": "CUDNN_ATTR_POINTWISE_ELU_ALPHA",
    "softplus_beta": "CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA",
    "axis": "CUDNN_ATTR_POINTWISE_AXIS",
}

_U = ("input",)
_AB = ("a", "b")
_IN01 = ("input0", "input1")
_CMP = ("input", "comparison")
_BWD = ("loss", "input")

# (method, cuDNN mode suffix, ports, attrs, kind). ``kind`` decides the backend operand roles:
# forward ops feed X[, B[, T]] and write Y; activation backward ops feed DY (loss) and X (input)
# and write DX.
POINTWISE_OPS: tuple = (
    # binary arithmetic
    ("add", "ADD", _AB, (), "binary"),
    ("bias", "ADD", ("input", "bias"), (), "binary"),
    ("sub", "SUB", _AB, (), "binary"),
    ("mul", "MUL", _AB, (), "binary"),
    ("scale", "MUL", ("input", "scale"), (), "binary"),
    ("div", "DIV", _AB, (), "binary"),
    ("add_square", "ADD_SQUARE", _AB, (), "binary"),
    ("max", "MAX", _IN01, (), "binary"),
    ("min", "MIN", _IN01, (), "binary"),
    ("mod", "MOD", _IN01, (), "binary"),
    ("pow", "POW", _IN01, (), "binary"),
    ("atan2", "ATAN2", _IN01, (), "binary"),
    ("floor_mod", "FLOOR_MOD", _IN01, (), "binary"),
    # unary math
    ("abs", "ABS", _U, (), "unary"),
    ("ceil", "CEIL", _U, (), "unary"),
    ("floor", "FLOOR", _U, (), "unary"),
    ("exp", "EXP", _U, (), "unary"),
    ("log", "LOG", _U, (), "unary"),
    ("neg", "NEG", _U, (), "unary"),
    ("reciprocal", "RECIPROCAL", _U, (), "unary"),
    ("rsqrt", "RSQRT", _U, (), "unary"),
    ("sqrt", "SQRT", _U, (), "unary"),
    ("sin", "SIN", _U, (), "unary"),
    ("cos", "COS", _U, (), "unary"),
    ("tan", "TAN", _U, (), "unary"),
    ("erf", "ERF", _U, (), "unary"),
    ("identity", "IDENTITY", _U, (), "unary"),
    ("gen_index", "GEN_INDEX", _U, _AXIS_ATTRS, "unary"),
    # forward activations
    ("relu", "RELU_FWD", _U, _RELU_ATTRS, "unary"),
    ("leaky_relu", "RELU_FWD", _U, _LEAKY_ATTRS, "unary"),
    ("tanh", "TANH_FWD", _U, (), "unary"),
    ("sigmoid", "SIGMOID_FWD", _U, (), "unary"),
    ("elu", "ELU_FWD", _U, _ELU_ATTRS, "unary"),
    ("gelu", "GELU_FWD", _U, (), "unary"),
    ("gelu_approx_tanh", "GELU_APPROX_TANH_FWD", _U, (), "unary"),
    ("softplus", "SOFTPLUS_FWD", _U, _SOFTPLUS_ATTRS, "unary"),
    ("swish", "SWISH_FWD", _U, _SWISH_ATTRS, "unary"),
    # activation backward: loss = dy, input = x
    ("relu_backward", "RELU_BWD", _BWD, _RELU_ATTRS, "backward"),
    ("leaky_relu_backward", "RELU_BWD", _BWD, _LEAKY_ATTRS, "backward"),
    ("tanh_backward", "TANH_BWD", _BWD, (), "backward"),
    ("sigmoid_backward", "SIGMOID_BWD", _BWD, (), "backward"),
    ("elu_backward", "ELU_BWD", _BWD, _ELU_ATTRS, "backward"),
    ("gelu_backward", "GELU_BWD", _BWD, (), "backward"),
    ("gelu_approx_tanh_backward", "GELU_APPROX_TANH_BWD", _BWD, (), "backward"),
    ("softplus_backward", "SOFTPLUS_BWD", _BWD, _SOFTPLUS_ATTRS, "backward"),
    ("swish_backward", "SWISH_BWD", _BWD, _SWISH_ATTRS, "backward"),
    # comparisons and logic
    ("cmp_eq", "CMP_EQ", _CMP, (), "compare"),
    ("cmp_neq", "CMP_NEQ", _CMP, (), "compare"),
    ("cmp_gt", "CMP_GT", _CMP, (), "compare"),
    ("cmp_ge", "CMP_GE", _CMP, (), "compare"),
    ("cmp_lt", "CMP_LT", _CMP, (), "compare"),
    ("cmp_le", "CMP_LE", _CMP, (), "compare"),
    ("logical_and", "LOGICAL_AND", _AB, (), "logical"),
    ("logical_or", "LOGICAL_OR", _AB, (), "logical"),
    ("logical_not", "LOGICAL_NOT", _U, (), "logical"),
    # ternary
    ("binary_select", "BINARY_SELECT", ("input0", "input1", "mask"), (), "ternary"),
)

# cuDNN modes pygraph has no method for: exposed as extensions, with the cuDNN version they need.
_EXTENSIONS = {"atan2": 90100, "floor_mod": 92700}

# Pygraph's argument order is (ports, attrs, compute_data_type, name) except where noted here.
_PYGRAPH_ORDER_EXCEPTIONS = {
    "swish_backward": ("loss", "input", "compute_data_type", "swish_beta", "name"),
}

_FORWARD_OPERANDS = ("CUDNN_ATTR_OPERATION_POINTWISE_XDESC", "CUDNN_ATTR_OPERATION_POINTWISE_BDESC",
                     "CUDNN_ATTR_OPERATION_POINTWISE_TDESC")
_BACKWARD_OPERANDS = ("CUDNN_ATTR_OPERATION_POINTWISE_DYDESC", "CUDNN_ATTR_OPERATION_POINTWISE_XDESC")


def _is_scalar(info) -> bool:
    """A one-element pass-by-value operand (``tensor_scalar``, or a Python number given for a port)."""
    return info.is_pass_by_value and all(d == 1 for d in info.dim)


def broadcast_dims(ctx: InferContext, ports: tuple) -> tuple:
    """Broadcast the dims of ``ports`` (all required, equal rank); fails naming the offending port.

    A one-element pass-by-value scalar broadcasts to any rank (``graph.mul(x, 0.5)``); a lowering gives
    it the output's rank with unit dims, as cuDNN's descriptors need equal ranks.
    """
    if len(ports) == 1:
        return tuple(ctx.need(ports[0]).dim)
    infos = [ctx.need(p) for p in ports]
    first = next((p for p, i in zip(ports, infos) if not _is_scalar(i)), ports[0])
    rank = len(infos[ports.index(first)].dim)
    out = [1] * rank
    for port, info in zip(ports, infos):
        dim = tuple(info.dim)
        if len(dim) != rank and _is_scalar(info):
            dim = (1,) * rank
        if len(dim) != len(out):
            ctx.fail(port, f"has rank {len(dim)} (dims {tuple(dim)}) but '{first}' has rank {len(out)}; "
                           "pointwise inputs must have equal rank (pad with size-1 axes to broadcast)")
        for i, (have, new) in enumerate(zip(out, dim)):
            if new != have and new != 1 and have != 1:
                ctx.fail(port, f"dims {tuple(dim)} do not broadcast with {tuple(out)}: axis {i} is {new}, "
                               f"expected {have} or 1")
            if have == 1:
                out[i] = new
    return tuple(out)


def _make_infer(method: str, ports: tuple) -> Callable[[InferContext], dict]:
    def infer(ctx: InferContext) -> dict:
        dim = broadcast_dims(ctx, ports)
        if method == "gen_index":
            axis = ctx.attrs["axis"]
            if not 0 <= axis < len(dim):
                ctx.fail("axis", f"must lie in [0, {len(dim) - 1}] for a rank-{len(dim)} input; got {axis}")
        # Provisional stride: that of an input with the output's dims (cudnn-frontend does the same).
        stride = next((ctx.inputs[p].stride for p in ports if tuple(ctx.inputs[p].dim) == dim), None)
        return {"Y": OutputInfo(dim, None, tuple(stride) if stride is not None else None)}

    infer.__name__ = f"infer_{method}"
    return infer


def pointwise_op(method: str, mode: str, ports: tuple, attrs: tuple, kind: str) -> OpSchema:
    """Build the schema of one pointwise method from its table row."""
    # Extension attributes stay keyword-only so pygraph's positional calls bind as they do there.
    listed = tuple(a.name for a in attrs if a.name not in _KEYWORD_ONLY)
    order = _PYGRAPH_ORDER_EXCEPTIONS.get(method, ports + listed + ("compute_data_type", "name"))
    operands = _BACKWARD_OPERANDS if kind == "backward" else _FORWARD_OPERANDS[:len(ports)]
    return OpSchema(
        name=method,
        family="pointwise",
        inputs=tuple(Port(p) for p in ports),
        outputs=(Output("Y"),),
        infer=_make_infer(method, ports),
        attrs=attrs,
        positional=tuple(n for n in order if n not in ("compute_data_type", "name")),
        doc=f"Pointwise CUDNN_POINTWISE_{mode} on ({', '.join(ports)}).",
        pointwise_mode=pointwise_mode[mode],
        pointwise_kind=kind,
        operands=dict(zip(ports, operands)),
        attr_map={a.name: _ATTR_TO_BACKEND[a.name] for a in attrs},
        in_pygraph=method not in _EXTENSIONS,
        min_cudnn=_EXTENSIONS.get(method, 0),
        pygraph_positional=order,
    )


register(*(pointwise_op(*row) for row in POINTWISE_OPS))
