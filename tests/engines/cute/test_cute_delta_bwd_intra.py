"""The CuTe DSL chunk_bwd_intra for gdn_bwd and kda_bwd (engines/cute/_delta_bwd_intra), on the CPU: its
specialisations compile for sm_90a with the parameters the cuTile plan's C launch path writes (seven
addresses, then tokens, chunks and sequences as int32), a block of four warps and at most 48 KB of dynamic
shared memory."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

pytest.importorskip("cudnn_graph")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("cuda.tile", reason="cuda-tile is not installed (the cubin reader is the cuTile engine's)")

from cudnn_graph.engines.cute import _delta_bwd_intra  # noqa: E402
from cubin_tables import addresses_then_three_sizes, parameters  # noqa: E402


# kda's FP16 scores take the split decays in BF16 (the output kernel's scores_per_channel)
@pytest.mark.parametrize("io, K, V, HQ, H, per_channel", [("bfloat16", 128, 128, 2, 4, False),
                                                          ("bfloat16", 128, 128, 2, 4, True),
                                                          ("float16", 64, 64, 2, 2, False),
                                                          ("float16", 128, 128, 2, 4, True),
                                                          ("bfloat16", 64, 128, 2, 2, True)])
def test_the_kernel_compiles_with_the_parameters_the_c_path_writes(io, K, V, HQ, H, per_channel):
    launcher = _delta_bwd_intra.bwd_intra_launcher(io, K, V, HQ, H, True, K ** -0.5, 3, per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(7)
    assert block == (128, 1, 1) and 0 < shared <= 48 * 1024


def test_its_scratch_outputs_are_in_the_own_scratch_type_and_aligned_for_16_byte_stores():
    assert _delta_bwd_intra._pointer_types("bfloat16", True)[5:] == (("float32", 16), ("float32", 16))
    assert _delta_bwd_intra._pointer_types("bfloat16", True, "bfloat16")[5:] == (("bfloat16", 16), ("bfloat16", 16))


def test_the_16_bit_scratch_kernel_compiles_apart_from_the_f32_one():
    f32 = _delta_bwd_intra.bwd_intra_launcher("bfloat16", 128, 128, 2, 4, True, 128 ** -0.5, 3)
    narrow = _delta_bwd_intra.bwd_intra_launcher("bfloat16", 128, 128, 2, 4, True, 128 ** -0.5, 3,
                                                 own_dtype="bfloat16")
    cubin, block, shared = narrow.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(7)
    assert cubin != f32.cubin()[0] and shared == f32.cubin()[2]
