"""cudnn_graph: a framework-neutral runtime for cuDNN-style op graphs.

Buffers from any producer (DLPack, the CUDA array interface, raw addresses) become ``Slot`` objects;
a call's buffers become one ``VariantPack``. ``import cudnn_graph as cudnn`` is meant to run code
written for ``cudnn.pygraph``.

Example:
    >>> import numpy as np, cudnn_graph
    >>> cudnn_graph.Slot.from_object(np.zeros((2, 3), np.float16)).dtype
    'float16'
"""
from __future__ import annotations

import logging as _logging
import os as _os
import sys as _sys


def _use_installed_core() -> None:
    """Imported from a source checkout (e.g. ``python -m cudnn_graph`` in the clone's root)?

    The compiled core lives in the installed package; put it first on this package's search path so
    that the README commands work from the source tree too.
    """
    here = _os.path.dirname(_os.path.abspath(__file__))
    if any(f.startswith("_slot.") and not f.endswith((".pyx", ".pxd")) for f in _os.listdir(here)):
        return
    for entry in _sys.path:
        candidate = _os.path.join(_os.path.abspath(entry or _os.curdir), "cudnn_graph")
        if candidate != here and _os.path.isdir(candidate) and any(
                f.startswith("_slot.") and f.endswith((".so", ".pyd")) for f in _os.listdir(candidate)):
            __path__.insert(0, candidate)
            return
    # An editable install's import hook serves the compiled modules itself; otherwise say what to do.
    if not any(type(f).__module__.startswith("_cudnn_graph_editable_loader") for f in _sys.meta_path):
        raise ImportError("cudnn_graph's compiled core is not built here: run `python -m pip install .` "
                          "(or `pip install --no-build-isolation -e .`)")


_use_installed_core()

from ._slot import Slot, refresh_exchange_api_cache
from ._variant_pack import TensorSpec, PackLayout, VariantPack, check
from ._stream import as_stream_handle
from ._ir import Tensor, Node, GraphContext
from .graph import pygraph, PlanEntryError
from .router import Router, get_default_router, set_default_router
from .data_type import DataType, data_type_of
from . import errors
from .errors import (
    CudnnGraphError, BufferImportError, MalformedBufferError, TensorMismatchError, DataTypeMismatchError,
    ShapeMismatchError, StrideMismatchError, DeviceMismatchError, AlignmentError, ReadOnlyOutputError, HostAddressError,
    MissingTensorError, UnknownTensorError, GraphValidationError, GraphNotSupportedError,
    cudnnGraphNotSupportedError, GraphFrozenError,
)
from .errors import (GraphStateError, NotPlannedError, AlreadyPlannedError, NotBuiltError, InvalidArgumentError,
                     InvalidArgumentTypeError, InvalidDeviceError, UidCollisionError, AmbiguousTensorNameError)

__version__ = "0.1.0"

# cudnn.pygraph spellings.
data_type = DataType
from .enums import (heur_mode, reduction_mode, norm_forward_phase, build_plan_policy, numerical_note,
                    behavior_note, knob_type, pointwise_mode, convolution_mode, diagonal_alignment,
                    attention_implementation, reshape_mode, tensor_reordering)
from ._cudnn_errors import (CudnnNotFoundError, CudnnVersionError, CudnnStatusError)
from . import _loader as _cudnn_loader
from .host_handle import HostHandle


def backend_version() -> int:
    """cuDNN's version as an int (e.g. 91900); 0 where no libcudnn loads (a CPU machine), so every
    ``backend_version() >= N`` gate reads "too old" and a port takes its CPU path."""
    if not _cudnn_loader.is_available():
        return 0
    return _cudnn_loader.backend_version()


def backend_version_string() -> str:
    """cuDNN's version as 'major.minor.patch'; '0.0.0' where no libcudnn loads (compares below any
    release, and parses as a version)."""
    if not _cudnn_loader.is_available():
        return "0.0.0"
    return _cudnn_loader.backend_version_string()


def get_last_error_string() -> str:
    """cuDNN's last error message for this thread (reading it clears it)."""
    return _cudnn_loader.get_last_error_string()


def create_handle(device: int = 0):
    """A cuDNN handle on CUDA ``device``; ``int(handle)`` is the raw cudnnHandle_t. Where no libcudnn
    loads, a ``HostHandle`` (``cudnn_graph.host_handle``): graphs made with it run on the host.

    >>> h = cudnn_graph.create_handle()                  # doctest: +SKIP
    >>> cudnn_graph.set_stream(handle=h, stream=0)       # doctest: +SKIP
    """
    if not _cudnn_loader.is_available():
        _logging.getLogger(__name__).info("create_handle: no libcudnn loads here; a host handle (CPU graphs)")
        return HostHandle()
    from . import _cudnn_handle
    return _cudnn_handle.create_handle(device)


def destroy_handle(handle) -> None:
    """Destroy a handle from create_handle (a second call does nothing); a raw int handle is destroyed too."""
    if isinstance(handle, HostHandle):
        handle.destroyed = True
        return
    from . import _cudnn_handle
    _cudnn_handle.destroy_handle(handle)


def set_stream(*, handle, stream) -> None:
    """Bind ``stream`` (None, an int, or an object with ``__cuda_stream__``) to ``handle`` (a host
    handle records it: host graphs do not run on streams)."""
    if isinstance(handle, HostHandle):
        handle.bind_stream(stream)
        return
    from . import _cudnn_handle
    _cudnn_handle.set_stream(handle=handle, stream=stream)


