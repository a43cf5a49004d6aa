"""Shared by the GPU tests: run one graph builder on the reference engine (host) and on the GPU from a
chosen producer, and compare.

A builder is ``builder(device, **kwargs) -> (graph, {name: Tensor})``; host inputs are NumPy arrays
(bfloat16 through ml_dtypes) keyed by those names, laid out with the strides the builder declares.
Frameworks are imported only when a producer asks for them.
"""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn

F = cudnn.data_type

# Max error allowed, relative to max(1, max |reference|), per output dtype.
TOLERANCE = {"float32": 5e-3, "float16": 5e-3, "bfloat16": 3e-2, "int32": 0, "int64": 0, "uint8": 0,
             "int8": 0, "float8_e4m3fn": 1.3e-1, "float8_e5m2": 2.6e-1}


def jax_gpu():
    """The jax module, or a skip where it is missing or sees no GPU."""
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("jax sees no GPU")
    return jax


def row_major(dims) -> tuple:
    """Element strides of a packed row-major tensor of ``dims``."""
    strides, acc = [], 1
    for d in reversed(dims):
        strides.insert(0, acc)
        acc *= d
    return tuple(strides)


def nhwc(dims) -> tuple:
    """Element strides of an (N, C, H, W) tensor laid out channels-last."""
    n, c, h, w = dims
    return (h * w * c, 1, w * c, c)


def host_dtype(dtype):
    import ml_dtypes
    table = {F.FLOAT: np.float32, F.HALF: np.float16, F.BFLOAT16: ml_dtypes.bfloat16, F.INT32: np.int32,
             F.INT64: np.int64, F.UINT8: np.uint8, F.INT8: np.int8, F.DOUBLE: np.float64,
             F.BOOLEAN: np.bool_, F.FP8_E4M3: ml_dtypes.float8_e4m3fn, F.FP8_E5M2: ml_dtypes.float8_e5m2}
    return table[dtype]


def assert_close(got, want, dtype_name, what="", tolerance=None):
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    tol = TOLERANCE[dtype_name] if tolerance is None else tolerance
    assert err <= tol * scale, f"{what}: max error {err} (scale {scale}, {dtype_name}, tolerance {tol})"


