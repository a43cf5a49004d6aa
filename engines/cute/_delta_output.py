"""The chunked delta rule's output in CuTe DSL, for sm_90: a per-token (scalar) gate (gdn) or per-channel
gates (kda).

What ``engines/cutile/_kernels.chunk_output`` computes for gdn and kda, from the same workspace regions (the
chunk-start states ``hs`` and deltas ``d`` of the state pass, the cumulative gates), per (chunk of 64
tokens, value head) over all of V::

    o = (scale q e^gc) S0 + attn d,   attn[t, j] = scale (q_t . k_j) e^(gc_t - gc_j) for j <= t, else 0

Why: the cuTile kernel took 0.10 ms at 4 x 2048 tokens, 16 heads, K = V = 128 on the H200 where
flash-linear-attention's takes 0.074. Here a CTA of 128 threads holds q, one 64-row operand buffer
and attn in about 45 KB of shared memory (several CTAs an SM):

1. locate the chunk (``ChunkKernel.locate_chunk``); the cumulative gates of its rows (rows past the end
   repeat the last: their q and k rows are zero, and a finite gate keeps 0 * e^x at 0);
2. q and k rows (L2-normalised when asked) into shared memory; ``q k^T`` on the tensor cores, masked,
   decayed and scaled into ``attn`` in the input type; q's rows scaled by ``scale e^gc`` in place;
3. the state product over K in blocks of 64 rows of S0, then ``attn d``, each operand read into the one
   buffer in turn (k's, once attn is formed), all into one set of f32 accumulators; gdn loads S0's first
   block into registers before q and k, so that its loads overlap theirs and the scores;
4. o's valid rows stored through shared memory in 16-byte segments.

Per-channel gates (kda) cannot scale attn after the product: the decay is in its operands instead, split
at the chunk's row SPLIT_ROW as the cuTile kernel's (``q e^(gc - gc_mid)`` and ``k e^(gc_mid - gc)``:
either factor spans at most half a chunk of decay), and q's copy is rescaled by ``scale e^gc_mid`` for
``scale q e^gc``.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr, range_constexpr
from cutlass.memory import SmemAllocator

from ._delta_chunk import (CHUNK, PAD, SEG, SPLIT_ROW, THREADS, ChunkKernel, KernelLauncher, chunk_major,
                           compile_kernel, shared_field, shared_struct)


class DeltaOutput(ChunkKernel):
    """One specialisation: the input type (also the scratch type of d and hs), K, V, the key heads ``HQ``,
    the value heads ``H``, whether q and k are L2-normalised, the scale and whether the gates are per
    channel (kda: g holds their in-chunk sums, tokens x value heads x K)."""

    def __init__(self, io_dtype: str, K: int, V: int, HQ: int, H: int, use_l2: bool, scale: float,
                 per_channel: bool = False):
        self.set_heads(io_dtype, K, V, HQ, H, use_l2)
        if K % CHUNK:
            raise ValueError(f"K = {K} is not a multiple of {CHUNK}")
        self.scale = float(scale)
        self.per_channel = per_channel

    @property
    def _row_width(self) -> int:
        return max(self.K, self.V) + PAD

    def shared_storage(self):
        width = self._row_width
        return shared_struct("DeltaOutputStorage", {
            "q": shared_field(self.io, CHUNK * width), "x": shared_field(self.io, CHUNK * width),
            "attn": shared_field(self.io, CHUNK * (CHUNK + PAD)), "gc": shared_field(Float32, CHUNK),
            "scan": shared_field(Int32, THREADS), "where": shared_field(Int32, 4)})

    def shared_bytes(self) -> int:
        return self.shared_storage().size_in_bytes()

    def score_views(self, pq: cute.Pointer, pk: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer, tokens: Int32,
                    n_seq: Int32):
        """The global views the scores read (traced into the caller's kernel): q and k (tokens x key heads x
        K), the cumulative gates per token (tokens x value heads) and per channel (x K), cu_seqlens."""
        K, H, HQ = self.K, self.H, self.HQ
        mQ = cute.make_tensor(pq, cute.make_layout((tokens, HQ, K), stride=(HQ * K, K, 1)))
        mK = cute.make_tensor(pk, cute.make_layout((tokens, HQ, K), stride=(HQ * K, K, 1)))
        mG = cute.make_tensor(pg, cute.make_layout((tokens, H), stride=(H, 1)))
        mGs = cute.make_tensor(pg, cute.make_layout((tokens, H, K), stride=(H * K, K, 1)))
        mCu = cute.make_tensor(pcu, cute.make_layout((n_seq + 1,), stride=(1,)))
        return mQ, mK, mG, mGs, mCu

    def score_buffers(self, storage):
        """The shared buffers over ``storage``: q's rows, the one operand buffer (k's rows, then a 64 x V
        block), attn and the chunk's cumulative gates."""
        width = self._row_width
        sQ = cute.make_tensor(storage.q.data_ptr(), cute.make_layout((CHUNK, self.K), stride=(width, 1)))
        sK = cute.make_tensor(storage.x.data_ptr(), cute.make_layout((CHUNK, self.K), stride=(width, 1)))
        sX = cute.make_tensor(storage.x.data_ptr(), cute.make_layout((CHUNK, self.V), stride=(width, 1)))
        sAttn = cute.make_tensor(storage.attn.data_ptr(), cute.make_layout((CHUNK, CHUNK), stride=(CHUNK + PAD, 1)))
        sGc = cute.make_tensor(storage.gc.data_ptr(), cute.make_layout((CHUNK,)))
        return sQ, sK, sX, sAttn, sGc

    @cute.jit
    def __call__(self, pq: cute.Pointer, pk: cute.Pointer, pd: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer,
                 phs: cute.Pointer, po: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32,
                 stream: cuda.CUstream):
        self.kernel(pq, pk, pd, pg, pcu, phs, po, tokens, chunks, n_seq).launch(
            grid=[chunks, self.H, 1], block=[THREADS, 1, 1], smem=self.shared_bytes(), stream=stream,
            **self.launch_options())

    @cute.kernel
    def kernel(self, pq: cute.Pointer, pk: cute.Pointer, pd: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer,
               phs: cute.Pointer, po: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32):
        K, V, H = self.K, self.V, self.H
        io = self.io
        mQ, mK, mG, mGs, mCu = self.score_views(pq, pk, pg, pcu, tokens, n_seq)
        mD = chunk_major(pd, chunks, H, V)
        mHs = cute.make_tensor(phs, cute.make_layout((chunks, H, K, V), stride=(H * K * V, K * V, V, 1)))
        mO = cute.make_tensor(po, cute.make_layout((tokens, H, V), stride=(H * V, V, 1)))
        tiled_mma, tidx, h, hk, thr = self.block_heads()

        storage = SmemAllocator().allocate(self.shared_storage())
        width = self._row_width
        sQ, sK, sX, sAttn, sGc = self.score_buffers(storage)

        c, seq, start, count = self.chunk_of_block(mCu, n_seq, tidx, storage)
        if seq < n_seq:
            # gdn: S0's first 64 rows are loaded into registers now, to be in flight with q's and k's (the
            # scores do not need them; k's buffer takes them once the scores are formed). Not for kda: its
            # scores' passes hold more registers, and the early fetch measured slower there (99 vs 97 us).
            early_hs = const_expr(not self.per_channel)
            hs_first = None
            if const_expr(early_hs):
                hs_first = self.row_registers(V)
                self.fetch_rows(cute.local_tile(mHs[c, h, None, None], (CHUNK, V), (0, 0)), hs_first, V, tidx)
            self.chunk_scores(tiled_mma, thr, mQ, mK, mG, mGs, sQ, sK, sAttn, sGc, h, hk, start, count, tidx)
            out = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, V)), Float32)
            out.fill(0.0)
            # (scale q e^gc) S0, 64 rows of S0 at a time through the operand buffer
            for half in range_constexpr(K // CHUNK):
                cute.arch.sync_threads()
                if const_expr(early_hs and half == 0):
                    self.put_rows(hs_first, sX, V, tidx)
                else:
                    self.load_rows(mHs[c, h, None, None], sX, half * CHUNK, CHUNK, V, False, tidx)
                cute.arch.sync_threads()
                qs = cute.make_tensor(sQ.iterator + half * CHUNK, cute.make_layout((CHUNK, CHUNK), stride=(width, 1)))
                self.product_bt(tiled_mma, out, qs, sX, CHUNK, V, width, tidx)
            cute.arch.sync_threads()
            self.load_rows(mD[c, h, None, None], sX, 0, CHUNK, V, False, tidx)
            cute.arch.sync_threads()
            self.product_bt(tiled_mma, out, sAttn, sX, CHUNK, V, width, tidx)
            stage = cute.make_tensor(storage.q.data_ptr(), cute.make_layout((CHUNK, V), stride=(width, 1)))
            self.store_staged(tiled_mma, out, stage, mO[None, h, None], start, count, V, tidx)

    @cute.jit
    def chunk_scores(self, tiled_mma, thr, mQ: cute.Tensor, mK: cute.Tensor, mG: cute.Tensor, mGs: cute.Tensor,
                     sQ: cute.Tensor, sK: cute.Tensor, sAttn: cute.Tensor, sGc: cute.Tensor, h: Int32, hk: Int32,
                     start: Int32, count: Int32, tidx: Int32):
        """The chunk's attn and scale q e^gc (``score_views``' tensors, ``score_buffers``' buffers): per
        channel or per token as the specialisation's gates are."""
        if const_expr(self.per_channel):
            self.scores_per_channel(tiled_mma, thr, mQ[None, hk, None], mK[None, hk, None], mGs[None, h, None], sQ,
                                    sK, sAttn, start, count, tidx)
        else:
            self.scores_per_token(tiled_mma, thr, mQ[None, hk, None], mK[None, hk, None], mG, sQ, sK, sAttn, sGc, h,
                                  start, count, tidx)

    @cute.jit
    def scores_per_token(self, tiled_mma, thr, gQ: cute.Tensor, gK: cute.Tensor, mG: cute.Tensor, sQ: cute.Tensor,
                         sK: cute.Tensor, sAttn: cute.Tensor, sGc: cute.Tensor, h: Int32, start: Int32, count: Int32,
                         tidx: Int32, q_hook=None, rescale_q: cutlass.Constexpr = True):
        """gdn: attn = scale (q k^T) e^(gc_t - gc_j), j <= t, then q's rows times scale e^gc in place (unless
        not ``rescale_q``). ``q_hook(p, row, seg, x)``, when given, sees each segment of q's rows in f32
        (after the norm), as ``load_rows``' ``also``."""
        if tidx < CHUNK:
            sGc[tidx] = mG[start + cutlass.min(tidx, count - 1), h]
        # q's and k's loads all issued before either is processed (one global round trip, not two)
        q_raw = self.issue_rows(gQ, start, count, self.K, tidx)
        k_raw = self.issue_rows(gK, start, count, self.K, tidx)
        self.put_loaded_rows(q_raw, sQ, self.K, self.use_l2, tidx, q_hook)
        self.put_loaded_rows(k_raw, sK, self.K, self.use_l2, tidx)
        cute.arch.sync_threads()
        self.masked_scores(tiled_mma, thr, sQ, sK, sAttn, sGc, True, tidx)
        cute.arch.sync_threads()
        if const_expr(rescale_q):
            self.scale_query_rows(sQ, sGc, tidx)

    @cute.jit
    def scores_per_channel(self, tiled_mma, thr, gQ: cute.Tensor, gK: cute.Tensor, gS: cute.Tensor, sQ: cute.Tensor,
                           sK: cute.Tensor, sAttn: cute.Tensor, start: Int32, count: Int32, tidx: Int32,
                           q_hook=None, rescale_q: cutlass.Constexpr = True):
        """kda: attn = scale (q e^(gc - gc_mid)) (k e^(gc_mid - gc))^T, j <= t, then q's copy rescaled in
        place by scale e^(gc_mid) to scale q e^gc (gS: the gates' in-chunk sums, tokens x K; rows past the
        chunk's end repeat its last: their q and k rows are zero, and the factors stay finite). Each gate row
        is read once for q and k together (the gates are twice q's bytes); the rescale rounds q a second
        time to the input type instead of reading q and the gates again (unless not ``rescale_q``).
        ``q_hook(p, row, seg, x, sums)``, when given, sees each segment of q's rows in f32 (after the norm)
        with the row's gate sums."""
        K = self.K
        segs = K // SEG
        rows_per_pass = THREADS // segs
        seg = tidx % segs
        mid = start + cutlass.min(count - 1, SPLIT_ROW)
        pivot = cute.make_rmem_tensor((1, SEG), Float32)
        sums = cute.make_rmem_tensor((1, SEG), Float32)
        q_raw = cute.make_rmem_tensor((1, SEG), self.io)
        k_raw = cute.make_rmem_tensor((1, SEG), self.io)
        # the split operands in their own type (BF16 for FP16 inputs: ``split``), over q's and k's buffers
        converted = const_expr(self.split is not self.io)
        q_split, k_split = q_raw, k_raw
        split_mma, split_thr = tiled_mma, thr
        if const_expr(converted):
            q_split = cute.make_rmem_tensor((1, SEG), self.split)
            k_split = cute.make_rmem_tensor((1, SEG), self.split)
            split_mma = self.warp_mma(self.split)
            split_thr = split_mma.get_slice(tidx)
        sQs, sKs = self.as_split_view(sQ), self.as_split_view(sK)
        # a thread reads the same K segment of every row: the pivot row's segment once
        cute.autovec_copy(cute.local_tile(gS, (1, SEG), (mid, seg)), pivot)
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            if row < count:
                cute.autovec_copy(cute.local_tile(gQ, (1, SEG), (start + row, seg)), q_raw)
                cute.autovec_copy(cute.local_tile(gK, (1, SEG), (start + row, seg)), k_raw)
            else:
                q_raw.fill(0.0)
                k_raw.fill(0.0)
            cute.autovec_copy(cute.local_tile(gS, (1, SEG), (start + cutlass.min(row, count - 1), seg)), sums)
            x_q = q_raw.load().to(Float32)
            x_k = k_raw.load().to(Float32)
            if const_expr(self.use_l2):
                x_q = x_q * self.row_inverse_norm(x_q, segs)
                x_k = x_k * self.row_inverse_norm(x_k, segs)
            if const_expr(q_hook is not None):
                q_hook(p, row, seg, x_q, sums.load())
            split = sums.load() - pivot.load()
            q_split.store((x_q * cute.math.exp(split)).to(self.split))
            k_split.store((x_k * cute.math.exp(-split)).to(self.split))
            cute.autovec_copy(q_split, cute.local_tile(sQs, (1, SEG), (row, seg)))
            cute.autovec_copy(k_split, cute.local_tile(sKs, (1, SEG), (row, seg)))
        cute.arch.sync_threads()
        self.masked_scores(split_mma, split_thr, sQs, sKs, sAttn, None, False, tidx)
        cute.arch.sync_threads()
        if const_expr(rescale_q):
            if const_expr(converted):
                # q's copy is BF16: q and its gate sums read again, for scale q e^gc rounded once to FP16
                self.scaled_query_rows(gQ, gS, sQ, start, count, tidx)
            else:
                self.scale_rows(sQ, cute.math.exp(pivot.load()) * self.scale, K, tidx)

    @cute.jit
    def scaled_query_rows(self, gQ: cute.Tensor, gS: cute.Tensor, sQ: cute.Tensor, start: Int32, count: Int32,
                          tidx: Int32):
        """scale q e^gc (L2-normalised q when asked; gS: the gate sums, tokens x K) into sQ in the input
        type, rows past the chunk's end zero: each thread writes the segments it wrote before."""
        sums = cute.make_rmem_tensor((1, SEG), Float32)

        def decay(p, row, seg, x):
            cute.autovec_copy(cute.local_tile(gS, (1, SEG), (start + cutlass.min(row, count - 1), seg)), sums)
            return x * (cute.math.exp(sums.load()) * self.scale)

        self.load_rows(gQ, sQ, start, count, self.K, self.use_l2, tidx, store=decay)

    @cute.jit
    def scale_query_rows(self, sQ: cute.Tensor, sGc: cute.Tensor, tidx: Int32):
        """q's rows times scale e^gc, in place (after every warp has read q for the scores)."""
        segs = self.K // SEG
        rows_per_pass = THREADS // segs
        seg = tidx % segs
        frag = cute.make_rmem_tensor((1, SEG), self.io)
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            part = cute.local_tile(sQ, (1, SEG), (row, seg))
            cute.autovec_copy(part, frag)
            frag.store((frag.load().to(Float32) * (self.scale * cute.math.exp(sGc[row]))).to(self.io))
            cute.autovec_copy(frag, part)


class DeltaScores(DeltaOutput):
    """The output's chunk-local half for the fused state pass (``_delta_state.DeltaStatePassFused``), which
    forms o itself from the running state: per (chunk of 64 tokens, value head), ``scale q e^gc`` (64 x K)
    and the masked, decayed ``attn`` (64 x 64) in the input type into the workspace (rows past a sequence's
    end zero), by the same steps and roundings as ``DeltaOutput``'s, so that the fused pass's o has its bits.
    Called with q, k, the cumulative gates, cu_seqlens, qg, attn, then tokens, chunks, sequences."""

    # four CTAs an SM instead of three (134 registers a thread uncapped; 128 with a 40-byte spill): gdn 66.2 ->
    # 63.1 us, kda 89.0 -> 81.7 at 4 x 2048, H 16, K = V = 128 bf16 (session 24, H100)
    min_blocks_per_sm = 4

    @cute.jit
    def __call__(self, pq: cute.Pointer, pk: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer, pqg: cute.Pointer,
                 pattn: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32, stream: cuda.CUstream):
        self.kernel(pq, pk, pg, pcu, pqg, pattn, tokens, chunks, n_seq).launch(
            grid=[chunks, self.H, 1], block=[THREADS, 1, 1], smem=self.shared_bytes(), stream=stream,
            **self.launch_options())

    @cute.kernel
    def kernel(self, pq: cute.Pointer, pk: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer, pqg: cute.Pointer,
               pattn: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32):
        K, H = self.K, self.H
        mQ, mK, mG, mGs, mCu = self.score_views(pq, pk, pg, pcu, tokens, n_seq)
        mQg, mAttn = chunk_major(pqg, chunks, H, K), chunk_major(pattn, chunks, H, CHUNK)
        tiled_mma, tidx, h, hk, thr = self.block_heads()
        storage = SmemAllocator().allocate(self.shared_storage())
        sQ, sK, _, sAttn, sGc = self.score_buffers(storage)
        c, seq, start, count = self.chunk_of_block(mCu, n_seq, tidx, storage)
        if seq < n_seq:
            self.chunk_scores(tiled_mma, thr, mQ, mK, mG, mGs, sQ, sK, sAttn, sGc, h, hk, start, count, tidx)
            cute.arch.sync_threads()     # q's rescale (each thread its own segments) and attn, all written
            self.copy_rows(sQ, mQg[c, h, None, None], CHUNK, K, tidx)
            self.copy_rows(sAttn, mAttn[c, h, None, None], CHUNK, CHUNK, tidx)


def _pointer_types(io_dtype: str, per_channel: bool = False) -> tuple:
    """(element type, assumed alignment) of each pointer: q, k, d, g (the stored cumulative gates, f32;
    per channel, read in 32-byte row segments), cu_seqlens, hs, o."""
    return ((io_dtype, 16), (io_dtype, 16), (io_dtype, 16), ("float32", 16 if per_channel else 4), ("int32", 4),
            (io_dtype, 16), (io_dtype, 16))


def compile_output(io_dtype: str, K: int, V: int, HQ: int, H: int, use_l2: bool, scale: float,
                   per_channel: bool = False):
    """(compiled kernel, dynamic shared bytes) of one specialisation."""
    return compile_kernel(DeltaOutput(io_dtype, K, V, HQ, H, use_l2, scale, per_channel),
                          _pointer_types(io_dtype, per_channel))


def score_kernel_launcher(kind, name: str, pointer_types, io_dtype: str, K: int, V: int, HQ: int, H: int,
                          use_l2: bool, scale: float, n_seq: int, per_channel: bool) -> KernelLauncher:
    """The launcher of one specialisation of ``kind`` (DeltaOutput or a subclass taking its arguments),
    cached under ``name`` and the specialisation; ``pointer_types(io_dtype, per_channel)`` its slots' types."""
    key = (name, io_dtype, K, V, HQ, H, use_l2, float(scale), per_channel)
    return KernelLauncher(lambda: kind(io_dtype, K, V, HQ, H, use_l2, scale, per_channel), key,
                          pointer_types(io_dtype, per_channel), n_seq)


def output_launcher(io_dtype: str, K: int, V: int, HQ: int, H: int, use_l2: bool, scale: float,
                    n_seq: int, per_channel: bool = False) -> KernelLauncher:
    """The launcher of one specialisation; its slots: q, k, d, g, cu_seqlens, hs, o."""
    return score_kernel_launcher(DeltaOutput, "chunk_output", _pointer_types, io_dtype, K, V, HQ, H, use_l2, scale,
                                 n_seq, per_channel)


def _scores_pointer_types(io_dtype: str, per_channel: bool = False) -> tuple:
    """(element type, assumed alignment) of each pointer of ``DeltaScores``: q, k, g, cu_seqlens, qg, attn."""
    q, k, _, g, cu, _, _ = _pointer_types(io_dtype, per_channel)
    return (q, k, g, cu, (io_dtype, 16), (io_dtype, 16))


def scores_launcher(io_dtype: str, K: int, V: int, HQ: int, H: int, use_l2: bool, scale: float,
                    n_seq: int, per_channel: bool = False) -> KernelLauncher:
    """The launcher of one ``DeltaScores`` specialisation; its slots: q, k, g, cu_seqlens, qg, attn."""
    return score_kernel_launcher(DeltaScores, "chunk_scores", _scores_pointer_types, io_dtype, K, V, HQ, H, use_l2,
                                 scale, n_seq, per_channel)
