"""cudnn-frontend's ``cudnn.Graph`` wrapper (``cudnn_graph.Graph``) on the host: NumPy templates, the
reference engine, names by "node::port", tensor name, uid, Tensor and template buffer, positional and
dict calls, workspace_alloc, and the errors that name the bad argument."""
import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph.errors import (CudnnGraphError, InvalidArgumentError, TensorReferenceError,
                                WrapperStateError)

F = cudnn.data_type
rng = np.random.default_rng(19)


def conv_reference(x, w, pad=1):
    """NCHW cross-correlation, stride 1, dilation 1, zero padding ``pad``."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((n, k, h + 2 * pad - r + 1, wd + 2 * pad - s + 1), np.float64)
    for i in range(r):
        for j in range(s):
            window = xp[:, :, i:i + out.shape[2], j:j + out.shape[3]]
            out += np.einsum("nchw,kc->nkhw", window, w[:, :, i, j])
    return out


def nhwc_array(n, c, h, w, dtype=np.float32):
    """An (N, C, H, W) array laid out channels-last, like the frontend's samples."""
    return rng.standard_normal((n, h, w, c)).astype(dtype).transpose(0, 3, 1, 2)


@pytest.fixture
def conv_inputs():
    return nhwc_array(2, 8, 6, 6), nhwc_array(4, 8, 3, 3)


def conv_wrapper(x, w, **kwargs):
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, **kwargs) as graph:
        y = graph.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], name="conv2d")
        y.set_output(True).set_name("conv_out")
    return graph, y


# ---- the with block and a positional call -------------------------------------------------------

def test_wrapper_builds_on_exit_and_a_positional_call_returns_the_output(conv_inputs):
    x, w = conv_inputs
    graph, y = conv_wrapper(x, w, inputs=["conv2d::image", "conv2d::weight"], outputs=["conv_out"])
    out = graph(x, w, handle=None)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert out.shape == y.dim
    assert tuple(s // out.itemsize for s in out.strides) == y.stride
    np.testing.assert_allclose(out, conv_reference(x, w), rtol=1e-4, atol=1e-4)


def test_wrapper_call_takes_fresh_inputs_of_the_same_layout(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w, inputs=["conv2d::image", "conv2d::weight"], outputs=["conv_out"])
    x2, w2 = nhwc_array(2, 8, 6, 6), nhwc_array(4, 8, 3, 3)
    np.testing.assert_allclose(graph(x2, w2), conv_reference(x2, w2), rtol=1e-4, atol=1e-4)


def test_wrapper_is_the_top_level_graph_and_pygraph_stays_the_graph_class():
    from cudnn_graph import wrapper, _ir
    assert cudnn.Graph is wrapper.Graph
    assert issubclass(cudnn.pygraph, _ir.Graph)
    assert not issubclass(cudnn.Graph, _ir.Graph)


def test_wrapper_several_outputs_come_back_as_a_list_in_outputs_order():
    a = rng.standard_normal((2, 3)).astype(np.float32)
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                     inputs=["r::input"], outputs=["neg", "act"]) as graph:
        act = graph.relu(input=a, name="r")
        act.set_output(True).set_name("act")
        graph.neg(input=act, name="n").set_output(True).set_name("neg")
    neg, relu = graph(a)
    np.testing.assert_array_equal(relu, np.maximum(a, 0))
    np.testing.assert_array_equal(neg, -np.maximum(a, 0))


def test_wrapper_data_type_keywords_take_any_spelling():
    a = np.ones((2, 2), np.float16)

    class TorchLikeDtype:            # recognised by its name: the framework is never imported
        def __str__(self):
            return "torch.float16"

    with cudnn.Graph(io_data_type=TorchLikeDtype(), compute_data_type="float32",
                     inputs=["r::input"], outputs=["r::Y"]) as graph:
        graph.relu(input=a, name="r").set_output(True)
    out = graph(a)
    assert out.dtype == np.float16


