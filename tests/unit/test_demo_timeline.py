"""The demo's verdict: faults matched to findings, findings to actions; the report's files."""

from __future__ import annotations

from html.parser import HTMLParser
from io import BytesIO
from pathlib import Path
from typing import Any

import orjson
from matplotlib.collections import PathCollection
from matplotlib.colors import to_hex

from c4.action_notes import note
from c4.dashboard.model import FeedView
from c4.demo.receivers import Call
from c4.demo.report import WallClock, write_report
from c4.demo.run import DemoOptions, demo_topology, load_demo_scenario, simulator_plan
from c4.demo.timeline import build_timeline, format_rows, skipped_line, table, verdict
from c4.demo.timeline_plot import COLOURS, MARK_S, stack, timeline_figure
from schemas.messages import Action, Diagnosis, Suspect
from simulator import ground_truth
from simulator.cluster import build_cluster
from simulator.run import route_messages
from simulator.truth import Truth

T0 = 1_800_000_000_000_000_000
S = 1_000_000_000


def truth(kind: str, suspect: tuple[str, str], at_s: int, job: str | None = "job-a") -> Truth:
    classes = {"slow_gpu": ("noncomm_slow",), "fabric_link_down": ("link_down", "link_degraded")}
    return Truth(f"{kind}#0", kind, job, T0 + at_s * S, classes[kind], *suspect)


def finding(ident: str, cls: str, suspect: tuple[str, str], at_s: float, **extra: Any) -> Diagnosis:
    return Diagnosis.model_validate(
        {
            "v": 1,
            "kind": "diagnosis",
            "id": ident,
            "job": extra.get("job", "job-a"),
            "state": extra.get("state", "firing"),
            "class": cls,
            "onset_ns": T0,
            "ts_ns": T0 + int(at_s * S),
            "suspects": [Suspect(type=suspect[0], id=suspect[1], score=0.9)],
            "evidence": extra.get("evidence", {}),
        }
    )


def action(diagnosis: str, name: str, target: str, status: str = "done", **detail: Any) -> Action:
    if status != "done":
        detail.setdefault("reason", "already_isolated")
    return Action(
        v=1,
        kind="action",
        id=f"a-{diagnosis}-{name}-{target}",
        diagnosis=diagnosis,
        ts_ns=T0 + 30 * S,
        action=name,  # type: ignore[arg-type]
        target=target,
        status=status,  # type: ignore[arg-type]
        detail=detail,
    )


SLOW = truth("slow_gpu", ("gpu", "node-005/gpu5"), 10)
LINK = truth("fabric_link_down", ("link", "leaf-1a~spine-a-1"), 36, job=None)


def test_every_fault_diagnosed_and_acted_on_passes() -> None:
    diagnoses = [
        finding("d-1", "noncomm_slow", ("gpu", "node-005/gpu5"), 13.9),
        finding("d-1", "noncomm_slow", ("gpu", "node-005/gpu5"), 13.9),  # redelivered
        finding("d-2", "link_degraded", ("link", "leaf-1a~spine-a-1"), 38.9, job=None),
    ]
    actions = [
        action("d-1", "isolate", "node-005"),
        action(
            "d-1",
            "restart",
            "job-a",
            replaced={"node-005": "node-000"},
            tiers={"node-000": "same leaf"},
        ),
        action("d-1", "alert", "node-005/gpu5", receiver="oncall"),
        action(
            "d-2", "reroute", "leaf-1a~spine-a-1", before_max_util=1.5, after_max_util=1.0, moved=2
        ),
    ]
    timeline = build_timeline(T0, [LINK, SLOW], diagnoses, actions)
    assert timeline.passed
    assert [row.truth.type for row in timeline.rows] == ["slow_gpu", "fabric_link_down"]
    assert timeline.rows[0].latency_ns == int(3.9 * S)
    text = format_rows(table(timeline))
    assert "restart job-a: node-005 -> node-000 (same leaf)" in text
    assert "reroute leaf-1a~spine-a-1: max link util 1.50 -> 1.00, 2 flows moved" in text
    assert "1/1 alerts delivered" in text
    assert verdict(timeline).startswith("PASS: 2/2 faults diagnosed, 2/2 acted on, 0 false")


