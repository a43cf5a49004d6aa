"""The persistent kernel's tile order: which output tiles each resident cluster computes, and in what order.

The grid is ``(cluster_m, cluster_n, persistent_clusters)``: every CTA of a cluster shares blockIdx.z, the
cluster's number among the resident ones. Cluster ``z`` takes the linear cluster tiles ``z, z + G, z + 2G,
...`` (G: the grid's z extent) until the problem's are used up. A linear cluster tile is decoded into a
cluster coordinate (cm, cn, l), rastered along M; with an L2 swizzle of ``s`` the N axis is cut into groups
of ``s`` columns and the raster walks down M inside a group, so consecutive tiles share B panels in L2. The
N extent is rounded up to a multiple of ``s``: the few tiles past the edge load zeros and store nothing (TMA
clips them), which costs less than a second divide per tile. A CTA's tile is the cluster coordinate times
the cluster shape plus the CTA's place in its cluster.

The counts are Python ints when the problem shape is compile-time, DSL integers when it is a runtime
argument: the decode is the same arithmetic either way. No DSL import at module level beyond cutlass, so the
host-side numbers are testable without a GPU.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute


def _ceil_div(a, b):
    return (a + b - 1) // b


class TileSchedule:
    """Static persistent schedule of a (tiles_m, tiles_n, L) problem over clusters of ``cluster_mn`` CTAs.

    Example (host side, plain ints)::

        s = TileSchedule((10, 3, 1), (2, 1), swizzle=1)
        s.total_clusters   # 15: 5 cluster rows x 3 columns
    """

    def __init__(self, tiles_mnl, cluster_mn, swizzle: int = 1):
        tiles_m, tiles_n, batches = tiles_mnl
        self.cluster_m, self.cluster_n = (int(c) for c in cluster_mn)
        self.swizzle = int(swizzle)
        self.clusters_m = _ceil_div(tiles_m, self.cluster_m)
        self.clusters_n = _ceil_div(_ceil_div(tiles_n, self.cluster_n), self.swizzle) * self.swizzle
        self.batches = batches
        self.per_batch = self.clusters_m * self.clusters_n
        self.total_clusters = self.per_batch * batches

    def grid(self, max_active_clusters):
        """The launch grid: as many clusters as are resident at once, never more than there are tiles."""
        total = self.total_clusters
        resident = min(total, max_active_clusters) if isinstance(total, int) else \
            cutlass.min(total, max_active_clusters)
        return (self.cluster_m, self.cluster_n, resident)

    def first(self):
        """This cluster's first linear tile and the stride between its tiles (device side)."""
        return cute.arch.block_idx()[2], cute.arch.grid_dim()[2]

    def tile(self, linear):
        """The (m, n, l) output tile of this CTA for linear cluster tile ``linear`` (device side)."""
        batch = linear // self.per_batch
        rest = linear % self.per_batch
        if self.swizzle == 1:          # a Python-level choice: the swizzle is a compile-time knob
            cm = rest % self.clusters_m
            cn = rest // self.clusters_m
        else:
            group_span = self.swizzle * self.clusters_m
            group = rest // group_span
            inner = rest % group_span
            cm = inner // self.swizzle
            cn = group * self.swizzle + inner % self.swizzle
        bx, by, _ = cute.arch.block_idx()
        tm = cute.arch.make_warp_uniform(cm * self.cluster_m + bx % self.cluster_m)
        tn = cute.arch.make_warp_uniform(cn * self.cluster_n + by % self.cluster_n)
        return tm, tn, cute.arch.make_warp_uniform(batch)
