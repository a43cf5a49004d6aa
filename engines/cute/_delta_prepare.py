"""The chunked delta rule's per-chunk preparation for a per-token (scalar) gate in CuTe DSL, for sm_90.

What it computes is ``engines/cutile/_kernels.chunk_prepare``'s (gdn; the algebra is in that module's
docstring) into the same workspace regions, so that the cuTile state pass and output kernels read it as
their own: per (chunk of 64 tokens, value head) the in-chunk cumulative gate ``gc``, ``w = T (C e^gc)``,
``u = T X`` and ``kd = k e^(gc_last - gc)``, with ``T = (I + A)^-1`` and ``A[t, i] = beta_t (k_t . k_i)
e^(gc_t - gc_i)`` for i < t.

Why a second implementation of the same kernel: tileiras gives the cuTile one about 224 KB of shared
memory, so one CTA runs per SM with nothing to overlap its serial chain (docs/engines_cutile.md). Here the
CTA holds its operands in about 37 KB and several CTAs share an SM. The steps, 128 threads (four warps):

1. locate the chunk from ``cu_seqlens`` on the device (a block-wide scan of per-sequence chunk counts);
2. the gate's in-chunk sums and beta (threads 0-63, a row each), then k (L2-normalised when asked) into
   shared memory in 16-byte row segments; ``kd`` straight from those registers to global memory;
3. ``k k^T`` on the tensor cores (mma.sync m16n8k16, BF16 / FP16 in, f32 out), masked and scaled into
   ``A`` (f32, shared);
4. ``T`` in f32 by forward substitution, one column per thread: column c of ``(I + A) T = I`` needs only the
   rows above it, kept in registers, while A's rows are broadcast from shared memory; for gdn the four
   16-row diagonal blocks' inverses at once (a warp each), then merged into 32- and 64-row blocks,
   ``T21 = -T22 A21 T11``, on the tensor cores in TF32;
5. ``w = (T diag(beta e^gc)) k`` and ``u = (T diag(beta)) v`` on the tensor cores, with T's column
   scales folded in before it is rounded to the input type (fla's precision: T in the input type); v is
   read into k's buffer once w is out; each product staged in its operand's place and stored to the
   chunk-major scratch in 16-byte segments.

gdn's prepare, and the one with the scores (``DeltaPrepareScores``, the fused forward's), issue k, (q) and v by
cp.async before step 2 instead (``prefetch``): q into A's place, v into a buffer of its own, k and q each
normalised in place as its group lands, so the chunk's loads overlap the gate sums and each other where the
steps above wait out four global round trips one after another. The extra buffer (17 KB at V = 128, 54 KB in
all: the C paths opt in past 48 KB) keeps the CTAs an SM the registers allow, but for the plain prepare at
K = V = 64, which keeps its round trips (``PREFETCH`` has the timings).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr, range_constexpr
from cutlass.memory import SmemAllocator

from ._delta_chunk import (CHUNK, SPLIT_ROW as _SPLIT_ROW, ITEMSIZE, PAD as _PAD, SEG as _SEG, THREADS, ChunkKernel, KernelLauncher,
                           chunk_major, compile_kernel, shared_field, shared_struct)


class DeltaPrepare(ChunkKernel):
    """One specialisation: the input type, the gate and beta types, K, V, the value heads per key head
    (``group``), the key heads ``HQ``, the value heads ``H`` and whether keys are L2-normalised. Called (once
    compiled: ``compile_prepare``) with DSL pointers to k, v, g, beta, cu_seqlens, w, u, g_out, kd, then
    tokens, chunks, sequences and a stream."""

    def __init__(self, io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int,
                 HQ: int, H: int, use_l2: bool, per_channel: bool = False, prefetch: bool = False):
        self.set_heads(io_dtype, K, V, HQ, H, use_l2)
        if prefetch and per_channel:
            raise ValueError("prefetch is gdn's (a per-token gate): kda's prepare reads k with its gate sums")
        self.prefetch = prefetch
        # kda: per-channel decays; their in-chunk sums are formed here into g_out (what the cuTile engine's
        # chunk_gates launch computes, saved a launch and a pass over g) and read back from it; A's
        # operands carry the decay split around the chunk's row SPLIT_ROW, as the cuTile kernel's
        self.per_channel = per_channel

    # u = Tu v is written (a backward from the forward's checkpoints on 16-bit scratch has chunk_bwd_values form
    # U from T itself: this kernel reads no v and writes no u, ``DeltaPrepareInverse(store_u=False)``)
    store_u = True
    # gdn: k, q and v are issued by cp.async at the chunk's start, v into a buffer of its own (``prefetch``),
    # instead of four global round trips one after another
    prefetch = False

    @property
    def _row_width(self) -> int:
        """Elements per padded row of the k / v buffer (v takes k's place once w is out)."""
        return max(self.K, self.V) + _PAD

    def shared_storage(self):
        """The CTA's shared memory as one struct (its size is the launch's dynamic shared bytes, the same
        for the DSL's launch and the C path's): the k / v rows, A (then T's two scaled copies), the
        cumulative gates, beta and the chunk locator's scan."""
        return shared_struct("DeltaPrepareStorage", self.shared_fields())

    def shared_fields(self) -> dict:
        """``shared_storage``'s fields, for a subclass to add to."""
        width = self._row_width
        fields = {"kv": shared_field(self.io, CHUNK * width), "a": shared_field(Float32, CHUNK * (CHUNK + _PAD)),
                  "gc": shared_field(Float32, CHUNK), "beta": shared_field(Float32, CHUNK),
                  "scan": shared_field(Int32, THREADS), "where": shared_field(Int32, 4)}
        if self.prefetch and self.store_u:
            fields["v"] = shared_field(self.io, CHUNK * width)
        return fields

    def shared_bytes(self) -> int:
        return self.shared_storage().size_in_bytes()

    # -- host side ----------------------------------------------------------------------------------

    @cute.jit
    def __call__(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer,
                 pcu: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer,
                 tokens: Int32, chunks: Int32, n_seq: Int32, stream: cuda.CUstream):
        # The kernel takes bare pointers and int32 sizes, so that a C launch can fill its parameters
        # (``PARAMETERS``); it forms its tensors itself.
        self.kernel(pk, pv, pg, pbeta, pcu, pw, pu, pgo, pkd, tokens, chunks, n_seq).launch(
            grid=[chunks, self.H, 1], block=[THREADS, 1, 1], smem=self.shared_bytes(), stream=stream,
            **self.launch_options())

    # -- device side --------------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer,
               pcu: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer,
               tokens: Int32, chunks: Int32, n_seq: Int32):
        self.run(pk, pv, pg, pbeta, pcu, pw, pu, pgo, pkd, tokens, chunks, n_seq)

    @cute.jit
    def run(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer, pcu: cute.Pointer,
            pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer, tokens: Int32, chunks: Int32,
            n_seq: Int32, scores=None, inverse=None, intra=None):
        """The kernel's body; ``scores``, when given, the pointers (q, qg, attn) of ``DeltaPrepareScores``;
        ``inverse``, the pointer T goes to (``DeltaPrepareInverse``); ``intra``, the pointers (q, dO, P, qg) of
        ``DeltaPrepareInverseIntra`` (attn in shared memory)."""
        K, V, H, HQ = self.K, self.V, self.H, self.HQ
        io = self.io
        mK = cute.make_tensor(pk, cute.make_layout((tokens, HQ, K), stride=(HQ * K, K, 1)))
        mV = cute.make_tensor(pv, cute.make_layout((tokens, H, V), stride=(H * V, V, 1)))
        mG = cute.make_tensor(pg, cute.make_layout((tokens, H), stride=(H, 1)))
        mB = cute.make_tensor(pbeta, cute.make_layout((tokens, H), stride=(H, 1)))
        mCu = cute.make_tensor(pcu, cute.make_layout((n_seq + 1,), stride=(1,)))
        mW = chunk_major(pw, chunks, H, K)
        mU = chunk_major(pu, chunks, H, V)
        mKd = chunk_major(pkd, chunks, H, K)
        mGo = cute.make_tensor(pgo, cute.make_layout((tokens, H), stride=(H, 1)))
        mGs = cute.make_tensor(pgo, cute.make_layout((tokens, H, K), stride=(H * K, K, 1)))   # per channel
        mGc = cute.make_tensor(pg, cute.make_layout((tokens, H, K), stride=(H * K, K, 1)))
        mT = None
        if const_expr(inverse is not None):
            mT = chunk_major(inverse, chunks, H, CHUNK)
        tiled_mma, tidx, h, hk, _ = self.block_heads()

        storage = SmemAllocator().allocate(self.shared_storage())
        width = self._row_width
        sK = cute.make_tensor(storage.kv.data_ptr(), cute.make_layout((CHUNK, K), stride=(width, 1)))
        sV = cute.make_tensor(storage.kv.data_ptr(), cute.make_layout((CHUNK, V), stride=(width, 1)))
        if const_expr(self.prefetch and self.store_u):
            sV = cute.make_tensor(storage.v.data_ptr(), cute.make_layout((CHUNK, V), stride=(width, 1)))
        sA = cute.make_tensor(storage.a.data_ptr(), cute.make_layout((CHUNK, CHUNK), stride=(CHUNK + _PAD, 1)))
        # T's two scaled copies take A's place once the substitution has read it (A's padded rows hold both)
        t_layout = cute.make_layout((CHUNK, CHUNK), stride=(CHUNK + _PAD, 1))
        sTw = cute.make_tensor(cute.recast_ptr(sA.iterator, dtype=io), t_layout)
        sTu = cute.make_tensor(cute.recast_ptr(sA.iterator, dtype=io) + cute.cosize(t_layout), t_layout)
        sGc = cute.make_tensor(storage.gc.data_ptr(), cute.make_layout((CHUNK,)))
        sBeta = cute.make_tensor(storage.beta.data_ptr(), cute.make_layout((CHUNK,)))

        # 1. which sequence and tokens chunk c covers
        c, seq, start, count = self.chunk_of_block(mCu, n_seq, tidx, storage)
        if seq < n_seq:
            gT = None
            if const_expr(mT is not None):
                gT = mT[c, h, None, None]
            sAttn = None
            if const_expr(self.per_channel):
                score_views = None
                if const_expr(intra is not None):
                    # q's split rows, then attn over them (the scores' barrier follows every read of q)
                    sQs = cute.make_tensor(cute.recast_ptr(storage.q.data_ptr(), dtype=self.split),
                                           cute.make_layout((CHUNK, K), stride=(K + _PAD, 1)))
                    sAttn = cute.make_tensor(storage.q.data_ptr(),
                                             cute.make_layout((CHUNK, CHUNK), stride=(CHUNK + _PAD, 1)))
                    mQ, mQg = self.query_views(intra[0], intra[3], tokens, chunks)
                    score_views = (mQ[None, hk, None], mQg[c, h, None, None], sQs, sAttn)
                self.prepare_per_channel(tiled_mma, mK, mV, mB, mGc, mGs, mW, mU, mKd, sK, sV, sA, sTw, sTu, sGc,
                                         sBeta, c, h, hk, start, count, tidx, gT, score_views)
            else:
                score_views = None
                if const_expr(scores is not None):
                    score_views = self.score_views(*scores, tokens, chunks)
                if const_expr(intra is not None):
                    sAttn = cute.make_tensor(storage.attn.data_ptr(),
                                             cute.make_layout((CHUNK, CHUNK), stride=(CHUNK + _PAD, 1)))
                    # attn stays in shared memory: a view of it at every (chunk, head) of the global one's shape
                    attn = cute.make_tensor(sAttn.iterator, cute.make_layout((1, 1, CHUNK, CHUNK),
                                                                              stride=(0, 0, CHUNK + _PAD, 1)))
                    score_views = (*self.query_views(intra[0], intra[3], tokens, chunks), attn)
                self.prepare_per_token(tiled_mma, mK, mV, mG, mB, mGo, mW, mU, mKd, sK, sV, sA, sTw, sTu, sGc,
                                       sBeta, c, h, hk, start, count, tidx, score_views, gT)
            if const_expr(intra is not None):
                self.intra_values(tiled_mma, intra[1], intra[2], sAttn, storage, c, h, start, count, tokens, chunks,
                                  tidx)

    @cute.jit
    def load_beta(self, mB: cute.Tensor, sBeta: cute.Tensor, h: Int32, start: Int32, count: Int32, tidx: Int32):
        if tidx < CHUNK:
            bv = Float32(0.0)
            if tidx < count:
                bv = mB[start + tidx, h].to(Float32)
            sBeta[tidx] = bv

    @cute.jit
    def prepare_per_token(self, tiled_mma, mK, mV, mG, mB, mGo, mW, mU, mKd, sK, sV, sA, sTw, sTu, sGc, sBeta,
                          c: Int32, h: Int32, hk: Int32, start: Int32, count: Int32, tidx: Int32, score_views=None,
                          gT=None):
        """gdn: the gate's in-chunk sums (written to g_out), then A, T, w and u (and, with ``score_views``:
        (q, qg, attn) global views, ``DeltaPrepareScores``' scale q e^gc and attn, once k is in place; with
        ``gT``, the chunk's 64 x 64 global view, T itself)."""
        K, V = self.K, self.V
        if const_expr(self.prefetch):
            # k, q and v in flight while the gates are summed: a cp.async group each, waited on in that order
            self.copy_rows_async(mK[None, hk, None], sK, K, tidx, start, count, zero_past=True)
            if const_expr(score_views is not None):
                self.copy_rows_async(score_views[0][None, hk, None], self.query_rows(sA), K, tidx, start, count,
                                     zero_past=True)
            if const_expr(self.store_u):
                self.copy_rows_async(mV[None, h, None], sV, V, tidx, start, count, zero_past=True)
        # 2. gates and beta (a row a thread), then k
        self.load_beta(mB, sBeta, h, start, count, tidx)
        if tidx < CHUNK:
            gv = Float32(0.0)
            if tidx < count:
                gv = mG[start + tidx, h].to(Float32)
            sGc[tidx] = gv
        cute.arch.sync_threads()
        gc = Float32(0.0)
        if tidx < CHUNK:
            for j in range_constexpr(CHUNK):
                gc = gc + cutlass.select_(j <= tidx, sGc[j], Float32(0.0))
        cute.arch.sync_threads()
        if tidx < CHUNK:
            sGc[tidx] = gc
            if tidx < count:
                mGo[start + tidx, h] = gc
        cute.arch.sync_threads()
        pending = None
        if const_expr(self.prefetch):
            pending = int(score_views is not None) + int(self.store_u)
        self.load_keys(mK, mKd, sK, sGc, start, count, c, h, hk, tidx, pending)
        cute.arch.sync_threads()
        if const_expr(score_views is not None):
            mQ, mQg, mAttn = score_views
            self.form_scores(tiled_mma, mQ[None, hk, None], mQg[c, h, None, None], mAttn[c, h, None, None], sK, sA,
                             sGc, start, count, tidx)
        # 3. A = beta_t (k_t . k_i) e^(gc_t - gc_i), i < t (form_a's barrier follows every read of q in A's place)
        self.form_a(tiled_mma, sK, sK, sA, sGc, sBeta, tidx)
        cute.arch.sync_threads()
        # 4. T = (I + A)^-1, a column a thread
        self.invert_column(sA, sTw, sTu, sGc, sBeta, tidx, gT)
        cute.arch.sync_threads()
        # 5. w = T diag(beta e^gc) k, u = T diag(beta) v
        self.w_and_u(tiled_mma, mV, mW, mU, sK, sV, sTw, sTu, c, h, start, count, tidx)

    @cute.jit
    def prepare_per_channel(self, tiled_mma, mK, mV, mB, mGc, mGs, mW, mU, mKd, sK, sV, sA, sTw, sTu, sGc, sBeta,
                            c: Int32, h: Int32, hk: Int32, start: Int32, count: Int32, tidx: Int32, gT=None,
                            score_views=None):
        """kda (``gT``: as ``prepare_per_token``'s): the gates' in-chunk sums gc into g_out, then A from k e^(gc - gc_mid) and k e^(gc_mid - gc)
        (the split: each factor spans at most half a chunk of decay), T scaled by beta alone, w = T diag(beta)
        (k e^gc), its right operand A's left one rescaled in place by e^gc_mid (per channel): reading k and
        the gate sums again cost a second pass over both (the sums are f32, twice k's bytes). With
        ``score_views`` ((q, qg, q's split rows, attn): ``DeltaPrepareInverseIntra``) the scores too, once k's
        right operand is in A's place (``form_scores_per_channel``)."""
        K, V = self.K, self.V
        gS = mGs[None, h, None]
        self.gate_sums(mGc[None, h, None], gS, start, count, tidx)
        last = start + count - 1
        mid = start + cutlass.min(count - 1, _SPLIT_ROW)
        self.load_beta(mB, sBeta, h, start, count, tidx)
        gKd = mKd[c, h, None, None]
        segs = K // _SEG
        rows_per_pass = THREADS // segs
        kd_row = cute.make_rmem_tensor((1, _SEG), mKd.element_type)
        passes = CHUNK // rows_per_pass
        # two sets of a pass's gate registers: the next pass's gate loads are issued before this pass is
        # processed (its shared stores between them made each pass a global round trip)
        sums = [cute.make_rmem_tensor((1, _SEG), Float32) for _ in range(2)]
        pivot = cute.make_rmem_tensor((1, _SEG), Float32)
        end = cute.make_rmem_tensor((1, _SEG), Float32)
        # A's operands carry the split decays: in the split type (BF16 for FP16 inputs, ``split``), sK's view
        # and the right operand's in A's place
        sL = self.as_split_view(sK)
        sR = cute.make_tensor(cute.recast_ptr(sA.iterator, dtype=self.split), sK.layout)

        def fetch_gates(p):
            # rows past the chunk's end repeat its last row (their k is zero, and the decays stay finite)
            row = tidx // segs + p * rows_per_pass
            cute.autovec_copy(cute.local_tile(gS, (1, _SEG), (start + cutlass.min(row, count - 1), tidx % segs)),
                              sums[p % 2])

        def left(p, row, seg, x):
            if const_expr(p + 1 < passes):
                fetch_gates(p + 1)
            gc = sums[p % 2].load()
            right = x * cute.math.exp(pivot.load() - gc)
            cute.autovec_copy(self.as_type(right, self.split), cute.local_tile(sR, (1, _SEG), (row, seg)))
            # kd straight to global: the next pass's gate loads are issued already, so the store orders none
            kd_row.store((x * cute.math.exp(end.load() - gc)).to(mKd.element_type))
            cute.autovec_copy(kd_row, cute.local_tile(gKd, (1, _SEG), (row, seg)))
            return x * cute.math.exp(gc - pivot.load())

        cute.arch.sync_threads()
        # a thread reads the same K segment of every row it loads: the pivot and last rows' segments once
        cute.autovec_copy(cute.local_tile(gS, (1, _SEG), (mid, tidx % segs)), pivot)
        cute.autovec_copy(cute.local_tile(gS, (1, _SEG), (last, tidx % segs)), end)
        fetch_gates(0)
        self.load_rows(mK[None, hk, None], sL, start, count, K, self.use_l2, tidx, store=left)
        cute.arch.sync_threads()
        if const_expr(score_views is not None):
            self.form_scores_per_channel(score_views, sR, gS, pivot, start, count, tidx)
        # A = beta_t sum_d k_td k_id e^(gc_td - gc_id), i < t: the decays are in the operands
        self.form_a(self.warp_mma(self.split), sL, sR, sA, sGc, sBeta, tidx)
        # w's operand k e^gc into sK: form_a's barrier is past every read of sK as A's operand, and the
        # substitution's barrier orders these writes before w's product
        if const_expr(self.split is self.io):
            # k e^(gc - gc_mid) e^gc_mid: each thread rescales the segments it stored (its pivot registers
            # hold their channels)
            self.scale_rows(sK, cute.math.exp(pivot.load()), K, tidx)
        else:
            # the left operand is BF16: k and its gate sums read again, for k e^gc rounded once to FP16
            self.decayed_rows(mK[None, hk, None], gS, sK, start, count, tidx)
        cute.arch.sync_threads()
        self.invert_column(sA, sTw, sTu, sGc, sBeta, tidx, gT)
        cute.arch.sync_threads()
        self.w_and_u(tiled_mma, mV, mW, mU, sK, sV, sTw, sTu, c, h, start, count, tidx)

    @cute.jit
    def w_and_u(self, tiled_mma, mV: cute.Tensor, mW: cute.Tensor, mU: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor,
                sTw: cute.Tensor, sTu: cute.Tensor, c: Int32, h: Int32, start: Int32, count: Int32, tidx: Int32):
        """w = Tw k (sK holds k as w's product needs it) and u = Tu v, each staged in its operand's place and
        stored; v is read into k's place once w is out (not read, and u not written, without ``store_u``), or,
        with ``prefetch``, has been landing in a buffer of its own since the chunk's start."""
        self.product_out(tiled_mma, sTw, sK, mW, c, h, self.K, tidx)
        if const_expr(self.store_u):
            if const_expr(self.prefetch):
                cute.arch.cp_async_wait_group(0)        # v's rows, in their own buffer since the chunk's start
            else:
                cute.arch.sync_threads()
                self.load_rows(mV[None, h, None], sV, start, count, self.V, False, tidx)
            cute.arch.sync_threads()
            self.product_out(tiled_mma, sTu, sV, mU, c, h, self.V, tidx)

    @cute.jit
    def gate_sums(self, gRaw: cute.Tensor, gS: cute.Tensor, start: Int32, count: Int32, tidx: Int32):
        """The chunk's per-channel cumulative gate sums (rows start .. start + count of ``gRaw``, tokens x K)
        into ``gS`` (g_out), one channel per thread (a warp's rows are contiguous: coalesced). All 64 rows
        are loaded into registers before the first store: a store to g_out between two loads of g would
        order them (both are global memory the compiler cannot tell apart), and the loads would run one
        after another (rows past the chunk's end repeat its last: an in-bounds load, never stored). Later
        reads of ``gS`` by other threads come after a barrier (it orders the block's global writes too)."""
        if tidx < self.K:
            rows = cute.make_rmem_tensor((CHUNK,), Float32)
            for row in range_constexpr(CHUNK):
                rows[row] = gRaw[start + cutlass.min(row, count - 1), tidx].to(Float32)
            total = Float32(0.0)
            for row in range_constexpr(CHUNK):
                total = total + rows[row]
                if row < count:
                    gS[start + row, tidx] = total

    @cute.jit
    def as_type(self, x, dtype):
        """A segment's f32 values ``x`` in a register fragment of ``dtype``."""
        frag = cute.make_rmem_tensor((1, _SEG), dtype)
        frag.store(x.to(dtype))
        return frag

    @cute.jit
    def decayed_rows(self, gK: cute.Tensor, gS: cute.Tensor, sK: cute.Tensor, start: Int32, count: Int32,
                     tidx: Int32):
        """k e^gc (L2-normalised k when asked; gS: the chunk's gate sums, tokens x K, written by this CTA
        before a barrier) into sK in the input type; rows past the chunk's end zero."""
        sums = cute.make_rmem_tensor((1, _SEG), Float32)

        def decay(p, row, seg, x):
            cute.autovec_copy(cute.local_tile(gS, (1, _SEG), (start + cutlass.min(row, count - 1), seg)), sums)
            return x * cute.math.exp(sums.load())

        self.load_rows(gK, sK, start, count, self.K, self.use_l2, tidx, store=decay)

    @cute.jit
    def load_keys(self, mK: cute.Tensor, mKd: cute.Tensor, sK: cute.Tensor, sGc: cute.Tensor, start: Int32,
                  count: Int32, c: Int32, h: Int32, hk: Int32, tidx: Int32, pending=None):
        """k's rows into shared memory (``load_rows``, L2-normalised when asked) and, from the same
        registers, kd = k e^(gc_last - gc) to the scratch. With ``pending`` (``prefetch``): k's rows are
        in sK's cp.async group already, ``pending`` groups issued after it."""
        gKd = mKd[c, h, None, None]
        out = cute.make_rmem_tensor((1, _SEG), mKd.element_type)

        def write_kd(p, row, seg, x):
            out.store((x * cute.math.exp(sGc[CHUNK - 1] - sGc[row])).to(mKd.element_type))
            cute.autovec_copy(out, cute.local_tile(gKd, (1, _SEG), (row, seg)))

        if const_expr(pending is not None):
            self.put_prefetched_rows(sK, pending, tidx, also=write_kd)
        else:
            self.load_rows(mK[None, hk, None], sK, start, count, self.K, self.use_l2, tidx, also=write_kd)

    @cute.jit
    def put_prefetched_rows(self, sX: cute.Tensor, pending: cutlass.Constexpr, tidx: Int32, also=None):
        """k's or q's rows, copied into ``sX`` (64 x K) at the chunk's start, L2-normalised in place when asked
        and passed through ``also`` as ``load_rows`` does, once all but ``pending`` cp.async groups have landed:
        a thread reads back the segments it copied (no barrier), so the bits are ``load_rows``'."""
        cute.arch.cp_async_wait_group(pending)
        raw = self.row_registers(self.K)
        self.fetch_rows(sX, raw, self.K, tidx)
        self.put_loaded_rows(raw, sX, self.K, self.use_l2, tidx, also)

    @cute.jit
    def form_a(self, tiled_mma: cute.TiledMma, sL: cute.Tensor, sR: cute.Tensor, sA: cute.Tensor,
               sGc: cute.Tensor, sBeta: cute.Tensor, tidx: Int32):
        """A = beta_t (l_t . r_i) for i < t, else 0, into sA (f32), times e^(gc_t - gc_i) for a per-token
        gate (a per-channel one is in l and r). sR may lie in sA's place: every warp has read it before the
        barrier here."""
        thr = tiled_mma.get_slice(tidx)
        acc = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, CHUNK)), Float32)
        acc.fill(0.0)
        self.product(tiled_mma, acc, sL, sR, tidx)
        cute.arch.sync_threads()
        coords = thr.partition_C(cute.make_identity_tensor((CHUNK, CHUNK)))
        for e in range_constexpr(cute.size(acc)):
            t, i = coords[e]
            val = Float32(0.0)
            if i < t:
                if const_expr(self.per_channel):
                    val = acc[e] * sBeta[t]
                else:
                    val = acc[e] * sBeta[t] * cute.math.exp(sGc[t] - sGc[i])
            sA[t, i] = val

    @cute.jit
    def invert_column(self, sA: cute.Tensor, sTw: cute.Tensor, sTu: cute.Tensor, sGc: cute.Tensor,
                      sBeta: cute.Tensor, tidx: Int32, gT=None):
        """Column ``tidx`` (threads 0-63) of T = (I + A)^-1, scaled into sTw / sTu over A's place (and, with
        ``gT``, as it is into gT: 64 x 64 global, a row's columns on a warp's lanes). gdn: from 16-row blocks
        (``invert_blocks``); kda: one forward substitution over all 64 rows (an earlier blocked form, 32-row
        blocks merged on the CUDA cores, took 145 registers in kda's specialisation against 97: the cause was
        not found; kda's split decays are untried with TF32 products). Every thread reaches the barrier between
        T's last read of A and its writes over it."""
        tcol = cute.make_rmem_tensor((CHUNK,), Float32)
        if const_expr(self.per_channel):
            if tidx < CHUNK:
                self.substitute(sA, tcol, 0, tidx, CHUNK)
        else:
            self.invert_blocks(sA, tcol, tidx)
        if const_expr(gT is not None):
            if tidx < CHUNK:
                for r in range_constexpr(CHUNK):
                    if const_expr(gT.element_type is Float32):
                        gT[r, tidx] = tcol[r]
                    else:       # scratch="io_all": T as the values kernel's product takes it
                        gT[r, tidx] = tcol[r].to(gT.element_type)
        cute.arch.sync_threads()
        if tidx < CHUNK:
            scale_u = sBeta[tidx]
            scale_w = scale_u
            if const_expr(not self.per_channel):
                scale_w = scale_u * cute.math.exp(sGc[tidx])
            for r in range_constexpr(CHUNK):
                sTw[r, tidx] = (tcol[r] * scale_w).to(self.io)
                sTu[r, tidx] = (tcol[r] * scale_u).to(self.io)

    @cute.jit
    def invert_blocks(self, sA: cute.Tensor, tcol: cute.Tensor, tidx: Int32):
        """Column ``tidx`` of T = (I + A)^-1 into ``tcol`` (threads 0-63), from the four 16-row diagonal blocks'
        inverses (forward substitution, a warp a block, a column a lane), merged into 32-row blocks (warps 0
        and 1, a pair of blocks each) and then into T (all four warps) by T21 = -T22 (A21 T11), each product on
        the tensor cores in TF32 (``inverse_product``). The chain is a 16-row substitution (a quarter of a
        32-row one's FMAs) and four MMA steps; the form it replaced (session 48), two 32-row substitutions on
        warps 0 and 1 while warps 2 and 3 idled, then the merge on the CUDA cores, took the prepare 8-13% longer
        (H100, 4 x 2048 x 16). TF32 keeps T to ~5e-5 of its largest entry for L2-normalised keys, under the
        input type's rounding of T that follows. Each block of T is written over the block of A no later step
        reads; a product's X = A21 T11 goes above the diagonal, zeroed again where a later product reads T
        there."""
        q = CHUNK // 4
        half = CHUNK // 2
        warp = tidx // 32
        lane = tidx % 32
        blk = cute.make_rmem_tensor((q,), Float32)
        for b in range_constexpr(4):
            if warp == b:
                self.substitute(sA, blk, b * q, lane % q, q)
                cute.arch.sync_warp()          # the warp's reads of its block are done
                if lane < q:
                    for r in range_constexpr(q):
                        sA[b * q + r, b * q + lane] = blk[r]
        cute.arch.sync_threads()
        mma = self.inverse_mma()
        if warp < 2:
            top = warp * half                  # the pair's first row and column
            acc = self.inverse_product(mma, sA, top + q, top, top, top, q, q, lane)
            self.put_block(mma, acc, sA, top, top + q, q, False, lane)
            cute.arch.sync_warp()
            acc = self.inverse_product(mma, sA, top + q, top + q, top, top + q, q, q, lane)
            self.put_block(mma, acc, sA, top + q, top, q, True, lane)
            cute.arch.sync_warp()              # X is read: zero again (T's upper triangle)
            for e in range_constexpr(q * q // 32):
                sA[top + (e * 32 + lane) // q, top + q + (e * 32 + lane) % q] = Float32(0.0)
        cute.arch.sync_threads()
        rows = (warp // 2) * q
        cols = (warp % 2) * q
        acc = self.inverse_product(mma, sA, half + rows, 0, 0, cols, half, q, lane)
        self.put_block(mma, acc, sA, rows, half + cols, q, False, lane)
        cute.arch.sync_threads()
        acc = self.inverse_product(mma, sA, half + rows, half, 0, half + cols, half, q, lane)
        self.put_block(mma, acc, sA, half + rows, cols, q, True, lane)
        cute.arch.sync_threads()
        if tidx < CHUNK:
            for r in range_constexpr(CHUNK):
                if const_expr(r < half):
                    # rows above T22 are zero (A12's place holds X, not T)
                    tcol[r] = cutlass.select_(tidx < half, sA[r, tidx], Float32(0.0))
                else:
                    tcol[r] = sA[r, tidx]

    def inverse_mma(self) -> cute.TiledMma:
        """One warp's TF32 MMA (mma.sync m16n8k8, f32 out): the inverse's block products, a tile a warp."""
        return cute.make_tiled_mma(cute.nvgpu.warp.MmaTF32Op((16, 8, 8)), cute.make_layout((1, 1, 1)))

    @cute.jit
    def inverse_product(self, mma: cute.TiledMma, sA: cute.Tensor, row: Int32, col: Int32, krow: Int32,
                        kcol: Int32, k: cutlass.Constexpr, n: cutlass.Constexpr, lane: Int32) -> cute.Tensor:
        """The accumulators (f32) of sA[row:+16, col:+k] @ sA[krow:+k, kcol:+n] on one warp, both operands
        rounded to TF32 (to nearest) as they are read from shared memory."""
        stride = CHUNK + _PAD
        x = cute.make_tensor(sA.iterator + (row * stride + col), cute.make_layout((16, k), stride=(stride, 1)))
        # the right operand as the MMA's B (n x k, k contiguous in the MMA's view): its rows read down columns
        yt = cute.make_tensor(sA.iterator + (krow * stride + kcol), cute.make_layout((n, k), stride=(1, stride)))
        thr = mma.get_slice(lane)
        # the MMA's operand registers (compact, TF32: as the views' TF32 twins give them), filled from the f32 views
        ra = mma.make_fragment_A(thr.partition_A(self.as_tf32(x)))
        rb = mma.make_fragment_B(thr.partition_B(self.as_tf32(yt)))
        self.round_tf32(thr.partition_A(x), ra)
        self.round_tf32(thr.partition_B(yt), rb)
        acc = cute.make_rmem_tensor(thr.partition_shape_C((16, n)), Float32)
        acc.fill(0.0)
        for kb in range_constexpr(k // 8):
            cute.gemm(mma, acc, ra[None, None, kb], rb[None, None, kb], acc)
        return acc

    def as_tf32(self, x: cute.Tensor) -> cute.Tensor:
        """The f32 view ``x`` as TF32 elements (the same bits)."""
        return cute.make_tensor(cute.recast_ptr(x.iterator, dtype=cutlass.TFloat32), x.layout)

    @cute.jit
    def round_tf32(self, src: cute.Tensor, dst: cute.Tensor):
        """dst (TF32 registers) = src (f32) rounded to nearest (cvt.rna)."""
        bits = cute.recast_tensor(dst, Int32)
        for i in range_constexpr(cute.size(src)):
            bits[i] = Int32(cute.arch.cvt_f32_tf32(src[i]))

    @cute.jit
    def put_block(self, mma: cute.TiledMma, acc: cute.Tensor, sA: cute.Tensor, row: Int32, col: Int32,
                  n: cutlass.Constexpr, negate: cutlass.Constexpr, lane: Int32):
        """One warp's accumulators (16 x n) into sA[row:+16, col:+n] (negated with ``negate``)."""
        stride = CHUNK + _PAD
        out = cute.make_tensor(sA.iterator + (row * stride + col), cute.make_layout((16, n), stride=(stride, 1)))
        if const_expr(negate):
            acc.store(-acc.load())
        cute.autovec_copy(acc, mma.get_slice(lane).partition_C(out))

    @cute.jit
    def substitute(self, sA: cute.Tensor, tcol: cute.Tensor, base: cutlass.Constexpr, col: Int32,
                   rows: cutlass.Constexpr):
        """Column ``col`` of (I + A[base:base+rows, base:base+rows])^-1 into ``tcol`` by forward substitution:
        T[r] = -sum_{j<r} A[r, j] T[j] below the diagonal, 1 on it, 0 above (the sum is zero there already:
        T[j] = 0 for j < col). ``base`` is a trace-time constant so that A's rows are read in 16-byte
        vectors."""
        for r in range_constexpr(rows):
            # four partial sums: a row's dot product is four dependent FMA chains, not one
            part = [Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)]
            for j in range_constexpr(r):
                part[j % 4] = part[j % 4] - sA[base + r, base + j] * tcol[j]
            tcol[r] = cutlass.select_(r == col, Float32(1.0), (part[0] + part[1]) + (part[2] + part[3]))

    @cute.jit
    def product_out(self, tiled_mma: cute.TiledMma, sT: cute.Tensor, sX: cute.Tensor, mOut: cute.Tensor,
                    c: Int32, h: Int32, width: cutlass.Constexpr, tidx: Int32):
        """mOut[c, h] = sT (64 x 64) @ sX (64 x width), staged in sX's place (X is dead once every warp
        has its share; f32 scratch needs twice X's room and is stored from the accumulators)."""
        thr = tiled_mma.get_slice(tidx)
        acc = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, width)), Float32)
        acc.fill(0.0)
        self.product_bt(tiled_mma, acc, sT, sX, CHUNK, width, self._row_width, tidx)
        gOut = mOut[c, h, None, None]
        if const_expr(mOut.element_type.width != self.io.width):
            out = cute.make_rmem_tensor(acc.shape, mOut.element_type)
            out.store(acc.load().to(mOut.element_type))
            cute.autovec_copy(out, thr.partition_C(gOut))
        else:
            stage = cute.make_tensor(cute.recast_ptr(sX.iterator, dtype=mOut.element_type),
                                     cute.make_layout((CHUNK, width), stride=(self._row_width, 1)))
            self.store_staged(tiled_mma, acc, stage, gOut, 0, CHUNK, width, tidx)