def test_a_reroute_that_raises_the_maximum_says_how_high_it_must_be() -> None:
    lost = action(
        "d-2",
        "reroute",
        "leaf-1a~spine-a-1",
        before_max_util=3.0,
        after_max_util=3.5,
        bound=3.0,
        moved=28,
    )
    text = note(lost).text
    assert text == (
        "reroute leaf-1a~spine-a-1: max link util 3.00 -> 3.50"
        " (at least 3.00 without it), 28 flows moved"
    )
    lowered = action("d-2", "reroute", "leaf-1a~spine-a-1", before_max_util=3.0,
                     after_max_util=2.0, bound=2.0, moved=3)  # fmt: skip
    assert (
        note(lowered).text == "reroute leaf-1a~spine-a-1: max link util 3.00 -> 2.00, 3 flows moved"
    )


def test_a_wrong_suspect_is_a_miss_and_a_false_finding() -> None:
    diagnoses = [finding("d-1", "noncomm_slow", ("gpu", "node-005/gpu4"), 13.0)]
    timeline = build_timeline(T0, [SLOW], diagnoses, [action("d-1", "isolate", "node-005")])
    assert not timeline.passed
    assert timeline.rows[0].finding is None
    assert [d.id for d in timeline.false_findings] == ["d-1"]
    assert "MISSED" in format_rows(table(timeline))


def test_diagnosed_but_only_alerted_or_skipped_is_not_acted_on() -> None:
    diagnoses = [finding("d-1", "noncomm_slow", ("gpu", "node-005/gpu5"), 13.0)]
    actions = [
        action("d-1", "alert", "node-005/gpu5", receiver="oncall"),
        action("d-1", "isolate", "node-005", status="skipped"),
    ]
    timeline = build_timeline(T0, [SLOW], diagnoses, actions)
    assert timeline.rows[0].finding is not None
    assert not timeline.rows[0].acted
    assert not timeline.passed
    text = format_rows(table(timeline))
    assert "(no action done)" in text and "skipped" not in text
    assert skipped_line(timeline) == (
        "1 skipped action not shown (1 already_isolated); all actions are in actions.jsonl"
    )


def test_skipped_actions_are_counted_not_listed_and_failed_ones_are_listed() -> None:
    diagnoses = [finding("d-1", "noncomm_slow", ("gpu", "node-005/gpu5"), 13.0)]
    actions = [
        action("d-1", "isolate", "node-005"),
        action("d-1", "restart", "job-a", status="failed", reason="launcher_down"),
        action("d-1", "restart", "job-b", status="skipped", reason="not_in_job"),
        action("d-1", "alert", "node-005/gpu5", receiver="oncall"),
        action("d-1", "alert", "node-005/gpu5", status="skipped", receiver="oncall"),
    ]
    timeline = build_timeline(T0, [SLOW], diagnoses, actions)
    text = format_rows(table(timeline))
    assert "isolate node-005" in text
    assert "restart job-a [failed: launcher_down]" in text
    assert "job-b" not in text and "skipped" not in text
    assert "1/1 alerts delivered" in text  # the skipped alert is no undelivered one
    assert skipped_line(timeline) == (
        "2 skipped actions not shown (1 already_isolated, 1 not_in_job); "
        "all actions are in actions.jsonl"
    )
    assert len(timeline.rows[0].actions) == 5  # the timeline itself keeps them all
    assert skipped_line(build_timeline(T0, [SLOW], diagnoses, actions[:1])) is None


