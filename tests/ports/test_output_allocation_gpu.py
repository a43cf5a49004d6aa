"""The cudnn.Graph wrapper on the GPU with CuPy, JAX, torch and numba inputs: the outputs a call
allocates come back in the caller's framework with the graph tensor's data type, device and strides,
and the right values; raw inputs get ``OwnedBuffer`` outputs that every framework reads.

Run on the H200: ``pytest -m gpu tests/ports/test_output_allocation_gpu.py``.
"""
import os

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import OwnedBuffer
from gpu_support import assert_close, jax_gpu

pytestmark = pytest.mark.gpu
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

F = cudnn.data_type
M, K, N = 64, 32, 48
rng = np.random.default_rng(1932)


def host_operands():
    a = rng.standard_normal((1, M, K)).astype(np.float32)
    b = rng.standard_normal((1, K, N)).astype(np.float32)
    return a, b


def matmul_wrapper(a, b, io_type, out_strides=None, **kwargs):
    """A wrapper graph ``mm`` (C = A @ B) built from the templates ``a``, ``b``."""
    with cudnn.Graph(io_data_type=io_type, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                     inputs=["mm::A", "mm::B"], outputs=["mm::C"], **kwargs) as graph:
        c = graph.matmul(A=a, B=b, name="mm")
        c.set_output(True)
        if out_strides is not None:
            c.set_stride(list(out_strides))
    return graph, c


def check_matmul(got_host, a, b, dtype_name):
    assert_close(got_host, np.matmul(a.astype(np.float32), b.astype(np.float32)), dtype_name, "mm::C")


def run_half_matmul(to_device, out_strides):
    """Build and call ``mm`` on float16 inputs made by ``to_device``: (output, C, host A, host B)."""
    a, b = (v.astype(np.float16) for v in host_operands())
    da, db = to_device(a), to_device(b)
    graph, c = matmul_wrapper(da, db, F.HALF, out_strides)
    return graph(da, db), c, a, b


# ---- torch ---------------------------------------------------------------------------------------

def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    return torch


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("out_strides", [None, (M * N, 1, M)], ids=["inferred", "column-major"])
def test_torch_inputs_get_torch_outputs(dtype, out_strides):
    torch = _torch()
    a, b = host_operands()
    ta = torch.from_numpy(a).to("cuda", getattr(torch, dtype))
    tb = torch.from_numpy(b).to("cuda", getattr(torch, dtype))
    graph, c = matmul_wrapper(ta, tb, getattr(torch, dtype), out_strides)
    out = graph(ta, tb)
    assert isinstance(out, torch.Tensor)
    assert out.dtype == getattr(torch, dtype) and out.device == ta.device
    assert tuple(out.shape) == c.dim and tuple(out.stride()) == c.stride
    if out_strides is not None:
        assert tuple(out.stride()) == out_strides
    torch.cuda.synchronize()
    check_matmul(out.float().cpu().numpy(), ta.float().cpu().numpy(), tb.float().cpu().numpy(), dtype)


def test_the_frontends_conv_sample_runs_unchanged_with_torch_channels_last():
    torch = _torch()
    handle = cudnn.create_handle()
    try:
        x = torch.randn(8, 64, 56, 56, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        w = torch.randn(32, 64, 3, 3, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        with cudnn.Graph(name="graph_0", io_data_type=cudnn.data_type.HALF, compute_data_type=cudnn.data_type.FLOAT,
                         inputs=["conv2d::image", "conv2d::weight"], outputs=["conv_out"]) as graph:
            y = graph.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], name="conv2d")
            y.set_output(True).set_name("conv_out")
        out = graph(x, w, handle=handle)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float16 and out.is_cuda
        assert tuple(out.stride()) == y.stride
        ref = torch.nn.functional.conv2d(x, w, padding=1)
        torch.testing.assert_close(out, ref, atol=5e-3, rtol=3e-3)
        # The dict form: the missing output is allocated under its "node::port" key, as cudnn-frontend does.
        result = graph({"conv2d::image": x, "conv2d::weight": w}, handle=handle)
        torch.testing.assert_close(result["conv2d::Y"], ref, atol=5e-3, rtol=3e-3)
    finally:
        cudnn.destroy_handle(handle)


