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

# (op, plan): every plan with a CuTe kernel in it
OP_PLANS = [("gdn", f"cutile_gdn_chunk64_{v}") for v in ("cute_prepare", "cute", "cute_all")] + \
           [("kda", f"cutile_kda_chunk64_{v}") for v in ("cute_prepare", "cute", "cute_all")]
SEEDS = {"gdn": 20, "kda": 30}


@pytest.fixture(autouse=True)
def _sm90_with_the_dsl():
    import gpu_support
    gpu_support.sm90_with_the_dsl("the CuTe kernels are built for it")


@pytest.mark.parametrize("op, plan", OP_PLANS)
@pytest.mark.parametrize("K, V", [(128, 128), (64, 64), (64, 128)])
def test_uneven_sequences_bf16(op, plan, K, V):
    forward.run_case(op, forward.SMALL, K=K, V=V, seed=SEEDS[op] + 1, plan=plan)


@pytest.mark.parametrize("op, plan", OP_PLANS)
def test_float16_without_state_or_l2norm(op, plan):
    forward.run_case(op, [0, 64, 65, 190, 300], K=64, V=64, dtype="float16", l2=False, h0=False, seed=SEEDS[op] + 2,
                     plan=plan)


# kda with FP16 inputs: the prepare's and the scores' split-decay operands in BF16 (ChunkKernel.split; the
# test inputs' decays reach e^16 over half a chunk, past FP16's e^11), everything else in FP16
KDA_FP16_PLANS = [f"cutile_kda_chunk64_{v}" for v in ("cute_prepare", "cute", "cute_all", "cute_all_fused")]


@pytest.mark.parametrize("plan", KDA_FP16_PLANS)
@pytest.mark.parametrize("K, V", [(128, 128), (64, 64)])
def test_kda_float16_holds_its_split_decays_in_bf16(plan, K, V):
    forward.run_case("kda", forward.SMALL, K=K, V=V, dtype="float16", seed=SEEDS["kda"] + 12, plan=plan)


def test_kda_float16_with_the_bounded_gate_near_its_limit():
    # gate_lower_bound -2.5: a split factor up to e^80 (BF16 holds it, FP16 would not)
    gva.run_case("kda", gva.SMALL, H=2, HV=4, K=128, V=128, dtype="float16", attrs=gva.GATES["bounded_neg_eigval"],
                 seed=37, plan="cutile_kda_chunk64_cute_all_fused")


@pytest.mark.parametrize("width", ["bv64", "bv32"])
def test_the_fused_state_pass_gives_the_unfused_bits_for_kda_float16(width):
    import numpy as np
    fused, split = (forward.run_case("kda", forward.SMALL, K=128, V=128, dtype="float16", seed=SEEDS["kda"] + 13,
                                     plan=f"cutile_kda_chunk64_{suffix}") for suffix in FUSED_PAIRS[width])
    for name in split:
        assert np.asarray(fused[name]).tobytes() == np.asarray(split[name]).tobytes(), name


def test_the_kda_float16_backward_on_the_cute_recompute_matches_the_reference():
    forward.run_bwd_case("kda_bwd", forward.SMALL, K=64, V=64, dtype="float16", seed=38,
                         plan="cutile_kda_bwd_chunk64_cute_prepare")


@pytest.mark.parametrize("op, plan", OP_PLANS)
def test_long_sequences_h16(op, plan):
    forward.run_case(op, forward.BIG, H=16, seed=SEEDS[op] + 3, plan=plan)


# every CuTe state pass form takes the sequences longest first (ties in index order): lengths out of order,
# equal pairs, one of a single token, against the reference
@pytest.mark.parametrize("suffix", ["cute_all", "cute_all_split", "cute_all_fused", "cute_all_resident", "cute_all_wg"])
def test_the_state_pass_forms_take_the_longest_sequences_first(suffix):
    forward.run_case("gdn", [0, 64, 364, 365, 1065, 1765, 1829], H=2, seed=SEEDS["gdn"] + 15,
                     plan=f"cutile_gdn_chunk64_{suffix}")


