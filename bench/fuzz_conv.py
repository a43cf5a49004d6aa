"""Seeded randomized convolution fuzzer: each case runs on the GPU and is compared with the reference engine.

    python bench/fuzz_conv.py [--seed S] [--cases N] [--json PATH] [--quiet]

Cases draw conv_fprop / conv_dgrad / conv_wgrad, 2-D or 3-D, channels-first (NCHW / NCDHW) or
channels-last (NHWC / NDHWC) memory, stride, dilation, symmetric or asymmetric padding, groups, both
convolution modes, HALF / BFLOAT16 / FLOAT io with FLOAT compute (and now and then DOUBLE, which the
backend lowering declines), and fused epilogues: bias, scale, relu and a per-channel sum reduction after
fprop; relu_backward (drelu) or a per-channel scale after dgrad; a per-filter scale after wgrad.

Outcomes (passed / declined by reason / failed: see bench/_fuzz_common.py) are printed as a table and
written to bench/results/fuzz_conv-<host>-seed<S>.json; the exit status is 1 when a case failed.
"""
from __future__ import annotations

import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fuzz_common as common  # noqa: E402

NAME = "fuzz_conv"

OPS = ("fprop", "fprop", "fprop", "dgrad", "dgrad", "wgrad", "wgrad")
EPILOGUES = {
    "fprop": (("bias",), ("bias", "relu"), ("scale", "bias", "relu"), ("relu", "reduction")),
    "dgrad": (("drelu",), ("scale",)),
    "wgrad": (("scale",),),
}
IO_TYPES = ("HALF", "HALF", "BFLOAT16", "FLOAT")


def conv_output_size(x, f, pre, post, stride, dilation) -> int:
    return 1 + (x + pre + post - dilation * (f - 1) - 1) // stride


def _case(rng: random.Random, i: int) -> dict:
    op = rng.choice(OPS)
    nd = 2 if rng.random() < 0.75 else 3
    layout = rng.choice(("channels_last", "channels_first"))
    io, compute = rng.choice(IO_TYPES), "FLOAT"
    if rng.random() < 0.03:
        io = compute = "DOUBLE"
    groups = rng.choice((1, 1, 1, 1, 2, 4))
    c = groups * rng.choice((1, 2, 3, 4, 8, 16))
    k = groups * rng.choice((1, 2, 4, 8, 16))
    n = rng.choice((1, 2, 3))
    filt = [rng.choice((1, 1, 2, 3, 3, 5) if nd == 2 else (1, 2, 3)) for _ in range(nd)]
    stride = [rng.choice((1, 1, 1, 2, 3)) for _ in range(nd)]
    dilation = [rng.choice((1, 1, 1, 2)) for _ in range(nd)]
    pre = [rng.randint(0, 2) for _ in range(nd)]
    post = list(pre) if rng.random() < 0.6 else [rng.randint(0, 2) for _ in range(nd)]
    spatial = []
    for f, d, a, b in zip(filt, dilation, pre, post):
        need = max(1, d * (f - 1) + 1 - a - b)
        spatial.append(rng.randint(need, need + (10 if nd == 2 else 4)))
    mode = "CONVOLUTION" if rng.random() < 0.15 else "CROSS_CORRELATION"
    epilogue = list(rng.choice(EPILOGUES[op])) if rng.random() < 0.5 else []
    spec = {"id": i, "seed": rng.getrandbits(32), "op": op, "nd": nd, "layout": layout, "io": io,
            "compute": compute, "n": n, "c": c, "k": k, "groups": groups, "spatial": spatial, "filter": filt,
            "pre": pre, "post": post, "stride": stride, "dilation": dilation, "mode": mode, "epilogue": epilogue}
    spec["label"] = label(spec)
    return spec


def label(spec) -> str:
    """One line naming what a case exercises."""
    s = spec
    return (f"{s['op']} {s['nd']}d {'NHWC' if s['layout'] == 'channels_last' else 'NCHW'} {s['io']} "
            f"n{s['n']} c{s['c']} k{s['k']} g{s['groups']} x{s['spatial']} f{s['filter']} s{s['stride']} "
            f"d{s['dilation']} p{s['pre']}/{s['post']}"
            + (" flip" if s["mode"] == "CONVOLUTION" else "")
            + (" +" + "+".join(s["epilogue"]) if s["epilogue"] else ""))


def generate_cases(seed: int, count: int) -> list:
    """``count`` case specs from ``seed`` (the same list on every machine: Python's own generator)."""
    rng = random.Random(seed)
    return [_case(rng, i) for i in range(count)]


