"""bench/linear_attention.py's host-side pieces (no GPU, no torch): the --cases rows and the wall seconds each
measurement of a row took."""
from __future__ import annotations

import json
import sys

import pytest

from _helpers import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import linear_attention as bench  # noqa: E402


def test_cases_name_exact_rows():
    assert bench.parse_cases("gdn:4x2048_h16:bf16:128,kda:short_h16:fp16:64") == [
        bench.Case("gdn", "4x2048_h16", "bf16", 128), bench.Case("kda", "short_h16", "fp16", 64)]


@pytest.mark.parametrize("text", ["gdn:4x2048_h16:bf16", "gla:4x2048_h16:bf16:128", "gdn:8x1024:bf16:128",
                                  "gdn:4x2048_h16:fp32:128", "gdn:4x2048_h16:bf16:96"])
def test_a_malformed_case_is_refused_by_name(text):
    with pytest.raises(ValueError, match=f"case '{text}': expected OP:SHAPE:DTYPE:DIM"):
        bench.parse_cases(text)


def test_each_measurement_records_its_wall_seconds_even_when_it_fails():
    row = {"op": "gdn", "shape": "4x2048_h16", "dtype": "bf16", "K": 128, "variant": "default"}
    bench._measure("ours", row, lambda r: r.update(ours_gpu_ms=0.25))

    def fails(r):
        raise RuntimeError("no fla")
    bench._measure("fla", row, fails)
    assert set(row["wall_s"]) == {"ours", "fla"} and all(v >= 0.0 for v in row["wall_s"].values())
    assert row["fla_error"] == "RuntimeError: no fla"
    assert any(line.startswith("  wall seconds: ours ") for line in bench.row_lines(row))


def test_cute_kernels_are_told_apart_by_class_past_the_module_prefix():
    prefix = "kernel_cutlass_kernel_cudnn_graphenginescute_"
    scores = bench.kernel_label(prefix + "delta_outputDeltaScores_object_at__ptrbf16gmemalign16_ptrbf16_0")
    output = bench.kernel_label(prefix + "delta_outputDeltaOutput_object_at__ptrbf16gmemalign16_ptrbf16_0")
    assert scores.startswith("cute_delta_outputDeltaScores") and output.startswith("cute_delta_outputDeltaOutput")
    assert len(scores) == 60 and bench.kernel_label("chunk_fwd_kernel_o") == "chunk_fwd_kernel_o"


def test_the_training_pair_prints_its_ratio_and_the_step_beside_the_recomputing_one():
    row = {"op": "gdn", "shape": "4x2048_h16", "dtype": "bf16", "K": 128, "variant": "default",
           "ours_gpu_ms": 0.231, "ours_bwd_gpu_ms": 0.807, "ours_ckpt_gpu_ms": 0.250, "ours_ckpt_bwd_gpu_ms": 0.700,
           "ckpt_bwd_over_fwd": 2.8}
    line = next(line for line in bench.row_lines(row) if "state_checkpoints" in line)
    assert "bwd/fwd 2.80 (<= 3: yes)" in line and "forward + backward 0.950 against 1.038 recomputing" in line


def test_the_pair_with_the_chunk_cache_prints_its_own_ratio_after_the_checkpoints_one():
    row = {"op": "gdn", "shape": "4x2048_h16", "dtype": "bf16", "K": 128, "variant": "default",
           "ours_gpu_ms": 0.231, "ours_bwd_gpu_ms": 0.807, "ours_ckpt_gpu_ms": 0.236, "ours_ckpt_bwd_gpu_ms": 0.712,
           "ckpt_bwd_over_fwd": 3.02, "ours_cache_gpu_ms": 0.241, "ours_cache_bwd_gpu_ms": 0.637,
           "cache_bwd_over_fwd": 2.64}
    lines = [line for line in bench.row_lines(row) if "state_checkpoints" in line]
    assert "bwd/fwd 3.02 (<= 3: NO)" in lines[0]
    assert "chunk_cache" in lines[1] and "bwd/fwd 2.64 (<= 3: yes)" in lines[1]


