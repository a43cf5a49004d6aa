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
schema maps (``OpSchema.attr_map``), and reduction with its mode. Geometry is normalised the way
the backend wants it: cuDNN's matmul engines take exactly rank-3 tensors ``[batch, rows, cols]``, so
a graph with a matmul has rank-2 tensors padded with a leading 1 and rank >= 4 tensors folded into
one batch axis (when their batch axes are one affine run); other graphs are padded to rank 3.
Pass-by-value scalars take the rank of the graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from ...data_type import DataType, itemsize_bits
from ..._layout import ALIGNMENT_BYTES, row_major_strides as _row_major
from ...enums import pointwise_mode, reduction_mode
from ...errors import GraphNotSupportedError
from ...ops import SCHEMAS
from ...view import GraphView

__all__ = ["Ref", "HANDLE", "Step", "Program", "Lowering", "Lowerer", "LOWERERS", "lowers", "ATTRIBUTE_TYPES",
           "BYTE_ALIGNMENT", "MIN_RANK", "lower_program", "check_lowerable", "materialize", "dynamic_shape_wanted"]

BYTE_ALIGNMENT = ALIGNMENT_BYTES   # every tensor descriptor promises it (checked at execute)
MIN_RANK = 3          # cuDNN's matmul takes [batch, rows, cols]; smaller graphs are padded to it
OVERRIDE_SHAPE_VERSION = 92100   # CUDNN_ATTR_OPERATIONGRAPH_IS_OVERRIDE_SHAPE_ENABLED
DYNAMIC_SHAPE_VERSION = 90400    # CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED (kernels for a shape class)

_FLOAT32_MAX = 3.4028234663852886e38
_DOUBLE_MAX = 1.7976931348623157e308


@dataclass(frozen=True)
class Lowerer:
    """How one IR op becomes descriptors.

    ``fn(lw, node, i)`` yields the op's Steps (``lw`` is the ``Lowering`` under way, ``i`` the node's
    index); every ``CUDNN_BACKEND_OPERATION_*`` step it yields joins the operation graph in order.
    ``native_geometry`` ops (convolutions, norms, layout ops, attention) keep their tensors' own
    ranks (padded to ``MIN_RANK``); graphs of matmul / pointwise / reduction alone are normalised the
    way cuDNN's matmul and pointwise engines want (see ``_geometry``). ``min_version`` is the op
    schema's ``min_cudnn`` (the one place an op's version is declared): ``check_lowerable`` declines
    the op, naming the version needed, on an older libcudnn.
    """
    fn: Callable
    native_geometry: bool = False
    op: str = ""

    @property
    def min_version(self) -> int:
        schema = SCHEMAS.get(self.op)
        return schema.min_cudnn if schema is not None else 0


LOWERERS: dict[str, Lowerer] = {}


def lowers(*ops: str, native_geometry: bool = False, attributes: Optional[dict] = None):
    """Register the decorated generator as the lowering of ``ops``; ``attributes`` adds to
    ``ATTRIBUTE_TYPES`` the ``{attribute name: CUDNN_TYPE_*}`` the lowering sets."""
    def register(fn):
        for op in ops:
            LOWERERS[op] = Lowerer(fn, native_geometry, op)
        if attributes:
            ATTRIBUTE_TYPES.update(attributes)
        return fn
    return register

