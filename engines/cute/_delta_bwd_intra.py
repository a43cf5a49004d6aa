"""The chunked delta rule's backward intra-chunk terms in CuTe DSL, for sm_90: a per-token (scalar) gate (gdn) or
per-channel gates (kda).

What ``engines/cutile/_kernels.chunk_bwd_intra`` computes, into the same workspace regions, per (chunk of 64
tokens, value head): the parts of the reverse state pass that need no dS::

    P = attn^T dO   (by chunk: the reverse pass adds kd dS to it in place)
    qg = scale q e^gc   (by chunk)

in f32, or in the input type where the plan keeps its own scratch so (scratch="io_all").

with attn the forward's masked, decayed and scaled scores (``_delta_output``: the same shared memory, the
same score passes). qg is formed in f32 from q's normalised rows as they are loaded (the scores take q in
the input type), then dO's rows go into k's buffer and ``P`` is one product with both operands read
transposed (ldmatrix.trans), stored from the accumulators (8-byte pairs, whole 32-byte sectors a row).

Why: the cuTile kernel took 0.16 ms (gdn) and 0.23 (kda) at 4 x 2048 tokens, 16 heads, K = V = 128 on the
H200, about twice what its bytes need. attn is rounded to the input type before ``attn^T dO`` (the cuTile
kernel keeps TF32): the forward output's precision.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.memory import SmemAllocator

from ._delta_chunk import CHUNK, PAD, SEG, THREADS, KernelLauncher, chunk_major
from ._delta_output import DeltaOutput


class DeltaBwdIntra(DeltaOutput):
    """One specialisation (as ``DeltaOutput``'s): the input type, K, V, the key heads ``HQ``, the value heads
    ``H``, whether q and k are L2-normalised, the scale and whether the gates are per channel."""

    @cute.jit
    def __call__(self, pq: cute.Pointer, pk: cute.Pointer, pdo: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer,
                 pp: cute.Pointer, pqg: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32,
                 stream: cuda.CUstream):
        self.kernel(pq, pk, pdo, pg, pcu, pp, pqg, tokens, chunks, n_seq).launch(
            grid=[chunks, self.H, 1], block=[THREADS, 1, 1], smem=self.shared_bytes(), stream=stream,
            **self.launch_options())

    @cute.kernel
    def kernel(self, pq: cute.Pointer, pk: cute.Pointer, pdo: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer,
               pp: cute.Pointer, pqg: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32):
        K, V, H = self.K, self.V, self.H
        mQ, mK, mG, mGs, mCu = self.score_views(pq, pk, pg, pcu, tokens, n_seq)
        mDo = cute.make_tensor(pdo, cute.make_layout((tokens, H, V), stride=(H * V, V, 1)))
        mP = chunk_major(pp, chunks, H, V)
        mQg = chunk_major(pqg, chunks, H, K)
        tiled_mma, tidx, h, hk, thr = self.block_heads()

        storage = SmemAllocator().allocate(self.shared_storage())
        width = self._row_width
        sQ, sK, sX, sAttn, sGc = self.score_buffers(storage)

        c, seq, start, count = self.chunk_of_block(mCu, n_seq, tidx, storage)
        if seq < n_seq:
            gQg = mQg[c, h, None, None]
            qg_part = cute.make_rmem_tensor((1, SEG), mQg.element_type)
            if const_expr(self.per_channel):
                def store_qg(p, row, seg, x, sums):
                    qg_part.store((x * cute.math.exp(sums) * self.scale).to(mQg.element_type))
                    cute.autovec_copy(qg_part, cute.local_tile(gQg, (1, SEG), (row, seg)))

                self.scores_per_channel(tiled_mma, thr, mQ[None, hk, None], mK[None, hk, None], mGs[None, h, None],
                                        sQ, sK, sAttn, start, count, tidx, store_qg, False)
            else:
                def store_qg(p, row, seg, x):
                    # rows past the chunk's end are zero whatever their gate: the last row's is read
                    gate = mG[start + cutlass.min(row, count - 1), h]
                    qg_part.store((x * (self.scale * cute.math.exp(gate))).to(mQg.element_type))
                    cute.autovec_copy(qg_part, cute.local_tile(gQg, (1, SEG), (row, seg)))

                self.scores_per_token(tiled_mma, thr, mQ[None, hk, None], mK[None, hk, None], mG, sQ, sK, sAttn,
                                      sGc, h, start, count, tidx, store_qg, False)
            # dO's rows into k's buffer (the scores are formed: every warp is past their barrier)
            self.load_rows(mDo[None, h, None], sX, start, count, V, False, tidx)
            cute.arch.sync_threads()
            # P (64 x V) = attn^T dO: both operands read transposed from shared memory
            p = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, V)), Float32)
            p.fill(0.0)
            self.product_tt(tiled_mma, p, sAttn, sX, CHUNK, CHUNK, V, CHUNK + PAD, width, tidx)
            self.store_fragment(p, thr.partition_C(mP[c, h, None, None]))


def _pointer_types(io_dtype: str, per_channel: bool = False, own_dtype: str = "float32") -> tuple:
    """(element type, assumed alignment) of each pointer: q, k, dO, g (the stored cumulative gates, f32; per
    channel, read in 32-byte row segments), cu_seqlens, P and qg (the backward's own scratch: f32 or the input
    type)."""
    own = (own_dtype, 16)
    return ((io_dtype, 16), (io_dtype, 16), (io_dtype, 16), ("float32", 16 if per_channel else 4), ("int32", 4),
            own, own)


def bwd_intra_launcher(io_dtype: str, K: int, V: int, HQ: int, H: int, use_l2: bool, scale: float,
                       n_seq: int, per_channel: bool = False, own_dtype: str = "float32") -> KernelLauncher:
    """The launcher of one specialisation; its slots: q, k, dO, g, cu_seqlens, P, qg (P and qg in
    ``own_dtype``)."""
    key = ("chunk_bwd_intra", io_dtype, K, V, HQ, H, use_l2, float(scale), per_channel, own_dtype)
    return KernelLauncher(lambda: DeltaBwdIntra(io_dtype, K, V, HQ, H, use_l2, scale, per_channel), key,
                          _pointer_types(io_dtype, per_channel, own_dtype), n_seq)
