"""The CuTe DSL chunk_state_pass for gdn and kda (engines/cute/_delta_state), on the CPU: its specialisations compile for
sm_90a with the parameters the cuTile plan's C launch path writes (nine addresses, then tokens, chunks and
sequences as int32), a block of four warps (eight at BV = 64) and at most 48 KB of dynamic shared memory
(the split form more: its launch opts in)."""
from __future__ import annotations

import os
import warnings

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

pytest.importorskip("cudnn_graph")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("cuda.tile", reason="cuda-tile is not installed (the cubin reader is the cuTile engine's)")

from cudnn_graph.engines.cute import _delta_state  # noqa: E402
from cubin_tables import addresses_then_three_sizes, parameters  # noqa: E402


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("io, K, V, BV, states", [("bfloat16", 128, 128, 32, True), ("float16", 64, 128, 64, False),
                                                   ("bfloat16", 128, 128, 16, True)])
def test_the_kernel_compiles_with_the_parameters_the_c_path_writes(io, K, V, BV, states, per_channel):
    launcher = _delta_state.state_pass_launcher(io, K, V, BV, 4, states, states, 3, per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(9)
    assert block == ({16: 128, 32: 128, 64: 256}[BV], 1, 1) and 0 < shared <= 48 * 1024


def test_sixty_four_value_columns_take_eight_warps_and_put_kd_in_w_place():
    wide = _delta_state.DeltaStatePass("bfloat16", 128, 128, 64, 2, True, True)
    narrow = _delta_state.DeltaStatePass("bfloat16", 128, 128, 32, 2, True, True)
    assert (wide.threads, wide.kd_in_w) == (256, True) and (narrow.threads, narrow.kd_in_w) == (128, False)
    # without the shared buffer, K = 128 and BV = 64 would take W, KD (64 x 136 each) and S (128 x 72) in
    # BF16: over the 48 KB the C path launches with
    assert 2 * (2 * 64 * 136 + 128 * 72) > 48 * 1024 >= wide.shared_bytes()


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
def test_the_split_form_gives_kd_its_own_buffer_past_48_kb_at_k_128(per_channel):
    launcher = _delta_state.state_pass_launcher("bfloat16", 128, 128, 64, 4, True, True, 3, per_channel=per_channel,
                                                form="split")
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(9)
    # W, KD (64 x 136 each) and S (128 x 72) in BF16, plus the small fields: the launch opts in past 48 KB
    assert block == (256, 1, 1) and 2 * (2 * 64 * 136 + 128 * 72) < shared <= 56 * 1024 and shared > 48 * 1024
    assert not _delta_state.DeltaStatePassSplit("bfloat16", 128, 128, 64, 2, True, True).kd_in_w


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("io, K, V, BV", [("bfloat16", 128, 128, 64), ("float16", 64, 64, 64), ("bfloat16", 64, 128, 64),
                                          ("bfloat16", 64, 64, 32), ("bfloat16", 128, 128, 32)])
def test_the_fused_form_compiles_with_eleven_addresses_and_opts_in_past_48_kb(io, K, V, BV, per_channel):
    launcher = _delta_state.fused_state_pass_launcher(io, K, V, BV, 4, True, True, 3, per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    # kd, w, u, g, cu_seqlens, h0, qg, attn, ht, o, hs (written with store_hs alone); tokens, chunks, sequences
    assert parameters(cubin) == addresses_then_three_sizes(11)
    # W, KD, qg (64 x (K + 8) each), attn (64 x 72), S (K x (BV + 8)), D and o's staging (64 x (BV + 8) each)
    operands = 2 * (3 * 64 * (K + 8) + 64 * 72 + K * (BV + 8) + 2 * 64 * (BV + 8))
    assert block == (4 * BV, 1, 1) and operands < shared <= operands + 2048 and shared > 48 * 1024


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("K, V, BV", [(128, 128, 64), (64, 64, 32)])
def test_the_fused_form_that_stores_the_checkpoints_keeps_its_shared_memory(K, V, BV, per_channel):
    # store_hs (the forward's state_checkpoints): S leaves from the shared copy the products read, no new buffer
    def build(store_hs):
        return _delta_state.fused_state_pass_launcher("bfloat16", K, V, BV, 4, True, True, 3, per_channel=per_channel,
                                                      store_hs=store_hs).cubin()
    cubin, block, shared = build(True)
    plain = build(False)
    assert parameters(cubin) == addresses_then_three_sizes(11)
    assert block == plain[1] and shared == plain[2] and cubin != plain[0]


def test_the_fused_form_takes_thirty_two_or_sixty_four_value_columns():
    with pytest.raises(ValueError, match=r"BV in \(32, 64\), not 16"):
        _delta_state.DeltaStatePassFused("bfloat16", 128, 128, 16, 2, True, True)


def test_the_split_form_takes_sixty_four_value_columns():
    with pytest.raises(ValueError, match="BV = 64"):
        _delta_state.DeltaStatePassSplit("bfloat16", 128, 128, 32, 2, True, True)


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("io, K, V", [("bfloat16", 128, 128), ("float16", 64, 64)])
@pytest.mark.parametrize("form", ["resident", "warpgroup"])
def test_the_sixty_four_column_forms_compile_with_four_warps_under_48_kb(io, K, V, per_channel, form):
    launcher = _delta_state.state_pass_launcher(io, K, V, 64, 4, True, True, 3, per_channel=per_channel,
                                                form=form)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(9)
    assert block == (128, 1, 1) and 0 < shared <= 48 * 1024


def test_an_accumulator_fragment_read_as_the_a_fragment_holds_the_same_coordinates():
    """DeltaStatePassResident's products take S^T and D^T, accumulators of its MMA, as the A operand value for
    value (register_gemm): flat index f of a thread's accumulator fragment and of its A fragment must name the
    same (row, column), and each warp must own 16 rows (its staging block's columns)."""
    import cutlass.cute as cute
    from cutlass import range_constexpr
    kernel = _delta_state.DeltaStatePassResident("bfloat16", 128, 128, 64, 2, False, False)
    threads = (0, 5, 31, 32, 77, 127)
    seen = []

    @cute.jit
    def probe():
        mma = kernel.warp_mma()
        for i in range_constexpr(len(threads)):
            thr = mma.get_slice(threads[i])
            for j in range_constexpr(2):
                shape = ((64, 128), (64, 64))[j]
                c_at = thr.partition_C(cute.make_identity_tensor(shape))
                a_at = thr.partition_A(cute.make_identity_tensor(shape))
                for f in range_constexpr(cute.size(c_at)):
                    seen.append((threads[i], c_at[f], a_at[f]))

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This static loop has")   # unrolled at trace time on purpose
        cute.compile(probe)
    assert len(seen) == len(threads) * (64 + 32)
    for tidx, c, a in seen:
        c, a = tuple(int(x) for x in c), tuple(int(x) for x in a)
        assert c == a and 16 * (tidx // 32) <= c[0] < 16 * (tidx // 32) + 16, (tidx, c, a)


@pytest.mark.parametrize("K", [128, 64])
def test_a_wgmma_accumulator_read_as_the_next_a_operand_holds_the_same_coordinates(K):
    """DeltaStatePassWarpgroup's products take -S^T and D^T, accumulators of one WGMMA, as the register A
    operand of the next (_accumulator_as_a_operand): the register that A fragment position f reads must hold
    the (row, column) that position expects."""
    import cutlass.cute as cute
    from cutlass import range_constexpr
    kernel = _delta_state.DeltaStatePassWarpgroup("bfloat16", K, K, 64, 2, False, False)
    threads = (0, 5, 31, 32, 77, 127)
    seen = []

    @cute.jit
    def probe():
        mma_d, mma_s = kernel.products()
        for i in range_constexpr(len(threads)):
            # S^T (64 x K), mma_s's accumulator, as mma_d's A over K; D^T (64 x 64), mma_d's, as mma_s's A
            for acc_mma, a_mma, shape in ((mma_s, mma_d, (64, K)), (mma_d, mma_s, (64, 64))):
                c_at = acc_mma.get_slice(threads[i]).partition_C(cute.make_identity_tensor(shape))
                a_at = a_mma.get_slice(threads[i]).partition_A(cute.make_identity_tensor(shape))
                as_a = _delta_state._accumulator_as_a_operand(cute.make_layout(c_at.shape))
                for f in range_constexpr(cute.size(a_at)):
                    seen.append((threads[i], c_at[as_a(f)], a_at[f]))

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This static loop has")   # unrolled at trace time on purpose
        cute.compile(probe)
    assert len(seen) == len(threads) * (64 * K + 64 * 64) // 128
    for tidx, c, a in seen:
        c, a = tuple(int(x) for x in c), tuple(int(x) for x in a)
        assert c == a, (tidx, c, a)


def test_the_warpgroup_form_takes_sixty_four_value_columns():
    with pytest.raises(ValueError, match="warpgroup state pass takes BV = 64, not 32"):
        _delta_state.DeltaStatePassWarpgroup("bfloat16", 128, 128, 32, 2, False, False)


def test_the_resident_form_takes_sixty_four_value_columns():
    with pytest.raises(ValueError, match="resident state pass takes BV = 64, not 32"):
        _delta_state.DeltaStatePassResident("bfloat16", 128, 128, 32, 2, False, False)


def test_a_value_block_must_divide_v():
    with pytest.raises(ValueError, match="BV = 48 must divide V = 128"):
        _delta_state.DeltaStatePass("bfloat16", 128, 128, 48, 2, False, False)


def test_the_c_launch_record_writes_the_plan_sizes_not_the_grid():
    # the state pass's grid is (sequences, heads, V / BV); its kernel still takes tokens and the chunk bound
    import struct
    from cudnn_graph.engines.cutile import _c_launch
    from cudnn_graph.engines.cutile import _cute_launch
    from cudnn_graph.engines.cutile._variants import Variant
    T, H, K, V, N = 300, 2, 64, 64, 3
    chunks = -(-T // 64) + N
    variant = Variant(op="gdn", io_dtype="bfloat16", beta_dtype="bfloat16", w_dtype="bfloat16", K=K, V=V, block_v=32,
                      n_seq=N, scale=K ** -0.5, use_l2=True, has_h0=True, store_ht=True, scratch_dtype="bfloat16",
                      state_pass="cute")
    geometry = type("G", (), {"H": H, "T": T, "chunks": chunks})()
    launch = _cute_launch.CuteLaunch.state_pass(variant, geometry, fallback=None)
    op, region = _c_launch.OperandRef, _c_launch.RegionRef
    args = (region("kd", 256, "bfloat16", (chunks, H, 64, K)), region("w", 4096, "bfloat16", (chunks, H, 64, K)),
            region("u", 8192, "bfloat16", (chunks, H, 64, V)), region("g", 16384, "float32", (T, H)),
            op(1, "cu_seqlens", "int32", (N + 1,), (1,)), op(2, "initial_state", "float32", (N, H, K, V), (H * K * V, K * V, V, 1)),
            region("hs", 32768, "bfloat16", (chunks, H, K, V)), op(3, "final_state", "float32", (N, H, K, V), (H * K * V, K * V, V, 1)),
            region("d", 65536, "bfloat16", (chunks, H, 64, V)))
    index = {}
    record = launch.c_launch("state_pass", (N, H, V // 32), args, lambda ref: index.setdefault(ref.uid, len(index)))
    assert record.grid == (N, H, V // 32) and record.block == (128, 1, 1)
    assert struct.unpack_from("<iii", record.image, 72) == (T, chunks, N)