def test_wrapper_heuristics_and_pygraph_keywords_are_forwarded(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w, heuristics=[cudnn.heur_mode.A], name="g0", device="cpu",
                            inputs=["conv2d::image", "conv2d::weight"], outputs=["conv_out"])
    assert graph.context.name == "g0"
    assert graph.device == ("cpu", 0)
    assert graph.plans                   # non-method attributes pass through to the pygraph


# ---- names ---------------------------------------------------------------------------------------

def test_unnamed_nodes_are_named_op_dot_count_and_positional_ports_by_index_and_by_port(conv_inputs):
    x, w = conv_inputs
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT) as graph:
        y = graph.conv_fprop(x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
        y.set_output(True)
    assert y.name == "conv_fprop.0::Y"
    graph.set_io_tuples(["conv_fprop.0::0", "conv_fprop.0::weight"], ["conv_fprop.0::Y"])
    expected = conv_reference(x, w)
    np.testing.assert_allclose(graph(x, w), expected, rtol=1e-4, atol=1e-4)
    graph.set_io_tuples(["conv_fprop.0::image", "conv_fprop.0::weight"], [y])
    np.testing.assert_allclose(graph(x, w), expected, rtol=1e-4, atol=1e-4)


def test_io_entries_by_template_buffer_uid_tensor_and_assigned_name_in_any_order(conv_inputs):
    x, w = conv_inputs
    graph, y = conv_wrapper(x, w)
    expected = conv_reference(x, w)
    graph.set_io_tuples([w, x], [y])
    np.testing.assert_allclose(graph(w, x), expected, rtol=1e-4, atol=1e-4)
    image = graph.nodes[0].inputs["image"]
    graph.set_io_tuples([image.uid, "conv2d::weight"], [y.uid])
    np.testing.assert_allclose(graph(x, w), expected, rtol=1e-4, atol=1e-4)
    graph.set_io_tuples([image.name, w], ["conv_out"])
    np.testing.assert_allclose(graph(x, w), expected, rtol=1e-4, atol=1e-4)


def test_template_tensors_are_named_after_the_port_they_feed(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w)
    node = graph.nodes[0]
    assert node.inputs["image"].name == "conv2d::image"
    assert node.inputs["weight"].name == "conv2d::weight"


def test_the_kth_unnamed_call_of_an_op_is_op_dot_k_even_after_a_named_one():
    a = np.ones((2, 2), np.float32)
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT) as graph:
        first = graph.relu(input=a, name="act")
        second = graph.relu(input=first)
        second.set_output(True)
    assert [n.name for n in graph.nodes] == ["act", "relu.1"]
    assert second.name == "relu.1::Y"


def test_set_io_tuples_inside_the_block_is_applied_when_it_ends(conv_inputs):
    x, w = conv_inputs
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, inputs=["wrong"], outputs=[]) as graph:
        y = graph.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], name="c")
        y.set_output(True)
        graph.set_io_tuples(["c::weight", "c::image"], ["c::Y"])     # replaces inputs= / outputs=
    np.testing.assert_allclose(graph(w, x), conv_reference(x, w), rtol=1e-4, atol=1e-4)


def test_a_buffer_used_twice_is_one_tensor_and_two_temporaries_are_two():
    a = np.ones((2, 2), np.float32)
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT) as graph:
        s = graph.add(a=a, b=a, name="sum")
        graph.relu(input=np.ones((2, 2), np.float32), name="r0").set_output(True)
        graph.relu(input=np.ones((2, 2), np.float32), name="r1").set_output(True)
        s.set_output(True)
    sum_node, r0, r1 = graph.nodes
    assert sum_node.inputs["a"] is sum_node.inputs["b"]
    # Templates are held while the graph is built: a freed temporary's id cannot alias the next one.
    assert r0.inputs["input"] is not r1.inputs["input"]


