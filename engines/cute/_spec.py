"""What one compiled GEMM kernel is specialised on: plain data, no DSL import (the CPU tests build these).

A ``GemmSpec`` fixes the problem (M, N, K, L), every operand's element strides in the kernel's mode order
(A as (M, K, L), B as (N, K, L), C and the epilogue tensors as (M, N, L)), the data types, the fused epilogue
and the kernel knobs. Equal specs compile to the same kernel: ``GemmSpec`` is the compile cache's key.

Most problems are compiled once per shape class, not per shape: ``shape_class(spec)`` replaces M, N, K, L
by runtime kernel arguments and each stride by a symbol over them, when every operand is packed from its
shape (the usual case), the extents keep 16-byte strides (multiples of 8 elements) and offsets fit 32 bits.
A new batch size or sequence length of a known class then builds with no compile. Other layouts (padded
leading dimensions, odd extents) compile a kernel with static layouts for their shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..._layout import ALIGNMENT_BYTES

# The compiled host entry's arguments (engines/cute/_kernel.py's signature): six operand pointers (A, B, C
# and up to three epilogue tensors, unused ones at a placeholder), three f32 epilogue scalars, the extents
# M, N, K, L (read by a shape-class kernel, ignored by a static one), then the stream.
N_POINTERS = 6
N_SCALARS = 3
N_EXTENTS = 4

# Element sizes (bytes) of the types the kernel reads or writes.
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
TMA_ALIGN = ALIGNMENT_BYTES   # TMA: global address and every non-unit stride a multiple of 16 bytes
MAX_EPILOGUE_TENSORS = 3
MAX_EPILOGUE_SCALARS = 3
ACTIVATIONS = ("relu", "gelu_tanh", "swish")


@dataclass(frozen=True)
class EpilogueStep:
    """One fused op applied to the f32 accumulator: ``add`` / ``mul`` with a tensor (``tensor`` >= 0, an
    index into ``GemmSpec.epi_tensors``) or a by-value scalar (``scalar`` >= 0), or an activation.

    ``params``: relu (lower_clip, upper_clip, negative_slope), swish (beta,), otherwise ().
    """
    op: str
    tensor: int = -1
    scalar: int = -1
    params: tuple = ()


@dataclass(frozen=True)
class EpilogueTensor:
    """A tensor the epilogue reads element by element, broadcast to (M, N, L) by zero strides."""
    dtype: str
    stride: tuple          # (m, n, l) element strides; 0 on broadcast axes


@dataclass(frozen=True)
class Knobs:
    """The plan knobs: CTA tile (M, N), cluster (M, N), pipeline stages (0: as many as shared memory holds)
    and the tile scheduler's L2 swizzle (tiles of a group share operand panels in L2)."""
    tile: tuple = (128, 256)
    cluster: tuple = (2, 1)
    stages: int = 0
    swizzle: int = 1

    def label(self) -> str:
        stages = f"_s{self.stages}" if self.stages else ""
        swz = f"_sw{self.swizzle}" if self.swizzle != 1 else ""
        return f"t{self.tile[0]}x{self.tile[1]}_c{self.cluster[0]}x{self.cluster[1]}{stages}{swz}"

    def as_dict(self) -> dict:
        return {"tile": tuple(self.tile), "cluster": tuple(self.cluster), "stages": self.stages,
                "swizzle": self.swizzle}


@dataclass(frozen=True)
class GemmGeometry:
    """The problem a GEMM solves: operand data types, sizes and element strides in the kernel's mode order
    (both a matched graph and a compiled kernel's spec start with these fields)."""
    ab_dtype: str
    c_dtype: str
    M: int
    N: int
    K: int
    L: int
    a_stride: tuple        # (m, k, l)
    b_stride: tuple        # (n, k, l)
    c_stride: tuple        # (m, n, l)


