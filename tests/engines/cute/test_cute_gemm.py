"""The CuTe DSL GEMM engine (engines/cute): claims and declines, plan knobs, kernel compiles (CPU), and the
kernel against the reference engine on an H200 (GPU-marked).

CPU tests: the matcher's claims and reasons on graphs for a CUDA device (the compute capability is patched
to sm_90 or sm_80: there is no GPU to ask), the ranking of plan knobs, the engine's absence without the DSL,
and, when nvidia-cutlass-dsl is installed, compiles of kernel specialisations for sm_90a (the DSL compiles
without a GPU when CUTE_DSL_ARCH names the target), including a whole graph.build() through the engine.

GPU tests (``-m gpu``, H200): every epilogue, each dtype pair, row- and column-major A / B / output, batched
and not, from CuPy and JAX, against the reference engine; the plan list picks the engine and select_plan
pins another of its plans. Shapes are small and odd (edge tiles in M, N and K); each distinct specialisation
compiles once (a few seconds).
"""
from __future__ import annotations

import importlib
import math
import os
import sys

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

cg = pytest.importorskip("cudnn_graph")
F = cg.data_type
CUTE_ID = 20_100

try:
    from cudnn_graph.engines import cute as cute_pkg
    from cudnn_graph.engines.cute import _match, _plans, _spec
    from cudnn_graph.engines.cute import engine as cute_engine
    HAVE_DSL = True
except ImportError as exc:          # the DSL is missing: only the absence test runs
    HAVE_DSL = False
    DSL_MISSING = str(exc)

needs_dsl = pytest.mark.skipif(not HAVE_DSL, reason="nvidia-cutlass-dsl is not installed")


# ------------------------------------------------------------------------------------------ graphs

def _strides(dims, order):
    """Element strides of ``dims`` packed with axes ``order`` from outermost to innermost."""
    strides = [0] * len(dims)
    acc = 1
    for axis in reversed(order):
        strides[axis] = acc
        acc *= dims[axis]
    return strides


def _mat_strides(batch, rows, cols, row_major):
    dims = [*batch, rows, cols]
    r = len(batch)
    order = list(range(r)) + ([r, r + 1] if row_major else [r + 1, r])
    return dims, _strides(dims, order)


def gemm_graph(device, *, M=200, N=136, K=264, batch=(), ab=F.BFLOAT16, out=F.BFLOAT16, a_row=True,
               b_row=True, c_row=True, epilogue=(), router=None):
    """matmul(A, B) -> epilogue -> Y. ``epilogue`` items: ("bias", "row" | "col" | "batch" | "full"),
    ("scale", float) for a by-value scalar, ("scale", "row") for a tensor, ("relu", kwargs),
    ("gelu_approx_tanh", {}), ("swish", kwargs). Returns (graph, {name: tensor})."""
    g = cg.pygraph(io_data_type=ab, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT, device=device,
                   router=router)
    t = {}
    dims, strides = _mat_strides(batch, M, K, a_row)
    t["A"] = g.tensor(name="A", dim=dims, stride=strides, data_type=ab)
    dims, strides = _mat_strides(batch, K, N, b_row)
    t["B"] = g.tensor(name="B", dim=dims, stride=strides, data_type=ab)
    y = g.matmul(t["A"], t["B"])
    nb = len(batch)
    for i, (op, arg) in enumerate(epilogue):
        if op in ("bias", "scale") and not isinstance(arg, float):
            shape = {"row": [1] * nb + [1, N], "col": [1] * nb + [M, 1], "batch": [*batch, 1, N],
                     "full": [*batch, M, N]}[arg]
            name = f"{op}{i}"
            t[name] = g.tensor(name=name, dim=shape, stride=_strides(shape, list(range(len(shape)))),
                               data_type=F.FLOAT if op == "scale" else ab)
            y = getattr(g, op)(y, t[name])
        elif op == "scale":
            y = g.scale(y, arg)
        else:
            y = getattr(g, op)(y, **arg)
    dims, strides = _mat_strides(batch, M, N, c_row)
    y.set_output(True).set_dim(dims).set_stride(strides).set_data_type(out)
    t["Y"] = y
    return g, t


@pytest.fixture
def sm90(monkeypatch):
    if HAVE_DSL:
        monkeypatch.setattr(cute_engine, "_compute_capability", lambda ordinal: (9, 0))