class DeltaPrepareScores(DeltaPrepare):
    """gdn's prepare that also forms what the fused state pass (``_delta_state.DeltaStatePassFused``) reads of
    the output, ``DeltaScores``' scale q e^gc and attn with their bits, from the k rows and gate sums it holds
    already: no scores launch, no second read of k, no second chunk locator. q's rows go through A's place
    before A is formed (form_a reads k alone, and its barrier follows every read of q); qg is written from
    q's registers as they are stored, attn from the accumulators. The same shared memory as the prepare.
    Called with k, v, g, beta, cu_seqlens, w, u, g_out, kd, q, qg, attn, then tokens, chunks, sequences."""

    def __init__(self, io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int,
                 HQ: int, H: int, use_l2: bool, scale: float, prefetch: bool = False):
        super().__init__(io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2, prefetch=prefetch)
        self.scale = float(scale)

    @cute.jit
    def __call__(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer,
                 pcu: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer,
                 pq: cute.Pointer, pqg: cute.Pointer, pattn: cute.Pointer, tokens: Int32, chunks: Int32,
                 n_seq: Int32, stream: cuda.CUstream):
        self.kernel(pk, pv, pg, pbeta, pcu, pw, pu, pgo, pkd, pq, pqg, pattn, tokens, chunks, n_seq).launch(
            grid=[chunks, self.H, 1], block=[THREADS, 1, 1], smem=self.shared_bytes(), stream=stream,
            **self.launch_options())

    @cute.kernel
    def kernel(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer,
               pcu: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer,
               pq: cute.Pointer, pqg: cute.Pointer, pattn: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32):
        self.run(pk, pv, pg, pbeta, pcu, pw, pu, pgo, pkd, tokens, chunks, n_seq, (pq, pqg, pattn))

    def query_rows(self, sA: cute.Tensor) -> cute.Tensor:
        """q's rows in A's place: 64 rows of K + 8 in the input type, within A's 64 rows of 72 f32 for K <= 128."""
        return cute.make_tensor(cute.recast_ptr(sA.iterator, dtype=self.io),
                                cute.make_layout((CHUNK, self.K), stride=(self.K + _PAD, 1)))

    def score_views(self, pq: cute.Pointer, pqg: cute.Pointer, pattn: cute.Pointer, tokens: Int32, chunks: Int32):
        """q (tokens x key heads x K), qg (chunks x heads x 64 x K) and attn (chunks x heads x 64 x 64)."""
        return (*self.query_views(pq, pqg, tokens, chunks), chunk_major(pattn, chunks, self.H, CHUNK))

    def query_views(self, pq: cute.Pointer, pqg: cute.Pointer, tokens: Int32, chunks: Int32):
        """q (tokens x key heads x K) and qg (chunks x heads x 64 x K)."""
        K, HQ = self.K, self.HQ
        return (cute.make_tensor(pq, cute.make_layout((tokens, HQ, K), stride=(HQ * K, K, 1))),
                chunk_major(pqg, chunks, self.H, K))

    @cute.jit
    def form_scores(self, tiled_mma, gQ: cute.Tensor, gQg: cute.Tensor, gAttn: cute.Tensor, sK: cute.Tensor,
                    sA: cute.Tensor, sGc: cute.Tensor, start: Int32, count: Int32, tidx: Int32):
        """q's rows (L2-normalised when asked) into A's place, qg = scale q e^gc to global from the same
        registers (q rounded to the input type first, as ``DeltaOutput.scale_query_rows`` reads it), then
        attn = masked_scores(q, k) to global."""
        io = self.io
        sQ = self.query_rows(sA)
        out = cute.make_rmem_tensor((1, _SEG), gQg.element_type)

        def write_qg(p, row, seg, x):
            stored = x.to(io).to(Float32)
            out.store((stored * (self.scale * cute.math.exp(sGc[row]))).to(gQg.element_type))
            cute.autovec_copy(out, cute.local_tile(gQg, (1, _SEG), (row, seg)))

        if const_expr(self.prefetch):
            self.put_prefetched_rows(sQ, int(self.store_u), tidx, also=write_qg)
        else:
            self.load_rows(gQ, sQ, start, count, self.K, self.use_l2, tidx, also=write_qg)
        cute.arch.sync_threads()
        self.masked_scores(tiled_mma, tiled_mma.get_slice(tidx), sQ, sK, gAttn, sGc, True, tidx)


