"""cuTile kernels for the chunked delta rule (gdn, kda, gdn2; forward and backward).

All three ops are one recurrence (see ``engines/reference/_kernels_linear_attention.py``): per token the
state S (K x V) decays by ``Diag(exp(g_t))``, is read with ``c_t`` and written with ``k_t``::

    u_t = x_t - (Diag(exp g_t) S_{t-1})^T c_t,   S_t = Diag(exp g_t) S_{t-1} + k_t u_t^T,   o_t = scale S_t^T q_t

with ``c = beta * k``, ``x = beta * v`` (gdn, kda) or ``x = w * v`` (gdn2); gdn's decay is one scalar per token.

Chunks of C = 64 tokens. With ``gc`` the in-chunk inclusive cumulative sum of g and S0 the state at the chunk
start, the deltas ``U'`` of a chunk solve ``(I + A) U' = X - (C * exp(gc)) S0`` where ``A`` is strictly lower
triangular, ``A[t, i] = (c_t * exp(gc_t - gc_i)) . k_i`` (the UT transform). With ``T = (I + A)^-1``:
``w = T (C * exp(gc))`` and ``u = T X`` depend on the chunk alone (kernel ``chunk_prepare``, parallel over
chunks); the state pass (kernel ``chunk_state_pass``, sequential over a sequence's chunks) forms
``U' = u - w S0``, stores S0 and the next state ``exp(gc_last) S0 + (K * exp(gc_last - gc))^T U'``; then
``chunk_output``, parallel over chunks again, forms
``O = scale ((Q * exp(gc)) S0 + (Q K^T masked by exp(gc_t - gc_j), j <= t) U')``.

``T`` is the Neumann product ``(I - A)(I + A^2)(I + A^4)...(I + A^32)`` (A is nilpotent: A^64 = 0), which
needs only tile matrix products. Per-channel decays (kda, gdn2) split ``exp(gc_t - gc_i)`` around the gate
at the chunk's middle row so neither factor strays far from 1.

Sequences are packed (THD) and described by ``cu_seqlens``; ``chunk_prepare`` finds its (sequence, chunk)
from ``cu_seqlens`` on the device (a cumulative sum of per-sequence chunk counts), so no host
synchronisation is needed. Partial chunks load zero padding: a zero k, beta and g row changes nothing.
"""
from __future__ import annotations

import cuda.tile as ct

from ._variants import CHUNK, SPLIT_ROW as _MID
_ZERO = ct.PaddingMode.ZERO
_NEG = -1.0e30

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
ConstFloat = ct.Constant[float]


# Eight worker warps instead of the compiler's four, on sm_90 only, for the kernels (and, in forward_kernels,
# the ops) the H200 ran faster that way at K = V = 128 (docs/engines_cutile.md); other targets are unmeasured.
_EIGHT_ON_SM90 = ct.ByTarget(sm_90=8)


@ct.function
def _rows(x, h, start, stop, width: ConstInt, col):
    """Rows [start, stop) of head h of a (T, H, width-or-more) array as a zero-padded (CHUNK, width) f32 tile."""
    part = x.slice(0, start, stop)
    tile = ct.load(part, (0, h, col), shape=(CHUNK, 1, width), padding_mode=_ZERO)
    return ct.reshape(tile, (CHUNK, width)).astype(ct.float32)


@ct.function
def _column(x, h, start, stop):
    """Rows [start, stop) of head h of a (T, H) array as a zero-padded (CHUNK, 1) f32 tile."""
    part = x.slice(0, start, stop)
    return ct.load(part, (0, h), shape=(CHUNK, 1), padding_mode=_ZERO).astype(ct.float32)


@ct.function
def _store_rows(x, h, start, stop, col, tile, width: ConstInt):
    part = x.slice(0, start, stop)
    ct.store(part, (0, h, col), ct.reshape(tile, (CHUNK, 1, width)).astype(x.dtype))


@ct.function
def _chunk_block(x, c, h, width: ConstInt, col):
    """Global chunk c, head h, column block ``col`` of a chunk-major (chunks, H, CHUNK, n) scratch array as a
    (CHUNK, width) tile of its type. Scratch is laid out by chunk so every access is one aligned, in-bounds
    block (rows past a sequence's end hold zeros), whatever the sequence boundaries."""
    tile = ct.load(x, (c, h, 0, col), shape=(1, 1, CHUNK, width), check_bounds=False)
    return ct.reshape(tile, (CHUNK, width))


@ct.function
def _chunk_tile(x, c, h, width: ConstInt, col):
    """``_chunk_block`` as f32."""
    return _chunk_block(x, c, h, width, col).astype(ct.float32)


@ct.function
def _store_chunk_tile(x, c, h, col, tile, width: ConstInt):
    ct.store(x, (c, h, 0, col), ct.reshape(tile, (1, 1, CHUNK, width)).astype(x.dtype), check_bounds=False)


@ct.function
def _mm(x, y, acc):
    """x @ y + acc on the tensor cores in TF32 (f32 inputs would be emulated: slow and huge code)."""
    return ct.mma(x.astype(ct.tfloat32), y.astype(ct.tfloat32), acc)


@ct.function
def _mmx(x, y, acc, LOW: ConstBool):
    """x @ y + acc with f32 accumulation: BF16 inputs when LOW (half the operand registers, fla's choice
    for its state products), else TF32 (``_mm``)."""
    if LOW:
        return ct.mma(x.astype(ct.bfloat16), y.astype(ct.bfloat16), acc)
    else:
        return _mm(x, y, acc)


@ct.function
def _mmx16(x, y, acc, LOW: ConstBool, FP16: ConstBool):
    """``_mmx`` with FP16 inputs instead of BF16 where LOW and FP16 (FP16 scratch: the precision of the CuTe
    state pass, which rounds the state to the input type for its products)."""
    if LOW and FP16:
        return ct.mma(x.astype(ct.float16), y.astype(ct.float16), acc)
    else:
        return _mmx(x, y, acc, LOW)


@ct.function
def _l2_normalise(x):
    """x / ||x|| per row; a zero row stays zero (as the reference)."""
    ss = ct.sum(x * x, axis=1, keepdims=True)
    inv = ct.where(ss > 0.0, ct.rsqrt(ss), 0.0)
    return x * inv


@ct.function
def _split_tf32(x):
    """x as two TF32 tiles whose sum is x to f32 accuracy: products with 0/+-1 matrices stay exact."""
    head = x.astype(ct.tfloat32)
    return head, (x - head.astype(ct.float32)).astype(ct.tfloat32)


