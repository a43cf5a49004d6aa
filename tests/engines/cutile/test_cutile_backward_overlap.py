"""A backward that recomputes its chunk-start states with that state pass on a side stream (knob ``overlap``,
engines/cutile/_backward.py and _schedule.side_lane): beside it on the caller's stream chunk_bwd_intra and the
reverse state pass, which read neither the states nor the deltas it writes.

On the CPU: which graphs the overlapping plans are proposed for and where they rank, the knob's refusal, and the
C path's schedule with the workspace regions each launch touches (what the side launch shares with the launches
beside it is what the prepare wrote before it). On an sm_90 GPU: the plan it overlaps gives the same bits (the same
kernels on the same buffers), against the reference engine too, with grouped value heads and the gate options
repeated, and the C path, the Python path and a captured CUDA graph give the same bits.
"""
from __future__ import annotations

import numpy as np
import pytest

from test_cutile_export import _checkpointed_gdn, _grouped_gated_graph, _package, _proposed

W8 = "cute_all_io_all_w8"
BASES = [W8, f"{W8}_tile_pass_bv8", f"{W8}_tile_pass_bv16"]


@pytest.fixture
def overlap_on(monkeypatch):
    """The overlapping plans proposed (_backward.OVERLAP_GPU_TESTED: off until their GPU tests have passed)."""
    from cudnn_graph.engines.cutile import _backward
    monkeypatch.setattr(_backward, "OVERLAP_GPU_TESTED", True)


def _labels(cg, g) -> dict:
    return {p.label: p for p in _proposed(cg, g)}


def test_overlapping_plans_are_proposed_only_once_gpu_tested_and_for_a_recomputing_backward(monkeypatch):
    cg = _package()
    from cudnn_graph.engines.cutile import _backward
    g = _grouped_gated_graph(cg, "gdn_bwd", N=64)
    monkeypatch.setattr(_backward, "OVERLAP_GPU_TESTED", False)
    assert not any(label.endswith("_overlap") for label in _labels(cg, g))
    monkeypatch.setattr(_backward, "OVERLAP_GPU_TESTED", True)
    plans = _labels(cg, g)
    default = plans["cutile_gdn_bwd_chunk64"]
    for base in BASES:
        twin = plans[f"cutile_gdn_bwd_chunk64_{base}_overlap"]
        own = plans[f"cutile_gdn_bwd_chunk64_{base}"]
        assert twin.knobs == dict(own.knobs, overlap=True) and twin.workspace_size == own.workspace_size
        assert twin.priority < default.priority          # to pin or time until measured faster
    # a backward given the forward's checkpoints runs no state pass: nothing to overlap
    checkpointed = _checkpointed_gdn(cg, backward=True)
    assert not any(label.endswith("_overlap") for label in _labels(cg, checkpointed))


@pytest.mark.parametrize("op, io, K, N, base", [
    ("gdn_bwd", "BFLOAT16", 64, 64, W8),                       # many sequences: the CuTe recompute pass first
    ("gdn_bwd", "BFLOAT16", 64, 2, f"{W8}_tile_pass_bv8"),     # few: the narrow cuTile pass first
    ("gdn_bwd", "BFLOAT16", 128, 2, f"{W8}_tile_pass_bv16")])
def test_a_measured_overlap_ranks_just_above_the_plan_it_overlaps_where_that_ranks_first(overlap_on, monkeypatch, op,
                                                                                        io, K, N, base):
    cg = _package()
    from cudnn_graph.engines.cutile import _backward
    g = _grouped_gated_graph(cg, op, K=K, N=N, io=io)

    def first():
        return max(_proposed(cg, g), key=lambda p: p.priority).label

    assert first() == f"cutile_{op}_chunk64_{base}"
    monkeypatch.setattr(_backward, "OVERLAP_FIRST", tuple(BASES))
    assert first() == f"cutile_{op}_chunk64_{base}_overlap"
    # measured faster for another plan only: the first plan stays
    monkeypatch.setattr(_backward, "OVERLAP_FIRST", tuple(b for b in BASES if b != base))
    assert first() == f"cutile_{op}_chunk64_{base}"