class DeltaPrepareInverse(DeltaPrepare):
    """The backward recompute's prepare (gdn or kda) that also writes T = (I + A)^-1 itself (64 x 64 a chunk,
    chunk-major, in the backward's own scratch type: f32, or the input type with scratch="io_all") for
    ``_delta_bwd_values.DeltaBwdValues``, which would otherwise form it again: the substitution's columns go to
    global memory from the registers that hold them. Called with k, v, g, beta, cu_seqlens, w, u, g_out, kd, T,
    then tokens, chunks, sequences. ``store_u=False``: u is not written (``DeltaPrepare.store_u``)."""

    def __init__(self, io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int,
                 HQ: int, H: int, use_l2: bool, per_channel: bool = False, store_u: bool = True):
        super().__init__(io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2, per_channel)
        self.store_u = store_u

    @cute.jit
    def __call__(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer,
                 pcu: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer,
                 pt: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32, stream: cuda.CUstream):
        self.kernel(pk, pv, pg, pbeta, pcu, pw, pu, pgo, pkd, pt, tokens, chunks, n_seq).launch(
            grid=[chunks, self.H, 1], block=[THREADS, 1, 1], smem=self.shared_bytes(), stream=stream,
            **self.launch_options())

    @cute.kernel
    def kernel(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer,
               pcu: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer,
               pt: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32):
        self.run(pk, pv, pg, pbeta, pcu, pw, pu, pgo, pkd, tokens, chunks, n_seq, inverse=pt)



