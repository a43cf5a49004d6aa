"""The cuTile engine's backward plans (gdn_bwd, kda_bwd, gdn2_bwd): the forward recompute, then the gradient
kernels (``_kernels``: chunk_bwd_intra, chunk_bwd_state_pass, chunk_bwd_values, chunk_bwd_grads; their CuTe
forms on sm_90 through ``CuteLaunch``), and the plan built from its knobs (``backward_plan``)."""
from __future__ import annotations

import dataclasses

from ..base import GraphView, PlanConfig
from ...data_type import DataType
from ...errors import GraphNotSupportedError
from . import _c_launch, _segments
from ._cute_launch import CuteLaunch
from ._schedule import side_lane
from ._variants import BLOCK_WARPS, CHUNK, Variant
from ._geometry import BACKWARD_OPS, _Geometry, _cdiv
from .engine import (BACKWARD_BLOCK_V, FLOAT16_BACKWARD_GPU_TESTED, FORWARD_BLOCK_VS, MMA_TYPES, SCRATCH_FORMS,
                     SEGMENTS_FIRST_FROM, VARIANT_KNOBS, _IO_TYPES, CutileForwardPlan, _cute_kernels_reason,
                     _forward_priority, _kernel_source, backward_workspace_size, checkpoint_port, checkpoint_reason,
                     logger, state_pass_ctas, variant_of)


