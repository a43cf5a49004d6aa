"""The exceptions of cudnn_graph's graph, buffer and plan machinery, and their base ``CudnnGraphError``.

cuDNN's own failures (a ``cudnnStatus_t``, a missing or too old libcudnn) are in
``cudnn_graph._cudnn_errors`` and ``PlanEntryError`` (no plan of the list could be built) is in
``cudnn_graph.graph``; every one of them subclasses ``CudnnGraphError`` and is importable from
``cudnn_graph`` itself.

Buffer errors name the tensor (name and uid), what was expected and what arrived. They subclass
``ValueError`` or ``TypeError`` so callers that already catch those keep working.
"""
from __future__ import annotations
from typing import Optional

__all__ = [
    "CudnnGraphError", "BufferError_", "BufferImportError", "MalformedBufferError", "TensorMismatchError",
    "DataTypeMismatchError", "ShapeMismatchError", "StrideMismatchError", "DeviceMismatchError",
    "AlignmentError", "ReadOnlyOutputError", "HostAddressError", "MissingTensorError", "UnknownTensorError",
    "WorkspaceError", "StreamDeviceError", "CudaDriverError", "DeviceMemoryError",
    "GraphValidationError", "GraphNotSupportedError", "cudnnGraphNotSupportedError", "GraphFrozenError",
]


class CudnnGraphError(Exception):
    """Base of every cudnn_graph error."""


class BufferImportError(CudnnGraphError, TypeError):
    """An object is not a buffer cudnn_graph can read (no DLPack, no CUDA array interface, ...)."""


class MalformedBufferError(CudnnGraphError, ValueError):
    """A producer handed over something that breaks the DLPack or CUDA-array-interface rules."""


BufferError_ = MalformedBufferError


def _label(name, uid) -> str:
    if name and uid is not None:
        return f"tensor '{name}' (uid {uid})"
    if uid is not None:
        return f"tensor uid {uid}"
    if name:
        return f"tensor '{name}'"
    return "tensor"


class TensorMismatchError(CudnnGraphError, ValueError):
    """A buffer does not match the geometry the graph declares for its tensor."""

    def __init__(self, name, uid, what: str, expected, got):
        self.tensor_name = name
        self.uid = uid
        self.what = what
        self.expected = expected
        self.got = got
        super().__init__(f"{_label(name, uid)}: {what} expected {expected}; got {got}")


class DataTypeMismatchError(TensorMismatchError, TypeError):
    pass


class ShapeMismatchError(TensorMismatchError):
    pass


class StrideMismatchError(TensorMismatchError):
    pass


class DeviceMismatchError(TensorMismatchError):
    pass


class AlignmentError(TensorMismatchError):
    pass


class ReadOnlyOutputError(TensorMismatchError):
    pass


class HostAddressError(BufferImportError):
    """A bare int address for a tensor on a host device: this process would dereference memory it cannot
    prove is there. Pass a host buffer (NumPy, any DLPack producer) or an explicit ``Slot.from_address``."""

    def __init__(self, name, uid, device: str):
        self.tensor_name = name
        self.uid = uid
        super().__init__(
            f"{_label(name, uid)}: expected a host buffer (a NumPy array, any DLPack producer) or an explicit "
            f"Slot.from_address(ptr, shape, dtype=..., device='cpu'); got an int address for a {device} tensor")


class WorkspaceError(CudnnGraphError, ValueError):
    """The workspace handed to execute() cannot serve the plan (too small, or not device memory)."""

    def __init__(self, message, required=0, given=0):
        self.required = int(required)
        self.given = int(given)
        super().__init__(message)


class CudaDriverError(CudnnGraphError, RuntimeError):
    """A CUDA driver call failed (or the driver is missing): the message names the call and its result."""


class DeviceMemoryError(CudaDriverError, MemoryError):
    """cuMemAlloc could not provide device memory (a workspace, a scratch buffer)."""


class StreamDeviceError(CudnnGraphError, ValueError):
    """A stream of one device was given for a graph that runs on another."""


class MissingTensorError(CudnnGraphError, ValueError):
    """The variant pack lacks a buffer for a tensor the plan reads or writes."""


