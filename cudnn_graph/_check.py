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
            env["libcudnn_error"] = str(exc).splitlines()[0]
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


# Later self-tests (graph runs on the best engine) register here.
STEPS: list[Callable[[], StepResult]] = [_step_slot_roundtrip]


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
