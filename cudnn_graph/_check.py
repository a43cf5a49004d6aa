"""``python -m cudnn_graph check``: an environment report, then self-tests on the best engine available.

The report says what this process can use and, for what it cannot, why: the CUDA driver and GPUs, the
libcudnn the loader found (or every place it tried, with the fix), and each in-tree engine with its
version and status, in the engine's own words. ``--json`` gives the same as one object for bug reports.
Nothing here imports a GPU framework or a DSL the engine modules do not import themselves: package
versions come from the installed distributions' metadata.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import platform
import re
import subprocess
import sys
import traceback
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Callable, Optional, TextIO

logger = logging.getLogger(__name__)


@dataclass
class StepResult:
    name: str
    ok: bool
    detail: str = ""
    data: dict = field(default_factory=dict)


@dataclass
class EngineStatus:
    """One engine as the report shows it: ``status`` is "ready" (it can serve graphs here), "no GPU"
    (installed, but no CUDA device it runs on is visible) or "absent" (``detail`` says why)."""
    name: str
    status: str
    detail: str
    versions: dict = field(default_factory=dict)


# Distributions the report names when installed: cudnn_graph's own dependencies and extras, and the
# producers people hand buffers from. Read from metadata only: importing torch or jax takes seconds
# and can initialise CUDA.
_BASE_DISTRIBUTIONS = ("cudnn_graph", "numpy", "ml_dtypes", "cuda-pathfinder", "cuda-bindings")
_RELEVANT_DISTRIBUTION = re.compile(
    r"^(nvidia-|cuda-|cupy|torch$|jax$|jaxlib$|jax-cuda|numba|tensorflow$|triton$|ml[-_]dtypes$|numpy$)")
_CUDNN_WHEELS = ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13")
# Producers the report always names, installed or not: (module, distributions that provide it).
_FRAMEWORKS = (("torch", ("torch",)), ("jax", ("jax",)), ("jaxlib", ("jaxlib",)),
               ("cupy", ("cupy-cuda13x", "cupy-cuda12x", "cupy")), ("numba", ("numba",)),
               ("numba_cuda", ("numba-cuda",)))
# Environment variables that change what is loaded (only these: a bug report must not carry secrets).
_ENVIRONMENT_VARIABLES = ("CUDNN_GRAPH_LIBCUDNN", "CUDNN_GRAPH_LOG", "CUDNN_PATH", "CUDA_HOME", "CUDA_PATH",
                          "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "LD_PRELOAD", "CONDA_PREFIX", "VIRTUAL_ENV")
_LOADED_LIBRARY = re.compile(r"/(libcudnn[^/]*\.so[^/]*|libcublas(Lt)?\.so[^/]*|libcudart\.so[^/]*|libcuda\.so[^/]*"
                             r"|libnvrtc\.so[^/]*)$")


def _distribution_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def packages() -> dict:
    """``{distribution: version}``: cudnn_graph's dependencies (None when missing) and every installed
    NVIDIA / CUDA / framework distribution, from metadata (nothing is imported)."""
    found = {name: _distribution_version(name) for name in _BASE_DISTRIBUTIONS}
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").strip()
        if name and _RELEVANT_DISTRIBUTION.match(name.lower()):
            found.setdefault(name.lower(), dist.version)
    return dict(sorted(found.items(), key=lambda item: (item[0] not in _BASE_DISTRIBUTIONS, item[0])))


def frameworks() -> dict:
    """``{module: version or None}`` for the frameworks whose buffers people pass, from metadata only
    (importing torch or jax takes seconds and may initialise CUDA)."""
    found = {}
    for module, distributions in _FRAMEWORKS:
        found[module] = next((v for v in map(_distribution_version, distributions) if v), None)
    return found


def _os_release() -> Optional[str]:
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return None


def python_info() -> dict:
    return {"version": platform.python_version(), "implementation": platform.python_implementation(),
            "executable": sys.executable,
            "virtual_env": sys.prefix if sys.prefix != getattr(sys, "base_prefix", sys.prefix) else None}


def platform_info() -> dict:
    return {"platform": platform.platform(), "machine": platform.machine(), "os": _os_release(),
            "libc": " ".join(v for v in platform.libc_ver() if v) or None}


def _format_cuda_version(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def cuda_info() -> dict:
    """The CUDA driver (None when libcuda does not load) and the devices it sees."""
    from . import _driver
    version = _driver.driver_version()
    gpus = []
    for i in range(_driver.device_count()):
        info = _driver.device_info(i)
        major, minor = info["compute_capability"]
        gpus.append({"ordinal": info["ordinal"], "name": info["name"], "compute_capability": f"{major}.{minor}",
                     "sm": f"sm_{major}{minor}"})
    return {"driver_loaded": bool(_driver.driver_available()),
            "driver_cuda_version": _format_cuda_version(version) if version else None,
            "gpus": gpus}


def _cudnn_is_installed_somewhere() -> bool:
    """Whether a libcudnn exists where cuda-pathfinder looks first (a cuDNN wheel, $CUDNN_PATH, conda):
    only then is a failure of its dependencies (libcublasLt) the reason cuDNN did not load."""
    if any(_distribution_version(name) for name in _CUDNN_WHEELS):
        return True
    for root, subdirs in ((os.environ.get("CUDNN_PATH"), ("lib", "lib64")), (os.environ.get("CONDA_PREFIX"), ("lib",))):
        if root and any(os.path.exists(os.path.join(root, sub, "libcudnn.so.9")) for sub in subdirs):
            return True
    return False


_PATHFINDER_SOUGHT = re.compile(r'Failure finding "([^"]+)"')    # DynamicLibNotFoundError: the library


def explain_attempts(attempts) -> list:
    """The loader's ``(place, reason)`` list with each reason as the report shows it.

    cuda-pathfinder loads libcudnn's dependencies before it looks for libcudnn, so without any cuDNN
    its failure names libcublasLt: true, but beside the point. That reason is then replaced by what is
    really missing; it stays when a cuDNN is installed (its missing dependency is then the cause).
    """
    shown = []
    for place, reason in attempts:
        sought = _PATHFINDER_SOUGHT.search(reason) if place.startswith("cuda.pathfinder") else None
        if sought and "cudnn" not in sought.group(1).lower():
            if _cudnn_is_installed_somewhere():
                reason = f"a cuDNN is installed, but a library it needs did not load: {reason}"
            else:
                reason = ("no cuDNN wheel (" + " / ".join(_CUDNN_WHEELS) + ") is installed and $CUDNN_PATH names "
                          "no libcudnn (cuda-pathfinder looks for libcudnn's dependencies first and stopped at one: "
                          "--json has its words)")
        shown.append((place, reason))
    return shown


def cudnn_info() -> dict:
    """The loaded libcudnn (path, how it was found, versions), or the loader's failure: ``error`` is its
    whole message, ``attempts`` every place tried with the reason as ``explain_attempts`` shows it."""
    try:
        from . import _loader
    except ImportError as exc:
        return {"loaded": False, "error": f"the loader is not built ({exc})", "attempts": [], "install_hint": None}
    from ._cudnn_errors import CudnnNotFoundError
    try:
        _loader.load()
        info = _loader.library_info()
    except CudnnNotFoundError as exc:
        return {"loaded": False, "error": str(exc), "summary": exc.summary, "install_hint": exc.install_hint,
                "attempts": [{"place": place, "reason": shown, "raw_reason": raw}
                             for (place, raw), (_, shown) in zip(exc.attempts, explain_attempts(exc.attempts))]}
    except Exception as exc:     # noqa: BLE001  (a broken library raises what it likes: report it)
        return {"loaded": False, "error": f"{type(exc).__name__}: {exc}", "attempts": [], "install_hint": None}
    cudart = info["cudart_version"]
    return {"loaded": True, "version": info["version_string"], "path": info["path"], "found_via": info["found_via"],
            "cudart_version": _format_cuda_version(cudart) if cudart else None,
            "optional_entry_points": info["optional_entry_points"]}


def loaded_libraries() -> list:
    """CUDA libraries mapped into this process (the copy that is loaded, when several are installed)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if ".so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if _LOADED_LIBRARY.search(p))


