"""Whether CuTe DSL kernels can be compiled here: the nvidia-cutlass-dsl package (module ``cutlass``).

Two questions, at two prices: ``installed()`` looks the package up without importing it (the manifest
asks it when cudnn_graph plans its first graph); ``missing()`` imports the DSL (about a third of a
second) and is asked only when the engine first considers a graph on a device it can serve.
"""
from __future__ import annotations

import importlib.util
import logging

NOT_INSTALLED = "nvidia-cutlass-dsl is not installed (module 'cutlass'); install the 'cute' extra"


def installed() -> bool:
    """Whether a ``cutlass`` package is on the path (found, not imported: a host graph never pays for
    the DSL). A package that is found but fails to import is reported by ``missing()``."""
    try:
        return importlib.util.find_spec("cutlass") is not None
    except (ImportError, ValueError):
        return False


def missing() -> str | None:
    """Why the CuTe GEMM cannot be built here, or None when it can.

    Looking up ``cutlass.cute`` runs the top package's import: an install that fails there (e.g. no
    CUDA toolkit flavour of its MLIR libraries) is reported as missing, with its error.
    """
    try:
        found = importlib.util.find_spec("cutlass") is not None and \
            importlib.util.find_spec("cutlass.cute") is not None
    except (ImportError, ValueError) as exc:
        return f"nvidia-cutlass-dsl is not importable ({exc}); install the 'cute' extra"
    except Exception as exc:     # noqa: BLE001  (a broken install raises what it likes: the engine declines)
        why = (f"nvidia-cutlass-dsl is installed but does not import ({type(exc).__name__}: "
               f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); reinstall the 'cute' extra")
        logging.getLogger(__name__).warning("CuTe GEMM engine declines every graph: %s", why)   # broken: say so
        return why
    if not found:
        return NOT_INSTALLED
    return None
