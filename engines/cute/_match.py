"""Which graphs the CuTe GEMM engine claims: ``matmul`` followed by a chain of fused pointwise ops.

The claimed pattern (no DSL import here; the CPU tests run it)::

    C = matmul(A, B)                       A [.., M, K], B [.., K, N]: BFLOAT16 or HALF (both alike)
      [-> add / bias (tensor or scalar)]   a tensor broadcast to [.., M, N] (a row vector, a column vector,
      [-> mul / scale (tensor or scalar)]  per batch or full), or a by-value FLOAT scalar
      [-> relu | leaky_relu | gelu_approx_tanh | swish]
    -> Y                                   BFLOAT16, HALF or FLOAT, the only output

in any order and up to three tensor operands and three scalars. Intermediates stay in f32 registers, so
virtual tensors must be FLOAT (the graph's default). Batch axes fold into one (L) when every operand's
batch strides allow it; A and B must not broadcast over the batch. TMA needs one unit-stride axis per
matrix and every other stride a multiple of 16 bytes.

``match(graph)`` returns a ``Problem`` (the spec without knobs, and where each operand comes from) or
raises ``GraphNotSupportedError`` saying why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...data_type import DataType
from ...errors import GraphNotSupportedError
from ...view import GraphView
from ._spec import (ACTIVATIONS, ITEMSIZE, MAX_EPILOGUE_SCALARS, MAX_EPILOGUE_TENSORS, TMA_ALIGN,
                    EpilogueStep, EpilogueTensor, GemmGeometry)

AB_TYPES = {DataType.BFLOAT16: "bfloat16", DataType.HALF: "float16"}
OUT_TYPES = {DataType.BFLOAT16: "bfloat16", DataType.HALF: "float16", DataType.FLOAT: "float32"}
EPI_TYPES = OUT_TYPES
BINARY = {"add": "add", "bias": "add", "mul": "mul", "scale": "mul"}
UNARY = {"relu": "relu", "leaky_relu": "relu", "gelu_approx_tanh": "gelu_tanh", "swish": "swish"}
CLAIMED_OPS = ("matmul",) + tuple(BINARY) + tuple(UNARY)


@dataclass(frozen=True)
class Problem(GemmGeometry):
    """A matched graph: the problem geometry, the epilogue, and the uids each kernel argument comes from."""
    epi_tensors: tuple
    steps: tuple
    a_uid: int
    b_uid: int
    c_uid: int
    epi_uids: tuple
    scalar_uids: tuple
    scalar_types: tuple


def _decline(why: str):
    raise GraphNotSupportedError(why)


def _fold(dims, strides):
    """One stride for the flattened batch axes (0 when they are all 1), or None when they do not fold."""
    base = None
    expected = None
    for d, s in zip(reversed(dims), reversed(strides)):
        if d == 1:
            continue
        if base is None:
            base, expected = s, s * d
        elif s != expected:
            return None
        else:
            expected = s * d
    return 0 if base is None else base


def _span(dims, strides) -> int:
    return 1 + sum((d - 1) * abs(s) for d, s in zip(dims, strides))


def _round_up(n: int, a: int) -> int:
    return -(-n // a) * a


def _matrix(name, t, rows, cols, batch_dims, itemsize, which):
    """(row stride, col stride, batch stride) of a TMA operand, checked; ``which`` names the unit-stride
    choices ('k'/'m' style) for the reason strings."""
    dims, strides = tuple(t.dim), tuple(t.stride)
    r_s, c_s = strides[-2], strides[-1]
    if any(s < 0 for s in strides):
        _decline(f"{name} has a negative stride {strides}; TMA reads positive strides")
    # A size-1 axis has no meaningful stride, but a TMA descriptor still needs one (16-byte aligned):
    # make the other axis the unit-stride one where it can be, and give the size-1 axis an aligned stride.
    align = TMA_ALIGN // itemsize
    if rows == 1 and cols == 1:
        r_s, c_s = align, 1
    elif cols == 1:
        if r_s == 1:
            c_s = _round_up(rows, align)      # a column, contiguous down its rows
        else:
            c_s = 1
    elif rows == 1:
        if c_s == 1:
            r_s = _round_up(cols, align)      # a row, contiguous along it
        else:
            r_s = 1
    if c_s != 1 and r_s != 1:
        _decline(f"{name} has strides {strides}: neither of its last two axes is contiguous "
                 f"({which}); TMA needs a unit stride on one of them")
    batch = _fold(dims[:-2], strides[:-2])
    if batch is None:
        _decline(f"{name}'s batch axes {dims[:-2]} with strides {strides[:-2]} do not fold into one batch axis")
    if any(d != b for d, b in zip(dims[:-2], batch_dims)):
        if any(d != 1 for d in dims[:-2]):
            _decline(f"{name}'s batch dims {dims[:-2]} neither match the output's {batch_dims} nor are all 1")
        _decline(f"{name} is broadcast over the batch (dims {dims}); the kernel reads A and B per batch")
    L = math.prod(batch_dims)
    if L == 1:
        batch = _round_up(_span(dims[-2:], (r_s, c_s)), align)
    for what, s in (("row", r_s), ("column", c_s), ("batch", batch)):
        if s != 1 and s % align:
            _decline(f"{name}'s {what} stride {s} elements is not a multiple of 16 bytes ({align} elements); "
                     "TMA cannot express it")
    return r_s, c_s, batch


def _epilogue_tensor(t, out_dims, graph) -> EpilogueTensor:
    dims, strides = tuple(t.dim), tuple(t.stride)
    dt = GraphView.of(graph).data_type(t)
    if dt not in EPI_TYPES:
        _decline(f"epilogue operand '{t.name}' is {DataType(dt).name}; expected BFLOAT16, HALF or FLOAT")
    if len(dims) != len(out_dims):
        _decline(f"epilogue operand '{t.name}' has rank {len(dims)}; the output has rank {len(out_dims)}")
    for d, o in zip(dims, out_dims):
        if d not in (1, o):
            _decline(f"epilogue operand '{t.name}' dims {dims} do not broadcast to {out_dims}")
    M, N = out_dims[-2], out_dims[-1]
    sm = strides[-2] if dims[-2] == M and M > 1 else 0
    sn = strides[-1] if dims[-1] == N and N > 1 else 0
    batch_dims = dims[:-2]
    if all(d == 1 for d in batch_dims):
        sl = 0
    elif tuple(batch_dims) == tuple(out_dims[:-2]):
        sl = _fold(batch_dims, strides[:-2])
        if sl is None:
            _decline(f"epilogue operand '{t.name}' batch axes {batch_dims} (strides {strides[:-2]}) do not fold")
    else:
        _decline(f"epilogue operand '{t.name}' broadcasts over some batch axes only ({dims} vs {out_dims})")
    if math.prod(out_dims[:-2]) == 1:
        sl = 0
    return EpilogueTensor(OUT_TYPES[dt], (sm, sn, sl))


def _activation(node) -> EpilogueStep:
    p = node.params
    op = UNARY[node.op]
    if op == "relu":
        lo = p.get("lower_clip")
        hi = p.get("upper_clip")
        slope = p.get("negative_slope")
        return EpilogueStep("relu", params=(0.0 if lo is None else float(lo),
                                            math.inf if hi is None else float(hi),
                                            0.0 if slope is None else float(slope)))
    if op == "swish":
        beta = p.get("swish_beta")
        return EpilogueStep("swish", params=(1.0 if beta is None else float(beta),))
    return EpilogueStep(op)


def match(graph) -> Problem:
    """The GEMM problem of ``graph``, or ``GraphNotSupportedError`` with the reason."""
    nodes = list(graph.nodes)
    if not nodes or nodes[0].op != "matmul":
        _decline("runs a matmul followed by fused pointwise ops; "
                 f"this graph starts with {nodes[0].op if nodes else 'nothing'}")
    resolve = GraphView.of(graph).data_type
    mm = nodes[0]
    a, b = mm.inputs["A"], mm.inputs["B"]
    a_t, b_t = resolve(a), resolve(b)
    if a_t not in AB_TYPES or b_t != a_t:
        _decline(f"matmul inputs are {DataType(a_t).name} x {DataType(b_t).name}; the kernel takes "
                 "BFLOAT16 x BFLOAT16 or HALF x HALF")
    if mm.compute_data_type not in (-1, DataType.FLOAT, DataType.NOT_SET):
        _decline(f"matmul compute type {DataType(mm.compute_data_type).name}; the kernel accumulates in FLOAT")
    ctx_compute = graph.context.compute_data_type
    if ctx_compute not in (DataType.FLOAT, DataType.NOT_SET):
        _decline(f"graph compute type {DataType(ctx_compute).name}; the kernel accumulates in FLOAT")

    value = mm.outputs["C"]
    steps, epi, epi_uids, scalar_uids, scalar_types = [], [], [], [], []
    out_dims = tuple(value.dim)
    for node in nodes[1:]:
        if node.op not in BINARY and node.op not in UNARY:
            _decline(f"node '{node.name}' ({node.op}) is not a fusable epilogue op "
                     f"(fuses {', '.join(tuple(BINARY) + tuple(UNARY))})")
        if not value.is_virtual:
            _decline(f"'{value.name}' is an output and also feeds '{node.name}'; only the last op's output is written")
        if resolve(value) != DataType.FLOAT:
            _decline(f"intermediate '{value.name}' is {DataType(resolve(value)).name}; the fused epilogue keeps "
                     "intermediates in FLOAT (set intermediate_data_type FLOAT)")
        if node.compute_data_type not in (-1, DataType.FLOAT, DataType.NOT_SET):
            _decline(f"node '{node.name}' computes in {DataType(node.compute_data_type).name}; the epilogue "
                     "computes in FLOAT")
        ins = [t for t in node.inputs.values() if t is not None]
        if not any(t is value for t in ins):
            _decline(f"node '{node.name}' does not consume the chain's value '{value.name}'")
        if node.op in UNARY:
            steps.append(_activation(node))
        else:
            others = [t for t in ins if t is not value]
            if len(others) != 1:
                _decline(f"node '{node.name}' ({node.op}) uses the chain's value twice")
            other = others[0]
            op = BINARY[node.op]
            if other.is_pass_by_value:
                if math.prod(other.dim) != 1:
                    _decline(f"by-value operand '{other.name}' has dims {tuple(other.dim)}; the epilogue takes "
                             "one-element scalars")
                st = resolve(other)
                if st not in (DataType.FLOAT, DataType.DOUBLE):
                    _decline(f"by-value scalar '{other.name}' is {DataType(st).name}; expected FLOAT or DOUBLE")
                if len(scalar_uids) == MAX_EPILOGUE_SCALARS:
                    _decline(f"more than {MAX_EPILOGUE_SCALARS} by-value scalars in the epilogue")
                steps.append(EpilogueStep(op, scalar=len(scalar_uids)))
                scalar_uids.append(other.uid)
                scalar_types.append("float64" if st == DataType.DOUBLE else "float32")
            else:
                if other.producer is not None:
                    _decline(f"epilogue operand '{other.name}' is computed by the graph; it must be an input")
                if len(epi_uids) == MAX_EPILOGUE_TENSORS:
                    _decline(f"more than {MAX_EPILOGUE_TENSORS} tensor operands in the epilogue")
                epi.append(_epilogue_tensor(other, out_dims, graph))
                steps.append(EpilogueStep(op, tensor=len(epi_uids)))
                epi_uids.append(other.uid)
        outs = list(node.outputs.values())
        value = outs[0]
        if tuple(value.dim) != out_dims:
            _decline(f"node '{node.name}' changes the dims to {tuple(value.dim)} (expected {out_dims})")
    if value.is_virtual:
        _decline(f"the chain's last value '{value.name}' is not an output")
    c_t = resolve(value)
    if c_t not in OUT_TYPES:
        _decline(f"output '{value.name}' is {DataType(c_t).name}; the kernel writes BFLOAT16, HALF or FLOAT")

    rank = len(out_dims)
    if len(a.dim) != rank or len(b.dim) != rank:
        _decline(f"ranks differ: A {tuple(a.dim)}, B {tuple(b.dim)}, output {out_dims}")
    M, N = out_dims[-2], out_dims[-1]
    K = a.dim[-1]
    batch_dims = out_dims[:-2]
    if min(M, N, K) < 1:
        _decline(f"empty problem M={M} N={N} K={K}")
    ab = AB_TYPES[a_t]
    size = ITEMSIZE[ab]
    am, ak, al = _matrix("A", a, M, K, batch_dims, size, "K-major or M-major")
    bk, bn, bl = _matrix("B", b, K, N, batch_dims, size, "N-major or K-major")
    cm, cn, cl = _matrix(f"output '{value.name}'", value, M, N, batch_dims, ITEMSIZE[OUT_TYPES[c_t]],
                         "N-major or M-major")
    return Problem(ab_dtype=ab, c_dtype=OUT_TYPES[c_t], M=M, N=N, K=K, L=math.prod(batch_dims),
                   a_stride=(am, ak, al), b_stride=(bn, bk, bl), c_stride=(cm, cn, cl),
                   epi_tensors=tuple(epi), steps=tuple(steps), a_uid=a.uid, b_uid=b.uid, c_uid=value.uid,
                   epi_uids=tuple(epi_uids), scalar_uids=tuple(scalar_uids), scalar_types=tuple(scalar_types))


__all__ = ["Problem", "match", "CLAIMED_OPS", "ACTIVATIONS"]