# ---- the engines ----------------------------------------------------------------------------------

# In-tree engines the report describes: (name in plan lists, package, distributions whose versions it
# shows). Whether each one can run is the engine's own word (its toolchain module or the loader).
_DSL_ENGINES = (
    ("cute_gemm", "cute", ("nvidia-cutlass-dsl",)),
    ("cutile_linear_attention", "cutile", ("cuda-tile", "nvidia-cuda-tileiras")),
)


def _toolchain_missing(package: str) -> Optional[str]:
    """The engine package's own reason its toolchain is missing, or None (its ``_toolchain.missing()``;
    a package that refuses to import raises ImportError with that same reason)."""
    try:
        toolchain = importlib.import_module(f"cudnn_graph.engines.{package}._toolchain")
    except ImportError as exc:
        return str(exc) or f"cudnn_graph.engines.{package} does not import"
    return toolchain.missing()


def _arch_reason(package: str, gpus: list) -> Optional[str]:
    """Why no visible GPU suits the engine (its REQUIRED_ARCH / MIN_ARCH), or None."""
    try:
        engine = importlib.import_module(f"cudnn_graph.engines.{package}.engine")
    except Exception:            # noqa: BLE001  (the self-tests and declines will say more)
        return None
    exact, minimum = getattr(engine, "REQUIRED_ARCH", None), getattr(engine, "MIN_ARCH", None)
    arches = [tuple(int(v) for v in g["compute_capability"].split(".")) for g in gpus]
    if exact is not None and exact not in arches:
        return f"its kernels are for sm_{exact[0]}{exact[1]} only; no visible GPU is"
    if minimum is not None and not any(a >= minimum for a in arches):
        return f"its kernels need sm_{minimum[0]}{minimum[1]} or newer; no visible GPU is"
    return None


