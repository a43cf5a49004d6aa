"""cudnn-frontend's graph helpers on the host: ``with graph(handle) as (g, uids)``, ``with pygraph(...)``
and the ``graph_cache`` decorator, ported the way the frontend's own tests use them."""
import threading

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph.errors import InvalidArgumentError

F = cudnn.data_type


# ---- graph(handle, ...) --------------------------------------------------------------------------

def test_graph_yields_a_pygraph_and_an_empty_list_with_the_frontends_default_types():
    with cudnn.graph(None, device="cpu") as (g, uids):
        pass
    assert isinstance(g, cudnn.pygraph)
    assert uids == []
    assert g.context.name == "cudnn_graph"
    assert cudnn.data_type_of(g.context.io_data_type) is F.HALF
    assert cudnn.data_type_of(g.context.intermediate_data_type) is F.FLOAT
    assert cudnn.data_type_of(g.context.compute_data_type) is F.FLOAT


def test_graph_yields_a_fresh_list_each_time():
    with cudnn.graph(None, device="cpu") as (_, first):
        first.append("x")
    with cudnn.graph(None, device="cpu") as (_, second):
        pass
    assert second == []


def test_graph_forwards_its_arguments_to_pygraph():
    class Handle:
        device = "cpu"

    handle = Handle()
    with cudnn.graph(handle, "g1", F.FLOAT, F.FLOAT, F.FLOAT, is_override_shape_enabled=True) as (g, _):
        pass
    assert g.handle is handle and g.device == ("cpu", 0)
    assert g.context.name == "g1" and cudnn.data_type_of(g.context.io_data_type) is F.FLOAT
    assert g.is_override_shape_enabled


def test_leaving_graph_builds_nothing():
    with cudnn.graph(None, io_data_type=F.FLOAT, device="cpu") as (g, _):
        x = g.tensor(name="x", dim=[2], stride=[1])
        g.relu(x).set_output(True)
    assert not g.frozen
    assert g.get_execution_plan_count() == 0        # nothing planned (0 before planning, as in cudnn.pygraph)
    assert not hasattr(g, "plans")


def test_an_error_inside_graph_propagates():
    with pytest.raises(ZeroDivisionError):
        with cudnn.graph(None, device="cpu") as (g, _):
            1 / 0


