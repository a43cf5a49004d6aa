"""cudnn_graph.jax on the CPU: host graphs run through XLA's real FFI protocol (the handler decodes the
buffers, reads plan_id, checks the geometry, and the reference engine executes through the GIL fallback).

Skipped where jax is not installed (CI installs none). Every test pins jax's CPU device, so the file
means the same on a GPU machine.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import _xla_ffi
from cudnn_graph.data_type import data_type_of
from cudnn_graph.errors import DataTypeMismatchError, FfiRegistrationError, ShapeMismatchError
from _jax_on_cpu import NEEDS_JAX, jax_on_cpu

pytestmark = NEEDS_JAX
jax = jnp = cgjax = None
F = cudnn.data_type


@pytest.fixture(autouse=True)
def on_cpu():
    with jax_on_cpu(globals()):
        yield


def _host_matmul(m=4, k=3, n=2, stride_a=None):
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    a = g.tensor(name="a", dim=[1, m, k], stride=stride_a or [m * k, k, 1])
    b = g.tensor(name="b", dim=[1, k, n], stride=[k * n, n, 1])
    y = g.relu(g.matmul(a, b)).set_output(True).set_name("y")
    g.build([cudnn.heur_mode.A])
    return g, a, b, y


def _rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _runtime_error(call, match):
    """The call fails inside XLA with the handler's message: jax raises it (never a crash)."""
    with pytest.raises(Exception, match=match) as info:
        jax.block_until_ready(call())
    assert isinstance(info.value, (jax.errors.JaxRuntimeError, ValueError)), type(info.value)


# ---- the handler protocol ----------------------------------------------------------------------------------

def test_the_handler_reports_the_installed_jaxlib_api_version():
    cgjax.register_targets("cpu")
    want = cgjax._framework_api_version()
    assert want is not None and _xla_ffi.reported_api_version() == want
    assert _xla_ffi.header_api_version()[0] == want[0]


def test_registering_the_targets_twice_is_a_no_op():
    cgjax.register_targets("cpu")
    cgjax.register_targets("CPU")


def test_a_wrapped_host_graph_runs_eagerly_and_under_jit_like_execute():
    g, a, b, y = _host_matmul()
    f = cgjax.wrap(g, [a, b], [y])
    A, B = _rand(1, 4, 3, seed=1), _rand(1, 3, 2, seed=2)
    want = np.zeros((1, 4, 2), np.float32)
    g.execute({a: A, b: B, y: want})
    eager = np.asarray(f(jnp.asarray(A), jnp.asarray(B)))
    jitted = np.asarray(jax.jit(f)(jnp.asarray(A), jnp.asarray(B)))
    np.testing.assert_array_equal(eager, want)
    np.testing.assert_array_equal(jitted, want)
    assert f.registration.kind == "python" and f.registration.device == -1
    assert f.registration.command_buffer_compatible is False


def test_a_mismatched_argument_names_the_tensor_at_trace_time():
    g, a, b, y = _host_matmul()
    f = jax.jit(cgjax.wrap(g, [a, b], [y]))
    with pytest.raises(ShapeMismatchError, match=r"tensor 'a' \(uid \d+\): shape expected \(1, 4, 3\); got \(1, 5, 3\)"):
        f(jnp.ones((1, 5, 3)), jnp.ones((1, 3, 2)))
    with pytest.raises(DataTypeMismatchError, match=r"tensor 'b' .*expected float32; got float16"):
        f(jnp.ones((1, 4, 3)), jnp.ones((1, 3, 2), jnp.float16))


def test_an_unknown_plan_id_is_a_typed_runtime_error():
    call = jax.ffi.ffi_call(cgjax.TARGET, jax.ShapeDtypeStruct((2,), jnp.float32))
    cgjax.register_targets("cpu")
    _runtime_error(lambda: call(jnp.ones((2,)), plan_id=np.int64(10 ** 12)), r"NOT_FOUND.*plan id 1000000000000 is not registered")


