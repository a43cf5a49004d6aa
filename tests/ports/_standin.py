"""The stand-in libcudnn / libcuda of tests/engines/cudnn_backend, reused by the port tests."""
from __future__ import annotations

import os
import sys

_BACKEND_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engines",
                              "cudnn_backend")
if _BACKEND_TESTS not in sys.path:
    sys.path.insert(0, _BACKEND_TESTS)

from test_cuda_graph_replay import fake_cuda_builder, fake_cuda_source, run_child  # noqa: E402

__all__ = ["fake_cuda_builder", "fake_cuda_source", "run_child", "CHILD_PROLOGUE"]

# A child process on the stand-in: cuDNN's plans ranked first, and a small relu graph maker.
CHILD_PROLOGUE = """
import json
import cudnn_graph as cudnn
from cudnn_graph.router import PreferFamily, set_default_router
set_default_router(PreferFamily("cudnn"))
F = cudnn.data_type

def make(n, kernel_cache=None):
    g = cudnn.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device="cuda", kernel_cache=kernel_cache)
    x = g.tensor(name="x", dim=[4, n], stride=[n, 1])
    g.relu(x).set_output(True)
    g.build([cudnn.heur_mode.A])
    return g
"""
