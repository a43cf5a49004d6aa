"""Host scalars as pass-by-value inputs, as cudnn.pygraph code writes them: ``graph.tensor_like(eps_cpu)`` of a
one-element host tensor (cudnn-frontend's rmsnorm, batchnorm and instancenorm tests) makes a pass-by-value
tensor on a GPU graph, and at execute a host buffer given for it is read by value.

CPU tests run on the reference engine with NumPy buffers, plus the cuDNN lowering (no GPU needed); the GPU
tests run rmsnorm on the cuDNN backend with CuPy buffers and a NumPy epsilon.
"""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph.engines import manifest
from cudnn_graph.engines.cudnn_backend import lower_program
from cudnn_graph.engines.reference import ReferenceEngine
from cudnn_graph.errors import DeviceMismatchError

F = cudnn.data_type
TRAINING = cudnn.norm_forward_phase.TRAINING


def fake_gpu_buffer(shape=(4, 8, 1, 1), dtype="float32", device="cuda:0"):
    """A device buffer's geometry (never dereferenced on the CPU machine)."""
    return cudnn.Slot.from_address(0x7F0000000000, shape, dtype=dtype, device=device)


def host_eps(value=1e-3):
    return np.full((1, 1, 1, 1), value, np.float32)


# ---- tensor_like ---------------------------------------------------------------------------------------

def test_a_host_scalar_template_on_a_gpu_graph_is_pass_by_value():
    g = cudnn.pygraph()
    x = g.tensor_like(fake_gpu_buffer(), name="x")
    eps = g.tensor_like(host_eps(), name="eps")
    assert eps.is_pass_by_value and eps.get_is_pass_by_value()
    assert (eps.dim, eps.stride, eps.data_type) == ((1, 1, 1, 1), (1, 1, 1, 1), F.FLOAT)
    assert not x.is_pass_by_value
    assert g.device == ("cuda", 0)


def test_a_host_scalar_first_leaves_the_device_to_the_next_template():
    g = cudnn.pygraph()
    eps = g.tensor_like(np.array([0.5], np.float32), name="eps")
    g.tensor_like(fake_gpu_buffer(device="cuda:1"), name="x")
    assert eps.is_pass_by_value and g.device == ("cuda", 1)


def test_a_larger_host_template_on_a_gpu_graph_is_refused_naming_it():
    g = cudnn.pygraph(device="cuda:0")
    with pytest.raises(DeviceMismatchError, match="'scale'.*one-element host tensor") as e:
        g.tensor_like(np.ones((1, 8, 1, 1), np.float32), name="scale")
    assert "cpu" in str(e.value) and g.tensors == ()


def test_host_graphs_keep_ordinary_host_operands():
    g = cudnn.pygraph()
    x = g.tensor_like(np.zeros((4, 8), np.float32), name="x")
    eps = g.tensor_like(host_eps(), name="eps")
    assert not x.is_pass_by_value and eps.is_pass_by_value
    assert g.device == ("cpu", 0)


def test_tensor_like_takes_is_virtual_as_pygraph_does():
    g = cudnn.pygraph(device="cpu")
    t = g.tensor_like(np.zeros((2, 3), np.float32), name="t", is_virtual=True)
    assert t.is_virtual and t.dim == (2, 3)
    copy = g.tensor_like(g.tensor_like(host_eps()), name="copy")
    assert copy.is_pass_by_value and not copy.is_virtual


def test_the_cudnn_lowering_passes_the_host_scalar_by_value_each_execute():
    g = cudnn.pygraph(io_data_type=F.FLOAT, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT)
    x = g.tensor_like(fake_gpu_buffer((8, 16, 1, 1)), name="x")
    scale = g.tensor_like(fake_gpu_buffer((1, 16, 1, 1)), name="scale")
    eps = g.tensor_like(host_eps(), name="eps")
    y, inv_var = g.rmsnorm(norm_forward_phase=TRAINING, input=x, scale=scale, epsilon=eps)
    y.set_output(True)
    inv_var.set_output(True).set_data_type(F.FLOAT)
    g.validate()
    program = lower_program(g)
    desc = next(a for a in program.of_kind("TENSOR") if a["CUDNN_ATTR_TENSOR_UNIQUE_ID"] == eps.uid)
    assert desc["CUDNN_ATTR_TENSOR_IS_BY_VALUE"] is True
    assert all(uid != eps.uid for uid, _, _ in program.constants)   # a value given per execute, not baked in


# ---- execute on the reference engine -----------------------------------------------------------------

@pytest.fixture
def reference_only(monkeypatch):
    monkeypatch.setattr(manifest, "_loaded", [ReferenceEngine()])


def rmsnorm_f64(x, scale, eps):
    x = x.astype(np.float64)
    inv = 1.0 / np.sqrt((x * x).mean(axis=(1, 2, 3), keepdims=True) + eps)
    return x * inv * scale, inv


def host_rmsnorm_graph(x, scale, eps):
    g = cudnn.pygraph(io_data_type=F.FLOAT, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT)
    tx, ts, te = g.tensor_like(x, name="x"), g.tensor_like(scale, name="scale"), g.tensor_like(eps, name="eps")
    y, inv_var = g.rmsnorm(norm_forward_phase=TRAINING, input=tx, scale=ts, epsilon=te)
    y.set_output(True)
    inv_var.set_output(True).set_data_type(F.FLOAT)
    g.build([cudnn.heur_mode.A])
    return g, tx, ts, te, y, inv_var


