"""Whether CuTe DSL kernels can be compiled here: the nvidia-cutlass-dsl package (module ``cutlass``)."""
from __future__ import annotations

import importlib.util
import logging


def missing() -> str | None:
    """Why the CuTe GEMM cannot be built here, or None when it can.

    Only the package's presence is checked (importing the DSL takes about a second), but looking up
    ``cutlass.cute`` runs the top package's import: an install that fails there (e.g. no CUDA toolkit
    flavour of its MLIR libraries) is reported as missing, with its error.
    """
    try:
        found = importlib.util.find_spec("cutlass") is not None and \
            importlib.util.find_spec("cutlass.cute") is not None
    except (ImportError, ValueError) as exc:
        return f"nvidia-cutlass-dsl is not importable ({exc}); install the 'cute' extra"
    except Exception as exc:     # noqa: BLE001  (a broken install raises what it likes: the engine is absent)
        why = (f"nvidia-cutlass-dsl is installed but does not import ({type(exc).__name__}: "
               f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); reinstall the 'cute' extra")
        logging.getLogger(__name__).warning("CuTe GEMM engine left out: %s", why)   # broken: say so
        return why
    if not found:
        return "nvidia-cutlass-dsl is not installed (module 'cutlass'); install the 'cute' extra"
    return None
