"""The cuTile engine's backward plans on the CPU (engines/cutile/_backward.py): which plans a gdn_bwd / kda_bwd /
gdn2_bwd graph is proposed and in what order, what each plan's knobs are and keep in the input type, and the
typed refusals of knobs its CuTe kernels cannot honour. The graphs and the engine come from
test_cutile_export.py's helpers (no GPU: the device checks are stubbed)."""
from __future__ import annotations

import re

import pytest

from test_cutile_export import _grouped_gated_graph, _package, _proposed


def test_the_backward_ranks_the_plans_with_the_most_cute_kernels_first():
    # sm_90, BF16 (measured on the H100, sessions 27-28): every kernel in CuTe first; the CuTe prepare and
    # chunk_bwd_intra together above the default, each alone below it; the plans not yet GPU-tested below the
    # default (to pin or time); none of them where the CuTe kernels cannot run. 64 sequences: the CTAs fill the GPU
    # (with few, the recompute's narrow cuTile pass ranks first: test_the_backward_recomputes_with_the_cutile_...)
    cg = _package()
    for op, attrs in (("gdn_bwd", {}), ("kda_bwd", {"gate_lower_bound": -2.5})):
        g = _grouped_gated_graph(cg, op, N=64, **attrs)
        plans = _proposed(cg, g)
        by_name = {p.label: p for p in plans}

        def name(suffix, op=op):
            return f"cutile_{op}_chunk64{suffix}"
        default = by_name[name("")]
        first = max(plans, key=lambda p: p.priority)
        every, but_state = by_name[name("_cute_all")], by_name[name("_cute_all_tile_state")]
        # every kernel in CuTe on 16-bit scratch first, then on f32 scratch, once the op's CuTe chunk_bwd_grads
        # is GPU-tested (its f32 twin runs a call whose buffers a CuTe kernel refuses, in the same workspace);
        # until then every other kernel in CuTe with the cuTile chunk_bwd_grads
        io, but_grads = by_name[name("_cute_all_io")], by_name[name("_cute_all_tile_grads")]
        assert io.knobs == dict(every.knobs, state_pass="cute", scratch="io")
        assert io.workspace_size == every.workspace_size
        assert but_grads.knobs == dict(every.knobs, grads="cutile")
        io_all = by_name[name("_cute_all_io_all")]
        assert io_all.knobs == dict(io.knobs, scratch="io_all") and io_all.workspace_size == every.workspace_size
        from cudnn_graph.engines.cutile._backward import (CUTE_GRADS_GPU_TESTED, GRADS_W8_GPU_TESTED,
                                                          IO_ALL_GPU_TESTED, VALUES_W8_GPU_TESTED)
        # chunk_bwd_grads in eight-warp CTAs: io_all's twin, first once GPU-tested; then chunk_bwd_values too
        w8 = by_name[name("_cute_all_io_all_w8")]
        assert w8.knobs == dict(io_all.knobs, grads_warps=8) and w8.workspace_size == io_all.workspace_size
        values_w8 = by_name[name("_cute_all_io_all_w8_values_w8")]
        assert values_w8.knobs == dict(w8.knobs, values_warps=8) and values_w8.workspace_size == w8.workspace_size
        # the state passes over 64 value columns a CTA: to time, below the default
        for suffix, narrow in (("_cute_all_io_all_w8_bv64", w8), ("_cute_all_io_all_w8_values_w8_bv64", values_w8)):
            wide = by_name[name(suffix)]
            assert wide.knobs == dict(narrow.knobs, block_v=64) and wide.priority < default.priority
        # the prepare doing chunk_bwd_intra's work: to time, below the default
        fused = by_name[name("_cute_all_io_all_w8_intra_in_prepare")]
        assert fused.knobs == dict(w8.knobs, intra_in_prepare=True) and fused.priority < default.priority
        both = by_name[name("_cute_all_io_all_w8_values_w8_intra_in_prepare")]
        assert both.knobs == dict(values_w8.knobs, intra_in_prepare=True) and both.priority < default.priority
        if op.removesuffix("_bwd") in CUTE_GRADS_GPU_TESTED:
            assert io.priority > every.priority > default.priority > but_grads.priority
            assert first is (values_w8 if GRADS_W8_GPU_TESTED and VALUES_W8_GPU_TESTED else
                             w8 if GRADS_W8_GPU_TESTED else io_all if IO_ALL_GPU_TESTED else io)
            assert (io_all.priority > io.priority) == IO_ALL_GPU_TESTED
            assert (w8.priority > io_all.priority) == GRADS_W8_GPU_TESTED
            assert (values_w8.priority > w8.priority) == (GRADS_W8_GPU_TESTED and VALUES_W8_GPU_TESTED)
        else:
            assert first is but_grads and max(io.priority, io_all.priority, every.priority) < default.priority
        values = by_name[name("_cute_prepare_intra_values")]
        assert values.knobs["values"] == every.knobs["values"] == "cute" and values.knobs["prepare"] == "cute"
        assert every.knobs["bwd_state"] == every.knobs["grads"] == "cute"
        assert but_state.knobs == {k: v for k, v in every.knobs.items() if k != "bwd_state"}
        pair = by_name[name("_cute_prepare_intra")]
        assert (pair.knobs["prepare"], pair.knobs["intra"], pair.knobs["mma"]) == ("cute", "cute", "tf32")
        assert pair.priority > default.priority > but_state.priority
        for alone, knob in (("cute_prepare", "prepare"), ("cute_intra", "intra")):
            assert by_name[name(f"_{alone}")].knobs[knob] == "cute"
            assert default.priority > by_name[name(f"_{alone}")].priority
        # the default and the pair have twins over value blocks of 64, below the default (to time)
        for label in (pair.label, default.label):
            twin = by_name[f"{label}_bv64"]
            assert dict(twin.knobs, block_v=32) == dict(by_name[label].knobs) and twin.knobs["block_v"] == 64
            assert twin.priority < default.priority
        # fewer CuTe kernels: below the default (measured slower than every one in CuTe)
        fewer = ["_cute_prepare_intra_state", "_cute_prepare_intra_values", "_cute_prepare_intra_grads",
                 "_cute_prepare_intra_grads_state"]
        assert all(by_name[name(suffix)].priority < default.priority for suffix in fewer)
        assert not [p for p in _proposed(cg, g, cute_reason="not sm_90") if "cute" in p.label]
    from cudnn_graph.engines.cutile import engine as cutile_engine
    g = _grouped_gated_graph(cg, "gdn2_bwd")
    assert cutile_engine._cute_kernels_reason(g, g.nodes[0], "intra") == \
        "the CuTe chunk_intra computes gdn / kda, not gdn2_bwd"


