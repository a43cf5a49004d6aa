"""Per-device plans on GPUs (issue 27): the handler finds the device a call runs on from XLA's stream and
runs that device's plan; a plan of another device is refused. With two GPUs, ``jax.shard_map`` over a
2-device mesh runs data-parallel matmul+bias+relu, SDPA forward+backward and a gated-delta-net layer,
each device computing its shard with its own plan, equal to the single-device run on the same data.

One GPU: the two-GPU tests skip, naming the missing second GPU. Run with
XLA_PYTHON_CLIENT_PREALLOCATE=false (cudnn_graph allocates device memory next to XLA's).
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def jx():
    from gpu_support import jax_gpu
    return jax_gpu()


@pytest.fixture(autouse=True)
def no_forged_device():
    yield
    from cudnn_graph import _xla_ffi
    _xla_ffi.override_call_device(None)


@pytest.fixture
def router():
    from cudnn_graph.router import PreferFamily, set_default_router, get_default_router
    previous = get_default_router()
    yield lambda *families: set_default_router(PreferFamily(*families))
    set_default_router(previous)


def _two_gpus(jx):
    gpus = jx.devices("gpu")
    if len(gpus) < 2:
        pytest.skip(f"needs a second GPU: jax sees {len(gpus)} ({', '.join(str(d) for d in gpus)})")
    return gpus[:2]


def _shard_map(jx):
    found = getattr(jx, "shard_map", None)
    if found is None:
        from jax.experimental.shard_map import shard_map as found
    return found


def _rand(jnp, shape, dtype, seed, scale=1.0):
    values = np.random.default_rng(seed).standard_normal(shape) * scale
    return jnp.asarray(values.astype(np.float32)).astype(dtype)


def _bits(array) -> np.ndarray:
    host = np.asarray(array)
    return host.view(f"u{host.dtype.itemsize}")


def _runtime_error(jx, call, match):
    with pytest.raises(Exception, match=match) as info:
        jx.block_until_ready(call())
    assert isinstance(info.value, (jx.errors.JaxRuntimeError, ValueError)), type(info.value)


def _modules():
    import jax.numpy as jnp
    import cudnn_graph.jax as cgjax
    from cudnn_graph import _xla_ffi
    return jnp, cgjax, _xla_ffi


# ---- one GPU: the lookup from XLA's stream, and the refusal of another device's plan ------------------------

@pytest.mark.parametrize("family", ["cudnn", "python"], ids=["cudnn", "cute"])
def test_a_jitted_call_runs_the_plan_of_the_device_its_stream_belongs_to(jx, router, family):
    jnp, cgjax, ffi = _modules()
    router(family)
    fn = cgjax.function(cgjax._matmul_bias_relu_build, name=f"devices_mbr_{family}")
    a, b = _rand(jnp, (2, 128, 64), jnp.bfloat16, 1), _rand(jnp, (2, 64, 96), jnp.bfloat16, 2)
    bias = _rand(jnp, (1, 1, 96), jnp.bfloat16, 3)
    ffi.reset_calls_by_device()
    got = jx.jit(fn)(a, b, bias)
    jx.block_until_ready(got)
    (call,) = fn.families.values()
    members = ffi.family_members(call.family_id)
    gpus = jx.devices("gpu")
    assert sorted(members) == sorted(cgjax._ordinal(d) for d in gpus)   # every local GPU's plan, at trace time
    for ordinal, plan in call.plans.items():
        assert plan.registration.device == ordinal and members[ordinal] == plan.registration.plan_id
    device = cgjax._ordinal(a.devices().pop())
    assert ffi.last_call_device() == (device, "stream")
    assert ffi.calls_by_device() == {device: 1}
    plan = call.plans[device]
    if family == "python" and 20_100 <= plan.graph.selected_plan.engine_id < 20_200 and device == 0:
        from cudnn_graph.engines.cute import engine as cute_engine
        assert plan.registration.kind == ("dsl" if cute_engine.C_LAUNCH else "python")
    want = jnp.maximum(jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32)) + bias.astype(jnp.float32), 0)
    from gpu_support import assert_close
    assert_close(np.asarray(got, np.float32), np.asarray(want), "float32", "y vs jnp", tolerance=3e-2)


def test_a_plan_of_device_0_on_a_forged_device_is_refused_naming_both(jx, router):
    jnp, cgjax, ffi = _modules()
    router("cudnn")
    fn = cgjax.function(cgjax._matmul_bias_relu_build, name="devices_forged")
    a, b = _rand(jnp, (1, 64, 64), jnp.float16, 1), _rand(jnp, (1, 64, 64), jnp.float16, 2)
    bias = _rand(jnp, (1, 1, 64), jnp.float16, 3)
    plan = fn.plan_for(a, b, bias, device="cuda:0")
    pinned = cgjax.wrap(plan.graph, *_tensors(plan))
    forged = len(jx.devices("gpu"))         # an ordinal no local GPU has: no family has its plan
    ffi.override_call_device(forged)
    _runtime_error(jx, lambda: jx.jit(pinned)(a, b, bias),
                   rf"INVALID_ARGUMENT.*plan {pinned.registration.plan_id} was built for cuda:0; XLA runs this "
                   rf"call on cuda:{forged}")
    _runtime_error(jx, lambda: jx.jit(fn)(a, b, bias), rf"NOT_FOUND.*has no plan for cuda:{forged}")
    ffi.override_call_device(None)
    expected = np.asarray(jx.jit(pinned)(a, b, bias))
    np.testing.assert_array_equal(_bits(jx.jit(fn)(a, b, bias)), _bits(expected))


def _tensors(plan):
    """The registered plan's graph's input and output Tensors, in the call's order."""
    by_uid = {t.uid: t for t in plan.graph.tensors}
    return [by_uid[e[1]] for e in plan.inputs], [by_uid[e[1]] for e in plan.outputs]


