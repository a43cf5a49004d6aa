"""Outputs allocated for the caller (docs/porting.md, "Outputs allocated for you"), on the host: the
template rule, the NumPy maker, the module-of-the-type lookup (never an import), the Array API path,
and the ``OwnedBuffer`` fallback."""
import subprocess
import sys
import textwrap
import types

import ml_dtypes
import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import OwnedBuffer
from cudnn_graph._output_allocation import allocate_output, buffer_device, template_for
from cudnn_graph.errors import InvalidArgumentError

F = cudnn.data_type
HOST = ("cpu", 0)


def element_strides(array) -> tuple:
    return tuple(s // array.itemsize for s in array.strides)


class DevicePretender:
    """Says it lives on CUDA device ``ordinal`` (never read: only its device is asked)."""

    def __init__(self, ordinal=0):
        self.ordinal = ordinal

    def __dlpack__(self, **kwargs):
        raise AssertionError("not read")

    def __dlpack_device__(self):
        return (2, self.ordinal)


# ---- the template ---------------------------------------------------------------------------------

def test_the_template_is_the_first_buffer_on_the_graphs_device():
    a, b = np.zeros(2), np.zeros(3)
    assert template_for([7, None, 1.5, a, b], HOST) is a
    assert template_for([DevicePretender(), b], HOST) is b
    assert template_for([b, DevicePretender(1), gpu := DevicePretender(0)], ("cuda", 0)) is gpu
    assert template_for([7, a], ("cuda", 0)) is None


def test_buffer_device_reads_the_protocols_without_importing_anything():
    class CaiOnly:
        __cuda_array_interface__ = {"shape": (1,)}

    assert buffer_device(np.zeros(1)) == HOST
    assert buffer_device(DevicePretender(3)) == ("cuda", 3)
    assert buffer_device(CaiOnly()) == ("cuda", None)
    assert buffer_device(object()) is None
    assert template_for([CaiOnly()], ("cuda", 2)) is not None


# ---- NumPy ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,np_dtype", [(F.FLOAT, np.float32), (F.HALF, np.float16), (F.INT32, np.int32),
                                            (F.BFLOAT16, ml_dtypes.bfloat16), (F.FP8_E4M3, ml_dtypes.float8_e4m3fn),
                                            (F.FP8_E5M2, ml_dtypes.float8_e5m2)])
@pytest.mark.parametrize("shape,strides", [((2, 3), (3, 1)), ((2, 3), (1, 2)), ((2, 4, 3, 3), (36, 1, 12, 4))])
def test_a_numpy_template_gets_a_numpy_output_with_the_tensors_geometry(dtype, np_dtype, shape, strides):
    buffer, finish = allocate_output(shape, strides, dtype, HOST, np.zeros(1, np.float32))
    out = finish()
    assert type(out) is np.ndarray and out.dtype == np.dtype(np_dtype)
    assert out.shape == shape and element_strides(out) == strides
    slot = cudnn.Slot.from_object(buffer)          # what execute writes is that very memory
    assert slot.data_ptr == out.ctypes.data and slot.strides == strides and slot.dtype == np.dtype(np_dtype).name


def test_no_template_on_the_host_gives_an_owned_buffer():
    buffer, finish = allocate_output((2, 3), (1, 2), F.HALF, HOST, None)
    out = finish()
    assert isinstance(out, OwnedBuffer) and buffer is out.slot      # execute writes its Slot
    assert out.device == HOST and out.strides == (1, 2) and out.dtype == "float16"


# ---- a framework through the module of the template's type -------------------------------------

def fake_framework(monkeypatch, root, **attrs):
    module = types.ModuleType(root)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, root, module)
    return module