@pytest.mark.parametrize("op, io, K, N, width", [
    ("gdn_bwd", "BFLOAT16", 64, 2, 8),       # the forward runs cute_bv8: its CTAs fit one wave
    ("kda_bwd", "BFLOAT16", 64, 2, 16),      # cute_bv16 (kda's 8-column pass was slower)
    ("gdn_bwd", "HALF", 64, 2, 16),          # cute_bv16 with FP16 products
    ("gdn_bwd", "BFLOAT16", 128, 2, 16),     # cute_bv16
    ("kda_bwd", "HALF", 128, 2, 0),          # cute_all_bv16: the CuTe state pass
    ("gdn_bwd", "BFLOAT16", 64, 64, 0)])     # 512 CTAs at 32 columns fill the GPU: the fused pass
def test_the_backward_recomputes_with_the_cutile_state_pass_its_forward_ranks_first(op, io, K, N, width):
    # where few sequences x heads leave the CuTe pass's 32-column CTAs on a few SMs, the forward's first plan runs
    # the cuTile pass over 8 or 16 columns a CTA; the backward's recompute takes it at that width (its reverse pass
    # keeps 32), first once GPU-tested, and the other width to pin or time
    from cudnn_graph.engines.cutile._backward import TILE_PASS_GPU_TESTED, forward_tile_pass_width
    cg = _package()
    g = _grouped_gated_graph(cg, op, K=K, N=N, io=io, **({"gate_lower_bound": -2.5} if op == "kda_bwd" else {}))
    assert forward_tile_pass_width(g, g.nodes[0]) == width
    plans = {p.label: p for p in _proposed(cg, g)}
    w8 = plans[f"cutile_{op}_chunk64_cute_all_io_all_w8"]
    first = max(plans.values(), key=lambda p: p.priority)
    for narrow in (8, 16):
        tile = plans[f"cutile_{op}_chunk64_cute_all_io_all_w8_tile_pass_bv{narrow}"]
        assert tile.knobs == dict(w8.knobs, state_pass="cutile", state_pass_block_v=narrow)
        assert tile.workspace_size == w8.workspace_size
        assert (first is tile) == (narrow == width and TILE_PASS_GPU_TESTED)
    if not (width and TILE_PASS_GPU_TESTED):
        assert first is w8


