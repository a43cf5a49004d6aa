"""Invalid graphs built through the pygraph builders: each raises a typed error, at the builder call
("build time") or at ``validate()``, that names the node and the port.

Every case is a function that builds a graph; ``expect`` says which error, where it is raised and, for a
``GraphValidationError``, which node and port it must name. A case that raises at build time must leave
the graph unchanged (no half-made node or tensor), which is checked too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import GraphNotSupportedError, GraphValidationError, PlanEntryError
from cudnn_graph.engines import manifest
from cudnn_graph.engines.reference import ReferenceEngine

FLOAT, HALF, INT32, INT8 = (cudnn.data_type.FLOAT, cudnn.data_type.HALF, cudnn.data_type.INT32,
                            cudnn.data_type.INT8)
TRAINING, INFERENCE = cudnn.norm_forward_phase.TRAINING, cudnn.norm_forward_phase.INFERENCE


def graph(**kw):
    kw.setdefault("io_data_type", HALF)
    kw.setdefault("intermediate_data_type", FLOAT)
    kw.setdefault("compute_data_type", FLOAT)
    kw.setdefault("device", "cpu")
    return cudnn.pygraph(**kw)


def T(g, name, *dim, dt=None, **kw):
    stride, acc = [], 1
    for d in reversed(dim):
        stride.insert(0, acc)
        acc *= d
    return g.tensor(name=name, dim=list(dim), stride=stride, data_type=dt, **kw)


@dataclass
class Expect:
    exc: type = GraphValidationError
    when: str = "validate"          # "build": the builder call raises; "validate": validate() raises
    node: Optional[str] = None      # GraphValidationError.node
    port: Optional[str] = None      # GraphValidationError.port
    match: Optional[str] = None     # regex the message must contain


CASES: dict[str, tuple[Callable, Expect]] = {}


def case(expect: Expect):
    def register(fn):
        CASES[fn.__name__] = (fn, expect)
        return fn
    return register


# ------------------------------------------------------------------------------- shapes and ranks

@case(Expect(node="add_0", port="b", match="axis 1 is 4, expected 3 or 1"))
def pointwise_shape_mismatch(g):
    g.add(T(g, "a", 2, 3), T(g, "b", 2, 4)).set_output(True)


@case(Expect(node="mul_0", port="b", match="rank"))
def pointwise_rank_mismatch(g):
    g.mul(T(g, "a", 2, 3), T(g, "b", 3)).set_output(True)


@case(Expect(node="mm", port="B", match="K mismatch"))
def matmul_k_mismatch(g):
    g.matmul(T(g, "A", 1, 4, 8), T(g, "B", 1, 6, 2), name="mm").set_output(True)


@case(Expect(node="matmul_0", port="A", match="rank >= 2"))
def matmul_rank_one(g):
    g.matmul(T(g, "A", 8), T(g, "B", 8)).set_output(True)


@case(Expect(node="matmul_0", port="B", match="batch axis 0"))
def matmul_batch_mismatch(g):
    g.matmul(T(g, "A", 2, 4, 8), T(g, "B", 3, 8, 2)).set_output(True)


@case(Expect(node="reshape_0", port="Y", match="elements"))
def reshape_changes_element_count(g):
    g.reshape(T(g, "x", 2, 3)).set_dim([7]).set_stride([1]).set_output(True)


@case(Expect(node="concatenate_0", port="inputs", match="entry 1"))
def concatenate_mismatched_dims(g):
    g.concatenate([T(g, "a", 2, 3), T(g, "b", 4, 4)], axis=1).set_output(True)


@case(Expect(node="concatenate_0", port="axis", match=r"\[0, 1\]"))
def concatenate_axis_out_of_range(g):
    g.concatenate([T(g, "a", 2, 3), T(g, "b", 2, 3)], axis=2).set_output(True)


@case(Expect(when="build", node="concatenate_0", port="inputs", match="non-empty list"))
def concatenate_empty_list(g):
    g.concatenate([], axis=0)


@case(Expect(node="slice_0", port="slices", match="step must be positive"))
def slice_negative_step(g):
    g.slice(T(g, "x", 4, 4), slices=[slice(None, None, -1)]).set_output(True)


@case(Expect(node="slice_0", port="slices", match="selects nothing"))
def slice_selects_nothing(g):
    g.slice(T(g, "x", 4, 4), slices=[slice(3, 1)]).set_output(True)


@case(Expect(node="gen_index_0", port="axis", match=r"\[0, 1\]"))
def gen_index_axis_out_of_range(g):
    g.gen_index(T(g, "x", 4, 4), axis=5).set_output(True)


# ------------------------------------------------------------------------------------- permutations

@case(Expect(node="transpose_0", port="permutation", match="not a permutation"))
def transpose_repeated_axis(g):
    g.transpose(T(g, "x", 2, 3, 4), permutation=[0, 0, 1]).set_output(True)


@case(Expect(node="transpose_0", port="permutation", match="3 entries but the input has rank 2"))
def transpose_wrong_length(g):
    g.transpose(T(g, "x", 2, 3), permutation=[0, 2, 1]).set_output(True)


@case(Expect(when="build", node="transpose_0", port="permutation", match="integer"))
def transpose_float_entries(g):
    g.transpose(T(g, "x", 2, 3), permutation=[1.0, 0.0])


# ------------------------------------------------------------------------------------------- dtypes

@case(Expect(node="block_scale_quantize_0", port="input", match="FLOAT, HALF or BFLOAT16"))
def quantize_integer_input(g):
    y, s = g.block_scale_quantize(T(g, "x", 4, 32, dt=INT8), block_size=32)
    y.set_output(True).set_data_type(cudnn.data_type.FP8_E4M3)
    s.set_output(True).set_data_type(cudnn.data_type.FP8_E8M0)


@case(Expect(node="block_scale_quantize_0", port="block_size", match="does not divide"))
def quantize_block_does_not_divide(g):
    y, s = g.block_scale_quantize(T(g, "x", 4, 30), block_size=32)
    y.set_output(True)
    s.set_output(True)


@case(Expect(node="sdpa_0", port="q", match="HALF, BFLOAT16 or FLOAT"))
def sdpa_integer_query(g):
    q = T(g, "q", 1, 2, 4, 8, dt=INT32)
    k, v = T(g, "k", 1, 2, 4, 8), T(g, "v", 1, 2, 4, 8)
    g.sdpa(q, k, v, generate_stats=False)[0].set_output(True)


@case(Expect(node="sdpa_0", port="k", match="differs from q's"))
def sdpa_mixed_types(g):
    q, k, v = T(g, "q", 1, 2, 4, 8), T(g, "k", 1, 2, 4, 8, dt=FLOAT), T(g, "v", 1, 2, 4, 8)
    g.sdpa(q, k, v, generate_stats=False)[0].set_output(True)


@case(Expect(node="<graph>", port="x", match="no data type"))
def input_without_data_type(g):
    g.relu(T(g, "x", 4)).set_output(True).set_data_type(FLOAT)


@case(Expect(node="relu_0", port="Y", match="no data type.*io_data_type"))
def output_without_data_type(g):
    g.relu(T(g, "x", 4, dt=FLOAT)).set_output(True)


# ------------------------------------------------------------------------------------ missing ports

@case(Expect(when="build", node="add_0", port="b", match="required"))
def missing_required_port(g):
    g.add(T(g, "a", 4))


@case(Expect(when="build", node="lr", port="negative_slope", match="required"))
def missing_required_attr(g):
    g.leaky_relu(T(g, "x", 4), name="lr")


@case(Expect(when="build", node="reduction_0", port="mode", match="required"))
def reduction_without_mode(g):
    g.reduction(T(g, "x", 4, 4))


@case(Expect(node="instancenorm_backward_0", port="mean", match="saved mean"))
def instancenorm_backward_without_stats(g):
    x = T(g, "x", 2, 3, 4, 4)
    outs = g.instancenorm_backward(grad=T(g, "dy", 2, 3, 4, 4), input=x, scale=T(g, "s", 1, 3, 1, 1))
    for t in outs:
        t.set_output(True)


@case(Expect(node="batchnorm_0", port="in_running_var", match="together; got only in_running_mean"))
def batchnorm_partial_running_stats(g):
    x = T(g, "x", 2, 3, 4, 4)
    pc = [T(g, n, 1, 3, 1, 1, dt=FLOAT) for n in ("s", "b", "rm")]
    eps = g.tensor_scalar(1e-5)
    outs = g.batchnorm(input=x, scale=pc[0], bias=pc[1], in_running_mean=pc[2], epsilon=eps)
    for t in outs:
        if t is not None:
            t.set_output(True)


@case(Expect(node="sdpa_0", port="seq_len_q", match="use_padding_mask=True needs"))
def sdpa_padding_mask_without_lengths(g):
    q, k, v = T(g, "q", 1, 2, 4, 8), T(g, "k", 1, 2, 4, 8), T(g, "v", 1, 2, 4, 8)
    g.sdpa(q, k, v, generate_stats=False, use_padding_mask=True)[0].set_output(True)


@case(Expect(node="sdpa_0", port="generate_stats", match="exactly one"))
def sdpa_without_stats_choice(g):
    q, k, v = T(g, "q", 1, 2, 4, 8), T(g, "k", 1, 2, 4, 8), T(g, "v", 1, 2, 4, 8)
    g.sdpa(q, k, v)[0].set_output(True)


@case(Expect(node="sdpa_backward_0", port="dBias", match="needs bias"))
def sdpa_backward_dbias_without_bias(g):
    q, k, v = T(g, "q", 1, 2, 4, 8), T(g, "k", 1, 2, 4, 8), T(g, "v", 1, 2, 4, 8)
    o, do = T(g, "o", 1, 2, 4, 8), T(g, "dO", 1, 2, 4, 8)
    st = T(g, "stats", 1, 2, 4, 1, dt=FLOAT)
    db = T(g, "dBias", 1, 2, 4, 4, dt=FLOAT)
    for t in g.sdpa_backward(q, k, v, o, do, st, dBias=db):
        t.set_output(True)


# --------------------------------------------------------------------------- unused tensors / outputs

@case(Expect(node="act", port="Y", match="neither used"))
def unused_virtual_output(g):
    x = T(g, "x", 4)
    g.relu(x, name="act")                     # never consumed, never marked as an output
    g.neg(x).set_output(True)


@case(Expect(node="layernorm_0", port="mean", match="neither used"))
def unused_conditional_output(g):
    x = T(g, "x", 4, 8)
    y, mean, inv = g.layernorm(TRAINING, x, T(g, "s", 1, 8, dt=FLOAT), T(g, "b", 1, 8, dt=FLOAT),
                               g.tensor_scalar(1e-5))
    y.set_output(True)
    inv.set_output(True)


@case(Expect(node="relu_0", port="input", match="tensor 'x' has no dims"))
def input_without_dims(g):
    g.relu(g.tensor(name="x", data_type=FLOAT)).set_output(True)


# --------------------------------------------------------------------------------------- convolution

def _conv_inputs(g, c=4, k=8, hw=8, r=3):
    return T(g, "x", 2, c, hw, hw), T(g, "w", k, c, r, r)


@case(Expect(node="conv_fprop_0", port="padding", match="impossible conv padding"))
def conv_impossible_padding(g):
    x, w = T(g, "x", 1, 1, 2, 2), T(g, "w", 1, 1, 5, 5)
    g.conv_fprop(x, w, padding=[0, 0], stride=[1, 1], dilation=[1, 1]).set_output(True)


@case(Expect(node="conv_fprop_0", port="padding", match="impossible conv padding"))
def conv_dilation_too_large(g):
    x, w = _conv_inputs(g)
    g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[5, 5]).set_output(True)


@case(Expect(node="conv_fprop_0", port="padding", match="not set"))
def conv_padding_not_set(g):
    x, w = _conv_inputs(g)
    g.conv_fprop(x, w, stride=[1, 1], dilation=[1, 1]).set_output(True)


@case(Expect(node="conv_fprop_0", port="stride", match="3 entries; a 2-D convolution needs 2"))
def conv_stride_wrong_length(g):
    x, w = _conv_inputs(g)
    g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1, 1], dilation=[1, 1]).set_output(True)


@case(Expect(node="conv_fprop_0", port="padding", match="non-negative"))
def conv_negative_padding(g):
    x, w = _conv_inputs(g)
    g.conv_fprop(x, w, padding=[-1, 0], stride=[1, 1], dilation=[1, 1]).set_output(True)


@case(Expect(node="conv_fprop_0", port="weight", match="channel mismatch"))
def conv_channel_mismatch(g):
    x, w = T(g, "x", 2, 4, 8, 8), T(g, "w", 8, 3, 3, 3)
    g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1]).set_output(True)


@case(Expect(node="conv_fprop_0", port="image", match="rank 4"))
def conv_rank_three(g):
    x, w = T(g, "x", 2, 4, 8), T(g, "w", 8, 4, 3)
    g.conv_fprop(x, w, padding=[1], stride=[1], dilation=[1]).set_output(True)


@case(Expect(node="conv_dgrad_0", port="DX", match="set_dim|cannot infer"))
def conv_dgrad_output_dims_not_set(g):
    dy, w = T(g, "dy", 2, 8, 8, 8), T(g, "w", 8, 4, 3, 3)
    g.conv_dgrad(dy, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1]).set_output(True)


@case(Expect(node="conv_dgrad_0", port="DX", match="not the loss dims"))
def conv_dgrad_output_dims_inconsistent(g):
    dy, w = T(g, "dy", 2, 8, 8, 8), T(g, "w", 8, 4, 3, 3)
    dx = g.conv_dgrad(dy, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    dx.set_dim([2, 4, 9, 9]).set_output(True)


@case(Expect(node="conv_wgrad_0", port="DW", match="set_dim|cannot infer"))
def conv_wgrad_output_dims_not_set(g):
    x, dy = T(g, "x", 2, 4, 8, 8), T(g, "dy", 2, 8, 8, 8)
    g.conv_wgrad(x, dy, padding=[1, 1], stride=[1, 1], dilation=[1, 1]).set_output(True)


# --------------------------------------------------------------------------------------- reductions

@case(Expect(node="reduction_0", port="Y", match="axis 1 is 2"))
def reduction_output_non_one_reduced_dim(g):
    y = g.reduction(T(g, "x", 4, 6), mode=cudnn.reduction_mode.ADD)
    y.set_dim([4, 2]).set_output(True)


@case(Expect(node="reduction_0", port="Y", match="set_dim|must be set"))
def reduction_output_dims_not_set(g):
    g.reduction(T(g, "x", 4, 6), mode=cudnn.reduction_mode.MAX).set_output(True)


@case(Expect(node="reduction_0", port="Y", match="rank 1"))
def reduction_output_wrong_rank(g):
    g.reduction(T(g, "x", 4, 6), mode="ADD").set_dim([4]).set_output(True)


@case(Expect(when="build", node="reduction_0", port="mode", match="ADD"))
def reduction_unknown_mode(g):
    g.reduction(T(g, "x", 4, 6), mode="MEDIAN")


# --------------------------------------------------------------------------------------------- norms

@case(Expect(node="layernorm_0", port="scale", match="do not broadcast"))
def layernorm_scale_wrong_dims(g):
    x = T(g, "x", 4, 8)
    y, _, _ = g.layernorm(INFERENCE, x, T(g, "s", 1, 7, dt=FLOAT), T(g, "b", 1, 7, dt=FLOAT),
                          g.tensor_scalar(1e-5))
    y.set_output(True)


@case(Expect(node="rmsnorm_0", port="epsilon", match="exactly one element"))
def rmsnorm_epsilon_not_scalar(g):
    x = T(g, "x", 4, 8)
    y, _ = g.rmsnorm(INFERENCE, x, T(g, "s", 1, 8, dt=FLOAT), None, T(g, "eps", 2, dt=FLOAT))
    y.set_output(True)


@case(Expect(when="build", node="rmsnorm_backward_0", port="has_dbias", match="bool"))
def rmsnorm_backward_has_dbias_not_bool(g):
    x = T(g, "x", 4, 8)
    g.rmsnorm_backward(T(g, "dy", 4, 8), x, T(g, "s", 1, 8), T(g, "iv", 4, 1), has_dbias="yes")


@case(Expect(when="build", node="layernorm_0", port="norm_forward_phase", match="TRAINING or INFERENCE"))
def layernorm_bad_phase(g):
    g.layernorm("SOMETIMES", T(g, "x", 4, 8), T(g, "s", 1, 8), T(g, "b", 1, 8), g.tensor_scalar(1e-5))


# ----------------------------------------------------------------------------------------------- GQA

@case(Expect(node="sdpa_0", port="k", match="h_q=4, h_k=3"))
def gqa_key_heads_do_not_divide(g):
    q, k, v = T(g, "q", 1, 4, 8, 16), T(g, "k", 1, 3, 8, 16), T(g, "v", 1, 2, 8, 16)
    g.sdpa(q, k, v, generate_stats=False)[0].set_output(True)


@case(Expect(node="sdpa_0", port="v", match="h_q=6, h_v=4"))
def gqa_value_heads_do_not_divide(g):
    q, k, v = T(g, "q", 1, 6, 8, 16), T(g, "k", 1, 3, 8, 16), T(g, "v", 1, 4, 8, 16)
    g.sdpa(q, k, v, generate_stats=False)[0].set_output(True)


@case(Expect(node="sdpa_0", port="k", match="d_qk mismatch"))
def sdpa_head_dim_mismatch(g):
    q, k, v = T(g, "q", 1, 2, 8, 16), T(g, "k", 1, 2, 8, 8), T(g, "v", 1, 2, 8, 16)
    g.sdpa(q, k, v, generate_stats=False)[0].set_output(True)


@case(Expect(node="sdpa_0", port="dropout", match=r"\[0, 1\)"))
def sdpa_dropout_probability_out_of_range(g):
    q, k, v = T(g, "q", 1, 2, 4, 8), T(g, "k", 1, 2, 4, 8), T(g, "v", 1, 2, 4, 8)
    seed = T(g, "seed", 1, 1, 1, 1, dt=INT32)
    off = T(g, "offset", 1, 1, 1, 1, dt=INT32)
    g.sdpa(q, k, v, generate_stats=False, dropout=(1.5, seed, off))[0].set_output(True)


@case(Expect(node="sdpa_0", port="use_causal_mask_bottom_right", match="cannot both"))
def sdpa_two_causal_flags(g):
    q, k, v = T(g, "q", 1, 2, 4, 8), T(g, "k", 1, 2, 4, 8), T(g, "v", 1, 2, 4, 8)
    g.sdpa(q, k, v, generate_stats=False, use_causal_mask=True,
           use_causal_mask_bottom_right=True)[0].set_output(True)


# ------------------------------------------------------------------------------ the call itself

@case(Expect(exc=TypeError, when="build", match="unexpected keyword argument 'alpha'"))
def unknown_keyword(g):
    g.relu(T(g, "x", 4), alpha=0.1)


@case(Expect(exc=TypeError, when="build", match="at most 4 positional arguments"))
def too_many_positional_args(g):
    x = T(g, "x", 4)
    g.add(x, x, FLOAT, "name", "extra")


@case(Expect(exc=TypeError, when="build", match="multiple values for argument 'a'"))
def argument_given_twice(g):
    x = T(g, "x", 4)
    g.add(x, x, a=x)


@case(Expect(when="build", node="add_0", port="b", match="expects a Tensor.*got str"))
def non_tensor_port_value(g):
    g.add(T(g, "a", 4), "b")


@case(Expect(when="build", node="add_0", port="b", match="expects a Tensor.*got ndarray"))
def array_as_port_value(g):
    g.add(T(g, "a", 4), np.ones(4, np.float16))


@case(Expect(when="build", node="add_0", port="b", match="'alien' belongs to another graph"))
def tensor_from_another_graph(g):
    other = graph()
    g.add(T(g, "a", 4), T(other, "alien", 4))


@case(Expect(when="build", node="concatenate_0", port="inputs", match="another graph"))
def list_port_with_foreign_tensor(g):
    other = graph()
    g.concatenate([T(g, "a", 4), T(other, "b", 4)], axis=0)


@case(Expect(when="build", node="relu_0", port="negative_slope", match="could not convert|float"))
def attribute_of_wrong_type(g):
    g.relu(T(g, "x", 4), negative_slope="steep")


@case(Expect(when="build", node="relu_0", port="compute_data_type", match="no_such_type"))
def unknown_compute_data_type(g):
    g.relu(T(g, "x", 4), compute_data_type="no_such_type")


@case(Expect(exc=ValueError, when="build", match="2 strides for 3 dims"))
def tensor_stride_rank_mismatch(g):
    g.tensor(name="x", dim=[2, 3, 4], stride=[12, 4])


@case(Expect(exc=TypeError, when="build", match="dim must be a sequence of ints"))
def tensor_float_dims(g):
    g.tensor(name="x", dim=[2.5, 3])


@case(Expect(exc=TypeError, when="build", match="unknown data type name"))
def tensor_unknown_data_type(g):
    g.tensor(name="x", dim=[2], stride=[1], data_type="float13")


@case(Expect(exc=TypeError, when="build", match="ragged offset is a Tensor"))
def ragged_offset_not_a_tensor(g):
    g.tensor(name="x", dim=[2], stride=[1], ragged_offset=[0, 1, 2])


# ------------------------------------------------------------------- not supported (declined) graphs

@case(Expect(exc=GraphNotSupportedError, when="plan", match="block_mask"))
def reference_declines_sdpa_block_mask(g):
    q, k, v = T(g, "q", 1, 2, 128, 8), T(g, "k", 1, 2, 128, 8), T(g, "v", 1, 2, 128, 8)
    bm = T(g, "bm", 1, 2, 1, 1, dt=cudnn.data_type.UINT8)
    g.sdpa(q, k, v, generate_stats=False, block_mask=bm)[0].set_output(True)


@case(Expect(exc=GraphNotSupportedError, when="plan", match="Philox dropout"))
def reference_declines_philox_dropout(g):
    q, k, v = T(g, "q", 1, 2, 4, 8), T(g, "k", 1, 2, 4, 8), T(g, "v", 1, 2, 4, 8)
    seed = T(g, "seed", 1, 1, 1, 1, dt=INT32)
    off = T(g, "offset", 1, 1, 1, 1, dt=INT32)
    g.sdpa(q, k, v, generate_stats=False, dropout=(0.1, seed, off))[0].set_output(True)


@case(Expect(exc=GraphNotSupportedError, when="plan", match="sdpa_backward: score_mod"))
def reference_declines_backward_score_mod(g):
    q, k, v, o, d_o = (T(g, name, 1, 2, 4, 8) for name in ("q", "k", "v", "o", "dO"))
    stats = T(g, "stats", 1, 2, 4, 1, dt=FLOAT)
    for grad in g.sdpa_backward(q, k, v, o, d_o, stats, score_mod=lambda graph, score: score):
        grad.set_output(True)


@case(Expect(exc=GraphNotSupportedError, when="plan", match="FP4_E2M1"))
def reference_declines_unhostable_type(g):
    g.identity(T(g, "x", 8, dt=cudnn.data_type.FP4_E2M1)).set_output(True).set_data_type(FLOAT)


# ----------------------------------------------------------------------------------------------- run

@pytest.fixture
def reference_only(monkeypatch):
    monkeypatch.setattr(manifest, "_loaded", [ReferenceEngine()])


def _state(g):
    return [t.name for t in g.tensors], [n.name for n in g.nodes]


@pytest.mark.parametrize("name", sorted(CASES))
def test_invalid_graph_raises_a_typed_error(name, reference_only):
    fn, expect = CASES[name]
    g = graph(io_data_type=None) if name in ("input_without_data_type", "output_without_data_type") else graph()
    if expect.when == "build":
        with pytest.raises(expect.exc, match=expect.match) as info:
            fn(_Recorder(g))
        # Whatever the case built before the failing call survives it unchanged.
        assert _state(g) == _Recorder.last_snapshot, "a failed builder call changed the graph"
    else:
        fn(g)                                          # builds fine ...
        if expect.when == "validate":
            with pytest.raises(expect.exc, match=expect.match) as info:
                g.validate()                           # ... and validate() says what is wrong
            with pytest.raises(expect.exc):
                g.build()                              # and build() refuses it the same way
            assert not g.frozen
        else:                                          # valid, but no engine can run it here
            g.validate()
            with pytest.raises(expect.exc, match=expect.match) as info:
                g.build()
            assert isinstance(info.value, PlanEntryError)
    err = info.value
    if isinstance(err, GraphValidationError):
        assert err.node == expect.node, str(err)
        assert err.port == expect.port, str(err)
        assert f"node '{err.node}'" in str(err) and f"port '{err.port}'" in str(err)
    else:
        assert type(err) is expect.exc or isinstance(err, expect.exc)


class _Recorder:
    """Passes every attribute through to the graph and snapshots its tensors and nodes before each
    call, so the test can check that the call that failed left nothing behind."""

    last_snapshot = None

    def __init__(self, g):
        self._g = g
        _Recorder.last_snapshot = _state(g)

    def __getattr__(self, name):
        attr = getattr(self._g, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            _Recorder.last_snapshot = _state(self._g)
            return attr(*args, **kwargs)
        return call


def test_there_are_enough_cases():
    assert len(CASES) >= 25
    kinds = {e.exc for _, e in CASES.values()}
    assert {GraphValidationError, TypeError, ValueError, GraphNotSupportedError} <= kinds


def test_validation_error_is_a_value_error_with_fields():
    g = graph()
    g.add(T(g, "a", 2, 3), T(g, "b", 2, 4), name="sum").set_output(True)
    with pytest.raises(ValueError) as info:
        g.validate()
    err = info.value
    assert isinstance(err, GraphValidationError)
    assert (err.node, err.op, err.port) == ("sum", "add", "b")


def test_fixing_the_graph_makes_it_valid():
    g = graph()
    a, b = T(g, "a", 2, 3), T(g, "b", 2, 4)
    y = g.add(a, b).set_output(True)
    with pytest.raises(GraphValidationError):
        g.validate()
    b.set_dim([2, 3]).set_stride([3, 1])
    g.validate()
    assert y.dim == (2, 3)


def test_a_builder_call_that_fails_on_a_scalar_leaves_no_scalar_tensor():
    g = graph()
    q, k, v = T(g, "q", 1, 2, 4, 8), T(g, "k", 1, 2, 4, 8), T(g, "v", 1, 2, 4, 8)
    n = len(g.tensors)
    with pytest.raises(GraphValidationError, match="bias"):
        g.sdpa(q, k, v, generate_stats=False, attn_scale=0.5, bias="not a tensor")
    with pytest.raises(TypeError):
        g.sdpa(q, k, v, generate_stats=False, attn_scale=0.5, alpha=1)
    assert len(g.tensors) == n and g.nodes == ()
    o, _ = g.sdpa(q, k, v, generate_stats=False, attn_scale=0.5)
    assert len(g.tensors) == n + 2                     # the scale scalar and O
    assert g.nodes[0].inputs["attn_scale"].dim == (1, 1, 1, 1)
    o.set_output(True)
    g.validate()
