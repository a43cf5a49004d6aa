"""Which stream each of a plan's launches runs on: ``ScheduledLaunches`` (a launch list carrying, per launch, its
lane and the events around it) and ``side_lane`` (one launch of a serial list moved to the side stream).

Lane 0 is the caller's stream, lane 1 the plan's side stream (``cudnn_graph._lanes``: non-blocking, at the
highest priority, so that a chain of dependent steps gets its SMs first). A scheduled list's order is also a
correct serial order: a launch hook (the bench's per-kernel timing) and the C runtime's plan blob run it on one
stream, and the schedule only adds the side lane and its events. Users: a segmented forward (``_segments``) and
a backward that recomputes its chunk-start states beside its reverse pass (``_backward``, knob ``overlap``).
"""
from __future__ import annotations

SIDE_LANE_EVENTS = 2        # side_lane's: one after the launch the side lane waits for, one after the side launch


class ScheduledLaunches(list):
    """A plan's launch list with, per launch, ``(lane, wait, record)``: lane 0 the caller's stream and 1 the side
    stream, the event its stream waits on before it and the one recorded after it (-1: none)."""

    def __init__(self, launches, schedule):
        super().__init__(launches)
        if len(schedule) != len(launches):
            raise ValueError(f"{len(schedule)} schedule entries for {len(launches)} launches")
        self.schedule = list(schedule)


def side_lane(launches: list, name: str, after: str, join: str) -> list:
    """``launches`` (a serial list of (name, grid, kernel, args)) with launch ``name`` on the side stream, beside
    the caller's-stream launches that follow it up to ``join``: it waits for launch ``after`` (event 0) and
    ``join`` waits for it (event 1), which also joins the side stream back before the call ends. The caller
    vouches that the launches in between neither write what ``name`` reads nor touch what it writes. The list
    as it is where it holds no ``name`` launch (a backward from the checkpoints runs no state pass)."""
    names = [launch[0] for launch in launches]
    if name not in names:
        return launches
    first, side, last = names.index(after), names.index(name), names.index(join)
    if not first < side < last:
        raise ValueError(f"{name} on the side stream must come after {after} and before {join}; the launches "
                         f"are {names}")
    schedule = [(0, -1, -1)] * len(launches)
    schedule[first] = (0, -1, 0)
    schedule[side] = (1, 0, 1)
    schedule[last] = (0, 1, -1)
    return ScheduledLaunches(launches, schedule)
