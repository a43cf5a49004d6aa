"""Normalizations and genstats on the cuDNN backend: the lowered programs (CPU) and the GPU results
against the reference engine (marked ``gpu``).

Layouts follow what cudnn-frontend's own norm samples run: layer / RMS norm on ``(rows, hidden, 1, 1)``
(or ``(B, S, H)``), batch / instance norm and genstats on channels-last ``(N, C, H, W)``, scale, bias
and statistics in FLOAT whatever the io type. JAX hands over dense row-major arrays only, so its
batch-norm cases use ``(N, C, 1, 1)`` (channels-last and row-major at once) and its instance-norm case
declares NCHW strides.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph.data_type import DataType
from cudnn_graph.errors import GraphNotSupportedError
from cudnn_graph.engines.cudnn_backend import Ref, check_lowerable, lower_program
from cudnn_graph.engines.cudnn_backend import _lower_norm
from cudnn_graph.engines.cudnn_backend.lowering import ATTRIBUTE_TYPES, LOWERERS, materialize
from cudnn_graph.ops._norms import NormFwdPhase
from gpu_support import assert_close, build_gpu, gpu_run, host_dtype, nhwc, reference_run, row_major
from _helpers import REPO_ROOT

F = cudnn.data_type
TRAINING, INFERENCE = NormFwdPhase.TRAINING, NormFwdPhase.INFERENCE
FWD = "CUDNN_ATTR_OPERATION_NORM_FWD_"
BWD = "CUDNN_ATTR_OPERATION_NORM_BWD_"
GEN = "CUDNN_ATTR_OPERATION_GENSTATS_"
NORM_FWD_OP = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR"
NORM_BWD_OP = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR"
GENSTATS_OP = "CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR"


# ---- layouts ------------------------------------------------------------------------------------------

def per_channel(c):
    return (1, c, 1, 1), (c, 1, c, c)


def _graph(device, io, name):
    return cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                         device=device, name=name)


def _eps(g, value=1e-5):
    return g.tensor_scalar(value, data_type=F.FLOAT)


def _out(t, name, dtype):
    return t.set_output(True).set_data_type(dtype).set_name(name)


def _forward_outputs(t, outs, io, phase, stats=("mean", "inv_variance")):
    """Name a norm forward's outputs in ``t``: Y in ``io``, and in training its FLOAT ``stats`` (outs[1:])."""
    t["Y"] = _out(outs[0], "Y", io)
    if phase == TRAINING:
        for name, tensor in zip(stats, outs[1:]):
            t[name] = _out(tensor, name, F.FLOAT)


def _backward_outputs(t, outs, io):
    """Name a norm backward's outputs in ``t``: DX in ``io``, FLOAT dscale and (when there is one) dbias."""
    t["DX"] = _out(outs[0], "DX", io)
    t["dscale"] = _out(outs[1], "dscale", F.FLOAT)
    if outs[2] is not None:
        t["dbias"] = _out(outs[2], "dbias", F.FLOAT)


# ---- graph builders shared by the CPU and GPU tests -------------------------------------------------