def test_workspace_alloc_false_takes_a_torch_workspace():
    torch = _torch()
    a, b = host_operands()
    ta, tb = (torch.from_numpy(v).to("cuda", torch.float16) for v in (a, b))
    graph, _ = matmul_wrapper(ta, tb, F.HALF, workspace_alloc=False)
    with pytest.raises(cudnn.WrapperStateError, match="workspace"):
        graph(ta, tb)
    workspace = torch.empty(max(graph.get_workspace_size(), 1), dtype=torch.uint8, device="cuda")
    out = graph(ta, tb, workspace=workspace)
    torch.cuda.synchronize()
    check_matmul(out.float().cpu().numpy(), ta.float().cpu().numpy(), tb.float().cpu().numpy(), "float16")


# ---- CuPy ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("out_strides", [None, (M * N, 1, M)], ids=["inferred", "column-major"])
def test_cupy_inputs_get_cupy_outputs(out_strides):
    cp = pytest.importorskip("cupy")
    out, c, a, b = run_half_matmul(cp.asarray, out_strides)
    assert isinstance(out, cp.ndarray) and out.dtype == np.float16 and out.device.id == cp.cuda.Device().id
    assert out.shape == c.dim and tuple(s // out.itemsize for s in out.strides) == c.stride
    cp.cuda.Device().synchronize()
    check_matmul(cp.asnumpy(out), a, b, "float16")


def test_cupy_bfloat16_outputs_fall_back_to_an_owned_buffer_cupy_and_torch_read():
    cp = pytest.importorskip("cupy")
    import ml_dtypes
    a, b = host_operands()
    a16, b16 = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    # CuPy holds no bfloat16: its bits go in through Slots (the template decides nothing here).
    ca, cb = cp.asarray(a16.view(np.uint16)), cp.asarray(b16.view(np.uint16))
    sa = cudnn.Slot.from_address(ca.data.ptr, a.shape, None, "bfloat16", "cuda:0")
    sb = cudnn.Slot.from_address(cb.data.ptr, b.shape, None, "bfloat16", "cuda:0")
    graph, c = matmul_wrapper(sa, sb, F.BFLOAT16)
    out = graph(sa, sb)
    assert isinstance(out, OwnedBuffer) and out.dtype == "bfloat16" and out.device == ("cuda", 0)
    assert out.shape == c.dim and out.strides == c.stride
    cp.cuda.Device().synchronize()       # read below by address, not through the DLPack handshake
    memory = cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(out.data_ptr, out.nbytes, out), 0)
    bits = cp.ndarray(out.shape, np.uint16, memory, strides=tuple(2 * s for s in out.strides))
    got = cp.asnumpy(bits).view(ml_dtypes.bfloat16).astype(np.float32)
    check_matmul(got, a16, b16, "bfloat16")
    torch = pytest.importorskip("torch")
    as_torch = torch.from_dlpack(out)
    assert as_torch.dtype == torch.bfloat16 and tuple(as_torch.stride()) == c.stride
    np.testing.assert_array_equal(as_torch.float().cpu().numpy(), got)


# ---- JAX -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_jax_inputs_get_jax_arrays(dtype):
    jax = jax_gpu()
    import jax.numpy as jnp
    a, b = host_operands()
    ja = jnp.asarray(a, dtype=getattr(jnp, dtype))
    jb = jnp.asarray(b, dtype=getattr(jnp, dtype))
    ja.block_until_ready()
    jb.block_until_ready()
    graph, c = matmul_wrapper(ja, jb, getattr(jnp, dtype))
    assert c.stride == (M * N, N, 1)                 # JAX arrays are dense row-major
    out = graph(ja, jb)
    assert isinstance(out, jax.Array) and out.dtype == getattr(jnp, dtype)
    assert out.shape == c.dim and out.devices() == ja.devices()
    check_matmul(np.asarray(out.astype(jnp.float32)), np.asarray(ja.astype(jnp.float32)),
                 np.asarray(jb.astype(jnp.float32)), dtype)