# the eight-warp CuTe state pass (64 value columns a CTA, KD in W's buffer)
@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("K, V, cu", [(128, 128, "small"), (64, 64, "small"), (128, 128, "big")])
def test_the_eight_warp_state_pass(op, K, V, cu):
    lengths, H = (forward.SMALL, 2) if cu == "small" else (forward.BIG, 16)
    forward.run_case(op, lengths, H=H, K=K, V=V, seed=SEEDS[op] + 5, plan=f"cutile_{op}_chunk64_cute_all_bv64")


# value blocks of 16 (four times the default's state-pass CTAs, for few sequences x heads): the cuTile state
# pass (cute_bv16) and the CuTe one (cute_all_bv16), four warps a CTA
@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("suffix", ["cute_bv16", "cute_all_bv16"])
@pytest.mark.parametrize("K, V, cu", [(128, 128, "small"), (64, 64, "small"), (128, 128, "big")])
def test_the_sixteen_column_state_pass(op, suffix, K, V, cu):
    lengths, H = (forward.SMALL, 2) if cu == "small" else (forward.BIG, 16)
    forward.run_case(op, lengths, H=H, K=K, V=V, seed=SEEDS[op] + 7, plan=f"cutile_{op}_chunk64_{suffix}")


# FP16 ranks the CuTe sixteen-column pass first at K = 128 where few CTAs would run (faster there than the cuTile
# pass as timed with TF32 products, session 43)
@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("cu", ["small", "big"])
def test_the_sixteen_column_cute_state_pass_in_float16(op, cu):
    lengths, H = (forward.SMALL, 2) if cu == "small" else (forward.BIG, 16)
    forward.run_case(op, lengths, H=H, dtype="float16", seed=SEEDS[op] + 17, plan=f"cutile_{op}_chunk64_cute_all_bv16")


# value blocks of 8 in the cuTile state pass (cute_bv8: gdn's first at K = 64 where its CTAs fit one wave); with
# FP16 inputs its products take FP16 inputs, as the CuTe passes' do
@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("K, V, cu", [(64, 64, "small"), (64, 64, "big"), (128, 128, "small")])
def test_the_eight_column_state_pass(op, dtype, K, V, cu):
    lengths, H = (forward.SMALL, 2) if cu == "small" else (forward.BIG, 16)
    forward.run_case(op, lengths, H=H, K=K, V=V, dtype=dtype, seed=SEEDS[op] + 19,
                     plan=f"cutile_{op}_chunk64_cute_bv8")


# the CuTe state pass forms that hold the state transposed in accumulators: resident (four warps of 16 value
# columns, mma.sync) and warpgroup (WGMMA, W and KD in swizzled shared memory); (plan suffix, seed offset)
TRANSPOSED_FORMS = {"resident": ("cute_all_resident", 6), "warpgroup": ("cute_all_wg", 8)}


@pytest.mark.parametrize("form", list(TRANSPOSED_FORMS))
@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("K, V, cu", [(128, 128, "small"), (64, 64, "small"), (64, 128, "small"),
                                      (128, 128, "big")])
def test_the_transposed_state_pass_forms(form, op, K, V, cu):
    suffix, seed = TRANSPOSED_FORMS[form]
    lengths, H = (forward.SMALL, 2) if cu == "small" else (forward.BIG, 16)
    forward.run_case(op, lengths, H=H, K=K, V=V, seed=SEEDS[op] + seed, plan=f"cutile_{op}_chunk64_{suffix}")


# the split state pass (KD in a shared buffer of its own: 53 KB, so its launch opts in past 48 KB) runs the
# eight-warp staged pass's products in the same order: the same bits
@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("cu", ["small", "big"])
def test_the_split_state_pass_gives_the_staged_bits(op, cu):
    import numpy as np
    lengths, H = (forward.SMALL, 2) if cu == "small" else (forward.BIG, 16)
    staged, split = (forward.run_case(op, lengths, H=H, seed=SEEDS[op] + 9, plan=f"cutile_{op}_chunk64_{suffix}")
                     for suffix in ("cute_all_bv64", "cute_all_split"))
    for name in staged:
        assert np.asarray(split[name]).tobytes() == np.asarray(staged[name]).tobytes(), name


