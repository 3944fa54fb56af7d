"""The demo's report: one HTML page and its PNG plots, readable after the processes are gone.

- ``index.html``: the verdict, the timeline table, the plots, each finding's evidence, the
  webhook calls received;
- ``timeline.png``: per fault, its onset, its diagnosis and the actions, in event time;
- ``throughput.png``: the per-connection throughput of every comm_slow finding (its heatmap);
- ``links.png``: fabric link utilisation under the first and the latest route plan;
- ``timeline.json``: the table as data.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import orjson  # noqa: E402

from c4.dashboard.model import (  # noqa: E402
    FeedView,  # noqa: E402
    link_loads,
    route_vias,
)
from c4.demo.receivers import Call  # noqa: E402
from c4.demo.timeline import (  # noqa: E402
    Timeline,
    format_rows,
    skipped_line,
    table,
    verdict,
)
from c4.demo.timeline_plot import timeline_figure  # noqa: E402
from schemas.files import Topology  # noqa: E402
from topology.model import Fabric  # noqa: E402

NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class WallClock:
    """Maps wall-clock ns (action records) to the simulator's event time."""

    wall_start_ns: int
    event_start_ns: int
    speed: float

    def event_ns(self, wall_ns: int) -> int:
        """The event time the simulator was at when the wall clock showed ``wall_ns``."""
        return self.event_start_ns + int((wall_ns - self.wall_start_ns) * self.speed)


def write_report(
    folder: Path,
    timeline: Timeline,
    view: FeedView,
    topology: Topology,
    clock: WallClock,
    calls: Sequence[Call],
    wall_s: float,
) -> Path:
    """Write the report into ``folder``; returns the HTML file."""
    folder.mkdir(parents=True, exist_ok=True)
    images = [
        _timeline_plot(folder / "timeline.png", timeline, clock),
        _throughput_plot(folder / "throughput.png", timeline),
        _links_plot(folder / "links.png", topology, view),
    ]
    (folder / "timeline.json").write_bytes(
        orjson.dumps(_timeline_data(timeline, clock), option=orjson.OPT_INDENT_2)
    )
    page = folder / "index.html"
    page.write_text(_html(timeline, [i for i in images if i], calls, wall_s), encoding="utf-8")
    return page


def _timeline_data(timeline: Timeline, clock: WallClock) -> dict[str, Any]:
    start = timeline.start_ns
    rows = []
    for row in timeline.rows:
        finding = row.finding
        rows.append(
            {
                "fault": row.truth.fault,
                "type": row.truth.type,
                "culprit": row.truth.suspect_id,
                "at_s": (row.truth.onset_ns - start) / NS_PER_S,
                "diagnosis": finding.class_ if finding else None,
                "suspect": finding.suspects[0].id if finding and finding.suspects else None,
                "diagnosis_id": finding.id if finding else None,
                "latency_s": None if row.latency_ns is None else row.latency_ns / NS_PER_S,
                "actions": [
                    {
                        "action": a.action,
                        "target": a.target,
                        "status": a.status,
                        "text": a.text,
                        "at_s": (clock.event_ns(a.ts_ns) - start) / NS_PER_S,
                    }
                    for a in row.actions
                ],
                "ok": row.ok,
            }
        )
    false = [
        {"class": d.class_, "job": d.job, "suspect": d.suspects[0].id if d.suspects else None}
        for d in timeline.false_findings
    ]
    return {"passed": timeline.passed, "rows": rows, "false_findings": false}


def _timeline_plot(path: Path, timeline: Timeline, clock: WallClock) -> str:
    timeline_figure(timeline, clock.event_ns).savefig(path, dpi=110)
    return path.name


