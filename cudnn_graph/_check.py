"""``python -m cudnn_graph check``: an environment report, then self-tests on the best engine available."""
from __future__ import annotations

import importlib
import logging
import platform
import sys
import traceback
from dataclasses import dataclass, field
from typing import Callable

logger = logging.getLogger(__name__)


@dataclass
class StepResult:
    name: str
    ok: bool
    detail: str = ""
    data: dict = field(default_factory=dict)


def _version_of(module: str) -> str:
    try:
        from importlib.metadata import version
        return version(module)
    except Exception:
        try:
            return getattr(importlib.import_module(module), "__version__", "installed")
        except Exception:
            return "not installed"


def environment() -> dict:
    """What this process can use: versions, the CUDA driver and devices, libcudnn."""
    from . import __version__
    from . import _driver

    env = {
        "cudnn_graph": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": _version_of("numpy"),
        "ml_dtypes": _version_of("ml_dtypes"),
        "cuda-pathfinder": _version_of("cuda-pathfinder"),
        "cuda-bindings": _version_of("cuda-bindings"),
        "cuda_driver": _driver.driver_version() or None,
        "gpus": [],
    }
    for i in range(_driver.device_count()):
        env["gpus"].append(_driver.device_info(i))
    try:
        from . import _loader
    except ImportError:
        env["libcudnn"] = "loader not built"
    else:
        try:
            path = _loader.load()
            env["libcudnn"] = path
            env["cudnn_version"] = _loader.backend_version_string()
        except Exception as exc:  # the report says why; nothing here is fatal
            env["libcudnn"] = None
            env["libcudnn_error"] = " ".join(line.strip() for line in str(exc).splitlines())[:400]
    return env


def _step_slot_roundtrip() -> StepResult:
    import numpy as np

    from ._slot import Slot
    from ._variant_pack import PackLayout, TensorSpec

    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:, ::2, 1:]
    s = Slot.from_object(a)
    back = np.from_dlpack(s)
    ok = back.shape == a.shape and np.array_equal(back, a) and back.strides == a.strides
    layout = PackLayout([TensorSpec(7, a.shape, "float32", strides=s.strides, device="cpu", name="a")])
    pack = layout.pack({7: a})
    ok = ok and pack.data_ptrs == (a.__array_interface__["data"][0],)
    return StepResult("slot round-trip (numpy -> Slot -> numpy, VariantPack)", bool(ok),
                      f"shape {s.shape} strides {s.strides}")


def _best_device() -> str:
    """CUDA device 0 when a GPU and libcudnn are both usable, else the host."""
    from . import _driver
    if _driver.device_count() == 0:
        return "cpu"
    try:
        from . import _loader
        _loader.load()
    except Exception:
        return "cpu"
    return "cuda:0"


class _DeviceArrays:
    """Device copies of host arrays through cuda.bindings (off any hot path: the check job only)."""

    def __init__(self):
        from cuda.bindings import driver
        self.driver = driver
        self._check(driver.cuInit(0))
        device = self._check(driver.cuDeviceGet(0))
        self.context = self._check(driver.cuDevicePrimaryCtxRetain(device))
        self._check(driver.cuCtxSetCurrent(self.context))
        self.allocations = []

    def _check(self, result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise RuntimeError(f"CUDA driver call failed: {err}")
        return rest[0] if len(rest) == 1 else (rest or None)

    def upload(self, host):
        ptr = self._check(self.driver.cuMemAlloc(max(host.nbytes, 1)))
        self.allocations.append(ptr)
        self._check(self.driver.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes))
        return int(ptr)

    def download(self, address, host):
        self._check(self.driver.cuMemcpyDtoH(host.ctypes.data, address, host.nbytes))
        return host

    def close(self):
        for ptr in self.allocations:
            self.driver.cuMemFree(ptr)
        self.allocations.clear()


def _matmul_bias_relu(device, io_type):
    from . import pygraph, data_type
    g = pygraph(io_data_type=io_type, intermediate_data_type=data_type.FLOAT,
                compute_data_type=data_type.FLOAT, device=device, name="check_matmul")
    a = g.tensor(name="A", dim=[2, 64, 32], stride=[64 * 32, 32, 1])
    b = g.tensor(name="B", dim=[2, 32, 48], stride=[32 * 48, 48, 1])
    bias = g.tensor(name="bias", dim=[1, 1, 48], stride=[48, 48, 1])
    y = g.relu(g.add(g.matmul(a, b), bias))
    y.set_output(True).set_name("Y")
    return g, [a, b, bias], y


def _sdpa_causal(device, io_type):
    from . import pygraph, data_type
    g = pygraph(io_data_type=io_type, intermediate_data_type=data_type.FLOAT,
                compute_data_type=data_type.FLOAT, device=device, name="check_sdpa")
    b, h, s, d = 1, 2, 64, 64
    dims, strides = [b, h, s, d], [h * s * d, s * d, d, 1]
    q = g.tensor(name="q", dim=dims, stride=strides)
    k = g.tensor(name="k", dim=dims, stride=strides)
    v = g.tensor(name="v", dim=dims, stride=strides)
    o, _ = g.sdpa(q, k, v, attn_scale=d ** -0.5, use_causal_mask=True, generate_stats=False)
    o.set_output(True).set_name("O").set_stride(strides)
    return g, [q, k, v], o


