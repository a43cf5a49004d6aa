"""The chunked delta rule's gradients through the UT transform in CuTe DSL, for sm_90 (gdn and kda).

What ``engines/cutile/_kernels.chunk_bwd_values`` computes (scalar beta, no write gate), from the same
workspace regions, per (chunk of 64 tokens, value head): with T = (I + A)^-1, the chunk-start state S0 (hs),
the deltas' gradient dD (dd) and the recompute's W and U,

    dX = T^T dD,  dv = beta dX,  dbeta's v part = rowsum(v * dX),
    dW = -dD S0^T,  dCg = T^T dW,  dA = -strict_tril(dX U^T + dCg W^T).

Why: the cuTile kernel (0.42 ms of gdn's 2.35 ms backward at 4 x 2048 tokens, 16 heads, K = V = 128 on the
H100) forms T again from k, g and beta: the recompute's prepare did that already, so here the backward's
prepare (``_delta_prepare.DeltaPrepareInverse``) leaves T in dA's region, which this kernel reads
before it writes dA over it (each CTA its own chunk's 64 x 64: no other CTA reads it), or a backward from
the forward's ``chunk_cache`` hands it the T the forward's prepare wrote there. Nothing else depends
on the gate, so one kernel serves gdn and kda. A CTA of four warps holds its operands in the input type
(rounded from f32 scratch, or copied where the plan keeps its scratch in the input type) in shared memory (94
KB at K = V = 128: two CTAs an SM, eight warps). With ``warps=8`` (knob ``values_warps``) the same shared memory
serves eight warps, the second four along the columns of every product (``ChunkKernel.warp_mma``), so an SM holds
sixteen: the kernel moves ~0.3 GB at 4 x 2048, H 16, K = V = 128, and with eight warps an SM its loads and
products wait on each other (H100, session 31: 61% of DRAM bandwidth, ~12.7 cycles between a warp's
instructions). Its steps:

1. T, dD, S0 (K rows), U rounded, v and beta;
2. dW = dD S0^T, negated into S0's place;
3. dX = T^T dD, the row sums of v * dX into dbeta's v part, dX into v's place and dv = beta dX out through
   dD's place;
4. dCg = T^T dW to its scratch from the accumulators, rounded into S0's place beside dW; W rounded into
   dD's place;
5. dA = -strict_tril(dX U^T + dCg W^T) over T's region.

The products take BF16 / FP16 operands with f32 accumulation (the cuTile kernel: TF32).

With ``deltas`` (a backward from the forward's ``state_checkpoints``: no state pass recomputes the chunk-start
states, so none leaves the deltas either) step 1 ends with ``D = U - W S0`` into d, the scratch the
recompute's state pass would have written (chunk_bwd_grads reads it), U from f32 scratch in f32 as the state
pass reads it: W is loaded with the other operands over v's place where K <= V, and v follows by cp.async
during step 2 (one round of loads, as without); at K > V over dD's place, and dD and v follow the product.
On 16-bit scratch it forms U too: ``U = T (beta v)``, beta v into U's place as v is loaded (the prepare reads no
v and writes no u for such a backward: ``DeltaPrepareInverse(store_u=False)``; 48 KB less traffic a chunk at
K = V = 128 in BF16 for one more 64 x 64 x V product and a barrier), D from U in f32, U rounded into its place.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr, range_constexpr
from cutlass.memory import SmemAllocator

from ._delta_chunk import (CHUNK, DTYPES, ITEMSIZE, PAD, THREADS, ChunkKernel, KernelLauncher, chunk_major,
                           shared_field, shared_struct)


class DeltaBwdValues(ChunkKernel):
    """One specialisation: the input type, beta's type, dv's type, K, V, the value heads ``H``, the warps a
    CTA (``BLOCK_WARPS``) and whether it forms the deltas (``deltas``). Called with v, beta, cu_seqlens, hs, dd,
    w, u, dv, dCg, T (dA's region, or the forward's chunk cache), dA, dbeta's v part, d (written with ``deltas``,
    else not read), then tokens, chunks, sequences."""

    def __init__(self, io_dtype: str, beta_dtype: str, dv_dtype: str, K: int, V: int, H: int, warps: int = 4,
                 deltas: bool = False):
        # no key heads are read: the grouping of value heads over key heads does not enter
        self.set_heads(io_dtype, K, V, H, H, False)
        self.set_warps(warps)
        self.beta_type = DTYPES[beta_dtype]
        self.dv_type = DTYPES[dv_dtype]
        self.dv_itemsize = ITEMSIZE[dv_dtype]
        self.deltas = deltas

    @property
    def _wide(self) -> int:
        """Elements per padded row of a buffer that holds K or V columns (dD then W; v then dX)."""
        return max(self.K, self.V) + PAD

    def shared_storage(self):
        wide_rows = CHUNK * self._wide
        # dv leaves through dD's place in its own type (f32: twice the 16-bit room)
        stage = CHUNK * (self.V + PAD) * self.dv_itemsize // 2
        return shared_struct("DeltaBwdValuesStorage", {
            "t": shared_field(self.io, CHUNK * (CHUNK + PAD)),
            "dd": shared_field(self.io, max(wide_rows, stage)),
            # S0's K rows, then -dW and dCg (64 x K each) in their place
            "s0": shared_field(self.io, max(self.K * (self.V + PAD), 2 * CHUNK * (self.K + PAD))),
            "v": shared_field(self.io, CHUNK * (self.V + PAD)), "u": shared_field(self.io, CHUNK * (self.V + PAD)),
            "beta": shared_field(Float32, CHUNK), "scan": shared_field(Int32, THREADS),
            "where": shared_field(Int32, 4),
            # eight warps: the row sums of warps 4-7 (the rows' other columns), added in by warps 0-3
            **({"row_sums": shared_field(Float32, CHUNK)} if self.threads != THREADS else {})})

    def shared_bytes(self) -> int:
        return self.shared_storage().size_in_bytes()

    @cute.jit
    def __call__(self, pv: cute.Pointer, pbeta: cute.Pointer, pcu: cute.Pointer, phs: cute.Pointer,
                 pdd: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pdv: cute.Pointer, pdcg: cute.Pointer,
                 pt: cute.Pointer, pda: cute.Pointer, pdbv: cute.Pointer, pd: cute.Pointer, tokens: Int32,
                 chunks: Int32, n_seq: Int32, stream: cuda.CUstream):
        self.kernel(pv, pbeta, pcu, phs, pdd, pw, pu, pdv, pdcg, pt, pda, pdbv, pd, tokens, chunks, n_seq).launch(
            grid=[chunks, self.H, 1], block=[self.threads, 1, 1], smem=self.shared_bytes(), stream=stream,
            **self.launch_options())

    @cute.kernel
    def kernel(self, pv: cute.Pointer, pbeta: cute.Pointer, pcu: cute.Pointer, phs: cute.Pointer,
               pdd: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pdv: cute.Pointer, pdcg: cute.Pointer,
               pt: cute.Pointer, pda: cute.Pointer, pdbv: cute.Pointer, pd: cute.Pointer, tokens: Int32,
               chunks: Int32, n_seq: Int32):
        K, V, H = self.K, self.V, self.H
        io = self.io
        mV = cute.make_tensor(pv, cute.make_layout((tokens, H, V), stride=(H * V, V, 1)))
        mBeta = cute.make_tensor(pbeta, cute.make_layout((tokens, H), stride=(H, 1)))
        mCu = cute.make_tensor(pcu, cute.make_layout((n_seq + 1,), stride=(1,)))
        mHs = cute.make_tensor(phs, cute.make_layout((chunks, H, K, V), stride=(H * K * V, K * V, V, 1)))
        mDd, mU, mD = chunk_major(pdd, chunks, H, V), chunk_major(pu, chunks, H, V), chunk_major(pd, chunks, H, V)
        mW, mDcg = chunk_major(pw, chunks, H, K), chunk_major(pdcg, chunks, H, K)
        mT, mDa = chunk_major(pt, chunks, H, CHUNK), chunk_major(pda, chunks, H, CHUNK)
        mDbv = chunk_major(pdbv, chunks, H, 1)
        mDv = cute.make_tensor(pdv, cute.make_layout((tokens, H, V), stride=(H * V, V, 1)))
        tiled_mma, tidx, h, _, thr = self.block_heads()

        storage = SmemAllocator().allocate(self.shared_storage())
        wide = self._wide
        sT = cute.make_tensor(storage.t.data_ptr(), cute.make_layout((CHUNK, CHUNK), stride=(CHUNK + PAD, 1)))
        sDd = cute.make_tensor(storage.dd.data_ptr(), cute.make_layout((CHUNK, V), stride=(wide, 1)))
        sW = cute.make_tensor(storage.dd.data_ptr(), cute.make_layout((CHUNK, K), stride=(wide, 1)))
        stage = cute.make_tensor(cute.recast_ptr(storage.dd.data_ptr(), dtype=self.dv_type),
                                 cute.make_layout((CHUNK, V), stride=(V + PAD, 1)))
        sS0 = cute.make_tensor(storage.s0.data_ptr(), cute.make_layout((K, V), stride=(V + PAD, 1)))
        k_rows = cute.make_layout((CHUNK, K), stride=(K + PAD, 1))
        sDw = cute.make_tensor(storage.s0.data_ptr(), k_rows)
        sDcg = cute.make_tensor(storage.s0.data_ptr() + cute.cosize(k_rows), k_rows)
        v_rows = cute.make_layout((CHUNK, V), stride=(V + PAD, 1))
        sV = cute.make_tensor(storage.v.data_ptr(), v_rows)     # v, then dX in its place
        # deltas with K <= V: W over v's place for D = U - W S0, before v comes
        sWv = cute.make_tensor(storage.v.data_ptr(), cute.make_layout((CHUNK, K), stride=(V + PAD, 1)))
        sU = cute.make_tensor(storage.u.data_ptr(), v_rows)
        sBeta = cute.make_tensor(storage.beta.data_ptr(), cute.make_layout((CHUNK,)))

        c, seq, start, count = self.chunk_of_block(mCu, n_seq, tidx, storage)
        if seq < n_seq:
            acc_v = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, V)), Float32)
            # deltas: W over v's place where it fits (v comes by cp.async once D is formed), else over dD's
            w_over_v = const_expr(self.deltas and K <= V)
            # 1. the operands (T from the prepare, in dA's region and read here before dA is written over it, or
            # from the forward's chunk cache)
            if tidx < CHUNK:
                b = Float32(0.0)
                if tidx < count:
                    b = mBeta[start + tidx, h].to(Float32)
                sBeta[tidx] = b
            gDa = mDa[c, h, None, None]
            self.scratch_rows(mT[c, h, None, None], sT, CHUNK, tidx)
            if const_expr(not self.deltas or w_over_v):
                self.scratch_rows(mDd[c, h, None, None], sDd, V, tidx)
            self.scratch_rows(mHs[c, h, None, None], sS0, V, tidx, rows=K)
            # U = T (beta v) here where the scratch is 16-bit and the deltas are formed (the prepare writes no u:
            # DeltaPrepareInverse(store_u=False)): beta v into U's place as it is loaded
            u_from_t = const_expr(self.deltas and mU.element_type is not Float32)
            if const_expr(u_from_t):
                def times_beta(p, row, seg, x):
                    return x * mBeta[start + cutlass.min(row, count - 1), h].to(Float32)
                self.load_rows(mV[None, h, None], sU, start, count, V, False, tidx, store=times_beta)
            else:
                self.scratch_rows(mU[c, h, None, None], sU, V, tidx)
            if const_expr(w_over_v):
                self.scratch_rows(mW[c, h, None, None], sWv, K, tidx)
            elif const_expr(self.deltas):
                self.scratch_rows(mW[c, h, None, None], sW, K, tidx)
            if const_expr(not self.deltas):
                self.load_rows(mV[None, h, None], sV, start, count, V, False, tidx)
            if const_expr(u_from_t):
                # 0. U = T (beta v) in f32, rounded into U's place once every warp has read beta v there; then
                # D = U - W S0 into d, from U in f32 (-U, plus W S0, negated)
                cute.arch.sync_threads()
                acc_v.fill(0.0)
                self.product_bt(tiled_mma, acc_v, sT, sU, CHUNK, V, V + PAD, tidx)
                u_io = cute.make_rmem_tensor(acc_v.shape, io)
                u_io.store(acc_v.load().to(io))
                cute.arch.sync_threads()
                cute.autovec_copy(u_io, thr.partition_C(sU))
                acc_v.store(-acc_v.load())
                self.product_bt(tiled_mma, acc_v, sWv if const_expr(w_over_v) else sW, sS0, K, V, V + PAD, tidx)
                acc_v.store(-acc_v.load())
                self.store_fragment(acc_v, thr.partition_C(mD[c, h, None, None]))
            elif const_expr(self.deltas):
                # 0. D = U - W S0 into d (U in f32 from f32 scratch, as the state pass reads it)
                u_part = cute.make_rmem_tensor(acc_v.shape, Float32)
                self.load_fragment(thr.partition_C(mU[c, h, None, None]), u_part)
                cute.arch.sync_threads()
                acc_v.fill(0.0)
                self.product_bt(tiled_mma, acc_v, sWv if const_expr(w_over_v) else sW, sS0, K, V, V + PAD, tidx)
                acc_v.store(u_part.load() - acc_v.load())
                self.store_fragment(acc_v, thr.partition_C(mD[c, h, None, None]))
            if const_expr(self.deltas):
                cute.arch.sync_threads()        # W's readers are done: v (or dD and v) take its place
                if const_expr(w_over_v):
                    # waited on before step 3 reads it; a row past the chunk's end copies its last (dX is 0 there)
                    self.copy_rows_async(mV[None, h, None], sV, V, tidx, start, count)
                else:
                    self.scratch_rows(mDd[c, h, None, None], sDd, V, tidx)
                    self.load_rows(mV[None, h, None], sV, start, count, V, False, tidx)
            cute.arch.sync_threads()

            row0, col0 = self.first_place(tidx)

            # 2. dW = dD S0^T, negated into S0's place
            acc_k = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, K)), Float32)
            acc_k.fill(0.0)
            self.product(tiled_mma, acc_k, sDd, sS0, tidx)
            out_k = cute.make_rmem_tensor(acc_k.shape, io)
            out_k.store((-acc_k.load()).to(io))
            if const_expr(w_over_v):
                cute.arch.cp_async_wait_group(0)
            cute.arch.sync_threads()            # every warp has read S0 (and v is in)
            cute.autovec_copy(out_k, thr.partition_C(sDw))

            # 3. dX = T^T dD: dbeta's v part, dX into v's place, dv = beta dX out through dD's place
            acc_v.fill(0.0)
            self.product_tt(tiled_mma, acc_v, sT, sDd, CHUNK, CHUNK, V, CHUNK + PAD, wide, tidx)
            sums = cute.make_rmem_tensor((1, 2), Float32)
            sums.fill(0.0)
            for e in range_constexpr(cute.size(acc_v)):
                t, i = self.place(e, row0, col0)
                self.add_row(sums, 0, e, sV[t, i].to(Float32) * acc_v[e])
            self.quad_sums(sums, 1)
            self.put_row_sums(sums, mDbv, c, h, row0, tidx, storage)
            out_v = cute.make_rmem_tensor(acc_v.shape, io)
            out_v.store(acc_v.load().to(io))
            for e in range_constexpr(cute.size(acc_v)):
                t, i = self.place(e, row0, col0)
                acc_v[e] = acc_v[e] * sBeta[t]
            # a thread read v where it writes dX (no barrier); store_staged's barriers follow every read of dD
            # and precede dX's and -dW's readers below
            cute.autovec_copy(out_v, thr.partition_C(sV))
            self.store_staged(tiled_mma, acc_v, stage, mDv[None, h, None], start, count, V, tidx)

            # 4. dCg = T^T dW to its scratch and into S0's place; W into dD's place once dv is out
            acc_k.fill(0.0)
            self.product_tt(tiled_mma, acc_k, sT, sDw, CHUNK, CHUNK, K, CHUNK + PAD, K + PAD, tidx)
            # dCg's scratch: f32, or the input type (scratch="io_all") as rounded here for the products
            gDcg = thr.partition_C(mDcg[c, h, None, None])
            if const_expr(mDcg.element_type is Float32):
                cute.autovec_copy(acc_k, gDcg)
                out_k.store(acc_k.load().to(io))
            else:
                out_k.store(acc_k.load().to(io))
                cute.autovec_copy(out_k, gDcg)
            cute.autovec_copy(out_k, thr.partition_C(sDcg))
            cute.arch.sync_threads()            # dv has left dD's place
            self.scratch_rows(mW[c, h, None, None], sW, K, tidx)
            cute.arch.sync_threads()

            # 5. dA = -strict_tril(dX U^T + dCg W^T) over T's place
            acc = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, CHUNK)), Float32)
            acc.fill(0.0)
            self.product(tiled_mma, acc, sV, sU, tidx)
            self.product(tiled_mma, acc, sDcg, sW, tidx)
            for e in range_constexpr(cute.size(acc)):
                t, j = self.place(e, row0, col0)
                acc[e] = cutlass.select_(t > j, -acc[e], Float32(0.0))
            self.store_fragment(acc, thr.partition_C(gDa))

    @cute.jit
    def put_row_sums(self, sums: cute.Tensor, mDbv: cute.Tensor, c: Int32, h: Int32, row0: Int32, tidx: Int32,
                     storage):
        """dbeta's v part, the row sums of ``quad_sums`` (rows row0 and row0 + 8), into chunk c's rows of ``mDbv``
        at head h, one lane a quad. With eight warps, warps w and w + 4 hold halves of the same rows: the second's
        sums meet the first's in shared memory, after a barrier."""
        if const_expr(self.threads == THREADS):
            if tidx % 4 == 0:
                mDbv[c, h, row0, 0] = sums[0, 0]
                mDbv[c, h, row0 + 8, 0] = sums[0, 1]
        else:
            sRowSums = cute.make_tensor(storage.row_sums.data_ptr(), cute.make_layout((CHUNK,)))
            if tidx % 4 == 0 and tidx >= THREADS:
                sRowSums[row0] = sums[0, 0]
                sRowSums[row0 + 8] = sums[0, 1]
            cute.arch.sync_threads()
            if tidx % 4 == 0 and tidx < THREADS:
                mDbv[c, h, row0, 0] = sums[0, 0] + sRowSums[row0]
                mDbv[c, h, row0 + 8, 0] = sums[0, 1] + sRowSums[row0 + 8]


