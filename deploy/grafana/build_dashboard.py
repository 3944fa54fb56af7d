"""c4's Grafana dashboard as code (grafana-foundation-sdk): writes ``c4-dashboard.json``.

    python deploy/grafana/build_dashboard.py            # rewrite the JSON beside this file
    python deploy/grafana/build_dashboard.py --check    # exit 1 when the JSON is out of date

Every panel queries the Prometheus data source picked in the ``datasource`` variable, over
the metrics the c4 workers serve (README, "Plugging into Prometheus"): findings over time
and open now, detection latency, per-job operation rates, the fabric's link utilisation from
the plans in force, and the workers' intake, rejections, lag and actions.
tests/unit/test_grafana_dashboard.py keeps the JSON in step with this file, and
tests/integration/test_prometheus_scrape.py runs every query against a real Prometheus
scraping the demo's workers.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos

OUTPUT = Path(__file__).with_name("c4-dashboard.json")
UID = "c4-overview"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
WIDTH = 24


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True, slots=True)
class PanelSpec:
    """A panel: its title, what it shows, its unit, its queries; a table shows one instant."""

    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    table: bool = False
    width: int = 12
    height: int = 8


PANELS = (
    PanelSpec(
        "Open findings by class",
        "Findings the streams workers hold open (c4_finding_open), summed over the group.",
        "short",
        (Query("sum by (class) (c4_finding_open)", "{{class}}"),),
    ),
    PanelSpec(
        "Open findings",
        "Each open finding with its best suspect, its job and where it is (node, GPU, port).",
        "short",
        (
            Query(
                "max by (diagnosis, class, training_job, suspect, suspect_type, node, gpu,"
                " device, port) (c4_finding_open)"
            ),
        ),
        table=True,
    ),
    PanelSpec(
        "Detection latency",
        "From a finding's onset to its publication, p50 and p99 over the group.",
        "s",
        (
            Query(
                "histogram_quantile(0.5, sum by (le) "
                "(rate(c4_stream_detection_latency_seconds_bucket[$__rate_interval])))",
                "p50",
            ),
            Query(
                "histogram_quantile(0.99, sum by (le) "
                "(rate(c4_stream_detection_latency_seconds_bucket[$__rate_interval])))",
                "p99",
            ),
        ),
    ),
    PanelSpec(
        "Diagnoses published",
        "Diagnoses per second by class and state (firing, resolved).",
        "ops",
        (
            Query(
                "sum by (class, state) (rate(c4_stream_diagnoses_total[$__rate_interval]))",
                "{{class}} {{state}}",
            ),
        ),
    ),
    PanelSpec(
        "Operations per job",
        "Collective operations reported per second, by training job.",
        "ops",
        (
            Query(
                "sum by (training_job) (rate(c4_stream_operations_total[$__rate_interval]))",
                "{{training_job}}",
            ),
        ),
    ),
    PanelSpec(
        "Fabric link utilisation (plan in force)",
        "The busiest links of the traffic plan in force (load / capacity), and its maximum.",
        "percentunit",
        (
            Query("topk(10, c4_plan_link_utilization_ratio)", "{{link}}"),
            Query("max(c4_action_plan_max_utilization_ratio)", "max"),
        ),
    ),
    PanelSpec(
        "Messages taken",
        "v1 messages decoded per second by kind, and records dead-lettered.",
        "ops",
        (
            Query("sum by (kind) (rate(c4_stream_messages_total[$__rate_interval]))", "{{kind}}"),
            Query(
                "sum by (code) (rate(c4_stream_rejected_total[$__rate_interval]))",
                "rejected {{code}}",
            ),
        ),
    ),
    PanelSpec(
        "Consumer lag",
        "Records behind the end of each input topic, over the streams workers' partitions.",
        "short",
        (Query("sum by (topic) (c4_stream_consumer_lag)", "{{topic}}"),),
    ),
    PanelSpec(
        "Actions",
        "What the actions workers did per second, by action and status.",
        "ops",
        (
            Query(
                "sum by (action, status) (rate(c4_action_records_total[$__rate_interval]))",
                "{{action}} {{status}}",
            ),
        ),
    ),
    PanelSpec(
        "Dead letters of the actions workers",
        "Steps that failed for good, by where they were going.",
        "short",
        (Query("sum by (source) (c4_action_deadletters_total)", "{{source}}"),),
    ),
)


def queries() -> list[str]:
    """Every PromQL expression of the dashboard, in panel order."""
    return [query.expr for spec in PANELS for query in spec.queries]


def _panel(spec: PanelSpec, x: int, y: int) -> table.Panel | timeseries.Panel:
    grid = GridPos(h=spec.height, w=spec.width, x=x, y=y)
    panel: table.Panel | timeseries.Panel
    if spec.table:
        panel = table.Panel()
    else:
        panel = timeseries.Panel().fill_opacity(10)
    panel = (
        panel.title(spec.title)
        .description(spec.description)
        .unit(spec.unit)
        .datasource(DATASOURCE)
        .grid_pos(grid)
    )
    for index, query in enumerate(spec.queries):
        target = (
            prometheus.Dataquery()
            .expr(query.expr)
            .legend_format(query.legend or "__auto")
            .ref_id(chr(ord("A") + index))
        )
        if spec.table:
            target = target.instant().format("table")
        panel = panel.with_target(target)
    return panel


def build() -> dict[str, object]:
    """The dashboard as Grafana's JSON model."""
    board = (
        dashboard.Dashboard("c4: findings, detection, traffic")
        .uid(UID)
        .tags(["c4", "gpu", "training"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
    )
    x = y = 0
    for spec in PANELS:
        if x + spec.width > WIDTH:
            x, y = 0, y + spec.height
        board = board.with_panel(_panel(spec, x, y))
        x += spec.width
    built: dict[str, object] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return built


def render() -> str:
    """The JSON text written to ``c4-dashboard.json``."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the JSON is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(OUTPUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
