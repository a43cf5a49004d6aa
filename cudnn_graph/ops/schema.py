"""Declarative op schemas: the one description of every op that the IR, the validators and the engines read.

An ``OpSchema`` names an op's ports exactly as ``cudnn.pygraph``'s keyword arguments, its attributes with
their defaults, its outputs (some conditional) and an ``infer`` function that checks the inputs and
computes each output's dims and data type. The graph builder methods are generated from these tables;
no op has a hand-written method.

Contract for ``infer(ctx)``:
  * ``ctx.inputs``: ``{port: TensorInfo | None}`` for every declared input port (None when not given);
  * ``ctx.attrs``: ``{attr: value}`` after ``Attr.convert`` and defaults;
  * ``ctx.compute_data_type`` / ``ctx.intermediate_data_type`` / ``ctx.io_data_type``: ``DataType``;
  * returns ``{output port: OutputInfo(dim, data_type)}`` for every output that exists for these attrs;
    ``data_type=None`` means "the graph's intermediate data type" (virtual tensors) and ``dim=None`` means
    the caller must set it;
  * raises through ``ctx.fail(port, message)`` (a ``GraphValidationError`` naming node and port) or
    ``ctx.unsupported(message)`` (``GraphNotSupportedError``).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from .. import enums
from ..data_type import DataType
from ..errors import GraphNotSupportedError, GraphValidationError

__all__ = ["REQUIRED", "Port", "Attr", "Output", "TensorInfo", "OutputInfo", "InferContext", "OpSchema",
           "register", "SCHEMAS", "enum_converter", "int_list"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Port:
    """An input port. ``name`` is the keyword of the cudnn.pygraph builder method."""
    name: str
    optional: bool = False
    doc: str = ""


@dataclass(frozen=True)
class Attr:
    """A non-tensor parameter; ``convert`` normalises what the user passed (and may raise)."""
    name: str
    default: Any = REQUIRED
    convert: Optional[Callable[[Any], Any]] = None
    doc: str = ""


@dataclass(frozen=True)
class Output:
    """An output port; ``when(attrs, given_inputs)`` decides whether it exists for a node."""
    name: str
    when: Optional[Callable[[Mapping[str, Any], frozenset], bool]] = None


@dataclass(frozen=True)
class TensorInfo:
    """What inference sees of an input tensor."""
    dim: tuple
    stride: tuple
    data_type: DataType
    is_virtual: bool = False
    is_pass_by_value: bool = False
    name: str = ""


@dataclass(frozen=True)
class OutputInfo:
    dim: Optional[tuple]
    data_type: Optional[DataType] = None
    stride: Optional[tuple] = None   # provisional unless the user sets one


@dataclass
class InferContext:
    node: str
    op: str
    inputs: Mapping[str, Optional[TensorInfo]]
    attrs: Mapping[str, Any]
    compute_data_type: DataType = DataType.NOT_SET
    intermediate_data_type: DataType = DataType.NOT_SET
    io_data_type: DataType = DataType.NOT_SET

    def fail(self, port: str, message: str) -> "NoReturn":  # noqa: F821
        raise GraphValidationError(self.node, self.op, port, message)

    def unsupported(self, message: str) -> "NoReturn":  # noqa: F821
        raise GraphNotSupportedError(f"node '{self.node}' ({self.op}): {message}")

    def need(self, port: str) -> TensorInfo:
        t = self.inputs.get(port)
        if t is None:
            self.fail(port, "is required but was not given")
        return t


@dataclass(frozen=True)
class OpSchema:
    """One op: its ports, attributes and outputs, how inference checks them, and what the builder
    and the engines need beyond that (each such fact a typed field below, none a free-form bag)."""

    name: str                                  # builder method name, as in cudnn.pygraph
    family: str                                # pointwise | matmul | reduction | conv | norm | layout | quant | sdpa | linear_attention | ...
    inputs: Sequence[Port]
    outputs: Sequence[Output]
    infer: Callable[[InferContext], Mapping[str, OutputInfo]]
    attrs: Sequence[Attr] = ()
    positional: Sequence[str] = ()             # order of positional arguments the builder accepts
    returns: str = "single"                    # "single": one Tensor; "list": a list in outputs order (absent ones as None)
    python_only: bool = False                  # only python engines run it (no cuDNN lowering)
    doc: str = ""

    # -- how the graph builder binds a call ------------------------------------------------------------
    pygraph_positional: Sequence[str] = ()
    """pygraph's full positional order, its generic ``compute_data_type`` and ``name`` included where
    pygraph puts them; empty means ``positional`` (then the ports)."""
    generic_positional: Sequence[str] = ()
    """Which of ``pygraph_positional`` are the generic keywords every builder takes (not ports or attrs)."""
    aliases: Sequence[str] = ()
    """Further builder method names for the same op (pygraph's older spellings)."""
    keyword_expanders: Mapping[str, Callable[..., Mapping[str, Any]]] = field(default_factory=dict)
    """Keyword -> function turning its value into ports / attrs (e.g. sdpa's ``dropout`` tuple)."""
    declined_keywords: Mapping[str, str] = field(default_factory=dict)
    """Keyword -> why cuDNN cannot do it: the builder raises GraphNotSupportedError saying so."""
    list_ports: Sequence[str] = ()
    """Ports that take a list of tensors (concatenate's ``inputs``)."""
    scalar_ports: Mapping[str, DataType] = field(default_factory=dict)
    """Port -> data type of the pass-by-value constant a Python number given for it becomes."""
    tensor_list_attrs: Sequence[str] = ()
    """Attributes whose values are graph tensors (batchnorm's ``peer_stats``): they count as consumed."""
    output_keywords: Sequence[str] = ()
    """Outputs the caller may hand in as a keyword (a tensor it made) for the op to write."""
    returned_outputs: Optional[Sequence[str]] = None
    """What the builder returns as a list when it is not every output (pygraph's ``[O, Stats]``)."""
    validate_outputs: Optional[Callable[[InferContext, Mapping[str, tuple]], None]] = None
    """``check(ctx, {output: dims})`` for outputs whose dims the caller sets (inference gives None)."""

    # -- what the engines read ----------------------------------------------------------------------------
    min_cudnn: int = 0
    """The oldest cuDNN (cudnnGetVersion() encoding) that has this op: the one version gate."""
    backend: str = ""
    """The cuDNN backend operation descriptor the op lowers to, where it is one."""
    pointwise_mode: Optional[enums.pointwise_mode] = None
    """Pointwise ops: the mode of their CUDNN_BACKEND_POINTWISE_DESCRIPTOR."""
    pointwise_kind: str = ""
    """Pointwise ops: the table row's kind (unary, binary, backward, compare, logical, ternary, ...)."""
    operands: Mapping[str, str] = field(default_factory=dict)
    """Pointwise ops: port -> the CUDNN_ATTR_OPERATION_POINTWISE_* descriptor attribute it sets."""
    attr_map: Mapping[str, str] = field(default_factory=dict)
    """Pointwise ops: attribute -> the CUDNN_ATTR_POINTWISE_* attribute it sets."""
    in_pygraph: bool = True
    """False for the package's extensions (methods cudnn.pygraph has no counterpart of)."""
    prepare_call: Optional[Callable[[Any, "OpSchema", dict], dict]] = None
    """``prepare(graph, schema, keywords) -> keywords`` run by the builder before binding (every positional
    argument given as its keyword): sdpa's runs ``score_mod`` callbacks and records their subgraphs."""

    def port_names(self) -> tuple:
        return tuple(p.name for p in self.inputs)

    def output_names(self) -> tuple:
        return tuple(o.name for o in self.outputs)


def enum_converter(enum_cls: type, keyword: str, prefix: str = "", expected: str = "") -> Callable[[Any], Any]:
    """An Attr.convert for an enum, matched by NAME: a member of ``enum_cls`` passes as it is;
    cudnn.pygraph's enum (another binding's numbering never matters) or a string in any case, with or
    without the cuDNN ``prefix``, is looked up by name. Members with a negative value (``NOT_SET``)
    mean "no value" and are refused."""
    usable = {name: member for name, member in enum_cls.__members__.items() if member.value >= 0}

    def convert(value: Any):
        if isinstance(value, enum_cls) and value.value >= 0:
            return value
        name = value if isinstance(value, str) else getattr(value, "name", None)
        if isinstance(name, str):
            key = name.strip().upper().rsplit(".", 1)[-1]
            if prefix and key.startswith(prefix):
                key = key[len(prefix):]
            if key in usable:
                return usable[key]
        choices = expected or "one of " + ", ".join(usable)
        raise ValueError(f"{keyword} must be {choices}; got {value!r}")
    return convert


def int_list(value: Any) -> tuple:
    """An Attr.convert for a list of integers (ints or NumPy integers; no bools, no bare int)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"a list of integers was expected; got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool):
            raise TypeError(f"a list of integers was expected; got {value!r}")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise TypeError(f"a list of integers was expected; got {value!r}") from None
    return tuple(out)


SCHEMAS: dict[str, OpSchema] = {}


def register(*schemas: OpSchema) -> None:
    for s in schemas:
        if s.name in SCHEMAS:
            raise RuntimeError(f"op {s.name!r} is declared twice")
        SCHEMAS[s.name] = s
