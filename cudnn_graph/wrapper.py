"""``cudnn_graph.Graph``: cudnn-frontend's ``cudnn.Graph`` wrapper -- a graph built in a ``with`` block
from framework arrays, and then called like a function.

Inside the block, op builders take buffers (any DLPack / CUDA-array-interface object) where a tensor
goes: each buffer is a template (``tensor_like``), read for its dims, strides and data type only. On
exit the graph is validated, planned with the ``heuristics`` modes and built. Calling the wrapper
executes it: ``graph(x, w, handle=h)`` takes the inputs in ``inputs=`` order and returns the outputs
(one, or a list in ``outputs=`` order), allocated in the framework of the inputs
(``cudnn_graph._output_allocation``); ``graph({"conv2d::image": x, ...})`` fills the outputs the dict
lacks and returns the same dict.

Tensors are named as cudnn-frontend names them: ``"node::port"`` for a keyword argument,
``"node::i"`` for the i-th positional one (here also ``"node::port"``), ``"node::port::j"`` for the
j-th item of a tuple or list, the output's name (``"node::Y"``, or the one ``set_name`` gave it); an
unnamed node is ``"<op>.<k>"`` (the k-th call of that op). An ``inputs=`` / ``outputs=`` entry may be
such a name, a tensor's own name, its uid, the Tensor, or the very buffer used as its template.

Example:
    >>> import numpy as np
    >>> import cudnn_graph as cudnn
    >>> x = np.ones((1, 2, 3), np.float32)
    >>> w = np.ones((1, 3, 2), np.float32)
    >>> with cudnn.Graph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT,
    ...                  inputs=["mm::A", "mm::B"], outputs=["y"]) as graph:
    ...     y = graph.matmul(A=x, B=w, name="mm")
    ...     _ = y.set_output(True).set_name("y")
    >>> graph(x, w)[0].tolist()
    [[3.0, 3.0], [3.0, 3.0]]
"""
from __future__ import annotations

import inspect
import logging
import weakref
from typing import Any, Optional, Sequence

from ._ir import Tensor
from ._output_allocation import allocate_output, framework_of, template_for
from .data_type import data_type_of
from .enums import heur_mode
from .errors import InvalidArgumentError, TensorReferenceError, WrapperStateError
from .graph import pygraph
from .ops import SCHEMAS

logger = logging.getLogger(__name__)

__all__ = ["Graph", "get_default_handle", "destroy_default_handle"]

# Every op builder of pygraph, by the names a caller spells (schema names and aliases).
_OP_BUILDERS = frozenset(n for s in SCHEMAS.values() for n in (s.name,) + tuple(s.aliases))
# Tensor makers: what they make is a graph tensor the caller may list in inputs= / outputs= as is.
_TENSOR_MAKERS = frozenset(("tensor", "tensor_like", "tensor_scalar"))
# The lifecycle and plan-list calls the wrapper makes itself: cudnn-frontend refuses them too.
_BLOCKED = frozenset((
    "build", "build_operation_graph", "build_plan_at_index", "build_plans", "check_support",
    "create_execution_plan", "create_execution_plans", "deselect_behavior_notes", "deselect_engines",
    "deselect_numeric_notes", "deselect_workspace_greater_than", "execute", "execute_plan_at_index",
    "get_behavior_notes", "get_behavior_notes_for_plan_at_index", "get_engine_count",
    "get_execution_plan_count", "get_knobs_for_engine", "get_plan_name_at_index", "key",
    "populate_cuda_graph", "select_behavior_notes", "select_numeric_notes", "update_cuda_graph", "validate",
))
_DEFAULT_HEURISTICS = (heur_mode.A, heur_mode.FALLBACK)
_DATA_TYPE_KEYWORDS = ("io_data_type", "intermediate_data_type", "compute_data_type")


def _is_buffer(obj) -> bool:
    """A framework array (or any producer) standing where a graph tensor goes."""
    return not isinstance(obj, Tensor) and (hasattr(obj, "__dlpack__")
                                            or hasattr(obj, "__cuda_array_interface__"))


def _detached(obj):
    """A template the producer can export: autograd tensors export only once detached (duck-typed)."""
    if getattr(obj, "requires_grad", False) and hasattr(obj, "detach"):
        return obj.detach()
    return obj


def _positional_ports(method) -> tuple:
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)


