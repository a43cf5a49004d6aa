"""The CuTe DSL chunk_bwd_values for gdn_bwd / kda_bwd (engines/cute/_delta_bwd_values) and the backward
prepare that leaves it T (``_delta_prepare.DeltaPrepareInverse``), on the CPU: their specialisations compile for
sm_90a with the parameters the cuTile plan's C launch path writes (the addresses, then tokens, chunks and
sequences as int32), a block of four warps (or eight: ``values_warps``), and the values kernel in the shared
memory two CTAs an SM hold; the prepare that does chunk_bwd_intra's work too (``DeltaPrepareInverseIntra``)."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

pytest.importorskip("cudnn_graph")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("cuda.tile", reason="cuda-tile is not installed (the cubin reader is the cuTile engine's)")

from cudnn_graph.engines.cute import _delta_bwd_values, _delta_prepare  # noqa: E402
from cubin_tables import addresses_then_three_sizes, largest_frame, parameters, registers  # noqa: E402


# (input type, beta's type, dv's type, K, V)
@pytest.mark.parametrize("io, beta, dv, K, V", [("bfloat16", "bfloat16", "bfloat16", 128, 128),
                                                ("bfloat16", "float32", "bfloat16", 64, 64),
                                                ("float16", "float16", "float16", 128, 64),
                                                ("bfloat16", "bfloat16", "float32", 64, 128)])
def test_the_values_kernel_compiles_with_the_parameters_the_c_path_writes(io, beta, dv, K, V):
    cubin, block, shared = _delta_bwd_values.bwd_values_launcher(io, beta, dv, K, V, 4, 3).cubin()
    # v, beta, cu_seqlens, hs, dd, w, u, dv, dCg, T, dA, dbeta's v part, d (written with deltas=True alone)
    assert parameters(cubin) == addresses_then_three_sizes(13)
    assert block == (128, 1, 1) and 0 < shared <= 113 * 1024


@pytest.mark.parametrize("K, V, scratch", [(128, 128, "bfloat16"), (128, 128, "float32"), (64, 128, "bfloat16"),
                                            (128, 64, "float32")])
def test_the_values_kernel_compiles_in_eight_warps_without_spilling(K, V, scratch):
    # values_warps=8: the second four warps along the columns of every product, dbeta's v part meeting in shared
    # memory; the launch asks for two CTAs an SM (128 registers), which the shared memory still allows
    launcher = _delta_bwd_values.bwd_values_launcher("bfloat16", "bfloat16", "bfloat16", K, V, 4, 3, scratch, scratch,
                                                     warps=8)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(13)
    assert block == (256, 1, 1) and 0 < shared <= 113 * 1024
    assert registers(cubin) <= 128 and largest_frame(cubin) == 0


@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("K, V, scratch", [(128, 128, "bfloat16"), (128, 128, "float32"), (64, 64, "bfloat16"),
                                            (128, 64, "bfloat16")])
def test_the_values_kernel_that_forms_the_deltas_keeps_its_shared_memory_and_does_not_spill(K, V, scratch, warps):
    # deltas=True (a backward from the forward's checkpoints): W takes v's (or dD's) place for D = U - W S0 first,
    # and on 16-bit scratch beta v takes U's for U = T (beta v), so the shared memory (two CTAs an SM at
    # K = V = 128) is the plain kernel's
    def build(deltas):
        return _delta_bwd_values.bwd_values_launcher("bfloat16", "bfloat16", "bfloat16", K, V, 4, 3, scratch, scratch,
                                                     warps=warps, deltas=deltas).cubin()
    cubin, block, shared = build(True)
    assert parameters(cubin) == addresses_then_three_sizes(13)
    assert block == (32 * warps, 1, 1) and shared == build(False)[2]
    # registers for two CTAs an SM too: 65536 over 256 threads (eight warps) or 128
    assert largest_frame(cubin) == 0 and registers(cubin) <= (128 if warps == 8 else 255)


def test_a_values_block_takes_four_or_eight_warps():
    with pytest.raises(ValueError, match=r"warps = 6; expected one of \(4, 8\)"):
        _delta_bwd_values.DeltaBwdValues("bfloat16", "bfloat16", "bfloat16", 64, 64, 4, warps=6)


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_prepare_that_leaves_t_takes_one_address_more_than_the_prepare(per_channel):
    launcher = _delta_prepare.prepare_inverse_launcher("bfloat16", "float32", "bfloat16", "float32", 128, 128, 2, 4,
                                                       True, 3, per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(10)
    # the forward's prepare that reads its rows in round trips (the backward's does: it never prefetches)
    plain = _delta_prepare.prepare_launcher("bfloat16", "float32", "bfloat16", "float32", 128, 128, 2, 4, True, 3,
                                            per_channel=per_channel, prefetch=False)
    assert block == (128, 1, 1) and shared == plain.cubin()[2]


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("K, V, scratch", [(128, 128, "bfloat16"), (128, 128, "float32"), (64, 128, "bfloat16"),
                                            (128, 64, "float32")])
def test_the_prepare_that_does_the_intra_work_compiles_for_four_ctas_an_sm_without_spilling(K, V, scratch,
                                                                                          per_channel):
    # intra_in_prepare: T, then chunk_bwd_intra's qg and P = attn^T dO (attn kept in shared memory); gdn under the
    # 48 KB a launch gets without opting in, kda (q's split rows in a buffer of their own) under a quarter of an
    # SM's 228 KB; four CTAs an SM by their registers too
    launcher = _delta_prepare.prepare_inverse_intra_launcher("bfloat16", "float32", "bfloat16", scratch, K, V, 2, 4,
                                                             True, K ** -0.5, 3, per_channel=per_channel,
                                                             own_dtype=scratch)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(14)
    assert block == (128, 1, 1) and 0 < shared <= (56 if per_channel else 48) * 1024
    assert registers(cubin) <= 128 and largest_frame(cubin) == 0


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
def test_the_prepare_without_u_takes_the_same_addresses_and_no_more_shared_memory(per_channel):
    # a backward from the checkpoints on 16-bit scratch: chunk_bwd_values forms U, so neither prepare that leaves T
    # (alone, or doing the intra work too) reads v or writes u; the same slots, so the plan swaps it in unchanged
    for launcher_of, addresses in ((_delta_prepare.prepare_inverse_launcher, 10),
                                   (_delta_prepare.prepare_inverse_intra_launcher, 14)):
        scale = (128 ** -0.5,) if addresses == 14 else ()
        made = [launcher_of("bfloat16", "float32", "bfloat16", "bfloat16", 128, 128, 2, 4, True, *scale, 3,
                            per_channel=per_channel, own_dtype="bfloat16", store_u=store_u)
                for store_u in (True, False)]
        (with_u, _, shared), (without_u, block, shared_without) = (m.cubin() for m in made)
        assert parameters(without_u) == addresses_then_three_sizes(addresses) and block == (128, 1, 1)
        assert without_u != with_u and shared_without <= shared and largest_frame(without_u) == 0


def test_scalar_operands_are_aligned_to_their_own_size():
    types = _delta_bwd_values._pointer_types("bfloat16", "bfloat16", "bfloat16")
    assert types[1] == ("bfloat16", 2) and types[2] == ("int32", 4) and types[11] == ("float32", 4)
    assert types[12] == types[3]                        # d: the recompute's scratch, as hs


def test_dd_dcg_and_da_take_the_backward_scratch_type_and_hs_w_u_the_recompute_type():
    io = _delta_bwd_values._pointer_types("bfloat16", "bfloat16", "bfloat16", "bfloat16")
    assert all(io[i] == ("bfloat16", 16) for i in (3, 5, 6)) and all(io[i] == ("float32", 16) for i in (4, 8, 9, 10))
    io_all = _delta_bwd_values._pointer_types("bfloat16", "bfloat16", "bfloat16", "bfloat16", "bfloat16")
    assert all(io_all[i] == ("bfloat16", 16) for i in (3, 4, 5, 6, 8, 9, 10)) and io_all[11] == ("float32", 4)
