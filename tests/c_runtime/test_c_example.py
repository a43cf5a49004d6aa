"""examples/c: run_plan.c builds against the installed runtime on any machine; on the GPU (marked gpu) it
executes the cuDNN matmul, conv and SDPA plans make_plan.py serializes, with outputs bitwise equal to
Python's execute() of the same built plan on the same inputs, including plans that bind operands of their
own (the SDPA composites' constants and ALiBi slopes, a slice's view: the blob's section 6)."""
from __future__ import annotations

import importlib.util
import os
import subprocess

import numpy as np
import pytest

from _c_build import HERE, build_program

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "c")


def test_the_example_builds_against_the_installed_runtime(tmp_path):
    program = build_program(os.path.join(EXAMPLES, "run_plan.c"), tmp_path / "run_plan", extra=["-ldl"])
    assert os.access(program, os.X_OK)


def _make_plan_module():
    spec = importlib.util.spec_from_file_location("make_plan", os.path.join(EXAMPLES, "make_plan.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _python_outputs(g, folder) -> dict:
    """Python's execute() of ``g`` on the inputs make_plan.py wrote: {uid: bytes of the output's span}."""
    cp = pytest.importorskip("cupy")
    make_plan = _make_plan_module()
    pack, outs = {}, {}
    for t in g.get_inputs():
        if t.is_pass_by_value:
            continue
        raw = np.fromfile(os.path.join(folder, f"{t.uid}.in"), make_plan.HOST_TYPES[t.data_type])
        base = cp.asarray(raw)
        pack[t.uid] = cp.lib.stride_tricks.as_strided(base, shape=tuple(t.dim),
                                                      strides=tuple(s * raw.itemsize for s in t.stride))
    for t in g.get_outputs():
        np_type = make_plan.HOST_TYPES[t.data_type]
        span = 1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride))
        base = cp.zeros(span, np_type)
        outs[t.uid] = base
        pack[t.uid] = cp.lib.stride_tricks.as_strided(base, shape=tuple(t.dim),
                                                      strides=tuple(s * base.itemsize for s in t.stride))
    workspace = cp.empty(max(g.get_workspace_size(), 1), cp.uint8)
    g.execute(pack, workspace)
    cp.cuda.Device().synchronize()
    return {uid: cp.asnumpy(base).tobytes() for uid, base in outs.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("graph, plan_operands", [("matmul", False), ("conv", False), ("sdpa", True),
                                                  ("sdpa_alibi", True), ("slice_matmul", True)])
def test_the_example_executes_a_serialized_cudnn_plan_bitwise_as_python_does(graph, plan_operands, tmp_path):
    from cudnn_graph import _loader, _plan_blob
    program = build_program(os.path.join(EXAMPLES, "run_plan.c"), tmp_path / "run_plan", extra=["-ldl"])
    folder = tmp_path / graph
    g = _make_plan_module().write_plan(graph, str(folder))
    read = _plan_blob.unpack_blob((folder / "plan.blob").read_bytes())
    assert bool(read.plan_operands) == plan_operands, read.plan_operands
    assert read.header.format_version == (2 if plan_operands else 1)
    want = _python_outputs(g, folder)
    # The C runtime has no cuda-pathfinder: point it at the libcudnn this process loaded.
    env = {**os.environ, "CUDNN_GRAPH_LIBCUDNN": _loader.load()}
    result = subprocess.run([program, str(folder)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for uid, expected in want.items():
        got = (folder / f"{uid}.out").read_bytes()
        assert got == expected, f"{graph}: output uid {uid} differs from Python's execute() of the same plan"


def test_the_c_api_benchs_timing_loop_builds(tmp_path):
    source = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "c_api_loop.c")
    assert os.access(build_program(source, tmp_path / "c_api_loop", extra=["-ldl"]), os.X_OK)