def _throughput_plot(path: Path, timeline: Timeline) -> str | None:
    panels = []
    for row in timeline.rows:
        for finding in row.findings:
            rows = finding.evidence.get("throughput")
            if finding.class_ == "comm_slow" and isinstance(rows, list) and rows:
                panels.append((finding, rows))
                break
    if not panels:
        return None
    figure, axes_list = plt.subplots(len(panels), 1, figsize=(10, 1.8 * len(panels)), squeeze=False)
    for (finding, rows), axes in zip(panels, axes_list[:, 0], strict=True):
        cells = [r for r in rows if isinstance(r, list) and len(r) == 3]
        ranks = [int(str(r[0])) for r in cells]
        gbps = [float(str(r[2])) for r in cells]
        extent = (-0.5, len(gbps) - 0.5, 0, 1)
        image = axes.imshow([gbps], aspect="auto", cmap="RdYlGn", extent=extent)
        axes.set_yticks([])
        step = max(1, len(ranks) // 16)
        axes.set_xticks(range(0, len(ranks), step), [str(r) for r in ranks[::step]], fontsize=7)
        suspect = finding.suspects[0].id if finding.suspects else "-"
        axes.set_title(
            f"{finding.job}: connection throughput (Gbit/s) per rank -> next; suspect {suspect}",
            fontsize=9,
        )
        figure.colorbar(image, ax=axes, fraction=0.03)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path.name


def _links_plot(path: Path, topology: Topology, view: FeedView) -> str | None:
    if not view.routes:
        return None
    fabric = Fabric.from_topology(topology)
    first_plan = min(view.routes, key=lambda r: r.ts_ns).plan
    before_vias, _ = route_vias(r for r in view.routes if r.plan == first_plan)
    after_vias, latest_plan = route_vias(view.routes)
    jobs = [j for j in view.jobs if j.state == "running"]
    before, _, _ = link_loads(fabric, jobs, before_vias)
    after, _, _ = link_loads(fabric, jobs, after_vias)
    speeds = {link.id: link.gbps for link in topology.links}
    links = sorted(set(before) | set(after), key=lambda link: -before.get(link, 0.0))[:24]
    if not links:
        return None
    figure, axes = plt.subplots(figsize=(10, 3.6))
    xs = range(len(links))
    axes.bar(
        [x - 0.2 for x in xs],
        [before.get(k, 0.0) / speeds[k] for k in links],
        0.4,
        label=f"plan {first_plan}",
        color="#ff7f0e",
    )
    axes.bar(
        [x + 0.2 for x in xs],
        [after.get(k, 0.0) / speeds[k] for k in links],
        0.4,
        label=f"plan {latest_plan}",
        color="#1f77b4",
    )
    axes.set_xticks(list(xs), links, rotation=60, ha="right", fontsize=7)
    axes.set_ylabel("utilisation (line-rate flows / link speed)")
    axes.set_title("fabric links: the first route plan and the plan in force at the end", size=9)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path.name


def _html(timeline: Timeline, images: list[str], calls: Sequence[Call], wall_s: float) -> str:
    esc = html.escape
    cells_of = table(timeline)
    head = "".join(f"<th>{esc(cell)}</th>" for cell in cells_of[0])
    body = []
    for cells in cells_of[1:]:
        tds = "".join(f"<td>{esc(cell)}</td>" for cell in cells)
        body.append(f"<tr>{tds}</tr>")
    details = []
    for row in timeline.rows:
        finding = row.finding
        evidence = {} if finding is None else dict(finding.evidence)
        evidence.pop("throughput", None)
        details.append(
            f"<h3 id='{esc(row.truth.fault)}'>{esc(row.truth.fault)}: {esc(row.truth.type)} "
            f"on {esc(row.truth.suspect_id)}</h3>"
            + (
                f"<p>diagnosis <code>{esc(finding.id)}</code> {esc(finding.class_)}, suspects "
                + esc(", ".join(f"{s.id} ({s.score})" for s in finding.suspects[:4]))
                + f"; evidence <code>{esc(orjson.dumps(evidence).decode())}</code></p>"
                if finding is not None
                else "<p><b>missed</b></p>"
            )
            + "<ul>"
            + "".join(f"<li>{esc(a.text)} — {esc(a.status)}</li>" for a in row.actions)
            + "</ul>"
        )
    launches = sum(1 for c in calls if c.path == "/launch")
    alerts = sum(1 for c in calls if c.path == "/alert")
    pictures = "".join(f"<p><img src='{esc(name)}' alt='{esc(name)}'></p>" for name in images)
    left_out = skipped_line(timeline)
    skipped = f"<p>{esc(left_out)}</p>" if left_out else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>c4 demo report</title>
<style>body{{font:14px system-ui,sans-serif;margin:24px;max-width:1100px}}
table{{border-collapse:collapse}}td,th{{border-bottom:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top}}img{{max-width:100%}}.pass{{color:#2ca02c}}
.fail{{color:#d62728}}</style></head><body>
<h1>c4 demo report</h1>
<p class="{"pass" if timeline.passed else "fail"}"><b>{esc(verdict(timeline))}</b></p>
<p>Run time {wall_s:.0f} s. Latency is in event time (fault onset to the diagnosis).
The launcher webhook took {launches} restarts, the alert receiver {alerts} alerts.</p>
<h2>Timeline</h2>
<table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>
<pre>{esc(format_rows(cells_of))}</pre>
{skipped}
<h2>Plots</h2>{pictures}
<h2>Faults in detail</h2>{"".join(details)}
<p>Files: timeline.json, diagnoses.jsonl, actions.jsonl, routes.jsonl, truth.jsonl,
scenario.json, topology.json, actions.yaml, logs/.</p>
</body></html>
"""
