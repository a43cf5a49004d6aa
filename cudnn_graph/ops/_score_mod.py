"""SDPA ``score_mod`` callbacks recorded as a subgraph of the attention node.

cudnn.pygraph's ``sdpa(..., score_mod=f)`` calls ``f(graph, score)`` with a graph to build on and the score
tensor ``attn_scale * q @ k^T`` (FLOAT, dims ``(b, h_q, s_q, s_kv)``); ``f`` returns the modified score, which
then goes through bias, softmax and ``@ v``. Callers pass the extra tensors the callback reads (mask bounds,
document ids, a softcap) with ``functools.partial``; those tensors are made on the outer graph::

    def softcap(sub, score, cap):
        return sub.mul(a=sub.tanh(input=sub.div(a=score, b=cap)), b=cap)

    cap = graph.tensor(name="cap", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], is_pass_by_value=True,
                       data_type=cudnn.data_type.FLOAT)
    o, _ = graph.sdpa(q, k, v, generate_stats=False, attn_scale=0.125,
                      score_mod=functools.partial(softcap, cap=cap))

Here the builder runs the callback once, when ``sdpa`` is called, on a ``ScoreModBuilder``: a stand-in
graph whose op methods append to a child ``pygraph`` (the *subgraph*). Every outer tensor the callback
hands an op is mirrored into the subgraph by a tensor of the same name and geometry; the outer tensors
become the attention node's ``score_mod_inputs`` port (so validation sees them used and the variant pack
carries their buffers), and the recorded ``ScoreModGraph`` is its ``score_mod_graph`` attribute. Tensors
the callback makes with ``tensor()`` / ``tensor_like()`` / ``tensor_scalar()`` on the stand-in are made on
the outer graph (the caller binds them at execute like any other input). ``score_mod_bprop`` (the
backward's callback) is recorded the same way, as ``score_mod_bprop_inputs`` / ``score_mod_bprop_graph``.

Inference (``check_score_mod``, called by the sdpa schemas) refreshes the mirrors and the score tensor from
the outer graph, infers the subgraph and checks that the callback's result has the score's dims; errors
name the attention node, the ``score_mod`` port and the subgraph's node, port and tensor.

Engines read the subgraph through ``ScoreModGraph``: ``nodes`` (pointwise nodes in order), ``score`` (its
input standing for the scores), ``output`` (what the callback returned), ``mirrors`` (subgraph tensor ->
outer tensor, in port order) and ``constants`` (subgraph tensors with a value: Python numbers given to an op).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional

from .._layout import row_major_strides
from ..data_type import DataType
from ..errors import GraphNotSupportedError, GraphValidationError
from .schema import InferContext

logger = logging.getLogger(__name__)

__all__ = ["ScoreModGraph", "ScoreModBuilder", "SCORE_MOD_KEYWORDS", "prepare_score_mod_call",
           "check_score_mod", "to_score_mod_graph"]

# (callback keyword, port holding the outer tensors it reads, attribute holding the recorded subgraph)
SCORE_MOD_KEYWORDS = (("score_mod", "score_mod_inputs", "score_mod_graph"),
                      ("score_mod_bprop", "score_mod_bprop_inputs", "score_mod_bprop_graph"))

# Tensor makers of the stand-in graph that make their tensor on the outer graph.
_OUTER_MAKERS = ("tensor", "tensor_like", "tensor_scalar")
# Read from the outer graph too: a callback written for pygraph receives the graph itself and may look up
# the graph's tensors (e.g. its sequence lengths) there; an outer tensor it passes to an op is mirrored.
_OUTER_LOOKUPS = ("tensors", "tensor_by_uid")


class ScoreModGraph:
    """The subgraph one ``score_mod`` (or ``score_mod_bprop``) callback built (see the module doc)."""

    def __init__(self, keyword: str, node: str, graph, score, mirrors: dict):
        self.keyword = keyword           # "score_mod" or "score_mod_bprop"
        self.node = node                 # the attention node's name (for messages)
        self.graph = graph               # the child pygraph holding the callback's nodes
        self.score = score               # the child tensor standing for the scores
        self.output = score              # set once the callback returned
        self._mirrors = mirrors          # outer uid -> (outer tensor, child tensor), first use first

    @property
    def nodes(self) -> tuple:
        """The callback's nodes, in the order it built them (a topological order)."""
        return self.graph.nodes

    @property
    def mirrors(self) -> tuple:
        """``(child tensor, outer tensor)`` pairs, in the order of the node's inputs port."""
        return tuple((child, outer) for outer, child in self._mirrors.values())

    @property
    def outer_tensors(self) -> tuple:
        return tuple(outer for outer, _child in self._mirrors.values())

    @property
    def constants(self) -> tuple:
        """Child tensors that carry their own value (Python numbers the callback gave an op)."""
        return tuple(t for t in self.graph.tensors if t.producer is None and t.value is not None)

    def freeze(self) -> None:
        """Freeze the subgraph (its graph's build_operation_graph does, with the graph)."""
        if not self.graph.frozen:
            self.graph._freeze()

    def to_dict(self) -> dict:
        """The structure (for the graph's JSON and fingerprint), names left out as the graph's key does:
        callbacks that build the same ops on the same tensors share plans."""
        graph = self.graph.to_dict()
        graph["context"].pop("name", None)
        for item in graph["tensors"] + graph["nodes"]:
            item.pop("name", None)
        return {"keyword": self.keyword, "graph": graph, "score": int(self.score.uid),
                "output": int(self.output.uid), "mirrors": [int(c.uid) for c, _o in self.mirrors]}

    def __repr__(self) -> str:
        ops = ", ".join(n.op for n in self.nodes) or "identity"
        return f"ScoreModGraph({self.keyword} of '{self.node}': {ops})"


