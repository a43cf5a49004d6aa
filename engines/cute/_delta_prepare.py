"""The chunked delta rule's per-chunk preparation for a per-token (scalar) gate in CuTe DSL, for sm_90.

What it computes is ``engines/cutile/_kernels.chunk_prepare``'s (gdn; the algebra is in that module's
docstring) into the same workspace regions, so that the cuTile state pass and output kernels read it as
their own: per (chunk of 64 tokens, value head) the in-chunk cumulative gate ``gc``, ``w = T (C e^gc)``,
``u = T X`` and ``kd = k e^(gc_last - gc)``, with ``T = (I + A)^-1`` and ``A[t, i] = beta_t (k_t . k_i)
e^(gc_t - gc_i)`` for i < t.

Why a second implementation of the same kernel: tileiras gives the cuTile one about 224 KB of shared
memory, so one CTA runs per SM with nothing to overlap its serial chain (docs/engines_cutile.md). Here the
CTA holds its operands in about 60 KB and four CTAs share an SM. The steps, 128 threads (four warps):

1. locate the chunk from ``cu_seqlens`` on the device (a block-wide scan of per-sequence chunk counts);
2. the gate's in-chunk sums and beta (threads 0-63, a row each), then k (L2-normalised when asked) and v
   into shared memory, two threads a row; ``kd`` straight from those registers to global memory;
3. ``k k^T`` on the tensor cores (mma.sync m16n8k16, BF16 / FP16 in, f32 out), masked and scaled into
   ``A`` (f32, shared);
4. ``T`` by forward substitution in f32, one column per thread (64 threads): column c of ``(I + A) T = I``
   needs only the rows above it, kept in registers, while A's rows are broadcast from shared memory;
5. ``w = (T diag(beta e^gc)) k`` and ``u = (T diag(beta)) v`` on the tensor cores, with T's column
   scales folded in before it is rounded to the input type (fla's precision: T in the input type);
   stored to the chunk-major scratch.
"""
from __future__ import annotations

import tempfile
import warnings

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr, range_constexpr
from cutlass.cute.runtime import make_ptr
from cutlass.memory import SmemAllocator

CHUNK = 64
THREADS = 128
_PAD = 8                     # elements of padding per shared row (16 bytes): rows start on other banks
_SEG = 8                     # elements per global access of a row (16 bytes)

_DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16, "float32": cutlass.Float32}