class UnknownTensorError(CudnnGraphError, ValueError):
    """The variant pack names a tensor (or uid) the graph does not have."""


class GraphValidationError(CudnnGraphError, ValueError):
    """A graph is ill-formed; names the node, the op and the port."""

    def __init__(self, node: str, op: str, port: str, message: str):
        self.node = node
        self.op = op
        self.port = port
        super().__init__(f"node '{node}' ({op}), port '{port}': {message}")


class GraphNotSupportedError(CudnnGraphError, NotImplementedError):
    """No engine (or the engine asked) can run this graph; the message says why."""


# The name cudnn.pygraph users catch.
cudnnGraphNotSupportedError = GraphNotSupportedError


# ---- lifecycle and argument errors ------------------------------------------------------------------
# A lifecycle misuse says the state it found and what to call; a bad argument fails where it is given,
# naming it. Each keeps the builtin its plain predecessor was, so existing ``except`` clauses still match.

class GraphStateError(CudnnGraphError, RuntimeError):
    """A graph call made in a lifecycle state that cannot serve it.

    ``action`` is the call, ``state`` what it found ('not planned', 'already planned', 'already built',
    'not built'), ``next_call`` what to call instead.
    """

    def __init__(self, action: str, state: str, next_call: str, detail: str = ""):
        self.action = action
        self.state = state
        self.next_call = next_call
        super().__init__(f"{action}: the graph is {state}{f' ({detail})' if detail else ''}; call {next_call}")


class GraphFrozenError(GraphStateError):
    """The graph was lowered or planned and can no longer change (``.state`` is 'frozen')."""

    def __init__(self, message: str = "the graph was lowered or planned; it can no longer change"):
        self.action = "a change to the graph"
        self.state = "frozen"
        self.next_call = ("every change before build_operation_graph() or build(); to change a built graph, "
                          "build a new one")
        super(GraphStateError, self).__init__(f"{message} (make {self.next_call})")


class NotPlannedError(GraphStateError, AttributeError):
    """The plan list was read (``plans``, ``selected_plan``, ...) before create_execution_plans().

    Also an AttributeError, so ``hasattr(graph, "plans")`` is False until the graph is planned.
    """


class AlreadyPlannedError(GraphStateError):
    """create_execution_plans() (or build()) on a graph that is already planned: planning is one-shot."""


class NotBuiltError(GraphStateError):
    """execute() (or a reader of the built plan) before any plan was built."""


