"""On an sm_90 GPU with the CuTe DSL: a bf16 matmul graph's build line names the CuTe plan and says what
its kernel cost (compile ms, or reused), and the compile is reported while it runs."""
from __future__ import annotations

import logging

import pytest

cg = pytest.importorskip("cudnn_graph")
F = cg.data_type


@pytest.mark.gpu
def test_a_cuda_bf16_matmul_build_logs_the_cute_plan_and_its_compile(caplog):
    from cudnn_graph.engines import manifest
    from cudnn_graph.engines._device import compute_capability
    engine = next((e for e in manifest.engines() if e.name == "cute_gemm"), None)
    if engine is None or engine.missing is not None:
        pytest.skip(f"the CuTe engine cannot build here: {engine.missing if engine else 'absent'}")
    if compute_capability(0) != (9, 0):
        pytest.skip("the CuTe GEMM runs on sm_90 only")
    caplog.set_level(logging.INFO, logger="cudnn_graph")
    events = []
    previous = cg.set_progress_callback(lambda stage, detail: events.append((stage, detail)))
    try:
        g = cg.pygraph(io_data_type=F.BFLOAT16, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                       device="cuda")
        a = g.tensor(name="A", dim=[1, 384, 320], stride=[384 * 320, 320, 1])
        b = g.tensor(name="B", dim=[1, 320, 448], stride=[320 * 448, 448, 1])
        g.matmul(a, b).set_output(True)
        g.build([cg.heur_mode.A])
    finally:
        cg.set_progress_callback(previous)
    build = [d for stage, d in events if stage == "build"]
    assert len(build) == 1 and build[0]["engine"] == "cute_gemm", build
    lines = [r.getMessage() for r in caplog.records if "built plan" in r.getMessage()]
    assert len(lines) == 1 and "(engine cute_gemm)" in lines[0], lines
    if build[0]["kernel_reused"]:
        assert "kernel reused" in lines[0] and build[0]["compile_ms"] is None
    else:
        assert build[0]["compile_ms"] > 0 and "compile " in lines[0], lines
        compiles = [d["state"] for stage, d in events if stage == "compile"]
        assert compiles[0] == "start" and compiles[-1] == "done", compiles
        assert any(r.getMessage().startswith("cute_gemm: compiled GEMM 384x448x320 bfloat16 ")
                   for r in caplog.records)