class DeltaPrepare:
    """One specialisation: the input type, the gate and beta types, K, V, the value heads per key head
    (``group``), the key heads ``HQ``, the value heads ``H`` and whether keys are L2-normalised.
    ``compile()`` gives a launcher ``(k, v, g, beta, cu, w, u, g_out, kd, tokens, chunks, n_seq, stream)``
    taking addresses and ints."""

    def __init__(self, io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int,
                 HQ: int, H: int, use_l2: bool):
        if H % HQ:
            raise ValueError(f"value heads {H} are not a multiple of the key heads {HQ}")
        self.io = _DTYPES[io_dtype]
        self.g_type = _DTYPES[g_dtype]
        self.beta_type = _DTYPES[beta_dtype]
        self.scratch = _DTYPES[scratch_dtype]
        self.K, self.V, self.HQ, self.H = K, V, HQ, H
        self.group = H // HQ
        self.use_l2 = use_l2

    @property
    def _row_width(self) -> int:
        """Elements per padded row of the k / v buffer (v takes k's place once w is out)."""
        return max(self.K, self.V) + _PAD

    def shared_storage(self):
        """The CTA's shared memory as one struct (its size is the launch's dynamic shared bytes, the same
        for the DSL's launch and the C path's): the k / v rows, A (then T's two scaled copies), the
        cumulative gates, beta and the chunk locator's scan."""
        width = self._row_width

        def field(dtype, count):
            return cute.struct.Align[cute.struct.MemRange[dtype, count], 16]

        # Built from an annotations dict: this module's annotations are strings (postponed evaluation).
        fields = {"kv": field(self.io, CHUNK * width), "a": field(Float32, CHUNK * (CHUNK + _PAD)),
                  "gc": field(Float32, CHUNK), "beta": field(Float32, CHUNK), "scan": field(Int32, THREADS),
                  "where": field(Int32, 4)}
        return cute.struct(type("DeltaPrepareStorage", (), {"__annotations__": fields}))

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
            grid=[chunks, self.H, 1], block=[THREADS, 1, 1], smem=self.shared_bytes(), stream=stream)

    # -- device side --------------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, pk: cute.Pointer, pv: cute.Pointer, pg: cute.Pointer, pbeta: cute.Pointer,
               pcu: cute.Pointer, pw: cute.Pointer, pu: cute.Pointer, pgo: cute.Pointer, pkd: cute.Pointer,
               tokens: Int32, chunks: Int32, n_seq: Int32):
        K, V, H, HQ = self.K, self.V, self.H, self.HQ
        io = self.io
        mK = cute.make_tensor(pk, cute.make_layout((tokens, HQ, K), stride=(HQ * K, K, 1)))
        mV = cute.make_tensor(pv, cute.make_layout((tokens, H, V), stride=(H * V, V, 1)))
        mG = cute.make_tensor(pg, cute.make_layout((tokens, H), stride=(H, 1)))
        mB = cute.make_tensor(pbeta, cute.make_layout((tokens, H), stride=(H, 1)))
        mCu = cute.make_tensor(pcu, cute.make_layout((n_seq + 1,), stride=(1,)))
        mW = cute.make_tensor(pw, cute.make_layout((chunks, H, CHUNK, K), stride=(H * CHUNK * K, CHUNK * K, K, 1)))
        mU = cute.make_tensor(pu, cute.make_layout((chunks, H, CHUNK, V), stride=(H * CHUNK * V, CHUNK * V, V, 1)))
        mKd = cute.make_tensor(pkd, cute.make_layout((chunks, H, CHUNK, K),
                                                     stride=(H * CHUNK * K, CHUNK * K, K, 1)))
        mGo = cute.make_tensor(pgo, cute.make_layout((tokens, H), stride=(H, 1)))
        tiled_mma = cute.make_tiled_mma(cute.nvgpu.warp.MmaF16BF16Op(io, Float32, (16, 8, 16)),
                                        cute.make_layout((4, 1, 1)))
        tidx, _, _ = cute.arch.thread_idx()
        c, h, _ = cute.arch.block_idx()
        hk = h // self.group

        storage = SmemAllocator().allocate(self.shared_storage())
        width = self._row_width
        sK = cute.make_tensor(storage.kv.data_ptr(), cute.make_layout((CHUNK, K), stride=(width, 1)))
        sV = cute.make_tensor(storage.kv.data_ptr(), cute.make_layout((CHUNK, V), stride=(width, 1)))
        sA = cute.make_tensor(storage.a.data_ptr(), cute.make_layout((CHUNK, CHUNK), stride=(CHUNK + _PAD, 1)))
        # T's two scaled copies take A's place once the substitution has read it (A's padded rows hold both)
        t_layout = cute.make_layout((CHUNK, CHUNK), stride=(CHUNK + _PAD, 1))
        sTw = cute.make_tensor(cute.recast_ptr(sA.iterator, dtype=io), t_layout)
        sTu = cute.make_tensor(cute.recast_ptr(sA.iterator, dtype=io) + cute.cosize(t_layout), t_layout)
        sGc = cute.make_tensor(storage.gc.data_ptr(), cute.make_layout((CHUNK,)))
        sBeta = cute.make_tensor(storage.beta.data_ptr(), cute.make_layout((CHUNK,)))
        sScan = cute.make_tensor(storage.scan.data_ptr(), cute.make_layout((THREADS,)))
        sWhere = cute.make_tensor(storage.where.data_ptr(), cute.make_layout((4,)))

        # 1. which sequence and tokens chunk c covers
        self.locate_chunk(mCu, n_seq, c, tidx, sScan, sWhere)
        cute.arch.sync_threads()
        seq = sWhere[0]
        start = sWhere[1]
        count = sWhere[2]
        if seq < n_seq:
            # 2. gates and beta (a row a thread), then k and v (two threads a row)
            if tidx < CHUNK:
                gv = Float32(0.0)
                bv = Float32(0.0)
                if tidx < count:
                    gv = mG[start + tidx, h].to(Float32)
                    bv = mB[start + tidx, h].to(Float32)
                sGc[tidx] = gv
                sBeta[tidx] = bv
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
            self.load_keys(mK, mKd, sK, sGc, start, count, c, h, hk, tidx)
            cute.arch.sync_threads()
            # 3. A = beta_t (k_t . k_i) e^(gc_t - gc_i), i < t
            self.form_a(tiled_mma, sK, sA, sGc, sBeta, tidx)
            cute.arch.sync_threads()
            # 4. T = (I + A)^-1, a column a thread
            self.invert_column(sA, sTw, sTu, sGc, sBeta, tidx)
            cute.arch.sync_threads()
            # 5. w = T diag(beta e^gc) k, u = T diag(beta) v; each staged in its operand's place, then
            # stored; v is read into k's place once w is out
            self.product_out(tiled_mma, sTw, sK, mW, c, h, K, tidx)
            cute.arch.sync_threads()
            self.load_values(mV, sV, start, count, h, tidx)
            cute.arch.sync_threads()
            self.product_out(tiled_mma, sTu, sV, mU, c, h, V, tidx)

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
        carried = Int32(0)
        blocks = (n_seq + THREADS - 1) // THREADS
        for b in cutlass.range(blocks):
            i = b * THREADS + tidx
            lo = Int32(0)
            hi = Int32(0)
            if i < n_seq:
                lo = mCu[i]
                hi = mCu[i + 1]
            n_chunks = (hi - lo + CHUNK - 1) // CHUNK
            cute.arch.sync_threads()
            sScan[tidx] = n_chunks
            cute.arch.sync_threads()
            # inclusive Hillis-Steele scan over the 128 counts
            for step in range_constexpr(7):
                d = 1 << step
                add = Int32(0)
                if tidx >= d:
                    add = sScan[tidx - d]
                cute.arch.sync_threads()
                sScan[tidx] = sScan[tidx] + add
                cute.arch.sync_threads()
            ends = carried + sScan[tidx]
            first = ends - n_chunks
            if i < n_seq:
                if c >= first:
                    if c < ends:
                        sWhere[0] = i
                        begin = lo + (c - first) * CHUNK
                        sWhere[1] = begin
                        sWhere[2] = cutlass.min(hi - begin, CHUNK)
            carried = carried + sScan[THREADS - 1]

    @cute.jit
    def load_keys(self, mK: cute.Tensor, mKd: cute.Tensor, sK: cute.Tensor, sGc: cute.Tensor, start: Int32,
                  count: Int32, c: Int32, h: Int32, hk: Int32, tidx: Int32):
        """k's rows in 16-byte segments (a warp reads whole rows: coalesced), zeros past the chunk's end; the
        row's L2 norm over the lanes that hold it (shuffles); k into shared memory, kd to the scratch."""
        K = self.K
        segs = K // _SEG
        rows_per_pass = THREADS // segs
        seg = tidx % segs
        gK = mK[None, hk, None]
        gKd = mKd[c, h, None, None]
        raw = cute.make_rmem_tensor((1, _SEG), self.io)
        out = cute.make_rmem_tensor((1, _SEG), mKd.element_type)
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            if row < count:
                cute.autovec_copy(cute.local_tile(gK, (1, _SEG), (start + row, seg)), raw)
            else:
                raw.fill(0.0)
            x = raw.load().to(Float32)
            if const_expr(self.use_l2):
                ss = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                for lane in range_constexpr(segs.bit_length() - 1):
                    ss = ss + cute.arch.shuffle_sync_bfly(ss, 1 << lane)
                inv = cutlass.select_(ss > Float32(0.0), cute.math.rsqrt(ss), Float32(0.0))
                x = x * inv
            raw.store(x.to(self.io))
            cute.autovec_copy(raw, cute.local_tile(sK, (1, _SEG), (row, seg)))
            out.store((x * cute.math.exp(sGc[CHUNK - 1] - sGc[row])).to(mKd.element_type))
            cute.autovec_copy(out, cute.local_tile(gKd, (1, _SEG), (row, seg)))

    @cute.jit
    def load_values(self, mV: cute.Tensor, sV: cute.Tensor, start: Int32, count: Int32, h: Int32, tidx: Int32):
        """v's rows into shared memory as load_keys reads k."""
        segs = self.V // _SEG
        rows_per_pass = THREADS // segs
        seg = tidx % segs
        gV = mV[None, h, None]
        raw = cute.make_rmem_tensor((1, _SEG), self.io)
        for p in range_constexpr(CHUNK // rows_per_pass):
            row = tidx // segs + p * rows_per_pass
            if row < count:
                cute.autovec_copy(cute.local_tile(gV, (1, _SEG), (start + row, seg)), raw)
            else:
                raw.fill(0.0)
            cute.autovec_copy(raw, cute.local_tile(sV, (1, _SEG), (row, seg)))

    @cute.jit
    def form_a(self, tiled_mma: cute.TiledMma, sK: cute.Tensor, sA: cute.Tensor, sGc: cute.Tensor,
               sBeta: cute.Tensor, tidx: Int32):
        thr = tiled_mma.get_slice(tidx)
        tA = thr.partition_A(sK)
        tB = thr.partition_B(sK)
        acc = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, CHUNK)), Float32)
        acc.fill(0.0)
        rA = tiled_mma.make_fragment_A(tA[None, None, 0])
        rB = tiled_mma.make_fragment_B(tB[None, None, 0])
        for kb in range_constexpr(cute.size(tA, mode=[2])):
            cute.autovec_copy(tA[None, None, kb], rA)
            cute.autovec_copy(tB[None, None, kb], rB)
            cute.gemm(tiled_mma, acc, rA, rB, acc)
        coords = thr.partition_C(cute.make_identity_tensor((CHUNK, CHUNK)))
        for e in range_constexpr(cute.size(acc)):
            t, i = coords[e]
            val = Float32(0.0)
            if i < t:
                val = acc[e] * sBeta[t] * cute.math.exp(sGc[t] - sGc[i])
            sA[t, i] = val

    @cute.jit
    def invert_column(self, sA: cute.Tensor, sTw: cute.Tensor, sTu: cute.Tensor, sGc: cute.Tensor,
                      sBeta: cute.Tensor, tidx: Int32):
        """Column ``tidx`` (threads 0-63) of T = (I + A)^-1 by forward substitution: T[r] = -sum_{j<r}
        A[r, j] T[j] below the diagonal, 1 on it, 0 above (the sum is zero there already: T[j] = 0 for
        j < col). Every thread reaches the barrier between A's last read and T's writes over it."""
        tcol = cute.make_rmem_tensor((CHUNK,), Float32)
        if tidx < CHUNK:
            for r in range_constexpr(CHUNK):
                acc = Float32(0.0)
                for j in range_constexpr(r):
                    acc = acc - sA[r, j] * tcol[j]
                tcol[r] = cutlass.select_(r == tidx, Float32(1.0), acc)
        cute.arch.sync_threads()
        if tidx < CHUNK:
            scale_u = sBeta[tidx]
            scale_w = scale_u * cute.math.exp(sGc[tidx])
            for r in range_constexpr(CHUNK):
                sTw[r, tidx] = (tcol[r] * scale_w).to(self.io)
                sTu[r, tidx] = (tcol[r] * scale_u).to(self.io)

    @cute.jit
    def product_out(self, tiled_mma: cute.TiledMma, sT: cute.Tensor, sX: cute.Tensor, mOut: cute.Tensor,
                    c: Int32, h: Int32, width: cutlass.Constexpr, tidx: Int32):
        """mOut[c, h] = sT (64 x 64) @ sX (64 x width), X read transposed as the MMA's K-major B. The
        product is staged in sX's place (X is dead once every warp has its share) and stored in 16-byte
        row segments (coalesced; the accumulators' own layout would write 4 bytes a lane)."""
        thr = tiled_mma.get_slice(tidx)
        xt = cute.make_tensor(sX.iterator, cute.make_layout((width, CHUNK), stride=(1, self._row_width)))
        tA = thr.partition_A(sT)
        tB = thr.partition_B(xt)
        acc = cute.make_rmem_tensor(thr.partition_shape_C((CHUNK, width)), Float32)
        acc.fill(0.0)
        rA = tiled_mma.make_fragment_A(tA[None, None, 0])
        rB = tiled_mma.make_fragment_B(tB[None, None, 0])
        for kb in range_constexpr(cute.size(tA, mode=[2])):
            cute.autovec_copy(tA[None, None, kb], rA)
            cute.autovec_copy(tB[None, None, kb], rB)
            cute.gemm(tiled_mma, acc, rA, rB, acc)
        out = cute.make_rmem_tensor(acc.shape, mOut.element_type)
        out.store(acc.load().to(mOut.element_type))
        gOut = mOut[c, h, None, None]
        if const_expr(mOut.element_type.width != self.io.width):
            cute.autovec_copy(out, thr.partition_C(gOut))     # f32 scratch: twice X's room, stored as it is
        else:
            stage = cute.make_tensor(cute.recast_ptr(sX.iterator, dtype=mOut.element_type),
                                     cute.make_layout((CHUNK, width), stride=(self._row_width, 1)))
            cute.arch.sync_threads()
            cute.autovec_copy(out, thr.partition_C(stage))
            cute.arch.sync_threads()
            segs = width // _SEG
            rows_per_pass = THREADS // segs
            seg = tidx % segs
            for p in range_constexpr(CHUNK // rows_per_pass):
                row = tidx // segs + p * rows_per_pass
                cute.autovec_copy(cute.local_tile(stage, (1, _SEG), (row, seg)),
                                  cute.local_tile(gOut, (1, _SEG), (row, seg)))


_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


def compile_prepare(io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int, HQ: int,
                    H: int, use_l2: bool):
    """Compile one specialisation (CUTE_DSL_ARCH / the current GPU decides the target); the result is
    called with DSL pointers and sizes (``DeltaPrepare.__call__``'s arguments)."""
    kernel = DeltaPrepare(io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2)
    ptrs = [_pointer(d, 4096, a) for d, a in _pointer_types(io_dtype, g_dtype, beta_dtype, scratch_dtype)]
    with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="cudnn_graph_cute_") as dump:
        # the register-resident loops are unrolled at trace time on purpose (static register indices)
        warnings.filterwarnings("ignore", message="This static loop has")
        # the cubin is kept (``__cubin__``) for the C launch path; the DSL's copy on disk goes with ``dump``
        compiled = cute.compile(kernel, *ptrs, Int32(64), Int32(1), Int32(1), cuda.CUstream(0),
                                options=f"--keep-cubin --dump-dir {dump}")
    return compiled, kernel.shared_bytes()