def test_a_call_without_the_plan_id_attribute_is_refused():
    cgjax.register_targets("cpu")
    call = jax.ffi.ffi_call(cgjax.TARGET, jax.ShapeDtypeStruct((2,), jnp.float32))
    _runtime_error(lambda: call(jnp.ones((2,))), "no int64 attribute 'plan_id'")


def test_the_handler_checks_each_buffer_against_the_declared_geometry():
    g, a, b, y = _host_matmul()
    f = cgjax.wrap(g, [a, b], [y])
    pid = np.int64(f.registration.plan_id)
    call = jax.ffi.ffi_call(cgjax.TARGET, jax.ShapeDtypeStruct((1, 4, 2), jnp.float32))
    _runtime_error(lambda: call(jnp.ones((1, 5, 3)), jnp.ones((1, 3, 2)), plan_id=pid),
                   r"argument 0, tensor 'a' \(uid \d+\): expected float32\[1,4,3\], got float32\[1,5,3\]")
    _runtime_error(lambda: call(jnp.ones((1, 4, 3)), jnp.ones((1, 3, 2), jnp.int32), plan_id=pid),
                   r"tensor 'b' .*expected float32\[1,3,2\], got int32\[1,3,2\]")
    _runtime_error(lambda: call(jnp.ones((1, 4, 3)), plan_id=pid), "the call has 1 arguments and 1 results")
    wrong_out = jax.ffi.ffi_call(cgjax.TARGET, jax.ShapeDtypeStruct((1, 4, 3), jnp.float32))
    _runtime_error(lambda: wrong_out(jnp.ones((1, 4, 3)), jnp.ones((1, 3, 2)), plan_id=pid),
                   r"result 0, tensor 'y' .*expected float32\[1,4,2\], got float32\[1,4,3\]")


def test_a_released_graph_leaves_the_table_and_its_id_fails():
    g, a, b, y = _host_matmul()
    f = cgjax.wrap(g, [a, b], [y])
    pid = f.registration.plan_id
    assert pid in _xla_ffi.registered_plans()
    del f, g, a, b, y
    gc.collect()
    assert pid not in _xla_ffi.registered_plans()
    call = jax.ffi.ffi_call(cgjax.TARGET, jax.ShapeDtypeStruct((1, 4, 2), jnp.float32))
    _runtime_error(lambda: call(jnp.ones((1, 4, 3)), jnp.ones((1, 3, 2)), plan_id=np.int64(pid)),
                   f"plan id {pid} is not registered")


def test_an_exception_in_the_python_engine_becomes_the_ffi_error(monkeypatch):
    g, a, b, y = _host_matmul()
    f = cgjax.wrap(g, [a, b], [y])

    def fail(*args, **kwargs):
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(_xla_ffi._python_plans[f.registration.plan_id], "run", fail)
    _runtime_error(lambda: f(jnp.ones((1, 4, 3)), jnp.ones((1, 3, 2))), r"\(RuntimeError\): engine exploded")


# ---- registration checks -------------------------------------------------------------------------------------

def test_strides_that_are_no_dense_buffer_are_refused_naming_the_tensor():
    g, a, b, y = _host_matmul(stride_a=[24, 6, 1])
    with pytest.raises(FfiRegistrationError, match=r"input 0 \(tensor 'a'\) has dims \(1, 4, 3\) and strides \(24, 6, 1\)"):
        cgjax.wrap(g, [a, b], [y])


def test_a_transposed_tensor_takes_its_memory_order_as_the_buffer_shape():
    g, a, b, y = _host_matmul(stride_a=[12, 1, 4])        # a (1, 4, 3) stored as (1, 3, 4)
    f = cgjax.wrap(g, [a, b], [y])
    assert f.inputs[0][2] == (1, 3, 4)
    A, B = _rand(1, 4, 3, seed=1), _rand(1, 3, 2, seed=2)
    got = jax.jit(f)(jnp.asarray(A.transpose(0, 2, 1)), jnp.asarray(B))
    np.testing.assert_allclose(np.asarray(got), np.maximum(A @ B, 0), rtol=1e-5, atol=1e-6)