class DeltaPrepareScoresInverse(DeltaPrepareScores):
    """gdn's forward prepare with the scores (``DeltaPrepareScores``) that also writes T = (I + A)^-1, as
    ``DeltaPrepareInverse`` does for the backward: the forward that keeps a ``chunk_cache`` leaves its gate sums,
    w, kd and T there, and the backward from it reads them instead of forming them again (the same code forms
    them in both prepares: the same bits). Called with k, v, g, beta, cu_seqlens, w, u, g_out, kd, q, qg, attn,
    T, then tokens, chunks, sequences."""

    @cute.jit
    def __call__(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer,
                 pcu: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer,
                 pq: cute.Pointer, pqg: cute.Pointer, pattn: cute.Pointer, pt: cute.Pointer, tokens: Int32,
                 chunks: Int32, n_seq: Int32, stream: cuda.CUstream):
        self.kernel(pk, pv, pg, pbeta, pcu, pw, pu, pgo, pkd, pq, pqg, pattn, pt, tokens, chunks, n_seq).launch(
            grid=[chunks, self.H, 1], block=[THREADS, 1, 1], smem=self.shared_bytes(), stream=stream,
            **self.launch_options())

    @cute.kernel
    def kernel(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer,
               pcu: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer,
               pq: cute.Pointer, pqg: cute.Pointer, pattn: cute.Pointer, pt: cute.Pointer, tokens: Int32,
               chunks: Int32, n_seq: Int32):
        self.run(pk, pv, pg, pbeta, pcu, pw, pu, pgo, pkd, tokens, chunks, n_seq, (pq, pqg, pattn), inverse=pt)


