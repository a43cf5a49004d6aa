"""Scaled dot-product attention (forward and backward) lowered to backend descriptors.

Two lowerings per direction, picked by the node's ``implementation`` (forward) and by what the loaded
libcudnn supports:

* **composite**: the operation graph cudnn-frontend 1.x builds for cuDNN's fused flash-attention engines
  (matmul, pointwise and reduction operations). cuDNN recognises the pattern, so the sequence, the
  operand order and the intermediate data types follow the frontend's: ``bmm1 = Q @ K^T`` (K's descriptor
  is K with its last two dims and strides swapped), ``* attn_scale``, ``+ bias``, ``+ alibi``, the padding
  mask, the diagonal band (right bound, then left bound), the softmax as MAX / SUB / EXP / ADD-reduction /
  LOG / ADD (Stats) / DIV, dropout, ``bmm2 = P @ V``. Masks are GEN_INDEX + comparisons + BINARY_SELECT
  with a by-value -inf. The backward is the frontend's dO.O row sum (``softmax_sum``), the recomputation of
  P from Stats, dV = P^T dO, dS, dK = dS^T Q and dQ through a float accumulator.
* **native**: ``CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR`` (cuDNN >= 9.13.1) and
  ``..._SDPA_BWD_DESCRIPTOR`` (>= 9.17), one operation each. This lowering sets only the attributes of
  the first releases (Q K V O Stats scale, block mask >= 9.14, page tables and sequence lengths >= 9.15),
  so masks, bias, dropout and sinks stay on the composite.

``implementation``: UNIFIED = native or decline; COMPOSITE = composite or decline; AUTO = native when the
running version supports every feature the node asks for, else composite (cudnn-frontend's rule).
``sdpa_backward`` has no ``implementation``: the lowerings in ``BACKWARD_ORDER`` are tried in turn, by
default the composite (what cudnn-frontend runs) when it can be built, else the native operation when it
covers the case (cuDNN 9.19 refuses the native backward's operation graph on H200: see BACKWARD_ORDER).

Tensors the composite needs in device memory of the plan's own (the backward's ``softmax_sum`` and dQ
accumulator, the ALiBi slopes) come from ``Lowering.scratch``; a lowering without it declines those
graphs saying so. Attribute names the compiled core cannot set yet (the native SDPA operations,
RNG, paged-cache loads, reshape) are not registered, and the graphs needing them are declined with the
reason, so AUTO still falls back to what can be built.

``score_mod`` (the subgraph the builder records from the callback) is lowered on the composite forward,
between the scale and the bias (``_lower_score_mod``); the native operation declines it.

Not lowered (declined by name): ``score_mod`` / ``score_mod_bprop`` in the backward, block masks on the
composite, dynamic shapes and execute-time override shapes.
"""
from __future__ import annotations

import logging
import math
from typing import Optional

from ..._layout import row_major_strides as _row_major
from ...data_type import DataType
from ...enums import pointwise_mode as PW, reduction_mode as RED
from ...errors import GraphNotSupportedError
from ...ops._sdpa import PAGED_BACKWARD_REASON, AttentionImplementation, DiagonalAlignment, MaskSpec, \
    alibi_slopes, infer_s_kv, resolve_masking, stats_requested
from .lowering import ATTRIBUTE_TYPES, Ref, Step, lowers
from ._lower_score_mod import lower_score_mod

logger = logging.getLogger(__name__)

__all__ = ["NATIVE_FWD_VERSION", "NATIVE_BWD_VERSION", "BACKWARD_ORDER", "BACKWARD_MAX_HEAD_DIM",
           "PAGED_BACKWARD_REASON", "SDPA_ATTRIBUTE_TYPES", "settable", "choose_forward", "choose_backward"]

NATIVE_FWD_VERSION = 91301       # CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR usable (cudnn-frontend's gate)
NATIVE_BLOCK_MASK_VERSION = 91400
NATIVE_PAGED_VERSION = 91500     # page tables and sequence lengths on the native forward
NATIVE_BWD_VERSION = 91700
NATIVE_SUBGRAPH_VERSION = 92100  # masks / bias / dropout / sink reach the native op only through a subgraph
RAGGED_GQA_BWD_VERSION = 90600   # ragged offsets with h_k or h_v < h_q in the backward (cudnn-frontend's gate)

# cuDNN's support matrix (9.18): the fused fp16 / bf16 attention runs head dims up to 256 on sm_90 (forward
# and backward); its backward stops at 128 on sm_80 / sm_89, and cudnn-frontend's checks keep sm_100's there
# too (bar d_qk=192 with d_v=128). The
# lowering does not know the device, so it declines only what no architecture runs and lets cuDNN's
# heuristics refuse the rest (the engine then says so).
BACKWARD_MAX_HEAD_DIM = 256

# The lowerings sdpa_backward tries, in order. cudnn-frontend's released nodes build only the composite
# backward; the native SDPA_BWD operation is a fallback for what the composite declines. cuDNN 9.19 on an
# H200 refuses an operation graph holding it (finalize: BAD_PARAM from buildDAG), and third-party reports
# see no engine for it on 9.24 / 9.26 either. Set ("native",) (or ("native", "composite")) to force it.
BACKWARD_ORDER = ("composite", "native")

_F, _I32, _BOOL = DataType.FLOAT, DataType.INT32, DataType.BOOLEAN
_NEG_INF = float("-inf")

# Attributes beyond matmul / pointwise / reduction that these lowerings set, with their CUDNN_TYPE_*.
SDPA_ATTRIBUTE_TYPES = {
    "CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_POINTWISE_TDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_FWD_BLOCK_MASK_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_KDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_VDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_KVDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_SEQ_LEN_QDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_SEQ_LEN_KVDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_RNG_DISTRIBUTION": "CUDNN_TYPE_RNG_DISTRIBUTION",
    "CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY": "CUDNN_TYPE_DOUBLE",
    "CUDNN_ATTR_OPERATION_RNG_YDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_RNG_SEED": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_RNG_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_RESHAPE_XDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
    "CUDNN_ATTR_OPERATION_RESHAPE_YDESC": "CUDNN_TYPE_BACKEND_DESCRIPTOR",
}

