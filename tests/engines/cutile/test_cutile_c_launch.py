"""execute()'s C launch path for cuTile plans (engines/cutile/_abi.py, _c_launch.py;
src/cudnn_graph/_tile_launch.pyx).

- CPU, no toolchain: the packer (TileLaunch) on a made-up parameter layout: extents and strides kept,
  each call's operand and workspace addresses written at their offsets, a misaligned operand refused with
  an AlignmentError naming it; the layout arithmetic and its comparison with a cubin's table.
- CPU, with cuda.tile and tileiras: the ABI pin. A gdn forward and a gdn and gdn2 backward plan's kernels
  compile for sm_90 and each cubin's own parameter table (EIATTR_KPARAM_INFO) is the layout the packer
  writes; a cuda.tile upgrade that flattens arguments otherwise fails here rather than launching garbage.
- GPU (``-m gpu``): the C path's outputs are bitwise those of the Python path (ct.launch) for gdn and kda
  forward and gdn and gdn2 backward, on the first execute and on the repeated one (the fast executor), and
  for the plans with the eight-warp CuTe state pass (a block of 256 threads in the launch record).
"""
from __future__ import annotations

import struct

import numpy as np
import pytest

from cudnn_graph import PackLayout, TensorSpec
from cudnn_graph._tile_launch import TileLaunch
from cudnn_graph.engines.cutile import _abi, _c_launch, _toolchain
from cudnn_graph.errors import AlignmentError, InvalidArgumentError

MISSING = _toolchain.missing()
needs_cutile = pytest.mark.skipif(MISSING is not None, reason=f"cannot compile cuTile kernels: {MISSING}")


# ------------------------------------------------------------------------------------------ the packer

def _fake_launch(alignment=16):
    """Two kernels over operands x (uid 1, 2-d f32) and y (uid 2, 1-d i32) and a workspace region."""
    layout = PackLayout([TensorSpec(1, (4, 8), "float32", strides=(8, 1), name="x"),
                         TensorSpec(2, (5,), "int32", strides=(1,), name="y")])
    x = _c_launch.OperandRef(1, "x", "float32", (4, 8), (8, 1))
    y = _c_launch.OperandRef(2, "y", "int32", (5,), (1,))
    region = _c_launch.RegionRef("scratch", 512, "float32", (3, 16))
    operands = []

    def index(ref):
        if ref.uid not in [u for u, _, _ in operands]:
            operands.append((ref.uid, alignment, ref.name))
        return [u for u, _, _ in operands].index(ref.uid)

    rows = []
    for args in ((x, 7, region), (region, y, x)):
        params = _abi.ParamLayout.of([len(a.shape) if not isinstance(a, int) else None for a in args])
        image, patches = _c_launch.parameter_image(params, args, index)
        rows.append((0, (2, 1, 1), image, params.offsets, patches))
    blocks = {}

    def workspaces(stream):
        blocks.setdefault(stream, 0x7000_0000 + 0x1000 * len(blocks))
        return blocks[stream], list(blocks.items())

    return TileLaunch.create(layout, rows, operands, workspaces, 0, None), rows


def test_the_parameter_layout_places_each_field_at_c_alignment():
    layout = _abi.ParamLayout.of([2, None, 1, 3])
    want = [(0, 8), (8, 4), (12, 4), (16, 4), (20, 4),          # x: address, 2 extents, 2 strides
            (24, 8), (32, 4), (36, 4),                          # y (the constant takes nothing)
            (40, 8)] + [(48 + 4 * i, 4) for i in range(6)]      # z
    assert [(f.offset, f.size) for f in layout.fields] == want
    assert layout.size == 72