# ---- numba ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("out_strides", [None, (M * N, 1, M)], ids=["inferred", "column-major"])
def test_numba_inputs_get_numba_device_arrays(out_strides):
    cuda = pytest.importorskip("numba.cuda")
    out, c, a, b = run_half_matmul(cuda.to_device, out_strides)
    assert type(out).__module__.split(".")[0] in ("numba", "numba_cuda") and hasattr(out, "copy_to_host")
    assert out.dtype == np.float16 and out.shape == c.dim
    assert tuple(s // out.dtype.itemsize for s in out.strides) == c.stride
    cuda.synchronize()
    check_matmul(out.copy_to_host(), a, b, "float16")


# ---- raw inputs: OwnedBuffer ---------------------------------------------------------------------

def test_raw_address_inputs_get_owned_buffers_every_framework_reads():
    cp = pytest.importorskip("cupy")
    a, b = host_operands()
    ca, cb = cp.asarray(a.astype(np.float16)), cp.asarray(b.astype(np.float16))
    with cudnn.Graph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                     device="cuda:0", inputs=["mm::A", "mm::B"], outputs=["mm::C"]) as graph:
        graph.matmul(A=graph.tensor_like(ca, name="A"), B=graph.tensor_like(cb, name="B"), name="mm").set_output(True)
    out = graph(ca.data.ptr, cb.data.ptr)           # bare addresses, shaped by the graph
    assert isinstance(out, OwnedBuffer) and out.dtype == "float16" and out.device == ("cuda", 0)
    via_dlpack = cp.from_dlpack(out)                 # the first export waits for the execute
    assert via_dlpack.data.ptr == out.data_ptr
    check_matmul(cp.asnumpy(via_dlpack), a.astype(np.float16), b.astype(np.float16), "float16")
    via_cai = cp.asarray(out)
    assert via_cai.data.ptr == out.data_ptr and via_cai.dtype == np.float16
    slot = cudnn.Slot.from_object(out)
    assert slot.data_ptr == out.data_ptr and slot.strides == out.strides


def test_an_owned_device_buffer_outlives_its_python_object_in_a_consumer():
    cp = pytest.importorskip("cupy")
    buf = OwnedBuffer.empty((256,), None, "float32", device="cuda:0")
    view = cp.from_dlpack(buf)
    view[...] = 7.0
    del buf
    cp.cuda.Device().synchronize()
    assert float(view.sum()) == 7.0 * 256


# ---- handles and streams -------------------------------------------------------------------------

def test_get_default_handle_is_the_runtimes_thread_handle_bound_to_the_stream():
    from cudnn_graph.wrapper import get_default_handle
    cp = pytest.importorskip("cupy")
    stream = cp.cuda.Stream(non_blocking=True)
    handle = get_default_handle(stream.ptr)
    assert handle is get_default_handle()
    assert cudnn.get_stream(handle) == stream.ptr


def test_a_call_without_a_handle_runs_on_torchs_current_stream(prefer_cudnn):
    torch = _torch()
    from cudnn_graph.wrapper import get_default_handle
    a, b = host_operands()
    ta, tb = (torch.from_numpy(v).to("cuda", torch.float16) for v in (a, b))
    graph, _ = matmul_wrapper(ta, tb, F.HALF)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = graph(ta, tb)
    assert cudnn.get_stream(get_default_handle()) == side.cuda_stream
    side.synchronize()
    check_matmul(out.float().cpu().numpy(), ta.float().cpu().numpy(), tb.float().cpu().numpy(), "float16")
