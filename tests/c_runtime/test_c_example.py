"""examples/c: run_plan.c builds against the installed runtime on any machine; on the GPU (marked gpu) it
executes the cuDNN matmul, conv and SDPA plans make_plan.py serializes, with outputs bitwise equal to
Python's execute() of the same built plan on the same inputs, including plans that bind operands of their
own (the SDPA composites' constants and ALiBi slopes, a slice's view: the blob's section 6), a CuTe
plan (BF16 matmul + bias + relu: its kernel launched from the blob's DSL launch section, section 7) and a
cuTile plan (the gdn forward: its cubins and launches in section 7, calling convention 2)."""
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
    from cudnn_graph import Slot
    make_plan = _make_plan_module()
    pack, outs = {}, {}
    inputs = []          # a Slot.from_address holds an address, not its array: the arrays must outlive execute()

    def bind(t, base):
        if t.data_type == make_plan.F.BFLOAT16:       # CuPy has no BF16: the raw 2-byte words, declared BF16
            return Slot.from_address(base.data.ptr, tuple(t.dim), tuple(t.stride), dtype="bfloat16", device="cuda")
        return cp.lib.stride_tricks.as_strided(base, shape=tuple(t.dim),
                                               strides=tuple(s * base.itemsize for s in t.stride))

    def storage(t):
        np_type = np.dtype(make_plan.HOST_TYPES[t.data_type])
        return np.uint16 if t.data_type == make_plan.F.BFLOAT16 else np_type

    for t in g.get_inputs():
        if t.is_pass_by_value:
            continue
        base = cp.asarray(np.fromfile(os.path.join(folder, f"{t.uid}.in"), storage(t)))
        inputs.append(base)
        pack[t.uid] = bind(t, base)
    for t in g.get_outputs():
        span = 1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride))
        base = cp.zeros(span, storage(t))
        outs[t.uid] = base
        pack[t.uid] = bind(t, base)
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


@pytest.mark.gpu
def test_the_example_executes_a_serialized_cute_plan_bitwise_as_python_does(tmp_path):
    """The CuTe GEMM's plan (H200): its blob carries the kernel's shared object and the DSL launch section;
    run_plan loads it with libcuda and the DSL runtime library alone and matches Python bitwise."""
    pytest.importorskip("ml_dtypes")
    from cudnn_graph import _plan_blob
    from cudnn_graph.engines.cute import _shared_object
    program = build_program(os.path.join(EXAMPLES, "run_plan.c"), tmp_path / "run_plan", extra=["-ldl"])
    folder = tmp_path / "cute_matmul"
    g = _make_plan_module().write_plan("cute_matmul", str(folder))
    assert g.selected_plan.engine.name == "cute_gemm", g.selected_plan
    read = _plan_blob.unpack_blob((folder / "plan.blob").read_bytes())
    assert read.header.format_version == 3 and len(read.dsl_launch) == 1, read.header
    want = _python_outputs(g, folder)
    runtime = _shared_object.runtime_path()
    assert runtime, "no CuTe DSL runtime library found"
    # No libcudnn: a CuTe plan needs only libcuda and the DSL runtime library.
    env = {k: v for k, v in os.environ.items() if k != "CUDNN_GRAPH_LIBCUDNN"}
    env.update(CUDNN_GRAPH_CUTE_RUNTIME=runtime, CUDNN_GRAPH_LIBCUDNN="/nonexistent/libcudnn.so.9")
    result = subprocess.run([program, str(folder)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for uid, expected in want.items():
        got = (folder / f"{uid}.out").read_bytes()
        assert got == expected, f"cute_matmul: output uid {uid} differs from Python's execute() of the same plan"


@pytest.mark.gpu
def test_the_example_executes_a_serialized_cutile_plan_bitwise_as_python_does(tmp_path):
    """The cuTile gdn forward plan (H200): its blob carries each kernel's cubin, grid and parameter image;
    run_plan loads it with libcuda alone (no libcudnn, no Python) and matches Python bitwise."""
    pytest.importorskip("cuda.tile")
    pytest.importorskip("ml_dtypes")
    from cudnn_graph import _plan_blob
    from cudnn_graph._plan_launch import CONVENTION_CUTILE_PARAMS
    program = build_program(os.path.join(EXAMPLES, "run_plan.c"), tmp_path / "run_plan", extra=["-ldl"])
    folder = tmp_path / "cutile_gdn"
    g = _make_plan_module().write_plan("cutile_gdn", str(folder))
    assert g.selected_plan.engine.name == "cutile_linear_attention", g.selected_plan
    read = _plan_blob.unpack_blob((folder / "plan.blob").read_bytes())
    assert read.header.format_version == 4 and len(read.dsl_launch) >= 3, read.header
    assert {k.convention for k in read.dsl_launch} == {CONVENTION_CUTILE_PARAMS}
    want = _python_outputs(g, folder)
    env = {k: v for k, v in os.environ.items() if k != "CUDNN_GRAPH_LIBCUDNN"}
    env["CUDNN_GRAPH_LIBCUDNN"] = "/nonexistent/libcudnn.so.9"
    result = subprocess.run([program, str(folder)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for uid, expected in want.items():
        got = (folder / f"{uid}.out").read_bytes()
        assert got == expected, f"cutile_gdn: output uid {uid} differs from Python's execute() of the same plan"


def test_the_c_api_benchs_timing_loop_builds(tmp_path):
    source = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "c_api_loop.c")
    assert os.access(build_program(source, tmp_path / "c_api_loop", extra=["-ldl"]), os.X_OK)