_NATIVE_FWD_ATTRS = tuple(a for a in SDPA_ATTRIBUTE_TYPES if a.startswith("CUDNN_ATTR_OPERATION_SDPA_FWD_"))
_NATIVE_BWD_ATTRS = tuple(a for a in SDPA_ATTRIBUTE_TYPES if a.startswith("CUDNN_ATTR_OPERATION_SDPA_BWD_"))
_RNG_ATTRS = tuple(a for a in SDPA_ATTRIBUTE_TYPES if "_RNG_" in a)
_PAGED_ATTRS = tuple(a for a in SDPA_ATTRIBUTE_TYPES if "PAGED_CACHE_LOAD" in a)
_RESHAPE_ATTRS = tuple(a for a in SDPA_ATTRIBUTE_TYPES if "RESHAPE" in a)


def _backend_attribute_names() -> Optional[frozenset]:
    """The attribute names the compiled core can set; None when it is not importable."""
    try:
        from ... import _cudnn_descriptor  # noqa: F401 (the compiled core: without it nothing is set)
        from ... import _cudnn_names
    except ImportError:
        return None
    return frozenset(_cudnn_names.ATTRIBUTES)


_KNOWN = _backend_attribute_names()


def settable(names) -> bool:
    """Whether every attribute of ``names`` can be set by this build (all, when it cannot tell)."""
    return _KNOWN is None or all(n in _KNOWN for n in names)


_REGISTERED = {a: t for a, t in SDPA_ATTRIBUTE_TYPES.items() if settable((a,))}


def _missing_names(names) -> str:
    missing = [n for n in names if not settable((n,))]
    return (f"this build's cudnn_backend cannot set {missing[0]}" + (f" (and {len(missing) - 1} more)" if
                                                                  len(missing) > 1 else "")
            + "; include/cudnn_graph/cudnn_backend.h must declare them")


# ---- what a node asks for ----------------------------------------------------------------------------

class _Ask:
    """The features one sdpa / sdpa_backward node uses, read once."""

    def __init__(self, lw, node, forward: bool):
        ins, a = node.inputs, node.params
        self.node = node
        self.forward = forward
        self.q, self.k, self.v = ins["q"], ins["k"], ins["v"]
        self.b, self.h_q, self.s_q, self.d_qk = (int(x) for x in self.q.dim)
        self.h_k, self.h_v, self.d_v = int(self.k.dim[1]), int(self.v.dim[1]), int(self.v.dim[3])
        self.table_k = ins.get("paged_attention_k_table")
        self.table_v = ins.get("paged_attention_v_table")
        self.bias = ins.get("bias")
        self.s_kv = infer_s_kv(tuple(self.k.dim), tuple(self.v.dim), self.table_k is not None,
                               self.table_v is not None, a.get("paged_attention_max_seq_len_kv"),
                               tuple(self.bias.dim) if self.bias is not None else None,
                               tuple(self.table_k.dim) if self.table_k is not None else None,
                               tuple(self.table_v.dim) if self.table_v is not None else None)
        self.scale = ins.get("attn_scale")
        self.padding = bool(a.get("use_padding_mask"))
        self.seq_q, self.seq_kv = ins.get("seq_len_q"), ins.get("seq_len_kv")
        self.mask: MaskSpec = resolve_masking(a)
        self.alibi = bool(a.get("use_alibi_mask"))
        self.p = a.get("dropout_probability")
        self.philox = self.p is not None and self.p != 0.0
        self.seed, self.offset = ins.get("dropout_seed"), ins.get("dropout_offset")
        self.dmask, self.dscale = ins.get("dropout_mask"), ins.get("dropout_scale")
        self.dscale_inv = ins.get("dropout_scale_inv")
        self.sink = ins.get("sink_token")
        self.block_mask = ins.get("block_mask")
        self.ragged = any(getattr(t, "ragged_offset", None) is not None
                          for t in (*ins.values(), *node.outputs.values()))
        self.score_mod = a.get("score_mod_graph")          # the callback's recorded subgraph (or None)
        self.score_mod_given = a.get("score_mod") is not None or a.get("score_mod_bprop") is not None
        self.io = DataType(lw.graph.data_type(self.q))
        self.compute = lw.compute_type(node)
        outs = node.outputs
        if forward:
            self.o = outs["O"]
            self.stats = outs.get("Stats") if stats_requested(a) else None
            self.score_max, self.score_sum_exp = outs.get("score_max"), outs.get("score_sum_exp")
            self.rng_dump = outs.get("rng_dump")
        else:
            self.o, self.d_o, self.stats = ins["o"], ins["dO"], ins["stats"]
            self.dq, self.dk, self.dv = outs["dQ"], outs["dK"], outs["dV"]
            self.dbias, self.dsink = outs.get("dBias"), outs.get("dSink_token")
            self.rng_dump = outs.get("rng_dump")
        self.implementation = AttentionImplementation(a.get("implementation") or 0) if forward \
            else AttentionImplementation.AUTO

    @property
    def where(self) -> str:
        return f"node '{self.node.name}' ({self.node.op})"

    @property
    def banded(self) -> bool:
        return self.mask.left_bound is not None or self.mask.right_bound is not None


