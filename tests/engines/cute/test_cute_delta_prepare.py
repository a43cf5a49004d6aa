"""The CuTe DSL chunk_prepare for gdn and kda (engines/cute/_delta_prepare), on the CPU: its specialisations compile
for sm_90a (CUTE_DSL_ARCH names the target: no GPU needed), and the cuTile plan's C launch path gets a
record for it that matches the cubin: nine addresses then three int32 sizes, its block and its dynamic
shared memory (the plain prepare's at most 48 KB; past that the C paths opt in at load). The kernel's results
against the reference engine are tests/engines/cutile/test_cutile_cute_kernels.py's (H200). kda's plans with it
have no gates launch (the kernel forms the gate sums), and its cuTile stand-in runs chunk_gates first. On an
sm_90 GPU: gdn's prefetching prepares give the round-trip kernels' bytes in every output region.
"""
from __future__ import annotations

import itertools
import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

pytest.importorskip("cudnn_graph")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("cuda.tile", reason="cuda-tile is not installed (the C launch record is the cuTile plan's)")

from cudnn_graph.engines.cute import _delta_prepare  # noqa: E402
from cudnn_graph.engines.cutile import _c_launch, _cute_launch  # noqa: E402
from cubin_tables import addresses_then_three_sizes, kernel_table, largest_frame, parameters, registers  # noqa: E402
from cudnn_graph.engines.cutile import engine as cutile_engine  # noqa: E402
from cudnn_graph.engines.cutile._variants import Variant  # noqa: E402

# (io, scratch, K, V, key heads, value heads): BF16 at the benchmark's head dims; FP16 with grouped value
# heads, a wider V than K and f32 scratch (the products stored unstaged).
CASES = [("bfloat16", "bfloat16", 128, 128, 16, 16), ("float16", "float32", 64, 128, 2, 4)]


