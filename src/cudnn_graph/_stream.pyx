"""Stream arguments: None, a raw handle (int) or any object that publishes ``__cuda_stream__``."""
from libc.stdint cimport intptr_t


cdef intptr_t stream_handle(object stream) except? -1:
    if stream is None:
        return 0
    if type(stream) is int:
        if stream < 0:
            raise ValueError(f"a stream handle cannot be negative; got {stream}")
        return <intptr_t>stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        # CUDA stream protocol: a method returning (version, handle).
        pair = proto() if callable(proto) else proto
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"{type(stream).__name__}.__cuda_stream__() returned {pair!r}; "
                            "expected (version, handle)")
        return <intptr_t>int(pair[1])
    if isinstance(stream, int):   # an int subclass (e.g. an IntEnum or numpy integer is not int)
        return <intptr_t>int(stream)
    for attr in ("cuda_stream", "ptr", "handle"):   # older CuPy / torch streams
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return <intptr_t>value
    raise TypeError(f"stream must be None, an int handle or an object with __cuda_stream__; "
                    f"got {type(stream).__name__}")


def as_stream_handle(stream) -> int:
    """The raw CUDA stream handle for any accepted stream form (0 is the default stream).

    Example:
        >>> as_stream_handle(None)
        0
    """
    return stream_handle(stream)
