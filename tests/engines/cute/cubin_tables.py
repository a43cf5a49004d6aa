"""The parameter layout the C launch path writes for a CuTe chunk kernel, as its cubin declares it (for the
kernels' compile tests in this folder): the addresses (8 bytes each), then tokens, chunks and sequences as
int32; and the kernels' stack frames (a spill shows as one) and registers a thread."""
from __future__ import annotations


def kernel_table(cubin: bytes):
    """The parameter table of the cubin's one kernel (``_abi.CubinKernel``)."""
    from cudnn_graph.engines.cutile import _abi
    (symbol,) = _abi.kernel_symbols(cubin)
    return _abi.cubin_parameters(cubin, symbol)


def parameters(cubin: bytes) -> list:
    """(offset, size) of each parameter of the cubin's one kernel."""
    return [(p.offset, p.size) for p in kernel_table(cubin).params]


def addresses_then_three_sizes(addresses: int) -> list:
    """The C path's layout for ``addresses`` pointers."""
    return [(8 * i, 8) for i in range(addresses)] + [(8 * addresses + 4 * i, 4) for i in range(3)]


EIATTR_FRAME_SIZE = 0x11    # in the cubin's global .nv.info: (symbol index, bytes) per kernel
EIATTR_REGCOUNT = 0x2F      # likewise: (symbol index, registers a thread) per kernel


def largest_frame(cubin: bytes) -> int:
    """The largest per-thread stack frame of the cubin's kernels, in bytes (0: nothing spilled to local memory)."""
    import struct
    from cudnn_graph.engines.cutile import _abi
    info = _abi._sections(cubin).get(".nv.info", b"")
    return max((struct.unpack_from("<II", value)[1] for attr, value in _abi._records(info)
                if attr == EIATTR_FRAME_SIZE), default=0)


def registers(cubin: bytes) -> int:
    """The most registers a thread of the cubin's kernels takes."""
    import struct
    from cudnn_graph.engines.cutile import _abi
    info = _abi._sections(cubin).get(".nv.info", b"")
    return max((struct.unpack_from("<II", value)[1] for attr, value in _abi._records(info)
                if attr == EIATTR_REGCOUNT), default=0)
