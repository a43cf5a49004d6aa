"""One sequence's forward in segments (engines/cutile/_segments): each segment's state pass on a side stream
beside the next segment's prepare and the last one's output.

On the CPU: which graphs the segmented plans are proposed for, the workspace views each segment reads and
writes, and the schedule (an order that is serial-correct, every wait after its record, the caller's stream
last). On an sm_90 GPU: against the reference engine, the unsegmented plan's bits (the chained f32 states are
the chain's own), the C launch path's bits against the Python path's, a CUDA graph capturing the caller's
stream, a sequence shorter than its buffers, and the call ordered on the caller's stream.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import types

import pytest

from _helpers import REPO_ROOT, load_by_path


def _package():
    cg = pytest.importorskip("cudnn_graph")
    if not hasattr(cg, "pygraph") or importlib.util.find_spec("cudnn_graph.engines.cutile") is None:
        pytest.skip("cudnn_graph (with engines/cutile) is not installed")
    pytest.importorskip("cuda.tile", reason="the cuTile engine's plans need cuda.tile")
    return cg


def _one_sequence_graph(cg, T, n_seq=1):
    """gdn over ``n_seq`` sequences in T tokens, H 2, K = V = 64, BF16 (test_cutile_export's graph)."""
    import test_cutile_export as export
    g = export._gdn_graph(cg, cg.data_type.BFLOAT16, 64, 64, n_seq=n_seq, T=T)
    g.validate()
    return g


def _proposed_labels(cg, g):
    """The engine's plans for ``g`` by label, the device checks stubbed (test_cutile_export's)."""
    import test_cutile_export as export
    return {p.label: p for p in export._proposed(cg, g)}


@pytest.fixture
def segments_on(monkeypatch):
    """The segmented variants proposed (engine.SEGMENTS_GPU_TESTED: off until their GPU tests have passed)."""
    from cudnn_graph.engines.cutile import engine as cutile_engine
    monkeypatch.setattr(cutile_engine, "SEGMENTS_GPU_TESTED", True)


def test_segmented_plans_are_proposed_only_once_gpu_tested(monkeypatch):
    cg = _package()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    graph = _one_sequence_graph(cg, 32768)
    for tested in (False, True):
        monkeypatch.setattr(cutile_engine, "SEGMENTS_GPU_TESTED", tested)
        assert any("_seg" in label for label in _proposed_labels(cg, graph)) == tested


def test_segmented_plans_are_proposed_for_one_long_sequence_only(segments_on):
    cg = _package()
    long_one = _proposed_labels(cg, _one_sequence_graph(cg, 8192))
    assert {"cutile_gdn_chunk64_cute_bv8_seg4", "cutile_gdn_chunk64_cute_bv8_seg8"} <= set(long_one)
    assert long_one["cutile_gdn_chunk64_cute_bv8_seg8"].knobs["segments"] == 8
    short_one = _proposed_labels(cg, _one_sequence_graph(cg, 4095))       # under 16 chunks a segment at 4
    assert not any("_seg" in label for label in short_one)
    two = _proposed_labels(cg, _one_sequence_graph(cg, 8192, n_seq=2))
    assert not any("_seg" in label for label in two)


def test_a_measured_segment_count_ranks_just_above_its_plan_for_one_long_sequence(segments_on, monkeypatch):
    cg = _package()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    monkeypatch.setattr(cutile_engine, "SEGMENTS_FIRST", {"bfloat16": 8})

    def first(T):
        plans = _proposed_labels(cg, _one_sequence_graph(cg, T))
        return max(plans.values(), key=lambda p: p.priority).label

    assert first(32768) == "cutile_gdn_chunk64_cute_bv8_seg8"
    assert first(16384) == "cutile_gdn_chunk64_cute_bv8"          # shorter than measured: the plain plan
    monkeypatch.setattr(cutile_engine, "SEGMENTS_FIRST", {})
    assert first(32768) == "cutile_gdn_chunk64_cute_bv8"


@pytest.mark.parametrize("T, S", [(8192, 4), (5000, 4), (8192, 8)])
def test_each_segment_views_its_own_chunks_and_the_states_chain_them(T, S):
    cg = _package()
    from cudnn_graph.engines.cutile._geometry import _Geometry
    node = _one_sequence_graph(cg, T).nodes[0]
    plain = _Geometry(node, io_scratch="bfloat16")
    geometry = _Geometry(node, io_scratch="bfloat16", segments=S)
    per = geometry.segment_chunks
    assert geometry.segment_tokens == per * 64 and S * geometry.segment_tokens >= T
    assert (S - 1) * geometry.segment_tokens < T      # no segment is empty for a full-length call
    assert geometry.chunks >= max(plain.chunks, S * per)
    for name in ("w", "u", "kd", "d", "hs"):
        offset, shape = geometry.regions[name]
        row = (shape[1] * shape[2] * shape[3]) * 2
        for s in range(S):
            view_offset, view_shape = geometry.regions[f"{name}@{s}"]
            assert view_shape == (per, *shape[1:]) and view_offset == offset + s * per * row
            assert view_offset + per * row <= offset + shape[0] * row
    bounds = geometry.regions["segment_bounds"][0]
    assert [geometry.regions[f"cu@{s}"] for s in range(S)] == [(bounds + 16 * s, (2,)) for s in range(S)]
    assert all(geometry.dtypes[f"cu@{s}"] == "int32" for s in range(S))
    assert sorted(n for n in geometry.regions if n.startswith("state@")) == [f"state@{s}" for s in range(S - 1)]
    # views take no bytes of their own: the regions proper end where the workspace does
    assert geometry.workspace_size <= plain.workspace_size + S * 16 + 256 + (S - 1) * 4 * 2 * 64 * 64 + 256 + \
        (geometry.chunks - plain.chunks) * 2 * 64 * 64 * 2 * 5


def _segments_module():
    """engines/cutile/_segments loaded by path (it needs no compiled module)."""
    return load_by_path("_cutile_under_test", REPO_ROOT / "engines" / "cutile", "_segments")[0]


@dataclasses.dataclass(frozen=True)
class _FakeVariant:
    segments: int
    has_h0: bool = False
    store_ht: bool = False


class _FakeCuteLaunch:
    """A CuTe launch stand-in: bounded to a segment's chunks, it is the string the schedule test looks for."""

    def over_chunks(self, chunks):
        return "PREPARE_BOUNDED"


_FAKE_PREPARE = _FakeCuteLaunch()


class _FakePlan:
    """What segmented_launches reads of a plan: its variant, geometry, own kernels and launch builder."""

    def __init__(self, segments, head=()):
        self.variant = _FakeVariant(segments)
        self._geometry = types.SimpleNamespace(segment_chunks=16, segment_tokens=1024)
        self.segment_kernels = {"bounds": "BOUNDS"}
        self.segment_bounded = {}
        self._head = list(head)
        self.built = []

    def _forward_launches(self, slot, scratch, v=None):
        self.built.append((slot("cu_seqlens"), slot("initial_state"), slot("final_state"), scratch["w"], v))
        return [*self._head, ("prepare", (99, 2, 1), _FAKE_PREPARE, ("p", scratch["w"])),
                ("state_pass", (1, 2, 8), "STATE", ("s", scratch["hs"])),
                ("output", (99, 2, 1), "OUTPUT", ("o", scratch["hs"]))]


def _fake_scratch(S):
    names = ["w", "u", "kd", "d", "hs"]
    scratch = {n: n for n in names + ["segment_bounds"]}
    for s in range(S):
        scratch.update({f"{n}@{s}": f"{n}@{s}" for n in names})
        scratch[f"cu@{s}"] = f"cu@{s}"
        scratch[f"state@{s}"] = f"state@{s}"
    return scratch


@pytest.mark.parametrize("S", [2, 4, 8])
def test_the_schedule_is_serially_correct_and_joins_the_callers_stream(S):
    segments = _segments_module()
    plan = _FakePlan(S, head=[("gate_activation", (1, 1, 1), "GATES", ())])
    launches = segments.segmented_launches(plan, lambda port: port, _fake_scratch(S))
    schedule = launches.schedule
    names = [name for name, *_ in launches]
    assert names[:2] == ["gate_activation", "segment_bounds"]
    assert len(launches) == 2 + 3 * S and len(schedule) == len(launches)
    recorded, done = {}, set()
    for i, ((name, grid, kernel, args), (lane, wait, record)) in enumerate(zip(launches, schedule)):
        if wait >= 0:
            assert wait in recorded, f"launch {i} ({name}) waits on event {wait} before it is recorded"
        if name == "state_pass":
            assert lane == 1 and recorded[wait] == ("prepare", args[1].split("@")[1])
        else:
            assert lane == 0
        if name == "output":
            assert recorded[wait] == ("state_pass", args[1].split("@")[1])
        if name in ("prepare", "output"):
            assert grid[0] == 16                 # the segment's chunks
        if record >= 0:
            assert record not in recorded, "an event recorded twice in one call"
            recorded[record] = (name, args[1].split("@")[1])
        done.add((name, args[1] if len(args) > 1 else None))
    assert len(recorded) == segments.event_count(S)
    # the last launch runs on the caller's stream after the last state pass: the side stream is joined
    assert schedule[-1][0] == 0 and recorded[schedule[-1][1]] == ("state_pass", str(S - 1))
    # each segment's own views, the previous segment's state in and its own out, the call's at the ends
    assert plan.built[0][0] == "cu_seqlens"                 # the whole call's (its head launches)
    for s, (cu, h0, ht, w, v) in enumerate(plan.built[1:]):
        assert cu == f"cu@{s}" and w == f"w@{s}"
        assert h0 == ("initial_state" if s == 0 else f"state@{s - 1}")
        assert ht == ("final_state" if s == S - 1 else f"state@{s}")
        assert v.has_h0 == (s > 0) and v.store_ht == (s < S - 1)
    assert [k for name, _, k, _ in launches if name == "prepare"] == ["PREPARE_BOUNDED"] * S
    assert [k for name, _, k, _ in launches if name == "output"] == ["OUTPUT"] * S


@pytest.mark.parametrize("suffix", ["cute_bv8_seg4", "cute_bv8_seg8"])
def test_launches_left_unordered_share_no_chunk_rows(segments_on, monkeypatch, suffix):
    # the built plan's Python-path launches: each segment's state pass beside the next prepare and the last output
    # shares with them only the gate sums' region (token-indexed: each prepare writes its own segment's rows) and
    # graph inputs, never a chunk row of w, u, kd, the deltas or the states
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    cg = _package()
    from cudnn_graph.engines.base import ExecutionContext
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    from cudnn_graph.engines.cutile import engine as cutile_engine
    from test_cutile_schedule import assert_unordered_launches_share_only
    from test_cutile_segments_backward import _slot_launches
    monkeypatch.setattr(cutile_engine, "_compute_capability", lambda ordinal: (9, 0))
    g = _one_sequence_graph(cg, 8192)
    engine = CutileLinearAttentionEngine()
    engine.missing = None
    config = next(p for p in engine.propose_plans(g) if p.label == f"cutile_gdn_chunk64_{suffix}")
    plan = engine.build_plan(g, config, ExecutionContext())
    launches, base, ports = _slot_launches(cg, plan, g)
    assert [name for name, *_ in launches].count("state_pass") == plan.variant.segments
    assert_unordered_launches_share_only(launches, base, ports, plan._geometry, ("g", "state_dummy"),
                                         {"q", "k", "v", "g", "beta", "cu_seqlens", "initial_state"})


def test_tile_launch_refuses_a_lane_without_lanes_and_a_lane_past_the_side_stream():
    _package()
    from cudnn_graph import PackLayout, TensorSpec
    from cudnn_graph._tile_launch import TileLaunch
    from cudnn_graph.errors import InvalidArgumentError
    layout = PackLayout([TensorSpec(1, (4,), "float32", strides=(1,), name="x")])
    row = (0, (1, 1, 1), bytes(16), [0], [], (1, 1, 1), 0)
    with pytest.raises(InvalidArgumentError, match="lanes_for"):
        TileLaunch.create(layout, [(*row, (1, -1, -1))], [], None, 0, None)
    with pytest.raises(InvalidArgumentError, match="lane"):
        TileLaunch.create(layout, [(*row, (2, -1, -1))], [], None, 0, None, lambda stream: None)
    plain = TileLaunch.create(layout, [(*row, (0, -1, -1))], [], None, 0, None)
    assert plain.kernel_count == 1


# ---- on the GPU ------------------------------------------------------------------------------------------

gpu = pytest.mark.gpu


@pytest.fixture
def sm90(segments_on):
    import gpu_support
    return gpu_support.sm90_with_the_dsl("the segmented plans run the CuTe prepare and output")


def _forward():
    import test_cutile_linear_attention as forward
    return forward


@gpu
@pytest.mark.parametrize("dtype, width", [("bfloat16", "bv8"), ("float16", "bv16")])
@pytest.mark.parametrize("T, S", [(8192, 4), (5000, 4), (8192, 8)])
def test_segments_match_the_reference_and_the_unsegmented_bits(sm90, dtype, width, T, S):
    import numpy as np
    forward = _forward()
    cut = forward.run_case("gdn", [0, T], H=4, K=64, V=64, dtype=dtype, seed=T + S,
                           plan=f"cutile_gdn_chunk64_cute_{width}_seg{S}")
    whole = forward.run_case("gdn", [0, T], H=4, K=64, V=64, dtype=dtype, seed=T + S,
                             plan=f"cutile_gdn_chunk64_cute_{width}")
    for name in whole:
        assert np.asarray(cut[name]).tobytes() == np.asarray(whole[name]).tobytes(), name


@gpu
def test_segments_without_states_match_the_reference(sm90):
    _forward().run_case("gdn", [0, 8192], H=2, K=64, V=64, h0=False, final=False, l2=False, seed=3,
                        plan="cutile_gdn_chunk64_cute_bv8_seg4")


def _call(plan, host, *, capture=False, c_launch=True, monkeypatch=None):
    """o and final_state of one gdn call with ``plan`` pinned on a CuPy stream of its own (the segmented plan's
    caller stream): executed, or recorded in a CUDA graph of that stream and replayed; ``c_launch`` False
    sends every launch through the Python path."""
    import gpu_support
    cp = pytest.importorskip("cupy")
    if not c_launch:
        from cudnn_graph.engines.cutile import engine as cutile_engine
        monkeypatch.setattr(cutile_engine, "C_LAUNCH", False)
    builder = _forward().builder_for("gdn", host, cudnn_data_type().BFLOAT16, True, True, plan)
    g, t = gpu_support.build_gpu(builder)
    assert g.selected_plan.label == plan
    pack, keep, outs = gpu_support.device_pack(cp, g, t, host, ["o", "final_state"])
    return gpu_support.run_on_own_stream(cp, g, pack, outs, capture)


def cudnn_data_type():
    import cudnn_graph
    return cudnn_graph.data_type


def _host(T, cu_end=None, seed=11):
    import ml_dtypes
    import numpy as np
    host = _forward().make_inputs("gdn", [0, T], 4, 64, 64, ml_dtypes.bfloat16, seed, True)
    if cu_end is not None:
        host["cu_seqlens"] = np.array([0, cu_end], np.int32)
    return host


@gpu
def test_the_c_path_and_a_captured_graph_give_the_python_paths_bits(sm90, monkeypatch):
    host = _host(8192)
    plan = "cutile_gdn_chunk64_cute_bv8_seg4"
    c_path = _call(plan, host)
    captured = _call(plan, host, capture=True)
    python_path = _call(plan, host, c_launch=False, monkeypatch=monkeypatch)
    for name in c_path:
        assert c_path[name].tobytes() == python_path[name].tobytes(), name
        assert captured[name].tobytes() == c_path[name].tobytes(), name


@gpu
def test_a_sequence_shorter_than_its_buffers_leaves_the_last_segments_empty(sm90):
    """cu_seqlens [0, 6000] in 8192-token buffers: four segments of 2048 tokens, the last one empty (its state
    pass hands its start state on): the unsegmented plan's o over the sequence and final state."""
    host = _host(8192, cu_end=6000)
    cut = _call("cutile_gdn_chunk64_cute_bv8_seg4", host)
    whole = _call("cutile_gdn_chunk64_cute_bv8", host)
    assert cut["final_state"].tobytes() == whole["final_state"].tobytes()
    assert cut["o"][:6000].tobytes() == whole["o"][:6000].tobytes()