def _matched(**kw):
    g, _ = gemm_graph("cuda", **kw)
    g.validate()
    return _match.match(g)


# ------------------------------------------------------------------------------- absence / claims

def test_engine_is_absent_from_the_manifest_without_the_dsl(monkeypatch):
    import importlib.util
    from cudnn_graph.engines import manifest
    real = importlib.util.find_spec

    def no_cutlass(name, *args, **kwargs):
        if name == "cutlass" or name.startswith("cutlass."):
            return None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", no_cutlass)
    for mod in [m for m in sys.modules if m.startswith("cudnn_graph.engines.cute")]:
        monkeypatch.delitem(sys.modules, mod)
    with pytest.raises(ImportError, match="nvidia-cutlass-dsl"):
        importlib.import_module("cudnn_graph.engines.cute")
    monkeypatch.setattr(manifest, "_made", {})       # each in-tree engine is tried once per process
    names = [e.name for e in manifest._load_in_tree()]
    assert "cute_gemm" not in names and "reference" in names


def test_a_dsl_that_fails_to_import_is_declined_with_its_error_and_host_graphs_run(tmp_path):
    """A broken install (the DSL's package raises RuntimeError at import, as nvidia-cutlass-dsl does
    without its CUDA-toolkit flavour): a host graph builds and runs without touching it; a CUDA matmul
    graph is declined by the engine with the import's error (and one warning), not a failed build."""
    import subprocess
    import textwrap
    broken = tmp_path / "cutlass"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise RuntimeError("No CTK flavor installed")\n')
    (broken / "cute.py").write_text("")
    code = textwrap.dedent(f"""
        import sys
        # ahead of an installed DSL, whose .pth file puts its own path first at start-up
        sys.path.insert(0, {str(tmp_path)!r})
        for name in [m for m in sys.modules if m == "cutlass" or m.startswith("cutlass.")]:
            del sys.modules[name]
        import json, logging, numpy as np
        logging.basicConfig(level=logging.WARNING)
        import cudnn_graph as cudnn
        from cudnn_graph.engines import manifest
        names = [e.name for e in manifest.engines()]
        F = cudnn.data_type
        g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
        a = g.tensor(name="A", dim=[1, 4, 8], stride=[32, 8, 1])
        b = g.tensor(name="B", dim=[1, 8, 2], stride=[16, 2, 1])
        c = g.matmul(a, b).set_output(True)
        g.build([cudnn.heur_mode.A])
        x, y, z = np.ones((1, 4, 8), np.float32), np.ones((1, 8, 2), np.float32), np.zeros((1, 4, 2), np.float32)
        g.execute({{a: x, b: y, c: z}})
        print("host graph done", file=sys.stderr, flush=True)
        from cudnn_graph.engines.cute import engine as cute_engine
        cute_engine._compute_capability = lambda ordinal: (9, 0)       # no GPU needed to reach the DSL
        h = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cuda")
        p = h.tensor(name="A", dim=[1, 64, 64], stride=[4096, 64, 1])
        q = h.tensor(name="B", dim=[1, 64, 64], stride=[4096, 64, 1])
        h.matmul(p, q).set_output(True)
        h.create_execution_plans()
        print(json.dumps({{"names": names, "z": float(z.sum()),
                          "declines": [why for who, why in h.declines if who == "cute_gemm"]}}))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    out = __import__("json").loads(result.stdout.strip().splitlines()[-1])
    assert "cute_gemm" in out["names"] and "reference" in out["names"]
    assert out["z"] == 64.0
    host_part, cuda_part = result.stderr.split("host graph done")
    assert "cutlass" not in host_part                      # the host graph never imported the DSL
    assert "does not import (RuntimeError: No CTK flavor installed)" in out["declines"][0]
    assert cuda_part.count("does not import (RuntimeError: No CTK flavor installed)") == 1


@needs_dsl
@pytest.mark.parametrize("kw, expect", [
    ({}, dict(a_stride=(264, 1, 200 * 264),
              b_stride=(1, 136), c_stride=(136, 1), L=1)),
    ({"a_row": False, "b_row": False, "c_row": False}, dict(a_stride=(1, 200), b_stride=(264, 1),
                                                             c_stride=(1, 200), L=1)),
    ({"batch": (3,)}, dict(a_stride=(264, 1, 200 * 264), b_stride=(1, 136, 264 * 136),
                           c_stride=(136, 1, 200 * 136), L=3)),
    ({"batch": (2, 3)}, dict(L=6, a_stride=(264, 1, 200 * 264))),
    # K = 1 (the H200 fuzzer's case): both of A's strides are 1 elements; TMA needs the size-1 axis's
    # stride 16-byte aligned, so A is read as a column (M-major) and B's size-1 row axis gets 136.
    ({"K": 1}, dict(a_stride=(1, 200), b_stride=(1, 136))),
    ({"K": 1, "M": 16, "ab": F.HALF}, dict(a_stride=(1, 16))),
])
def test_layouts_and_batches_map_to_kernel_strides(kw, expect):
    p = _matched(**kw)
    for key, value in expect.items():
        got = getattr(p, key)
        if key.endswith("stride"):
            got = got[:len(value)]
        assert got == value, (key, got, value)
    assert (p.M, p.N, p.K) == (kw.get("M", 200), 136, kw.get("K", 264))


@needs_dsl
def test_every_epilogue_op_is_fused_in_graph_order():
    p = _matched(epilogue=[("bias", "row"), ("scale", 0.5), ("relu", {"upper_clip": 6.0}),
                           ("scale", "col"), ("gelu_approx_tanh", {}), ("swish", {"swish_beta": 1.5})],
                 batch=(2,), out=F.FLOAT)
    assert [s.op for s in p.steps] == ["add", "mul", "relu", "mul", "gelu_tanh", "swish"]
    assert p.steps[0].tensor == 0 and p.steps[1].scalar == 0 and p.steps[3].tensor == 1
    assert p.steps[2].params == (0.0, 6.0, 0.0) and p.steps[5].params == (1.5,)
    assert p.epi_tensors[0].stride == (0, 1, 0)           # a row vector: broadcast over M and the batch
    assert p.epi_tensors[1].stride == (1, 0, 0)           # a column vector
    assert p.c_dtype == "float32" and p.scalar_types == ("float32",)


@needs_dsl
def test_per_batch_and_full_epilogue_tensors_keep_their_batch_stride():
    p = _matched(batch=(3,), epilogue=[("bias", "batch"), ("scale", "full")])
    assert p.epi_tensors[0].stride == (0, 1, 136)
    assert p.epi_tensors[1].stride == (136, 1, 200 * 136)


@needs_dsl
@pytest.mark.parametrize("kw, words", [
    ({"ab": F.FLOAT, "out": F.FLOAT}, "BFLOAT16 x BFLOAT16 or HALF x HALF"),
    ({"K": 260}, "not a multiple of 16 bytes"),
    ({"N": 130}, "not a multiple of 16 bytes"),
    ({"epilogue": [("tanh", {})]}, "not a fusable epilogue op"),
    ({"out": F.INT32}, "writes BFLOAT16, HALF or FLOAT"),
])
def test_unsupported_graphs_are_declined_with_the_reason(kw, words):
    g, _ = gemm_graph("cuda", **kw)
    _assert_match_declines(g, words)


def _bf16_operands(a_batch: int, b_batch: int):
    """A BF16 graph and its (batch, 64, 64) row-major operands A and B."""
    g = cg.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cuda")
    a = g.tensor(name="A", dim=[a_batch, 64, 64], stride=[4096, 64, 1])
    b = g.tensor(name="B", dim=[b_batch, 64, 64], stride=[4096, 64, 1])
    return g, a, b


def _assert_match_declines(g, words):
    """``g`` validates, and the CuTe matcher declines it with a reason matching ``words``."""
    g.validate()
    with pytest.raises(cg.errors.GraphNotSupportedError, match=words):
        _match.match(g)


@needs_dsl
def test_a_batch_broadcast_b_is_declined():
    g, a, b = _bf16_operands(3, 1)
    g.matmul(a, b).set_output(True)
    _assert_match_declines(g, "broadcast over the batch")


@needs_dsl
def test_an_intermediate_output_is_declined():
    g, a, b = _bf16_operands(1, 1)
    c = g.matmul(a, b).set_output(True)
    g.relu(c).set_output(True)
    _assert_match_declines(g, "only the last op's output")


@needs_dsl
def test_other_architectures_and_host_graphs_are_declined(monkeypatch):
    engine = cute_pkg.CuteGemmEngine()
    monkeypatch.setattr(cute_engine, "_compute_capability", lambda ordinal: (8, 0))
    g, _ = gemm_graph("cuda")
    g.validate()
    with pytest.raises(cg.errors.GraphNotSupportedError, match="sm_80.*sm_90"):
        engine.propose_plans(g)
    h, _ = gemm_graph("cpu")
    h.validate()
    with pytest.raises(cg.errors.GraphNotSupportedError, match="runs on cpu"):
        engine.propose_plans(h)


# ------------------------------------------------------------------------------------- plan knobs

@needs_dsl
def test_plans_are_ranked_by_the_model_and_named_by_their_knobs(sm90):
    g, _ = gemm_graph("cuda", M=8192, N=8192, K=8192)
    g.validate()
    plans = cute_pkg.CuteGemmEngine().propose_plans(g)
    assert 2 <= len(plans) <= _plans.MAX_PLANS
    assert all(p.engine_id == CUTE_ID for p in plans)
    assert len({p.name for p in plans}) == len(plans)
    assert plans[0].knobs["tile"] == (128, 256)
    assert [p.priority for p in plans] == sorted((p.priority for p in plans), reverse=True)


@needs_dsl
def test_a_skinny_problem_prefers_a_64_row_tile():
    p = _matched(M=16, N=8192, K=8192)
    best = _plans.candidates(p)[0]
    assert best.tile[0] == 64


@needs_dsl
def test_bad_pinned_knobs_are_refused():
    with pytest.raises(ValueError, match="tile"):
        _plans.knobs_from({"tile": (96, 96)})
    with pytest.raises(ValueError, match="cluster"):
        _plans.knobs_from({"cluster": (4, 4)})


# ------------------------------------------------------------------------------ compiles (no GPU)

def _compile_specs():
    if not HAVE_DSL:
        return []
    S = _spec
    plain = _matched()
    fused = _matched(batch=(2,), epilogue=[("bias", "batch"), ("scale", 0.5), ("gelu_approx_tanh", {})])
    colmajor = _matched(a_row=False, b_row=False, c_row=False, out=F.FLOAT,
                        epilogue=[("scale", "row"), ("relu", {"upper_clip": 6.0, "negative_slope": 0.1}),
                                  ("swish", {})])
    half = _matched(ab=F.HALF, out=F.HALF, M=16, epilogue=[("bias", "col")])
    odd = _matched(M=203, N=136, K=264)
    return [
        pytest.param(odd, S.Knobs((128, 256), (2, 1)), id="static-odd-shape"),
        pytest.param(plain, S.Knobs((128, 256), (2, 1)), id="bf16-t128x256-c2x1"),
        pytest.param(fused, S.Knobs((128, 128), (1, 2), swizzle=8), id="bf16-batched-bias-scale-gelu"),
        pytest.param(colmajor, S.Knobs((128, 128), (1, 1)), id="colmajor-f32out-relu6-swish"),
        pytest.param(half, S.Knobs((64, 256), (1, 1)), id="f16-t64-colbias"),
    ]


@needs_dsl
@pytest.mark.parametrize("problem, knobs", _compile_specs())
def test_kernel_specialisations_compile_for_sm90(problem, knobs):
    spec = cute_engine.kernel_spec(cute_engine.spec_for(problem, knobs))
    launcher = cute_engine.compiled_launcher(spec)
    assert launcher is not None
    assert cute_engine.compiled_launcher(spec) is launcher          # compiled once, then cached


@needs_dsl
def test_packed_problems_of_one_layout_share_a_shape_class():
    S = _spec
    knobs = S.Knobs((128, 256), (2, 1))
    a = cute_engine.spec_for(_matched(M=200, epilogue=[("bias", "row")]), knobs)
    b = cute_engine.spec_for(_matched(M=512, batch=(3,), epilogue=[("bias", "row")]), knobs)
    c = cute_engine.spec_for(_matched(M=64, N=8, K=4096, epilogue=[("bias", "row")]), knobs)
    assert S.shape_class(a) is not None and S.shape_class(a).dynamic
    assert S.shape_class(a) == S.shape_class(b) == S.shape_class(c)
    # Another epilogue layout, majorness or dtype is another class.
    assert S.shape_class(cute_engine.spec_for(_matched(M=200, epilogue=[("bias", "col")]), knobs)) \
        != S.shape_class(a)
    assert S.shape_class(cute_engine.spec_for(_matched(M=200, a_row=False, epilogue=[("bias", "row")]),
                                              knobs)) != S.shape_class(a)


@needs_dsl
@pytest.mark.parametrize("kw, why", [
    (dict(M=203), "an extent that is not a multiple of 8"),
    (dict(M=65536, N=65536, K=64), "offsets past 32 bits"),
])
def test_layouts_a_shape_class_cannot_express_compile_per_shape(kw, why):
    spec = cute_engine.spec_for(_matched(**kw), _spec.Knobs((128, 256), (2, 1)))
    assert _spec.shape_class(spec) is None, why
    assert cute_engine.kernel_spec(spec) is spec


@needs_dsl
def test_padded_leading_dimension_compiles_per_shape():
    S = _spec
    spec = S.GemmSpec("bfloat16", "bfloat16", 64, 64, 64, 1, (72, 1, 64 * 72), (64, 1, 4096), (64, 1, 4096),
                      S.Knobs())
    assert S.shape_class(spec) is None


@needs_dsl
def test_two_shapes_of_one_class_compile_one_kernel(monkeypatch):
    from cudnn_graph.engines.cute import _kernel
    compiles = []
    real = _kernel.compile_spec

    def counting(spec):
        compiles.append(spec)
        return real(spec)

    monkeypatch.setattr(_kernel, "compile_spec", counting)
    monkeypatch.setattr(cute_engine, "_cache", {})
    knobs = _spec.Knobs((128, 128), (1, 1))
    first = cute_engine.spec_for(_matched(M=256, N=128, K=128), knobs)
    second = cute_engine.spec_for(_matched(M=768, N=256, K=512, batch=(2,)), knobs)
    assert first != second
    k1, k2 = cute_engine.kernel_spec(first), cute_engine.kernel_spec(second)
    assert k1 == k2 and k1.dynamic
    assert cute_engine.compiled_launcher(k1) is cute_engine.compiled_launcher(k2)
    assert len(compiles) == 1


@needs_dsl
def test_a_skinny_problem_ranks_its_plans_after_cudnns(sm90):
    g, _ = gemm_graph("cuda", M=16, N=512, K=1024)
    g.validate()
    plans = cute_engine.CuteGemmEngine().propose_plans(g.view)
    assert plans and all(p.priority < 0 for p in plans)
    g, _ = gemm_graph("cuda", M=256, N=512, K=1024)
    g.validate()
    assert all(p.priority > 0 for p in cute_engine.CuteGemmEngine().propose_plans(g.view))


@needs_dsl
def test_a_close_knob_set_with_a_compiled_kernel_is_ranked_first(monkeypatch):
    problem = _matched(M=512, N=512, K=512)
    device = cute_engine._Device()
    ranked = _plans.candidates(problem, device.sm_count)
    runner_up = ranked[1]
    monkeypatch.setattr(cute_engine, "_cache",
                        {cute_engine.kernel_spec(cute_engine.spec_for(problem, runner_up, device)): object()})
    monkeypatch.setattr(cute_engine, "COMPILED_PREFERENCE", 0.0)
    assert cute_engine._prefer_compiled(problem, ranked, device)[0] == runner_up
    monkeypatch.setattr(cute_engine, "COMPILED_PREFERENCE", 1.01)     # never worth a worse plan
    assert cute_engine._prefer_compiled(problem, ranked, device) == ranked


@needs_dsl
def test_launcher_hands_the_dsl_the_addresses_it_would_pack():
    """The packed launch path is taken only when the DSL packs a call as this launcher's own addresses."""
    from cudnn_graph.engines.cute._launch import Launcher
    spec = cute_engine.spec_for(_matched(), _spec.Knobs((128, 256), (2, 1)))
    launcher = Launcher(cute_engine.compiled_launcher(spec), spec)
    assert launcher.probe()


@needs_dsl
def test_graph_build_selects_and_compiles_the_engine_plan(sm90):
    g, _ = gemm_graph("cuda", epilogue=[("bias", "row"), ("relu", {})])
    g.build([cg.heur_mode.A])
    assert g.selected_plan.engine_id == CUTE_ID
    assert g.selected_plan.name.startswith("cute_gemm_")
    assert g.get_workspace_size() == 0


# =========================================================================================== GPU

def _require_engine():
    if not HAVE_DSL:
        pytest.skip(f"the CuTe engine is absent: {DSL_MISSING}")
    from cudnn_graph.engines import manifest
    engine = next((e for e in manifest.engines() if e.name == "cute_gemm"), None)
    if engine is None:
        pytest.skip("the CuTe engine is absent from the manifest")
    if engine.missing is not None:
        pytest.skip(f"the CuTe engine cannot build kernels here: {engine.missing}")


def _host_inputs(g, t, seed):
    import ml_dtypes  # noqa: F401
    from gpu_support import empty_like_strided, host_dtype
    rng = np.random.default_rng(seed)
    out = {}
    for name, tensor in t.items():
        if name == "Y":
            continue
        np_dtype = host_dtype(g.view.data_type(tensor))
        arr = empty_like_strided(np_dtype, tensor.dim, tensor.stride)
        scale = 1.0 if name in ("A", "B") else 0.5
        arr[...] = (rng.standard_normal(tuple(tensor.dim)) * scale).astype(np_dtype)
        out[name] = arr
    return out


def _dense_only(host):
    return {k: np.ascontiguousarray(v) for k, v in host.items()}


def _run_case(producer="cupy", seed=0, pin=None, **kw):
    from gpu_support import assert_close, gpu_run, reference_run
    _require_engine()

    def builder(device):
        return gemm_graph(device, **kw)

    g, t = builder("cpu")
    host = _host_inputs(g, t, seed)
    want = reference_run(builder, host, ["Y"])
    if pin is None and kw.get("M", 200) * math.prod(kw.get("batch", ())) <= _plans.SKINNY_M:
        pin = 0           # a skinny problem ranks cuDNN's plans first: pin the engine's best plan
    if pin is None:
        got, graph = gpu_run(builder, host, ["Y"], producer)
        assert graph.selected_plan.engine_id == CUTE_ID, graph.selected_plan
    else:
        got, graph = _pinned_run(builder, host, pin)
    name = np.dtype(want["Y"].dtype).name
    tol = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 2e-3}[name]
    assert np.all(np.isfinite(np.asarray(got["Y"], np.float32)))
    assert_close(got["Y"], want["Y"], name, f"Y ({producer}, {kw})", tolerance=tol)
    return graph