def _pointer_types(io_dtype: str, beta_dtype: str, dv_dtype: str, scratch_dtype: str = "float32",
                   own_dtype: str = "float32") -> tuple:
    """(element type, assumed alignment) of each pointer: v, beta, cu_seqlens, hs (the recompute's scratch: f32 or
    the input type), dd (the backward's own scratch: f32 or the input type), w, u (the recompute's), dv, dCg, T,
    dA (all three own), dbeta's v part (f32), d (the recompute's)."""
    scratch, own = (scratch_dtype, 16), (own_dtype, 16)
    return ((io_dtype, 16), (beta_dtype, ITEMSIZE[beta_dtype]), ("int32", 4), scratch, own, scratch, scratch,
            (dv_dtype, 16), own, own, own, ("float32", 4), scratch)


def bwd_values_launcher(io_dtype: str, beta_dtype: str, dv_dtype: str, K: int, V: int, H: int,
                        n_seq: int, scratch_dtype: str = "float32", own_dtype: str = "float32",
                        warps: int = 4, deltas: bool = False) -> KernelLauncher:
    """The launcher of one specialisation; its slots: v, beta, cu_seqlens, hs, dd, w, u, dv, dCg, T (read; dA's
    region itself, or a chunk cache's), dA (written), dbeta's v part, d (hs, w, u and d in ``scratch_dtype``; dd,
    dCg, T and dA in ``own_dtype``; ``warps`` a
    CTA: one of ``BLOCK_WARPS``; ``deltas``: it writes d = U - W S0, else d is not touched)."""
    key = ("chunk_bwd_values", io_dtype, beta_dtype, dv_dtype, K, V, H, scratch_dtype, own_dtype, warps, deltas)
    return KernelLauncher(lambda: DeltaBwdValues(io_dtype, beta_dtype, dv_dtype, K, V, H, warps, deltas), key,
                          _pointer_types(io_dtype, beta_dtype, dv_dtype, scratch_dtype, own_dtype), n_seq)
