"""Plan knobs for a GEMM problem and the simple model that ranks them.

Candidates: CTA tiles 128x256, 128x128, 64x256, 64x128 (M 128 = two consumer warpgroups), clusters 1x1,
2x1, 1x2 (TMA multicast of B along M / of A along N), stages as many as shared memory holds, and an L2
swizzle of 1 or 8 tiles. The model scores a configuration by

    useful fraction of the computed tile area (edge tiles waste rows / columns)
  x wave efficiency of the persistent grid (tiles spread over the SMs' clusters)
  x tile efficiency: operand bytes per MMA, relative to 128x256 (bigger tiles reuse more)

and ranks by score, breaking ties toward the larger tile. It is a starting order, not a tuner:
``bench/gemm.py --plans all`` times every candidate.
"""
from __future__ import annotations

from ._spec import ITEMSIZE, Knobs, smem_stages

TILES = ((128, 256), (128, 128), (64, 256), (64, 128))
CLUSTERS = ((2, 1), (1, 1), (1, 2))
SWIZZLES = (1, 8)
MAX_PLANS = 8
# Skinny problems (a few rows against a large weight: decode-time GEMMs) are weight-bandwidth bound, and
# cuDNN's split-K kernels serve them better than this persistent kernel: measured on the H200,
# 16 x 8192 x 8192 bf16 runs at 38 TF/s here against cuDNN's 61 and cuBLAS's 55. Such a problem keeps
# its CuTe plans, ranked after cuDNN's.
SKINNY_M = 64


def _tile_efficiency(tile) -> float:
    bm, bn = tile
    # bytes loaded per flop ~ (bm + bn) / (bm * bn); 128x256 is the reference
    return ((128 + 256) / (128 * 256)) / ((bm + bn) / (bm * bn))


def score(problem, knobs: Knobs, sm_count: int) -> float:
    bm, bn = knobs.tile
    cm, cn = knobs.cluster
    tm, tn = -(-problem.M // bm), -(-problem.N // bn)
    # tiles are scheduled in whole clusters
    tm_c, tn_c = -(-tm // cm) * cm, -(-tn // cn) * cn
    tiles = tm_c * tn_c * problem.L
    useful = (problem.M * problem.N * problem.L) / (tiles * bm * bn)
    slots = max(1, (sm_count // (cm * cn)) * cm * cn)
    waves = -(-tiles // slots)
    wave_eff = tiles / (waves * slots)
    # multicast halves one operand's L2 traffic; worth a little when the grid is large
    mcast = 1.03 if (cm * cn > 1 and tiles >= slots) else 1.0
    swz = 1.01 if (knobs.swizzle > 1 and tm_c >= 8 and tn_c >= 8) else (1.0 if knobs.swizzle == 1 else 0.99)
    return useful * wave_eff * _tile_efficiency(knobs.tile) * mcast * swz


def candidates(problem, sm_count: int = 132) -> list:
    """Knob sets for ``problem``, best first by the model (at most MAX_PLANS)."""
    ab, c = ITEMSIZE[problem.ab_dtype], ITEMSIZE[problem.c_dtype]
    out = []
    for tile in TILES:
        stages = smem_stages(tile, ab, c)
        if stages < 2:
            continue
        for cluster in CLUSTERS:
            for swizzle in SWIZZLES:
                k = Knobs(tile=tile, cluster=cluster, stages=stages, swizzle=swizzle)
                out.append((score(problem, k, sm_count), tile[0] * tile[1], k))
    out.sort(key=lambda e: (-e[0], -e[1]))
    return [k for _, _, k in out[:MAX_PLANS]]


def knobs_from(mapping) -> Knobs:
    """Knobs from a PlanConfig's knob mapping (checked: a pinned or hand-made plan may carry anything)."""
    tile = tuple(mapping.get("tile", (128, 256)))
    cluster = tuple(mapping.get("cluster", (2, 1)))
    stages = int(mapping.get("stages", 0))
    swizzle = int(mapping.get("swizzle", 1))
    if tile not in TILES:
        raise ValueError(f"tile {tile} is not one of {TILES}")
    if cluster not in CLUSTERS:
        raise ValueError(f"cluster {cluster} is not one of {CLUSTERS}")
    if swizzle not in (1, 2, 4, 8):
        raise ValueError(f"swizzle {swizzle} is not 1, 2, 4 or 8")
    return Knobs(tile=tile, cluster=cluster, stages=stages, swizzle=swizzle)


def ranks_below_cudnn(problem) -> bool:
    """Whether ``problem`` is one whose CuTe plans rank after the cuDNN backend's (see SKINNY_M)."""
    return problem.M * problem.L <= SKINNY_M