def test_buffers_inside_tuples_and_lists_are_templates_named_port_colon_index():
    a = np.ones((2, 3), np.float32)
    b = np.full((2, 3), 2.0, np.float32)
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                     inputs=["cat::inputs::0", "cat::inputs::1"], outputs=["cat::Y"]) as graph:
        graph.concatenate(inputs=[a, b], axis=1, name="cat").set_output(True)
    np.testing.assert_array_equal(graph(a, b), np.concatenate([a, b], axis=1))


def test_tensors_made_with_tensor_are_accepted_as_io_entries_as_they_are(conv_inputs):
    x, w = conv_inputs
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT) as graph:
        X = graph.tensor(name="X", dim=x.shape, stride=[s // 4 for s in x.strides])
        W = graph.tensor_like(w, name="W")
        y = graph.conv_fprop(image=X, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1], name="c")
        y.set_output(True)
    graph.set_io_tuples([X, "W"], [y])
    np.testing.assert_allclose(graph(x, w), conv_reference(x, w), rtol=1e-4, atol=1e-4)


def test_a_scalar_that_carries_its_value_needs_no_io_entry():
    a = rng.standard_normal((2, 2)).astype(np.float32)
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT) as graph:
        half = graph.tensor_scalar(0.5, data_type=F.FLOAT)
        graph.mul(a=a, b=half, name="m").set_output(True)
    graph.set_io_tuples(["m::a"], ["m::Y"])
    np.testing.assert_allclose(graph(a), a * 0.5, rtol=1e-6)


def test_autograd_templates_are_detached_before_tensor_like():
    class Tracked(np.ndarray):          # a stand-in for a tensor with requires_grad=True
        requires_grad = True
        detached = 0

        def detach(self):
            Tracked.detached += 1
            return np.asarray(self)

    a = np.ones((2, 2), np.float32).view(Tracked)
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT) as graph:
        graph.relu(input=a, name="r").set_output(True)
    assert Tracked.detached == 1


# ---- dict calls ----------------------------------------------------------------------------------

def test_dict_call_allocates_missing_outputs_under_their_name_and_returns_the_same_dict(conv_inputs):
    x, w = conv_inputs
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT) as graph:
        graph.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1],
                         name="conv2d").set_output(True)
    tensors = {"conv2d::image": x, "conv2d::weight": w}
    out = graph(tensors)
    assert out is tensors and set(out) == {"conv2d::image", "conv2d::weight", "conv2d::Y"}
    np.testing.assert_allclose(out["conv2d::Y"], conv_reference(x, w), rtol=1e-4, atol=1e-4)


def test_dict_call_writes_into_a_given_output_in_place(conv_inputs):
    x, w = conv_inputs
    graph, y = conv_wrapper(x, w)
    dest = np.zeros((2, 6, 6, 4), np.float32).transpose(0, 3, 1, 2)     # the NHWC strides y has
    out = graph({"conv2d::image": x, "conv2d::weight": w, "conv2d::Y": dest})
    assert out["conv2d::Y"] is dest
    np.testing.assert_allclose(dest, conv_reference(x, w), rtol=1e-4, atol=1e-4)


def test_dict_keys_may_be_tensor_names_tensors_or_uids(conv_inputs):
    x, w = conv_inputs
    graph, y = conv_wrapper(x, w)
    image = graph.nodes[0].inputs["image"]
    dest = np.zeros((2, 6, 6, 4), np.float32).transpose(0, 3, 1, 2)
    graph({image: x, graph.nodes[0].inputs["weight"].uid: w, "conv_out": dest})
    np.testing.assert_allclose(dest, conv_reference(x, w), rtol=1e-4, atol=1e-4)


def test_dict_call_without_an_input_names_it(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w)
    with pytest.raises(TensorReferenceError, match=r"conv2d::weight"):
        graph({"conv2d::image": x})


