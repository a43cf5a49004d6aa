"""The CuTe DSL chunk_prepare for gdn and kda (engines/cute/_delta_prepare), on the CPU: its specialisations compile
for sm_90a (CUTE_DSL_ARCH names the target: no GPU needed), and the cuTile plan's C launch path gets a
record for it that matches the cubin: nine addresses then three int32 sizes, its block and its dynamic
shared memory (at most 48 KB: the C path sets no opt-in attribute). The kernel's results against the
reference engine are tests/engines/cutile/test_cutile_cute_kernels.py's (H200). kda's plans with it have no
gates launch (the kernel forms the gate sums), and its cuTile stand-in runs chunk_gates first.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

pytest.importorskip("cudnn_graph")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("cuda.tile", reason="cuda-tile is not installed (the C launch record is the cuTile plan's)")

from cudnn_graph.engines.cute import _delta_prepare  # noqa: E402
from cudnn_graph.engines.cutile import _c_launch, _cute_launch  # noqa: E402
from cubin_tables import addresses_then_three_sizes, kernel_table, largest_frame, parameters  # noqa: E402
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
    assert 0 < shared <= 48 * 1024


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
    launcher = _delta_prepare.prepare_scores_launcher(io, "float32", io, io, K, V, 2, 4, True, K ** -0.5, 3)
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
    launcher = _delta_prepare.prepare_scores_inverse_launcher(io, "float32", io, io, K, V, 2, 4, True, K ** -0.5, 3)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(13)
    scores = _delta_prepare.prepare_scores_launcher(io, "float32", io, io, K, V, 2, 4, True, K ** -0.5, 3)
    assert block == (128, 1, 1) and shared == scores.cubin()[2]
    assert largest_frame(cubin) == 0