def test_a_torch_template_gets_torch_empty_strided_with_its_device(monkeypatch):
    calls = []

    class dtype:
        def __init__(self, name):
            self.name = name

    def empty_strided(shape, strides, *, dtype, device):
        calls.append((shape, strides, dtype.name, device))
        return ("torch tensor", shape)

    torch = fake_framework(monkeypatch, "torch", dtype=dtype, bfloat16=dtype("bfloat16"),
                           empty_strided=empty_strided)

    class Tensor:
        device = "cuda:1"
    Tensor.__module__ = "torch"

    buffer, finish = allocate_output((4, 8), (1, 4), F.BFLOAT16, ("cuda", 1), Tensor())
    assert calls == [((4, 8), (1, 4), "bfloat16", "cuda:1")]
    assert finish() is buffer and buffer == ("torch tensor", (4, 8))
    assert torch.bfloat16.name == "bfloat16"


def test_a_framework_lacking_the_data_type_falls_back_to_an_owned_buffer(monkeypatch):
    class dtype:
        pass

    fake_framework(monkeypatch, "torch", dtype=dtype,
                   empty_strided=lambda *a, **k: pytest.fail("torch has no such dtype"))

    class Tensor:
        device = "cpu"
    Tensor.__module__ = "torch._tensor"

    _, finish = allocate_output((2,), (1,), F.FP8_E5M2, HOST, Tensor())
    out = finish()
    assert isinstance(out, OwnedBuffer) and out.dtype == "float8_e5m2"


def test_a_jax_template_gets_its_output_through_dlpack_after_the_execute(monkeypatch):
    imported = []
    dlpack = types.SimpleNamespace(from_dlpack=lambda obj: imported.append(np.from_dlpack(obj).copy()) or "jax array")
    fake_framework(monkeypatch, "jax", dlpack=dlpack)

    class ArrayImpl(np.ndarray):      # JAX's array type lives in jaxlib
        pass
    ArrayImpl.__module__ = "jaxlib.xla_extension"

    a = np.array([-1.0, 3.0], np.float32)
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, inputs=["r::input"], outputs=["r::Y"]) as g:
        g.relu(input=a, name="r").set_output(True)
    assert g(a.view(ArrayImpl)) == "jax array"
    assert imported[0].tolist() == [0.0, 3.0]      # JAX got the buffer once the execute had written it