# Which CUDNN_TYPE_* each attribute the lowering (and plan building) sets takes.
ATTRIBUTE_TYPES: dict[str, str] = {
    "CUDNN_ATTR_TENSOR_UNIQUE_ID": "CUDNN_TYPE_INT64",
    "CUDNN_ATTR_TENSOR_DATA_TYPE": "CUDNN_TYPE_DATA_TYPE",
    "CUDNN_ATTR_TENSOR_DIMENSIONS": "CUDNN_TYPE_INT64",
    "CUDNN_ATTR_TENSOR_STRIDES": "CUDNN_TYPE_INT64",
    "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT": "CUDNN_TYPE_INT64",
    "CUDNN_ATTR_TENSOR_IS_VIRTUAL": "CUDNN_TYPE_BOOLEAN",
    "CUDNN_ATTR_TENSOR_IS_BY_VALUE": "CUDNN_TYPE_BOOLEAN",
    "CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
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
    "CUDNN_ATTR_OPERATIONGRAPH_IS_OVERRIDE_SHAPE_ENABLED": "CUDNN_TYPE_BOOLEAN",
    "CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED": "CUDNN_TYPE_BOOLEAN",
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
    # (view uid, source uid, byte offset): the view is fed the source's pointer plus the offset at
    # execute (a slice of a graph input, where the backend has no slice operation).
    aliases: list = field(default_factory=list)
    # (uid, DataType, value): by-value scalars the lowering made; the plan always supplies them.
    plan_constants: list = field(default_factory=list)
    # engine id -> why it must not run this graph (a wrong answer measured on some cuDNN version)
    barred_engines: dict = field(default_factory=dict)
    # uids the caller passes that no operation reads (a view replaced them): kept out of cuDNN's
    # variant pack, which must name exactly the operation graph's tensors.
    unused_uids: list = field(default_factory=list)
    # (uid, nbytes, fill): device tensors the plan owns, carved from the workspace; fill None (cuDNN
    # writes them first), 0 (zeroed before each execute) or a tuple of values (written once).
    scratch: list = field(default_factory=list)

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

def _lowerer(node) -> Optional[Lowerer]:
    if node.schema.family == "pointwise":
        return LOWERERS.get(node.op) or LOWERERS["pointwise"]
    return LOWERERS.get(node.op)


def check_lowerable(graph, version: Optional[int] = None) -> None:
    """Raise GraphNotSupportedError (saying why) unless every node can be lowered; needs no cuDNN.

    With ``version`` (the loaded libcudnn's), ops newer than it (their schema's ``min_cudnn``) are
    declined naming the version needed, after every check that needs no version.
    """
    python_only = sorted({n.op for n in graph.nodes if n.schema.python_only})
    if python_only:
        raise GraphNotSupportedError(f"the cuDNN backend runs no python-only op ({', '.join(python_only)})")
    missing = sorted({n.op for n in graph.nodes if _lowerer(n) is None})
    if missing:
        covered = ", ".join(sorted(op for op in LOWERERS if op != "pointwise"))
        raise GraphNotSupportedError(
            f"the cuDNN backend lowering does not cover {', '.join(missing)} yet "
            f"(it lowers pointwise ops and {covered})")
    if not graph.nodes:
        raise GraphNotSupportedError("the graph has no operations")
    for t in graph.tensors:
        if t.reordering_type:
            raise GraphNotSupportedError(f"tensor '{t.name}' asks for a reordering; the lowering does not "
                                         "cover reordered tensors yet")
    if version is not None:
        from ..._cudnn_errors import CudnnVersionError
        for node in graph.nodes:
            needed = node.schema.min_cudnn
            if needed > version:
                raise CudnnVersionError(f"node '{node.name}' ({node.op}) on the cuDNN backend", needed, version)


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
# Where the fold cannot be made, measured on the H200 (cuDNN 9.19; test_cudnn_backend.py,
# test_gpu_partial_broadcast_over_the_first_axis): an operand broadcast along the first axis ONLY (RoPE's
# (1, T, d) tables against (B, T, d), cudnn-frontend's test_apply_rope) is computed right, so the graph
# keeps its axes; one broadcast along the first axis and another ((1, 8, 1) against (2, 8, 64)) is read
# wrong, so that engine is kept out of the graph's plans.
_POINTWISE_ONLY_ENGINE = 1
_POINTWISE_BAR = ("cuDNN 9.19's pointwise-only engine miscomputes an operand broadcast along the first "
                  "axis and another, and this graph's leading axes cannot be folded into one")


def _geometry(graph, used) -> tuple[dict, list, dict]:
    """uid -> (dims, strides) as cuDNN gets them, notes on what changed, and {engine id: why} of the
    engines that must not run the graph in that geometry."""
    notes = []
    barred = {}
    raw = {}
    for t in used:
        dims, strides = tuple(t.dim), tuple(t.stride)
        if len(strides) != len(dims):
            raise GraphNotSupportedError(f"tensor '{t.name}' has {len(strides)} strides for dims {dims}")
        raw[t.uid] = (t, dims, strides)
    shaped = [(t, d, s) for t, d, s in raw.values() if not t.is_pass_by_value]
    ranks = sorted({len(d) for _, d, _ in shaped})
    has_matmul = any(n.op == "matmul" for n in graph.nodes)
    if any(_lowerer(n).native_geometry for n in graph.nodes):
        return _native_geometry(raw, ranks, has_matmul), notes, barred
    if has_matmul and len(ranks) > 1:
        raise GraphNotSupportedError(f"a matmul graph needs one rank for all tensors; found ranks {ranks}")
    rank = max(ranks) if ranks else MIN_RANK
    target = max(rank, MIN_RANK)
    batch_shape, why, pad_after_fold, folded = None, "", 0, None
    pointwise_only = all(n.schema.family == "pointwise" for n in graph.nodes)
    if has_matmul and rank > 3:
        target = 3
        batch_shape = tuple(max(d[i] for _, d, _ in shaped) for i in range(rank - 2))
        why = _MATMUL_FOLD
        notes.append(f"batch axes {batch_shape} folded into one (cuDNN's matmul takes rank-3 tensors)")
    elif pointwise_only and rank >= 3 and len(ranks) == 1 and _broadcasts_first_axis(shaped):
        if any("CUDNN_ATTR_POINTWISE_AXIS" in n.schema.attr_map.values() for n in graph.nodes):
            raise GraphNotSupportedError(_POINTWISE_FOLD + "; a gen_index axis does not survive that fold")
        full = tuple(max(d[i] for _, d, _ in shaped) for i in range(rank))
        batch_shape = full[:-1]
        try:
            folded = {t.uid: _fold_leading(t.name, dims, strides, batch_shape, _POINTWISE_FOLD)
                      for t, dims, strides in shaped}
        except GraphNotSupportedError as exc:
            batch_shape = None
            if all(d[1:] == full[1:] for _, d, _ in shaped):
                notes.append(f"leading axes kept: operands broadcast along the first axis only ({exc})")
            else:
                barred[_POINTWISE_ONLY_ENGINE] = _POINTWISE_BAR
                notes.append(f"engine {_POINTWISE_ONLY_ENGINE} kept out ({exc})")
        else:
            why, target, pad_after_fold = _POINTWISE_FOLD, MIN_RANK, 1
            notes.append(f"leading axes {batch_shape} folded into one: {_POINTWISE_FOLD}")
    elif rank < target:
        notes.append(f"rank {rank} padded to {target} with leading unit axes")
    geometry = {}
    for uid, (t, dims, strides) in raw.items():
        if t.is_pass_by_value:
            geometry[uid] = _scalar_geometry(t, dims, target)
        elif batch_shape is not None:
            # the pointwise fold was made above; the matmul fold is made here
            f_dims, f_strides = folded[uid] if folded else _fold_leading(t.name, dims, strides, batch_shape, why)
            geometry[uid] = _pad(f_dims, f_strides, len(f_dims) + pad_after_fold)
        else:
            geometry[uid] = _pad(dims, strides, target)
    return geometry, notes, barred


def _scalar_geometry(t, dims, rank: int) -> tuple:
    """A pass-by-value scalar's (dims, strides) at ``rank``: all ones (a non-scalar one is refused)."""
    if any(d != 1 for d in dims):
        raise GraphNotSupportedError(f"pass-by-value tensor '{t.name}' has dims {dims}; it must be a scalar")
    return (1,) * rank, (1,) * rank


def _native_geometry(raw, ranks, has_matmul) -> dict:
    """Tensors as the graph shaped them, padded to ``MIN_RANK``; scalars take the graph's rank."""
    rank = max([MIN_RANK] + ranks)
    if has_matmul and ranks and max(ranks) != 3:
        raise GraphNotSupportedError(
            "a matmul fused with convolution, norm, layout or attention ops "
            f"needs rank-3 tensors ([batch, rows, cols]); found ranks {ranks}")
    geometry = {}
    for uid, (t, dims, strides) in raw.items():
        if t.is_pass_by_value:
            geometry[uid] = _scalar_geometry(t, dims, rank)
        else:
            geometry[uid] = _pad(dims, strides, MIN_RANK)
    return geometry


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
                if t.ragged_offset is not None:
                    yield t.ragged_offset


class Lowering:
    """What a lowerer works with: the graph, its tensors' geometry and descriptor steps, and helpers
    to reference a tensor, add a virtual tensor or a pass-by-value constant of its own."""

    def __init__(self, graph, geometry: dict, steps: list, tensor_steps: dict, constants: list,
                 axis_shift: int, version: Optional[int]):
        self.graph = graph
        self.geometry = geometry          # uid -> (dims, strides) as pushed to cuDNN
        self.steps = steps
        self.tensor_steps = tensor_steps  # uid -> step name
        self.constants = constants        # (uid, DataType, value) the plan passes by value
        self.axis_shift = axis_shift      # rank pushed to cuDNN minus the graph's rank
        self.version = version            # the loaded libcudnn's version; None when lowering offline
        self.aliases = []                 # (view uid, source uid, byte offset), see Program.aliases
        self.plan_constants = []          # see Program.plan_constants
        self.scratch_tensors = []         # see Program.scratch
        self.barred_engines = {}          # see Program.barred_engines
        self._next_uid = max([int(u) for u in tensor_steps] + [0]) + 1

    def ref(self, t) -> Ref:
        """The descriptor of graph tensor ``t``."""
        return Ref(self.tensor_steps[t.uid])

    def tensor_step(self, t) -> Step:
        """The descriptor step of graph tensor ``t`` (a lowerer may adjust its attributes)."""
        name = self.tensor_steps[t.uid]
        return next(s for s in self.steps if s.name == name)

    def dims(self, t) -> tuple:
        return self.geometry[t.uid][0]

    def strides(self, t) -> tuple:
        return self.geometry[t.uid][1]

    def compute_type(self, node) -> DataType:
        return _compute_type(self.graph, node)

    def _tensor(self, dims, strides, dtype, **extra) -> tuple:
        uid = self._next_uid
        self._next_uid += 1
        name = f"tensor_{uid}"
        attrs = {
            "CUDNN_ATTR_TENSOR_UNIQUE_ID": uid,
            "CUDNN_ATTR_TENSOR_DATA_TYPE": DataType(dtype),
            "CUDNN_ATTR_TENSOR_DIMENSIONS": tuple(int(d) for d in dims),
            "CUDNN_ATTR_TENSOR_STRIDES": tuple(int(s) for s in strides),
            "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT": BYTE_ALIGNMENT,
        }
        attrs.update(extra)
        self.tensor_steps[uid] = name
        self.geometry[uid] = (tuple(dims), tuple(strides))
        return uid, Step(name, "CUDNN_BACKEND_TENSOR_DESCRIPTOR", attrs)

    def virtual(self, dims, strides=None, dtype=DataType.FLOAT) -> tuple:
        """A new virtual (intermediate) tensor: ``(Ref, Step)``; yield the step before using the ref."""
        strides = tuple(strides) if strides is not None else _row_major(dims)
        uid, step = self._tensor(dims, strides, dtype, CUDNN_ATTR_TENSOR_IS_VIRTUAL=True)
        return Ref(step.name), step

    def bar_engines(self, engine_ids, reason: str) -> None:
        """Keep cuDNN's engines ``engine_ids`` out of this graph's plans, saying why."""
        for engine_id in engine_ids:
            self.barred_engines[int(engine_id)] = reason

    def alias(self, view, source, byte_offset: int) -> None:
        """Feed graph tensor ``view`` at execute with ``source``'s pointer plus ``byte_offset`` (the
        caller passes no buffer for ``view``; ``source`` must be a graph input or output)."""
        self.aliases.append((int(view.uid), int(source.uid), int(byte_offset)))

    def constant(self, value, dtype=DataType.FLOAT, rank: Optional[int] = None) -> tuple:
        """A new pass-by-value scalar the plan supplies at every execute: ``(Ref, Step)``."""
        rank = rank or max([len(d) for d, _ in self.geometry.values()] + [MIN_RANK])
        uid, step = self._tensor((1,) * rank, (1,) * rank, dtype, CUDNN_ATTR_TENSOR_IS_BY_VALUE=True)
        self.plan_constants.append((uid, DataType(dtype), value))
        return Ref(step.name), step

    def scratch(self, dims, strides=None, dtype=DataType.FLOAT, fill=None) -> tuple:
        """A new device tensor the plan owns: ``(Ref, Step)``. ``fill``: None when cuDNN writes it
        before reading, 0 to zero it before every execute, or a tuple of values written once (row-major
        over ``dims``; constant data the graph needs, e.g. ALiBi slopes)."""
        strides = tuple(strides) if strides is not None else _row_major(dims)
        uid, step = self._tensor(dims, strides, dtype)
        span = 1 + sum((int(d) - 1) * int(s) for d, s in zip(dims, strides))
        nbytes = (span * itemsize_bits(DataType(dtype)) + 7) // 8
        if fill is not None and fill != 0:
            fill = tuple(float(v) for v in fill)
            if len(fill) != span:
                raise ValueError(f"scratch tensor of {span} elements given {len(fill)} fill values")
        self.scratch_tensors.append((uid, nbytes, fill))
        return Ref(step.name), step


@lowers("matmul")
def _lower_matmul(lw, node, i):
    desc = {"CUDNN_ATTR_MATMUL_COMP_TYPE": lw.compute_type(node)}
    padding = float(node.params.get("padding") or 0.0)
    if padding != 0.0:
        desc["CUDNN_ATTR_MATMUL_PADDING_VALUE"] = padding
    yield Step(f"matmul_{i}", "CUDNN_BACKEND_MATMUL_DESCRIPTOR", desc)
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR", {
        "CUDNN_ATTR_OPERATION_MATMUL_ADESC": lw.ref(node.inputs["A"]),
        "CUDNN_ATTR_OPERATION_MATMUL_BDESC": lw.ref(node.inputs["B"]),
        "CUDNN_ATTR_OPERATION_MATMUL_CDESC": lw.ref(node.outputs["C"]),
        "CUDNN_ATTR_OPERATION_MATMUL_DESC": Ref(f"matmul_{i}"),
    })