# the fused state pass forms o itself from the scores kernel's scale q e^gc and attn, in the output kernel's
# product order: the bits of the staged pass of its width (64 columns: split) and the output kernel, o and
# final state; (fused plan, unfused plan)
FUSED_PAIRS = {"bv64": ("cute_all_fused", "cute_all_split"), "bv32": ("cute_all_fused_bv32", "cute_all")}


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("width", list(FUSED_PAIRS))
@pytest.mark.parametrize("K, V, cu", [(128, 128, "small"), (64, 64, "small"), (64, 128, "small"), (128, 64, "small"),
                                      (128, 128, "big")])
def test_the_fused_state_pass_gives_the_unfused_bits(op, width, K, V, cu):
    import numpy as np
    lengths, H = (forward.SMALL, 2) if cu == "small" else (forward.BIG, 16)
    fused, split = (forward.run_case(op, lengths, H=H, K=K, V=V, seed=SEEDS[op] + 11, plan=f"cutile_{op}_chunk64_{suffix}")
                    for suffix in FUSED_PAIRS[width])
    for name in split:
        assert np.asarray(fused[name]).tobytes() == np.asarray(split[name]).tobytes(), name


# gdn's prepare forming the scores (DeltaPrepareScores) from the k rows and gate sums it holds: the scores
# kernel's bits, so the fused plan's o and final state
@pytest.mark.parametrize("width", ["", "_bv32"])
@pytest.mark.parametrize("K, V, cu", [(128, 128, "small"), (64, 64, "small"), (64, 128, "small"), (128, 64, "small"),
                                      (128, 128, "big")])
def test_the_prepare_formed_scores_give_the_scores_kernels_bits(width, K, V, cu):
    import numpy as np
    lengths, H = (forward.SMALL, 2) if cu == "small" else (forward.BIG, 16)
    own, prepared = (forward.run_case("gdn", lengths, H=H, K=K, V=V, seed=SEEDS["gdn"] + 14,
                                      plan=f"cutile_gdn_chunk64_{suffix}")
                     for suffix in (f"cute_all_fused{width}", f"cute_all_fused{width}_prepare_scores"))
    for name in own:
        assert np.asarray(prepared[name]).tobytes() == np.asarray(own[name]).tobytes(), name


@pytest.mark.parametrize("width", ["", "_bv32"])
@pytest.mark.parametrize("K", [128, 64])
def test_the_prepare_formed_scores_give_the_scores_kernels_bits_in_float16(width, K):
    import numpy as np
    own, prepared = (forward.run_case("gdn", forward.SMALL, K=K, V=K, dtype="float16", seed=SEEDS["gdn"] + 16,
                                      plan=f"cutile_gdn_chunk64_{suffix}")
                     for suffix in (f"cute_all_fused{width}", f"cute_all_fused{width}_prepare_scores"))
    for name in own:
        assert np.asarray(prepared[name]).tobytes() == np.asarray(own[name]).tobytes(), name


def test_the_prepare_formed_scores_with_grouped_value_heads_and_gate_options():
    gva.run_case("gdn", gva.SMALL, H=2, HV=4, K=128, V=128, attrs=gva.GATES["softplus_beta_sigmoid"], seed=36,
                 plan="cutile_gdn_chunk64_cute_all_fused_prepare_scores")


def test_the_fused_state_pass_float16_without_state_or_l2norm():
    forward.run_case("gdn", [0, 64, 65, 190, 300], K=64, V=64, dtype="float16", l2=False, h0=False, seed=12,
                     plan="cutile_gdn_chunk64_cute_all_fused")


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_the_fused_state_pass_with_grouped_value_heads_and_gate_options(op):
    gva.run_case(op, gva.SMALL, H=2, HV=4, K=128, V=128, attrs=gva.GATES["softplus_beta_sigmoid"], seed=35,
                 plan=f"cutile_{op}_chunk64_cute_all_fused")


def test_the_fused_plan_runs_the_split_pass_and_the_output_where_its_kernels_refuse_the_buffers(monkeypatch):
    import numpy as np
    from cudnn_graph.engines.cutile import _cute_launch
    plan = "cutile_gdn_chunk64_cute_all_fused"
    fused = forward.run_case("gdn", forward.SMALL, seed=13, plan=plan)
    monkeypatch.setattr(_cute_launch.CuteLaunch, "takes", lambda self, args: False)
    fallback = forward.run_case("gdn", forward.SMALL, seed=13, plan=plan)
    for name in fused:
        assert np.asarray(fallback[name]).tobytes() == np.asarray(fused[name]).tobytes(), name


