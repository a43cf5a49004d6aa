"""The chunked delta rule's per-chunk gradients of q, k, the gate and beta in CuTe DSL, for sm_90: a per-token
(scalar) gate (gdn: ``DeltaBwdGrads``) or a per-channel one (kda: ``DeltaBwdGradsPerChannel`` in
``_delta_bwd_grads_per_channel``, whose docstring says what differs).

What ``engines/cutile/_kernels.chunk_bwd_grads`` computes for gdn (its docstring and
tests/engines/cutile/test_cutile_export.py::chunked_backward have the algebra), from the same workspace
regions, per (chunk of 64 tokens, value head): dq, dk, dg and dbeta from the chunk-start state ``S0`` (hs),
the end gradient ``dS1`` (dhs), the deltas ``D`` and chunk_bwd_values' dCg, dA and dbeta part.

Why: the cuTile kernel is the backward's largest (1.09 ms of gdn's 2.35 at 4 x 2048 tokens, 16 heads,
K = V = 128 on the H100): 253 registers with eight warps, one CTA an SM, a chain of dependent products with
nothing beside it. Here a CTA of four warps holds its operands in the input type in about 110 KB of shared
memory (two CTAs an SM) and folds each 64 x 64 product into dq, dk and the gate's row sums as it is formed:

1. locate the chunk; the gate's in-chunk sums and the per-row factors e^gc, e^(gc - gc_mid), e^(gc_mid - gc),
   e^(gc_last - gc) and beta (threads 0-63, a row each); 1 / ||q|| and 1 / ||k|| per row when L2-normalised;
2. dO and D (D rounded from f32 scratch) into shared memory; ``dm = tril(dO D^T) scale`` and dA in the input
   type;
3. per 64 key columns: S0's and dS1's rows (rounded; their f32 product summed for the last row's gate
   term), q's and k's normalised columns; ``dqs = dO S0^T`` and ``dkg = D dS1^T``; then ``qn = q e^(gc -
   gc_mid)``, ``kn = k e^(gc_mid - gc)``, ``an = beta k e^(gc - gc_mid)`` over S0's and dS1's place, and the
   four score products ``dm kn``, ``dm^T qn``, ``dA kn``, ``dA^T an``; dq and dk leave (before the norm's
   backward into the scratch the plan gives, with L2 norm);
4. the row sums (a quad's lanes, then one lane a row) into dg (a reverse cumulative sum) and dbeta; with L2
   norm, dq and dk through ``x / ||x||``'s backward.

The products take BF16 / FP16 operands with f32 accumulation (the cuTile kernel: TF32); the four score products'
operands (dm, dA and the split rows qn, kn, an: a factor may reach e^SPLIT_EXPONENT_LIMIT, past FP16's e^11) are in
``split``'s type, BF16 for FP16 inputs, as kda's prepare and output hold theirs. The gate's terms of the four
score products multiply each product by the rounded operand the product paired it with (``qn * (dm kn)`` against
``kn * (dm^T qn)``, ``an * (dA kn)`` against ``kn * (dA^T an)``; read back from shared memory, or rounded again in
registers as ``split_operands`` rounded it where that kept the stack frame smaller), not by q e^(gc - mid) in f32:
the scores depend on gate differences only, so over a chunk these terms cancel, and they cancel in the kernel too
only when both sides of each pair see the same values. With f32 factors each pair left a residue of the operands'
rounding (2^-9 of the term) that the reverse cumulative sum and any token sum of dg add up coherently: kda with
``gate_lower_bound = -2.5`` (gate sums of -70 to -80 over a chunk) had d_dt_bias 7.5e-2 and d_a_log 4.0e-2 off the
reference on the H100 (tolerance 3e-2); a numpy model of the kernels' roundings gives those figures to three digits,
and 2.0e-3 / 3.6e-3 with the paired operands.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr, range_constexpr
from cutlass.memory import SmemAllocator

from ._delta_chunk import (CHUNK, DTYPES, ITEMSIZE, PAD, SEG, SPLIT_ROW, THREADS, ChunkKernel, KernelLauncher,
                           chunk_major, shared_field, shared_struct)


class DeltaBwdGrads(ChunkKernel):
    """One specialisation: the input type, the gate's and beta's types, the types dq / dk, dg and dbeta are
    written in, K, V, the key heads ``HQ``, the value heads ``H`` and whether q and k are L2-normalised.
    Called with q, k, g (the raw per-token gate), beta, dO, cu_seqlens, hs, dhs, d, dCg, dA, dbeta's v part,
    dq and dk before the norm (scratch), dq, dk, dg, dbeta, then tokens, chunks, sequences."""

    per_channel = False         # g and dg (tokens, H), a gate per token

    def __init__(self, io_dtype: str, g_dtype: str, beta_dtype: str, dq_dtype: str, dg_dtype: str,
                 dbeta_dtype: str, K: int, V: int, HQ: int, H: int, use_l2: bool, scale: float, warps: int = 4):
        self.set_heads(io_dtype, K, V, HQ, H, use_l2)
        if K % CHUNK or V % CHUNK:
            raise ValueError(f"K = {K} and V = {V} must be multiples of {CHUNK}")
        self.set_warps(warps)
        self.g_type, self.beta_type = DTYPES[g_dtype], DTYPES[beta_dtype]
        self.dq_type, self.dg_type, self.dbeta_type = DTYPES[dq_dtype], DTYPES[dg_dtype], DTYPES[dbeta_dtype]
        self.scale = float(scale)

    def shared_storage(self):
        v_rows = CHUNK * (self.V + PAD)
        block = CHUNK * (CHUNK + PAD)
        return shared_struct("DeltaBwdGradsStorage", {
            "do": shared_field(self.io, v_rows), "d": shared_field(self.io, v_rows),
            # S0's and dS1's 64 key rows, then qn, kn and an (64 x 64 each) in their place
            "s0": shared_field(self.io, max(v_rows, 2 * block)), "ds1": shared_field(self.io, max(v_rows, block)),
            "q": shared_field(self.io, block), "k": shared_field(self.io, block),
            "dm": shared_field(self.io, block), "da": shared_field(self.io, block),
            # per row: gate sums, e^gc, the split factors, e^(last - gc), beta, 1/||q||, 1/||k||, and the
            # row sums dgc, dbeta, q . dq, k . dk
            # row sums (rows 12-15: those of warps 4-7 with eight warps, added in before they are read)
            "rows": shared_field(Float32, self._row_fields * CHUNK),
            "warp_sums": shared_field(Float32, self.threads // 32),
            "scan": shared_field(Int32, THREADS), "where": shared_field(Int32, 4)})

    @property
    def _row_fields(self) -> int:
        return 12 if self.threads == THREADS else 16

    def shared_bytes(self) -> int:
        return self.shared_storage().size_in_bytes()

    @cute.jit
    def __call__(self, pq: cute.Pointer, pk: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer, pdo: cute.Pointer,
                 pcu: cute.Pointer, phs: cute.Pointer, pdhs: cute.Pointer, pd: cute.Pointer, pdcg: cute.Pointer,
                 pda: cute.Pointer, pdbv: cute.Pointer, pdqp: cute.Pointer, pdkp: cute.Pointer, pdq: cute.Pointer,
                 pdk: cute.Pointer, pdg: cute.Pointer, pdbeta: cute.Pointer, tokens: Int32, chunks: Int32,
                 n_seq: Int32, stream: cuda.CUstream):
        self.kernel(pq, pk, pg, pbeta, pdo, pcu, phs, pdhs, pd, pdcg, pda, pdbv, pdqp, pdkp, pdq, pdk, pdg, pdbeta,
                    tokens, chunks, n_seq).launch(grid=[chunks, self.H, 1], block=[self.threads, 1, 1],
                                                  smem=self.shared_bytes(), stream=stream, **self.launch_options())

    def global_tensors(self, pointers: tuple, tokens: Int32, chunks: Int32, n_seq: Int32) -> tuple:
        """The kernel's 18 pointers as tensors (traced into the kernel): q, k (tokens, key heads, K), g, beta, dO,
        cu_seqlens, hs and dhs (chunks, H, K, V), the chunk-major scratch d, dCg, dA, dbeta's v part, dq / dk
        before the norm, then dq, dk (tokens, H, K), dg (as g: per token or per channel) and dbeta."""
        (pq, pk, pg, pbeta, pdo, pcu, phs, pdhs, pd, pdcg, pda, pdbv, pdqp, pdkp, pdq, pdk, pdg, pdbeta) = pointers
        K, V, H, HQ = self.K, self.V, self.H, self.HQ
        keys = cute.make_layout((tokens, HQ, K), stride=(HQ * K, K, 1))
        per_token = cute.make_layout((tokens, H), stride=(H, 1))
        per_key = cute.make_layout((tokens, H, K), stride=(H * K, K, 1))
        gates = per_key if self.per_channel else per_token
        states = cute.make_layout((chunks, H, K, V), stride=(H * K * V, K * V, V, 1))
        return (cute.make_tensor(pq, keys), cute.make_tensor(pk, keys), cute.make_tensor(pg, gates),
                cute.make_tensor(pbeta, per_token),
                cute.make_tensor(pdo, cute.make_layout((tokens, H, V), stride=(H * V, V, 1))),
                cute.make_tensor(pcu, cute.make_layout((n_seq + 1,), stride=(1,))),
                cute.make_tensor(phs, states), cute.make_tensor(pdhs, states),
                chunk_major(pd, chunks, H, V), chunk_major(pdcg, chunks, H, K), chunk_major(pda, chunks, H, CHUNK),
                chunk_major(pdbv, chunks, H, 1), chunk_major(pdqp, chunks, H, K), chunk_major(pdkp, chunks, H, K),
                cute.make_tensor(pdq, per_key), cute.make_tensor(pdk, per_key), cute.make_tensor(pdg, gates),
                cute.make_tensor(pdbeta, per_token))

    @cute.kernel
    def kernel(self, pq: cute.Pointer, pk: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer, pdo: cute.Pointer,
               pcu: cute.Pointer, phs: cute.Pointer, pdhs: cute.Pointer, pd: cute.Pointer, pdcg: cute.Pointer,
               pda: cute.Pointer, pdbv: cute.Pointer, pdqp: cute.Pointer, pdkp: cute.Pointer, pdq: cute.Pointer,
               pdk: cute.Pointer, pdg: cute.Pointer, pdbeta: cute.Pointer, tokens: Int32, chunks: Int32,
               n_seq: Int32):
        (mQ, mK, mG, mBeta, mDo, mCu, mHs, mDhs, mD, mDcg, mDa, mDbv, mDqp, mDkp, mDq, mDk, mDg,
         mDbeta) = self.global_tensors((pq, pk, pg, pbeta, pdo, pcu, phs, pdhs, pd, pdcg, pda, pdbv, pdqp, pdkp, pdq,
                                        pdk, pdg, pdbeta), tokens, chunks, n_seq)
        K, V = self.K, self.V
        tiled_mma, tidx, h, hk, thr = self.block_heads()

        storage = SmemAllocator().allocate(self.shared_storage())
        v_rows = cute.make_layout((CHUNK, V), stride=(V + PAD, 1))
        block = cute.make_layout((CHUNK, CHUNK), stride=(CHUNK + PAD, 1))
        sDo = cute.make_tensor(storage.do.data_ptr(), v_rows)
        sD = cute.make_tensor(storage.d.data_ptr(), v_rows)
        sS0 = cute.make_tensor(storage.s0.data_ptr(), v_rows)
        sDs1 = cute.make_tensor(storage.ds1.data_ptr(), v_rows)
        # qn and kn over S0's rows, an over dS1's, once the products that read those are done; they, dm and dA
        # are the four score products' operands, in the split type (``split_mma``)
        sQn = self.as_split_view(cute.make_tensor(storage.s0.data_ptr(), block))
        sKn = self.as_split_view(cute.make_tensor(storage.s0.data_ptr() + CHUNK * (CHUNK + PAD), block))
        sAn = self.as_split_view(cute.make_tensor(storage.ds1.data_ptr(), block))
        sQ = cute.make_tensor(storage.q.data_ptr(), block)
        sK = cute.make_tensor(storage.k.data_ptr(), block)
        sDm = self.as_split_view(cute.make_tensor(storage.dm.data_ptr(), block))
        sDa = self.as_split_view(cute.make_tensor(storage.da.data_ptr(), block))
        split_mma = self.warp_mma(self.split)
        rows = cute.make_tensor(storage.rows.data_ptr(),
                                cute.make_layout((self._row_fields, CHUNK), stride=(CHUNK, 1)))
        sWarp = cute.make_tensor(storage.warp_sums.data_ptr(), cute.make_layout((self.threads // 32,)))
        # the last key block's dq and dk before the norm, over dO's and D's rows once its first two products are done
        held = cute.make_layout((CHUNK, CHUNK), stride=(V + PAD, 1))
        sDqHeld = cute.make_tensor(storage.do.data_ptr(), held)
        sDkHeld = cute.make_tensor(storage.d.data_ptr(), held)

        c, seq, start, count = self.chunk_of_block(mCu, n_seq, tidx, storage)
        if seq < n_seq:
            # dO's rows (zeros past the chunk's end) in flight while the row factors are formed
            do_rows = self.issue_rows(mDo[None, h, None], start, count, V, tidx)
            self.row_factors(mQ[None, hk, None], mK[None, hk, None], mG, mBeta, rows, h, hk, start, count, tidx)
            # dO and D into shared memory, then dm and dA
            self.put_loaded_rows(do_rows, sDo, V, False, tidx)
            self.scratch_rows(mD[c, h, None, None], sD, V, tidx)
            self.scratch_rows(mDa[c, h, None, None], sDa, CHUNK, tidx)
            cute.arch.sync_threads()
            row0, col0 = self.first_place(tidx)
            acc = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, CHUNK)), Float32)
            self.score_gradient(tiled_mma, thr, acc, sDo, sD, sDm, row0, col0, tidx)

            # row sums over this thread's two rows (a quad's four lanes share them)
            sums = cute.make_rmem_tensor((4, 2), Float32)        # dgc, dbeta, q . dq, k . dk for row0, row0 + 8
            sums.fill(0.0)
            dlast = Float32(0.0)      # sum of dS1 * S0 (times e^gc_last below) and of kg * dkg, over the block
            dq = cute.make_rmem_tensor(acc.shape, Float32)
            dk = cute.make_rmem_tensor(acc.shape, Float32)
            dct = cute.make_rmem_tensor(acc.shape, Float32)
            last_e = cute.math.exp(rows[0, count - 1])
            for kb in cutlass.range(K // CHUNK):
                # q's and k's columns in flight across the barrier, S0's and dS1's rows by cp.async after it where
                # the scratch is the input type (loaded and stored a row at a time, each waited on)
                first_seg = kb * (CHUNK // SEG)
                q_cols = self.issue_rows(mQ[None, hk, None], start, count, CHUNK, tidx, first_seg)
                k_cols = self.issue_rows(mK[None, hk, None], start, count, CHUNK, tidx, first_seg)
                cute.arch.sync_threads()        # the previous block's readers of S0's and dS1's place are done
                dlast = dlast + last_e * self.state_rows(mHs[c, h, None, None], mDhs[c, h, None, None], sS0, sDs1,
                                                         q_cols, k_cols, sQ, sK, rows, kb, tidx)
                cute.arch.sync_threads()
                # dqs = dO S0^T -> dq = dqs e^gc scale
                acc.fill(0.0)
                self.product(tiled_mma, acc, sDo, sS0, tidx)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    q = sQ[t, i].to(Float32)
                    dq[e] = acc[e] * rows[1, t] * self.scale
                    self.add_row(sums, 0, e, q * dq[e])
                # dkg = D dS1^T -> dk = dkg e^(last - gc)
                acc.fill(0.0)
                self.product(tiled_mma, acc, sD, sDs1, tidx)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    kg = sK[t, i].to(Float32) * rows[4, t]
                    dk[e] = acc[e] * rows[4, t]
                    self.add_row(sums, 0, e, -kg * acc[e])
                    dlast = dlast + kg * acc[e]
                cute.arch.sync_threads()        # S0's and dS1's rows are read: qn, kn, an take their place
                self.split_operands(sQ, sK, sQn, sKn, sAn, rows, tidx)
                cute.arch.sync_threads()
                # dm kn -> dq, which then leaves (its registers free for dk's terms)
                acc.fill(0.0)
                self.product_bt(split_mma, acc, sDm, sKn, CHUNK, CHUNK, CHUNK + PAD, tidx)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    q = sQ[t, i].to(Float32)
                    dq[e] = dq[e] + acc[e] * rows[2, t]
                    self.add_row(sums, 0, e, sQn[t, i].to(Float32) * acc[e])
                    self.add_row(sums, 2, e, q * dq[e])
                self.leave(thr, dq, mDqp[c, h, None, None], mDq[None, h, None], row0, col0, start, count, kb,
                           sDqHeld)
                # dm^T qn -> dk
                acc.fill(0.0)
                self.product_tt(split_mma, acc, sDm, sQn, CHUNK, CHUNK, CHUNK, CHUNK + PAD, CHUNK + PAD, tidx)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    dk[e] = dk[e] + acc[e] * rows[3, t]
                    self.add_row(sums, 0, e, -sKn[t, i].to(Float32) * acc[e])
                # dA kn -> dCt = dCg e^gc + dA kn e^(gc - mid)
                self.load_fragment(thr.partition_C(cute.local_tile(mDcg[c, h, None, None], (CHUNK, CHUNK),
                                                                      (0, kb))), dct)
                acc.fill(0.0)
                self.product_bt(split_mma, acc, sDa, sKn, CHUNK, CHUNK, CHUNK + PAD, tidx)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    read = rows[5, t] * sK[t, i].to(Float32)
                    self.add_row(sums, 0, e, read * rows[1, t] * dct[e] + sAn[t, i].to(Float32) * acc[e])
                    dct[e] = dct[e] * rows[1, t] + acc[e] * rows[2, t]
                # dA^T an -> dk
                acc.fill(0.0)
                self.product_tt(split_mma, acc, sDa, sAn, CHUNK, CHUNK, CHUNK, CHUNK + PAD, CHUNK + PAD, tidx)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    k = sK[t, i].to(Float32)
                    dk[e] = dk[e] + acc[e] * rows[3, t] + rows[5, t] * dct[e]
                    self.add_row(sums, 0, e, -sKn[t, i].to(Float32) * acc[e])
                    self.add_row(sums, 1, e, k * dct[e])
                    self.add_row(sums, 3, e, k * dk[e])
                self.leave(thr, dk, mDkp[c, h, None, None], mDk[None, h, None], row0, col0, start, count, kb,
                           sDkHeld)
            self.finish(sums, dlast, rows, sWarp, row0, mDbv[c, h, None, None], mDg, mDbeta, h, start, count, tidx)
            if const_expr(self.use_l2):
                cute.arch.sync_threads()        # every dq / dk before the norm is written, the row dots are summed
                self.through_the_norm(mDqp[c, h, None, None], mQ[None, hk, None], mDq[None, h, None], rows, 6, 10,
                                      start, count, tidx, sDqHeld)
                self.through_the_norm(mDkp[c, h, None, None], mK[None, hk, None], mDk[None, h, None], rows, 7, 11,
                                      start, count, tidx, sDkHeld)

    # -- helpers ------------------------------------------------------------------------------------

    @cute.jit
    def as_operand(self, x):
        """x rounded to the split type as the score products' operands were (the per-channel kernel's
        ``split_operands_per_channel`` rounds the same f32 product, so the same bits), back in f32."""
        return x.to(self.split).to(Float32)

    @cute.jit
    def score_gradient(self, tiled_mma, thr, acc: cute.Tensor, sDo: cute.Tensor, sD: cute.Tensor, sDm: cute.Tensor,
                       row0: Int32, col0: Int32, tidx: Int32):
        """dm = tril(dO D^T) scale (the gradient of o's intra-chunk scores) into sDm in its type (the split
        operands'); ``acc`` (64 x 64 accumulators) is overwritten."""
        acc.fill(0.0)
        self.product(tiled_mma, acc, sDo, sD, tidx)
        dm = cute.make_rmem_tensor(acc.shape, sDm.element_type)
        for e in range_constexpr(cute.size(acc)):
            t, j = self.place(e, row0, col0)
            val = Float32(0.0)
            if j <= t:
                val = acc[e] * self.scale
            dm[e] = val.to(sDm.element_type)
        cute.autovec_copy(dm, thr.partition_C(sDm))

    @cute.jit
    def put_row_sums(self, sums: cute.Tensor, rows: cute.Tensor, first: cutlass.Constexpr, n: cutlass.Constexpr,
                     row0: Int32, tidx: Int32):
        """The ``n`` row sums of ``quad_sums`` (two rows a thread) into rows[first, first + n), one lane a quad.
        With eight warps, warps w and w + 4 hold halves of the same rows: the second's sums go to rows 12 on and
        are added in after a barrier. The caller's next barrier orders their readers."""
        if const_expr(self.threads == THREADS):
            if tidx % 4 == 0:
                for which in range_constexpr(n):
                    rows[first + which, row0] = sums[which, 0]
                    rows[first + which, row0 + 8] = sums[which, 1]
        else:
            if tidx % 4 == 0:
                base = first + (12 - first) * (tidx // (32 * 4))
                for which in range_constexpr(n):
                    rows[base + which, row0] = sums[which, 0]
                    rows[base + which, row0 + 8] = sums[which, 1]
            cute.arch.sync_threads()
            if tidx < CHUNK:
                for which in range_constexpr(n):
                    rows[first + which, tidx] = rows[first + which, tidx] + rows[12 + which, tidx]

    @cute.jit
    def row_factors(self, gQ: cute.Tensor, gK: cute.Tensor, mG: cute.Tensor, mBeta: cute.Tensor, rows: cute.Tensor,
                    h: Int32, hk: Int32, start: Int32, count: Int32, tidx: Int32):
        """rows[0..7] per token of the chunk: gc (in-chunk gate sums; rows past the end repeat the last), e^gc,
        e^(gc - gc_mid), e^(gc_mid - gc), e^(gc_last - gc), beta, 1 / ||q||, 1 / ||k|| (1 without L2 norm or
        for a zero row: it passes the gradient through unchanged, as the cuTile kernel's); rows[8..11] zero.
        q's and k's rows for the norms are loaded first, in flight during the gate sums. Every thread is past a
        barrier when it returns."""
        norm_rows = self.issue_norm_rows(gQ, gK, start, count, tidx)
        if tidx < CHUNK:
            g = Float32(0.0)
            b = Float32(0.0)
            if tidx < count:
                g = mG[start + tidx, h].to(Float32)
                b = mBeta[start + tidx, h].to(Float32)
            rows[8, tidx] = g
            rows[5, tidx] = b
            for which in range_constexpr(8, 12):
                if const_expr(which != 8):
                    rows[which, tidx] = Float32(0.0)
        cute.arch.sync_threads()
        if tidx < CHUNK:
            gc = Float32(0.0)
            for j in range_constexpr(CHUNK):
                gc = gc + cutlass.select_(j <= tidx, rows[8, j], Float32(0.0))
            rows[0, tidx] = gc
        cute.arch.sync_threads()
        if tidx < CHUNK:
            rows[8, tidx] = Float32(0.0)
            gc = rows[0, tidx]
            mid = rows[0, cutlass.min(count - 1, SPLIT_ROW)]
            rows[1, tidx] = cute.math.exp(gc)
            rows[2, tidx] = cute.math.exp(gc - mid)
            rows[3, tidx] = cute.math.exp(mid - gc)
            rows[4, tidx] = cute.math.exp(rows[0, count - 1] - gc)
        self.inverse_norms(norm_rows, rows, tidx)
        cute.arch.sync_threads()

    @cute.jit
    def issue_norm_rows(self, gQ: cute.Tensor, gK: cute.Tensor, start: Int32, count: Int32, tidx: Int32):
        """q's and k's chunk rows (all of K; zeros past the chunk's end) into registers for ``inverse_norms``,
        issued and not waited on; None without L2 norm. Loaded and reduced a row at a time, they held a fifth of
        gdn's stall samples with the loads after them (ncu, H100, session 32)."""
        if const_expr(self.use_l2):
            return (self.issue_rows(gQ, start, count, self.K, tidx), self.issue_rows(gK, start, count, self.K, tidx))
        return None

    @cute.jit
    def inverse_norms(self, norm_rows, rows: cute.Tensor, tidx: Int32):
        """rows[6, t] = 1 / ||q_t|| and rows[7, t] = 1 / ||k_t|| over all of K from ``issue_norm_rows``' registers
        (1 for a zero row or one past the chunk's end, and for every row without L2 norm). The caller's next
        barrier orders their readers."""
        if const_expr(self.use_l2):
            self.inverse_norm_rows(norm_rows[0], rows, 6, tidx)
            self.inverse_norm_rows(norm_rows[1], rows, 7, tidx)
        else:
            if tidx < CHUNK:
                rows[6, tidx] = Float32(1.0)
                rows[7, tidx] = Float32(1.0)

    @cute.jit
    def inverse_norm_rows(self, raw: cute.Tensor, rows: cute.Tensor, which: cutlass.Constexpr, tidx: Int32):
        """rows[which, t] = 1 / ||x_t|| from x's rows in ``issue_rows``' registers (1 for a zero row)."""
        segs = self.K // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            x = cute.local_tile(raw, (1, SEG), (p, 0)).load().to(Float32)
            ss = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            for lane in range_constexpr(segs.bit_length() - 1):
                ss = ss + cute.arch.shuffle_sync_bfly(ss, 1 << lane)
            if seg == 0:
                rows[which, row] = cutlass.select_(ss > Float32(0.0), cute.math.rsqrt(ss), Float32(1.0))

    @cute.jit
    def state_rows(self, gS0: cute.Tensor, gDs1: cute.Tensor, sS0: cute.Tensor, sDs1: cute.Tensor, q_cols: cute.Tensor,
                   k_cols: cute.Tensor, sQ: cute.Tensor, sK: cute.Tensor, rows: cute.Tensor, kb: Int32, tidx: Int32):
        """Key block kb's operands into shared memory: S0's and dS1's key rows (``rounded_state_rows``; by cp.async
        where the scratch is the input type, the copies in flight while q's and k's columns from ``issue_rows``
        are stored times 1 / ||x||). Returns this thread's share of sum(S0 * dS1) over the block, in f32."""
        if const_expr(gS0.element_type is self.io and gDs1.element_type is self.io):
            self.copy_rows_async(cute.local_tile(gS0, (CHUNK, self.V), (kb, 0)), sS0, self.V, tidx)
            self.copy_rows_async(cute.local_tile(gDs1, (CHUNK, self.V), (kb, 0)), sDs1, self.V, tidx)
        self.put_columns(q_cols, sQ, rows, 6, tidx)
        self.put_columns(k_cols, sK, rows, 7, tidx)
        total = Float32(0.0)
        if const_expr(gS0.element_type is self.io and gDs1.element_type is self.io):
            cute.arch.cp_async_wait_group(0)
            total = self.own_row_dots(sS0, sDs1, tidx)
        else:
            total = self.rounded_state_rows(gS0, gDs1, sS0, sDs1, kb, tidx)
        return total

    @cute.jit
    def put_columns(self, raw: cute.Tensor, sX: cute.Tensor, rows: cute.Tensor, which: cutlass.Constexpr,
                    tidx: Int32):
        """A key block of q's or k's chunk rows from ``issue_rows`` into sX (64 x 64), times rows[which]
        (1 / ||x||) with L2 norm."""
        segs = CHUNK // SEG
        rows_per_pass = self.threads // segs
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            part = cute.local_tile(raw, (1, SEG), (p, 0))
            if const_expr(self.use_l2):
                part.store((part.load().to(Float32) * rows[which, row]).to(self.io))
            cute.autovec_copy(part, cute.local_tile(sX, (1, SEG), (row, tidx % segs)))

    @cute.jit
    def own_row_dots(self, sS0: cute.Tensor, sDs1: cute.Tensor, tidx: Int32):
        """This thread's share of sum(S0 * dS1) (f32) over the segments its own copies put in sS0 / sDs1 (64 x V):
        seen after its wait, without a barrier."""
        segs = self.V // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        a = cute.make_rmem_tensor((1, SEG), self.io)
        b = cute.make_rmem_tensor((1, SEG), self.io)
        total = Float32(0.0)
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            cute.autovec_copy(cute.local_tile(sS0, (1, SEG), (row, seg)), a)
            cute.autovec_copy(cute.local_tile(sDs1, (1, SEG), (row, seg)), b)
            total = total + (a.load().to(Float32) * b.load().to(Float32)).reduce(cute.ReductionOp.ADD,
                                                                                Float32(0.0), 0)
        return total

    @cute.jit
    def rounded_state_rows(self, gS0: cute.Tensor, gDs1: cute.Tensor, sS0: cute.Tensor, sDs1: cute.Tensor,
                           kb: Int32, tidx: Int32):
        """Key rows [64 kb, 64 kb + 64) of S0 and dS1 (K x V, f32 or the input type: the scratch's) in the input type
        into sS0 / sDs1 (64 x V); returns this thread's share of sum(S0 * dS1) over them, in f32."""
        V = self.V
        segs = V // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        a = cute.make_rmem_tensor((1, SEG), gS0.element_type)     # f32, or the input type (its scratch)
        b = cute.make_rmem_tensor((1, SEG), gDs1.element_type)
        out = cute.make_rmem_tensor((1, SEG), self.io)
        total = Float32(0.0)
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            cute.autovec_copy(cute.local_tile(gS0, (1, SEG), (kb * CHUNK + row, seg)), a)
            cute.autovec_copy(cute.local_tile(gDs1, (1, SEG), (kb * CHUNK + row, seg)), b)
            x, y = a.load().to(Float32), b.load().to(Float32)
            total = total + (x * y).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            out.store(x.to(self.io))
            cute.autovec_copy(out, cute.local_tile(sS0, (1, SEG), (row, seg)))
            out.store(y.to(self.io))
            cute.autovec_copy(out, cute.local_tile(sDs1, (1, SEG), (row, seg)))
        return total

    @cute.jit
    def split_operands(self, sQ: cute.Tensor, sK: cute.Tensor, sQn: cute.Tensor, sKn: cute.Tensor, sAn: cute.Tensor,
                       rows: cute.Tensor, tidx: Int32):
        """qn = q e^(gc - mid), kn = k e^(mid - gc), an = beta k e^(gc - mid) (64 x 64, the split type)."""
        segs = CHUNK // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        part = cute.make_rmem_tensor((1, SEG), self.io)
        out = cute.make_rmem_tensor((1, SEG), self.split)
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            up, down = rows[2, row], rows[3, row]
            cute.autovec_copy(cute.local_tile(sQ, (1, SEG), (row, seg)), part)
            out.store((part.load().to(Float32) * up).to(self.split))
            cute.autovec_copy(out, cute.local_tile(sQn, (1, SEG), (row, seg)))
            cute.autovec_copy(cute.local_tile(sK, (1, SEG), (row, seg)), part)
            k = part.load().to(Float32)
            out.store((k * down).to(self.split))
            cute.autovec_copy(out, cute.local_tile(sKn, (1, SEG), (row, seg)))
            out.store((k * (rows[5, row] * up)).to(self.split))
            cute.autovec_copy(out, cute.local_tile(sAn, (1, SEG), (row, seg)))

    def holds_last_block(self, gPre: cute.Tensor, sHeld) -> bool:
        """Whether the last key block of dq / dk waits for the norm's backward in shared memory (``sHeld``)
        instead of the scratch: where the scratch is in the input type (the same rounding)."""
        return self.use_l2 and sHeld is not None and gPre.element_type is self.io

    @cute.jit
    def leave(self, thr, acc: cute.Tensor, gPre: cute.Tensor, dst: cute.Tensor, row0: Int32, col0: Int32,
              start: Int32, count: Int32, kb: Int32, sHeld=None):
        """Key block kb of dq or dk (acc): with L2 norm into the scratch before the norm's backward (gPre, 64 x K
        by chunk: f32, or the input type with scratch="io_all"; the last block into ``sHeld`` where
        ``holds_last_block``: half the scratch's round trip at K = 128, all of it at 64), else into dst's rows."""
        if const_expr(self.use_l2):
            if const_expr(self.holds_last_block(gPre, sHeld)):
                if kb == self.K // CHUNK - 1:
                    self.store_fragment(acc, thr.partition_C(sHeld))
                else:
                    self.store_fragment(acc, thr.partition_C(cute.local_tile(gPre, (CHUNK, CHUNK), (0, kb))))
            else:
                self.store_fragment(acc, thr.partition_C(cute.local_tile(gPre, (CHUNK, CHUNK), (0, kb))))
        else:
            self.store_rows(acc, row0, col0, dst, start, count, kb)

    @cute.jit
    def store_rows(self, acc: cute.Tensor, row0: Int32, col0: Int32, dst: cute.Tensor, start: Int32, count: Int32,
                   kb: Int32):
        """acc (64 x 64 of key block kb) into dst's rows start + t, t < count, in dst's type."""
        for e in range_constexpr(cute.size(acc)):
            t, i = self.place(e, row0, col0)
            if t < count:
                dst[start + t, kb * CHUNK + i] = acc[e].to(dst.element_type)

    @cute.jit
    def finish(self, sums: cute.Tensor, dlast, rows: cute.Tensor, sWarp: cute.Tensor, row0: Int32,
               gDbv: cute.Tensor, mDg: cute.Tensor, mDbeta: cute.Tensor, h: Int32, start: Int32, count: Int32,
               tidx: Int32):
        """The row sums over a quad's lanes into rows[8..11]; the block's dlast into the last row's gate
        gradient; dg (the reverse cumulative sum of dgc) and dbeta (plus chunk_bwd_values' v part) stored."""
        self.quad_sums(sums, 4)
        for lane in range_constexpr(5):
            dlast = dlast + cute.arch.shuffle_sync_bfly(dlast, 1 << lane)
        self.put_row_sums(sums, rows, 8, 4, row0, tidx)
        if tidx % 32 == 0:
            sWarp[tidx // 32] = dlast
        cute.arch.sync_threads()
        if tidx < CHUNK:
            total = Float32(0.0)
            for w in range_constexpr(self.threads // 32):
                total = total + sWarp[w]
            dg = Float32(0.0)
            for j in range_constexpr(CHUNK):
                dg = dg + cutlass.select_(j >= tidx, rows[8, j], Float32(0.0))
            dg = Float32(dg + total)     # the last row's gate term reaches every row at or before it
            if tidx < count:
                mDg[start + tidx, h] = dg.to(mDg.element_type)
                mDbeta[start + tidx, h] = Float32(rows[9, tidx] + gDbv[tidx, 0]).to(mDbeta.element_type)

    @cute.jit
    def through_the_norm(self, gPre: cute.Tensor, gX: cute.Tensor, dst: cute.Tensor, rows: cute.Tensor,
                         which: cutlass.Constexpr, dot: cutlass.Constexpr, start: Int32, count: Int32, tidx: Int32,
                         sHeld=None):
        """dx = (dxn - xn (xn . dxn)) / ||x|| from the pre-norm gradient (64 x K, the scratch's type, its last key
        block in ``sHeld`` where ``leave`` put it there; the dot in f32 from the registers that held it) into dst's
        rows. Every pass's loads are issued before the first is used (unguarded: a row past the chunk's end reads
        its last token's x, and is not stored): loaded and used a pass at a time, they held an eighth of gdn's
        stall samples (ncu, H100, session 32)."""
        segs = self.K // SEG
        rows_per_pass = self.threads // segs
        passes = CHUNK // rows_per_pass
        seg = tidx % segs
        pre = cute.make_rmem_tensor(cute.make_layout((passes, SEG), stride=(SEG, 1)), gPre.element_type)
        x = cute.make_rmem_tensor(cute.make_layout((passes, SEG), stride=(SEG, 1)), self.io)
        out = cute.make_rmem_tensor((1, SEG), dst.element_type)
        held_from = (self.K - CHUNK) // SEG         # the first segment of the last key block
        for p in range_constexpr(passes):
            row = tidx // segs + p * rows_per_pass
            if const_expr(self.holds_last_block(gPre, sHeld)):
                if seg >= held_from:
                    cute.autovec_copy(cute.local_tile(sHeld, (1, SEG), (row, seg - held_from)),
                                      cute.local_tile(pre, (1, SEG), (p, 0)))
                else:
                    cute.autovec_copy(cute.local_tile(gPre, (1, SEG), (row, seg)),
                                      cute.local_tile(pre, (1, SEG), (p, 0)))
            else:
                cute.autovec_copy(cute.local_tile(gPre, (1, SEG), (row, seg)),
                                  cute.local_tile(pre, (1, SEG), (p, 0)))
            cute.autovec_copy(cute.local_tile(gX, (1, SEG), (start + cutlass.min(row, count - 1), seg)),
                              cute.local_tile(x, (1, SEG), (p, 0)))
        for p in range_constexpr(passes):
            row = tidx // segs + p * rows_per_pass
            if row < count:
                inv = rows[which, row]
                xn = cute.local_tile(x, (1, SEG), (p, 0)).load().to(Float32) * inv
                grad = cute.local_tile(pre, (1, SEG), (p, 0)).load().to(Float32)
                out.store(((grad - xn * rows[dot, row]) * inv).to(dst.element_type))
                cute.autovec_copy(out, cute.local_tile(dst, (1, SEG), (start + row, seg)))


def _pointer_types(io_dtype: str, g_dtype: str, beta_dtype: str, dq_dtype: str, dg_dtype: str,
                   dbeta_dtype: str, scratch_dtype: str = "float32", per_channel: bool = False,
                   own_dtype: str = "float32") -> tuple:
    """(element type, assumed alignment) of each pointer: q, k, g, beta, dO, cu_seqlens, hs (the recompute's
    scratch: f32 or the input type), dhs (the backward's own scratch: f32 or the input type), d (the recompute's),
    dCg and dA (own), dbeta's v part (f32), dq / dk before the norm (own), dq, dk, dg, dbeta. A per-channel g and
    dg are read and written a row of K at a time (16-byte segments of g)."""
    scratch, own = (scratch_dtype, 16), (own_dtype, 16)
    g = (g_dtype, 16) if per_channel else (g_dtype, ITEMSIZE[g_dtype])
    return ((io_dtype, 16), (io_dtype, 16), g, (beta_dtype, ITEMSIZE[beta_dtype]),
            (io_dtype, 16), ("int32", 4), scratch, own, scratch, own, own, ("float32", 4), own, own,
            (dq_dtype, 16), (dq_dtype, 16), (dg_dtype, ITEMSIZE[dg_dtype]), (dbeta_dtype, ITEMSIZE[dbeta_dtype]))


def bwd_grads_launcher(io_dtype: str, g_dtype: str, beta_dtype: str, dq_dtype: str, dg_dtype: str,
                       dbeta_dtype: str, K: int, V: int, HQ: int, H: int, use_l2: bool, scale: float,
                       n_seq: int, scratch_dtype: str = "float32", per_channel: bool = False,
                       own_dtype: str = "float32", warps: int = 4) -> KernelLauncher:
    """The launcher of one specialisation; its slots: q, k, g, beta, dO, cu_seqlens, hs, dhs, d, dCg, dA, dbeta's
    v part, dq / dk before the norm, dq, dk, dg, dbeta (hs and d in ``scratch_dtype``; dhs, dCg, dA and dq / dk
    before the norm in ``own_dtype``; g and dg per channel, (tokens, H, K), with ``per_channel``; ``warps`` a CTA:
    one of ``BLOCK_WARPS``)."""
    key = ("chunk_bwd_grads", io_dtype, g_dtype, beta_dtype, dq_dtype, dg_dtype, dbeta_dtype, K, V, HQ, H, use_l2,
           float(scale), scratch_dtype, per_channel, own_dtype, warps)
    from ._delta_bwd_grads_per_channel import DeltaBwdGradsPerChannel    # a subclass: its module imports this one
    kernel = DeltaBwdGradsPerChannel if per_channel else DeltaBwdGrads
    return KernelLauncher(lambda: kernel(io_dtype, g_dtype, beta_dtype, dq_dtype, dg_dtype, dbeta_dtype, K, V, HQ, H,
                                         use_l2, scale, warps),
                          key, _pointer_types(io_dtype, g_dtype, beta_dtype, dq_dtype, dg_dtype, dbeta_dtype,
                                              scratch_dtype, per_channel, own_dtype), n_seq)
