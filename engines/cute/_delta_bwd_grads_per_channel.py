"""kda's chunk_bwd_grads in CuTe DSL for sm_90: ``DeltaBwdGradsPerChannel``, the per-token kernel of
``_delta_bwd_grads`` (its docstring has the algorithm and the operand pairing the gate's terms need) for a gate
per (token, key column). ``_delta_bwd_grads.bwd_grads_launcher`` builds either."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr, range_constexpr
from cutlass.memory import SmemAllocator

from ._delta_bwd_grads import DeltaBwdGrads
from ._delta_chunk import CHUNK, PAD, SEG, SPLIT_ROW, THREADS, shared_field, shared_struct


# f32 shared rows of the per-channel kernel's 64 x 64 gate blocks: 68 floats apart (272 bytes: 16-byte aligned rows,
# a quad's lanes on other banks than the next row's)
GATE_STRIDE = CHUNK + 4
_ROW_DOT = 0       # rows[0] of the per-channel kernel: sum over V of S0 * dS1 per key row of the block


class DeltaBwdGradsPerChannel(DeltaBwdGrads):
    """chunk_bwd_grads for a per-channel gate (kda): g is (tokens, H, K), and the gate's terms are per (token, key
    column) instead of row sums. Per block of 64 key columns, what the per-token kernel does with these changes:

    - the gate's in-chunk sums gc (64 x 64, f32 shared: g's rows, then a cumulative sum down each column by one
      thread a column) and its factors e^gc, e^(gc - gc_mid), e^(gc_mid - gc), e^(gc_last - gc) per element;
    - the gate-gradient terms per element added up in f32 shared memory (``dgc``: in registers the sm_90a cubin
      spilled 656 bytes a thread at K = 128); one thread a column forms dg as their reverse cumulative sum plus
      the last row's term: the column sums of kg * dkg (a warp's lanes by shuffles, then the warps through
      shared memory) and e^gc_last times the key row's sum over V of S0 * dS1 (in f32, as dS1's rows are
      rounded into shared memory);
    - two operand buffers instead of four (dO and S0, then D and dS1, reloaded a block each; qn and kn over the
      first), so that two CTAs fit an SM with the two f32 gate blocks beside them; at K = 64 dq and dk before
      the norm wait in q's and k's columns (``holds_last_block``), each thread over the places it alone reads.
    """

    per_channel = True          # g and dg (tokens, H, K)

    def shared_storage(self):
        block = CHUNK * (CHUNK + PAD)
        operands = max(CHUNK * (self.V + PAD), 2 * block)      # 64 rows of V, or qn and kn
        return shared_struct("DeltaBwdGradsPerChannelStorage", {
            "a": shared_field(self.io, operands), "b": shared_field(self.io, operands),
            "q": shared_field(self.io, block), "k": shared_field(self.io, block),
            "dm": shared_field(self.io, block), "da": shared_field(self.io, block),
            "gc": shared_field(Float32, CHUNK * GATE_STRIDE), "dgc": shared_field(Float32, CHUNK * GATE_STRIDE),
            # per token: beta, 1/||q||, 1/||k||, and the row sums dbeta, q . dq, k . dk (rows 5-7, 9-11, as the
            # per-token kernel's); per key row of the block: sum(S0 * dS1) (row 0)
            # (rows 12-14: the row sums of warps 4-7 with eight warps, added in before they are read)
            "rows": shared_field(Float32, self._row_fields * CHUNK),
            # each warp's column sums of kg * dkg (with eight warps, each of its 32 columns)
            "columns": shared_field(Float32, (self.threads // 32) * CHUNK),
            "scan": shared_field(Int32, THREADS), "where": shared_field(Int32, 4)})

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
        gates = cute.make_layout((CHUNK, CHUNK), stride=(GATE_STRIDE, 1))
        sA = cute.make_tensor(storage.a.data_ptr(), v_rows)       # dO, then D
        sB = cute.make_tensor(storage.b.data_ptr(), v_rows)       # S0's key rows, then dS1's
        # the four score products' operands in the split type (``split_mma``): qn and kn over A, an over B, dm, dA
        sQn = self.as_split_view(cute.make_tensor(storage.a.data_ptr(), block))
        sKn = self.as_split_view(cute.make_tensor(storage.a.data_ptr() + CHUNK * (CHUNK + PAD), block))
        sAn = self.as_split_view(cute.make_tensor(storage.b.data_ptr(), block))
        sDgc = cute.make_tensor(storage.dgc.data_ptr(), gates)
        sQ = cute.make_tensor(storage.q.data_ptr(), block)
        sK = cute.make_tensor(storage.k.data_ptr(), block)
        sDm = self.as_split_view(cute.make_tensor(storage.dm.data_ptr(), block))
        sDa = self.as_split_view(cute.make_tensor(storage.da.data_ptr(), block))
        split_mma = self.warp_mma(self.split)
        sGc = cute.make_tensor(storage.gc.data_ptr(), gates)
        rows = cute.make_tensor(storage.rows.data_ptr(),
                                cute.make_layout((self._row_fields, CHUNK), stride=(CHUNK, 1)))
        sColumns = cute.make_tensor(storage.columns.data_ptr(),
                                    cute.make_layout((self.threads // 32, CHUNK), stride=(CHUNK, 1)))
        # dq and dk before the norm wait in q's and k's columns at K = 64 only (no scratch round trip at all); at
        # K = 128 the choice between the scratch and the columns took 160 -> 328 bytes of stack (sm_90a, 8 warps)
        sQHeld = sQ if const_expr(K == CHUNK) else None
        sKHeld = sK if const_expr(K == CHUNK) else None

        c, seq, start, count = self.chunk_of_block(mCu, n_seq, tidx, storage)
        if seq < n_seq:
            do_rows = self.issue_rows(mDo[None, h, None], start, count, V, tidx)
            self.token_factors(mQ[None, hk, None], mK[None, hk, None], mBeta, rows, h, start, count, tidx)
            # dm = tril(dO D^T) scale over all of V, and dA, once
            self.put_loaded_rows(do_rows, sA, V, False, tidx)
            self.scratch_rows(mD[c, h, None, None], sB, V, tidx)
            self.scratch_rows(mDa[c, h, None, None], sDa, CHUNK, tidx)
            cute.arch.sync_threads()
            row0, col0 = self.first_place(tidx)
            acc = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, CHUNK)), Float32)
            self.score_gradient(tiled_mma, thr, acc, sA, sB, sDm, row0, col0, tidx)

            sums = cute.make_rmem_tensor((3, 2), Float32)        # dbeta, q . dq, k . dk for row0, row0 + 8
            sums.fill(0.0)
            dq = cute.make_rmem_tensor(acc.shape, Float32)
            dk = cute.make_rmem_tensor(acc.shape, Float32)
            dct = cute.make_rmem_tensor(acc.shape, Float32)
            # the gate-gradient terms of this thread's places, at K = 64 (at 128 the registers spilled 528 bytes)
            dgc = cute.make_rmem_tensor(acc.shape, Float32) if const_expr(K == CHUNK) else None
            mid_row = cutlass.min(count - 1, SPLIT_ROW)
            for kb in cutlass.range(K // CHUNK):
                # the block's rows in flight together, across the barrier (loaded and stored a row at a time they
                # held an eighth of the stall samples: ncu, H100): g, q and k by registers; S0 and dO by cp.async
                # (the next block's issued before this one's gate gradients), S0 by registers from f32 scratch
                block_rows = self.issue_key_block(mG[None, h, None], mQ[None, hk, None], mK[None, hk, None],
                                                  mHs[c, h, None, None], start, count, kb, tidx)
                cute.arch.sync_threads()        # the previous block's readers of A, B, the gates and sums are done
                if kb == 0:
                    self.copy_block_async(mDo[None, h, None], mHs[c, h, None, None], sA, sB, start, count, kb, tidx)
                self.put_key_block(block_rows, sGc, sQ, sK, sB, rows, tidx)
                cute.arch.cp_async_wait_group(0)
                cute.arch.sync_threads()
                self.column_cumsum(sGc, tidx)
                # dqs = dO S0^T -> dq = dqs e^gc scale
                acc.fill(0.0)
                self.product(tiled_mma, acc, sA, sB, tidx)
                cute.arch.sync_threads()        # the sums are formed; dO's and S0's rows are read
                # D's and dS1's rows in flight during dq's epilogue
                state_rows = self.issue_state_rows(mD[c, h, None, None], mHs[c, h, None, None],
                                                   mDhs[c, h, None, None], sA, kb, tidx)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    dq[e] = acc[e] * cute.math.exp(sGc[t, i]) * self.scale
                    self.gate_term(dgc, sDgc, e, t, i, lambda: sQ[t, i].to(Float32) * dq[e], first=True)
                # dkg = D dS1^T -> dk = dkg e^(last - gc)
                self.put_state_rows(state_rows, sA, sB, rows, tidx)
                cute.arch.cp_async_wait_group(0)
                cute.arch.sync_threads()
                acc.fill(0.0)
                self.product(tiled_mma, acc, sA, sB, tidx)
                columns = cute.make_rmem_tensor((cute.size(acc) // 2,), Float32)     # kg * dkg over row0, row0 + 8
                columns.fill(0.0)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    tail = cute.math.exp(sGc[count - 1, i] - sGc[t, i])
                    kg_dkg = sK[t, i].to(Float32) * tail * acc[e]
                    dk[e] = acc[e] * tail
                    self.gate_term(dgc, sDgc, e, t, i, lambda: kg_dkg, subtract=True)
                    columns[(e // 4) * 2 + e % 2] = columns[(e // 4) * 2 + e % 2] + kg_dkg
                self.warp_column_sums(columns, sColumns, col0, tidx)
                cute.arch.sync_threads()        # D's and dS1's rows are read: qn, kn, an take their place
                self.split_operands_per_channel(sQ, sK, sQn, sKn, sAn, sGc, rows, mid_row, tidx)
                cute.arch.sync_threads()
                # dm kn -> dq, which then leaves
                acc.fill(0.0)
                self.product_bt(split_mma, acc, sDm, sKn, CHUNK, CHUNK, CHUNK + PAD, tidx)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    q = sQ[t, i].to(Float32)
                    up = cute.math.exp(sGc[t, i] - sGc[mid_row, i])
                    dq[e] = dq[e] + acc[e] * up
                    self.gate_term(dgc, sDgc, e, t, i, lambda: self.as_operand(q * up) * acc[e])
                    self.add_row(sums, 1, e, q * dq[e])
                # the last key block's dq over q's columns (each thread's own places: read above, not read again)
                self.leave(thr, dq, mDqp[c, h, None, None], mDq[None, h, None], row0, col0, start, count, kb, sQHeld)
                # dm^T qn -> dk
                acc.fill(0.0)
                self.product_tt(split_mma, acc, sDm, sQn, CHUNK, CHUNK, CHUNK, CHUNK + PAD, CHUNK + PAD, tidx)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    down = cute.math.exp(sGc[mid_row, i] - sGc[t, i])
                    dk[e] = dk[e] + acc[e] * down
                    self.gate_term(dgc, sDgc, e, t, i, lambda: self.as_operand(sK[t, i].to(Float32) * down) * acc[e],
                                   subtract=True)
                # dA kn -> dCt = dCg e^gc + dA kn e^(gc - mid)
                self.load_fragment(thr.partition_C(cute.local_tile(mDcg[c, h, None, None], (CHUNK, CHUNK),
                                                                      (0, kb))), dct)
                acc.fill(0.0)
                self.product_bt(split_mma, acc, sDa, sKn, CHUNK, CHUNK, CHUNK + PAD, tidx)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    gc = sGc[t, i]
                    k = sK[t, i].to(Float32)
                    decay = cute.math.exp(gc)
                    up = cute.math.exp(gc - sGc[mid_row, i])
                    t_a = acc[e] * up
                    self.gate_term(dgc, sDgc, e, t, i, lambda: rows[5, t] * k * decay * dct[e],
                                   then=lambda: self.as_operand(k * up * rows[5, t]) * acc[e])
                    dct[e] = dct[e] * decay + t_a
                # dA^T an -> dk, which then leaves
                acc.fill(0.0)
                self.product_tt(split_mma, acc, sDa, sAn, CHUNK, CHUNK, CHUNK, CHUNK + PAD, CHUNK + PAD, tidx)
                for e in range_constexpr(cute.size(acc)):
                    t, i = self.place(e, row0, col0)
                    k = sK[t, i].to(Float32)
                    down = cute.math.exp(sGc[mid_row, i] - sGc[t, i])
                    dk[e] = dk[e] + acc[e] * down + rows[5, t] * dct[e]
                    self.gate_term(dgc, sDgc, e, t, i, lambda: self.as_operand(k * down) * acc[e], subtract=True,
                                   last=True)
                    self.add_row(sums, 0, e, k * dct[e])
                    self.add_row(sums, 2, e, k * dk[e])
                self.leave(thr, dk, mDkp[c, h, None, None], mDk[None, h, None], row0, col0, start, count, kb, sKHeld)
                cute.arch.sync_threads()        # every term is in the gate-gradient block
                if kb + 1 < K // CHUNK:
                    self.copy_block_async(mDo[None, h, None], mHs[c, h, None, None], sA, sB, start, count, kb + 1,
                                          tidx)
                self.gate_gradients(sDgc, sGc, sColumns, rows, mDg[None, h, None], start, count, kb, tidx)
            self.finish_rows(sums, rows, row0, mDbv[c, h, None, None], mDbeta, h, start, count, tidx)
            if const_expr(self.use_l2):
                cute.arch.sync_threads()        # every dq / dk before the norm is written, the row dots are summed
                self.through_the_norm(mDqp[c, h, None, None], mQ[None, hk, None], mDq[None, h, None], rows, 6, 10,
                                      start, count, tidx, sQHeld)
                self.through_the_norm(mDkp[c, h, None, None], mK[None, hk, None], mDk[None, h, None], rows, 7, 11,
                                      start, count, tidx, sKHeld)

    # -- helpers ------------------------------------------------------------------------------------

    @cute.jit
    def token_factors(self, gQ: cute.Tensor, gK: cute.Tensor, mBeta: cute.Tensor, rows: cute.Tensor, h: Int32,
                      start: Int32, count: Int32, tidx: Int32):
        """rows[5..7] per token: beta, 1 / ||q||, 1 / ||k|| (as ``row_factors``); rows[9..11] zero. Every thread is
        past a barrier when it returns."""
        norm_rows = self.issue_norm_rows(gQ, gK, start, count, tidx)
        if tidx < CHUNK:
            b = Float32(0.0)
            if tidx < count:
                b = mBeta[start + tidx, h].to(Float32)
            rows[5, tidx] = b
            for which in range_constexpr(9, 12):
                rows[which, tidx] = Float32(0.0)
        self.inverse_norms(norm_rows, rows, tidx)
        cute.arch.sync_threads()

    @cute.jit
    def issue_key_block(self, gG: cute.Tensor, gQ: cute.Tensor, gK: cute.Tensor, gS: cute.Tensor, start: Int32,
                        count: Int32, kb: Int32, tidx: Int32):
        """Key block kb's rows into registers, issued and not waited on (``put_key_block`` stores them): columns
        [64 kb, 64 kb + 64) of g's, q's and k's chunk rows (zeros past the chunk's end), and S0's key rows [64 kb,
        64 kb + 64) where the scratch (gS: K x V) is f32 (in the input type they come by ``copy_block_async``)."""
        first_seg = kb * (CHUNK // SEG)
        g = self.issue_rows(gG, start, count, CHUNK, tidx, first_seg)
        q = self.issue_rows(gQ, start, count, CHUNK, tidx, first_seg)
        k = self.issue_rows(gK, start, count, CHUNK, tidx, first_seg)
        s0 = None
        if const_expr(gS.element_type is not self.io):
            s0 = self.issue_rows(gS, kb * CHUNK, CHUNK, self.V, tidx)
        return g, q, k, s0

    @cute.jit
    def copy_block_async(self, gDo: cute.Tensor, gS: cute.Tensor, sDo: cute.Tensor, sS0: cute.Tensor, start: Int32,
                         count: Int32, kb: Int32, tidx: Int32):
        """Key block kb's rows that need no arithmetic on the way, by cp.async (the caller waits, then a barrier):
        S0's key rows [64 kb, 64 kb + 64) into sS0 where the scratch is the input type, and past the first block
        dO's rows into sDo (a row past the chunk's end repeats its last: dq's rows there meet a zero q and are
        not stored). Readers of both buffers must be past a barrier."""
        if const_expr(gS.element_type is self.io):
            self.copy_rows_async(cute.local_tile(gS, (CHUNK, self.V), (kb, 0)), sS0, self.V, tidx)
        if kb > 0:
            self.copy_rows_async(gDo, sDo, self.V, tidx, start, count)

    @cute.jit
    def put_key_block(self, block_rows, sGc: cute.Tensor, sQ: cute.Tensor, sK: cute.Tensor, sS0: cute.Tensor,
                      rows: cute.Tensor, tidx: Int32):
        """``issue_key_block``'s rows into shared memory: g in f32 (sGc), q and k times 1 / ||x|| (rows[6], rows[7])
        with L2 norm, S0 (from f32 scratch) in the input type."""
        g, q, k, s0 = block_rows
        segs = CHUNK // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        gates = cute.make_rmem_tensor((1, SEG), Float32)
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            gates.store(cute.local_tile(g, (1, SEG), (p, 0)).load().to(Float32))
            cute.autovec_copy(gates, cute.local_tile(sGc, (1, SEG), (row, seg)))
        self.put_columns(q, sQ, rows, 6, tidx)
        self.put_columns(k, sK, rows, 7, tidx)
        if const_expr(s0 is not None):
            self.put_scratch_rows(s0, sS0, self.V, tidx)

    @cute.jit
    def column_cumsum(self, sGc: cute.Tensor, tidx: Int32):
        """sGc's columns replaced by their inclusive cumulative sums, one thread a column (threads 0-63)."""
        if tidx < CHUNK:
            total = Float32(0.0)
            for t in range_constexpr(CHUNK):
                total = total + sGc[t, tidx]
                sGc[t, tidx] = total

    @cute.jit
    def issue_state_rows(self, gD: cute.Tensor, gS0: cute.Tensor, gDs1: cute.Tensor, sD: cute.Tensor, kb: Int32,
                         tidx: Int32):
        """dS1's key rows [64 kb, 64 kb + 64) (K x V) into registers, issued and not waited on (``put_state_rows``
        stores them); D's chunk rows (64 x V) by cp.async into sD where the scratch is the input type (readers of
        sD past a barrier; the caller waits), else into registers, with S0's key rows (with 16-bit scratch the
        rows in shared memory are the scratch's own values)."""
        ds1 = self.issue_rows(gDs1, kb * CHUNK, CHUNK, self.V, tidx)
        d = None
        s0 = None
        if const_expr(gD.element_type is self.io):
            self.copy_rows_async(gD, sD, self.V, tidx)
        else:
            d = self.issue_rows(gD, 0, CHUNK, self.V, tidx)
            s0 = self.issue_rows(gS0, kb * CHUNK, CHUNK, self.V, tidx)
        return d, ds1, s0

    @cute.jit
    def put_state_rows(self, state_rows, sD: cute.Tensor, sS: cute.Tensor, rows: cute.Tensor, tidx: Int32):
        """``issue_state_rows``' rows into shared memory: D into sD (from registers); dS1 in the input type over
        S0's rows in sS, and rows[_ROW_DOT, r] = sum over V of S0 * dS1 of the block's key row r (f32; both as
        the scratch holds them: S0 from sS, where this thread's own copy put it, or from the f32 registers)."""
        d, ds1, s0 = state_rows
        V = self.V
        if const_expr(d is not None):
            self.put_scratch_rows(d, sD, V, tidx)
        segs = V // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        held = cute.make_rmem_tensor((1, SEG), self.io)
        out = cute.make_rmem_tensor((1, SEG), self.io)
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            place = cute.local_tile(sS, (1, SEG), (row, seg))
            if const_expr(s0 is None):
                cute.autovec_copy(place, held)
                x = held.load().to(Float32)
            else:
                x = cute.local_tile(s0, (1, SEG), (p, 0)).load().to(Float32)
            y = cute.local_tile(ds1, (1, SEG), (p, 0)).load().to(Float32)
            dot = (x * y).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            for lane in range_constexpr(segs.bit_length() - 1):
                dot = dot + cute.arch.shuffle_sync_bfly(dot, 1 << lane)
            if seg == 0:
                rows[_ROW_DOT, row] = dot
            out.store(y.to(self.io))
            cute.autovec_copy(out, place)

    @cute.jit
    def gate_term(self, dgc, sDgc: cute.Tensor, e: cutlass.Constexpr, t, i, term, then=None,
                  first: cutlass.Constexpr = False, subtract: cutlass.Constexpr = False,
                  last: cutlass.Constexpr = False):
        """Adds (or subtracts) one epilogue's gate-gradient term of place (t, i) (accumulator element e; ``term()``
        traces it after the place is read, in the order the epilogues always had): into ``dgc``'s registers
        where given (stored to sDgc with the ``last`` term: one shared-memory store a place instead of six
        read-modify-writes), else into sDgc; the ``first`` term sets it; ``then()``, when given, is added after
        ``term()``."""
        if const_expr(dgc is None):
            if const_expr(first):
                sDgc[t, i] = term()
            elif const_expr(subtract):
                sDgc[t, i] = sDgc[t, i] - term()
            elif const_expr(then is None):
                sDgc[t, i] = sDgc[t, i] + term()
            else:
                sDgc[t, i] = sDgc[t, i] + term() + then()
        else:
            total = dgc[e]
            if const_expr(first):
                total = term()
            elif const_expr(subtract):
                total = total - term()
            elif const_expr(then is None):
                total = total + term()
            else:
                total = total + term() + then()
            if const_expr(last):
                sDgc[t, i] = total
            else:
                dgc[e] = total

    @cute.jit
    def warp_column_sums(self, columns: cute.Tensor, sColumns: cute.Tensor, col0: Int32, tidx: Int32):
        """A thread's per-column partial sums (``columns[2 n + j]``: column col0 + 8 n + j with four warps, col0 +
        16 n + j with eight, over its two rows) summed over the warp's eight lanes that share the columns, into
        sColumns[warp, column]."""
        for n in range_constexpr(cute.size(columns)):
            x = columns[n]
            for lane in range_constexpr(2, 5):
                x = x + cute.arch.shuffle_sync_bfly(x, 1 << lane)
            columns[n] = x
        if (tidx % 32) < 4:
            for n in range_constexpr(cute.size(columns)):
                sColumns[tidx // 32, col0 + 8 * (self.threads // THREADS) * (n // 2) + n % 2] = columns[n]

    @cute.jit
    def split_operands_per_channel(self, sQ: cute.Tensor, sK: cute.Tensor, sQn: cute.Tensor, sKn: cute.Tensor,
                                   sAn: cute.Tensor, sGc: cute.Tensor, rows: cute.Tensor, mid_row: Int32,
                                   tidx: Int32):
        """qn = q e^(gc - mid), kn = k e^(mid - gc), an = beta k e^(gc - mid) per element (64 x 64, the split
        type), mid: gc's row ``mid_row``."""
        segs = CHUNK // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        part = cute.make_rmem_tensor((1, SEG), self.io)
        out = cute.make_rmem_tensor((1, SEG), self.split)
        gc = cute.make_rmem_tensor((1, SEG), Float32)
        mid = cute.make_rmem_tensor((1, SEG), Float32)
        cute.autovec_copy(cute.local_tile(sGc, (1, SEG), (mid_row, seg)), mid)
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            cute.autovec_copy(cute.local_tile(sGc, (1, SEG), (row, seg)), gc)
            up = cute.math.exp(gc.load() - mid.load())
            down = cute.math.exp(mid.load() - gc.load())
            cute.autovec_copy(cute.local_tile(sQ, (1, SEG), (row, seg)), part)
            out.store((part.load().to(Float32) * up).to(self.split))
            cute.autovec_copy(out, cute.local_tile(sQn, (1, SEG), (row, seg)))
            cute.autovec_copy(cute.local_tile(sK, (1, SEG), (row, seg)), part)
            k = part.load().to(Float32)
            out.store((k * down).to(self.split))
            cute.autovec_copy(out, cute.local_tile(sKn, (1, SEG), (row, seg)))
            out.store((k * up * rows[5, row]).to(self.split))
            cute.autovec_copy(out, cute.local_tile(sAn, (1, SEG), (row, seg)))

    @cute.jit
    def gate_gradients(self, sDgc: cute.Tensor, sGc: cute.Tensor, sColumns: cute.Tensor, rows: cute.Tensor,
                       gDg: cute.Tensor, start: Int32, count: Int32, kb: Int32, tidx: Int32):
        """dg of key columns [64 kb, 64 kb + 64), one thread a column: the reverse cumulative sum of the block's
        gate-gradient terms plus the last row's term (which reaches every row at or before it): the column sum
        of kg * dkg and e^gc_last sum(S0 * dS1) of the column's key row."""
        if tidx < CHUNK:
            total = cute.math.exp(sGc[count - 1, tidx]) * rows[_ROW_DOT, tidx]
            if const_expr(self.threads == THREADS):
                for w in range_constexpr(THREADS // 32):
                    total = total + sColumns[w, tidx]
            else:
                # with eight warps, the four whose columns (8 of every 16) hold this one
                for m in range_constexpr(4):
                    total = total + sColumns[m + 4 * ((tidx // 8) % 2), tidx]
            for r in range_constexpr(CHUNK):
                t = CHUNK - 1 - r
                total = total + sDgc[t, tidx]
                if t < count:
                    gDg[start + t, kb * CHUNK + tidx] = total.to(gDg.element_type)

    @cute.jit
    def finish_rows(self, sums: cute.Tensor, rows: cute.Tensor, row0: Int32, gDbv: cute.Tensor, mDbeta: cute.Tensor,
                    h: Int32, start: Int32, count: Int32, tidx: Int32):
        """The row sums over a quad's lanes into rows[9..11]; dbeta (plus chunk_bwd_values' v part) stored."""
        self.quad_sums(sums, 3)
        self.put_row_sums(sums, rows, 9, 3, row0, tidx)
        cute.arch.sync_threads()
        if tidx < count:
            mDbeta[start + tidx, h] = Float32(rows[9, tidx] + gDbv[tidx, 0]).to(mDbeta.element_type)