def test_a_finding_before_the_onset_does_not_count() -> None:
    diagnoses = [finding("d-1", "noncomm_slow", ("gpu", "node-005/gpu5"), 5.0)]
    timeline = build_timeline(T0, [SLOW], diagnoses, [action("d-1", "isolate", "node-005")])
    assert timeline.rows[0].finding is None


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.extend(value or "" for name, value in attrs if name == "src")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_report_opens_and_names_every_injected_fault(tmp_path: Path) -> None:
    options = DemoOptions(report=tmp_path)
    topology = demo_topology(options)
    scenario = load_demo_scenario(None, None).model_copy(update={"start_ns": T0})
    cluster = build_cluster(topology, scenario)
    truths = ground_truth(topology, scenario, cluster)
    assert {t.type for t in truths} == {"slow_gpu", "port_degraded", "gpu_stop", "fabric_link_down"}
    first = truths[0]
    diagnoses = [
        finding(
            "d-1", first.classes[0], (first.suspect_type, first.suspect_id), 14.0, job=first.job
        ),
        finding(
            "d-2",
            "comm_slow",
            ("port", "node-022/mlx5_3:1"),
            19.0,
            job="job-b",
            evidence={
                "throughput": [[r, (r + 1) % 64, 100.0 if r == 19 else 190.0] for r in range(64)]
            },
        ),
    ]
    actions = [action("d-1", "isolate", "node-005")]
    routes = tuple(route_messages(cluster, T0))
    view = FeedView(tuple(diagnoses), tuple(actions), routes, ())
    timeline = build_timeline(T0, truths, diagnoses, actions)
    calls = [Call("/alert", 0.0, {}, {}), Call("/launch", 0.0, {}, {})]
    page = write_report(tmp_path, timeline, view, topology, WallClock(T0, T0, 1.0), calls, 42.0)
    parser = _Page()
    parser.feed(page.read_text(encoding="utf-8"))
    text = " ".join(parser.text)
    for item in truths:
        assert item.type in text and item.suspect_id in text
    assert "FAIL" in text  # three faults were not diagnosed in this made-up run
    assert parser.images == ["timeline.png", "throughput.png"]
    for image in parser.images:
        data = (tmp_path / image).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000
    saved = orjson.loads((tmp_path / "timeline.json").read_bytes())
    assert [row["type"] for row in saved["rows"]] == [t.type for t in truths]


def test_the_simulators_routes_are_the_plan_in_force() -> None:
    topology = demo_topology(DemoOptions(report=Path()))
    scenario = load_demo_scenario(None, None)
    cluster = build_cluster(topology, scenario)
    current = simulator_plan(topology, cluster, T0)
    assert current.id == "p-sim" and current.down == ()
    by_flow = {path.flow: path for path in current.plan.paths}
    sim_routes = {p.flow: p.via for r in route_messages(cluster, T0) for p in r.paths}
    for flow, path in by_flow.items():
        assert sim_routes[flow] == path.via
    crossing = [p for p in current.plan.paths if "leaf-1a~spine-a-1" in p.links]
    assert len(crossing) == 12  # the link the built-in scenario takes down carries 12 flows
    assert current.plan.max_util > 0


def test_actions_and_alerts_of_one_time_stand_apart_the_actions_on_top() -> None:
    diagnoses = [finding("d-1", "noncomm_slow", ("gpu", "node-005/gpu5"), 13.9)]
    actions = [  # all at T0 + 30 s, as the alert, isolate and restart of one finding come
        action("d-1", "alert", "node-005/gpu5", receiver="oncall"),
        action("d-1", "isolate", "node-005"),
        action("d-1", "restart", "job-a", replaced={"node-005": "node-000"}),
        action("d-1", "isolate", "node-005", status="skipped"),
    ]
    timeline = build_timeline(T0, [SLOW], diagnoses, actions)
    figure = timeline_figure(timeline, lambda wall_ns: wall_ns)
    squares: dict[str, list[PathCollection]] = {"action": [], "alert": []}
    for collection in figure.axes[0].collections:
        colour = to_hex(collection.get_facecolor()[0])
        kinds = [kind for kind in squares if COLOURS[kind] == colour]
        if kinds and len(collection.get_offsets()):  # the legend's handles hold no point
            assert isinstance(collection, PathCollection)
            squares[kinds[0]].append(collection)
    assert [len(squares["action"]), len(squares["alert"])] == [2, 1]  # the skipped one: none
    drawn = squares["action"] + squares["alert"]
    assert {float(c.get_offsets()[0][0]) for c in drawn} == {30.0}  # each at its own time
    assert min(c.get_zorder() for c in squares["action"]) > squares["alert"][0].get_zorder()
    where = [c.get_offset_transform().transform(c.get_offsets())[0] for c in drawn]
    side_px = MARK_S**0.5 * figure.dpi / 72
    for i, first in enumerate(where):
        for second in where[i + 1 :]:
            assert abs(first[1] - second[1]) >= side_px  # one under the other, none covered
    assert min(p[1] for p in where[:2]) > where[2][1]  # the actions nearest the lane
    figure.savefig(BytesIO(), format="png")


def test_markers_close_in_time_take_the_next_free_place() -> None:
    assert stack([30.0, 30.0, 40.0, 30.05, 40.0], near=0.1) == [0, 1, 0, 2, 1]
    assert stack([30.0, 30.2], near=0.1) == [0, 0]