@pytest.mark.parametrize("op, io, K, width", [("gdn_bwd", "BFLOAT16", 64, 8), ("gdn_bwd", "BFLOAT16", 128, 16)])
def test_the_narrow_reverse_pass_is_proposed_once_gpu_tested_and_first_once_timed_faster(op, io, K, width, monkeypatch):
    # with the forward's narrow pass in the recompute, the reverse pass over 16 value columns a CTA too (few
    # sequences x heads: its 32-column CTAs leave most SMs idle): proposed once GPU-tested, just below its plan, and
    # just above it once timed faster
    from cudnn_graph.engines.cutile import _backward
    cg = _package()
    g = _grouped_gated_graph(cg, op, K=K, N=2, io=io)
    base = f"cutile_{op}_chunk64_cute_all_io_all_w8_tile_pass_bv{width}"
    monkeypatch.setattr(_backward, "REVERSE_NARROW_GPU_TESTED", False)
    assert not any(p.label.endswith("_rev16") for p in _proposed(cg, g))
    monkeypatch.setattr(_backward, "REVERSE_NARROW_GPU_TESTED", True)
    plans = {p.label: p for p in _proposed(cg, g)}
    narrow = plans[f"{base}_rev16"]
    assert narrow.knobs == dict(plans[base].knobs, reverse_block_v=16)
    assert narrow.workspace_size == plans[base].workspace_size
    assert max(plans.values(), key=lambda p: p.priority) is plans[base]
    monkeypatch.setattr(_backward, "REVERSE_NARROW_FIRST", (f"cute_all_io_all_w8_tile_pass_bv{width}_rev16",))
    assert max(_proposed(cg, g), key=lambda p: p.priority).label == f"{base}_rev16"


def test_the_reverse_pass_width_is_one_the_kernels_take(monkeypatch):
    cg = _package()
    from cudnn_graph.errors import GraphNotSupportedError
    knobs = {"mma": "tf32", "prepare": "cute", "intra": "cute", "values": "cute", "grads": "cute", "bwd_state": "cute",
             "scratch": "io_all", "grads_warps": 8, "state_pass": "cutile", "state_pass_block_v": 8}
    with pytest.raises(GraphNotSupportedError, match="reverse_block_v=8: the reverse state pass's value columns a "
                                                     "CTA, one of 16, 32, 64 dividing V=64"):
        _build_pinned_backward(cg, dict(knobs, reverse_block_v=8), monkeypatch)
    plan = _build_pinned_backward(cg, dict(knobs, reverse_block_v=16), monkeypatch)
    V = plan._geometry.V
    assert plan._reverse_grid[2] == V // 16 and plan.variant.block_v == 32     # the gradient kernels keep 32
    assert plan.variant.bwd_state_pass_constants()[3] == 16 and plan._f32_twin._reverse_grid == plan._reverse_grid


@pytest.mark.parametrize("io, products", [("BFLOAT16", "bfloat16"), ("HALF", "float16")])
def test_the_recomputes_narrow_cutile_state_pass_takes_products_of_the_scratch_type(io, products, monkeypatch):
    # the pass runs over 8 value columns a CTA, the reverse pass over 32; on 16-bit scratch its products are of the
    # scratch's type (as the forward plans' cute_bv8 / cute_bv16), on the f32 twin TF32
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    cg = _package()
    knobs = {"mma": "tf32", "prepare": "cute", "intra": "cute", "values": "cute", "grads": "cute", "bwd_state": "cute",
             "scratch": "io_all", "grads_warps": 8, "state_pass": "cutile", "state_pass_block_v": 8}
    plan = _build_pinned_backward(cg, knobs, monkeypatch, io=io)
    v = plan.variant
    assert (v.state_pass, v.pass_block_v, v.block_v, v.scratch_dtype) == ("cutile", 8, 32, products)
    assert v.low_mma and v.fp16_products == (products == "float16")
    assert plan._state_pass_grid == (2, 4, 8) and plan._reverse_grid == (2, 4, 2)
    twin = plan._f32_twin.variant
    assert (twin.pass_block_v, twin.scratch_dtype, twin.low_mma, twin.fp16_products) == (8, "float32", False, False)


@pytest.mark.parametrize("op, K, first", [("kda_bwd", 64, "cutile_kda_bwd_chunk64_cute_all"),
                                          ("kda_bwd", 128, "cutile_kda_bwd_chunk64_cute_all"),
                                          ("gdn2_bwd", 64, "cutile_gdn2_bwd_chunk64")])
