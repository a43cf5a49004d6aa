"""One long sequence's forward, and its backward, in segments, overlapping: the launches and the order between them
(the backward's: ``segmented_backward_launches``).

Where the graph holds one sequence, the forward's state pass is one chain of T / 64 dependent chunk steps on
H x V / block_v CTAs that leave most of each SM idle for their whole length, while the prepare before it and
the output after it are parallel over chunks and fill the GPU. A plan with the ``segments`` knob S cuts the
sequence into S segments of ``_Geometry.segment_tokens`` tokens and runs each as a sequence of its own: its
prepare, its state pass starting from the previous segment's final state (an f32 region of the workspace),
its output. Segment s's state pass runs on a side stream (``cudnn_graph._lanes``) beside segment s + 1's
prepare and segment s - 1's output on the caller's stream:

    caller's stream:  bounds  prep 0  prep 1  (wait S0) out 0  prep 2  (wait S1) out 1  ...  (wait S_last) out last
    side stream:              (wait P0) state 0   (wait P1) state 1   (wait P2) state 2  ...

The launch list is in an order that is also correct on one stream (the schedule only adds the side lane and the
events): a hooked launch (bench's per-kernel timing) and the C runtime's plan blob run it serially. The segments'
cu_seqlens come from ``segment_bounds`` over the call's own (the offsets are data; a shorter sequence leaves the
last segments empty, whose state passes carry their start state through unchanged).
"""
from __future__ import annotations

import dataclasses

from ._schedule import ScheduledLaunches
from ._variants import CHUNK

MIN_SEGMENT_CHUNKS = 16          # shorter segments lose more to their own launches than the overlap gains


def event_count(segments: int) -> int:
    """The events a segmented plan's schedule uses: P_s after each prepare, S_s after each state pass."""
    return 2 * segments


def segments_reason(node, segments: int) -> str | None:
    """Why ``segments`` cannot apply to this forward node (None: it can)."""
    n_seq = node.inputs["cu_seqlens"].dim[0] - 1
    T = node.inputs["q"].dim[0]
    if n_seq != 1:
        return f"segments={segments} cuts one sequence; cu_seqlens holds {n_seq}"
    if segments < 2:
        return f"segments={segments}: expected 2 or more"
    if T < segments * MIN_SEGMENT_CHUNKS * CHUNK:
        return (f"segments={segments} needs at least {MIN_SEGMENT_CHUNKS * CHUNK} tokens a segment "
                f"({segments * MIN_SEGMENT_CHUNKS * CHUNK} in all); the sequence has {T}")
    return None


def segmented_launches(plan, slot, scratch) -> ScheduledLaunches:
    """The launches of ``plan`` (a segmented CutileForwardPlan) with its schedule: the whole call's launches
    before its prepare (the gate options), ``segment_bounds``, then per segment its prepare, state pass and
    output in the order the module docstring draws."""
    v, g = plan.variant, plan._geometry
    S, per = v.segments, g.segment_chunks
    whole = plan._forward_launches(slot, scratch)
    head = whole[:[name for name, *_ in whole].index("prepare")]
    launches = [*head, ("segment_bounds", (S, 1, 1), plan.segment_kernels["bounds"],
                        (slot("cu_seqlens"), scratch["segment_bounds"], g.segment_tokens))]
    schedule = [(0, -1, -1)] * len(launches)
    parts = [_segment_parts(plan, slot, scratch, s, per) for s in range(S)]
    for s in range(S):
        prepare, state_pass, output = parts[s]
        launches += [prepare, state_pass]
        schedule += [(0, -1, s), (1, s, S + s)]
        if s:
            launches.append(parts[s - 1][2])
            schedule.append((0, S + s - 1, -1))
    launches.append(parts[S - 1][2])
    schedule.append((0, 2 * S - 1, -1))
    return ScheduledLaunches(launches, schedule)


def _segment_parts(plan, slot, scratch, s: int, per: int) -> tuple:
    """Segment s's (prepare, state pass, output) launches: the plan's own over its cu_seqlens row and chunk
    views, its state pass from the previous segment's state (the call's initial state, or none, for the
    first) to its own (the call's final state, or none, for the last)."""
    v, last = plan.variant, plan.variant.segments - 1
    ports = {"cu_seqlens": scratch[f"cu@{s}"]}
    if s:
        ports["initial_state"] = scratch[f"state@{s - 1}"]
    if s < last:
        ports["final_state"] = scratch[f"state@{s}"]
    variant = dataclasses.replace(v, has_h0=v.has_h0 or s > 0, store_ht=v.store_ht or s < last)
    launches = {name: (grid, kernel, args) for name, grid, kernel, args in
                plan._forward_launches(*_segment_operands(slot, scratch, ports, s), variant)}
    out = []
    for name in ("prepare", "state_pass", "output"):
        grid, kernel, args = launches[name]
        if name != "state_pass":
            grid, kernel = (per, *grid[1:]), _bounded(plan, kernel, per)     # the segment's chunks, not the call's
        out.append((name, grid, kernel, args))
    return tuple(out)