@pytest.mark.parametrize("eps_buffer", [host_eps(0.25), np.array([0.25], np.float32)],
                         ids=["as declared", "layout-identical (1,)"])
def test_rmsnorm_reads_epsilon_from_a_host_buffer(reference_only, eps_buffer):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 8, 1, 1)).astype(np.float32)
    scale = (1 + 0.1 * rng.standard_normal((1, 8, 1, 1))).astype(np.float32)
    g, tx, ts, te, y, inv_var = host_rmsnorm_graph(x, scale, host_eps(1e-3))
    assert te.is_pass_by_value
    out, inv = np.zeros_like(x), np.zeros((4, 1, 1, 1), np.float32)
    g.execute({tx: x, ts: scale, te: eps_buffer, y: out, inv_var: inv})
    want_y, want_inv = rmsnorm_f64(x, scale, 0.25)                  # the value given, not the template's
    np.testing.assert_allclose(out, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(inv, want_inv, rtol=1e-5)


# ---- GPU: the cuDNN backend -----------------------------------------------------------------------------

def _cudnn_rmsnorm(cp, rows=64, hidden=128):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((rows, hidden, 1, 1)).astype(np.float32)
    scale = (1 + 0.1 * rng.standard_normal((1, hidden, 1, 1))).astype(np.float32)
    xd, sd = cp.asarray(x), cp.asarray(scale)
    g = cudnn.pygraph(io_data_type=F.FLOAT, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT)
    tx, ts = g.tensor_like(xd, name="x"), g.tensor_like(sd, name="scale")
    te = g.tensor_like(host_eps(), name="eps")
    y, inv_var = g.rmsnorm(norm_forward_phase=TRAINING, input=tx, scale=ts, epsilon=te)
    y.set_output(True)
    inv_var.set_output(True).set_data_type(F.FLOAT)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    ws = cp.empty(max(g.get_workspace_size(), 1), cp.uint8)
    yd, invd = cp.zeros_like(xd), cp.zeros((rows, 1, 1, 1), cp.float32)
    feeds = {tx: xd, ts: sd, y: yd, inv_var: invd}
    return g, x, scale, te, feeds, yd, invd, ws


@pytest.mark.gpu
def test_rmsnorm_epsilon_from_a_host_tensor_runs_on_cudnn():
    cp = pytest.importorskip("cupy")
    g, x, scale, te, feeds, yd, invd, ws = _cudnn_rmsnorm(cp)
    assert te.is_pass_by_value and g.device == ("cuda", 0)
    eps_buffer = host_eps()
    # The value is read at every execute: changed in place at the same address, and each value executed
    # twice (a repeated pack is where a CUDA-graph replay would freeze a host operand's value).
    for eps in (1e-3, 0.5, 0.5, 2.0, 2.0):
        eps_buffer[...] = eps
        g.execute({**feeds, te: eps_buffer}, ws)
        cp.cuda.runtime.deviceSynchronize()
        want_y, want_inv = rmsnorm_f64(x, scale, eps)
        np.testing.assert_allclose(cp.asnumpy(yd), want_y, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(cp.asnumpy(invd), want_inv, rtol=2e-3)
    g.execute({**feeds, te: np.array([0.25], np.float32)}, ws)      # a (1,) buffer: the same bytes
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_allclose(cp.asnumpy(yd), rmsnorm_f64(x, scale, 0.25)[0], rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
def test_a_device_buffer_for_a_host_scalar_is_refused_naming_it():
    cp = pytest.importorskip("cupy")
    g, x, scale, te, feeds, yd, invd, ws = _cudnn_rmsnorm(cp)
    with pytest.raises(DeviceMismatchError, match=r"'eps'.*expected cpu.*got cuda:0"):
        g.execute({**feeds, te: cp.asarray(host_eps())}, ws)


@pytest.mark.gpu
def test_rmsnorm_epsilon_from_a_torch_cpu_tensor_as_the_frontend_tests_write_it():
    """cudnn-frontend's test_rmsnorm shape of code: torch CUDA buffers, epsilon a CPU torch tensor."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    rows, hidden = 256, 64
    x = 2 * torch.randn(rows, hidden, 1, 1, device="cuda") - 1.25
    scale = 3 * torch.randn(1, hidden, 1, 1, device="cuda") - 2.75
    eps_cpu = torch.full((1, 1, 1, 1), 1e-3, device="cpu", dtype=torch.float32)
    g = cudnn.pygraph(intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT)
    tx, ts, te = g.tensor_like(x), g.tensor_like(scale), g.tensor_like(eps_cpu)
    y, inv_var = g.rmsnorm(name="RMS", norm_forward_phase=TRAINING, input=tx, scale=ts, epsilon=te)
    y.set_output(True).set_data_type(F.FLOAT)
    inv_var.set_output(True).set_data_type(F.FLOAT)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    y_out, inv_out = torch.empty_like(x), torch.empty(rows, 1, 1, 1, device="cuda")
    ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    g.execute({tx: x, ts: scale, te: eps_cpu, y: y_out, inv_var: inv_out}, ws)
    torch.cuda.synchronize()
    want_y, want_inv = rmsnorm_f64(x.cpu().numpy(), scale.cpu().numpy(), 1e-3)
    np.testing.assert_allclose(y_out.cpu().numpy(), want_y, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(inv_out.cpu().numpy(), want_inv, rtol=2e-3)