@lowers("pointwise")
def _lower_pointwise(lw, node, i):
    schema = node.schema
    mode = schema.pointwise_mode
    compute = lw.compute_type(node)
    desc = {"CUDNN_ATTR_POINTWISE_MODE": mode, "CUDNN_ATTR_POINTWISE_MATH_PREC": compute}
    if mode in (pointwise_mode.RELU_FWD, pointwise_mode.RELU_BWD):
        # cuDNN's clip defaults, spelled out as cudnn-frontend does (the upper clip within FLOAT's range).
        desc["CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP"] = 0.0
        desc["CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP"] = _FLOAT32_MAX if compute == DataType.FLOAT else _DOUBLE_MAX
        desc["CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE"] = 0.0
    for attr, backend_attr in schema.attr_map.items():
        value = node.params.get(attr)
        if value is None:
            continue
        if backend_attr == "CUDNN_ATTR_POINTWISE_AXIS":
            axis, rank = int(value), len(node.outputs["Y"].dim)
            if lw.axis_shift < 0 and axis < rank - 2:
                raise GraphNotSupportedError(
                    f"node '{node.name}' ({node.op}): axis {axis} is a batch axis that folding merges away "
                    "(a matmul graph of rank > 3 has its batch axes folded into one)")
            # Padding prepends axes (shift > 0); folding merges the batch axes (shift < 0).
            desc[backend_attr] = axis + lw.axis_shift
        elif backend_attr == "CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP" and compute == DataType.FLOAT:
            desc[backend_attr] = min(float(value), _FLOAT32_MAX)
        else:
            desc[backend_attr] = float(value)
    yield Step(f"pointwise_{i}", "CUDNN_BACKEND_POINTWISE_DESCRIPTOR", desc)
    op = {"CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR": Ref(f"pointwise_{i}")}
    for port, backend_attr in schema.operands.items():
        op[backend_attr] = lw.ref(node.inputs[port])
    out = "CUDNN_ATTR_OPERATION_POINTWISE_DXDESC" if schema.pointwise_kind == "backward" \
        else "CUDNN_ATTR_OPERATION_POINTWISE_YDESC"
    op[out] = lw.ref(node.outputs["Y"])
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR", op)


