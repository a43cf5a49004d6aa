"""The chunked delta rule's state pass in CuTe DSL, for sm_90: a per-token (scalar) gate (gdn) or
per-channel gates (kda).

What ``engines/cutile/_kernels.chunk_state_pass`` computes for gdn and kda, from the same workspace regions, per
(sequence, value head, block of BV value columns), chunk after chunk::

    hs[c] = S (the state at the chunk's start),   D = U - W S  -> d[c],   S <- e^(gc_last) S + KD^T D

(per channel, e^(gc_last) scales each of the state's K rows by its own channel's decay).

The K x BV state stays in f32 accumulators for the whole sequence; its products take it rounded to the input
type (fla's h kernel does the same). Per chunk: W and KD (64 x K each) into shared memory in coalesced
16-byte segments, S's input-type copy into a small buffer (also hs's store), D = U - W S with U read in
the accumulators' own layout, D into the small buffer (d's store), then KD^T D with both operands through
ldmatrix.trans. About 45 KB of shared memory (K = 128, BV = 32: four warps).

BV = 64 takes eight warps (the extra four along the value columns), so that each CTA reads W and KD for
twice the columns: the W and KD traffic per column halves, each warp's share of the products stays as at
BV = 32. Its KD goes into W's buffer once W S is done (the S buffer alone is 18 KB at BV = 64, and so the
pass fits the 48 KB a launch gets without opting in), so KD's registers are refilled for the next chunk from
the middle of a step rather than its start. The split form (``DeltaStatePassSplit``) gives KD its own buffer
(53 KB at K = 128: the launch opts in), so both are put at a step's start and fetched a whole step ahead.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr, range_constexpr
from cutlass.memory import SmemAllocator
from cutlass.cute.nvgpu import OperandMajorMode
from cutlass.cute.nvgpu.warpgroup import OperandSource
from cutlass.tensor_utils import LayoutEnum
import cutlass.utils.hopper_helpers as sm90_utils

from ._delta_chunk import (CHUNK, DTYPES, PAD, SEG, ChunkKernel, KernelLauncher, chunk_major, compile_kernel,
                           shared_field, shared_struct)


# the warps a CTA takes for its BV value columns (four along the chunk's rows, the rest along the columns)
WARPS_OF_BV = {16: 4, 32: 4, 64: 8}


class DeltaStatePass(ChunkKernel):
    """One specialisation: the input (scratch) type, K, V, the value columns per CTA ``BV``, the value heads
    ``H``, whether an initial state is read / the final state written and whether the gates are per channel
    (kda: g holds their in-chunk sums, tokens x value heads x K)."""

    kd_buffer_of_its_own = False

    def __init__(self, io_dtype: str, K: int, V: int, BV: int, H: int, has_h0: bool, store_ht: bool,
                 per_channel: bool = False):
        if V % BV or BV not in WARPS_OF_BV:
            raise ValueError(f"BV = {BV} must divide V = {V} and be one of {sorted(WARPS_OF_BV)}")
        self.threads = 32 * WARPS_OF_BV[BV]
        # eight warps share one buffer between W and KD (see the module docstring; the split form does not)
        self.kd_in_w = BV > 32 and not self.kd_buffer_of_its_own
        self.io = DTYPES[io_dtype]
        self.K, self.V, self.BV, self.H = K, V, BV, H
        self.has_h0, self.store_ht = has_h0, store_ht
        self.per_channel = per_channel

    def shared_storage(self):
        return shared_struct("DeltaStateStorage", {
            "w": shared_field(self.io, CHUNK * (self.K + PAD)),
            "kd": shared_field(self.io, 8 if self.kd_in_w else CHUNK * (self.K + PAD)),
            "s": shared_field(self.io, max(self.K, CHUNK) * (self.BV + PAD)), "first": shared_field(Int32, self.threads),
            "decay": shared_field(Float32, self.K if self.per_channel else 1)})

    def shared_bytes(self) -> int:
        return self.shared_storage().size_in_bytes()

    @cute.jit
    def __call__(self, pkd: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer,
                 ph0: cute.Pointer, phs: cute.Pointer, pht: cute.Pointer, pd: cute.Pointer, tokens: Int32,
                 chunks: Int32, n_seq: Int32, stream: cuda.CUstream):
        self.kernel(pkd, pw, pu, pg, pcu, ph0, phs, pht, pd, tokens, chunks, n_seq).launch(
            grid=[n_seq, self.H, self.V // self.BV], block=[self.threads, 1, 1], smem=self.shared_bytes(),
            stream=stream, **self.launch_options())

    @cute.kernel
    def kernel(self, pkd: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer,
               ph0: cute.Pointer, phs: cute.Pointer, pht: cute.Pointer, pd: cute.Pointer, tokens: Int32,
               chunks: Int32, n_seq: Int32):
        K, V, BV, H = self.K, self.V, self.BV, self.H
        io = self.io
        mKd, mW, mD, mG, mCu, mHs = self.chunk_views(pkd, pw, pd, pg, pcu, phs, tokens, chunks, n_seq)
        mU = chunk_major(pu, chunks, H, V)
        mH0, mHt = self.sequence_states(ph0, pht, n_seq)
        storage = SmemAllocator().allocate(self.shared_storage())
        tiled_mma, tidx, thr, sFirst, n, h, vb, sDecay, state_rows = self.block_start(mCu, n_seq, storage)
        sW = cute.make_tensor(storage.w.data_ptr(), cute.make_layout((CHUNK, K), stride=(K + PAD, 1)))
        sKd = cute.make_tensor((storage.w if self.kd_in_w else storage.kd).data_ptr(),
                               cute.make_layout((CHUNK, K), stride=(K + PAD, 1)))
        sS = cute.make_tensor(storage.s.data_ptr(), cute.make_layout((K, BV), stride=(BV + PAD, 1)))
        sDelta = cute.make_tensor(storage.s.data_ptr(), cute.make_layout((CHUNK, BV), stride=(BV + PAD, 1)))

        bos, eos, first, n_chunks, state = self.sequence_start(mCu, mH0, thr, n, h, vb, tidx, sFirst)
        s_io = cute.make_rmem_tensor(state.shape, io)
        delta = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, BV)), Float32)
        u_part = cute.make_rmem_tensor(delta.shape, io)
        d_io = cute.make_rmem_tensor(delta.shape, io)
        # Chunk j + 1's W, KD, U and closing gate are loaded into registers while chunk j is computed: the
        # pass is a chain of dependent steps, so each step's global-load latency would otherwise add up.
        next_w = self.row_registers(K)
        next_kd = self.row_registers(K)
        next_u = cute.make_rmem_tensor(delta.shape, io)
        next_decay = cute.make_rmem_tensor((1,), Float32)
        if n_chunks > 0:     # an empty sequence's "first" chunk may lie past the workspace
            self.fetch_chunk(mW, mKd, mU, mG, thr, next_w, next_kd, next_u, next_decay, first, h, vb,
                             cutlass.min(bos + CHUNK, eos) - 1, tidx)
        for j in cutlass.range(n_chunks):
            c = first + j
            cute.arch.sync_threads()
            self.put_rows(next_w, sW, K, tidx)
            if const_expr(not self.kd_in_w):
                self.put_rows(next_kd, sKd, K, tidx)
            u_part.store(next_u.load())
            decay = next_decay[0]
            if const_expr(self.per_channel):
                if tidx < K:
                    sDecay[tidx] = cute.math.exp(decay)
            # the last chunk fetches itself again (a wasted load rather than a branch in the chain)
            following = cutlass.min(j + 1, n_chunks - 1)
            self.fetch_chunk(mW, mKd, mU, mG, thr, next_w, next_kd, next_u, next_decay, first + following, h, vb,
                             cutlass.min(bos + (following + 1) * CHUNK, eos) - 1, tidx, not self.kd_in_w)
            s_io.store(state.load().to(io))
            cute.autovec_copy(s_io, thr.partition_C(sS))
            cute.arch.sync_threads()
            self.copy_rows(sS, cute.local_tile(mHs[c, h, None, None], (K, BV), (0, vb)), K, BV, tidx)
            # D = U - W S
            delta.fill(0.0)
            self.product_bt(tiled_mma, delta, sW, sS, K, BV, BV + PAD, tidx)
            delta.store(u_part.load().to(Float32) - delta.load())
            cute.arch.sync_threads()
            d_io.store(delta.load().to(io))
            cute.autovec_copy(d_io, thr.partition_C(sDelta))
            if const_expr(self.kd_in_w):
                # W is read (the barrier above): this chunk's KD takes its place, the next chunk's is fetched
                self.put_rows(next_kd, sKd, K, tidx)
                self.fetch_rows(mKd[first + following, h, None, None], next_kd, K, tidx)
            cute.arch.sync_threads()
            self.copy_rows(sDelta, cute.local_tile(mD[c, h, None, None], (CHUNK, BV), (0, vb)), CHUNK, BV, tidx)
            # S <- e^(gc_last) S + KD^T D
            if const_expr(self.per_channel):
                for e in range_constexpr(cute.size(state)):
                    state[e] = state[e] * sDecay[state_rows[e][0]]
            else:
                state.store(state.load() * cute.math.exp(decay))
            self.product_tt(tiled_mma, state, sKd, sDelta, CHUNK, K, BV, K + PAD, BV + PAD, tidx)
        if const_expr(self.store_ht):
            cute.autovec_copy(state, thr.partition_C(cute.local_tile(mHt[n, h, None, None], (K, BV), (0, vb))))

    @cute.jit
    def chunk_views(self, pkd: cute.Pointer, pw: cute.Pointer, pd: cute.Pointer, pg: cute.Pointer,
                    pcu: cute.Pointer, phs: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32):
        """The global views both forms read and write as stored: kd, w (chunks x heads x 64 x K), d (x V), the
        cumulative gates (per token, or per channel), cu_seqlens and hs (chunks x heads x K x V)."""
        K, V, H = self.K, self.V, self.H
        if const_expr(self.per_channel):
            mG = cute.make_tensor(pg, cute.make_layout((tokens, H, K), stride=(H * K, K, 1)))
        else:
            mG = cute.make_tensor(pg, cute.make_layout((tokens, H), stride=(H, 1)))
        return (chunk_major(pkd, chunks, H, K), chunk_major(pw, chunks, H, K), chunk_major(pd, chunks, H, V),
                mG, cute.make_tensor(pcu, cute.make_layout((n_seq + 1,), stride=(1,))),
                cute.make_tensor(phs, cute.make_layout((chunks, H, K, V), stride=(H * K * V, K * V, V, 1))))

    @cute.jit
    def sequence_states(self, pa: cute.Pointer, pb: cute.Pointer, n_seq: Int32):
        """Two per-sequence state views (sequences x heads x K x V, f32): h0 and ht, or dht and dh0."""
        K, V, H = self.K, self.V, self.H
        states = cute.make_layout((n_seq, H, K, V), stride=(H * K * V, K * V, V, 1))
        return cute.make_tensor(pa, states), cute.make_tensor(pb, states)

    @cute.jit
    def block_start(self, mCu: cute.Tensor, n_seq: Int32, storage):
        """What a form's block starts with: the MMA, this thread's index and slice, the longest-first scan's
        buffer, the block's (sequence, head, value block) (``work_of_block``), the per-channel decay buffer
        (e^(gc_last) per channel) and the state accumulators' (row, column) places."""
        tiled_mma = self.warp_mma()
        tidx, _, _ = cute.arch.thread_idx()
        thr = tiled_mma.get_slice(tidx)
        sFirst = cute.make_tensor(storage.first.data_ptr(), cute.make_layout((self.threads,)))
        n, h, vb = self.work_of_block(mCu, n_seq, tidx, sFirst)
        sDecay = cute.make_tensor(storage.decay.data_ptr(), cute.make_layout((self.K,)))
        state_rows = thr.partition_C(cute.make_identity_tensor((self.K, self.BV)))
        return tiled_mma, tidx, thr, sFirst, n, h, vb, sDecay, state_rows

    def key_rows(self, storage):
        """The shared W, KD and qg buffers (64 rows of K) of the forms that hold all three."""
        rows_k = cute.make_layout((CHUNK, self.K), stride=(self.K + PAD, 1))
        return tuple(cute.make_tensor(field.data_ptr(), rows_k) for field in (storage.w, storage.kd, storage.qg))

    @cute.jit
    def fetch_chunk(self, mW: cute.Tensor, mKd: cute.Tensor, mU: cute.Tensor, mG: cute.Tensor, thr, next_w: cute.Tensor,
                    next_kd: cute.Tensor, next_u: cute.Tensor, next_decay: cute.Tensor, c: Int32, h: Int32, vb: Int32,
                    last_row: Int32, tidx: Int32, with_kd: cutlass.Constexpr = True,
                    u_transposed: cutlass.Constexpr = False):
        """Chunk c's W and KD rows (KD unless ``with_kd`` is False), this thread's U fragment (of U^T, mU
        viewed value column first, with ``u_transposed``) and the gate sum at the chunk's last row (per
        channel: channel tidx's) into registers (issued, not waited on)."""
        self.fetch_rows(mW[c, h, None, None], next_w, self.K, tidx)
        if const_expr(with_kd):
            self.fetch_rows(mKd[c, h, None, None], next_kd, self.K, tidx)
        if const_expr(u_transposed):
            u_tile = cute.local_tile(mU[c, h, None, None], (self.BV, CHUNK), (vb, 0))
        else:
            u_tile = cute.local_tile(mU[c, h, None, None], (CHUNK, self.BV), (0, vb))
        cute.autovec_copy(thr.partition_C(u_tile), next_u)
        if const_expr(self.per_channel):
            if tidx < self.K:
                next_decay[0] = mG[last_row, h, tidx]
        else:
            next_decay[0] = mG[last_row, h]

    @cute.jit
    def first_chunk(self, mCu: cute.Tensor, n: Int32, tidx: Int32, sFirst: cute.Tensor):
        """The global index of sequence n's first chunk: the chunk counts of the sequences before it, summed
        a block's width at a time."""
        part = Int32(0)
        for i in cutlass.range(tidx, n, self.threads):
            part = part + (mCu[i + 1] - mCu[i] + CHUNK - 1) // CHUNK
        sFirst[tidx] = part
        cute.arch.sync_threads()
        total = Int32(0)
        for i in range_constexpr(self.threads):
            total = total + sFirst[i]
        return total

    @cute.jit
    def work_of_block(self, mCu: cute.Tensor, n_seq: Int32, tidx: Int32, sFirst: cute.Tensor):
        """(sequence, value head, value block) of this CTA. The grid's CTAs, in launch order (x fastest), take
        the sequences longest first (ties in index order; a sequence's H x V / BV CTAs one after another)
        where the block's threads can rank them (at most ``threads`` sequences), else in index order: a CTA
        walks its sequence's chunks one after another, so the longest chains go first and the last wave
        holds the short ones (with 32 sequences of 64-512 tokens list scheduling's tail is about a tenth of
        the pass; equal lengths keep index order). ``sFirst`` is free again when it returns."""
        bx, by, bz = cute.arch.block_idx()
        per_sequence = self.H * (self.V // self.BV)
        linear = bx + n_seq * (by + self.H * bz)
        rank = linear // per_sequence
        rest = linear - rank * per_sequence
        n = rank
        if n_seq <= self.threads:
            length = Int32(-1)
            if tidx < n_seq:
                length = mCu[tidx + 1] - mCu[tidx]
            sFirst[tidx] = length
            cute.arch.sync_threads()
            ahead = Int32(0)
            for i in cutlass.range(n_seq):
                other = sFirst[i]
                ahead = ahead + cutlass.select_(other > length, Int32(1), Int32(0)) + cutlass.select_(
                    other == length, cutlass.select_(i < tidx, Int32(1), Int32(0)), Int32(0))
            cute.arch.sync_threads()
            if tidx < n_seq:
                if ahead == rank:
                    sFirst[0] = tidx
            cute.arch.sync_threads()
            n = sFirst[0]
            cute.arch.sync_threads()
        return n, rest % self.H, rest // self.H

    @cute.jit
    def sequence_start(self, mCu: cute.Tensor, mH0: cute.Tensor, thr, n: Int32, h: Int32, vb: Int32, tidx: Int32,
                       sFirst: cute.Tensor):
        """(bos, eos, first chunk, chunk count, S) of sequence n: S (K x BV) in ``thr``'s accumulator fragment,
        from h0 (mH0: sequences x heads x K x V) or zero."""
        bos = mCu[n]
        eos = mCu[n + 1]
        first = self.first_chunk(mCu, n, tidx, sFirst)
        n_chunks = (eos - bos + CHUNK - 1) // CHUNK
        state = cute.make_rmem_tensor(thr.partition_shape_C((self.K, self.BV)), Float32)
        if const_expr(self.has_h0):
            h0 = cute.make_rmem_tensor(state.shape, Float32)
            cute.autovec_copy(thr.partition_C(cute.local_tile(mH0[n, h, None, None], (self.K, self.BV), (0, vb))),
                              h0)
            state.store(h0.load())
        else:
            state.fill(0.0)
        return bos, eos, first, n_chunks, state

    @cute.jit
    def transposed_start(self, mCu: cute.Tensor, mH0t: cute.Tensor, thr, n: Int32, h: Int32, vb: Int32, tidx: Int32,
                         sFirst: cute.Tensor):
        """(bos, eos, first chunk, chunk count, S^T) of sequence n for the forms that hold the state transposed:
        S^T (BV x K) in ``thr``'s accumulator fragment, from h0 (mH0t: sequences x heads x V x K) or zero."""
        bos = mCu[n]
        eos = mCu[n + 1]
        first = self.first_chunk(mCu, n, tidx, sFirst)
        n_chunks = (eos - bos + CHUNK - 1) // CHUNK
        state = cute.make_rmem_tensor(thr.partition_shape_C((self.BV, self.K)), Float32)
        if const_expr(self.has_h0):
            h0 = cute.make_rmem_tensor(state.shape, Float32)
            cute.autovec_copy(thr.partition_C(cute.local_tile(mH0t[n, h, None, None], (self.BV, self.K), (vb, 0))),
                              h0)
            state.store(h0.load())
        else:
            state.fill(0.0)
        return bos, eos, first, n_chunks, state


# the value columns each warp of the resident form owns (one m16 row block of the transposed state)
RESIDENT_COLUMNS = 16


class DeltaStatePassResident(DeltaStatePass):
    """The state pass with the state held transposed, S^T (BV x K), in the MMA's accumulators, so that both
    products take their A operand from registers (an m16n8k16 accumulator pair is, converted, the A
    fragment of one k-block: no shared-memory round trip for S or D)::

        D^T = U^T - S^T W^T          (A: S^T, registers; B: W as stored)
        S^T <- S^T e^(gc_last) + D^T KD   (A: D^T, registers; B: KD read transposed)

    Four warps, each owning 16 value columns for the whole sequence: no warp reads another's registers, so a
    chunk takes two CTA barriers (W and KD stored, then read), not four. hs and d leave through a
    warp-private staging block (16 columns x 64 rows) in 32-byte row pieces. BV = 64."""

    def __init__(self, io_dtype: str, K: int, V: int, BV: int, H: int, has_h0: bool, store_ht: bool,
                 per_channel: bool = False):
        super().__init__(io_dtype, K, V, BV, H, has_h0, store_ht, per_channel)
        if BV != 4 * RESIDENT_COLUMNS:
            raise ValueError(f"the resident state pass takes BV = {4 * RESIDENT_COLUMNS}, not {BV}")
        self.threads = 128
        self.kd_in_w = False

    def shared_storage(self):
        return shared_struct("DeltaStateResidentStorage", {
            "w": shared_field(self.io, CHUNK * (self.K + PAD)),
            "kd": shared_field(self.io, CHUNK * (self.K + PAD)),
            "stage": shared_field(self.io, 4 * CHUNK * (RESIDENT_COLUMNS + PAD)),
            "first": shared_field(Int32, self.threads),
            "decay": shared_field(Float32, self.K if self.per_channel else 1)})

    @cute.kernel
    def kernel(self, pkd: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer,
               ph0: cute.Pointer, phs: cute.Pointer, pht: cute.Pointer, pd: cute.Pointer, tokens: Int32,
               chunks: Int32, n_seq: Int32):
        K, V, BV, H = self.K, self.V, self.BV, self.H
        io = self.io
        cols = RESIDENT_COLUMNS
        mKd, mW, mD, mG, mCu, mHs = self.chunk_views(pkd, pw, pd, pg, pcu, phs, tokens, chunks, n_seq)
        # U and the states read transposed (value column first), in the accumulators' own layout
        mUt = cute.make_tensor(pu, cute.make_layout((chunks, H, V, CHUNK), stride=(H * CHUNK * V, CHUNK * V, 1, V)))
        states_t = cute.make_layout((n_seq, H, V, K), stride=(H * K * V, K * V, 1, V))
        mH0t = cute.make_tensor(ph0, states_t)
        mHtt = cute.make_tensor(pht, states_t)
        tiled_mma = self.warp_mma()
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // 32
        lane = tidx % 32
        thr = tiled_mma.get_slice(tidx)
        storage = SmemAllocator().allocate(self.shared_storage())
        sW = cute.make_tensor(storage.w.data_ptr(), cute.make_layout((CHUNK, K), stride=(K + PAD, 1)))
        sKd = cute.make_tensor(storage.kd.data_ptr(), cute.make_layout((CHUNK, K), stride=(K + PAD, 1)))
        sKdT = cute.make_tensor(storage.kd.data_ptr(), cute.make_layout((K, CHUNK), stride=(1, K + PAD)))
        sStage = cute.make_tensor(storage.stage.data_ptr() + warp * CHUNK * (cols + PAD),
                                  cute.make_layout((CHUNK, cols), stride=(cols + PAD, 1)))
        sFirst = cute.make_tensor(storage.first.data_ptr(), cute.make_layout((self.threads,)))
        n, h, vb = self.work_of_block(mCu, n_seq, tidx, sFirst)
        sDecay = cute.make_tensor(storage.decay.data_ptr(), cute.make_layout((K,)))    # per channel: e^(gc_last)
        state_at = thr.partition_C(cute.make_identity_tensor((BV, K)))      # [e] -> (value column, key row)
        delta_at = thr.partition_C(cute.make_identity_tensor((BV, CHUNK)))  # [e] -> (value column, token)

        bos, eos, first, n_chunks, state = self.transposed_start(mCu, mH0t, thr, n, h, vb, tidx, sFirst)
        delta = cute.make_rmem_tensor(thr.partition_shape_C((BV, CHUNK)), Float32)
        next_w = self.row_registers(K)
        next_kd = self.row_registers(K)
        next_u = cute.make_rmem_tensor(delta.shape, io)
        next_decay = cute.make_rmem_tensor((1,), Float32)
        if n_chunks > 0:     # an empty sequence's "first" chunk may lie past the workspace
            self.fetch_chunk(mW, mKd, mUt, mG, thr, next_w, next_kd, next_u, next_decay, first, h, vb,
                             cutlass.min(bos + CHUNK, eos) - 1, tidx, True, True)
        for j in cutlass.range(n_chunks):
            c = first + j
            cute.arch.sync_threads()     # every warp is done with the previous chunk's W, KD and decays
            self.put_rows(next_w, sW, K, tidx)
            self.put_rows(next_kd, sKd, K, tidx)
            delta.store(next_u.load().to(Float32))      # D^T starts as U^T
            decay = next_decay[0]
            if const_expr(self.per_channel):
                if tidx < K:
                    sDecay[tidx] = cute.math.exp(decay)
            # the last chunk fetches itself again (a wasted load rather than a branch in the chain)
            following = cutlass.min(j + 1, n_chunks - 1)
            self.fetch_chunk(mW, mKd, mUt, mG, thr, next_w, next_kd, next_u, next_decay, first + following, h,
                             vb, cutlass.min(bos + (following + 1) * CHUNK, eos) - 1, tidx, True, True)
            cute.arch.sync_threads()     # W, KD and the decays are in shared memory
            # D^T = U^T - S^T W^T (S^T negated into the A operand)
            self.register_gemm(tiled_mma, delta, state, -1.0, thr.partition_shape_A((BV, K)), sW, False, tidx)
            # hs = S (the chunk's start state, still in the accumulators): this warp's 16 columns, all K rows,
            # through its staging block, after the product is issued (off the barrier-to-barrier path)
            hs_cols = cute.local_tile(mHs[c, h, None, None], (K, cols), (0, vb * 4 + warp))
            for half in range_constexpr(K // CHUNK):
                self.stage_out(state, state_at, half * CHUNK, 4 * CHUNK // 8 * half, sStage, hs_cols, warp, lane)
            self.stage_out(delta, delta_at, 0, 0, sStage,
                           cute.local_tile(mD[c, h, None, None], (CHUNK, cols), (0, vb * 4 + warp)), warp, lane)
            # S^T <- S^T e^(gc_last) + D^T KD
            if const_expr(self.per_channel):
                for e in range_constexpr(cute.size(state)):
                    state[e] = state[e] * sDecay[state_at[e][1]]
            else:
                state.store(state.load() * cute.math.exp(decay))
            self.register_gemm(tiled_mma, state, delta, 1.0, thr.partition_shape_A((BV, CHUNK)), sKdT, True, tidx)
        if const_expr(self.store_ht):
            cute.autovec_copy(state, thr.partition_C(cute.local_tile(mHtt[n, h, None, None], (BV, K), (vb, 0))))

    @cute.jit
    def register_gemm(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, src: cute.Tensor, sign: cutlass.Constexpr,
                      a_shape, sB: cute.Tensor, b_transposed: cutlass.Constexpr, tidx: Int32):
        """acc += (sign src) B, src an f32 accumulator fragment of this MMA (rows x width) taken as the A
        operand: an m16n8k16 accumulator's n-tiles 2kb and 2kb + 1 hold, value for value, the A fragment of
        k-block kb, so src viewed with the A fragment's shape (``a_shape``) is converted a k-block at a
        time. B (N x width) is read from shared memory by ldmatrix (transposed where the view is)."""
        src_a = cute.make_tensor(src.iterator, cute.make_layout(a_shape))
        a_kb = cute.make_rmem_tensor(src_a[None, None, 0].shape, self.io)
        thr = tiled_mma.get_slice(tidx)
        rB = tiled_mma.make_fragment_B(thr.partition_B(sB))
        copy_b = self.ldmatrix_copy(tiled_mma, "B", b_transposed, sB.element_type)
        thr_b = copy_b.get_slice(tidx)
        sB_src = thr_b.partition_S(sB)
        rB_view = thr_b.retile(rB)
        for kb in range_constexpr(cute.size(src_a, mode=[2])):
            cute.copy(copy_b, sB_src[None, None, kb], rB_view[None, None, kb])
            a_kb.store((src_a[None, None, kb].load() * sign).to(self.io))
            cute.gemm(tiled_mma, acc, a_kb, rB[None, None, kb], acc)

    @cute.jit
    def stage_out(self, frag: cute.Tensor, frag_at: cute.Tensor, first_col: cutlass.Constexpr,
                  first_value: cutlass.Constexpr, sStage: cute.Tensor, dst: cute.Tensor, warp: Int32, lane: Int32):
        """This warp's share of a transposed fragment (value column, r) for r in [first_col, first_col + 64)
        (its values first_value .. first_value + 31 in register order) into dst's rows r (dst: rows x 16, the
        warp's columns, global) in the input type, through the warp's staging block (64 x 16): element
        stores into it, then 16-byte segments out."""
        cols = RESIDENT_COLUMNS
        cute.arch.sync_warp()        # the block's previous contents are out
        for e in range_constexpr(first_value, first_value + 4 * CHUNK // 8):
            at = frag_at[e]
            sStage[at[1] - first_col, at[0] - warp * cols] = frag[e].to(self.io)
        cute.arch.sync_warp()
        segs = cols // SEG
        for i in range_constexpr(CHUNK * segs // 32):
            q = lane + i * 32
            cute.autovec_copy(cute.local_tile(sStage, (1, SEG), (q // segs, q % segs)),
                              cute.local_tile(dst, (1, SEG), (first_col + q // segs, q % segs)))


def _accumulator_as_a_operand(layout: cute.Layout) -> cute.Layout:
    """An m64nNk16 WGMMA accumulator's register layout, ((2, 2, N/8), MMA_M, MMA_N), read as the register
    A operand of a following WGMMA whose K is that N: each pair of its 8-column blocks holds, value for
    value, one k-block of 16 (the layout ((2, 2, 2), MMA_M, (N/16, MMA_N)); the PTX ISA's wgmma register
    fragments for .bf16 / .f16 A and the f32 accumulator place a thread's values the same way)."""
    halves = cute.logical_divide(layout, ((None, None, 2), None, None))
    shape, stride = halves.shape, halves.stride
    return cute.make_layout(
        ((shape[0][0], shape[0][1], shape[0][2][0]), shape[1], (shape[0][2][1], shape[2])),
        stride=((stride[0][0], stride[0][1], stride[0][2][0]), stride[1], (stride[0][2][1], stride[2])))


# the value columns of a warpgroup state pass's CTA: WGMMA's M
WARPGROUP_COLUMNS = 64


class DeltaStatePassWarpgroup(DeltaStatePass):
    """The state pass on one warpgroup's WGMMA (sm_90), the state transposed, S^T (64 value columns x K),
    in f32 accumulators for the whole sequence (as the resident form's, four times the MMA tile a warp)::

        D^T = U^T - S^T W^T            (A: -S^T in the input type, registers; B: W as stored, K-major)
        S^T <- S^T e^(gc_last) + D^T KD   (A: D^T, registers; B: KD as stored, value-column-major)

    Both products take A from the previous one's accumulators (an accumulator fragment is the A fragment
    of the next WGMMA, ``_accumulator_as_a_operand``), and W and KD from shared memory in WGMMA's 128-byte
    swizzled layouts (32 KB at K = 128), written from registers that were loaded while the previous chunk
    computed. hs and d are stored while the products run, each from the accumulators the running product
    does not touch. Two CTA barriers a chunk. BV = 64, 128 threads."""

    def __init__(self, io_dtype: str, K: int, V: int, BV: int, H: int, has_h0: bool, store_ht: bool,
                 per_channel: bool = False):
        super().__init__(io_dtype, K, V, BV, H, has_h0, store_ht, per_channel)
        if BV != WARPGROUP_COLUMNS:
            raise ValueError(f"the warpgroup state pass takes BV = {WARPGROUP_COLUMNS}, not {BV}")
        self.threads = 128
        self.kd_in_w = False

    def operand_layouts(self):
        """The swizzled shared layouts of W, (64 token rows, K), K contiguous, and KD read as (K, 64 token
        rows), K contiguous: WGMMA's B operands (N x K-block) of the two products."""
        w = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (self.BV, CHUNK, self.K), self.io, 1)
        kd = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, (self.BV, self.K, CHUNK), self.io, 1)
        return cute.slice_(w, (None, None, 0)), cute.slice_(kd, (None, None, 0))

    def shared_storage(self):
        # the swizzled layouts are dense: 64 x K elements each, on the 1024-byte period of the 128-byte swizzle
        return shared_struct("DeltaStateWarpgroupStorage", {
            "w": cute.struct.Align[cute.struct.MemRange[self.io, CHUNK * self.K], 1024],
            "kd": cute.struct.Align[cute.struct.MemRange[self.io, CHUNK * self.K], 1024],
            "first": shared_field(Int32, self.threads),
            "decay": shared_field(Float32, self.K if self.per_channel else 1)})

    def products(self):
        """The two WGMMAs (A from registers): D^T (64 x 64 tokens) over K, and S^T (64 x K) over the tokens."""
        def make(n, b_major):
            return sm90_utils.make_trivial_tiled_mma(self.io, self.io, OperandMajorMode.K, b_major, Float32, (1, 1, 1),
                                                     (self.BV, n), OperandSource.RMEM)
        return make(CHUNK, OperandMajorMode.K), make(self.K, OperandMajorMode.MN)

    def row_copy(self, k_contiguous_rows: bool):
        """The 16-byte copy that moves W (``k_contiguous_rows``: 64 rows of K) or KD viewed as (K, 64) between
        global memory, registers and its swizzled shared layout: a thread's share is whole 16-byte segments."""
        segs = self.K // SEG
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.io, num_bits_per_copy=128)
        if k_contiguous_rows:
            threads = cute.make_layout((self.threads // segs, segs), stride=(segs, 1))
            values = cute.make_layout((1, SEG))
        else:
            threads = cute.make_layout((segs, self.threads // segs), stride=(1, segs))
            values = cute.make_layout((SEG, 1))
        return cute.make_tiled_copy_tv(atom, threads, values)

    @cute.kernel
    def kernel(self, pkd: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer,
               ph0: cute.Pointer, phs: cute.Pointer, pht: cute.Pointer, pd: cute.Pointer, tokens: Int32,
               chunks: Int32, n_seq: Int32):
        K, V, BV, H = self.K, self.V, self.BV, self.H
        io = self.io
        _, mW, mD, mG, mCu, mHs = self.chunk_views(pkd, pw, pd, pg, pcu, phs, tokens, chunks, n_seq)
        # KD read as (K, 64 rows); U, d, hs and the states value column first (the accumulators' rows)
        mKdT = cute.make_tensor(pkd, cute.make_layout((chunks, H, K, CHUNK), stride=(H * CHUNK * K, CHUNK * K, 1, K)))
        mUt = cute.make_tensor(pu, cute.make_layout((chunks, H, V, CHUNK), stride=(H * CHUNK * V, CHUNK * V, 1, V)))
        mDt = cute.make_tensor(pd, cute.make_layout((chunks, H, V, CHUNK), stride=(H * CHUNK * V, CHUNK * V, 1, V)))
        mHst = cute.make_tensor(phs, cute.make_layout((chunks, H, V, K), stride=(H * K * V, K * V, 1, V)))
        states_t = cute.make_layout((n_seq, H, V, K), stride=(H * K * V, K * V, 1, V))
        mH0t = cute.make_tensor(ph0, states_t)
        mHtt = cute.make_tensor(pht, states_t)
        tidx, _, _ = cute.arch.thread_idx()
        w_layout, kd_layout = self.operand_layouts()
        storage = SmemAllocator().allocate(self.shared_storage())
        sW = storage.w.get_tensor(w_layout.outer, swizzle=w_layout.inner)
        sKd = storage.kd.get_tensor(kd_layout.outer, swizzle=kd_layout.inner)
        sFirst = cute.make_tensor(storage.first.data_ptr(), cute.make_layout((self.threads,)))
        n, h, vb = self.work_of_block(mCu, n_seq, tidx, sFirst)
        sDecay = cute.make_tensor(storage.decay.data_ptr(), cute.make_layout((K,)))    # per channel: e^(gc_last)

        mma_d, mma_s = self.products()
        mma_d.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        mma_s.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        # B operands (shared-memory descriptors) from the warpgroup's slice; register fragments and their
        # coordinates from each thread's own
        w_desc = mma_d.make_fragment_B(mma_d.get_slice(0).partition_B(sW))
        kd_desc = mma_s.make_fragment_B(mma_s.get_slice(0).partition_B(sKd))
        thr_d = mma_d.get_slice(tidx)
        thr_s = mma_s.get_slice(tidx)
        copy_w = self.row_copy(True)
        copy_kd = self.row_copy(False)
        thr_copy_w = copy_w.get_slice(tidx)
        thr_copy_kd = copy_kd.get_slice(tidx)
        put_w = thr_copy_w.partition_D(sW)
        put_kd = thr_copy_kd.partition_D(sKd)
        state_at = thr_s.partition_C(cute.make_identity_tensor((BV, K)))      # [e] -> (value column, key row)

        bos, eos, first, n_chunks, state = self.transposed_start(mCu, mH0t, thr_s, n, h, vb, tidx, sFirst)
        delta = cute.make_rmem_tensor(thr_d.partition_shape_C((BV, CHUNK)), Float32)
        s_io = cute.make_rmem_tensor(state.shape, io)       # -S^T: the first product's A, and hs
        d_io = cute.make_rmem_tensor(delta.shape, io)       # D^T: the second product's A, and d
        a_state = cute.make_tensor(s_io.iterator, _accumulator_as_a_operand(s_io.layout))
        a_delta = cute.make_tensor(d_io.iterator, _accumulator_as_a_operand(d_io.layout))
        next_w = cute.make_rmem_tensor_like(put_w)
        next_kd = cute.make_rmem_tensor_like(put_kd)
        next_u = cute.make_rmem_tensor(delta.shape, io)
        next_decay = cute.make_rmem_tensor((1,), Float32)
        if n_chunks > 0:     # an empty sequence's "first" chunk may lie past the workspace
            self.fetch_operands(mW, mKdT, mUt, mG, thr_d, copy_w, copy_kd, thr_copy_w, thr_copy_kd, next_w, next_kd,
                                next_u, next_decay, first, h, vb, cutlass.min(bos + CHUNK, eos) - 1, tidx)
        for j in cutlass.range(n_chunks):
            c = first + j
            cute.arch.sync_threads()     # every warp's products of the previous chunk are done
            cute.copy(copy_w, next_w, put_w)
            cute.copy(copy_kd, next_kd, put_kd)
            delta.store(next_u.load().to(Float32))      # D^T starts as U^T
            decay = next_decay[0]
            if const_expr(self.per_channel):
                if tidx < K:
                    sDecay[tidx] = cute.math.exp(decay)
            # the last chunk fetches itself again (a wasted load rather than a branch in the chain)
            following = cutlass.min(j + 1, n_chunks - 1)
            self.fetch_operands(mW, mKdT, mUt, mG, thr_d, copy_w, copy_kd, thr_copy_w, thr_copy_kd, next_w, next_kd,
                                next_u, next_decay, first + following, h, vb,
                                cutlass.min(bos + (following + 1) * CHUNK, eos) - 1, tidx)
            # the generic-proxy stores above are read by WGMMA (the async proxy)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()
            # D^T = U^T - S^T W^T (S^T negated into the A operand)
            s_io.store((-state.load()).to(io))
            self.issue_product(mma_d, delta, a_state, w_desc)
            # hs = S (the chunk's start state) while the product runs, from the accumulators it leaves alone (its
            # own A and accumulator registers may not be read before the wait: PTX leaves that undefined)
            self.store_rounded(state, thr_s.partition_C(cute.local_tile(mHst[c, h, None, None], (BV, K), (vb, 0))))
            cute.nvgpu.warpgroup.wait_group(0)
            # S^T <- S^T e^(gc_last) + D^T KD
            d_io.store(delta.load().to(io))
            if const_expr(self.per_channel):
                for e in range_constexpr(cute.size(state)):
                    state[e] = state[e] * sDecay[state_at[e][1]]
            else:
                state.store(state.load() * cute.math.exp(decay))
            self.issue_product(mma_s, state, a_delta, kd_desc)
            self.store_rounded(delta, thr_d.partition_C(cute.local_tile(mDt[c, h, None, None], (BV, CHUNK), (vb, 0))))
            cute.nvgpu.warpgroup.wait_group(0)
        if const_expr(self.store_ht):
            cute.autovec_copy(state, thr_s.partition_C(cute.local_tile(mHtt[n, h, None, None], (BV, K), (vb, 0))))

    @cute.jit
    def issue_product(self, mma: cute.TiledMma, acc: cute.Tensor, a: cute.Tensor, b_desc: cute.Tensor):
        """acc += A B on the warpgroup's WGMMA, A from registers, B from shared memory: issued and committed,
        not waited on."""
        cute.nvgpu.warpgroup.fence()
        for kb in range_constexpr(cute.size(a, mode=[2])):
            cute.gemm(mma, acc, a[None, None, kb], b_desc[None, None, kb], acc)
        cute.nvgpu.warpgroup.commit_group()

    @cute.jit
    def store_rounded(self, frag: cute.Tensor, dst: cute.Tensor):
        """An f32 fragment into ``dst`` (global, the fragment's partition) in the input type."""
        for e in range_constexpr(cute.size(frag)):
            dst[e] = frag[e].to(self.io)

    @cute.jit
    def fetch_operands(self, mW: cute.Tensor, mKdT: cute.Tensor, mUt: cute.Tensor, mG: cute.Tensor, thr_d,
                       copy_w, copy_kd, thr_copy_w, thr_copy_kd, next_w: cute.Tensor, next_kd: cute.Tensor,
                       next_u: cute.Tensor, next_decay: cute.Tensor, c: Int32, h: Int32, vb: Int32, last_row: Int32,
                       tidx: Int32):
        """Chunk c's W and KD segments, this thread's U^T fragment and the gate sum at the chunk's last row
        (per channel: channel tidx's) into registers (issued, not waited on)."""
        cute.copy(copy_w, thr_copy_w.partition_S(mW[c, h, None, None]), next_w)
        cute.copy(copy_kd, thr_copy_kd.partition_S(mKdT[c, h, None, None]), next_kd)
        cute.autovec_copy(thr_d.partition_C(cute.local_tile(mUt[c, h, None, None], (self.BV, CHUNK), (vb, 0))),
                          next_u)
        if const_expr(self.per_channel):
            if tidx < self.K:
                next_decay[0] = mG[last_row, h, tidx]
        else:
            next_decay[0] = mG[last_row, h]


def _pointer_types(io_dtype: str) -> tuple:
    """kd, w, u, g (the cumulative gates, f32: per token, or per channel), cu_seqlens, h0 (f32), hs, ht (f32),
    d."""
    return ((io_dtype, 16), (io_dtype, 16), (io_dtype, 16), ("float32", 4), ("int32", 4), ("float32", 16),
            (io_dtype, 16), ("float32", 16), (io_dtype, 16))


class DeltaStatePassSplit(DeltaStatePass):
    """The staged form at BV = 64 with KD in a buffer of its own (53 KB of shared memory at K = 128, past the
    48 KB a launch gets without opting in): W and KD are put at a step's start and fetched a whole step
    ahead. The same products in the same order as the staged form: the same bits."""

    kd_buffer_of_its_own = True

    def __init__(self, io_dtype: str, K: int, V: int, BV: int, H: int, has_h0: bool, store_ht: bool,
                 per_channel: bool = False):
        if BV != 64:
            raise ValueError(f"the split state pass takes BV = 64 (eight warps), not {BV}")
        super().__init__(io_dtype, K, V, BV, H, has_h0, store_ht, per_channel)


# the value columns a CTA of the fused state pass may take (four warps at 32, eight at 64)
FUSED_COLUMNS = (32, 64)


class DeltaStatePassFused(DeltaStatePass):
    """The split form that forms o itself (no chunk-start states or deltas through global memory): per chunk,
    besides W, KD and U, ``qg = scale q e^gc`` (64 x K) and the masked, decayed ``attn`` (64 x 64) of
    ``_delta_output.DeltaScores``, and::

        D = U - W S,   o = qg S + attn D,   S <- e^(gc_last) S + KD^T D

    o in the output kernel's product order (K's k-blocks, then attn's), so the same bits as the split form's
    state pass followed by ``DeltaOutput``. Why: that pair wrote and read every chunk-start state (K x V per
    chunk and head: 67 MB at 4 x 2048 tokens, 16 heads, K = V = 128) and the deltas, and the output kernel
    read q and k again. o leaves through a staging block a step late: its copy to global memory follows the
    next step's first barrier, so a step takes three barriers, not four. About 97 KB of shared memory at
    K = 128, BV = 64 (the launch opts in): eight warps; BV = 32 (twice the CTAs, for fewer sequences x
    heads): four warps, 80 KB. With ``store_hs`` it writes the chunk-start states after all (the forward's
    ``state_checkpoints``, one a chunk: S as the products read it, in the input type)."""

    kd_buffer_of_its_own = True

    def __init__(self, io_dtype: str, K: int, V: int, BV: int, H: int, has_h0: bool, store_ht: bool,
                 per_channel: bool = False, store_hs: bool = False):
        if BV not in FUSED_COLUMNS:
            raise ValueError(f"the fused state pass takes BV in {FUSED_COLUMNS}, not {BV}")
        super().__init__(io_dtype, K, V, BV, H, has_h0, store_ht, per_channel)
        self.store_hs = store_hs

    def shared_storage(self):
        K, BV, io = self.K, self.BV, self.io
        return shared_struct("DeltaStateFusedStorage", {
            "w": shared_field(io, CHUNK * (K + PAD)), "kd": shared_field(io, CHUNK * (K + PAD)),
            "qg": shared_field(io, CHUNK * (K + PAD)), "attn": shared_field(io, CHUNK * (CHUNK + PAD)),
            "s": shared_field(io, K * (BV + PAD)), "d": shared_field(io, CHUNK * (BV + PAD)),
            "o": shared_field(io, CHUNK * (BV + PAD)), "first": shared_field(Int32, self.threads),
            "decay": shared_field(Float32, K if self.per_channel else 1)})

    @cute.jit
    def __call__(self, pkd: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer,
                 ph0: cute.Pointer, pqg: cute.Pointer, pattn: cute.Pointer, pht: cute.Pointer, po: cute.Pointer,
                 phs: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32, stream: cuda.CUstream):
        self.kernel(pkd, pw, pu, pg, pcu, ph0, pqg, pattn, pht, po, phs, tokens, chunks, n_seq).launch(
            grid=[n_seq, self.H, self.V // self.BV], block=[self.threads, 1, 1], smem=self.shared_bytes(),
            stream=stream, **self.launch_options())

    @cute.kernel
    def kernel(self, pkd: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pg: cute.Pointer, pcu: cute.Pointer,
               ph0: cute.Pointer, pqg: cute.Pointer, pattn: cute.Pointer, pht: cute.Pointer, po: cute.Pointer,
               phs: cute.Pointer, tokens: Int32, chunks: Int32, n_seq: Int32):
        K, V, BV, H = self.K, self.V, self.BV, self.H
        io = self.io
        # qg stands in for d, which this form does not write; hs is written with store_hs alone
        mKd, mW, _, mG, mCu, mHs = self.chunk_views(pkd, pw, pqg, pg, pcu, phs, tokens, chunks, n_seq)
        mQg, mAttn = chunk_major(pqg, chunks, H, K), chunk_major(pattn, chunks, H, CHUNK)
        mU = chunk_major(pu, chunks, H, V)
        mO = cute.make_tensor(po, cute.make_layout((tokens, H, V), stride=(H * V, V, 1)))
        mH0, mHt = self.sequence_states(ph0, pht, n_seq)
        storage = SmemAllocator().allocate(self.shared_storage())
        tiled_mma, tidx, thr, sFirst, n, h, vb, sDecay, state_rows = self.block_start(mCu, n_seq, storage)
        sW, sKd, sQg = self.key_rows(storage)
        sAttn = cute.make_tensor(storage.attn.data_ptr(), cute.make_layout((CHUNK, CHUNK), stride=(CHUNK + PAD, 1)))
        sS = cute.make_tensor(storage.s.data_ptr(), cute.make_layout((K, BV), stride=(BV + PAD, 1)))
        rows_bv = cute.make_layout((CHUNK, BV), stride=(BV + PAD, 1))
        sDelta = cute.make_tensor(storage.d.data_ptr(), rows_bv)
        sOut = cute.make_tensor(storage.o.data_ptr(), rows_bv)
        gO = mO[None, h, None]
        o_seg = vb * (BV // SEG)          # this CTA's first 16-byte segment of an o row

        bos, eos, first, n_chunks, state = self.sequence_start(mCu, mH0, thr, n, h, vb, tidx, sFirst)
        s_io = cute.make_rmem_tensor(state.shape, io)
        delta = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, BV)), Float32)
        out = cute.make_rmem_tensor(delta.shape, Float32)
        u_part = cute.make_rmem_tensor(delta.shape, io)
        d_io = cute.make_rmem_tensor(delta.shape, io)
        # chunk j + 1's operands in registers while chunk j is computed (as the staged form's)
        next_w = self.row_registers(K)
        next_kd = self.row_registers(K)
        next_qg = self.row_registers(K)
        next_attn = self.row_registers(CHUNK)
        next_u = cute.make_rmem_tensor(delta.shape, io)
        next_decay = cute.make_rmem_tensor((1,), Float32)
        if n_chunks > 0:     # an empty sequence's "first" chunk may lie past the workspace
            self.fetch_chunk(mW, mKd, mU, mG, thr, next_w, next_kd, next_u, next_decay, first, h, vb,
                             cutlass.min(bos + CHUNK, eos) - 1, tidx)
            self.fetch_rows(mQg[first, h, None, None], next_qg, K, tidx)
            self.fetch_rows(mAttn[first, h, None, None], next_attn, CHUNK, tidx)
        for j in cutlass.range(n_chunks):
            cute.arch.sync_threads()
            if j > 0:
                # the previous chunk's o, staged by every warp before the barrier
                previous = bos + (j - 1) * CHUNK
                self.copy_rows(sOut, gO, CHUNK, BV, tidx, previous, o_seg, cutlass.min(eos - previous, CHUNK))
            self.put_rows(next_w, sW, K, tidx)
            self.put_rows(next_kd, sKd, K, tidx)
            self.put_rows(next_qg, sQg, K, tidx)
            self.put_rows(next_attn, sAttn, CHUNK, tidx)
            u_part.store(next_u.load())
            decay = next_decay[0]
            if const_expr(self.per_channel):
                if tidx < K:
                    sDecay[tidx] = cute.math.exp(decay)
            # the last chunk fetches itself again (a wasted load rather than a branch in the chain)
            following = cutlass.min(j + 1, n_chunks - 1)
            self.fetch_chunk(mW, mKd, mU, mG, thr, next_w, next_kd, next_u, next_decay, first + following, h, vb,
                             cutlass.min(bos + (following + 1) * CHUNK, eos) - 1, tidx)
            self.fetch_rows(mQg[first + following, h, None, None], next_qg, K, tidx)
            self.fetch_rows(mAttn[first + following, h, None, None], next_attn, CHUNK, tidx)
            s_io.store(state.load().to(io))
            cute.autovec_copy(s_io, thr.partition_C(sS))
            cute.arch.sync_threads()
            if const_expr(self.store_hs):
                # the chunk-start state as the products read it (sS is next written after two more barriers)
                self.copy_rows(sS, cute.local_tile(mHs[first + j, h, None, None], (K, BV), (0, vb)), K, BV, tidx)
            # D = U - W S and qg S, both over S as stored
            delta.fill(0.0)
            self.product_bt(tiled_mma, delta, sW, sS, K, BV, BV + PAD, tidx)
            out.fill(0.0)
            self.product_bt(tiled_mma, out, sQg, sS, K, BV, BV + PAD, tidx)
            delta.store(u_part.load().to(Float32) - delta.load())
            d_io.store(delta.load().to(io))
            cute.autovec_copy(d_io, thr.partition_C(sDelta))
            cute.arch.sync_threads()
            # o = qg S + attn D;  S <- e^(gc_last) S + KD^T D
            self.product_bt(tiled_mma, out, sAttn, sDelta, CHUNK, BV, BV + PAD, tidx)
            if const_expr(self.per_channel):
                for e in range_constexpr(cute.size(state)):
                    state[e] = state[e] * sDecay[state_rows[e][0]]
            else:
                state.store(state.load() * cute.math.exp(decay))
            self.product_tt(tiled_mma, state, sKd, sDelta, CHUNK, K, BV, K + PAD, BV + PAD, tidx)
            d_io.store(out.load().to(io))
            cute.autovec_copy(d_io, thr.partition_C(sOut))
        cute.arch.sync_threads()
        if n_chunks > 0:
            last = bos + (n_chunks - 1) * CHUNK
            self.copy_rows(sOut, gO, CHUNK, BV, tidx, last, o_seg, eos - last)
        if const_expr(self.store_ht):
            cute.autovec_copy(state, thr.partition_C(cute.local_tile(mHt[n, h, None, None], (K, BV), (0, vb))))


FORMS = {"staged": DeltaStatePass, "resident": DeltaStatePassResident, "warpgroup": DeltaStatePassWarpgroup,
         "split": DeltaStatePassSplit}


def compile_state_pass(io_dtype: str, K: int, V: int, BV: int, H: int, has_h0: bool, store_ht: bool,
                       per_channel: bool = False, form: str = "staged"):
    kind = FORMS[form]
    return compile_kernel(kind(io_dtype, K, V, BV, H, has_h0, store_ht, per_channel), _pointer_types(io_dtype))


def state_pass_launcher(io_dtype: str, K: int, V: int, BV: int, H: int, has_h0: bool, store_ht: bool,
                        n_seq: int, per_channel: bool = False, form: str = "staged") -> KernelLauncher:
    """The launcher of one specialisation of ``form`` (a key of FORMS); its slots: kd, w, u, g, cu_seqlens, h0,
    hs, ht, d."""
    key = ("chunk_state_pass", io_dtype, K, V, BV, H, has_h0, store_ht, per_channel, form)
    kind = FORMS[form]
    return KernelLauncher(lambda: kind(io_dtype, K, V, BV, H, has_h0, store_ht, per_channel), key,
                          _pointer_types(io_dtype), n_seq)


def _fused_pointer_types(io_dtype: str) -> tuple:
    """kd, w, u, g, cu_seqlens, h0 (f32), qg, attn, ht (f32), o, hs."""
    kd, w, u, g, cu, h0, hs, ht, _ = _pointer_types(io_dtype)
    return (kd, w, u, g, cu, h0, (io_dtype, 16), (io_dtype, 16), ht, (io_dtype, 16), hs)


def fused_state_pass_launcher(io_dtype: str, K: int, V: int, BV: int, H: int, has_h0: bool, store_ht: bool,
                              n_seq: int, per_channel: bool = False, store_hs: bool = False) -> KernelLauncher:
    """The launcher of one ``DeltaStatePassFused`` specialisation (BV value columns a CTA); its slots: kd, w, u,
    g, cu_seqlens, h0, qg, attn, ht, o, hs (the chunk-start states, written with ``store_hs``, else not
    touched)."""
    key = ("chunk_state_output", io_dtype, K, V, BV, H, has_h0, store_ht, per_channel, store_hs)
    return KernelLauncher(lambda: DeltaStatePassFused(io_dtype, K, V, BV, H, has_h0, store_ht, per_channel,
                                                      store_hs), key, _fused_pointer_types(io_dtype), n_seq)
