"""One long sequence's backward in segments (engines/cutile/_segments.segmented_backward_launches): the reverse
state pass segment by segment, last first, on a side stream, each segment's chunk_bwd_values and chunk_bwd_grads
on the caller's stream behind it, the recompute's state pass beside it.

On the CPU: which graphs the segmented plans are proposed for and where they rank, the knob's refusals, and the C
path's launches and schedule, with every pair of launches the schedule leaves unordered checked to share only
workspace bytes that no launch after the prepare writes, and only graph inputs. On an sm_90 GPU: the bits of the
plan it segments (the dS that chains two segments is the chain's own f32 value), against the reference too, a
sequence shorter than its buffers, and the C path, the Python path and a captured CUDA graph alike.
"""
from __future__ import annotations

import numpy as np
import pytest

from test_cutile_export import _package, _proposed
from test_cutile_schedule import assert_unordered_launches_share_only

W8 = "cute_all_io_all_w8"


@pytest.fixture
def segments_on(monkeypatch):
    """The segmented backward plans proposed (_backward.BACKWARD_SEGMENTS_GPU_TESTED: off until GPU-tested)."""
    from cudnn_graph.engines.cutile import _backward
    monkeypatch.setattr(_backward, "BACKWARD_SEGMENTS_GPU_TESTED", True)