@pytest.mark.parametrize("op, plan", [(op, plan) for op, plan in OP_PLANS if op == "gdn"])
def test_grouped_value_heads(op, plan):
    gva.run_case(op, gva.SMALL, H=2, HV=4, K=128, V=128, seed=SEEDS[op] + 4, plan=plan)


# the gate options (with grouped value heads): the softplus gate from a_log / dt_bias and beta through a
# sigmoid, and kda's bounded gate
@pytest.mark.parametrize("op, plan, gates", [(op, plan, "softplus_beta_sigmoid") for op, plan in OP_PLANS] +
                         [(op, plan, "bounded_neg_eigval") for op, plan in OP_PLANS if op == "kda"])
def test_gate_options(op, plan, gates):
    if op == "gdn":
        gva.run_case(op, gva.SMALL, H=2, HV=4, attrs=gva.GATES[gates], seed=25, plan=plan)
    else:
        gva.run_case(op, gva.SMALL, H=2, HV=4, K=128, V=128, attrs=gva.GATES[gates], seed=34, plan=plan)


# the backward's intra-chunk terms (P = attn^T dO, qg) from the CuTe chunk_bwd_intra
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
@pytest.mark.parametrize("K, V", [(64, 64), (128, 128)])
def test_backward_intra_on_cute(op, K, V):
    forward.run_bwd_case(op, forward.SMALL, K=K, V=V, seed=43, plan=f"cutile_{op}_chunk64_cute_intra")


def test_backward_intra_on_cute_t8192_h16():
    forward.run_bwd_case("gdn_bwd", forward.BIG, H=16, seed=44, plan="cutile_gdn_bwd_chunk64_cute_intra")


# the backward's forward recompute on the CuTe chunk_prepare (f32 scratch)
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
@pytest.mark.parametrize("K, V", [(64, 64), (128, 128)])
def test_backward_recompute_on_the_cute_prepare(op, K, V):
    forward.run_bwd_case(op, forward.SMALL, K=K, V=V, seed=41, plan=f"cutile_{op}_chunk64_cute_prepare")


# the plan ranked first for the backward (both CuTe kernels), executed four times on the case that showed the
# eight-warp reverse state pass's race (test_cutile_linear_attention_gva_gates.py)
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_the_first_backward_plan_gives_the_same_bits_every_execution(op):
    gva.run_case(op, gva.SMALL, attrs=gva.GATES["softplus_beta_sigmoid"], seed=5,
                 plan=f"cutile_{op}_chunk64_cute_prepare_intra", repeats=4)


# chunk_bwd_grads in CuTe DSL (BF16: engines/cute/_delta_bwd_grads; kda's per-channel gate: _delta_bwd_grads_per_channel)
# on the first plan's other kernels

@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
@pytest.mark.parametrize("K, V", [(64, 64), (128, 128), (64, 128), (128, 64)])
def test_the_cute_gradient_kernel_matches_the_reference(op, K, V):
    forward.run_bwd_case(op, forward.SMALL, K=K, V=V, seed=43, plan=f"cutile_{op}_chunk64_cute_prepare_intra_grads")


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_the_cute_gradient_kernel_at_t8192_h16(op):
    forward.run_bwd_case(op, forward.BIG, H=16, K=128, V=128, seed=44,
                         plan=f"cutile_{op}_chunk64_cute_prepare_intra_grads")


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_the_cute_gradient_kernel_without_states_or_l2norm(op):
    forward.run_bwd_case(op, [0, 64, 65, 190, 300], K=64, V=64, l2=False, h0=False, dht=False, seed=45,
                         plan=f"cutile_{op}_chunk64_cute_prepare_intra_grads")


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_the_cute_gradient_kernel_with_grouped_value_heads_and_gate_options_every_execution(op):
    # dq / dk as f32 shares summed by group_sum, dg / dbeta through gate_activation_bwd
    gva.run_case(op, gva.SMALL, attrs=gva.GATES["softplus_beta_sigmoid"], seed=46,
                 plan=f"cutile_{op}_chunk64_cute_prepare_intra_grads", repeats=3)


