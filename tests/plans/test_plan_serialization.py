"""serialize() / deserialize() of host (reference-engine) plans: every op family the reference engine runs
round-trips with bitwise-equal results, the loaded graph executes without planning, and every way a blob
can be wrong (truncated, a flipped byte, another magic, format, library, cuDNN version or GPU) is refused
with a typed error."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

import cudnn_graph as cudnn
from _blob_headers import with_header
from cudnn_graph import _plan_blob, plan_serialization
from cudnn_graph.data_type import numpy_dtype
from cudnn_graph.errors import GraphStateError, PlanBlobError, PlanVersionMismatchError
from _helpers import registered

F = cudnn.data_type
EPS = 1e-5


def _graph(io=F.FLOAT):
    return cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")


def _t(g, name, dims, dtype=None, **kw):
    strides = [int(np.prod(dims[i + 1:])) for i in range(len(dims))]
    return g.tensor(name=name, dim=list(dims), stride=strides, data_type=dtype, **kw)


def matmul_bias_relu():
    g = _graph()
    a, b, bias = _t(g, "a", [2, 4, 3]), _t(g, "b", [2, 3, 5]), _t(g, "bias", [1, 1, 5])
    g.relu(g.bias(g.matmul(a, b), bias)).set_output(True)
    return g, {}


def pointwise_with_scalars():
    g = _graph(F.HALF)
    x = _t(g, "x", [3, 7])
    y = g.add(g.mul(x, 3.0), 0.5)
    g.swish(y, swish_beta=1.5).set_output(True)
    g.cmp_gt(x, y).set_output(True).set_data_type(F.BOOLEAN)
    return g, {}


def conv_fprop_dgrad_wgrad():
    g = _graph()
    x, w = _t(g, "x", [1, 2, 6, 6]), _t(g, "w", [3, 2, 3, 3])
    g.conv_fprop(x, w, padding=[1, 1], stride=[2, 1], dilation=[1, 1]).set_output(True)
    dy = _t(g, "dy", [1, 3, 6, 6])
    g.conv_dgrad(dy, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1]).set_output(True).set_dim([1, 2, 6, 6])
    g.conv_wgrad(x, dy, padding=[1, 1], stride=[1, 1], dilation=[1, 1]).set_output(True).set_dim([3, 2, 3, 3])
    return g, {}


def norms():
    g = _graph()
    x, s, b = _t(g, "x", [4, 6, 1, 1]), _t(g, "s", [1, 6, 1, 1]), _t(g, "b", [1, 6, 1, 1])
    y, mean, inv = g.layernorm(cudnn.norm_forward_phase.TRAINING, x, s, b, g.tensor_scalar(EPS))
    for t in (y, mean, inv):
        t.set_output(True)
    y2, inv2 = g.rmsnorm(cudnn.norm_forward_phase.TRAINING, x, s, b, g.tensor_scalar(EPS))
    y2.set_output(True)
    inv2.set_output(True)
    return g, {}


def batchnorm():
    g = _graph()
    x = _t(g, "x", [4, 3, 2, 2])
    s, b, rm, rv = (_t(g, n, [1, 3, 1, 1]) for n in ("s", "b", "rm", "rv"))
    outs = g.batchnorm(input=x, scale=s, bias=b, in_running_mean=rm, in_running_var=rv,
                       epsilon=g.tensor_scalar(EPS), momentum=g.tensor_scalar(0.1))
    for t in outs:
        t.set_output(True)
    return g, {"rv": lambda shape: np.abs(np.random.default_rng(3).standard_normal(shape)).astype(np.float32) + 1}


def reductions_and_layout_ops():
    g = _graph()
    x, z = _t(g, "x", [2, 3, 4]), _t(g, "z", [2, 3, 1])
    g.reduction(x, mode=cudnn.reduction_mode.ADD).set_dim([2, 3, 1]).set_output(True)
    g.transpose(x, permutation=[2, 0, 1]).set_output(True)
    g.slice(x, slices=[slice(1, 2), slice(0, 3, 2)]).set_output(True)
    g.concatenate([x, z], axis=2).set_output(True)
    return g, {}


def sdpa():
    g = _graph()
    q, k, v = _t(g, "q", [2, 4, 5, 8]), _t(g, "k", [2, 2, 6, 8]), _t(g, "v", [2, 2, 6, 8])
    o, stats = g.sdpa(q, k, v, generate_stats=True, attn_scale=0.3, use_causal_mask=True)
    o.set_output(True)
    stats.set_output(True)
    return g, {}


def linear_attention_gdn():
    g = _graph(F.FLOAT)
    T, H, K, V = 9, 2, 4, 4
    q, k, v = _t(g, "q", [T, H, K]), _t(g, "k", [T, H, K]), _t(g, "v", [T, H, V])
    gate, beta = _t(g, "g", [T, H]), _t(g, "beta", [T, H])
    cu = _t(g, "cu", [3], F.INT32)
    o, final, _ = g.gdn(q, k, v, gate, beta, cu_seqlens=cu, output_final_state=True)
    o.set_output(True)
    final.set_output(True)
    return g, {"cu": lambda shape: np.array([0, 4, 9], np.int32),
               "g": lambda shape: -np.random.default_rng(5).uniform(0.05, 0.7, shape).astype(np.float32),
               "beta": lambda shape: np.random.default_rng(6).uniform(0.2, 0.9, shape).astype(np.float32)}


FAMILIES = {"matmul": matmul_bias_relu, "pointwise": pointwise_with_scalars, "conv": conv_fprop_dgrad_wgrad,
            "norms": norms, "batchnorm": batchnorm, "reduction_layout": reductions_and_layout_ops,
            "sdpa": sdpa, "linear_attention": linear_attention_gdn}


def _inputs(g, special, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in g.get_inputs():
        if t.is_pass_by_value and t.value is not None:
            continue
        dtype = numpy_dtype(t.data_type)
        make = special.get(t.name)
        feeds[t.name] = make(t.dim) if make else rng.standard_normal(t.dim).astype(dtype)
    return feeds


def _run(g, feeds):
    """Execute ``g`` on ``feeds`` ({name: array}), keyed by uid; returns {name: output array}."""
    outs = {t.name: np.zeros(t.dim, numpy_dtype(t.data_type)) for t in g.get_outputs()}
    pack = {g.find_tensor(name).uid: a for name, a in {**feeds, **outs}.items()}
    g.execute(pack)
    return outs


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_host_plan_round_trips_with_bitwise_equal_results(family):
    g, special = FAMILIES[family]()
    g.build()
    feeds = _inputs(g, special)
    want = _run(g, feeds)
    blob = g.serialize(as_bytes=True)
    loaded = cudnn.pygraph()
    loaded.deserialize(blob)
    assert loaded.get_execution_plan_count() == 1 and loaded.compiled_plan() is not None
    assert loaded.key() == g.key()
    got = _run(loaded, feeds)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].tobytes() == want[name].tobytes(), name


def test_serialize_returns_a_list_of_byte_values_by_default_and_deserialize_takes_it():
    g, _ = matmul_bias_relu()
    g.build()
    values = g.serialize()
    assert isinstance(values, list) and all(isinstance(v, int) and 0 <= v < 256 for v in values)
    assert bytes(values) == g.serialize(as_bytes=True)
    loaded = cudnn.pygraph()
    loaded.deserialize(values)
    assert [t.name for t in loaded.tensors] == [t.name for t in g.tensors]


def test_the_handle_form_and_the_frontends_keywords_load_the_same_graph():
    g, _ = matmul_bias_relu()
    g.build()
    blob = g.serialize(as_bytes=True)
    handle = cudnn.create_handle() if cudnn.backend_version() == 0 else None
    for call in (lambda h: h.deserialize(handle, blob), lambda h: h.deserialize(handle_=handle, pyobj=blob),
                 lambda h: h.deserialize(blob)):
        loaded = cudnn.pygraph()
        call(loaded)
        assert loaded.key() == g.key()


def test_a_loaded_graph_is_inspectable_and_keeps_names_uids_and_attributes():
    g, _ = sdpa()
    g.build()
    loaded = cudnn.pygraph()
    loaded.deserialize(g.serialize(as_bytes=True))
    assert [(n.op, n.name) for n in loaded.nodes] == [(n.op, n.name) for n in g.nodes]
    assert dict(loaded.nodes[0].params) == dict(g.nodes[0].params)
    assert [(t.uid, t.name, t.dim, t.stride, t.data_type) for t in loaded.tensors] == \
        [(t.uid, t.name, t.dim, t.stride, t.data_type) for t in g.tensors]
    assert loaded.frozen


def test_a_loaded_graph_runs_without_planning(monkeypatch):
    g, _ = matmul_bias_relu()
    g.build()
    blob = g.serialize(as_bytes=True)
    from cudnn_graph.engines import manifest

    def no_planning(*_a, **_k):
        raise AssertionError("deserialize() planned")
    for engine in manifest.engines():
        monkeypatch.setattr(engine, "propose_plans_for_modes", no_planning, raising=False)
    monkeypatch.setattr(cudnn.pygraph, "create_execution_plans", no_planning)
    loaded = cudnn.pygraph()
    loaded.deserialize(blob)
    _run(loaded, _inputs(loaded, {}))


def test_serialize_before_a_plan_is_built_raises_a_state_error():
    g, _ = matmul_bias_relu()
    with pytest.raises(GraphStateError, match="not built"):
        g.serialize()


def test_deserialize_into_a_graph_with_tensors_raises_a_state_error():
    g, _ = matmul_bias_relu()
    g.build()
    busy = _graph()
    busy.tensor(name="x", dim=[1], stride=[1])
    with pytest.raises(GraphStateError, match="empty"):
        busy.deserialize(g.serialize(as_bytes=True))


def test_a_graph_with_a_callback_attribute_is_refused_by_name():
    g = _graph()
    q, k, v = _t(g, "q", [1, 1, 4, 8]), _t(g, "k", [1, 1, 4, 8]), _t(g, "v", [1, 1, 4, 8])
    o, _ = g.sdpa(q, k, v, generate_stats=False, attn_scale=0.25, score_mod=lambda graph, score: score)
    o.set_output(True)
    try:
        g.build()
    except cudnn.GraphNotSupportedError:
        pytest.skip("no engine here runs an sdpa with score_mod")
    with pytest.raises(PlanBlobError, match="score_mod"):
        g.serialize()


# ---- refusals ---------------------------------------------------------------------------------------

def _blob():
    g, _ = matmul_bias_relu()
    g.build()
    return g.serialize(as_bytes=True)


def _load(blob):
    cudnn.pygraph().deserialize(blob)


def test_a_truncated_blob_is_refused():
    blob = _blob()
    for cut in (3, 40, len(blob) // 2, len(blob) - 1):
        with pytest.raises(PlanBlobError) as info:
            _load(blob[:cut])
        assert not isinstance(info.value, PlanVersionMismatchError)


@pytest.mark.parametrize("where", ["header", "tensor_table", "graph", "last"])
def test_a_flipped_byte_is_refused_by_the_checksum(where):
    blob = bytearray(_blob())
    at = {"header": 20, "tensor_table": _plan_blob.HEADER.size + 100, "graph": len(blob) // 2,
          "last": len(blob) - 1}[where]
    blob[at] ^= 0x40
    with pytest.raises(PlanBlobError, match="checksum|format version|truncated") as info:
        _load(bytes(blob))
    assert info.value.field in ("checksum", "format version", "total_size")


def test_another_magic_is_refused():
    blob = _blob()
    with pytest.raises(PlanBlobError, match="not a cudnn_graph plan blob") as info:
        _load(b"CUDNN_FE" + blob[8:])
    assert info.value.field == "magic"
    with pytest.raises(PlanBlobError, match="str"):
        _load('{"json": "graph"}')


def test_another_format_version_is_refused_saying_which():
    with pytest.raises(PlanVersionMismatchError) as info:
        _load(with_header(_blob(), format_version=_plan_blob.FORMAT_VERSION + 1))
    err = info.value
    assert err.field == "format version" and err.blob_value == _plan_blob.FORMAT_VERSION + 1
    assert err.process_value == _plan_blob.FORMAT_VERSION


def test_another_library_version_is_refused_saying_which():
    with pytest.raises(PlanVersionMismatchError, match="cudnn_graph version is 9.9.9") as info:
        _load(with_header(_blob(), library_version=_plan_blob.pack_version(9, 9, 9)))
    assert info.value.field == "cudnn_graph version"
    assert info.value.process_value == plan_serialization._version_text(plan_serialization.library_version())


def test_another_cudnn_version_is_refused_saying_which(monkeypatch):
    monkeypatch.setattr(plan_serialization, "_cudnn_version", lambda: 92100)
    with pytest.raises(PlanVersionMismatchError, match="cuDNN version is 8.9.7") as info:
        _load(with_header(_blob(), cudnn_version=_plan_blob.pack_version(8, 9, 7)))
    assert (info.value.field, info.value.blob_value, info.value.process_value) == ("cuDNN version", "8.9.7", "9.21.0")
    # Another patch release of the same major.minor is the same cuDNN for a plan.
    _load(with_header(_blob(), cudnn_version=_plan_blob.pack_version(9, 21, 3)))


def test_another_gpu_architecture_is_refused_saying_which(monkeypatch):
    monkeypatch.setattr(plan_serialization, "device_arch", lambda device: 90)
    with pytest.raises(PlanVersionMismatchError, match="GPU architecture is sm_100") as info:
        _load(with_header(_blob(), arch=100))
    assert (info.value.blob_value, info.value.process_value) == ("sm_100", "sm_90")


def test_a_gpu_blob_on_a_host_without_that_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(plan_serialization, "device_arch", lambda device: 0)
    with pytest.raises(PlanVersionMismatchError, match="host"):
        _load(with_header(_blob(), arch=90))


def test_a_blob_naming_an_engine_this_process_lacks_is_refused():
    blob = _plan_blob.unpack_blob(_blob())
    sections = dict(blob.sections)
    sections[_plan_blob.SECTION_PLAN] = sections[_plan_blob.SECTION_PLAN].replace(b'"reference"', b'"gone"', 1)
    with pytest.raises(PlanBlobError, match="'gone'") as info:
        _load(_plan_blob.pack_blob(blob.header, blob.tensors, sections))
    assert info.value.field == "engine"


def test_a_tensor_table_that_disagrees_with_the_graph_is_refused():
    blob = _plan_blob.unpack_blob(_blob())
    first = blob.tensors[0]
    bad = (_plan_blob.TensorRecord(first.uid, first.name, first.data_type, (9,) * len(first.dims), first.strides,
                                   first.is_virtual, first.is_pass_by_value, first.alignment),) + blob.tensors[1:]
    with pytest.raises(PlanBlobError, match="tensor table") as info:
        _load(_plan_blob.pack_blob(blob.header, bad, blob.sections))
    assert info.value.field == "tensors"


def test_garbage_never_crashes():
    rng = np.random.default_rng(0)
    good = _blob()
    for i in range(200):
        junk = bytearray(good)
        for at in rng.integers(0, len(junk), size=1 + i % 5):
            junk[at] = int(rng.integers(0, 256))
        if i % 3 == 0:       # a well-formed checksum over junk: the parser itself must refuse it
            struct.pack_into("<I", junk, 56, 0)
            struct.pack_into("<I", junk, 56, zlib.crc32(junk))
        try:
            _load(bytes(junk))
        except (PlanBlobError, cudnn.CudnnGraphError):
            pass


def test_the_header_is_64_little_endian_bytes_a_c_reader_can_parse():
    blob = _blob()
    assert blob[:8] == b"CDNGPLAN"
    version, header_size = struct.unpack_from("<HH", blob, 8)
    assert (version, header_size) == (1, 64)
    engine_id, workspace, total = struct.unpack_from("<qQQ", blob, 32)
    assert engine_id == 20000 and workspace == 0 and total == len(blob)
    count = struct.unpack_from("<I", blob, 60)[0]
    kinds = [struct.unpack_from("<IIQQ", blob, 64 + 24 * i)[0] for i in range(count)]
    assert kinds[0] == _plan_blob.SECTION_TENSORS and _plan_blob.SECTION_GRAPH in kinds
    header = plan_serialization.blob_header(blob)
    assert header.arch == 0 and header.cudnn_version == 0 and header.engine_family == 3


# ---- a Python engine's kernels (the export_kernels / load_plan hooks) -------------------------------

def _kernel_engine():
    """A toy out-of-tree engine: the reference engine's plans, with 'compiled kernels' it can hand over."""
    from cudnn_graph.engines.base import PlanConfig
    from cudnn_graph.engines.reference.engine import ReferenceEngine, ReferencePlan

    class KernelPlan(ReferencePlan):
        def export_kernels(self):
            return b"\x7fELF-kernels-of-" + str(self.plan.knobs["tile"]).encode()

    class KernelEngine(ReferenceEngine):
        name, engine_id = "kernel_toy", 30_001
        loads: list = []

        def propose_plans(self, graph):
            return [PlanConfig(30_001, {"tile": 64}, name="toy_t64", engine=self, priority=10.0)]

        def build_plan(self, graph, plan, ctx):
            return KernelPlan(plan, graph)

        def load_plan(self, graph, plan, ctx, kernels):
            self.loads.append((dict(plan.knobs), kernels))
            return KernelPlan(plan, graph)
    return KernelEngine()


