"""Invalid graph arguments fail where they are given, naming them (issue 20): tensor dims and strides,
the graph's device, build()'s heur_modes and build_plans()'s policy, user uids; and a tensor name
several tensors share is refused as a variant-pack key instead of silently meaning the last of them.

Each error is a typed ``CudnnGraphError`` that keeps the builtin its plain predecessor was
(ValueError / TypeError), so existing ``except`` clauses still match.
"""
from __future__ import annotations

import enum

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import (AmbiguousTensorNameError, InvalidArgumentError, InvalidArgumentTypeError,
                         InvalidDeviceError, UidCollisionError, UnknownTensorError)
from cudnn_graph.engines import manifest
from cudnn_graph.engines.base import BaseEngine
from cudnn_graph.engines.reference import ReferenceEngine

FLOAT = cudnn.data_type.FLOAT


@pytest.fixture
def reference_only(monkeypatch):
    monkeypatch.setattr(manifest, "_loaded", [ReferenceEngine()])


def host_graph(**kw):
    return cudnn.pygraph(io_data_type=FLOAT, compute_data_type=FLOAT, device="cpu", **kw)


def relu_graph():
    g = host_graph()
    x = g.tensor(name="x", dim=[4], stride=[1])
    return g, x, g.relu(x).set_output(True)


def test_the_argument_errors_are_exported_and_keep_their_builtins():
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(InvalidArgumentTypeError, TypeError) and issubclass(InvalidArgumentTypeError, ValueError)
    assert issubclass(InvalidDeviceError, InvalidArgumentTypeError)
    assert issubclass(UidCollisionError, ValueError)
    assert issubclass(AmbiguousTensorNameError, UnknownTensorError)
    for name in ("InvalidArgumentError", "InvalidArgumentTypeError", "InvalidDeviceError", "UidCollisionError",
                 "AmbiguousTensorNameError"):
        assert name in cudnn.__all__ and name in cudnn.errors.__all__
        assert issubclass(getattr(cudnn, name), cudnn.CudnnGraphError)


# ------------------------------------------------------------------------------- dims and strides

def test_a_negative_dim_is_refused_at_tensor_naming_the_tensor_and_the_index():
    g = host_graph()
    with pytest.raises(InvalidArgumentError, match=r"tensor 'x': dim\[1\] must be a non-negative int; got -1") as info:
        g.tensor(name="x", dim=[2, -1, 3])
    assert (info.value.argument, info.value.got, info.value.tensor_name) == ("dim[1]", -1, "x")
    assert g.tensors == ()                    # nothing half-made was left behind


@pytest.mark.parametrize("dim, argument", [([2, True], "dim[1]"), ([2.0, 3], "dim"), ([np.float32(2)], "dim"),
                                           (5, "dim"), ("23", "dim")])
def test_non_integer_dims_are_refused_at_tensor(dim, argument):
    g = host_graph()
    with pytest.raises(InvalidArgumentTypeError, match="tensor 'x': dim") as info:
        g.tensor(name="x", dim=dim)
    assert info.value.argument == argument and g.tensors == ()


def test_numpy_integer_dims_and_zero_dims_are_accepted():
    g = host_graph()
    t = g.tensor(name="x", dim=[np.int64(2), np.int32(0)], stride=[1, 1])
    assert t.dim == (2, 0) and type(t.dim[0]) is int


def test_a_bool_stride_is_refused_but_negative_and_zero_strides_are_declared_as_given():
    g = host_graph()
    with pytest.raises(InvalidArgumentTypeError, match=r"stride\[0\] must be an int"):
        g.tensor(name="x", dim=[2, 3], stride=[False, 1])
    # A zero stride broadcasts and a negative one walks backwards: the buffer check compares them.
    assert g.tensor(name="y", dim=[2, 3], stride=[0, -1]).stride == (0, -1)


def test_a_stride_list_of_the_wrong_length_is_refused_at_tensor():
    g = host_graph()
    with pytest.raises(InvalidArgumentError, match="2 strides for 3 dims") as info:
        g.tensor(name="x", dim=[2, 3, 4], stride=[12, 4])
    assert info.value.argument == "stride" and info.value.tensor_name == "x"


def test_set_dim_and_set_stride_refuse_negative_and_non_integer_values_naming_the_tensor():
    g = host_graph()
    t = g.tensor(name="x", dim=[2, 3], stride=[3, 1])
    with pytest.raises(InvalidArgumentError, match=rf"tensor 'x' \(uid {t.uid}\): dim\[0\] must be a non-negative"):
        t.set_dim([-2, 3])
    with pytest.raises(InvalidArgumentTypeError, match=r"stride must be a sequence of ints"):
        t.set_stride([3.5, 1])
    assert t.dim == (2, 3) and t.stride == (3, 1)   # a refused setter changes nothing


