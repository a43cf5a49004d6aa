"""What one compiled GEMM kernel is specialised on: plain data, no DSL import (the CPU tests build these).

A ``GemmSpec`` fixes the problem (M, N, K, L), every operand's element strides in the kernel's mode order
(A as (M, K, L), B as (N, K, L), C and the epilogue tensors as (M, N, L)), the data types, the fused epilogue
and the kernel knobs. Graph shapes are fixed once a graph is built, so the kernel is compiled with static
layouts; only the addresses, the by-value scalars and the stream change between executes. Equal specs
compile to the same kernel: ``GemmSpec`` is the compile cache's key.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..._layout import ALIGNMENT_BYTES

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