def test_a_function_pinned_to_another_gpu_is_refused_on_this_one(jx):
    jnp, cgjax, ffi = _modules()
    gpus = jx.devices("gpu")
    if len(gpus) < 2:
        pytest.skip(f"needs a second GPU: jax sees {len(gpus)} (a plan for cuda:1 cannot be built here)")
    fn = cgjax.function(cgjax._matmul_bias_relu_build, device="cuda:1", name="devices_pinned")
    a = jx.device_put(_rand(jnp, (1, 64, 64), jnp.float16, 1), gpus[0])
    _runtime_error(jx, lambda: jx.jit(fn)(a, a, a[:, :1, :]), "has no plan for cuda:0")


# ---- two GPUs: shard_map over a 2-device mesh ------------------------------------------------------------

def _mesh(jx):
    from jax.sharding import Mesh
    return Mesh(np.array(_two_gpus(jx)), ("x",))


def _on(jx, device, arrays):
    return [jx.device_put(a, device) for a in arrays]


def _assert_equal_to_single_device(jx, sharded, per_shard, whole, names, tolerance):
    """``sharded`` (the mesh's outputs) equals, bit for bit, the same shards run one after another on one
    device (the same plans' shapes; where two single-device runs agree bitwise), and matches the
    unsharded single-device run within ``tolerance``."""
    from gpu_support import assert_close
    for name, got, shards, full in zip(names, sharded, per_shard, whole):
        got = np.asarray(got)
        again = np.concatenate([np.asarray(s) for s in shards[1]], axis=shards[0])
        first = np.concatenate([np.asarray(s) for s in shards[2]], axis=shards[0])
        if np.array_equal(_bits(again), _bits(first)):
            assert np.array_equal(_bits(got), _bits(first)), f"{name}: the mesh's shards differ from one device's"
        else:
            assert_close(got.astype(np.float32), first.astype(np.float32), "float32", name, tolerance=tolerance)
        assert_close(got.astype(np.float32), np.asarray(full, np.float32), "float32", f"{name} vs unsharded",
                     tolerance=tolerance)


def _per_shard(jx, fn, shards, axis):
    """(axis, run 1, run 2): each output's shards of ``fn`` run on the first GPU, twice."""
    runs = []
    for _ in range(2):
        outs = [fn(*_on(jx, jx.devices("gpu")[0], s)) for s in shards]
        outs = [o if isinstance(o, (tuple, list)) else (o,) for o in outs]
        runs.append([[o[i] for o in outs] for i in range(len(outs[0]))])
    return [(axis, runs[0][i], runs[1][i]) for i in range(len(runs[0]))]


