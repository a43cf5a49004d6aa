"""cudnn_graph.jax on a GPU: plans run inside jax.jit through the XLA FFI handler (cuDNN and CuTe plans in C,
cuTile plans through the GIL fallback) give exactly what the eager execute() of the same plan gives on
the same inputs, and match JAX's own ops within the tolerances of gpu_support; jax.grad through the
custom_vjp functions matches jax.grad of JAX's own ops.

Run with XLA_PYTHON_CLIENT_PREALLOCATE=false (cudnn_graph allocates device memory next to XLA's).
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def jx():
    from gpu_support import jax_gpu
    return jax_gpu()


def _modules():
    import jax.numpy as jnp
    import cudnn_graph as cudnn
    import cudnn_graph.jax as cgjax
    return jnp, cudnn, cgjax


def _rand(shape, dtype, seed, scale=1.0):
    import ml_dtypes  # noqa: F401  (jnp.asarray of bfloat16 host arrays)
    jnp, _, _ = _modules()
    values = np.random.default_rng(seed).standard_normal(shape) * scale
    return jnp.asarray(values.astype(np.float32)).astype(dtype)


def _bits(array) -> np.ndarray:
    host = np.asarray(array)
    return host.view(f"u{host.dtype.itemsize}")


def _eager(plan, arrays):
    """execute() of the registered plan's graph on the same device inputs, outside jit (the graph's own
    PlanRunner / engine path); returns the outputs on the host."""
    import jax
    jnp, cudnn, _ = _modules()
    from cudnn_graph._driver import device_synchronize
    g = plan.graph
    tensors = {t.uid: t for t in g.tensors}
    pack, keep, outs = {}, [], []
    for (name, uid, shape, dtype), a in zip(plan.inputs, arrays):
        a = jnp.asarray(a)
        a.block_until_ready()
        keep.append(a)
        t = tensors[uid]
        pack[uid] = cudnn.Slot.from_address(cudnn.Slot.from_object(a).data_ptr, t.get_dim(), t.get_stride(),
                                            dtype, "cuda:0")
    for name, uid, shape, dtype in plan.outputs:
        buf = cudnn.OwnedBuffer.empty(shape, None, dtype, device="cuda:0")
        t = tensors[uid]
        pack[uid] = cudnn.Slot.from_address(buf.data_ptr, t.get_dim(), t.get_stride(), dtype, "cuda:0")
        outs.append(buf)
    g.execute(pack)
    device_synchronize(0)
    return [np.asarray(jax.device_get(jnp.from_dlpack(b))) for b in outs]


def _deterministic(plan, arrays) -> bool:
    """Whether two eager executes agree bitwise (a plan accumulating with atomics may not)."""
    first, second = _eager(plan, arrays), _eager(plan, arrays)
    return all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(first, second))


def _assert_jit_equals_eager(plan, arrays, jitted_outputs, names):
    eager = _eager(plan, arrays)
    exact = _deterministic(plan, arrays)
    for name, got, want in zip(names, jitted_outputs, eager):
        if exact:
            assert np.array_equal(_bits(got), _bits(want)), f"{name}: jit and eager differ"
        else:       # the plan itself is not bitwise reproducible: jit must agree as two eager runs do
            from gpu_support import assert_close
            assert_close(np.asarray(got, np.float32), np.asarray(want, np.float32), np.asarray(want).dtype.name, name)


def _close(got, want, what, tolerance=None):
    from gpu_support import assert_close
    got = np.asarray(got, np.float32)
    assert_close(got, np.asarray(want, np.float32), np.asarray(want).dtype.name if tolerance is None else "float32",
                 what, tolerance=tolerance)


@pytest.fixture
def router():
    from cudnn_graph.router import PreferFamily, set_default_router, get_default_router
    previous = get_default_router()
    yield lambda *families: set_default_router(PreferFamily(*families))
    set_default_router(previous)


# ---- matmul + bias + relu: the cuDNN plan and the CuTe plan (both called from C) -----------------------------

@pytest.mark.parametrize("family", ["cudnn", "python"], ids=["cudnn", "cute"])
def test_matmul_bias_relu_in_jit_equals_eager_execute(jx, router, family):
    jnp, cudnn, cgjax = _modules()
    router(family)
    fn = cgjax.function(cgjax._matmul_bias_relu_build, name=f"mbr_{family}")
    a, b = _rand((2, 128, 64), jnp.bfloat16, 1), _rand((2, 64, 96), jnp.bfloat16, 2)
    bias = _rand((1, 1, 96), jnp.bfloat16, 3)
    plan = fn.plan_for(a, b, bias)
    engine_id = plan.graph.selected_plan.engine_id
    if family == "python":
        if not 20_100 <= engine_id < 20_200:
            pytest.skip(f"no CuTe plan for this graph (engine {engine_id} runs it): CuTe not installed?")
        from cudnn_graph.engines.cute import engine as cute_engine
        # The CuTe plan's compiled entry is called from the handler in C (no GIL) where it has a C launch.
        assert plan.registration.kind == ("dsl" if cute_engine.C_LAUNCH else "python")
    else:
        assert engine_id < 10_000 and plan.registration.kind == "cudnn"
        assert plan.target == cgjax.TARGET_COMMAND_BUFFER
    got = jx.jit(fn)(a, b, bias)
    _assert_jit_equals_eager(plan, (a, b, bias), [got], ["y"])
    want = jnp.maximum(jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32)) + bias.astype(jnp.float32), 0)
    _close(got, np.asarray(want), "y vs jnp", tolerance=3e-2)


# ---- conv_fprop + bias + relu (channels-last: NHWC jax arrays) -----------------------------------------------

def _conv_build(x, w, bias, device):
    """x (N, H, W, C), w (K, R, S, C), bias (1, 1, 1, K) as NHWC buffers of (N, C, H, W) tensors."""
    _, cudnn, cgjax = _modules()
    F = cudnn.data_type
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT, device=device)

    def nhwc(name, shape):
        n, h, w_, c = shape
        return g.tensor(name=name, dim=[n, c, h, w_], stride=[h * w_ * c, 1, w_ * c, c], data_type=F.HALF)

    tx, tw, tb = nhwc("x", x.shape), nhwc("w", w.shape), nhwc("bias", bias.shape)
    y = g.conv_fprop(tx, tw, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    y = g.relu(g.add(y, tb))
    n, h, w_, _ = x.shape
    k = w.shape[0]
    y.set_output(True).set_name("y").set_data_type(F.HALF).set_dim([n, k, h, w_]).set_stride([h * w_ * k, 1, w_ * k, k])
    return g, [tx, tw, tb], [y]


def test_conv_bias_relu_in_jit_equals_eager_execute(jx):
    jnp, cudnn, cgjax = _modules()
    fn = cgjax.function(_conv_build)
    x, w = _rand((2, 16, 16, 32), jnp.float16, 1), _rand((64, 3, 3, 32), jnp.float16, 2, 0.1)
    bias = _rand((1, 1, 1, 64), jnp.float16, 3)
    plan = fn.plan_for(x, w, bias)
    assert plan.registration.kind == "cudnn"
    got = jx.jit(fn)(x, w, bias)
    assert got.shape == (2, 16, 16, 64)
    _assert_jit_equals_eager(plan, (x, w, bias), [got], ["y"])
    want = jx.lax.conv_general_dilated(x.astype(jnp.float32), w.astype(jnp.float32), (1, 1), ((1, 1), (1, 1)),
                                       dimension_numbers=("NHWC", "OHWI", "NHWC"))
    want = jnp.maximum(want + bias.astype(jnp.float32), 0)
    _close(got, np.asarray(want), "y vs lax.conv", tolerance=5e-3)


# ---- layer norm forward and backward --------------------------------------------------------------------------

def _layernorm_ref(jnp, x, s, b, eps=1e-5):
    x32 = x.astype(jnp.float32)
    m = x32.mean(-1, keepdims=True)
    v = ((x32 - m) ** 2).mean(-1, keepdims=True)
    return (x32 - m) / jnp.sqrt(v + eps) * s.astype(jnp.float32) + b.astype(jnp.float32)


def test_layernorm_forward_and_backward_in_jit_equal_eager_and_match_jax(jx):
    jnp, cudnn, cgjax = _modules()
    x, s, b = _rand((4, 128, 256), jnp.float32, 1), _rand((1, 1, 256), jnp.float32, 2), _rand((1, 1, 256), jnp.float32, 3)
    fwd = cgjax._cached_function(("layernorm", 1e-5), cgjax._layernorm_fwd_build(1e-5))
    plan = fwd.plan_for(x, s, b)
    assert plan.registration.kind == "cudnn"
    outs = jx.jit(fwd)(x, s, b)
    _assert_jit_equals_eager(plan, (x, s, b), outs, ["y", "mean", "inv_variance"])
    _close(outs[0], np.asarray(_layernorm_ref(jnp, x, s, b)), "y vs jax", tolerance=1e-3)

    dy = _rand((4, 128, 256), jnp.float32, 4)
    bwd = cgjax._cached_function(("layernorm_backward",), cgjax._layernorm_bwd_build)
    bplan = bwd.plan_for(dy, x, s, outs[1], outs[2])
    assert bplan.registration.kind == "cudnn"
    grads = jx.jit(bwd)(dy, x, s, outs[1], outs[2])
    _assert_jit_equals_eager(bplan, (dy, x, s, outs[1], outs[2]), grads, ["dx", "dscale", "dbias"])

    ours = jx.jit(jx.grad(lambda *t: jnp.sum(cgjax.layernorm(*t) * dy), argnums=(0, 1, 2)))(x, s, b)
    theirs = jx.grad(lambda *t: jnp.sum(_layernorm_ref(jnp, *t) * dy), argnums=(0, 1, 2))(x, s, b)
    for name, o, t in zip(("dx", "dscale", "dbias"), ours, theirs):
        _close(o, np.asarray(t), f"{name} vs jax.grad", tolerance=2e-3)


# ---- causal SDPA forward and backward (bf16) ------------------------------------------------------------------

def _attention_ref(jx, q, k, v):
    t = lambda a: a.transpose(0, 2, 1, 3)
    return t(jx.nn.dot_product_attention(t(q), t(k), t(v), is_causal=True, implementation="xla"))


def test_causal_sdpa_forward_and_backward_in_jit_equal_eager_and_match_jax(jx):
    jnp, cudnn, cgjax = _modules()
    shape = (2, 4, 256, 64)
    q, k, v = (_rand(shape, jnp.bfloat16, seed) for seed in (1, 2, 3))
    fwd = cgjax._cached_function(("sdpa", True, None), cgjax._sdpa_fwd_build(True, None))
    plan = fwd.plan_for(q, k, v)
    assert plan.registration.kind == "cudnn"
    o, stats = jx.jit(fwd)(q, k, v)
    _assert_jit_equals_eager(plan, (q, k, v), [o, stats], ["o", "stats"])
    _close(o, np.asarray(_attention_ref(jx, q, k, v)), "o vs jax", tolerance=3e-2)

    do = _rand(shape, jnp.bfloat16, 4)
    bwd = cgjax._cached_function(("sdpa_backward", True, None), cgjax._sdpa_bwd_build(True, None))
    bplan = bwd.plan_for(q, k, v, o, do, stats)
    assert bplan.registration.kind == "cudnn"
    grads = jx.jit(bwd)(q, k, v, o, do, stats)
    _assert_jit_equals_eager(bplan, (q, k, v, o, do, stats), grads, ["dQ", "dK", "dV"])

    loss = lambda f: (lambda *a: jnp.sum(f(*a).astype(jnp.float32) * do.astype(jnp.float32)))
    ours = jx.jit(jx.grad(loss(lambda *a: cgjax.sdpa(*a, causal=True)), argnums=(0, 1, 2)))(q, k, v)
    theirs = jx.grad(loss(lambda *a: _attention_ref(jx, *a)), argnums=(0, 1, 2))(q, k, v)
    for name, mine, want in zip(("dq", "dk", "dv"), ours, theirs):
        _close(mine, np.asarray(want.astype(jnp.float32)), f"{name} vs jax.grad", tolerance=5e-2)


# ---- gated delta net forward and backward (cuTile) -------------------------------------------------------------

def _gdn_inputs(jnp, T=256, H=2, K=128, V=128, per_channel=False):
    """gdn's inputs (kda's with ``per_channel``: g (T, H, K))."""
    r = np.random.default_rng(5)
    q = jnp.asarray((r.standard_normal((T, H, K)) * 0.1).astype(np.float32)).astype(jnp.bfloat16)
    k = jnp.asarray((r.standard_normal((T, H, K)) * 0.1).astype(np.float32)).astype(jnp.bfloat16)
    v = jnp.asarray(r.standard_normal((T, H, V)).astype(np.float32)).astype(jnp.bfloat16)
    g = jnp.asarray((-np.abs(r.standard_normal((T, H, K) if per_channel else (T, H))) * 0.05).astype(np.float32))
    beta = jnp.asarray(r.uniform(0.1, 0.9, (T, H)).astype(np.float32)).astype(jnp.bfloat16)
    cu = jnp.asarray(np.array([0, 100, T], np.int32))
    return q, k, v, g, beta, cu


def test_gdn_forward_and_backward_in_jit_equal_eager_and_match_the_reference_engine(jx):
    jnp, cudnn, cgjax = _modules()
    from cudnn_graph.errors import GraphNotSupportedError
    args = _gdn_inputs(jnp)
    fwd = cgjax._cached_function(("gdn", None, False), cgjax._la_fwd_build("gdn", None, False))
    try:
        plan = fwd.plan_for(*args)
    except GraphNotSupportedError as exc:
        pytest.skip(f"no GPU engine runs gdn here (cuTile not installed?): {exc}")
    o = jx.jit(fwd)(*args)
    _assert_jit_equals_eager(plan, args, [o], ["o"])
    host = [np.asarray(a) for a in args]
    with jx.default_device(jx.devices("cpu")[0]):
        want = np.asarray(cgjax.gdn(*[jnp.asarray(h) for h in host]))
    _close(o, want, "o vs reference engine", tolerance=3e-2)

    do = _rand((256, 2, 128), jnp.bfloat16, 6)
    bwd = cgjax._cached_function(("gdn_bwd", None, False), cgjax._la_bwd_build("gdn_bwd", None, False))
    bplan = bwd.plan_for(*args, do)
    grads = jx.jit(bwd)(*args, do)
    _assert_jit_equals_eager(bplan, (*args, do), grads, ["dq", "dk", "dv", "dg", "dbeta"])

    loss = lambda *a: jnp.sum(cgjax.gdn(*a).astype(jnp.float32) * do.astype(jnp.float32))
    ours = jx.jit(jx.grad(loss, argnums=(0, 1, 2, 3, 4)))(*args)
    with jx.default_device(jx.devices("cpu")[0]):
        cpu_args = [jnp.asarray(h) for h in host]
        cpu_do = jnp.asarray(np.asarray(do))
        theirs = jx.grad(lambda *a: jnp.sum(cgjax.gdn(*a).astype(jnp.float32) * cpu_do.astype(jnp.float32)),
                         argnums=(0, 1, 2, 3, 4))(*cpu_args)
    for name, mine, want in zip(("dq", "dk", "dv", "dg", "dbeta"), ours, theirs):
        _close(mine, np.asarray(want, np.float32), f"{name} vs the reference engine", tolerance=5e-2)


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_the_training_forward_keeps_its_chunk_cache_on_sm90_and_the_backward_reads_it(jx, op):
    """Under differentiation the BF16 forward also writes the chunk cache where a plan can (CuTe on sm_90), and
    the backward graph takes it with the checkpoints; the gradients are those of the graphs without it."""
    jnp, cudnn, cgjax = _modules()
    from cudnn_graph.errors import GraphNotSupportedError
    args = _gdn_inputs(jnp, per_channel=op == "kda")
    try:
        cgjax._cached_function((op, None, False), cgjax._la_fwd_build(op, None, False)).plan_for(*args)
    except GraphNotSupportedError as exc:
        pytest.skip(f"no GPU engine runs {op} here (cuTile not installed?): {exc}")
    do = _rand((256, 2, 128), jnp.bfloat16, 6)
    layer = getattr(cgjax, op)
    loss = lambda *a: jnp.sum(layer(*a).astype(jnp.float32) * do.astype(jnp.float32))
    ours = jx.jit(jx.grad(loss, argnums=(0, 1, 2, 3, 4)))(*args)
    forward = cgjax._FUNCTIONS[(op, None, False, "checkpoints")].plan_for(*args)
    names = [name for name, _, _, _ in forward.outputs]
    from cudnn_graph.engines.cutile.engine import _cute_device_reason
    if _cute_device_reason(forward.graph) is not None:
        assert names == ["o", "state_checkpoints"]
        pytest.skip(f"no plan keeps the chunk cache here: {_cute_device_reason(forward.graph)}")
    assert names == ["o", "state_checkpoints", "chunk_cache"]
    assert (f"{op}_bwd", None, False, "checkpoints", "chunk_cache") in cgjax._FUNCTIONS
    # the same gradients from the recomputing backward graph (no checkpoints, no cache)
    bwd = cgjax._cached_function((f"{op}_bwd", None, False), cgjax._la_bwd_build(f"{op}_bwd", None, False))
    for name, mine, again in zip(("dq", "dk", "dv", "dg", "dbeta"), ours, jx.jit(bwd)(*args, do)):
        _close(mine, np.asarray(again, np.float32), f"{name} with the cache vs the recomputing backward",
               tolerance=5e-2)
