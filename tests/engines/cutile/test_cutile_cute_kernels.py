"""gdn's and kda's forward with the CuTe DSL kernels (engines/cute/_delta_prepare, _delta_state,
_delta_output) in the cuTile plan, against the reference engine, on an sm_90 GPU.

gdn: ``cutile_gdn_chunk64_cute_prepare`` (the CuTe chunk_prepare, then the cuTile state pass and output
over what it wrote), ``cutile_gdn_chunk64_cute`` (the CuTe output too) and ``_cute_all`` (the CuTe state
pass too); kda: ``cutile_kda_chunk64_cute_prepare`` (the per-channel CuTe chunk_prepare), ``_cute``
(its CuTe output too) and ``_cute_all``. Each case pins the plan
and compares o and final_state as the cuTile engine's own tests do (same inputs, tolerances per output
type): uneven sequences with a length-1 one, both head dims, FP16 without L2 norm or states, grouped value
heads, the gate options, and T = 8192 over 16 heads (test_cutile_export.py pins, on the CPU, which graphs
the plans are proposed for).
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

cudnn = pytest.importorskip("cudnn_graph")
import test_cutile_linear_attention as forward  # noqa: E402
import test_cutile_linear_attention_gva_gates as gva  # noqa: E402

PLANS = ["cutile_gdn_chunk64_cute_prepare", "cutile_gdn_chunk64_cute", "cutile_gdn_chunk64_cute_all"]


@pytest.fixture(autouse=True)
def _sm90_with_the_dsl():
    cp = pytest.importorskip("cupy")
    if cp.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA GPU visible")
    major = cp.cuda.Device(0).compute_capability
    if major != "90":
        pytest.skip(f"the CuTe kernels are built for sm_90; this GPU is sm_{major}")
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("K, V", [(128, 128), (64, 64), (64, 128)])
def test_uneven_sequences_bf16(plan, K, V):
    forward.run_case("gdn", forward.SMALL, K=K, V=V, seed=21, plan=plan)


@pytest.mark.parametrize("plan", PLANS)
def test_float16_without_state_or_l2norm(plan):
    forward.run_case("gdn", [0, 64, 65, 190, 300], K=64, V=64, dtype="float16", l2=False, h0=False, seed=22,
                     plan=plan)


@pytest.mark.parametrize("plan", PLANS)
def test_long_sequences_h16(plan):
    forward.run_case("gdn", forward.BIG, H=16, seed=23, plan=plan)


@pytest.mark.parametrize("plan", PLANS)
def test_grouped_value_heads(plan):
    gva.run_case("gdn", gva.SMALL, H=2, HV=4, K=128, V=128, seed=24, plan=plan)


@pytest.mark.parametrize("plan", PLANS)
def test_gate_options(plan):
    # gdn's gate options: the softplus gate from a_log / dt_bias and beta through a sigmoid (gate_lower_bound is kda's)
    gva.run_case("gdn", gva.SMALL, H=2, HV=4, attrs=gva.GATES["softplus_beta_sigmoid"], seed=25, plan=plan)


# kda: the CuTe chunk_prepare (per-channel decays, the gate sums formed in it) before the cuTile state pass
# and output, the CuTe chunk_output too, and all three CuTe kernels
KDA_PLANS = ["cutile_kda_chunk64_cute_prepare", "cutile_kda_chunk64_cute", "cutile_kda_chunk64_cute_all"]


@pytest.mark.parametrize("plan", KDA_PLANS)
@pytest.mark.parametrize("K, V", [(128, 128), (64, 64), (64, 128)])
def test_kda_uneven_sequences_bf16(plan, K, V):
    forward.run_case("kda", forward.SMALL, K=K, V=V, seed=31, plan=plan)


@pytest.mark.parametrize("plan", KDA_PLANS)
def test_kda_float16_without_state_or_l2norm(plan):
    forward.run_case("kda", [0, 64, 65, 190, 300], K=64, V=64, dtype="float16", l2=False, h0=False, seed=32,
                     plan=plan)


@pytest.mark.parametrize("plan", KDA_PLANS)
def test_kda_long_sequences_h16(plan):
    forward.run_case("kda", forward.BIG, H=16, seed=33, plan=plan)


@pytest.mark.parametrize("plan", KDA_PLANS)
@pytest.mark.parametrize("gates", ["softplus_beta_sigmoid", "bounded_neg_eigval"])
def test_kda_grouped_value_heads_and_gates(plan, gates):
    gva.run_case("kda", gva.SMALL, H=2, HV=4, K=128, V=128, attrs=gva.GATES[gates], seed=34, plan=plan)