@ct.function
def _cumsum_rows(x):
    """Inclusive cumulative sums down the rows of a (CHUNK, n) f32 tile, as two TF32 products of the lower
    triangular ones with x's TF32 head and remainder (0/1 coefficients: the sum keeps f32 accuracy). The
    tensor cores do in two instructions what a row scan does through shuffles (ct.cumsum on a (64, 128)
    tile cost kda five times its whole gate read and write on the H200)."""
    rows = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (CHUNK, 1))
    cols = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (1, CHUNK))
    ones = ct.where(cols <= rows, 1.0, 0.0).astype(ct.tfloat32)
    head, rest = _split_tf32(x)
    return ct.mma(ones, rest, ct.mma(ones, head, ct.zeros(x.shape, dtype=ct.float32)))


@ct.function
def _gates(g, h, start, stop, K: ConstInt, PER_CHANNEL: ConstBool):
    """In-chunk inclusive cumulative log decay: (CHUNK, K) per channel, (CHUNK, 1) per token."""
    if PER_CHANNEL:
        return _cumsum_rows(_rows(g, h, start, stop, K, 0))
    else:
        return ct.cumsum(_column(g, h, start, stop), axis=0)


@ct.function
def _row(x, index):
    """Row ``index`` of a (CHUNK, width) tile as a (1, width) tile."""
    rows = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (CHUNK, 1))
    return ct.sum(ct.where(rows == index, x, 0.0), axis=0, keepdims=True)


@ct.function
def _pad_gates(gc, count, last):
    """Rows at and past ``count`` repeat the last valid row (a padded token neither decays nor writes)."""
    rows = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (CHUNK, 1))
    return ct.where(rows < count, gc, last)


@ct.function
def _gate_row(g, h, row, K: ConstInt, PER_CHANNEL: ConstBool):
    """The stored cumulative gate of token ``row``, head h: (1, K) per channel, (1, 1) per token."""
    if PER_CHANNEL:
        return ct.reshape(ct.load(g.slice(0, row, row + 1), (0, h, 0), shape=(1, 1, K)), (1, K))
    else:
        return ct.load(g.slice(0, row, row + 1), (0, h), shape=(1, 1))


@ct.function
def _decayed_scores(a, b, gc, mid, INCLUSIVE: ConstBool, PER_CHANNEL: ConstBool, LOW: ConstBool):
    """(a_t * exp(gc_t - gc_j)) . b_j for j < t (j <= t when INCLUSIVE), zero elsewhere: (CHUNK, CHUNK).

    Per-channel gates are split around ``mid`` (1, K), a row of gc near the chunk's middle."""
    rows = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (CHUNK, 1))
    cols = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (1, CHUNK))
    if INCLUSIVE:
        keep = rows >= cols
    else:
        keep = rows > cols
    zero = ct.zeros((CHUNK, CHUNK), dtype=ct.float32)
    if PER_CHANNEL:
        lhs = a * ct.exp(gc - mid)
        rhs = b * ct.exp(mid - gc)
        scores = _mmx(lhs, ct.transpose(rhs), zero, LOW)
        return ct.where(keep, scores, 0.0)
    else:
        scores = _mmx(a, ct.transpose(b), zero, LOW)
        diff = ct.where(keep, gc - ct.transpose(gc), _NEG)
        return ct.where(keep, scores * ct.exp(diff), 0.0)


@ct.function
def _unit_lower_inverse(a):
    """(I + a)^-1 for a strictly lower triangular (CHUNK, CHUNK) tile: (I - a)(I + a^2)(I + a^4)..."""
    rows = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (CHUNK, 1))
    cols = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (1, CHUNK))
    eye = ct.where(rows == cols, 1.0, 0.0)
    power = -a
    inv = eye + power
    zero = ct.zeros((CHUNK, CHUNK), dtype=ct.float32)
    for _ in ct.static_iter(range(5)):
        power = _mm(power, power, zero)
        inv = _mm(inv, power, inv)
    return inv


@ct.function
def _chunk_counts(cu, NSEQ: ConstInt, NP: ConstInt):
    """Per sequence slot i < NP: (i, whether i < NSEQ, first token, end token, chunk count); a slot at or
    past NSEQ counts no chunks."""
    idx = ct.arange(NP, dtype=ct.int32)
    valid = idx < NSEQ
    lo = ct.load(cu, (0,), shape=(NP,), padding_mode=_ZERO)
    hi = ct.load(cu.slice(0, 1, NSEQ + 1), (0,), shape=(NP,), padding_mode=_ZERO)
    count = (ct.where(valid, hi - lo, 0) + (CHUNK - 1)) // CHUNK
    return idx, valid, lo, hi, count


@ct.function
def _locate_chunk(cu, c, NSEQ: ConstInt, NP: ConstInt):
    """(sequence, first token, end token) of global chunk c; sequence == NSEQ when c is past the last chunk."""
    idx, valid, lo, hi, count = _chunk_counts(cu, NSEQ, NP)
    ends = ct.cumsum(count, axis=0)
    before = ct.where(valid & (ends <= c), 1, 0)
    n = ct.sum(before)
    here = idx == n
    first_chunk = ct.sum(ct.where(here, ends - count, 0))
    seq_start = ct.sum(ct.where(here, lo, 0))
    seq_end = ct.sum(ct.where(here, hi, 0))
    start = seq_start + (c - first_chunk) * CHUNK
    stop = ct.minimum(start + CHUNK, seq_end)
    return n, start, stop


@ct.function
def _keys_and_gates(k, g, beta, g_sums, hk, h, start, stop, K: ConstInt, PER_CHANNEL: ConstBool,
                    BETA_PER_CHANNEL: ConstBool, USE_L2: ConstBool):
    """A chunk's keys (L2-normalised with USE_L2), beta, and gates: gc, gc - gc[mid] (per channel; gc itself
    for a scalar gate, which needs no split) and gc[last] - gc. Per-channel sums are read back from g_sums
    (chunk_gates wrote them: forming them here took more shared memory than an H200 has at K = 128)."""
    count = stop - start
    kt = _rows(k, hk, start, stop, K, 0)
    if USE_L2:
        kt = _l2_normalise(kt)
    if PER_CHANNEL:
        last = _gate_row(g_sums, h, stop - 1, K, True)
        gc = _pad_gates(_rows(g_sums, h, start, stop, K, 0), count, last)
        from_mid = gc - _gate_row(g_sums, h, start + ct.minimum(count - 1, _MID), K, True)
        to_last = last - gc
    else:
        gc = _gates(g, h, start, stop, K, False)
        from_mid = gc
        to_last = _row(gc, count - 1) - gc
    if BETA_PER_CHANNEL:
        bt = _rows(beta, h, start, stop, K, 0)
    else:
        bt = _column(beta, h, start, stop)
    return kt, bt, gc, from_mid, to_last