def test_each_call_writes_the_operand_and_workspace_addresses_at_their_offsets():
    launch, rows = _fake_launch()
    first, second = launch.packed_parameters({1: 0x1000_0000, 2: 0x2000_0010}, stream=0)
    # kernel 0: x (address at 0, extents 4, 8, strides 8, 1), then the region (workspace + 512)
    assert struct.unpack_from("<Q5i", first, 0)[:5] == (0x1000_0000, 4, 8, 8, 1)
    assert struct.unpack_from("<Q", first, 24)[0] == 0x7000_0000 + 512
    assert struct.unpack_from("<4i", first, 32) == (3, 16, 16, 1)
    # kernel 1: region, y, x
    assert struct.unpack_from("<Q", second, 0)[0] == 0x7000_0000 + 512
    assert struct.unpack_from("<Qii", second, 24) == (0x2000_0010, 5, 1)
    assert struct.unpack_from("<Q", second, 40)[0] == 0x1000_0000
    # the next call's addresses replace them; the prebuilt extents stay
    again = launch.packed_parameters({1: 0x3000_0000, 2: 0x4000_0000}, stream=0)[0]
    assert struct.unpack_from("<Q4i", again, 0) == (0x3000_0000, 4, 8, 8, 1)
    assert rows[0][2][:8] == bytes(8)              # the template itself is never written


def test_each_stream_gets_its_own_workspace_block():
    launch, _ = _fake_launch()
    a = launch.packed_parameters({1: 0x1000_0000, 2: 0x2000_0000}, stream=0)[0]
    b = launch.packed_parameters({1: 0x1000_0000, 2: 0x2000_0000}, stream=12345)[0]
    assert struct.unpack_from("<Q", a, 24)[0] != struct.unpack_from("<Q", b, 24)[0]


def test_a_misaligned_operand_is_refused_naming_the_tensor():
    launch, _ = _fake_launch()
    with pytest.raises(AlignmentError) as info:
        launch.packed_parameters({1: 0x1000_0004, 2: 0x2000_0000}, stream=0)
    assert info.value.tensor_name == "x" and info.value.uid == 1
    assert "0x10000004" in str(info.value) and "16 bytes" in str(info.value)


def test_the_mapping_is_checked_as_execute_checks_it():
    launch, _ = _fake_launch()
    with pytest.raises(Exception) as info:            # y missing: pack_into's own error
        launch.packed_parameters({1: 0x1000_0000}, stream=0)
    assert "y" in str(info.value)


def test_malformed_kernel_rows_are_refused():
    layout = PackLayout([TensorSpec(1, (4,), "float32", strides=(1,), name="x")])
    with pytest.raises(InvalidArgumentError):
        TileLaunch.create(layout, [(0, (1, 1, 1), bytes(16), [0, 20], [])], [], None, 0, None)
    with pytest.raises(InvalidArgumentError):
        TileLaunch.create(layout, [(0, (1, 1, 1), bytes(16), [0], [(4, 0, 0)])], [(1, 16, "x")], None, 0, None)
    with pytest.raises(InvalidArgumentError):
        TileLaunch.create(layout, [(0, (0, 1, 1), bytes(16), [0], [])], [], None, 0, None)


def test_a_kernel_may_take_shared_memory_past_48_kb_up_to_what_sm_90_allows():
    layout = PackLayout([TensorSpec(1, (4,), "float32", strides=(1,), name="x")])
    TileLaunch.create(layout, [(0, (1, 1, 1), bytes(16), [0], [], (256, 1, 1), 53 * 1024)], [], None, 0, None)
    with pytest.raises(InvalidArgumentError, match="kernel 0 shared bytes.*232448.*kernel_allow_shared"):
        TileLaunch.create(layout, [(0, (1, 1, 1), bytes(16), [0], [], (256, 1, 1), 240 * 1024)], [], None, 0, None)


def test_a_cubin_table_that_differs_from_the_layout_is_a_mismatch():
    layout = _abi.ParamLayout.of([1])
    good = _abi.CubinKernel("k", tuple(_abi.CubinParam(i, f.offset, f.size) for i, f in enumerate(layout.fields)),
                            layout.size, (128, 1, 1))
    layout.check_against(good)
    wide = _abi.CubinKernel("k", (_abi.CubinParam(0, 0, 8), _abi.CubinParam(1, 8, 8), _abi.CubinParam(2, 16, 8)),
                            24, None)
    with pytest.raises(_abi.AbiMismatchError, match="cubin's parameters"):
        layout.check_against(wide)


