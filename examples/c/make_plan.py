"""Build a graph in Python, serialize its plan and write it (with inputs) for run_plan.c.

    python make_plan.py matmul plan_dir     # or conv, sdpa, sdpa_alibi, slice_matmul, cute_matmul, cutile_gdn
    make && ./run_plan plan_dir

Writes plan_dir/plan.blob and plan_dir/<uid>.in for every input operand: the raw bytes of its whole
strided span (a pass-by-value scalar: its one value). Needs a GPU and libcudnn; uses NumPy (and
ml_dtypes for BF16). cute_matmul is a CuTe plan (the DSL's kernel, launched by the C runtime with no
Python: run_plan needs $CUDNN_GRAPH_CUTE_RUNTIME, or the DSL runtime library's path the blob recorded).
cutile_gdn is a cuTile plan (the gated delta rule's chunked kernels: their cubins and launches are in the
blob, which the C runtime launches with libcuda alone).
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import cudnn_graph as cudnn
from cudnn_graph.router import PreferFamily

F = cudnn.data_type
HOST_TYPES = {F.HALF: np.float16, F.FLOAT: np.float32, F.INT32: np.int32, F.INT64: np.int64}
try:
    import ml_dtypes
    HOST_TYPES[F.BFLOAT16] = np.dtype(ml_dtypes.bfloat16)
except ImportError:          # only the BF16 graph (cute_matmul) needs it
    pass


def row_major(dims):
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= d
    return list(reversed(strides))


def nhwc(dims):
    n, c, h, w = dims
    return [h * w * c, 1, w * c, c]


def new_graph():
    return cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                         device="cuda", router=PreferFamily("cudnn"))


def matmul():
    g = new_graph()
    a = g.tensor(name="A", dim=[2, 64, 32], stride=row_major([2, 64, 32]))
    b = g.tensor(name="B", dim=[2, 32, 48], stride=row_major([2, 32, 48]))
    g.matmul(a, b).set_output(True).set_name("C")
    return g


def conv():
    g = new_graph()
    x = g.tensor(name="X", dim=[4, 32, 16, 16], stride=nhwc([4, 32, 16, 16]))
    w = g.tensor(name="W", dim=[64, 32, 3, 3], stride=nhwc([64, 32, 3, 3]))
    y = g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    y.set_output(True).set_name("Y").set_stride(nhwc([4, 64, 16, 16]))
    return g


def sdpa():
    g = new_graph()
    dims = [2, 4, 128, 64]
    q, k, v = (g.tensor(name=n, dim=dims, stride=row_major(dims)) for n in ("Q", "K", "V"))
    o, _ = g.sdpa(q, k, v, generate_stats=False, attn_scale=0.125, use_causal_mask=True)
    o.set_output(True).set_name("O").set_dim(dims).set_stride(row_major(dims))
    return g


def sdpa_alibi():
    """SDPA with an ALiBi bias: the composite lowering adds constants (the mask fill, the scale) and a
    constant device tensor (the slopes) that the plan binds itself (the blob's section 6)."""
    g = new_graph()
    dims = [1, 4, 64, 64]
    q, k, v = (g.tensor(name=n, dim=dims, stride=row_major(dims)) for n in ("Q", "K", "V"))
    o, _ = g.sdpa(q, k, v, generate_stats=False, attn_scale=0.125, use_causal_mask=True, use_alibi_mask=True)
    o.set_output(True).set_name("O").set_dim(dims).set_stride(row_major(dims))
    return g


def slice_matmul():
    """C = A[:, 4:12, :16] @ B: before cuDNN 9.22 the slice is A's pointer plus a byte offset, a view the
    plan binds itself, and A is kept out of cuDNN's variant pack (the blob's section 6)."""
    g = new_graph()
    a = g.tensor(name="A", dim=[2, 16, 32], stride=row_major([2, 16, 32]))
    b = g.tensor(name="B", dim=[2, 16, 8], stride=row_major([2, 16, 8]))
    cut = g.slice(a, slices=[slice(None), slice(4, 12), slice(0, 16)])
    g.matmul(cut, b).set_output(True).set_name("C")
    return g


def cute_matmul():
    """relu(A @ B + bias) in BF16: on an H200 the default plan is the CuTe GEMM with the bias and relu
    fused (the blob's DSL launch section tells the C runtime how to launch its kernel)."""
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda", router=PreferFamily("python"))
    a = g.tensor(name="A", dim=[1, 256, 128], stride=row_major([1, 256, 128]))
    b = g.tensor(name="B", dim=[1, 128, 192], stride=row_major([1, 128, 192]))
    bias = g.tensor(name="bias", dim=[1, 1, 192], stride=row_major([1, 1, 192]))
    y = g.relu(g.bias(g.matmul(a, b), bias))
    y.set_output(True).set_name("Y").set_dim([1, 256, 192]).set_stride(row_major([1, 256, 192]))
    return g


GDN_T, GDN_H, GDN_K, GDN_V = 192, 2, 128, 128


def cutile_gdn():
    """The gated delta rule (gdn) forward over two sequences in BF16, with the final state: on an H200 the
    default plan is the cuTile engine's (three chunked kernels; the blob carries their cubins)."""
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cuda",
                      router=PreferFamily("python"))
    T, H, K, V = GDN_T, GDN_H, GDN_K, GDN_V
    q, k = (g.tensor(name=n, dim=[T, H, K], stride=row_major([T, H, K])) for n in ("q", "k"))
    v = g.tensor(name="v", dim=[T, H, V], stride=row_major([T, H, V]))
    gate = g.tensor(name="g", dim=[T, H], stride=[H, 1], data_type=F.FLOAT)
    beta = g.tensor(name="beta", dim=[T, H], stride=[H, 1])
    cu = g.tensor(name="cu_seqlens", dim=[3], stride=[1], data_type=F.INT32)
    o, final, _ = g.gdn(q, k, v, gate, beta, cu_seqlens=cu, output_final_state=True, use_qk_l2norm=True)
    o.set_output(True).set_name("o")
    final.set_output(True).set_name("final_state")
    return g


