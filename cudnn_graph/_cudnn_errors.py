"""cuDNN failures as Python exceptions: the one place a ``cudnnStatus_t`` becomes an exception.

cuDNN 9 status codes are hierarchical, ``category * 1000 + specific error`` (1xxx library state,
2xxx bad parameter, 3xxx not supported, 4xxx internal error, 5xxx execution failed). The class is
chosen by category, so a sub-code a newer cuDNN adds still lands in the right family, while
``status_name`` keeps the exact sub-code (``CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH``, not just
``BAD_PARAM``).

The loader's errors live here too: a missing library, a missing symbol, a library too old for a
feature. Nothing in this module touches libcudnn; ``cudnn_graph._loader`` calls
:func:`raise_for_status` with the texts it read from the library.
"""
from __future__ import annotations

# STATUS_NAMES: every code include/cudnn_graph/cudnn_backend.h declares (generated from it at build
# time). Where a deprecated alias shares a code with its replacement, the replacement's name wins;
# CUDNN_STATUS_INVALID_VALUE (2001) has no replacement.
from cudnn_graph._cudnn_names import STATUS_NAMES
from cudnn_graph.errors import CudnnGraphError, GraphNotSupportedError

__all__ = [
    "STATUS_NAMES", "status_name", "status_class", "raise_for_status",
    "CudnnNotFoundError", "CudnnSymbolError", "CudnnVersionError",
    "CudnnStatusError", "CudnnLibraryError", "CudnnBadParamError", "CudnnNotSupportedError",
    "CudnnInternalError", "CudnnAllocFailedError", "CudnnExecutionFailedError",
    "format_version",
]

CUDNN_STATUS_SUCCESS = 0

_CATEGORY_NAMES = {
    1000: "CUDNN_STATUS_LIBRARY",   # cuDNN calls these "uncategorized"; no plain 1000 code exists
    2000: "CUDNN_STATUS_BAD_PARAM",
    3000: "CUDNN_STATUS_NOT_SUPPORTED",
    4000: "CUDNN_STATUS_INTERNAL_ERROR",
    5000: "CUDNN_STATUS_EXECUTION_FAILED",
}


def status_name(status: int) -> str:
    """The exact name of a status code; an unknown sub-code is named after its category."""
    status = int(status)
    name = STATUS_NAMES.get(status)
    if name is not None:
        return name
    category = _CATEGORY_NAMES.get(status // 1000 * 1000)
    if category is not None:   # a sub-code newer than the 9.28 headers
        return f"{category}_{status % 1000}"
    return f"CUDNN_STATUS_UNKNOWN_{status}"


def format_version(version: int) -> str:
    """``91900`` -> ``"9.19.0"`` (cuDNN 9 encodes major * 10000 + minor * 100 + patch)."""
    version = int(version)
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


# ---- loader errors -------------------------------------------------------------------------------

class CudnnNotFoundError(CudnnGraphError, RuntimeError):
    """No usable libcudnn (major version 9) could be loaded.

    ``attempts`` lists ``(place, reason)`` for every place the loader tried, in order; the message
    spells them out, so the fix (set CUDNN_GRAPH_LIBCUDNN, install nvidia-cudnn-cu12/cu13, ...) is
    visible without a debugger.
    """

    #: What to do about it: the message's last line (the cuDNN engine's decline quotes it too).
    install_hint = ("Install the cuDNN wheel (pip install 'cudnn_graph[cu12]' or '[cu13]') or set "
                    "CUDNN_GRAPH_LIBCUDNN to the path of libcudnn.so.9.")

    def __init__(self, attempts=(), summary: str = "libcudnn (cuDNN 9) could not be loaded"):
        self.attempts = [(str(place), str(reason)) for place, reason in attempts]
        self.summary = summary
        lines = [summary + "; tried, in order:"]
        lines += [f"  - {place}: {reason}" for place, reason in self.attempts]
        lines.append(self.install_hint)
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return (type(self), (self.attempts, self.summary))


class CudnnSymbolError(CudnnNotFoundError):
    """A libcudnn was found but lacks an entry point cudnn_graph requires (``symbol``)."""

    def __init__(self, attempts=(), symbol: str = "", summary: str | None = None):
        self.symbol = symbol
        super().__init__(attempts, summary or f"no loadable libcudnn exports the required symbol {symbol}")

    def __reduce__(self):
        return (type(self), (self.attempts, self.symbol, self.summary))


class CudnnVersionError(GraphNotSupportedError):
    """The loaded cuDNN is older than a feature needs.

    It is a :class:`GraphNotSupportedError`, so an engine that asks for a feature the library
    lacks declines cleanly and the plan list moves on.
    """

    def __init__(self, feature: str, required: int, found: int):
        self.feature = feature
        self.required = int(required)
        self.found = int(found)
        super().__init__(f"{feature} needs cuDNN >= {format_version(self.required)}; "
                         f"the loaded cuDNN is {format_version(self.found)}")

    def __reduce__(self):
        return (type(self), (self.feature, self.required, self.found))


# ---- status errors -------------------------------------------------------------------------------

class CudnnStatusError(CudnnGraphError, RuntimeError):
    """A cuDNN call returned a status other than CUDNN_STATUS_SUCCESS.

    Attributes: ``status`` (the int code), ``status_name`` (its exact name), ``where`` (which call
    or step failed), ``error_string`` (cudnnGetErrorString's text) and ``last_error``
    (cudnnGetLastErrorString's text: cuDNN's own explanation, usually the useful part).
    """

    def __init__(self, status: int, where: str = "", last_error: str = "", error_string: str = ""):
        self.status = int(status)
        self.status_name = status_name(self.status)
        self.where = where or ""
        self.last_error = (last_error or "").strip()
        self.error_string = error_string or ""
        head = f"{self.where}: " if self.where else ""
        message = f"{head}{self.status_name} ({self.status})"
        if self.error_string and self.error_string != self.status_name:
            message += f": {self.error_string}"
        if self.last_error:
            message += f"\ncuDNN: {self.last_error}"
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.status, self.where, self.last_error, self.error_string))


