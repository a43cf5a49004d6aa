"""CutileLinearAttentionEngine: cuTile chunked kernels for the delta-rule ops (gdn, kda, gdn2 forward; gdn_bwd,
kda_bwd, gdn2_bwd), with grouped value heads and the gate options.

A forward plan runs three launches on the caller's stream (see ``_kernels``; four for per-channel gates):
``chunk_prepare`` over every (chunk, head), ``chunk_state_pass`` over every (sequence, head, value block) and
``chunk_output`` over every (chunk, head, value block). Their scratch (w, u, kd, the deltas and the
chunk-start states, laid out by chunk; the cumulative gates) is carved from the workspace at plan-time
offsets (``_geometry``). The kernels read ``cu_seqlens`` on the device, so execute never synchronises with the
host. A segmented plan (``_segments``) runs one long sequence's segments with their state passes on a side stream,
joined to the caller's before it returns.

Grouped value heads (HV = group * H): every kernel runs per value head and reads q / k at head
``h // group``; the backward's dq / dk shares per value head go to f32 scratch and ``group_sum`` adds them.
The gate options (safe_gate, use_beta_sigmoid) add ``gate_activation`` before the chunked kernels (the
log decay and the write strength into f32 scratch they read as g and beta) and, in the backward,
``gate_activation_bwd`` after them (the raw inputs' gradients, d_a_log and d_dt_bias). Kernels are compiled by cuTile
at the first launch of a plan's specialisation and cached by cuTile (in memory and on disk) afterwards.
"""
from __future__ import annotations

import dataclasses

import logging
import threading
from typing import Optional

from .._device import StreamWorkspaces, compute_capability as _compute_capability
from .._dsl_common import ToolchainGatedEngine
from ..base import CompiledPlan, ExecutionContext, GraphView, PlanConfig
from ..ids import CUTILE_BASE
from ...data_type import DataType
from ...errors import GraphNotSupportedError
from ... import _progress
from . import _toolchain
from ._variants import CHUNK, OP_FEATURES, GateOptions, Variant, split_safe_lower_bound
from ._cute_launch import FUSED_FALLBACK_FORM, CuteLaunch, gates_grid
from . import _segments
from ._schedule import SIDE_LANE_EVENTS
from ._geometry import BACKWARD_OPS, _Geometry, _cdiv

logger = logging.getLogger(__name__)

FORWARD_OPS = tuple(OP_FEATURES)
BACKWARD_BLOCK_V = 32
HEAD_DIMS = (64, 128)
MAX_SEQUENCES = 8191          # the chunk locator holds N + 1 boundaries in one tile
MIN_ARCH = (8, 0)

_IO_TYPES = {DataType.BFLOAT16: "bfloat16", DataType.HALF: "float16"}
_GATE_TYPES = {DataType.BFLOAT16: "bfloat16", DataType.HALF: "float16", DataType.FLOAT: "float32"}


# Plan variants (knob sets) proposed after the default one; bench/linear_attention.py --variants times them.
# block_v: value columns per CTA of the state pass; output_block_v: of the output kernel (0: all of V, so a
# chunk's scores and L2 norms are formed once); scratch: "io" keeps w, u, kd, the deltas and the chunk-start
# states in the input type when that is BF16 / FP16 (fla's choice: half the scratch traffic), "f32" in
# float32; mma: input type of the w / u, state and output products ("auto": BF16 for BF16 inputs, as fla,
# else TF32; the UT inverse is TF32 always).
# The default was measured fastest on the H200 (issue 8 note).
DEFAULT_KNOBS = {"block_v": 32, "mma": "auto", "output_block_v": 0, "scratch": "io", "prepare": "cutile",
                 "output": "cutile", "state_pass": "cutile", "state_form": "staged", "scores": "kernel", "segments": 0}
VARIANT_KNOBS = {
    "cute_all": {"prepare": "cute", "output": "cute", "state_pass": "cute"},
    # the CuTe state pass with eight warps and 64 value columns a CTA (engines/cute/_delta_state); first
    # where the 32-column CTAs fill the GPU (_forward_priority)
    "cute_all_bv64": {"prepare": "cute", "output": "cute", "state_pass": "cute", "block_v": 64},
    # its resident form: the state transposed in the MMA accumulators, both products' A operand from registers
    "cute_all_resident": {"prepare": "cute", "output": "cute", "state_pass": "cute", "block_v": 64,
                          "state_form": "resident"},
    # its split form: KD in a shared buffer of its own (53 KB, past the default 48: the launch opts in), fetched
    # a whole step ahead; the same bits, a faster state pass (_forward_priority), so first where cute_all_bv64 is
    "cute_all_split": {"prepare": "cute", "output": "cute", "state_pass": "cute", "block_v": 64,
                       "state_form": "split"},
    # its warpgroup form: the transposed state in WGMMA accumulators (sm_90), W and KD in swizzled shared memory;
    # slower than the eight-warp form wherever timed (docs/engines_cutile.md), so to pin or time
    "cute_all_wg": {"prepare": "cute", "output": "cute", "state_pass": "cute", "block_v": 64,
                    "state_form": "warpgroup"},
    # its fused form: the state pass forms o itself from q e^gc and attn (a scores launch), no chunk-start
    # states or deltas through global memory; the split form and the output kernel where its buffers do not suit
    "cute_all_fused": {"prepare": "cute", "output": "cute", "state_pass": "cute", "block_v": 64,
                       "state_form": "fused"},
    # the fused form with gdn's scores formed by its prepare (no scores launch; DeltaPrepareScores)
    "cute_all_fused_prepare_scores": {"prepare": "cute", "output": "cute", "state_pass": "cute", "block_v": 64,
                                      "state_form": "fused", "scores": "prepare"},
    # the same over 32 value columns a CTA (four warps, twice the CTAs) for fewer sequences x heads
    "cute_all_fused_bv32": {"prepare": "cute", "output": "cute", "state_pass": "cute", "block_v": 32,
                            "state_form": "fused"},
    "cute_all_fused_bv32_prepare_scores": {"prepare": "cute", "output": "cute", "state_pass": "cute", "block_v": 32,
                                           "state_form": "fused", "scores": "prepare"},
    "cute": {"prepare": "cute", "output": "cute"},
    "cute_prepare": {"prepare": "cute"},
    "tf32": {"mma": "tf32"},
    # value blocks of 16 in the state pass: twice the default's CTAs, for few sequences x heads (one sequence
    # of 32k tokens at 16 heads: 64 CTAs at 32 columns on 132 SMs); first there (_forward_priority)
    "cute_bv16": {"prepare": "cute", "output": "cute", "block_v": 16},
    "cute_all_bv16": {"prepare": "cute", "output": "cute", "state_pass": "cute", "block_v": 16},
    # value blocks of 8 in the cuTile state pass: four times the default's CTAs; first for gdn at K = 64 where
    # they still fit one wave (_forward_priority)
    "cute_bv8": {"prepare": "cute", "output": "cute", "block_v": 8},
    # one sequence in segments whose state passes overlap the other segments' prepares and outputs (_segments)
    "cute_bv8_seg4": {"prepare": "cute", "output": "cute", "block_v": 8, "segments": 4},
    "cute_bv8_seg8": {"prepare": "cute", "output": "cute", "block_v": 8, "segments": 8},
    "cute_bv16_seg4": {"prepare": "cute", "output": "cute", "block_v": 16, "segments": 4},
    "cute_bv16_seg8": {"prepare": "cute", "output": "cute", "block_v": 16, "segments": 8},
    "bv64": {"block_v": 64},
    "bv128": {"block_v": 128},
    "out32": {"output_block_v": 32},
    "out64": {"output_block_v": 64},
    "f32_scratch": {"scratch": "f32"},
}
MMA_TYPES = ("auto", "tf32", "bf16")
# a backward's scratch knob: all f32; "io": the recompute's w, u, kd, d and hs in the input type (every kernel
# CuTe); "io_all": the backward's own scratch in it too (_Geometry)
SCRATCH_FORMS = ("f32", "io", "io_all")
FORWARD_BLOCK_VS = (8, 16, 32, 64, 128)    # the forward's block_v knob: value columns per state-pass CTA
# the CuTe state pass's forms (engines/cute/_delta_state.FORMS, and "fused": DeltaStatePassFused, which writes o)
STATE_FORMS = ("staged", "resident", "warpgroup", "split", "fused")
# where the fused form's scores come from: a launch of their own (DeltaScores), or gdn's prepare (DeltaPrepareScores)
SCORES_SOURCES = ("kernel", "prepare")
KERNEL_SOURCES = ("cutile", "cute")     # the prepare / output knobs: the cuTile kernel or the CuTe DSL one

