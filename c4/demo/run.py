"""``c4 demo``, end to end: stack, topics, topology and spares, workers, live simulator, verdict.

Every run has its own topic prefix, Redis key prefix, Faust app id and consumer groups, so a
rerun never sees an earlier run's data. The streams worker and the actions worker run as
subprocesses (logs in the report folder); the job launcher and the alert receiver are real
HTTP servers in this process; the simulator publishes live, paced in event time. The run
ends with the timeline (per injected fault: diagnosis, detection latency, actions) and the
HTML report, and stops everything it started (the local stack only if it started it).

The pieces live beside it: `c4.demo.options` (what was asked, scenario and topology),
`c4.demo.prepare` (stack, plan in force, actions config, topics), `c4.demo.workers`.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

from actions.drivers.reroute.plan_store import PlanStore
from actions.state.store import RedisState
from c4.dashboard.feed import Feed
from c4.dashboard.server import DashboardServer, Source
from c4.demo import DemoError, Say
from c4.demo.audit import audit
from c4.demo.chaos import (
    Chaos,
    ChildTarget,
    Kill,
    StackTarget,
    Target,
    kill_plan,
    recovery_table,
)
from c4.demo.live_sim import HandoffOutlet, LiveSimulator, store_reader
from c4.demo.options import DemoOptions, demo_topology, load_demo_scenario, spare_nodes
from c4.demo.pipeline_watch import PipelineWatch
from c4.demo.prepare import actions_config, delete_topics, ensure_stack, simulator_plan
from c4.demo.processes import Child
from c4.demo.receivers import Receivers
from c4.demo.report import WallClock, write_report
from c4.demo.timeline import (
    Timeline,
    build_timeline,
    format_rows,
    skipped_line,
    table,
    verdict,
)
from c4.demo.workers import start_workers
from c4.scenarios import place
from c4.settings import Settings
from c4.stack import stack_down
from c4.topics import create_topics
from schemas.codec import encode
from schemas.files import Topology
from simulator import Scenario, ScenarioError, ground_truth
from simulator.cluster import Cluster
from simulator.truth import Truth

# The names `c4 demo` and the tests import from here; their homes are the modules above.
__all__ = [
    "DemoOptions",
    "DemoRun",
    "Outcome",
    "demo_topology",
    "load_demo_scenario",
    "print_chaos",
    "print_timeline",
    "simulator_plan",
]

PARTITIONS = 2  # a demo on a laptop: fewer partitions, fewer Faust tasks
PROGRESS_EVERY_S = 5.0
PLAY_ON_S = 4.0  # wall seconds the simulator runs on once every fault was acted on


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a demo run produced."""

    timeline: Timeline
    report: Path
    wall_s: float
    kills: tuple[Kill, ...] = ()
    problems: tuple[str, ...] = ()  # what the chaos audit found done twice or leaked

    @property
    def ok(self) -> bool:
        """Every fault diagnosed and acted on, nothing false, nothing twice, nothing leaked."""
        return self.timeline.passed and not self.problems