def test_the_library_never_imports_a_framework():
    code = textwrap.dedent("""
        import sys, numpy as np, cudnn_graph as cudnn
        a = np.ones((2, 2), np.float32)
        with cudnn.Graph(io_data_type=np.float32, compute_data_type=np.float32, inputs=["r::input"],
                         outputs=["r::Y"]) as g:
            g.relu(input=a, name="r").set_output(True)
        g(a)
        g({"r::input": a})
        print(sorted(m for m in ("torch", "jax", "cupy", "numba") if m in sys.modules))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


# ---- any Array API namespace ---------------------------------------------------------------------

class NumpyNamespace:
    """A minimal Array API namespace over NumPy that records what it was asked."""

    float32 = np.float32

    def __init__(self):
        self.calls = []

    def empty(self, shape, *, dtype, device):
        self.calls.append(("empty", shape, device))
        return np.empty(shape, dtype)

    def permute_dims(self, x, axes):
        self.calls.append(("permute_dims", axes))
        return np.transpose(x, axes)


class ArrayApiArray:
    def __init__(self, xp):
        self.xp = xp
        self.device = "host-device"

    def __array_namespace__(self):
        return self.xp

    def __dlpack_device__(self):
        return (1, 0)


def test_an_array_api_template_gets_xp_empty_in_memory_order_permuted_back():
    xp = NumpyNamespace()
    _, finish = allocate_output((2, 4, 3, 3), (36, 1, 12, 4), F.FLOAT, HOST, ArrayApiArray(xp))
    out = finish()
    assert xp.calls == [("empty", (2, 3, 3, 4), "host-device"), ("permute_dims", (0, 3, 1, 2))]
    assert out.shape == (2, 4, 3, 3) and element_strides(out) == (36, 1, 12, 4)


def test_an_array_api_namespace_without_the_type_or_layout_falls_back():
    xp = NumpyNamespace()
    _, finish = allocate_output((2, 3), (3, 1), F.HALF, HOST, ArrayApiArray(xp))     # no xp.float16
    assert isinstance(finish(), OwnedBuffer) and xp.calls == []
    _, finish = allocate_output((2, 3), (4, 1), F.FLOAT, HOST, ArrayApiArray(xp))    # padded rows
    out = finish()
    assert isinstance(out, OwnedBuffer) and out.strides == (4, 1)


# ---- OwnedBuffer ---------------------------------------------------------------------------------

def test_an_owned_host_buffer_is_a_dlpack_producer_over_its_own_memory():
    buf = OwnedBuffer.empty((2, 3), (1, 2), "float32", device="cpu")
    view = np.from_dlpack(buf)
    view[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert buf.numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert view.ctypes.data == buf.data_ptr and buf.nbytes == 24
    assert buf.__dlpack_device__() == (1, 0)
    with pytest.raises(AttributeError):
        buf.__cuda_array_interface__


def test_a_consumer_keeps_an_owned_buffers_memory_alive():
    buf = OwnedBuffer.empty((4,), None, "int32", device="cpu")
    buf.numpy()[...] = [1, 2, 3, 4]
    view = np.from_dlpack(buf)
    del buf
    assert view.tolist() == [1, 2, 3, 4]


def test_an_owned_bfloat16_buffer_is_read_by_slots_with_its_type():
    buf = OwnedBuffer.empty((3,), (1,), F.BFLOAT16, device="cpu")
    slot = cudnn.Slot.from_object(buf)
    assert slot.dtype == "bfloat16" and slot.data_ptr == buf.data_ptr


def test_an_owned_buffer_holds_an_empty_tensor():
    buf = OwnedBuffer.empty((0, 3), None, "float32", device="cpu")
    assert buf.shape == (0, 3) and buf.nbytes == 0 and np.from_dlpack(buf).size == 0


@pytest.mark.parametrize("args,error,message", [
    (((2, -1), None, "float32"), InvalidArgumentError, "negative extent"),
    (((2, 3), (1,), "float32"), InvalidArgumentError, "1 strides for the 2-d shape"),
    (((2, 3), (3, -1), "float32"), InvalidArgumentError, "must not be negative"),
    (((2,), None, "nonsense"), InvalidArgumentError, "dtype 'nonsense'"),
    (((2,), None, F.FP4_E2M1), NotImplementedError, "4-bit elements"),
])
def test_owned_buffer_arguments_are_checked(args, error, message):
    with pytest.raises(error, match=message):
        OwnedBuffer.empty(*args, device="cpu")


def test_an_owned_buffer_is_made_only_through_empty():
    with pytest.raises(TypeError, match="OwnedBuffer.empty"):
        OwnedBuffer()


# ---- through the wrapper -------------------------------------------------------------------------

def test_the_wrapper_returns_numpy_outputs_with_the_graphs_data_type_and_strides():
    x = np.ones((2, 3, 4), np.float16)
    w = np.ones((2, 4, 5), np.float16)
    with cudnn.Graph(io_data_type=F.HALF, compute_data_type=F.FLOAT, inputs=["mm::A", "mm::B"],
                     outputs=["mm::C"]) as g:
        c = g.matmul(A=x, B=w, name="mm")
        c.set_output(True).set_stride([15, 1, 3])
    out = g(x, w)
    assert type(out) is np.ndarray and out.dtype == np.float16
    assert element_strides(out) == (15, 1, 3)
    assert out.tolist() == np.full((2, 3, 5), 4.0).tolist()


def test_the_wrapper_returns_an_owned_buffer_when_the_inputs_are_slots():
    x = np.full((2, 2), 2.0, np.float32)
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, inputs=["r::input"], outputs=["r::Y"]) as g:
        g.relu(input=x, name="r").set_output(True)
    out = g(cudnn.Slot.from_object(x))
    assert isinstance(out, OwnedBuffer)
    assert np.from_dlpack(out).tolist() == [[2.0, 2.0], [2.0, 2.0]]
