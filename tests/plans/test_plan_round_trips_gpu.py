"""GPU plans through serialize() / deserialize() (marked gpu; run on the H200): a cuDNN matmul, conv and SDPA
plan, a CuTe GEMM plan and a cuTile gdn plan each load into a fresh graph whose results are bitwise equal
to the original plan's on the same inputs, with the same engine, knobs and workspace; a cuDNN blob carries
cuDNN's serialized execution plan and loads in a new process."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import _plan_blob, plan_serialization
from cudnn_graph.router import PreferFamily
from gpu_support import _CupyBits, cupy_from_host, empty_like_strided, host_dtype, nhwc, row_major

F = cudnn.data_type
pytestmark = pytest.mark.gpu


def _exotic(np_dtype) -> bool:
    return np.dtype(np_dtype).name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _host_inputs(g, special, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for t in g.get_inputs():
        if t.is_pass_by_value:
            continue
        np_dtype = host_dtype(t.data_type)
        make = special.get(t.name)
        values = make(t.dim) if make else rng.standard_normal(t.dim) * 0.5
        host = empty_like_strided(np_dtype, t.dim, t.stride)
        host[...] = np.asarray(values).astype(np_dtype)
        out[t.name] = host
    return out


def _run(g, host_inputs):
    """Execute ``g`` (keyed by uid) on device copies of ``host_inputs``; returns {output name: raw bytes}."""
    cp = pytest.importorskip("cupy")
    pack, keep, outs = {}, [], {}
    for name, host in host_inputs.items():
        dev = cupy_from_host(cp, host)
        keep.append(dev)
        pack[g.find_tensor(name).uid] = _CupyBits(dev, host.dtype.name).slot() if _exotic(host.dtype) else dev
    for t in g.get_outputs():
        np_dtype = host_dtype(t.data_type)
        dev = cupy_from_host(cp, empty_like_strided(np_dtype, t.dim, t.stride))
        outs[t.name] = dev
        pack[t.uid] = _CupyBits(dev, np.dtype(np_dtype).name).slot() if _exotic(np_dtype) else dev
    workspace = cp.empty(max(g.get_workspace_size(), 1), cp.uint8)
    g.execute(pack, workspace)
    cp.cuda.Device().synchronize()
    return {name: cp.asnumpy(dev).tobytes() for name, dev in outs.items()}


def _round_trip(g, special=None, expect_engine=None):
    """Build ``g``, run it, serialize, load into a fresh graph, run that: both results must be the same bytes."""
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    if expect_engine is not None:
        assert g.selected_plan.engine_id in expect_engine, g.selected_plan
    host = _host_inputs(g, special or {})
    want = _run(g, host)
    blob = g.serialize(as_bytes=True)
    header = plan_serialization.blob_header(blob)
    assert header.arch == 90 and header.engine_id == g.selected_plan.engine_id
    assert header.workspace_size == g.get_workspace_size()
    loaded = cudnn.pygraph()
    loaded.deserialize(cudnn.create_handle(), blob)
    assert loaded.get_execution_plan_count() == 1
    assert (loaded.selected_plan.engine_id, dict(loaded.selected_plan.knobs)) == \
        (g.selected_plan.engine_id, dict(g.selected_plan.knobs))
    assert loaded.get_workspace_size() == g.get_workspace_size()
    got = _run(loaded, host)
    for name in want:
        assert got[name] == want[name], f"{name}: the loaded plan's result differs from the original plan's"
    return g, blob


def _cudnn_matmul():
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda", router=PreferFamily("cudnn"))
    a = g.tensor(name="A", dim=[2, 64, 32], stride=list(row_major([2, 64, 32])))
    b = g.tensor(name="B", dim=[2, 32, 48], stride=list(row_major([2, 32, 48])))
    bias = g.tensor(name="bias", dim=[1, 1, 48], stride=[48, 48, 1])
    g.relu(g.bias(g.matmul(a, b), bias)).set_output(True).set_name("Y")
    return g


def test_a_cudnn_matmul_plan_round_trips_bitwise():
    g, blob = _round_trip(_cudnn_matmul(), expect_engine=range(0, 10_000))
    header = plan_serialization.blob_header(blob)
    assert header.cudnn_version == cudnn.backend_version() and header.engine_family == 1
    sections = _plan_blob.unpack_blob(blob).sections
    # Runtime-compiled engines (the fused matmul's) serialize as cuDNN's own plan; say so if not.
    assert _plan_blob.SECTION_CUDNN_PLAN in sections, "cuDNN did not serialize the fused matmul plan"


def test_a_cudnn_conv_plan_round_trips_bitwise():
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda", router=PreferFamily("cudnn"))
    x = g.tensor(name="X", dim=[4, 32, 16, 16], stride=list(nhwc([4, 32, 16, 16])))
    w = g.tensor(name="W", dim=[64, 32, 3, 3], stride=list(nhwc([64, 32, 3, 3])))
    y = g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    y.set_output(True).set_name("Y").set_stride(list(nhwc([4, 64, 16, 16])))
    _round_trip(g, expect_engine=range(0, 10_000))


def test_a_cudnn_sdpa_plan_round_trips_bitwise():
    b, h, s, d = 2, 4, 128, 64
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda", router=PreferFamily("cudnn"))
    dims = [b, h, s, d]
    q, k, v = (g.tensor(name=n, dim=dims, stride=list(row_major(dims))) for n in ("Q", "K", "V"))
    o, stats = g.sdpa(q, k, v, generate_stats=True, attn_scale=0.125, use_causal_mask=True)
    o.set_output(True).set_name("O").set_stride(list(row_major(dims)))
    stats.set_output(True).set_name("Stats").set_data_type(F.FLOAT)
    _round_trip(g, expect_engine=range(0, 10_000))


def test_a_cute_gemm_plan_round_trips_bitwise():
    pytest.importorskip("cutlass")
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda", router=PreferFamily("python"))
    a = g.tensor(name="A", dim=[1, 256, 128], stride=list(row_major([1, 256, 128])))
    bm = g.tensor(name="B", dim=[1, 128, 192], stride=list(row_major([1, 128, 192])))
    g.matmul(a, bm).set_output(True).set_name("Y").set_data_type(F.BFLOAT16)
    _round_trip(g, expect_engine=range(20_100, 20_200))


def test_a_cutile_gdn_plan_round_trips_bitwise():
    pytest.importorskip("cuda.tile")
    import ml_dtypes  # noqa: F401  (bf16 host arrays)
    T, H, K, V = 192, 2, 128, 128
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cuda",
                      router=PreferFamily("python"))
    q, k = (g.tensor(name=n, dim=[T, H, K], stride=[H * K, K, 1]) for n in ("q", "k"))
    v = g.tensor(name="v", dim=[T, H, V], stride=[H * V, V, 1])
    gate = g.tensor(name="g", dim=[T, H], stride=[H, 1], data_type=F.FLOAT)
    beta = g.tensor(name="beta", dim=[T, H], stride=[H, 1])
    cu = g.tensor(name="cu_seqlens", dim=[3], stride=[1], data_type=F.INT32)
    o, final, _ = g.gdn(q, k, v, gate, beta, cu_seqlens=cu, output_final_state=True, use_qk_l2norm=True)
    o.set_output(True)
    final.set_output(True)
    rng = np.random.default_rng(1)
    special = {"cu_seqlens": lambda shape: np.array([0, 100, T], np.int32),
               "g": lambda shape: -rng.uniform(0.05, 0.7, shape),
               "beta": lambda shape: rng.uniform(0.2, 0.9, shape)}
    _round_trip(g, special, expect_engine=range(20_200, 20_300))


def test_a_cudnn_blob_loads_and_runs_in_a_new_process(tmp_path):
    g = _cudnn_matmul()
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    path = tmp_path / "plan.bin"
    path.write_bytes(g.serialize(as_bytes=True))
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})
        import numpy as np, cudnn_graph as cudnn
        from cudnn_graph.engines import manifest
        for engine in manifest.engines():      # a load that planned would fail here
            engine.propose_plans = engine.propose_plans_for_modes = None
        from plans.test_plan_round_trips_gpu import _host_inputs, _run
        g = cudnn.pygraph()
        g.deserialize(open({str(path)!r}, "rb").read())
        print(_run(g, _host_inputs(g, {{}}))["Y"].hex())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert bytes.fromhex(result.stdout.strip()) == _run(g, _host_inputs(g, {}))["Y"]
