"""The report's ``timeline.png``: per fault, its onset, its diagnosis and the actions taken.

Actions and alerts of one fault often come within a fraction of a second of each other (the
isolate, the restart and the alert of one finding), where their markers would cover one
another: markers that close share a column and stand one under the other, the actions
nearest the fault's lane and drawn above the alerts. A marker keeps its own time; only its
height moves, by a fixed number of points. Skipped actions changed nothing and are not
drawn (as in the timeline table).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count

from matplotlib.figure import Figure
from matplotlib.transforms import offset_copy

from c4.demo.timeline import CHANGING, Row, Timeline, seconds

NS_PER_S = 1_000_000_000
COLOURS = {"fault": "#d62728", "diagnosis": "#1f77b4", "action": "#2ca02c", "alert": "#999999"}
WIDTH_IN = 10.0
LANE_IN = 0.8  # the height of one fault's lane
MARK_S = 30  # the action and alert squares' area in points^2 (5.5 points a side)
STACK_PT = 7.0  # one marker's step under the one before it
BELOW = 0.18  # the first marker's place under its lane, in lanes
# Layers, bottom to top: the lane's line, the alerts, the fault and diagnosis, the actions.
Z_ALERT, Z_EVENT, Z_ACTION = 3, 4, 5
# The plot's share of the figure's width (at least): a bound for points per second.
PLOT_SHARE = 0.75


@dataclass(frozen=True, slots=True)
class Mark:
    """An action's or alert's square: when (event time, s since the start) and which."""

    at_s: float
    kind: str  # "action" (isolate, restart, reroute) or "alert"


def marks(row: Row, start_ns: int, event_ns: Callable[[int], int]) -> list[Mark]:
    """The row's squares in drawing order: actions first (the places nearest the lane),
    then alerts, each by time; skipped ones left out."""
    drawn = [
        Mark(
            (event_ns(a.ts_ns) - start_ns) / NS_PER_S, "action" if a.action in CHANGING else "alert"
        )
        for a in row.actions
        if a.status != "skipped"
    ]
    return sorted(drawn, key=lambda m: (m.kind != "action", m.at_s))


def timeline_figure(timeline: Timeline, event_ns: Callable[[int], int]) -> Figure:
    """The figure; ``event_ns`` maps an action's wall-clock time to the run's event time."""
    rows = timeline.rows
    start = timeline.start_ns
    height = 1.2 + LANE_IN * max(1, len(rows))
    figure = Figure(figsize=(WIDTH_IN, height), layout="constrained")
    axes = figure.add_subplot()
    squares = [marks(row, start, event_ns) for row in timeline.rows]
    times = [m.at_s for row_marks in squares for m in row_marks]
    for row in rows:
        times.append((row.truth.onset_ns - start) / NS_PER_S)
        if row.finding is not None:
            times.append((row.finding.ts_ns - start) / NS_PER_S)
    low, high = (min(times), max(times)) if times else (0.0, 1.0)
    pad = max(0.5, 0.04 * (high - low))
    axes.set_xlim(low - pad, high + pad)
    # Squares nearer than this in time would overlap (or nearly) at the plot's width.
    near = STACK_PT * (high - low + 2 * pad) / (WIDTH_IN * 72 * PLOT_SHARE)
    for lane, (row, row_marks) in enumerate(zip(rows, squares, strict=True)):
        y = len(rows) - lane
        onset = (row.truth.onset_ns - start) / NS_PER_S
        axes.scatter([onset], [y], marker="v", s=90, color=COLOURS["fault"], zorder=Z_EVENT)
        if row.finding is not None:
            found = (row.finding.ts_ns - start) / NS_PER_S
            axes.plot([onset, found], [y, y], color=COLOURS["diagnosis"], linewidth=2)
            axes.scatter([found], [y], marker="o", s=70, color=COLOURS["diagnosis"], zorder=Z_EVENT)
            axes.annotate(
                f"{row.finding.class_} ({seconds(row.latency_ns)} s)",
                (found, y),
                xytext=(6, 6),
                textcoords="offset points",
                fontsize=8,
            )
        slots = stack([m.at_s for m in row_marks], near)
        for mark, slot in zip(row_marks, slots, strict=True):
            shifted = offset_copy(axes.transData, figure, y=-STACK_PT * slot, units="points")
            axes.scatter(
                [mark.at_s],
                [y - BELOW],
                marker="s",
                s=MARK_S,
                color=COLOURS[mark.kind],
                zorder=Z_ACTION if mark.kind == "action" else Z_ALERT,
                transform=shifted,
            )
    axes.set_yticks(
        [len(rows) - i for i in range(len(rows))],
        [f"{r.truth.type}\n{r.truth.suspect_id}" for r in rows],
        fontsize=8,
    )
    axes.set_xlabel("event time (s since the run's start)")
    axes.set_ylim(0.3, len(rows) + 0.7)
    axes.grid(axis="x", alpha=0.3)
    handles = [
        axes.scatter([], [], marker="v", color=COLOURS["fault"], label="fault injected"),
        axes.scatter([], [], marker="o", color=COLOURS["diagnosis"], label="diagnosed"),
        axes.scatter([], [], marker="s", color=COLOURS["action"], label="isolate/restart/reroute"),
        axes.scatter([], [], marker="s", color=COLOURS["alert"], label="alert"),
    ]
    figure.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    return figure


def stack(times: Sequence[float], near: float) -> list[int]:
    """Each marker's place in its column, in drawing order: the first free one among the
    markers before it that are less than ``near`` away in time (0 is the top)."""
    slots: list[int] = []
    for index, at in enumerate(times):
        taken = {slots[j] for j in range(index) if abs(times[j] - at) < near}
        slots.append(next(slot for slot in count() if slot not in taken))
    return slots