def test_a_rank_change_through_the_setters_must_agree_by_validate():
    g = host_graph()
    x = g.tensor(name="x", dim=[2, 3], stride=[3, 1])
    g.relu(x).set_output(True)
    x.set_dim([2, 3, 4])                      # set_stride may follow: not refused yet
    with pytest.raises(cudnn.GraphValidationError, match="2 strides for 3 dims") as info:
        g.validate()
    assert info.value.port == "x"
    x.set_stride([12, 4, 1])
    g.validate()


# -------------------------------------------------------------------------------------------- device

@pytest.mark.parametrize("device, code", [("cpu", (1, 0)), ("CPU", (1, 0)), (" cpu:0 ", (1, 0)), ("cuda", (2, 0)),
                                          ("cuda:3", (2, 3)), (2, (2, 2)), (("cuda", 1), (2, 1)),
                                          (("cpu", 0), (1, 0)), ((2, np.int64(1)), (2, 1)), ((1, 0), (1, 0))])
def test_every_documented_device_form_is_accepted(device, code):
    assert host_graph().__class__(device=device).device_code == code
    assert cudnn.pygraph().set_device(device).device_code == code


# ("gpu" as a test id would mark the case a GPU test: conftest skips those without a GPU.)
@pytest.mark.parametrize("device", [pytest.param("gpu", id="gpu_alias"), "gpu:0", "host", "tpu", "cuda_host", "opencl", "cuda:", "cuda:x",
                                    "cuda:-1", "cpu:1", "", (3, 0), ("rocm", 0), ("cuda", -1), ("cuda", 1.0),
                                    ("cuda",), -1, True, 1.5, object()])
def test_an_unknown_device_is_refused_at_the_constructor_listing_the_accepted_forms(device):
    with pytest.raises(InvalidDeviceError) as info:
        cudnn.pygraph(device=device)
    err = info.value
    assert err.argument == "device" and err.got == device
    assert "'cpu', 'cuda', 'cuda:N'" in str(err)
    with pytest.raises(InvalidDeviceError):
        cudnn.pygraph().set_device(device)


def test_gpu_is_refused_with_the_spelling_to_use():
    with pytest.raises(InvalidDeviceError, match="'gpu' is spelled 'cuda' here"):
        cudnn.pygraph(device="gpu")


# ----------------------------------------------------------------------------- heur_modes and policy

@pytest.mark.parametrize("heur_modes, argument", [
    ("A", "build(heur_modes)"),
    (cudnn.heur_mode.A, "build(heur_modes)"),
    ({"A": 1}, "build(heur_modes)"),
    (["A"], "build(heur_modes)[0]"),
    ([cudnn.heur_mode.A, "FALLBACK"], "build(heur_modes)[1]"),
    ([True], "build(heur_modes)[0]"),
    ([7], "build(heur_modes)[0]"),
    ([3.0], "build(heur_modes)[0]"),
])
def test_build_refuses_what_is_not_a_list_of_heur_modes_before_touching_the_graph(heur_modes, argument):
    g, *_ = relu_graph()
    with pytest.raises(InvalidArgumentTypeError) as info:
        g.build(heur_modes)
    assert info.value.argument == argument and "heur_mode" in str(info.value)
    assert not g.frozen                       # refused where given: nothing was validated or frozen
    with pytest.raises(InvalidArgumentTypeError) as info:
        g.create_execution_plans(heur_modes)
    assert info.value.argument == argument.replace("build", "create_execution_plans")


class _ModesSeen(BaseEngine):
    """Proposes nothing; records the modes it was asked for."""

    name = "modes-seen"
    engine_id = 30_419

    def __init__(self):
        self.modes = None

    def propose_plans(self, graph):
        return []

    def propose_plans_for_modes(self, graph, modes):
        self.modes = list(modes)
        return []


class _FrontendHeurMode(enum.IntEnum):
    """A stand-in for another module's heur_mode (cudnn-frontend's own): matched by member name."""
    A = 0
    FALLBACK = 1


@pytest.mark.parametrize("given", [[cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK], (cudnn.heur_mode.A, 2),
                                   [_FrontendHeurMode.A, _FrontendHeurMode.FALLBACK]])
def test_heur_modes_reach_the_engines_as_heur_mode_members(monkeypatch, given):
    seen = _ModesSeen()
    monkeypatch.setattr(manifest, "_loaded", [seen, ReferenceEngine()])
    g, *_ = relu_graph()
    g.build(given)
    assert seen.modes == [cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK]
    assert all(type(m) is cudnn.heur_mode for m in seen.modes)