def _pinned_run(builder, host, index):
    """Build the GPU graph, pin plan ``index`` (one of the engine's), execute from CuPy."""
    import cupy as cp
    from gpu_support import _CupyBits, cupy_from_host, empty_like_strided, host_dtype
    g, t = builder("cuda")
    g.build_operation_graph()
    g.create_execution_plans([cg.heur_mode.A, cg.heur_mode.FALLBACK])
    g.check_support()
    cute_indices = [i for i, p in enumerate(g.plans) if p.engine_id == CUTE_ID]
    chosen = cute_indices[index]
    g.select_plan(chosen)
    g.build_plans()
    assert g.selected_plan is g.plans[chosen]
    pack, keep = {}, []
    out_dtype = host_dtype(g.view.data_type(t["Y"]))
    y_host = empty_like_strided(out_dtype, t["Y"].dim, t["Y"].stride)
    y_dev = cupy_from_host(cp, y_host)
    pack[t["Y"]] = _CupyBits(y_dev, np.dtype(out_dtype).name).slot() if np.dtype(out_dtype).name == "bfloat16" \
        else y_dev
    for name, arr in host.items():
        dev = cupy_from_host(cp, arr)
        keep.append(dev)
        pack[t[name]] = _CupyBits(dev, arr.dtype.name).slot() if arr.dtype.name == "bfloat16" else dev
    g.execute(pack)
    cp.cuda.Device().synchronize()
    raw = cp.asnumpy(y_dev)
    return {"Y": raw.view(out_dtype) if raw.dtype != np.dtype(out_dtype) else raw}, g


