"""The CuTe DSL chunk_state_pass for gdn and kda (engines/cute/_delta_state), on the CPU: its specialisations compile for
sm_90a with the parameters the cuTile plan's C launch path writes (nine addresses, then tokens, chunks and
sequences as int32), a block of 128 and at most 48 KB of dynamic shared memory."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

pytest.importorskip("cudnn_graph")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("cuda.tile", reason="cuda-tile is not installed (the cubin reader is the cuTile engine's)")

from cudnn_graph.engines.cute import _delta_state  # noqa: E402
from cudnn_graph.engines.cutile import _abi  # noqa: E402


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("io, K, V, BV, states", [("bfloat16", 128, 128, 32, True), ("float16", 64, 128, 64, False)])
def test_the_kernel_compiles_with_the_parameters_the_c_path_writes(io, K, V, BV, states, per_channel):
    launcher = _delta_state.state_pass_launcher(io, K, V, BV, 4, states, states, 3, per_channel=per_channel)
    cubin, block, shared = launcher.cubin()
    (symbol,) = _abi.kernel_symbols(cubin)
    table = _abi.cubin_parameters(cubin, symbol)
    assert [(p.offset, p.size) for p in table.params] == [(8 * i, 8) for i in range(9)] + [(72, 4), (76, 4), (80, 4)]
    assert block == (128, 1, 1) and 0 < shared <= 48 * 1024


def test_a_value_block_must_divide_v():
    with pytest.raises(ValueError, match="BV = 48 must divide V = 128"):
        _delta_state.DeltaStatePass("bfloat16", 128, 128, 48, 2, False, False)
