"""ReferenceEngine: NumPy execution of a whole graph, one node after another."""
from __future__ import annotations

import logging

import numpy as np

from ..base import BaseEngine, CompiledPlan, ExecutionContext, GraphView, PlanConfig
from ..ids import REFERENCE
from ...data_type import DataType, numpy_dtype as host_numpy_dtype
from ...errors import GraphNotSupportedError
from ... import _progress
from . import (_kernels_basic, _kernels_conv, _kernels_linear_attention, _kernels_norm, _kernels_sampling,
               _kernels_sdpa)

logger = logging.getLogger(__name__)

KERNELS: dict = {}
for _module in (_kernels_basic, _kernels_conv, _kernels_norm, _kernels_sdpa, _kernels_linear_attention,
                _kernels_sampling):
    KERNELS.update(_module.KERNELS)

# Features a kernel cannot run, checked when plans are proposed (a decline), not when they execute:
# op -> check(inputs, attrs) raising NotImplementedError. The kernels' own checks read only which
# ports are given and the attributes, so they run on the graph's nodes as they run on arrays.
SUPPORT_CHECKS: dict = {
    "sdpa": _kernels_sdpa._unsupported,
    "sdpa_backward": _kernels_sdpa._unsupported_backward,
    "batchnorm": lambda inputs, attrs: _kernels_norm._no_peers(attrs),
    "batchnorm_backward": lambda inputs, attrs: _kernels_norm._no_peers(attrs),
    "gdn": _kernels_linear_attention.keeps_no_chunk_cache,
    "kda": _kernels_linear_attention.keeps_no_chunk_cache,
}


def numpy_dtype(dt: DataType) -> np.dtype:
    """The NumPy (or ml_dtypes) dtype that stores a cuDNN data type on the host."""
    try:
        return host_numpy_dtype(dt)
    except ValueError:
        raise GraphNotSupportedError(f"the reference engine has no host type for {DataType(dt).name}") from None


class _ArrayInterface:
    __slots__ = ("__array_interface__",)

    def __init__(self, iface):
        self.__array_interface__ = iface


def host_view(slot, dtype: np.dtype) -> np.ndarray:
    """A NumPy view of a host slot (no copy; negative and zero strides kept)."""
    itemsize = dtype.itemsize
    shape = slot.shape
    if slot.numel == 0:
        return np.empty(shape, dtype)
    iface = {
        "data": (slot.data_ptr, slot.readonly), "shape": shape,
        "strides": tuple(s * itemsize for s in slot.strides),
        "typestr": ("|u1" if itemsize == 1 else f"<u{itemsize}"), "version": 3,
    }
    return np.asarray(_ArrayInterface(iface)).view(dtype)


def node_steps(graph) -> tuple:
    """``(numpy dtype per uid, [(node, kernel, outputs, compute dtype)])`` for running ``graph``'s nodes
    in order with ``run_steps`` (a graph, its view, or a score_mod subgraph's graph)."""
    resolve = GraphView.of(graph).data_type
    types = {t.uid: numpy_dtype(resolve(t)) for t in graph.tensors}
    ctx = graph.context
    steps = []
    for node in graph.nodes:
        compute = DataType(node.compute_data_type) if node.compute_data_type != -1 else ctx.compute_data_type
        outputs = {name: (t.dim, types[t.uid]) for name, t in node.outputs.items()}
        steps.append((node, KERNELS[node.op], outputs, np.float64 if compute == DataType.DOUBLE else np.float32))
    return types, steps


def run_steps(steps, values: dict) -> None:
    """Run ``node_steps``'s steps on ``values`` (uid -> array): virtual outputs are added to it, the
    others are written into the arrays it holds for them."""
    for node, kernel, outputs, compute in steps:
        inputs = {}
        for port, value in node.inputs.items():
            if value is None:
                inputs[port] = None
            elif isinstance(value, tuple):
                inputs[port] = [values[t.uid] for t in value]
            else:
                inputs[port] = values[value.uid]
        results = kernel(inputs, dict(node.params), outputs, compute)
        for name, t in node.outputs.items():
            result = results.get(name)
            if result is None:
                continue
            dims, dtype = outputs[name]
            result = np.asarray(result).reshape(dims)
            if t.is_virtual:
                # Round through the intermediate type, as a fused kernel keeps it there.
                values[t.uid] = result.astype(dtype)
            else:
                np.copyto(values[t.uid], result.astype(dtype), casting="unsafe")


class ReferencePlan(CompiledPlan):
    def __init__(self, plan: PlanConfig, graph):
        super().__init__(plan, 0)
        self._types, self._steps = node_steps(graph)
        self._what = f"graph {graph.context.name!r} ({len(self._steps)} nodes)"

    def execute(self, graph, variant_pack, ctx: ExecutionContext) -> None:
        values = {}
        for uid, slot in zip(variant_pack.uids, variant_pack.slots):
            values[uid] = host_view(slot, self._types[uid])
        # NumPy runs of big graphs take seconds (an SDPA of 1024 tokens: ~8 s): one that runs past
        # _progress.LONG_RUN_S is reported while it runs; a short one logs nothing.
        with _progress.long_run(ReferenceEngine.name, self._what, logger):
            run_steps(self._steps, values)


_PACKED_LAYOUT_OPS = ("sdpa", "sdpa_backward")   # ops whose ragged offsets change which elements are read


class ReferenceEngine(BaseEngine):
    """Runs every op with a NumPy kernel on host-device graphs."""

    name = "reference"
    engine_id = REFERENCE
    binds_provisional_strides = False   # any caller layout is fine on the host
    host_scalars = True

    def propose_plans(self, graph) -> list[PlanConfig]:
        kind, _ = graph.device
        if kind != "cpu":
            raise GraphNotSupportedError(f"the reference engine runs host graphs; this graph is on {kind}")
        packed = [t.name for n in graph.nodes if n.op in _PACKED_LAYOUT_OPS
                  for t in list(n.inputs.values()) + list(n.outputs.values())
                  if getattr(t, "ragged_offset", None) is not None]
        if packed:
            # The attention kernels read each tensor through dims and strides; a packed (THD) tensor's
            # sequences start where its offset tensor says, which they would not apply: a wrong answer.
            raise GraphNotSupportedError(f"the reference engine does not apply ragged offsets (packed THD "
                                         f"layouts); attention tensor '{packed[0]}' has one")
        missing = sorted({n.op for n in graph.nodes if n.op not in KERNELS})
        if missing:
            raise GraphNotSupportedError(f"the reference engine has no kernel for {', '.join(missing)}")
        for node in graph.nodes:
            check = SUPPORT_CHECKS.get(node.op)
            if check is None:
                continue
            try:
                check(node.inputs, node.params)
            except NotImplementedError as exc:
                raise GraphNotSupportedError(f"node '{node.name}' ({node.op}): {exc}") from None
        # Ranked last: it is the oracle, not the fast path.
        return [PlanConfig(REFERENCE, name="reference", engine=self, priority=-1000.0)]

    def build_plan(self, graph, plan: PlanConfig, ctx: ExecutionContext) -> CompiledPlan:
        return ReferencePlan(plan, graph)