def test_the_overlap_knob_takes_true_or_false(monkeypatch):
    cg = _package()
    from test_cutile_backward_plans import _build_pinned_backward
    from cudnn_graph.errors import GraphNotSupportedError
    knobs = {"mma": "tf32", "prepare": "cute", "intra": "cute", "values": "cute", "grads": "cute",
             "bwd_state": "cute", "state_pass": "cute", "scratch": "io_all", "grads_warps": 8}
    with pytest.raises(GraphNotSupportedError, match="overlap='yes'; expected True or False"):
        _build_pinned_backward(cg, dict(knobs, overlap="yes"), monkeypatch)
    plan = _build_pinned_backward(cg, dict(knobs, overlap=True), monkeypatch)
    assert plan.variant.overlap and plan._f32_twin.variant.overlap


# ---- the C path's schedule (compiles the CuTe kernels for sm_90 on the CPU) ---------------------------------

def _c_plan(op, label, monkeypatch, checkpoints=False, overlap=True):
    """A built backward plan ``label`` with ``overlap`` of test_cutile_c_launch's small graph, and its layout."""
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import cudnn_graph as cg
    from cudnn_graph.engines.base import ExecutionContext, PlanConfig
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    from cudnn_graph.engines.cutile import engine as cutile_engine
    from test_cutile_c_launch import _graph
    monkeypatch.setattr(cutile_engine, "_compute_capability", lambda ordinal: (9, 0))
    g = _graph(cg, op, checkpoints=checkpoints)
    engine = CutileLinearAttentionEngine()
    engine.missing = None
    config = next(p for p in engine.propose_plans(g) if p.label == label)
    pinned = PlanConfig(config.engine_id, knobs=dict(config.knobs, overlap=overlap), name=f"{label}_overlap",
                        engine=engine, workspace_size=config.workspace_size)
    return engine.build_plan(g, pinned, ExecutionContext()), g._layout_for(engine)


def _regions_by_launch(plan, layout) -> dict:
    """Each C-path launch's name -> the workspace regions (by name) and graph operands (by uid) it passes."""
    by_offset = {}
    for name, (offset, _) in plan._geometry.regions.items():
        by_offset.setdefault(offset, set()).add(name)
    touched = {}
    for k in plan.launch_description(layout)["kernels"]:
        names = touched.setdefault(k["name"], set())
        for a in k["addresses"]:
            names |= by_offset[a["add"]] if a["operand_uid"] is None else {a["operand_uid"]}
    return touched


@pytest.mark.parametrize("base", [W8, f"{W8}_tile_pass_bv8"])
def test_the_state_pass_runs_on_the_side_stream_beside_launches_that_leave_its_regions_alone(base, monkeypatch):
    # gdn_bwd (kda's launches are the same but for the gate sums' kernel before the prepare)
    plan, layout = _c_plan("gdn_bwd", f"cutile_gdn_bwd_chunk64_{base}", monkeypatch)
    prepared = plan.launch_plan(layout)
    assert prepared is not None, "the plan fell back to the Python launch path (see the log)"
    names = [k.name for k in prepared.kernels]
    schedule = dict(zip(names, prepared.schedule))
    assert schedule["prepare"] == (0, -1, 0) and schedule["state_pass"] == (1, 0, 1)
    assert schedule["bwd_values"] == (0, 1, -1)
    assert all(schedule[n] == (0, -1, -1) for n in names if n not in ("prepare", "state_pass", "bwd_values"))
    beside = names[names.index("state_pass") + 1:names.index("bwd_values")]
    assert beside == ["bwd_intra", "bwd_state_pass"]
    touched = _regions_by_launch(plan, layout)
    shared = touched["state_pass"] & set().union(*(touched[n] for n in beside))
    # what they share is what the prepare wrote before the side stream's wait (w, kd, the gate sums; the
    # graph's cu_seqlens), and the stand-in for an absent state, which none of them reads or writes
    assert shared <= touched["prepare"] | {"state_dummy"}, shared
    assert {"hs", "d"} <= touched["state_pass"] and not {"hs", "d"} & set().union(*(touched[n] for n in beside))
    # and by bytes, on the Python path's launches: every pair its schedule leaves unordered
    import cudnn_graph as cg
    from test_cutile_c_launch import _graph
    from test_cutile_schedule import assert_unordered_launches_share_only
    from test_cutile_segments_backward import _slot_launches
    launches, base, ports = _slot_launches(cg, plan, _graph(cg, "gdn_bwd"))
    assert_unordered_launches_share_only(launches, base, ports, plan._geometry, ("g", "w", "kd", "u", "state_dummy"),
                                         {"q", "k", "v", "g", "beta", "dO", "cu_seqlens"})