def get_stream(handle) -> int:
    """The raw CUDA stream last bound to ``handle``."""
    if isinstance(handle, HostHandle):
        return handle.stream
    from . import _cudnn_handle
    return _cudnn_handle.get_stream(handle)


_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__all__ = [
    "data_type", "heur_mode", "reduction_mode", "norm_forward_phase", "build_plan_policy", "numerical_note",
    "behavior_note", "knob_type", "pointwise_mode", "convolution_mode", "diagonal_alignment",
    "attention_implementation", "reshape_mode", "tensor_reordering", "CudnnNotFoundError",
    "CudnnVersionError", "CudnnStatusError", "backend_version", "backend_version_string",
    "get_last_error_string", "create_handle", "destroy_handle", "set_stream", "get_stream", "pygraph", "Tensor", "Node", "GraphContext", "PlanEntryError", "Router",
    "get_default_router", "set_default_router", "Slot", "TensorSpec", "PackLayout", "VariantPack", "check", "refresh_exchange_api_cache",
    "as_stream_handle", "DataType", "data_type_of", "errors", "CudnnGraphError", "BufferImportError",
    "MalformedBufferError", "TensorMismatchError", "DataTypeMismatchError", "ShapeMismatchError",
    "StrideMismatchError", "DeviceMismatchError", "AlignmentError", "ReadOnlyOutputError", "HostAddressError",
    "MissingTensorError", "UnknownTensorError", "GraphValidationError", "GraphNotSupportedError",
    "cudnnGraphNotSupportedError", "GraphFrozenError",
    "GraphStateError", "NotPlannedError", "AlreadyPlannedError", "NotBuiltError", "InvalidArgumentError",
    "InvalidArgumentTypeError", "InvalidDeviceError", "UidCollisionError", "AmbiguousTensorNameError",
]

# Variant-pack key and output errors (issue 20).
from .errors import ForeignTensorError, VirtualTensorError, DuplicateTensorError, OverlappingOutputError
__all__ += ["ForeignTensorError", "VirtualTensorError", "DuplicateTensorError", "OverlappingOutputError"]

# cudnn-frontend's graph-level helpers: the cudnn.Graph wrapper (``cudnn_graph.Graph`` is the wrapper;
# the graph class is ``pygraph``, its Cython core ``cudnn_graph._ir.Graph``), the graph() context
# manager (it shadows the ``cudnn_graph.graph`` module as an attribute, as cudnn.graph does: import
# from that module with ``from cudnn_graph.graph import ...``), graph_cache, and the buffers outputs
# are allocated in when the caller's inputs name no framework that can.
from .wrapper import Graph
from .graph_helpers import graph, graph_cache
from ._owned_buffer import OwnedBuffer
from .errors import TensorReferenceError, WrapperStateError
__all__ += ["Graph", "graph", "graph_cache", "OwnedBuffer", "TensorReferenceError",
            "WrapperStateError"]

# ---- the rest of cudnn-frontend 1.32's graph-level surface (cudnn_graph._frontend_surface lists it) ----
from .jit import jit
from .kernel_cache import KernelCache, create_kernel_cache
from .errors import ArgumentTypeError, KernelCacheError
from ._cudnn_handle import Handle
from .engines.cudnn_backend.engine import Knob as knob
tensor = Tensor


def sdpa_capabilities() -> frozenset:
    """The native SDPA binder's capability names: none here (cudnn_graph has no such binder)."""
    return frozenset()


from . import _frontend_surface
_frontend_surface.install_module_stubs(globals())
__all__ += ["jit", "KernelCache", "create_kernel_cache", "HostHandle", "ArgumentTypeError", "KernelCacheError",
            "Handle", "knob",
            "tensor", "sdpa_capabilities"]
__all__ += [n for n, (status, _) in _frontend_surface.TOP_LEVEL.items()
            if status == _frontend_surface.NOT_IMPLEMENTED and n not in __all__]

# ---- logging and progress (issue 26): CUDNN_GRAPH_LOG=info|debug prints the package's log to stderr;
# set_progress_callback(fn) receives (stage, detail) events of builds, declines, compiles and long runs.
from ._progress import set_progress_callback
from . import _log_env
_log_env.install_from_environment()
__all__ += ["set_progress_callback"]

# ---- plans that last (issue 22): autotune's and the CUDA-graph calls' errors ----
from .errors import AutotuneError, CudaGraphError
__all__ += ["AutotuneError", "CudaGraphError"]

# ---- serialized plans and the persistent plan cache (issue 22): graph.serialize() / deserialize(),
# set_plan_cache(path) or $CUDNN_GRAPH_PLAN_CACHE (docs/prebuilt_plans.md, docs/plan_format.md).
from .plan_cache import set_plan_cache, get_plan_cache
from .errors import PlanBlobError, PlanVersionMismatchError
__all__ += ["set_plan_cache", "get_plan_cache", "PlanBlobError", "PlanVersionMismatchError"]

# ---- deviceless (ahead-of-time) builds (issue 22): create_device_properties(0).serialize() where the GPU is,
# pygraph(device_property=create_device_properties(text)) where it is not (docs/prebuilt_plans.md).
from .device_properties import DeviceProperties, create_device_properties
from .errors import DevicePropertiesError, DevicePropertiesMismatchError
__all__ += ["DeviceProperties", "create_device_properties", "DevicePropertiesError", "DevicePropertiesMismatchError"]

# ---- the in-process C API for extension modules (issue 24): PyCapsule_Import("cudnn_graph._C_API", 0)
# finds this attribute (include/cudnn_graph/cudnn_graph_capi.h, docs/c_api.md); making it loads no cuDNN
# or GPU library.
from ._capi import _C_API  # noqa: E402
