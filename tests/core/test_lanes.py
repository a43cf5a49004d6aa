"""cudnn_graph._lanes.Lanes: a side stream and ordering events for a plan whose launches overlap.

Without a GPU: made only by its factory, its event count checked before any driver call, and a machine with
no driver refused with a typed error naming the call. On a GPU: work on the side stream ordered after the
caller's by an event and joined back (test_cutile_segments runs the plans that use it).
"""
from __future__ import annotations

import pytest

cg = pytest.importorskip("cudnn_graph")
_lanes = pytest.importorskip("cudnn_graph._lanes")
from cudnn_graph.errors import CudaDriverError, InvalidArgumentError  # noqa: E402


def test_lanes_are_made_by_their_factory_only():
    with pytest.raises(TypeError, match="Lanes.create"):
        _lanes.Lanes()


@pytest.mark.parametrize("count", [0, -1, 65])
def test_an_event_count_out_of_range_is_refused_naming_the_range(count):
    with pytest.raises(InvalidArgumentError, match="1 to 64"):
        _lanes.Lanes.create(0, count)


def test_without_a_driver_the_factory_raises_a_driver_error():
    from cudnn_graph._driver import driver_available
    if driver_available():
        pytest.skip("a CUDA driver is loaded here")
    with pytest.raises(CudaDriverError, match="no CUDA driver"):
        _lanes.Lanes.create(0, 2)


@pytest.mark.gpu
def test_work_on_the_side_stream_waits_for_the_callers_event_and_joins_back():
    cp = pytest.importorskip("cupy")
    if cp.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA GPU visible")
    lanes = _lanes.Lanes.create(0, 2)
    assert lanes.side_stream != 0 and lanes.event_count == 2
    caller = cp.cuda.Stream(non_blocking=True)
    side = cp.cuda.ExternalStream(lanes.side_stream)
    x = cp.zeros(1 << 20, cp.float32)
    order = []

    def launch(i, stream):
        order.append((i, stream))
        with (caller if stream == caller.ptr else side):
            if i == 0:
                x.fill(1.0)             # the caller's stream
            elif i == 1:
                x[...] = x * 2          # the side stream: after the fill (event 0)
            else:
                x[...] = x + 1          # the caller's stream: after the side stream's work (event 1)

    lanes.issue(caller.ptr, [(0, -1, 0), (1, 0, 1), (0, 1, -1)], launch)
    caller.synchronize()
    assert [s for _, s in order] == [caller.ptr, lanes.side_stream, caller.ptr]
    assert float(x[0]) == 3.0 and float(x[-1]) == 3.0