def _common_decline(ask: _Ask) -> Optional[str]:
    """Reasons neither lowering can take the node."""
    reason = _score_mod_decline(ask)
    if reason:
        return reason
    if ask.io not in (DataType.HALF, DataType.BFLOAT16):
        return f"cuDNN's attention engines take HALF or BFLOAT16 q/k/v; got {ask.io.name}"
    if ask.compute != _F:
        return f"cuDNN's attention runs with FLOAT compute; the node asks for {ask.compute.name}"
    for name, t in (("q", ask.q), ("k", ask.k), ("v", ask.v), ("o", ask.o)):
        if int(t.stride[3]) != 1:
            return f"tensor '{t.name}' ({name}) needs a unit stride along the head dim; got strides {tuple(t.stride)}"
    if ask.d_qk % 8 or ask.d_v % 8:
        return f"head dims must be multiples of 8; got d_qk={ask.d_qk}, d_v={ask.d_v}"
    if not ask.forward:
        if ask.d_qk > BACKWARD_MAX_HEAD_DIM or ask.d_v > BACKWARD_MAX_HEAD_DIM:
            return (f"cuDNN's attention backward takes head dims up to {BACKWARD_MAX_HEAD_DIM} (on sm_90; up to "
                    f"128 on sm_80 / sm_89, and on sm_100 but for d_qk=192 with d_v=128); got d_qk={ask.d_qk}, "
                    f"d_v={ask.d_v}")
        if ask.table_k is not None or ask.table_v is not None:
            return PAGED_BACKWARD_REASON
    return None


def _native_decline(ask: _Ask, version: Optional[int]) -> Optional[str]:
    """Why the native operation cannot take the node on ``version`` (None: it can)."""
    need = NATIVE_FWD_VERSION if ask.forward else NATIVE_BWD_VERSION
    if version is not None and version < need:
        return f"the native SDPA {'forward' if ask.forward else 'backward'} operation needs cuDNN >= " \
               f"{_dotted(need)}; loaded {_dotted(version)}"
    names = _NATIVE_FWD_ATTRS if ask.forward else _NATIVE_BWD_ATTRS
    if not settable(names):
        return _missing_names(names)
    later = []
    if ask.banded or ask.mask.alignment != DiagonalAlignment.TOP_LEFT:
        later.append("causal / sliding-window bounds")
    if ask.alibi:
        later.append("ALiBi")
    if ask.bias is not None:
        later.append("bias")
    if ask.p is not None or ask.dmask is not None:
        later.append("dropout")
    if ask.sink is not None:
        later.append("a sink token")
    if ask.score_mod is not None:
        later.append("a score_mod subgraph")
    if ask.forward and (ask.score_max is not None or ask.rng_dump is not None):
        later.append("score_max / score_sum_exp / rng_dump outputs")
    if not ask.forward and ask.dbias is not None:
        later.append("dBias")
    if later:
        return (f"the native operation takes {', '.join(later)} only through a score subgraph / softmax "
                f"descriptor (cuDNN >= {_dotted(NATIVE_SUBGRAPH_VERSION)}), which this lowering does not build")
    if ask.forward:
        paged = ask.table_k is not None or ask.table_v is not None
        if (paged or ask.padding) and version is not None and version < NATIVE_PAGED_VERSION:
            return f"the native forward takes sequence lengths and page tables from cuDNN " \
                   f"{_dotted(NATIVE_PAGED_VERSION)}; loaded {_dotted(version)}"
        if ask.block_mask is not None and version is not None and version < NATIVE_BLOCK_MASK_VERSION:
            return f"the native forward takes a block mask from cuDNN {_dotted(NATIVE_BLOCK_MASK_VERSION)}; " \
                   f"loaded {_dotted(version)}"
    return None


def _composite_decline(ask: _Ask, lw) -> Optional[str]:
    """Why the composite lowering cannot take the node (None: it can)."""
    if ask.block_mask is not None:
        return "a block mask runs only on the native operation (implementation=UNIFIED)"
    if ask.alibi and not hasattr(lw, "scratch"):
        return ("ALiBi needs the per-head slopes in device memory the plan owns; this lowering has no "
                "plan-owned tensors yet (Lowering.scratch)")
    if ask.philox and not settable(_RNG_ATTRS):
        return "Philox dropout: " + _missing_names(_RNG_ATTRS)
    if (ask.table_k is not None or ask.table_v is not None) and not settable(_PAGED_ATTRS):
        return "paged K/V caches: " + _missing_names(_PAGED_ATTRS)
    if ask.forward:
        if ask.stats is not None and ask.score_max is not None:
            return "the composite softmax writes either Stats or score_max + score_sum_exp, not both"
    else:
        if not hasattr(lw, "scratch"):
            return ("the composite backward keeps softmax_sum and the dQ accumulator in device memory the "
                    "plan owns; this lowering has no plan-owned tensors yet (Lowering.scratch)")
        if not settable(_RESHAPE_ATTRS):
            return "the composite backward: " + _missing_names(_RESHAPE_ATTRS)
        if ask.s_q == 1 and ask.s_kv == 1:
            return "s_q = s_kv = 1 has no backward engine"
        if ask.dmask is not None:
            # Measured on the H200 (cuDNN 9.19): dK off by ~33% of its scale with a caller's keep-mask,
            # bf16 and fp16, CuPy and JAX, while the same lowering with a Philox mask matches the reference.
            return ("a custom dropout mask in the backward: cuDNN 9.19's plan for it computed a wrong dK on "
                    "the H200, so it is declined until that is understood (Philox dropout backward is verified)")
        if ask.ragged and (ask.h_k != ask.h_q or ask.h_v != ask.h_q) and lw.version is not None \
                and lw.version < RAGGED_GQA_BWD_VERSION:
            return (f"a ragged (THD) backward with fewer K/V heads than query heads (GQA / MQA) needs cuDNN >= "
                    f"{_dotted(RAGGED_GQA_BWD_VERSION)}; loaded {_dotted(lw.version)}")
        if lw.version is not None and lw.version <= 91500 and ask.s_kv % 128 and not ask.padding:
            return (f"cuDNN {_dotted(lw.version)} needs a padding-mask workaround for s_kv % 128 != 0 "
                    "that this lowering does not build; give use_padding_mask with full lengths")
    if ask.mask.alignment == DiagonalAlignment.BOTTOM_RIGHT and ask.mask.right_bound == 0:
        if ask.bias is not None or ask.alibi or ask.p is not None or ask.dmask is not None:
            return "a bottom-right causal mask does not combine with bias, ALiBi or dropout in cuDNN"
        if not ask.padding and ask.s_q > ask.s_kv:
            return f"a bottom-right causal mask needs s_q <= s_kv without padding; got s_q={ask.s_q}, s_kv={ask.s_kv}"
    if ask.mask.left_bound is not None and not ask.padding and ask.s_q > ask.s_kv:
        return f"a sliding window needs s_q <= s_kv without padding; got s_q={ask.s_q}, s_kv={ask.s_kv}"
    return None