def test_graph_then_build_then_execute_by_uid_as_the_frontends_tests_do():
    a = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    with cudnn.graph(None, io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu") as (g, _):
        X = g.tensor_like(a)
        Y = g.relu(input=X)
        Y.set_output(True)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    out = np.empty_like(a)
    g.execute({X.get_uid(): a, Y.get_uid(): out}, None, handle=None)
    np.testing.assert_array_equal(out, np.maximum(a, 0))


# ---- pygraph as a context manager ----------------------------------------------------------------

def test_pygraph_in_a_with_block_is_itself_and_its_end_builds_nothing():
    with cudnn.pygraph(io_data_type=F.FLOAT, device="cpu") as g:
        x = g.tensor(name="x", dim=[2], stride=[1])
        g.relu(x).set_output(True)
    assert isinstance(g, cudnn.pygraph) and not g.frozen
    g.build([cudnn.heur_mode.A])
    out = np.empty(2, np.float32)
    g.execute({x: np.array([-1.0, 2.0], np.float32), g.nodes[0].outputs["Y"]: out})
    assert out.tolist() == [0.0, 2.0]


def test_an_error_inside_a_pygraph_block_propagates():
    with pytest.raises(ValueError, match="inside"):
        with cudnn.pygraph(device="cpu"):
            raise ValueError("inside")


# ---- graph_cache ---------------------------------------------------------------------------------

def conv_reduce_key(handle, x, w):
    return (x.shape, x.strides, w.shape, w.strides, x.dtype, w.dtype)


def make_cached_factory(calls):
    @cudnn.graph_cache(key_fn=conv_reduce_key)
    def create(handle, x, w):
        calls.append((x.shape, w.shape))
        with cudnn.graph(handle, io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu") as (g, _):
            X = g.tensor_like(x)
            W = g.tensor_like(w)
            y = g.conv_fprop(X, W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
            Y = g.reduction(y, mode=cudnn.reduction_mode.ADD)
            n, _, h, wd = X.get_dim()
            Y.set_output(True).set_dim([n, 1, h, wd]).set_data_type(F.FLOAT)
        g.build([cudnn.heur_mode.A, cudnn.heur_mode.B])
        return g, [X, W, Y]
    return create


def test_graph_cache_returns_the_same_graph_for_the_same_key_as_test_conv_reduction_does():
    calls = []
    create = make_cached_factory(calls)
    x = np.ones((2, 4, 5, 5), np.float32)
    w = np.ones((3, 4, 3, 3), np.float32)
    g, (X, W, Y) = create(None, x, w)
    g2, (X2, W2, Y2) = create(None, np.zeros_like(x), np.zeros_like(w))
    assert g2 is g and (X2.get_uid(), W2.get_uid(), Y2.get_uid()) == (X.get_uid(), W.get_uid(), Y.get_uid())
    assert len(calls) == 1
    out = np.empty((2, 1, 5, 5), np.float32)
    g.execute({X.get_uid(): x, W.get_uid(): w, Y.get_uid(): out}, None)
    # Every output element sums 3 filters over 4 channels of a 3x3 window of ones (fewer at the border).
    assert out[0, 0, 2, 2] == 3 * 4 * 9 and out[0, 0, 0, 0] == 3 * 4 * 4
    g3, _ = create(None, np.ones((1, 4, 5, 5), np.float32), w)
    assert g3 is not g and len(calls) == 2


def test_graph_cache_passes_positional_and_keyword_arguments_to_the_key_function():
    seen = []

    def key(*args, **kwargs):
        seen.append((args, kwargs))
        return args, tuple(sorted(kwargs.items()))

    @cudnn.graph_cache(key_fn=key)
    def factory(a, b=0):
        return object()

    assert factory(1, b=2) is factory(1, b=2)
    assert factory(1, b=3) is not factory(1, b=2)
    assert seen[0] == ((1,), {"b": 2})


def test_graph_cache_evicts_the_oldest_entry_first_not_the_least_recently_used():
    calls = []

    @cudnn.graph_cache(key_fn=lambda k: k, maxsize=2)
    def factory(k):
        calls.append(k)
        return [k]

    a = factory("a")
    factory("b")
    assert factory("a") is a          # a hit does not make "a" younger
    factory("c")                      # evicts "a", the oldest
    assert factory("b") is not None and calls == ["a", "b", "c"]
    assert factory("a") is not a and calls == ["a", "b", "c", "a"]


def test_graph_cache_keeps_the_factorys_name_and_doc():
    @cudnn.graph_cache(key_fn=lambda: 0)
    def build_my_graph():
        """Doc."""
        return 1

    assert build_my_graph.__name__ == "build_my_graph" and build_my_graph.__doc__ == "Doc."


@pytest.mark.parametrize("maxsize", [0, -1, 1.5, True])
def test_graph_cache_refuses_a_maxsize_below_one(maxsize):
    with pytest.raises(InvalidArgumentError, match=r"graph_cache\(maxsize=\)"):
        cudnn.graph_cache(key_fn=lambda: 0, maxsize=maxsize)


def test_graph_cache_refuses_a_key_function_that_is_not_callable():
    with pytest.raises(InvalidArgumentError, match=r"graph_cache\(key_fn=\)"):
        cudnn.graph_cache(key_fn="shape")


def test_graph_cache_from_many_threads_hands_every_later_call_one_object():
    @cudnn.graph_cache(key_fn=lambda k: k, maxsize=4)
    def factory(k):
        return object()

    results = []
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        for i in range(200):
            results.append(factory(i % 6))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 1600
    settled = factory(5)
    assert factory(5) is settled
