"""The CuTe DSL chunk_bwd_grads for gdn_bwd and kda_bwd (engines/cute/_delta_bwd_grads and
_delta_bwd_grads_per_channel), on the CPU: its specialisations (a per-token and a per-channel gate) compile for
sm_90a with the parameters the cuTile plan's C launch path writes (eighteen addresses, then tokens, chunks and
sequences as int32), a block of four warps and the shared memory two CTAs an SM can hold, for BF16 and FP16 inputs
(FP16's four score products in BF16: the split decays overflow FP16). Both also compile in eight-warp CTAs at 128
registers a thread (two CTAs an SM) with a small stack frame, the accumulator places the epilogues use are the MMA
partition's for four and eight warps, and a key block's plain copies arrive by cp.async."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

pytest.importorskip("cudnn_graph")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("cuda.tile", reason="cuda-tile is not installed (the cubin reader is the cuTile engine's)")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cudnn_graph.engines.cute import _delta_bwd_grads, _delta_bwd_grads_per_channel  # noqa: E402
from cubin_tables import addresses_then_three_sizes, largest_frame, parameters, registers  # noqa: E402


# (K, V, L2 norm, dq / dk type): the ports in the input type, or f32 shares for grouped value heads
@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("K, V, use_l2, dq", [(128, 128, True, "bfloat16"), (64, 64, False, "float32"),
                                              (128, 64, True, "float32"), (64, 128, False, "bfloat16")])
def test_the_kernel_compiles_with_the_parameters_the_c_path_writes(K, V, use_l2, dq, per_channel):
    launcher = _delta_bwd_grads.bwd_grads_launcher("bfloat16", "float32", "bfloat16", dq, "float32", "bfloat16", K, V,
                                                   2, 4, use_l2, K ** -0.5, 3, per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(18)
    assert block == (128, 1, 1) and 0 < shared <= 113 * 1024


# FP16 inputs, four and eight warps, f32 and 16-bit scratch: the split operands, dm and dA in BF16 over the same
# 16-bit shared buffers, so the same shared memory as BF16's (and eight warps within 128 registers)
@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("warps, scratch", [(4, "float32"), (8, "float16")])
def test_the_float16_kernel_takes_its_score_products_in_bf16(per_channel, warps, scratch):
    launcher = _delta_bwd_grads.bwd_grads_launcher("float16", "float32", "float16", "float16", "float32", "float16",
                                                   128, 128, 2, 4, True, 128 ** -0.5, 3, scratch, own_dtype=scratch,
                                                   warps=warps, per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(18)
    assert block == (32 * warps, 1, 1) and 0 < shared <= 113 * 1024
    bf16 = _delta_bwd_grads.bwd_grads_launcher("bfloat16", "float32", "bfloat16", "bfloat16", "float32", "bfloat16",
                                               128, 128, 2, 4, True, 128 ** -0.5, 3,
                                               "bfloat16" if scratch != "float32" else scratch,
                                               own_dtype="bfloat16" if scratch != "float32" else scratch,
                                               warps=warps, per_channel=per_channel)
    assert shared == bf16.cubin()[2]
    if warps == 8:
        assert registers(cubin) <= 128 and largest_frame(cubin) <= 256


def test_scalar_operands_are_aligned_to_their_own_size():
    types = _delta_bwd_grads._pointer_types("bfloat16", "bfloat16", "float32", "float32", "float32", "float32")
    assert types[2] == ("bfloat16", 2) and types[3] == ("float32", 4) and types[16:] == (("float32", 4),
                                                                                        ("float32", 4))


def test_the_scratch_it_reads_and_the_pre_norm_gradients_follow_their_scratch_types():
    types = ("bfloat16", "float32", "bfloat16", "bfloat16", "float32", "bfloat16")
    recompute, own = (6, 8), (7, 9, 10, 12, 13)     # hs, d; dhs, dCg, dA, dq / dk before the norm
    f32 = _delta_bwd_grads._pointer_types(*types)
    io = _delta_bwd_grads._pointer_types(*types, "bfloat16")
    io_all = _delta_bwd_grads._pointer_types(*types, "bfloat16", own_dtype="bfloat16")
    assert all(f32[i] == ("float32", 16) for i in recompute + own)
    assert all(io[i] == ("bfloat16", 16) for i in recompute) and all(io[i] == ("float32", 16) for i in own)
    assert all(io_all[i] == ("bfloat16", 16) for i in recompute + own)
    assert io_all[11] == ("float32", 4)     # dbeta's v part


def test_a_per_channel_gate_is_read_in_16_byte_segments():
    types = _delta_bwd_grads._pointer_types("bfloat16", "float32", "bfloat16", "bfloat16", "float32", "bfloat16",
                                            per_channel=True)
    assert types[2] == ("float32", 16)


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("K, V, use_l2, dq, scratch", [(128, 128, True, "bfloat16", "bfloat16"),
                                                       (64, 64, False, "float32", "float32"),
                                                       (128, 64, True, "float32", "bfloat16")])
def test_the_kernel_compiles_in_eight_warps_at_128_registers(K, V, use_l2, dq, scratch, per_channel):
    # grads_warps=8: warps w and w + 4 share the rows of every 64 x 64 product (the columns split between them),
    # so the row sums meet in shared memory; the launch asks for two CTAs an SM, which caps the registers
    launcher = _delta_bwd_grads.bwd_grads_launcher("bfloat16", "float32", "bfloat16", dq, "float32", "bfloat16", K, V,
                                                   2, 4, use_l2, K ** -0.5, 3, scratch, own_dtype=scratch, warps=8,
                                                   per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(18)
    assert block == (256, 1, 1) and 0 < shared <= 113 * 1024
    assert registers(cubin) <= 128
    # a few spilled words (sm_90a, K = V = 128, io_all: 48 bytes per token, 160 per channel)
    assert largest_frame(cubin) <= 256


def test_a_block_takes_four_or_eight_warps():
    with pytest.raises(ValueError, match=r"warps = 6; expected one of \(4, 8\)"):
        _delta_bwd_grads_per_channel.DeltaBwdGradsPerChannel("bfloat16", "float32", "bfloat16", "bfloat16", "float32",
                                                             "bfloat16", 64, 64, 2, 4, False, 0.125, warps=6)


_MISMATCHES = []      # (thread, element, the partition's coordinates, place's), filled at trace time


@cute.jit
def _compare_places(kern: cutlass.Constexpr):
    tiled_mma = kern.warp_mma()
    for tidx in cutlass.range_constexpr(kern.threads):
        coords = tiled_mma.get_slice(tidx).partition_C(cute.make_identity_tensor((64, 64)))
        row0, col0 = kern.first_place(tidx)
        for e in cutlass.range_constexpr(cute.size(coords)):
            want = (int(coords[e][0]), int(coords[e][1]))
            got = tuple(int(x) for x in kern.place(e, row0, col0))
            if cutlass.const_expr(want != got):
                _MISMATCHES.append((tidx, e, want, got))


@pytest.mark.filterwarnings("ignore:This static loop has")     # unrolled at trace time on purpose
@pytest.mark.parametrize("warps", [4, 8])
def test_place_names_the_accumulator_coordinates_the_mma_partition_gives(warps):
    # the epilogues index shared memory by ChunkKernel.first_place / place instead of the MMA's own partition of
    # an identity tensor; both are evaluated at trace time here, for every thread of the block
    kernel = _delta_bwd_grads.DeltaBwdGrads("bfloat16", "float32", "bfloat16", "bfloat16", "float32", "bfloat16",
                                            64, 64, 2, 4, False, 0.125, warps=warps)
    _MISMATCHES.clear()
    _compare_places(kernel)
    assert not _MISMATCHES, _MISMATCHES[:4]


class _Scratch:
    """A stand-in for the pre-norm scratch tensor: what ``holds_last_block`` reads of it."""

    def __init__(self, element_type):
        self.element_type = element_type


@pytest.mark.parametrize("scratch, use_l2, held, holds", [(cutlass.BFloat16, True, "smem", True),
                                                          (cutlass.Float32, True, "smem", False),
                                                          (cutlass.BFloat16, False, "smem", False),
                                                          (cutlass.BFloat16, True, None, False)])
def test_the_last_key_block_waits_for_the_norm_in_shared_memory_only_where_the_rounding_is_the_same(
        scratch, use_l2, held, holds):
    # in shared memory the block is rounded to the input type: the same bits as a 16-bit scratch gives, not an
    # f32 one's; without L2 norm dq and dk leave for their rows directly
    kernel = _delta_bwd_grads.DeltaBwdGrads("bfloat16", "float32", "bfloat16", "bfloat16", "float32", "bfloat16",
                                            128, 128, 2, 4, use_l2, 0.125, warps=8)
    assert kernel.holds_last_block(_Scratch(scratch), held) is holds


@pytest.mark.filterwarnings("ignore:This static loop has")     # unrolled at trace time on purpose
@pytest.mark.parametrize("per_channel, scratch, copies", [
    # kda: S0's key rows at two places (the first block's, the next block's before the gate gradients), dO's at
    # the second only (the first block's are in place), D's rows once: 64 rows x 16 segments over 256 threads,
    # 4 copies a thread each
    (True, "bfloat16", 4 * 4),
    (True, "float32", 4),           # from f32 scratch S0 and D are rounded on the way: dO's rows alone
    (False, "bfloat16", 2 * 4),     # gdn: S0's and dS1's key rows
    (False, "float32", 0)], ids=["kda-io_all", "kda-f32", "gdn-io_all", "gdn-f32"])
def test_a_key_blocks_plain_copies_arrive_by_cp_async_in_16_bytes(tmp_path, per_channel, scratch, copies):
    # rows that need no arithmetic on the way take no registers and are in flight with the block's other loads
    # (each row loaded and stored in turn, the block's loads held an eighth of kda's stall samples: ncu, H100)
    import cuda.bindings.driver as cuda
    from cudnn_graph.engines.cute._delta_chunk import pointer
    kernel_type = (_delta_bwd_grads_per_channel.DeltaBwdGradsPerChannel if per_channel
                   else _delta_bwd_grads.DeltaBwdGrads)
    kernel = kernel_type("bfloat16", "float32", "bfloat16", "bfloat16", "float32", "bfloat16", 128, 128, 2, 4, True,
                         0.125, warps=8)
    types = _delta_bwd_grads._pointer_types("bfloat16", "float32", "bfloat16", "bfloat16", "float32", "bfloat16",
                                            scratch, per_channel, scratch)
    cute.compile(kernel, *[pointer(dtype, 4096, align) for dtype, align in types], cutlass.Int32(64),
                 cutlass.Int32(1), cutlass.Int32(1), cuda.CUstream(0), options=f"--keep-ptx --dump-dir {tmp_path}")
    (ptx,) = tmp_path.glob("*.ptx")
    found = [line for line in ptx.read_text().splitlines() if "cp.async.cg.shared.global" in line]
    assert len(found) == copies
    assert all(line.rstrip().endswith(", 16, 16;") for line in found)