GRAPHS = {"matmul": matmul, "conv": conv, "sdpa": sdpa, "sdpa_alibi": sdpa_alibi, "slice_matmul": slice_matmul,
          "cute_matmul": cute_matmul, "cutile_gdn": cutile_gdn}

# Inputs whose values the kernels constrain (by graph, then tensor name): sequence boundaries, a log decay
# (negative), a write strength in (0, 1). The others are normal * 0.5.
INPUT_VALUES = {"cutile_gdn": {
    "cu_seqlens": lambda span, rng: np.array([0, 100, GDN_T], np.int64),
    "g": lambda span, rng: -rng.uniform(0.05, 0.7, span),
    "beta": lambda span, rng: rng.uniform(0.2, 0.9, span),
}}


def input_bytes(t, rng, values=None) -> bytes:
    """The bytes run_plan.c copies for input ``t``: its strided span, or a scalar's value; ``values``:
    {tensor name: f(span, rng)} for inputs with constrained values."""
    np_type = HOST_TYPES[t.data_type]
    if t.is_pass_by_value:
        return np.asarray([t.value], np_type).tobytes()
    span = 1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride))
    make = (values or {}).get(t.name)
    data = make(span, rng) if make is not None else rng.standard_normal(span) * 0.5
    return np.asarray(data).astype(np_type).tobytes()


def write_plan(name: str, folder: str, seed: int = 0):
    """Build graph ``name``, write its blob and inputs under ``folder``; returns the built graph."""
    g = GRAPHS[name]()
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "plan.blob"), "wb") as f:
        f.write(g.serialize(as_bytes=True))
    rng = np.random.default_rng(seed)
    for t in g.get_inputs():
        with open(os.path.join(folder, f"{t.uid}.in"), "wb") as f:
            f.write(input_bytes(t, rng, INPUT_VALUES.get(name)))
    return g


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph", choices=sorted(GRAPHS))
    parser.add_argument("folder")
    args = parser.parse_args()
    write_plan(args.graph, args.folder)