# the reverse state pass in CuTe DSL (DeltaStatePassReverse), alone and with the CuTe gradient kernel (gdn)
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
@pytest.mark.parametrize("K, V", [(64, 64), (128, 128)])
def test_the_cute_reverse_state_pass_matches_the_reference(op, K, V):
    forward.run_bwd_case(op, forward.SMALL, K=K, V=V, seed=47, plan=f"cutile_{op}_chunk64_cute_prepare_intra_state")


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_the_cute_reverse_state_pass_at_t8192_h16(op):
    forward.run_bwd_case(op, forward.BIG, H=16, K=128, V=128, seed=48, plan=f"cutile_{op}_chunk64_cute_prepare_intra_state")


def test_the_cute_reverse_state_pass_without_states_or_l2norm_in_float16():
    forward.run_bwd_case("gdn_bwd", [0, 64, 65, 190, 300], K=64, V=64, dtype="float16", l2=False, h0=False,
                         dht=False, seed=49, plan="cutile_gdn_bwd_chunk64_cute_prepare_intra_state")


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_the_cute_backward_kernels_give_the_same_bits_every_execution(op):
    suffix = "cute_prepare_intra_grads_state" if op == "gdn_bwd" else "cute_prepare_intra_state"
    gva.run_case(op, gva.SMALL, attrs=gva.GATES["softplus_beta_sigmoid"], seed=5, plan=f"cutile_{op}_chunk64_{suffix}",
                 repeats=4)


# chunk_bwd_values in CuTe DSL (DeltaBwdValues) from the T the backward's CuTe prepare leaves in dA's region
# (DeltaPrepareInverse), alone and with every backward kernel the op has in CuTe (cute_all)
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
@pytest.mark.parametrize("K, V", [(64, 64), (128, 128), (64, 128), (128, 64)])
def test_the_cute_values_kernel_matches_the_reference(op, K, V):
    forward.run_bwd_case(op, forward.SMALL, K=K, V=V, seed=50, plan=f"cutile_{op}_chunk64_cute_prepare_intra_values")


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_every_cute_backward_kernel_at_t8192_h16(op):
    forward.run_bwd_case(op, forward.BIG, H=16, K=128, V=128, seed=51, plan=f"cutile_{op}_chunk64_cute_all")


# every backward kernel the op has in CuTe but the reverse state pass (cuTile: the first plan where that pass's
# CTAs are few); and every one in FP16
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
@pytest.mark.parametrize("K, V", [(64, 64), (128, 128)])
def test_every_cute_backward_kernel_but_the_reverse_state_pass(op, K, V):
    forward.run_bwd_case(op, forward.SMALL, K=K, V=V, seed=57, plan=f"cutile_{op}_chunk64_cute_all_tile_state")


def test_every_cute_backward_kernel_in_float16():
    forward.run_bwd_case("gdn_bwd", [0, 64, 65, 190, 300], K=128, V=128, dtype="float16", seed=58,
                         plan="cutile_gdn_bwd_chunk64_cute_all")


# FP16 inputs on every CuTe backward kernel, the split decays in BF16 where they enter products (chunk_bwd_grads'
# four score products, kda's chunk_bwd_intra scores: ChunkKernel.split): f32 and 16-bit scratch, four- and
# eight-warp gradients; the grouped value heads with the gate options (kda's bounded gate near its limit: split
# factors up to e^80, which FP16 would overflow) and a long batch with states
# (kda's FP16 chunk_bwd_intra is offered only once engine.FLOAT16_BACKWARD_GPU_TESTED is set: set it to run these)
FLOAT16_BACKWARD_FORMS = ["cute_all", "cute_all_io", "cute_all_io_all", "cute_all_io_all_w8"]


def _float16_backward_offered(op):
    from cudnn_graph.engines.cutile.engine import FLOAT16_BACKWARD_GPU_TESTED
    if op == "kda_bwd" and not FLOAT16_BACKWARD_GPU_TESTED:
        pytest.skip("kda's FP16 chunk_bwd_intra is not offered until engine.FLOAT16_BACKWARD_GPU_TESTED is set")