class DemoRun:
    """One run of the demo; `run` returns its outcome, `close` stops what it started."""

    def __init__(self, options: DemoOptions, settings: Settings, say: Say) -> None:
        self.options = options
        self.say = say
        self.run_id = uuid.uuid4().hex[:8]
        # A run of its own: its topics, keys and groups (a deployment's set-up uses the
        # configured names, which its services share).
        self.settings = (
            settings.model_copy(
                update={
                    "topic_prefix": f"{settings.topic_prefix}demo-{self.run_id}.",
                    "redis_key_prefix": f"{settings.redis_key_prefix}:demo:{self.run_id}",
                    "topic_partitions": PARTITIONS,
                }
            )
            if not options.setup_only
            else settings
        )
        self.app_id = settings.names.owned(f"c4-demo-{self.run_id}")
        # Absolute: the workers run in the logs folder and read files from the report folder.
        self.report = options.report.resolve()
        self.logs = self.report / "logs"
        self._children: list[Child] = []
        self._started_stack = False
        self._receivers: Receivers | None = None
        self._feed: Feed | None = None
        self._dashboard: DashboardServer | None = None
        self._state: RedisState | None = None
        self._simulator: LiveSimulator | None = None
        self.dashboard_url: str | None = None
        self._outlet: HandoffOutlet | None = None
        self._chaos: Chaos | None = None
        self._watch_pipeline: PipelineWatch | None = None
        self._ports: dict[str, int] = {}
        self._spares: list[str] = []

    # --- set-up -----------------------------------------------------------------------
    def _prepare(self) -> tuple[Topology, Scenario, Cluster, list[Truth], list[str]]:
        options = self.options
        self.logs.mkdir(parents=True, exist_ok=True)
        scenario = load_demo_scenario(options.scenario, options.duration)
        topology = demo_topology(options)
        try:
            cluster = place(topology, scenario, options.scenario or "demo scenario")
        except ScenarioError as error:
            raise DemoError(str(error)) from None
        truths = ground_truth(topology, scenario, cluster)
        (self.report / "topology.json").write_bytes(encode(topology) + b"\n")
        return topology, scenario, cluster, truths, spare_nodes(cluster)

    def _write_inputs(self, scenario: Scenario, truths: list[Truth]) -> None:
        (self.report / "scenario.json").write_bytes(
            orjson.dumps(scenario.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
        )
        (self.report / "truth.jsonl").write_bytes(
            b"".join(orjson.dumps(t.as_dict()) + b"\n" for t in truths)
        )

    def _start_chaos(self) -> None:
        """The kill plan and the pipeline watch (after the simulator started)."""
        seed = self.options.chaos_seed
        assert seed is not None and self._outlet is not None  # noqa: S101
        assert self._simulator is not None  # noqa: S101
        children = {child.name: child for child in self._children}
        ports = self._ports
        targets: dict[str, Target] = {
            "streams worker": ChildTarget(
                "streams worker", children["streams worker"], ports["streams web"]
            ),
            "actions worker": ChildTarget(
                "actions worker", children["actions worker"], ports["actions metrics"]
            ),
            "node agent": ChildTarget("node agent", children["node agent"]),
            "kafka": StackTarget("kafka", self.settings),
            "redis": StackTarget("redis", self.settings),
        }
        simulator = self._simulator
        prefix = self.settings.topic_prefix
        self._watch_pipeline = PipelineWatch(
            handoff=self.report / "handoff",
            checkpoint=self.report / "agent-spool" / "handoff-offsets.json",
            written=self._outlet.written,
            sent=lambda: simulator.sent,
            streams_metrics_port=ports["streams metrics"],
            collective_topic=f"{prefix}c4.collective.v1",
            kafka_config=self.settings.kafka_client_config(),
            actions_group=f"{self.app_id}-actions",
            diagnosis_topic=f"{prefix}c4.diagnosis.v1",
        )
        kills = kill_plan(seed, self.options.chaos_first_s, self.options.chaos_pause_s)
        plan = ", ".join(f"{kill.target} after {kill.pause_s:.1f} s" for kill in kills)
        self.say(f"chaos (seed {seed}): kill -9, one at a time: {plan}")
        self._chaos = Chaos(kills, targets, self._watch_pipeline.caught_up, self.say)

    def _check_children(self) -> None:
        """A worker that exited on its own is an error; one the chaos run killed is not."""
        held = self._chaos.holding if self._chaos is not None else None
        for child in self._children:
            if child.name != held:
                child.check()

    def _receivers_url(self) -> str:
        assert self._receivers is not None  # noqa: S101 - started before the workers
        return self._receivers.url

    def _prepare_cluster(self) -> tuple[Topology, Scenario, Cluster, list[Truth], PlanStore]:
        """Topics, topology, cluster state with spares, and the simulator's plan in force."""
        say = self.say
        topology, scenario, cluster, truths, spares = self._prepare()
        self._spares = spares
        created = create_topics(self.settings, partitions=self.settings.topic_partitions)
        say(f"topics: {len(created)} under prefix {self.settings.topic_prefix or '(none)'}")
        self._state = RedisState.connect(
            self.settings.redis_url,
            self.settings.redis_password.get_secret_value()
            if self.settings.redis_password
            else None,
            self.settings.redis_key_prefix,
        )
        counts = self._state.components.load_topology(topology)
        now = time.time_ns()
        for node in spares:
            self._state.components.add_spare(node, now, now // 1_000_000, "c4-demo")
        say(
            f"cluster state: {counts.get('node', 0)} nodes, {counts.get('link', 0)} fabric links,"
            f" {len(spares)} spares under {self.settings.redis_key_prefix}"
        )
        plans = PlanStore(self._state.client, f"{self.settings.redis_key_prefix}:plan:")
        plans.replace(simulator_plan(topology, cluster, now), None)
        return topology, scenario, cluster, truths, plans

    def setup_only(self) -> None:
        """What a deployment (docker compose) needs before its services start, into the
        report folder: topics, topology.json, scenario.json, actions.yaml, the cluster state."""
        _, scenario, _, truths, _ = self._prepare_cluster()
        self._write_inputs(scenario, truths)
        config = actions_config("", reroute=True)
        del config["launcher"], config["receivers"]  # c4.job.v1 is the hand-off, no alerts
        (self.report / "actions.yaml").write_text(yaml.safe_dump(config))
        self.say(f"set up: {self.report}/topology.json, scenario.json, actions.yaml")

    # --- the run ----------------------------------------------------------------------
    def run(self) -> Outcome:
        """Everything from the stack to the report; raises `DemoError` on a broken set-up."""
        began = time.monotonic()
        say = self.say
        self._started_stack = ensure_stack(self.settings, say)
        topology, scenario, cluster, truths, plans = self._prepare_cluster()
        secret = secrets.token_hex(16)
        self._receivers = Receivers(secret.encode()).start()
        self._ports = start_workers(
            self.settings,
            self.options,
            (self.app_id, self.run_id),
            self.report,
            self._receivers_url(),
            secret,
            self._children,
            say,
        )
        self._feed = Feed(
            self.settings.kafka_client_config(), self.settings.topic_prefix, f"{self.app_id}-feed"
        ).start()
        if self.options.dashboard_port is not None and self._state is not None:
            source = Source(self._state, self._feed, f"c4 demo {self.run_id}")
            self._dashboard = DashboardServer(source, port=self.options.dashboard_port).start()
            self.dashboard_url = self._dashboard.url
            say(f"dashboard: {self.dashboard_url}")
        # The simulated cluster runs now: its event time is the wall clock the workers stamp
        # their own records with (placements, routes), as a real cluster's agents would.
        scenario = scenario.model_copy(update={"start_ns": time.time_ns()})
        truths = ground_truth(topology, scenario, cluster)
        self._write_inputs(scenario, truths)
        jobs = ", ".join(f"{j.spec.id} ({j.spec.ranks} GPUs)" for j in cluster.jobs)
        say(f"simulator: {jobs}; {len(truths)} faults scripted; speed x{self.options.speed}")
        for truth in truths:
            at = (truth.onset_ns - scenario.start_ns) / 1e9
            say(f"  at {at:5.1f} s  {truth.type:<22} {truth.suspect_id}")
        if self.options.chaos_seed is not None:
            self._outlet = HandoffOutlet(self.report / "handoff")

        self._simulator = LiveSimulator(
            cluster, scenario, self.settings, self.options.speed, store_reader(plans), self._outlet
        )
        self._simulator.start()
        if self.options.chaos_seed is not None:
            self._start_chaos()
        try:
            self._watch(scenario, truths)
        finally:
            self._save_records()
        view = self._feed.view()
        timeline = build_timeline(scenario.start_ns, truths, view.diagnoses, view.actions)
        started = self._simulator.wall_start_ns or time.time_ns()
        clock = WallClock(started, scenario.start_ns, self.options.speed)
        path = write_report(
            self.report,
            timeline,
            view,
            topology,
            clock,
            self._receivers.calls(),
            wall_s=time.monotonic() - began,
        )
        if self._chaos is None or self._state is None:
            return Outcome(timeline, path, time.monotonic() - began)
        problems = audit(view.diagnoses, view.actions, self._spares, self._state.snapshot())
        return Outcome(
            timeline,
            path,
            time.monotonic() - began,
            tuple(self._chaos.kills),
            tuple(problems),
        )

    def _watch(self, scenario: Scenario, truths: list[Truth]) -> None:
        """Progress lines while the simulator runs, then wait for the last actions to land."""
        assert self._simulator is not None and self._feed is not None  # noqa: S101
        simulator, feed = self._simulator, self._feed
        next_line = time.monotonic()
        all_done: float | None = None
        chaos, pipeline = self._chaos, self._watch_pipeline
        while simulator.is_alive():
            if chaos is not None and pipeline is not None:
                pipeline.sample()
                chaos.step()
            self._check_children()
            now = time.monotonic()
            if now >= next_line:
                next_line += PROGRESS_EVERY_S
                if self._progress(scenario, truths) and all_done is None:
                    all_done = now
            chaos_over = chaos is None or chaos.done
            if (
                not self.options.full
                and chaos_over
                and all_done is not None
                and now > all_done + PLAY_ON_S
            ):
                self.say("every fault acted on: stopping the simulator (--full plays it out)")
                simulator.cancel()
                simulator.join(30)
            time.sleep(0.25)
        if simulator.error is not None:
            message = f"simulator: {simulator.error}"
            raise DemoError(message)
        if chaos is not None and not chaos.done:
            over = sum(1 for kill in chaos.kills if kill.recovered_s is not None)
            reason = pipeline.last_reason if pipeline is not None else ""
            message = (
                f"the scenario ended with {over} of {len(chaos.kills)} kills over "
                f"(last check: {reason}): give it a longer --duration"
            )
            raise DemoError(message)
        self.say(f"simulator: done, {simulator.sent} messages; waiting for the last actions")
        deadline = time.monotonic() + self.options.settle_s
        while time.monotonic() < deadline:
            self._check_children()
            view = feed.view()
            timeline = build_timeline(scenario.start_ns, truths, view.diagnoses, view.actions)
            if all(row.ok for row in timeline.rows):
                time.sleep(2.0)  # a last straggling false finding would show here
                break
            time.sleep(0.5)
        self._progress(scenario, truths)

    def _progress(self, scenario: Scenario, truths: list[Truth]) -> bool:
        """Print one progress line; whether every fault is diagnosed and acted on."""
        assert self._simulator is not None and self._feed is not None  # noqa: S101
        view = self._feed.view()
        timeline = build_timeline(scenario.start_ns, truths, view.diagnoses, view.actions)
        found = sum(1 for row in timeline.rows if row.finding is not None)
        acted = sum(1 for row in timeline.rows if row.ok)
        event_s = (self._simulator.event_ns - scenario.start_ns) / 1e9
        receivers = self._receivers
        calls = len(receivers.calls()) if receivers else 0
        self.say(
            f"t={event_s:5.1f}/{scenario.duration_s:.0f} s  {self._simulator.sent} msgs  "
            f"faults diagnosed {found}/{len(truths)}, acted on {acted}/{len(truths)}  "
            f"findings {len(view.open_findings())} open  actions {len(view.actions)}  "
            f"webhook calls {calls}"
        )
        return acted == len(truths)

    def _save_records(self) -> None:
        assert self._feed is not None  # noqa: S101
        view = self._feed.view()
        for name, items in (
            ("diagnoses", view.diagnoses),
            ("actions", view.actions),
            ("routes", view.routes),
        ):
            (self.report / f"{name}.jsonl").write_bytes(b"".join(encode(m) + b"\n" for m in items))

    # --- tear-down --------------------------------------------------------------------
    def close(self) -> None:
        """Stop everything this run started, newest first; never a stack it did not start."""
        if self.options.setup_only:
            if self._state is not None:
                self._state.close()
            return
        if self._simulator is not None:
            self._simulator.cancel()
            self._simulator.join(10)
        if self._dashboard is not None:
            self._dashboard.stop()
        for child in reversed(self._children):
            child.stop()
        if self._feed is not None:
            self._feed.stop()
        if self._receivers is not None:
            self._receivers.stop()
        if self._state is not None:
            self._state.close()
        if not self.options.keep_topics:
            try:
                delete_topics(self.settings, (self.settings.topic_prefix, self.app_id))
            except Exception as error:  # noqa: BLE001 - leftovers are reported, not fatal
                self.say(f"topics of this run not deleted: {error}")
        if self._started_stack:
            self.say("stack: stopping the local Kafka and Redis this run started")
            stack_down(self.settings)


def print_chaos(kills: Sequence[Kill], problems: Sequence[str], say: Say) -> None:
    """The recovery table and what the audit found (or that it found nothing)."""
    say("")
    say(format_rows(recovery_table(kills)))
    say("")
    for problem in problems:
        say(f"AUDIT: {problem}")
    if not problems:
        say(
            "audit: every diagnosis published once, every action done once, "
            "nothing isolated twice, every spare taken went to one job"
        )


def print_timeline(timeline: Timeline, say: Say) -> None:
    """The closing table and the verdict line."""
    say("")
    say(format_rows(table(timeline)))
    say("")
    if (skipped := skipped_line(timeline)) is not None:
        say(skipped)
    say(verdict(timeline))