def test_an_operand_the_call_does_not_pass_is_refused():
    g, a, b, y = _host_matmul()
    with pytest.raises(FfiRegistrationError, match="does not pass.*'b'"):
        cgjax.wrap(g, [a], [y])


def test_an_unbuilt_graph_is_built_on_wrap():
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    a = g.tensor(name="a", dim=[2, 3], stride=[3, 1])
    y = g.relu(a).set_output(True).set_name("y")
    f = cgjax.wrap(g, [a], [y])
    np.testing.assert_array_equal(np.asarray(f(jnp.asarray([[-1.0, 2, -3], [4, -5, 6]]))),
                                  [[0, 2, 0], [4, 0, 6]])


# ---- function(): one graph per avals ---------------------------------------------------------------------------

def _counting_add():
    built = []

    def build(x, y, device):
        built.append((x.shape, x.dtype.name, device))
        g = cudnn.pygraph(io_data_type=data_type_of(x.dtype.name), compute_data_type=F.FLOAT,
                          device=device)
        tx = g.tensor(name="x", dim=list(x.shape), stride=cgjax.row_major_strides(x.shape), data_type=g_type(x))
        ty = g.tensor(name="y", dim=list(y.shape), stride=cgjax.row_major_strides(y.shape), data_type=g_type(y))
        out = g.add(tx, ty).set_output(True).set_name("sum").set_data_type(g_type(x))
        return g, [tx, ty], [out]

    def g_type(aval):
        return data_type_of(aval.dtype.name)

    return cgjax.function(build), built


def test_function_builds_once_per_shapes_and_dtypes():
    add, built = _counting_add()
    x = jnp.ones((2, 3))
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(jax.jit(add)(x, x)), 2 * np.ones((2, 3)))
    add(x, x)
    assert built == [((2, 3), "float32", "cpu")]
    add(jnp.ones((4, 3)), jnp.ones((4, 3)))
    add(jnp.ones((2, 3), jnp.float16), jnp.ones((2, 3), jnp.float16))
    assert [b[:2] for b in built] == [((2, 3), "float32"), ((4, 3), "float32"), ((2, 3), "float16")]
    assert len(add.plans) == 3


def test_function_composes_with_jax_ops_under_jit():
    add, _ = _counting_add()
    x = jnp.arange(6.0).reshape(2, 3)
    got = jax.jit(lambda a: jnp.sin(add(a * 2, a)) + 1)(x)
    np.testing.assert_allclose(np.asarray(got), np.sin(3 * np.asarray(x)) + 1, rtol=1e-6)


def test_a_build_returning_the_wrong_thing_is_a_typed_error():
    f = cgjax.function(lambda x: 3)
    with pytest.raises(FfiRegistrationError, match="must return"):
        f(jnp.ones(2))


# ---- the ready-made functions and their gradients -----------------------------------------------------------

def test_matmul_bias_relu_matches_jax():
    a, b, bias = _rand(2, 4, 8, seed=1), _rand(2, 8, 5, seed=2), _rand(1, 1, 5, seed=3)
    got = jax.jit(cgjax.matmul_bias_relu)(a, b, bias)
    np.testing.assert_allclose(np.asarray(got), np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-5)


def _layernorm_ref(x, s, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + eps) * s + b


def test_layernorm_and_its_gradient_match_jax():
    x, s, b = _rand(2, 3, 8, seed=1), _rand(1, 1, 8, seed=2), _rand(1, 1, 8, seed=3)
    w = jnp.asarray(_rand(2, 3, 8, seed=4))
    np.testing.assert_allclose(np.asarray(jax.jit(cgjax.layernorm)(x, s, b)), np.asarray(_layernorm_ref(x, s, b)),
                               rtol=1e-5, atol=1e-5)
    ours = jax.jit(jax.grad(lambda *t: jnp.sum(cgjax.layernorm(*t) * w), argnums=(0, 1, 2)))(x, s, b)
    theirs = jax.grad(lambda *t: jnp.sum(_layernorm_ref(*t) * w), argnums=(0, 1, 2))(x, s, b)
    for name, o, t in zip(("dx", "dscale", "dbias"), ours, theirs):
        np.testing.assert_allclose(np.asarray(o), np.asarray(t), rtol=1e-4, atol=1e-4, err_msg=name)