def _variant(io, scratch, K, V, n_seq=3):
    return Variant(op="gdn", io_dtype=io, beta_dtype=io, w_dtype=io, K=K, V=V, block_v=32, n_seq=n_seq,
                   scale=K ** -0.5, use_l2=True, has_h0=False, store_ht=False, scratch_dtype=scratch,
                   prepare="cute")


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("io, scratch, K, V, HQ, H", CASES)
def test_the_kernel_compiles_with_the_parameters_the_c_path_writes(io, scratch, K, V, HQ, H, per_channel):
    launcher = _delta_prepare.prepare_launcher(io, "float32", io, scratch, K, V, HQ, H, True, 3,
                                               per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(9)
    assert block == (128, 1, 1) and kernel_table(cubin).block in (None, block)
    # gdn's prefetching form holds v in a buffer of its own: past the 48 KB a launch gets without opting in
    assert 0 < shared <= (56 if _delta_prepare.PREFETCH and not per_channel else 48) * 1024


def _refs(io, scratch, K, V, HQ, H, T=300, k_strides=None):
    op = _c_launch.OperandRef
    region = _c_launch.RegionRef
    chunks = -(-T // 64) + 3
    k = op(1, "k", io, (T, HQ, K), k_strides or (HQ * K, K, 1))
    return (k, op(2, "v", io, (T, H, V), (H * V, V, 1)), op(3, "g", "float32", (T, H), (H, 1)),
            op(4, "beta", io, (T, H), (H, 1)), k, op(5, "cu_seqlens", "int32", (4,), (1,)),
            region("w", 256, scratch, (chunks, H, 64, K)), region("u", 4096, scratch, (chunks, H, 64, V)),
            region("g", 8192, "float32", (T, H)), region("kd", 65536, scratch, (chunks, H, 64, K))), chunks


def _c_record(io, scratch, K, V, HQ, H, **kw):
    args, chunks = _refs(io, scratch, K, V, HQ, H, **kw)
    geometry = type("G", (), {"HQ": HQ, "H": H, "T": 300, "chunks": chunks})()
    launch = _cute_launch.CuteLaunch.prepare(_variant(io, scratch, K, V), geometry, fallback=None)
    index = {}
    return launch.c_launch("prepare", (chunks, H, 1), args, lambda ref: index.setdefault(ref.uid, len(index))), chunks


def test_the_c_launch_record_patches_each_address_and_writes_the_sizes():
    import struct
    record, chunks = _c_record("bfloat16", "bfloat16", 128, 128, 16, 16)
    assert record.grid == (chunks, 16, 1) and record.block == (128, 1, 1) and record.shared_bytes > 0
    # k, v, g, beta and cu_seqlens are operands 0-4; w, u, g_out and kd are workspace offsets
    assert record.patches == [(0, 0, 0), (8, 1, 0), (16, 2, 0), (24, 3, 0), (32, 4, 0), (40, -1, 256),
                              (48, -1, 4096), (56, -1, 8192), (64, -1, 65536)]
    assert struct.unpack_from("<iii", record.image, 72) == (300, chunks, 3)


def test_a_key_tensor_that_is_not_packed_keeps_the_python_launch_path():
    with pytest.raises(_c_launch.Unsupported, match="tensor 'k' has strides .* packed row-major"):
        _c_record("bfloat16", "bfloat16", 64, 64, 2, 2, k_strides=(2 * 64 + 8, 64, 1))


def _slot(address, shape, strides=None):
    import types
    if strides is None:
        strides, step = [], 1
        for extent in reversed(shape):
            strides.insert(0, step)
            step *= extent
    numel = 1
    for extent in shape:
        numel *= extent
    return types.SimpleNamespace(data_ptr=address, shape=tuple(shape), strides=tuple(strides), numel=numel)


def _slots(k_address=4096, k_strides=None, g_address=8192):
    T, HQ, H, K, chunks = 100, 2, 2, 64, 5
    return [_slot(k_address, (T, HQ, K), k_strides), _slot(4096, (T, H, K)), _slot(g_address, (T, H)),
            _slot(4096, (T, H)), _slot(4096, (4,)), _slot(4096, (chunks, H, 64, K)), _slot(4096, (chunks, H, 64, K)),
            _slot(4096, (T, H)), _slot(4096, (chunks, H, 64, K))]


def test_buffers_the_kernel_cannot_take_send_the_call_to_the_cutile_kernel():
    # usable() False: CuteLaunch launches the cuTile chunk_prepare instead (nothing is compiled to ask)
    launcher = _delta_prepare.prepare_launcher("bfloat16", "float32", "bfloat16", "bfloat16", 64, 64, 2, 2, True, 3)
    assert launcher.usable(_slots())
    assert launcher.usable(_slots(g_address=4100))                   # f32 gates need 4-byte alignment only
    assert not launcher.usable(_slots(k_address=4104))               # k rows are read in 16-byte segments
    assert not launcher.usable(_slots(k_strides=(2 * 64 + 8, 64, 1)))  # padded rows: not packed


def test_a_kernel_that_does_not_compile_sends_every_call_to_the_cutile_kernel(caplog):
    from cudnn_graph.engines.cute import _delta_chunk

    def broken():
        raise RuntimeError("no such MLIR pass")

    launcher = _delta_chunk.KernelLauncher(broken, ("chunk_prepare", "broken"),
                                           _delta_prepare._pointer_types("bfloat16", "float32", "bfloat16", "bfloat16"), 3)
    with caplog.at_level("WARNING"):
        assert launcher(0, _slots(), 100, 5) is False
        assert launcher(0, _slots(), 100, 5) is False
    assert [r.getMessage() for r in caplog.records].count(
        "the CuTe chunk_prepare kernel did not compile (RuntimeError: no such MLIR pass); its cuTile kernel runs "
        "instead") == 1
    with pytest.raises(RuntimeError, match="did not compile: RuntimeError: no such MLIR pass"):
        launcher.cubin()


def _kda_variant(prepare):
    return Variant(op="kda", io_dtype="bfloat16", beta_dtype="bfloat16", w_dtype="bfloat16", K=64, V=64, block_v=32,
                   n_seq=3, scale=0.125, use_l2=True, has_h0=False, store_ht=False, scratch_dtype="bfloat16",
                   prepare=prepare)


def test_kda_plans_with_the_cute_prepare_have_no_gates_launch():
    # the CuTe kernel forms the per-channel gate sums itself; the cuTile prepare reads chunk_gates' output
    import types
    geometry = types.SimpleNamespace(chunks=5, H=2, HQ=2, K=64)
    scratch = {"g": "g_out"}
    for prepare, names in (("cute", []), ("cutile", ["gates"])):
        plan = types.SimpleNamespace(variant=_kda_variant(prepare), _geometry=geometry, _gates="chunk_gates")
        launches = cutile_engine.CutileForwardPlan._gate_launches(plan, "g", "cu", scratch)
        assert [launch[0] for launch in launches] == names


def test_the_kda_cute_prepare_falls_back_to_chunk_gates_then_the_cutile_prepare(monkeypatch):
    import types
    import cuda.tile as ct
    launched = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: launched.append((grid, kernel, args[:3])))
    geometry = types.SimpleNamespace(T=100, chunks=5, H=2, HQ=2, K=64)
    launch = _cute_launch.CuteLaunch.prepare(_kda_variant("cute"), geometry, fallback="cutile_prepare")
    launch._launcher = lambda stream, slots, tokens, chunks: False   # buffers the CuTe kernel does not take
    args = ("k", "v", "g", "beta", "wgate", "cu", "w", "u", "g_out", "kd")
    launch(0, (5, 2, 1), args)
    (gates_grid, gates_kernel, gates_args), (grid, kernel, first_args) = launched
    assert gates_grid[:2] == (5, 2) and gates_args == ("g", "cu", "g_out")
    assert gates_kernel is not None and (grid, kernel, first_args) == ((5, 2, 1), "cutile_prepare", ("k", "v", "g"))


@pytest.mark.parametrize("io, K, V", [("bfloat16", 128, 128), ("float16", 64, 64), ("bfloat16", 64, 128)])
def test_the_prepare_with_scores_compiles_with_twelve_addresses_in_the_prepares_shared_memory(io, K, V):
    # k, v, g, beta, cu_seqlens, w, u, g_out, kd, q, qg, attn; then tokens, chunks, sequences. q goes through
    # A's place: no more shared memory than the prepare's
    launcher = _delta_prepare.prepare_scores_launcher(io, "float32", io, io, K, V, 2, 4, True, K ** -0.5, 3,
                                                      prefetch=False)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(12)
    plain = _delta_prepare.DeltaPrepare(io, "float32", io, io, K, V, 2, 4, True)
    assert block == (128, 1, 1) and shared == plain.shared_bytes()
    # q (64 rows of K + 8, 16-bit) fits A's place (64 rows of 72 f32)
    assert 2 * 64 * (K + 8) <= 4 * 64 * 72


@pytest.mark.parametrize("io, K, V", [("bfloat16", 128, 128), ("float16", 64, 64)])
def test_the_forward_prepare_that_keeps_the_chunk_cache_takes_t_after_the_scores_in_the_same_shared_memory(io, K, V):
    # gdn's forward keeping its chunk_cache: the prepare with scores, T's address last (thirteen); T leaves from
    # the registers of the substitution, as the backward's prepare writes it: no shared memory of its own
    for prefetch in (False, True):
        launcher = _delta_prepare.prepare_scores_inverse_launcher(io, "float32", io, io, K, V, 2, 4, True, K ** -0.5, 3,
                                                                  prefetch=prefetch)
        cubin, block, shared = launcher.cubin()
        assert parameters(cubin) == addresses_then_three_sizes(13)
        scores = _delta_prepare.prepare_scores_launcher(io, "float32", io, io, K, V, 2, 4, True, K ** -0.5, 3,
                                                        prefetch=prefetch)
        assert block == (128, 1, 1) and shared == scores.cubin()[2]
        assert largest_frame(cubin) == 0


# an SM of an H100 / H200: 64 K registers and 228 KB of shared memory, 1 KB of it kept per CTA
SM_REGISTERS, SM_SHARED, CTA_RESERVED = 65536, 228 * 1024, 1024


@pytest.mark.parametrize("io, K, ctas", [("bfloat16", 128, 4), ("float16", 64, 5)])
def test_the_prefetching_prepare_keeps_the_round_trip_kernels_ctas_an_sm(io, K, ctas):
    # k, q and v issued at the chunk's start: v in a buffer of its own (q in A's place, k in its own), so the
    # shared memory grows by one 64-row buffer and the CTAs an SM stay what the registers allow, as before
    round_trip = _delta_prepare.prepare_scores_launcher(io, "float32", io, io, K, K, 16, 16, True, K ** -0.5, 3,
                                                        prefetch=False)
    launcher = _delta_prepare.prepare_scores_launcher(io, "float32", io, io, K, K, 16, 16, True, K ** -0.5, 3,
                                                      prefetch=True)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(12) and largest_frame(cubin) == 0
    assert shared == round_trip.cubin()[2] + 2 * 64 * (K + 8)
    per_thread = -(-registers(cubin) // 8) * 8               # registers are given out 8 a thread at a time
    assert SM_REGISTERS // (per_thread * block[0]) >= ctas
    assert SM_SHARED // (shared + CTA_RESERVED) >= ctas


def _device_slot(array):
    """``_slot`` over a CuPy array."""
    return _slot(array.data.ptr, array.shape, tuple(s // array.itemsize for s in array.strides))


def _prepare_outputs(launcher, inputs, lengths, H, K, V, io, kind):
    """Every output region of one launch of a gdn prepare (``kind``: "prepare", "scores" or "scores_inverse")
    over ``inputs`` (k, v, g, beta, cu, q), each filled with 0xFF bytes first, so that a region one kernel
    leaves alone and the other writes shows."""
    import cupy as cp
    tokens, chunks = sum(lengths), sum(-(-n // 64) for n in lengths)
    shapes = {"w": ((chunks, H, 64, K), io), "u": ((chunks, H, 64, V), io), "g_out": ((tokens, H), "float32"),
              "kd": ((chunks, H, 64, K), io)}
    if kind != "prepare":
        shapes.update(qg=((chunks, H, 64, K), io), attn=((chunks, H, 64, 64), io))
    if kind == "scores_inverse":
        shapes["T"] = ((chunks, H, 64, 64), io)
    outs = {}
    for name, (shape, dtype) in shapes.items():
        outs[name] = cp.empty(shape, dtype=cp.float16 if dtype == "bfloat16" else dtype)
        outs[name].view(cp.uint8).fill(0xFF)
    k, v, g, beta, cu, q = inputs
    order = [k, v, g, beta, cu, outs["w"], outs["u"], outs["g_out"], outs["kd"]]
    if kind != "prepare":
        order += [q, outs["qg"], outs["attn"]]
    if kind == "scores_inverse":
        order.append(outs["T"])
    assert launcher(cp.cuda.get_current_stream().ptr, [_device_slot(a) for a in order], tokens, chunks)
    cp.cuda.get_current_stream().synchronize()
    return {name: cp.asnumpy(a.view(cp.uint8)) for name, a in outs.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["prepare", "scores", "scores_inverse"])
@pytest.mark.parametrize("io, K, V, HQ, H", [("bfloat16", 128, 128, 4, 4), ("float16", 64, 64, 4, 4),
                                             ("bfloat16", 64, 128, 2, 4)])
def test_the_prefetching_prepare_gives_the_round_trip_kernels_bits(io, K, V, HQ, H, kind):
    # k, q and v by cp.async at the chunk's start (rows past a sequence's end stored as zeros, normalised in
    # place) against four global round trips: every output region byte for byte, over uneven sequences (one
    # token, a chunk's edge, a partial last chunk)
    cp = pytest.importorskip("cupy")
    if cp.cuda.runtime.getDeviceCount() == 0 or cp.cuda.Device(0).compute_capability != "90":
        pytest.skip("the CuTe kernels run on sm_90")
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    lengths = [1, 64, 65, 190, 300, 7]
    tokens = sum(lengths)
    rng = cp.random.default_rng(25)

    def io_array(shape):
        x = rng.standard_normal(shape, dtype=cp.float32)
        if io == "float16":
            return x.astype(cp.float16)
        return (x.view(cp.uint32) + 0x8000 >> 16).astype(cp.uint16).view(cp.float16)   # BF16 bits, by rounding

    k, q, v = io_array((tokens, HQ, K)), io_array((tokens, HQ, K)), io_array((tokens, H, V))
    g = -rng.uniform(0.0, 0.2, (tokens, H), dtype=cp.float32)
    beta = io_array((tokens, H))                # any finite values do: both kernels take the same ones
    cu = cp.asarray([0, *itertools.accumulate(lengths)], dtype=cp.int32)

    def launcher(prefetch):
        if kind == "prepare":
            return _delta_prepare.prepare_launcher(io, "float32", io, io, K, V, HQ, H, True, len(lengths),
                                                   prefetch=prefetch)
        make = getattr(_delta_prepare, f"prepare_{kind}_launcher")
        return make(io, "float32", io, io, K, V, HQ, H, True, K ** -0.5, len(lengths), prefetch=prefetch)

    results = [_prepare_outputs(launcher(prefetch), (k, v, g, beta, cu, q), lengths, H, K, V, io, kind)
               for prefetch in (False, True)]
    for name, round_trip in results[0].items():
        assert (results[1][name] == round_trip).all(), name


@pytest.mark.parametrize("K, V, per_channel, expected", [(128, 128, False, True), (64, 128, False, True),
                                                         (64, 64, False, False), (128, 128, True, False)])
def test_the_plain_prepare_prefetches_where_it_keeps_its_ctas_an_sm(monkeypatch, K, V, per_channel, expected):
    # gdn's plain prepare at K = V = 64 (six CTAs an SM by its registers) loses one to v's buffer and was slower
    # on the H100; kda's reads k with its gate sums; the prepare with the scores prefetches at every K
    monkeypatch.setattr(_delta_prepare, "PREFETCH", True)
    plain = _delta_prepare.prepare_launcher("bfloat16", "float32", "bfloat16", "bfloat16", K, V, 2, 2, True, 3,
                                            per_channel=per_channel)
    assert plain._make_kernel().prefetch is expected
    scores = _delta_prepare.prepare_scores_launcher("bfloat16", "float32", "bfloat16", "bfloat16", K, V, 2, 2, True,
                                                    K ** -0.5, 3)
    assert scores._make_kernel().prefetch is True
    monkeypatch.setattr(_delta_prepare, "PREFETCH", False)
    assert plain._make_kernel().prefetch is expected        # decided when the launcher was made
    with pytest.raises(ValueError, match="prefetch is gdn's"):
        _delta_prepare.DeltaPrepare("bfloat16", "float32", "bfloat16", "bfloat16", 64, 64, 2, 2, True,
                                    per_channel=True, prefetch=True)
