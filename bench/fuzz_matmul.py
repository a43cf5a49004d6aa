"""Seeded randomized matmul fuzzer: each case runs on the GPU and is compared with the reference engine.

    python bench/fuzz_matmul.py [--seed S] [--cases N] [--json PATH] [--quiet]

Cases draw C = epilogue(A @ B) with rank 2, 3 or 4 operands (rank 4 batch axes are folded into one by
the backend lowering), a B shared across the batch (broadcast) or not, row-major, column-major
(transposed) or row-padded (strided) A and B, odd and aligned M / N / K, HALF / BFLOAT16 / FLOAT io
with FLOAT compute, and epilogues from bias (a row vector), scale (a by-value scalar), relu, gelu and
silu (swish).

Outcomes (passed / declined by reason / failed: see bench/_fuzz_common.py) are printed as a table and
written to bench/results/fuzz_matmul-<host>-seed<S>.json; the exit status is 1 when a case failed.
"""
from __future__ import annotations

import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fuzz_common as common  # noqa: E402

NAME = "fuzz_matmul"

EXTENTS = (1, 3, 8, 16, 17, 24, 32, 48, 64, 96)
LAYOUTS = ("row", "row", "col", "padded")
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "swish"}   # epilogue step -> graph builder
EPILOGUES = ((), ("bias",), ("relu",), ("gelu",), ("silu",), ("scale",), ("bias", "relu"), ("bias", "gelu"),
             ("scale", "bias", "silu"), ("bias", "scale", "relu"))
IO_TYPES = ("HALF", "HALF", "BFLOAT16", "FLOAT")
ROW_PAD = 8   # extra elements per padded row: keeps 16-byte alignment for every io type


def _case(rng: random.Random, i: int) -> dict:
    rank = rng.choice((2, 3, 3, 3, 4))
    batch = [rng.choice((1, 2, 3, 4)) for _ in range(rank - 2)]
    spec = {"id": i, "seed": rng.getrandbits(32), "batch": batch,
            "m": rng.choice(EXTENTS), "n": rng.choice(EXTENTS), "k": rng.choice(EXTENTS),
            "a_layout": rng.choice(LAYOUTS), "b_layout": rng.choice(LAYOUTS),
            "b_broadcast": bool(batch) and rng.random() < 0.25,
            "io": rng.choice(IO_TYPES), "epilogue": list(rng.choice(EPILOGUES)),
            "scale": round(rng.uniform(0.25, 2.0), 3)}
    spec["label"] = label(spec)
    return spec


def label(spec) -> str:
    """One line naming what a case exercises."""
    s = spec
    return (f"{s['io']} batch{s['batch']}{' bcastB' if s['b_broadcast'] else ''} m{s['m']} n{s['n']} k{s['k']} "
            f"A:{s['a_layout']} B:{s['b_layout']}" + (" +" + "+".join(s["epilogue"]) if s["epilogue"] else ""))


def generate_cases(seed: int, count: int) -> list:
    """``count`` case specs from ``seed`` (the same list on every machine: Python's own generator)."""
    rng = random.Random(seed)
    return [_case(rng, i) for i in range(count)]


def make_spec(**overrides) -> dict:
    """A case spec for tests: a batch-2 HALF 32x24x16 matmul with row-major operands unless overridden."""
    spec = {"id": 0, "seed": 1, "batch": [2], "m": 32, "n": 24, "k": 16, "a_layout": "row", "b_layout": "row",
            "b_broadcast": False, "io": "HALF", "epilogue": [], "scale": 0.5}
    spec.update(overrides)
    spec["label"] = label(spec)
    return spec


# ---- layouts ----------------------------------------------------------------------------------------

def _matrix(lead, rows, cols, layout) -> tuple:
    """(dims, strides, physical dims, how to view the physical buffer) of a batch of rows x cols matrices."""
    if layout == "col":
        inner, size, physical = (1, rows), rows * cols, (cols, rows)
    elif layout == "padded":
        inner, size, physical = (cols + ROW_PAD, 1), rows * (cols + ROW_PAD), (rows, cols + ROW_PAD)
    else:
        inner, size, physical = (cols, 1), rows * cols, (rows, cols)
    batch_strides, acc = [], size
    for extent in reversed(lead):
        batch_strides.insert(0, acc)
        acc *= extent
    return tuple(lead) + (rows, cols), tuple(batch_strides) + inner, tuple(lead) + physical


def operands(spec) -> dict:
    """{name: (dims, strides, layout, physical dims)} of the inputs."""
    lead = tuple(spec["batch"])
    b_lead = (1,) * len(lead) if spec["b_broadcast"] else lead
    a = _matrix(lead, spec["m"], spec["k"], spec["a_layout"])
    b = _matrix(b_lead, spec["k"], spec["n"], spec["b_layout"])
    ops = {"A": a + (spec["a_layout"],), "B": b + (spec["b_layout"],)}
    if "bias" in spec["epilogue"]:
        dims = (1,) * len(lead) + (1, spec["n"])
        ops["bias"] = _matrix((1,) * len(lead), 1, spec["n"], "row") + ("row",)
        assert ops["bias"][0] == dims
    return ops


def outputs(spec) -> tuple:
    return ("C",)


def tolerance(spec) -> float:
    return common.TOLERANCE[spec["io"]]


def build(device, spec):
    """The case's graph on ``device``: (graph, {name: Tensor})."""
    import cudnn_graph as cudnn
    F = cudnn.data_type
    io = F[spec["io"]]
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device=device, name=f"fuzz_matmul_{spec['id']}")
    t = {name: g.tensor(name=name, dim=dims, stride=strides)
         for name, (dims, strides, _, _) in operands(spec).items()}
    y = g.matmul(t["A"], t["B"])
    for step in spec["epilogue"]:
        if step == "bias":
            y = g.bias(y, t["bias"])
        elif step == "scale":
            y = g.scale(y, float(spec["scale"]))
        elif step in ACTIVATIONS:
            y = getattr(g, ACTIVATIONS[step])(y)
    lead = tuple(spec["batch"])
    c_dims, c_strides, _ = _matrix(lead, spec["m"], spec["n"], "row")
    y.set_stride(c_strides).set_output(True).set_data_type(io).set_name("C")
    assert tuple(y.dim) == c_dims, (y.dim, c_dims)
    t["C"] = y
    return g, t


def host_inputs(spec) -> dict:
    """Seeded inputs viewed with the strides ``build`` declares."""
    rng = np.random.default_rng(spec["seed"])
    dtype = common.host_dtype(spec["io"])
    out = {}
    for name, (dims, strides, physical, layout) in operands(spec).items():
        buffer = rng.uniform(-1.0, 1.0, physical).astype(dtype)
        if layout == "col":
            view = np.swapaxes(buffer, -1, -2)
        elif layout == "padded":
            view = buffer[..., :dims[-1]]
        else:
            view = buffer
        item = view.dtype.itemsize
        assert view.shape == dims and tuple(s // item for s in view.strides) == strides, (name, view.strides)
        out[name] = view
    return out


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__], __doc__))