def _attention_ref(q, k, v, causal):
    t = lambda a: a.transpose(0, 2, 1, 3)
    return t(jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=causal))


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_and_its_gradient_match_jax(causal):
    q, k, v = (_rand(1, 2, 8, 16, seed=i) for i in range(3))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda *a: cgjax.sdpa(*a, causal=causal))(q, k, v)),
                               np.asarray(_attention_ref(q, k, v, causal)), rtol=1e-5, atol=1e-5)
    w = jnp.asarray(_rand(1, 2, 8, 16, seed=7))
    ours = jax.jit(jax.grad(lambda *a: jnp.sum(cgjax.sdpa(*a, causal=causal) * w), argnums=(0, 1, 2)))(q, k, v)
    theirs = jax.grad(lambda *a: jnp.sum(_attention_ref(*a, causal) * w), argnums=(0, 1, 2))(q, k, v)
    for name, o, t in zip(("dq", "dk", "dv"), ours, theirs):
        np.testing.assert_allclose(np.asarray(o), np.asarray(t), rtol=1e-4, atol=1e-4, err_msg=name)


def _gdn_inputs(T=12, H=1, K=8, V=8, per_channel=False):
    r = np.random.default_rng(5)
    q = (r.standard_normal((T, H, K)) * 0.3).astype(np.float32)
    k = (r.standard_normal((T, H, K)) * 0.3).astype(np.float32)
    v = r.standard_normal((T, H, V)).astype(np.float32)
    g = (-np.abs(r.standard_normal((T, H, K) if per_channel else (T, H))) * 0.1).astype(np.float32)
    beta = r.uniform(0.1, 0.9, (T, H)).astype(np.float32)
    cu = np.array([0, 5, T], np.int32)
    return q, k, v, g, beta, cu


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_linear_attention_gradient_matches_finite_differences(op):
    fn = getattr(cgjax, op)
    args = _gdn_inputs(per_channel=op == "kda")
    w = jnp.asarray(_rand(12, 1, 8, seed=9))
    loss = lambda *a: jnp.sum(fn(*a) * w)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(*args)
    rng = np.random.default_rng(11)
    for i, name in enumerate(("q", "k", "v", "g", "beta")):
        direction = rng.standard_normal(args[i].shape)
        h = 1e-3
        plus = [a.astype(np.float64) for a in args[:5]]
        minus = [a.astype(np.float64) for a in args[:5]]
        plus[i] = plus[i] + h * direction
        minus[i] = minus[i] - h * direction
        f = lambda xs: float(loss(*[x.astype(np.float32) for x in xs], args[5]))
        numeric = (f(plus) - f(minus)) / (2 * h)
        analytic = float(np.sum(np.asarray(grads[i], np.float64) * direction))
        assert abs(numeric - analytic) <= 2e-2 * max(1.0, abs(numeric)), (name, numeric, analytic)


def test_gdn_under_jit_equals_eager_execute():
    args = _gdn_inputs()
    got = np.asarray(jax.jit(cgjax.gdn)(*args))
    plan = cgjax._FUNCTIONS[("gdn", None, False)].plan_for(*args)
    g = plan.graph
    want = np.zeros((12, 1, 8), np.float32)
    g.execute({**{uid: a for (_, uid, _, _), a in zip(plan.inputs, args)}, plan.outputs[0][1]: want})
    np.testing.assert_array_equal(got, want)


def test_gdn_under_grad_keeps_the_chunk_states_its_backward_starts_from():
    # the training forward also writes state_checkpoints (one a 64-token chunk) and the backward graph takes them
    args = _gdn_inputs()
    jax.grad(lambda *a: jnp.sum(cgjax.gdn(*a)), argnums=(0,))(*args)
    forward = cgjax._FUNCTIONS[("gdn", None, False, "checkpoints")].plan_for(*args)
    assert [name for name, _, _, _ in forward.outputs] == ["o", "state_checkpoints"]
    assert forward.outputs[1][2] == (12 // 64 + 2, 1, 8, 8)