class DeltaPrepareInverseIntra(DeltaPrepareScores):
    """The backward recompute's prepare (``DeltaPrepareInverse``: T too) that does chunk_bwd_intra's work as well
    (``_delta_bwd_intra.DeltaBwdIntra``): qg = scale q e^gc to its scratch and the masked, decayed, scaled scores
    attn into shared memory from the k rows and gate sums the prepare holds, then, once u is out, dO's rows into
    v's place and P = attn^T dO over dD's region. Against the two launches: no second read of k and the gates, no
    second chunk locator, one launch less. gdn: q's rows in A's place before A is formed (``form_scores``, as
    ``DeltaPrepareScores`` forms them for the forward), attn in 9 KB of its own (about 46 KB at K = V = 128). kda:
    q's split rows q e^(gc - gc_mid) in a buffer of their own, against k's right operand k e^(gc_mid - gc) that
    the prepare has in A's place already for A (``form_scores_per_channel``), then attn over q's rows (about 55 KB
    at K = V = 128: the launch opts in). Called with k, v, g, beta, cu_seqlens, w, u, g_out, kd, T, q, dO, P, qg,
    then tokens, chunks, sequences. ``store_u=False``: u is not written (``DeltaPrepare.store_u``)."""

    def __init__(self, io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int,
                 HQ: int, H: int, use_l2: bool, scale: float, per_channel: bool = False, store_u: bool = True):
        DeltaPrepare.__init__(self, io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2, per_channel)
        self.scale = float(scale)
        self.store_u = store_u

    def shared_fields(self) -> dict:
        if self.per_channel:
            return {**super().shared_fields(), "q": shared_field(self.io, CHUNK * (self.K + _PAD))}
        return {**super().shared_fields(), "attn": shared_field(self.io, CHUNK * (CHUNK + _PAD))}

    @cute.jit
    def form_scores_per_channel(self, score_views, sR: cute.Tensor, gS: cute.Tensor, pivot: cute.Tensor,
                                start: Int32, count: Int32, tidx: Int32):
        """kda: q's rows (L2-normalised when asked) with their gate sums gc (``gS``, the chunk's g_out rows; rows
        past its end repeat the last): qg = scale q e^gc to its scratch, q e^(gc - gc_mid) (``pivot``: this
        thread's gc_mid segment) into q's split buffer; then attn = scale (q e^(gc - gc_mid)) (k e^(gc_mid -
        gc))^T, j <= t, with ``sR`` (A's place) the right operand, over q's buffer."""
        gQ, gQg, sQs, sAttn = score_views
        sums = cute.make_rmem_tensor((1, _SEG), Float32)
        qg_part = cute.make_rmem_tensor((1, _SEG), gQg.element_type)

        def with_gates(p, row, seg, x):
            cute.autovec_copy(cute.local_tile(gS, (1, _SEG), (start + cutlass.min(row, count - 1), seg)), sums)
            qg_part.store((x * cute.math.exp(sums.load()) * self.scale).to(gQg.element_type))
            cute.autovec_copy(qg_part, cute.local_tile(gQg, (1, _SEG), (row, seg)))

        def split_left(p, row, seg, x):
            return x * cute.math.exp(sums.load() - pivot.load())

        self.load_rows(gQ, sQs, start, count, self.K, self.use_l2, tidx, also=with_gates, store=split_left)
        cute.arch.sync_threads()
        split_mma = self.warp_mma(self.split)
        self.masked_scores(split_mma, split_mma.get_slice(tidx), sQs, sR, sAttn, None, False, tidx,
                           over_operand=True)

    @cute.jit
    def __call__(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer,
                 pcu: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer,
                 pt: cute.Pointer, pq: cute.Pointer, pdo: cute.Pointer, pp: cute.Pointer, pqg: cute.Pointer,
                 tokens: Int32, chunks: Int32, n_seq: Int32, stream: cuda.CUstream):
        self.kernel(pk, pv, pg, pbeta, pcu, pw, pu, pgo, pkd, pt, pq, pdo, pp, pqg, tokens, chunks, n_seq).launch(
            grid=[chunks, self.H, 1], block=[THREADS, 1, 1], smem=self.shared_bytes(), stream=stream,
            **self.launch_options())

    @cute.kernel
    def kernel(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer,
               pcu: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer,
               pt: cute.Pointer, pq: cute.Pointer, pdo: cute.Pointer, pp: cute.Pointer, pqg: cute.Pointer,
               tokens: Int32, chunks: Int32, n_seq: Int32):
        self.run(pk, pv, pg, pbeta, pcu, pw, pu, pgo, pkd, tokens, chunks, n_seq, inverse=pt,
                 intra=(pq, pdo, pp, pqg))

    @cute.jit
    def intra_values(self, tiled_mma, pdo: cute.Pointer, pp: cute.Pointer, sAttn: cute.Tensor, storage, c: Int32,
                     h: Int32, start: Int32, count: Int32, tokens: Int32, chunks: Int32, tidx: Int32):
        """P = attn^T dO (64 x V) into chunk c's P region, dO's rows (zeros past the chunk's end) in v's place."""
        V, H = self.V, self.H
        mDo = cute.make_tensor(pdo, cute.make_layout((tokens, H, V), stride=(H * V, V, 1)))
        mP = chunk_major(pp, chunks, H, V)
        width = self._row_width
        sDo = cute.make_tensor(storage.kv.data_ptr(), cute.make_layout((CHUNK, V), stride=(width, 1)))
        cute.arch.sync_threads()        # u's staged rows have left v's place
        self.load_rows(mDo[None, h, None], sDo, start, count, V, False, tidx)
        cute.arch.sync_threads()
        thr = tiled_mma.get_slice(tidx)
        p = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, V)), Float32)
        p.fill(0.0)
        self.product_tt(tiled_mma, p, sAttn, sDo, CHUNK, CHUNK, V, CHUNK + _PAD, width, tidx)
        self.store_fragment(p, thr.partition_C(mP[c, h, None, None]))