@pytest.mark.parametrize("suffix", FLOAT16_BACKWARD_FORMS)
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
@pytest.mark.parametrize("K, V", [(64, 64), (128, 128)])
def test_every_cute_backward_form_in_float16_matches_the_reference(op, K, V, suffix):
    _float16_backward_offered(op)
    forward.run_bwd_case(op, forward.SMALL, K=K, V=V, dtype="float16", seed=66, plan=f"cutile_{op}_chunk64_{suffix}")


@pytest.mark.parametrize("op, gates", [("gdn_bwd", "softplus_beta_sigmoid"), ("kda_bwd", "bounded_neg_eigval")])
def test_the_float16_backward_with_grouped_value_heads_and_gate_options(op, gates):
    _float16_backward_offered(op)
    gva.run_case(op, gva.SMALL, H=2, HV=4, K=128, V=128, dtype="float16", attrs=gva.GATES[gates], seed=67,
                 plan=f"cutile_{op}_chunk64_cute_all_io_all_w8", repeats=2)


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_the_float16_backward_at_t8192_h16_with_states(op):
    _float16_backward_offered(op)
    forward.run_bwd_case(op, forward.BIG, H=16, K=128, V=128, dtype="float16", seed=68,
                         plan=f"cutile_{op}_chunk64_cute_all_io_all_w8")


def test_the_cute_values_kernel_without_states_or_l2norm_in_float16():
    forward.run_bwd_case("gdn_bwd", [0, 64, 65, 190, 300], K=64, V=64, dtype="float16", l2=False, h0=False,
                         dht=False, seed=52, plan="cutile_gdn_bwd_chunk64_cute_prepare_intra_values")


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_every_cute_backward_kernel_with_grouped_value_heads_and_gate_options_every_execution(op):
    gva.run_case(op, gva.SMALL, attrs=gva.GATES["softplus_beta_sigmoid"], seed=53, plan=f"cutile_{op}_chunk64_cute_all",
                 repeats=4)


# every backward kernel in CuTe with the recompute's w, u, kd, d and hs in the input type (BF16: scratch="io";
# the recompute's state pass is the forward's CuTe pass), and with the backward's own scratch in it too
# (scratch="io_all": dhs, P / dD, qg / dCg, T / dA, dq / dk before the norm)
SIXTEEN_BIT_SCRATCH = ["cute_all_io", "cute_all_io_all"]
# the forms ranked below the default (GPU-tested in session 32, none faster): chunk_bwd_values in eight-warp CTAs
# too (values_warps=8), both state passes over 64 value columns a CTA (block_v=64: the recompute's staged pass and
# the prefetching reverse pass in eight warps), the two together, and the recompute's prepare doing
# chunk_bwd_intra's work (intra_in_prepare), alone and with the eight-warp values kernel
UNRANKED_BACKWARD_FORMS = ["cute_all_io_all_w8_values_w8", "cute_all_io_all_w8_bv64",
                           "cute_all_io_all_w8_values_w8_bv64", "cute_all_io_all_w8_intra_in_prepare",
                           "cute_all_io_all_w8_values_w8_intra_in_prepare"]


@pytest.mark.parametrize("suffix", SIXTEEN_BIT_SCRATCH + UNRANKED_BACKWARD_FORMS)
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
@pytest.mark.parametrize("K, V", [(64, 64), (128, 128), (64, 128), (128, 64)])
def test_every_cute_backward_kernel_on_16_bit_scratch_matches_the_reference(op, K, V, suffix):
    forward.run_bwd_case(op, forward.SMALL, K=K, V=V, seed=54, plan=f"cutile_{op}_chunk64_{suffix}")


@pytest.mark.parametrize("suffix", SIXTEEN_BIT_SCRATCH)
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_every_cute_backward_kernel_on_16_bit_scratch_at_t8192_h16_without_states(op, suffix):
    forward.run_bwd_case(op, forward.BIG, H=16, K=128, V=128, h0=False, dht=False, seed=55,
                         plan=f"cutile_{op}_chunk64_{suffix}")


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_the_16_bit_backward_scratch_at_t8192_h16_with_states(op):
    forward.run_bwd_case(op, forward.BIG, H=16, K=128, V=128, seed=60, plan=f"cutile_{op}_chunk64_cute_all_io_all")


