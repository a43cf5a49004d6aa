"""Lowering a graph's IR to a cuDNN backend descriptor program: data first, then descriptors.

``lower_program(graph)`` needs neither cuDNN nor a GPU: it returns a ``Program``, the ordered list of
descriptors to create, each with its attributes by name::

    >>> program = lower_program(graph)                                        # doctest: +SKIP
    >>> [kind for kind, attrs in program][:2]                                 # doctest: +SKIP
    ['CUDNN_BACKEND_TENSOR_DESCRIPTOR', 'CUDNN_BACKEND_TENSOR_DESCRIPTOR']

Attribute values are plain data: ints and tuples of ints (uids, dims, strides), floats (clips, betas),
bools, ``DataType`` / ``pointwise_mode`` / ``reduction_mode`` members (IntEnums whose values are the
backend's), ``Ref(name)`` for a descriptor made earlier in the program and ``HANDLE`` for the cuDNN
handle. ``materialize(program, handle)`` then creates, sets and finalizes every descriptor in order;
``ATTRIBUTE_TYPES`` says which ``CUDNN_TYPE_*`` each attribute takes.

What is lowered: matmul (with its padding value), every pointwise mode with the attributes its
schema maps (``extra["attr_map"]``), and reduction with its mode. Geometry is normalised the way
the backend wants it: cuDNN's matmul engines take exactly rank-3 tensors ``[batch, rows, cols]``, so
a graph with a matmul has rank-2 tensors padded with a leading 1 and rank >= 4 tensors folded into
one batch axis (when their batch axes are one affine run); other graphs are padded to rank 3.
Pass-by-value scalars take the rank of the graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from ...data_type import DataType
from ...enums import pointwise_mode, reduction_mode
from ...errors import GraphNotSupportedError

__all__ = ["Ref", "HANDLE", "Step", "Program", "ATTRIBUTE_TYPES", "BYTE_ALIGNMENT", "MIN_RANK",
           "lower_program", "check_lowerable", "materialize", "LOWERED_OPS"]

BYTE_ALIGNMENT = 16   # every tensor descriptor promises 16-byte aligned data (checked at execute)
MIN_RANK = 3          # cuDNN's matmul takes [batch, rows, cols]; smaller graphs are padded to it

_FLOAT32_MAX = 3.4028234663852886e38
_DOUBLE_MAX = 1.7976931348623157e308

# Ops this lowering handles, by family or by name.
LOWERED_FAMILIES = frozenset({"pointwise"})
LOWERED_OPS = frozenset({"matmul", "reduction"})

# Which CUDNN_TYPE_* each attribute the lowering (and plan building) sets takes.
ATTRIBUTE_TYPES: dict[str, str] = {
    "CUDNN_ATTR_TENSOR_UNIQUE_ID": "CUDNN_TYPE_INT64",
    "CUDNN_ATTR_TENSOR_DATA_TYPE": "CUDNN_TYPE_DATA_TYPE",
    "CUDNN_ATTR_TENSOR_DIMENSIONS": "CUDNN_TYPE_INT64",
    "CUDNN_ATTR_TENSOR_STRIDES": "CUDNN_TYPE_INT64",
    "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT": "CUDNN_TYPE_INT64",
    "CUDNN_ATTR_TENSOR_IS_VIRTUAL": "CUDNN_TYPE_BOOLEAN",
    "CUDNN_ATTR_TENSOR_IS_BY_VALUE": "CUDNN_TYPE_BOOLEAN",
    "CUDNN_ATTR_MATMUL_COMP_TYPE": "CUDNN_TYPE_DATA_TYPE",
    "CUDNN_ATTR_MATMUL_PADDING_VALUE": "CUDNN_TYPE_DOUBLE",
    "CUDNN_ATTR_OPERATION_MATMUL_ADESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_MATMUL_BDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_MATMUL_CDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_MATMUL_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_POINTWISE_MODE": "CUDNN_TYPE_POINTWISE_MODE",
    "CUDNN_ATTR_POINTWISE_MATH_PREC": "CUDNN_TYPE_DATA_TYPE",
    "CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP": "CUDNN_TYPE_DOUBLE",
    "CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP": "CUDNN_TYPE_DOUBLE",
    "CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE": "CUDNN_TYPE_DOUBLE",
    "CUDNN_ATTR_POINTWISE_ELU_ALPHA": "CUDNN_TYPE_DOUBLE",
    "CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA": "CUDNN_TYPE_DOUBLE",
    "CUDNN_ATTR_POINTWISE_SWISH_BETA": "CUDNN_TYPE_DOUBLE",
    "CUDNN_ATTR_POINTWISE_AXIS": "CUDNN_TYPE_INT64",
    "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_POINTWISE_XDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_POINTWISE_BDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_POINTWISE_TDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_POINTWISE_YDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_POINTWISE_DXDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_POINTWISE_DYDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_REDUCTION_OPERATOR": "CUDNN_TYPE_REDUCTION_OPERATOR_TYPE",
    "CUDNN_ATTR_REDUCTION_COMP_TYPE": "CUDNN_TYPE_DATA_TYPE",
    "CUDNN_ATTR_OPERATION_REDUCTION_XDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_REDUCTION_YDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_REDUCTION_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATIONGRAPH_OPS": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATIONGRAPH_HANDLE": "CUDNN_TYPE_HANDLE",
    # heuristics, engines, configs, plans
    "CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_ENGINEHEUR_MODE": "CUDNN_TYPE_HEUR_MODE",
    "CUDNN_ATTR_ENGINE_OPERATION_GRAPH": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_ENGINE_GLOBAL_INDEX": "CUDNN_TYPE_INT64",
    "CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE": "CUDNN_TYPE_KNOB_TYPE",
    "CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE": "CUDNN_TYPE_INT64",
    "CUDNN_ATTR_ENGINECFG_ENGINE": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_ENGINECFG_KNOB_CHOICES": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_EXECUTION_PLAN_HANDLE": "CUDNN_TYPE_HANDLE",
    "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
}


@dataclass(frozen=True)
class Ref:
    """A descriptor made by an earlier step of the program, by its step name."""
    name: str

    def __repr__(self) -> str:
        return f"@{self.name}"


class _HandleToken:
    def __repr__(self) -> str:
        return "HANDLE"


HANDLE: Any = _HandleToken()   # stands for the cuDNN handle the program is materialized with


@dataclass
class Step:
    """One descriptor: its step name, its ``CUDNN_BACKEND_*_DESCRIPTOR`` kind and its attributes.

    A step unpacks as ``(kind, attrs)``.
    """
    name: str
    kind: str
    attrs: dict

    def __iter__(self) -> Iterator:
        yield self.kind
        yield self.attrs


@dataclass
class Program:
    """The lowered graph: steps in creation order, the last one the operation graph."""
    steps: list
    tensor_steps: dict          # uid -> step name of its tensor descriptor
    geometry: dict              # uid -> (dims, strides) as pushed to cuDNN
    operations: list            # step names of the operation descriptors, in graph order
    constants: list             # (uid, DataType, value) of pass-by-value scalars the graph fixed
    op_graph: str = "operation_graph"
    notes: list = field(default_factory=list)   # what the lowering changed (padding, folding)

    def __iter__(self) -> Iterator:
        return iter([(s.kind, s.attrs) for s in self.steps])

    def __len__(self) -> int:
        return len(self.steps)

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def of_kind(self, kind: str) -> list:
        """The attribute dicts of every step of ``kind`` (a full name or its distinctive middle)."""
        return [s.attrs for s in self.steps if s.kind == kind or s.kind == f"CUDNN_BACKEND_{kind}_DESCRIPTOR"]


# ---- support ----------------------------------------------------------------------------------------

def _lowered(node) -> bool:
    return node.schema.family in LOWERED_FAMILIES or node.op in LOWERED_OPS


def check_lowerable(graph) -> None:
    """Raise GraphNotSupportedError (saying why) unless every node can be lowered; needs no cuDNN."""
    python_only = sorted({n.op for n in graph.nodes if n.schema.python_only})
    if python_only:
        raise GraphNotSupportedError(f"the cuDNN backend runs no python-only op ({', '.join(python_only)})")
    missing = sorted({n.op for n in graph.nodes if not _lowered(n)})
    if missing:
        raise GraphNotSupportedError(
            f"the cuDNN backend lowering does not cover {', '.join(missing)} yet "
            "(it lowers matmul, pointwise and reduction)")
    if not graph.nodes:
        raise GraphNotSupportedError("the graph has no operations")
    for t in graph.tensors:
        if t.ragged_offset is not None:
            raise GraphNotSupportedError(f"tensor '{t.name}' has a ragged offset; the lowering does not "
                                         "cover ragged tensors yet")
        if t.reordering_type:
            raise GraphNotSupportedError(f"tensor '{t.name}' asks for a reordering; the lowering does not "
                                         "cover reordered tensors yet")


# ---- geometry ---------------------------------------------------------------------------------------

def _span(dims, strides) -> int:
    """The stride an extra leading unit axis takes: one past the farthest element."""
    return max([d * s for d, s in zip(dims, strides)] + [1])


def _pad(dims, strides, rank):
    extra = rank - len(dims)
    if extra <= 0:
        return tuple(dims), tuple(strides)
    lead = _span(dims, strides)
    return (1,) * extra + tuple(dims), (lead,) * extra + tuple(strides)


def _fold_leading(name, dims, strides, batch_shape, why):
    """Fold every axis but the last ``len(dims) - len(batch_shape)`` into one leading axis.

    A tensor's leading axes must be all 1 (it broadcasts over them) or all full and one affine run
    of memory; anything else raises GraphNotSupportedError saying ``why`` the fold was needed.
    """
    k = len(batch_shape)
    bd, bs = dims[:k], strides[:k]
    inner_dims, inner_strides = tuple(dims[k:]), tuple(strides[k:])
    if all(d == 1 for d in bd):
        return (1,) + inner_dims, (_span(inner_dims, inner_strides),) + inner_strides
    if tuple(bd) != tuple(batch_shape):
        raise GraphNotSupportedError(
            f"tensor '{name}': axes {tuple(bd)} broadcast partially against {tuple(batch_shape)}; {why}, "
            "so those axes must be all 1 or all full")
    live = [(d, s) for d, s in zip(bd, bs) if d != 1]
    for (d0, s0), (d1, s1) in zip(live, live[1:]):
        if s0 != s1 * d1:
            raise GraphNotSupportedError(
                f"tensor '{name}': axes {tuple(bd)} with strides {tuple(bs)} are not one affine run; {why}")
    return (math.prod(bd),) + inner_dims, (live[-1][1],) + inner_strides


_MATMUL_FOLD = "cuDNN's matmul takes one batch axis"
# Measured on the H200 with cuDNN 9.19 (engine 1, the pointwise-only runtime fusion): an operand that
# broadcasts along the first axis of a rank-3 graph is read as if it did not, so every element past
# the first batch is wrong; the same graph with that axis folded into the next one is right.
_POINTWISE_FOLD = ("cuDNN 9.19's pointwise-only engine miscomputes an operand broadcast along the "
                   "first axis, so the leading axes are folded into one")


def _geometry(graph, used) -> tuple[dict, list]:
    """uid -> (dims, strides) as cuDNN gets them, and notes on what changed."""
    notes = []
    raw = {}
    for t in used:
        dims, strides = tuple(t.dim), tuple(t.stride)
        if len(strides) != len(dims):
            raise GraphNotSupportedError(f"tensor '{t.name}' has {len(strides)} strides for dims {dims}")
        raw[t.uid] = (t, dims, strides)
    shaped = [(t, d, s) for t, d, s in raw.values() if not t.is_pass_by_value]
    ranks = sorted({len(d) for _, d, _ in shaped})
    has_matmul = any(n.op == "matmul" for n in graph.nodes)
    if has_matmul and len(ranks) > 1:
        raise GraphNotSupportedError(f"a matmul graph needs one rank for all tensors; found ranks {ranks}")
    rank = max(ranks) if ranks else MIN_RANK
    target = max(rank, MIN_RANK)
    batch_shape, why, pad_after_fold = None, "", 0
    pointwise_only = all(n.schema.family == "pointwise" for n in graph.nodes)
    if has_matmul and rank > 3:
        target = 3
        batch_shape = tuple(max(d[i] for _, d, _ in shaped) for i in range(rank - 2))
        why = _MATMUL_FOLD
        notes.append(f"batch axes {batch_shape} folded into one (cuDNN's matmul takes rank-3 tensors)")
    elif pointwise_only and rank >= 3 and len(ranks) == 1 and _broadcasts_first_axis(shaped):
        if any("CUDNN_ATTR_POINTWISE_AXIS" in n.schema.extra.get("attr_map", {}).values() for n in graph.nodes):
            raise GraphNotSupportedError(_POINTWISE_FOLD + "; a gen_index axis does not survive that fold")
        batch_shape = tuple(max(d[i] for _, d, _ in shaped) for i in range(rank - 1))
        why, target, pad_after_fold = _POINTWISE_FOLD, MIN_RANK, 1
        notes.append(f"leading axes {batch_shape} folded into one: {_POINTWISE_FOLD}")
    elif rank < target:
        notes.append(f"rank {rank} padded to {target} with leading unit axes")
    geometry = {}
    for uid, (t, dims, strides) in raw.items():
        if t.is_pass_by_value:
            if any(d != 1 for d in dims):
                raise GraphNotSupportedError(f"pass-by-value tensor '{t.name}' has dims {dims}; it must be a scalar")
            geometry[uid] = ((1,) * target, (1,) * target)
        elif batch_shape is not None:
            folded = _fold_leading(t.name, dims, strides, batch_shape, why)
            geometry[uid] = _pad(*folded, len(folded[0]) + pad_after_fold)
        else:
            geometry[uid] = _pad(dims, strides, target)
    return geometry, notes


def _broadcasts_first_axis(shaped) -> bool:
    extents = [d[0] for _, d, _ in shaped]
    return max(extents) > 1 and min(extents) == 1


# ---- the program ------------------------------------------------------------------------------------

def _compute_type(graph, node) -> DataType:
    if node.compute_data_type != -1:
        return DataType(node.compute_data_type)
    ctx = graph.context.compute_data_type
    return DataType.FLOAT if ctx == DataType.NOT_SET else DataType(ctx)


def _tensors_of(node):
    for value in list(node.inputs.values()) + list(node.outputs.values()):
        for t in (value if isinstance(value, tuple) else (value,)):
            if t is not None:
                yield t


def _lower_matmul(graph, node, i, ref, axis_shift):
    desc = {"CUDNN_ATTR_MATMUL_COMP_TYPE": _compute_type(graph, node)}
    padding = float(node.params.get("padding") or 0.0)
    if padding != 0.0:
        desc["CUDNN_ATTR_MATMUL_PADDING_VALUE"] = padding
    yield Step(f"matmul_{i}", "CUDNN_BACKEND_MATMUL_DESCRIPTOR", desc)
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR", {
        "CUDNN_ATTR_OPERATION_MATMUL_ADESC": ref(node.inputs["A"]),
        "CUDNN_ATTR_OPERATION_MATMUL_BDESC": ref(node.inputs["B"]),
        "CUDNN_ATTR_OPERATION_MATMUL_CDESC": ref(node.outputs["C"]),
        "CUDNN_ATTR_OPERATION_MATMUL_DESC": Ref(f"matmul_{i}"),
    })


def _lower_pointwise(graph, node, i, ref, axis_shift):
    extra = node.schema.extra
    mode_name = extra["mode"][len("CUDNN_POINTWISE_"):]
    mode = pointwise_mode[mode_name]
    compute = _compute_type(graph, node)
    desc = {"CUDNN_ATTR_POINTWISE_MODE": mode, "CUDNN_ATTR_POINTWISE_MATH_PREC": compute}
    if mode in (pointwise_mode.RELU_FWD, pointwise_mode.RELU_BWD):
        # cuDNN's clip defaults, spelled out as cudnn-frontend does (the upper clip within FLOAT's range).
        desc["CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP"] = 0.0
        desc["CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP"] = _FLOAT32_MAX if compute == DataType.FLOAT else _DOUBLE_MAX
        desc["CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE"] = 0.0
    for attr, backend_attr in extra.get("attr_map", {}).items():
        value = node.params.get(attr)
        if value is None:
            continue
        if backend_attr == "CUDNN_ATTR_POINTWISE_AXIS":
            axis, rank = int(value), len(node.outputs["Y"].dim)
            if axis_shift < 0 and axis < rank - 2:
                raise GraphNotSupportedError(
                    f"node '{node.name}' ({node.op}): axis {axis} is a batch axis that folding merges away "
                    "(a matmul graph of rank > 3 has its batch axes folded into one)")
            # Padding prepends axes (shift > 0); folding merges the batch axes (shift < 0).
            desc[backend_attr] = axis + axis_shift
        elif backend_attr == "CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP" and compute == DataType.FLOAT:
            desc[backend_attr] = min(float(value), _FLOAT32_MAX)
        else:
            desc[backend_attr] = float(value)
    yield Step(f"pointwise_{i}", "CUDNN_BACKEND_POINTWISE_DESCRIPTOR", desc)
    op = {"CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR": Ref(f"pointwise_{i}")}
    for port, backend_attr in extra["operands"].items():
        op[backend_attr] = ref(node.inputs[port])
    out = "CUDNN_ATTR_OPERATION_POINTWISE_DXDESC" if extra.get("kind") == "backward" \
        else "CUDNN_ATTR_OPERATION_POINTWISE_YDESC"
    op[out] = ref(node.outputs["Y"])
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR", op)


def _lower_reduction(graph, node, i, ref, axis_shift):
    mode = node.params["mode"]
    yield Step(f"reduction_{i}", "CUDNN_BACKEND_REDUCTION_DESCRIPTOR", {
        "CUDNN_ATTR_REDUCTION_OPERATOR": reduction_mode[getattr(mode, "name", str(mode))],
        "CUDNN_ATTR_REDUCTION_COMP_TYPE": _compute_type(graph, node),
    })
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR", {
        "CUDNN_ATTR_OPERATION_REDUCTION_XDESC": ref(node.inputs["input"]),
        "CUDNN_ATTR_OPERATION_REDUCTION_YDESC": ref(node.outputs["Y"]),
        "CUDNN_ATTR_OPERATION_REDUCTION_DESC": Ref(f"reduction_{i}"),
    })


def lower_program(graph) -> Program:
    """The descriptor program for ``graph`` (validated first when needed). Needs no cuDNN.

    Raises GraphNotSupportedError, saying why, for what the lowering does not cover.
    """
    check_lowerable(graph)
    if hasattr(graph, "_ensure_inferred"):
        graph._ensure_inferred()
    used = {}
    for node in graph.nodes:
        for t in _tensors_of(node):
            used.setdefault(t.uid, t)
    ordered = [t for t in graph.tensors if t.uid in used]
    geometry, notes = _geometry(graph, ordered)

    steps, tensor_steps, constants = [], {}, []
    for t in ordered:
        dims, strides = geometry[t.uid]
        dtype = graph._resolved_type(t)
        if dtype == DataType.NOT_SET:
            raise GraphNotSupportedError(f"tensor '{t.name}' has no data type")
        attrs = {
            "CUDNN_ATTR_TENSOR_UNIQUE_ID": int(t.uid),
            "CUDNN_ATTR_TENSOR_DATA_TYPE": DataType(dtype),
            "CUDNN_ATTR_TENSOR_DIMENSIONS": tuple(int(d) for d in dims),
            "CUDNN_ATTR_TENSOR_STRIDES": tuple(int(s) for s in strides),
            "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT": BYTE_ALIGNMENT,
            "CUDNN_ATTR_TENSOR_IS_VIRTUAL": bool(t.is_virtual),
        }
        if t.is_pass_by_value:
            attrs["CUDNN_ATTR_TENSOR_IS_BY_VALUE"] = True
            if t.value is not None:
                constants.append((int(t.uid), DataType(dtype), t.value))
        name = f"tensor_{t.uid}"
        tensor_steps[t.uid] = name
        steps.append(Step(name, "CUDNN_BACKEND_TENSOR_DESCRIPTOR", attrs))

    def ref(t):
        return Ref(tensor_steps[t.uid])

    # GEN_INDEX's axis moves with the axes the padding prepends; folding would merge it away.
    shaped = [t for t in ordered if not t.is_pass_by_value]
    axis_shift = len(geometry[shaped[0].uid][0]) - len(shaped[0].dim) if shaped else 0
    lowerers = {"matmul": _lower_matmul, "reduction": _lower_reduction}
    operations = []
    for i, node in enumerate(graph.nodes):
        steps.extend(lowerers.get(node.op, _lower_pointwise)(graph, node, i, ref, axis_shift))
        operations.append(f"op_{i}")
    steps.append(Step("operation_graph", "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR", {
        "CUDNN_ATTR_OPERATIONGRAPH_OPS": tuple(Ref(name) for name in operations),
        "CUDNN_ATTR_OPERATIONGRAPH_HANDLE": HANDLE,
    }))
    return Program(steps, tensor_steps, geometry, operations, constants, notes=notes)


# ---- materializing ------------------------------------------------------------------------------------

def _resolve_value(value, made, handle):
    if isinstance(value, Ref):
        return made[value.name]
    if value is HANDLE:
        return handle
    if isinstance(value, (list, tuple)):
        return [_resolve_value(v, made, handle) for v in value]
    return value


def materialize(program: Program, handle, *, descriptor_factory=None) -> dict:
    """Create, set and finalize every descriptor of ``program``; returns ``{step name: Descriptor}``.

    ``handle`` is what ``HANDLE`` stands for (a _backend.Handle). Raises the typed CudnnStatusError
    of the first call cuDNN refuses (its message names the attribute and the descriptor).
    """
    if descriptor_factory is None:
        from ..._backend import Descriptor as descriptor_factory
    made = {}
    for step in program.steps:
        descriptor = descriptor_factory(step.kind)
        for attr, value in step.attrs.items():
            attr_type = ATTRIBUTE_TYPES[attr]
            descriptor.set(attr, attr_type, _resolve_value(value, made, handle))
        descriptor.finalize()
        made[step.name] = descriptor
    return made