# gdn's prepare (and the one with the scores) issues k (q) and v at the chunk's start (``DeltaPrepare.prefetch``):
# its outputs are the round-trip kernel's bits (session 47, H100: all three prepares, BF16 / FP16, K 64 / 128,
# grouped value heads). Its GPU time against the round trips there (bench/delta_prepare.py): with the scores
# 0.86-1.00x at every shape and K; the plain prepare 0.89-0.94x at K = 128, but 1.01-1.07x at K = V = 64, where v's
# buffer costs a CTA an SM (80 registers allow six; 38 KB of shared memory five): off there
PREFETCH = True


def _pointer_types(io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str) -> tuple:
    """(element type, assumed address alignment) of each pointer argument, in order: k, v, g, beta,
    cu_seqlens, w, u, g_out, kd. The row-major tiles (rows of K or V elements) and g_out (a workspace
    region; kda's gate sums are read in 32-byte row segments) are assumed 16-byte aligned, the per-token
    inputs element-aligned."""
    return ((io_dtype, 16), (io_dtype, 16), (g_dtype, ITEMSIZE[g_dtype]), (beta_dtype, ITEMSIZE[beta_dtype]),
            ("int32", 4), (scratch_dtype, 16), (scratch_dtype, 16), ("float32", 16), (scratch_dtype, 16))


