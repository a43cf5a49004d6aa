"""``HostHandle``: what ``create_handle()`` returns on a machine where no libcudnn loads.

A port written for cudnn-frontend makes a handle first (``handle = cudnn.create_handle()``) and
passes it to every graph (``pygraph(handle=handle)``) and execute. On a machine without cuDNN the
same code runs unchanged on the reference engine: the host handle puts its graphs on the host
(``handle.device == "cpu"``), ``set_stream`` records the stream without using it (a host graph runs
inside the ``execute`` call, so there is nothing to order on a stream), and ``destroy_handle``
releases nothing.

Example:
    >>> from cudnn_graph.host_handle import HostHandle
    >>> import cudnn_graph as cudnn
    >>> h = HostHandle()
    >>> cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=h).device
    ('cpu', 0)
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

__all__ = ["HostHandle"]


class HostHandle:
    """A handle for host graphs: ``device`` is 'cpu'; the stream is recorded, never used."""

    device = "cpu"

    def __init__(self) -> None:
        self.stream = 0
        self.destroyed = False

    def bind_stream(self, stream) -> None:
        """Record ``stream`` (None, an int or a ``__cuda_stream__`` object); host graphs do not use it."""
        if stream is None:
            self.stream = 0
            return
        if hasattr(stream, "__cuda_stream__"):
            stream = stream.__cuda_stream__()[1]
        self.stream = int(stream)
        logger.debug("set_stream on a host handle: stream 0x%x recorded, unused by host graphs", self.stream)

    def __repr__(self) -> str:
        return f"HostHandle(device='cpu', stream=0x{self.stream:x}{', destroyed' if self.destroyed else ''})"