def _run_case(build, name) -> StepResult:
    import numpy as np
    from . import data_type
    from .data_type import numpy_dtype
    device = _best_device()
    io_type = data_type.BFLOAT16 if device != "cpu" else data_type.FLOAT
    rng = np.random.default_rng(0)
    host_dtype = numpy_dtype(io_type)

    ref, ref_inputs, ref_out = build("cpu", io_type)
    ref.build()
    inputs = {t.name: rng.standard_normal(t.dim).astype(np.float32).astype(host_dtype) for t in ref_inputs}
    expected = np.zeros(ref_out.dim, host_dtype)
    ref.execute({**{t: inputs[t.name] for t in ref_inputs}, ref_out: expected})

    if device == "cpu":
        # No GPU: check the reference engine against an independent formula of the same graph.
        got = _independent(name, inputs).astype(host_dtype)
        engine = ref.selected_plan.label + " (CPU; no GPU visible)"
    else:
        from .errors import GraphNotSupportedError
        g, g_inputs, g_out = build(device, io_type)
        try:
            g.build()
        except GraphNotSupportedError as exc:
            # No GPU engine runs this op yet: the best engine available is the host reference engine.
            reasons = "; ".join(f"{who}: {why}" for who, why in getattr(exc, "declines", []))
            got = _independent(name, inputs).astype(host_dtype)
            err = float(np.max(np.abs(got.astype(np.float32) - expected.astype(np.float32))))
            scale = float(np.max(np.abs(expected.astype(np.float32)))) or 1.0
            ok = err <= 2e-2 * scale
            return StepResult(f"{name} on cpu (no GPU engine for it yet)", ok,
                              f"engine {ref.selected_plan.label}; max |error| {err:.3g} vs an independent "
                              f"formula; GPU declines: {reasons[:300]}")
        engine = g.selected_plan.label
        dev = _DeviceArrays()
        try:
            pack = {t: dev.upload(np.ascontiguousarray(inputs[t.name])) for t in g_inputs}
            out_host = np.zeros(g_out.dim, host_dtype)
            out_addr = dev.upload(out_host)
            pack[g_out] = out_addr
            g.execute(pack)
            dev.driver.cuCtxSynchronize()
            got = dev.download(out_addr, out_host)
        finally:
            dev.close()
    err = float(np.max(np.abs(got.astype(np.float32) - expected.astype(np.float32))))
    scale = float(np.max(np.abs(expected.astype(np.float32)))) or 1.0
    tol = 2e-2 if device != "cpu" else 1e-4
    ok = err <= tol * scale
    return StepResult(f"{name} on {device}", ok, f"engine {engine}; max |error| {err:.3g} "
                      f"(tolerance {tol * scale:.3g}) vs the reference engine")


def _independent(name, inputs):
    import numpy as np
    if name == "matmul+bias+relu":
        x = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64) + inputs["bias"]
        return np.maximum(x, 0)
    q, k, v = (inputs[n].astype(np.float64) for n in ("q", "k", "v"))
    scores = q @ np.swapaxes(k, -1, -2) * q.shape[-1] ** -0.5
    s = scores.shape[-1]
    scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _step_matmul() -> StepResult:
    return _run_case(_matmul_bias_relu, "matmul+bias+relu")


def _step_sdpa() -> StepResult:
    return _run_case(_sdpa_causal, "sdpa (causal)")


STEPS: list[Callable[[], StepResult]] = [_step_slot_roundtrip, _step_matmul, _step_sdpa]


def run_check(out=None) -> int:
    """Print the report and run every step; 0 when all pass."""
    out = out or sys.stdout
    env = environment()
    out.write("cudnn_graph environment\n")
    for key, value in env.items():
        if key == "gpus":
            if not value:
                out.write(f"  {'gpu':<16} none visible (CPU only: the reference engine runs the graphs)\n")
            for g in value:
                cc = ".".join(map(str, g["compute_capability"]))
                out.write(f"  {'gpu':<16} {g['ordinal']}: {g['name']} (sm_{cc.replace('.', '')})\n")
            continue
        out.write(f"  {key:<16} {value if value is not None else 'not found'}\n")
    out.write("self-tests\n")
    failures = 0
    for step in STEPS:
        try:
            result = step()
        except Exception as exc:
            result = StepResult(getattr(step, "__name__", "step"), False,
                                f"{type(exc).__name__}: {exc}")
            logger.debug("check step failed", exc_info=True)
            traceback.print_exc(file=sys.stderr)
        failures += not result.ok
        out.write(f"  [{'ok' if result.ok else 'FAIL'}] {result.name}: {result.detail}\n")
    out.write("check passed\n" if failures == 0 else f"check FAILED ({failures} step(s))\n")
    return 0 if failures == 0 else 1