def _gdn_bwd(cg, T, n_seq=1, states=False, checkpoints=False):
    """gdn_bwd over ``n_seq`` sequences in T tokens, H 2, K = V = 64, BF16; ``states``: initial_state and
    d_final_state (so d_initial_state too); ``checkpoints``: the forward's state_checkpoints at 64 tokens."""
    F = cg.data_type
    g = cg.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cuda")
    H, K = 2, 64

    def tensor(name, dims, dt=F.BFLOAT16):
        strides = [int(np.prod(dims[i + 1:])) for i in range(len(dims))]
        return g.tensor(name=name, dim=list(dims), stride=strides, data_type=dt)

    args = [tensor(n, (T, H, K)) for n in ("q", "k", "v")] + [tensor("g", (T, H), F.FLOAT), tensor("beta", (T, H)),
                                                             tensor("dO", (T, H, K))]
    extra = {}
    if states:
        extra = {"initial_state": tensor("initial_state", (n_seq, H, K, K), F.FLOAT),
                 "d_final_state": tensor("d_final_state", (n_seq, H, K, K), F.FLOAT)}
    if checkpoints:
        extra.update(checkpoint_every_n_tokens=64,
                     state_checkpoints=tensor("state_checkpoints", (T // 64 + n_seq, H, K, K)))
    for out in g.gdn_bwd(*args, cu_seqlens=tensor("cu_seqlens", (n_seq + 1,), F.INT32), use_qk_l2norm=True,
                         **extra):
        if out is not None:
            out.set_output(True)
    g.validate()
    return g


def _labels(cg, g) -> dict:
    return {p.label: p for p in _proposed(cg, g)}


def test_segmented_backward_plans_are_proposed_once_gpu_tested_for_one_long_recomputing_sequence(monkeypatch):
    cg = _package()
    from cudnn_graph.engines.cutile import _backward
    long_one = _gdn_bwd(cg, 8192)
    assert not any("_seg" in label for label in _labels(cg, long_one))
    monkeypatch.setattr(_backward, "BACKWARD_SEGMENTS_GPU_TESTED", True)
    plans = _labels(cg, long_one)
    default = plans["cutile_gdn_bwd_chunk64"]
    for count in (4, 8):
        twin, own = plans[f"cutile_gdn_bwd_chunk64_{W8}_seg{count}"], plans[f"cutile_gdn_bwd_chunk64_{W8}"]
        assert twin.knobs == dict(own.knobs, segments=count) and twin.priority < default.priority
        assert twin.workspace_size > own.workspace_size          # the chaining dS and the segments' bounds
    assert "cutile_gdn_bwd_chunk64_cute_all_io_all_w8_seg8" not in _labels(cg, _gdn_bwd(cg, 4096))  # 8 chunks each
    assert not any("_seg" in label for label in _labels(cg, _gdn_bwd(cg, 8192, n_seq=2)))
    assert not any("_seg" in label for label in _labels(cg, _gdn_bwd(cg, 8192, checkpoints=True)))


def test_a_measured_segment_count_ranks_first_from_the_tokens_it_was_measured_at(segments_on, monkeypatch):
    cg = _package()
    from cudnn_graph.engines.cutile import _backward

    def first(T):
        return max(_proposed(cg, _gdn_bwd(cg, T)), key=lambda p: p.priority).label

    base = first(32768)
    monkeypatch.setattr(_backward, "BACKWARD_SEGMENTS_FIRST", (f"{base.split('chunk64_')[1]}_seg8",))
    assert first(32768) == f"{base}_seg8"
    assert first(16384) == first(16384).split("_seg")[0]            # shorter than measured: unsegmented


def _built(cg, monkeypatch, suffix, **graph):
    """The built plan ``cutile_gdn_bwd_chunk64_<suffix>`` of ``_gdn_bwd(cg, **graph)`` and the graph."""
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from cudnn_graph.engines.base import ExecutionContext
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    from cudnn_graph.engines.cutile import engine as cutile_engine
    monkeypatch.setattr(cutile_engine, "_compute_capability", lambda ordinal: (9, 0))
    g = _gdn_bwd(cg, **graph)
    engine = CutileLinearAttentionEngine()
    engine.missing = None
    config = next(p for p in engine.propose_plans(g) if p.label == f"cutile_gdn_bwd_chunk64_{suffix}")
    return engine.build_plan(g, config, ExecutionContext()), g


def test_the_segments_knob_is_refused_for_two_sequences_and_beside_overlap(segments_on, monkeypatch):
    cg = _package()
    from cudnn_graph.engines.base import ExecutionContext, PlanConfig
    from cudnn_graph.errors import GraphNotSupportedError
    plan, g = _built(cg, monkeypatch, W8, T=8192)
    engine = plan.plan.engine
    for graph, knobs, words in ((_gdn_bwd(cg, 8192, n_seq=2), {"segments": 4}, "cu_seqlens holds 2"),
                                (g, {"segments": 4, "overlap": True}, "overlap=True is the unsegmented")):
        pinned = PlanConfig(plan.plan.engine_id, knobs=dict(plan.plan.knobs, **knobs), name="pinned", engine=engine)
        with pytest.raises(GraphNotSupportedError, match=words):
            engine.build_plan(graph, pinned, ExecutionContext())


def _slot_launches(cg, plan, g):
    """The plan's Python-path launches on Slots, each graph port at an address of its own and the workspace at one
    base: (the launches, the base, {port address: port name})."""
    from cudnn_graph import Slot
    node = g.nodes[0]
    names = {cg.data_type.BFLOAT16: "bfloat16", cg.data_type.FLOAT: "float32", cg.data_type.INT32: "int32"}
    tensors = {port: t for port, t in {**node.inputs, **node.outputs}.items() if t is not None}
    slots = {port: Slot.from_address(0x7F0000000000 + i * 0x10000000, tuple(t.dim), None,
                                     names[g.view.data_type(t)], "cuda:0")
             for i, (port, t) in enumerate(tensors.items())}
    base = 0x7E0000000000
    launches = plan._launches_at(slots.__getitem__, base)
    ports = {s.data_ptr: port for port, s in slots.items()}
    return launches, base, ports


@pytest.mark.parametrize("suffix, states", [(f"{W8}_seg4", True), (f"{W8}_tile_pass_bv8_seg8", False)])
def test_launches_left_unordered_share_only_what_no_launch_after_the_prepare_writes(segments_on, monkeypatch,
                                                                                     suffix, states):
    cg = _package()
    plan, g = _built(cg, monkeypatch, suffix, T=8192, states=states)
    launches, base, ports = _slot_launches(cg, plan, g)
    schedule = launches.schedule
    S = plan.variant.segments
    # the plan's own 16-bit scratch: no CuTe launch of a segment refused its views (the f32 twin did not stand in)
    assert not plan._told_fallback and "bfloat16" in {a.dtype for *_, args in launches for a in args
                                                      if base <= getattr(a, "data_ptr", 0) < base + plan.workspace_size}
    names = [name for name, *_ in launches]
    assert names.count("bwd_state_pass") == names.count("bwd_values") == names.count("bwd_grads") == S
    assert [lane for lane, _, _ in schedule].count(1) == S and schedule[-1][0] == 0
    regions = plan._geometry.regions
    # the workspace regions written only up to segment_bounds' event (the prepare's and chunk_bwd_intra's are
    # rewritten per segment further on, by segment views, so only these are read by all)
    assert_unordered_launches_share_only(launches, base, ports, plan._geometry, ("g", "w", "kd", "u", "state_dummy"),
                                         {"q", "k", "v", "g", "beta", "dO", "cu_seqlens", "initial_state",
                                          "d_final_state"})
    # each segment's launches take its own cu_seqlens row, and the dS that chains it, segment by segment
    starts = [args[5] for name, _, _, args in launches if name == "bwd_state_pass"]
    assert [a.data_ptr - base for a in starts] == [regions[f"cu@{s}"][0] for s in reversed(range(S))]


def test_the_c_path_runs_the_segments_schedule_with_kernels_bounded_to_a_segment(segments_on, monkeypatch):
    cg = _package()
    plan, g = _built(cg, monkeypatch, f"{W8}_seg4", T=8192, states=True)
    prepared = plan.launch_plan(g._layout_for(plan.plan.engine))
    assert prepared is not None, "the plan fell back to the Python launch path (see the log)"
    rows = [(k.name, k.grid, schedule) for k, schedule in zip(prepared.kernels, prepared.schedule)]
    assert [r[0] for r in rows[:4]] == ["prepare", "bwd_intra", "segment_bounds", "state_pass"]
    assert rows[2][2] == (0, -1, 0) and rows[3][2] == (0, -1, -1)
    per = plan._geometry.segment_chunks
    for s, at in zip(reversed(range(4)), range(4, 16, 3)):
        (reverse, values, grads) = rows[at:at + 3]
        assert reverse[0] == "bwd_state_pass" and reverse[2] == (1, 0 if s == 3 else -1, 1 + s)
        assert values[0] == "bwd_values" and values[2] == (0, 1 + s, -1) and values[1][0] == per
        assert grads[0] == "bwd_grads" and grads[1][0] == per
    # the reverse pass's specialisations: starting from a dS (all but the call's last segment, which has the
    # graph's d_final_state too) and handing one on (all but the first, which writes d_initial_state)
    assert len({k.cubin for k in prepared.kernels if k.name == "bwd_state_pass"}) == 1     # states: one form
    plain, plain_graph = _built(cg, monkeypatch, f"{W8}_seg4", T=8192, states=False)
    forms = {k.cubin for k in plain.launch_plan(plain_graph._layout_for(plain.plan.engine)).kernels
             if k.name == "bwd_state_pass"}
    assert len(forms) == 3                     # no dS in at the end, none out at the start, both in between


def test_eight_segments_with_grouped_heads_and_the_gate_options_fit_a_plan_blob(segments_on, monkeypatch):
    # the most launches a segmented backward has: the gate activation, prepare, intra, bounds, state pass, three a
    # segment, the two group sums and the gate activation's backward: 32, the C runtime's bound
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    cg = _package()
    from cudnn_graph._plan_launch import MAX_LAUNCH_KERNELS
    from cudnn_graph.engines.base import ExecutionContext
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    from cudnn_graph.engines.cutile import engine as cutile_engine
    monkeypatch.setattr(cutile_engine, "_compute_capability", lambda ordinal: (9, 0))
    F = cg.data_type
    g = cg.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cuda")
    T, H, HV, K = 8192, 2, 4, 64

    def tensor(name, dims, dt=F.BFLOAT16):
        return g.tensor(name=name, dim=list(dims), stride=[int(np.prod(dims[i + 1:])) for i in range(len(dims))],
                        data_type=dt)
    outs = g.gdn_bwd(tensor("q", (T, H, K)), tensor("k", (T, H, K)), tensor("v", (T, HV, K)),
                     tensor("g", (T, HV), F.FLOAT), tensor("beta", (T, HV)), tensor("dO", (T, HV, K)),
                     cu_seqlens=tensor("cu", (2,), F.INT32), a_log=tensor("a_log", (HV,), F.FLOAT),
                     dt_bias=tensor("dt_bias", (HV,), F.FLOAT), safe_gate=True, use_beta_sigmoid=True)
    for out in outs:
        if out is not None:
            out.set_output(True)
    g.validate()
    engine = CutileLinearAttentionEngine()
    engine.missing = None
    config = next(p for p in engine.propose_plans(g) if p.label.endswith(f"{W8}_seg8"))
    prepared = engine.build_plan(g, config, ExecutionContext()).launch_plan(g._layout_for(engine))
    assert prepared is not None and len(prepared.kernels) == MAX_LAUNCH_KERNELS


# ---- on the GPU ------------------------------------------------------------------------------------------

@pytest.fixture
def sm90(segments_on):
    import gpu_support
    return gpu_support.sm90_with_the_dsl("the segmented backward runs the CuTe gradient kernels")


@pytest.mark.gpu
@pytest.mark.parametrize("cu, K, dtype, suffix, states", [
    ([0, 8192], 64, "bfloat16", f"{W8}_seg4", True),
    ([0, 8192], 64, "bfloat16", f"{W8}_tile_pass_bv8_seg8", True),
    ([0, 8192], 128, "bfloat16", f"{W8}_tile_pass_bv16_seg4", False),
    ([0, 5000], 64, "float16", f"{W8}_tile_pass_bv16_seg4", True)])
def test_the_segmented_backward_gives_the_bits_of_the_plan_it_segments(sm90, cu, K, dtype, suffix, states):
    import test_cutile_linear_attention as forward
    kinds = dict(H=4, K=K, V=K, dtype=dtype, h0=states, dht=states, seed=91)
    segmented = forward.run_bwd_case("gdn_bwd", cu, plan=f"cutile_gdn_bwd_chunk64_{suffix}", **kinds)
    whole = forward.run_bwd_case("gdn_bwd", cu, plan=f"cutile_gdn_bwd_chunk64_{suffix.split('_seg')[0]}", **kinds)
    for name in whole:
        assert np.asarray(segmented[name]).tobytes() == np.asarray(whole[name]).tobytes(), name


@pytest.mark.gpu
def test_kda_in_segments_matches_the_reference(sm90):
    import test_cutile_linear_attention as forward
    forward.run_bwd_case("kda_bwd", [0, 8192], H=4, K=64, V=64, seed=92, plan=f"cutile_kda_bwd_chunk64_{W8}_seg4")


def _call(plan, monkeypatch, *, T=8192, cu_end=None, c_launch=True, capture=False) -> dict:
    """The gradients (host bytes) of one gdn_bwd call of ``plan`` over one sequence of ``cu_end`` (default T)
    tokens in T-token buffers, on a CuPy stream of its own: executed, or captured into a CUDA graph and replayed;
    ``c_launch`` False sends every launch through the Python path."""
    import gpu_support
    from cudnn_graph.engines.cutile import engine as cutile_engine
    from test_cutile_c_launch import _builder, _host_inputs
    cp = pytest.importorskip("cupy")
    monkeypatch.setattr(cutile_engine, "C_LAUNCH", c_launch)
    host = _host_inputs("gdn_bwd", T=T, H=4, K=64, V=64, seed=93)
    host["cu_seqlens"] = np.array([0, cu_end or T], np.int32)
    host["initial_state"] = host["initial_state"][:1]
    builder, out_names = _builder("gdn_bwd", host, plan)
    g, t = gpu_support.build_gpu(builder)
    assert g.selected_plan.label == plan, g.selected_plan
    pack, keep, outs = gpu_support.device_pack(cp, g, t, host, out_names)
    return gpu_support.run_on_own_stream(cp, g, pack, outs, capture)


@pytest.mark.gpu
def test_the_c_path_the_python_path_and_a_captured_graph_give_the_same_bits(sm90, monkeypatch):
    plan = f"cutile_gdn_bwd_chunk64_{W8}_seg4"
    c_path = _call(plan, monkeypatch)
    runs = {"captured": _call(plan, monkeypatch, capture=True),
            "python path": _call(plan, monkeypatch, c_launch=False),
            "unsegmented": _call(f"cutile_gdn_bwd_chunk64_{W8}", monkeypatch)}
    for what, run in runs.items():
        for name in c_path:
            assert run[name].tobytes() == c_path[name].tobytes(), (what, name)


@pytest.mark.gpu
def test_a_sequence_shorter_than_its_buffers_leaves_the_last_segments_empty(sm90, monkeypatch):
    """cu_seqlens [0, 6000] in 8192-token buffers: the last of four 2048-token segments is empty (its reverse
    pass hands the call's d_final_state on as it is): the unsegmented plan's gradients over the sequence."""
    cut = _call(f"cutile_gdn_bwd_chunk64_{W8}_seg4", monkeypatch, cu_end=6000)
    whole = _call(f"cutile_gdn_bwd_chunk64_{W8}", monkeypatch, cu_end=6000)
    for name in whole:
        got, want = cut[name], whole[name]
        if got.shape and got.shape[0] == 8192:            # per token: the sequence's rows
            got, want = got[:6000], want[:6000]
        assert got.tobytes() == want.tobytes(), name
