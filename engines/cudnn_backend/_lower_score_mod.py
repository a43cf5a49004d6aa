"""An sdpa ``score_mod`` subgraph lowered into the composite attention's operation graph.

The builder records the callback's pointwise nodes (``cudnn_graph.ops._score_mod.ScoreModGraph``); the
composite forward (``_lower_sdpa``) puts them between the scale and the bias, as cudnn-frontend's composite
does, so that ``bmm1 -> * attn_scale -> score_mod ops -> (+ bias) -> softmax -> bmm2`` is one operation
graph. Each subgraph node becomes the pointwise descriptor pair the graph-level pointwise lowering makes
(one source for modes, attributes and operand roles: ``LOWERERS["pointwise"]``), with its tensors mapped:
the subgraph's score input is the composite's score, a mirror is the outer tensor's descriptor (the
node's ``score_mod_inputs``), a constant (a Python number given to an op) is a by-value scalar the plan
supplies, and every node output is a new virtual tensor of its inferred dims and data type.
"""
from __future__ import annotations

from ..._layout import row_major_strides
from ...data_type import DataType
from .lowering import LOWERERS, Ref, _compute_type

__all__ = ["lower_score_mod"]


class _SubgraphLowering:
    """What the pointwise lowerer reads of a ``Lowering``, answered for the subgraph's tensors."""

    def __init__(self, lw, graph, refs: dict):
        self._lw, self._graph, self._refs = lw, graph, refs
        self.axis_shift = lw.axis_shift

    def ref(self, t) -> Ref:
        return self._refs[t.uid]

    def compute_type(self, node) -> DataType:
        return _compute_type(self._graph, node)


def lower_score_mod(s, lw, record, score: Ref) -> Ref:
    """Append ``record``'s nodes to the composite's steps ``s`` on ``score``; returns the modified score."""
    refs = {record.score.uid: score}
    for child, outer in record.mirrors:
        refs[child.uid] = lw.ref(outer)
    for t in record.constants:
        refs[t.uid] = s.constant(t.value, DataType(t.data_type))
    sub = _SubgraphLowering(lw, record.graph, refs)
    for k, node in enumerate(record.nodes):
        for t in node.outputs.values():
            dims = tuple(int(d) for d in t.dim)
            refs[t.uid] = s.virtual(dims, DataType(t.data_type), row_major_strides(dims))
        lowerer = LOWERERS.get(node.op) or LOWERERS["pointwise"]
        s.steps.extend(lowerer.fn(sub, node, f"sdpa{s.i}_score_mod{k}"))
    return refs[record.output.uid]
