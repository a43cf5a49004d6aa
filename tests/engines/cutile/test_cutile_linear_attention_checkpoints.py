"""The forward's state_checkpoints on the GPU (checkpoint_every_n_tokens=64: one row a 64-token chunk) and the
backward that starts from them: the plans write the chunk-start states into the caller's buffer, and a
backward given them runs no state pass (chunk_bwd_values forms the deltas), against the reference engine on
the same checkpoints.

Tolerances as test_cutile_linear_attention's: max |error| / max(1, max |reference|) per output.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cudnn = pytest.importorskip("cudnn_graph")
from gpu_support import gpu_run, reference_run  # noqa: E402
from test_cutile_linear_attention import (BIG, BWD_TOLERANCE, SMALL, _require_engine, bwd_outputs,  # noqa: E402
                                          make_inputs, prefer_plan)

F = cudnn.data_type
EVERY = 64
# the checkpoints hold states rounded to their type: BF16 rows of TF32 / BF16 products
CHECKPOINT_TOLERANCE = {"bfloat16": 2e-2, "float32": 1e-2}
O_TOLERANCE = 3e-2


def _relative_error(got, want) -> float:
    ref = np.asarray(want, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - ref))) / max(1.0, float(np.max(np.abs(ref))))


def forward_builder(op, host, plan=None, checkpoint_type=None):
    def builder(device):
        router = prefer_plan(plan) if plan and device == "cuda" else None
        g = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device=device, router=router)
        types = {"g": F.FLOAT, "cu_seqlens": F.INT32, "initial_state": F.FLOAT}
        t = {name: g.tensor(name=name, dim=list(a.shape), stride=[s // a.itemsize for s in a.strides],
                            data_type=types.get(name, F.BFLOAT16)) for name, a in host.items()}
        writes = [t["w"]] if "w" in t else []
        o, _, checkpoints = getattr(g, op)(t["q"], t["k"], t["v"], t["g"], t["beta"], *writes,
                                           cu_seqlens=t["cu_seqlens"], initial_state=t.get("initial_state"),
                                           use_qk_l2norm=True, checkpoint_every_n_tokens=EVERY)
        if checkpoint_type is not None:
            checkpoints.set_data_type(checkpoint_type)
        t["o"], t["state_checkpoints"] = o.set_output(True), checkpoints.set_output(True)
        return g, t
    return builder


def backward_builder(op, host, plan=None, every=EVERY):
    def builder(device):
        router = prefer_plan(plan) if plan and device == "cuda" else None
        g = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device=device, router=router)
        types = {"g": F.FLOAT, "cu_seqlens": F.INT32, "initial_state": F.FLOAT, "d_final_state": F.FLOAT,
                 "state_checkpoints": F.BFLOAT16 if host["state_checkpoints"].dtype.itemsize == 2 else F.FLOAT}
        t = {name: g.tensor(name=name, dim=list(a.shape), stride=[s // a.itemsize for s in a.strides],
                            data_type=types.get(name, F.BFLOAT16)) for name, a in host.items()}
        writes = [t["w"]] if "w" in t else []
        outs = getattr(g, op)(t["q"], t["k"], t["v"], t["g"], t["beta"], *writes, t["dO"], cu_seqlens=t["cu_seqlens"],
                              initial_state=t.get("initial_state"), d_final_state=t.get("d_final_state"),
                              state_checkpoints=t["state_checkpoints"], checkpoint_every_n_tokens=every,
                              use_qk_l2norm=True)
        for name, tensor in zip(bwd_outputs(op, "initial_state" in t), outs):
            t[name] = tensor.set_output(True)
        return g, t
    return builder


def _checkpoint_rows(cu) -> int:
    """The rows the sequences write (ceil(len / 64) each)."""
    return sum(-(-(b - a) // EVERY) for a, b in zip(cu, cu[1:]))


def forward_case(op, cu, *, H=2, K=64, V=64, seed=0, plan=None, checkpoint_type=None):
    """(host inputs, GPU checkpoints, relative errors) of a forward with checkpoints against the reference."""
    import ml_dtypes
    _require_engine()
    host = make_inputs(op, cu, H, K, V, ml_dtypes.bfloat16, seed, True)
    builder = forward_builder(op, host, plan, checkpoint_type)
    want = reference_run(builder, host, ["o", "state_checkpoints"])
    got, graph = gpu_run(builder, host, ["o", "state_checkpoints"])
    assert graph.selected_plan.engine_id == 20_200, graph.selected_plan
    if plan:
        assert graph.selected_plan.label == plan, graph.selected_plan
    rows = _checkpoint_rows(cu)
    errors = {"o": _relative_error(got["o"], want["o"]),
              "state_checkpoints": _relative_error(got["state_checkpoints"][:rows], want["state_checkpoints"][:rows])}
    kind = "float32" if checkpoint_type == F.FLOAT else "bfloat16"
    print(f"{op} K={K} V={V} cu={cu[:3]}..{cu[-1]} H={H} {graph.selected_plan.label} checkpoints {kind}: "
          + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    assert errors["o"] <= O_TOLERANCE and errors["state_checkpoints"] <= CHECKPOINT_TOLERANCE[kind], errors
    return host, got["state_checkpoints"]


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("plan", [None, "split", "cute_all_fused_bv32", "default", "f32_scratch"])
def test_forward_writes_each_chunks_start_state_to_the_checkpoints(op, plan):
    """The first plan, the split CuTe state pass and the fused one (the states to the caller's buffer), the
    cuTile state pass, and FLOAT checkpoints from the f32-scratch plan."""
    names = {"split": f"cutile_{op}_chunk64_cute_all_split", "default": f"cutile_{op}_chunk64",
             "cute_all_fused_bv32": f"cutile_{op}_chunk64_cute_all_fused_bv32",
             "f32_scratch": f"cutile_{op}_chunk64_f32_scratch"}
    forward_case(op, SMALL, seed=3, plan=names.get(plan),
                 checkpoint_type=F.FLOAT if plan == "f32_scratch" else None)


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_forward_checkpoints_at_the_benchmark_shape(op):
    """T = 8192 as 4 x 2048, H = 16, K = V = 128: the fused eight-warp state pass writes them."""
    forward_case(op, BIG, H=16, K=128, V=128, seed=5)


def test_gdn2_forward_and_backward_with_checkpoints_on_the_cutile_kernels():
    """gdn2 (cuTile kernels alone): its state pass writes the checkpoints; its backward, with no CuTe values
    kernel to form the deltas, recomputes the states, and matches the reference from the same checkpoints."""
    import ml_dtypes
    host, checkpoints = forward_case("gdn2", SMALL, seed=11)
    rng = np.random.default_rng(12)
    T, H, V = SMALL[-1], host["v"].shape[1], host["v"].shape[2]
    host = dict(host, dO=rng.standard_normal((T, H, V)).astype(ml_dtypes.bfloat16),
                state_checkpoints=np.ascontiguousarray(checkpoints))
    builder = backward_builder("gdn2_bwd", host)
    outs = bwd_outputs("gdn2_bwd", True)
    want = reference_run(builder, host, outs)
    got, graph = gpu_run(builder, host, outs)
    errors = {name: _relative_error(got[name], want[name]) for name in outs}
    assert max(errors.values()) <= BWD_TOLERANCE["bfloat16"], errors


def _launch_names(graph, pack_run) -> list:
    """The names of the launches the selected plan runs (its Python path, through the launch hook)."""
    compiled = graph.compiled_plan()
    names = []

    def hook(name, launch):
        names.append(name)
        launch()
    compiled.launch_hook = hook
    try:
        pack_run()
    finally:
        compiled.launch_hook = None
    return names


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
@pytest.mark.parametrize("shape, plan", [(dict(cu=SMALL, K=64, V=64), None), (dict(cu=BIG, H=16, K=128, V=128), None),
                                         (dict(cu=SMALL, K=64, V=64), "cute_all_io_all_w8_intra_in_prepare")],
                         ids=["small_k64", "t8192_h16_k128", "small_k64_intra_in_prepare"])
def test_backward_from_the_forwards_checkpoints_runs_no_state_pass(op, shape, plan):
    """The forward's GPU checkpoints into the backward: the first plan (or ``plan``) reads them (no state pass
    launch) and its gradients match the reference engine's from the same checkpoints."""
    cp = pytest.importorskip("cupy")
    import ml_dtypes
    cu = shape["cu"]
    host, checkpoints = forward_case(op[:-4], cu, H=shape.get("H", 2), K=shape["K"], V=shape["V"], seed=7)
    rng = np.random.default_rng(8)
    T, N, H, V = cu[-1], len(cu) - 1, host["v"].shape[1], host["v"].shape[2]
    host = dict(host, dO=rng.standard_normal((T, H, V)).astype(ml_dtypes.bfloat16),
                d_final_state=rng.standard_normal(host["initial_state"].shape).astype(np.float32),
                state_checkpoints=np.ascontiguousarray(checkpoints))
    label = plan and f"cutile_{op}_chunk64_{plan}"
    builder = backward_builder(op, host, label)
    outs = bwd_outputs(op, True)
    want = reference_run(builder, host, outs)
    got, graph = gpu_run(builder, host, outs)
    assert graph.selected_plan.engine_id == 20_200, graph.selected_plan
    assert not plan or graph.selected_plan.label == label, graph.selected_plan
    errors = {name: _relative_error(got[name], want[name]) for name in outs}
    print(f"{op} from checkpoints K={shape['K']} cu={cu[:3]}..{cu[-1]} {graph.selected_plan.label}: "
          + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    assert all(np.all(np.isfinite(got[name])) for name in outs)
    assert max(errors.values()) <= BWD_TOLERANCE["bfloat16"], errors

    # the launches: no state pass (the gradients above came from the checkpoints)
    g, t = builder("cuda")
    g.build([cudnn.heur_mode.A])
    keep = []

    def device(a):
        raw = np.ascontiguousarray(a)
        dev = cp.asarray(raw.view(np.uint16) if raw.dtype.name == "bfloat16" else raw)
        keep.append(dev)
        return cudnn.Slot.from_address(dev.data.ptr, a.shape, None, a.dtype.name, ("cuda", 0))

    pack = {t[name]: device(a) for name, a in host.items()}
    for name in outs:
        dtype = ml_dtypes.bfloat16 if g.view.data_type(t[name]) == F.BFLOAT16 else np.float32
        pack[t[name]] = device(np.zeros(t[name].dim, dtype))
    launched = _launch_names(g, lambda: g.execute(pack))
    cp.cuda.Device().synchronize()
    assert "state_pass" not in launched and "bwd_values" in launched, launched


def test_a_cadence_other_than_the_chunk_leaves_no_gpu_forward_plan_and_says_why():
    import ml_dtypes
    _require_engine()
    host = make_inputs("gdn", SMALL, 2, 64, 64, ml_dtypes.bfloat16, 1, True)

    def builder(device):
        g = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device=device)
        t = {name: g.tensor(name=name, dim=list(a.shape), stride=[s // a.itemsize for s in a.strides],
                            data_type={"g": F.FLOAT, "cu_seqlens": F.INT32, "initial_state": F.FLOAT}.get(
                                name, F.BFLOAT16)) for name, a in host.items()}
        o, _, c = g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=t["cu_seqlens"],
                        checkpoint_every_n_tokens=128)
        o.set_output(True)
        c.set_output(True)
        return g
    g = builder("cuda")
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="n = 64"):
        g.build([cudnn.heur_mode.A])


