"""gdn's and kda's chunk_cache on the GPU: a forward that keeps it (its prepare writes the gate sums, w, kd and T there)
gives the same o and checkpoints as one that does not, and the backward from the checkpoints given it runs no
prepare and gives the same gradients, bit for bit, as the backward that forms those factors again (the two
prepares are one code), on the C launch path and the Python one.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cudnn = pytest.importorskip("cudnn_graph")
from gpu_support import gpu_run, reference_run  # noqa: E402
from test_cutile_linear_attention import BIG, BWD_TOLERANCE, SMALL, prefer_plan  # noqa: E402
from test_cutile_linear_attention_gva_gates import _require_engine, make_inputs  # noqa: E402

F = cudnn.data_type
EVERY = 64
FORWARD_OUTPUTS = ("o", "state_checkpoints")
GRADIENTS = ("dq", "dk", "dv", "dg", "dbeta", "d_initial_state", "d_a_log", "d_dt_bias")


def _types(host):
    np_types = {np.dtype(np.float32): F.FLOAT, np.dtype(np.float16): F.HALF, np.dtype(np.uint8): F.UINT8,
                np.dtype(np.int32): F.INT32}
    return {name: np_types.get(a.dtype, F.BFLOAT16) for name, a in host.items()}


def _tensors(g, host):
    types = _types(host)
    return {name: g.tensor(name=name, dim=list(a.shape), stride=[s // a.itemsize for s in a.strides],
                           data_type=types[name]) for name, a in host.items()}


def forward_builder(op, host, attrs, cache: bool, plan=None):
    def builder(device):
        router = prefer_plan(plan) if plan and device == "cuda" else None
        g = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device=device, router=router)
        t = _tensors(g, host)
        keep = g.tensor(name="chunk_cache") if cache else None
        o, _, checkpoints = getattr(g, op)(t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=t["cu_seqlens"],
                                           initial_state=t["initial_state"], a_log=t.get("a_log"),
                                           dt_bias=t.get("dt_bias"), use_qk_l2norm=True,
                                           checkpoint_every_n_tokens=EVERY, chunk_cache=keep, **attrs)
        t["o"], t["state_checkpoints"] = o.set_output(True), checkpoints.set_output(True)
        if cache:
            t["chunk_cache"] = keep.set_output(True)
        return g, t
    return builder


def backward_builder(op, host, attrs, plan=None):
    def builder(device):
        router = prefer_plan(plan) if plan and device == "cuda" else None
        g = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device=device, router=router)
        t = _tensors(g, host)
        outs = getattr(g, op + "_bwd")(t["q"], t["k"], t["v"], t["g"], t["beta"], t["dO"], cu_seqlens=t["cu_seqlens"],
                                       initial_state=t["initial_state"], d_final_state=t["d_final_state"],
                                       a_log=t.get("a_log"), dt_bias=t.get("dt_bias"),
                                       state_checkpoints=t["state_checkpoints"], chunk_cache=t.get("chunk_cache"),
                                       checkpoint_every_n_tokens=EVERY, use_qk_l2norm=True, **attrs)
        for name, tensor in zip(GRADIENTS, outs):
            if tensor is not None:
                t[name] = tensor.set_output(True)
        return g, t
    return builder


def _bits_differ(a, b) -> list:
    return [name for name in a if not np.array_equal(np.asarray(a[name]).view(np.uint8),
                                                     np.asarray(b[name]).view(np.uint8))]


def _python_path_run(graph, t, host, outs):
    """The built graph once more through its Python launch path (a launch hook switches the C path off):
    (outputs on the host, the launches' names)."""
    cp = pytest.importorskip("cupy")
    import ml_dtypes
    keep, pack, result = [], {}, {}

    def device(a):
        raw = np.ascontiguousarray(a)
        dev = cp.asarray(raw.view(np.uint16) if raw.dtype.name == "bfloat16" else raw)
        keep.append(dev)
        return cudnn.Slot.from_address(dev.data.ptr, a.shape, None, a.dtype.name, ("cuda", 0)), dev

    for name, a in host.items():
        if name in t:
            pack[t[name]] = device(a)[0]
    numpy_types = {F.BFLOAT16: ml_dtypes.bfloat16, F.HALF: np.float16, F.UINT8: np.uint8}
    for name in outs:
        dtype = numpy_types.get(graph.view.data_type(t[name]), np.float32)
        pack[t[name]], result[name] = device(np.zeros(t[name].dim, dtype))
    compiled, names = graph.compiled_plan(), []

    def hook(name, launch):
        names.append(name)
        launch()
    compiled.launch_hook = hook
    try:
        graph.execute(pack)
    finally:
        compiled.launch_hook = None
    cp.cuda.Device().synchronize()
    got = {}
    for name, dev in result.items():
        raw = cp.asnumpy(dev)
        got[name] = raw.view(ml_dtypes.bfloat16) if graph.view.data_type(t[name]) == F.BFLOAT16 else raw
    return got, names


def _pair(op, cu, *, H, HV, K, V, seed, attrs, plan=None, dtype="bfloat16"):
    """The forward with and without the cache, then the backward from the checkpoints with and without it:
    (forward with, forward without, backward with, backward without, the backward's graph and tensors, host)."""
    import ml_dtypes
    _require_engine()
    io_np = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    host = make_inputs(op, cu, H=H, HV=HV, K=K, V=V, io_np=io_np, seed=seed, attrs=attrs)
    host.pop("dO", None)
    kept, graph = gpu_run(forward_builder(op, host, attrs, True, plan), host, FORWARD_OUTPUTS + ("chunk_cache",))
    assert graph.selected_plan.engine_id == 20_200 and (not plan or graph.selected_plan.label == plan), \
        graph.selected_plan
    plain, _ = gpu_run(forward_builder(op, host, attrs, False, plan), host, FORWARD_OUTPUTS)
    rng = np.random.default_rng(seed + 1)
    T, N = cu[-1], len(cu) - 1
    bwd_host = dict(host, dO=rng.standard_normal((T, HV, V)).astype(io_np),
                    d_final_state=rng.standard_normal((N, HV, K, V)).astype(np.float32),
                    state_checkpoints=np.ascontiguousarray(kept["state_checkpoints"]))
    outs = [name for name in GRADIENTS if not name.startswith("d_") or name[2:] in host]
    with_cache = dict(bwd_host, chunk_cache=np.ascontiguousarray(kept["chunk_cache"]))
    got, bwd_graph = gpu_run(backward_builder(op, with_cache, attrs), with_cache, outs)
    again, _ = gpu_run(backward_builder(op, bwd_host, attrs), bwd_host, outs)
    return kept, plain, got, again, bwd_graph, with_cache, outs


CASES = {"small_k64": dict(cu=SMALL, H=2, HV=2, K=64, V=64),
         "t8192_h16_k128": dict(cu=BIG, H=16, HV=16, K=128, V=128),
         "gva_gates": dict(cu=SMALL, H=2, HV=4, K=64, V=64),
         "fp16_k128": dict(cu=SMALL, H=2, HV=2, K=128, V=128, dtype="float16")}


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_backward_from_the_chunk_cache_gives_the_recomputes_bits_and_runs_no_prepare(op, case):
    shape = CASES[case]
    attrs = dict(safe_gate=True, use_beta_sigmoid=True) if case == "gva_gates" else {}
    dtype = shape.get("dtype", "bfloat16")
    from cudnn_graph.engines.cutile.engine import FLOAT16_BACKWARD_GPU_TESTED
    if dtype == "float16" and not FLOAT16_BACKWARD_GPU_TESTED:
        pytest.skip("FP16's backward reads the cache on its 16-bit scratch plans, ranked first only once "
                    "engine.FLOAT16_BACKWARD_GPU_TESTED is set")
    kept, plain, got, again, graph, host, outs = _pair(op, shape["cu"], H=shape["H"], HV=shape["HV"], K=shape["K"],
                                                       V=shape["V"], seed=21, attrs=attrs, dtype=dtype)
    print(f"{op} {case}: backward {graph.selected_plan.label}, chunk_cache {kept['chunk_cache'].nbytes} bytes")
    assert _bits_differ({k: kept[k] for k in FORWARD_OUTPUTS}, plain) == []
    assert _bits_differ(got, again) == [], "the backward from the cache differs from the recompute's"
    want = reference_run(backward_builder(op, host, attrs), host, outs)
    errors = {name: float(np.max(np.abs(np.asarray(got[name], np.float64) - want[name])))
              / max(1.0, float(np.max(np.abs(want[name])))) for name in outs}
    print("  against the reference: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    assert max(errors.values()) <= BWD_TOLERANCE[dtype], errors
    # the Python launch path: no prepare, the same bits as the C path's
    g, t = backward_builder(op, host, attrs)("cuda")
    g.build([cudnn.heur_mode.A])
    python_path, launched = _python_path_run(g, t, host, outs)
    assert "prepare" not in launched and "state_pass" not in launched and "bwd_values" in launched, launched
    assert _bits_differ(python_path, got) == []


@pytest.mark.parametrize("op, plan", [("gdn", "cute_bv16"), ("gdn", "cute_all_fused_prepare_scores"),
                                      ("kda", "cute_all_fused")])
def test_each_kind_of_forward_prepare_keeps_the_cache_the_backward_reads(op, plan):
    """The plain CuTe prepare (a cuTile state pass reading the cache's w, kd and gate sums), gdn's fused plan's
    prepare that forms the scores too, and kda's (its scores a launch of their own, reading the cache's gate
    sums); the forward's Python path writes the C path's bits."""
    plan = f"cutile_{op}_chunk64_{plan}"
    kept, plain, got, again, _, host, _ = _pair(op, SMALL, H=2, HV=2, K=64, V=64, seed=31, attrs={}, plan=plan)
    assert _bits_differ({k: kept[k] for k in FORWARD_OUTPUTS}, plain) == []
    assert _bits_differ(got, again) == []
    g, t = forward_builder(op, {k: v for k, v in host.items() if k in ("q", "k", "v", "g", "beta", "cu_seqlens",
                                                                       "initial_state")}, {}, True, plan)("cuda")
    g.build([cudnn.heur_mode.A])
    python_path, launched = _python_path_run(g, t, host, FORWARD_OUTPUTS + ("chunk_cache",))
    assert launched[0] == "prepare", launched
    # the cache's bytes past what the kernels write (padding rows, chunks no sequence reaches) are not compared
    assert _bits_differ({k: python_path[k] for k in FORWARD_OUTPUTS}, {k: kept[k] for k in FORWARD_OUTPUTS}) == []


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_only_plans_that_can_write_the_cache_are_proposed(op):
    """The plans whose prepare is the cuTile kernel or whose scratch is f32 store no T and keep w and kd in
    another type: a forward asked for the cache is not offered them."""
    import ml_dtypes
    _require_engine()
    host = make_inputs(op, SMALL, H=2, HV=2, K=64, V=64, io_np=ml_dtypes.bfloat16, seed=3, attrs={})
    host.pop("dO", None)
    g, _ = forward_builder(op, host, {}, True)("cuda")
    g.build([cudnn.heur_mode.A])
    labels = [p.label for p in g.plans]
    assert labels and all("cute" in label for label in labels), labels
    assert not any(label.endswith(("_f32_scratch", "_chunk64")) for label in labels), labels
