"""Normalizations and genstats lowered to backend descriptors.

Every forward norm is one ``CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR`` (its mode says which
norm, its phase training or inference), every backward one ``..._NORM_BACKWARD_DESCRIPTOR``, and
``genstats`` one ``..._GEN_STATS_DESCRIPTOR``. Which axes a norm reduces is never an attribute:
cuDNN reads it off the dims of the scale and statistics tensors, as the IR does (see
cudnn_graph/ops/_norms.py), so the tensors keep their own geometry (``native_geometry``).

``batchnorm_inference`` is ``(X - mean) * inv_variance * scale + bias`` as four pointwise ops (SUB,
MUL, MUL, ADD; intermediates virtual in the compute type, the statistics broadcast per channel). cuDNN
has no engine for a NORM_FORWARD in the INFERENCE phase with BATCH_NORM mode on its own (9.19 on the
H200: heuristics NOT_SUPPORTED); its one engine for it is the BN-inference -> dReLU -> dBN backward
fusion (cudnn-frontend's only sample of it), so a graph with a ``batchnorm_backward`` keeps that op
(mean and inverse variance as inputs, no epsilon: the inverse variance already holds it).
``batchnorm``'s ``momentum`` is cuDNN's exponential-average factor. Peer statistics (multi-GPU batch
norm) are graph tensors held in the node's ``peer_stats`` attribute rather than its ports, so their
descriptors are made here.
"""
from __future__ import annotations

from ...data_type import DataType
from ...enums import gen_stats_mode, norm_forward_phase as NormFwdPhase, norm_mode, pointwise_mode
from ...errors import GraphNotSupportedError
from ...ops._norms import ADA_LAYER_NORM_VERSION  # noqa: F401  (its version gate is the op schema's)
from .lowering import BYTE_ALIGNMENT, MIN_RANK, Ref, Step, lowers

__all__ = ["NormMode", "GenStatsMode", "FORWARD_MODES", "BACKWARD_MODES"]


# The lowering's names for the package's enums (cudnnBackendNormMode_t, cudnnGenStatsMode_t).
NormMode = norm_mode
GenStatsMode = gen_stats_mode


_FWD = "CUDNN_ATTR_OPERATION_NORM_FWD_"
_BWD = "CUDNN_ATTR_OPERATION_NORM_BWD_"
_GENSTATS = "CUDNN_ATTR_OPERATION_GENSTATS_"
_DESC = "CUDNN_TYPE_BACKEND_DESCRIPTOR"

# IR port -> the forward descriptor's attribute. ``mean`` / ``inv_variance`` are outputs of the
# training phase and inputs of batchnorm_inference: the same attribute either way.
_FWD_PORTS = {
    "input": "XDESC", "scale": "SCALE_DESC", "bias": "BIAS_DESC", "epsilon": "EPSILON_DESC",
    "momentum": "EXP_AVG_FACTOR_DESC", "in_running_mean": "INPUT_RUNNING_MEAN_DESC",
    "in_running_var": "INPUT_RUNNING_VAR_DESC", "mean": "MEAN_DESC", "inv_variance": "INV_VARIANCE_DESC",
    "Y": "YDESC", "out_running_mean": "OUTPUT_RUNNING_MEAN_DESC", "out_running_var": "OUTPUT_RUNNING_VAR_DESC",
}
_BWD_PORTS = {
    "input": "XDESC", "grad": "DYDESC", "scale": "SCALE_DESC", "mean": "MEAN_DESC",
    "inv_variance": "INV_VARIANCE_DESC", "DX": "DXDESC", "dscale": "DSCALE_DESC", "dbias": "DBIAS_DESC",
}

_FWD_TYPES = {_FWD + a: _DESC for a in _FWD_PORTS.values()}
_FWD_TYPES.update({_FWD + "MODE": "CUDNN_TYPE_NORM_MODE", _FWD + "PHASE": "CUDNN_TYPE_NORM_FWD_PHASE",
                   _FWD + "PEER_STAT_DESCS": _DESC})
_BWD_TYPES = {_BWD + a: _DESC for a in _BWD_PORTS.values()}
_BWD_TYPES.update({_BWD + "MODE": "CUDNN_TYPE_NORM_MODE", _BWD + "PEER_STAT_DESCS": _DESC})
_GENSTATS_TYPES = {_GENSTATS + "MODE": "CUDNN_TYPE_GENSTATS_MODE", _GENSTATS + "MATH_PREC": "CUDNN_TYPE_DATA_TYPE",
                   _GENSTATS + "XDESC": _DESC, _GENSTATS + "SUMDESC": _DESC, _GENSTATS + "SQSUMDESC": _DESC}

