"""The CuTe DSL reverse state pass of gdn_bwd and kda_bwd (engines/cute/_delta_state_reverse), on the CPU: its
specialisations compile for sm_90a with the parameters the cuTile plan's C launch path writes (ten addresses: dO,
w, kd, qg, g, cu_seqlens, dht, dhs, dD, dh0; then tokens, chunks and sequences as int32), its scratch slots
follow the plan's scratch types, and the form that loads a chunk ahead spills nothing (at K = 64 its next qg
arrives by cp.async, 16 bytes a copy, into a second buffer) and each step stores S and dD by stmatrix."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

pytest.importorskip("cudnn_graph")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("cuda.tile", reason="cuda-tile is not installed (the cubin reader is the cuTile engine's)")

from cudnn_graph.engines.cute import _delta_state, _delta_state_reverse  # noqa: E402
from cudnn_graph.engines.cute._delta_chunk import CHUNK, MAX_SHARED_BYTES, PAD, pointer  # noqa: E402
from cubin_tables import addresses_then_three_sizes, largest_frame, parameters  # noqa: E402


# the backward's reverse state pass: ten addresses (dO, w, kd, qg, g, cu_seqlens, dht, dhs, dD, dh0), f32
# scratch rounded into three operand buffers each step (past 48 KB at K = 128: its launch opts in)
@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("io, K, V, BV, states", [("bfloat16", 128, 128, 32, True), ("float16", 64, 64, 32, False),
                                                   ("bfloat16", 128, 128, 64, False)])
def test_the_reverse_pass_compiles_with_ten_addresses(io, K, V, BV, states, per_channel):
    launcher = _delta_state_reverse.reverse_state_pass_launcher(io, K, V, BV, 4, states, states, 3,
                                                                per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(10)
    assert block == (32 * _delta_state.WARPS_OF_BV[BV], 1, 1)
    assert 0 < shared <= MAX_SHARED_BYTES


@pytest.mark.parametrize("K, V, BV, per_channel", [(128, 128, 32, False), (128, 128, 64, True), (64, 64, 32, True)])
def test_the_prefetching_reverse_pass_compiles_without_spilling(K, V, BV, per_channel):
    # scratch="io_all": W, KD, dO, P and the gate of the chunk before are held in registers a step ahead
    launcher = _delta_state_reverse.reverse_state_pass_launcher("bfloat16", K, V, BV, 4, True, True, 3,
                                                                per_channel=per_channel, scratch_dtype="bfloat16",
                                                                own_dtype="bfloat16", prefetch=True)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(10)
    assert block == (32 * _delta_state.WARPS_OF_BV[BV], 1, 1) and 0 < shared <= MAX_SHARED_BYTES
    assert largest_frame(cubin) == 0


@pytest.mark.parametrize("K", [64, 128])
def test_the_reverse_pass_over_sixteen_value_columns_compiles_without_spilling(K):
    # the narrow reverse pass (knob reverse_block_v=16): four warps, less shared memory than at 32 columns; on
    # 16-bit scratch (the plan's prefetching form) and on its f32 twin's
    narrow = _delta_state_reverse.reverse_state_pass_launcher("bfloat16", K, K, 16, 16, True, True, 1,
                                                              scratch_dtype="bfloat16", own_dtype="bfloat16",
                                                              prefetch=True)
    cubin, block, shared = narrow.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(10) and block == (128, 1, 1)
    assert shared < _reverse_pass(K, True).cubin()[2] and largest_frame(cubin) == 0
    twin = _delta_state_reverse.reverse_state_pass_launcher("bfloat16", K, K, 16, 16, True, True, 1)
    cubin, block, shared = twin.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(10) and 0 < shared <= MAX_SHARED_BYTES


def test_the_cutile_plans_reverse_widths_are_the_ones_the_cute_pass_takes():
    from cudnn_graph.engines.cutile._backward import REVERSE_BLOCK_VS
    assert REVERSE_BLOCK_VS == tuple(sorted(_delta_state.WARPS_OF_BV))


def test_the_prefetching_reverse_pass_needs_16_bit_scratch():
    with pytest.raises(ValueError, match="needs 16-bit scratch"):
        _delta_state_reverse.reverse_state_pass_launcher("bfloat16", 128, 128, 32, 4, True, True, 3,
                                                         scratch_dtype="bfloat16", prefetch=True)


def test_the_reverse_pass_reads_and_writes_the_scratch_in_its_type():
    types = _delta_state_reverse._reverse_pointer_types("bfloat16")
    assert types[0] == ("bfloat16", 16) and all(t == ("float32", 16) for t in types[1:4] + types[6:])
    # scratch="io": w and kd in the input type; "io_all": qg, dhs and dD too; dht and dh0 (the op's ports) f32
    io = _delta_state_reverse._reverse_pointer_types("bfloat16", "bfloat16")
    assert io[1] == io[2] == ("bfloat16", 16) and all(t == ("float32", 16) for t in io[3:4] + io[6:])
    io_all = _delta_state_reverse._reverse_pointer_types("bfloat16", "bfloat16", "bfloat16")
    assert all(io_all[i] == ("bfloat16", 16) for i in (1, 2, 3, 7, 8))
    assert io_all[6] == io_all[9] == ("float32", 16)


def _reverse_pass(K, prefetch):
    return _delta_state_reverse.reverse_state_pass_launcher("bfloat16", K, K, 32, 4, True, True, 3,
                                                            scratch_dtype="bfloat16", own_dtype="bfloat16",
                                                            prefetch=prefetch)


@pytest.mark.parametrize("K, second_buffer", [(64, True), (128, False)])
def test_the_prefetching_reverse_pass_has_a_second_qg_buffer_at_k64_only(K, second_buffer):
    # at K = 128 cp.async made the pass slower (H100, session 32): it keeps one buffer and a step's own load
    extra = _reverse_pass(K, True).cubin()[2] - _reverse_pass(K, False).cubin()[2]
    assert extra == (CHUNK * (K + PAD) * 2 if second_buffer else 0)


def _prefetching_pass_ptx(K: int, dump_dir) -> list[str]:
    """The PTX lines of the prefetching reverse pass (bf16, K = V, BV = 32, four warps, states, L2 norm)."""
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute
    from cutlass import Int32
    kernel = _delta_state_reverse.DeltaStatePassReversePrefetch("bfloat16", K, K, 32, 4, True, True, False)
    pointers = [pointer(dtype, 4096, align)
                for dtype, align in _delta_state_reverse._reverse_pointer_types("bfloat16", "bfloat16", "bfloat16")]
    cute.compile(kernel, *pointers, Int32(64), Int32(1), Int32(1), cuda.CUstream(0),
                 options=f"--keep-ptx --dump-dir {dump_dir}")
    (ptx,) = dump_dir.glob("*.ptx")
    return ptx.read_text().splitlines()


@pytest.mark.filterwarnings("ignore:This static loop has")     # unrolled at trace time on purpose
def test_the_next_qg_arrives_in_16_byte_copies(tmp_path):
    # one cp.async a 16-byte segment: a copy of the (1, 8) tile itself would copy 16 bytes from each of its
    # elements, past the segment and misaligned (CUDA_ERROR_MISALIGNED_ADDRESS on the H100, session 32)
    copies = [line for line in _prefetching_pass_ptx(64, tmp_path) if "cp.async.cg.shared.global" in line]
    # two call sites (before the walk and each step), 64 rows x 8 segments over 128 threads: 4 copies each
    assert len(copies) == 2 * CHUNK * (64 // 8) // 128
    assert all(line.rstrip().endswith(", 16, 16;") for line in copies)


@pytest.mark.filterwarnings("ignore:This static loop has")
@pytest.mark.parametrize("K", [64, 128])
def test_each_step_stores_s_and_dd_by_stmatrix(tmp_path, K):
    # the pass is MIO-bound at K = 128: S (K x BV) and dD (64 x BV) leave the accumulators two 8 x 8 matrices an
    # instruction (four elements a thread), not a 4-byte store per column pair (gdn 0.156 -> 0.150 ms, H100)
    stores = [line for line in _prefetching_pass_ptx(K, tmp_path) if "stmatrix.sync.aligned.m8n8.x2" in line]
    assert len(stores) == (K * 32 + CHUNK * 32) // (128 * 4)
