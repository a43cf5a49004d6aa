"""The graph IR: Tensor, Node, Graph and GraphContext.

These classes hold the graph and own its invariants: the uid namespace, freezing, read-only
introspection, JSON and the fingerprint. A getter that needs an inferred value runs
``cudnn_graph._inference`` (shape and data-type inference). Op builders and the lifecycle
(validate, plan, build, execute) live in ``cudnn_graph.graph``, which subclasses ``Graph``.
"""
cimport cython
from libc.stdint cimport int64_t
from cpython.number cimport PyNumber_Index
from numbers import Number
from types import MappingProxyType
import hashlib
import json

from cudnn_graph.data_type import DataType, data_type_of
from cudnn_graph.enums import tensor_reordering
from cudnn_graph._layout import row_major_strides   # re-exported: the IR's provisional strides
from cudnn_graph.errors import DeviceMismatchError, GraphFrozenError, GraphValidationError
from cudnn_graph.errors import InvalidArgumentError, InvalidArgumentTypeError, InvalidDeviceError, UidCollisionError
from cudnn_graph._slot import Slot, device_name, _parse_device

_NOT_SET = -1


cdef object _as_dims(object value, str what, object tensor_name=None, object uid=None):
    """A tuple of Python ints from a sequence of integers (NumPy integers too), checked where it is
    given: floats and bools are refused, and so is a negative dim (it would fail only at execute).
    Strides may be negative or zero (broadcast); the buffer check compares them."""
    cdef list out = []
    cdef Py_ssize_t i
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InvalidArgumentTypeError(what, "a sequence of ints", value, tensor_name, uid)
    for i, v in enumerate(value):
        if isinstance(v, bool):
            raise InvalidArgumentTypeError(f"{what}[{i}]", "an int (not a bool)", v, tensor_name, uid)
        try:
            item = PyNumber_Index(v)
        except TypeError:
            raise InvalidArgumentTypeError(what, "a sequence of ints", value, tensor_name, uid,
                                           f"{what}[{i}] is a {type(v).__name__}") from None
        if item < 0 and what == "dim":
            raise InvalidArgumentError(f"{what}[{i}]", "a non-negative int", item, tensor_name, uid)
        out.append(item)
    return tuple(out)


# The device forms a graph takes (a graph runs on the host or on one CUDA device).
_GRAPH_DEVICE_FORMS = "'cpu', 'cuda', 'cuda:N', a CUDA ordinal N, or ('cpu' | 'cuda', N)"
_GRAPH_DEVICE_KINDS = {"cpu": "cpu", "cuda": "cuda", 1: "cpu", 2: "cuda"}


cdef tuple _graph_device(object device):
    """The DLPack (type, ordinal) of a graph's ``device``, refusing what a graph cannot run on
    (a Slot's device names such as 'gpu', 'host', 'cuda_host' or 'opencl' are not graph devices)."""
    kind = None
    ordinal = 0
    if isinstance(device, str):
        kind_name, colon, number = device.strip().lower().partition(":")
        kind = _GRAPH_DEVICE_KINDS.get(kind_name)
        number = number.strip()
        if colon:
            ordinal = int(number) if number.isascii() and number.isdigit() else None
    elif isinstance(device, tuple) and len(device) == 2:
        first, second = device
        if isinstance(first, str):
            kind = _GRAPH_DEVICE_KINDS.get(first.strip().lower())
        elif isinstance(first, int) and not isinstance(first, bool):
            kind = _GRAPH_DEVICE_KINDS.get(int(first))
        ordinal = None if isinstance(second, bool) or not hasattr(type(second), "__index__") else PyNumber_Index(second)
    elif isinstance(device, int) and not isinstance(device, bool):
        kind, ordinal = "cuda", device
    if kind is None or ordinal is None or ordinal < 0 or (kind == "cpu" and ordinal != 0):
        hint = " ('gpu' is spelled 'cuda' here)" if isinstance(device, str) and device.strip().lower().startswith("gpu") else ""
        raise InvalidDeviceError("device", _GRAPH_DEVICE_FORMS + hint, device)
    return _parse_device(kind if kind == "cpu" else f"cuda:{ordinal}")


cdef int _reordering_code(object value, str tensor_name) except -1:
    """cudnnBackendTensorReordering_t of ``value`` (a tensor_reordering member, its int or its name)."""
    try:
        return int(tensor_reordering[value] if isinstance(value, str) else tensor_reordering(int(value)))
    except (KeyError, ValueError, TypeError):
        raise ValueError(f"tensor '{tensor_name or '<unnamed>'}': reordering_type must be one of "
                         f"{[m.name for m in tensor_reordering]}; got {value!r}") from None