@pytest.mark.parametrize("policy", ["ALL", "all", True, 7, [cudnn.build_plan_policy.ALL]])
def test_build_plans_refuses_a_policy_that_is_not_a_build_plan_policy(reference_only, policy):
    g, *_ = relu_graph()
    g.create_execution_plans()
    with pytest.raises(InvalidArgumentTypeError, match=r"build_plans\(policy\) must be a build_plan_policy") as info:
        g.build_plans(policy)
    assert "HEURISTICS_CHOICE, ALL" in str(info.value)
    assert g.compiled_plan() is None


@pytest.mark.parametrize("policy", [None, cudnn.build_plan_policy.ALL, cudnn.build_plan_policy.HEURISTICS_CHOICE, 1])
def test_build_plans_takes_its_policies(reference_only, policy):
    g, x, y = relu_graph()
    g.create_execution_plans()
    g.build_plans(policy)
    assert g.compiled_plan() is not None


# ---------------------------------------------------------------------------------------------- uids

def test_two_user_uids_that_collide_name_both_tensors_and_the_uid():
    g = host_graph()
    g.tensor(name="a", dim=[2], uid=7)
    with pytest.raises(UidCollisionError, match="uid 7 is already held by tensor 'a'; tensor 'b' cannot take it") as info:
        g.tensor(name="b", dim=[2], uid=7)
    assert (info.value.uid, info.value.holder, info.value.claimant) == (7, "a", "b")
    assert [t.name for t in g.tensors] == ["a"]
    c = g.tensor(name="c", dim=[2])
    with pytest.raises(UidCollisionError, match="tensor 'c' cannot take it"):
        c.set_uid(7)


def test_a_user_uid_displacing_an_auto_uid_keeps_every_auto_name_distinct():
    g = host_graph()
    first = g.tensor(dim=[2])
    second = g.tensor(dim=[2], uid=first.uid)     # takes the number; `first` is renumbered
    third = g.tensor(dim=[2])
    assert second.uid != first.uid
    names = [t.name for t in g.tensors]
    assert len(set(names)) == len(names), names


# --------------------------------------------------------------------------------- duplicate names

def duplicate_name_graph():
    # Names are labels in cudnn.pygraph: two tensors may share one (the frontend's own tests do).
    g = host_graph()
    w1 = g.tensor(name="w", dim=[4], stride=[1])
    w2 = g.tensor(name="w", dim=[4], stride=[1])
    y = g.add(w1, w2).set_output(True)
    return g, w1, w2, y


def test_two_tensors_may_share_a_name(reference_only):
    g, w1, w2, y = duplicate_name_graph()
    g.build()
    A, B, Y = np.ones(4, np.float32), np.full(4, 2, np.float32), np.zeros(4, np.float32)
    g.execute({w1: A, w2: B, y: Y})
    np.testing.assert_array_equal(Y, A + B)
    g.execute({w1.uid: A, w2.uid: B, y.name: Y})   # uids, and a name that is unique, still key it


def test_a_shared_name_as_a_pack_key_is_ambiguous_naming_the_uids(reference_only):
    g, w1, w2, y = duplicate_name_graph()
    g.build()
    A, Y = np.ones(4, np.float32), np.zeros(4, np.float32)
    with pytest.raises(AmbiguousTensorNameError, match="tensor name 'w' is ambiguous") as info:
        g.execute({"w": A, w2: A, y: Y})
    assert info.value.uids == (w1.uid, w2.uid) and info.value.tensor_name == "w"
    assert not Y.any()


def test_an_unknown_name_is_still_unknown(reference_only):
    g, w1, w2, y = duplicate_name_graph()
    g.build()
    with pytest.raises(UnknownTensorError, match="no tensor named 'v'") as info:
        g.execute({"v": np.ones(4, np.float32), w1: np.ones(4, np.float32), w2: np.ones(4, np.float32),
                   y: np.zeros(4, np.float32)})
    assert not isinstance(info.value, AmbiguousTensorNameError)


def test_a_layout_maps_a_shared_name_to_all_its_uids():
    layout = cudnn.PackLayout([cudnn.TensorSpec(1, (4,), "float32", device="cpu", name="w"),
                               cudnn.TensorSpec(2, (4,), "float32", device="cpu", name="w"),
                               cudnn.TensorSpec(3, (4,), "float32", device="cpu", name="w"),
                               cudnn.TensorSpec(4, (4,), "float32", device="cpu", name="y", is_output=True)])
    with pytest.raises(AmbiguousTensorNameError) as info:
        layout.pack({"w": np.ones(4, np.float32)})
    assert info.value.uids == (1, 2, 3)