def test_the_backward_with_the_softplus_gate_ranks_as_any_other_gate(op, K, first):
    # the misses that kept the softplus gate's backward on BF16 products (sessions 11-19) were the eight-warp
    # reverse state pass's race (docs/engines_cutile.md, "The backward"); gdn2 has no CuTe kernels
    from cudnn_graph.engines.cutile._backward import (CUTE_GRADS_GPU_TESTED, GRADS_W8_GPU_TESTED,
                                                      IO_ALL_GPU_TESTED, VALUES_W8_GPU_TESTED)
    cg = _package()
    plans = _proposed(cg, _grouped_gated_graph(cg, op, K=K, N=64))
    if op == "kda_bwd" and "kda" not in CUTE_GRADS_GPU_TESTED:
        first += "_tile_grads"
    elif op == "kda_bwd" and not IO_ALL_GPU_TESTED:
        first += "_io"
    elif op == "kda_bwd":
        first += "_io_all" + ("_w8" if GRADS_W8_GPU_TESTED else "")
        first += "_values_w8" if GRADS_W8_GPU_TESTED and VALUES_W8_GPU_TESTED else ""
    assert max(plans, key=lambda p: p.priority).label == first


@pytest.mark.parametrize("op, attrs", [("gdn_bwd", {}), ("kda_bwd", {"gate_lower_bound": -2.5})])
def test_a_float16_backward_ranks_every_cute_kernel_first_once_its_gpu_tests_pass(op, attrs):
    # chunk_bwd_grads (and kda's chunk_bwd_intra) take FP16 inputs with the split decays in BF16: every form of the
    # BF16 backward is proposed; until the FP16 GPU tests pass the f32-scratch recompute pair stays first
    from cudnn_graph.engines.cutile.engine import FLOAT16_BACKWARD_GPU_TESTED
    cg = _package()
    half = {p.label: p for p in _proposed(cg, _grouped_gated_graph(cg, op, io="HALF", N=64, **attrs))}
    bf16 = {p.label: p for p in _proposed(cg, _grouped_gated_graph(cg, op, N=64, **attrs))}
    first = max(half.values(), key=lambda p: p.priority).label
    if FLOAT16_BACKWARD_GPU_TESTED:
        assert set(half) == set(bf16) and first == max(bf16.values(), key=lambda p: p.priority).label
        w8 = half[f"cutile_{op}_chunk64_cute_all_io_all_w8"]
        assert w8.knobs == bf16[w8.label].knobs and w8.knobs["grads"] == w8.knobs["intra"] == "cute"
    elif op == "gdn_bwd":       # every form proposed, the f32-scratch recompute pair first
        assert set(half) == set(bf16) and first == f"cutile_{op}_chunk64_cute_prepare_intra"
    else:                       # kda's FP16 chunk_bwd_intra is not offered: no plan with it
        assert not [label for label in half if "intra" in label] and "intra" not in first


def _build_pinned_backward(cg, knobs: dict, monkeypatch, io: str = "BFLOAT16"):
    """Build a gdn_bwd plan of ``knobs`` with the device checks stubbed (no GPU here to query)."""
    pytest.importorskip("cuda.tile", reason="a cuTile plan's kernels need cuda.tile (extra 'cutile')")
    from cudnn_graph.engines.base import ExecutionContext, PlanConfig
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    from cudnn_graph.engines.cutile import engine as cutile_engine
    monkeypatch.setattr(cutile_engine, "_support_reason", lambda graph, node: None)
    monkeypatch.setattr(cutile_engine, "_cute_device_reason", lambda graph: None)
    engine = CutileLinearAttentionEngine()
    engine.missing = None
    g = _grouped_gated_graph(cg, "gdn_bwd", io=io)
    return engine.build_plan(g, PlanConfig(cutile_engine.CUTILE_BASE, knobs=knobs, name="pinned", engine=engine),
                             ExecutionContext())


def test_a_backward_keeps_in_the_input_type_the_scratch_its_scratch_knob_names():
    # "io": the recompute's scratch; "io_all": the backward's own too (dhs, dD, qg / dCg, T / dA, dq / dk before
    # the norm); the f32 twin (a call a CuTe kernel refuses) and dbeta's v part keep f32
    cg = _package()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    g = _grouped_gated_graph(cg, "gdn_bwd")
    node = g.nodes[0]
    recompute = {"w", "u", "kd", "d", "hs"}
    own = {"dhs", "dd", "qg", "da", "dq_pre", "dk_pre"}
    twin = cutile_engine._Geometry(node, backward=True)
    assert set(twin.dtypes.values()) == {"float32"} and "dq_pre" not in twin.regions
    for scratch, narrow in (("io", recompute), ("io_all", recompute | own)):
        geometry = cutile_engine._Geometry(node, backward=True, io_scratch="bfloat16",
                                           io_backward=scratch == "io_all")
        assert {name for name, dtype in geometry.dtypes.items() if dtype == "bfloat16"} == narrow
        assert geometry.dtypes["dbeta_v"] == "float32"
        assert cutile_engine.backward_workspace_size(node, "bfloat16", scratch) == max(geometry.workspace_size,
                                                                                      twin.workspace_size)