# op -> (mode, phase fixed by the op or None when the node's norm_forward_phase says)
FORWARD_MODES = {
    "batchnorm": (NormMode.BATCH_NORM, NormFwdPhase.TRAINING),
    "batchnorm_inference": (NormMode.BATCH_NORM, NormFwdPhase.INFERENCE),
    "layernorm": (NormMode.LAYER_NORM, None),
    "adalayernorm": (NormMode.ADA_LAYER_NORM, None),
    "rmsnorm": (NormMode.RMS_NORM, None),
    "instancenorm": (NormMode.INSTANCE_NORM, None),
}
BACKWARD_MODES = {
    "batchnorm_backward": NormMode.BATCH_NORM,
    "layernorm_backward": NormMode.LAYER_NORM,
    "adalayernorm_backward": NormMode.ADA_LAYER_NORM,
    "rmsnorm_backward": NormMode.RMS_NORM,
    "instancenorm_backward": NormMode.INSTANCE_NORM,
}
# Norms whose statistics run per channel (axis 1): padding a rank-2 tensor to rank 3 would put the
# batch on axis 1, so they need the channel axis where cuDNN looks for it.
_CHANNEL_OPS = {"batchnorm", "batchnorm_inference", "batchnorm_backward", "genstats"}


def _channel_axis_kept(node) -> None:
    x = node.inputs["input"]
    if node.op in _CHANNEL_OPS and len(x.dim) < MIN_RANK:
        raise GraphNotSupportedError(
            f"node '{node.name}' ({node.op}): input '{x.name}' has rank {len(x.dim)} (dims {tuple(x.dim)}); "
            f"the backend takes rank >= {MIN_RANK} and a leading unit axis would move the channel axis "
            "off axis 1, so give the input as (N, C, 1)")


def _ports(lw, node, prefix: str, table: dict) -> dict:
    """The descriptor attributes of every port the node has, inputs and outputs alike."""
    attrs = {}
    for port, value in list(node.inputs.items()) + list(node.outputs.items()):
        if value is not None and port in table:
            attrs[prefix + table[port]] = lw.ref(value)
    return attrs


def _peer_stats(lw, node) -> tuple:
    """(tensor steps still to make, refs) for the node's peer-statistics tensors."""
    steps, refs = [], []
    for t in node.params.get("peer_stats") or ():
        if t.uid not in lw.tensor_steps:
            steps.append(_graph_tensor_step(lw, t))
        refs.append(lw.ref(t))
    return steps, tuple(refs)


def _graph_tensor_step(lw, t) -> Step:
    """The descriptor of a graph tensor no port names (it is fed at execute like any graph input)."""
    dims, strides = tuple(int(d) for d in t.dim), tuple(int(s) for s in t.stride)
    if len(dims) < MIN_RANK:
        span = max([d * s for d, s in zip(dims, strides)] + [1])
        extra = MIN_RANK - len(dims)
        dims, strides = (1,) * extra + dims, (span,) * extra + strides
    dtype = DataType(lw.graph.data_type(t))
    if dtype == DataType.NOT_SET:
        raise GraphNotSupportedError(f"peer-statistics tensor '{t.name}' has no data type")
    name = f"tensor_{t.uid}"
    lw.tensor_steps[t.uid] = name
    lw.geometry[t.uid] = (dims, strides)
    return Step(name, "CUDNN_BACKEND_TENSOR_DESCRIPTOR", {
        "CUDNN_ATTR_TENSOR_UNIQUE_ID": int(t.uid),
        "CUDNN_ATTR_TENSOR_DATA_TYPE": dtype,
        "CUDNN_ATTR_TENSOR_DIMENSIONS": dims,
        "CUDNN_ATTR_TENSOR_STRIDES": strides,
        "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT": BYTE_ALIGNMENT,
        "CUDNN_ATTR_TENSOR_IS_VIRTUAL": bool(t.is_virtual),
    })


def _norm_operation(lw, node, i, attrs: dict, prefix: str, ports: dict, kind: str):
    """The norm operation's steps: ``attrs`` (its mode, phase) plus its ports and peer statistics."""
    attrs.update(_ports(lw, node, prefix, ports))
    peer_steps, peers = _peer_stats(lw, node)
    yield from peer_steps
    if peers:
        attrs[prefix + "PEER_STAT_DESCS"] = peers
    yield Step(f"op_{i}", kind, attrs)


