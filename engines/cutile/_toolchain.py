"""Whether cuTile can compile here: the ``cuda.tile`` package and a ``tileiras`` compiler.

Two questions, at two prices: ``installed()`` looks ``cuda.tile`` up without importing it (the manifest
asks it when cudnn_graph plans its first graph); ``missing()`` imports it (about 0.6 s) and looks for the
compiler, and is asked only when the engine first considers a graph on a device it can serve.
"""
from __future__ import annotations

import functools
import importlib.util
import logging

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def tileiras_path() -> str | None:
    """Path of the tileiras compiler cuTile would use (its pip package, PATH or CUDA_HOME), or None."""
    try:
        from cuda.tile import _compile
        return _compile._find_compiler_bin().path
    except (ImportError, FileNotFoundError, AttributeError) as exc:
        logger.debug("no tileiras compiler: %s", exc)
        return None


def installed() -> bool:
    """Whether a ``cuda.tile`` package is on the path (found, not imported: a host graph never pays for
    it). A package that is found but fails to import, or a missing compiler, is ``missing()``'s to say."""
    try:
        return importlib.util.find_spec("cuda.tile") is not None
    except (ImportError, ValueError):
        return False
    except Exception:            # noqa: BLE001  (the ``cuda`` package itself is broken: missing() says how)
        return True


def missing() -> str | None:
    """Why cuTile kernels cannot be built here, or None when they can."""
    try:
        import cuda.tile  # noqa: F401
    except ImportError as exc:
        return f"cuda.tile is not importable ({exc}); install the 'cutile' extra"
    except Exception as exc:     # noqa: BLE001  (a broken install raises what it likes: the engine declines)
        why = (f"cuda.tile is installed but does not import ({type(exc).__name__}: "
               f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); reinstall the 'cutile' extra")
        logger.warning("cuTile engine declines every graph: %s", why)   # broken, unlike a plain absence: say so
        return why
    if tileiras_path() is None:
        return ("no tileiras compiler was found (pip package nvidia-cuda-tileiras with nvidia-cuda-nvcc and "
                "nvidia-nvvm, or tileiras on PATH / in $CUDA_HOME/bin)")
    return None