def _pointer_types(io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str) -> tuple:
    """(element type, assumed address alignment) of each pointer argument, in order: k, v, g, beta,
    cu_seqlens, w, u, g_out, kd. The row-major tiles (rows of K or V elements) are assumed 16-byte aligned,
    the per-token vectors element-aligned."""
    return ((io_dtype, 16), (io_dtype, 16), (g_dtype, _ITEMSIZE[g_dtype]), (beta_dtype, _ITEMSIZE[beta_dtype]),
            ("int32", 4), (scratch_dtype, 16), (scratch_dtype, 16), ("float32", 4), (scratch_dtype, 16))


def _pointer(dtype: str, address: int, align: int):
    cdt = cutlass.Int32 if dtype == "int32" else _DTYPES[dtype]
    return make_ptr(cdt, address, cute.AddressSpace.gmem, assumed_align=align)


class PrepareLauncher:
    """A compiled specialisation and the checks that its launch is valid for the buffers at hand:
    ``launcher(stream, k, v, g, beta, cu, w, u, g_out, kd)`` with Slots (the engine's operands and
    workspace regions) launches and returns True, or returns False without launching when a buffer is not
    packed row-major or not aligned as the kernel assumes (the caller runs its cuTile kernel instead)."""

    dsl_launch = True

    def __init__(self, io_dtype: str, g_dtype: str, beta_dtype: str, scratch_dtype: str, K: int, V: int, HQ: int,
                 H: int, use_l2: bool, n_seq: int):
        self._key = (io_dtype, g_dtype, beta_dtype, scratch_dtype, K, V, HQ, H, use_l2)
        self._types = _pointer_types(io_dtype, g_dtype, beta_dtype, scratch_dtype)
        self.n_seq = n_seq
        self._compiled = None
        self._shared_bytes = 0
        self._streams = {}

    def compile(self) -> None:
        if self._compiled is None:
            self._compiled, self._shared_bytes = _compiled(self._key)

    def cubin(self) -> tuple:
        """(cubin, block, dynamic shared bytes) of the kernel, for a launch from C: its parameters are the
        nine addresses of ``__call__`` then tokens, chunks and sequences as int32."""
        self.compile()
        cubin = self._compiled.__cubin__
        if not cubin:
            raise RuntimeError("the CuTe DSL kept no cubin of the chunk_prepare kernel")
        return bytes(cubin), (THREADS, 1, 1), self._shared_bytes

    def usable(self, slots) -> bool:
        """Whether every slot is packed row-major and aligned as the kernel assumes."""
        for slot, (_, align) in zip(slots, self._types):
            if slot.data_ptr % align:
                return False
            expected, step = [], 1
            for extent in reversed(slot.shape):
                expected.append(step)
                step *= extent
            if tuple(slot.strides) != tuple(reversed(expected)) and slot.numel > 1:
                return False
        return True

    def __call__(self, stream: int, slots, chunks: int) -> bool:
        if not self.usable(slots):
            return False
        self.compile()
        handle = self._streams.get(stream)
        if handle is None:
            handle = self._streams[stream] = cuda.CUstream(stream)
        tokens = slots[0].shape[0]
        self._compiled(*[_pointer(d, s.data_ptr, a) for (d, a), s in zip(self._types, slots)], Int32(tokens),
                       Int32(chunks), Int32(self.n_seq), handle)
        return True


_COMPILED = {}


def _compiled(key):
    """(compiled kernel, its dynamic shared bytes), one compile per specialisation per process (sizes are
    runtime arguments)."""
    found = _COMPILED.get(key)
    if found is None:
        found = _COMPILED[key] = compile_prepare(*key)
    return found