# execute() launches from C (compiled cubins, prebuilt parameters; _c_launch) where it can; False: every
# launch through ct.launch (the tests' reference for the C path's outputs).
C_LAUNCH = True


def _unsafe_gate_bound(node) -> float | None:
    """The bounded gate's lower bound where it lets a per-channel decay's split factors overflow, else None.
    Unbounded gates depend on the data and are not checked here (docs/engines_cutile.md)."""
    from cudnn_graph.ops._linear_attention import gate_transform
    if gate_transform(node.op, node.params) != "sigmoid":
        return None
    bound = float(node.params["gate_lower_bound"])
    return bound if bound < split_safe_lower_bound() else None


def _support_reason(graph, node) -> str | None:
    """Why this engine cannot run ``node`` (None when it can)."""
    if node.op not in FORWARD_OPS and node.op not in BACKWARD_OPS:
        return f"op {node.op} has no cuTile kernel (runs {', '.join(FORWARD_OPS + tuple(BACKWARD_OPS))})"
    kind, ordinal = graph.device
    if kind != "cuda":
        return f"the graph runs on {kind}; cuTile kernels run on CUDA devices"
    resolve = GraphView.of(graph).data_type
    q, v = node.inputs["q"], node.inputs["v"]
    io = resolve(q)
    if io not in _IO_TYPES:
        return (f"q/k/v are {DataType(io).name}; the cuTile kernels take BFLOAT16 or HALF (their products run "
                "in TF32 on the tensor cores, short of FLOAT accuracy)")
    for port in ("g", "beta", "w", "a_log", "dt_bias"):
        t = node.inputs.get(port)
        if t is not None and resolve(t) not in _GATE_TYPES:
            return f"{port} is {DataType(resolve(t)).name}; expected BFLOAT16, HALF or FLOAT"
    bound = _unsafe_gate_bound(node)
    if bound is not None:
        return (f"gate_lower_bound={bound:g}: the kernels split each per-channel decay around a chunk's middle row, "
                f"and a split factor can overflow float32 for log decays below {split_safe_lower_bound():g} per "
                f"token (a silent inf / NaN); the bound must be >= {split_safe_lower_bound():g}")
    K, V = q.dim[2], v.dim[2]
    if K not in HEAD_DIMS or V not in HEAD_DIMS:
        return f"head dims K={K}, V={V}; the cuTile kernels take K and V in {HEAD_DIMS}"
    N = node.inputs["cu_seqlens"].dim[0] - 1
    if N > MAX_SEQUENCES:
        return f"{N} sequences; the cuTile kernels take at most {MAX_SEQUENCES}"
    T, HV = q.dim[0], v.dim[1]
    if T * HV * max(K, V) >= 2 ** 31:
        return f"T*HV*max(K, V) = {T * HV * max(K, V)} elements exceeds 32-bit indexing"
    try:
        cc = _compute_capability(ordinal)
    except RuntimeError as exc:
        return f"no CUDA device {ordinal} to query ({exc})"
    if cc < MIN_ARCH:
        return f"device {ordinal} is sm_{cc[0]}{cc[1]}; the cuTile kernels need sm_80 or newer"
    return None


def backward_workspace_size(node, io_dtype: str, scratch: str, segments: int = 0) -> int:
    """A backward plan's workspace: its f32 scratch, or with scratch="io" / "io_all" room for its scratch in the
    input type ``io_dtype`` and for its f32 twin's (``_backward``: the larger of the two); ``segments``: its one
    sequence's segments' regions too (``_segments``)."""
    f32 = _Geometry(node, backward=True, segments=segments).workspace_size
    if scratch == "f32":
        return f32
    return max(f32, _Geometry(node, backward=True, io_scratch=io_dtype, io_backward=scratch == "io_all",
                              segments=segments).workspace_size)


