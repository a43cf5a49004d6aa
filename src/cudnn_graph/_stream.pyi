"""Type stubs for cudnn_graph._stream (compiled): stream arguments."""
from typing import Any

def as_stream_handle(stream: Any) -> int:
    """The raw CUDA stream handle for None, an int or an object with ``__cuda_stream__`` (0: the default stream)."""
