"""``CUDNN_GRAPH_LOG=info|debug`` (or ``warning``): a stderr handler on the ``cudnn_graph`` logger,
installed when ``cudnn_graph`` is imported. Unset (or ``off``), the package keeps only its NullHandler
and prints nothing; an application's own logging configuration works either way (records propagate).

Example (a shell):

    CUDNN_GRAPH_LOG=info python my_script.py      # one INFO line per graph build, compiles, long runs
    CUDNN_GRAPH_LOG=debug python my_script.py     # ... and every engine's decline, with its reason
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Mapping, Optional

ENV = "CUDNN_GRAPH_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_OFF = ("", "0", "off", "none")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def install_from_environment(environ: Mapping[str, str] = os.environ) -> Optional[logging.Handler]:
    """Add the stderr handler that ``environ[CUDNN_GRAPH_LOG]`` asks for to the ``cudnn_graph`` logger
    (and lower the logger's level to it); returns the handler, or None when none is asked for. A value
    that is not a level is ignored with a RuntimeWarning naming the ones that are.

    Example:
        >>> install_from_environment({"CUDNN_GRAPH_LOG": "off"}) is None
        True
    """
    value = environ.get(ENV, "").strip().lower()
    if value in _OFF:
        return None
    level = LEVELS.get(value)
    if level is None:
        warnings.warn(f"{ENV}={environ.get(ENV)!r} is not one of {', '.join(LEVELS)} (or off); no log "
                      "handler installed", RuntimeWarning, stacklevel=2)
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.setLevel(level)
    package_logger = logging.getLogger("cudnn_graph")
    package_logger.addHandler(handler)
    if package_logger.level == logging.NOTSET or package_logger.level > level:
        package_logger.setLevel(level)
    return handler