@ct.function
def _ut_inverse(kt, bt, from_mid, PER_CHANNEL: ConstBool):
    """T = (I + A)^-1 of the chunk's UT transform."""
    a = _decayed_scores(bt * kt, kt, from_mid, ct.zeros((1, 1), dtype=ct.float32), False, PER_CHANNEL, False)
    return _unit_lower_inverse(a)


@ct.function
def _write_w_u_kd(inv, kt, bt, gc, to_last, v, wgate, h, start, stop, c, w_out, u_out, kd_out, V: ConstInt,
                  HAS_W: ConstBool, LOW: ConstBool):
    """w = T (C * exp(gc)), u = T X and kd = k * exp(gc_last - gc) into chunk c of the scratch. Rows past
    the chunk's last token come out zero: their k, beta and g rows are zero padding."""
    K = kt.shape[1]
    vt = _rows(v, h, start, stop, V, 0)
    if HAS_W:
        xt = _rows(wgate, h, start, stop, V, 0) * vt
    else:
        xt = bt * vt
    w = _mmx(inv, bt * kt * ct.exp(gc), ct.zeros((CHUNK, K), dtype=ct.float32), LOW)
    u = _mmx(inv, xt, ct.zeros((CHUNK, V), dtype=ct.float32), LOW)
    _store_chunk_tile(w_out, c, h, 0, w, K)
    _store_chunk_tile(u_out, c, h, 0, u, V)
    _store_chunk_tile(kd_out, c, h, 0, kt * ct.exp(to_last), K)


@ct.function
def _ut_operands(k, g, beta, g_sums, hk, h, start, stop, K: ConstInt, PER_CHANNEL: ConstBool,
                 BETA_PER_CHANNEL: ConstBool, USE_L2: ConstBool):
    """What chunk_prepare and the backward's recompute both form from a chunk: keys, beta, gc, gc[last] - gc
    (``_keys_and_gates``) and the UT transform T (``_ut_inverse``)."""
    kt, bt, gc, from_mid, to_last = _keys_and_gates(k, g, beta, g_sums, hk, h, start, stop, K, PER_CHANNEL,
                                                    BETA_PER_CHANNEL, USE_L2)
    return kt, bt, gc, to_last, _ut_inverse(kt, bt, from_mid, PER_CHANNEL)


@ct.kernel
def chunk_prepare(k, v, g, beta, wgate, cu, w_out, u_out, g_out, kd_out,
                  NSEQ: ConstInt, NP: ConstInt, K: ConstInt, V: ConstInt,
                  PER_CHANNEL: ConstBool, BETA_PER_CHANNEL: ConstBool, HAS_W: ConstBool, USE_L2: ConstBool,
                  LOW: ConstBool, GROUP: ConstInt):
    """Per (chunk, head): gc (per-token gates; per-channel ones come from chunk_gates), w = T (C * exp(gc)),
    u = T X and the state-write keys kd = k * exp(gc_last - gc) into the scratch arrays. T itself is formed
    in TF32; with LOW its products with C and X take BF16 inputs (fla's choice: T in the input type)."""
    c = ct.bid(0)
    h = ct.bid(1)
    n, start, stop = _locate_chunk(cu, c, NSEQ, NP)
    if n < NSEQ:
        kt, bt, gc, to_last, inv = _ut_operands(k, g, beta, g_out, h // GROUP, h, start, stop, K, PER_CHANNEL,
                                                BETA_PER_CHANNEL, USE_L2)
        _write_w_u_kd(inv, kt, bt, gc, to_last, v, wgate, h, start, stop, c, w_out, u_out, kd_out, V, HAS_W, LOW)
        if not PER_CHANNEL:
            ct.store(g_out.slice(0, start, stop), (0, h), gc)


@ct.kernel
def chunk_gates(g, cu, g_out, NSEQ: ConstInt, NP: ConstInt, KB: ConstInt):
    """Per (chunk, head, block of KB key channels) of per-channel gates (kda, gdn2): the in-chunk cumulative
    sums into g_out, for chunk_prepare and the later passes to read."""
    c = ct.bid(0)
    h = ct.bid(1)
    kb = ct.bid(2)
    n, start, stop = _locate_chunk(cu, c, NSEQ, NP)
    if n < NSEQ:
        _store_rows(g_out, h, start, stop, kb, _cumsum_rows(_rows(g, h, start, stop, KB, kb)), KB)


# ------------------------------------------------------------------ state pass, then output

@ct.function
def _first_chunk(cu, n, NSEQ: ConstInt, NP: ConstInt):
    """Global index of sequence n's first chunk (the numbering ``_locate_chunk`` uses)."""
    idx, _, _, _, count = _chunk_counts(cu, NSEQ, NP)
    return ct.sum(ct.where(idx < n, count, 0))


@ct.function
def _sequence_walk(cu, n, carried, h, vb, NSEQ: ConstInt, NP: ConstInt, K: ConstInt, BV: ConstInt,
                   HAS_CARRIED: ConstBool):
    """What a per-sequence state pass starts from: sequence n's first and end token, its first global chunk,
    its chunk count, and the (K, BV) state block vb it carries in (``carried``; zeros without HAS_CARRIED)."""
    bos = ct.load(cu, (n,), shape=())
    eos = ct.load(cu, (n + 1,), shape=())
    first = _first_chunk(cu, n, NSEQ, NP)
    if HAS_CARRIED:
        state = ct.reshape(ct.load(carried, (n, h, 0, vb), shape=(1, 1, K, BV)), (K, BV))
    else:
        state = ct.zeros((K, BV), dtype=ct.float32)
    return bos, eos, first, (eos - bos + (CHUNK - 1)) // CHUNK, state


@ct.function
def _state_pass_inputs(kd_in, w_in, u_in, g_in, h, vb, c, start, eos, K: ConstInt, BV: ConstInt,
                       PER_CHANNEL: ConstBool):
    """What the state pass reads for global chunk c (first token ``start``): w, u's value block and kd in
    the scratch type, and the chunk's total decay ((K, 1) per channel, (1, 1) per token)."""
    wt = _chunk_block(w_in, c, h, K, 0)
    ut = _chunk_block(u_in, c, h, BV, vb)
    kd = _chunk_block(kd_in, c, h, K, 0)
    return wt, ut, kd, _chunk_decay(g_in, h, start, eos, K, PER_CHANNEL)


@ct.function
def _chunk_decay(g_in, h, start, eos, K: ConstInt, PER_CHANNEL: ConstBool):
    """exp of the chunk's total log decay (from its stored in-chunk sums): (K, 1) per channel, (1, 1) per
    token, to scale a (K, n) state by."""
    last = _gate_row(g_in, h, ct.minimum(start + CHUNK, eos) - 1, K, PER_CHANNEL)
    if PER_CHANNEL:
        return ct.reshape(ct.exp(last), (K, 1))
    else:
        return ct.exp(last)


