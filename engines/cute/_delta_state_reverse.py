"""The chunked delta rule's backward reverse state pass in CuTe DSL, for sm_90 (gdn and kda):
``engines/cutile/_kernels.chunk_bwd_state_pass``'s work, per (sequence, value head, block of BV value
columns), chunks last to first (``DeltaStatePassReverse``'s docstring); the forward's staged state pass
(``_delta_state.DeltaStatePass``) gives it its block start, sequence walk and products.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr, range_constexpr
from cutlass.memory import SmemAllocator

from ._delta_chunk import CHUNK, PAD, SEG, KernelLauncher, chunk_major, shared_field, shared_struct
from ._delta_state import DeltaStatePass, _pointer_types


class DeltaStatePassReverse(DeltaStatePass):
    """The backward's reverse state pass (``engines/cutile/_kernels.chunk_bwd_state_pass``), per (sequence, value
    head, block of BV value columns), chunks last to first, dS (K x BV) in f32 accumulators::

        dhs[c] = dS,   dD = P + KD dS  -> dd[c] (over chunk_bwd_intra's P),   dS <- e^(gc_last) dS + qg^T dO - W^T dD

    from the backward's scratch (kd, w, qg by chunk, f32 rounded to the input type into shared memory each step,
    or in the input type: kd and w with scratch="io", qg, P / dD and dhs too with "io_all"), dO in the input type,
    and dht / dh0 for the sequence's end and start (the base class's h0 / ht views and flags: carried in and out).
    Products in the input type with f32 accumulation (the cuTile kernel's with BF16 products, mma="bf16"). One
    more product a step than the forward's staged step; the same longest-first order (``work_of_block``).
    ``prefetch`` (16-bit w, kd and P: "io_all"): the previous chunk's W, KD, dO rows, P fragment and closing gate
    are loaded into registers while this chunk is computed, as the forward's pass does; at K = 64 qg's rows come by
    cp.async into the second of two buffers (``qg_buffers``; no registers left for them). A step's qg load, waited on
    as it was stored, held a fifth of the pass's stall samples at K = 128 (ncu, H100, session 32)."""

    prefetch = False

    @property
    def qg_buffers(self) -> int:
        """qg's shared buffers: two where the next chunk's rows arrive by cp.async during a step (the prefetching
        form at K = 64: 0.080 -> 0.058 ms at 4 x 2048, H 16 on the H100). At K = 128 cp.async made the pass slower
        both so (0.155 -> 0.167 ms, 17 KB more shared memory) and into the one buffer during the step's first
        product (0.165), so there a step loads its own qg as before."""
        return 2 if self.prefetch and self.K <= CHUNK else 1

    def qg_buffer(self, storage, step):
        """The qg buffer of step ``step`` (a run-time count: the prefetching form alternates two)."""
        rows_k = CHUNK * (self.K + PAD)      # 16-byte multiple: the second buffer's rows stay aligned for ldmatrix
        offset = cute.assume((step % self.qg_buffers) * rows_k, divby=rows_k)
        return cute.make_tensor(storage.qg.data_ptr() + offset,
                                cute.make_layout((CHUNK, self.K), stride=(self.K + PAD, 1)))

    def shared_storage(self):
        rows_k = CHUNK * (self.K + PAD)
        rows_bv = CHUNK * (self.BV + PAD)
        return shared_struct("DeltaStateReverseStorage", {
            "w": shared_field(self.io, rows_k), "kd": shared_field(self.io, rows_k),
            "qg": shared_field(self.io, rows_k * self.qg_buffers),
            "s": shared_field(self.io, self.K * (self.BV + PAD)), "do": shared_field(self.io, rows_bv),
            "dd": shared_field(self.io, rows_bv), "first": shared_field(Int32, self.threads),
            "decay": shared_field(Float32, self.K if self.per_channel else 1)})

    @cute.jit
    def __call__(self, pdo: cute.Pointer, pw: cute.Pointer, pkd: cute.Pointer, pqg: cute.Pointer, pg: cute.Pointer,
                 pcu: cute.Pointer, pdht: cute.Pointer, pdhs: cute.Pointer, pdd: cute.Pointer, pdh0: cute.Pointer,
                 tokens: Int32, chunks: Int32, n_seq: Int32, stream: cuda.CUstream):
        self.kernel(pdo, pw, pkd, pqg, pg, pcu, pdht, pdhs, pdd, pdh0, tokens, chunks, n_seq).launch(
            grid=[n_seq, self.H, self.V // self.BV], block=[self.threads, 1, 1], smem=self.shared_bytes(),
            stream=stream, **self.launch_options())

    @cute.kernel
    def kernel(self, pdo: cute.Pointer, pw: cute.Pointer, pkd: cute.Pointer, pqg: cute.Pointer, pg: cute.Pointer,
               pcu: cute.Pointer, pdht: cute.Pointer, pdhs: cute.Pointer, pdd: cute.Pointer, pdh0: cute.Pointer,
               tokens: Int32, chunks: Int32, n_seq: Int32):
        K, V, BV, H = self.K, self.V, self.BV, self.H
        io = self.io
        mKd, mW, mDd, mG, mCu, mDhs = self.chunk_views(pkd, pw, pdd, pg, pcu, pdhs, tokens, chunks, n_seq)
        mQg = chunk_major(pqg, chunks, H, K)
        # dO viewed by value block: this CTA's BV columns of every token are one (tokens, BV) slice
        mDo = cute.make_tensor(pdo, cute.make_layout((tokens, H, V // BV, BV), stride=(H * V, V, BV, 1)))
        mDht, mDh0 = self.sequence_states(pdht, pdh0, n_seq)
        storage = SmemAllocator().allocate(self.shared_storage())
        tiled_mma, tidx, thr, sFirst, n, h, vb, sDecay, state_rows = self.block_start(mCu, n_seq, storage)
        sW, sKd, sQg = self.key_rows(storage)
        sS = cute.make_tensor(storage.s.data_ptr(), cute.make_layout((K, BV), stride=(BV + PAD, 1)))
        rows_bv = cute.make_layout((CHUNK, BV), stride=(BV + PAD, 1))
        sDo = cute.make_tensor(storage.do.data_ptr(), rows_bv)
        sDd = cute.make_tensor(storage.dd.data_ptr(), rows_bv)
        gDo = mDo[None, h, vb, None]

        # dS from d_final_state (the base class's h0 flag and view) or zero
        bos, eos, first, n_chunks, ds = self.sequence_start(mCu, mDht, thr, n, h, vb, tidx, sFirst)
        s_io = cute.make_rmem_tensor(ds.shape, io)
        dd = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, BV)), Float32)
        dd_io = cute.make_rmem_tensor(dd.shape, io)
        ahead = None
        if const_expr(self.prefetch):
            ahead = (self.row_registers(K), self.row_registers(K), self.row_registers(BV),
                     cute.make_rmem_tensor(dd.shape, io), cute.make_rmem_tensor((1,), Float32))
            if n_chunks > 0:     # an empty sequence's "first" chunk may lie past the workspace
                self.fetch_reverse(mW, mKd, mDd, gDo, mG, thr, ahead, first, n_chunks - 1, bos, eos, h, vb, tidx)
                if const_expr(self.qg_buffers == 2):
                    self.copy_rows_async(mQg[first + n_chunks - 1, h, None, None], self.qg_buffer(storage, 0), K,
                                         tidx)
        for jj in cutlass.range(n_chunks):
            j = n_chunks - 1 - jj
            c = first + j
            start = bos + j * CHUNK
            stop = cutlass.min(start + CHUNK, eos)
            cute.arch.sync_threads()        # the previous step's readers of every buffer are done
            sQg_step = sQg
            if const_expr(self.prefetch):
                if const_expr(self.qg_buffers == 2):
                    # the next step's qg into the buffer the previous step read (the first chunk's again at the last)
                    self.copy_rows_async(mQg[first + cutlass.max(j - 1, 0), h, None, None],
                                         self.qg_buffer(storage, jj + 1), K, tidx)
                    sQg_step = self.qg_buffer(storage, jj)
                self.put_rows(ahead[0], sW, K, tidx)
                self.put_rows(ahead[1], sKd, K, tidx)
                self.put_rows(ahead[2], sDo, BV, tidx)
                dd.store(ahead[3].load().to(Float32))
                gate = ahead[4][0]
                # the first chunk fetches itself again (a wasted load rather than a branch in the chain)
                self.fetch_reverse(mW, mKd, mDd, gDo, mG, thr, ahead, first, cutlass.max(j - 1, 0), bos, eos, h,
                                   vb, tidx)
            s_io.store(ds.load().to(io))
            gDhs = thr.partition_C(cute.local_tile(mDhs[c, h, None, None], (K, BV), (0, vb)))
            if const_expr(mDhs.element_type is Float32):
                cute.autovec_copy(ds, gDhs)
            else:
                cute.autovec_copy(s_io, gDhs)
            self.store_fragment_matrices(tiled_mma, s_io, sS, tidx)
            decay = Float32(0.0)
            if const_expr(self.prefetch):
                gDd = thr.partition_C(cute.local_tile(mDd[c, h, None, None], (CHUNK, BV), (0, vb)))
                if const_expr(self.qg_buffers == 1):
                    self.scratch_rows(mQg[c, h, None, None], sQg, K, tidx)
                if const_expr(self.per_channel):
                    if tidx < K:
                        sDecay[tidx] = cute.math.exp(gate)
                else:
                    decay = cute.math.exp(gate)
            else:
                self.scratch_rows(mKd[c, h, None, None], sKd, K, tidx)
                self.scratch_rows(mW[c, h, None, None], sW, K, tidx)
                self.scratch_rows(mQg[c, h, None, None], sQg, K, tidx)
                self.load_rows(gDo, sDo, start, stop - start, BV, False, tidx)
                gDd = thr.partition_C(cute.local_tile(mDd[c, h, None, None], (CHUNK, BV), (0, vb)))
                self.load_fragment(gDd, dd)
                if const_expr(self.per_channel):
                    if tidx < K:
                        sDecay[tidx] = cute.math.exp(mG[stop - 1, h, tidx])
                else:
                    decay = cute.math.exp(mG[stop - 1, h])
            cute.arch.sync_threads()
            # dD = P + KD dS
            self.product_bt(tiled_mma, dd, sKd, sS, K, BV, BV + PAD, tidx)
            if const_expr(mDd.element_type is Float32):
                cute.autovec_copy(dd, gDd)
                dd_io.store((-dd.load()).to(io))
            else:
                dd_io.store(dd.load().to(io))
                cute.autovec_copy(dd_io, gDd)
                dd_io.store(-dd_io.load())
            self.store_fragment_matrices(tiled_mma, dd_io, sDd, tidx)
            if const_expr(self.qg_buffers == 2):
                cute.arch.cp_async_wait_group(1)        # this step's qg is in (the next step's may be in flight)
            cute.arch.sync_threads()
            # dS <- e^(gc_last) dS + qg^T dO - W^T dD
            if const_expr(self.per_channel):
                for e in range_constexpr(cute.size(ds)):
                    ds[e] = ds[e] * sDecay[state_rows[e][0]]
            else:
                ds.store(ds.load() * decay)
            self.product_tt(tiled_mma, ds, sQg_step, sDo, CHUNK, K, BV, K + PAD, BV + PAD, tidx)
            self.product_tt(tiled_mma, ds, sW, sDd, CHUNK, K, BV, K + PAD, BV + PAD, tidx)
        if const_expr(self.qg_buffers == 2):
            cute.arch.cp_async_wait_group(0)            # the last step's wasted copy lands before the CTA ends
        if const_expr(self.store_ht):
            cute.autovec_copy(ds, thr.partition_C(cute.local_tile(mDh0[n, h, None, None], (K, BV), (0, vb))))


    @cute.jit
    def fetch_reverse(self, mW: cute.Tensor, mKd: cute.Tensor, mDd: cute.Tensor, gDo: cute.Tensor, mG: cute.Tensor,
                      thr, ahead: tuple, first: Int32, j: Int32, bos: Int32, eos: Int32, h: Int32, vb: Int32,
                      tidx: Int32):
        """The sequence's chunk j into ``ahead`` (issued, not waited on): W's and KD's rows, dO's rows (zeros past
        the sequence's end), this thread's P fragment and the gate sum at the chunk's last row."""
        c = first + j
        start = bos + j * CHUNK
        self.fetch_rows(mW[c, h, None, None], ahead[0], self.K, tidx)
        self.fetch_rows(mKd[c, h, None, None], ahead[1], self.K, tidx)
        segs = self.BV // SEG
        rows_per_pass = self.threads // segs
        for p in range_constexpr(CHUNK // rows_per_pass):
            self.load_segment(gDo, cute.local_tile(ahead[2], (1, SEG), (p, 0)), start,
                              tidx // segs + p * rows_per_pass, tidx % segs, cutlass.min(eos - start, CHUNK))
        cute.autovec_copy(thr.partition_C(cute.local_tile(mDd[c, h, None, None], (CHUNK, self.BV), (0, vb))),
                          ahead[3])
        last = cutlass.min(start + CHUNK, eos) - 1
        if const_expr(self.per_channel):
            if tidx < self.K:
                ahead[4][0] = mG[last, h, tidx]
        else:
            ahead[4][0] = mG[last, h]


class DeltaStatePassReversePrefetch(DeltaStatePassReverse):
    """``DeltaStatePassReverse`` with the previous chunk's loads in flight during each step (16-bit scratch)."""

    prefetch = True


def _reverse_pointer_types(io_dtype: str, scratch_dtype: str = "float32", own_dtype: str = "float32") -> tuple:
    """dO, w and kd (the recompute's scratch: f32 or the input type), qg (the backward's own scratch: f32 or the
    input type), g (the gate sums, f32), cu_seqlens, dht (f32), dhs and dD (own), dh0 (f32)."""
    f32 = ("float32", 16)
    g = _pointer_types(io_dtype)[3]
    scratch, own = (scratch_dtype, 16), (own_dtype, 16)
    return ((io_dtype, 16), scratch, scratch, own, g, ("int32", 4), f32, own, own, f32)


def reverse_state_pass_launcher(io_dtype: str, K: int, V: int, BV: int, H: int, has_dht: bool, has_h0: bool,
                                n_seq: int, per_channel: bool = False, scratch_dtype: str = "float32",
                                own_dtype: str = "float32", prefetch: bool = False) -> KernelLauncher:
    """The launcher of one ``DeltaStatePassReverse`` specialisation (BV value columns a CTA; ``prefetch``: its
    ``DeltaStatePassReversePrefetch`` form, for 16-bit w, kd and dD); its slots: dO, w, kd, qg, g, cu_seqlens,
    dht, dhs, dD, dh0 (w and kd in ``scratch_dtype``; qg, dhs and dD in ``own_dtype``)."""
    if prefetch and "float32" in (scratch_dtype, own_dtype):
        raise ValueError("the prefetching reverse pass holds w, kd and dD in 16-bit registers: it needs 16-bit "
                         f"scratch (got scratch {scratch_dtype}, own {own_dtype})")
    key = ("chunk_bwd_state_pass", io_dtype, K, V, BV, H, has_dht, has_h0, per_channel, scratch_dtype, own_dtype,
           prefetch)
    kind = DeltaStatePassReversePrefetch if prefetch else DeltaStatePassReverse
    return KernelLauncher(lambda: kind(io_dtype, K, V, BV, H, has_dht, has_h0, per_channel), key,
                          _reverse_pointer_types(io_dtype, scratch_dtype, own_dtype), n_seq)