def _segment_operands(slot, scratch: dict, ports: dict, s: int) -> tuple:
    """(slot, scratch) of segment s: the graph's ports but those ``ports`` stands in for, the workspace regions
    with each per-chunk one's view of the segment's chunks in its place."""
    def segment_slot(port):
        found = ports.get(port)
        return slot(port) if found is None else found

    views = {name: scratch[f"{name}@{s}"] for name in scratch if "@" not in name and f"{name}@{s}" in scratch}
    return segment_slot, {**scratch, **views}


# ---- the backward: the reverse pass's segments on the side stream, each segment's gradients behind it ----------

def segmented_backward_launches(plan, slot, sc) -> ScheduledLaunches:
    """The launches of ``plan`` (a segmented CutileBackwardPlan) with its schedule. The forward recompute's prepare
    and chunk_bwd_intra run whole, then ``segment_bounds`` (event 0); the recompute's state pass runs whole on the
    caller's stream beside the reverse pass, which runs segment by segment, last first, on the side stream (event
    1 + s after segment s), each segment's chunk_bwd_values and chunk_bwd_grads on the caller's stream behind its
    event; then the whole call's launches after chunk_bwd_grads (group_sum, gate_activation_bwd)::

        caller's stream:  prepare  intra  bounds (E0)  state pass  (wait R_last) values, grads last  ...  (wait R_0) ...
        side stream:                      (wait E0) reverse last (R_last)  reverse last - 1  ...  reverse 0 (R_0)

    The chunks of segment s are only its own launches' (views), the dS that chains segment s to s + 1 an f32
    region (``state@s``), the token-indexed buffers are shared, each segment writing its own tokens."""
    v, g = plan.variant, plan._geometry
    S, per = v.segments, g.segment_chunks
    whole = plan._serial_launch_list(slot, sc)
    names = [name for name, *_ in whole]
    if "state_pass" not in names:
        raise ValueError(f"{plan.plan.label}: a segmented backward recomputes its states; its launches are {names}")
    head = [launch for launch in whole[:names.index("bwd_state_pass")] if launch[0] != "state_pass"]
    tail = whole[names.index("bwd_grads") + 1:]
    launches = [*head, ("segment_bounds", (S, 1, 1), plan.segment_kernels["bounds"],
                        (slot("cu_seqlens"), sc["segment_bounds"], g.segment_tokens)), whole[names.index("state_pass")]]
    schedule = [(0, -1, -1)] * len(head) + [(0, -1, 0), (0, -1, -1)]
    for s in reversed(range(S)):
        launches += _backward_parts(plan, slot, sc, s, per)
        schedule += [(1, 0 if s == S - 1 else -1, 1 + s), (0, 1 + s, -1), (0, -1, -1)]
    launches += tail
    schedule += [(0, -1, -1)] * len(tail)
    return ScheduledLaunches(launches, schedule)


def _backward_parts(plan, slot, sc, s: int, per: int) -> list:
    """Segment s's (reverse pass, chunk_bwd_values, chunk_bwd_grads): the plan's own over its cu_seqlens row and
    chunk views, the reverse pass from the dS at its end (the call's d_final_state, or none, for the last) to the
    one at its start (the call's d_initial_state, or none, for the first)."""
    v, last = plan.variant, plan.variant.segments - 1
    ports = {"cu_seqlens": sc[f"cu@{s}"]}
    if s < last:
        ports["d_final_state"] = sc[f"state@{s}"]
    if s:
        ports["d_initial_state"] = sc[f"state@{s - 1}"]
        if not v.has_h0:
            # the segment's variant has h0 for its dh0; its recompute launches, built and not launched, read this
            ports["initial_state"] = sc["state_dummy"]
    variant = dataclasses.replace(v, has_dht=v.has_dht or s < last, has_h0=v.has_h0 or s > 0)
    launches = {name: (grid, kernel, args) for name, grid, kernel, args in
                plan._serial_launch_list(*_segment_operands(slot, sc, ports, s), variant)}
    out = []
    for name in ("bwd_state_pass", "bwd_values", "bwd_grads"):
        grid, kernel, args = launches[name]
        if name == "bwd_state_pass":
            kernel = plan.reverse_pass_for(variant)          # its state flags are the segment's
        else:
            grid = (per, *grid[1:])                          # the segment's chunks, not the call's
        out.append((name, grid, _bounded(plan, kernel, per), args))
    return out


def _bounded(plan, kernel, per: int):
    """``kernel`` over one segment's chunks where it is a CuTe launch (cuTile kernels take their bounds from the
    arrays), made once a plan and kernel."""
    if not hasattr(kernel, "over_chunks"):
        return kernel
    found = plan.segment_bounded.get(id(kernel))
    if found is None:
        found = plan.segment_bounded[id(kernel)] = kernel.over_chunks(per)
    return found