# Each row: dtype pair, layouts (A, B, output row-major?), batch, epilogue. Together they cover every
# epilogue op, both input types, the three output types, all four A/B layout pairs, both output layouts,
# batched and not, with edge tiles in M (200), N (136) and K (264).
GPU_CASES = [
    dict(ab=F.BFLOAT16, out=F.BFLOAT16),
    dict(ab=F.BFLOAT16, out=F.BFLOAT16, epilogue=[("bias", "row")]),
    dict(ab=F.HALF, out=F.HALF, a_row=False, epilogue=[("bias", "row"), ("relu", {})]),
    dict(ab=F.BFLOAT16, out=F.FLOAT, b_row=False, epilogue=[("scale", 0.25), ("gelu_approx_tanh", {})]),
    dict(ab=F.HALF, out=F.FLOAT, a_row=False, b_row=False, c_row=False, epilogue=[("swish", {})]),
    dict(ab=F.BFLOAT16, out=F.BFLOAT16, c_row=False, batch=(3,),
         epilogue=[("bias", "batch"), ("scale", "row"), ("swish", {"swish_beta": 1.5})]),
    dict(ab=F.HALF, out=F.HALF, batch=(2,), epilogue=[("bias", "col"), ("scale", 2.0),
                                                       ("relu", {"upper_clip": 1.0, "negative_slope": 0.1})]),
    dict(ab=F.BFLOAT16, out=F.FLOAT, batch=(2,), b_row=False, epilogue=[("bias", "full"), ("gelu_approx_tanh", {})]),
    dict(ab=F.BFLOAT16, out=F.BFLOAT16, M=16, N=512, K=1024, epilogue=[("bias", "row"), ("gelu_approx_tanh", {})]),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(
    [c["ab"].name, c["out"].name, "A" + "RC"[not c.get("a_row", True)], "B" + "RC"[not c.get("b_row", True)],
     "Y" + "RC"[not c.get("c_row", True)], f"L{math.prod(c.get('batch', ()))}"]
    + [op for op, _ in c.get("epilogue", ())]))
