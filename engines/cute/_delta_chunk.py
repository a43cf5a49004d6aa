"""What the CuTe DSL kernels of the chunked delta rule share (engines/cute/_delta_prepare, _delta_output):
the chunk geometry, the chunk locator, row loads and stores in 16-byte segments, a tile product whose B
operand is read transposed from shared memory, and the launcher the cuTile plan calls.

Each kernel runs one CTA of 128 threads (256 for chunk_bwd_grads / chunk_bwd_values with eight warps) per
(chunk of 64 tokens, value head) and takes bare pointers and three int32 sizes (tokens, chunks, sequences), so
that a launch from C fills its parameters as the cuTile kernels' are filled (engines/cutile/_cute_launch.py
``CuteLaunch.c_launch``).
"""
from __future__ import annotations

import logging
import tempfile
import warnings

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr, range_constexpr
from cutlass.cute.runtime import make_ptr

from ..._driver import SHARED_BYTES_OPT_IN_MAX
from ..._layout import row_major_strides
# the chunk, the per-channel decays' split row and the warps a block may have
from ..cutile._variants import BLOCK_WARPS, CHUNK, SPLIT_ROW

THREADS = 128
PAD = 8                      # elements of padding per shared row (16 bytes): rows start on other banks
SEG = 8                      # elements per global access of a row (16 bytes)
# the most a sm_90 block may opt in to; past 48 KB the C paths opt in at load (_driver.kernel_allow_shared, the
# C runtime's cg_tile.c), the DSL's own launch always does
MAX_SHARED_BYTES = SHARED_BYTES_OPT_IN_MAX

logger = logging.getLogger(__name__)

DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16, "float32": cutlass.Float32}
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4}


def chunk_major(pointer: cute.Pointer, chunks, heads: int, width: int) -> cute.Tensor:
    """A workspace region laid out chunk-major, (chunks, heads, 64 rows, width) row-major (w, u, kd, d, qg,
    attn: the layout every chunk kernel reads and writes)."""
    return cute.make_tensor(pointer, cute.make_layout((chunks, heads, CHUNK, width),
                                                      stride=(heads * CHUNK * width, CHUNK * width, width, 1)))


def shared_field(dtype, count):
    """A 16-byte aligned array of ``count`` ``dtype`` elements as a shared-storage struct field."""
    return cute.struct.Align[cute.struct.MemRange[dtype, count], 16]


def shared_struct(name: str, fields: dict):
    """A shared-storage struct from a {name: shared_field} dict (the kernels' modules postpone annotation
    evaluation, so the struct cannot be written as a class body)."""
    return cute.struct(type(name, (), {"__annotations__": fields}))