def layer_graph(device, io=F.HALF, op="layernorm", phase=TRAINING, rows=64, hidden=128, bias=True, rank=4):
    """layernorm / rmsnorm over ``hidden``: x (rows, hidden, 1, 1), or (2, rows / 2, hidden) at rank 3."""
    g = _graph(device, io, op)
    if rank == 4:
        xd, xs = (rows, hidden, 1, 1), (hidden, 1, hidden, hidden)
        sd, ss = (1, hidden, 1, 1), (hidden, 1, hidden, hidden)
    else:
        xd = (2, rows // 2, hidden)
        xs = row_major(xd)
        sd, ss = (1, 1, hidden), (hidden, hidden, 1)
    t = {"X": g.tensor(name="X", dim=xd, stride=xs),
         "scale": g.tensor(name="scale", dim=sd, stride=ss, data_type=F.FLOAT)}
    if bias:
        t["bias"] = g.tensor(name="bias", dim=sd, stride=ss, data_type=F.FLOAT)
    builder = getattr(g, op)
    outs = builder(norm_forward_phase=phase, input=t["X"], scale=t["scale"], bias=t.get("bias"), epsilon=_eps(g))
    _forward_outputs(t, outs, io, phase, ("inv_variance",) if op == "rmsnorm" else ("mean", "inv_variance"))
    return g, t


def layer_backward_graph(device, io=F.HALF, op="layernorm_backward", rows=64, hidden=128, dbias=True, rank=4):
    g = _graph(device, io, op)
    if rank == 4:
        xd, xs = (rows, hidden, 1, 1), (hidden, 1, hidden, hidden)
        sd, ss = (1, hidden, 1, 1), (hidden, 1, hidden, hidden)
        md = (rows, 1, 1, 1)
    else:
        xd = (2, rows // 2, hidden)
        xs = row_major(xd)
        sd, ss = (1, 1, hidden), (hidden, hidden, 1)
        md = (2, rows // 2, 1)
    t = {"DY": g.tensor(name="DY", dim=xd, stride=xs), "X": g.tensor(name="X", dim=xd, stride=xs),
         "scale": g.tensor(name="scale", dim=sd, stride=ss, data_type=F.FLOAT),
         "inv_variance": g.tensor(name="inv_variance", dim=md, stride=row_major(md), data_type=F.FLOAT)}
    if op == "rmsnorm_backward":
        outs = g.rmsnorm_backward(grad=t["DY"], input=t["X"], scale=t["scale"], inv_variance=t["inv_variance"],
                                  has_dbias=dbias)
    else:
        t["mean"] = g.tensor(name="mean", dim=md, stride=row_major(md), data_type=F.FLOAT)
        outs = getattr(g, op)(grad=t["DY"], input=t["X"], scale=t["scale"], mean=t["mean"],
                              inv_variance=t["inv_variance"])
    _backward_outputs(t, outs, io)
    return g, t


def ada_graph(device, io=F.HALF, phase=TRAINING, b=2, s=64, d=128):
    """Adaptive layer norm: x (B, S, D), a per-sample scale / bias (B, 1, D)."""
    g = _graph(device, io, "adaln")
    xd, sd = (b, s, d), (b, 1, d)
    t = {"X": g.tensor(name="X", dim=xd, stride=row_major(xd)),
         "scale": g.tensor(name="scale", dim=sd, stride=row_major(sd), data_type=F.FLOAT),
         "bias": g.tensor(name="bias", dim=sd, stride=row_major(sd), data_type=F.FLOAT)}
    outs = g.adalayernorm(norm_forward_phase=phase, input=t["X"], scale=t["scale"], bias=t["bias"], epsilon=_eps(g))
    _forward_outputs(t, outs, io, phase)
    return g, t


def ada_backward_graph(device, io=F.HALF, b=2, s=64, d=128):
    g = _graph(device, io, "dadaln")
    xd, sd, md = (b, s, d), (b, 1, d), (b, s, 1)
    t = {"DY": g.tensor(name="DY", dim=xd, stride=row_major(xd)), "X": g.tensor(name="X", dim=xd, stride=row_major(xd)),
         "scale": g.tensor(name="scale", dim=sd, stride=row_major(sd), data_type=F.FLOAT),
         "mean": g.tensor(name="mean", dim=md, stride=row_major(md), data_type=F.FLOAT),
         "inv_variance": g.tensor(name="inv_variance", dim=md, stride=row_major(md), data_type=F.FLOAT)}
    outs = g.adalayernorm_backward(grad=t["DY"], input=t["X"], scale=t["scale"], mean=t["mean"],
                                   inv_variance=t["inv_variance"])
    _backward_outputs(t, outs, io)
    return g, t


def _channel_x(g, name, dims, layout):
    return g.tensor(name=name, dim=dims, stride=nhwc(dims) if layout == "nhwc" else row_major(dims))


def batchnorm_graph(device, io=F.HALF, dims=(4, 32, 8, 8), running=True, relu=False, peers=0, layout="nhwc"):
    """Training batch norm (running statistics updated when ``running``), optionally fused with ReLU."""
    g = _graph(device, io, "bn")
    pd, ps = per_channel(dims[1])
    t = {"X": _channel_x(g, "X", dims, layout)}
    for name in ("scale", "bias") + (("in_running_mean", "in_running_var") if running else ()):
        t[name] = g.tensor(name=name, dim=pd, stride=ps, data_type=F.FLOAT)
    peer_stats = [g.tensor(name=f"peer{i}", dim=(2, 4 * dims[1], 1, 1), stride=(4 * dims[1], 1, 4 * dims[1], 4 * dims[1]),
                           data_type=F.FLOAT) for i in range(peers)]
    t.update({f"peer{i}": p for i, p in enumerate(peer_stats)})
    outs = g.batchnorm(input=t["X"], scale=t["scale"], bias=t["bias"], in_running_mean=t.get("in_running_mean"),
                       in_running_var=t.get("in_running_var"), epsilon=_eps(g),
                       momentum=g.tensor_scalar(0.1, data_type=F.FLOAT) if running else None,
                       peer_stats=peer_stats or None)
    y = outs[0]
    if relu:
        y = g.relu(y)
    t["Y"] = _out(y, "Y", io)
    t["mean"] = _out(outs[1], "mean", F.FLOAT)
    t["inv_variance"] = _out(outs[2], "inv_variance", F.FLOAT)
    if running:
        t["out_running_mean"] = _out(outs[3], "out_running_mean", F.FLOAT)
        t["out_running_var"] = _out(outs[4], "out_running_var", F.FLOAT)
    return g, t


def batchnorm_inference_graph(device, io=F.HALF, dims=(4, 32, 8, 8), layout="nhwc", relu=False):
    """Inference batch norm from given statistics, optionally followed by ReLU (then its Y is virtual)."""
    g = _graph(device, io, "bn_infer")
    pd, ps = per_channel(dims[1])
    t = {"X": _channel_x(g, "X", dims, layout)}
    for name in ("mean", "inv_variance", "scale", "bias"):
        t[name] = g.tensor(name=name, dim=pd, stride=ps, data_type=F.FLOAT)
    y = g.batchnorm_inference(input=t["X"], mean=t["mean"], inv_variance=t["inv_variance"], scale=t["scale"],
                              bias=t["bias"])
    if relu:
        t["BN_Y"] = y
        y = g.relu(y)
    t["Y"] = _out(y, "Y", io)
    return g, t


def bn_infer_drelu_dbn_graph(device, io=F.HALF, dims=(4, 32, 8, 8)):
    """dBN(dReLU(DY, BN_inference(X))): cudnn-frontend's one graph with an inference-phase NORM_FORWARD."""
    g = _graph(device, io, "bn_infer_drelu_dbn")
    pd, ps = per_channel(dims[1])
    t = {"X": _channel_x(g, "X", dims, "nhwc"), "DY": _channel_x(g, "DY", dims, "nhwc")}
    for name in ("mean", "inv_variance", "scale", "bias"):
        t[name] = g.tensor(name=name, dim=pd, stride=ps, data_type=F.FLOAT)
    bn_y = g.batchnorm_inference(input=t["X"], mean=t["mean"], inv_variance=t["inv_variance"], scale=t["scale"],
                                 bias=t["bias"])
    drelu = g.relu_backward(loss=t["DY"], input=bn_y).set_data_type(io)
    dx, dscale, dbias = g.batchnorm_backward(grad=drelu, input=t["X"], scale=t["scale"], mean=t["mean"],
                                             inv_variance=t["inv_variance"])
    t["DX"] = _out(dx, "DX", io)
    t["dscale"] = _out(dscale, "dscale", F.FLOAT)
    t["dbias"] = _out(dbias, "dbias", F.FLOAT)
    return g, t


def batchnorm_backward_graph(device, io=F.HALF, dims=(4, 32, 8, 8), peers=0, layout="nhwc"):
    g = _graph(device, io, "dbn")
    pd, ps = per_channel(dims[1])
    t = {"DY": _channel_x(g, "DY", dims, layout), "X": _channel_x(g, "X", dims, layout)}
    for name in ("scale", "mean", "inv_variance"):
        t[name] = g.tensor(name=name, dim=pd, stride=ps, data_type=F.FLOAT)
    peer_stats = [g.tensor(name=f"peer{i}", dim=(2, 4 * dims[1], 1, 1), stride=(4 * dims[1], 1, 4 * dims[1], 4 * dims[1]),
                           data_type=F.FLOAT) for i in range(peers)]
    t.update({f"peer{i}": p for i, p in enumerate(peer_stats)})
    outs = g.batchnorm_backward(grad=t["DY"], input=t["X"], scale=t["scale"], mean=t["mean"],
                                inv_variance=t["inv_variance"], peer_stats=peer_stats or None)
    _backward_outputs(t, outs, io)
    return g, t


def instancenorm_graph(device, io=F.HALF, phase=TRAINING, dims=(2, 16, 8, 8), layout="nhwc"):
    g = _graph(device, io, "in")
    pd, ps = per_channel(dims[1])
    t = {"X": _channel_x(g, "X", dims, layout),
         "scale": g.tensor(name="scale", dim=pd, stride=ps, data_type=F.FLOAT),
         "bias": g.tensor(name="bias", dim=pd, stride=ps, data_type=F.FLOAT)}
    outs = g.instancenorm(norm_forward_phase=phase, input=t["X"], scale=t["scale"], bias=t["bias"], epsilon=_eps(g))
    _forward_outputs(t, outs, io, phase)
    return g, t


def instancenorm_backward_graph(device, io=F.HALF, dims=(2, 16, 8, 8), layout="nhwc"):
    g = _graph(device, io, "din")
    pd, ps = per_channel(dims[1])
    sd = dims[:2] + (1, 1)
    t = {"DY": _channel_x(g, "DY", dims, layout), "X": _channel_x(g, "X", dims, layout),
         "scale": g.tensor(name="scale", dim=pd, stride=ps, data_type=F.FLOAT),
         "mean": g.tensor(name="mean", dim=sd, stride=(dims[1], 1, dims[1], dims[1]), data_type=F.FLOAT),
         "inv_variance": g.tensor(name="inv_variance", dim=sd, stride=(dims[1], 1, dims[1], dims[1]),
                                  data_type=F.FLOAT)}
    outs = g.instancenorm_backward(grad=t["DY"], input=t["X"], scale=t["scale"], mean=t["mean"],
                                   inv_variance=t["inv_variance"])
    _backward_outputs(t, outs, io)
    return g, t


def genstats_graph(device, io=F.HALF, dims=(4, 32, 8, 8)):
    g = _graph(device, io, "genstats")
    t = {"X": _channel_x(g, "X", dims, "nhwc")}
    s, sq = g.genstats(input=t["X"])
    t["sum"] = _out(s, "sum", F.FLOAT)
    t["sq_sum"] = _out(sq, "sq_sum", F.FLOAT)
    return g, t


def scale_bias_relu_conv_genstats_graph(device, io=F.HALF, n=2, c=16, k=32, hw=8, r=3):
    """relu(X * S + B) -> conv_fprop (3x3, pad 1) -> Y, and genstats(Y): the users' BN-fusion prologue."""
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=io, compute_data_type=F.FLOAT, device=device,
                      name="sbr_conv_genstats")
    xd, wd = (n, c, hw, hw), (k, c, r, r)
    pd, ps = per_channel(c)
    t = {"X": g.tensor(name="X", dim=xd, stride=nhwc(xd)), "W": g.tensor(name="W", dim=wd, stride=nhwc(wd)),
         "S": g.tensor(name="S", dim=pd, stride=ps), "B": g.tensor(name="B", dim=pd, stride=ps)}
    act = g.relu(g.bias(g.scale(t["X"], t["S"]), t["B"]))
    pad = r // 2
    y = g.conv_fprop(image=act, weight=t["W"], padding=[pad, pad], stride=[1, 1], dilation=[1, 1])
    t["Y"] = _out(y, "Y", io)
    s, sq = g.genstats(input=y)
    t["sum"] = _out(s, "sum", F.FLOAT)
    t["sq_sum"] = _out(sq, "sq_sum", F.FLOAT)
    return g, t


def _program(builder, **kwargs):
    g, t = builder("cuda", **kwargs)
    g.validate()
    return lower_program(g), t


def _op(program, kind):
    (op,) = [s.attrs for s in program.steps if s.kind == kind]
    return op


def _ref(t):
    return Ref(f"tensor_{t.uid}")


# ---- CPU: the lowered programs ------------------------------------------------------------------------

@pytest.mark.parametrize("op, mode", [("layernorm", "LAYER_NORM"), ("rmsnorm", "RMS_NORM")])
@pytest.mark.parametrize("phase", [TRAINING, INFERENCE], ids=lambda p: p.name)
def test_layer_norms_lower_to_norm_forward_with_mode_and_phase(op, mode, phase):
    program, t = _program(layer_graph, op=op, phase=phase)
    fwd = _op(program, NORM_FWD_OP)
    assert fwd[FWD + "MODE"] == _lower_norm.NormMode[mode]
    assert fwd[FWD + "PHASE"] == phase
    assert fwd[FWD + "XDESC"] == _ref(t["X"])
    assert fwd[FWD + "SCALE_DESC"] == _ref(t["scale"])
    assert fwd[FWD + "BIAS_DESC"] == _ref(t["bias"])
    assert fwd[FWD + "YDESC"] == _ref(t["Y"])
    assert isinstance(fwd[FWD + "EPSILON_DESC"], Ref)
    if phase == TRAINING:
        assert fwd[FWD + "INV_VARIANCE_DESC"] == _ref(t["inv_variance"])
        # statistics per row: (N, 1, 1, 1) over x (N, C, H, W)
        assert program.geometry[t["inv_variance"].uid] == ((64, 1, 1, 1), (1, 1, 1, 1))
    else:
        assert FWD + "INV_VARIANCE_DESC" not in fwd and FWD + "MEAN_DESC" not in fwd
    assert (FWD + "MEAN_DESC" in fwd) == (op == "layernorm" and phase == TRAINING)
    for absent in ("EXP_AVG_FACTOR_DESC", "INPUT_RUNNING_MEAN_DESC", "OUTPUT_RUNNING_MEAN_DESC", "PEER_STAT_DESCS"):
        assert FWD + absent not in fwd
    assert program.operations == ["op_0"]


def test_rmsnorm_without_bias_sets_no_bias_and_keeps_rank3():
    program, t = _program(layer_graph, op="rmsnorm", bias=False, rank=3)
    fwd = _op(program, NORM_FWD_OP)
    assert FWD + "BIAS_DESC" not in fwd
    assert program.geometry[t["X"].uid][0] == (2, 32, 128)
    assert program.geometry[t["inv_variance"].uid][0] == (2, 32, 1)


def test_epsilon_is_a_by_value_scalar_of_the_graph_rank():
    program, t = _program(layer_graph)
    eps_step = program.step(_op(program, NORM_FWD_OP)[FWD + "EPSILON_DESC"].name)
    assert eps_step.attrs["CUDNN_ATTR_TENSOR_IS_BY_VALUE"] is True
    assert eps_step.attrs["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (1, 1, 1, 1)
    uid = eps_step.attrs["CUDNN_ATTR_TENSOR_UNIQUE_ID"]
    assert [(u, v) for u, _, v in program.constants] == [(uid, 1e-5)]


def test_batchnorm_training_maps_running_statistics_and_momentum():
    program, t = _program(batchnorm_graph)
    fwd = _op(program, NORM_FWD_OP)
    assert fwd[FWD + "MODE"] == _lower_norm.NormMode.BATCH_NORM
    assert fwd[FWD + "PHASE"] == TRAINING
    expect = {"XDESC": "X", "SCALE_DESC": "scale", "BIAS_DESC": "bias", "YDESC": "Y", "MEAN_DESC": "mean",
              "INV_VARIANCE_DESC": "inv_variance", "INPUT_RUNNING_MEAN_DESC": "in_running_mean",
              "INPUT_RUNNING_VAR_DESC": "in_running_var", "OUTPUT_RUNNING_MEAN_DESC": "out_running_mean",
              "OUTPUT_RUNNING_VAR_DESC": "out_running_var"}
    for attr, name in expect.items():
        assert fwd[FWD + attr] == _ref(t[name]), attr
    momentum = program.step(fwd[FWD + "EXP_AVG_FACTOR_DESC"].name).attrs
    assert momentum["CUDNN_ATTR_TENSOR_IS_BY_VALUE"] is True
    assert (momentum["CUDNN_ATTR_TENSOR_UNIQUE_ID"], DataType.FLOAT, 0.1) in program.constants
    # per-channel statistics, channels-last like x
    assert program.geometry[t["mean"].uid] == ((1, 32, 1, 1), (32, 1, 32, 32))
    assert program.geometry[t["X"].uid] == ((4, 32, 8, 8), nhwc((4, 32, 8, 8)))


def test_batchnorm_without_running_statistics_sets_none_of_them():
    program, _ = _program(batchnorm_graph, running=False)
    fwd = _op(program, NORM_FWD_OP)
    for attr in ("EXP_AVG_FACTOR_DESC", "INPUT_RUNNING_MEAN_DESC", "INPUT_RUNNING_VAR_DESC",
                 "OUTPUT_RUNNING_MEAN_DESC", "OUTPUT_RUNNING_VAR_DESC"):
        assert FWD + attr not in fwd


def test_batchnorm_peer_statistics_get_descriptors_and_the_peer_attribute():
    program, t = _program(batchnorm_graph, peers=2)
    fwd = _op(program, NORM_FWD_OP)
    assert fwd[FWD + "PEER_STAT_DESCS"] == (_ref(t["peer0"]), _ref(t["peer1"]))
    for name in ("peer0", "peer1"):
        step = program.step(f"tensor_{t[name].uid}")
        assert step.kind == "CUDNN_BACKEND_TENSOR_DESCRIPTOR"
        assert step.attrs["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 128, 1, 1)
        assert step.attrs["CUDNN_ATTR_TENSOR_STRIDES"] == (128, 1, 128, 128)
        assert step.attrs["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.FLOAT
        assert step.attrs["CUDNN_ATTR_TENSOR_IS_VIRTUAL"] is False
        assert t[name].uid in program.tensor_steps
    # each descriptor is made once, before the operation that references it
    names = [s.name for s in program.steps]
    assert names.count(f"tensor_{t['peer0'].uid}") == 1
    assert names.index(f"tensor_{t['peer0'].uid}") < names.index("op_0")


def test_batchnorm_backward_peer_statistics():
    program, t = _program(batchnorm_backward_graph, peers=1)
    bwd = _op(program, NORM_BWD_OP)
    assert bwd[BWD + "PEER_STAT_DESCS"] == (_ref(t["peer0"]),)


PW_OP = "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR"
PW = "CUDNN_ATTR_OPERATION_POINTWISE_"


def _chain(program):
    """[(mode, X step attrs, B step attrs, Y step attrs)] of the program's pointwise operations."""
    out = []
    for name in program.operations:
        op = program.step(name)
        assert op.kind == PW_OP, op.kind
        mode = program.step(op.attrs[PW + "PW_DESCRIPTOR"].name).attrs["CUDNN_ATTR_POINTWISE_MODE"]
        out.append((mode,) + tuple(program.step(op.attrs[PW + a].name).attrs if PW + a in op.attrs else None
                                   for a in ("XDESC", "BDESC", "YDESC")))
    return out


def _uid(attrs):
    return attrs["CUDNN_ATTR_TENSOR_UNIQUE_ID"]


def test_batchnorm_inference_is_the_pointwise_composite_in_the_graphs_geometry():
    """cuDNN 9.19 refused the composite over channel-first views and ran it in the graph's (N, C, ...) order."""
    from cudnn_graph.enums import pointwise_mode as pw
    program, t = _program(batchnorm_inference_graph)
    assert program.of_kind(NORM_FWD_OP) == [] and program.constants == [] and program.aliases == []
    chain = _chain(program)
    assert [m for m, *_ in chain] == [pw.SUB, pw.MUL, pw.MUL, pw.ADD]
    # (X - mean) * inv_variance * scale + bias, each operand the graph tensor of that name
    assert chain[0][1] == program.step(f"tensor_{t['X'].uid}").attrs
    for (_, _, b, _), name in zip(chain, ("mean", "inv_variance", "scale", "bias")):
        assert b == program.step(f"tensor_{t[name].uid}").attrs, name
    assert chain[-1][3] == program.step(f"tensor_{t['Y'].uid}").attrs
    x = chain[0][1]
    # each op feeds the next through a virtual tensor of the compute type, in X's layout
    for (_, _, _, y), (_, nxt, _, _) in zip(chain, chain[1:]):
        assert y is nxt and y["CUDNN_ATTR_TENSOR_IS_VIRTUAL"] is True
        assert y["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.FLOAT
        assert y["CUDNN_ATTR_TENSOR_STRIDES"] == x["CUDNN_ATTR_TENSOR_STRIDES"]
    for attrs in program.of_kind("POINTWISE"):
        assert attrs["CUDNN_ATTR_POINTWISE_MATH_PREC"] == DataType.FLOAT


def test_batchnorm_inference_feeding_relu_keeps_its_geometry():
    """A virtual Y is also the ReLU's input, so it cannot be seen channel first: tensors as the graph has them."""
    program, t = _program(batchnorm_inference_graph, relu=True)
    chain = _chain(program)
    assert len(chain) == 5 and program.aliases == []
    assert chain[0][1] == program.step(f"tensor_{t['X'].uid}").attrs
    assert chain[1][2] == program.step(f"tensor_{t['inv_variance'].uid}").attrs
    assert chain[3][3] == program.step(f"tensor_{t['BN_Y'].uid}").attrs   # the ADD writes BN's Y, ReLU reads it
    assert chain[4][1] is chain[3][3]


def test_batchnorm_inference_in_the_dbn_fusion_stays_an_inference_norm_forward():
    program, t = _program(bn_infer_drelu_dbn_graph)
    kinds = [program.step(name).kind for name in program.operations]
    assert kinds == [NORM_FWD_OP, PW_OP, NORM_BWD_OP]
    fwd = _op(program, NORM_FWD_OP)
    assert fwd[FWD + "MODE"] == _lower_norm.NormMode.BATCH_NORM
    assert fwd[FWD + "PHASE"] == INFERENCE
    assert fwd[FWD + "MEAN_DESC"] == _ref(t["mean"])
    assert fwd[FWD + "INV_VARIANCE_DESC"] == _ref(t["inv_variance"])
    assert FWD + "EPSILON_DESC" not in fwd
    assert program.constants == [] and program.aliases == []


def test_batchnorm_relu_fusion_is_one_graph():
    program, t = _program(batchnorm_graph, relu=True)
    kinds = [program.step(name).kind for name in program.operations]
    assert kinds == [NORM_FWD_OP, "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR"]
    fwd = _op(program, NORM_FWD_OP)
    y = program.step(fwd[FWD + "YDESC"].name).attrs
    assert y["CUDNN_ATTR_TENSOR_IS_VIRTUAL"] is True and y["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.FLOAT


@pytest.mark.parametrize("phase", [TRAINING, INFERENCE], ids=lambda p: p.name)
def test_instancenorm_statistics_are_per_sample_and_channel(phase):
    program, t = _program(instancenorm_graph, phase=phase)
    fwd = _op(program, NORM_FWD_OP)
    assert fwd[FWD + "MODE"] == _lower_norm.NormMode.INSTANCE_NORM
    assert fwd[FWD + "PHASE"] == phase
    if phase == TRAINING:
        assert program.geometry[t["mean"].uid] == ((2, 16, 1, 1), (16, 1, 16, 16))


def test_adalayernorm_statistics_and_version_gate():
    program, t = _program(ada_graph)
    fwd = _op(program, NORM_FWD_OP)
    assert fwd[FWD + "MODE"] == _lower_norm.NormMode.ADA_LAYER_NORM
    assert program.geometry[t["scale"].uid][0] == (2, 1, 128)
    assert program.geometry[t["mean"].uid][0] == (2, 64, 1)
    from cudnn_graph._cudnn_errors import CudnnVersionError
    for builder in (ada_graph, ada_backward_graph):
        g, _ = builder("cuda")
        g.validate()
        with pytest.raises(CudnnVersionError, match=r"9\.9\.0") as info:
            check_lowerable(g, version=90800)
        assert "adalayernorm" in str(info.value) and "9.8.0" in str(info.value)
        check_lowerable(g, version=91900)
        lower_program(g, version=91900)


@pytest.mark.parametrize("builder, kwargs, mode", [
    (layer_backward_graph, {"op": "layernorm_backward"}, "LAYER_NORM"),
    (layer_backward_graph, {"op": "rmsnorm_backward"}, "RMS_NORM"),
    (ada_backward_graph, {}, "ADA_LAYER_NORM"),
    (batchnorm_backward_graph, {}, "BATCH_NORM"),
    (instancenorm_backward_graph, {}, "INSTANCE_NORM"),
], ids=["layernorm", "rmsnorm", "adalayernorm", "batchnorm", "instancenorm"])
def test_backward_norms_map_every_port(builder, kwargs, mode):
    program, t = _program(builder, **kwargs)
    bwd = _op(program, NORM_BWD_OP)
    assert bwd[BWD + "MODE"] == _lower_norm.NormMode[mode]
    expect = {"XDESC": "X", "DYDESC": "DY", "SCALE_DESC": "scale", "INV_VARIANCE_DESC": "inv_variance",
              "DXDESC": "DX", "DSCALE_DESC": "dscale", "DBIAS_DESC": "dbias", "MEAN_DESC": "mean"}
    for attr, name in expect.items():
        if name in t:
            assert bwd[BWD + attr] == _ref(t[name]), attr
        else:
            assert BWD + attr not in bwd, attr
    assert (BWD + "MEAN_DESC" in bwd) == (mode != "RMS_NORM")
    assert BWD + "EPSILON_DESC" not in bwd   # only cuDNN < 8.9.6 wanted it
    assert BWD + "PEER_STAT_DESCS" not in bwd


def test_rmsnorm_backward_without_dbias_sets_no_dbias():
    program, t = _program(layer_backward_graph, op="rmsnorm_backward", dbias=False)
    bwd = _op(program, NORM_BWD_OP)
    assert "dbias" not in t and BWD + "DBIAS_DESC" not in bwd
    assert bwd[BWD + "DSCALE_DESC"] == _ref(t["dscale"])


def test_genstats_program():
    program, t = _program(genstats_graph)
    op = _op(program, GENSTATS_OP)
    assert op == {GEN + "MODE": _lower_norm.GenStatsMode.SUM_SQSUM, GEN + "MATH_PREC": DataType.FLOAT,
                  GEN + "XDESC": _ref(t["X"]), GEN + "SUMDESC": _ref(t["sum"]), GEN + "SQSUMDESC": _ref(t["sq_sum"])}
    assert program.geometry[t["sum"].uid] == ((1, 32, 1, 1), (32, 1, 32, 32))


def test_scale_bias_relu_conv_genstats_program():
    if "conv_fprop" not in LOWERERS:
        pytest.skip("conv_fprop is not lowered yet (engines/cudnn_backend/_lower_conv.py)")
    program, t = _program(scale_bias_relu_conv_genstats_graph)
    kinds = [program.step(name).kind for name in program.operations]
    assert kinds[:3] == ["CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR"] * 3
    assert kinds[-1] == GENSTATS_OP and "CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR" in kinds
    op = _op(program, GENSTATS_OP)
    assert op[GEN + "XDESC"] == _ref(t["Y"])
    assert program.geometry[t["sum"].uid][0] == (1, 32, 1, 1)


@pytest.mark.parametrize("op", ["batchnorm", "genstats"])
def test_rank2_channel_norms_are_declined_naming_the_input(op):
    g = _graph("cuda", F.FLOAT, "r2")
    x = g.tensor(name="x2d", dim=(8, 4), stride=(4, 1))
    if op == "genstats":
        outs = g.genstats(input=x)
    else:
        s = g.tensor(name="s", dim=(1, 4), stride=(4, 1))
        b = g.tensor(name="b", dim=(1, 4), stride=(4, 1))
        outs = g.batchnorm(input=x, scale=s, bias=b, epsilon=_eps(g))
    for o in outs:
        if o is not None:
            o.set_output(True)
    g.validate()
    with pytest.raises(GraphNotSupportedError, match="x2d.*channel axis"):
        lower_program(g)


def test_rank2_layernorm_is_padded_in_front():
    g = _graph("cuda", F.FLOAT, "ln2")
    x = g.tensor(name="x", dim=(8, 64), stride=(64, 1))
    s = g.tensor(name="s", dim=(1, 64), stride=(64, 1))
    b = g.tensor(name="b", dim=(1, 64), stride=(64, 1))
    y, mean, inv = g.layernorm(norm_forward_phase=TRAINING, input=x, scale=s, bias=b, epsilon=_eps(g))
    for o in (y, mean, inv):
        o.set_output(True)
    g.validate()
    program = lower_program(g)
    assert program.geometry[x.uid][0] == (1, 8, 64)
    assert program.geometry[s.uid][0] == (1, 1, 64)
    assert program.geometry[mean.uid][0] == (1, 8, 1)


ALL_BUILDERS = [
    (layer_graph, {}), (layer_graph, {"op": "rmsnorm", "bias": False}), (layer_backward_graph, {}),
    (layer_backward_graph, {"op": "rmsnorm_backward"}), (ada_graph, {}), (ada_backward_graph, {}),
    (batchnorm_graph, {"peers": 2, "relu": True}), (batchnorm_inference_graph, {}),
    (batchnorm_inference_graph, {"relu": True}), (bn_infer_drelu_dbn_graph, {}),
    (batchnorm_backward_graph, {"peers": 1}), (instancenorm_graph, {}), (instancenorm_backward_graph, {}),
    (genstats_graph, {}),
]


class _RecordingDescriptor:
    calls: list = []

    def __init__(self, kind):
        self.kind = kind

    def set(self, attr, attr_type, value):
        _RecordingDescriptor.calls.append((self.kind, attr, attr_type, value))

    def finalize(self):
        return self


@pytest.mark.parametrize("builder, kwargs", ALL_BUILDERS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_every_attribute_has_a_type_and_enums_go_as_ints(builder, kwargs):
    program, _ = _program(builder, **kwargs)
    _RecordingDescriptor.calls = []
    materialize(program, handle=object(), descriptor_factory=_RecordingDescriptor)
    enum_types = {"CUDNN_TYPE_NORM_MODE", "CUDNN_TYPE_NORM_FWD_PHASE", "CUDNN_TYPE_GENSTATS_MODE",
                  "CUDNN_TYPE_DATA_TYPE"}
    for kind, attr, attr_type, value in _RecordingDescriptor.calls:
        assert ATTRIBUTE_TYPES[attr] == attr_type
        if attr_type in enum_types:
            assert isinstance(value, int), (attr, value)
        if attr_type == "CUDNN_TYPE_BACKEND_DESCRIPTOR":
            values = value if isinstance(value, list) else [value]
            assert all(isinstance(v, _RecordingDescriptor) for v in values), attr


def test_norm_names_and_enum_values_match_the_header():
    header = (REPO_ROOT / "include" / "cudnn_graph" / "cudnn_backend.h").read_text()
    values = {name: int(v) for name, v in re.findall(r"^\s+(CUDNN_\w+)\s+=\s+(-?\d+),?", header, re.M)}
    for attr, attr_type in ATTRIBUTE_TYPES.items():
        if "NORM" in attr or "GENSTATS" in attr:
            assert attr in values and attr_type in values, attr
    for kind in (NORM_FWD_OP, NORM_BWD_OP, GENSTATS_OP):
        assert kind in values
    header_modes = {"LAYER_NORM": "CUDNN_LAYER_NORM", "INSTANCE_NORM": "CUDNN_INSTANCE_NORM",
                    "BATCH_NORM": "CUDNN_BATCH_NORM", "GROUP_NORM": "CUDNN_GROUP_NORM", "RMS_NORM": "CUDNN_RMS_NORM",
                    "ADA_LAYER_NORM": "CUDNN_ADA_LAYER_NORM"}
    for member in _lower_norm.NormMode:
        assert values[header_modes[member.name]] == member.value
    assert values["CUDNN_NORM_FWD_TRAINING"] == TRAINING and values["CUDNN_NORM_FWD_INFERENCE"] == INFERENCE
    assert values["CUDNN_GENSTATS_SUM_SQSUM"] == _lower_norm.GenStatsMode.SUM_SQSUM


# ---- GPU: results against the reference engine ----------------------------------------------------------

# Max error allowed, relative to max(1, max |reference|), per output dtype (FLOAT outputs are the
# statistics and the parameter gradients: fp32 sums of io-typed values).
TOLERANCE = {"float32": 2e-3, "float16": 5e-3, "bfloat16": 3e-2}
IO_TYPES = [F.FLOAT, F.HALF, F.BFLOAT16]


def _host(dtype, array):
    return np.asarray(array, np.float32).astype(host_dtype(dtype))


def _channels_last(rng, dims, dtype, scale=1.0, shift=0.0):
    """Host array of NCHW ``dims`` whose memory is NHWC (what the builders declare)."""
    n, c, h, w = dims
    a = (scale * rng.standard_normal((n, h, w, c)) + shift).astype(np.float32)
    return _host(dtype, a).transpose(0, 3, 1, 2)


def _dense(rng, dims, dtype, scale=1.0, shift=0.0):
    return _host(dtype, scale * rng.standard_normal(dims) + shift)


def _per_channel(rng, c, scale=1.0, shift=0.0):
    return (scale * rng.standard_normal((1, c, 1, 1)) + shift).astype(np.float32)


def _stats(x, axes, eps=1e-5):
    x = np.asarray(x, np.float32)
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(np.square(x - mean).mean(axis=axes, keepdims=True) + eps)
    return mean.astype(np.float32), inv.astype(np.float32)


def _check(builder, host, out_names, producer, **kwargs):
    want = reference_run(builder, host, out_names, **kwargs)
    got, g = gpu_run(builder, host, out_names, producer, **kwargs)
    for name in out_names:
        dtype = np.dtype(want[name].dtype).name
        assert_close(got[name], want[name], dtype, f"{name} ({producer})", tolerance=TOLERANCE[dtype])
    return g


def _layer_inputs(rng, io, rows=64, hidden=128, rank=4):
    dims = (rows, hidden, 1, 1) if rank == 4 else (2, rows // 2, hidden)
    sdims = (1, hidden, 1, 1) if rank == 4 else (1, 1, hidden)
    return {"X": _dense(rng, dims, io, 2.0, 0.5),
            "scale": (1.0 + 0.5 * rng.standard_normal(sdims)).astype(np.float32),
            "bias": (0.5 * rng.standard_normal(sdims)).astype(np.float32)}


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO_TYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_layer_norms_forward_with_cupy(io, op):
    rng = np.random.default_rng(1)
    host = _layer_inputs(rng, io)
    _check(layer_graph, host, {"Y", "inv_variance"} | ({"mean"} if op == "layernorm" else set()), "cupy",
           io=io, op=op)
    if io == F.HALF:   # the inference phase once: a separate graph build per case costs time
        _check(layer_graph, host, {"Y"}, "cupy", io=io, op=op, phase=INFERENCE)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_layer_norms_forward_with_jax(op):
    rng = np.random.default_rng(2)
    host = _layer_inputs(rng, F.HALF)
    outs = {"Y", "inv_variance"} | ({"mean"} if op == "layernorm" else set())
    _check(layer_graph, host, outs, "jax", io=F.HALF, op=op)


@pytest.mark.gpu
@pytest.mark.parametrize("producer", ["cupy", "jax"])
def test_rmsnorm_rank3_without_bias(producer):
    rng = np.random.default_rng(3)
    host = _layer_inputs(rng, F.BFLOAT16, rank=3)
    del host["bias"]
    _check(layer_graph, host, {"Y", "inv_variance"}, producer, io=F.BFLOAT16, op="rmsnorm", bias=False, rank=3)


def _layer_backward_inputs(rng, io, op, rank=4):
    host = _layer_inputs(rng, io, rank=rank)
    x = np.asarray(host["X"], np.float32)
    axes = tuple(i for i, s in enumerate(host["scale"].shape) if s != 1)
    mean, inv = _stats(x, axes)
    if op == "rmsnorm_backward":
        inv = (1.0 / np.sqrt(np.square(x).mean(axis=axes, keepdims=True) + 1e-5)).astype(np.float32)
    return {"X": host["X"], "DY": _dense(rng, x.shape, io), "scale": host["scale"], "mean": mean,
            "inv_variance": inv}


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO_TYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["layernorm_backward", "rmsnorm_backward"])
def test_layer_norms_backward_with_cupy(io, op):
    rng = np.random.default_rng(4)
    host = _layer_backward_inputs(rng, io, op)
    _check(layer_backward_graph, host, {"DX", "dscale", "dbias"}, "cupy", io=io, op=op)


@pytest.mark.gpu
@pytest.mark.parametrize("op, dbias", [("layernorm_backward", True), ("rmsnorm_backward", False)])
def test_layer_norms_backward_with_jax(op, dbias):
    rng = np.random.default_rng(5)
    host = _layer_backward_inputs(rng, F.HALF, op)
    outs = {"DX", "dscale"} | ({"dbias"} if dbias else set())
    _check(layer_backward_graph, host, outs, "jax", io=F.HALF, op=op, dbias=dbias)


def _ada_inputs(rng, io):
    return {"X": _dense(rng, (2, 64, 128), io, 2.0, 0.5),
            "scale": (1.0 + 0.5 * rng.standard_normal((2, 1, 128))).astype(np.float32),
            "bias": (0.5 * rng.standard_normal((2, 1, 128))).astype(np.float32)}


@pytest.mark.gpu
@pytest.mark.parametrize("io, producer", [(F.FLOAT, "cupy"), (F.HALF, "cupy"), (F.BFLOAT16, "cupy"),
                                          (F.HALF, "jax")], ids=lambda v: getattr(v, "name", v))
def test_adalayernorm_forward_and_backward(io, producer):
    rng = np.random.default_rng(6)
    host = _ada_inputs(rng, io)
    _check(ada_graph, host, {"Y", "mean", "inv_variance"}, producer, io=io)
    if io == F.HALF:
        _check(ada_graph, host, {"Y"}, producer, io=io, phase=INFERENCE)
    x = np.asarray(host["X"], np.float32)
    mean, inv = _stats(x, (2,))
    bwd = {"X": host["X"], "DY": _dense(rng, x.shape, io), "scale": host["scale"], "mean": mean, "inv_variance": inv}
    _check(ada_backward_graph, bwd, {"DX", "dscale", "dbias"}, producer, io=io)


def _maker(producer, layout):
    """Host arrays with the memory the builder declares; JAX only takes dense ones (its cases use
    layouts where that is the same memory: unit spatial axes, or NCHW)."""
    return _dense if producer == "jax" or layout == "nchw" else _channels_last


def _batch_inputs(rng, io, dims, make):
    c = dims[1]
    return {"X": make(rng, dims, io, 1.5, 0.25), "scale": _per_channel(rng, c, 0.5, 1.0),
            "bias": _per_channel(rng, c, 0.5), "in_running_mean": _per_channel(rng, c, 0.1),
            "in_running_var": np.abs(_per_channel(rng, c, 0.1, 1.0))}


# JAX arrays are dense row-major: (N, C, 1, 1) is channels-last and row-major at once.
BATCH_CASES = [(F.FLOAT, "cupy", (4, 32, 8, 8), "nhwc"), (F.HALF, "cupy", (4, 32, 8, 8), "nhwc"),
               (F.BFLOAT16, "cupy", (4, 32, 8, 8), "nhwc"), (F.HALF, "jax", (64, 32, 1, 1), "nhwc")]


@pytest.mark.gpu
@pytest.mark.parametrize("io, producer, dims, layout", BATCH_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_batchnorm_training_with_running_statistics(io, producer, dims, layout):
    rng = np.random.default_rng(7)
    host = _batch_inputs(rng, io, dims, _maker(producer, layout))
    _check(batchnorm_graph, host, {"Y", "mean", "inv_variance", "out_running_mean", "out_running_var"}, producer,
           io=io, dims=dims, layout=layout)


@pytest.mark.gpu
@pytest.mark.parametrize("producer", ["cupy", "jax"])
def test_batchnorm_relu_fusion(producer):
    dims = (4, 32, 8, 8) if producer == "cupy" else (64, 32, 1, 1)
    rng = np.random.default_rng(8)
    host = _batch_inputs(rng, F.HALF, dims, _maker(producer, "nhwc"))
    _check(batchnorm_graph, host, {"Y", "mean", "inv_variance"}, producer, io=F.HALF, dims=dims, relu=True,
           running=False)


@pytest.mark.gpu
@pytest.mark.parametrize("io, producer, dims, layout", BATCH_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_batchnorm_inference_and_backward(io, producer, dims, layout):
    rng = np.random.default_rng(9)
    make = _maker(producer, layout)
    host = _batch_inputs(rng, io, dims, make)
    x = np.asarray(host["X"], np.float32)
    mean, inv = _stats(x, (0, 2, 3))
    infer = {"X": host["X"], "mean": mean, "inv_variance": inv, "scale": host["scale"], "bias": host["bias"]}
    _check(batchnorm_inference_graph, infer, {"Y"}, producer, io=io, dims=dims, layout=layout)
    bwd = {"X": host["X"], "DY": make(rng, dims, io), "scale": host["scale"], "mean": mean, "inv_variance": inv}
    _check(batchnorm_backward_graph, bwd, {"DX", "dscale", "dbias"}, producer, io=io, dims=dims, layout=layout)


@pytest.mark.gpu
@pytest.mark.parametrize("producer", ["cupy", "jax"])
def test_batchnorm_inference_relu_fusion(producer):
    """The composite with a virtual Y, so in the graph's own (N, C, H, W) geometry: its per-channel
    operands broadcast along axis 0 (see lowering._POINTWISE_FOLD), which this checks numerically."""
    dims = (4, 32, 8, 8) if producer == "cupy" else (64, 32, 1, 1)
    rng = np.random.default_rng(13)
    host = _batch_inputs(rng, F.HALF, dims, _maker(producer, "nhwc"))
    mean, inv = _stats(np.asarray(host["X"], np.float32), (0, 2, 3))
    infer = {"X": host["X"], "mean": mean, "inv_variance": inv, "scale": host["scale"], "bias": host["bias"]}
    _check(batchnorm_inference_graph, infer, {"Y"}, producer, io=F.HALF, dims=dims, relu=True)


@pytest.mark.gpu
@pytest.mark.parametrize("producer", ["cupy", "jax"])
def test_batchnorm_inference_drelu_dbn_fusion(producer):
    """cudnn-frontend's BN_inference -> dReLU -> dBN graph: NORM_FORWARD (inference) kept native."""
    dims = (4, 32, 8, 8) if producer == "cupy" else (64, 32, 1, 1)
    rng = np.random.default_rng(14)
    make = _maker(producer, "nhwc")
    host = _batch_inputs(rng, F.HALF, dims, make)
    mean, inv = _stats(np.asarray(host["X"], np.float32), (0, 2, 3))
    inputs = {"X": host["X"], "DY": make(rng, dims, F.HALF), "mean": mean, "inv_variance": inv,
              "scale": host["scale"], "bias": host["bias"]}
    _check(bn_infer_drelu_dbn_graph, inputs, {"DX", "dscale", "dbias"}, producer, dims=dims)


def _instance_inputs(rng, io, dims, make):
    c = dims[1]
    return {"X": make(rng, dims, io, 1.5, 0.25), "scale": _per_channel(rng, c, 0.5, 1.0),
            "bias": _per_channel(rng, c, 0.5)}


# JAX cannot hand over channels-last memory, so its case declares NCHW strides.
INSTANCE_CASES = [(F.FLOAT, "cupy", "nhwc"), (F.HALF, "cupy", "nhwc"), (F.BFLOAT16, "cupy", "nhwc"),
                  (F.HALF, "jax", "nchw")]


@pytest.mark.gpu
@pytest.mark.parametrize("io, producer, layout", INSTANCE_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_instancenorm_forward_and_backward(io, producer, layout):
    dims = (2, 16, 8, 8)
    rng = np.random.default_rng(10)
    make = _maker(producer, layout)
    host = _instance_inputs(rng, io, dims, make)
    _check(instancenorm_graph, host, {"Y", "mean", "inv_variance"}, producer, io=io, layout=layout)
    if io == F.HALF:
        _check(instancenorm_graph, host, {"Y"}, producer, io=io, phase=INFERENCE, layout=layout)
    x = np.asarray(host["X"], np.float32)
    mean, inv = _stats(x, (2, 3))
    bwd = {"X": host["X"], "DY": make(rng, dims, io), "scale": host["scale"],
           "mean": np.ascontiguousarray(mean), "inv_variance": np.ascontiguousarray(inv)}
    _check(instancenorm_backward_graph, bwd, {"DX", "dscale", "dbias"}, producer, io=io, layout=layout)


@pytest.mark.gpu
@pytest.mark.parametrize("producer", ["cupy", "jax"])
def test_scale_bias_relu_conv_genstats_fusion(producer):
    """The BN-fusion prologue users build; needs conv_fprop lowered (engines/cudnn_backend/_lower_conv.py)."""
    rng = np.random.default_rng(11)
    c, k = 16, 32
    # JAX arrays are dense: its case is a 1x1 convolution of 1x1 images, channels-last and row-major at once.
    n, hw, r = (2, 8, 3) if producer == "cupy" else (64, 1, 1)
    make = _maker(producer, "nhwc")
    host = {"X": make(rng, (n, c, hw, hw), F.HALF), "W": make(rng, (k, c, r, r), F.HALF, 0.2),
            "S": _host(F.HALF, 1.0 + 0.1 * rng.standard_normal((1, c, 1, 1))),
            "B": _host(F.HALF, 0.1 * rng.standard_normal((1, c, 1, 1)))}
    _check(scale_bias_relu_conv_genstats_graph, host, {"Y", "sum", "sq_sum"}, producer, n=n, hw=hw, r=r)


@pytest.mark.gpu
@pytest.mark.parametrize("producer", ["cupy", "jax"])
def test_standalone_genstats_runs_right_or_declines_cleanly(producer):
    """cuDNN may have no engine for genstats outside a convolution fusion: then the build must decline
    with GraphNotSupportedError; when it runs, the sums must be right."""
    dims = (4, 32, 8, 8) if producer == "cupy" else (64, 32, 1, 1)
    rng = np.random.default_rng(12)
    host = {"X": _maker(producer, "nhwc")(rng, dims, F.HALF)}
    try:
        build_gpu(genstats_graph, dims=dims)
    except GraphNotSupportedError as exc:
        assert str(exc)
        return
    _check(genstats_graph, host, {"sum", "sq_sum"}, producer, dims=dims)


@pytest.mark.gpu
def test_batchnorm_with_peer_statistics_builds_or_declines_cleanly():
    """The reference engine runs one device, so peer statistics get no numeric check here: cuDNN must
    take the lowered graph (plans built) or decline it with GraphNotSupportedError; nothing is run,
    since peer buffers carry a cross-GPU handshake a single process cannot honestly stand in for."""
    for builder in (batchnorm_graph, batchnorm_backward_graph):
        try:
            g, _ = build_gpu(builder, peers=2)
        except GraphNotSupportedError as exc:
            assert str(exc)
            continue
        assert g is not None