cdef inline int _dt_code(object value) except -2:
    """cuDNN data type code of anything ``data_type_of`` accepts (DataType members fast)."""
    if type(value) is DataType:
        return <int>(<object>value)
    return <int>data_type_of(value)


@cython.final
cdef class GraphContext:
    """A graph's default data types and name (as ``cudnn.pygraph``'s constructor takes them)."""
    cdef readonly object io_data_type
    cdef readonly object intermediate_data_type
    cdef readonly object compute_data_type
    cdef readonly str name

    def __init__(self, io_data_type=None, intermediate_data_type=None, compute_data_type=None,
                 name=""):
        self.io_data_type = DataType.NOT_SET if io_data_type is None else data_type_of(io_data_type)
        self.intermediate_data_type = (DataType.NOT_SET if intermediate_data_type is None
                                       else data_type_of(intermediate_data_type))
        self.compute_data_type = (DataType.NOT_SET if compute_data_type is None
                                  else data_type_of(compute_data_type))
        self.name = str(name or "")

    def __repr__(self):
        return (f"GraphContext(io={self.io_data_type.name}, intermediate={self.intermediate_data_type.name}, "
                f"compute={self.compute_data_type.name}, name={self.name!r})")


@cython.final
cdef class Tensor:
    """A graph tensor. Created by ``graph.tensor(...)``, ``graph.tensor_like(...)`` or an op builder.

    Setters return the tensor so calls chain, as in ``cudnn.pygraph``::

        y = graph.matmul(a, b).set_output(True).set_data_type(cudnn.data_type.FLOAT)
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("tensors are created by a graph: graph.tensor(...), graph.tensor_like(...)")

    cdef int _mutable(self) except -1:
        if self.graph is not None and (<Graph>self.graph).frozen:
            raise GraphFrozenError(
                f"tensor '{self._name}' belongs to a graph that was lowered or planned; it can no longer change")
        if self.graph is not None:
            (<Graph>self.graph)._inferred = False
        return 0

    # ---- pygraph-style setters (chainable) --------------------------------------------------

    def set_name(self, name):
        self._mutable()
        self._name = str(name)
        return self

    def set_dim(self, dim):
        self._mutable()
        self._dim = _as_dims(dim, "dim", self._name, self._uid)
        self.dim_set_by_user = self._dim is not None
        return self

    def set_stride(self, stride):
        self._mutable()
        self._stride = _as_dims(stride, "stride", self._name, self._uid)
        self.stride_set_by_user = self._stride is not None
        return self

    def set_data_type(self, data_type):
        self._mutable()
        self._data_type = _dt_code(data_type)
        return self

    def set_output(self, bint is_output=True):
        self._mutable()
        self._virtual = not is_output
        self._virtual_user = True
        return self

    def set_is_virtual(self, bint is_virtual):
        self._mutable()
        self._virtual = is_virtual
        self._virtual_user = True
        return self

    def set_is_pass_by_value(self, bint value):
        self._mutable()
        self.is_pass_by_value = value
        return self

    def set_ragged_offset(self, offset):
        self._mutable()
        if offset is not None and not isinstance(offset, Tensor):
            raise TypeError(f"a ragged offset is a Tensor of the same graph; got {type(offset).__name__}")
        if offset is not None and (<Tensor>offset).graph is not self.graph:
            raise ValueError("the ragged offset tensor belongs to another graph")
        self.ragged_offset = offset
        return self

    def set_reordering_type(self, reordering):
        self._mutable()
        self.reordering_type = _reordering_code(reordering, self._name)
        return self

    def set_uid(self, uid):
        self._mutable()
        if self.graph is None:
            self._uid = PyNumber_Index(uid)
        else:
            (<Graph>self.graph)._claim_uid(self, PyNumber_Index(uid))
        self.uid_assigned_by_user = True
        return self

    # ---- getters ------------------------------------------------------------------------------
    # cudnn.pygraph spells every getter get_*(); the properties of the same name are those methods.

    def get_name(self) -> str:
        return self._name

    name = property(get_name)

    def get_uid(self) -> int:
        return self._uid

    uid = property(get_uid)

    def get_dim(self) -> list:
        return list(self.dim)

    def get_stride(self) -> list:
        return list(self.stride)

    def get_is_virtual(self) -> bool:
        return self._virtual

    is_virtual = property(get_is_virtual)

    def get_is_pass_by_value(self) -> bool:
        return self.is_pass_by_value

    def get_ragged_offset(self):
        return self.ragged_offset

    def get_data_type(self):
        """The tensor's data type: the user's, else the one inference resolved (``cudnn_graph._inference``:
        the op's, else the graph's io / intermediate / compute type); NOT_SET where none applies."""
        if self._data_type == _NOT_SET and self.graph is not None and not (<Graph>self.graph)._inferred:
            try:
                self.graph._ensure_inferred()
            except Exception:
                pass
        return DataType(self._data_type if self._data_type != _NOT_SET else self._dtype_inferred)

    data_type = property(get_data_type)

    @property
    def dim(self) -> tuple:
        if self._dim is None and self.producer is not None and self.graph is not None:
            self.graph._ensure_inferred()
        return self._dim if self._dim is not None else ()

    @property
    def stride(self) -> tuple:
        if self._stride is None and self.producer is not None and self.graph is not None:
            self.graph._ensure_inferred()
        if self._stride is not None:
            return self._stride
        return row_major_strides(self._dim) if self._dim is not None else ()

    @property
    def is_output(self) -> bool:
        return self.producer is not None and not self._virtual

    @property
    def device(self):
        """The device of the buffer ``tensor_like`` read this tensor from (None otherwise)."""
        return self._device

    def _set_inferred(self, dim, stride, data_type):
        """Record inference results without touching what the user set (IR-internal)."""
        if not self.dim_set_by_user and dim is not None:
            self._dim = tuple(dim)
        if not self.stride_set_by_user:
            if stride is not None:
                self._stride = tuple(stride)
            elif self._dim is not None:
                self._stride = None
        self._dtype_inferred = _NOT_SET if data_type is None else int(data_type)

    def _set_inferred_type(self, data_type):
        """Record an inferred data type only (IR-internal)."""
        self._dtype_inferred = _NOT_SET if data_type is None else int(data_type)

    def _raw_dim(self):
        return self._dim

    @property
    def data_type_set_by_user(self) -> bool:
        return self._data_type != _NOT_SET

    def __repr__(self):
        kind = "virtual" if self._virtual else ("output" if self.producer is not None else "input")
        return (f"Tensor(name={self._name!r}, uid={self._uid}, dim={self._dim}, "
                f"stride={self._stride}, data_type={self.data_type.name}, {kind})")


@cython.final
cdef class Node:
    """One op of a graph. ``inputs``, ``outputs`` and ``params`` are read-only mappings."""

    def __init__(self, *args, **kwargs):
        raise TypeError("nodes are created by a graph's op builders")

    @property
    def inputs(self):
        return MappingProxyType(self._inputs)

    @property
    def outputs(self):
        return MappingProxyType(self._outputs)

    @property
    def params(self):
        return MappingProxyType(self._params)

    def __repr__(self):
        return f"Node({self.op!r}, name={self.name!r}, inputs={list(self._inputs)}, outputs={list(self._outputs)})"


@cython.final
cdef class OpBinding:
    """What an op builder reads at call time, computed once per op schema (at import, by
    ``cudnn_graph.graph``): positional order, the keywords it takes and its port / attribute /
    output tables. ``Graph._build`` binds a call against it without building any set or dict of
    names per call.
    """
    cdef readonly object schema
    cdef readonly str op
    cdef readonly tuple order            # positional names, pygraph's order
    cdef readonly frozenset known        # every keyword the builder takes
    cdef readonly tuple expanders        # (keyword, f(value) -> {name: value}) (sdpa's dropout=)
    cdef readonly tuple ports            # (port, optional, takes a list, type of a Python number given)
    cdef readonly tuple attrs            # (attr, default, convert)
    cdef readonly tuple outputs          # (output, when(attrs, given) or None)
    cdef readonly object static_outputs  # output names when none is conditional, else None
    cdef readonly tuple redirect         # outputs the caller may hand in as a tensor it made
    cdef readonly object returned        # output names the builder returns as a list, or None (one tensor)
    cdef object required                 # the "no default" sentinel of the op tables

    def __init__(self, schema, required, generic=("compute_data_type", "name")):
        self.schema = schema
        self.op = schema.name
        self.required = required
        self.order = tuple(schema.pygraph_positional or schema.positional or schema.port_names())
        self.expanders = tuple(schema.keyword_expanders.items())
        attr_names = {a.name for a in schema.attrs}
        self.known = frozenset(set(schema.port_names()) | attr_names | set(generic)
                               | {k for k, _ in self.expanders})
        list_ports = set(schema.list_ports)
        scalar_ports = schema.scalar_ports
        self.ports = tuple((p.name, bool(p.optional), p.name in list_ports, scalar_ports.get(p.name))
                           for p in schema.inputs)
        self.attrs = tuple((a.name, a.default, a.convert) for a in schema.attrs)
        self.outputs = tuple((o.name, o.when) for o in schema.outputs)
        self.static_outputs = (tuple(o.name for o in schema.outputs)
                               if all(o.when is None for o in schema.outputs) else None)
        self.redirect = tuple(o.name for o in schema.outputs if o.name in attr_names)
        returned = schema.returned_outputs
        if returned is not None:
            self.returned = tuple(returned)
        elif schema.returns == "list":
            self.returned = tuple(o.name for o in schema.outputs)
        else:
            self.returned = None

    def __repr__(self):
        return f"OpBinding({self.op!r}, positional={self.order})"


cdef bint _operand(Graph g, object value, str node, str op, str port, bint number_ok) except -1:
    """True for a Tensor of ``g``, False for a Python number (a scalar operand); raises otherwise."""
    if isinstance(value, Tensor):
        if (<Tensor>value).graph is not g:
            raise GraphValidationError(node, op, port, f"tensor '{(<Tensor>value)._name}' belongs to another graph")
        return True
    if number_ok and isinstance(value, Number) and not isinstance(value, bool):
        return False
    raise GraphValidationError(node, op, port,
                               f"expects a Tensor{' (or a Python number for a scalar)' if number_ok else ''}; "
                               f"got {type(value).__name__}")


cdef list _append_node(Graph g, str op, object schema, str name, dict inputs, dict params,
                       tuple output_names, int compute):
    """Append a checked node (inputs are tensors of ``g``); returns its new output tensors."""
    cdef Node n = Node.__new__(Node)
    cdef Tensor t
    cdef list outs = []
    n.op = op
    n.schema = schema
    n.index = len(g._nodes)
    n.name = name
    n._inputs = inputs
    n._params = params
    n.compute_data_type = compute
    n._outputs = {}
    for out_name in output_names:
        t = g._new_tensor()
        t._name = f"{name}::{out_name}"
        t._virtual = True
        t.producer = n
        n._outputs[out_name] = t
        outs.append(t)
    g._nodes.append(n)
    g._inferred = False
    return outs


cdef class Graph:
    """The graph core: tensors, nodes, uids, device and freezing. Build graphs with ``cudnn_graph.pygraph``."""

    def __cinit__(self):
        self._tensors = []
        self._nodes = []
        self._uids = {}
        self._next_uid = 1
        self.frozen = False
        self._device = None
        self.device_explicit = False
        self.handle = None
        self._router = None
        self._inferred = False
        self._validated = False
        self._hot = None

    def __init__(self, io_data_type=None, intermediate_data_type=None, compute_data_type=None, *,
                 name="", device=None, handle=None, router=None):
        self.context = GraphContext(io_data_type, intermediate_data_type, compute_data_type, name)
        self.handle = handle
        self._router = router
        if device is not None:
            self._device = _graph_device(device)
            self.device_explicit = True
        elif handle is not None and getattr(handle, "device", None) is not None:
            self._device = _parse_device(handle.device)
            self.device_explicit = True

    cdef int _mutable(self) except -1:
        if self.frozen:
            raise GraphFrozenError("the graph was lowered or planned; it can no longer change")
        self._inferred = False
        return 0

    def _freeze(self):
        self.frozen = True

    @property
    def router(self):
        """The Router that ranks this graph's plan list (None: the process default)."""
        return self._router

    @router.setter
    def router(self, router):
        # Ranking happens once, in create_execution_plans(): a router set afterwards would do nothing.
        if self.frozen:
            raise GraphFrozenError("the graph was lowered or planned; set its router before building")
        self._router = router

    # ---- uids ---------------------------------------------------------------------------------

    cdef int64_t _claim_uid(self, Tensor t, int64_t uid) except -1:
        """User uids win: an auto uid in the way is renumbered; two user uids that collide raise."""
        cdef Tensor holder = self._uids.get(uid)
        if holder is t:
            return uid
        if holder is not None:
            if holder.uid_assigned_by_user:
                raise UidCollisionError(uid, holder._name, t._name)
            del self._uids[uid]
            holder._uid = self._fresh_uid()
            self._uids[holder._uid] = holder
        if self._uids.get(t._uid) is t:
            del self._uids[t._uid]
        t._uid = uid
        self._uids[uid] = t
        if uid >= self._next_uid:
            self._next_uid = uid + 1
        return uid

    def _fresh_uid(self):
        while self._next_uid in self._uids:
            self._next_uid += 1
        uid = self._next_uid
        self._next_uid += 1
        return uid

    cdef Tensor _new_tensor(self):
        cdef Tensor t = Tensor.__new__(Tensor)
        while self._next_uid in self._uids:
            self._next_uid += 1
        t.graph = self
        t._uid = self._next_uid
        self._next_uid += 1
        t.uid_assigned_by_user = False
        t._name = ""
        t._dim = None
        t._stride = None
        t.dim_set_by_user = False
        t.stride_set_by_user = False
        t._data_type = _NOT_SET
        t._dtype_inferred = _NOT_SET
        t._virtual = False
        t._virtual_user = False
        t.is_pass_by_value = False
        t.value = None
        t.ragged_offset = None
        t.producer = None
        t.reordering_type = 0
        t._device = None
        self._uids[t._uid] = t
        self._tensors.append(t)
        return t

    # ---- tensors ------------------------------------------------------------------------------

    def tensor(self, name=None, dim=None, stride=None, data_type=None, is_virtual=False,
               is_pass_by_value=False, ragged_offset=None, reordering_type=None, uid=None):
        """A graph input (or, with ``is_virtual=True``, an intermediate) tensor.

        Example:
            >>> import cudnn_graph as cudnn
            >>> g = cudnn.pygraph(device="cpu")
            >>> x = g.tensor(name="x", dim=[4, 8], stride=[8, 1], data_type=cudnn.data_type.FLOAT)
            >>> x.dim, x.stride
            ((4, 8), (8, 1))
        """
        self._mutable()
        # Everything that can fail is checked before the tensor exists: a failed call leaves no
        # half-made tensor (and no consumed uid) in the graph.
        cdef object dims = _as_dims(dim, "dim", name)
        cdef object strides = _as_dims(stride, "stride", name)
        cdef int dt = _NOT_SET if data_type is None else _dt_code(data_type)
        cdef int reorder = 0 if reordering_type is None else _reordering_code(reordering_type, name)
        cdef Tensor holder
        cdef int64_t want_uid = 0
        cdef bint has_uid = uid is not None
        if dims is not None and strides is not None and len(strides) != len(dims):
            raise InvalidArgumentError("stride", "one int per dim", strides, name or "<unnamed>", None,
                                       f"{len(strides)} strides for {len(dims)} dims")
        if ragged_offset is not None:
            if not isinstance(ragged_offset, Tensor):
                raise TypeError(f"a ragged offset is a Tensor of the same graph; got {type(ragged_offset).__name__}")
            if (<Tensor>ragged_offset).graph is not self:
                raise ValueError("the ragged offset tensor belongs to another graph")
        if has_uid:
            want_uid = PyNumber_Index(uid)
            holder = self._uids.get(want_uid)
            if holder is not None and holder.uid_assigned_by_user:
                raise UidCollisionError(want_uid, holder._name, name or "<unnamed>")
        cdef Tensor t = self._new_tensor()
        # Named from the auto uid, which no later tensor receives: auto names never collide, even
        # when a user uid takes an auto tensor's number.
        t._name = str(name) if name else f"tensor_{t._uid}"
        if has_uid:
            self._claim_uid(t, want_uid)
            t.uid_assigned_by_user = True
        if dims is not None:
            t._dim = dims
            t.dim_set_by_user = True
        if strides is not None:
            t._stride = strides
            t.stride_set_by_user = True
        t._data_type = dt
        t._virtual = bool(is_virtual)
        t._virtual_user = bool(is_virtual)
        t.is_pass_by_value = bool(is_pass_by_value)
        t.ragged_offset = ragged_offset
        t.reordering_type = reorder
        return t

    cdef Tensor _new_placed_tensor(self, object name, str prefix, tuple dim, tuple stride, int data_type):
        """A new tensor whose geometry and data type are given (they bind as if the user set them);
        unnamed ones are called ``<prefix>_<uid>``."""
        cdef Tensor t = self._new_tensor()
        t._name = str(name) if name else f"{prefix}_{t._uid}"
        t._dim = dim
        t._stride = stride
        t.dim_set_by_user = True
        t.stride_set_by_user = True
        t._data_type = data_type
        return t

    def tensor_like(self, template, name=None, is_virtual=False):
        """A tensor with the dims, strides and data type of ``template`` (any buffer, or a Tensor).

        A buffer also gives the graph its device when none was set. A one-element host (CPU) buffer, such
        as cudnn.pygraph code's epsilon ``torch.full((1, 1, 1, 1), 1e-5)``, becomes a pass-by-value tensor
        whatever the graph's device, and leaves the device unset (a host scalar says nothing about where
        the graph runs); at execute it is given a host buffer, read by value.

        Example:
            >>> import numpy as np, cudnn_graph as cudnn
            >>> g = cudnn.pygraph(device="cpu")
            >>> eps = g.tensor_like(np.full((1, 1, 1, 1), 1e-5, np.float32))
            >>> eps.is_pass_by_value, eps.dim
            (True, (1, 1, 1, 1))
        """
        self._mutable()
        cdef Tensor src
        cdef Tensor t
        if isinstance(template, Tensor):
            src = <Tensor>template
            t = self._new_placed_tensor(name, "tensor", src.dim, src.stride, src._data_type)
            t.is_pass_by_value = src.is_pass_by_value
            t._device = src._device
            t._virtual = t._virtual_user = bool(is_virtual)
            return t
        slot = Slot.from_object(template)
        try:
            dt = data_type_of(slot.dtype)
        except TypeError:
            raise TypeError(f"tensor_like: cuDNN has no data type for {slot.dtype}") from None
        dev = slot.device
        by_value = self._host_value_template(dev, slot.numel)
        # Checked before the tensor exists, so a template on another device leaves nothing behind.
        if not by_value:
            self._adopt_device(dev, name)
        t = self._new_placed_tensor(name, "tensor", slot.shape, slot.strides, int(dt))
        t._device = dev
        t.is_pass_by_value = by_value
        t._virtual = t._virtual_user = bool(is_virtual)
        return t

    def _host_value_template(self, dev, numel) -> bool:
        """Whether a ``tensor_like`` template on ``dev`` holding ``numel`` elements is pass-by-value: a
        one-element host buffer. cudnn.pygraph marks every host template so, but cuDNN reads a
        by-value tensor as a scalar, and a graph here may run on the host too; a larger host buffer is an
        ordinary operand (of a host graph; on a GPU graph it is refused as on another device)."""
        return numel == 1 and dev[0] in ("cpu", "cuda_host")

    def tensor_scalar(self, value, data_type=None, name=None):
        """A pass-by-value scalar tensor holding ``value`` (dims [1] unless set otherwise)."""
        self._mutable()
        if data_type is None:
            data_type = DataType.FLOAT if isinstance(value, float) else (
                DataType.INT32 if isinstance(value, int) and not isinstance(value, bool) else DataType.FLOAT)
        cdef int dt = _dt_code(data_type)
        cdef Tensor t = self._new_placed_tensor(name, "scalar", (1,), (1,), dt)
        t.is_pass_by_value = True
        t.value = value
        return t

    def _adopt_device(self, dev, name):
        """Take ``dev`` (a template's device) as the graph's, or refuse a template on another device."""
        kind, ordinal = dev
        kind = "cpu" if kind in ("cpu", "cuda_host") else ("cuda" if kind in ("cuda", "cuda_managed") else kind)
        parsed = _parse_device(f"{kind}:{ordinal}" if kind != "cpu" else "cpu")
        if self._device is None:
            self._device = parsed
        elif self._device != parsed:
            what = "device (the graph's)" if kind != "cpu" else \
                "device (the graph's; only a one-element host tensor becomes a pass-by-value scalar)"
            raise DeviceMismatchError(name or "tensor_like template", None, what,
                                      device_name(*self._device), device_name(*parsed))

    # ---- nodes --------------------------------------------------------------------------------

    def _add_node(self, op, schema, name, inputs, params, output_names, compute_data_type):
        """Append a node; returns its output tensors (in ``output_names`` order)."""
        self._mutable()
        cdef int index = len(self._nodes)
        cdef str node_name = str(name) if name else f"{op}_{index}"
        cdef dict ins = dict(inputs)
        for port, value in ins.items():
            if value is None:
                continue
            if type(value) is Tensor and (<Tensor>value).graph is self:
                continue
            for item in (value if isinstance(value, (list, tuple)) else (value,)):
                if item is not None:
                    _operand(self, item, node_name, op, port, False)
        compute = _dt_code(compute_data_type) if compute_data_type is not None else _NOT_SET
        return _append_node(self, op, schema, node_name, ins, dict(params), tuple(output_names), compute)

    def _build(self, OpBinding b, tuple args, dict kwargs):
        """Bind one op-builder call against ``b``, check it and append the node.

        Everything is checked before anything is added, so a failed call leaves the graph as it was
        (Python numbers given for ports become scalar tensors only once the call is known good).
        Returns the output tensor, or a list of them when the op returns several.
        """
        if self.frozen:
            raise GraphFrozenError("the graph was lowered or planned; it can no longer change")
        cdef str op = b.op
        cdef tuple order = b.order
        cdef Py_ssize_t i, npos = len(args)
        cdef dict bound = {}
        cdef dict inputs = {}
        cdef dict params = {}
        cdef list scalars = None
        cdef list redirects = None
        cdef int compute = _NOT_SET
        cdef Tensor t
        if npos > len(order):
            raise TypeError(f"{op}() takes at most {len(order)} positional arguments "
                            f"({', '.join(order)}); got {npos}")
        for i in range(npos):
            bound[order[i]] = args[i]
        if kwargs:
            for key, value in kwargs.items():
                if key not in b.known:
                    raise TypeError(f"{op}() got an unexpected keyword argument '{key}' "
                                    f"(it takes {', '.join(sorted(b.known))})")
                if key in bound:
                    raise TypeError(f"{op}() got multiple values for argument '{key}'")
                bound[key] = value
        # pygraph keywords that stand for several ports/attrs (sdpa's dropout=(p, seed, offset)).
        for key, expand in b.expanders:
            if key in bound:
                for k, v in expand(bound.pop(key)).items():
                    if bound.get(k) is not None:
                        raise TypeError(f"{op}(): '{key}' and '{k}' both set '{k}'")
                    bound[k] = v
        name = bound.get("name")
        cdef str node_name = str(name) if name else f"{op}_{len(self._nodes)}"
        compute_value = bound.get("compute_data_type")
        if compute_value is not None:
            try:
                compute = _dt_code(compute_value)
            except TypeError as exc:
                raise GraphValidationError(node_name, op, "compute_data_type", str(exc)) from None
        for port, optional, is_list, scalar_type in b.ports:
            value = bound.get(port)
            if value is None:
                if not optional:
                    raise GraphValidationError(node_name, op, port, "is required but was not given")
                inputs[port] = None
            elif type(value) is Tensor and (<Tensor>value).graph is self:
                inputs[port] = value
            elif is_list:
                if not isinstance(value, (list, tuple)) or not value:
                    raise GraphValidationError(node_name, op, port, "takes a non-empty list of tensors")
                for item in value:
                    _operand(self, item, node_name, op, port, False)
                inputs[port] = tuple(value)
            elif _operand(self, value, node_name, op, port, True):
                inputs[port] = value
            else:
                if scalars is None:
                    scalars = []
                scalars.append((port, value, scalar_type))
                inputs[port] = value
        for attr, default, convert in b.attrs:
            value = bound.get(attr)
            if value is None:
                if default is b.required:
                    raise GraphValidationError(node_name, op, attr, "is required but was not given")
                value = default
            elif convert is not None:
                try:
                    value = convert(value)
                except GraphValidationError:
                    raise
                except (TypeError, ValueError) as exc:
                    raise GraphValidationError(node_name, op, attr, str(exc)) from None
            params[attr] = value
        cdef tuple out_names = b.static_outputs
        if out_names is None:
            given = frozenset([k for k, v in inputs.items() if v is not None])
            out_names = tuple([o for o, when in b.outputs if when is None or when(params, given)])
        for oname in b.redirect:
            requested = params.get(oname)
            if isinstance(requested, Tensor) and oname in out_names:
                if (<Tensor>requested).graph is not self:
                    raise GraphValidationError(node_name, op, oname,
                                               "the tensor to receive it belongs to another graph")
                if (<Tensor>requested).producer is not None:
                    raise GraphValidationError(node_name, op, oname,
                                               "the tensor given to receive it is already produced")
                if redirects is None:
                    redirects = []
                redirects.append((oname, requested))
        if scalars is not None:
            for port, value, scalar_type in scalars:
                t = self.tensor_scalar(value, data_type=scalar_type, name=f"{node_name}::{port}")
                if scalar_type is not None:
                    # cuDNN's scalar operands of 4-d ops are 4-d too.
                    t._dim = (1, 1, 1, 1)
                    t._stride = (1, 1, 1, 1)
                inputs[port] = t
        cdef list outs = _append_node(self, op, b.schema, node_name, inputs, params, out_names, compute)
        if redirects is not None:
            # An output the caller asked to receive in a tensor it made (e.g. sdpa_backward(dBias=t)).
            node = (<Tensor>outs[0]).producer
            for oname, requested in redirects:
                outs[out_names.index(oname)] = self._adopt_output(node, oname, requested)
        if b.returned is None:
            return outs[0]
        by_name = dict(zip(out_names, outs))
        return [by_name.get(o) for o in b.returned]

    def _adopt_output(self, Node node, oname, Tensor tensor):
        """Make a caller-made tensor the node's ``oname`` output, dropping the one the builder made."""
        cdef Tensor made = node._outputs[oname]
        if tensor.graph is not self:
            raise GraphValidationError(node.name, node.op, oname, "the tensor to receive it belongs to another graph")
        self._tensors.remove(made)
        del self._uids[made._uid]
        node._outputs[oname] = tensor
        tensor.producer = node
        if not tensor._virtual_user:
            tensor._virtual = False
        return tensor

    # ---- introspection ------------------------------------------------------------------------

    @property
    def nodes(self) -> tuple:
        return tuple(self._nodes)

    @property
    def tensors(self) -> tuple:
        return tuple(self._tensors)

    @property
    def node_count(self) -> int:
        """``len(graph.nodes)`` without building the tuple."""
        return len(self._nodes)

    def tensor_by_uid(self, uid):
        return self._uids[uid]

    @property
    def device(self):
        """('cpu', 0) or ('cuda', N); resolved at first use when nothing set it."""
        if self._device is None:
            from cudnn_graph import _driver
            self._device = _parse_device("cuda:0" if _driver.device_count() > 0 else "cpu")
        return (device_name(self._device[0], self._device[1]).split(":")[0], self._device[1])

    @property
    def device_code(self):
        """The graph's DLPack (device type, ordinal)."""
        self.device
        return self._device

    def set_device(self, device):
        self._mutable()
        self._device = _graph_device(device)
        self.device_explicit = True
        return self

    def _ensure_inferred(self):
        """Infer every output's dims, strides and data type when a change made them stale."""
        if not self._inferred:
            from cudnn_graph._inference import infer_graph
            infer_graph(self)

    # ---- serialization ------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The graph's structure (no buffers) as plain data."""
        def tensor_ref(t):
            return None if t is None else (<Tensor>t)._uid

        def encode(v):
            if isinstance(v, Tensor):
                return {"tensor": (<Tensor>v)._uid}
            if isinstance(v, (list, tuple)):
                return [encode(x) for x in v]
            if hasattr(v, "name") and hasattr(v, "value") and not isinstance(v, (int, float, str)):
                return {"enum": type(v).__name__, "name": v.name}
            if hasattr(v, "to_dict") and not isinstance(v, type):
                return {"subgraph": v.to_dict()}     # a recorded callback subgraph (sdpa's score_mod)
            if callable(v):
                # The structure it built is recorded beside it; the callable itself is named, not encoded.
                return {"callable": getattr(v, "__qualname__", type(v).__name__)}
            return v

        tensors = []
        for t in self._tensors:
            tensors.append({
                "uid": (<Tensor>t)._uid, "name": (<Tensor>t)._name,
                "dim": list((<Tensor>t)._dim) if (<Tensor>t)._dim is not None else None,
                "stride": list((<Tensor>t)._stride) if (<Tensor>t).stride_set_by_user else None,
                "dim_user": (<Tensor>t).dim_set_by_user,
                "data_type": DataType((<Tensor>t)._data_type).name,
                "data_type_inferred": DataType((<Tensor>t)._dtype_inferred).name,
                "is_virtual": (<Tensor>t)._virtual, "virtual_user": (<Tensor>t)._virtual_user,
                "is_pass_by_value": (<Tensor>t).is_pass_by_value,
                "value": (<Tensor>t).value if isinstance((<Tensor>t).value, (int, float)) else None,
                "uid_user": (<Tensor>t).uid_assigned_by_user,
                "ragged_offset": tensor_ref((<Tensor>t).ragged_offset),
                "producer": (<Node>(<Tensor>t).producer).index if (<Tensor>t).producer is not None else None,
            })
        nodes = []
        for n in self._nodes:
            nodes.append({
                "op": (<Node>n).op, "name": (<Node>n).name,
                "inputs": {k: encode(v) for k, v in (<Node>n)._inputs.items()},
                "params": {k: encode(v) for k, v in (<Node>n)._params.items()},
                "outputs": {k: (<Tensor>v)._uid for k, v in (<Node>n)._outputs.items()},
                "compute_data_type": DataType((<Node>n).compute_data_type).name,
            })
        ctx = self.context
        return {
            "format": "cudnn_graph/1",
            "context": {"io_data_type": ctx.io_data_type.name,
                        "intermediate_data_type": ctx.intermediate_data_type.name,
                        "compute_data_type": ctx.compute_data_type.name, "name": ctx.name},
            "device": list(self.device_code) if self._device is not None else None,
            "tensors": tensors, "nodes": nodes,
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def key(self) -> str:
        """A stable fingerprint of the structure (names excluded): equal graphs share plans.

        Taken on the inferred graph with its device resolved, so it does not change when a graph is
        validated, built or asked for its device (an invalid graph keys what it holds).
        """
        if not self._inferred:
            try:
                self._ensure_inferred()
            except Exception:
                pass
        self.device_code
        d = self.to_dict()
        d["context"].pop("name", None)
        for t in d["tensors"]:
            t.pop("name", None)
        for n in d["nodes"]:
            n.pop("name", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:32]