def host_buffer(array):
    """NumPy exports no bfloat16 / fp8 through DLPack: such arrays go in as host Slots (same memory)."""
    if array.dtype.kind == "V" or array.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        itemsize = array.dtype.itemsize
        return cudnn.Slot.from_address(array.ctypes.data, array.shape,
                                       tuple(s // itemsize for s in array.strides), array.dtype.name, "cpu")
    return array


def empty_like_strided(np_dtype, dims, strides):
    """A host array of ``dims`` with element ``strides`` (a dense buffer viewed)."""
    span = 1 + sum((d - 1) * s for d, s in zip(dims, strides)) if all(d > 0 for d in dims) else 0
    base = np.zeros(max(span, 1), np_dtype)
    itemsize = base.dtype.itemsize
    return np.lib.stride_tricks.as_strided(base, shape=tuple(dims), strides=tuple(s * itemsize for s in strides))


def reference_run(builder, host_inputs, out_names, **kwargs):
    """Build the graph on the host and run the reference engine; returns {name: array}."""
    g, t = builder("cpu", **kwargs)
    g.build([cudnn.heur_mode.A])
    outs, pack = {}, {}
    for name, tensor in t.items():
        if name in out_names:
            outs[name] = empty_like_strided(host_dtype(g.view.data_type(tensor)), tensor.dim, tensor.stride)
            pack[tensor] = host_buffer(outs[name])
        elif name in host_inputs:
            pack[tensor] = host_buffer(host_inputs[name])
    g.execute(pack)
    return outs


def build_gpu(builder, **kwargs):
    g, t = builder("cuda", **kwargs)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return g, t


def cupy_from_host(cp, array):
    """A CuPy array with the values and the element strides of a host array (bf16 / fp8 by bits)."""
    bits = {2: np.uint16, 1: np.uint8}
    if array.dtype.kind == "V" or array.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        raw = np.ascontiguousarray(array).view(bits[array.dtype.itemsize])
    else:
        raw = np.ascontiguousarray(array)
    span = 1 + sum((d - 1) * s for d, s in zip(array.shape, array.strides)) // array.dtype.itemsize \
        if array.size else 1
    base = cp.zeros(max(span, 1), raw.dtype)
    view = cp.lib.stride_tricks.as_strided(base, shape=array.shape, strides=array.strides)
    view[...] = cp.asarray(raw)
    return view


class _CupyBits:
    """A CuPy array holding bf16 / fp8 bits, described to cudnn_graph with its real dtype."""

    def __init__(self, array, dtype_name):
        self.array = array
        self.dtype_name = dtype_name

    def slot(self):
        a = self.array
        return cudnn.Slot.from_address(a.data.ptr, a.shape, tuple(s // a.itemsize for s in a.strides),
                                       self.dtype_name, ("cuda", a.device.id))


def _device_input(producer, array):
    """(object handed to execute, keep-alive) for one host input under ``producer``."""
    exotic = array.dtype.kind == "V" or array.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")
    if producer == "cupy":
        cp = pytest.importorskip("cupy")
        dev = cupy_from_host(cp, array)
        return (_CupyBits(dev, array.dtype.name).slot() if exotic else dev), dev
    if producer == "jax":
        jnp = pytest.importorskip("jax.numpy")
        dense = np.ascontiguousarray(array)
        if array.strides != dense.strides:      # JAX arrays are dense: keep the values, not the strides
            raise ValueError("jax inputs must be dense; give the builder dense strides for this producer")
        x = jnp.asarray(dense)
        x.block_until_ready()
        return x, x
    if producer == "torch":
        torch = pytest.importorskip("torch")
        import ml_dtypes
        if array.dtype == ml_dtypes.bfloat16:
            dense = torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
        else:
            dense = torch.from_numpy(np.ascontiguousarray(array))
        out = torch.empty_strided(array.shape, tuple(s // array.dtype.itemsize for s in array.strides),
                                  dtype=dense.dtype, device="cuda")
        out.copy_(dense.to("cuda"))
        return out, out
    raise ValueError(f"unknown producer {producer!r}")


def gpu_run(builder, host_inputs, out_names, producer="cupy", **kwargs):
    """Build the graph for the GPU, feed ``host_inputs`` from ``producer`` (outputs are CuPy arrays
    with the builder's strides, so JAX's immutable arrays only ever read), execute and return the
    outputs on the host, plus the graph: ``({name: array}, graph)``."""
    runs, g = gpu_runs(builder, host_inputs, out_names, 1, producer, **kwargs)
    return runs[0], g


def device_pack(cp, g, t, host_inputs, out_names, producer="cupy"):
    """The execute pack of built graph ``g`` (tensors ``t`` by name): ``host_inputs`` on the device from
    ``producer``, a zeroed CuPy buffer with the graph's strides for each of ``out_names``. Returns (pack, what
    keeps the inputs alive, {output name: (CuPy array, host dtype)})."""
    pack, keep, outs = {}, [], {}
    for name, tensor in t.items():
        if name in out_names:
            np_dtype = host_dtype(g.view.data_type(tensor))
            dev = cupy_from_host(cp, empty_like_strided(np_dtype, tensor.dim, tensor.stride))
            outs[name] = (dev, np_dtype)
            exotic = np.dtype(np_dtype).kind == "V" or np.dtype(np_dtype).name in (
                "bfloat16", "float8_e4m3fn", "float8_e5m2")
            pack[tensor] = _CupyBits(dev, np.dtype(np_dtype).name).slot() if exotic else dev
        elif name in host_inputs:
            obj, alive = _device_input(producer, host_inputs[name])
            pack[tensor] = obj
            keep.append(alive)
    return pack, keep, outs


def run_on_own_stream(cp, g, pack: dict, outs: dict, capture: bool = False) -> dict:
    """Execute built graph ``g`` on a non-blocking CuPy stream of its own (what a plan takes for its caller's
    stream, with a side stream beside it where its launches overlap); with ``capture`` that execute only warms up
    (compiles, makes the stream's workspace and side stream), the outputs are zeroed and the next execute is
    captured into a CUDA graph of the stream and replayed. ``outs``: device_pack's. {output name: host array}."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        g.execute(pack, stream=stream.ptr)
        if capture:
            stream.synchronize()
            for dev, _ in outs.values():
                dev.fill(0)
            stream.begin_capture()
            g.execute(pack, stream=stream.ptr)
            stream.end_capture().launch(stream)
    stream.synchronize()
    return {name: cp.asnumpy(dev) for name, (dev, _) in outs.items()}


def sm90_with_the_dsl(why: str):
    """CuPy, where an sm_90 GPU and the CuTe DSL are here; else the test skips, saying ``why`` it needs them."""
    cp = pytest.importorskip("cupy")
    if cp.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA GPU visible")
    capability = cp.cuda.Device(0).compute_capability
    if capability != "90":
        pytest.skip(f"{why} (sm_90); this GPU is sm_{capability}")
    pytest.importorskip("cutlass", reason="the CuTe DSL (extra 'cute') is not installed")
    return cp


def gpu_runs(builder, host_inputs, out_names, times, producer="cupy", **kwargs):
    """``gpu_run`` executing the built graph ``times`` times on the same inputs, the outputs zeroed before
    each: ``([{name: array}, ...], graph)`` (to pin that a plan is deterministic)."""
    cp = pytest.importorskip("cupy")
    g, t = build_gpu(builder, **kwargs)
    pack, keep, outs = device_pack(cp, g, t, host_inputs, out_names, producer)
    runs = []
    for _ in range(times):
        for dev, _ in outs.values():
            dev[...] = 0
        g.execute(pack)
        cp.cuda.Device().synchronize()
        result = {}
        for name, (dev, np_dtype) in outs.items():
            raw = cp.asnumpy(dev)
            result[name] = raw.view(np_dtype) if raw.dtype != np.dtype(np_dtype) else raw
        runs.append(result)
    return runs, g


def compare(builder, host_inputs, out_names, producer="cupy", tolerance=None, **kwargs):
    """Reference vs GPU for every output in ``out_names``; returns the GPU graph (its plan, notes)."""
    want = reference_run(builder, host_inputs, out_names, **kwargs)
    got, g = gpu_run(builder, host_inputs, out_names, producer, **kwargs)
    for name in out_names:
        assert_close(got[name], want[name], np.dtype(want[name].dtype).name, f"{name} ({producer})",
                     tolerance=tolerance)
    return g