class ChunkKernel:
    """Device helpers of the chunk kernels; subclasses set ``io`` (the input type) and may widen
    ``threads`` (the block: the row helpers and ``warp_mma`` spread over it, ``first_place`` / ``place`` follow;
    ``locate_chunk`` scans with the first 128)."""

    threads = THREADS
    # CTAs an SM should hold at once (0: no bound): the compiler caps the registers a thread takes to fit them
    min_blocks_per_sm = 0

    def set_warps(self, warps: int) -> None:
        """A block of ``warps`` warps (one of ``BLOCK_WARPS``); eight ask for two CTAs an SM, which caps a thread at
        128 registers (the compiler spills past them), so that an SM holds sixteen warps."""
        if warps not in BLOCK_WARPS:
            raise ValueError(f"warps = {warps}; expected one of {BLOCK_WARPS}")
        if warps == 8:
            self.threads, self.min_blocks_per_sm = 256, 2

    def launch_options(self) -> dict:
        """The launch's occupancy hint (``min_blocks_per_sm``), for ``.launch(**...)``. The shared-memory carveout
        is named with it (the most the SM has) so that the DSL does not ask a GPU for it at compile time."""
        if not self.min_blocks_per_sm:
            return {}
        return {"min_blocks_per_mp": self.min_blocks_per_sm, "preferred_smem_carveout": 100}

    @cute.jit
    def locate_chunk(self, mCu: cute.Tensor, n_seq: Int32, c: Int32, tidx: Int32, sScan: cute.Tensor,
                     sWhere: cute.Tensor):
        """sWhere = (sequence, first token, token count) of global chunk c; sequence = n_seq past the last
        chunk. Sequences are taken 128 at a time: each thread counts one's chunks, a block-wide scan gives
        where each sequence's chunks start, and the thread whose range holds c writes the answer."""
        if tidx == 0:
            sWhere[0] = n_seq
            sWhere[1] = Int32(0)
            sWhere[2] = Int32(0)
        # a block wider than 128 threads: its first 128 scan, the others take part in the barriers alone
        wide = self.threads != THREADS
        carried = Int32(0)
        blocks = (n_seq + THREADS - 1) // THREADS
        for b in cutlass.range(blocks):
            i = b * THREADS + tidx
            lo = Int32(0)
            hi = Int32(0)
            if i < n_seq:
                if const_expr(wide):
                    if tidx < THREADS:
                        lo = mCu[i]
                        hi = mCu[i + 1]
                else:
                    lo = mCu[i]
                    hi = mCu[i + 1]
            n_chunks = (hi - lo + CHUNK - 1) // CHUNK
            cute.arch.sync_threads()
            if const_expr(wide):
                if tidx < THREADS:
                    sScan[tidx] = n_chunks
            else:
                sScan[tidx] = n_chunks
            cute.arch.sync_threads()
            # inclusive Hillis-Steele scan over the 128 counts
            for step in range_constexpr(7):
                d = 1 << step
                add = Int32(0)
                if tidx >= d:
                    if const_expr(wide):
                        if tidx < THREADS:
                            add = sScan[tidx - d]
                    else:
                        add = sScan[tidx - d]
                cute.arch.sync_threads()
                if const_expr(wide):
                    if tidx < THREADS:
                        sScan[tidx] = sScan[tidx] + add
                else:
                    sScan[tidx] = sScan[tidx] + add
                cute.arch.sync_threads()
            if const_expr(wide):
                if tidx < THREADS:
                    self.claim_chunk(c, i, n_seq, lo, hi, n_chunks, carried + sScan[tidx], sWhere)
            else:
                self.claim_chunk(c, i, n_seq, lo, hi, n_chunks, carried + sScan[tidx], sWhere)
            carried = carried + sScan[THREADS - 1]

    @cute.jit
    def claim_chunk(self, c: Int32, i: Int32, n_seq: Int32, lo: Int32, hi: Int32, n_chunks: Int32, ends: Int32,
                    sWhere: cute.Tensor):
        """``locate_chunk``'s answer, written by the thread whose sequence ``i`` (chunks [ends - n_chunks, ends))
        holds chunk c."""
        first = ends - n_chunks
        if i < n_seq:
            if c >= first:
                if c < ends:
                    sWhere[0] = i
                    begin = lo + (c - first) * CHUNK
                    sWhere[1] = begin
                    sWhere[2] = cutlass.min(hi - begin, CHUNK)

    @cute.jit
    def chunk_of_block(self, mCu: cute.Tensor, n_seq: Int32, tidx: Int32, storage):
        """(chunk, sequence, first token, token count) of this CTA's chunk (blockIdx.x), every thread past
        the barrier; sequence == n_seq past the last chunk. ``storage`` has int32 fields ``scan`` (THREADS)
        and ``where`` (4)."""
        c, _, _ = cute.arch.block_idx()
        sWhere = cute.make_tensor(storage.where.data_ptr(), cute.make_layout((4,)))
        self.locate_chunk(mCu, n_seq, c, tidx, cute.make_tensor(storage.scan.data_ptr(), cute.make_layout((THREADS,))),
                          sWhere)
        cute.arch.sync_threads()
        return c, sWhere[0], sWhere[1], sWhere[2]

    @cute.jit
    def block_heads(self):
        """A chunk kernel's start: its MMA (``warp_mma``), this thread's index, the block's value head (blockIdx.y)
        and key head (value head // group) and the thread's slice of the MMA."""
        tiled_mma = self.warp_mma()
        tidx, _, _ = cute.arch.thread_idx()
        _, h, _ = cute.arch.block_idx()
        return tiled_mma, tidx, h, h // self.group, tiled_mma.get_slice(tidx)

    def warp_mma(self, dtype=None) -> cute.TiledMma:
        """The tile products' MMA: mma.sync m16n8k16 (``dtype`` in, the input type by default; f32 out), four
        warps along M (a wider block's further warps along N; traced into the caller's kernel)."""
        warps = self.threads // 32
        return cute.make_tiled_mma(cute.nvgpu.warp.MmaF16BF16Op(dtype or self.io, Float32, (16, 8, 16)),
                                   cute.make_layout((4, warps // 4, 1)))

    @property
    def split(self):
        """The type of the operands that carry a per-channel decay split around a chunk's middle row (kda: a
        factor may reach e^SPLIT_EXPONENT_LIMIT): the input type, but BF16 for FP16 inputs (FP16 overflows
        past e^11; BF16 has float32's range), so that FP16 inputs take BF16 products there alone."""
        return cutlass.BFloat16 if self.io is cutlass.Float16 else self.io

    def as_split_view(self, sX: cute.Tensor) -> cute.Tensor:
        """``sX`` (shared, the input type) viewed in the split operands' type (the same 16-bit elements)."""
        if self.split is self.io:
            return sX
        return cute.make_tensor(cute.recast_ptr(sX.iterator, dtype=self.split), sX.layout)

    def set_heads(self, io_dtype: str, K: int, V: int, HQ: int, H: int, use_l2: bool) -> None:
        """The specialisation's input type, head dims, key heads ``HQ`` and value heads ``H`` (a multiple of
        HQ: ``group`` value heads read each key head) and whether keys (and queries) are L2-normalised."""
        if H % HQ:
            raise ValueError(f"value heads {H} are not a multiple of the key heads {HQ}")
        self.io = DTYPES[io_dtype]
        self.K, self.V, self.HQ, self.H = K, V, HQ, H
        self.group = H // HQ
        self.use_l2 = use_l2

    @cute.jit
    def load_rows(self, src: cute.Tensor, dst: cute.Tensor, start: Int32, count: Int32, width: cutlass.Constexpr,
                  normalise: cutlass.Constexpr, tidx: Int32, also=None, store=None):
        """Rows [start, start + 64) of ``src`` (tokens x width) into ``dst`` (64 x width, shared) in 16-byte
        segments (a warp reads whole rows: coalesced), zeros past ``count``; L2-normalised per row when
        ``normalise`` (the row's lanes sum their squares by shuffles). ``also(p, row, seg, x)``, when given, is
        traced into the loop with each segment's f32 values (after the norm; p: the pass, a trace-time
        constant, to index registers with); ``store(p, row, seg, x)``, when given, gives the f32 values
        written to ``dst`` instead of x. Every row's load is issued before the
        first row is processed: a hook that stores to global memory (kd) between two loads would order them
        (the compiler cannot tell the buffers apart), and each row would wait out the previous one's
        latency."""
        self.put_loaded_rows(self.issue_rows(src, start, count, width, tidx), dst, width, normalise, tidx, also,
                             store)

    @cute.jit
    def issue_rows(self, src: cute.Tensor, start: Int32, count: Int32, width: cutlass.Constexpr, tidx: Int32,
                   first_seg=0):
        """``load_rows``' first half: rows [start, start + 64) of ``src`` into a thread's registers
        (``row_registers`` in src's type), zeros past ``count``; the loads are issued, not waited on, so that a
        caller can have several blocks' loads in flight before it processes any. ``first_seg``: the rows'
        columns start at that segment of 8 columns (a key block of a wider row)."""
        raw = self.row_registers(width, src.element_type)
        self.fill_rows(src, raw, start, count, width, tidx, first_seg)
        return raw

    @cute.jit
    def fill_rows(self, src: cute.Tensor, raw: cute.Tensor, start: Int32, count: Int32, width: cutlass.Constexpr,
                  tidx: Int32, first_seg=0):
        """``issue_rows`` into registers the caller holds (``raw``: to be filled under a runtime condition)."""
        segs = width // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            self.load_segment(src, cute.local_tile(raw, (1, SEG), (p, 0)), start, row, first_seg + seg, count)

    @cute.jit
    def load_segment(self, src: cute.Tensor, part: cute.Tensor, start: Int32, row, seg, count: Int32):
        """The 16-byte segment ``seg`` of ``src``'s row ``start + row`` into ``part`` (registers), or zeros
        where ``row`` is past the chunk's ``count`` rows."""
        if row < count:
            cute.autovec_copy(cute.local_tile(src, (1, SEG), (start + row, seg)), part)
        else:
            part.fill(0.0)

    @cute.jit
    def put_loaded_rows(self, raw: cute.Tensor, dst: cute.Tensor, width: cutlass.Constexpr,
                        normalise: cutlass.Constexpr, tidx: Int32, also=None, store=None):
        """``load_rows``' second half: what ``issue_rows`` loaded, normalised and passed through the hooks
        as ``load_rows`` says, into ``dst``."""
        segs = width // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            part = cute.local_tile(raw, (1, SEG), (p, 0))
            if const_expr(normalise or also is not None or store is not None):
                x = part.load().to(Float32)
                if const_expr(normalise):
                    x = x * self.row_inverse_norm(x, segs)
                    part.store(x.to(self.io))
                if const_expr(also is not None):
                    also(p, row, seg, x)
                if const_expr(store is not None):
                    if const_expr(dst.element_type is not self.io):
                        # a store into another 16-bit type (the split operands' BF16 over FP16 inputs)
                        converted = cute.make_rmem_tensor((1, SEG), dst.element_type)
                        converted.store(store(p, row, seg, x).to(dst.element_type))
                        part = converted
                    else:
                        part.store(store(p, row, seg, x).to(self.io))
            cute.autovec_copy(part, cute.local_tile(dst, (1, SEG), (row, seg)))

    @cute.jit
    def scale_rows(self, sX: cute.Tensor, scale, width: cutlass.Constexpr, tidx: Int32):
        """sX (64 x width, shared) times ``scale`` (one segment's f32 factors) in place, over the segments
        ``load_rows`` gives this thread (one column segment, a row each pass): a per-channel rescale of
        rows this thread stored needs no barrier before it."""
        segs = width // SEG
        rows_per_pass = self.threads // segs
        vals = cute.make_rmem_tensor((1, SEG), self.io)
        for p in range_constexpr(CHUNK // rows_per_pass):
            part = cute.local_tile(sX, (1, SEG), (tidx // segs + p * rows_per_pass, tidx % segs))
            cute.autovec_copy(part, vals)
            vals.store((vals.load().to(Float32) * scale).to(self.io))
            cute.autovec_copy(vals, part)

    @cute.jit
    def copy_rows(self, src: cute.Tensor, dst: cute.Tensor, rows: cutlass.Constexpr, width: cutlass.Constexpr,
                  tidx: Int32, dst_row=0, dst_seg=0, count=None):
        """src (rows x width, shared) into dst (global) at row ``dst_row`` and 16-byte segment ``dst_seg`` on, in
        16-byte segments, a row's segments on adjacent threads (coalesced); only rows below ``count`` when
        given (a chunk's rows past a sequence's end)."""
        segs = width // SEG
        for i in range_constexpr(rows * segs // self.threads):
            q = tidx + i * self.threads
            row = q // segs
            seg = q % segs
            if const_expr(count is None):
                cute.autovec_copy(cute.local_tile(src, (1, SEG), (row, seg)),
                                  cute.local_tile(dst, (1, SEG), (dst_row + row, dst_seg + seg)))
            else:
                if row < count:
                    cute.autovec_copy(cute.local_tile(src, (1, SEG), (row, seg)),
                                      cute.local_tile(dst, (1, SEG), (dst_row + row, dst_seg + seg)))

    @cute.jit
    def load_fragment(self, src: cute.Tensor, dst: cute.Tensor):
        """A thread's accumulator-shaped fragment of scratch (f32, or the input type with 16-bit scratch) into f32
        registers ``dst``."""
        if const_expr(src.element_type is Float32):
            cute.autovec_copy(src, dst)
        else:
            raw = cute.make_rmem_tensor(dst.shape, src.element_type)
            cute.autovec_copy(src, raw)
            dst.store(raw.load().to(Float32))

    @cute.jit
    def store_fragment(self, src: cute.Tensor, dst: cute.Tensor):
        """f32 accumulators ``src`` into a thread's fragment of scratch ``dst`` in its type (rounded to 16 bits
        with 16-bit scratch)."""
        if const_expr(dst.element_type is Float32):
            cute.autovec_copy(src, dst)
        else:
            rounded = cute.make_rmem_tensor(src.shape, dst.element_type)
            rounded.store(src.load().to(dst.element_type))
            cute.autovec_copy(rounded, dst)

    @cute.jit
    def scratch_rows(self, src: cute.Tensor, dst: cute.Tensor, width: cutlass.Constexpr, tidx: Int32,
                     rows: cutlass.Constexpr = CHUNK):
        """src (``rows`` x width, global: the backward's scratch, f32 or the input type) into dst (shared, 16 bits:
        the input type, or the split operands' BF16 over FP16 inputs), converted or copied, in segments of 8
        columns, a row's on adjacent threads."""
        segs = width // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        raw = cute.make_rmem_tensor((1, SEG), src.element_type)
        out = cute.make_rmem_tensor((1, SEG), dst.element_type)
        for p in range_constexpr(rows // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            cute.autovec_copy(cute.local_tile(src, (1, SEG), (row, seg)), raw)
            if const_expr(src.element_type is dst.element_type):
                cute.autovec_copy(raw, cute.local_tile(dst, (1, SEG), (row, seg)))
            else:
                out.store(raw.load().to(dst.element_type))
                cute.autovec_copy(out, cute.local_tile(dst, (1, SEG), (row, seg)))

    @cute.jit
    def put_scratch_rows(self, raw: cute.Tensor, dst: cute.Tensor, width: cutlass.Constexpr, tidx: Int32):
        """Rows ``issue_rows`` loaded from scratch (f32 or the input type) into ``dst`` in the input type."""
        segs = width // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        out = cute.make_rmem_tensor((1, SEG), self.io)
        for p in range_constexpr(CHUNK // rows_per_pass):
            part = cute.local_tile(raw, (1, SEG), (p, 0))
            if const_expr(raw.element_type is not self.io):
                out.store(part.load().to(self.io))
                part = out
            cute.autovec_copy(part, cute.local_tile(dst, (1, SEG), (tidx // segs + p * rows_per_pass, seg)))

    def first_place(self, tidx):
        """(row0, col0): the first row and column of a thread's accumulator elements (``place``): four warps of
        16 rows, a quad's lanes on a row, two columns a lane (mma.sync m16n8's C layout); in a block of eight
        warps (``warp_mma``: the second four along N) warp w + 4 takes the 8 columns after warp w's."""
        if const_expr(self.threads == THREADS):
            return (tidx // 32) * 16 + (tidx % 32) // 4, 2 * (tidx % 4)
        warp = tidx // 32
        return (warp % 4) * 16 + (tidx % 32) // 4, (warp // 4) * 8 + 2 * (tidx % 4)

    def place(self, e: int, row0, col0):
        """(row, column) of accumulator element ``e`` of a 64 x N product (``warp_mma``) held by the thread whose
        first row and column are ``first_place``'s: the fragment is ((2 columns, 2 rows 8 apart), 1, column
        tiles), the column tiles 8 apart with four warps (N / 8 of them), 16 apart with eight (N / 16)."""
        return row0 + 8 * ((e // 2) % 2), col0 + 8 * (self.threads // THREADS) * (e // 4) + e % 2

    @cute.jit
    def add_row(self, sums: cute.Tensor, which: cutlass.Constexpr, e: cutlass.Constexpr, value):
        """Add ``value`` (of accumulator element e) to its row's sum ``which`` (row0's or row0 + 8's: ``place``);
        a row's sum is spread over a quad's four lanes until ``quad_sums``."""
        sums[which, (e // 2) % 2] = sums[which, (e // 2) % 2] + value

    @cute.jit
    def quad_sums(self, sums: cute.Tensor, count: cutlass.Constexpr):
        """Each row sum of ``add_row`` (``count`` of them, two rows each) summed over the quad's lanes."""
        for which in range_constexpr(count):
            for half in range_constexpr(2):
                x = sums[which, half]
                x = x + cute.arch.shuffle_sync_bfly(x, 1)
                x = x + cute.arch.shuffle_sync_bfly(x, 2)
                sums[which, half] = x

    def row_registers(self, width: int, dtype=None):
        """A thread's share of a 64 x ``width`` block held in registers between ``fetch_rows`` and
        ``put_rows``: one segment of 8 columns per pass of the CTA's threads, each segment contiguous (the
        input type unless ``dtype``)."""
        passes = CHUNK * width // (self.threads * SEG)
        return cute.make_rmem_tensor(cute.make_layout((passes, SEG), stride=(SEG, 1)),
                                     self.io if dtype is None else dtype)

    @cute.jit
    def fetch_rows(self, src: cute.Tensor, regs: cute.Tensor, width: cutlass.Constexpr, tidx: Int32):
        """All 64 rows of ``src`` (64 x width, global, or shared) into ``regs`` (``row_registers``): the loads are
        issued and not waited on until ``put_rows`` reads the registers, so a chunk's rows can be in
        flight while the previous chunk is computed (the kernels have no shared memory left for a second
        buffer under the 48 KB the C path launches with). The segments are ``load_rows``' and
        ``copy_rows_async``' own: a thread reads back what it copied without a barrier."""
        segs = width // SEG
        rows_per_pass = self.threads // segs
        for p in range_constexpr(CHUNK // rows_per_pass):
            cute.autovec_copy(cute.local_tile(src, (1, SEG), (tidx // segs + p * rows_per_pass, tidx % segs)),
                              cute.local_tile(regs, (1, SEG), (p, 0)))

    @cute.jit
    def put_rows(self, regs: cute.Tensor, dst: cute.Tensor, width: cutlass.Constexpr, tidx: Int32):
        """What ``fetch_rows`` loaded into ``dst`` (64 x width, shared), in the same segments."""
        segs = width // SEG
        rows_per_pass = self.threads // segs
        for p in range_constexpr(CHUNK // rows_per_pass):
            cute.autovec_copy(cute.local_tile(regs, (1, SEG), (p, 0)),
                              cute.local_tile(dst, (1, SEG), (tidx // segs + p * rows_per_pass, tidx % segs)))

    @cute.jit
    def store_fragment_matrices(self, tiled_mma: cute.TiledMma, frag: cute.Tensor, dst: cute.Tensor, tidx: Int32):
        """A thread's accumulator-layout fragment ``frag`` (the input type) into ``dst`` (shared, rows 16-byte
        aligned) by stmatrix: two 8 x 8 matrices an instruction instead of a 4-byte store per column pair (the
        state passes' stores of S and dD each step are MIO-bound)."""
        atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 2), self.io)
        tiled = cute.make_tiled_copy_C(atom, tiled_mma)
        thr = tiled.get_slice(tidx)
        cute.copy(tiled, thr.retile(frag), thr.partition_D(dst))

    @cute.jit
    def copy_rows_async(self, src: cute.Tensor, dst: cute.Tensor, width: cutlass.Constexpr, tidx: Int32,
                        start=0, count=None, zero_past: cutlass.Constexpr = False):
        """All 64 rows of ``src`` (64 x width, global, the input type) into ``dst`` (64 x width, shared) by cp.async
        in ``fetch_rows``' segments, committed as one group: no registers and no wait until the caller's
        ``cp_async_wait_group`` (then a barrier, so that every thread's copies are seen; a thread's own
        segments it may read after the wait alone). With ``count``, src is token rows: rows [start, start +
        64), a row past the chunk's ``count`` a copy of its last (finite, and in bounds; a caller whose products
        would read it gives it a zero factor), or zeros with ``zero_past`` (``load_rows``' rows)."""
        atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cute.nvgpu.cpasync.LoadCacheMode.GLOBAL), self.io,
                                   num_bits_per_copy=128)
        segs = width // SEG
        rows_per_pass = self.threads // segs
        zeros = None
        if const_expr(zero_past):
            zeros = cute.make_rmem_tensor((SEG,), self.io)
            zeros.fill(0.0)
        for p in range_constexpr(CHUNK // rows_per_pass):
            row, seg = tidx // segs + p * rows_per_pass, tidx % segs
            src_row = row
            if const_expr(count is not None):
                src_row = start + cutlass.min(row, count - 1)
            # one-mode segments: the atom's 8 values are the tensor's first mode (a (1, 8) tile would be copied
            # 16 bytes from each element)
            dst_seg = cute.local_tile(dst[row, None], (SEG,), (seg,))
            if const_expr(zero_past):
                if row < count:
                    cute.copy(atom, cute.local_tile(src[src_row, None], (SEG,), (seg,)), dst_seg)
                else:
                    cute.autovec_copy(zeros, dst_seg)
            else:
                cute.copy(atom, cute.local_tile(src[src_row, None], (SEG,), (seg,)), dst_seg)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def row_inverse_norm(self, x, segs: cutlass.Constexpr):
        """1 / ||row|| over the ``segs`` lanes that hold a row's segments (0 for a zero row)."""
        ss = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        for lane in range_constexpr(segs.bit_length() - 1):
            ss = ss + cute.arch.shuffle_sync_bfly(ss, 1 << lane)
        return cutlass.select_(ss > Float32(0.0), cute.math.rsqrt(ss), Float32(0.0))

    def ldmatrix_copy(self, tiled_mma: cute.TiledMma, operand: str, transpose: bool, dtype):
        """The ldmatrix copy that reads the MMA's ``operand`` ("A": four 8 x 8 matrices a warp, "B": two) of
        ``dtype`` from a shared tile whose rows of 8 start 16-byte aligned: as stored (K contiguous), or viewed
        transposed with ``transpose`` (traced into the caller's kernel)."""
        atom = cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(transpose=transpose,
                                                                     num_matrices=4 if operand == "A" else 2), dtype)
        return cute.make_tiled_copy_A(atom, tiled_mma) if operand == "A" else cute.make_tiled_copy_B(atom, tiled_mma)

    @cute.jit
    def product_bt(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, sA: cute.Tensor, sX: cute.Tensor,
                   rows: cutlass.Constexpr, width: cutlass.Constexpr, row_stride: cutlass.Constexpr, tidx: Int32):
        """acc (64 x width) += sA (64 x rows) @ X, X (rows x width, row-major, ``row_stride`` apart in shared
        memory) read transposed as the MMA's K-major B operand by ldmatrix.trans (a lane's K-pairs are not
        adjacent in X: element loads would take 16 bits each). ldmatrix needs 16-byte aligned rows of 8."""
        xt = cute.make_tensor(sX.iterator, cute.make_layout((width, rows), stride=(1, row_stride)))
        self.ldmatrix_gemm(tiled_mma, acc, sA, xt, False, True, tidx)

    @cute.jit
    def ldmatrix_gemm(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, sA: cute.Tensor, sB: cute.Tensor,
                      a_transposed: cutlass.Constexpr, b_transposed: cutlass.Constexpr, tidx: Int32):
        """acc += A B over the k-blocks, each k-block's operands read from the shared views sA (M x K) and
        sB (N x K) by ldmatrix (transposed where the view is)."""
        thr = tiled_mma.get_slice(tidx)
        # whole fragments, as the ldmatrix copies retile them (a k-block's slice does not retile); each slice
        # is written and read once, so its registers are live a k-block at a time
        rA = tiled_mma.make_fragment_A(thr.partition_A(sA))
        rB = tiled_mma.make_fragment_B(thr.partition_B(sB))
        copy_a = self.ldmatrix_copy(tiled_mma, "A", a_transposed, sA.element_type)
        copy_b = self.ldmatrix_copy(tiled_mma, "B", b_transposed, sB.element_type)
        thr_a = copy_a.get_slice(tidx)
        thr_b = copy_b.get_slice(tidx)
        sA_src = thr_a.partition_S(sA)
        sB_src = thr_b.partition_S(sB)
        rA_view = thr_a.retile(rA)
        rB_view = thr_b.retile(rB)
        for kb in range_constexpr(cute.size(rA, mode=[2])):
            cute.copy(copy_a, sA_src[None, None, kb], rA_view[None, None, kb])
            cute.copy(copy_b, sB_src[None, None, kb], rB_view[None, None, kb])
            cute.gemm(tiled_mma, acc, rA[None, None, kb], rB[None, None, kb], acc)

    @cute.jit
    def product_tt(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, sY: cute.Tensor, sX: cute.Tensor,
                   rows: cutlass.Constexpr, m: cutlass.Constexpr, width: cutlass.Constexpr,
                   y_stride: cutlass.Constexpr, x_stride: cutlass.Constexpr, tidx: Int32):
        """acc (m x width) += Y^T @ X with Y (rows x m) and X (rows x width) row-major in shared memory
        (``y_stride`` / ``x_stride`` apart): both operands read transposed by ldmatrix.trans."""
        yt = cute.make_tensor(sY.iterator, cute.make_layout((m, rows), stride=(1, y_stride)))
        xt = cute.make_tensor(sX.iterator, cute.make_layout((width, rows), stride=(1, x_stride)))
        self.ldmatrix_gemm(tiled_mma, acc, yt, xt, True, True, tidx)

    @cute.jit
    def product(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, sA: cute.Tensor, sB: cute.Tensor, tidx: Int32):
        """acc (M x N) += sA (M x K) @ sB^T, sB given as N x K (shared memory, K contiguous, rows of 8 starting
        16-byte aligned), both read by ldmatrix."""
        self.ldmatrix_gemm(tiled_mma, acc, sA, sB, False, False, tidx)

    @cute.jit
    def masked_scores(self, tiled_mma, thr, sQ: cute.Tensor, sK: cute.Tensor, dAttn: cute.Tensor, sGc,
                      decayed: cutlass.Constexpr, tidx: Int32, over_operand: cutlass.Constexpr = False):
        """attn = scale (q k^T) for j <= t, else 0, into dAttn (64 x 64, shared or global) in the input type from
        the accumulators' layout; times e^(gc_t - gc_j) when ``decayed`` (a per-token gate; per-channel decays
        are in the operands already). ``self.scale``: the scale. ``over_operand``: dAttn lies over sQ or sK (a
        barrier after the product, so that every warp has read them)."""
        scores = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, CHUNK)), Float32)
        scores.fill(0.0)
        self.product(tiled_mma, scores, sQ, sK, tidx)
        if const_expr(over_operand):
            cute.arch.sync_threads()
        coords = thr.partition_C(cute.make_identity_tensor((CHUNK, CHUNK)))
        vals = cute.make_rmem_tensor(scores.shape, self.io)
        for e in range_constexpr(cute.size(scores)):
            t, j = coords[e]
            val = Float32(0.0)
            if j <= t:
                val = scores[e] * self.scale
                if const_expr(decayed):
                    val = val * cute.math.exp(sGc[t] - sGc[j])
            vals[e] = val.to(self.io)
        cute.autovec_copy(vals, thr.partition_C(dAttn))

    @cute.jit
    def store_staged(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, stage: cute.Tensor, dst: cute.Tensor,
                     start: Int32, count: Int32, width: cutlass.Constexpr, tidx: Int32):
        """acc (64 x width, f32) in ``dst``'s type through ``stage`` (shared, 64 x width, free to overwrite
        once every thread is past the barrier here) into ``dst``'s rows start + [0, count) in 16-byte
        segments (coalesced; the accumulators' own layout would write 4 bytes a lane)."""
        thr = tiled_mma.get_slice(tidx)
        out = cute.make_rmem_tensor(acc.shape, dst.element_type)
        out.store(acc.load().to(dst.element_type))
        cute.arch.sync_threads()
        cute.autovec_copy(out, thr.partition_C(stage))
        cute.arch.sync_threads()
        segs = width // SEG
        rows_per_pass = self.threads // segs
        seg = tidx % segs
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            if row < count:
                cute.autovec_copy(cute.local_tile(stage, (1, SEG), (row, seg)),
                                  cute.local_tile(dst, (1, SEG), (start + row, seg)))


def pointer(dtype: str, address: int, align: int):
    cdt = cutlass.Int32 if dtype == "int32" else DTYPES[dtype]
    return make_ptr(cdt, address, cute.AddressSpace.gmem, assumed_align=align)


def compile_kernel(kernel, pointer_types):
    """(compiled kernel, its dynamic shared bytes): ``kernel`` (a ChunkKernel with ``__call__`` taking the
    pointers, tokens, chunks, sequences and a stream) compiled for CUTE_DSL_ARCH / the current GPU, its
    cubin kept (``__cubin__``) for the C launch path."""
    ptrs = [pointer(d, 4096, a) for d, a in pointer_types]
    with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="cudnn_graph_cute_") as dump:
        # the register-resident loops are unrolled at trace time on purpose (static register indices)
        warnings.filterwarnings("ignore", message="This static loop has")
        compiled = cute.compile(kernel, *ptrs, Int32(64), Int32(1), Int32(1), cuda.CUstream(0),
                                options=f"--keep-cubin --dump-dir {dump}")
    shared = kernel.shared_bytes()
    if shared > MAX_SHARED_BYTES:
        raise ValueError(f"{type(kernel).__name__} takes {shared} bytes of shared memory; a sm_90 block has at "
                         f"most {MAX_SHARED_BYTES}")
    return compiled, shared


_COMPILED = {}


class KernelLauncher:
    """One specialisation of a chunk kernel, compiled at first use (once per process) and the checks that
    its launch is valid for the buffers at hand: ``launcher(stream, slots, tokens, chunks)`` with Slots (the
    engine's operands and workspace regions, in the kernel's pointer order; tokens and chunks: the plan's
    token count and its bound on chunks, whatever the kernel's grid) launches and returns True, or
    returns False without launching when a buffer is not packed row-major or not aligned as the kernel
    assumes (the caller runs its cuTile kernel instead)."""

    def __init__(self, make_kernel, key: tuple, pointer_types: tuple, n_seq: int):
        self._make_kernel = make_kernel
        self._key = key
        self._types = pointer_types
        self.n_seq = n_seq
        self._compiled = None
        self._failed = None            # why the compile failed: every call then goes to the cuTile kernel
        self._shared_bytes = 0
        self._threads = THREADS
        self._streams = {}

    @property
    def name(self) -> str:
        """The kernel's name (its specialisation key's first field)."""
        return self._key[0]

    def compile(self) -> bool:
        """Whether the kernel is compiled (at the first call); a failure is logged once, not raised: the
        caller's cuTile kernel computes the same."""
        if self._compiled is None and self._failed is None:
            try:
                found = _COMPILED.get(self._key)
                if found is None:
                    kernel = self._make_kernel()
                    found = _COMPILED[self._key] = (*compile_kernel(kernel, self._types), kernel.threads)
                self._compiled, self._shared_bytes, self._threads = found
            except Exception as exc:      # noqa: BLE001  (a DSL failure of any kind: the cuTile kernel runs)
                self._failed = f"{type(exc).__name__}: {exc}"
                logger.warning("the CuTe %s kernel did not compile (%s); its cuTile kernel runs instead",
                               self._key[0], self._failed)
        return self._compiled is not None

    def cubin(self) -> tuple:
        """(cubin, block, dynamic shared bytes) of the kernel, for a launch from C: its parameters are the
        addresses in pointer order, then tokens, chunks and sequences as int32. RuntimeError when the
        kernel did not compile."""
        if not self.compile():
            raise RuntimeError(f"the CuTe {self.name} kernel did not compile: {self._failed}")
        cubin = self._compiled.__cubin__
        if not cubin:
            raise RuntimeError(f"the CuTe DSL kept no cubin of {self.name}")
        return bytes(cubin), (self._threads, 1, 1), self._shared_bytes

    def usable(self, slots) -> bool:
        """Whether every slot is packed row-major and aligned as the kernel assumes."""
        for slot, (_, align) in zip(slots, self._types):
            if slot.data_ptr % align:
                return False
            if tuple(slot.strides) != row_major_strides(slot.shape) and slot.numel > 1:
                return False
        return True

    def __call__(self, stream: int, slots, tokens: int, chunks: int) -> bool:
        if not self.usable(slots) or not self.compile():
            return False
        handle = self._streams.get(stream)
        if handle is None:
            handle = self._streams[stream] = cuda.CUstream(stream)
        self._compiled(*[pointer(d, s.data_ptr, a) for (d, a), s in zip(self._types, slots)], Int32(tokens),
                       Int32(chunks), Int32(self.n_seq), handle)
        return True