def _score_mod_decline(ask: _Ask) -> Optional[str]:
    """Why no lowering takes the node's score_mod (None: the composite forward lowers it)."""
    if not ask.score_mod_given:
        return None
    if not ask.forward:
        return ("score_mod / score_mod_bprop in sdpa_backward are not lowered yet (the forward's score_mod is: "
                "it joins the composite's operation graph)")
    if ask.score_mod is None:
        return "a score_mod callback without the subgraph the builder records from it (score_mod_graph)"
    return None


def _dotted(version: int) -> str:
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


def choose_forward(lw, node) -> str:
    """'native' or 'composite' for an sdpa node; raises GraphNotSupportedError saying why neither."""
    return _choose(lw, _Ask(lw, node, forward=True))


def choose_backward(lw, node) -> str:
    """'composite' or 'native' for an sdpa_backward node; raises GraphNotSupportedError saying why neither."""
    return _choose(lw, _Ask(lw, node, forward=False))


def _choose(lw, ask: _Ask) -> str:
    common = _common_decline(ask)
    if common:
        raise GraphNotSupportedError(f"{ask.where}: {common}")
    native = _native_decline(ask, lw.version)
    composite = _composite_decline(ask, lw)
    impl = ask.implementation
    if impl == AttentionImplementation.UNIFIED:
        if native:
            raise GraphNotSupportedError(f"{ask.where}: implementation=UNIFIED: {native}")
        return "native"
    if impl == AttentionImplementation.COMPOSITE:
        if composite:
            raise GraphNotSupportedError(f"{ask.where}: implementation=COMPOSITE: {composite}")
        return "composite"
    reasons = {"native": native, "composite": composite}
    order = ("native", "composite") if ask.forward else BACKWARD_ORDER
    for kind in order:
        if reasons[kind] is None:
            if not ask.forward and kind == "native" and order[0] != "native":
                logger.info("%s: the composite backward cannot take it (%s); trying the native SDPA_BWD "
                            "operation, which cuDNN 9.19 refuses on H200", ask.where, composite)
            return kind
    tried = "; ".join(f"{kind}: {reasons[kind]}" for kind in order)
    raise GraphNotSupportedError(f"{ask.where}: no lowering covers it; {tried}")


# ---- a small step builder -------------------------------------------------------------------------------

class _Steps:
    """Collects one node's steps in creation order, with helpers for the frontend's building blocks."""

    def __init__(self, lw, i: int):
        self.lw, self.i, self.n = lw, i, 0
        self.steps: list = []

    def _name(self, what: str) -> str:
        self.n += 1
        return f"sdpa{self.i}_{what}{self.n}"

    def virtual(self, dims, dtype=_F, strides=None, ragged: Optional[Ref] = None) -> Ref:
        """A virtual tensor; ``ragged``: the offset tensor of a packed (THD) view, as cudnn-frontend gives
        the K it reshapes back in the backward."""
        ref, step = self.lw.virtual(tuple(dims), strides if strides is None else tuple(strides), dtype)
        if ragged is not None:
            step.attrs["CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC"] = ragged
        self.steps.append(step)
        return ref

    def constant(self, value, dtype) -> Ref:
        ref, step = self.lw.constant(value, dtype, rank=4)
        self.steps.append(step)
        return ref

    def scratch(self, dims, dtype, strides=None, fill=None) -> Ref:
        ref, step = self.lw.scratch(tuple(dims), tuple(strides or _row_major(dims)), dtype, fill=fill)
        self.steps.append(step)
        return ref

    def pointwise(self, mode: PW, x: Ref, b: Optional[Ref] = None, t: Optional[Ref] = None, *, y: Ref,
                  compute=_F, axis: Optional[int] = None) -> Ref:
        desc = {"CUDNN_ATTR_POINTWISE_MODE": mode, "CUDNN_ATTR_POINTWISE_MATH_PREC": DataType(compute)}
        if axis is not None:
            desc["CUDNN_ATTR_POINTWISE_AXIS"] = int(axis)
        pw = self._name(f"pw_{mode.name.lower()}_")
        self.steps.append(Step(pw, "CUDNN_BACKEND_POINTWISE_DESCRIPTOR", desc))
        op = {"CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR": Ref(pw), "CUDNN_ATTR_OPERATION_POINTWISE_XDESC": x}
        if b is not None:
            op["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"] = b
        if t is not None:
            op["CUDNN_ATTR_OPERATION_POINTWISE_TDESC"] = t
        op["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"] = y
        self.steps.append(Step(self._name("op_pointwise"), "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR", op))
        return y

    def reduction(self, mode: RED, x: Ref, y: Ref) -> Ref:
        red = self._name(f"reduction_{mode.name.lower()}_")
        self.steps.append(Step(red, "CUDNN_BACKEND_REDUCTION_DESCRIPTOR", {
            "CUDNN_ATTR_REDUCTION_OPERATOR": mode, "CUDNN_ATTR_REDUCTION_COMP_TYPE": _F}))
        self.steps.append(Step(self._name("op_reduction"), "CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR", {
            "CUDNN_ATTR_OPERATION_REDUCTION_XDESC": x, "CUDNN_ATTR_OPERATION_REDUCTION_YDESC": y,
            "CUDNN_ATTR_OPERATION_REDUCTION_DESC": Ref(red)}))
        return y

    def matmul(self, a: Ref, b: Ref, c: Ref, *, m: Optional[Ref] = None, n: Optional[Ref] = None,
               k: Optional[Ref] = None) -> Ref:
        mm = self._name("matmul")
        self.steps.append(Step(mm, "CUDNN_BACKEND_MATMUL_DESCRIPTOR", {"CUDNN_ATTR_MATMUL_COMP_TYPE": _F}))
        op = {"CUDNN_ATTR_OPERATION_MATMUL_ADESC": a, "CUDNN_ATTR_OPERATION_MATMUL_BDESC": b,
              "CUDNN_ATTR_OPERATION_MATMUL_CDESC": c, "CUDNN_ATTR_OPERATION_MATMUL_DESC": Ref(mm)}
        for attr, ref in (("M", m), ("N", n), ("K", k)):
            if ref is not None:
                op[f"CUDNN_ATTR_OPERATION_MATMUL_GEMM_{attr}_OVERRIDE_DESC"] = ref
        self.steps.append(Step(self._name("op_matmul"), "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR", op))
        return c

    def reshape(self, x: Ref, y: Ref) -> Ref:
        self.steps.append(Step(self._name("op_reshape"), "CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR", {
            "CUDNN_ATTR_OPERATION_RESHAPE_XDESC": x, "CUDNN_ATTR_OPERATION_RESHAPE_YDESC": y}))
        return y

    def rng(self, seed: Ref, offset: Ref, keep_probability: float, y: Ref) -> Ref:
        rng = self._name("rng")
        self.steps.append(Step(rng, "CUDNN_BACKEND_RNG_DESCRIPTOR", {
            "CUDNN_ATTR_RNG_DISTRIBUTION": 0,     # CUDNN_RNG_DISTRIBUTION_BERNOULLI
            "CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY": float(keep_probability)}))
        self.steps.append(Step(self._name("op_rng"), "CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR", {
            "CUDNN_ATTR_OPERATION_RNG_YDESC": y, "CUDNN_ATTR_OPERATION_RNG_SEED": seed,
            "CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC": offset, "CUDNN_ATTR_OPERATION_RNG_DESC": Ref(rng)}))
        return y

    def paged_load(self, container: Ref, table: Ref, seq_len: Ref, y: Ref) -> Ref:
        self.steps.append(Step(self._name("op_paged_load"), "CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR", {
            "CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC": container,
            "CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC": table,
            "CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC": seq_len,
            "CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC": y}))
        return y