def test_a_plan_whose_kernels_overlap_is_timed_by_its_span_and_prints_its_kernels_sum(monkeypatch):
    # a segmented forward or an overlapping backward: the GPU's span of a call, the kernels' sum beside it
    monkeypatch.setattr(bench, "gpu_ms", lambda torch, run, iters, per_kernel: per_kernel.update(a=0.5) or 0.9)
    monkeypatch.setattr(bench, "gpu_span_ms", lambda torch, run, iters: 0.7)
    overlapping = type("Plan", (), {"variant": type("V", (), {"segments": 0, "overlap": True})()})()
    serial = type("Plan", (), {"variant": type("V", (), {"segments": 0, "overlap": False})()})()
    row = {"op": "gdn", "shape": "1x32768_h16", "dtype": "bf16", "K": 128, "variant": "default"}
    bench.ours_gpu_ms(None, None, serial, 20, row, "ours")
    assert row["ours_gpu_ms"] == 0.9 and "ours_span_gpu_ms" not in row
    bench.ours_gpu_ms(None, None, overlapping, 20, row, "ours_bwd")
    bench.ours_gpu_ms(None, None, overlapping, 20, row, "ours_bwd_cute_all_io_all_w8_overlap")
    assert row["ours_bwd_gpu_ms"] == row["ours_bwd_span_gpu_ms"] == 0.7 and row["ours_bwd_kernel_sum_gpu_ms"] == 0.9
    lines = bench.row_lines(row)
    assert "  ours_bwd is the GPU's span of a call (its kernels overlap): 0.700; its kernels' times add up to " \
           "0.900" in lines
    variant_lines = [line for line in lines if line.startswith("  backward plan ")]
    assert variant_lines == ["  backward plan cute_all_io_all_w8_overlap: 0.700 (a 0.500)"]


def test_the_target_lines_count_the_first_ranked_rows_and_name_each_one_over():
    def row(shape, variant, **ratios):
        return {"op": "gdn", "shape": shape, "dtype": "bf16", "K": 64, "variant": variant, **ratios}
    rows = [row("a", "default", ours_over_fla_gpu=0.74, bwd_over_fwd=3.2, cache_bwd_over_fwd=2.1),
            row("b", "default", ours_over_fla_gpu=0.82, bwd_over_fwd=2.9, cache_bwd_over_fwd=2.0),
            row("b", "cute_bv16", ours_over_fla_gpu=0.95)]         # a variant row: not the plan users get
    assert bench.target_lines(rows) == [
        "forward <= 0.8x fla's: 1 of 2 rows; over: gdn b bf16 64 (0.820)",
        "backward <= 3x our forward, recomputing: 1 of 2 rows; over: gdn a bf16 64 (3.200)",
        "from the chunk cache: 2 of 2 rows"]


def test_a_resumed_run_keeps_the_rows_an_earlier_run_saved_on_the_same_gpu(tmp_path):
    row = {"op": "gdn", "shape": "4x2048_h16", "dtype": "bf16", "K": 128, "variant": "default", "ours_gpu_ms": 0.2}
    path = tmp_path / "rows.json"
    assert bench.resumed_rows(str(path), "NVIDIA H200") == []           # the first run: nothing saved yet
    path.write_text(json.dumps({"gpu": "NVIDIA H200", "rows": [row]}))
    kept = bench.resumed_rows(str(path), "NVIDIA H200")
    assert kept == [row]
    assert bench.row_key(kept[0]) == bench.Case("gdn", "4x2048_h16", "bf16", 128).row_key()
    assert bench.row_key(kept[0]) != bench.Case("gdn", "4x2048_h16", "bf16", 128).row_key("cute_bv8")


def test_a_resumed_run_refuses_rows_of_another_gpu_model(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "rows": []}))
    with pytest.raises(ValueError, match="measured on 'NVIDIA H100 80GB HBM3', this GPU is 'NVIDIA H200'"):
        bench.resumed_rows(str(path), "NVIDIA H200")


def test_a_resumed_run_measures_only_the_rows_it_lacks_and_saves_them_all(tmp_path, monkeypatch, capsys):
    import types
    path = tmp_path / "rows.json"
    first = {"op": "gdn", "shape": "4x2048_h16", "dtype": "bf16", "K": 128, "variant": "default", "ours_gpu_ms": 0.2}
    path.write_text(json.dumps({"gpu": "stand-in GPU", "rows": [first]}))
    cuda = types.SimpleNamespace(get_device_name=lambda: "stand-in GPU")
    stand_in = types.SimpleNamespace(__version__="0", cuda=cuda)
    monkeypatch.setitem(sys.modules, "torch", stand_in)
    # save() also writes bench/results/: here only the resumed file, as save() writes it
    monkeypatch.setattr(bench, "save", lambda torch, rows, resume_path="": path.write_text(
        json.dumps({"gpu": "stand-in GPU", "rows": rows})))
    measured = []

    def measure_case(torch, case, args, variant=""):
        measured.append(case.row_key(variant))
        return {"op": case.op, "shape": case.shape, "dtype": case.dtype, "K": case.head_dim,
                "variant": variant or "default", "ours_gpu_ms": 0.1}
    monkeypatch.setattr(bench, "measure_case", measure_case)
    bench.main(["--cases", "gdn:4x2048_h16:bf16:128,gdn:4x2048_h16:bf16:64", "--resume", str(path)])
    assert measured == [("gdn", "4x2048_h16", "bf16", 64, "default")]
    saved = json.loads(path.read_text())["rows"]
    assert [bench.row_key(r) for r in saved] == [bench.row_key(first), measured[0]]
    assert "kept from" in capsys.readouterr().err