def _lower_forward(lw, node, i):
    _channel_axis_kept(node)
    mode, phase = FORWARD_MODES[node.op]
    if phase is None:
        phase = NormFwdPhase(int(node.params["norm_forward_phase"]))
    yield from _norm_operation(lw, node, i, {_FWD + "MODE": mode, _FWD + "PHASE": phase}, _FWD, _FWD_PORTS,
                               "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")


def _lower_backward(lw, node, i):
    _channel_axis_kept(node)
    yield from _norm_operation(lw, node, i, {_BWD + "MODE": BACKWARD_MODES[node.op]}, _BWD, _BWD_PORTS,
                               "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")


lowers("batchnorm", "layernorm", "rmsnorm", "instancenorm", "adalayernorm",
       native_geometry=True, attributes=_FWD_TYPES)(_lower_forward)
lowers("batchnorm_backward", "layernorm_backward", "rmsnorm_backward", "instancenorm_backward",
       "adalayernorm_backward", native_geometry=True, attributes=_BWD_TYPES)(_lower_backward)


@lowers("genstats", native_geometry=True, attributes=_GENSTATS_TYPES)
def _lower_genstats(lw, node, i):
    _channel_axis_kept(node)
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR", {
        _GENSTATS + "MODE": GenStatsMode.SUM_SQSUM,
        # The statistics accumulate in the compute type (cudnn-frontend up to 1.15 passed the
        # compute type; FLOAT unless the graph says otherwise).
        _GENSTATS + "MATH_PREC": lw.compute_type(node),
        _GENSTATS + "XDESC": lw.ref(node.inputs["input"]),
        _GENSTATS + "SUMDESC": lw.ref(node.outputs["sum"]),
        _GENSTATS + "SQSUMDESC": lw.ref(node.outputs["sq_sum"]),
    })


# ---- batchnorm_inference ------------------------------------------------------------------------------

_PW = "CUDNN_ATTR_OPERATION_POINTWISE_"
_BN_INFERENCE_STEPS = (("mean", pointwise_mode.SUB), ("inv_variance", pointwise_mode.MUL),
                       ("scale", pointwise_mode.MUL), ("bias", pointwise_mode.ADD))


def _in_backward_fusion(lw) -> bool:
    """Whether the graph is the BN-inference -> dReLU -> dBN fusion cuDNN has a NORM_FORWARD engine for."""
    return any(n.op == "batchnorm_backward" for n in lw.graph.nodes)


def _lower_batchnorm_inference(lw, node, i):
    _channel_axis_kept(node)
    if _in_backward_fusion(lw):
        yield from _lower_forward(lw, node, i)
        return
    x, y = node.inputs["input"], node.outputs["Y"]
    stats = [node.inputs[port] for port, _ in _BN_INFERENCE_STEPS]
    # The graph's own (N, C, ...) geometry: cuDNN 9.19 refused ("Unsupported pointwise pattern") the
    # channel-first views tried first, and ran this one correctly (H200, BN-infer + ReLU).
    x_ref, y_ref, stat_refs = lw.ref(x), lw.ref(y), [lw.ref(t) for t in stats]
    compute = lw.compute_type(node)
    dims, strides = lw.dims(x), lw.strides(x)
    current = x_ref
    for k, ((port, mode), operand) in enumerate(zip(_BN_INFERENCE_STEPS, stat_refs)):
        last = k == len(_BN_INFERENCE_STEPS) - 1
        if last:
            out = y_ref
        else:
            # X's layout, as cudnn-frontend gives a pointwise output whose strides nobody set.
            out, step = lw.virtual(dims, strides, compute)
            yield step
        yield Step(f"pointwise_{i}_{port}", "CUDNN_BACKEND_POINTWISE_DESCRIPTOR", {
            "CUDNN_ATTR_POINTWISE_MODE": mode, "CUDNN_ATTR_POINTWISE_MATH_PREC": compute})
        yield Step(f"op_{i}_{port}", "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR", {
            _PW + "PW_DESCRIPTOR": Ref(f"pointwise_{i}_{port}"), _PW + "XDESC": current, _PW + "BDESC": operand,
            _PW + "YDESC": out})
        current = out


lowers("batchnorm_inference", native_geometry=True, attributes=_FWD_TYPES)(_lower_batchnorm_inference)