def _orient(lw, ask: _Ask, t, transposed: bool) -> None:
    """Describe graph tensor ``t`` to cuDNN as the caller laid it out, or with its last two dims (and
    strides) swapped: the composite hands the fused engines K^T (and V^T in the backward) as a strided
    view of the caller's buffer. One descriptor serves every op of the graph, so the uses must agree."""
    seen = lw.__dict__.setdefault("_sdpa_orientation", {})
    if t.uid in seen:
        if seen[t.uid] != transposed:
            raise GraphNotSupportedError(
                f"{ask.where}: tensor '{t.name}' is read transposed by one attention lowering and as laid "
                "out by another; cuDNN has one descriptor per tensor, so give each its own tensor")
        return
    for other in lw.graph.nodes:
        if other.op in ("sdpa", "sdpa_backward") or not transposed:
            continue
        if any(value is t for value in other.inputs.values()):
            raise GraphNotSupportedError(
                f"{ask.where}: tensor '{t.name}' also feeds node '{other.name}' ({other.op}); the attention "
                "lowering describes it transposed to cuDNN, so it cannot be shared")
    seen[t.uid] = transposed
    if not transposed:
        return
    step = lw.tensor_step(t)
    dims = list(step.attrs["CUDNN_ATTR_TENSOR_DIMENSIONS"])
    strides = list(step.attrs["CUDNN_ATTR_TENSOR_STRIDES"])
    dims[-1], dims[-2] = dims[-2], dims[-1]
    strides[-1], strides[-2] = strides[-2], strides[-1]
    step.attrs["CUDNN_ATTR_TENSOR_DIMENSIONS"] = tuple(dims)
    step.attrs["CUDNN_ATTR_TENSOR_STRIDES"] = tuple(strides)
    lw.geometry[t.uid] = (tuple(dims), tuple(strides))


# ---- composite pieces shared by forward and backward -----------------------------------------------------

def _scores(s: _Steps, ask: _Ask) -> tuple:
    """(dims, strides) of the score matrix (b, h_q, s_q, s_kv), row-major."""
    dims = (ask.b, ask.h_q, ask.s_q, ask.s_kv)
    return dims, _row_major(dims)


def _score_modifiers(s: _Steps, ask: _Ask, lw, score: Ref, *, before_band=None) -> Ref:
    """bias, ALiBi, padding mask, then (after ``before_band``) the diagonal band, as the frontend orders them."""
    dims, _ = _scores(s, ask)
    if ask.bias is not None:
        score = s.pointwise(PW.ADD, score, lw.ref(ask.bias), y=s.virtual(dims))
    if ask.alibi:
        row = s.pointwise(PW.GEN_INDEX, score, y=s.virtual(dims, _I32), compute=_I32, axis=2)
        col = s.pointwise(PW.GEN_INDEX, score, y=s.virtual(dims, _I32), compute=_I32, axis=3)
        dist = s.pointwise(PW.SUB, col, row, y=s.virtual(dims, _I32), compute=_I32)
        slopes = s.scratch((1, ask.h_q, 1, 1), _F, (ask.h_q, 1, 1, 1), fill=tuple(alibi_slopes(ask.h_q)))
        bias = s.pointwise(PW.MUL, dist, slopes, y=s.virtual(dims))
        score = s.pointwise(PW.ADD, score, bias, y=s.virtual(dims))
    if ask.padding:
        row = s.pointwise(PW.GEN_INDEX, score, y=s.virtual(dims, _I32), compute=_I32, axis=2)
        col = s.pointwise(PW.GEN_INDEX, score, y=s.virtual(dims, _I32), compute=_I32, axis=3)
        row_ok = s.pointwise(PW.CMP_LT, row, lw.ref(ask.seq_q), y=s.virtual(dims, _BOOL), compute=_BOOL)
        col_ok = s.pointwise(PW.CMP_LT, col, lw.ref(ask.seq_kv), y=s.virtual(dims, _BOOL), compute=_BOOL)
        keep = s.pointwise(PW.LOGICAL_AND, row_ok, col_ok, y=s.virtual(dims, _BOOL), compute=_BOOL)
        score = s.pointwise(PW.BINARY_SELECT, score, s.constant(_NEG_INF, _F), keep, y=s.virtual(dims))
    if before_band is not None:
        score = before_band(score)
    return _diagonal_band(s, ask, lw, score)


