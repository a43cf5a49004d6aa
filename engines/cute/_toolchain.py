"""Whether CuTe DSL kernels can be compiled here: the nvidia-cutlass-dsl package (module ``cutlass``)."""
from __future__ import annotations

import importlib.util


def missing() -> str | None:
    """Why the CuTe GEMM cannot be built here, or None when it can.

    Only the package's presence is checked (importing the DSL takes about a second); a broken install
    surfaces when the first plan is built.
    """
    try:
        found = importlib.util.find_spec("cutlass") is not None and \
            importlib.util.find_spec("cutlass.cute") is not None
    except (ImportError, ValueError) as exc:
        return f"nvidia-cutlass-dsl is not importable ({exc}); install the 'cute' extra"
    if not found:
        return "nvidia-cutlass-dsl is not installed (module 'cutlass'); install the 'cute' extra"
    return None