def test_an_output_another_op_reads_is_allocated_in_a_dict_call():
    a = rng.standard_normal((2, 2)).astype(np.float32)
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT) as graph:
        r = graph.relu(input=a, name="r")
        r.set_output(True)
        graph.neg(input=r, name="n").set_output(True)
    out = graph({"r::input": a})
    np.testing.assert_array_equal(out["r::Y"], np.maximum(a, 0))
    np.testing.assert_array_equal(out["n::Y"], -np.maximum(a, 0))


# ---- workspace -----------------------------------------------------------------------------------

def test_workspace_alloc_false_makes_every_call_pass_a_workspace(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w, workspace_alloc=False, inputs=["conv2d::image", "conv2d::weight"],
                            outputs=["conv_out"])
    with pytest.raises(WrapperStateError, match="workspace_alloc=False"):
        graph(x, w)
    workspace = np.zeros(max(graph.get_workspace_size(), 1), np.uint8)
    np.testing.assert_allclose(graph(x, w, workspace=workspace), conv_reference(x, w), rtol=1e-4, atol=1e-4)


def test_workspace_alloc_true_needs_no_workspace_argument(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w, inputs=["conv2d::image", "conv2d::weight"], outputs=["conv_out"])
    assert graph.get_workspace_size() == 0            # passes through to the pygraph
    graph(x, w)


# ---- errors that name the bad argument -----------------------------------------------------------

def test_calling_before_the_block_ends_raises(conv_inputs):
    x, w = conv_inputs
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT) as graph:
        graph.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1],
                         name="c").set_output(True)
        with pytest.raises(WrapperStateError, match="with block ends"):
            graph(x, w)


def test_wrapper_errors_keep_the_frontends_exception_types():
    assert issubclass(WrapperStateError, RuntimeError) and issubclass(WrapperStateError, CudnnGraphError)
    assert issubclass(TensorReferenceError, ValueError) and issubclass(TensorReferenceError, CudnnGraphError)


def test_using_the_wrapper_before_entering_it_raises():
    graph = cudnn.Graph(io_data_type=F.FLOAT)
    with pytest.raises(WrapperStateError, match="relu"):
        graph.relu
    with pytest.raises(WrapperStateError):
        graph()


def test_entering_a_wrapper_twice_raises(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w)
    with pytest.raises(WrapperStateError, match="already entered"):
        graph.__enter__()


def test_an_error_inside_the_block_propagates_and_drops_the_graph():
    a = np.ones((2, 2), np.float32)
    graph = cudnn.Graph(io_data_type=F.FLOAT)
    with pytest.raises(KeyError, match="boom"):
        with graph:
            graph.relu(input=a).set_output(True)
            raise KeyError("boom")
    with pytest.raises(WrapperStateError):
        graph(a)


def test_a_positional_call_without_an_input_order_raises(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w)
    with pytest.raises(WrapperStateError, match="set_io_tuples"):
        graph(x, w)


def test_a_positional_call_with_the_wrong_count_names_the_inputs(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w, inputs=["conv2d::image", "conv2d::weight"], outputs=["conv_out"])
    with pytest.raises(TensorReferenceError, match=r"takes 2 positional inputs \(conv2d::image, conv2d::weight\); got 1"):
        graph(x)


@pytest.mark.parametrize("inputs,outputs,message", [
    (["conv2d::nope", "conv2d::weight"], ["conv_out"], r"input at index 0 \('conv2d::nope'\) names no input"),
    (["conv2d::image", "conv2d::image"], ["conv_out"], r"input at index 1 \('conv2d::image'\) is a duplicate"),
    (["conv2d::image"], ["conv_out"], r"conv2d::weight is a non-virtual tensor but is not listed"),
    (["conv2d::image", "conv2d::weight"], [], r"node output conv2d::Y is a non-virtual tensor"),
    (["conv2d::image", "conv2d::weight"], ["conv2d::image"], r"output at index 0 \('conv2d::image'\) names no output"),
])
def test_bad_io_entries_name_the_entry(conv_inputs, inputs, outputs, message):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w)
    with pytest.raises(TensorReferenceError, match=message):
        graph.set_io_tuples(inputs, outputs)