def _tileiras(versions: dict) -> None:
    try:
        from .engines.cutile import _toolchain
        path = _toolchain.tileiras_path()
    except Exception:            # noqa: BLE001
        return
    if path is None:
        versions["tileiras"] = None
        return
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
        line = next((l.strip() for l in reversed(out.splitlines()) if l.strip()), "")
    except (OSError, subprocess.SubprocessError) as exc:
        line = f"does not run ({exc})"
    versions["tileiras"] = f"{path} ({line})" if line else path


def engine_statuses(cuda: dict, cudnn: dict) -> list:
    """Every in-tree engine (and any registered one) with its status, versions and, when it cannot run
    here, why."""
    import numpy
    gpus = cuda["gpus"]
    result = [EngineStatus("reference", "ready", "host (cpu) graphs, every op, in NumPy (the numerical oracle)",
                           {"numpy": numpy.__version__})]
    if cudnn["loaded"]:
        status = "ready" if gpus else "no GPU"
        result.append(EngineStatus("cudnn_backend", status,
                                   f"cuDNN {cudnn['version']} from {cudnn['path']}"
                                   + ("" if gpus else " (loaded, but there is no GPU to run it on)"),
                                   {"cuDNN": cudnn["version"], "libcudnn": cudnn["path"]}))
    else:
        result.append(EngineStatus("cudnn_backend", "absent", "libcudnn not found (see cuDNN above)",
                                   {name: _distribution_version(name) for name in _CUDNN_WHEELS}))
    for name, package, distributions in _DSL_ENGINES:
        versions = {d: _distribution_version(d) for d in distributions}
        if package == "cutile":
            _tileiras(versions)
        why = _toolchain_missing(package)
        if why is not None:
            result.append(EngineStatus(name, "absent", why, versions))
        elif not gpus:
            result.append(EngineStatus(name, "no GPU", "toolchain present; no CUDA device is visible", versions))
        else:
            arch = _arch_reason(package, gpus)
            result.append(EngineStatus(name, "no GPU" if arch else "ready", arch or "toolchain present", versions))
    from .engines import manifest
    known = {e.name for e in result}
    for engine in manifest.engines():
        if engine.name not in known:
            result.append(EngineStatus(engine.name, "ready", f"registered ({type(engine).__module__})"))
    return result