def to_score_mod_graph(value: Any) -> Optional[ScoreModGraph]:
    """Attr.convert of ``score_mod_graph``: a recorded subgraph, or None."""
    if value is None or isinstance(value, ScoreModGraph):
        return value
    raise TypeError(f"a subgraph recorded from score_mod was expected; got {value!r} "
                    "(the builder sets it: pass score_mod=callback)")


class ScoreModBuilder:
    """The graph a ``score_mod`` callback receives: pygraph's op methods, appending to the subgraph.

    Outer-graph tensors given to an op are mirrored into the subgraph (first use makes the mirror);
    ``tensor`` / ``tensor_like`` / ``tensor_scalar`` make their tensor on the outer graph. Example::

        def mask_below(sub, score, bound, neg_inf):
            col = sub.gen_index(input=score, axis=3)
            col.set_data_type(cudnn.data_type.INT32)
            keep = sub.cmp_lt(input=col, comparison=bound)
            keep.set_data_type(cudnn.data_type.BOOLEAN)
            return sub.binary_select(input0=score, input1=neg_inf, mask=keep)
    """

    def __init__(self, outer, record: ScoreModGraph):
        self._outer = outer
        self._record = record

    def _mirror(self, value: Any) -> Any:
        from .._ir import Tensor
        if isinstance(value, (list, tuple)):
            return type(value)(self._mirror(v) for v in value)
        if not isinstance(value, Tensor) or value.graph is not self._outer:
            return value
        rec = self._record
        found = rec._mirrors.get(value.uid)
        if found is None:
            dt = value.data_type
            child = rec.graph.tensor(name=value.name, dim=value.dim, stride=value.stride,
                                     data_type=None if dt == DataType.NOT_SET else dt,
                                     is_pass_by_value=value.is_pass_by_value)
            found = rec._mirrors[value.uid] = (value, child)
        return found[1]

    def __getattr__(self, name: str):
        source = self._outer if name in _OUTER_MAKERS or name in _OUTER_LOOKUPS else self._record.graph
        attr = getattr(source, name)
        if not callable(attr) or source is self._outer:
            return attr

        def call(*args, **kwargs):
            return attr(*[self._mirror(a) for a in args], **{k: self._mirror(v) for k, v in kwargs.items()})
        call.__name__ = name
        call.__doc__ = getattr(attr, "__doc__", None)
        return call

    def __repr__(self) -> str:
        return f"ScoreModBuilder({self._record.keyword} of '{self._record.node}')"