def test_kernel_matches_the_reference_from_cupy(case):
    _run_case("cupy", **case)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [GPU_CASES[1], GPU_CASES[6]], ids=["bf16-bias", "f16-batched-bias-scale-relu"])
def test_kernel_matches_the_reference_from_jax(case):
    pytest.importorskip("jax")
    _run_case("jax", seed=1, **case)


@pytest.mark.gpu
def test_an_odd_shape_runs_its_static_kernel():
    _run_case("cupy", ab=F.BFLOAT16, out=F.BFLOAT16, M=203, N=136, K=264, epilogue=[("bias", "row")])
    assert any(not s.dynamic and (s.M, s.N, s.K) == (203, 136, 264) for s in cute_engine.compile_seconds)


@pytest.mark.gpu
@pytest.mark.parametrize("ab", [F.BFLOAT16, F.HALF])
def test_new_shapes_of_a_known_class_build_without_a_compile(ab, monkeypatch):
    """One compile serves every shape of the class (edge tiles in M and N, batches), each result right."""
    _require_engine()
    # One knob set for every shape, so that all of them fall in one class.
    monkeypatch.setattr(_plans, "candidates", lambda problem, sm_count=132: [_spec.Knobs((128, 128), (1, 1))])
    epilogue = [("bias", "row"), ("relu", {})]
    before = len(cute_engine.compile_seconds)
    shapes = [dict(M=256, N=256, K=128), dict(M=200, N=136, K=264), dict(M=72, N=520, K=64, batch=(3,)),
              dict(M=1024, N=64, K=1032), dict(M=8, N=8, K=8)]
    for shape in shapes:
        _run_case("cupy", ab=ab, out=ab, epilogue=epilogue, **shape)
    compiled = list(cute_engine.compile_seconds)[before:]
    assert len(compiled) <= 1 and all(s.dynamic for s in compiled), compiled