def environment() -> dict:
    """What this process can use: Python, platform, packages, the CUDA driver and GPUs, libcudnn."""
    from . import __version__
    cuda = cuda_info()
    cudnn = cudnn_info()
    return {"cudnn_graph": __version__, "python": python_info(), "platform": platform_info(),
            "packages": packages(), "frameworks": frameworks(),
            "environment_variables": {k: os.environ[k] for k in _ENVIRONMENT_VARIABLES if k in os.environ},
            "cuda": cuda, "cudnn": cudnn, "loaded_libraries": loaded_libraries()}


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
    """CUDA device 0 when the driver sees a GPU (an engine there runs the self-tests; when none can, they
    run on the host and say which engines declined), else the host."""
    from . import _driver
    return "cuda:0" if _driver.device_count() > 0 else "cpu"


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


def _max_error(got, expected) -> tuple:
    import numpy as np
    err = float(np.max(np.abs(got.astype(np.float32) - expected.astype(np.float32))))
    scale = float(np.max(np.abs(expected.astype(np.float32)))) or 1.0
    return err, scale


_INDEPENDENT = "an independent NumPy float64 formula"


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
        # No GPU: the reference engine's result against a formula that shares no code with it.
        err, scale = _max_error(expected, _independent(name, inputs).astype(host_dtype))
        tol = 1e-4 * scale
        return StepResult(f"{name} on cpu", err <= tol,
                          f"engine {ref.selected_plan.label} (no GPU visible) vs {_INDEPENDENT}: max |error| "
                          f"{err:.3g} (tolerance {tol:.3g})", {"engine": ref.selected_plan.label, "device": "cpu",
                                                               "max_error": err, "tolerance": tol,
                                                               "compared_with": _INDEPENDENT})
    from .errors import GraphNotSupportedError
    g, g_inputs, g_out = build(device, io_type)
    try:
        g.build()
    except GraphNotSupportedError as exc:
        # No GPU engine runs this graph here: the best engine available is the host reference engine.
        declines = list(getattr(exc, "declines", []))
        err, scale = _max_error(expected, _independent(name, inputs).astype(host_dtype))
        tol = 2e-2 * scale
        reasons = "; ".join(f"{who}: {why}" for who, why in declines)
        return StepResult(f"{name} on cpu (no engine for it on {device})", err <= tol,
                          f"engine {ref.selected_plan.label} vs {_INDEPENDENT}: max |error| {err:.3g} "
                          f"(tolerance {tol:.3g}); {device} declines: {reasons}",
                          {"engine": ref.selected_plan.label, "device": "cpu", "max_error": err, "tolerance": tol,
                           "compared_with": _INDEPENDENT, "declines": [list(d) for d in declines]})
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
    err, scale = _max_error(got, expected)
    tol = 2e-2 * scale
    compared = "the reference engine on the host"
    return StepResult(f"{name} on {device}", err <= tol,
                      f"engine {engine} vs {compared}: max |error| {err:.3g} (tolerance {tol:.3g})",
                      {"engine": engine, "device": device, "max_error": err, "tolerance": tol,
                       "compared_with": compared})


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


def run_steps(steps=None) -> list:
    """Run every self-test; a step that raises fails with the exception's text (traceback in ``data``)."""
    results = []
    for step in STEPS if steps is None else steps:
        try:
            result = step()
        except Exception as exc:     # noqa: BLE001  (the report is the place to say what broke)
            logger.debug("check step failed", exc_info=True)
            result = StepResult(getattr(step, "__name__", "step"), False, f"{type(exc).__name__}: {exc}",
                                {"traceback": traceback.format_exc()})
        results.append(result)
    return results


def report() -> dict:
    """The whole check as one JSON-able object: ``environment()`` plus ``engines``, ``self_tests`` and
    ``passed`` (what ``python -m cudnn_graph check --json`` prints)."""
    env = environment()
    engines = engine_statuses(env["cuda"], env["cudnn"])
    results = run_steps()
    # After the self-tests: the libraries they loaded are mapped now.
    env["loaded_libraries"] = loaded_libraries()
    return {**env, "engines": [asdict(e) for e in engines], "self_tests": [asdict(r) for r in results],
            "passed": all(r.ok for r in results)}