def _score_dims(graph, op: str, node: str, keyword: str, kwargs: Mapping[str, Any]) -> tuple:
    """(b, h_q, s_q, s_kv) from the builder's q / k / v (and paging) arguments, as inference finds them."""
    from ._sdpa import infer_s_kv
    dims = {}
    for port in ("q", "k", "v", "bias", "paged_attention_k_table", "paged_attention_v_table"):
        t = kwargs.get(port)
        d = getattr(t, "dim", None) if t is not None else None
        if d is not None and len(d) != 4 and port in ("q", "k", "v"):
            d = None
        dims[port] = tuple(int(x) for x in d) if d else None
    for port in ("q", "k", "v"):
        if dims[port] is None:
            raise GraphValidationError(node, op, keyword, f"the callback is run when {op}() is called, so {port} "
                                                          "must be a rank-4 tensor with its dims set by then")
    table_k, table_v = dims["paged_attention_k_table"], dims["paged_attention_v_table"]
    bias = dims["bias"]
    s_kv = infer_s_kv(dims["k"], dims["v"], table_k is not None, table_v is not None,
                      kwargs.get("paged_attention_max_seq_len_kv"),
                      bias if bias is not None and len(bias) == 4 else None, table_k, table_v)
    b, h_q, s_q, _ = dims["q"]
    return (b, h_q, s_q, int(s_kv))


def _record(graph, op: str, node: str, keyword: str, callback: Callable, dims: tuple) -> ScoreModGraph:
    """Run ``callback`` on a fresh subgraph; returns what it built."""
    from .._ir import Tensor
    from ..graph import pygraph
    ctx = graph.context
    child = pygraph(io_data_type=ctx.io_data_type, intermediate_data_type=ctx.intermediate_data_type,
                    compute_data_type=ctx.compute_data_type, name=f"{node}::{keyword}", device="cpu")
    score = child.tensor(name=f"{node}::score", dim=dims, stride=row_major_strides(dims),
                         data_type=DataType.FLOAT, is_virtual=True)
    rec = ScoreModGraph(keyword, node, child, score, {})
    result = callback(ScoreModBuilder(graph, rec), score)
    if not isinstance(result, Tensor):
        raise GraphValidationError(node, op, keyword, f"the callback must return the modified score tensor; "
                                                      f"it returned {type(result).__name__}")
    if result.graph is not child:
        where = "the outer graph" if result.graph is graph else "another graph"
        raise GraphValidationError(node, op, keyword, f"the callback returned tensor '{result.name}' of {where}; "
                                                      "it must return a tensor built from the score it was given")
    made = [t for t in child.tensors if t.producer is None and t is not score and t.value is None
            and all(t is not c for c, _o in rec.mirrors)]
    if made:
        raise GraphValidationError(node, op, keyword, f"tensor '{made[0].name}' was made inside the subgraph, where "
                                                      "no buffer can reach it; make it on the graph (graph.tensor)")
    rec.output = result
    logger.debug("node '%s': %s recorded %d nodes reading %d outer tensors", node, keyword,
                 len(child.nodes), len(rec.mirrors))
    return rec