@pytest.fixture
def kernel_engine():
    yield from registered(_kernel_engine())


@pytest.mark.parametrize("include_kernels", [True, False])
def test_a_python_engine_gets_its_kernels_back_only_when_they_were_included(kernel_engine, include_kernels):
    g, _ = matmul_bias_relu()
    g.build()
    assert g.selected_plan.engine_id == 30_001
    feeds = _inputs(g, {})
    want = _run(g, feeds)
    blob = g.serialize(as_bytes=True, include_kernels=include_kernels)
    header = plan_serialization.blob_header(blob)
    assert (header.engine_family, header.engine_id) == (4, 30_001)
    assert bool(header.flags & _plan_blob.FLAG_KERNELS) == include_kernels
    loaded = cudnn.pygraph()
    loaded.deserialize(blob)
    assert kernel_engine.loads[-1] == ({"tile": 64}, b"\x7fELF-kernels-of-64" if include_kernels else None)
    got = _run(loaded, feeds)
    assert all(got[name].tobytes() == want[name].tobytes() for name in want)


def test_an_engine_without_the_hook_rebuilds_from_its_engine_id_and_knobs(kernel_engine, monkeypatch):
    g, _ = matmul_bias_relu()
    g.build()
    blob = g.serialize(as_bytes=True)
    built = []
    from cudnn_graph.engines.base import BaseEngine
    monkeypatch.setattr(type(kernel_engine), "load_plan", BaseEngine.load_plan)
    original = type(kernel_engine).build_plan
    monkeypatch.setattr(type(kernel_engine), "build_plan",
                        lambda self, graph, plan, ctx: built.append(dict(plan.knobs)) or original(self, graph, plan, ctx))
    loaded = cudnn.pygraph()
    loaded.deserialize(blob)
    assert built == [{"tile": 64}] and loaded.selected_plan.label == "toy_t64"