@ct.kernel
def chunk_state_pass(kd_in, w_in, u_in, g_in, cu, h0, hs, ht, d_out,
                     NSEQ: ConstInt, NP: ConstInt, K: ConstInt, BV: ConstInt, PER_CHANNEL: ConstBool,
                     HAS_H0: ConstBool, STORE_HT: ConstBool, LOW: ConstBool, FP16: ConstBool):
    """Per (sequence, head, value block): the sequential part alone. Stores the state at every chunk
    start (hs) and the chunk's deltas ``u - w S`` (d_out), both by global chunk. FP16: LOW's products take
    FP16 inputs (``_mmx16``)."""
    n = ct.bid(0)
    h = ct.bid(1)
    vb = ct.bid(2)
    bos, eos, first, chunks, state = _sequence_walk(cu, n, h0, h, vb, NSEQ, NP, K, BV, HAS_H0)
    for j in range(chunks):
        wt, ut, kd, decay = _state_pass_inputs(kd_in, w_in, u_in, g_in, h, vb, first + j, bos + j * CHUNK, eos,
                                               K, BV, PER_CHANNEL)
        ct.store(hs, (first + j, h, 0, vb), ct.reshape(state, (1, 1, K, BV)).astype(hs.dtype))
        delta = _mmx16(-wt, state, ut.astype(ct.float32), LOW, FP16)
        _store_chunk_tile(d_out, first + j, h, vb, delta, BV)
        state = _mmx16(ct.transpose(kd), delta, state * decay, LOW, FP16)
    if STORE_HT:
        ct.store(ht, (n, h, 0, vb), ct.reshape(state, (1, 1, K, BV)))


@ct.function
def _output_operands(q, k, g_in, hk, h, start, stop, scale: ConstFloat, K: ConstInt, PER_CHANNEL: ConstBool,
                     USE_L2: ConstBool, LOW: ConstBool):
    """What maps a chunk's start state and deltas to its outputs, o = qs S0 + attn D: qs = scale q e^gc
    (CHUNK, K) and attn = scale (q k^T masked by e^(gc_t - gc_j), j <= t) (CHUNK, CHUNK)."""
    qt = _rows(q, hk, start, stop, K, 0)
    kt = _rows(k, hk, start, stop, K, 0)
    if USE_L2:
        qt = _l2_normalise(qt)
        kt = _l2_normalise(kt)
    count = stop - start
    if PER_CHANNEL:
        gc = _rows(g_in, h, start, stop, K, 0)
        mid = _gate_row(g_in, h, start + ct.minimum(count - 1, _MID), K, True)
    else:
        gc = _column(g_in, h, start, stop)
        mid = ct.zeros((1, 1), dtype=ct.float32)
    last = _gate_row(g_in, h, stop - 1, K, PER_CHANNEL)
    gc = _pad_gates(gc, count, last)
    qs = qt * (ct.exp(gc) * scale)
    return qs, _decayed_scores(qt * scale, kt, gc, mid, True, PER_CHANNEL, LOW)


