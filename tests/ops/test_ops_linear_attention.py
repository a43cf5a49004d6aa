"""Linear-attention op schemas: grouped value heads (HV a multiple of H), the gate options (safe_gate,
gate_lower_bound, use_beta_sigmoid, allow_neg_eigval with a_log / dt_bias) and gdn2_bwd — inferred dims and
types, and the typed error naming the port for each bad input."""
from __future__ import annotations

import pytest

from cudnn_graph.data_type import DataType
from cudnn_graph.errors import GraphValidationError
from cudnn_graph.ops import SCHEMAS
from cudnn_graph.ops._linear_attention import beta_transform, chunk_cache_layout, gate_transform
from cudnn_graph.ops.schema import REQUIRED, InferContext, TensorInfo

F32, BF16, I32 = DataType.FLOAT, DataType.BFLOAT16, DataType.INT32
T_, H, HV, K, V, N = 9, 2, 6, 4, 3, 3


def T(*dim, dt=F32):
    stride, acc = [], 1
    for d in reversed(dim):
        stride.insert(0, acc)
        acc *= d
    return TensorInfo(dim=tuple(dim), stride=tuple(stride), data_type=dt)


def infer(op, inputs, **given):
    schema = SCHEMAS[op]
    attrs = {}
    for a in schema.attrs:
        if a.name in given:
            v = given[a.name]
            attrs[a.name] = a.convert(v) if (a.convert and v is not None) else v
        elif a.default is not REQUIRED:
            attrs[a.name] = a.default
    full = {p.name: inputs.get(p.name) for p in schema.inputs}
    ctx = InferContext(node="n0", op=op, inputs=full, attrs=attrs)
    return schema.infer(ctx)


def forward_inputs(op, heads=HV, gate_dt=F32, **extra):
    per_channel = op.startswith(("kda", "gdn2"))
    d = {"q": T(T_, H, K, dt=BF16), "k": T(T_, H, K, dt=BF16), "v": T(T_, heads, V, dt=BF16),
         "g": T(T_, heads, K, dt=gate_dt) if per_channel else T(T_, heads, dt=gate_dt),
         "beta": T(T_, heads, K, dt=BF16) if op.startswith("gdn2") else T(T_, heads, dt=BF16),
         "cu_seqlens": T(N + 1, dt=I32), "initial_state": T(N, heads, K, V)}
    if op.startswith("gdn2"):
        d["w"] = T(T_, heads, V, dt=BF16)
    if op.endswith("_bwd"):
        d["dO"] = T(T_, heads, V, dt=BF16)
        d["d_final_state"] = T(N, heads, K, V)
    d.update(extra)
    return d


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
def test_grouped_value_heads_give_outputs_and_states_with_hv_heads(op):
    out = infer(op, forward_inputs(op), output_final_state=True)
    assert out["o"].dim == (T_, HV, V) and out["o"].data_type is BF16
    assert out["final_state"].dim == (N, HV, K, V) and out["final_state"].data_type is F32


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd", "gdn2_bwd"])
def test_grouped_value_heads_backward_gives_dq_dk_with_query_heads(op):
    out = infer(op, forward_inputs(op))
    assert out["dq"].dim == out["dk"].dim == (T_, H, K)
    assert out["dv"].dim == (T_, HV, V)
    assert out["dg"].data_type is F32 and out["dg"].dim[:2] == (T_, HV)
    assert out["d_initial_state"].dim == (N, HV, K, V)
    assert ("dw" in out) == (op == "gdn2_bwd")
    if op == "gdn2_bwd":
        assert out["dw"].dim == (T_, HV, V) and out["dw"].data_type is BF16
        assert out["dbeta"].dim == (T_, HV, K)


@pytest.mark.parametrize("op", ["gdn", "kda_bwd", "gdn2", "gdn2_bwd"])
def test_value_heads_not_a_multiple_of_query_heads_name_v(op):
    with pytest.raises(GraphValidationError) as e:
        infer(op, forward_inputs(op, heads=5))
    assert e.value.port == "v" and "HV=5" in str(e.value) and "H=2" in str(e.value)


@pytest.mark.parametrize("port", ["g", "beta", "initial_state"])
def test_a_value_head_tensor_with_query_heads_is_named(port):
    bad = forward_inputs("kda", heads=H)[port]
    with pytest.raises(GraphValidationError) as e:
        infer("kda", forward_inputs("kda", **{port: bad}))
    assert e.value.port == port