class CutileBackwardPlan(CutileForwardPlan):
    """A built gdn_bwd / kda_bwd / gdn2_bwd plan: the forward recompute, then the dS-free terms per chunk, the
    reverse state pass and the per-chunk gradients in two parts (``_kernels``: chunk_bwd_intra,
    chunk_bwd_state_pass, chunk_bwd_values, chunk_bwd_grads)."""

    def __init__(self, plan: PlanConfig, graph, node, variant: Variant, geometry: _Geometry,
                 f32_twin: "CutileBackwardPlan | None" = None):
        super().__init__(plan, graph, node, variant, geometry)
        # scratch="io": the same kernels on f32 scratch in this plan's workspace, for a call whose buffers a CuTe
        # kernel refuses (no cuTile kernel of the backward reads 16-bit scratch to stand in for it alone)
        self._f32_twin = f32_twin
        self._told_fallback = False
        from . import _kernels
        self._bwd_intra = _kernels.chunk_bwd_intra
        if variant.intra == "cute":
            self._bwd_intra = CuteLaunch.bwd_intra(variant, geometry, self._bwd_intra)
        self._bwd_state_pass = _kernels.chunk_bwd_state_pass
        self._io_scratch = variant.scratch_dtype != "float32"
        if variant.bwd_state == "cute":
            self._bwd_state_pass = CuteLaunch.bwd_state_pass(variant, geometry, self._bwd_state_pass)
        self._bwd_values = _kernels.chunk_bwd_values
        self._bwd_grads = _kernels.chunk_bwd_grads
        if variant.grads == "cute":
            self._bwd_grads = CuteLaunch.bwd_grads(variant, geometry, self._bwd_grads)
        self._cute_values = None
        if variant.values == "cute":
            self._cute_values = (CuteLaunch.prepare_inverse(variant, geometry),
                                 CuteLaunch.bwd_values(variant, geometry))
        self._prepare_intra = CuteLaunch.prepare_inverse_intra(variant, geometry) if variant.intra_in_prepare else None
        # from the checkpoints on 16-bit scratch the values kernel forms U = T (beta v) itself, and no state pass
        # reads u: the prepare neither reads v nor writes u (taken only where the state pass goes): (prepare, the
        # same without u) pairs
        self._prepare_without_u = ()
        if self._cute_values is not None and variant.checkpoints and self._io_scratch:
            self._prepare_without_u = ((self._cute_values[0], CuteLaunch.prepare_inverse(variant, geometry,
                                                                                          store_u=False)),)
            if self._prepare_intra is not None:
                self._prepare_without_u += ((self._prepare_intra,
                                             CuteLaunch.prepare_inverse_intra(variant, geometry, store_u=False)),)
        self._grads_grid = (geometry.chunks, geometry.H, 1)
        # the reverse state pass's CTAs: reverse_width value columns each (the recompute's pass may be narrower too)
        self._reverse_grid = (geometry.N, geometry.H, geometry.V // variant.reverse_width)
        self._group_sum = _kernels.group_sum
        self._group_sum_grid = (_cdiv(geometry.T, CHUNK), geometry.HQ, 1)
        self._gate_activation_bwd = _kernels.gate_activation_bwd
        self._reverse_passes = {(variant.has_dht, variant.has_h0): self._bwd_state_pass}

    def reverse_pass_for(self, v: Variant):
        """The reverse state pass taking ``v``'s state flags (a segment's: whether it starts from a dS and hands one
        on), made once each; the cuTile kernel takes them as constants."""
        if not isinstance(self._bwd_state_pass, CuteLaunch):
            return self._bwd_state_pass
        key = (v.has_dht, v.has_h0)
        found = self._reverse_passes.get(key)
        if found is None:
            from . import _kernels
            found = self._reverse_passes[key] = CuteLaunch.bwd_state_pass(v, self._geometry,
                                                                          _kernels.chunk_bwd_state_pass)
        return found

    def _gradient_targets(self, slot, sc) -> dict:
        """Where chunk_bwd_grads writes dq, dk, dg and dbeta: the ports, or scratch that group_sum /
        gate_activation_bwd read back (grouped value heads, the gate options); and where chunk_bwd_values
        writes the write gate's dw (gdn2; dv in its place otherwise, which the kernel then never writes
        there)."""
        v, o = self.variant, self.variant.gates
        grouped = v.group > 1
        return {"dq": sc["dq_hv"] if grouped else slot("dq"), "dk": sc["dk_hv"] if grouped else slot("dk"),
                "dg": sc["dg_act"] if o.on_gate else slot("dg"),
                "dbeta": sc["dbeta_act"] if o.on_beta else slot("dbeta"),
                "dw": slot("dw") if v.has_w else slot("dv")}

    def _after_launches(self, slot, sc) -> list:
        """group_sum into dq and dk, then gate_activation_bwd, where the variant needs them."""
        v, o = self.variant, self.variant.gates
        launches = []
        if v.group > 1:
            for name in ("dq", "dk"):
                launches.append(("group_sum", self._group_sum_grid, self._group_sum,
                                 (sc[name + "_hv"], slot(name), *v.group_sum_constants())))
        if o.on_gate or o.on_beta:
            a_log, dt_bias = self._gate_parameters(slot, sc)
            d_a_log = slot("d_a_log") if o.a_log_dtype else sc["a_log_dummy"]
            d_dt_bias = slot("d_dt_bias") if o.dt_bias_dtype else sc["dt_bias_dummy"]
            launches.append(("gate_activation_bwd", (self._geometry.H, 1, 1), self._gate_activation_bwd,
                             (slot("g"), a_log, dt_bias, slot("beta"), sc["dg_act"], sc["dbeta_act"], slot("dg"),
                              slot("dbeta"), d_a_log, d_dt_bias, *v.gate_activation_constants())))
        return launches

    def _launch_list(self, slot, sc) -> list:
        if self.variant.segments:
            return _segments.segmented_backward_launches(self, slot, sc)
        launches = self._serial_launch_list(slot, sc)
        if self.variant.overlap:
            # the recompute's state pass on the side stream from the prepare on: chunk_bwd_intra and the reverse pass
            # neither read its states and deltas nor write what it reads (the prepare's w, u, kd, gate sums), and
            # chunk_bwd_values, the first to read hs, waits for it
            return side_lane(launches, "state_pass", after="prepare", join="bwd_values")
        return launches

    def _serial_launch_list(self, slot, sc, v: Variant | None = None) -> list:
        """The plan's launches in order on one stream; ``v``: the variant whose constants and state flags they
        take (a segment's, ``_segments``; default the plan's)."""
        v = v or self.variant
        q, k, val, cu, do = (slot(p) for p in ("q", "k", "v", "cu_seqlens", "dO"))
        dummy = sc["state_dummy"]
        launches, g, beta, wgate = self._recompute_launches(slot, sc, dummy, v)
        out = self._gradient_targets(slot, sc)
        dht = slot("d_final_state") if v.has_dht else dummy
        dh0 = slot("d_initial_state") if v.has_h0 else dummy
        launches += [
            ("bwd_intra", self._prepare_grid, self._bwd_intra,
             (q, k, do, sc["g"], cu, sc["dd"], sc["qg"], *v.bwd_intra_constants())),
            ("bwd_state_pass", self._reverse_grid, self._bwd_state_pass,
             (do, sc["w"], sc["kd"], sc["qg"], sc["g"], cu, dht, sc["dhs"], sc["dd"], dh0,
              *v.bwd_state_pass_constants())),
            ("bwd_values", self._grads_grid, self._bwd_values,
             (k, val, g, beta, wgate, cu, sc["hs"], sc["dd"], sc["w"], sc["u"], sc["g"], slot("dv"), out["dw"],
              sc["qg"], sc["da"], sc["dbeta_v"], *v.bwd_values_constants())),
            ("bwd_grads", self._grads_grid, self._bwd_grads,
             (q, k, g, beta, do, cu, sc["hs"], sc["dhs"], sc["d"], sc["qg"], sc["da"], sc["dbeta_v"],
              *((sc["dq_pre"], sc["dk_pre"]) if self._io_scratch else (sc["kd"], sc["w"])), out["dq"], out["dk"],
              out["dg"], out["dbeta"], *v.bwd_grads_constants())),
            *self._after_launches(slot, sc),
        ]
        if self._cute_values is not None:
            self._take_cute_values(launches, sc)
        if v.checkpoints:
            self._start_from_checkpoints(launches, slot("state_checkpoints"), sc["hs"])
        if v.chunk_cache:
            self._read_chunk_cache(launches, slot("chunk_cache"), sc)
        if self._f32_twin is not None:
            self._check_io_scratch(launches)
        return launches

    def _check_io_scratch(self, launches: list) -> None:
        """scratch="io": every launch over the recompute's scratch but its cuTile state pass (the forward's, which
        reads 16-bit scratch and takes any call: its operands are the workspace's, cu_seqlens and the initial state)
        must be CuTe (no cuTile kernel of the backward reads 16-bit scratch), so a CuTe kernel that refuses the
        buffers (not packed row-major, misaligned, or it did not compile) refuses the plan's 16-bit form for the
        call: IoScratchRefused, which keeps the C path off (it is an Unsupported) and sends a Python-path execute
        to the f32 twin."""
        for name, _, kernel, args in launches:
            if name == "state_pass" and self.variant.state_pass == "cutile":
                continue
            if name in _SCRATCH_LAUNCHES and not (isinstance(kernel, CuteLaunch) and kernel.takes(args)):
                raise IoScratchRefused(f"the CuTe {name} launch refuses this call's buffers; the plan's 16-bit "
                                       "scratch has no cuTile reader")

    def _launches_at(self, slot, base: int) -> list:
        """scratch="io": the f32 twin's launches where a CuTe launch refuses this call's buffers (each of those
        CuTe where it takes them, cuTile where not)."""
        try:
            return super()._launches_at(slot, base)
        except IoScratchRefused as refused:
            if not self._told_fallback:
                self._told_fallback = True
                logger.info("%s: %s; the same kernels on f32 scratch run it", self.plan.label, refused)
            return self._f32_twin._launches_at(slot, base)

    def _take_cute_values(self, launches: list, sc) -> None:
        """``values="cute"``: the recompute's prepare leaves T = (I + A)^-1 in dA's region and the CuTe
        chunk_bwd_values reads it there, so both CuTe launches replace theirs or neither does (a cuTile prepare
        leaves no T). With ``intra_in_prepare`` the prepare that does chunk_bwd_intra's work too goes first, and
        chunk_bwd_intra's launch with it; where it refuses the call's buffers, the prepare that leaves T alone."""
        prepare_inverse, values = self._cute_values
        at = {launch[0]: i for i, launch in enumerate(launches)}
        _, prepare_grid, _, a = launches[at["prepare"]]
        prepare_args = (a[0], a[1], a[2], a[3], a[5], a[6], a[7], a[8], a[9], sc["da"])
        _, values_grid, _, a = launches[at["bwd_values"]]
        values_args = (a[1], a[3], a[5], a[6], a[7], a[8], a[9], a[11], a[13], a[14], a[14], a[15], sc["d"])
        if not values.takes(values_args):
            return
        prepare, args = prepare_inverse, prepare_args
        if self._prepare_intra is not None:
            # intra_in_prepare: the prepare takes chunk_bwd_intra's q, dO, P and qg too, and its launch goes
            _, _, _, b = launches[at["bwd_intra"]]
            fused_args = (*prepare_args, b[0], b[2], b[5], b[6])
            if self._prepare_intra.takes(fused_args):
                prepare, args = self._prepare_intra, fused_args
        if prepare is prepare_inverse and not prepare_inverse.takes(prepare_args):
            return
        launches[at["prepare"]] = ("prepare", prepare_grid, prepare, args)
        launches[at["bwd_values"]] = ("bwd_values", values_grid, values, values_args)
        if prepare is not prepare_inverse:
            del launches[at["bwd_intra"]]

    def _start_from_checkpoints(self, launches: list, checkpoints, hs) -> None:
        """The forward's checkpoints as the chunk-start states: chunk_bwd_values and chunk_bwd_grads read them
        where the recompute's state pass would have left hs, and that launch goes (chunk_bwd_values forms the
        deltas, ``variant.checkpoints``). Where the CuTe values kernel did not take this call's buffers, or a
        CuTe launch refuses the checkpoints' buffer, the state pass stays: the same states, recomputed."""
        at = {launch[0]: i for i, launch in enumerate(launches)}
        values = launches[at["bwd_values"]][2]
        if "state_pass" not in at or not isinstance(values, CuteLaunch) or values is not self._cute_values[1]:
            return
        moved = {}
        for name in ("bwd_values", "bwd_grads"):
            _, grid, kernel, args = launches[at[name]]
            args = tuple(checkpoints if a is hs else a for a in args)
            if isinstance(kernel, CuteLaunch) and not kernel.takes(args):
                return
            moved[name] = (name, grid, kernel, args)
        for name, launch in moved.items():
            launches[at[name]] = launch
        _, grid, prepare, args = launches[at["prepare"]]
        for with_u, without_u in self._prepare_without_u:
            if prepare is with_u:
                launches[at["prepare"]] = ("prepare", grid, without_u, args)
        del launches[at["state_pass"]]

    def _read_chunk_cache(self, launches: list, cache, sc) -> None:
        """The forward's chunk cache in place of the recompute's prepare: the later kernels read its gate sums, w
        and kd where the prepare would have left them, and chunk_bwd_values its T, and the prepare's launch goes.
        Only where the backward starts from the checkpoints with the CuTe values kernel (no state pass needs u),
        and every launch takes the cache's buffers; otherwise the prepare forms the same factors again."""
        at = {launch[0]: i for i, launch in enumerate(launches)}
        values = launches[at["bwd_values"]][2]
        if "state_pass" in at or "bwd_intra" not in at or self._cute_values is None \
                or values is not self._cute_values[1]:
            return
        regions = self._chunk_cache_regions(cache)
        swap = {id(sc["g"]): regions["gate_sums"], id(sc["w"]): regions["w"], id(sc["kd"]): regions["kd"]}
        moved = []
        for name, grid, kernel, args in launches:
            if name == "prepare":
                continue
            args = tuple(swap.get(id(a), a) for a in args)
            if kernel is values:
                args = (*args[:9], regions["t"], *args[10:])     # T from the cache, dA still to its region
            if isinstance(kernel, CuteLaunch) and not kernel.takes(args):
                return
            moved.append((name, grid, kernel, args))
        launches[:] = moved


class IoScratchRefused(_c_launch.Unsupported):
    """A scratch="io" plan's CuTe launch refuses a call's buffers (the Python path runs the f32 twin)."""


# the launches a scratch="io" plan runs only in CuTe: those over the recompute's w, u, kd, d and hs (16-bit), and
# chunk_bwd_intra (its buffers are the gradient kernels' too: a call it refuses, they refuse)
_SCRATCH_LAUNCHES = ("prepare", "state_pass", "bwd_intra", "bwd_state_pass", "bwd_values", "bwd_grads")

# a backward plan's kernel-source knobs ("state_pass": its forward recompute's)
BACKWARD_KERNEL_KNOBS = ("prepare", "state_pass", "intra", "bwd_state", "values", "grads")

# the ops whose CuTe chunk_bwd_grads has passed its GPU tests (tests/engines/cutile/test_cutile_cute_kernels.py):
# their plans with it rank first (kda's per-channel _delta_bwd_grads_per_channel: session 28, on the H100)
CUTE_GRADS_GPU_TESTED = ("gdn", "kda")
# whether scratch="io_all" (the backward's own scratch in the input type too) has passed its GPU tests
# (test_cutile_cute_kernels.py's 16-bit scratch cases, the C path's bitwise test): it then ranks first (session 30,
# H100: all passed; gdn 0.924 / kda 1.542 ms against the io plan's 1.118 / 1.705 at 4 x 2048, H 16, K = V = 128)
IO_ALL_GPU_TESTED = True
# whether the eight-warp CuTe chunk_bwd_grads (knob grads_warps=8) has passed its GPU tests and timed faster than
# the four-warp one: its plan then ranks first (session 31, H100: all passed, the whole suite with it first too;
# gdn 0.863 / kda 1.240 ms against io_all's 0.947 / 1.573 at 4 x 2048, H 16, K = V = 128)
GRADS_W8_GPU_TESTED = True
# whether chunk_bwd_values in eight-warp CTAs too (knob values_warps=8: two CTAs an SM at K = V = 128, sixteen warps
# instead of eight) has passed its GPU tests and timed faster: its plan then ranks first. Session 32 (H100): its
# GPU tests passed, but it timed no faster (chunk_bwd_values 0.130 against 0.127 ms; gdn 0.864 / kda 1.247 against
# 0.860 / 1.238 at 4 x 2048, H 16, K = V = 128), so it stays below the default
VALUES_W8_GPU_TESTED = False
# whether the recompute's state pass in cuTile over 8 or 16 value columns a CTA (knob state_pass_block_v, plans
# cute_all_io_all_w8_tile_pass_bv8 / _bv16) has passed its GPU tests: it then ranks first where the forward ranks
# that pass first (few sequences x heads: its CTAs fill the SMs where the CuTe pass's 32-column CTAs leave most idle)
TILE_PASS_GPU_TESTED = True
# whether the recompute's state pass on a side stream (knob overlap: beside chunk_bwd_intra and the reverse state
# pass, two chains of dependent chunk steps that each leave most of an SM idle; _schedule.side_lane) has passed its
# GPU tests (tests/engines/cutile/test_cutile_backward_overlap.py): its plans are proposed only then, for a backward
# that recomputes its states (one from the checkpoints runs no state pass). OVERLAP_FIRST: the OVERLAP_BASES whose
# twin timed faster, which then ranks just above its plan where that one ranks first
OVERLAP_GPU_TESTED = False
OVERLAP_FIRST = ()
OVERLAP_BASES = ("cute_all_io_all_w8", "cute_all_io_all_w8_tile_pass_bv8", "cute_all_io_all_w8_tile_pass_bv16",
                 "cute_all_io_all_w8_tile_pass_bv8_rev16", "cute_all_io_all_w8_tile_pass_bv16_rev16")
# whether the reverse state pass over 16 value columns a CTA (knob reverse_block_v; plans
# cute_all_io_all_w8_tile_pass_bv8_rev16 / _bv16_rev16: where the forward runs its narrow pass, few sequences x
# heads leave the reverse pass's 32-column CTAs on a few SMs, 64 at one 32k sequence, 16 heads, K = 128) has passed
# its GPU tests (test_cutile_cute_kernels.py -k narrow_reverse): proposed only then. REVERSE_NARROW_FIRST: those
# timed faster than their plan, which then rank just above it where it ranks first
REVERSE_NARROW_GPU_TESTED = False
REVERSE_NARROW_FIRST = ()
# whether a segmented backward (knob segments, 4 or 8: one long sequence's reverse pass in segments on a side stream,
# each segment's chunk_bwd_values and chunk_bwd_grads behind it and the recompute's state pass beside it; plans
# <base>_seg4 / _seg8 of SEGMENT_BASES; _segments.segmented_backward_launches) has passed its GPU tests
# (test_cutile_segments_backward.py): proposed only then. BACKWARD_SEGMENTS_FIRST: the plans timed faster than their
# base, which then rank just above it where it ranks first, from SEGMENTS_FIRST_FROM tokens
BACKWARD_SEGMENTS_GPU_TESTED = False
BACKWARD_SEGMENTS_FIRST = ()
SEGMENT_BASES = OVERLAP_BASES
# the reverse pass's widths: the CuTe pass's (engines/cute/_delta_state.WARPS_OF_BV), which the cuTile one takes too
REVERSE_BLOCK_VS = (16, 32, 64)


def forward_tile_pass_width(graph, node) -> int:
    """The value columns a CTA (8 or 16) of the cuTile state pass that this backward's forward ranks first
    (``cute_bv8``, ``cute_bv16``), or 0 where its first plan runs another state pass."""
    op, q = BACKWARD_OPS[node.op], node.inputs["q"]
    io, ctas = _IO_TYPES[GraphView.of(graph).data_type(q)], state_pass_ctas(node)
    first = max(("", *VARIANT_KNOBS), key=lambda suffix: _forward_priority(suffix, op, io, q.dim[2], ctas, q.dim[0]))
    return {"cute_bv8": 8, "cute_bv16": 16}.get(first.split("_seg")[0], 0)


def backward_variants(graph, node) -> list:
    """The backward plans this graph can have, as (name suffix, knobs, rank: higher first).

    The default (TF32 products) ranks first where no CuTe kernel can run (not sm_90, gdn2); there, ``auto``
    (BF16 / FP16 products where they are safe) is to pin. The recompute's prepare with chunk_bwd_intra in CuTe
    (``cute_prepare_intra``) ranks above the default (7-9% faster on the H200, session 19). On sm_90 the more
    kernels in CuTe the faster (H100, sessions 27-28, GPU ms; docs/engines_cutile.md "The backward"). With BF16
    inputs ``cute_all_io_all_w8`` ranks first: every kernel in CuTe, all scratch in the input type (a call whose
    buffers a CuTe kernel refuses runs on its f32 twin, ``CutileBackwardPlan._launches_at``), chunk_bwd_grads in
    eight-warp CTAs; at 4 x 2048, H 16, K = V = 128 gdn 0.863 and kda 1.240 ms (H100, session 31), 0.834 / 1.219
    once its gradient kernels issued the norm's loads together (session 32, the sum of its kernels); then
    ``cute_all_io_all`` (the same with four-warp chunk_bwd_grads: 0.947 / 1.573 in that run, 0.924 / 1.542 in
    session 30's), ``cute_all_io`` (the recompute's scratch
    alone in the input type: 1.118 / 1.705, against 2.348 and 2.869 for the first plan of session 26) and
    ``cute_all`` (the same on f32 scratch: 1.396 / 2.044). FP16 inputs rank the same once
    ``FLOAT16_BACKWARD_GPU_TESTED`` (session 42, H100: gdn's backward from the forward's checkpoints 0.731 ms and
    with its chunk cache 0.660, against 2.388 / 2.359 for the f32-scratch recompute that ranked first before). Where
    the forward's first plan runs the cuTile state pass over 8 or 16 value columns a CTA (few sequences x heads:
    ``forward_tile_pass_width``), ``cute_all_io_all_w8_tile_pass_bv8`` / ``_bv16`` rank above it: the same plan with
    that pass in the recompute (``TILE_PASS_GPU_TESTED``; docs/engines_cutile.md, "Session 45"). Where
    the op's CuTe chunk_bwd_grads has not passed its GPU tests (``CUTE_GRADS_GPU_TESTED``), the plan with its
    cuTile one (``cute_all_tile_grads``) ranks first instead. Kept to pin or time:

    - ``cute_all_tile_state``: the cuTile reverse state pass, which has more CTAs in flight where the sequences
      are few (one 32k sequence: 2.47 / 2.69 ms for gdn / kda against the CuTe pass's 3.32 / 3.86);
    - the plans with fewer CuTe kernels (each measured slower than ``cute_all``);
    - GPU-tested and timed in session 32 (H100, 4 x 2048, H 16, K = V = 128: gdn / kda ms against the first plan's
      0.860 / 1.238; bench/results/linear_attention-h100-session32-bwd-forms.txt), none faster:
      ``cute_all_io_all_w8_values_w8`` (chunk_bwd_values in eight-warp CTAs too: 0.864 / 1.247);
      ``cute_all_io_all_w8_bv64`` and ``cute_all_io_all_w8_values_w8_bv64`` (both state passes over 64 value
      columns a CTA in eight warps: 0.878 / 1.266 and 0.884 / 1.270; the reverse pass 0.175 against 0.155);
      ``cute_all_io_all_w8_intra_in_prepare`` (the recompute's CuTe prepare doing chunk_bwd_intra's work,
      ``DeltaPrepareInverseIntra``: gdn 0.859, kda 1.335, its fused prepare 0.396 against 0.184 + 0.117) and
      ``cute_all_io_all_w8_values_w8_intra_in_prepare`` (0.861 / 1.338).
    """
    variants = [("", {"mma": "tf32"}, 10.0), ("auto", {"mma": "auto"}, 1.0)]
    cute = {kernel: _cute_kernels_reason(graph, node, kernel) is None
            for kernel in ("prepare", "intra", "grads", "bwd_state", "values", "state_pass")}
    if cute["prepare"]:
        variants.append(("cute_prepare", {"mma": "tf32", "prepare": "cute"}, 5.0))
    if cute["intra"]:
        variants.append(("cute_intra", {"mma": "tf32", "intra": "cute"}, 4.0))
    if cute["prepare"] and cute["intra"]:
        both = {"mma": "tf32", "prepare": "cute", "intra": "cute"}
        variants.append(("cute_prepare_intra", both, 16.0))
        if cute["grads"]:
            variants.append(("cute_prepare_intra_grads", {**both, "grads": "cute"}, 1.5))
        if cute["bwd_state"]:
            variants.append(("cute_prepare_intra_state", {**both, "bwd_state": "cute"}, 1.4))
            if cute["grads"]:
                variants.append(("cute_prepare_intra_grads_state",
                                 {**both, "bwd_state": "cute", "grads": "cute"}, 1.6))
        if cute["values"]:
            values = {**both, "values": "cute"}
            variants.append(("cute_prepare_intra_values", values, 1.3))
            but_state = {**values, **({"grads": "cute"} if cute["grads"] else {})}
            every = {**but_state, **({"bwd_state": "cute"} if cute["bwd_state"] else {})}
            # FP16's every-kernel-in-CuTe plans rank first only once their GPU tests pass
            tested_type = GraphView.of(graph).data_type(node.inputs["q"]) == DataType.BFLOAT16 or \
                FLOAT16_BACKWARD_GPU_TESTED
            op = BACKWARD_OPS.get(node.op, node.op)
            grads_tested = cute["grads"] and op in CUTE_GRADS_GPU_TESTED and tested_type
            variants.append(("cute_all", every, 20.0 if tested_type and (grads_tested or not cute["grads"]) else 1.7))
            if every != but_state:
                variants.append(("cute_all_tile_state", but_state, 1.65))
            if cute["grads"]:
                # every kernel in CuTe but chunk_bwd_grads: the first plan where the CuTe one is not yet GPU-tested
                variants.append(("cute_all_tile_grads", {**every, "grads": "cutile"},
                                 20.0 if tested_type and not grads_tested else 1.6))
            if every.get("grads") == every.get("bwd_state") == "cute" and cute["state_pass"]:
                variants.append(("cute_all_io", {**every, "state_pass": "cute", "scratch": "io"},
                                 25.0 if grads_tested else 1.8))
                # the backward's own scratch in 16 bits too: first once GPU-tested
                variants.append(("cute_all_io_all", {**every, "state_pass": "cute", "scratch": "io_all"},
                                 26.0 if grads_tested and IO_ALL_GPU_TESTED else 1.85))
                # chunk_bwd_grads in eight-warp CTAs (four warps a scheduler instead of two)
                w8 = {**every, "state_pass": "cute", "scratch": "io_all", "grads_warps": 8}
                variants.append(("cute_all_io_all_w8", w8, 27.0 if grads_tested and GRADS_W8_GPU_TESTED else 1.84))
                # its recompute's state pass in cuTile over 8 or 16 value columns a CTA: first where the forward's
                # first plan runs that pass (TILE_PASS_GPU_TESTED)
                width = forward_tile_pass_width(graph, node)
                for narrow, rank in ((8, 1.78), (16, 1.77)):
                    first = narrow == width and grads_tested and GRADS_W8_GPU_TESTED and TILE_PASS_GPU_TESTED
                    knobs = {**w8, "state_pass": "cutile", "state_pass_block_v": narrow}
                    variants.append((f"cute_all_io_all_w8_tile_pass_bv{narrow}", knobs, 27.5 if first else rank))
                    if REVERSE_NARROW_GPU_TESTED:
                        # its reverse pass over 16 value columns a CTA too: twice the CTAs where they are few
                        reverse = f"cute_all_io_all_w8_tile_pass_bv{narrow}_rev16"
                        variants.append((reverse, {**knobs, "reverse_block_v": 16},
                                         27.6 if first and reverse in REVERSE_NARROW_FIRST else rank - 0.005))
                values_w8 = {**w8, "values_warps": 8}
                variants.append(("cute_all_io_all_w8_values_w8", values_w8,
                                 28.0 if grads_tested and GRADS_W8_GPU_TESTED and VALUES_W8_GPU_TESTED else 1.83))
                variants.append(("cute_all_io_all_w8_bv64", {**w8, "block_v": 64}, 1.82))
                variants.append(("cute_all_io_all_w8_values_w8_bv64", {**values_w8, "block_v": 64}, 1.81))
                # the recompute's prepare doing chunk_bwd_intra's work (one launch and one read of k and g less), alone
                # and with the eight-warp values kernel
                variants.append(("cute_all_io_all_w8_intra_in_prepare", {**w8, "intra_in_prepare": True}, 1.80))
                variants.append(("cute_all_io_all_w8_values_w8_intra_in_prepare",
                                 {**values_w8, "intra_in_prepare": True}, 1.79))
    # value blocks of 64 in the reverse state pass, chunk_bwd_values and chunk_bwd_grads (fewer, wider loads; half
    # the reverse pass's CTAs; no spill in the sm_90 cubins at K = 128, 128 would spill 2.7 KB a thread in
    # chunk_bwd_grads): to pin or time
    variants += [(f"{suffix}_bv64" if suffix else "bv64", {**knobs, "block_v": 64}, 2.0)
                 for suffix, knobs, priority in variants if suffix in ("", "cute_prepare_intra")]
    if OVERLAP_GPU_TESTED and checkpoint_port(graph, node) is None:
        variants += _overlap_variants(variants)
    if BACKWARD_SEGMENTS_GPU_TESTED:
        variants += _segment_variants(graph, node, variants)
    return variants


def backward_segments_reason(graph, node, segments: int) -> str | None:
    """Why ``segments`` cannot apply to this backward (None: it can): one sequence long enough, whose states it
    recomputes (no checkpoints or chunk cache to read)."""
    if checkpoint_port(graph, node) is not None or node.inputs.get("chunk_cache") is not None:
        return f"segments={segments} recomputes the states; this backward reads the forward's checkpoints"
    return _segments.segments_reason(node, segments)


def _segment_variants(graph, node, variants: list) -> list:
    """The ``_seg4`` / ``_seg8`` twins of the SEGMENT_BASES plans among ``variants``, where the graph is one
    sequence long enough: just above their plan where it ranks first, the twin is in BACKWARD_SEGMENTS_FIRST and
    the sequence is at least SEGMENTS_FIRST_FROM tokens, else below the default (to pin or time)."""
    best = max(rank for _, _, rank in variants)
    long_enough = node.inputs["q"].dim[0] >= SEGMENTS_FIRST_FROM
    out = []
    for suffix, knobs, rank in variants:
        if suffix not in SEGMENT_BASES:
            continue
        for count in (4, 8):
            if backward_segments_reason(graph, node, count) is None:
                name = f"{suffix}_seg{count}"
                first = name in BACKWARD_SEGMENTS_FIRST and rank == best and long_enough
                out.append((name, {**knobs, "segments": count}, rank + 0.3 if first else 1.74))
    return out


def _overlap_variants(variants: list) -> list:
    """The ``_overlap`` twins of the OVERLAP_BASES plans among ``variants``: just above their plan where it ranks
    first and is in OVERLAP_FIRST, else below the default (to pin or time)."""
    best = max(rank for _, _, rank in variants)
    return [(f"{suffix}_overlap", {**knobs, "overlap": True},
             rank + 0.25 if suffix in OVERLAP_FIRST and rank == best else 1.76)
            for suffix, knobs, rank in variants if suffix in OVERLAP_BASES]


def backward_plan(graph, node, plan: PlanConfig) -> CutileBackwardPlan:
    """A backward plan built from its knobs: ``block_v``, ``mma``, the kernel sources and ``scratch`` ("f32", or
    "io": the recompute's w, u, kd, d and hs in the input type, where every kernel is CuTe)."""
    block_v = int(plan.knobs.get("block_v", BACKWARD_BLOCK_V))
    V = node.inputs["v"].dim[2]
    if block_v not in (32, 64, 128) or V % block_v:
        raise GraphNotSupportedError(f"block_v={block_v} is not one of 32, 64, 128 dividing V={V}")
    mma = plan.knobs.get("mma", "tf32")
    if mma not in MMA_TYPES:
        raise GraphNotSupportedError(f"mma={mma!r}; expected one of {MMA_TYPES}")
    low = {"bf16": True, "tf32": False}.get(mma)   # None: auto
    sources = {kernel: _kernel_source(graph, node, kernel, plan.knobs.get(kernel, "cutile"))
               for kernel in BACKWARD_KERNEL_KNOBS}
    variant = dataclasses.replace(variant_of(graph, node, block_v, low_mma=low), **sources)
    if variant.values == "cute" and variant.prepare != "cute":
        raise GraphNotSupportedError("values='cute' reads T = (I + A)^-1 from the CuTe prepare; it needs "
                                     f"prepare='cute' too (got prepare={variant.prepare!r})")
    if plan.knobs.get("intra_in_prepare", False):
        needs = {kernel: getattr(variant, kernel) for kernel in ("prepare", "intra", "values")}
        if set(needs.values()) != {"cute"}:
            raise GraphNotSupportedError("intra_in_prepare=True is the CuTe prepare doing chunk_bwd_intra's work: it "
                                         "needs prepare, intra and values 'cute' (this plan has "
                                         f"{', '.join(f'{k}={v!r}' for k, v in needs.items())})")
        variant = dataclasses.replace(variant, intra_in_prepare=True)
    for kernel in ("grads", "values"):
        knob = f"{kernel}_warps"
        warps = plan.knobs.get(knob, 4)
        if warps == 4:
            continue
        if getattr(variant, kernel) != "cute":
            raise GraphNotSupportedError(f"{knob}={warps!r} needs the CuTe chunk_bwd_{kernel} ({kernel}='cute'); "
                                         f"this plan has {kernel}={getattr(variant, kernel)!r}")
        if warps not in BLOCK_WARPS:
            raise GraphNotSupportedError(f"{knob}={warps!r}; expected one of {BLOCK_WARPS}")
        variant = dataclasses.replace(variant, **{knob: warps})
    pass_width = int(plan.knobs.get("state_pass_block_v", 0))
    if pass_width:
        if variant.state_pass != "cutile" or pass_width not in FORWARD_BLOCK_VS or V % pass_width:
            raise GraphNotSupportedError(
                f"state_pass_block_v={pass_width}: the recompute's cuTile state pass (state_pass='cutile') over one "
                f"of {', '.join(map(str, FORWARD_BLOCK_VS))} value columns dividing V={V}; got "
                f"state_pass={variant.state_pass!r}")
        variant = dataclasses.replace(variant, state_pass_block_v=pass_width)
    reverse_width = int(plan.knobs.get("reverse_block_v", 0))
    if reverse_width:
        if reverse_width not in REVERSE_BLOCK_VS or V % reverse_width:
            raise GraphNotSupportedError(f"reverse_block_v={reverse_width}: the reverse state pass's value columns a "
                                         f"CTA, one of {', '.join(map(str, REVERSE_BLOCK_VS))} dividing V={V}")
        variant = dataclasses.replace(variant, reverse_block_v=reverse_width)
    segments = int(plan.knobs.get("segments", 0))
    if segments:
        why = backward_segments_reason(graph, node, segments)
        if why is not None:
            raise GraphNotSupportedError(f"node '{node.name}' ({node.op}): {why}")
        variant = dataclasses.replace(variant, segments=segments)
    overlap = plan.knobs.get("overlap", False)
    if overlap not in (False, True):
        raise GraphNotSupportedError(f"overlap={overlap!r}; expected True or False")
    if overlap and segments:
        raise GraphNotSupportedError(f"segments={segments} runs the recompute's state pass beside the reverse pass "
                                     "already; overlap=True is the unsegmented backward's")
    variant = dataclasses.replace(variant, overlap=bool(overlap))
    scratch = plan.knobs.get("scratch", "f32")
    if scratch not in SCRATCH_FORMS:
        raise GraphNotSupportedError(f"scratch={scratch!r}; expected one of {', '.join(map(repr, SCRATCH_FORMS))}")

    def reading_checkpoints(v: Variant) -> Variant:
        # the CuTe chunk_bwd_values forms the deltas a backward from the checkpoints needs; other plans, and
        # checkpoints of another cadence or type than the plan's chunk-start states, recompute those states
        reuse = v.values == "cute" and checkpoint_reason(graph, node, v.scratch_dtype) is None \
            and checkpoint_port(graph, node) is not None
        return dataclasses.replace(v, checkpoints=reuse)

    def reading_cache(v: Variant) -> Variant:
        # the forward's chunk cache (T and w, kd in the input type) stands in for the prepare of a backward from the
        # checkpoints whose own scratch is in the input type too, where the prepare does no other kernel's work
        use = v.checkpoints and v.own_dtype == v.io_dtype and not v.intra_in_prepare \
            and node.inputs.get("chunk_cache") is not None
        return dataclasses.replace(v, chunk_cache=use)

    if scratch == "f32":
        if variant.state_pass == "cute":
            raise GraphNotSupportedError("state_pass='cute' in a backward reads the recompute's scratch in the "
                                         "input type: it needs scratch='io'")
        return CutileBackwardPlan(plan, graph, node, reading_checkpoints(variant),
                                  _Geometry(node, backward=True, segments=variant.segments))
    # the backward's cuTile kernels read f32 scratch: with 16-bit scratch every kernel is CuTe but the recompute's
    # state pass (the forward's cuTile one reads 16-bit scratch)
    cutile = [kernel for kernel, source in sources.items() if source != "cute" and kernel != "state_pass"]
    if cutile:
        raise GraphNotSupportedError(f"scratch={scratch!r} in a backward needs every kernel but the state pass in "
                                     f"CuTe; {', '.join(cutile)} are 'cutile'")
    twin = CutileBackwardPlan(plan, graph, node, reading_checkpoints(dataclasses.replace(variant, state_pass="cutile")),
                              _Geometry(node, backward=True, segments=variant.segments))
    own = scratch == "io_all"
    geometry = _Geometry(node, backward=True, io_scratch=variant.io_dtype, io_backward=own, segments=variant.segments)
    # room for the twin's too
    geometry.workspace_size = backward_workspace_size(node, variant.io_dtype, scratch, variant.segments)
    # a cuTile state pass on 16-bit scratch takes products of the scratch's type, as the forward's plans with it
    products = {"low_mma": True, "fp16_products": variant.io_dtype == "float16"} if variant.state_pass == "cutile" \
        else {}
    narrow = dataclasses.replace(variant, scratch_dtype=variant.io_dtype,
                                 own_dtype=variant.io_dtype if own else "float32", **products)
    return CutileBackwardPlan(plan, graph, node, reading_cache(reading_checkpoints(narrow)), geometry, twin)
