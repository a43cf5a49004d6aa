"""CuteLaunch: a cuTile plan's launch through a CuTe DSL kernel (engines/cute: sm_90) that takes the cuTile
kernel's arguments, with the cuTile kernel as its fallback for a call whose buffers the CuTe one does not take,
and its C-path record (``c_launch``)."""
from __future__ import annotations

import copy

from ._variants import Variant

# the fused plan's state pass where its buffers do not suit the fused kernel, by block_v
FUSED_FALLBACK_FORM = {64: "split", 32: "staged"}


def gates_grid(variant: Variant, geometry: "_Geometry") -> tuple:
    """chunk_gates' grid: per chunk, value head and block of the variant's gate_block key channels."""
    return (geometry.chunks, geometry.H, geometry.K // variant.gate_block)


def _cutile_reads(variant: Variant, fallback):
    """A backward CuTe launch's cuTile fallback, or None where the scratch is in the input type (scratch="io"),
    which the backward's cuTile kernels neither read nor write (the plan checks every launch first)."""
    return fallback if variant.scratch_dtype == "float32" else None


class CuteLaunch:
    """A cuTile launch through a CuTe DSL kernel (engines/cute/_delta_prepare, _delta_state, _delta_output:
    sm_90) that takes the same arguments, or through the cuTile kernel for a call whose buffers the CuTe one
    does not take (not packed row-major, or misaligned). ``operands(args)`` picks the CuTe kernel's buffers from
    the cuTile kernel's arguments, in its pointer order."""

    def __init__(self, launcher, fallback, operands, geometry: "_Geometry", fallback_first=None):
        self._launcher = launcher
        self._fallback = fallback
        self._operands = operands
        # the kernels' three int32 sizes besides the sequences: tokens and the bound on chunks
        self._sizes = (geometry.T, geometry.chunks)
        # (kernel, grid, args(args)): a cuTile launch the fallback needs first, for work the CuTe kernel
        # does itself (kda's gate sums)
        self._fallback_first = fallback_first

    @staticmethod
    def prepare(variant: Variant, geometry: "_Geometry", fallback) -> "CuteLaunch":
        """chunk_prepare: the CuTe kernel reads k, v, g, beta, cu_seqlens and writes w, u, g_out, kd."""
        from ..cute._delta_prepare import prepare_launcher
        launcher = prepare_launcher(variant.io_dtype, variant.kernel_g_dtype, variant.beta_dtype,
                                    variant.scratch_dtype, variant.K, variant.V, geometry.HQ, geometry.H,
                                    variant.use_l2, variant.n_seq, per_channel=variant.per_channel)
        first = None
        if variant.per_channel:
            # the CuTe kernel forms kda's gate sums itself (the plan has no gates launch); its cuTile
            # stand-in reads them, so chunk_gates runs before it: (g, cu_seqlens, g_out)
            from . import _kernels
            first = (_kernels.forward_kernels(True)[0], gates_grid(variant, geometry),
                     lambda a: (a[2], a[5], a[8], *variant.gates_constants()))
        return CuteLaunch(launcher, fallback, lambda a: (a[0], a[1], a[2], a[3], a[5], a[6], a[7], a[8], a[9]),
                           geometry, first)

    @staticmethod
    def output(variant: Variant, geometry: "_Geometry", fallback) -> "CuteLaunch":
        """chunk_output: the CuTe kernel reads q, k, d, the cumulative gates, cu_seqlens, hs and writes o."""
        from ..cute._delta_output import output_launcher
        launcher = output_launcher(variant.io_dtype, variant.K, variant.V, geometry.HQ, geometry.H, variant.use_l2,
                                   variant.scale, variant.n_seq, per_channel=variant.per_channel)
        return CuteLaunch(launcher, fallback, lambda a: a[:7], geometry)

    @staticmethod
    def bwd_intra(variant: Variant, geometry: "_Geometry", fallback) -> "CuteLaunch":
        """chunk_bwd_intra: the CuTe kernel reads q, k, dO, the cumulative gates, cu_seqlens and writes P (over
        dD's region) and qg (in the backward's own scratch type: the input type with scratch="io_all")."""
        from ..cute._delta_bwd_intra import bwd_intra_launcher
        launcher = bwd_intra_launcher(variant.io_dtype, variant.K, variant.V, geometry.HQ, geometry.H, variant.use_l2,
                                      variant.scale, variant.n_seq, per_channel=variant.per_channel,
                                      own_dtype=variant.own_dtype)
        return CuteLaunch(launcher, _cutile_reads(variant, fallback), lambda a: a[:7], geometry)

    @staticmethod
    def bwd_grads(variant: Variant, geometry: "_Geometry", fallback) -> "CuteLaunch":
        """chunk_bwd_grads (gdn, kda): the CuTe kernel takes the cuTile kernel's 18 buffers in its order: q, k, g,
        beta, dO, cu_seqlens, hs, dhs, d, dCg, dA, dbeta's v part, dq / dk before the norm, dq, dk, dg, dbeta
        (dq / dk are f32 shares with grouped value heads; dg is f32)."""
        from ..cute._delta_bwd_grads import bwd_grads_launcher
        dq_dtype = "float32" if variant.group > 1 else variant.io_dtype
        launcher = bwd_grads_launcher(variant.io_dtype, variant.kernel_g_dtype, variant.beta_dtype, dq_dtype, "float32",
                                      variant.beta_dtype, variant.K, variant.V, geometry.HQ, geometry.H,
                                      variant.use_l2, variant.scale, variant.n_seq, variant.scratch_dtype,
                                      per_channel=variant.per_channel, own_dtype=variant.own_dtype,
                                      warps=variant.grads_warps)
        return CuteLaunch(launcher, _cutile_reads(variant, fallback), lambda a: a[:18], geometry)

    @staticmethod
    def bwd_state_pass(variant: Variant, geometry: "_Geometry", fallback) -> "CuteLaunch":
        """chunk_bwd_state_pass: the CuTe kernel takes the cuTile kernel's 10 buffers in its order: dO, w, kd,
        qg, the gate sums, cu_seqlens, dht, dhs, dD (P in, dD out), dh0. With all its scratch in 16 bits
        (scratch="io_all") the form that loads the next chunk during each step."""
        from ..cute._delta_state_reverse import reverse_state_pass_launcher
        launcher = reverse_state_pass_launcher(variant.io_dtype, variant.K, variant.V, variant.reverse_width,
                                               geometry.H, variant.has_dht, variant.has_h0, variant.n_seq,
                                               per_channel=variant.per_channel, scratch_dtype=variant.scratch_dtype,
                                               own_dtype=variant.own_dtype, prefetch=variant.own_dtype != "float32")
        return CuteLaunch(launcher, _cutile_reads(variant, fallback), lambda a: a[:10], geometry)

    @staticmethod
    def prepare_inverse(variant: Variant, geometry: "_Geometry", store_u: bool = True) -> "CuteLaunch":
        """The backward recompute's chunk_prepare that leaves T = (I + A)^-1 for chunk_bwd_values
        (``values="cute"``): the CuTe kernel reads k, v, g, beta, cu_seqlens and writes w, u, g_out, kd and T (no
        cuTile kernel: the plan checks ``takes`` first, for it and the values kernel together). ``store_u=False``:
        no u (a backward from the checkpoints on 16-bit scratch, whose values kernel forms U from T)."""
        from ..cute._delta_prepare import prepare_inverse_launcher
        launcher = prepare_inverse_launcher(variant.io_dtype, variant.kernel_g_dtype, variant.beta_dtype,
                                            variant.scratch_dtype, variant.K, variant.V, geometry.HQ, geometry.H,
                                            variant.use_l2, variant.n_seq, per_channel=variant.per_channel,
                                            own_dtype=variant.own_dtype, store_u=store_u)
        return CuteLaunch(launcher, None, lambda a: a, geometry)

    @staticmethod
    def prepare_inverse_intra(variant: Variant, geometry: "_Geometry", store_u: bool = True) -> "CuteLaunch":
        """``prepare_inverse`` doing chunk_bwd_intra's work too (``intra_in_prepare``): the CuTe kernel reads k, v,
        g, beta, cu_seqlens, q and dO and writes w, u, g_out, kd, T, P and qg (no cuTile kernel: the plan checks
        ``takes`` first and keeps the two launches where it refuses). ``store_u=False``: no v read, no u written
        (as ``prepare_inverse``'s)."""
        from ..cute._delta_prepare import prepare_inverse_intra_launcher
        launcher = prepare_inverse_intra_launcher(variant.io_dtype, variant.kernel_g_dtype, variant.beta_dtype,
                                                  variant.scratch_dtype, variant.K, variant.V, geometry.HQ,
                                                  geometry.H, variant.use_l2, variant.scale, variant.n_seq,
                                                  per_channel=variant.per_channel, own_dtype=variant.own_dtype,
                                                  store_u=store_u)
        return CuteLaunch(launcher, None, lambda a: a, geometry)

    @staticmethod
    def bwd_values(variant: Variant, geometry: "_Geometry") -> "CuteLaunch":
        """chunk_bwd_values from the T ``prepare_inverse`` left in dA's region (or the forward's chunk cache holds):
        the CuTe kernel reads v, beta, cu_seqlens, hs, dd, w, u and T and writes dv, dCg, dA, dbeta's v part and,
        from the forward's checkpoints (``variant.checkpoints``), the deltas d (no cuTile kernel: the plan checks
        ``takes`` first)."""
        from ..cute._delta_bwd_values import bwd_values_launcher
        launcher = bwd_values_launcher(variant.io_dtype, variant.beta_dtype, variant.io_dtype, variant.K, variant.V,
                                       geometry.H, variant.n_seq, variant.scratch_dtype, variant.own_dtype,
                                       warps=variant.values_warps, deltas=variant.checkpoints)
        return CuteLaunch(launcher, None, lambda a: a, geometry)

    @staticmethod
    def state_pass(variant: Variant, geometry: "_Geometry", fallback) -> "CuteLaunch":
        """chunk_state_pass: the CuTe kernel reads kd, w, u, the cumulative gates, cu_seqlens, h0 and writes
        hs, ht, d."""
        from ..cute._delta_state import state_pass_launcher
        form = FUSED_FALLBACK_FORM[variant.block_v] if variant.state_form == "fused" else variant.state_form
        launcher = state_pass_launcher(variant.io_dtype, variant.K, variant.V, variant.block_v, geometry.H,
                                       variant.has_h0, variant.store_ht, variant.n_seq, per_channel=variant.per_channel,
                                       form=form)
        return CuteLaunch(launcher, fallback, lambda a: a[:9], geometry)

    @staticmethod
    def scores(variant: Variant, geometry: "_Geometry") -> "CuteLaunch":
        """The fused form's chunk_scores: the CuTe kernel reads q, k, the cumulative gates, cu_seqlens and
        writes scale q e^gc and attn (no cuTile kernel: the plan checks ``takes`` first)."""
        from ..cute._delta_output import scores_launcher
        launcher = scores_launcher(variant.io_dtype, variant.K, variant.V, geometry.HQ, geometry.H, variant.use_l2,
                                   variant.scale, variant.n_seq, per_channel=variant.per_channel)
        return CuteLaunch(launcher, None, lambda a: a, geometry)

    @staticmethod
    def prepare_scores(variant: Variant, geometry: "_Geometry") -> "CuteLaunch":
        """The fused form's gdn chunk_prepare that forms the scores too (``scores="prepare"``): the CuTe kernel
        reads k, v, g, beta, cu_seqlens and q and writes w, u, g_out, kd, scale q e^gc and attn (no cuTile
        kernel: the plan checks ``takes`` first)."""
        from ..cute._delta_prepare import prepare_scores_launcher
        launcher = prepare_scores_launcher(variant.io_dtype, variant.kernel_g_dtype, variant.beta_dtype,
                                           variant.scratch_dtype, variant.K, variant.V, geometry.HQ, geometry.H,
                                           variant.use_l2, variant.scale, variant.n_seq)
        return CuteLaunch(launcher, None, lambda a: a, geometry)

    @staticmethod
    def prepare_scores_inverse(variant: Variant, geometry: "_Geometry") -> "CuteLaunch":
        """``prepare_scores`` that also writes T = (I + A)^-1 in the input type: gdn's fused forward keeping its
        chunk cache (its w, kd and gate sums are the cache's regions already). No cuTile kernel."""
        from ..cute._delta_prepare import prepare_scores_inverse_launcher
        launcher = prepare_scores_inverse_launcher(variant.io_dtype, variant.kernel_g_dtype, variant.beta_dtype,
                                                   variant.scratch_dtype, variant.K, variant.V, geometry.HQ,
                                                   geometry.H, variant.use_l2, variant.scale, variant.n_seq)
        return CuteLaunch(launcher, None, lambda a: a, geometry)

    @staticmethod
    def state_output(variant: Variant, geometry: "_Geometry") -> "CuteLaunch":
        """The fused state pass: the CuTe kernel reads kd, w, u, the cumulative gates, cu_seqlens, h0, scale
        q e^gc, attn and writes ht, o and, for the forward's checkpoints (``variant.checkpoints``), hs (no cuTile
        kernel: the plan checks ``takes`` first)."""
        from ..cute._delta_state import fused_state_pass_launcher
        launcher = fused_state_pass_launcher(variant.io_dtype, variant.K, variant.V, variant.block_v, geometry.H,
                                             variant.has_h0, variant.store_ht, variant.n_seq,
                                             per_channel=variant.per_channel, store_hs=variant.checkpoints)
        return CuteLaunch(launcher, None, lambda a: a, geometry)

    def over_chunks(self, chunks: int) -> "CuteLaunch":
        """This launch with its chunk bound ``chunks`` (one segment's, ``_segments``): the same kernel and
        fallback; the tokens stay the call's (a segment's cu_seqlens row holds absolute token offsets)."""
        other = copy.copy(self)
        other._sizes = (self._sizes[0], chunks)
        return other

    def takes(self, args: tuple) -> bool:
        """Whether the CuTe kernel runs on ``args``: it compiled, and its buffers are packed row-major and
        aligned as it assumes (the C path's refs carry no address: their strides are c_launch's check)."""
        refs = self._operands(args)
        if not self._launcher.compile():
            return False
        return self._launcher.usable(refs) if all(hasattr(r, "data_ptr") for r in refs) else True

    def __call__(self, stream: int, grid: tuple, args: tuple) -> None:
        if not self._launcher(stream, self._operands(args), *self._sizes):
            if self._fallback is None:
                raise RuntimeError(f"the CuTe {self._launcher.name} kernel refused buffers its plan checked")
            import cuda.tile as ct
            if self._fallback_first is not None:
                kernel, first_grid, first_args = self._fallback_first
                ct.launch(stream, first_grid, kernel, first_args(args))
            ct.launch(stream, grid, self._fallback, args)

    def c_launch(self, name: str, grid: tuple, args: tuple, operand_index):
        """This launch for the C path (``_c_launch.prepare``): the CuTe cubin, its parameter buffer (the
        addresses, then tokens, chunks and sequences as int32; checked against the cubin's own table) and
        its block and dynamic shared memory. Unsupported where an operand is not packed row-major."""
        import struct
        from ..._layout import row_major_strides
        from . import _abi, _c_launch
        refs = self._operands(args)
        for ref in refs:
            if tuple(ref.strides) != row_major_strides(ref.shape):
                raise _c_launch.Unsupported(f"{_c_launch._label(ref)} has strides {ref.strides}; the CuTe "
                                            f"{name} kernel reads packed row-major buffers")
        try:
            cubin, block, shared = self._launcher.cubin()
        except RuntimeError as exc:
            raise _c_launch.Unsupported(str(exc)) from exc
        symbols = _abi.kernel_symbols(cubin)
        if len(symbols) != 1:
            raise _c_launch.Unsupported(f"the CuTe {name} kernel's cubin has kernels {symbols}; expected one")
        symbol = symbols[0]
        n = len(refs)
        fields = [_abi.Field(i, "address", 0, 8 * i, 8) for i in range(n)]
        fields += [_abi.Field(n + j, "value", 0, 8 * n + 4 * j, 4) for j in range(3)]
        layout = _abi.ParamLayout(tuple(fields), 8 * n + 12)
        layout.check_against(_abi.cubin_parameters(cubin, symbol))
        image = bytearray(layout.size)
        struct.pack_into("<iii", image, 8 * n, *self._sizes, self._launcher.n_seq)
        patches = [(8 * i, operand_index(r), r.add) if isinstance(r, _c_launch.OperandRef) else (8 * i, -1, r.offset)
                   for i, r in enumerate(refs)]
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        return _c_launch.KernelLaunch(name, symbol, grid, cubin, layout, bytes(image), patches, tuple(block),
                                      shared)