def test_an_unknown_buffer_as_an_io_entry_says_buffers_name_their_templates(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w)
    with pytest.raises(TensorReferenceError, match=r"a ndarray\) names no input.*template"):
        graph.set_io_tuples([x.copy(), w], ["conv_out"])


def test_a_virtual_tensor_cannot_be_an_input():
    a = np.ones((2, 2), np.float32)
    with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT) as graph:
        r = graph.relu(input=a, name="r")
        graph.neg(input=r, name="n").set_output(True)
    with pytest.raises(TensorReferenceError, match=r"input at index 1 \('n::input'\) is a virtual tensor"):
        graph.set_io_tuples(["r::input", "n::input"], ["n::Y"])


def test_lifecycle_methods_are_refused_through_the_wrapper(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w)
    for name in ("build", "execute", "validate", "create_execution_plans", "get_execution_plan_count"):
        with pytest.raises(WrapperStateError, match=f"Graph.{name}: the wrapper runs"):
            getattr(graph, name)


def test_a_node_name_used_twice_is_refused():
    a = np.ones((2, 2), np.float32)
    with pytest.raises(InvalidArgumentError, match=r"relu\(name='act'\): node name 'act' is already used"):
        with cudnn.Graph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT) as graph:
            graph.relu(input=a, name="act")
            graph.relu(input=a, name="act")


@pytest.mark.parametrize("keyword", ["inputs", "outputs", "heuristics"])
def test_io_and_heuristics_keywords_must_be_lists(keyword):
    with pytest.raises(InvalidArgumentError, match=rf"Graph\({keyword}=\): expected a list or tuple; got str"):
        cudnn.Graph(**{keyword: "conv2d::image"})


def test_set_io_tuples_refuses_a_non_list(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w)
    with pytest.raises(InvalidArgumentError, match=r"set_io_tuples\(outputs=\)"):
        graph.set_io_tuples(["conv2d::image", "conv2d::weight"], "conv_out")


def test_a_bad_data_type_keyword_names_it():
    with pytest.raises(InvalidArgumentError, match=r"Graph\(io_data_type=\)"):
        cudnn.Graph(io_data_type="not-a-type")


def test_a_buffer_of_the_wrong_layout_at_a_call_names_the_tensor(conv_inputs):
    x, w = conv_inputs
    graph, _ = conv_wrapper(x, w, inputs=["conv2d::image", "conv2d::weight"], outputs=["conv_out"])
    with pytest.raises(cudnn.ShapeMismatchError, match="conv2d::image"):
        graph(np.zeros((2, 8, 5, 5), np.float32), w)


# ---- handles and streams -------------------------------------------------------------------------

def test_destroy_default_handle_says_why_it_is_not_implemented():
    from cudnn_graph.wrapper import destroy_default_handle
    with pytest.raises(NotImplementedError, match="per-thread cuDNN handles"):
        destroy_default_handle()


def test_without_a_handle_a_cuda_call_follows_the_current_stream_of_the_inputs_framework(monkeypatch):
    import sys
    import types
    from cudnn_graph.wrapper import _current_stream

    class Stream:
        cuda_stream = 0x1234

    asked = []
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(current_stream=lambda device: asked.append(device) or Stream())
    monkeypatch.setitem(sys.modules, "torch", torch)

    class CudaTensor:
        device = "cuda:0"

        def __dlpack_device__(self):
            return (2, 0)

    class HostTensor(CudaTensor):
        def __dlpack_device__(self):
            return (1, 0)

    CudaTensor.__module__ = HostTensor.__module__ = "torch"
    assert _current_stream(CudaTensor()) == 0x1234 and asked == ["cuda:0"]
    assert _current_stream(HostTensor()) is None          # a host template has no stream to follow
    assert _current_stream(np.zeros(1)) is None and _current_stream(None) is None
