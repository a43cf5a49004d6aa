"""Per-device plans behind one custom call (issue 27), on the CPU through XLA's real FFI: a plan family
runs the member of the device XLA runs the call on, a device without a member and a plan of another
device are typed runtime errors naming the devices, and cudnn_graph.jax registers a plan for every
device a traced call may run on. ``override_call_device`` forges the call's device where this machine
has one; a subprocess with two forced host devices runs a real ``jax.shard_map``.

Skipped where jax is not installed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import _xla_ffi
from cudnn_graph.errors import FfiRegistrationError, InvalidArgumentError
from _jax_on_cpu import NEEDS_JAX, jax_on_cpu

pytestmark = NEEDS_JAX
jax = jnp = cgjax = None
F = cudnn.data_type


@pytest.fixture(autouse=True)
def on_cpu():
    with jax_on_cpu(globals()):
        cgjax.register_targets("cpu")
        yield
    _xla_ffi.override_call_device(None)


def _host_pointwise(op: str):
    """A built host graph y = op(x) over (2, 3) float32, wrapped as a custom call."""
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    x = g.tensor(name="x", dim=[2, 3], stride=[3, 1])
    y = getattr(g, op)(x).set_output(True).set_name("y")
    return cgjax.wrap(g, [x], [y])


def _call(plan_id, extra_results=()):
    call = jax.ffi.ffi_call(cgjax.TARGET, [jax.ShapeDtypeStruct((2, 3), jnp.float32), *extra_results])
    return lambda x: call(x, plan_id=np.int64(plan_id))


def _runtime_error(call, match):
    with pytest.raises(Exception, match=match) as info:
        jax.block_until_ready(call())
    assert isinstance(info.value, (jax.errors.JaxRuntimeError, ValueError)), type(info.value)


X = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)


def test_a_family_runs_the_member_of_the_calls_device():
    relu, neg = _host_pointwise("relu"), _host_pointwise("neg")
    family = _xla_ffi.register_family({0: relu.registration.plan_id, 1: neg.registration.plan_id}, on_cuda=False)
    assert _xla_ffi.family_members(family) == {0: relu.registration.plan_id, 1: neg.registration.plan_id}
    run = jax.jit(_call(family))
    np.testing.assert_array_equal(np.asarray(run(X)[0]), np.maximum(X, 0))       # XLA's host device 0
    assert _xla_ffi.last_call_device() == (0, "framework")
    _xla_ffi.override_call_device(1)
    np.testing.assert_array_equal(np.asarray(run(X + 0)[0]), -X)
    assert _xla_ffi.last_call_device() == (1, "override")
    _xla_ffi.override_call_device(0)
    np.testing.assert_array_equal(np.asarray(run(X + 1)[0]), np.maximum(X + 1, 0))


def test_a_device_without_a_member_is_a_not_found_error_naming_it():
    relu, neg = _host_pointwise("relu"), _host_pointwise("neg")
    family = _xla_ffi.register_family({0: relu.registration.plan_id, 1: neg.registration.plan_id}, on_cuda=False)
    _xla_ffi.override_call_device(3)
    _runtime_error(lambda: _call(family)(jnp.asarray(X)),
                   rf"NOT_FOUND.*plan family {family} has no plan for host device 3.*holds plans for host device 0, "
                   r"host device 1")


def test_a_plan_of_another_device_is_refused_naming_both_before_it_runs(monkeypatch):
    relu = _host_pointwise("relu")
    pid = relu.registration.plan_id
    ran = []
    monkeypatch.setattr(_xla_ffi._python_plans[pid], "run", lambda *a: ran.append(a))
    _xla_ffi.set_plan_device_for_tests(pid, 1)       # a plan of cuda:1 ...
    _xla_ffi.override_call_device(0)                 # ... called on cuda:0's buffers
    _runtime_error(lambda: _call(pid)(jnp.asarray(X)),
                   rf"INVALID_ARGUMENT.*plan {pid} was built for cuda:1; XLA runs this call on cuda:0")
    assert ran == []


def test_the_calls_resolved_per_device_are_counted():
    relu = _host_pointwise("relu")
    family = _xla_ffi.register_family({0: relu.registration.plan_id, 5: relu.registration.plan_id}, on_cuda=False)
    _xla_ffi.reset_calls_by_device()
    _xla_ffi.override_call_device(5)
    jax.block_until_ready(_call(family)(jnp.asarray(X)))
    jax.block_until_ready(_call(family)(jnp.asarray(X)))
    assert _xla_ffi.calls_by_device() == {5: 2}


def test_register_family_refuses_members_that_cannot_serve_their_device():
    relu = _host_pointwise("relu")
    pid = relu.registration.plan_id
    with pytest.raises(FfiRegistrationError, match=rf"member for cuda:0 \(plan {pid}\) was built for the host"):
        _xla_ffi.register_family({0: pid}, on_cuda=True)
    with pytest.raises(FfiRegistrationError, match=r"\(id 999999999\) is not a registered plan"):
        _xla_ffi.register_family({0: 999_999_999}, on_cuda=False)
    with pytest.raises(FfiRegistrationError, match="at least one member"):
        _xla_ffi.register_family({}, on_cuda=False)
    with pytest.raises(FfiRegistrationError, match="out of range"):
        _xla_ffi.register_family({64: pid}, on_cuda=False)
    family = _xla_ffi.register_family({0: pid}, on_cuda=False)
    with pytest.raises(FfiRegistrationError, match="is not a registered plan"):
        _xla_ffi.register_family({0: family}, on_cuda=False)        # families do not nest


def test_releasing_a_family_leaves_its_members():
    relu = _host_pointwise("relu")
    pid = relu.registration.plan_id
    family = _xla_ffi.register_family({0: pid}, on_cuda=False)
    _xla_ffi.release_plan(family)
    assert family not in _xla_ffi.registered_plans() and pid in _xla_ffi.registered_plans()
    _runtime_error(lambda: _call(family)(jnp.asarray(X)), f"plan id {family} is not registered")
    np.testing.assert_array_equal(np.asarray(_call(pid)(jnp.asarray(X))[0]), np.maximum(X, 0))


def test_a_plan_without_a_workspace_accepts_a_familys_workspace_result():
    relu = _host_pointwise("relu")
    pid = relu.registration.plan_id
    out, _ = _call(pid, [jax.ShapeDtypeStruct((256,), jnp.uint8)])(jnp.asarray(X))
    np.testing.assert_array_equal(np.asarray(out), np.maximum(X, 0))
    _runtime_error(lambda: _call(pid, [jax.ShapeDtypeStruct((4,), jnp.float32)])(jnp.asarray(X)),
                   "the last result must be the plan's workspace")
    two = [jax.ShapeDtypeStruct((4,), jnp.uint8)] * 2
    _runtime_error(lambda: _call(pid, two)(jnp.asarray(X)), "the call has 1 arguments and 3 results")


# ---- cudnn_graph.jax: which devices a call gets plans for ------------------------------------------------

def _counting_relu(**kwargs):
    built = []

    def build(x, device):
        built.append(device)
        g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device=device)
        tx = g.tensor(name="x", dim=list(x.shape), stride=cgjax.row_major_strides(x.shape))
        return g, [tx], [g.relu(tx).set_output(True).set_name("y")]

    return cgjax.function(build, **kwargs), built


def test_a_traced_call_carries_a_family_of_every_local_host_device():
    fn, built = _counting_relu()
    got = jax.jit(fn)(jnp.asarray(X))
    np.testing.assert_array_equal(np.asarray(got), np.maximum(X, 0))
    (family,) = fn.families.values()
    ordinals = sorted(cgjax._ordinal(d) for d in jax.local_devices(backend="cpu"))
    members = _xla_ffi.family_members(family.family_id)
    assert sorted(members) == ordinals
    assert len(set(members.values())) == 1 and built == ["cpu"]       # host devices share one plan
    fn(jnp.asarray(X))                                                  # eager: the same family and plan
    assert len(fn.families) == 1 and built == ["cpu"]


def test_a_cuda_device_jax_does_not_have_is_a_typed_error():
    fn, built = _counting_relu(devices=["cuda:7"])
    with pytest.raises(InvalidArgumentError, match="cuda:7"):
        fn(jnp.asarray(X))
    assert built == []


def test_members_follow_the_devices_given():
    fn, _ = _counting_relu(devices=jax.local_devices(backend="cpu")[:1])
    assert fn.members_for(jnp.asarray(X)) == {cgjax._ordinal(d): "cpu" for d in jax.local_devices(backend="cpu")}


# ---- a real shard_map over two host devices (a subprocess: the device count is fixed at jax's start) -------

SHARD_MAP_SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import numpy as np
    import jax, jax.numpy as jnp
    jax.config.update("jax_platforms", "cpu")
    from jax.sharding import Mesh, PartitionSpec as P
    import cudnn_graph.jax as cgjax
    from cudnn_graph import _xla_ffi

    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    r = np.random.default_rng(0)
    a, b = r.standard_normal((4, 8, 16), np.float32), r.standard_normal((4, 16, 8), np.float32)
    bias = r.standard_normal((1, 1, 8), np.float32)
    shard = jax.jit(jax.shard_map(cgjax.matmul_bias_relu, mesh=mesh, in_specs=(P("x"), P("x"), P()),
                                  out_specs=P("x")))
    got = np.asarray(shard(a, b, bias))
    whole = np.asarray(jax.jit(cgjax.matmul_bias_relu)(a, b, bias))
    np.testing.assert_allclose(got, whole, rtol=1e-6, atol=1e-6)

    q, k, v, w = (r.standard_normal((2, 2, 8, 16), np.float32) for _ in range(4))
    loss = lambda q, k, v: jnp.sum(cgjax.sdpa(q, k, v, causal=True) * w)
    spec = P("x")
    def sharded_loss(q, k, v):
        part = jax.shard_map(lambda q, k, v, w: jnp.sum(cgjax.sdpa(q, k, v, causal=True) * w)[None],
                             mesh=mesh, in_specs=(spec,) * 4, out_specs=P("x"))(q, k, v, w)
        return jnp.sum(part)
    mine = jax.jit(jax.grad(sharded_loss, argnums=(0, 1, 2)))(q, k, v)
    theirs = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for m, t in zip(mine, theirs):
        np.testing.assert_allclose(np.asarray(m), np.asarray(t), rtol=1e-5, atol=1e-5)
    calls = _xla_ffi.calls_by_device()
    assert set(calls) == {0, 1}, calls
    print("OK", calls)
""")


def test_shard_map_over_two_host_devices_runs_each_devices_member_and_equals_one_device():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, "-c", SHARD_MAP_SCRIPT], capture_output=True, text=True, cwd="/",
                          env=env, timeout=300)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr
