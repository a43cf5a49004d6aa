"""CuTe DSL engines: a Hopper (sm_90) GEMM with fused bias / scale / activation epilogues.

Optional (extra ``cute``: nvidia-cutlass-dsl): without the DSL this package raises ImportError and the
manifest leaves the engine out; nothing else changes. Importing this package does not import the DSL
(only looks it up): the engine imports it when it first considers a graph on a CUDA device it can serve.
See docs/engines_cute.md.
"""
from ._toolchain import NOT_INSTALLED as _NOT_INSTALLED, installed as _installed

if not _installed():
    raise ImportError(_NOT_INSTALLED)

from .engine import CuteGemmEngine  # noqa: E402

__all__ = ["CuteGemmEngine"]