def make_spec(**overrides) -> dict:
    """A case spec for tests: a 2-D channels-last HALF fprop unless ``overrides`` say otherwise."""
    nd = overrides.get("nd", 2)
    spec = {"id": 0, "seed": 1, "op": "fprop", "nd": nd, "layout": "channels_last", "io": "HALF",
            "compute": "FLOAT", "n": 2, "c": 8, "k": 16, "groups": 1, "spatial": [8] * nd, "filter": [3] * nd,
            "pre": [1] * nd, "post": [1] * nd, "stride": [1] * nd, "dilation": [1] * nd,
            "mode": "CROSS_CORRELATION", "epilogue": []}
    spec.update(overrides)
    spec["label"] = label(spec)
    return spec


# ---- shapes and layouts ----------------------------------------------------------------------------

def layout_order(spec) -> tuple:
    """Memory order of the axes, outermost first: N, C, spatial... or N, spatial..., C."""
    nd = spec["nd"]
    if spec["layout"] == "channels_last":
        return (0,) + tuple(range(2, nd + 2)) + (1,)
    return tuple(range(nd + 2))


def shapes(spec) -> tuple:
    """(image dims, filter dims, output (dy) dims) in logical N, C, spatial order."""
    x = (spec["n"], spec["c"], *spec["spatial"])
    w = (spec["k"], spec["c"] // spec["groups"], *spec["filter"])
    out = [conv_output_size(*a) for a in zip(spec["spatial"], spec["filter"], spec["pre"], spec["post"],
                                             spec["stride"], spec["dilation"])]
    return x, w, (spec["n"], spec["k"], *out)


def _channel_dims(spec, channels, axis=1) -> tuple:
    dims = [1] * (spec["nd"] + 2)
    dims[axis] = channels
    return tuple(dims)


def input_dims(spec) -> dict:
    """{input name: dims} of a case."""
    x, w, y = shapes(spec)
    ins = {"fprop": {"X": x, "W": w}, "dgrad": {"DY": y, "W": w}, "wgrad": {"X": x, "DY": y}}[spec["op"]]
    for step in spec["epilogue"]:
        if step == "bias":
            ins["B"] = _channel_dims(spec, spec["k"])
        elif step == "scale":
            ins["S"] = {"fprop": _channel_dims(spec, spec["k"]), "dgrad": _channel_dims(spec, spec["c"]),
                        "wgrad": _channel_dims(spec, spec["k"], axis=0)}[spec["op"]]
        elif step == "drelu":
            ins["XR"] = x
    return ins


def outputs(spec) -> tuple:
    if "reduction" in spec["epilogue"]:
        return ("Y", "R")
    return ({"fprop": "Y", "dgrad": "DX", "wgrad": "DW"}[spec["op"]],)


def tolerance(spec) -> float:
    return common.TOLERANCE[spec["io"]]


def build(device, spec):
    """The case's graph on ``device``: (graph, {name: Tensor}) with every input and output named."""
    import cudnn_graph as cudnn
    F = cudnn.data_type
    io = F[spec["io"]]
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F[spec["compute"]],
                      device=device, name=f"fuzz_conv_{spec['id']}")
    order = layout_order(spec)
    x_dims, w_dims, y_dims = shapes(spec)
    t = {name: g.tensor(name=name, dim=dims, stride=common.packed_strides(dims, order))
         for name, dims in input_dims(spec).items()}
    geometry = dict(pre_padding=list(spec["pre"]), post_padding=list(spec["post"]), stride=list(spec["stride"]),
                    dilation=list(spec["dilation"]), convolution_mode=spec["mode"])
    op = spec["op"]
    if op == "fprop":
        out, dims = g.conv_fprop(t["X"], t["W"], **geometry), y_dims
    elif op == "dgrad":
        out, dims = g.conv_dgrad(t["DY"], t["W"], **geometry).set_dim(x_dims), x_dims
    else:
        out, dims = g.conv_wgrad(t["X"], t["DY"], **geometry).set_dim(w_dims), w_dims
    out.set_stride(common.packed_strides(dims, order))
    for step in spec["epilogue"]:
        if step == "bias":
            out = g.bias(out, t["B"])
        elif step == "scale":
            out = g.scale(out, t["S"])
        elif step == "relu":
            out = g.relu(out)
        elif step == "drelu":
            out = g.relu_backward(out, t["XR"])
    name = outputs(spec)[0]
    out.set_output(True).set_data_type(io).set_name(name)
    t[name] = out
    if "reduction" in spec["epilogue"]:
        chan = _channel_dims(spec, spec["k"])
        r = g.reduction(out, mode=cudnn.reduction_mode.ADD)
        r.set_dim(chan).set_stride(common.packed_strides(chan, order)).set_output(True)
        t["R"] = r.set_data_type(F.FLOAT).set_name("R")
    return g, t


def host_inputs(spec) -> dict:
    """Seeded inputs in the case's layout (strided views of packed buffers)."""
    rng = np.random.default_rng(spec["seed"])
    dtype = common.host_dtype(spec["io"])
    order = layout_order(spec)
    return {name: common.random_packed(rng, dims, order, dtype) for name, dims in input_dims(spec).items()}


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__], __doc__))