def test_a_backward_from_the_checkpoints_runs_its_launches_in_order(monkeypatch):
    plan, layout = _c_plan("gdn_bwd", f"cutile_gdn_bwd_chunk64_{W8}", monkeypatch, checkpoints=True)
    assert plan.variant.checkpoints and plan.variant.overlap
    prepared = plan.launch_plan(layout)
    assert prepared is not None and "state_pass" not in [k.name for k in prepared.kernels]
    assert prepared.schedule is None


# ---- on the GPU ------------------------------------------------------------------------------------------

gpu = pytest.mark.gpu


@pytest.fixture
def sm90(overlap_on):
    import gpu_support
    return gpu_support.sm90_with_the_dsl("the overlapping plans run the CuTe backward kernels")


@gpu
@pytest.mark.parametrize("op, cu, H, K, dtype, base", [
    ("gdn_bwd", [0, 2048, 4096, 6144, 8192], 16, 128, "bfloat16", W8),
    ("kda_bwd", [0, 1, 40, 200, 333], 2, 64, "float16", W8),
    ("gdn_bwd", [0, 8192], 4, 64, "bfloat16", f"{W8}_tile_pass_bv8"),
    ("kda_bwd", [0, 8192], 4, 128, "bfloat16", f"{W8}_tile_pass_bv16"),
    ("gdn_bwd", [0, 5000], 2, 64, "float16", f"{W8}_tile_pass_bv16")])
def test_the_overlapping_backward_gives_the_bits_of_the_plan_it_overlaps(sm90, op, cu, H, K, dtype, base):
    import test_cutile_linear_attention as forward
    plan = f"cutile_{op}_chunk64_{base}"
    overlapped = forward.run_bwd_case(op, cu, H=H, K=K, V=K, dtype=dtype, seed=81, plan=f"{plan}_overlap")
    serial = forward.run_bwd_case(op, cu, H=H, K=K, V=K, dtype=dtype, seed=81, plan=plan)
    for name in serial:
        assert np.asarray(overlapped[name]).tobytes() == np.asarray(serial[name]).tobytes(), name


@gpu
@pytest.mark.parametrize("op, gates", [("gdn_bwd", "softplus_beta_sigmoid"), ("kda_bwd", "bounded_neg_eigval")])
def test_the_overlapping_backward_with_grouped_value_heads_and_gate_options(sm90, op, gates):
    import test_cutile_linear_attention_gva_gates as gva
    gva.run_case(op, gva.SMALL, attrs=gva.GATES[gates], seed=82, plan=f"cutile_{op}_chunk64_{W8}_overlap", repeats=3)


def _call(op, plan, monkeypatch, *, c_launch=True, capture=False) -> dict:
    """The gradients (host bytes) of one call of ``plan`` on a CuPy stream of its own (the plan's caller stream):
    executed, or recorded into a CUDA graph of that stream and replayed; ``c_launch`` False sends every launch
    through the Python path."""
    cp = pytest.importorskip("cupy")
    import gpu_support
    from cudnn_graph.engines.cutile import engine as cutile_engine
    from test_cutile_c_launch import _builder, _host_inputs
    monkeypatch.setattr(cutile_engine, "C_LAUNCH", c_launch)
    host = _host_inputs(op, T=4096, H=4, K=64, V=64, seed=83)
    builder, out_names = _builder(op, host, plan)
    g, t = gpu_support.build_gpu(builder)
    assert g.selected_plan.label == plan, g.selected_plan
    pack, keep, outs = gpu_support.device_pack(cp, g, t, host, out_names)
    got = gpu_support.run_on_own_stream(cp, g, pack, outs, capture)
    return {name: a.tobytes() for name, a in got.items()}


@gpu
@pytest.mark.parametrize("op, base", [("gdn_bwd", W8), ("kda_bwd", W8),
                                      ("gdn_bwd", f"{W8}_tile_pass_bv8_rev16")])   # the narrow reverse pass too
def test_the_c_path_the_python_path_and_a_captured_graph_give_the_same_bits(sm90, op, base, monkeypatch):
    from cudnn_graph.engines.cutile import _backward
    monkeypatch.setattr(_backward, "REVERSE_NARROW_GPU_TESTED", True)
    plan = f"cutile_{op}_chunk64_{base}_overlap"
    c_path = _call(op, plan, monkeypatch)
    captured = _call(op, plan, monkeypatch, capture=True)
    python_path = _call(op, plan, monkeypatch, c_launch=False)
    serial = _call(op, f"cutile_{op}_chunk64_{base}", monkeypatch)
    for name in c_path:
        assert c_path[name] == python_path[name], name
        assert captured[name] == c_path[name], name
        assert serial[name] == c_path[name], name