def test_gdn2_bwd_outputs_follow_the_frontends_order():
    schema = SCHEMAS["gdn2_bwd"]
    assert schema.output_names() == ("dq", "dk", "dv", "dg", "dbeta", "dw", "d_initial_state", "d_a_log",
                                     "d_dt_bias")
    assert tuple(schema.positional) == ("q", "k", "v", "g", "beta", "w", "dO")
    out = infer("gdn2_bwd", forward_inputs("gdn2_bwd", initial_state=None))
    assert "d_initial_state" not in out


# ------------------------------------------------------------------------------------------ gate options

@pytest.mark.parametrize("op, dt_dims", [("gdn", (HV,)), ("kda", (HV, K)), ("gdn2_bwd", (HV, K))])
def test_safe_gate_takes_a_log_and_dt_bias_per_value_head(op, dt_dims):
    inputs = forward_inputs(op, gate_dt=BF16, a_log=T(HV), dt_bias=T(*dt_dims, dt=BF16))
    out = infer(op, inputs, safe_gate=True, use_beta_sigmoid=True, allow_neg_eigval=True)
    if op.endswith("_bwd"):
        assert out["d_a_log"].dim == (HV,) and out["d_a_log"].data_type is F32
        assert out["d_dt_bias"].dim == dt_dims and out["d_dt_bias"].data_type is BF16
        assert out["dg"].data_type is F32


@pytest.mark.parametrize("op, inputs, attrs, port", [
    ("gdn", {"a_log": T(HV)}, {}, "a_log"),                                     # a_log without safe_gate
    ("kda", {"dt_bias": T(HV, K)}, {}, "dt_bias"),
    ("gdn", {"a_log": T(H)}, {"safe_gate": True}, "a_log"),                     # query heads, not value heads
    ("gdn", {"dt_bias": T(HV, K)}, {"safe_gate": True}, "dt_bias"),             # gdn's bias is per head
    ("kda", {"dt_bias": T(HV)}, {"safe_gate": True}, "dt_bias"),                # kda's is per head and channel
    ("kda", {"a_log": T(HV, dt=I32)}, {"safe_gate": True}, "a_log"),
    ("gdn", {"g": T(T_, HV, dt=BF16)}, {}, "g"),                                # a raw gate type without safe_gate
    ("kda", {}, {"gate_lower_bound": -5.0}, "g"),                               # bound without safe_gate
    ("gdn", {}, {"allow_neg_eigval": True}, "beta"),                            # needs use_beta_sigmoid
])
def test_gate_option_misuse_names_the_port(op, inputs, attrs, port):
    with pytest.raises(GraphValidationError) as e:
        infer(op, forward_inputs(op, **inputs), **attrs)
    assert e.value.port == port


def test_gate_lower_bound_is_a_kda_and_gdn2_attribute_and_must_be_negative():
    assert "gate_lower_bound" not in {a.name for a in SCHEMAS["gdn"].attrs}
    assert {"gate_lower_bound", "safe_gate", "use_beta_sigmoid", "allow_neg_eigval"} <= {
        a.name for a in SCHEMAS["gdn2_bwd"].attrs}
    convert = next(a for a in SCHEMAS["kda"].attrs if a.name == "gate_lower_bound").convert
    assert convert(-3) == -3.0
    for bad in (0.0, 1.0, float("nan")):
        with pytest.raises(ValueError, match="gate_lower_bound"):
            convert(bad)


