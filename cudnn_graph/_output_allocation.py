"""Outputs a call allocates for the caller, in the framework of the caller's inputs, importing none.

The rule (docs/porting.md, "Outputs allocated for you"):

1. The template is the first of the call's input buffers that lives on the graph's device.
2. Its framework allocates, through the module its type comes from, which is already imported (looked
   up in ``sys.modules``, never imported here): torch ``empty_strided``; CuPy an ``ndarray`` over CuPy
   memory; numba ``cuda.device_array``; NumPy an ``ndarray`` -- each with the tensor's dims, strides,
   data type and device. JAX arrays are immutable, so the output is written into an ``OwnedBuffer``
   and handed to JAX through DLPack (``jax.dlpack.from_dlpack``, no copy).
3. Any other template with an Array API namespace: ``xp.empty`` in the tensor's memory order and
   ``xp.permute_dims`` back, kept only when the result has the tensor's exact geometry.
4. Otherwise -- no template, raw addresses, a data type the framework lacks, a layout it cannot make --
   an ``OwnedBuffer`` (cudnn_graph-owned memory, a DLPack producer) on the graph's device.

Example:
    >>> import numpy as np
    >>> from cudnn_graph._output_allocation import allocate_output
    >>> buffer, finish = allocate_output((2, 3), (1, 2), "float32", ("cpu", 0), np.zeros(1, np.float32))
    >>> out = finish()
    >>> type(out).__name__, out.strides
    ('ndarray', (4, 8))
"""
from __future__ import annotations

import logging
import sys
from typing import Callable, Iterable, Optional, Sequence

from ._dtypes import _dtype_name_of
from ._owned_buffer import OwnedBuffer, span_elements
from ._slot import Slot
from .data_type import data_type_of, itemsize_bits, numpy_dtype

logger = logging.getLogger(__name__)

__all__ = ["allocate_output", "template_for", "buffer_device", "framework_of"]

# DLPack device types that hold host memory, and CUDA device memory (kDLCPU, kDLCUDAHost; kDLCUDA,
# kDLCUDAManaged).
_HOST_KINDS = (1, 3)
_CUDA_KINDS = (2, 13)


def buffer_device(obj) -> Optional[tuple]:
    """('cpu', 0), ('cuda', N) (N None when the producer does not say), or None for a non-buffer.

    Reads ``__dlpack_device__`` or the presence of ``__cuda_array_interface__``; imports nothing.
    """
    probe = getattr(obj, "__dlpack_device__", None)
    if probe is not None:
        try:
            kind, ordinal = probe()
        except Exception:    # a producer that cannot say is simply no template
            return None
        kind = int(kind)
        if kind in _HOST_KINDS:
            return ("cpu", 0)
        if kind in _CUDA_KINDS:
            return ("cuda", int(ordinal))
        return None
    if getattr(obj, "__cuda_array_interface__", None) is not None:
        return ("cuda", None)
    return None


def template_for(buffers: Iterable, device: tuple):
    """The first of ``buffers`` on ``device`` (the graph's ('cuda', N) or ('cpu', 0)), or None."""
    for obj in buffers:
        if obj is None or isinstance(obj, (int, float, bool)):
            continue
        where = buffer_device(obj)
        if where is None or where[0] != device[0]:
            continue
        if where[0] == "cuda" and where[1] is not None and where[1] != device[1]:
            continue
        return obj
    return None


def framework_of(obj):
    """(root name, the already-imported top-level module) an object's type comes from, the module None
    when it is not imported; jaxlib's arrays count as jax's, numba_cuda's as numba's."""
    root = type(obj).__module__.split(".", 1)[0]
    if root == "jaxlib":
        root = "jax"
    elif root == "numba_cuda":
        root = "numba"
    return root, sys.modules.get(root)


def _identity(value) -> Callable[[], object]:
    return lambda: value


def allocate_output(shape: Sequence[int], strides: Sequence[int], data_type, device: tuple,
                    template=None) -> tuple[object, Callable[[], object]]:
    """Memory for one output: ``(buffer the execute writes, finish)``; ``finish()`` after the execute
    returns what the caller receives (for JAX, the array made from the written buffer).

    ``device`` is the graph's ('cuda', N) / ('cpu', 0); ``template`` a caller buffer on that device
    (``template_for``) or None.
    """
    shape = tuple(int(d) for d in shape)
    strides = tuple(int(s) for s in strides)
    name = _dtype_name_of(data_type)
    if template is not None:
        root, module = framework_of(template)
        maker = _FRAMEWORKS.get(root)
        made = None
        if module is not None and maker is not None:
            made = maker(module, template, shape, strides, name, device)
        elif hasattr(template, "__array_namespace__"):
            made = _array_api(template, shape, strides, name, device)
        if made is not None:
            return made
        logger.debug("allocate_output: %s cannot hold a %s %s %s output; returning an OwnedBuffer",
                     type(template).__name__, name, shape, strides)
    owned = OwnedBuffer.empty(shape, strides, name, device=_device_text(device))
    return owned.slot, _identity(owned)


