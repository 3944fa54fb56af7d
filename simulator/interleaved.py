"""Megatron's interleaved 1F1B schedule, as steps every stage of a pipeline runs in lockstep.

With ``v`` model chunks per stage the pipeline has ``pp x v`` virtual stages: virtual stage
``c x pp + r`` is chunk ``c`` on stage ``r``, so a microbatch's forward goes round the stages
``v`` times (the last stage hands each chunk's output to the first) and its backward comes
back the same way. Each stage works through Megatron's order (``warmup`` forwards, then one
forward and one backward at a time, then the remaining backwards; the chunk and microbatch of
the k-th forward or backward by Megatron's formulas), doing the next one in a step once what
it needs was sent in an earlier step, else idling (a bubble). After each step neighbours
exchange what they produced: one coalesced send/recv per pair that carries anything, as
Megatron's ``send_forward_backward_recv_forward_backward`` batches them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True, slots=True)
class Unit:
    """One forward or backward pass of one model chunk for one microbatch."""

    backward: bool
    chunk: int
    microbatch: int


@dataclass(frozen=True, slots=True)
class Step:
    """What one stage does in one step: a pass (None: a bubble), then its exchanges."""

    unit: Unit | None
    sends_next: bool  # its output goes to the next stage (the first, from the last)
    sends_prev: bool
    with_next: bool  # an exchange with the next stage happens after this step
    with_prev: bool


def _order(pp: int, microbatches: int, v: int, stage: int) -> list[Unit]:
    total = microbatches * v

    def forward(k: int) -> Unit:
        return Unit(False, (k // pp) % v, (k // (pp * v)) * pp + k % pp)

    def backward(k: int) -> Unit:
        return Unit(True, v - 1 - (k // pp) % v, (k // (pp * v)) * pp + k % pp)

    warmup = min((pp - stage - 1) * 2 + (v - 1) * pp, total)
    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


@cache
def schedule(pp: int, microbatches: int, v: int) -> tuple[tuple[Step, ...], ...]:
    """Every stage's steps of one iteration (all stages run the same number of steps)."""
    orders = [_order(pp, microbatches, v, stage) for stage in range(pp)]
    last = pp * v - 1
    done: dict[tuple[bool, int, int], int] = {}  # (backward, virtual stage, mb) -> step
    position = [0] * pp
    units: list[list[Unit | None]] = [[] for _ in range(pp)]
    step = 0
    limit = 8 * (2 * microbatches * v + 2 * pp * v)
    while any(position[r] < len(orders[r]) for r in range(pp)):
        if step > limit:
            message = f"interleaved schedule pp={pp} m={microbatches} v={v} does not finish"
            raise RuntimeError(message)
        ran: list[tuple[bool, int, int]] = []
        for stage in range(pp):
            unit = orders[stage][position[stage]] if position[stage] < len(orders[stage]) else None
            if unit is not None:
                virtual = unit.chunk * pp + stage
                if unit.backward:
                    needs = (True, virtual + 1, unit.microbatch) if virtual < last else None
                    needs = needs or (False, virtual, unit.microbatch)
                else:
                    needs = (False, virtual - 1, unit.microbatch) if virtual > 0 else None
                if needs is not None and done.get(needs, step) >= step:
                    unit = None  # what it needs was not sent before this step: a bubble
            if unit is not None:
                position[stage] += 1
                ran.append((unit.backward, unit.chunk * pp + stage, unit.microbatch))
            units[stage].append(unit)
        for key in ran:
            done[key] = step
        step += 1
    steps: list[list[Step]] = [[] for _ in range(pp)]
    for t in range(step):
        sends = [_sends(units[r][t], r, pp, last) for r in range(pp)]
        for r in range(pp):
            nxt, prev = (r + 1) % pp, (r - 1) % pp
            with_next = sends[r][0] or sends[nxt][1]
            with_prev = sends[r][1] or sends[prev][0]
            if r == pp - 1 and pp > 2 and v == 1:
                with_next = False  # no wrap-around pair without virtual stages
            steps[r].append(Step(units[r][t], sends[r][0], sends[r][1], with_next, with_prev))
    return tuple(tuple(s) for s in steps)


def _sends(unit: Unit | None, stage: int, pp: int, last: int) -> tuple[bool, bool]:
    """(to the next stage, to the previous one) after this stage ran ``unit``."""
    if unit is None:
        return False, False
    virtual = unit.chunk * pp + stage
    if unit.backward:
        return False, virtual > 0
    return virtual < last, False
