"""Every GPU producer (CuPy, torch, JAX, numba, raw addresses) through the same Slot / VariantPack path.

Run on the H200 with ``pytest -m gpu``; skipped where no GPU is visible.
"""
import os
import threading

import numpy as np
import pytest

import cudnn_graph as cg
from cudnn_graph import Slot, TensorSpec, PackLayout, VariantPack

pytestmark = pytest.mark.gpu
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _cupy():
    return pytest.importorskip("cupy")


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    return torch


def _jax():
    from gpu_support import jax_gpu
    return jax_gpu()


def _numba_cuda():
    return pytest.importorskip("numba.cuda")


def _producers():
    """(name, factory(shape, dtype_name) -> (array, data_ptr)) for each importable producer."""
    out = []

    def cupy_make(shape, dtype):
        cp = _cupy()
        a = cp.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
        return a, a.data.ptr

    def torch_make(shape, dtype):
        torch = _torch()
        a = torch.arange(int(np.prod(shape)), device="cuda").to(getattr(torch, dtype)).reshape(shape)
        return a, a.data_ptr()

    def jax_make(shape, dtype):
        jax = _jax()
        import jax.numpy as jnp
        a = jnp.arange(int(np.prod(shape)), dtype=getattr(jnp, dtype)).reshape(shape)
        a.block_until_ready()
        return a, a.unsafe_buffer_pointer()

    def numba_make(shape, dtype):
        cuda = _numba_cuda()
        a = cuda.to_device(np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape))
        return a, a.device_ctypes_pointer.value

    return [("cupy", cupy_make), ("torch", torch_make), ("jax", jax_make), ("numba", numba_make)]


PRODUCERS = _producers()


@pytest.mark.parametrize("name,make", PRODUCERS, ids=[p[0] for p in PRODUCERS])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_producer_imports_pointer_geometry_and_device(name, make, dtype):
    a, ptr = make((4, 6), dtype)
    s = Slot.from_object(a)
    assert s.data_ptr == ptr
    assert s.shape == (4, 6) and s.strides == (6, 1)
    assert s.dtype == dtype
    assert s.device == ("cuda", 0)


@pytest.mark.parametrize("name,make", [p for p in PRODUCERS if p[0] in ("torch", "jax")],
                         ids=["torch", "jax"])
def test_gpu_producer_bfloat16(name, make):
    a, ptr = make((3, 5), "bfloat16")
    s = Slot.from_object(a)
    assert s.dtype == "bfloat16" and s.data_ptr == ptr


def test_torch_publishes_exchange_api_and_it_is_used():
    torch = _torch()
    assert hasattr(type(torch.empty(1)), "__dlpack_c_exchange_api__")
    base = torch.arange(64, dtype=torch.float32, device="cuda").reshape(8, 8)
    view = base[2:, 1::2]   # offset + strides
    s = Slot.from_object(view)
    assert s.data_ptr == view.data_ptr()
    assert s.strides == (8, 2) and s.shape == (6, 4)
    assert s.owner is view   # the exchange table's borrowed view keeps the tensor itself as owner


def test_cupy_non_contiguous_view_and_stream():
    cp = _cupy()
    base = cp.arange(60, dtype=cp.float32).reshape(6, 10)
    view = base[1:, ::-3]
    stream = cp.cuda.Stream(non_blocking=True)
    s = Slot.from_object(view, stream=stream)
    assert s.data_ptr == view.data.ptr
    assert s.strides == (10, -3) and s.shape == view.shape


def test_numba_cai_device_ordinal_from_driver():
    cuda = _numba_cuda()
    a = cuda.device_array((5, 7), dtype=np.float32)
    s = Slot.from_object(a)
    assert s.device == ("cuda", 0)
    assert s.data_ptr == a.device_ctypes_pointer.value


def test_raw_address_with_layout_and_mixed_pack():
    torch = _torch()
    cp = _cupy()
    x = torch.ones(16, 32, device="cuda", dtype=torch.float16)
    y = cp.zeros((16, 32), dtype=cp.float16)
    z = torch.empty(16, 32, device="cuda", dtype=torch.float16)
    layout = PackLayout([
        TensorSpec(1, (16, 32), "float16", device="cuda:0", name="x"),
        TensorSpec(2, (16, 32), "float16", device="cuda:0", name="y"),
        TensorSpec(3, (16, 32), "float16", device="cuda:0", name="z", is_output=True),
    ])
    pack = layout.pack({3: z.data_ptr(), 1: x, "y": y})
    assert pack.uids == (1, 2, 3)
    assert pack.data_ptrs == (x.data_ptr(), y.data.ptr, z.data_ptr())


def test_host_array_for_gpu_tensor_is_a_device_mismatch():
    layout = PackLayout([TensorSpec(1, (4,), "float32", device="cuda:0", name="x")])
    with pytest.raises(cg.DeviceMismatchError, match="tensor 'x' \\(uid 1\\).*cuda:0.*cpu"):
        layout.pack({1: np.zeros(4, np.float32)})


def test_jax_float32_is_not_confused_by_python_type_identity():
    jax = _jax()
    import jax.numpy as jnp
    a = jnp.zeros((2, 2), dtype=jnp.float32)
    layout = PackLayout([TensorSpec(1, (2, 2), "float32", device="cuda:0", name="a")])
    assert layout.pack({1: a}).data_ptrs == (a.unsafe_buffer_pointer(),)


def test_slot_exports_back_to_each_framework():
    torch = _torch()
    cp = _cupy()
    t = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    s = Slot.from_object(t)
    back_cupy = cp.from_dlpack(s)
    assert back_cupy.data.ptr == t.data_ptr() and back_cupy.shape == (3, 4)
    back_torch = torch.from_dlpack(s)
    assert back_torch.data_ptr() == t.data_ptr()
    assert torch.equal(back_torch, t)


def test_sixteen_threads_with_gpu_buffers_never_mix_pointers():
    cp = _cupy()
    buffers = [cp.empty((8,), cp.float32) for _ in range(64)]
    layout = PackLayout([TensorSpec(1, (8,), "float32", device="cuda:0", name="x")])
    errors = []

    def work(tid):
        for i in range(2000):
            b = buffers[(tid * 7 + i) % len(buffers)]
            if layout.pack({1: b}).data_ptrs != (b.data.ptr,):
                errors.append((tid, i))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(16)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
