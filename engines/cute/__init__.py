"""CuTe DSL engines: a Hopper (sm_90) GEMM with fused bias / scale / activation epilogues.

Optional (extra ``cute``: nvidia-cutlass-dsl): without the DSL this package raises ImportError and the
manifest leaves the engine out; nothing else changes. See docs/engines_cute.md.
"""
from ._toolchain import missing as _missing

_why = _missing()
if _why is not None:
    raise ImportError(_why)

from .engine import CuteGemmEngine  # noqa: E402

__all__ = ["CuteGemmEngine"]