class _Template:
    """A buffer used as a template and the tensor made from it. The buffer is held while the graph is
    built (so a temporary's id cannot be reused for another template) and weakly afterwards."""

    __slots__ = ("tensor", "_strong", "_weak")

    def __init__(self, buffer, tensor):
        self.tensor = tensor
        self._strong = buffer
        self._weak = None

    def release(self):
        try:
            self._weak = weakref.ref(self._strong)
        except TypeError:
            self._weak = False        # not weak-referenceable: trust the id, as cudnn-frontend does
        self._strong = None

    def holds(self, obj) -> bool:
        if self._strong is not None:
            return self._strong is obj
        return self._weak is False or self._weak() is obj


class Graph:
    """cudnn-frontend's ``cudnn.Graph``: build a graph from framework arrays in a ``with`` block, then
    call it.

    Keywords (all keyword-only): ``handle`` (used by every call that names none; "auto" or None: the
    runtime's handle for the device and thread), ``inputs`` / ``outputs`` (the positional order of a
    call, as ``set_io_tuples``), ``heuristics`` (the modes planned with; default
    ``[heur_mode.A, heur_mode.FALLBACK]``), ``workspace_alloc`` (True: the graph provides the
    workspace; False: every call passes ``workspace=``); everything else goes to ``pygraph`` (``name``,
    ``io_data_type``, ``intermediate_data_type``, ``compute_data_type`` -- any dtype spelling,
    ``torch.float16`` included --, ``device``, ...).

    Example:
        >>> import numpy as np
        >>> import cudnn_graph as cudnn
        >>> a = np.full((1, 2, 2), 2.0, np.float32)
        >>> with cudnn.Graph(io_data_type=np.float32, compute_data_type=np.float32) as graph:
        ...     _ = graph.relu(input=a, name="act").set_output(True)
        >>> out = graph({"act::input": a})
        >>> out["act::Y"].tolist()
        [[[2.0, 2.0], [2.0, 2.0]]]
    """

    def __init__(self, *, handle=None, inputs: Optional[Sequence] = None, outputs: Optional[Sequence] = None,
                 heuristics: Optional[Sequence] = None, workspace_alloc: bool = True, **kwargs) -> None:
        for what, value in (("inputs", inputs), ("outputs", outputs), ("heuristics", heuristics)):
            if value and not isinstance(value, (list, tuple)):
                raise InvalidArgumentError(f"Graph({what}=): expected a list or tuple; got {type(value).__name__}")
        for key in _DATA_TYPE_KEYWORDS:
            if kwargs.get(key) is not None:
                try:
                    kwargs[key] = data_type_of(kwargs[key])
                except TypeError as exc:
                    raise InvalidArgumentError(f"Graph({key}=): {exc}") from None
        self._w_kwargs = kwargs
        self._w_handle = handle
        self._w_heuristics = list(heuristics) if heuristics else list(_DEFAULT_HEURISTICS)
        self._w_workspace_alloc = bool(workspace_alloc)
        self._w_graph: Optional[pygraph] = None
        self._w_built = False
        self._w_templates: dict = {}      # id(buffer) -> _Template
        self._w_in: dict = {}             # "node::port" -> Tensor an op was given
        self._w_out: dict = {}            # output name -> Tensor an op made
        self._w_made: list = []           # tensors made by tensor() / tensor_like() / tensor_scalar()
        self._w_node_count: dict = {}     # op -> calls so far (names unnamed nodes "<op>.<k>")
        self._w_node_names: set = set()
        self._w_io = (list(inputs or ()), list(outputs or ()))   # resolved at exit
        self._w_in_order: Optional[tuple] = None
        self._w_out_order: Optional[tuple] = None

    # ---- the with block -------------------------------------------------------------------------

    def __enter__(self) -> "Graph":
        if self._w_graph is not None:
            raise WrapperStateError("this Graph was already entered: a wrapper holds one graph")
        handle = self._w_handle if self._w_handle not in (None, "auto") else None
        self._w_graph = pygraph(handle=handle, **self._w_kwargs)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            logger.debug("Graph: the with block raised %s; the graph is dropped", exc_type.__name__)
            self._w_graph = None
            return False
        g = self._w_graph
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans(self._w_heuristics)
        g.check_support()
        g.build_plans()
        self._w_built = True
        for template in self._w_templates.values():
            template.release()
        inputs, outputs = self._w_io
        if inputs or outputs:
            self.set_io_tuples(inputs, outputs)
        logger.debug("Graph %r built: inputs %s, outputs %s", g.context.name, list(self._w_in), list(self._w_out))
        return False

    # ---- building: pygraph's methods, with buffers as templates ---------------------------------

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the wrapper itself lacks: pygraph's methods and attributes.
        if name.startswith("_w_"):
            raise AttributeError(name)
        g = self._w_graph
        if g is None:
            raise WrapperStateError(f"Graph.{name}: use the wrapper inside its with block first "
                                    "(`with cudnn_graph.Graph(...) as graph:`)")
        if name in _BLOCKED:
            raise WrapperStateError(f"Graph.{name}: the wrapper runs the graph's lifecycle itself; "
                                    "calling it through the wrapper is not allowed")
        attr = getattr(g, name)
        if name in _TENSOR_MAKERS:
            return self._tensor_maker(attr)
        if name in _OP_BUILDERS:
            return self._op_builder(name, attr)
        return attr

    def _tensor_maker(self, method):
        def make(*args, **kwargs):
            tensor = method(*args, **kwargs)
            self._w_made.append(tensor)
            return tensor
        make.__name__ = method.__name__
        make.__doc__ = method.__doc__
        return make

    def _template_tensor(self, buffer, label: str) -> Tensor:
        entry = self._w_templates.get(id(buffer))
        if entry is not None and entry.holds(buffer):
            return entry.tensor
        tensor = self._w_graph.tensor_like(_detached(buffer), name=label)
        self._w_templates[id(buffer)] = _Template(buffer, tensor)
        return tensor

    def _bind(self, value, keys: Sequence[str]):
        """``value`` with buffers replaced by template tensors; records the tensors under ``keys``."""
        if isinstance(value, (tuple, list)):
            items = list(value)
            for j, item in enumerate(items):
                items[j] = self._bind(item, [f"{k}::{j}" for k in keys])
            return type(value)(items)
        if _is_buffer(value):
            value = self._template_tensor(value, keys[-1])
        if isinstance(value, Tensor):
            for key in keys:
                self._w_in[key] = value
        return value

    def _op_builder(self, op: str, method):
        ports = _positional_ports(method)

        def build(*args, **kwargs):
            count = self._w_node_count.get(op, 0)
            self._w_node_count[op] = count + 1
            node = kwargs.get("name")
            if node is None:
                node = kwargs["name"] = f"{op}.{count}"
            node = str(node)
            if node in self._w_node_names:
                raise InvalidArgumentError(f"{op}(name={node!r}): node name {node!r} is already used in this graph")
            self._w_node_names.add(node)
            args = list(args)
            for i, value in enumerate(args):
                keys = [f"{node}::{i}"] + ([f"{node}::{ports[i]}"] if i < len(ports) else [])
                args[i] = self._bind(value, keys)
            for key, value in kwargs.items():
                if key != "name":
                    kwargs[key] = self._bind(value, [f"{node}::{key}"])
            result = method(*args, **kwargs)
            made = result if isinstance(result, (list, tuple)) else [result]
            for i, tensor in enumerate(made):
                if isinstance(tensor, Tensor):
                    self._w_out[tensor.get_name() or f"{node}::{i}"] = tensor
            return result

        build.__name__ = op
        build.__doc__ = method.__doc__
        try:
            build.__signature__ = inspect.signature(method)
        except (TypeError, ValueError):
            pass
        return build

    # ---- inputs and outputs ---------------------------------------------------------------------

    def set_io_tuples(self, inputs: Sequence, outputs: Sequence) -> None:
        """Fix the positional order of a call: ``graph(*inputs)`` returns ``outputs`` (one, or a list).

        Entries are "node::port" names, tensor names, uids, Tensors or the template buffers. Every
        non-virtual tensor must be listed (inputs may not be virtual). Before the ``with`` block ends
        the lists are kept and resolved when it does.
        """
        for what, value in (("inputs", inputs), ("outputs", outputs)):
            if not isinstance(value, (list, tuple)):
                raise InvalidArgumentError(f"set_io_tuples({what}=): expected a list or tuple; "
                                           f"got {type(value).__name__}")
        if not self._w_built:
            self._w_io = (list(inputs), list(outputs))
            return
        seen: set = set()
        ins = [self._resolve(entry, i, "input", self._w_in, seen) for i, entry in enumerate(inputs)]
        outs = [self._resolve(entry, i, "output", self._w_out, seen) for i, entry in enumerate(outputs)]
        for i, tensor in enumerate(ins):
            if tensor.is_virtual:
                raise TensorReferenceError(f"input at index {i} ({inputs[i]!r}) is a virtual tensor "
                                           f"('{tensor.name}'): only non-virtual tensors are bound at a call")
        for table, what in ((self._w_out, "output"), (self._w_in, "input or output")):
            for key, tensor in table.items():
                if not tensor.is_virtual and id(tensor) not in seen and not _has_value(tensor):
                    raise TensorReferenceError(f"node {'output' if what == 'output' else 'input'} {key} is a "
                                               f"non-virtual tensor but is not listed as an {what}")
        self._w_in_order = tuple(ins)
        self._w_out_order = tuple(outs)

    def _resolve(self, entry, index: int, what: str, table: dict, seen: set) -> Tensor:
        tensor = self._lookup(entry, table)
        if tensor is None:
            hint = "" if isinstance(entry, (str, int, Tensor)) else "; a buffer names the tensor it was the template of"
            raise TensorReferenceError(f"{what} at index {index} ({_describe(entry)}) names no {what} tensor "
                                       f"of this graph (known: {', '.join(table) or 'none'}){hint}")
        if id(tensor) in seen:
            raise TensorReferenceError(f"{what} at index {index} ({_describe(entry)}) is a duplicate")
        seen.add(id(tensor))
        return tensor

    def _lookup(self, entry, table: dict) -> Optional[Tensor]:
        if isinstance(entry, Tensor):
            if any(entry is t for t in self._w_made):
                return entry
            return next((t for t in table.values() if t is entry), None)
        if isinstance(entry, str):
            if entry in table:
                return table[entry]
            return next((t for t in table.values() if t.get_name() == entry), None)
        if isinstance(entry, int) and not isinstance(entry, bool):
            return next((t for t in table.values() if t.get_uid() == entry), None)
        template = self._w_templates.get(id(entry))
        if template is not None and template.holds(entry):
            return next((t for t in table.values() if t is template.tensor), None)
        return None

    # ---- calls ----------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        """Execute: ``graph(*inputs, handle=..., workspace=..., stream=...)`` returns the outputs in
        ``outputs=`` order (one, or a list); ``graph({name: buffer, ...}, ...)`` returns that dict with
        every output it lacked allocated and filled. Other keywords go to ``pygraph.execute``."""
        if self._w_graph is None or not self._w_built:
            raise WrapperStateError("the graph is built when its with block ends; call it after that")
        if len(args) == 1 and isinstance(args[0], dict):
            return self._call_with_dict(args[0], kwargs)
        if self._w_in_order is None:
            raise WrapperStateError("a positional call needs the input order: give Graph(inputs=, outputs=) "
                                    "or call set_io_tuples(); or pass a dict {name: buffer}")
        if len(args) != len(self._w_in_order):
            raise TensorReferenceError(f"the graph takes {len(self._w_in_order)} positional inputs "
                                       f"({', '.join(t.name for t in self._w_in_order)}); got {len(args)}")
        pack = {t.get_uid(): buffer for t, buffer in zip(self._w_in_order, args)}
        template = template_for(args, self._w_graph.device)
        finishers = self._allocate(self._w_out_order, pack, template)
        self._execute(pack, kwargs, template)
        results = [finish() for finish in finishers]
        return results[0] if len(results) == 1 else results

    def _call_with_dict(self, tensors: dict, kwargs: dict) -> dict:
        g = self._w_graph
        pack: dict = {}
        # Tensors the dict lacks, by identity; a tensor that is an op's output (even if another op also
        # reads it) is allocated under its output name, as cudnn-frontend does.
        missing: dict = {}
        for table, is_output in ((self._w_in, False), (self._w_out, True)):
            for key, tensor in table.items():
                uid = tensor.get_uid()
                if uid in pack or tensor.is_virtual:
                    continue
                found, buffer = _find_buffer(key, tensor, tensors)
                if found:
                    pack[uid] = buffer
                    missing.pop(id(tensor), None)
                elif is_output or not _has_value(tensor):
                    missing[id(tensor)] = (key, tensor, is_output)
        missing_in = [key for key, tensor, is_output in missing.values() if not is_output]
        if missing_in:
            raise TensorReferenceError(f"the dict has no buffer for the non-virtual input tensors {missing_in}")
        missing_out = [(key, tensor) for key, tensor, is_output in missing.values() if is_output]
        template = template_for(tensors.values(), g.device)
        finishers = self._allocate([t for _, t in missing_out], pack, template)
        self._execute(pack, kwargs, template)
        for (key, _), finish in zip(missing_out, finishers):
            tensors[key] = finish()
        if missing_out:
            logger.debug("Graph %r: allocated outputs %s", g.context.name, [k for k, _ in missing_out])
        return tensors

    def _allocate(self, outputs, pack: dict, template) -> list:
        device = self._w_graph.device
        finishers = []
        for tensor in outputs:
            buffer, finish = allocate_output(tensor.dim, tensor.stride, data_type_of(tensor.get_data_type()),
                                             device, template)
            pack[tensor.get_uid()] = buffer
            finishers.append(finish)
        return finishers

    def _execute(self, pack: dict, kwargs: dict, template=None) -> None:
        kwargs = dict(kwargs)
        if kwargs.get("handle") is None:
            kwargs["handle"] = self._w_handle if self._w_handle != "auto" else None
            if kwargs["handle"] is None and kwargs.get("stream") is None:
                # cudnn-frontend's handle="auto" runs on torch's current stream: here, on the current
                # stream of the inputs' framework, where it has one.
                kwargs["stream"] = _current_stream(template)
        if kwargs.get("workspace") is None and not self._w_workspace_alloc:
            raise WrapperStateError("this Graph was made with workspace_alloc=False: pass workspace= "
                                    f"(at least get_workspace_size() = {self._w_graph.get_workspace_size()} bytes)")
        # workspace None: the runtime's workspace, allocated once per plan and stream and kept.
        self._w_graph.execute(pack, **kwargs)

    def __repr__(self):
        state = "built" if self._w_built else ("building" if self._w_graph is not None else "not entered")
        return f"<cudnn_graph.Graph wrapper ({state}): {self._w_graph!r}>"


def _current_stream(template):
    """The current stream of a CUDA template's framework (torch, CuPy), or None (the handle's stream)."""
    if template is None or getattr(template, "__dlpack_device__", None) is None:
        return None
    try:
        if template.__dlpack_device__()[0] != 2:      # kDLCUDA: a host template has no stream to follow
            return None
    except Exception:
        return None
    root, module = framework_of(template)
    if module is None:
        return None
    if root == "torch":
        stream = module.cuda.current_stream(template.device)
        return stream if hasattr(stream, "__cuda_stream__") else int(stream.cuda_stream)
    if root == "cupy":
        stream = module.cuda.get_current_stream()
        return stream if hasattr(stream, "__cuda_stream__") else int(stream.ptr)
    return None


def get_default_handle(stream=None, *, device: int = 0):
    """This thread's cuDNN handle for ``device`` -- the one the runtime uses for calls that name none --
    bound to ``stream`` when one is given (None leaves its stream as it is; cudnn-frontend binds torch's
    current stream).

    Example (on a machine with cuDNN):
        >>> from cudnn_graph.wrapper import get_default_handle
        >>> h = get_default_handle(0)            # doctest: +SKIP
    """
    from . import _cudnn_handle
    handle = _cudnn_handle.thread_handle(device)
    if stream is not None:
        _cudnn_handle.set_stream(handle=handle, stream=stream)
    return handle


def destroy_default_handle() -> None:
    """cudnn-frontend releases its cached default handles here; the runtime's per-thread handles serve
    every execute that names no handle, so they live until the thread (or the process) ends."""
    raise NotImplementedError("destroy_default_handle(): the runtime's per-thread cuDNN handles serve every "
                              "call that names no handle and are destroyed when their thread ends; "
                              "use create_handle()/destroy_handle() for a handle whose lifetime you manage")


def _has_value(tensor: Tensor) -> bool:
    """A pass-by-value tensor that carries its value (tensor_scalar): no call needs to supply it."""
    return tensor.is_pass_by_value and tensor.value is not None


def _describe(entry) -> str:
    if isinstance(entry, (str, int, Tensor)):
        return repr(entry)
    return f"a {type(entry).__name__}"


def _find_buffer(key: str, tensor: Tensor, tensors: dict):
    """The dict's buffer for ``tensor``: by "node::port" key, by the Tensor, by its name, by its uid."""
    for candidate in (key, tensor, tensor.get_name(), tensor.get_uid()):
        try:
            if candidate in tensors:
                return True, tensors[candidate]
        except TypeError:      # an unhashable key cannot be in the dict
            continue
    return False, None