class CudnnLibraryError(CudnnStatusError):
    """1xxx: library state (not initialized, sub-library version mismatch or load failure, license...)."""


class CudnnBadParamError(CudnnStatusError, ValueError):
    """2xxx: cuDNN rejected an argument or attribute (null pointer, shape mismatch, not finalized...)."""


class CudnnNotSupportedError(CudnnStatusError, GraphNotSupportedError):
    """3xxx: this cuDNN / GPU cannot run what was asked (graph pattern, shape, layout, arch...).

    A :class:`GraphNotSupportedError`, so an engine that gets it while building a plan declines.
    """


class CudnnInternalError(CudnnStatusError):
    """4xxx: cuDNN failed internally (compilation, unexpected value, launch parameters...)."""


class CudnnAllocFailedError(CudnnInternalError, MemoryError):
    """4003 / 4004: cuDNN could not allocate host or device memory."""


class CudnnExecutionFailedError(CudnnStatusError):
    """5xxx: a kernel or a library cuDNN calls (driver, runtime, cuBLAS, cuRAND) failed at run time."""


_CATEGORY_CLASSES = {
    1000: CudnnLibraryError,
    2000: CudnnBadParamError,
    3000: CudnnNotSupportedError,
    4000: CudnnInternalError,
    5000: CudnnExecutionFailedError,
}
_EXACT_CLASSES = {
    4003: CudnnAllocFailedError,   # INTERNAL_ERROR_HOST_ALLOCATION_FAILED (was ALLOC_FAILED)
    4004: CudnnAllocFailedError,   # INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
}


def status_class(status: int) -> type[CudnnStatusError]:
    """The exception class for a failed status: by exact code where one has its own, else by category."""
    status = int(status)
    cls = _EXACT_CLASSES.get(status)
    if cls is None:
        cls = _CATEGORY_CLASSES.get(status // 1000 * 1000, CudnnStatusError)
    return cls


def raise_for_status(status: int, where: str = "", last_error: str = "", error_string: str = "") -> None:
    """Raise the typed error for ``status``; return quietly for CUDNN_STATUS_SUCCESS."""
    status = int(status)
    if status == CUDNN_STATUS_SUCCESS:
        return
    raise status_class(status)(status, where, last_error, error_string)
