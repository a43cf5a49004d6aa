"""The CuTe DSL chunk_output for gdn and kda (engines/cute/_delta_output), on the CPU: its specialisations compile for
sm_90a with the parameters the cuTile plan's C launch path writes (seven addresses, then tokens, chunks and
sequences as int32), a block of 128 and at most 48 KB of dynamic shared memory. The kernel's results are
tests/engines/cutile/test_cutile_cute_kernels.py's (H200).
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

pytest.importorskip("cudnn_graph")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("cuda.tile", reason="cuda-tile is not installed (the cubin reader is the cuTile engine's)")

from cudnn_graph.engines.cute import _delta_output  # noqa: E402
from cubin_tables import addresses_then_three_sizes, kernel_table, parameters  # noqa: E402


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("io, K, V, HQ, H", [("bfloat16", 128, 128, 16, 16), ("float16", 64, 128, 2, 4)])
def test_the_kernel_compiles_with_the_parameters_the_c_path_writes(io, K, V, HQ, H, per_channel):
    launcher = _delta_output.output_launcher(io, K, V, HQ, H, True, K ** -0.5, 3, per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(7)
    assert block == (128, 1, 1) and kernel_table(cubin).block in (None, block)
    assert 0 < shared <= 48 * 1024


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("io, K, HQ, H", [("bfloat16", 128, 16, 16), ("float16", 64, 2, 4)])
def test_the_scores_kernel_compiles_with_six_addresses(io, K, HQ, H, per_channel):
    # q, k, g, cu_seqlens, qg, attn; then tokens, chunks, sequences (the fused state pass reads qg and attn)
    launcher = _delta_output.scores_launcher(io, K, 128, HQ, H, True, K ** -0.5, 3, per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    assert parameters(cubin) == addresses_then_three_sizes(6)
    assert block == (128, 1, 1) and 0 < shared <= 48 * 1024


def test_grouped_heads_must_divide():
    with pytest.raises(ValueError, match="value heads 3 are not a multiple of the key heads 2"):
        _delta_output.DeltaOutput("bfloat16", 64, 64, 2, 3, True, 0.125)


def test_per_channel_gate_sums_are_assumed_16_byte_aligned():
    # kda's gate sums are read in 32-byte row segments; gdn's one f32 per token
    assert _delta_output._pointer_types("bfloat16", per_channel=True)[3] == ("float32", 16)
    assert _delta_output._pointer_types("bfloat16")[3] == ("float32", 4)