@lowers("reduction")
def _lower_reduction(lw, node, i):
    yield Step(f"reduction_{i}", "CUDNN_BACKEND_REDUCTION_DESCRIPTOR", {
        # The op table's converter already made it a reduction_mode member.
        "CUDNN_ATTR_REDUCTION_OPERATOR": reduction_mode(node.params["mode"]),
        "CUDNN_ATTR_REDUCTION_COMP_TYPE": lw.compute_type(node),
    })
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR", {
        "CUDNN_ATTR_OPERATION_REDUCTION_XDESC": lw.ref(node.inputs["input"]),
        "CUDNN_ATTR_OPERATION_REDUCTION_YDESC": lw.ref(node.outputs["Y"]),
        "CUDNN_ATTR_OPERATION_REDUCTION_DESC": Ref(f"reduction_{i}"),
    })


_OPERATION_PREFIX = "CUDNN_BACKEND_OPERATION_"   # OPERATIONGRAPH does not match: no "_" after OPERATION


def lower_program(graph, version: Optional[int] = None, checked: bool = False) -> Program:
    """The descriptor program for ``graph`` (validated first when needed). Needs no cuDNN.

    ``version`` is the loaded libcudnn's (ops newer than it are declined; lowerings that differ by
    version follow it); None lowers for the newest this package knows. Raises
    GraphNotSupportedError, saying why, for what the lowering does not cover. ``checked`` skips
    ``check_lowerable`` when the caller has just run it with the same version.
    """
    if not checked:
        check_lowerable(graph, version)
    graph = GraphView.of(graph)
    used = {}
    for node in graph.nodes:
        for t in _tensors_of(node):
            used.setdefault(t.uid, t)
    ordered = [t for t in graph.tensors if t.uid in used]
    ordered.sort(key=lambda t: t.ragged_offset is not None)   # offsets first: their users reference them
    geometry, notes, barred = _geometry(graph, ordered)

    steps, tensor_steps, constants = [], {}, []
    for t in ordered:
        dims, strides = geometry[t.uid]
        dtype = graph.data_type(t)
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
        if t.ragged_offset is not None:
            attrs["CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC"] = Ref(tensor_steps[t.ragged_offset.uid])
        name = f"tensor_{t.uid}"
        tensor_steps[t.uid] = name
        steps.append(Step(name, "CUDNN_BACKEND_TENSOR_DESCRIPTOR", attrs))

    # GEN_INDEX's axis moves with the axes the padding prepends; folding would merge it away.
    shaped = [t for t in ordered if not t.is_pass_by_value]
    axis_shift = len(geometry[shaped[0].uid][0]) - len(shaped[0].dim) if shaped else 0
    override_shapes = bool(getattr(graph, "is_override_shape_enabled", False))
    if override_shapes and version is not None and version < OVERRIDE_SHAPE_VERSION:
        # Before any node is lowered: the version is the reason, whatever a node's lowering would add.
        from ..._cudnn_errors import CudnnVersionError
        raise CudnnVersionError("a graph with override shapes enabled (dynamic shapes)",
                                OVERRIDE_SHAPE_VERSION, version)
    lw = Lowering(graph, geometry, steps, tensor_steps, constants, axis_shift, version)
    for engine_id, reason in barred.items():
        lw.bar_engines([engine_id], reason)
    operations = []
    for i, node in enumerate(graph.nodes):
        for step in _lowerer(node).fn(lw, node, i):
            steps.append(step)
            if step.kind.startswith(_OPERATION_PREFIX):
                operations.append(step.name)
    op_graph = {"CUDNN_ATTR_OPERATIONGRAPH_OPS": tuple(Ref(name) for name in operations),
                "CUDNN_ATTR_OPERATIONGRAPH_HANDLE": HANDLE}
    if override_shapes:
        op_graph["CUDNN_ATTR_OPERATIONGRAPH_IS_OVERRIDE_SHAPE_ENABLED"] = True
    if dynamic_shape_wanted(graph, version):
        # Kernels compiled for a class of shapes, which is what lets a kernel cache serve another shape.
        op_graph["CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED"] = True
    steps.append(Step("operation_graph", "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR", op_graph))
    return Program(steps, tensor_steps, geometry, operations, constants, notes=notes, aliases=lw.aliases,
                   plan_constants=lw.plan_constants, scratch=lw.scratch_tensors,
                   barred_engines=lw.barred_engines, unused_uids=_unread_operands(steps, ordered, tensor_steps))