# ---------------------------------------------------------------------------- the ABI pin (toolchain)

def _plan(cg, op, monkeypatch, label=None, checkpoints=False):
    """A built cuTile plan of a small gdn / gdn_bwd / gdn2_bwd graph (T=64, H=2, K=V=64) and the graph's
    layout, with no GPU (the device query is stubbed): the first proposed, or the one named ``label``
    (``checkpoints``: the forward writes state_checkpoints, the backward reads them, at 64 tokens)."""
    from cudnn_graph.engines.base import ExecutionContext
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    from cudnn_graph.engines.cutile import engine as cutile_engine
    monkeypatch.setattr(cutile_engine, "_compute_capability", lambda ordinal: (9, 0))
    g = _graph(cg, op, checkpoints=checkpoints)
    engine = CutileLinearAttentionEngine()
    engine.missing = None
    config = next(p for p in engine.propose_plans(g) if label in (None, p.label))
    plan = engine.build_plan(g, config, ExecutionContext())
    return plan, g._layout_for(engine)


def _graph(cg, op, T=64, H=2, K=64, V=64, checkpoints=False):
    F = cg.data_type
    g = cg.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cuda")
    t = {n: g.tensor(name=n, dim=[T, H, K if n != "v" else V], stride=[H * (K if n != "v" else V),
                                                                     K if n != "v" else V, 1])
         for n in ("q", "k", "v")}
    cu = g.tensor(name="cu_seqlens", dim=[2], stride=[1], data_type=F.INT32)
    if op == "gdn2_bwd":                   # per-channel gate and beta, the write gate w
        gate = g.tensor(name="g", dim=[T, H, K], stride=[H * K, K, 1], data_type=F.FLOAT)
        beta = g.tensor(name="beta", dim=[T, H, K], stride=[H * K, K, 1])
        writes = [g.tensor(name="w", dim=[T, H, V], stride=[H * V, V, 1])]
    else:
        gate = g.tensor(name="g", dim=[T, H], stride=[H, 1], data_type=F.FLOAT)
        beta = g.tensor(name="beta", dim=[T, H], stride=[H, 1])
        writes = []
    every = {"checkpoint_every_n_tokens": 64} if checkpoints else {}
    if op == "gdn":
        o, _, states = g.gdn(t["q"], t["k"], t["v"], gate, beta, cu_seqlens=cu, **every)
        o.set_output(True)
        if states is not None:
            states.set_output(True)
    else:
        do = g.tensor(name="dO", dim=[T, H, V], stride=[H * V, V, 1])
        if checkpoints:
            every["state_checkpoints"] = g.tensor(name="state_checkpoints", dim=[T // 64 + 1, H, K, V],
                                                  stride=[H * K * V, K * V, V, 1])
        for out in getattr(g, op)(t["q"], t["k"], t["v"], gate, beta, *writes, do, cu_seqlens=cu, **every):
            if out is not None:
                out.set_output(True)
    g.validate()
    return g


@needs_cutile
@pytest.mark.parametrize("op", ["gdn", "gdn_bwd", "gdn2_bwd"])
def test_every_kernel_of_a_plan_has_the_parameter_layout_the_packer_writes(op, monkeypatch):
    import cudnn_graph as cg
    plan, layout = _plan(cg, op, monkeypatch)
    prepared = plan.launch_plan(layout)              # compiles for sm_90 and checks every cubin's table
    assert prepared is not None, "the plan fell back to the Python launch path (see the log)"
    for k in prepared.kernels:
        table = _abi.cubin_parameters(k.cubin, k.symbol)
        assert [(p.offset, p.size) for p in table.params] == [(f.offset, f.size) for f in k.layout.fields]
        assert table.size >= k.layout.size          # the tail is the driver's (tile hooks)
        assert table.block is not None and table.block[0] >= 32   # the driver's block, not the launch's
    description = plan.launch_description(layout)
    first = description["kernels"][0]
    assert first["block"] == [1, 1, 1] and first["cubin"][:4] == b"\x7fELF"
    assert {a["operand_uid"] for k in description["kernels"] for a in k["addresses"]} - {None} == \
        {u["uid"] for u in description["operands"]}


@needs_cutile
@pytest.mark.parametrize("suffix", ["cute_all", "cute_all_io", "cute_all_io_all", "cute_all_io_all_w8",
                                    "cute_all_io_all_w8_values_w8_bv64"])
def test_the_all_cute_backward_launches_the_prepare_that_leaves_t_and_the_values_kernel_that_reads_it(suffix,
                                                                                                  monkeypatch):
    # values="cute": both CuTe launches replace the recompute's prepare and chunk_bwd_values, or neither does;
    # with scratch="io" the recompute's state pass is CuTe too (the input type's scratch has no cuTile reader)
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import cudnn_graph as cg
    plan, layout = _plan(cg, "gdn_bwd", monkeypatch, label=f"cutile_gdn_bwd_chunk64_{suffix}")
    prepared = plan.launch_plan(layout)
    assert prepared is not None, "the plan fell back to the Python launch path (see the log)"
    kernels = {k.name: k.symbol for k in prepared.kernels}
    assert "DeltaPrepareInverse" in kernels["prepare"] and "DeltaBwdValues" in kernels["bwd_values"]
    assert "DeltaBwdGrads" in kernels["bwd_grads"] and "DeltaStatePassReverse" in kernels["bwd_state_pass"]
    assert ("DeltaStatePass_" in kernels["state_pass"]) == (suffix != "cute_all")


@needs_cutile
@pytest.mark.parametrize("label", ["cutile_gdn_bwd_chunk64_cute_all_io_all_w8", "cutile_gdn_bwd_chunk64_cute_all_io",
                                   "cutile_gdn_bwd_chunk64_cute_all_io_all_w8_intra_in_prepare"])
def test_a_backward_from_the_checkpoints_launches_no_state_pass_and_reads_them_as_hs(label, monkeypatch):
    # the forward's state_checkpoints stand for hs: chunk_bwd_values (the deltas' kernel) and chunk_bwd_grads take
    # the operand, the recompute's state pass is gone, and the C path launches it so
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import cudnn_graph as cg
    plan, layout = _plan(cg, "gdn_bwd", monkeypatch, label=label, checkpoints=True)
    assert plan.variant.checkpoints and not plan._f32_twin.variant.checkpoints   # BF16 rows: not the twin's hs
    prepared = plan.launch_plan(layout)
    assert prepared is not None, "the plan fell back to the Python launch path (see the log)"
    kernels = {k.name: k for k in prepared.kernels}
    assert "state_pass" not in kernels and "DeltaBwdValues" in kernels["bwd_values"].symbol
    assert _launches_taking(plan, layout, "state_checkpoints") == {"bwd_values", "bwd_grads"}
    # 16-bit scratch: the values kernel forms U = T (beta v) itself, so the prepare launched writes no u (the one
    # doing chunk_bwd_intra's work too where the plan has it)
    with_u, without_u = plan._prepare_without_u[-1]
    assert ("bwd_intra" in kernels) == (not label.endswith("_intra_in_prepare"))
    assert kernels["prepare"].cubin == without_u._launcher.cubin()[0]
    assert kernels["prepare"].cubin != with_u._launcher.cubin()[0]


@needs_cutile
@pytest.mark.parametrize("label", ["cutile_gdn_chunk64_cute_all_fused", "cutile_gdn_chunk64_cute_all_split"])
def test_a_forward_with_checkpoints_writes_them_from_its_state_pass(label, monkeypatch):
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import cudnn_graph as cg
    plan, layout = _plan(cg, "gdn", monkeypatch, label=label, checkpoints=True)
    assert _launches_taking(plan, layout, "state_checkpoints") == (
        {"state_output"} if label.endswith("fused") else {"state_pass", "output"})


def _launches_taking(plan, layout, operand: str) -> set:
    """The names of the C path's launches that take the graph operand whose name ends with ``operand``."""
    description = plan.launch_description(layout)
    uid = next(u["uid"] for u in description["operands"] if u["name"].endswith(operand))
    return {k["name"] for k in description["kernels"] for a in k["addresses"] if a["operand_uid"] == uid}


@needs_cutile
def test_the_narrow_reverse_pass_launches_sixteen_value_columns_a_cta_and_the_gradient_kernels_keep_theirs(monkeypatch):
    # knob reverse_block_v=16: the C path's record of the reverse pass has V / 16 CTAs a (sequence, head)
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import cudnn_graph as cg
    from cudnn_graph.engines.cutile import _backward
    monkeypatch.setattr(_backward, "REVERSE_NARROW_GPU_TESTED", True)
    label = "cutile_gdn_bwd_chunk64_cute_all_io_all_w8_tile_pass_bv8_rev16"
    plan, layout = _plan(cg, "gdn_bwd", monkeypatch, label=label)
    prepared = plan.launch_plan(layout)
    assert prepared is not None, "the plan fell back to the Python launch path (see the log)"
    kernels = {k.name: k for k in prepared.kernels}
    assert "DeltaStatePassReverse" in kernels["bwd_state_pass"].symbol
    assert kernels["bwd_state_pass"].grid == (1, 2, 64 // 16)            # one sequence, two heads, V = 64
    assert plan._reverse_grid == kernels["bwd_state_pass"].grid and plan.variant.block_v == 32


@needs_cutile
def test_the_prepare_that_does_the_intra_work_takes_the_intra_launchs_place(monkeypatch):
    # intra_in_prepare: one launch (DeltaPrepareInverseIntra) writes T, qg and P; no chunk_bwd_intra launch
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import cudnn_graph as cg
    plan, layout = _plan(cg, "gdn_bwd", monkeypatch, label="cutile_gdn_bwd_chunk64_cute_all_io_all_w8_intra_in_prepare")
    prepared = plan.launch_plan(layout)
    assert prepared is not None, "the plan fell back to the Python launch path (see the log)"
    kernels = {k.name: k.symbol for k in prepared.kernels}
    assert "DeltaPrepareInverseIntra" in kernels["prepare"] and "bwd_intra" not in kernels
    assert "DeltaBwdValues" in kernels["bwd_values"] and "DeltaStatePassReverse" in kernels["bwd_state_pass"]


@needs_cutile
def test_a_buffer_the_16_bit_scratch_backward_refuses_runs_on_its_f32_twin(monkeypatch):
    # scratch="io": no cuTile kernel of the backward reads 16-bit scratch, so where a CuTe kernel refuses a
    # buffer (here q, 2 bytes off the 16-byte alignment it was compiled for) the same kernels on f32 scratch run
    # the call, in the same workspace (sized for both); the C path is not built for such a call
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import cudnn_graph as cg
    from cudnn_graph import Slot
    from cudnn_graph.engines.cutile import _c_launch
    from cudnn_graph.engines.cutile._backward import IoScratchRefused
    plan, _ = _plan(cg, "gdn_bwd", monkeypatch, label="cutile_gdn_bwd_chunk64_cute_all_io")
    g = _graph(cg, "gdn_bwd")
    node = g.nodes[0]
    names = {cg.data_type.BFLOAT16: "bfloat16", cg.data_type.FLOAT: "float32", cg.data_type.INT32: "int32"}
    tensors = {port: t for port, t in {**node.inputs, **node.outputs}.items() if t is not None}

    def slots(offset_of_q):
        return {port: Slot.from_address(0x7F0000000000 + i * 0x100000 + (offset_of_q if port == "q" else 0),
                                        tuple(t.dim), None, names[g.view.data_type(t)], "cuda:0")
                for i, (port, t) in enumerate(tensors.items())}

    def scratch_types(launches):
        """The element types of the workspace buffers the launches pass."""
        return {a.dtype for _, _, _, args in launches for a in args
                if getattr(a, "data_ptr", 0) >= base and a.data_ptr < base + plan.workspace_size}

    base = 0x7E0000000000
    aligned = plan._launches_at(slots(0).__getitem__, base)
    kernels = [kernel for _, _, kernel, _ in aligned]
    assert any("values" in getattr(getattr(k, "_launcher", None), "name", "") for k in kernels)
    assert "bfloat16" in scratch_types(aligned)
    with pytest.raises(IoScratchRefused, match="the CuTe bwd_intra launch refuses"):
        plan._launch_list(slots(2).__getitem__, plan._regions(base))
    assert issubclass(IoScratchRefused, _c_launch.Unsupported)      # the C path stays off for such a call
    misaligned = plan._launches_at(slots(2).__getitem__, base)
    assert scratch_types(misaligned) == {"float32"}
    assert [name for name, *_ in misaligned] == [name for name, *_ in aligned]
    regions = plan._f32_twin._geometry.regions
    assert max(offset for offset, _ in regions.values()) < plan.workspace_size == plan.plan.workspace_size


@needs_cutile
def test_a_plan_exports_the_launch_records_a_blob_carries_for_the_c_runtime(monkeypatch):
    """export_launch: one calling-convention-2 record per launch_description kernel, in launch order, that
    pack into a blob (format version 4) and read back equal, checked against the plan's tensor table."""
    import cudnn_graph as cg
    from cudnn_graph._plan_blob import PlanHeader, TensorRecord, pack_blob, unpack_blob
    from cudnn_graph._plan_launch import CONVENTION_CUTILE_PARAMS
    plan, layout = _plan(cg, "gdn", monkeypatch)
    assert plan.export_launch(None) == ()            # no layout yet: the plan was not built by a graph
    plan.layout = layout
    records = plan.export_launch(None)
    description = plan.launch_description(layout)
    assert len(records) == len(description["kernels"]) >= 3
    uids = {o["uid"] for o in description["operands"]}
    for record, k in zip(records, description["kernels"]):
        t = record.tile
        assert record.convention == CONVENTION_CUTILE_PARAMS and record.entry_symbol == k["symbol"]
        assert record.code == k["cubin"] and t.image == k["param_image"] and t.grid == tuple(k["grid"])
        assert [o for o, _ in t.parameters] == k["param_offsets"] and t.block == (1, 1, 1) and t.shared_bytes == 0
        assert sum(size for _, size in t.parameters) <= k["param_size"]
        assert [(a.offset, a.uid, a.add) for a in t.addresses] == \
            [(a["offset"], a["operand_uid"], a["add"]) for a in k["addresses"]]
        assert {a.uid for a in t.addresses} - {None} <= uids and all(a.alignment == 16 for a in t.addresses)
        assert t.workspace_size == description["workspace_size"] == plan.workspace_size
    tensors = [TensorRecord(s.uid, s.name or "", 0, tuple(s.shape), tuple(s.strides or (0,) * len(s.shape)), False,
                            False, 16) for s in layout.specs]
    blob = pack_blob(PlanHeader(1, 0, 90, 3, 20200, plan.workspace_size), tensors, {}, (), records)
    read = unpack_blob(blob)
    assert read.header.format_version == 4 and read.dsl_launch == records


# ------------------------------------------------------------------------------------- GPU: bitwise

def _host_inputs(op, T=64, H=2, K=64, V=64, seed=0):
    import ml_dtypes
    rng = np.random.default_rng(seed)
    bf = ml_dtypes.bfloat16
    per_channel = op.startswith(("kda", "gdn2"))
    gdn2 = op.startswith("gdn2")
    d = {"q": rng.standard_normal((T, H, K)).astype(bf), "k": (rng.standard_normal((T, H, K)) / 8).astype(bf),
         "v": rng.standard_normal((T, H, V)).astype(bf),
         "g": (-rng.uniform(0.02, 0.5, (T, H, K) if per_channel else (T, H))).astype(np.float32),
         "beta": rng.uniform(0.2, 0.9, (T, H, K) if gdn2 else (T, H)).astype(bf),
         "cu_seqlens": np.array([0, 20, T], np.int32),
         "initial_state": rng.standard_normal((2, H, K, V)).astype(np.float32)}
    if gdn2:
        d["w"] = rng.uniform(0.2, 1.2, (T, H, V)).astype(bf)
    if op.endswith("_bwd"):
        d["dO"] = rng.standard_normal((T, H, V)).astype(bf)
    return d


def _builder(op, host, plan=None):
    import cudnn_graph as cg
    from test_cutile_linear_attention import prefer_plan
    F = cg.data_type
    types = {"g": F.FLOAT, "cu_seqlens": F.INT32, "initial_state": F.FLOAT}
    if op.endswith("_bwd"):
        names = ["dq", "dk", "dv", "dg", "dbeta"] + (["dw"] if "w" in host else []) + ["d_initial_state"]
    else:
        names = ["o", "final_state"]

    def builder(device):
        router = prefer_plan(plan) if plan and device == "cuda" else None
        g = cg.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device=device, router=router)
        t = {n: g.tensor(name=n, dim=list(a.shape), stride=[s // a.itemsize for s in a.strides],
                         data_type=types.get(n, F.BFLOAT16)) for n, a in host.items()}
        if op.endswith("_bwd"):
            positional = [t[p] for p in ("q", "k", "v", "g", "beta", "w") if p in t]
            outs = getattr(g, op)(*positional, t["dO"], cu_seqlens=t["cu_seqlens"],
                                  initial_state=t["initial_state"], use_qk_l2norm=True)
        else:
            outs = getattr(g, op)(t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=t["cu_seqlens"],
                                  initial_state=t["initial_state"], output_final_state=True, use_qk_l2norm=True)
        for name, tensor in zip(names, outs):
            tensor.set_output(True)
            t[name] = tensor
        return g, t
    return builder, names


def _run(op, c_launch, monkeypatch, executes=2, plan=None):
    """Outputs (host bytes) after ``executes`` executes (of ``plan`` when given, else the engine's first),
    and the graph's fast executor."""
    cp = pytest.importorskip("cupy")
    import gpu_support
    from cudnn_graph.engines.cutile import engine as cutile_engine
    monkeypatch.setattr(cutile_engine, "C_LAUNCH", c_launch)
    host = _host_inputs(op)
    builder, out_names = _builder(op, host, plan)
    g, t = gpu_support.build_gpu(builder)
    assert g.selected_plan.engine_id == 20_200, g.selected_plan
    assert plan is None or g.selected_plan.label == plan, g.selected_plan
    pack, keep, outs = gpu_support.device_pack(cp, g, t, host, out_names)
    results = []
    for _ in range(executes):
        for dev, _ in outs.values():
            dev.fill(0)
        g.execute(pack)
        cp.cuda.Device().synchronize()
        results.append({n: cp.asnumpy(d).tobytes() for n, (d, _) in outs.items()})
    return results, g.fast_executor


@pytest.mark.gpu
@pytest.mark.parametrize("op, plan", [("gdn", None), ("kda", None), ("gdn_bwd", None), ("gdn2_bwd", None),
                                      # the eight-warp CuTe state pass: a block of 256 in the C launch record
                                      ("gdn", "cutile_gdn_chunk64_cute_all_bv64"),
                                      ("kda", "cutile_kda_chunk64_cute_all_bv64"),
                                      # the resident CuTe state pass
                                      ("gdn", "cutile_gdn_chunk64_cute_all_resident"),
                                      ("kda", "cutile_kda_chunk64_cute_all_resident"),
                                      # the warpgroup CuTe state pass (WGMMA)
                                      ("gdn", "cutile_gdn_chunk64_cute_all_wg"),
                                      ("kda", "cutile_kda_chunk64_cute_all_wg"),
                                      # the split CuTe state pass: 53 KB of shared memory, opted in at load
                                      ("gdn", "cutile_gdn_chunk64_cute_all_split"),
                                      ("kda", "cutile_kda_chunk64_cute_all_split"),
                                      # the fused CuTe state pass (a scores launch, then o from the state pass)
                                      ("gdn", "cutile_gdn_chunk64_cute_all_fused"),
                                      ("kda", "cutile_kda_chunk64_cute_all_fused"),
                                      # gdn's prepare forming the scores (no scores launch)
                                      ("gdn", "cutile_gdn_chunk64_cute_all_fused_prepare_scores"),
                                      # every CuTe backward kernel (the prepare leaving T, chunk_bwd_values)
                                      ("gdn_bwd", "cutile_gdn_bwd_chunk64_cute_all"),
                                      ("gdn_bwd", "cutile_gdn_bwd_chunk64_cute_all_io"),
                                      ("kda_bwd", "cutile_kda_bwd_chunk64_cute_all"),
                                      ("kda_bwd", "cutile_kda_bwd_chunk64_cute_all_io"),
                                      # and the backward's own scratch in 16 bits too
                                      ("gdn_bwd", "cutile_gdn_bwd_chunk64_cute_all_io_all"),
                                      ("kda_bwd", "cutile_kda_bwd_chunk64_cute_all_io_all"),
                                      # chunk_bwd_grads in eight-warp CTAs
                                      ("gdn_bwd", "cutile_gdn_bwd_chunk64_cute_all_io_all_w8"),
                                      ("kda_bwd", "cutile_kda_bwd_chunk64_cute_all_io_all_w8"),
                                      # chunk_bwd_values in eight warps too; the state passes 64 columns a CTA
                                      ("gdn_bwd", "cutile_gdn_bwd_chunk64_cute_all_io_all_w8_values_w8"),
                                      ("kda_bwd", "cutile_kda_bwd_chunk64_cute_all_io_all_w8_values_w8_bv64"),
                                      # the recompute's cuTile state pass over 8 / 16 columns on 16-bit scratch
                                      ("gdn_bwd", "cutile_gdn_bwd_chunk64_cute_all_io_all_w8_tile_pass_bv8"),
                                      ("kda_bwd", "cutile_kda_bwd_chunk64_cute_all_io_all_w8_tile_pass_bv16"),
                                      # the prepare doing chunk_bwd_intra's work
                                      ("gdn_bwd", "cutile_gdn_bwd_chunk64_cute_all_io_all_w8_intra_in_prepare"),
                                      ("kda_bwd", "cutile_kda_bwd_chunk64_cute_all_io_all_w8_intra_in_prepare")])
def test_the_c_path_is_bitwise_the_python_path(op, plan, monkeypatch):
    from cudnn_graph.engines.manifest import engines
    engine = next((e for e in engines() if e.name == "cutile_linear_attention"), None)
    if engine is None or engine.missing is not None:
        pytest.skip("the cuTile engine is absent")
    if plan is not None and not any(p.label == plan for p in _proposals(engine, op)):
        pytest.skip(f"{plan} is not proposed here (the CuTe kernels need sm_90 and the DSL)")
    python_runs, executor = _run(op, False, monkeypatch, plan=plan)
    assert executor is False, executor
    c_runs, executor = _run(op, True, monkeypatch, plan=plan)
    assert type(getattr(executor, "__self__", None)).__name__ == "TileLaunch", executor
    want = python_runs[0]
    for i, got in enumerate(c_runs):                 # the first execute, then the fast executor's
        for name in want:
            same = got[name] == want[name]
            assert same, f"{op} {name}: execute {i + 1} on the C path differs from the Python path"
    assert python_runs[1] == want                    # and the Python path is itself deterministic


def _proposals(engine, op):
    """The engine's plans for this file's small graph of ``op`` on the GPU."""
    builder, _ = _builder(op, _host_inputs(op))
    g, _ = builder("cuda")
    g.validate()
    return engine.propose_plans(g)