@pytest.mark.parametrize("suffix", SIXTEEN_BIT_SCRATCH)
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_every_cute_backward_kernel_on_16_bit_scratch_with_grouped_value_heads_and_gate_options(op, suffix):
    gva.run_case(op, gva.SMALL, attrs=gva.GATES["softplus_beta_sigmoid"], seed=56, plan=f"cutile_{op}_chunk64_{suffix}",
                 repeats=3)


@pytest.mark.parametrize("suffix", SIXTEEN_BIT_SCRATCH + ["cute_all_io_all_w8_intra_in_prepare"])
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_a_query_the_16_bit_scratch_kernels_refuse_runs_on_the_f32_twin(op, suffix):
    # q a slice of a fused q/k buffer (rows not packed): the CuTe kernels refuse it, so the call runs the same
    # kernels on f32 scratch (each CuTe where it takes its buffers, cuTile where not)
    forward.run_bwd_case(op, forward.SMALL, K=64, V=64, seed=59, plan=f"cutile_{op}_chunk64_{suffix}", q_in_qk=True)


# chunk_bwd_grads in eight-warp CTAs (grads_warps=8): each shape of the four-warp cases, the grouped value heads
# and gate options (the bounded gate for kda) with repeated executions (same bits), and a long batch with states
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
@pytest.mark.parametrize("K, V", [(64, 64), (128, 128), (64, 128), (128, 64)])
def test_the_eight_warp_gradient_kernel_matches_the_reference(op, K, V):
    forward.run_bwd_case(op, forward.SMALL, K=K, V=V, seed=61, plan=f"cutile_{op}_chunk64_cute_all_io_all_w8")


@pytest.mark.parametrize("op, gates", [("gdn_bwd", "softplus_beta_sigmoid"), ("kda_bwd", "softplus_beta_sigmoid"),
                                       ("kda_bwd", "bounded_neg_eigval")])
def test_the_eight_warp_gradient_kernel_with_grouped_value_heads_and_gate_options(op, gates):
    gva.run_case(op, gva.SMALL, attrs=gva.GATES[gates], seed=62, plan=f"cutile_{op}_chunk64_cute_all_io_all_w8",
                 repeats=3)


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_the_eight_warp_gradient_kernel_at_t8192_h16_with_states(op):
    forward.run_bwd_case(op, forward.BIG, H=16, K=128, V=128, seed=63, plan=f"cutile_{op}_chunk64_cute_all_io_all_w8")


# the recompute's state pass in cuTile over 8 or 16 value columns a CTA, the reverse pass over 32 (knob
# state_pass_block_v: the forward's narrow pass, first where the forward ranks it): BF16 and FP16 (the pass's
# products of the scratch's type) at each head size, the grouped value heads and gate options with repeated
# executions (same bits), a long batch with states, and a query the CuTe kernels refuse (the f32 twin)
TILE_PASS_FORMS = ["cute_all_io_all_w8_tile_pass_bv8", "cute_all_io_all_w8_tile_pass_bv16"]


@pytest.mark.parametrize("suffix", TILE_PASS_FORMS)
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("K, V", [(64, 64), (128, 128)])
def test_the_backward_with_the_narrow_cutile_state_pass_matches_the_reference(op, dtype, K, V, suffix):
    forward.run_bwd_case(op, forward.SMALL, K=K, V=V, dtype=dtype, seed=67, plan=f"cutile_{op}_chunk64_{suffix}")


@pytest.mark.parametrize("suffix", TILE_PASS_FORMS)
@pytest.mark.parametrize("op, gates", [("gdn_bwd", "softplus_beta_sigmoid"), ("kda_bwd", "bounded_neg_eigval")])
def test_the_narrow_cutile_state_pass_with_grouped_value_heads_and_gate_options(op, gates, suffix):
    gva.run_case(op, gva.SMALL, attrs=gva.GATES[gates], seed=68, plan=f"cutile_{op}_chunk64_{suffix}", repeats=3)


