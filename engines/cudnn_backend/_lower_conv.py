"""Convolutions (fprop, dgrad, wgrad) lowered to backend descriptors.

Each conv node becomes two descriptors: a ``CONVOLUTION`` descriptor (compute type, mode, spatial dim
count, dilations, filter strides, pre and post paddings) and the operation that uses it
(``OPERATION_CONVOLUTION_FORWARD`` / ``_BACKWARD_DATA`` / ``_BACKWARD_FILTER``) with its tensors and
alpha = 1, beta = 0.

Dims reach cuDNN in the IR's logical order (N, C, [D,] H, W for images, K, C / groups, [T,] R, S for
filters) whatever the memory layout: the tensors' strides say NCHW, NHWC or anything else, and cuDNN's
heuristics decide which layouts an engine takes. Grouped convolution needs no attribute: as in cuDNN,
the filter's C (C_image / groups) against the image's C implies it.
"""
from __future__ import annotations

import logging

from ...data_type import DataType
from ...errors import GraphNotSupportedError
from ...ops._conv import resolve_padding
from .lowering import Ref, Step, lowers

logger = logging.getLogger(__name__)

__all__ = ["CONV_OPERATIONS"]

_CONV = "CUDNN_ATTR_CONVOLUTION_"
_FWD = "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_"
_BWD_DATA = "CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_"
_BWD_FILTER = "CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_"

# op -> (operation descriptor, its attribute prefix, {IR port or output: backend tensor attribute suffix})
CONV_OPERATIONS = {
    "conv_fprop": ("CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR", _FWD,
                   {"image": "X", "weight": "W", "Y": "Y"}),
    "conv_dgrad": ("CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR", _BWD_DATA,
                   {"loss": "DY", "filter": "W", "DX": "DX"}),
    "conv_wgrad": ("CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR", _BWD_FILTER,
                   {"image": "X", "loss": "DY", "DW": "DW"}),
}

_ATTRIBUTES = {
    _CONV + "COMP_TYPE": "CUDNN_TYPE_DATA_TYPE",
    _CONV + "CONV_MODE": "CUDNN_TYPE_CONVOLUTION_MODE",
    _CONV + "SPATIAL_DIMS": "CUDNN_TYPE_INT64",
    _CONV + "DILATIONS": "CUDNN_TYPE_INT64",
    _CONV + "FILTER_STRIDES": "CUDNN_TYPE_INT64",
    _CONV + "PRE_PADDINGS": "CUDNN_TYPE_INT64",
    _CONV + "POST_PADDINGS": "CUDNN_TYPE_INT64",
}
for _prefix, _ports in ((_FWD, ("X", "W", "Y")), (_BWD_DATA, ("DX", "W", "DY")), (_BWD_FILTER, ("X", "DW", "DY"))):
    for _port in _ports + ("CONV_DESC",):
        _ATTRIBUTES[_prefix + _port] = "CUDNN_TYPE_BACKEND_DESCRIPTOR"
    # cudnn-frontend passes alpha and beta as FLOAT for every compute type but DOUBLE (declined below:
    # an attribute has one CUDNN_TYPE_* in the lowering's table).
    _ATTRIBUTES[_prefix + "ALPHA"] = "CUDNN_TYPE_FLOAT"
    _ATTRIBUTES[_prefix + "BETA"] = "CUDNN_TYPE_FLOAT"


def _check_operand(node, port: str, t) -> None:
    """Decline operands no convolution engine reads: by-value scalars and broadcast (stride 0) axes."""
    if t.is_pass_by_value:
        raise GraphNotSupportedError(
            f"node '{node.name}' ({node.op}): '{port}' is the pass-by-value tensor '{t.name}'; a convolution "
            "operand must be a tensor in memory")
    broadcast = [axis for axis, (d, s) in enumerate(zip(t.dim, t.stride)) if d > 1 and s == 0]
    if broadcast:
        raise GraphNotSupportedError(
            f"node '{node.name}' ({node.op}): '{port}' tensor '{t.name}' broadcasts along axes {broadcast} "
            f"(stride 0, dims {tuple(t.dim)}, strides {tuple(t.stride)}); convolution operands must be "
            "materialized")


def convolution_attributes(node, compute: DataType) -> dict:
    """The CONVOLUTION descriptor's attributes for a conv node (geometry from its schema attrs)."""
    params = node.params
    pre, post = resolve_padding(params)
    stride, dilation = params["stride"], params["dilation"]
    spatial = len(stride)
    return {
        _CONV + "COMP_TYPE": DataType(compute),
        _CONV + "CONV_MODE": int(params["convolution_mode"]),
        _CONV + "SPATIAL_DIMS": spatial,
        _CONV + "DILATIONS": tuple(int(v) for v in dilation),
        _CONV + "FILTER_STRIDES": tuple(int(v) for v in stride),
        _CONV + "PRE_PADDINGS": tuple(int(v) for v in pre),
        _CONV + "POST_PADDINGS": tuple(int(v) for v in post),
    }


# Measured on the H200 with cuDNN 9.19.0 (bench/fuzz_conv.py --seed 7, case 82: wgrad 3-D, channels-last
# bf16, groups 2, stride (3, 1, 3), dilation (2, 2, 1), padding (2, 0, 1)/(2, 1, 1)): engines 1 and 20
# return a wrong DW (max error 3.5 on values of 3) while engine 0 matches the reference exactly.
_GROUPED_3D_WGRAD_WRONG = (1, 20)


def _bar_known_wrong_engines(lw, node, tensors) -> None:
    if node.op != "conv_wgrad" or len(node.params["stride"]) != 3:
        return
    image, grad = tensors["image"], tensors["DW"]
    if image.dim[1] == grad.dim[1]:
        return   # not grouped: the filter's C is the image's C
    lw.bar_engines(_GROUPED_3D_WGRAD_WRONG,
                   "miscomputes grouped 3-D conv_wgrad on cuDNN 9.19 (measured on the H200; engine 0 is right)")


@lowers("conv_fprop", "conv_dgrad", "conv_wgrad", native_geometry=True, attributes=_ATTRIBUTES)
def _lower_conv(lw, node, i):
    kind, prefix, roles = CONV_OPERATIONS[node.op]
    compute = lw.compute_type(node)
    if compute == DataType.DOUBLE:
        raise GraphNotSupportedError(
            f"node '{node.name}' ({node.op}): compute type DOUBLE is not lowered (cuDNN then wants alpha "
            "and beta as DOUBLE; the lowering passes them as FLOAT)")
    tensors = dict(node.inputs) | dict(node.outputs)
    for port in roles:
        _check_operand(node, port, tensors[port])
    _bar_known_wrong_engines(lw, node, tensors)
    conv = f"conv_{i}"
    yield Step(conv, "CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR", convolution_attributes(node, compute))
    op = {prefix + role: lw.ref(tensors[port]) for port, role in roles.items()}
    op[prefix + "CONV_DESC"] = Ref(conv)
    op[prefix + "ALPHA"] = 1.0
    op[prefix + "BETA"] = 0.0
    yield Step(f"op_{i}", kind, op)