def _write_wrapped(w, label: str, items: list, width: int = 100) -> None:
    """``label`` then the items, comma-separated, on as many indented lines as they need."""
    line, lines = "", []
    for item in items:
        if line and len(line) + len(item) + 2 > width - 17:
            lines.append(line + ",")
            line = item
        else:
            line = f"{line}, {item}" if line else item
    lines.append(line)
    for i, text in enumerate(lines):
        w(f"  {label if i == 0 else '':<14} {text}\n")


def _write_text(rep: dict, out: TextIO) -> None:
    w = out.write
    py, plat, cuda, cudnn = rep["python"], rep["platform"], rep["cuda"], rep["cudnn"]
    w(f"cudnn_graph {rep['cudnn_graph']}\n")
    w(f"  {'python':<14} {py['version']} ({py['executable']})\n")
    w(f"  {'platform':<14} {plat['platform']}\n")
    _write_wrapped(w, "packages", [f"{k} {v or 'not installed'}" for k, v in rep["packages"].items()])
    present = {k: v for k, v in rep["frameworks"].items() if v}
    w(f"  {'frameworks':<14} " + (", ".join(f"{k} {v}" for k, v in present.items()) if present else
                                  "none installed (" + ", ".join(rep["frameworks"]) + ")") + "\n")
    if cuda["driver_loaded"]:
        w(f"  {'CUDA driver':<14} CUDA {cuda['driver_cuda_version']}\n")
    else:
        w(f"  {'CUDA driver':<14} not loaded (no libcuda.so.1, or it failed to initialise)\n")
    if not cuda["gpus"]:
        w(f"  {'GPUs':<14} none visible: graphs run on the CPU reference engine\n")
    for g in cuda["gpus"]:
        w(f"  {'GPU ' + str(g['ordinal']):<14} {g['name']} ({g['sm']})\n")
    if cudnn["loaded"]:
        w(f"  {'cuDNN':<14} {cudnn['version']} (CUDA runtime {cudnn['cudart_version']}) at {cudnn['path']}\n")
        w(f"  {'':<14} found via {cudnn['found_via']}\n")
    else:
        w(f"  {'cuDNN':<14} not found. {cudnn.get('summary') or cudnn['error']}; tried, in order:\n")
        for attempt in cudnn["attempts"]:
            w(f"  {'':<14}   - {attempt['place']}: {attempt['reason']}\n")
        if cudnn.get("install_hint"):
            w(f"  {'':<14} {cudnn['install_hint']}\n")
    w("engines\n")
    for e in rep["engines"]:
        versions = ", ".join(f"{k} {v or ('not found' if k == 'tileiras' else 'not installed')}"
                             for k, v in e["versions"].items())
        w(f"  {e['name']:<24} {e['status']:<7} {e['detail']}" + (f" [{versions}]" if versions else "") + "\n")
    w("self-tests\n")
    for r in rep["self_tests"]:
        w(f"  [{'ok' if r['ok'] else 'FAIL'}] {r['name']}: {r['detail']}\n")
    failures = sum(not r["ok"] for r in rep["self_tests"])
    w("check passed\n" if failures == 0 else f"check FAILED ({failures} step(s))\n")


def run_check(out: Optional[TextIO] = None, as_json: bool = False) -> int:
    """Print the report (text, or one JSON object with ``as_json``) and return the exit status: 0 when
    every self-test passed on the best engine available, 1 otherwise.

    Example::

        >>> from cudnn_graph._check import run_check
        >>> status = run_check()          # doctest: +SKIP
    """
    out = out or sys.stdout
    rep = report()
    if as_json:
        json.dump(rep, out, indent=2, default=str)
        out.write("\n")
    else:
        _write_text(rep, out)
        for r in rep["self_tests"]:
            if "traceback" in r["data"]:
                sys.stderr.write(r["data"]["traceback"])
    return 0 if rep["passed"] else 1