@pytest.mark.gpu
def test_select_plan_pins_another_engine_plan():
    graph = _run_case("cupy", pin=1, ab=F.BFLOAT16, out=F.BFLOAT16, epilogue=[("bias", "row"), ("relu", {})])
    assert graph.selected_plan.engine_id == CUTE_ID
    assert graph.selected_plan is not graph.plans[0]


@pytest.mark.gpu
def test_large_square_problem_with_every_plan_knob_set_of_the_list():
    """1024^3 bf16 on each of the first three plans: the multicast / swizzle variants agree too."""
    for index in range(3):
        _run_case("cupy", pin=index, M=1024, N=1024, K=1024, epilogue=[("bias", "row")])


@pytest.mark.gpu
def test_repeated_executes_match_the_first():
    """The second execute() runs the plan's one-call path (PackedLaunch: packed in Cython, the compiled
    host entry called from C); its output is bitwise the first's, from CuPy arrays and from raw ints,
    with a by-value scalar left to the graph's value."""
    import cupy as cp
    _require_engine()
    g, t = gemm_graph("cuda", M=256, N=128, K=64, epilogue=[("bias", "row"), ("scale", 0.5), ("relu", {})])
    g.build([cg.heur_mode.A])
    assert g.selected_plan.engine_id == CUTE_ID
    rng = np.random.default_rng(1)

    def bf16(shape):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(cp.float16).view(cp.uint16)

    a, b, bias = bf16((256, 64)), bf16((64, 128)), bf16((1, 128))
    outs = [cp.zeros((256, 128), cp.uint16) for _ in range(3)]
    slots = {n: cg.Slot.from_address(x.data.ptr, tuple(t[n].dim), dtype="bfloat16", device="cuda:0")
             for n, x in (("A", a), ("B", b), ("bias0", bias))}

    def pack(y):
        return {t["A"]: slots["A"], t["B"]: slots["B"], t["bias0"]: slots["bias0"],
                t["Y"]: cg.Slot.from_address(y.data.ptr, tuple(t["Y"].dim), dtype="bfloat16", device="cuda:0")}

    g.execute(pack(outs[0]))                         # the first call: the Python path, finds the executor
    launch = getattr(g.fast_executor, "__self__", None)
    assert type(launch).__name__ == "PackedLaunch" or not cute_engine.C_LAUNCH, g.fast_executor
    g.execute(pack(outs[1]))                         # from C where the C launch path is on
    g.execute({t["A"]: a.data.ptr, t["B"]: b.data.ptr, t["bias0"]: bias.data.ptr, t["Y"]: outs[2].data.ptr})
    cp.cuda.Device().synchronize()
    assert int(cp.count_nonzero(outs[0])) > 0
    assert bool(cp.all(outs[0] == outs[1])) and bool(cp.all(outs[0] == outs[2]))


