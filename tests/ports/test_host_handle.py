"""create_handle / destroy_handle / set_stream / backend_version where no libcudnn loads (this CPU
machine): a host handle that host graphs accept, and a "no cuDNN" version that reads as too old."""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import _loader

pytestmark = pytest.mark.skipif(_loader.is_available(), reason="a libcudnn loads here: the GPU behaviour applies")

F = cudnn.data_type


def test_backend_version_reads_as_no_cudnn():
    assert cudnn.backend_version() == 0
    assert cudnn.backend_version_string() == "0.0.0"
    assert not cudnn.backend_version() >= 90500          # every version gate takes the old path


def test_create_handle_gives_a_host_handle_that_host_graphs_take():
    handle = cudnn.create_handle()
    assert isinstance(handle, cudnn.HostHandle)
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, handle=handle)
    assert g.device == ("cpu", 0)
    x = g.tensor(name="x", dim=[2, 3], stride=[3, 1])
    y = g.relu(x).set_output(True)
    g.build([cudnn.heur_mode.A])
    X = np.array([[-1, 0, 1], [2, -2, 3]], np.float32)
    Y = np.empty_like(X)
    g.execute({x: X, y: Y}, handle=handle)
    np.testing.assert_array_equal(Y, np.maximum(X, 0))
    cudnn.destroy_handle(handle)
    cudnn.destroy_handle(handle)        # a second call does nothing
    assert handle.destroyed


class _Stream:
    def __cuda_stream__(self):
        return (0, 0x1234)


def test_set_stream_on_a_host_handle_records_the_stream():
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=0xABC)
    assert cudnn.get_stream(handle) == 0xABC
    cudnn.set_stream(handle=handle, stream=_Stream())
    assert cudnn.get_stream(handle) == 0x1234
    cudnn.set_stream(handle=handle, stream=None)
    assert cudnn.get_stream(handle) == 0