def test_the_cute_values_kernel_needs_the_prepare_that_leaves_t(monkeypatch):
    cg = _package()
    with pytest.raises(cg.GraphNotSupportedError, match="values='cute' reads T .* needs prepare='cute' too"):
        _build_pinned_backward(cg, {"intra": "cute", "values": "cute"}, monkeypatch)


def test_an_output_set_to_another_type_leaves_the_cute_kernels_out():
    # the CuTe kernels' stores are compiled for the types the schema infers; the cuTile kernels store any type
    cg = _package()
    g = _grouped_gated_graph(cg, "gdn_bwd")
    assert [p for p in _proposed(cg, g) if "cute" in p.label]
    dv = next(t for name, t in g.nodes[0].outputs.items() if name == "dv")
    dv.set_data_type(cg.data_type.FLOAT)
    g.validate()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    assert cutile_engine._cute_output_reason(g, g.nodes[0]) == \
        "the CuTe kernels write dv as BFLOAT16; this graph sets it to FLOAT"
    assert not [p for p in _proposed(cg, g) if "cute" in p.label]


@pytest.mark.parametrize("knobs, words", [
    ({"scratch": "io", "prepare": "cute", "intra": "cute", "values": "cute", "bwd_state": "cute"},
     "scratch='io' in a backward needs every kernel but the state pass in CuTe; grads are 'cutile'"),
    ({"prepare": "cute", "state_pass": "cute"}, "state_pass='cute' in a backward reads the recompute's scratch in the "
                                                "input type: it needs scratch='io'"),
    ({"scratch": "bf16"}, "scratch='bf16'; expected one of 'f32', 'io', 'io_all'")])
def test_the_backward_takes_16_bit_scratch_only_with_every_kernel_but_the_state_pass_in_cute(knobs, words, monkeypatch):
    # the backward's cuTile kernels read f32 scratch: a CuTe state pass over it would read f32 bits as BF16
    cg = _package()
    with pytest.raises(cg.GraphNotSupportedError, match=re.escape(words)):
        _build_pinned_backward(cg, knobs, monkeypatch)


@pytest.mark.parametrize("knobs, words", [
    ({"grads_warps": 8}, "grads_warps=8 needs the CuTe chunk_bwd_grads (grads='cute'); this plan has "
                         "grads='cutile'"),
    ({"grads": "cute", "grads_warps": 6}, "grads_warps=6; expected one of (4, 8)"),
    ({"values_warps": 8}, "values_warps=8 needs the CuTe chunk_bwd_values (values='cute'); this plan has "
                          "values='cutile'"),
    ({"prepare": "cute", "values": "cute", "values_warps": 6}, "values_warps=6; expected one of (4, 8)"),
    ({"prepare": "cute", "state_pass": "cute", "scratch": "io", "state_pass_block_v": 8},
     "state_pass_block_v=8: the recompute's cuTile state pass (state_pass='cutile') over one of 8, 16, 32, 64, 128 "
     "value columns dividing V=64; got state_pass='cute'"),
    ({"state_pass_block_v": 128}, "state_pass_block_v=128: the recompute's cuTile state pass (state_pass='cutile') "
                                  "over one of 8, 16, 32, 64, 128 value columns dividing V=64; got state_pass='cutile'"),
    ({"prepare": "cute", "values": "cute", "intra_in_prepare": True},
     "intra_in_prepare=True is the CuTe prepare doing chunk_bwd_intra's work: it needs prepare, intra and values "
     "'cute' (this plan has prepare='cute', intra='cutile', values='cute')")])
def test_the_backward_refuses_knobs_its_cute_kernels_cannot_honour(knobs, words, monkeypatch):
    cg = _package()
    if "cute" in knobs.values():
        pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    with pytest.raises(cg.GraphNotSupportedError, match=re.escape(words)):
        _build_pinned_backward(cg, knobs, monkeypatch)