def dynamic_shape_wanted(graph, version: Optional[int]) -> bool:
    """Whether ``graph``'s operation graph is finalized as a dynamic-shape graph: it asked
    (``pygraph(is_dynamic_shape_enabled=True)``, or a ``kernel_cache=``) and cuDNN has the attribute.

    An older cuDNN builds the graph for its one shape (the results are the same); the graph's kernel
    cache records that decline, and the log says it (``cudnn_graph.kernel_cache``).
    """
    if not getattr(graph, "is_dynamic_shape_enabled", False):
        return False
    return version is None or version >= DYNAMIC_SHAPE_VERSION


def _refs_in(value, into: set) -> None:
    if isinstance(value, Ref):
        into.add(value.name)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _refs_in(v, into)


def _unread_operands(steps, tensors, tensor_steps) -> list:
    """uids of the graph's non-virtual tensors whose descriptor no other descriptor references."""
    referenced = set()
    for step in steps:
        for value in step.attrs.values():
            _refs_in(value, referenced)
    return [int(t.uid) for t in tensors
            if not t.is_virtual and not t.is_pass_by_value and tensor_steps[t.uid] not in referenced]


# The op families in their own modules register themselves on import (they import this module).
from . import _lower_conv, _lower_norm, _lower_layout, _lower_sdpa  # noqa: E402,F401


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

    ``handle`` is what ``HANDLE`` stands for (a _cudnn_handle.Handle; None leaves those attributes unset, as a
    deviceless build wants). Raises the typed CudnnStatusError
    of the first call cuDNN refuses (its message names the attribute and the descriptor).
    """
    if descriptor_factory is None:
        from ..._cudnn_descriptor import Descriptor as descriptor_factory
    made = {}
    for step in program.steps:
        descriptor = descriptor_factory(step.kind)
        for attr, value in step.attrs.items():
            if value is HANDLE and handle is None:
                continue        # a deviceless build (cuDNN >= 9.8): the operation graph takes no handle
            attr_type = ATTRIBUTE_TYPES[attr]
            descriptor.set(attr, attr_type, _resolve_value(value, made, handle))
        descriptor.finalize()
        made[step.name] = descriptor
    return made