class CutileForwardPlan(CompiledPlan):
    """A built forward plan: the variant's kernels, the operands' uids and the workspace layout."""

    def __init__(self, plan: PlanConfig, graph, node, variant: Variant, geometry: _Geometry):
        super().__init__(plan, geometry.workspace_size)
        from . import _kernels
        self._gates, self._prepare, self._state_pass, self._output = _kernels.forward_kernels(variant.per_channel)
        self._gate_activation = _kernels.gate_activation
        if variant.prepare == "cute":
            self._prepare = CuteLaunch.prepare(variant, geometry, self._prepare)
        if variant.output == "cute":
            self._output = CuteLaunch.output(variant, geometry, self._output)
        if variant.state_pass == "cute":
            self._state_pass = CuteLaunch.state_pass(variant, geometry, self._state_pass)
        self._fused = None
        if variant.state_form == "fused":
            scores = (CuteLaunch.prepare_scores if variant.scores == "prepare" else CuteLaunch.scores)(variant, geometry)
            self._fused = (scores, CuteLaunch.state_output(variant, geometry))
        # a forward keeping the chunk cache: its prepare stores T too (w, kd and the gate sums go to the cache)
        # (the scores' prepare's form or None, the plain prepare's form: the fused plan's stand-in for buffers
        # its scores' prepare refuses)
        self._cache_prepares = None
        if variant.chunk_cache and node.op not in BACKWARD_OPS:
            scores_form = CuteLaunch.prepare_scores_inverse(variant, geometry) \
                if self._fused is not None and variant.scores == "prepare" else None
            self._cache_prepares = (scores_form, CuteLaunch.prepare_inverse(
                dataclasses.replace(variant, own_dtype=variant.io_dtype), geometry))
        self._cache_views = {}           # the chunk cache's address -> its region slots
        # segments: segment_bounds, the CuTe launches bounded to a segment's chunks (by the whole call's launch:
        # _segments, made at first use), and each caller stream's Lanes
        self.segment_kernels = {"bounds": _kernels.segment_bounds} if variant.segments else {}
        self.segment_bounded = {}
        self._lanes = {}
        self.variant = variant
        self._geometry = geometry
        self._device = graph.device_code
        self._ordinal = graph.device[1]
        uid = {port: (t.uid if t is not None else None) for port, t in node.inputs.items()}
        uid.update({name: t.uid for name, t in node.outputs.items()})
        self._uid = uid
        self._positions = None
        self._views = {}                 # workspace base address -> its region slots
        self._region_layout = {name: (offset, shape, geometry.dtypes[name])
                               for name, (offset, shape) in geometry.regions.items()}
        self._own_workspaces = StreamWorkspaces(geometry.workspace_size, self._ordinal)   # when the caller gives none
        self._lock = threading.Lock()
        g = geometry
        self._prepare_grid = (g.chunks, g.H, 1)
        self._state_pass_grid = (g.N, g.H, g.V // variant.pass_block_v)
        self._output_grid = (g.chunks, g.H, g.V // variant.out_block_v)
        self._token_grid = (_cdiv(g.T, CHUNK), g.H, 1)            # gate_activation: per token block and head
        # bench/linear_attention.py --breakdown sets this to time each launch: hook(name, launch).
        self.launch_hook = None
        self._first_launch = True
        self._launch_plan = None         # _c_launch.LaunchPlan; False: the C path cannot run this plan
        self._c_launch = None            # its TileLaunch; False: none
        self._c_operand_uids = ()

    def _workspace_base(self, ctx: ExecutionContext, stream: int) -> int:
        if ctx.workspace is not None:
            return ctx.workspace.data_ptr
        return self._own_workspaces.address(stream)

    def _regions(self, base: int) -> dict:
        return self._slots_at(self._views, base, self._region_layout)

    def _slots_at(self, store: dict, base: int, layout: dict) -> dict:
        """Slots over the regions of ``layout`` (name -> (byte offset, shape, dtype)) at ``base``, made once an
        address and kept in ``store`` (the last few addresses)."""
        views = store.get(base)
        if views is None:
            from ... import Slot
            views = {name: Slot.from_address(base + offset, shape, None, dtype, self._device)
                     for name, (offset, shape, dtype) in layout.items()}
            with self._lock:
                if len(store) > 8:
                    store.clear()
                store[base] = views
        return views

    def _chunk_cache_regions(self, cache) -> dict:
        """The chunk_cache operand's regions (``_Geometry.cache_regions``) as kernel operands: slots over the
        caller's buffer, or for the C path refs at their offsets into it."""
        from . import _c_launch
        from ..._layout import row_major_strides
        regions = self._geometry.cache_regions
        if isinstance(cache, _c_launch.OperandRef):
            return {name: dataclasses.replace(cache, dtype=dtype, shape=shape, strides=row_major_strides(shape),
                                              add=offset) for name, (offset, shape, dtype) in regions.items()}
        return self._slots_at(self._cache_views, cache.data_ptr, regions)

    def _keep_chunk_cache(self, launches: list, t) -> None:
        """A forward keeping the chunk cache: its prepare launch (whose w, kd and gate sums are the cache's
        regions already) becomes the one that stores T there too. That kernel has no stand-in, so buffers it
        refuses refuse the call."""
        at = {launch[0]: i for i, launch in enumerate(launches)}
        _, grid, kernel, a = launches[at["prepare"]]
        scores_form, plain_form = self._cache_prepares
        if self._fused is not None and kernel is self._fused[0]:
            prepare, args = scores_form, (*a, t)              # the scores' prepare: q, qg and attn, then T
        else:
            prepare, args = plain_form, (a[0], a[1], a[2], a[3], a[5], a[6], a[7], a[8], a[9], t)
        if not prepare.takes(args):
            raise GraphNotSupportedError(
                f"{self.plan.label}: the CuTe prepare that writes the chunk_cache does not take this call's buffers "
                "(each must be packed row-major and 16-byte aligned), and no other kernel writes the cache")
        launches[at["prepare"]] = ("prepare", grid, prepare, args)

    def _gate_launches(self, g, cu, scratch) -> list:
        """Per-channel gates (kda, gdn2) get their in-chunk sums from a launch of their own, except where the
        CuTe chunk_prepare forms them itself."""
        v = self.variant
        if not v.per_channel or v.prepare == "cute":
            return []
        return [("gates", gates_grid(v, self._geometry), self._gates, (g, cu, scratch["g"], *v.gates_constants()))]

    def _gate_inputs(self, slot, scratch) -> tuple:
        """(launches, g, beta): the gate_activation launch where a gate option is on, and the g / beta the
        chunked kernels read (its f32 outputs, or the ports as given)."""
        o = self.variant.gates
        g, beta = slot("g"), slot("beta")
        if not (o.on_gate or o.on_beta):
            return [], g, beta
        launch = ("gate_activation", self._token_grid, self._gate_activation,
                  (g, *self._gate_parameters(slot, scratch), beta, scratch["g_act"], scratch["beta_act"],
                   *self.variant.gate_activation_constants()))
        return [launch], (scratch["g_act"] if o.on_gate else g), (scratch["beta_act"] if o.on_beta else beta)

    def _gate_parameters(self, slot, scratch) -> tuple:
        """a_log and dt_bias, or the f32 stand-ins the kernels never read where one is absent."""
        o = self.variant.gates
        return (slot("a_log") if o.a_log_dtype else scratch["a_log_dummy"],
                slot("dt_bias") if o.dt_bias_dtype else scratch["dt_bias_dummy"])

    def _slot_reader(self, variant_pack):
        """A function from a port name to that port's slot in ``variant_pack`` (the uid -> position map is
        built on the first execute)."""
        slots = variant_pack.slots
        positions = self._positions
        if positions is None:
            positions = self._positions = {u: i for i, u in enumerate(variant_pack.uids)}
        uid = self._uid

        def slot(port):
            return slots[positions[uid[port]]]

        return slot

    def _launch_all(self, stream: int, launches: list) -> None:
        """Launch each (name, grid, kernel, args) in order on ``stream``, through the launch hook if set.
        cuTile compiles (or loads from its caches) each kernel at its first launch: the plan's first
        execute runs inside a compile watch (a log line and progress events), later ones are plain."""
        if self._first_launch:
            self._first_launch = False
            with _progress.compiling(CutileLinearAttentionEngine.name,
                                     f"{self.plan.label} (at its first launch)", logger) as watch:
                self._launch_each(stream, launches)
                self.compile_seconds = watch.elapsed_s
            return
        self._launch_each(stream, launches)

    def _launch_each(self, stream: int, launches: list) -> None:
        import cuda.tile as ct
        hook = self.launch_hook

        def launch(i, on):
            _, grid, kernel, args = launches[i]
            if isinstance(kernel, CuteLaunch):
                kernel(on, grid, args)
            else:
                ct.launch(on, grid, kernel, args)

        schedule = getattr(launches, "schedule", None)
        if schedule is not None and hook is None:
            self.lanes_for(stream).issue(stream, schedule, launch)
            return
        # in order on the caller's stream (a scheduled list's order is a serial one too)
        for i, (name, *_) in enumerate(launches):
            if hook is None:
                launch(i, stream)
            else:
                hook(name, lambda i=i: launch(i, stream))

    def lanes_for(self, stream: int):
        """The ``_lanes.Lanes`` of caller stream ``stream`` (a scheduled plan's side stream and events), made at
        its first call there; the plan keeps the last eight streams'."""
        lanes = self._lanes.get(stream)
        if lanes is None:
            from ..._lanes import Lanes
            with self._lock:
                lanes = self._lanes.get(stream)
                if lanes is None:
                    if len(self._lanes) >= 8:
                        self._lanes.pop(next(iter(self._lanes)))
                    segments = self.variant.segments
                    lanes = self._lanes[stream] = Lanes.create(self._ordinal, _segments.event_count(segments)
                                                               if segments else SIDE_LANE_EVENTS)
        return lanes

    def _initial_state(self, slot, scratch, v: Optional[Variant] = None):
        """The state pass's h0 operand: the initial_state port, or an f32 stand-in it never reads."""
        return slot("initial_state") if (v or self.variant).has_h0 else scratch["state_dummy"]

    def _recompute_launches(self, slot, scratch, ht, v: Optional[Variant] = None) -> tuple:
        """The forward up to its state pass (the gate options, the gate sums, chunk_prepare, chunk_state_pass
        writing the final state to ``ht``), which a backward plan recomputes too: ``(launches, g, beta,
        wgate)``, the last three the gate, beta and write-gate operands the kernels read (v stands in for an
        absent write gate: never read then). ``v``: the variant whose constants the launches take (a segment's
        has_h0 / store_ht; default the plan's)."""
        v = v or self.variant
        k, val, cu = (slot(p) for p in ("k", "v", "cu_seqlens"))
        launches, g, beta = self._gate_inputs(slot, scratch)
        wgate = slot("w") if v.has_w else val
        h0 = self._initial_state(slot, scratch, v)
        launches += [
            *self._gate_launches(g, cu, scratch),
            ("prepare", self._prepare_grid, self._prepare,
             (k, val, g, beta, wgate, cu, scratch["w"], scratch["u"], scratch["g"], scratch["kd"],
              *v.prepare_constants())),
            ("state_pass", self._state_pass_grid, self._state_pass,
             (scratch["kd"], scratch["w"], scratch["u"], scratch["g"], cu, h0, scratch["hs"], ht, scratch["d"],
              *v.state_pass_constants()))]
        return launches, g, beta, wgate

    def _launch_list(self, slot, scratch) -> list:
        """The plan's launches in order, (name, grid, kernel, args), with ``slot(port)`` the operands and
        ``scratch[region]`` the workspace regions (Slots at execute; _c_launch's refs for the C path)."""
        v = self.variant
        if v.checkpoints:
            # the chunk-start states go to the caller's state_checkpoints (one row a chunk, as hs's)
            scratch = {**scratch, "hs": slot("state_checkpoints")}
        if v.segments:
            return _segments.segmented_launches(self, slot, scratch)
        if not v.chunk_cache:
            return self._forward_launches(slot, scratch)
        # the prepare's w, kd and gate sums go to the chunk cache (the state pass reads them there), and T too
        cache = self._chunk_cache_regions(slot("chunk_cache"))
        launches = self._forward_launches(slot, {**scratch, "w": cache["w"], "kd": cache["kd"],
                                                 "g": cache["gate_sums"]})
        self._keep_chunk_cache(launches, cache["t"])
        return launches

    def _forward_launches(self, slot, scratch, v: Optional[Variant] = None) -> list:
        v = v or self.variant
        ht = slot("final_state") if v.store_ht else scratch["state_dummy"]
        launches, g, beta, _ = self._recompute_launches(slot, scratch, ht, v)
        q, k, cu = slot("q"), slot("k"), slot("cu_seqlens")
        if self._fused is not None:
            scores, state_output = self._fused
            h0 = self._initial_state(slot, scratch, v)
            qg, attn = scratch["scores_qg"], scratch["scores_attn"]
            if v.scores == "prepare":
                scores_args = (k, slot("v"), g, beta, cu, scratch["w"], scratch["u"], scratch["g"], scratch["kd"], q,
                               qg, attn)
            else:
                scores_args = (q, k, scratch["g"], cu, qg, attn)
            # hs: the checkpoints where the variant writes them (else qg stands in, never touched)
            fused_args = (scratch["kd"], scratch["w"], scratch["u"], scratch["g"], cu, h0, qg, attn, ht, slot("o"),
                          scratch["hs"] if v.checkpoints else qg)
            if scores.takes(scores_args) and state_output.takes(fused_args):
                # the state pass forms o: it replaces the state pass and the output launches, and the scores
                # come from a launch of their own or from the prepare, in its place
                if v.scores == "prepare":
                    launches[-2] = ("prepare", self._prepare_grid, scores, scores_args)
                    launches[-1] = ("state_output", self._state_pass_grid, state_output, fused_args)
                else:
                    launches[-1] = ("scores", self._prepare_grid, scores, scores_args)
                    launches.append(("state_output", self._state_pass_grid, state_output, fused_args))
                return launches
        launches.append(("output", self._output_grid, self._output,
                         (q, k, scratch["d"], scratch["g"], cu, scratch["hs"], slot("o"), *v.output_constants())))
        return launches

    def execute(self, graph, variant_pack, ctx: ExecutionContext) -> None:
        stream = 0 if ctx.stream is None else int(ctx.stream)
        base = self._workspace_base(ctx, stream)
        launch = self._c_launch
        if launch and self.launch_hook is None:
            # The C path is built (fast_executor): launch its cubins here too, so that an execute with a
            # workspace or overrides does not JIT-compile the same kernels a second time.
            slots, positions = variant_pack.slots, self._pack_positions(variant_pack)
            launch.execute_addresses([slots[positions[u]].data_ptr for u in self._c_operand_uids], base,
                                     stream)
            return
        self._launch_all(stream, self._launches_at(self._slot_reader(variant_pack), base))

    def _launches_at(self, slot, base: int) -> list:
        """The launches of a Python-path execute on the workspace at ``base``."""
        return self._launch_list(slot, self._regions(base))

    # -- the C launch path (engines/cutile/_c_launch.py, src/cudnn_graph/_tile_launch.pyx) -----------------

    def _pack_positions(self, variant_pack) -> dict:
        positions = self._positions
        if positions is None:
            positions = self._positions = {u: i for i, u in enumerate(variant_pack.uids)}
        return positions

    def _workspace_blocks(self, stream: int) -> tuple:
        """(this stream's own workspace block, [(stream, block) of every live one]) for TileLaunch."""
        base = self._own_workspaces.address(stream)
        return base, self._own_workspaces.live()

    def launch_plan(self, layout):
        """The plan's launches prepared for C (``_c_launch.LaunchPlan``: cubins compiled for this device's
        architecture, parameter buffers prebuilt), or None with the reason logged when some launch
        cannot be (the Python path runs it then). Made once; ``describe()`` gives it as plain data."""
        if self._launch_plan is None:
            from . import _c_launch
            try:
                slot, scratch = _c_launch.symbolic_readers(layout, self._uid, self._geometry)
                arch = "sm_%d%d" % _compute_capability(self._ordinal)
                with _progress.compiling(CutileLinearAttentionEngine.name, f"{self.plan.label} (C launch path)",
                                         logger) as watch:
                    self._launch_plan = _c_launch.prepare(self._launch_list(slot, scratch),
                                                          self._geometry.workspace_size, arch)
                    self.compile_seconds = watch.elapsed_s
            except (_c_launch.Unsupported, _c_launch._abi.AbiMismatchError) as exc:
                logger.info("%s keeps the Python launch path: %s", self.plan.label, exc)
                self._launch_plan = False
        return self._launch_plan or None

    def launch_description(self, layout) -> Optional[dict]:
        """What a C runtime needs to launch this plan without Python (issue 24 scope 3), as plain data:
        see ``_c_launch.LaunchPlan.describe``; None where the plan has no C launch path.

        >>> plan.launch_description(graph.compiled_plan().layout)["kernels"][0]["symbol"]   # doctest: +SKIP
        'chunk_prepare_...'
        """
        found = self.launch_plan(layout)
        return None if found is None else found.describe()

    def export_launch(self, kernels) -> tuple:
        """The blob's DSL launch records of this plan (the C runtime's launch with no Python): per kernel of
        ``launch_description``, in launch order, a calling-convention-2 record with its cubin inline, its
        grid, parameter image and the addresses each call writes. ``kernels`` is unused (a cuTile plan
        exports no section 5). () where the plan has no C launch path or no layout yet (not built by a
        graph)."""
        description = None if self.layout is None else self.launch_description(self.layout)
        if description is None:
            return ()
        from ..._plan_launch import CONVENTION_CUTILE_PARAMS, LaunchKernel, TileAddress, TileParams
        from ._c_launch import BASE_ALIGNMENT       # what the kernels assume of the workspace's regions too
        operands = {o["uid"]: o for o in description["operands"]}
        out = []
        for k in description["kernels"]:
            addresses = []
            for a in k["addresses"]:
                uid = a["operand_uid"]
                operand = operands.get(uid)
                addresses.append(TileAddress(a["offset"], uid, a["add"],
                                             BASE_ALIGNMENT if operand is None else operand["alignment"],
                                             "workspace" if operand is None else operand["name"]))
            tile = TileParams(tuple(k["grid"]), bytes(k["param_image"]),
                              tuple(zip(k["param_offsets"], k["param_sizes"])), tuple(addresses),
                              description["workspace_size"], tuple(k["block"]), k["shared_bytes"])
            out.append(LaunchKernel(CONVENTION_CUTILE_PARAMS, (), (), (), k["symbol"], "", code=bytes(k["cubin"]),
                                    tile=tile))
        return tuple(out)

    def fast_executor(self, layout):
        """execute()'s one-call path: pack in Cython and launch every kernel from C on prebuilt parameter
        buffers (``_tile_launch.TileLaunch``), or None where a launch must go through ``ct.launch`` (the C
        path switched off, a launch hook set, a kernel whose layout the C path does not know)."""
        if not C_LAUNCH or layout is None or self.launch_hook is not None:
            return None
        if self._c_launch is None:
            found = self.launch_plan(layout)
            if found is None:
                self._c_launch = False
                return None
            from . import _c_launch
            self._c_launch = _c_launch.load(found, layout, self._workspace_blocks, self._ordinal,
                                            self.lanes_for if found.schedule is not None else None)
            self._c_operand_uids = tuple(u for u, _, _ in found.operands)
        return self._c_launch.execute_mapping if self._c_launch else None


class CutileLinearAttentionEngine(ToolchainGatedEngine):
    """cuTile chunked delta-rule kernels (gdn, kda, gdn2 and their backward ops) on sm_80 and newer."""

    name = "cutile_linear_attention"
    engine_id = CUTILE_BASE
    binds_provisional_strides = True
    toolchain = _toolchain

    def propose_plans(self, graph) -> list[PlanConfig]:
        # The toolchain (cuda.tile's import) is asked after the node checks: a host graph never imports it.
        # The graph tags every decline with the engine's name: the reasons here do not repeat it.
        nodes = graph.nodes
        if len(nodes) != 1:
            raise GraphNotSupportedError(
                f"runs a graph of one {'/'.join(FORWARD_OPS + tuple(BACKWARD_OPS))} node; this graph has "
                f"{len(nodes)} nodes")
        node = nodes[0]
        reason = _support_reason(graph, node)
        if reason is not None:
            raise GraphNotSupportedError(f"node '{node.name}' ({node.op}): {reason}")
        self._require_toolchain()
        if node.op in BACKWARD_OPS:
            from ._backward import backward_variants
            io_dtype = _IO_TYPES[GraphView.of(graph).data_type(node.inputs["q"])]
            variants, sizes = backward_variants(graph, node), {}
            for _, knobs, _ in variants:
                form = (knobs.get("scratch", "f32"), knobs.get("segments", 0))
                sizes[form] = sizes.get(form) or backward_workspace_size(node, io_dtype, *form)
            return [PlanConfig(CUTILE_BASE, knobs={"block_v": BACKWARD_BLOCK_V, **knobs},
                               name=f"cutile_{node.op}_chunk64" + (f"_{suffix}" if suffix else ""),
                               engine=self, priority=priority,
                               workspace_size=sizes[knobs.get("scratch", "f32"), knobs.get("segments", 0)])
                    for suffix, knobs, priority in variants]
        plans = []
        port = checkpoint_port(graph, node)
        if port is not None and port[0] != CHUNK:
            raise GraphNotSupportedError(f"node '{node.name}' ({node.op}): {checkpoint_reason(graph, node, '')}")
        cute_ok = {kernel: _cute_kernels_reason(graph, node, kernel) is None for kernel in FORWARD_KERNEL_KNOBS}
        io_dtype = _IO_TYPES[GraphView.of(graph).data_type(node.inputs["q"])]
        for suffix, extra in (("", {}), *VARIANT_KNOBS.items()):
            knobs = {**DEFAULT_KNOBS, **extra}
            V = node.inputs["v"].dim[2]
            if V % max(knobs["block_v"], knobs["output_block_v"]) or extra.get("output_block_v") == V:
                continue     # a block wider than V, or the same kernels as the default
            if any(knobs[kernel] == "cute" and not ok for kernel, ok in cute_ok.items()):
                continue
            if knobs["scores"] == "prepare" and node.op != "gdn":
                continue     # per-channel scores need the split decays the prepare forms in another order
            if checkpoint_reason(graph, node, _io_scratch(graph, node, knobs) or "float32") is not None:
                continue     # its chunk-start states are not the checkpoints' type
            if chunk_cache_reason(graph, node, knobs) is not None:
                continue
            if knobs["segments"] and (not SEGMENTS_GPU_TESTED or _segment_reason(node, knobs, port) is not None):
                continue
            name = f"cutile_{node.op}_chunk64" + (f"_{suffix}" if suffix else "")
            priority = _forward_priority(suffix, node.op, io_dtype, node.inputs["q"].dim[2], state_pass_ctas(node),
                                         node.inputs["q"].dim[0])
            plans.append(PlanConfig(CUTILE_BASE, knobs=knobs, name=name, engine=self, priority=priority,
                                    workspace_size=_Geometry(node, io_scratch=_io_scratch(graph, node, knobs),
                                                             segments=knobs["segments"]).workspace_size))
        if not plans and node.outputs.get("chunk_cache") is not None:
            why = (chunk_cache_reason(graph, node, {"prepare": "cute", "scratch": "io"})
                   or _cute_kernels_reason(graph, node, "prepare") or "no plan here takes the graph's other options")
            raise GraphNotSupportedError(f"node '{node.name}' ({node.op}): the chunk_cache is written by the CuTe "
                                         f"prepare alone: {why}")
        if not plans and port is not None:
            raise GraphNotSupportedError(f"node '{node.name}' ({node.op}): state_checkpoints is "
                                         f"{port[1] or 'of a type no kernel stores'}; the plans keep their "
                                         "chunk-start states in the input type (FLOAT: the f32_scratch plan)")
        return plans

    def build_plan(self, graph, plan: PlanConfig, ctx: ExecutionContext) -> CompiledPlan:
        node = graph.nodes[0]
        reason = _support_reason(graph, node)
        if reason is not None:
            raise GraphNotSupportedError(f"node '{node.name}' ({node.op}): {reason}")
        self._require_toolchain()
        if node.op in BACKWARD_OPS:
            from ._backward import backward_plan
            return backward_plan(graph, node, plan)
        knobs = {**DEFAULT_KNOBS, **plan.knobs}
        if knobs["scratch"] not in ("f32", "io"):
            raise GraphNotSupportedError(f"scratch={knobs['scratch']!r}; expected 'f32' or 'io'")
        io_scratch = _io_scratch(graph, node, knobs)
        segments = int(knobs["segments"])
        why = _segment_reason(node, knobs, checkpoint_port(graph, node)) if segments else None
        if why is not None:
            raise GraphNotSupportedError(f"node '{node.name}' ({node.op}): {why}")
        geometry = _Geometry(node, io_scratch=io_scratch, fused=knobs["state_form"] == "fused", segments=segments)
        block_v = int(knobs["block_v"])
        if block_v not in FORWARD_BLOCK_VS or geometry.V % block_v:
            raise GraphNotSupportedError(f"block_v={block_v} is not one of {', '.join(map(str, FORWARD_BLOCK_VS))} "
                                         f"dividing V={geometry.V}")
        if knobs["mma"] not in MMA_TYPES:
            raise GraphNotSupportedError(f"mma={knobs['mma']!r}; expected one of {MMA_TYPES}")
        output_block_v = int(knobs["output_block_v"])
        if output_block_v not in (0, 32, 64, 128) or (output_block_v and geometry.V % output_block_v):
            raise GraphNotSupportedError(f"output_block_v={output_block_v} is not 0 or one of 32, 64, 128 "
                                         f"dividing V={geometry.V}")
        for knob in FORWARD_KERNEL_KNOBS:
            _kernel_source(graph, node, knob, knobs[knob])
        form = knobs["state_form"]
        widths = tuple(FUSED_FALLBACK_FORM) if form == "fused" else (64,)
        if form not in STATE_FORMS or (form != "staged" and (knobs["state_pass"] != "cute" or block_v not in widths)):
            raise GraphNotSupportedError(f"state_form={form!r}: one of {STATE_FORMS}, each but 'staged' with "
                                         f"state_pass='cute' and block_v=64 ('fused': 32 or 64); got "
                                         f"state_pass={knobs['state_pass']!r}, block_v={block_v}")
        if knobs["scores"] not in SCORES_SOURCES or (knobs["scores"] == "prepare" and (
                form != "fused" or knobs["prepare"] != "cute" or node.op != "gdn")):
            raise GraphNotSupportedError(f"scores={knobs['scores']!r}: one of {SCORES_SOURCES}, 'prepare' for gdn "
                                         f"with state_form='fused' and prepare='cute'; got op {node.op}, "
                                         f"state_form={form!r}, prepare={knobs['prepare']!r}")
        if knobs["state_form"] == "fused" and knobs["output"] != "cute":
            raise GraphNotSupportedError("state_form='fused' forms o from the CuTe output kernel's scores "
                                         f"(output='cute'); got output={knobs['output']!r}")
        if knobs["state_pass"] == "cute" and not io_scratch:
            raise GraphNotSupportedError("state_pass='cute' reads and writes the scratch in the input type "
                                         f"(scratch='io'); got scratch={knobs['scratch']!r}")
        if knobs["output"] == "cute" and (not io_scratch or output_block_v):
            raise GraphNotSupportedError("output='cute' reads the deltas and states in the input type over all "
                                         f"of V (scratch='io', output_block_v=0); got scratch={knobs['scratch']!r}, "
                                         f"output_block_v={output_block_v}")
        why = checkpoint_reason(graph, node, io_scratch or "float32") or chunk_cache_reason(graph, node, knobs)
        if why is not None:
            raise GraphNotSupportedError(f"node '{node.name}' ({node.op}): {why}")
        low = {"bf16": True, "tf32": False}.get(knobs["mma"])   # None: auto
        # auto with FP16 scratch where the cuTile state pass is the plan's one cuTile kernel with products (CuTe
        # prepare and output): FP16 products, as the CuTe state pass's (session 44, H100, one 32k sequence, K = 64)
        fp16_state = (low is None and io_scratch == "float16" and knobs["state_pass"] == "cutile"
                      and knobs["prepare"] == knobs["output"] == "cute")
        if fp16_state:
            low = True
        variant = dataclasses.replace(variant_of(graph, node, block_v, low_mma=low),
                                      output_block_v=output_block_v or geometry.V,
                                      scratch_dtype=io_scratch or "float32", prepare=knobs["prepare"],
                                      fp16_products=fp16_state,
                                      output=knobs["output"], state_pass=knobs["state_pass"],
                                      state_form=knobs["state_form"], scores=knobs["scores"],
                                      checkpoints=checkpoint_port(graph, node) is not None,
                                      chunk_cache=node.outputs.get("chunk_cache") is not None, segments=segments)
        return CutileForwardPlan(plan, graph, node, variant, geometry)


# The CuTe state pass (one CTA per sequence, value head and 32 value columns, a chain of dependent chunk
# steps) was faster than the cuTile one on the H200 where its CTAs fill the 132 SMs: 89 vs 97 us at 4 x 2048
# tokens, 16 heads, K = V = 128 (256 CTAs), but 809 vs 686 us for one sequence of 32k tokens (64 CTAs), and
# 49 vs 37 us at K = 64 (docs/engines_cutile.md). Its eight-warp form (64 value columns a CTA, half the CTAs,
# W and KD read once for twice the columns) was faster still where the 32-column CTAs fill the SMs (session
# 18, K = V = 128, bf16: 82 vs 91 us at 4 x 2048 x 16 heads, 308 vs 348 at 2 x 8192 x 32, 150 vs 200 on many
# short sequences) and slower where they do not (1024 vs 754 us for one sequence of 32k, 16 heads). Where
# even the 32-column CTAs fill at most half the SMs, 16 columns a CTA (twice the CTAs) was faster (session 23,
# one 32k sequence, 16 heads, bf16, K = V = 128: gdn 603 vs 669 us on the H200, 654 vs 697 on an H100; kda
# 772 vs 849 on the H100) and slower wherever they fill it (175 vs 82 us at 4 x 2048, 785 vs 357 at 2 x 8192
# x 32). The split eight-warp form (KD in its own buffer, fetched a whole step ahead; 53 KB, opted in) gives the
# eight-warp form's bits in less time (session 23, H100, 4 x 2048 x 16 heads, bf16, K = V = 128: the state pass
# 95.3 -> 91.0 us for gdn, 95.9 -> 90.4 for kda). The fused form (the split form forming o itself from a scores
# kernel's q e^gc and attn: no chunk-start states or deltas through global memory, no output kernel) was faster
# than the first plan at every such shape timed (session 24, H100, bf16, K = V = 128, whole forward: 4 x 2048 x 16
# gdn 0.276 -> 0.253 ms, kda 0.380 -> 0.370; 2 x 8192 x 32 gdn 1.049 -> 0.927; 32 short sequences x 16 gdn 0.340
# -> 0.313; fp16 4 x 2048 x 16 gdn 0.281 -> 0.247) and slower where the CTAs are few (one 32k sequence: 1.949
# against 1.347 with 16 columns a CTA) or K = 64 (0.151 against 0.141). The SM count of the H100 SXM and the
# H200, the sm_90 parts measured.
STATE_PASS_FILL = 132


def state_pass_ctas(node) -> int:
    """The state pass's CTAs at 32 value columns a CTA (sequences x value heads x V / 32): what the ranking weighs
    against ``STATE_PASS_FILL``."""
    v = node.inputs["v"]
    return (node.inputs["cu_seqlens"].dim[0] - 1) * v.dim[1] * (v.dim[2] // 32)


# Whether the segmented variants (_segments) have passed their GPU tests (tests/engines/cutile/test_cutile_segments.py):
# until then they are not proposed (an autotune would time them, and select one, with no check of its answers);
# the GPU tests and bench/linear_attention.py --variants switch it on to run them.
SEGMENTS_GPU_TESTED = False
# A segmented variant ranks just above its unsegmented plan where that plan ranks first, for one
# sequence of at least SEGMENTS_FIRST_FROM tokens, with the segment count measured fastest per input type
# (SEGMENTS_FIRST; none: the variants are to pin or time).
SEGMENTS_FIRST: dict = {}
SEGMENTS_FIRST_FROM = 32768


def _forward_priority(suffix: str, op: str, io_dtype: str, K: int, state_pass_ctas: int, tokens: int = 0) -> float:
    """A forward plan variant's rank (higher first). The default ranks first, except where the CuTe kernels
    can run (sm_90): those plans measured faster on the H200 at every case timed (docs/engines_cutile.md).
    ``cute`` (CuTe prepare and output, the cuTile state pass) first, but ``cute_all`` (the CuTe state pass
    too) for FP16 (faster than the cuTile state pass but where noted below) and for K = 128 where the state pass's
    ``state_pass_ctas`` (counted at 32 value columns a CTA) fill the GPU, and there, for BF16 inputs,
    ``cute_all_bv64`` (its eight-warp form) above it and ``cute_all_split`` (that form with KD in a buffer of
    its own, the same bits) above both; where those CTAs fill at most half the GPU, twice the CTAs over 16
    value columns a CTA: ``cute_bv16`` (the cuTile state pass) above ``cute`` for BF16, ``cute_all_bv16`` (the
    CuTe one) above ``cute_all`` for FP16 at K = 128, ``cute_bv16`` (FP16 products) above it at K = 64; for gdn
    in BF16 at K = 64 where four times those CTAs fit one wave, ``cute_bv8`` above ``cute_bv16``.
    Where the CTAs fill the GPU at K = 128, ``cute_all_fused`` (the eight-warp state pass forming o itself) above
    all, for BF16 and FP16, and for gdn ``cute_all_fused_prepare_scores`` (its scores formed by the
    prepare) above that; at K = 64, where the CTAs fill at least half the GPU,
    ``cute_all_fused_bv32_prepare_scores`` (four warps) above ``cute`` and ``cute_all``, BF16 and FP16.
    The other variants are there to be pinned (plan index, a router) or timed."""
    if "_seg" in suffix:
        base, segments = suffix.rsplit("_seg", 1)
        if SEGMENTS_FIRST.get(io_dtype) != int(segments) or tokens < SEGMENTS_FIRST_FROM:
            return 1.0
        unsegmented = _forward_priority(base, op, io_dtype, K, state_pass_ctas)
        best = max(_forward_priority(other, op, io_dtype, K, state_pass_ctas) for other in ("", *VARIANT_KNOBS)
                   if "_seg" not in other)
        return unsegmented + 0.5 if unsegmented == best else 1.0
    fills = K >= 128 and state_pass_ctas >= STATE_PASS_FILL
    few = 2 * state_pass_ctas <= STATE_PASS_FILL
    # gdn, BF16, K = 64 (session 44, H100: kda and K = 128 were slower; session 51, H100, one 32k sequence: FP16
    # 0.802 ms at 8 columns against 0.770 at 16, BF16 0.744 against 0.825)
    if suffix == "cute_bv8":
        one_wave = 4 * state_pass_ctas <= STATE_PASS_FILL
        return 22.0 if one_wave and op == "gdn" and io_dtype == "bfloat16" and K < 128 else 1.0
    if suffix == "cute_bv16":
        # FP16 at K = 64, FP16 products: above cute_all (session 44, H100, one 32k sequence: 0.802 vs 0.893 ms)
        if few and io_dtype == "float16" and K < 128:
            return 26.0
        return 21.0 if few and io_dtype == "bfloat16" else 1.0
    if suffix == "cute_all_bv16":     # FP16, K = 128 (session 43, H100, one 32k sequence: 1.352 vs cute_all's 1.460)
        return 26.0 if few and io_dtype == "float16" and K >= 128 else 1.0
    if suffix == "cute_all":
        return 25.0 if io_dtype == "float16" or fills else 12.0
    if suffix == "cute_all_bv64":     # measured and GPU-tested with BF16 inputs only
        return 30.0 if fills and io_dtype == "bfloat16" else 1.0
    if suffix == "cute_all_split":    # the same bits as cute_all_bv64, its state pass 4.5-5.7% faster (session 23)
        return 31.0 if fills and io_dtype == "bfloat16" else 1.0
    if suffix == "cute_all_fused":    # faster than every other plan where it fills, BF16 and FP16 (session 24)
        return 32.0 if fills else 1.0
    # gdn only (the plans exist for gdn); bit-tested with BF16 inputs; measured in session 25 (H100): 0.229 vs
    # 0.249 ms at 4 x 2048, 0.293 vs 0.312 for 32 short sequences, 0.889 vs 0.927 at 2 x 8192 H 32, and at
    # K = 64 (4 x 2048, 128 CTAs) the 32-column form 0.139 vs cute's 0.141
    if suffix == "cute_all_fused_prepare_scores":     # FP16: its bits test (session 26) before its rank
        return 33.0 if fills else 1.0
    if suffix == "cute_all_fused_bv32_prepare_scores":     # FP16 too (session 43: 0.139 vs cute_all's 0.150)
        half = K < 128 and 2 * state_pass_ctas >= STATE_PASS_FILL
        return 27.0 if half else 1.0
    return {"cute": 20.0, "cute_prepare": 15.0, "": 10.0}.get(suffix, 1.0)


# the ops each CuTe kernel computes ("intra": the backward's chunk_bwd_intra, named by its forward op)
CUTE_OPS = {"prepare": ("gdn", "kda"), "output": ("gdn", "kda"), "state_pass": ("gdn", "kda"), "intra": ("gdn", "kda"),
            "grads": ("gdn", "kda"), "bwd_state": ("gdn", "kda"), "values": ("gdn", "kda")}
FORWARD_KERNEL_KNOBS = ("prepare", "output", "state_pass")     # a forward plan's kernel-source knobs


def _segment_reason(node, knobs, checkpoints) -> str | None:
    """Why the ``segments`` knob cannot apply to this forward (None: it can): one sequence long enough, the
    cuTile state pass in its staged form, neither checkpoints nor a chunk cache (their rows are the call's)."""
    segments = knobs["segments"]
    if knobs["state_pass"] != "cutile" or knobs["state_form"] != "staged":
        return (f"segments={segments} runs the cuTile state pass (state_pass='cutile', state_form='staged'); got "
                f"state_pass={knobs['state_pass']!r}, state_form={knobs['state_form']!r}")
    if checkpoints is not None or node.outputs.get("chunk_cache") is not None:
        return f"segments={segments} writes neither state_checkpoints nor a chunk_cache"
    return _segments.segments_reason(node, segments)


def _cute_kernels_reason(graph, node, kernel: str = "output") -> str | None:
    """Why the CuTe DSL ``kernel`` ("prepare": engines/cute/_delta_prepare; "output": _delta_output;
    "state_pass": _delta_state) cannot stand in for the cuTile one for this node, or None when it can: gdn
    and kda (scalar beta, no write gate; kda's chunk_bwd_intra with BF16 inputs; the prepare also for
    their backward's recompute), on device 0, sm_90, with the DSL installed, the outputs in their schema types."""
    reason = _cute_op_reason(graph, node, kernel)
    if reason is None:
        reason = _cute_device_reason(graph)
    return reason if reason is not None else _cute_output_reason(graph, node)


# the type the op's schema gives each output a CuTe kernel writes ("io": the input type, "beta": beta's)
_CUTE_OUTPUT_TYPES = {"o": "io", "dq": "io", "dk": "io", "dv": "io", "dg": DataType.FLOAT, "dbeta": "beta",
                      "final_state": DataType.FLOAT, "d_initial_state": DataType.FLOAT}


def _cute_output_reason(graph, node) -> str | None:
    """The CuTe kernels write each output in the type the op's schema infers for it (their stores are compiled
    for it); an output the caller set to another type leaves them out, where the cuTile kernels store any."""
    resolve = GraphView.of(graph).data_type
    for port, kind in _CUTE_OUTPUT_TYPES.items():
        t = node.outputs.get(port)
        if t is None:
            continue
        expected = {"io": resolve(node.inputs["q"]), "beta": resolve(node.inputs["beta"])}.get(kind, kind)
        if resolve(t) != expected:
            return (f"the CuTe kernels write {port} as {DataType(expected).name}; this graph sets it to "
                    f"{DataType(resolve(t)).name}")
    return None


# whether the CuTe backward's FP16 forms have passed their GPU tests (they have: H100, session 42): chunk_bwd_grads'
# four score products and kda's chunk_bwd_intra scores take the split decay operands in BF16 (ChunkKernel.split; a
# factor may reach e^80, FP16 overflows past e^11). While False, kda's FP16 chunk_bwd_intra is not offered and FP16's
# every-kernel-in-CuTe plans rank below the f32-scratch recompute (_backward.backward_variants)
FLOAT16_BACKWARD_GPU_TESTED = True


def _cute_op_reason(graph, node, kernel: str) -> str | None:
    """The part of ``_cute_kernels_reason`` the node alone decides (its op and input type)."""
    # a backward's recompute (prepare, state_pass), intra-chunk terms (intra), gradients (grads), reverse state
    # pass (bwd_state) and gradients through the UT transform (values) name the forward op
    op = BACKWARD_OPS.get(node.op, node.op) if kernel in ("prepare", "state_pass", "intra", "grads", "bwd_state",
                                                          "values") else node.op
    if op not in CUTE_OPS[kernel]:
        return f"the CuTe chunk_{kernel} computes {' / '.join(CUTE_OPS[kernel])}, not {node.op}"
    if kernel == "intra" and OP_FEATURES[op][0] and not FLOAT16_BACKWARD_GPU_TESTED and \
            GraphView.of(graph).data_type(node.inputs["q"]) == DataType.HALF:
        return (f"the CuTe chunk_bwd_intra has not yet run {op}'s FP16 inputs on a GPU (its scores take the split "
                f"decays in BF16, as the output's)")
    return None


def _cute_device_reason(graph) -> str | None:
    """The part of ``_cute_kernels_reason`` the device and the installed DSL decide."""
    if graph.device[1] != 0:
        # The DSL's own call launches on the CUDA runtime's current device; the Python launch path has no
        # device switch for these kernels and no second GPU has run them (issue 27).
        return f"the CuTe kernels run on CUDA device 0; this graph is on device {graph.device[1]}"
    try:
        from ..cute import _toolchain as cute_toolchain     # the package refuses to import without the DSL
    except ImportError as exc:
        return str(exc)
    missing = cute_toolchain.missing()
    if missing is not None:
        return missing
    try:
        cc = _compute_capability(graph.device[1])
    except RuntimeError as exc:
        return f"no CUDA device to query ({exc})"
    if cc != (9, 0):
        return f"the CuTe kernels are built for sm_90; device {graph.device[1]} is sm_{cc[0]}{cc[1]}"
    return None


def _kernel_source(graph, node, kernel: str, source: str) -> str:
    """A kernel-source knob's value (``prepare``, ``output``, ``state_pass``: the cuTile kernel or the CuTe
    DSL one), checked: GraphNotSupportedError for an unknown source or a CuTe kernel that cannot run here."""
    if source not in KERNEL_SOURCES:
        raise GraphNotSupportedError(f"{kernel}={source!r}; expected one of {KERNEL_SOURCES}")
    if source == "cute":
        reason = _cute_kernels_reason(graph, node, kernel)
        if reason is not None:
            raise GraphNotSupportedError(f"{kernel}='cute': {reason}")
    return source


def _io_scratch(graph, node, knobs) -> str:
    """The narrow scratch type of a forward plan with ``scratch="io"`` (a 16-bit input), else ""."""
    if knobs.get("scratch") != "io" or node.op in BACKWARD_OPS:
        return ""
    io = _IO_TYPES[GraphView.of(graph).data_type(node.inputs["q"])]
    return io if io in ("bfloat16", "float16") else ""


def checkpoint_port(graph, node) -> tuple | None:
    """(cadence, type name) of the node's ``state_checkpoints`` (a forward's output, a backward's input), or
    None where it has none; the type name is None for a type no kernel stores."""
    backward = node.op in BACKWARD_OPS
    t = (node.inputs if backward else node.outputs).get("state_checkpoints")
    if t is None:
        return None
    return int(node.params.get("checkpoint_every_n_tokens") or 0), _GATE_TYPES.get(GraphView.of(graph).data_type(t))


def chunk_cache_reason(graph, node, knobs) -> str | None:
    """Why a forward plan of these knobs cannot write the node's chunk_cache (None: it can, or there is none):
    the cache holds w and kd in the input type and T, which only the CuTe prepare stores."""
    if node.outputs.get("chunk_cache") is None:
        return None
    if knobs.get("prepare") != "cute" or not _io_scratch(graph, node, knobs):
        return ("the chunk_cache holds the CuTe prepare's w, kd and T in the 16-bit input type: only plans with "
                "prepare='cute' and scratch='io' write it (BF16 / FP16 inputs on sm_90); "
                f"this one has prepare={knobs.get('prepare')!r}, scratch={knobs.get('scratch')!r}")
    return None


def checkpoint_reason(graph, node, hs_dtype: str) -> str | None:
    """Why a plan that keeps its chunk-start states in ``hs_dtype`` cannot take the node's state_checkpoints
    as them (None when it can, or when the node has none): the kernels' states are one a 64-token chunk."""
    port = checkpoint_port(graph, node)
    if port is None:
        return None
    every, dtype = port
    if every != CHUNK:
        return (f"checkpoint_every_n_tokens={every}: the GPU kernels hold the state at each {CHUNK}-token chunk's "
                f"start, so they store and read checkpoints at n = {CHUNK} only (other n: the reference engine)")
    if dtype != hs_dtype:
        return (f"state_checkpoints is {dtype or 'of a type no kernel stores'}; this plan keeps its chunk-start "
                f"states in {hs_dtype}")
    return None


def variant_of(graph, node, block_v: int, low_mma: Optional[bool] = False) -> Variant:
    """The kernel specialisation a node needs (``low_mma=None``: BF16 products for BF16 inputs)."""
    from cudnn_graph.ops._linear_attention import beta_transform, gate_transform, resolved_scale
    resolve = GraphView.of(graph).data_type
    q, v = node.inputs["q"], node.inputs["v"]
    io = _IO_TYPES[resolve(q)]

    def type_of(port):
        t = node.inputs.get(port)
        return None if t is None else _GATE_TYPES[resolve(t)]

    w = node.inputs.get("w")
    params = node.params
    backward = node.op in BACKWARD_OPS
    gates = GateOptions(form=gate_transform(node.op, params), lower_bound=float(params.get("gate_lower_bound") or 0.0),
                        beta_factor=beta_transform(params), g_dtype=type_of("g"), beta_dtype=type_of("beta"),
                        a_log_dtype=type_of("a_log"), dt_bias_dtype=type_of("dt_bias"))
    return Variant(
        # the chunked kernels read beta through gate_activation's f32 output when it is given as logits
        op=BACKWARD_OPS.get(node.op, node.op), io_dtype=io,
        beta_dtype="float32" if gates.on_beta else type_of("beta"),
        w_dtype=_GATE_TYPES[resolve(w)] if w is not None else io,
        K=q.dim[2], V=v.dim[2], block_v=block_v, n_seq=node.inputs["cu_seqlens"].dim[0] - 1,
        scale=resolved_scale(params, q.dim[2]), use_l2=bool(params.get("use_qk_l2norm", False)),
        has_h0=node.inputs.get("initial_state") is not None,
        store_ht="final_state" in node.outputs and not backward,
        low_mma=(io == "bfloat16") if low_mma is None else low_mma,
        has_dht=backward and node.inputs.get("d_final_state") is not None,
        group=v.dim[1] // q.dim[1], gates=gates)