def _diagonal_band(s: _Steps, ask: _Ask, lw, score: Ref) -> Ref:
    """The right bound (causal), then the left bound (sliding window), each a BINARY_SELECT to -inf."""
    dims, _ = _scores(s, ask)
    spec = ask.mask
    bottom_right = spec.alignment == DiagonalAlignment.BOTTOM_RIGHT
    seq_q = lw.ref(ask.seq_q) if ask.padding else None
    seq_kv = lw.ref(ask.seq_kv) if ask.padding else None
    if spec.right_bound is not None:
        row = s.pointwise(PW.GEN_INDEX, score, y=s.virtual(dims, _I32), axis=2)
        col = s.pointwise(PW.GEN_INDEX, score, y=s.virtual(dims, _I32), axis=3)
        if bottom_right:     # row + (s_kv - s_q): the diagonal ends in the bottom-right corner
            row = s.pointwise(PW.ADD, row, seq_kv or s.constant(ask.s_kv, _I32), y=s.virtual(dims, _I32),
                              compute=_I32)
            row = s.pointwise(PW.SUB, row, seq_q or s.constant(ask.s_q, _I32), y=s.virtual(dims, _I32),
                              compute=_I32)
        if spec.right_bound != 0:
            row = s.pointwise(PW.ADD, row, s.constant(int(spec.right_bound), _I32), y=s.virtual(dims, _I32),
                              compute=_I32)
        keep = s.pointwise(PW.CMP_GE, row, col, y=s.virtual(dims, _BOOL), compute=_BOOL)
        score = s.pointwise(PW.BINARY_SELECT, score, s.constant(_NEG_INF, _F), keep, y=s.virtual(dims))
    if spec.left_bound is not None:
        row = s.pointwise(PW.GEN_INDEX, score, y=s.virtual(dims, _I32), axis=2)
        col = s.pointwise(PW.GEN_INDEX, score, y=s.virtual(dims, _I32), axis=3)
        left = int(spec.left_bound)
        if not bottom_right:          # keep col + left > row
            col = s.pointwise(PW.ADD, col, s.constant(float(left), _F), y=s.virtual(dims, _F), compute=_F)
        elif not ask.padding:         # fixed lengths fold the shift into the bound
            col = s.pointwise(PW.ADD, col, s.constant(float(left - ask.s_kv + ask.s_q), _F),
                              y=s.virtual(dims, _F), compute=_F)
        else:                         # per-batch shift: col + left - s_kv[b] + s_q[b] > row
            col = s.pointwise(PW.ADD, col, s.constant(left, _I32), y=s.virtual(dims, _I32), compute=_I32)
            col = s.pointwise(PW.SUB, col, seq_kv, y=s.virtual(dims, _I32), compute=_I32)
            col = s.pointwise(PW.ADD, col, seq_q, y=s.virtual(dims, _I32), compute=_I32)
        keep = s.pointwise(PW.CMP_GT, col, row, y=s.virtual(dims, _BOOL), compute=_BOOL)
        score = s.pointwise(PW.BINARY_SELECT, score, s.constant(_NEG_INF, _F), keep, y=s.virtual(dims))
    return score


def _length_overrides(lw, ask: _Ask) -> tuple:
    """The (seq_len_q, seq_len_kv) refs the matmuls take as their M / N / K overrides, or None each.
    cudnn-frontend passes the sequence-length tensors whenever the node has them (with a padding mask,
    or with paged K/V whose masking a score_mod does), not only with use_padding_mask."""
    return (lw.ref(ask.seq_q) if ask.seq_q is not None else None,
            lw.ref(ask.seq_kv) if ask.seq_kv is not None else None)


def _k_operand(s: _Steps, ask: _Ask, lw) -> Ref:
    """K^T for bmm1: K described transposed, or the K page cache gathered into a (b, h_k, d, s_kv) view."""
    if ask.table_k is None:
        _orient(lw, ask, ask.k, True)
        return lw.ref(ask.k)
    b, h, d, skv = ask.b, ask.h_k, ask.d_qk, ask.s_kv
    k_cache = s.virtual((b, h, d, skv), ask.io, (d * skv * h, d * skv, 1, d))
    return s.paged_load(lw.ref(ask.k), lw.ref(ask.table_k), lw.ref(ask.seq_kv), k_cache)


def _v_operand(s: _Steps, ask: _Ask, lw) -> Ref:
    if ask.table_v is None:
        _orient(lw, ask, ask.v, False)
        return lw.ref(ask.v)
    v_cache = s.virtual((ask.b, ask.h_v, ask.s_kv, ask.d_v), ask.io)
    return s.paged_load(lw.ref(ask.v), lw.ref(ask.table_v), lw.ref(ask.seq_kv), v_cache)


# ---- forward -----------------------------------------------------------------------------------------------

