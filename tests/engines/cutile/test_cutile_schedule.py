"""engines/cutile/_schedule: a launch list carrying its streams (ScheduledLaunches), and side_lane, which puts one
launch of a serial list on the side stream between the launch it waits for and the one that joins it back. No
compiled module and no GPU: the module is loaded by path."""
from __future__ import annotations

import pytest

from _helpers import REPO_ROOT, load_by_path


def _schedule_module():
    return load_by_path("_cutile_under_test", REPO_ROOT / "engines" / "cutile", "_schedule")[0]


def concurrent_pairs(schedule: list) -> set:
    """The pairs (i, j), i < j, of launches that ``schedule`` ((lane, wait, record) per launch) leaves unordered:
    neither follows the other on one stream or through a chain of events."""
    before, last_on_lane, recorded_by = [], {}, {}
    for i, (lane, wait, record) in enumerate(schedule):
        preds = set()
        for j in (last_on_lane.get(lane), recorded_by.get(wait) if wait >= 0 else None):
            if j is not None:
                preds |= before[j] | {j}
        before.append(preds)
        last_on_lane[lane] = i
        if record >= 0:
            recorded_by[record] = i
    return {(i, j) for j in range(len(schedule)) for i in range(j) if i not in before[j]}


def assert_unordered_launches_share_only(launches, base: int, ports: dict, geometry, read_only: tuple,
                                         inputs: set) -> None:
    """Every pair of ``launches`` (a ScheduledLaunches over Slots: the workspace at ``base``, graph ports at the
    addresses ``ports`` maps to their names) that its schedule leaves unordered shares only bytes of the workspace
    regions ``read_only`` (of ``geometry``: ones no launch of the pair writes) and only the graph ports ``inputs``."""
    import math
    from cudnn_graph.engines.cutile._geometry import ITEM_BYTES
    spans_of = {name: (offset, offset + ITEM_BYTES[geometry.dtypes[name]] * math.prod(shape))
                for name, (offset, shape) in geometry.regions.items()}
    allowed = [spans_of[name] for name in read_only]
    names = [launch[0] for launch in launches]

    def touched(args):
        spans, used = [], set()
        for a in args:
            ptr = getattr(a, "data_ptr", None)
            if ptr is None:
                continue
            if ptr in ports:
                used.add(ports[ptr])
            else:
                spans.append((ptr - base, ptr - base + a.nbytes))
        return spans, used

    for i, j in concurrent_pairs(launches.schedule):
        (a_spans, a_ports), (b_spans, b_ports) = touched(launches[i][3]), touched(launches[j][3])
        assert a_ports & b_ports <= inputs, (names[i], i, names[j], j, a_ports & b_ports)
        for a0, a1 in a_spans:
            for b0, b1 in b_spans:
                lo, hi = max(a0, b0), min(a1, b1)
                if lo < hi:
                    assert any(r0 <= lo and hi <= r1 for r0, r1 in allowed), (names[i], i, names[j], j, lo, hi)



def _launches(*names):
    return [(name, (1, 1, 1), name.upper(), ()) for name in names]


def test_a_schedule_of_the_wrong_length_is_refused():
    schedule = _schedule_module()
    with pytest.raises(ValueError, match="2 schedule entries for 3 launches"):
        schedule.ScheduledLaunches([1, 2, 3], [(0, -1, -1)] * 2)


def test_the_side_launch_waits_for_its_producer_and_the_join_waits_for_it():
    schedule = _schedule_module()
    serial = _launches("gates", "prepare", "state_pass", "bwd_intra", "bwd_state_pass", "bwd_values", "bwd_grads")
    scheduled = schedule.side_lane(serial, "state_pass", after="prepare", join="bwd_values")
    assert list(scheduled) == serial                   # the serial order is kept: a hook or a plan blob runs it so
    assert scheduled.schedule == [(0, -1, -1), (0, -1, 0), (1, 0, 1), (0, -1, -1), (0, -1, -1), (0, 1, -1),
                                  (0, -1, -1)]
    recorded = {record for _, _, record in scheduled.schedule if record >= 0}
    assert recorded == set(range(schedule.SIDE_LANE_EVENTS))
    # every launch after the join runs on the caller's stream after the side stream's work
    assert scheduled.schedule[-1][0] == 0


def test_only_the_launches_between_the_side_launch_and_its_join_run_beside_it():
    schedule = _schedule_module()
    serial = _launches("gates", "prepare", "state_pass", "bwd_intra", "bwd_state_pass", "bwd_values", "bwd_grads")
    scheduled = schedule.side_lane(serial, "state_pass", after="prepare", join="bwd_values")
    assert concurrent_pairs(scheduled.schedule) == {(2, 3), (2, 4)}
    assert concurrent_pairs([(0, -1, -1)] * 4) == set()


def test_a_list_without_the_side_launch_is_returned_as_it_is():
    schedule = _schedule_module()
    serial = _launches("prepare", "bwd_intra", "bwd_state_pass", "bwd_values")     # from the checkpoints
    assert schedule.side_lane(serial, "state_pass", after="prepare", join="bwd_values") is serial


@pytest.mark.parametrize("names", [("state_pass", "prepare", "bwd_values"), ("prepare", "bwd_values", "state_pass")])
def test_a_side_launch_outside_its_producer_and_join_is_refused_naming_the_order(names):
    schedule = _schedule_module()
    with pytest.raises(ValueError, match="state_pass on the side stream must come after prepare and before "
                                         "bwd_values"):
        schedule.side_lane(_launches(*names), "state_pass", after="prepare", join="bwd_values")