def _device_text(device: tuple) -> str:
    return "cpu" if device[0] == "cpu" else f"cuda:{device[1]}"


def _byte_strides(strides, name) -> tuple:
    itemsize = itemsize_bits(data_type_of(name)) // 8
    return tuple(s * itemsize for s in strides)


def _nbytes(shape, strides, name) -> int:
    return span_elements(shape, strides) * (itemsize_bits(data_type_of(name)) // 8)


def _plain_numpy_dtype(name):
    """The NumPy dtype of ``name`` when it is one that CuPy / numba also hold (not an ml_dtypes type)."""
    try:
        dt = numpy_dtype(name)
    except ValueError:
        return None
    return dt if dt.isbuiltin == 1 else None      # ml_dtypes' types are user-defined (0)


# ---- one maker per framework: (module, template, shape, strides, dtype name, device) -> made or None --

def _torch(torch, template, shape, strides, name, device):
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        return None
    out = torch.empty_strided(shape, strides, dtype=dtype, device=template.device)
    return out, _identity(out)


def _cupy(cupy, template, shape, strides, name, device):
    dtype = _plain_numpy_dtype(name)
    if dtype is None:
        return None
    with cupy.cuda.Device(template.device.id):
        memory = cupy.cuda.alloc(max(_nbytes(shape, strides, name), 1))
        out = cupy.ndarray(shape, dtype=dtype, memptr=memory, strides=_byte_strides(strides, name))
    return out, _identity(out)


def _numba(numba, template, shape, strides, name, device):
    dtype = _plain_numpy_dtype(name)
    cuda = sys.modules.get("numba.cuda")
    if dtype is None or cuda is None:
        return None
    with cuda.gpus[device[1]]:
        out = cuda.device_array(shape, dtype=dtype, strides=_byte_strides(strides, name))
    return out, _identity(out)


def _numpy(numpy, template, shape, strides, name, device):
    try:
        dtype = numpy_dtype(name)
    except ValueError:
        return None
    if dtype.isbuiltin != 1:
        # NumPy exports no extension type (bfloat16, float8_*) through DLPack: execute writes an owned
        # host buffer and the caller gets the NumPy view of that memory.
        owned = OwnedBuffer.empty(shape, strides, name, device="cpu")
        return owned.slot, _identity(owned.numpy())
    storage = numpy.empty(max(_nbytes(shape, strides, name), 1), numpy.uint8)
    out = numpy.ndarray(shape, dtype=dtype, buffer=storage, strides=_byte_strides(strides, name))
    return out, _identity(out)


def _jax(jax, template, shape, strides, name, device):
    # jax.dlpack where the package exposes it, else the array's own namespace (jax.numpy.from_dlpack).
    importer = getattr(getattr(jax, "dlpack", None), "from_dlpack", None)
    if importer is None and hasattr(template, "__array_namespace__"):
        importer = template.__array_namespace__().from_dlpack
    if importer is None:
        return None
    owned = OwnedBuffer.empty(shape, strides, name, device=_device_text(device))

    def finish():       # after the execute: JAX's import is the consumer handshake
        try:
            return importer(owned)
        except Exception as exc:   # a layout or type this JAX cannot import: the caller gets the buffer
            logger.warning("JAX cannot import a %s %s output with strides %s (%s); returning the "
                           "cudnn_graph OwnedBuffer", name, shape, strides, exc)
            return owned

    return owned.slot, finish


_FRAMEWORKS = {"torch": _torch, "cupy": _cupy, "numba": _numba, "numpy": _numpy, "jax": _jax}


def _memory_order(shape, strides) -> Optional[list]:
    """Axes from outermost to innermost when ``strides`` lay ``shape`` out densely (unit dims free)."""
    order = sorted(range(len(shape)), key=lambda a: (-strides[a], a))
    expected = 1
    for axis in reversed(order):
        if shape[axis] != 1 and strides[axis] != expected:
            return None
        expected *= shape[axis]
    return order


def _array_api(template, shape, strides, name, device):
    xp = template.__array_namespace__()
    dtype = getattr(xp, name, None)
    order = _memory_order(shape, strides)
    if dtype is None or order is None:
        return None
    try:
        out = xp.empty(tuple(shape[a] for a in order), dtype=dtype, device=template.device)
        if order != sorted(order):
            out = xp.permute_dims(out, tuple(order.index(a) for a in range(len(shape))))
        made = Slot.from_object(out)
    except Exception as exc:   # the namespace could not make it: the OwnedBuffer will
        logger.debug("allocate_output: %s's namespace failed: %s", type(template).__name__, exc)
        return None
    if made.shape != shape or made.strides != strides or made.readonly:
        return None
    return out, _identity(out)