def test_shard_map_runs_data_parallel_matmul_bias_relu_per_device(jx):
    jnp, cgjax, ffi = _modules()
    from jax.sharding import PartitionSpec as P
    mesh = _mesh(jx)
    a, b = _rand(jnp, (4, 128, 64), jnp.bfloat16, 1), _rand(jnp, (4, 64, 96), jnp.bfloat16, 2)
    bias = _rand(jnp, (1, 1, 96), jnp.bfloat16, 3)
    step = jx.jit(_shard_map(jx)(cgjax.matmul_bias_relu, mesh=mesh, in_specs=(P("x"), P("x"), P()),
                                 out_specs=P("x")))
    ffi.reset_calls_by_device()
    got = step(a, b, bias)
    jx.block_until_ready(got)
    assert set(ffi.calls_by_device()) == {0, 1}, ffi.calls_by_device()
    single = jx.jit(cgjax.matmul_bias_relu)
    per_shard = _per_shard(jx, single, [(a[:2], b[:2], bias), (a[2:], b[2:], bias)], 0)
    whole = [single(*_on(jx, jx.devices("gpu")[0], (a, b, bias)))]
    _assert_equal_to_single_device(jx, [got], per_shard, whole, ["y"], 3e-2)


def test_shard_map_runs_sdpa_forward_and_backward_per_device(jx):
    jnp, cgjax, ffi = _modules()
    from jax.sharding import PartitionSpec as P
    mesh = _mesh(jx)
    shape = (4, 4, 256, 64)
    q, k, v, do = (_rand(jnp, shape, jnp.bfloat16, seed) for seed in (1, 2, 3, 4))

    def step(q, k, v, do):
        o, pullback = jx.vjp(lambda q, k, v: cgjax.sdpa(q, k, v, causal=True), q, k, v)
        return (o, *pullback(do))

    sharded = jx.jit(_shard_map(jx)(step, mesh=mesh, in_specs=(P("x"),) * 4, out_specs=(P("x"),) * 4))
    ffi.reset_calls_by_device()
    got = sharded(q, k, v, do)
    jx.block_until_ready(got)
    assert set(ffi.calls_by_device()) == {0, 1}, ffi.calls_by_device()
    single = jx.jit(step)
    per_shard = _per_shard(jx, single, [(q[:2], k[:2], v[:2], do[:2]), (q[2:], k[2:], v[2:], do[2:])], 0)
    whole = single(*_on(jx, jx.devices("gpu")[0], (q, k, v, do)))
    _assert_equal_to_single_device(jx, got, per_shard, whole, ["o", "dq", "dk", "dv"], 5e-2)


def test_shard_map_runs_a_gated_delta_net_layer_per_device(jx):
    jnp, cgjax, ffi = _modules()
    from jax.sharding import PartitionSpec as P
    from cudnn_graph.errors import GraphNotSupportedError
    mesh = _mesh(jx)
    T, H, K, V = 256, 4, 128, 128
    r = np.random.default_rng(5)
    q = jnp.asarray((r.standard_normal((T, H, K)) * 0.1).astype(np.float32)).astype(jnp.bfloat16)
    k = jnp.asarray((r.standard_normal((T, H, K)) * 0.1).astype(np.float32)).astype(jnp.bfloat16)
    v = jnp.asarray(r.standard_normal((T, H, V)).astype(np.float32)).astype(jnp.bfloat16)
    g = jnp.asarray((-np.abs(r.standard_normal((T, H))) * 0.05).astype(np.float32))
    beta = jnp.asarray(r.uniform(0.1, 0.9, (T, H)).astype(np.float32)).astype(jnp.bfloat16)
    cu = jnp.asarray(np.array([0, 100, T], np.int32))
    do = _rand(jnp, (T, H, V), jnp.bfloat16, 6)

    def layer(q, k, v, g, beta, cu, do):       # heads are independent: data-parallel over H
        o, pullback = jx.vjp(lambda q, k, v, g, beta: cgjax.gdn(q, k, v, g, beta, cu), q, k, v, g, beta)
        return (o, *pullback(do))

    heads = P(None, "x")
    sharded = jx.jit(_shard_map(jx)(layer, mesh=mesh, in_specs=(heads,) * 5 + (P(), heads),
                                    out_specs=(heads,) * 6))
    try:
        got = sharded(q, k, v, g, beta, cu, do)
    except GraphNotSupportedError as exc:
        pytest.skip(f"no GPU engine runs gdn here (cuTile not installed?): {exc}")
    jx.block_until_ready(got)
    single = jx.jit(layer)
    halves = [tuple(x[:, :2] for x in (q, k, v, g, beta)) + (cu, do[:, :2]),
              tuple(x[:, 2:] for x in (q, k, v, g, beta)) + (cu, do[:, 2:])]
    per_shard = _per_shard(jx, single, halves, 1)
    whole = single(*_on(jx, jx.devices("gpu")[0], (q, k, v, g, beta, cu, do)))
    _assert_equal_to_single_device(jx, got, per_shard, whole, ["o", "dq", "dk", "dv", "dg", "dbeta"], 5e-2)