@dataclass(frozen=True)
class GemmSpec(GemmGeometry):
    knobs: Knobs
    epi_tensors: tuple = ()
    n_scalars: int = 0
    steps: tuple = ()
    max_active_clusters: int = 0    # the persistent grid: clusters resident at once (0: one per SM / cluster)
    sm_count: int = 132
    # A shape class (``shape_class``): M, N, K, L are runtime arguments of the kernel (the fields are 0) and
    # every stride is a symbol of ``STRIDE_SYMBOLS`` evaluated from them at launch.
    dynamic: bool = False

    @property
    def a_major(self) -> str:
        return "k" if self.a_stride[1] == 1 else "m"

    @property
    def b_major(self) -> str:
        return "k" if self.b_stride[1] == 1 else "n"

    @property
    def c_major(self) -> str:
        return "n" if self.c_stride[1] == 1 else "m"

    def tile_counts(self) -> tuple:
        bm, bn = self.knobs.tile
        return (-(-self.M // bm), -(-self.N // bn), self.L)

    def clusters(self) -> int:
        cm, cn = self.knobs.cluster
        return self.max_active_clusters or max(1, self.sm_count // (cm * cn))


def smem_stages(tile: tuple, ab_itemsize: int, c_itemsize: int, epi_stages: int = 4,
                capacity: int = 232448) -> int:
    """A/B pipeline stages that fit next to the epilogue buffers in sm_90 shared memory (227 KiB)."""
    bm, bn = tile
    bk = 64
    per_stage = (bm + bn) * bk * ab_itemsize
    epi_bytes = min(bm, 128) * 32 * c_itemsize * epi_stages
    return int((capacity - 1024 - epi_bytes) // per_stage)


# The strides a shape-class kernel can express: a literal 0 or 1, or a product of runtime extents.
STRIDE_SYMBOLS = ("M", "N", "K", "MN", "MK", "NK")
CLASS_DIVISOR = 8             # extents of a shape class are multiples of 8: 16-byte strides for 2-byte types
_INT32_MAX = 2 ** 31 - 1


def stride_value(symbol, M: int, N: int, K: int):
    """The stride a symbol stands for (plain ints here; the kernel applies the same rule to its arguments)."""
    if isinstance(symbol, int):
        return symbol
    value = 1
    for factor in symbol:
        value = value * {"M": M, "N": N, "K": K}[factor]
    return value


def _epilogue_symbols(stride, M: int, N: int, L: int):
    """The packed symbols of an epilogue tensor (row vector, column vector, per batch or full), or None."""
    has_m, has_n = M > 1 and stride[0] != 0, N > 1 and stride[1] != 0
    if has_m and has_n:
        if stride[1] == 1:
            sym_m, sym_n, sym_l = "N", 1, "MN"
        elif stride[0] == 1:
            sym_m, sym_n, sym_l = 1, "M", "MN"
        else:
            return None
    else:
        sym_m, sym_n = (1 if has_m else 0), (1 if has_n else 0)
        sym_l = "M" if has_m else "N" if has_n else 1
    if L == 1 or stride[2] == 0:
        sym_l = 0
    return (sym_m, sym_n, sym_l)


def shape_class(spec: GemmSpec) -> GemmSpec | None:
    """The shape-generic spec that serves ``spec`` with M, N, K, L at run time, or None (static compile).

    Example::

        >>> a = GemmSpec("bfloat16", "bfloat16", 256, 512, 128, 1, (128, 1, 32768), (128, 1, 65536),
        ...              (512, 1, 131072), Knobs())
        >>> b = GemmSpec("bfloat16", "bfloat16", 768, 512, 128, 1, (128, 1, 98304), (128, 1, 65536),
        ...              (512, 1, 393216), Knobs())
        >>> shape_class(a) == shape_class(b)
        True
    """
    M, N, K, L = spec.M, spec.N, spec.K, spec.L
    if spec.dynamic or any(x % CLASS_DIVISOR for x in (M, N, K)):
        return None
    if max(M * K, N * K, M * N) * L > _INT32_MAX:
        return None
    packed = {
        "a": ("K", 1, "MK") if spec.a_major == "k" else (1, "M", "MK"),
        "b": ("K", 1, "NK") if spec.b_major == "k" else (1, "N", "NK"),
        "c": ("N", 1, "MN") if spec.c_major == "n" else (1, "M", "MN"),
    }
    extents = {"a": (M, K, L), "b": (N, K, L), "c": (M, N, L)}
    actual = {"a": spec.a_stride, "b": spec.b_stride, "c": spec.c_stride}
    for which, symbols in packed.items():
        for symbol, extent, stride in zip(symbols, extents[which], actual[which]):
            if extent > 1 and stride_value(symbol, M, N, K) != stride:
                return None
    epi = []
    for tensor in spec.epi_tensors:
        symbols = _epilogue_symbols(tensor.stride, M, N, L)
        if symbols is None:
            return None
        for symbol, extent, stride in zip(symbols, (M, N, L), tensor.stride):
            if extent > 1 and stride_value(symbol, M, N, K) != stride:
                return None
        epi.append(EpilogueTensor(tensor.dtype, symbols))
    from dataclasses import replace
    return replace(spec, M=0, N=0, K=0, L=0, a_stride=packed["a"], b_stride=packed["b"], c_stride=packed["c"],
                   epi_tensors=tuple(epi), dynamic=True)