def compile_prepare(io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int, HQ: int,
                    H: int, use_l2: bool, per_channel: bool = False):
    """(compiled kernel, dynamic shared bytes) of one specialisation (CUTE_DSL_ARCH / the current GPU
    decides the target); the kernel is called with DSL pointers and sizes (``DeltaPrepare.__call__``)."""
    return compile_kernel(DeltaPrepare(io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2,
                                       per_channel), _pointer_types(io_dtype, g_dtype, beta_dtype, scratch_dtype))


def prepare_launcher(io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int, HQ: int,
                     H: int, use_l2: bool, n_seq: int, per_channel: bool = False,
                     prefetch: bool | None = None) -> KernelLauncher:
    """The launcher of one specialisation; its slots: k, v, g, beta, cu_seqlens, w, u, g_out, kd (kda:
    g_out holds the per-channel gate sums, read; gdn: the per-token sums, written). ``prefetch``:
    ``DeltaPrepare.prefetch`` (None: ``PREFETCH`` for gdn past K = V = 64)."""
    if prefetch is None:
        prefetch = PREFETCH and not per_channel and max(K, V) > 64
    key = ("chunk_prepare", io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2, per_channel, prefetch)
    return KernelLauncher(lambda: DeltaPrepare(io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2,
                                               per_channel, prefetch),
                          key, _pointer_types(io_dtype, g_dtype, beta_dtype, scratch_dtype), n_seq)