def prepare_score_mod_call(graph, schema, kwargs: dict) -> dict:
    """OpSchema.prepare_call of sdpa / sdpa_backward: run the score callbacks and record their subgraphs."""
    for keyword, port, attr in SCORE_MOD_KEYWORDS:
        if kwargs.get(port) is not None or kwargs.get(attr) is not None:
            raise TypeError(f"{schema.name}(): '{port}' and '{attr}' are set by the builder from {keyword}=; "
                            "do not pass them")
    present = [(k, p, a) for k, p, a in SCORE_MOD_KEYWORDS if kwargs.get(k) is not None]
    if not present:
        return kwargs
    node = str(kwargs.get("name") or f"{schema.name}_{graph.node_count}")
    dims = _score_dims(graph, schema.name, node, present[0][0], kwargs)
    out = dict(kwargs)
    for keyword, port, attr in present:
        callback = kwargs[keyword]
        if not callable(callback):
            raise GraphValidationError(node, schema.name, keyword, f"a callable (or None) was expected; got "
                                                                   f"{callback!r}")
        rec = _record(graph, schema.name, node, keyword, callback, dims)
        out[port] = rec.outer_tensors or None
        out[attr] = rec
    return out


def _tensor_named_by(rec: ScoreModGraph, exc: Exception) -> str:
    """`` (tensor 'x')`` for the subgraph tensor at the node and port a validation error names, else ''."""
    node = next((n for n in rec.nodes if n.name == getattr(exc, "node", None)), None)
    t = node.inputs.get(getattr(exc, "port", None)) if node is not None else None
    return f" (tensor '{t.name}')" if t is not None and not isinstance(t, tuple) else ""


def check_score_mod(ctx: InferContext, scores: tuple) -> None:
    """Refresh and infer each recorded subgraph of an attention node (the sdpa schemas' infer calls it)."""
    from .._inference import infer_graph
    a = ctx.attrs
    for keyword, port, attr in SCORE_MOD_KEYWORDS:
        rec = a.get(attr)
        if rec is None:
            continue
        infos = ctx.inputs.get(port) or ()
        if len(infos) != len(rec.mirrors):
            ctx.fail(port, f"holds {len(infos)} tensors; the recorded {keyword} subgraph reads {len(rec.mirrors)}")
        if keyword == "score_mod" and (a.get("use_alibi_mask") or a.get("use_padding_mask")
                                       or a.get("use_causal_mask") or a.get("use_causal_mask_bottom_right")
                                       or a.get("sliding_window_length") is not None
                                       or a.get("diagonal_band_left_bound") is not None
                                       or a.get("diagonal_band_right_bound") is not None):
            # cudnn-frontend's rule: with a score modifier the built-in masks are off (build them in it).
            ctx.unsupported("with score_mod the built-in masks (ALiBi, padding, causal, sliding window) are "
                            "disabled, as in cudnn-frontend; build them in the callback")
        if not rec.graph.frozen:
            if tuple(rec.score.dim) != tuple(scores):
                rec.score.set_dim(scores).set_stride(row_major_strides(scores))
            for (child, _outer), info in zip(rec.mirrors, infos):
                if tuple(child.dim) != tuple(info.dim) or tuple(child.stride) != tuple(info.stride):
                    child.set_dim(info.dim).set_stride(info.stride)
                if child.data_type != info.data_type:
                    child.set_data_type(info.data_type)
        try:
            infer_graph(rec.graph)
        except (GraphValidationError, GraphNotSupportedError) as exc:
            ctx.fail(keyword, f"in the subgraph the callback built{_tensor_named_by(rec, exc)}: {exc}")
        out = rec.output
        if out is not rec.score and tuple(out.dim) != tuple(scores):
            ctx.fail(keyword, f"the callback returned tensor '{out.name}' of dims {list(out.dim)}; the score it "
                              f"modifies has dims {list(scores)} (b, h_q, s_q, s_kv)")
        read = {t.uid for node in rec.nodes for t in node.inputs.values() if t is not None}
        for node in rec.nodes:
            for oname, t in node.outputs.items():
                if t is not out and t.uid not in read:
                    ctx.fail(keyword, f"tensor '{t.name}' (output {oname} of the subgraph's node '{node.name}') "
                                      "is not used; every op the callback builds must lead to the score it returns")
            if node.schema.family != "pointwise":
                ctx.fail(keyword, f"node '{node.name}' ({node.op}) of the subgraph is not a pointwise op; a score "
                                  "modifier is built from pointwise ops")