@pytest.mark.parametrize("op, suffix", [("gdn_bwd", TILE_PASS_FORMS[0]), ("kda_bwd", TILE_PASS_FORMS[1])])
@pytest.mark.parametrize("K", [64, 128])
def test_the_narrow_cutile_state_pass_at_t8192_h16_with_states(op, K, suffix):
    forward.run_bwd_case(op, forward.BIG, H=16, K=K, V=K, seed=69, plan=f"cutile_{op}_chunk64_{suffix}")


@pytest.mark.parametrize("suffix", TILE_PASS_FORMS)
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_a_query_the_cute_kernels_refuse_runs_the_narrow_pass_plan_on_its_f32_twin(op, suffix):
    forward.run_bwd_case(op, forward.SMALL, K=64, V=64, seed=70, plan=f"cutile_{op}_chunk64_{suffix}", q_in_qk=True)


# the reverse pass over 16 value columns a CTA too (knob reverse_block_v; proposed once these pass,
# REVERSE_NARROW_GPU_TESTED): against the reference in both types and head sizes, one long sequence with states,
# the grouped value heads and gate options with repeated executions (same bits)
@pytest.fixture
def narrow_reverse_on(monkeypatch):
    from cudnn_graph.engines.cutile import _backward
    monkeypatch.setattr(_backward, "REVERSE_NARROW_GPU_TESTED", True)


NARROW_REVERSE_FORMS = [f"{form}_rev16" for form in TILE_PASS_FORMS]


@pytest.mark.parametrize("op, dtype, K, suffix", [
    ("gdn_bwd", "bfloat16", 64, NARROW_REVERSE_FORMS[0]), ("gdn_bwd", "float16", 128, NARROW_REVERSE_FORMS[1]),
    ("kda_bwd", "bfloat16", 128, NARROW_REVERSE_FORMS[1]), ("kda_bwd", "float16", 64, NARROW_REVERSE_FORMS[0])])
def test_the_narrow_reverse_pass_matches_the_reference(narrow_reverse_on, op, dtype, K, suffix):
    forward.run_bwd_case(op, forward.SMALL, K=K, V=K, dtype=dtype, seed=71, plan=f"cutile_{op}_chunk64_{suffix}")


@pytest.mark.parametrize("op, K", [("gdn_bwd", 128), ("kda_bwd", 64)])
def test_the_narrow_reverse_pass_over_one_long_sequence_with_states(narrow_reverse_on, op, K):
    forward.run_bwd_case(op, [0, 8192], H=4, K=K, V=K, seed=72, plan=f"cutile_{op}_chunk64_{NARROW_REVERSE_FORMS[1]}")


@pytest.mark.parametrize("op, gates", [("gdn_bwd", "softplus_beta_sigmoid"), ("kda_bwd", "bounded_neg_eigval")])
def test_the_narrow_reverse_pass_with_grouped_value_heads_and_gate_options(narrow_reverse_on, op, gates):
    gva.run_case(op, gva.SMALL, attrs=gva.GATES[gates], seed=73, plan=f"cutile_{op}_chunk64_{NARROW_REVERSE_FORMS[0]}",
                 repeats=3)


# the forms below the default (UNRANKED_BACKWARD_FORMS; each shape and a refused query are in the 16-bit scratch
# tests above): the grouped value heads and gate options with repeated executions, a long batch with states
@pytest.mark.parametrize("suffix", UNRANKED_BACKWARD_FORMS)
@pytest.mark.parametrize("op, gates", [("gdn_bwd", "softplus_beta_sigmoid"), ("kda_bwd", "bounded_neg_eigval")])
def test_the_unranked_backward_forms_with_grouped_value_heads(op, gates, suffix):
    gva.run_case(op, gva.SMALL, attrs=gva.GATES[gates], seed=65, plan=f"cutile_{op}_chunk64_{suffix}", repeats=3)


@pytest.mark.parametrize("suffix", UNRANKED_BACKWARD_FORMS)
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd"])
def test_the_unranked_backward_forms_at_t8192_h16_with_states(op, suffix):
    forward.run_bwd_case(op, forward.BIG, H=16, K=128, V=128, seed=66, plan=f"cutile_{op}_chunk64_{suffix}")