def prepare_scores_launcher(io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int,
                            HQ: int, H: int, use_l2: bool, scale: float, n_seq: int,
                            prefetch: bool | None = None) -> KernelLauncher:
    """The launcher of one ``DeltaPrepareScores`` specialisation (gdn); its slots: k, v, g, beta, cu_seqlens, w, u,
    g_out, kd, q, qg, attn. ``prefetch``: ``DeltaPrepare.prefetch`` (None: ``PREFETCH``)."""
    prefetch = PREFETCH if prefetch is None else prefetch
    key = ("chunk_prepare_scores", io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2, float(scale),
           prefetch)
    types = _pointer_types(io_dtype, g_dtype, beta_dtype, scratch_dtype) + ((io_dtype, 16),) * 3
    return KernelLauncher(lambda: DeltaPrepareScores(io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2,
                                                     scale, prefetch), key, types, n_seq)


def prepare_scores_inverse_launcher(io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int,
                                    V: int, HQ: int, H: int, use_l2: bool, scale: float, n_seq: int,
                                    prefetch: bool | None = None) -> KernelLauncher:
    """The launcher of one ``DeltaPrepareScoresInverse`` specialisation (gdn's forward keeping a chunk cache); its
    slots: k, v, g, beta, cu_seqlens, w, u, g_out, kd, q, qg, attn, T (T in the input type); ``prefetch`` as
    ``prepare_scores_launcher``'s."""
    prefetch = PREFETCH if prefetch is None else prefetch
    key = ("chunk_prepare_scores_inverse", io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2,
           float(scale), prefetch)
    types = _pointer_types(io_dtype, g_dtype, beta_dtype, scratch_dtype) + ((io_dtype, 16),) * 4
    return KernelLauncher(lambda: DeltaPrepareScoresInverse(io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ,
                                                            H, use_l2, scale, prefetch), key, types, n_seq)


def prepare_inverse_launcher(io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int,
                             HQ: int, H: int, use_l2: bool, n_seq: int, per_channel: bool = False,
                             own_dtype: str = "float32", store_u: bool = True) -> KernelLauncher:
    """The launcher of one ``DeltaPrepareInverse`` specialisation; its slots: k, v, g, beta, cu_seqlens, w, u,
    g_out, kd, T (w, u and kd in ``scratch_dtype``, T in ``own_dtype``; u left alone without ``store_u``)."""
    key = ("chunk_prepare_inverse", io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2, per_channel,
           own_dtype, store_u)
    types = _pointer_types(io_dtype, g_dtype, beta_dtype, scratch_dtype) + ((own_dtype, 16),)
    return KernelLauncher(lambda: DeltaPrepareInverse(io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H,
                                                      use_l2, per_channel, store_u), key, types, n_seq)


def prepare_inverse_intra_launcher(io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int,
                                   HQ: int, H: int, use_l2: bool, scale: float, n_seq: int, per_channel: bool = False,
                                   own_dtype: str = "float32", store_u: bool = True) -> KernelLauncher:
    """The launcher of one ``DeltaPrepareInverseIntra`` specialisation; its slots: k, v, g, beta, cu_seqlens, w, u,
    g_out, kd, T, q, dO, P, qg (w, u and kd in ``scratch_dtype``; T, P and qg in ``own_dtype``; kda: g_out holds
    the per-channel gate sums; u left alone without ``store_u``)."""
    key = ("chunk_prepare_inverse_intra", io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2,
           float(scale), per_channel, own_dtype, store_u)
    own, io = (own_dtype, 16), (io_dtype, 16)
    types = _pointer_types(io_dtype, g_dtype, beta_dtype, scratch_dtype) + (own, io, io, own, own)
    return KernelLauncher(lambda: DeltaPrepareInverseIntra(io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H,
                                                           use_l2, scale, per_channel, store_u), key, types,
                          n_seq)