def _forward_composite(lw, ask: _Ask, i: int):
    s = _Steps(lw, i)
    dims, _ = _scores(s, ask)
    rows = (ask.b, ask.h_q, ask.s_q, 1)
    seq_q, seq_kv = _length_overrides(lw, ask)

    kt = _k_operand(s, ask, lw)
    score = s.matmul(lw.ref(ask.q), kt, s.virtual(dims), m=seq_q, n=seq_kv)
    if ask.scale is not None:
        score = s.pointwise(PW.MUL, score, lw.ref(ask.scale), y=s.virtual(dims))
    if ask.score_mod is not None:      # the callback's ops, between the scale and the bias (the frontend's order)
        score = lower_score_mod(s, lw, ask.score_mod, score)
    score = _score_modifiers(s, ask, lw, score)

    # softmax, as the frontend's composite softmax node: Stats = max + log(sum(exp(x - max)))
    if ask.sink is not None:
        row_max = s.reduction(RED.MAX, score, s.virtual(rows))
        row_max = s.pointwise(PW.MAX, row_max, lw.ref(ask.sink),
                              y=lw.ref(ask.score_max) if ask.score_max is not None else s.virtual(rows))
    else:
        row_max = s.reduction(RED.MAX, score,
                              lw.ref(ask.score_max) if ask.score_max is not None else s.virtual(rows))
    shifted = s.pointwise(PW.SUB, score, row_max, y=s.virtual(dims))
    exp = s.pointwise(PW.EXP, shifted, y=s.virtual(dims))
    total_out = lw.ref(ask.score_sum_exp) if ask.score_sum_exp is not None else s.virtual(rows)
    if ask.sink is not None:
        sink_shift = s.pointwise(PW.SUB, lw.ref(ask.sink), row_max, y=s.virtual(rows))
        sink_exp = s.pointwise(PW.EXP, sink_shift, y=s.virtual(rows))
        partial = s.reduction(RED.ADD, exp, s.virtual(rows))
        total = s.pointwise(PW.ADD, partial, sink_exp, y=total_out)
    else:
        total = s.reduction(RED.ADD, exp, total_out)
    if ask.score_max is None:
        # Without max / sum_exp outputs the frontend always writes Stats, virtual when not asked for.
        log = s.pointwise(PW.LOG, total, y=s.virtual(rows))
        s.pointwise(PW.ADD, row_max, log, y=lw.ref(ask.stats) if ask.stats is not None else s.virtual(rows))

    dropout = ask.philox or ask.dmask is not None
    prob = s.pointwise(PW.DIV, exp, total, y=s.virtual(dims, _F if dropout else ask.io))
    if ask.dmask is not None:
        prob = s.pointwise(PW.MUL, prob, lw.ref(ask.dscale), y=s.virtual(dims))
        prob = s.pointwise(PW.MUL, prob, lw.ref(ask.dmask), y=s.virtual(dims, ask.io))
    elif ask.philox:
        keep = lw.ref(ask.rng_dump) if ask.rng_dump is not None else s.virtual(dims)
        keep = s.rng(lw.ref(ask.seed), lw.ref(ask.offset), 1.0 - ask.p, keep)
        prob = s.pointwise(PW.MUL, prob, keep, y=s.virtual(dims))
        prob = s.pointwise(PW.MUL, prob, s.constant(1.0 / (1.0 - ask.p), _F), y=s.virtual(dims, ask.io))
    s.matmul(prob, _v_operand(s, ask, lw), lw.ref(ask.o), m=seq_q, k=seq_kv)
    return s.steps


def _scale_and_lengths(lw, ask: _Ask, op: dict, prefix: str) -> None:
    """The SDPA operation's optional scale and, with a padding mask, sequence-length descriptors."""
    if ask.scale is not None:
        op[prefix + "SCALEDESC"] = lw.ref(ask.scale)
    if ask.padding:
        op[prefix + "SEQ_LEN_QDESC"] = lw.ref(ask.seq_q)
        op[prefix + "SEQ_LEN_KVDESC"] = lw.ref(ask.seq_kv)