def test_gate_and_beta_transforms_read_the_attributes():
    assert gate_transform("gdn", {}) == "none"
    assert gate_transform("gdn", {"safe_gate": True}) == "softplus"
    assert gate_transform("kda", {"safe_gate": True, "gate_lower_bound": None}) == "softplus"
    assert gate_transform("kda_bwd", {"safe_gate": True, "gate_lower_bound": -5.0}) == "sigmoid"
    assert beta_transform({}) == 0.0
    assert beta_transform({"use_beta_sigmoid": True}) == 1.0
    assert beta_transform({"use_beta_sigmoid": True, "allow_neg_eigval": True}) == 2.0


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
def test_checkpoint_cadence_gives_a_state_checkpoints_output_of_t_over_n_plus_n_rows(op):
    out = infer(op, forward_inputs(op), checkpoint_every_n_tokens=4)
    assert out["state_checkpoints"].dim == (T_ // 4 + N, HV, K, V)
    assert out["state_checkpoints"].data_type is BF16          # q's type unless the graph sets FLOAT
    assert "state_checkpoints" not in infer(op, forward_inputs(op))


@pytest.mark.parametrize("value, error", [(-1, ValueError), (2.0, TypeError), (True, TypeError)])
def test_checkpoint_cadence_must_be_a_non_negative_int(value, error):
    with pytest.raises(error, match="checkpoint_every_n_tokens"):
        next(a for a in SCHEMAS["gdn"].attrs if a.name == "checkpoint_every_n_tokens").convert(value)


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd", "gdn2_bwd"])
def test_backward_takes_the_forwards_checkpoints_with_their_cadence(op):
    rows = T_ // 4 + N
    out = infer(op, forward_inputs(op, state_checkpoints=T(rows, HV, K, V, dt=BF16)), checkpoint_every_n_tokens=4)
    assert out["dq"].dim == (T_, H, K)
    infer(op, forward_inputs(op, state_checkpoints=T(rows, HV, K, V)), checkpoint_every_n_tokens=4)   # FLOAT too


@pytest.mark.parametrize("inputs, attrs, says", [
    ({}, {"checkpoint_every_n_tokens": 4}, "is missing"),
    ({"state_checkpoints": T(T_ // 4 + N, HV, K, V, dt=BF16)}, {}, "checkpoint_every_n_tokens=0"),
    ({"state_checkpoints": T(T_ // 4 + N - 1, HV, K, V, dt=BF16)}, {"checkpoint_every_n_tokens": 4}, "T // 4 + N"),
    ({"state_checkpoints": T(T_ // 4 + N, HV, V, K, dt=BF16)}, {"checkpoint_every_n_tokens": 4}, "HV, K, V"),
    ({"state_checkpoints": T(T_ // 4 + N, HV, K, V, dt=DataType.HALF)}, {"checkpoint_every_n_tokens": 4}, "HALF"),
])
def test_backward_checkpoint_misuse_names_state_checkpoints(inputs, attrs, says):
    with pytest.raises(GraphValidationError) as e:
        infer("gdn_bwd", forward_inputs("gdn_bwd", **inputs), **attrs)
    assert e.value.port == "state_checkpoints" and says in str(e.value)


def test_the_chunk_cache_is_the_byte_size_of_its_layout_for_gdn_and_kda_alone():
    size, regions = chunk_cache_layout(T_, N, HV, K, BF16)
    # ceil(T / 64) + N chunk places; gate sums in f32, w / kd / T in the input type, each region 256-byte aligned
    assert regions["t"][1] == (1 + N, HV, 64, 64) and regions["gate_sums"][1] == (T_, HV)
    assert all(offset % 256 == 0 for offset, _, _ in regions.values())
    assert infer("gdn", forward_inputs("gdn"), chunk_cache=True)["chunk_cache"].dim == (size,)
    assert infer("gdn", forward_inputs("gdn"), chunk_cache=True)["chunk_cache"].data_type is DataType.UINT8
    assert "chunk_cache" not in infer("gdn", forward_inputs("gdn"))
    # kda's gate sums are per key channel
    per_channel, regions = chunk_cache_layout(T_, N, HV, K, BF16, per_channel_gate=True)
    assert regions["gate_sums"][1] == (T_, HV, K) and per_channel > size
    assert infer("kda", forward_inputs("kda"), chunk_cache=True)["chunk_cache"].dim == (per_channel,)
    infer("kda_bwd", forward_inputs("kda_bwd", chunk_cache=T(per_channel, dt=DataType.UINT8)))
    assert all("chunk_cache" not in SCHEMAS[op].port_names() + tuple(a.name for a in SCHEMAS[op].attrs)
               for op in ("gdn2", "gdn2_bwd"))


def test_a_gdn_forward_returns_pygraphs_list_with_the_chunk_cache_in_the_callers_tensor():
    import cudnn_graph as cudnn
    g = cudnn.pygraph(device="cpu")
    t = {name: g.tensor(name=name, dim=list(info.dim), stride=list(info.stride), data_type=info.data_type)
         for name, info in forward_inputs("gdn").items()}
    cache = g.tensor(name="cache")
    out = g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=t["cu_seqlens"], chunk_cache=cache,
                checkpoint_every_n_tokens=4)
    assert len(out) == 3 and cache.producer is not None


@pytest.mark.parametrize("cache, says", [(T(7, dt=DataType.UINT8), "bytes"), (None, "UINT8")])
def test_backward_chunk_cache_misuse_names_it(cache, says):
    size, _ = chunk_cache_layout(T_, N, HV, K, BF16)
    given = cache if cache is not None else T(size // 4, dt=F32)
    with pytest.raises(GraphValidationError) as e:
        infer("gdn_bwd", forward_inputs("gdn_bwd", chunk_cache=given))
    assert e.value.port == "chunk_cache" and says in str(e.value)
    infer("gdn_bwd", forward_inputs("gdn_bwd", chunk_cache=T(size, dt=DataType.UINT8)))
