"""The workspace of a cuTile linear-attention plan: the node's sizes and each scratch region's byte offset,
shape and type, fixed when the plan is built (``_Geometry``)."""
from __future__ import annotations

import math

from ...data_type import DataType
from ._variants import CHUNK, OP_FEATURES

BACKWARD_OPS = {"gdn_bwd": "gdn", "kda_bwd": "kda", "gdn2_bwd": "gdn2"}     # backward op -> its forward
# the per-chunk regions (chunk-major: a segment's chunks are one slice of them) that a segmented plan views by segment
SEGMENT_VIEWED = ("w", "u", "kd", "d", "hs", "dhs", "dd", "qg", "da", "dbeta_v", "dq_pre", "dk_pre")
_ALIGN = 256
ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4}     # a region's type -> its element's bytes


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Geometry:
    """The node's sizes and the workspace regions (byte offsets), fixed when the plan is built. ``H`` counts
    the value heads (the kernels' heads), ``HQ`` the query/key heads."""

    def __init__(self, node, backward: bool = False, io_scratch: str = "", fused: bool = False,
                 io_backward: bool = False, segments: int = 0):
        """``io_scratch``: the input type ("bfloat16", "float16") in which the forward keeps w, u, kd, the
        deltas and the chunk-start states ("": float32, as everything else); ``io_backward``: the backward's
        own scratch in it too (scratch="io_all"). Per-chunk scratch is laid out
        (chunk, head, CHUNK rows, width), by global chunk. ``fused``: the regions ``scores_qg`` (scale q e^gc)
        and ``scores_attn`` of the fused state pass, in the input type over the deltas' and chunk-start states'
        place (that pass writes neither; d precedes hs, and 64 V + K V >= 64 K + 64 x 64 for K, V in 64, 128).
        ``segments``: the one sequence run as that many segments of ``segment_tokens`` (``_segments``): their
        cu_seqlens rows (``segment_bounds``), the f32 states that chain them (``segment_states``), and views of
        each segment's chunks and of those regions named ``<region>@<segment>`` (``_add_segment_views``)."""
        from cudnn_graph.ops._linear_attention import beta_transform, gate_transform
        q, v = node.inputs["q"], node.inputs["v"]
        self.T, self.HQ, self.K = q.dim
        self.H, self.V = v.dim[1], v.dim[2]
        self.group = self.H // self.HQ
        self.gate_options = gate_transform(node.op, node.params) != "none" or beta_transform(node.params) != 0.0
        self.N = node.inputs["cu_seqlens"].dim[0] - 1
        self.chunks = _cdiv(self.T, CHUNK) + self.N       # bound on the chunks of all sequences
        self.segments = segments
        self.segment_tokens = CHUNK * _cdiv(self.T, CHUNK * segments) if segments else 0
        if segments:
            # segment s holds chunks [s, s + 1) x segment_chunks wherever the sequence starts
            self.chunks = max(self.chunks, segments * self.segment_chunks)
        gate_width = self.K if OP_FEATURES[BACKWARD_OPS.get(node.op, node.op)][0] else 1
        offset = 0
        self.regions = {}
        self.dtypes = {}
        # a backward keeps them in the input type only where every kernel is CuTe (scratch="io", below); with
        # scratch="io_all" its own scratch too: dhs, dd (P, then dD), qg (then dCg) and da (T, then dA), which its
        # kernels read mostly as products' operands (rounded to the input type on the way into shared memory in
        # any case), and dq / dk before the norm (what the rest costs in precision: docs/engines_cutile.md)
        narrow = {"w", "u", "kd", "d", "hs"} if io_scratch else set()
        if io_scratch and backward and io_backward:
            narrow |= {"dhs", "dd", "qg", "da", "dq_pre", "dk_pre"}
        by_chunk = (self.chunks, self.H, CHUNK)
        regions = [("w", (*by_chunk, self.K)), ("u", (*by_chunk, self.V)), ("kd", (*by_chunk, self.K)),
                   ("d", (*by_chunk, self.V)), ("hs", (self.chunks, self.H, self.K, self.V)),
                   ("g", (self.T, self.H, self.K) if gate_width > 1 else (self.T, self.H)),
                   ("state_dummy", (1, 1, self.K, self.V))]
        if backward:
            # qg: scale q e^gc for the reverse state pass, then chunk_bwd_values' dCg in the same place
            regions += [("dhs", (self.chunks, self.H, self.K, self.V)), ("dd", (*by_chunk, self.V)),
                        ("qg", (*by_chunk, self.K)), ("da", (*by_chunk, CHUNK)), ("dbeta_v", (*by_chunk, 1))]
            if self.group > 1:
                regions += [("dq_hv", (self.T, self.H, self.K)), ("dk_hv", (self.T, self.H, self.K))]
            if io_scratch:
                # dq and dk before the L2 norm's backward, which f32 plans keep in kd's and w's place
                regions += [("dq_pre", (*by_chunk, self.K)), ("dk_pre", (*by_chunk, self.K))]
        if segments:
            regions += [("segment_bounds", (segments, 4)),
                        ("segment_states", (max(1, segments - 1), 1, self.H, self.K, self.V))]
            self.dtypes["segment_bounds"] = "int32"
        if self.gate_options:
            g_shape, beta_shape = tuple(node.inputs["g"].dim), tuple(node.inputs["beta"].dim)
            regions += [("g_act", g_shape), ("beta_act", beta_shape), ("a_log_dummy", (1,)),
                        ("dt_bias_dummy", (1, self.K) if gate_width > 1 else (1,))]
            if backward:
                regions += [("dg_act", g_shape), ("dbeta_act", beta_shape)]
        for name, shape in regions:
            self.regions[name] = (offset, shape)
            self.dtypes.setdefault(name, io_scratch if name in narrow else "float32")
            offset += _align(ITEM_BYTES[self.dtypes[name]] * math.prod(shape))
        self.workspace_size = offset
        if segments:
            self._add_segment_views()
        # a gdn / kda node's chunk_cache (a forward's output, a backward's input): its regions, in the 16-bit scratch's
        # layout (the plans that write or read it keep w and kd in the input type); {} without one
        self.cache_regions = {}
        cache = (node.inputs if backward else node.outputs).get("chunk_cache")
        if cache is not None and io_scratch:
            from cudnn_graph.ops._linear_attention import chunk_cache_layout
            io_type = DataType.BFLOAT16 if io_scratch == "bfloat16" else DataType.HALF
            _, layout = chunk_cache_layout(self.T, self.N, self.H, self.K, io_type, per_channel_gate=gate_width > 1)
            self.cache_regions = {name: (offset, shape, "float32" if dt == DataType.FLOAT else io_scratch)
                                  for name, (offset, shape, dt) in layout.items()}
            assert layout["w"][1][0] == self.chunks, "the chunk cache counts the chunks as the kernels do"
        if fused and io_scratch:     # the fused pass takes the 16-bit scratch (build_plan checks)
            place = self.regions["d"][0]
            end = self.regions["hs"][0] + 2 * self.chunks * self.H * self.K * self.V
            for name, width in (("scores_qg", self.K), ("scores_attn", CHUNK)):
                self.regions[name] = (place, (*by_chunk, width))
                self.dtypes[name] = io_scratch
                place += _align(2 * self.chunks * self.H * CHUNK * width)
            assert place <= _align(end), "the fused state pass's scores overrun the deltas' and states' place"

    @property
    def segment_chunks(self) -> int:
        return self.segment_tokens // CHUNK

    def _add_segment_views(self) -> None:
        """Per segment s, views into the regions (no bytes of their own): ``<region>@s`` over its chunks for each
        per-chunk region the plan has (SEGMENT_VIEWED: the forward's w, u, kd, d and hs, and a backward's own),
        ``cu@s`` its two bounds and ``state@s`` the state that chains it to the next segment (s below segments - 1:
        a forward's state at its end, a backward's dS there)."""
        per = self.segment_chunks
        for s in range(self.segments):
            for name in (n for n in SEGMENT_VIEWED if n in self.regions):
                offset, shape = self.regions[name]
                row = ITEM_BYTES[self.dtypes[name]] * math.prod(shape[1:])
                self.regions[f"{name}@{s}"] = (offset + s * per * row, (per, *shape[1:]))
                self.dtypes[f"{name}@{s}"] = self.dtypes[name]
            self.regions[f"cu@{s}"] = (self.regions["segment_bounds"][0] + 16 * s, (2,))
            self.dtypes[f"cu@{s}"] = "int32"
            if s < self.segments - 1:
                offset, shape = self.regions["segment_states"]
                self.regions[f"state@{s}"] = (offset + ITEM_BYTES["float32"] * s * math.prod(shape[1:]), shape[1:])
                self.dtypes[f"state@{s}"] = "float32"