class InvalidArgumentError(CudnnGraphError, ValueError):
    """An argument of a graph call is invalid: ``argument`` names it (``dim[1]``, ``device``,
    ``heur_modes[0]``), ``expected`` says what it takes, ``got`` what arrived; ``tensor_name`` and
    ``uid`` name the tensor where the argument is one of a tensor's."""

    def __init__(self, argument: str, expected: Optional[str] = None, got=None, tensor_name=None, uid=None,
                 detail: str = ""):
        if expected is None:
            # One whole message (the wrapper's form: its argument is part of the sentence).
            self.argument = self.expected = self.got = self.tensor_name = self.uid = None
            super().__init__(argument)
            return
        self.argument = argument
        self.expected = expected
        self.got = got
        self.tensor_name = tensor_name
        self.uid = uid
        where = f"{_label(tensor_name, uid)}: " if (tensor_name or uid is not None) else ""
        super().__init__(f"{where}{argument} must be {expected}; got {got!r}{f' ({detail})' if detail else ''}")


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong kind (a string where a list of enum members goes, a float dim, ...)."""


class InvalidDeviceError(InvalidArgumentTypeError):
    """A graph's ``device`` is not one a graph can run on; a ValueError (unknown name) and a
    TypeError (wrong kind), as the plain errors it replaces were."""


class UidCollisionError(CudnnGraphError, ValueError):
    """Two tensors were given the same user uid; names both and the uid."""

    def __init__(self, uid: int, holder: str, claimant: str):
        self.uid = uid
        self.holder = holder
        self.claimant = claimant
        super().__init__(f"uid {uid} is already held by tensor '{holder}'; tensor '{claimant}' cannot take it "
                         f"(give it another uid, or none and the graph picks one)")


class AmbiguousTensorNameError(UnknownTensorError):
    """A variant pack key names a tensor by a name several tensors share (names are labels: duplicates
    are legal, as in cudnn.pygraph); key it by Tensor or uid. ``uids`` lists the tensors of that name."""

    def __init__(self, name: str, uids):
        self.tensor_name = name
        self.uids = tuple(uids)
        super().__init__(f"tensor name '{name}' is ambiguous: tensors of uids {list(self.uids)} share it; "
                         f"key the variant pack by Tensor or uid")


__all__ += ["GraphStateError", "NotPlannedError", "AlreadyPlannedError", "NotBuiltError",
            "InvalidArgumentError", "InvalidArgumentTypeError", "InvalidDeviceError", "UidCollisionError",
            "AmbiguousTensorNameError"]


# ---- variant-pack keys and outputs (issue 20) ------------------------------------------------------
# Keys are checked to belong to the graph being executed and to name a buffer it reads or writes.

__all__ += ["ForeignTensorError", "VirtualTensorError", "DuplicateTensorError", "OverlappingOutputError"]


class ForeignTensorError(UnknownTensorError):
    """A variant-pack key is a Tensor of another graph: matching it by uid would bind the wrong buffer.

    Example: ``g1.execute({t_of_g2: buf, ...})`` raises it; key the pack with ``g1``'s tensors (or
    their uids / names).
    """

    def __init__(self, name, uid, tensor_graph: str, graph: str):
        self.tensor_name = name
        self.uid = uid
        self.tensor_graph = tensor_graph
        self.graph = graph
        super().__init__(
            f"{_label(name, uid)} belongs to {tensor_graph}, not to {graph} (the graph being executed): "
            "key the variant pack with this graph's tensors, their uids or their names")


class VirtualTensorError(UnknownTensorError):
    """A variant-pack key names a virtual tensor: an intermediate of the graph, which has no buffer."""

    def __init__(self, name, uid):
        self.tensor_name = name
        self.uid = uid
        super().__init__(
            f"{_label(name, uid)} is virtual (an intermediate that has no buffer): give buffers for the "
            "graph's inputs and outputs only, or mark it set_output(True) before building")


class DuplicateTensorError(CudnnGraphError, ValueError):
    """The variant pack gives one tensor twice (e.g. by its Tensor and by its uid or its name)."""

    def __init__(self, name, uid, keys=()):
        self.tensor_name = name
        self.uid = uid
        self.keys = tuple(keys)
        given = f" (as {' and '.join(self.keys)})" if len(self.keys) > 1 else ""
        super().__init__(f"{_label(name, uid)} is given twice in the variant pack{given}")


class OverlappingOutputError(StrideMismatchError):
    """An output buffer's strides make two indices address one element (a zero or overlapping stride):
    what the graph writes there would depend on the order of its writes."""


# ---- the cudnn.Graph wrapper and the graph helpers (cudnn_graph/wrapper.py, graph_helpers.py) --------
# They subclass the exception type cudnn-frontend raises in the same place (ValueError / RuntimeError),
# so a port's existing except clauses keep catching them.

class TensorReferenceError(InvalidArgumentError):
    """A wrapper ``inputs=`` / ``outputs=`` entry, or a call's argument, names no tensor of the graph, names
    one twice, or leaves a non-virtual tensor unaccounted for; the message names the entry."""


class WrapperStateError(CudnnGraphError, RuntimeError):
    """The ``cudnn_graph.Graph`` wrapper was used out of order (called before its ``with`` block ended,
    entered twice) or asked for something it does not do (a lifecycle method it runs itself, a call
    without the workspace ``workspace_alloc=False`` requires)."""


__all__ += ["TensorReferenceError", "WrapperStateError"]


# The frontend-surface name for an argument of the wrong kind (e.g. ``pygraph(kernel_cache=)`` given
# something that is not a ``KernelCache``): the same error as the graph's own argument checks raise.
ArgumentTypeError = InvalidArgumentTypeError


class KernelCacheError(CudnnGraphError, ValueError):
    """A kernel cache cannot do what was asked: serialize an empty cache, deserialize text it did not
    write, or deserialize into a cache that is in use."""


__all__ += ["ArgumentTypeError", "KernelCacheError"]


# ---- autotune and caller-owned CUDA graphs ----------------------------------------------------------

class AutotuneError(CudnnGraphError, RuntimeError):
    """``autotune()`` found no plan to choose: every plan of the list failed to build or to execute.
    ``failures`` lists ``(plan index, plan label, why)`` for each."""

    def __init__(self, message: str, failures=()):
        self.failures = list(failures)
        detail = "; ".join(f"plan {i} ({label}): {why}" for i, label, why in self.failures)
        super().__init__(f"{message}{f' ({detail})' if detail else ''}")


class CudaGraphError(CudnnGraphError, ValueError):
    """``populate_cuda_graph()`` / ``update_cuda_graph()`` cannot use the CUDA graph or the variant pack
    it was given: no graph handle, a graph that is not empty (populate) or was not populated by this
    graph (update), or operands a recorded graph would freeze (host, pass-by-value buffers)."""


__all__ += ["AutotuneError", "CudaGraphError"]

# ---- serialized plans and the plan cache (cudnn_graph/_plan_blob.py, plan_serialization.py) ---------

class PlanBlobError(CudnnGraphError, ValueError):
    """A serialized plan cannot be read or written: not a cudnn_graph plan blob (wrong magic), truncated,
    corrupt (its checksum does not match), or holding what this process cannot rebuild; ``field`` names
    the part that is wrong (None where the whole blob is)."""

    def __init__(self, message: str, field=None):
        self.field = field
        super().__init__(message)


class PlanVersionMismatchError(PlanBlobError):
    """A serialized plan was made for another format, library, cuDNN version or GPU architecture than
    this process has: ``field`` says which, ``blob_value`` what the blob holds, ``process_value`` what
    this process has. Build the graph again (and serialize it again) where it will run."""

    def __init__(self, field: str, blob_value, process_value, hint: str = "build the graph again here"):
        self.blob_value = blob_value
        self.process_value = process_value
        super().__init__(f"the plan blob's {field} is {blob_value}, this process has {process_value}: "
                         f"it cannot be loaded ({hint})", field)


__all__ += ["PlanBlobError", "PlanVersionMismatchError"]

# ---- device properties and deviceless builds (cudnn_graph/device_properties.py) -------------------------

class DevicePropertiesError(CudnnGraphError, ValueError):
    """Serialized device properties cannot be read: not text ``DeviceProperties.serialize()`` (or cuDNN)
    wrote, malformed JSON, refused by cuDNN, or written by another cuDNN version (``field`` says which part
    is wrong, ``blob_value`` / ``process_value`` what it holds and what this process has, where known)."""

    def __init__(self, message: str, field=None, blob_value=None, process_value=None):
        self.field = field
        self.blob_value = blob_value
        self.process_value = process_value
        super().__init__(message)


class DevicePropertiesMismatchError(PlanVersionMismatchError):
    """A plan built without a device (``pygraph(device_property=...)``) meets a GPU whose properties differ
    from the ones it was built for: ``differences`` maps each differing property to
    ``(built for, this device)``. Build it again for this GPU (or with its properties)."""

    def __init__(self, differences: dict, device: str):
        self.differences = dict(differences)
        shown = ", ".join(f"{k}: built for {a!r}, {device} has {b!r}" for k, (a, b) in sorted(self.differences.items()))
        self.blob_value = {k: a for k, (a, _) in self.differences.items()}
        self.process_value = {k: b for k, (_, b) in self.differences.items()}
        PlanBlobError.__init__(self, f"the plan was built without a device for a GPU whose properties differ from "
                                     f"{device}'s ({shown}): it cannot run here (build it again with this GPU's "
                                     f"properties: create_device_properties() on it)", "device properties")


__all__ += ["DevicePropertiesError", "DevicePropertiesMismatchError"]

# ---- the XLA FFI custom call (src/cudnn_graph/_xla_ffi.pyx, cudnn_graph/jax.py) ------------------------

class FfiRegistrationError(InvalidArgumentError):
    """A graph cannot run as an XLA custom call as declared (a virtual or pass-by-value operand, strides that
    are not dense row-major, a data type XLA has no code for, an operand the call does not pass, an
    XLA FFI API version the handler was not written for); the message names the tensor."""


__all__ += ["FfiRegistrationError"]