def test_a_backward_given_checkpoints_of_another_cadence_recomputes_the_states():
    """checkpoint_every_n_tokens=32: the GPU plans cannot take those rows as chunk-start states, so they run the
    state pass; the gradients are the reference's from the same checkpoints (the forward's states)."""
    import ml_dtypes
    _require_engine()
    cu = SMALL
    host = make_inputs("gdn", cu, 2, 64, 64, ml_dtypes.bfloat16, 9, True)
    from cudnn_graph.engines.reference import _kernels_linear_attention as ref
    wide = {k: (np.asarray(v, np.float64) if k != "cu_seqlens" else v) for k, v in host.items()}
    _, _, states = ref.linear_attention_forward(wide, {"use_qk_l2norm": True, "checkpoint_every_n_tokens": 32})
    rng = np.random.default_rng(10)
    host = dict(host, dO=rng.standard_normal((cu[-1], 2, 64)).astype(ml_dtypes.bfloat16),
                state_checkpoints=states.astype(np.float32))
    builder = backward_builder("gdn_bwd", host, every=32)
    outs = bwd_outputs("gdn_bwd", True)
    want = reference_run(builder, host, outs)
    got, graph = gpu_run(builder, host, outs)
    assert graph.selected_plan.engine_id == 20_200, graph.selected_plan
    errors = {name: _relative_error(got[name], want[name]) for name in outs}
    assert max(errors.values()) <= BWD_TOLERANCE["bfloat16"], errors