def _forward_native(lw, ask: _Ask, i: int):
    op = {"CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC": lw.ref(ask.q), "CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC": lw.ref(ask.k),
          "CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC": lw.ref(ask.v), "CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC": lw.ref(ask.o)}
    if ask.stats is not None:
        op["CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC"] = lw.ref(ask.stats)
    _scale_and_lengths(lw, ask, op, "CUDNN_ATTR_OPERATION_SDPA_FWD_")
    if ask.block_mask is not None:
        op["CUDNN_ATTR_OPERATION_SDPA_FWD_BLOCK_MASK_DESC"] = lw.ref(ask.block_mask)
    if ask.table_k is not None:
        op["CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_KDESC"] = lw.ref(ask.table_k)
    if ask.table_v is not None:
        op["CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_VDESC"] = lw.ref(ask.table_v)
    return [Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR", op)]


def _lower_attention(lw, node, i, forward: bool, native, composite):
    """Lower one attention node as one cuDNN SDPA operation (``native``) or as the composite graph."""
    ask = _Ask(lw, node, forward=forward)
    kind = _choose(lw, ask)
    logger.debug("node '%s' (%s) lowered as %s", node.name, node.op, kind)
    if kind == "native":
        _orient(lw, ask, ask.k, False)
        _orient(lw, ask, ask.v, False)
        yield from native(lw, ask, i)
        return
    yield from composite(lw, ask, i)


@lowers("sdpa", native_geometry=True, attributes=_REGISTERED)
def _lower_sdpa(lw, node, i):
    return _lower_attention(lw, node, i, True, _forward_native, _forward_composite)


# ---- backward -------------------------------------------------------------------------------------------

def _backward_composite(lw, ask: _Ask, i: int):
    s = _Steps(lw, i)
    b, h_q, s_q, s_kv, d_qk, d_v = ask.b, ask.h_q, ask.s_q, ask.s_kv, ask.d_qk, ask.d_v
    dims, _ = _scores(s, ask)
    rows = (b, h_q, s_q, 1)
    seq_q, seq_kv = _length_overrides(lw, ask)
    k_dims, k_strides = tuple(int(x) for x in ask.k.dim), tuple(int(x) for x in ask.k.stride)
    _orient(lw, ask, ask.k, True)
    _orient(lw, ask, ask.v, True)

    keep = scale = scale_inv = None
    if ask.philox:
        keep = lw.ref(ask.rng_dump) if ask.rng_dump is not None else s.virtual(dims)
        keep = s.rng(lw.ref(ask.seed), lw.ref(ask.offset), 1.0 - ask.p, keep)
        scale = s.constant(1.0 / (1.0 - ask.p), _F)
        scale_inv = s.constant(1.0 - ask.p, _F)
    elif ask.dmask is not None:
        keep, scale, scale_inv = lw.ref(ask.dmask), lw.ref(ask.dscale), lw.ref(ask.dscale_inv)

    # softmax_sum = rowsum(dO * O) (times the inverse dropout scale), kept in memory for the kernel
    d_o, o = lw.ref(ask.d_o), lw.ref(ask.o)
    prod = s.pointwise(PW.MUL, d_o, o, y=s.virtual((b, h_q, s_q, d_v)))
    row_dot = s.reduction(RED.ADD, prod, s.virtual(rows))
    if ask.dsink is not None:
        sink_shift = s.pointwise(PW.SUB, lw.ref(ask.sink), lw.ref(ask.stats), y=s.virtual(rows))
        sink_exp = s.pointwise(PW.EXP, sink_shift, y=s.virtual(rows))
        per_row = s.pointwise(PW.MUL, sink_exp, row_dot, y=s.virtual(rows))
        s.reduction(RED.ADD, per_row, lw.ref(ask.dsink))
    softmax_sum = s.pointwise(PW.MUL, row_dot, scale_inv if scale_inv is not None else s.constant(1.0, _F),
                              y=s.scratch(rows, _F, (h_q * s_q, s_q, 1, 1)))

    # P recomputed from Stats
    score = s.matmul(lw.ref(ask.q), lw.ref(ask.k), s.virtual(dims), m=seq_q, n=seq_kv)
    if ask.scale is not None:
        score = s.pointwise(PW.MUL, score, lw.ref(ask.scale), y=s.virtual(dims))
    stats = lw.ref(ask.stats)
    score = _score_modifiers(s, ask, lw, score,
                             before_band=lambda x: s.pointwise(PW.SUB, x, stats, y=s.virtual(dims)))
    exp_s = s.pointwise(PW.EXP, score, y=s.virtual(dims))
    prob = exp_s
    if keep is not None:
        prob = s.pointwise(PW.MUL, prob, keep, y=s.virtual(dims))
        prob = s.pointwise(PW.MUL, prob, scale, y=s.virtual(dims))

    transposed = (b, h_q, s_kv, s_q)
    transposed_strides = (h_q * s_q * s_kv, s_q * s_kv, 1, s_kv)
    prob_t = s.reshape(prob, s.virtual(transposed, ask.io, transposed_strides))
    _grad_matmul(s, ask, lw, prob_t, d_o, ask.dv, ask.h_v, d_v, seq_q, seq_kv)

    # dS = P * (dP - softmax_sum) (with dropout), times the attention scale
    dp = s.matmul(d_o, lw.ref(ask.v), s.virtual(dims), m=seq_q, n=seq_kv)
    if keep is not None:
        dp = s.pointwise(PW.MUL, dp, keep, y=s.virtual(dims))
    ds = s.pointwise(PW.SUB, dp, softmax_sum, y=s.virtual(dims))
    ds = s.pointwise(PW.MUL, ds, exp_s, y=s.virtual(dims))
    if scale is not None:
        ds = s.pointwise(PW.MUL, ds, scale, y=s.virtual(dims))
    if ask.dbias is not None:
        s.reduction(RED.ADD, ds, lw.ref(ask.dbias))
    if ask.scale is not None:
        ds = s.pointwise(PW.MUL, ds, lw.ref(ask.scale), y=s.virtual(dims))

    ds_t = s.reshape(ds, s.virtual(transposed, ask.io, transposed_strides))
    _grad_matmul(s, ask, lw, ds_t, lw.ref(ask.q), ask.dk, ask.h_k, d_qk, seq_q, seq_kv)

    # dQ = dS @ K through a FLOAT accumulator (cuDNN >= 9.6 initialises it itself)
    k_ragged = lw.ref(ask.k.ragged_offset) if ask.k.ragged_offset is not None else None
    k_back = s.reshape(lw.ref(ask.k), s.virtual(k_dims, ask.io, k_strides, ragged=k_ragged))
    accum = s.scratch((b, h_q, s_q, d_qk), _F, fill=0 if lw.version is not None and lw.version < 90600 else None)
    s.matmul(ds, k_back, accum, m=seq_q, k=seq_kv)
    s.pointwise(PW.IDENTITY, accum, y=lw.ref(ask.dq))
    return s.steps


def _grad_matmul(s: _Steps, ask: _Ask, lw, lhs_t: Ref, rhs: Ref, out, heads: int, d: int, seq_q, seq_kv) -> None:
    """dV = P^T dO or dK = dS^T Q; with fewer K/V heads (GQA / MQA) the full-head product is summed."""
    if heads == ask.h_q:
        s.matmul(lhs_t, rhs, lw.ref(out), m=seq_kv, k=seq_q)
        return
    full = s.virtual((ask.b, ask.h_q, ask.s_kv, d), ask.io)
    s.matmul(lhs_t, rhs, full, m=seq_kv, k=seq_q)
    s.reduction(RED.ADD, full, lw.ref(out))


def _backward_native(lw, ask: _Ask, i: int):
    op = {"CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC": lw.ref(ask.q), "CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC": lw.ref(ask.k),
          "CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC": lw.ref(ask.v), "CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC": lw.ref(ask.o),
          "CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC": lw.ref(ask.stats),
          "CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC": lw.ref(ask.d_o),
          "CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC": lw.ref(ask.dq),
          "CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC": lw.ref(ask.dk),
          "CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC": lw.ref(ask.dv)}
    _scale_and_lengths(lw, ask, op, "CUDNN_ATTR_OPERATION_SDPA_BWD_")
    return [Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR", op)]


@lowers("sdpa_backward", native_geometry=True, attributes=_REGISTERED)
def _lower_sdpa_backward(lw, node, i):
    return _lower_attention(lw, node, i, False, _backward_native, _backward_composite)


assert all(a in ATTRIBUTE_TYPES for a in _REGISTERED)