@pytest.mark.gpu
def test_repeated_arguments_replay_one_recorded_cuda_graph_that_reads_current_inputs():
    """A CuTe plan's launch called again with the same addresses and scalars is recorded once as a CUDA
    graph and replayed: the replay reads the inputs' current contents (new values in the same buffers give
    the new product), new addresses run the entry again, and the output equals a direct launch's bitwise."""
    import cupy as cp
    _require_engine()
    if not cute_engine.C_LAUNCH:
        pytest.skip("the C launch path is off")
    g, t = gemm_graph("cuda", M=256, N=128, K=64, epilogue=[("relu", {})])
    g.build([cg.heur_mode.A])
    assert g.selected_plan.engine_id == CUTE_ID
    rng = np.random.default_rng(2)

    def bf16(shape):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(cp.float16).view(cp.uint16)

    a, b = bf16((256, 64)), bf16((64, 128))
    y, direct = cp.zeros((256, 128), cp.uint16), cp.zeros((256, 128), cp.uint16)
    args = {t["A"]: a.data.ptr, t["B"]: b.data.ptr, t["Y"]: y.data.ptr}
    g.execute({t["A"]: a.data.ptr, t["B"]: b.data.ptr, t["Y"]: direct.data.ptr})   # the Python path
    g.execute({t["A"]: a.data.ptr, t["B"]: b.data.ptr, t["Y"]: direct.data.ptr})   # C, first sighting
    launch = g.fast_executor.__self__
    recorded = launch.replay_graphs
    assert recorded in (0, 1)                         # 1 when the first call already ran from C
    for _ in range(3):
        g.execute(args)                              # seen, then recorded, then replayed
    assert launch.replay_graphs == recorded + 1
    cp.cuda.Device().synchronize()
    assert bool(cp.all(y == direct))
    a[...] = bf16((256, 64))                          # new contents, same address: the replay must see them
    g.execute(args)
    g.execute({t["A"]: a.data.ptr, t["B"]: b.data.ptr, t["Y"]: direct.data.ptr})
    cp.cuda.Device().synchronize()
    assert bool(cp.all(y == direct)) and int(cp.count_nonzero(y)) > 0