@ct.kernel
def chunk_output(q, k, d_in, g_in, cu, hs, o, scale: ConstFloat,
                 NSEQ: ConstInt, NP: ConstInt, K: ConstInt, BV: ConstInt, PER_CHANNEL: ConstBool,
                 USE_L2: ConstBool, LOW: ConstBool, GROUP: ConstInt):
    """Per (chunk, head, value block), in parallel: o from the chunk's start state and deltas."""
    c = ct.bid(0)
    h = ct.bid(1)
    vb = ct.bid(2)
    n, start, stop = _locate_chunk(cu, c, NSEQ, NP)
    if n < NSEQ:
        qs, attn = _output_operands(q, k, g_in, h // GROUP, h, start, stop, scale, K, PER_CHANNEL, USE_L2, LOW)
        # state and deltas stay in the scratch type: the products convert them (an f32 copy of a 128 x 128
        # state alone would take 128 registers a thread)
        state = ct.reshape(ct.load(hs, (c, h, 0, vb), shape=(1, 1, K, BV)), (K, BV))
        delta = _chunk_block(d_in, c, h, BV, vb)
        out = _mmx(attn, delta, _mmx(qs, state, ct.zeros((CHUNK, BV), dtype=ct.float32), LOW), LOW)
        _store_rows(o, h, start, stop, vb, out, BV)


# ------------------------------------------------- backward (gdn_bwd, kda_bwd, gdn2_bwd): four kernels
#
# After the forward's chunk_prepare and chunk_state_pass (chunk-start states hs, deltas D in d) have
# recomputed the forward, chunk_bwd_intra forms each chunk's dS-free terms in parallel,
# chunk_bwd_state_pass walks each sequence's chunks last to first carrying dS, and chunk_bwd_values and
# chunk_bwd_grads form every other gradient per chunk in parallel. The math is
# tests/engines/cutile/test_cutile_export.py::chunked_backward (checked there against the reference backward).
# Only the last two see beta and the write: with BETA_PER_CHANNEL (gdn2) beta is a (CHUNK, K) tile and dbeta
# = k * dC per channel; with HAS_W (gdn2) X = w * V, so dv = w * dX and dw = V * dX, and dbeta has no v part.

@ct.kernel(num_worker_warps=_EIGHT_ON_SM90)
def chunk_bwd_intra(q, k, do, g_in, cu, p_out, qg_out, scale: ConstFloat,
                    NSEQ: ConstInt, NP: ConstInt, K: ConstInt, V: ConstInt, PER_CHANNEL: ConstBool,
                    USE_L2: ConstBool, GROUP: ConstInt):
    """Per (chunk, head), in parallel: the parts of the reverse state pass that need no dS, so its
    sequential loop is three small products: P = attn^T dO (p_out; the state pass adds kd dS to it in place)
    and qg = scale q e^gc (qg_out), both by chunk."""
    c = ct.bid(0)
    h = ct.bid(1)
    n, start, stop = _locate_chunk(cu, c, NSEQ, NP)
    if n < NSEQ:
        qs, attn = _output_operands(q, k, g_in, h // GROUP, h, start, stop, scale, K, PER_CHANNEL, USE_L2, False)
        dot = _rows(do, h, start, stop, V, 0)
        _store_chunk_tile(p_out, c, h, 0, _mm(ct.transpose(attn), dot, ct.zeros((CHUNK, V), dtype=ct.float32)), V)
        _store_chunk_tile(qg_out, c, h, 0, qs, K)


# Four worker warps, not eight: with eight (0.05-0.1 ms faster on the H200) the same inputs gave different dS
# from one execution to the next (session 20; docs/engines_cutile.md, "The backward").
@ct.kernel
def chunk_bwd_state_pass(do, w_in, kd_in, qg_in, g_in, cu, dht, dhs, dd_io, dh0,
                         NSEQ: ConstInt, NP: ConstInt, K: ConstInt, BV: ConstInt, PER_CHANNEL: ConstBool,
                         HAS_DHT: ConstBool, HAS_H0: ConstBool, LOW: ConstBool):
    """Per (sequence, head, value block), chunks in reverse: dS at every chunk end (dhs), the deltas'
    gradients dD = P + kd dS (over chunk_bwd_intra's P in dd_io), dS <- e^gL dS + qg^T dO - w^T dD, and dS
    at the sequence start (dh0); BF16 products with LOW, as the forward's state pass."""
    n = ct.bid(0)
    h = ct.bid(1)
    vb = ct.bid(2)
    bos, eos, first, chunks, ds = _sequence_walk(cu, n, dht, h, vb, NSEQ, NP, K, BV, HAS_DHT)
    for jj in range(chunks):
        j = chunks - 1 - jj
        c = first + j
        start = bos + j * CHUNK
        ct.store(dhs, (c, h, 0, vb), ct.reshape(ds, (1, 1, K, BV)))
        dd = _mmx(_chunk_block(kd_in, c, h, K, 0), ds, _chunk_tile(dd_io, c, h, BV, vb), LOW)
        _store_chunk_tile(dd_io, c, h, vb, dd, BV)
        dot = _rows(do, h, start, ct.minimum(start + CHUNK, eos), BV, vb)
        decayed = ds * _chunk_decay(g_in, h, start, eos, K, PER_CHANNEL)
        ds = _mmx(ct.transpose(-_chunk_block(w_in, c, h, K, 0)), dd,
                  _mmx(ct.transpose(_chunk_block(qg_in, c, h, K, 0)), dot, decayed, LOW), LOW)
    if HAS_H0:
        ct.store(dh0, (n, h, 0, vb), ct.reshape(ds, (1, 1, K, BV)))


@ct.function
def _at_gate_width(x, PER_CHANNEL: ConstBool):
    """A gate-gradient term at the gates' width: as is per channel, summed over K per token (a (CHUNK, 1)
    accumulator instead of a (CHUNK, K) one)."""
    return x if PER_CHANNEL else ct.sum(x, axis=1, keepdims=True)


@ct.kernel(num_worker_warps=_EIGHT_ON_SM90)
def chunk_bwd_values(k, v, g, beta, wgate, cu, hs, dd_in, w_in, u_in, g_sums, dv, dwgate, dcg_out, da_out,
                     dbeta_out, NSEQ: ConstInt, NP: ConstInt, K: ConstInt, V: ConstInt, BV: ConstInt,
                     PER_CHANNEL: ConstBool, BETA_PER_CHANNEL: ConstBool, HAS_W: ConstBool, USE_L2: ConstBool,
                     GROUP: ConstInt):
    """Per (chunk, head), in parallel, the gradients through the UT transform: dX = T^T dD (dv = beta dX;
    with HAS_W dv = w dX and the write gate's dw = V dX into dwgate), dW = -dD S0^T, and from them
    dCg = T^T dW (dcg_out), dA = -strict_tril(dX U^T + dCg W^T) (da_out) and, without HAS_W, the v part of
    dbeta (dbeta_out), for chunk_bwd_grads; T is recomputed as chunk_prepare forms it, W and U are the
    forward recompute's. Without HAS_W, wgate and dwgate are never touched (any arrays will do)."""
    c = ct.bid(0)
    h = ct.bid(1)
    n, start, stop = _locate_chunk(cu, c, NSEQ, NP)
    if n < NSEQ:
        kt, bt, _, _, inv = _ut_operands(k, g, beta, g_sums, h // GROUP, h, start, stop, K, PER_CHANNEL,
                                         BETA_PER_CHANNEL, USE_L2)
        inv_t = ct.transpose(inv)
        dw = ct.zeros((CHUNK, K), dtype=ct.float32)       # -dD S0^T
        dxu = ct.zeros((CHUNK, CHUNK), dtype=ct.float32)  # dX U^T
        dbeta_v = ct.zeros((CHUNK, 1), dtype=ct.float32)  # rowsum(v * dX)
        for vb in range(V // BV):
            s0 = ct.reshape(ct.load(hs, (c, h, 0, vb), shape=(1, 1, K, BV)), (K, BV))
            ddt = _chunk_tile(dd_in, c, h, BV, vb)
            vt = _rows(v, h, start, stop, BV, vb)
            dx = _mm(inv_t, ddt, ct.zeros((CHUNK, BV), dtype=ct.float32))
            dw = _mm(-ddt, ct.transpose(s0), dw)
            dxu = _mm(dx, ct.transpose(_chunk_tile(u_in, c, h, BV, vb)), dxu)
            if HAS_W:
                _store_rows(dv, h, start, stop, vb, _rows(wgate, h, start, stop, BV, vb) * dx, BV)
                _store_rows(dwgate, h, start, stop, vb, vt * dx, BV)
            else:
                dbeta_v = dbeta_v + ct.sum(vt * dx, axis=1, keepdims=True)
                _store_rows(dv, h, start, stop, vb, bt * dx, BV)
        rows = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (CHUNK, 1))
        cols = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (1, CHUNK))
        dcg = _mm(inv_t, dw, ct.zeros((CHUNK, K), dtype=ct.float32))
        wt = _chunk_tile(w_in, c, h, K, 0)
        da = ct.where(rows > cols, -_mm(dcg, ct.transpose(wt), dxu), 0.0)
        _store_chunk_tile(dcg_out, c, h, 0, dcg, K)
        _store_chunk_tile(da_out, c, h, 0, da, CHUNK)
        if not HAS_W:
            _store_chunk_tile(dbeta_out, c, h, 0, dbeta_v, 1)


@ct.function
def _inverse_norm(x):
    """1 / ||x|| per row as a (CHUNK, 1) tile; 1 for a zero row (it stays zero, as the reference, and passes
    no gradient through the norm)."""
    ss = ct.sum(x * x, axis=1, keepdims=True)
    return ct.where(ss > 0.0, ct.rsqrt(ss), 1.0)


# eight worker warps: with four it spills (1.3 KB gdn, 2.2 KB kda a thread at K = 128 in the sm_90 SASS;
# none / 104 B with eight), and its all-of-K form did not compile with four (tileiras 13.4 exit 5)
@ct.kernel(num_worker_warps=8)
def chunk_bwd_grads(q, k, g, beta, do, cu, hs, dhs, d_in, dcg_in, da_in, dbeta_in, dq_pre, dk_pre,
                    dq, dk, dg, dbeta, scale: ConstFloat, NSEQ: ConstInt, NP: ConstInt, K: ConstInt, V: ConstInt,
                    BV: ConstInt, PER_CHANNEL: ConstBool, BETA_PER_CHANNEL: ConstBool, USE_L2: ConstBool,
                    GROUP: ConstInt):
    """Per (chunk, head), in parallel: dq, dk, dg and dbeta from the chunk's start state (hs), end gradient
    (dhs), deltas (d_in) and chunk_bwd_values' dCg, dA and dbeta part, in blocks of CHUNK key columns (every
    product and the in-chunk cumsum are column-separable; a (CHUNK, K) f32 tile a term spilled at K = 128).
    With L2 norm, dq and dk before the norm's backward go to f32 scratch (dq_pre, dk_pre) until the rows'
    sums over all of K are known. With grouped value heads (GROUP > 1) h is the value head, q and k are
    read at h // GROUP and dq / dk are this value head's shares (f32 scratch, summed by group_sum). With
    BETA_PER_CHANNEL (gdn2) beta is read and dbeta = k * dC written per key block, as a per-channel gate
    and its dg are (dbeta_in is not read: without a v part there is nothing in it)."""
    c = ct.bid(0)
    h = ct.bid(1)
    hk = h // GROUP
    n, start, stop = _locate_chunk(cu, c, NSEQ, NP)
    if n < NSEQ:
        count = stop - start
        rows = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (CHUNK, 1))
        cols = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (1, CHUNK))
        zk = ct.zeros((CHUNK, CHUNK), dtype=ct.float32)
        if USE_L2:
            q_inv = _inverse_norm(_rows(q, hk, start, stop, K, 0))
            k_inv = _inverse_norm(_rows(k, hk, start, stop, K, 0))
        else:
            q_inv = ct.ones((CHUNK, 1), dtype=ct.float32)
            k_inv = ct.ones((CHUNK, 1), dtype=ct.float32)
        if BETA_PER_CHANNEL:
            bt_token = ct.zeros((CHUNK, 1), dtype=ct.float32)         # unused: beta is read per key block
            dbt = ct.zeros((CHUNK, 1), dtype=ct.float32)
        else:
            bt_token = _column(beta, h, start, stop)
            dbt = _chunk_tile(dbeta_in, c, h, 1, 0)
        # o's intra-chunk scores M = tril((q e^{gc-m}) (k e^{m-gc})^T), scaled: dM = dO D^T over all of V
        dm = ct.zeros((CHUNK, CHUNK), dtype=ct.float32)
        for vb in range(V // BV):
            dm = _mm(_rows(do, h, start, stop, BV, vb), ct.transpose(_chunk_tile(d_in, c, h, BV, vb)), dm)
        dm = ct.where(rows >= cols, dm * scale, 0.0)
        da = _chunk_tile(da_in, c, h, CHUNK, 0)
        if PER_CHANNEL:
            gc_token = ct.zeros((CHUNK, 1), dtype=ct.float32)
        else:
            gc_token = ct.cumsum(_column(g, h, start, stop), axis=0)   # zero padding: later rows repeat the last
        dgc_token = ct.zeros((CHUNK, 1), dtype=ct.float32)
        q_dot = ct.zeros((CHUNK, 1), dtype=ct.float32)               # rowsum(qn * dqn) over K, for the L2 norm
        k_dot = ct.zeros((CHUNK, 1), dtype=ct.float32)
        for kb in range(K // CHUNK):
            qt = _rows(q, hk, start, stop, CHUNK, kb) * q_inv
            kt = _rows(k, hk, start, stop, CHUNK, kb) * k_inv
            if PER_CHANNEL:
                gc = _cumsum_rows(_rows(g, h, start, stop, CHUNK, kb))
            else:
                gc = gc_token
            mid = _row(gc, ct.minimum(count - 1, _MID))
            last = _row(gc, count - 1)
            dqs = ct.zeros((CHUNK, CHUNK), dtype=ct.float32)      # dO S0^T
            dkg = ct.zeros((CHUNK, CHUNK), dtype=ct.float32)      # D dS1^T
            dlast = ct.zeros((CHUNK, 1), dtype=ct.float32)        # rowsum(dS1 * S0)
            for vb in range(V // BV):
                s0 = ct.reshape(ct.load(hs, (c, h, kb, vb), shape=(1, 1, CHUNK, BV)), (CHUNK, BV))
                ds1 = ct.reshape(ct.load(dhs, (c, h, kb, vb), shape=(1, 1, CHUNK, BV)), (CHUNK, BV))
                dqs = _mm(_rows(do, h, start, stop, BV, vb), ct.transpose(s0), dqs)
                dkg = _mm(_chunk_tile(d_in, c, h, BV, vb), ct.transpose(ds1), dkg)
                dlast = dlast + ct.sum(ds1 * s0, axis=1, keepdims=True)
            e = ct.exp(gc)
            up = ct.exp(gc - mid)
            down = ct.exp(mid - gc)
            dqt = dqs * (e * scale)
            dgc = _at_gate_width(qt * dqt, PER_CHANNEL)
            qn = qt * up
            kn = kt * down
            t_q = _mm(dm, kn, zk)
            t_k = _mm(ct.transpose(dm), qn, zk)
            dqt = dqt + t_q * up
            dkt = t_k * down
            dgc = dgc + _at_gate_width(qn * t_q - kn * t_k, PER_CHANNEL)
            # the state write keys kg = k e^{gc_L - gc}
            tail = ct.exp(last - gc)
            kg = kt * tail
            dkt = dkt + dkg * tail
            dgc = dgc - _at_gate_width(kg * dkg, PER_CHANNEL)
            dlast_row = _at_gate_width(ct.sum(kg * dkg, axis=0, keepdims=True)
                                       + ct.exp(last) * ct.transpose(dlast), PER_CHANNEL)
            # W = T (C e^{gc}), U = T X, T = (I + A)^-1: chunk_bwd_values formed dCg and dA
            dcg = _chunk_tile(dcg_in, c, h, CHUNK, kb)
            if BETA_PER_CHANNEL:
                bt = _rows(beta, h, start, stop, CHUNK, kb)
            else:
                bt = bt_token
            read = bt * kt
            an = read * up
            t_a = _mm(da, kn, zk)
            t_b = _mm(ct.transpose(da), an, zk)
            dct = dcg * e + t_a * up
            dkt = dkt + t_b * down + bt * dct
            dgc = dgc + _at_gate_width(read * e * dcg + an * t_a - kn * t_b, PER_CHANNEL)
            dgc = dgc + ct.where(rows == count - 1, dlast_row, 0.0)
            if BETA_PER_CHANNEL:
                _store_rows(dbeta, h, start, stop, kb, kt * dct, CHUNK)
            else:
                dbt = dbt + ct.sum(kt * dct, axis=1, keepdims=True)
            if PER_CHANNEL:
                # gc is the in-chunk cumulative sum of g: dg is the reverse cumulative sum of dgc
                _store_rows(dg, h, start, stop, kb, ct.sum(dgc, axis=0, keepdims=True) - _cumsum_rows(dgc) + dgc,
                            CHUNK)
            else:
                dgc_token = dgc_token + dgc
            if USE_L2:
                q_dot = q_dot + ct.sum(qt * dqt, axis=1, keepdims=True)
                k_dot = k_dot + ct.sum(kt * dkt, axis=1, keepdims=True)
                _store_chunk_tile(dq_pre, c, h, kb, dqt, CHUNK)
                _store_chunk_tile(dk_pre, c, h, kb, dkt, CHUNK)
            else:
                _store_rows(dq, h, start, stop, kb, dqt, CHUNK)
                _store_rows(dk, h, start, stop, kb, dkt, CHUNK)
        if not PER_CHANNEL:
            dgt = ct.sum(dgc_token, axis=0, keepdims=True) - ct.cumsum(dgc_token, axis=0) + dgc_token
            ct.store(dg.slice(0, start, stop), (0, h), dgt)
        if not BETA_PER_CHANNEL:
            ct.store(dbeta.slice(0, start, stop), (0, h), dbt.astype(dbeta.dtype))
        if USE_L2:
            # through x / ||x||: dx = (dxn - xn rowsum(xn dxn)) / ||x||
            for kb in range(K // CHUNK):
                qt = _rows(q, hk, start, stop, CHUNK, kb) * q_inv
                kt = _rows(k, hk, start, stop, CHUNK, kb) * k_inv
                _store_rows(dq, h, start, stop, kb, (_chunk_tile(dq_pre, c, h, CHUNK, kb) - qt * q_dot) * q_inv, CHUNK)
                _store_rows(dk, h, start, stop, kb, (_chunk_tile(dk_pre, c, h, CHUNK, kb) - kt * k_dot) * k_inv, CHUNK)


# ------------------------------------------- grouped value heads and the gate options: the kernels around
#
# group_sum adds the value heads' shares of dq / dk (chunk_bwd_grads writes one per value head) into the
# query/key heads. gate_activation maps the raw gate and beta logits to the log decay and the write strength
# (f32 scratch the chunked kernels read as their g and beta) before the forward or the backward's
# recompute; gate_activation_bwd carries the chunked backward's dg / dbeta (scratch) back to the raw inputs
# and reduces d_a_log / d_dt_bias over the tokens, one CTA per value head.

@ct.kernel
def group_sum(x, out, K: ConstInt, GROUP: ConstInt):
    """Per (token block, query/key head h): out[t, h] = sum over j < GROUP of x[t, h * GROUP + j], for
    (T, HV, K) f32 shares and a (T, H, K) result."""
    tb = ct.bid(0)
    h = ct.bid(1)
    acc = ct.zeros((CHUNK, 1, K), dtype=ct.float32)
    for j in range(GROUP):
        acc = acc + ct.load(x, (tb, h * GROUP + j, 0), shape=(CHUNK, 1, K), padding_mode=_ZERO)
    ct.store(out, (tb, h, 0), acc.astype(out.dtype))


@ct.function
def _head_rows(x, tb, h, K: ConstInt, PER_CHANNEL: ConstBool):
    """Token block tb of head h of a (T, HV, K) (PER_CHANNEL) or (T, HV) array: a zero-padded (CHUNK, K) or
    (CHUNK, 1) f32 tile."""
    if PER_CHANNEL:
        tile = ct.load(x, (tb, h, 0), shape=(CHUNK, 1, K), padding_mode=_ZERO)
        return ct.reshape(tile, (CHUNK, K)).astype(ct.float32)
    else:
        return ct.load(x, (tb, h), shape=(CHUNK, 1), padding_mode=_ZERO).astype(ct.float32)


@ct.function
def _store_head_rows(x, tb, h, tile, K: ConstInt, PER_CHANNEL: ConstBool):
    if PER_CHANNEL:
        ct.store(x, (tb, h, 0), ct.reshape(tile, (CHUNK, 1, K)).astype(x.dtype))
    else:
        ct.store(x, (tb, h), tile.astype(x.dtype))


@ct.function
def _token_blocks(x, K: ConstInt, PER_CHANNEL: ConstBool):
    """How many CHUNK-token blocks cover the T rows of a (T, HV, K) (PER_CHANNEL) or (T, HV) array."""
    if PER_CHANNEL:
        return ct.num_tiles(x, 0, shape=(CHUNK, 1, K))
    else:
        return ct.num_tiles(x, 0, shape=(CHUNK, 1))


@ct.function
def _gate_parameters(a_log, dt_bias, h, K: ConstInt, PER_CHANNEL: ConstBool, HAS_A: ConstBool,
                     HAS_BIAS: ConstBool):
    """exp(a_log[h]) as (1, 1) (1 without a_log) and dt_bias[h] as (1, K) per channel, (1, 1) per head
    (0 without dt_bias)."""
    if HAS_A:
        rate = ct.exp(ct.reshape(ct.load(a_log, (h,), shape=(1,)), (1, 1)).astype(ct.float32))
    else:
        rate = ct.ones((1, 1), dtype=ct.float32)
    if HAS_BIAS:
        if PER_CHANNEL:
            bias = ct.load(dt_bias, (h, 0), shape=(1, K)).astype(ct.float32)
        else:
            bias = ct.reshape(ct.load(dt_bias, (h,), shape=(1,)), (1, 1)).astype(ct.float32)
    else:
        bias = ct.zeros((1, 1), dtype=ct.float32)
    return rate, bias


@ct.function
def _sigmoid(x):
    return 1.0 / (1.0 + ct.exp(-x))


@ct.function
def _softplus(x):
    """log(1 + e^x), x itself above 20 (fla's threshold: the f32 difference is below its resolution)."""
    return ct.where(x > 20.0, x, ct.log(1.0 + ct.exp(ct.minimum(x, 20.0))))


@ct.kernel
def gate_activation(g_raw, a_log, dt_bias, beta_raw, g_out, beta_out, K: ConstInt, GATE_FORM: ConstInt,
                    LOWER_BOUND: ConstFloat, HAS_A: ConstBool, HAS_BIAS: ConstBool, PER_CHANNEL: ConstBool,
                    BETA_FACTOR: ConstFloat, BETA_PER_CHANNEL: ConstBool):
    """Per (token block, value head), GATE_FORM as _variants.GATE_FORMS numbers the forms: the log decay
    -exp(a_log) softplus(g + dt_bias) (GATE_FORM 1) or
    LOWER_BOUND sigmoid(exp(a_log) (g + dt_bias)) (2) into g_out, and BETA_FACTOR sigmoid(beta) into beta_out
    (BETA_FACTOR 0: beta is used as given; GATE_FORM 0: so is g)."""
    tb = ct.bid(0)
    h = ct.bid(1)
    if GATE_FORM != 0:
        rate, bias = _gate_parameters(a_log, dt_bias, h, K, PER_CHANNEL, HAS_A, HAS_BIAS)
        x = _head_rows(g_raw, tb, h, K, PER_CHANNEL) + bias
        if GATE_FORM == 1:
            gate = -rate * _softplus(x)
        else:
            gate = LOWER_BOUND * _sigmoid(rate * x)
        _store_head_rows(g_out, tb, h, gate, K, PER_CHANNEL)
    if BETA_FACTOR != 0.0:
        b = _head_rows(beta_raw, tb, h, K, BETA_PER_CHANNEL)
        _store_head_rows(beta_out, tb, h, BETA_FACTOR * _sigmoid(b), K, BETA_PER_CHANNEL)


@ct.kernel
def gate_activation_bwd(g_raw, a_log, dt_bias, beta_raw, dg_act, dbeta_act, dg, dbeta, d_a_log, d_dt_bias,
                        K: ConstInt, GATE_FORM: ConstInt, LOWER_BOUND: ConstFloat, HAS_A: ConstBool,
                        HAS_BIAS: ConstBool, PER_CHANNEL: ConstBool, BETA_FACTOR: ConstFloat,
                        BETA_PER_CHANNEL: ConstBool):
    """Per value head, over every token block: dg of the raw gate from dg_act (the log decay's gradient),
    d_a_log and d_dt_bias (sums over the tokens), and dbeta of the logits from dbeta_act."""
    h = ct.bid(0)
    if GATE_FORM != 0:
        blocks = _token_blocks(dg_act, K, PER_CHANNEL)
        rate, bias = _gate_parameters(a_log, dt_bias, h, K, PER_CHANNEL, HAS_A, HAS_BIAS)
        acc_a = ct.zeros((1, 1), dtype=ct.float32)
        if PER_CHANNEL:
            acc_b = ct.zeros((1, K), dtype=ct.float32)
        else:
            acc_b = ct.zeros((1, 1), dtype=ct.float32)
        for tb in range(blocks):
            x = _head_rows(g_raw, tb, h, K, PER_CHANNEL) + bias
            d_gate = _head_rows(dg_act, tb, h, K, PER_CHANNEL)       # zero past T: adds nothing
            if GATE_FORM == 1:
                dx = -d_gate * rate * _sigmoid(x)
                d_rate_log = -d_gate * rate * _softplus(x)          # d gate / d a_log = gate
            else:
                z = rate * x
                s = _sigmoid(z)
                dz = d_gate * (LOWER_BOUND * s * (1.0 - s))
                dx = dz * rate
                d_rate_log = dz * z
            _store_head_rows(dg, tb, h, dx, K, PER_CHANNEL)
            acc_b = acc_b + ct.sum(dx, axis=0, keepdims=True)
            acc_a = acc_a + ct.sum(ct.sum(d_rate_log, axis=1, keepdims=True), axis=0, keepdims=True)
        if HAS_A:
            ct.store(d_a_log, (h,), ct.reshape(acc_a, (1,)).astype(d_a_log.dtype))
        if HAS_BIAS:
            if PER_CHANNEL:
                ct.store(d_dt_bias, (h, 0), acc_b.astype(d_dt_bias.dtype))
            else:
                ct.store(d_dt_bias, (h,), ct.reshape(acc_b, (1,)).astype(d_dt_bias.dtype))
    if BETA_FACTOR != 0.0:
        for tb in range(_token_blocks(dbeta_act, K, BETA_PER_CHANNEL)):
            b = _sigmoid(_head_rows(beta_raw, tb, h, K, BETA_PER_CHANNEL))
            d_b = _head_rows(dbeta_act, tb, h, K, BETA_PER_CHANNEL) * (BETA_FACTOR * b * (1.0 - b))
            _store_head_rows(dbeta, tb, h, d_b, K, BETA_PER_CHANNEL)


# ------------------------------------------- one long sequence in segments (the forward's "segments" knob)
#
# The plan runs each segment of the sequence as a sequence of its own (prepare, state pass, output), the state
# passes chained through f32 states, so that one segment's state pass overlaps its neighbours' parallel
# kernels. Each segment's cu_seqlens is a row of the table segment_bounds writes from the call's own: the
# token offsets are data, the segment length the plan's.

@ct.kernel
def segment_bounds(cu, bounds, SEGMENT: ConstInt):
    """Row s of ``bounds`` (S, 4) int32: [start, stop, stop, stop] of segment s of the one sequence
    [cu[0], cu[1]), ``SEGMENT`` tokens each from its start (the last ones shorter or empty): what segment s's
    launches read as their cu_seqlens (its first two entries; 16-byte rows keep every view aligned)."""
    s = ct.bid(0)
    bos = ct.load(cu, (0,), shape=())
    eos = ct.load(cu, (1,), shape=())
    start = ct.minimum(bos + s * SEGMENT, eos)
    stop = ct.minimum(start + SEGMENT, eos)
    column = ct.arange(4, dtype=ct.int32)
    row = ct.where(column == 0, start, stop)
    ct.store(bounds, (s, 0), ct.reshape(row, (1, 4)))


_chunk_prepare_8 = chunk_prepare.replace_hints(num_worker_warps=_EIGHT_ON_SM90)
_chunk_output_8 = chunk_output.replace_hints(num_worker_warps=_EIGHT_ON_SM90)


def forward_kernels(per_channel: bool) -> tuple:
    """(chunk_gates, chunk_prepare, chunk_state_pass, chunk_output) as launched for per-channel gates (kda,
    gdn2) or per-token ones (gdn): eight worker warps on sm_90 for kda's chunk_prepare and gdn's chunk_output,
    the one that ran faster each (and slower the other way round)."""
    if per_channel:
        return chunk_gates, _chunk_prepare_8, chunk_state_pass, chunk_output
    return chunk_gates, chunk_prepare, chunk_state_pass, _chunk_output_8
