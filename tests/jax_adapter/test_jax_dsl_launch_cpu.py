"""A DSL plan with a C launch (CuTe's PackedLaunch) runs inside the XLA FFI handler without the GIL: on
the CPU, a host graph's plan is given a stand-in compiled entry (C, built here) that computes
y = a + alpha * b from the addresses it is handed and records whether it held the GIL. The handler
packs XLA's buffers with dsl_fill and calls it; a misaligned buffer, a failed launch and a scalar
without a value behave as execute()'s path does.

Skipped where jax is not installed (or no C compiler is).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import cudnn_graph as cudnn
from _helpers import build_shared_library
from cudnn_graph._dsl_launch import PackedLaunch
from _jax_on_cpu import NEEDS_JAX, jax_on_cpu

pytestmark = NEEDS_JAX
jax = jnp = cgjax = None
F = cudnn.data_type

# Arguments: a, b, y (pointer slots), alpha (f32), n (int32), the stream, the result cell.
SOURCE = r"""
#include <stdint.h>
extern int PyGILState_Check(void);
struct seen { int calls; int held_gil; intptr_t stream; };
struct seen seen;
int32_t fail_with = 0;
void entry(void** args) {
    const float* a = *(float**)args[0];
    const float* b = *(float**)args[1];
    float* y = *(float**)args[2];
    float alpha = *(float*)args[3];
    int32_t n = *(int32_t*)args[4];
    for (int32_t i = 0; i < n; i++) y[i] = a[i] + alpha * b[i];
    seen.stream = *(intptr_t*)args[5];
    seen.held_gil = PyGILState_Check();
    seen.calls++;
    *(int32_t*)args[6] = fail_with;
}
"""


class Seen(ctypes.Structure):
    _fields_ = [("calls", ctypes.c_int), ("held_gil", ctypes.c_int), ("stream", ctypes.c_ssize_t)]


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    return ctypes.CDLL(str(build_shared_library(SOURCE, tmp_path_factory.mktemp("ffi_dsl"), "libffientry.so")))


@pytest.fixture(autouse=True)
def on_cpu():
    with jax_on_cpu(globals()):
        yield


def _graph_with_c_launch(lib, *, alpha=2.0, align_b=4):
    """A built host graph y = a + b (2, 3) float32 whose plan's one-call executor is the stand-in's
    PackedLaunch (as the CuTe engine's fast_executor gives one)."""
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    a = g.tensor(name="a", dim=[2, 3], stride=[3, 1])
    b = g.tensor(name="b", dim=[2, 3], stride=[3, 1])
    y = g.add(a, b).set_output(True).set_name("y")
    g.build([cudnn.heur_mode.A])
    compiled = g.compiled_plan()
    entry = ctypes.cast(lib.entry, ctypes.c_void_p).value
    launch = PackedLaunch.create(compiled.layout, entry, [0] * 7, (a.uid, b.uid, y.uid), (4, align_b, 4),
                                 ("a", "b", "y"), 1, (999_999,), (False,), (alpha,), (6,), 6, None)
    compiled.fast_executor = lambda layout: launch.execute_mapping
    return g, a, b, y


def _seen(lib) -> Seen:
    return Seen.in_dll(lib, "seen")


def _inputs():
    r = np.random.default_rng(3)
    return r.standard_normal((2, 3)).astype(np.float32), r.standard_normal((2, 3)).astype(np.float32)


def _runtime_error(call, match):
    with pytest.raises(Exception, match=match) as info:
        jax.block_until_ready(call())
    assert isinstance(info.value, (jax.errors.JaxRuntimeError, ValueError)), type(info.value)


def test_the_handler_calls_a_plans_c_launch_without_the_gil(stand_in):
    g, a, b, y = _graph_with_c_launch(stand_in)
    f = cgjax.wrap(g, [a, b], [y])
    assert f.registration.kind == "dsl" and f.registration.command_buffer_compatible is False
    A, B = _inputs()
    before = _seen(stand_in).calls
    got = np.asarray(jax.jit(f)(jnp.asarray(A), jnp.asarray(B)))
    np.testing.assert_array_equal(got, A + np.float32(2.0) * B)        # the stand-in's, not the graph's a + b
    seen = _seen(stand_in)
    assert seen.calls == before + 1
    assert seen.held_gil == 0 and seen.stream == 0                      # host plan: no stream


def test_a_buffer_misaligned_for_the_kernel_is_an_error_naming_the_tensor(stand_in):
    g, a, b, y = _graph_with_c_launch(stand_in, align_b=1 << 40)
    f = cgjax.wrap(g, [a, b], [y])
    before = _seen(stand_in).calls
    A, B = _inputs()
    _runtime_error(lambda: f(jnp.asarray(A), jnp.asarray(B)),
                   rf"INVALID_ARGUMENT.*tensor 'b' \(uid {b.uid}\): expected a data address aligned to "
                   rf"{1 << 40} bytes")
    assert _seen(stand_in).calls == before


def test_a_failed_launch_is_a_typed_ffi_error(stand_in):
    g, a, b, y = _graph_with_c_launch(stand_in)
    f = cgjax.wrap(g, [a, b], [y])
    fail = ctypes.c_int32.in_dll(stand_in, "fail_with")
    fail.value = 719
    try:
        A, B = _inputs()
        _runtime_error(lambda: f(jnp.asarray(A), jnp.asarray(B)), "kernel launch failed: CUDA error 719")
    finally:
        fail.value = 0


def test_a_launch_with_a_scalar_without_a_value_keeps_the_gil_fallback(stand_in):
    g, a, b, y = _graph_with_c_launch(stand_in, alpha=None)
    f = cgjax.wrap(g, [a, b], [y])
    assert f.registration.kind == "python"
    A, B = _inputs()
    np.testing.assert_allclose(np.asarray(f(jnp.asarray(A), jnp.asarray(B))), A + B, rtol=1e-6)
