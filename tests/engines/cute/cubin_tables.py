"""The parameter layout the C launch path writes for a CuTe chunk kernel, as its cubin declares it (for the
kernels' compile tests in this folder): the addresses (8 bytes each), then tokens, chunks and sequences as
int32."""
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
