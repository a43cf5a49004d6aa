"""The cuTile engine's backward plans (gdn_bwd, kda_bwd, gdn2_bwd): the forward recompute, then the gradient
kernels (``_kernels``: chunk_bwd_intra, chunk_bwd_state_pass, chunk_bwd_values, chunk_bwd_grads; their CuTe
forms on sm_90 through ``CuteLaunch``), and the plan built from its knobs (``backward_plan``)."""
from __future__ import annotations

import dataclasses

from ..base import PlanConfig
from ...errors import GraphNotSupportedError
from ._cute_launch import CuteLaunch
from ._variants import CHUNK, Variant
from .engine import (BACKWARD_BLOCK_V, MMA_TYPES, CutileForwardPlan, _cdiv, _Geometry, _kernel_source,
                     variant_of)


class CutileBackwardPlan(CutileForwardPlan):
    """A built gdn_bwd / kda_bwd / gdn2_bwd plan: the forward recompute, then the dS-free terms per chunk, the
    reverse state pass and the per-chunk gradients in two parts (``_kernels``: chunk_bwd_intra,
    chunk_bwd_state_pass, chunk_bwd_values, chunk_bwd_grads)."""

    def __init__(self, plan: PlanConfig, graph, node, variant: Variant, geometry: _Geometry):
        super().__init__(plan, graph, node, variant, geometry)
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
        self._grads_grid = (geometry.chunks, geometry.H, 1)
        self._group_sum = _kernels.group_sum
        self._group_sum_grid = (_cdiv(geometry.T, CHUNK), geometry.HQ, 1)
        self._gate_activation_bwd = _kernels.gate_activation_bwd

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
        v = self.variant
        q, k, val, cu, do = (slot(p) for p in ("q", "k", "v", "cu_seqlens", "dO"))
        dummy = sc["state_dummy"]
        launches, g, beta, wgate = self._recompute_launches(slot, sc, dummy)
        out = self._gradient_targets(slot, sc)
        dht = slot("d_final_state") if v.has_dht else dummy
        dh0 = slot("d_initial_state") if v.has_h0 else dummy
        launches += [
            ("bwd_intra", self._prepare_grid, self._bwd_intra,
             (q, k, do, sc["g"], cu, sc["dd"], sc["qg"], *v.bwd_intra_constants())),
            ("bwd_state_pass", self._state_pass_grid, self._bwd_state_pass,
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
        if self._io_scratch:
            self._check_io_scratch(launches, slot)
        return launches

    def _check_io_scratch(self, launches: list, slot) -> None:
        """scratch="io": every kernel is CuTe and reads the recompute's scratch in the input type, which no
        cuTile kernel of the backward takes, so there is nothing to fall back to: a buffer the CuTe kernels
        refuse (not packed row-major, or not 16-byte aligned) is an error naming it."""
        from ...errors import AlignmentError, StrideMismatchError
        from ..._layout import row_major_strides
        if all(kernel.takes(args) for _, _, kernel, args in launches if isinstance(kernel, CuteLaunch)):
            return
        for port in self._uid:
            buffer = slot(port) if self._uid[port] is not None else None
            if buffer is None or not hasattr(buffer, "data_ptr"):
                continue
            if buffer.numel > 1 and tuple(buffer.strides) != row_major_strides(buffer.shape):
                raise StrideMismatchError(port, self._uid[port], f"strides (plan {self.plan.label}, every kernel "
                                          "in CuTe on 16-bit scratch)", row_major_strides(buffer.shape),
                                          tuple(buffer.strides))
            if buffer.data_ptr % 16:
                raise AlignmentError(port, self._uid[port], f"base address (plan {self.plan.label}, every kernel in "
                                     "CuTe on 16-bit scratch)", "16-byte aligned", hex(buffer.data_ptr))
        raise GraphNotSupportedError(f"plan {self.plan.label}: a CuTe kernel did not compile (see the log) and "
                                     "its 16-bit scratch has no cuTile kernel to fall back to")

    def _take_cute_values(self, launches: list, sc) -> None:
        """``values="cute"``: the recompute's prepare leaves T = (I + A)^-1 in dA's region and the CuTe
        chunk_bwd_values reads it there, so both CuTe launches replace theirs or neither does (a cuTile prepare
        leaves no T)."""
        prepare_inverse, values = self._cute_values
        at = {launch[0]: i for i, launch in enumerate(launches)}
        _, prepare_grid, _, a = launches[at["prepare"]]
        prepare_args = (a[0], a[1], a[2], a[3], a[5], a[6], a[7], a[8], a[9], sc["da"])
        _, values_grid, _, a = launches[at["bwd_values"]]
        values_args = (a[1], a[3], a[5], a[6], a[7], a[8], a[9], a[11], a[13], a[14], a[15])
        if prepare_inverse.takes(prepare_args) and values.takes(values_args):
            launches[at["prepare"]] = ("prepare", prepare_grid, prepare_inverse, prepare_args)
            launches[at["bwd_values"]] = ("bwd_values", values_grid, values, values_args)


# a backward plan's kernel-source knobs ("state_pass": its forward recompute's)
BACKWARD_KERNEL_KNOBS = ("prepare", "state_pass", "intra", "bwd_state", "values", "grads")


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
    scratch = plan.knobs.get("scratch", "f32")
    if scratch not in ("f32", "io"):
        raise GraphNotSupportedError(f"scratch={scratch!r}; expected 'f32' or 'io'")
    io_scratch = ""
    if scratch == "io":
        # the backward's cuTile kernels read f32 scratch: with 16-bit scratch every kernel is CuTe
        cutile = [kernel for kernel, source in sources.items() if source != "cute"]
        if cutile:
            raise GraphNotSupportedError(f"scratch='io' in a backward needs every kernel in CuTe; "
                                         f"{', '.join(cutile)} are 'cutile'")
        io_scratch = variant.io_dtype
        variant = dataclasses.replace(variant, scratch_dtype=io_scratch)
    elif variant.state_pass == "cute":
        raise GraphNotSupportedError("state_pass='cute' in a backward reads the recompute's scratch in the input "
                                     "type: it needs scratch='io'")
    return CutileBackwardPlan(plan, graph, node, variant, _Geometry(node, backward=True, io_scratch=io_scratch))
