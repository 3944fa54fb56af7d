"""``c4 demo --slurm``: a real training job on a real local Slurm cluster, real faults.

The stack (the configured Kafka and Redis, or the local ones started; the local Slurm
cluster of `c4.stack.slurm`, started unless it runs), this run's topics and Redis keys, a
topology of the cluster's four nodes in the cluster state; the streams worker, the action
worker (its scheduler Slurm) and one node agent per node as subprocesses; then the training
job (`slurm_train.py`, DDP over gloo under ``srun c4 run``) and the faults of
`c4.demo.slurm_faults`: ``hangs`` times every rank of one node stopped, then one straggler.
The run ends with the job's own end; `close` stops everything it started, newest first, and
only that: the job, the workers, this run's topics and keys, Slurm and the Kafka and Redis
when this run started them.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import orjson
import yaml

from actions.drivers.slurm.cli import ENDED_STATES, CommandRunner, Slurm
from actions.state.store import RedisState
from c4.dashboard.feed import Feed
from c4.demo import DemoError, Say
from c4.demo.prepare import delete_topics, ensure_stack
from c4.demo.processes import Child, free_port
from c4.demo.slurm_faults import Faults, release_command
from c4.demo.slurm_figures import (
    Bounds,
    FalseFinding,
    FaultRecord,
    Figures,
    JobEnd,
    figures,
    passed,
    report,
    summary_lines,
    table,
)
from c4.demo.slurm_job import JOB_NODES, JobFiles, SlurmView, job_script
from c4.demo.timeline import format_rows
from c4.demo.workers import worker_env
from c4.settings import Settings
from c4.stack import (
    StackError,
    slurm_conf_path,
    slurm_down,
    slurm_status,
    slurm_up,
    stack_down,
)
from c4.stack.slurm import node_names, run_dir
from c4.topics import create_topics
from schemas.codec import encode
from topology.generate import Shape, generate

REPORT_NAME = "slurm-demo.json"
DEFAULT_STEPS = 800
SOCKET_PATH_MAX = 107  # sun_path: 108 bytes with the terminating NUL
SECONDS_PER_STEP = 0.5  # a generous bound on a loaded 2-core machine, for the end's timeout


@dataclass(frozen=True, slots=True)
class SlurmOptions:
    """What ``c4 demo --slurm`` was asked for."""

    report: Path | None = None  # None: a temporary folder, removed after a passing run
    hangs: int = 1
    steps: int = DEFAULT_STEPS
    keep_topics: bool = False


@dataclass(frozen=True, slots=True)
class SlurmOutcome:
    """What a run measured; ``problem`` says why it stopped early, if it did."""

    records: tuple[FaultRecord, ...]
    figures: Figures
    end: JobEnd | None
    others: tuple[FalseFinding, ...]
    started_ns: int
    work: Path
    problem: str = ""

    @property
    def ok(self) -> bool:
        """Every fault found and acted on, the job completed, nothing stopped the run."""
        return passed(self.records, self.end) and not self.problem


def need_root() -> str | None:
    """Why this machine cannot run the Slurm demo, if it cannot (one line)."""
    if os.geteuid() != 0:
        return (
            "c4 demo --slurm needs root: the local Slurm cluster's drains and requeues are an "
            "administrator's (run it with sudo)"
        )
    return None


@contextmanager
def stops_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt as Ctrl-C does, so `close` runs on either."""

    def _interrupt(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class SlurmDemo:
    """One run; `run` returns its outcome, `close` stops what it started."""

    def __init__(self, options: SlurmOptions, settings: Settings, say: Say) -> None:
        self.options = options
        self.say = say
        self.run_id = uuid.uuid4().hex[:8]
        self.settings = settings.model_copy(
            update={
                "topic_prefix": f"{settings.topic_prefix}demo-{self.run_id}.",
                "redis_key_prefix": f"{settings.redis_key_prefix}:demo:{self.run_id}",
                "topic_partitions": 1,
            }
        )
        self.app_id = settings.names.owned(f"c4-demo-{self.run_id}")
        self._temporary = options.report is None
        self.work = (
            Path(tempfile.mkdtemp(prefix=f"c4-demo-slurm-{self.run_id}-"))
            if options.report is None
            else options.report.resolve()
        )
        self.logs = self.work / "logs"
        self._children: list[Child] = []
        self._started_stack = False
        self._started_slurm = False
        self._state: RedisState | None = None
        self._feed: Feed | None = None
        self._view: SlurmView | None = None
        self._faults: Faults | None = None
        self._job: str | None = None
        self._records: list[FaultRecord] = []
        self._passed = False

    # --- set-up -----------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        return worker_env(self.settings)

    def _actions_config(self) -> Path:
        """Isolate and restart on a hang and on a straggler, through Slurm."""
        hard = ["isolate", "restart"]
        faults = self.options.hangs + 1
        config = {
            "retry": {"tries": 3, "backoff_s": 0.1, "max_backoff_s": 0.5},
            "policy": {
                # A node whose every rank stopped while its agent runs is a noncomm_hang
                # naming those ranks; with the agent gone too, a node_down. A finding about
                # a run that was requeued since requeues nothing (earlier_run).
                "classes": {"node_down": hard, "noncomm_hang": hard, "noncomm_slow": hard},
                "max_restarts": faults,
                # Each fault isolates and restarts once: the default limits are a cluster's.
                "job_rate": {"actions": 2 * faults + 2, "window_s": 3600},
                "cluster_rate": {"actions": 2 * faults + 10, "window_s": 3600},
            },
            "scheduler": {
                "kind": "slurm",
                "slurm_conf": str(slurm_conf_path(self.settings)),
                "mirror_spares_s": 2,
                # A drained node gets no job already; a node given back between the faults
                # (`c4 state release`) must be one Slurm may place the job on again.
                "exclude_failed_nodes": False,
            },
        }
        path = self.work / "actions.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    def _stack(self) -> None:
        names = node_names(self.settings)
        if len(names) < JOB_NODES + 1:
            message = f"the Slurm demo needs {JOB_NODES + 1} nodes, the stack has {len(names)}"
            raise DemoError(message)
        # slurmstepd's sockets live in the node's spool folder; a Unix socket path holds 108
        # bytes. Too long, and every job step fails to start (the job is held, requeued).
        socket = run_dir(self.settings) / f"spool-{names[-1]}" / f"{names[-1]}_9999999.4294967291"
        if len(str(socket)) > SOCKET_PATH_MAX:
            message = (
                f"the stack folder {self.settings.stack_dir} is too long for Slurm's sockets "
                f"({len(str(socket))} > {SOCKET_PATH_MAX} bytes): set a shorter C4_STACK_DIR"
            )
            raise DemoError(message)
        self._started_stack = ensure_stack(self.settings, self.say)
        running = any(status.state == "running" for status in slurm_status(self.settings))
        try:
            statuses = slurm_up(self.settings, progress=lambda line: self.say(f"slurm: {line}"))
        except StackError as error:
            if not running:
                slurm_down(self.settings)  # whatever of it this run started
            message = f"the local Slurm cluster did not come up: {error}"
            raise DemoError(message) from None
        self._started_slurm = any(s.detail != "already running" for s in statuses)
        conf = slurm_conf_path(self.settings)
        how = "started" if self._started_slurm else "already running"
        self.say(f"slurm: {len(statuses) - 2} nodes, {how} (SLURM_CONF={conf})")
        self._view = SlurmView(conf)

    def _cluster_state(self) -> None:
        names = node_names(self.settings)
        topology = generate(Shape(nodes=len(names), spines=1, nics=1, planes=2, gpus=8))
        (self.work / "topology.json").write_bytes(encode(topology) + b"\n")
        created = create_topics(self.settings, partitions=1)
        self.say(f"topics: {len(created)} under prefix {self.settings.topic_prefix}")
        s = self.settings
        password = s.redis_password.get_secret_value() if s.redis_password else None
        self._state = RedisState.connect(s.redis_url, password, s.redis_key_prefix)
        counts = self._state.components.load_topology(topology)
        self.say(
            f"cluster state: {counts.get('node', 0)} nodes ({', '.join(names)}) under "
            f"{s.redis_key_prefix}; the spares mirror Slurm's idle nodes"
        )

    def _start_workers(self, config: Path) -> None:
        env, logs = self._env(), self.logs
        web, streams_metrics, actions_metrics = free_port(), free_port(), free_port()
        streams = Child(
            "streams worker",
            [
                *("streams", "worker", "--app-id", self.app_id, "--web-port", str(web)),
                *("--metrics-port", str(streams_metrics), "--loglevel", "warn"),
            ],
            env,
            logs,
            logs / "streams-worker.log",
        )
        self._children.append(streams)
        actions = Child(
            "actions worker",
            [
                *("actions", "worker", "--config", str(config), "--group", f"{self.app_id}-act"),
                *("--metrics-port", str(actions_metrics)),
            ],
            env,
            logs,
            logs / "actions-worker.log",
        )
        self._children.append(actions)
        for node in node_names(self.settings):
            handoff = self.work / "handoff" / node
            handoff.mkdir(parents=True, exist_ok=True)
            agent = [
                *("agent", "--node", node, "--handoff", str(handoff)),
                *("--spool-dir", str(self.work / "spool" / node)),
                *("--no-sysfs", "--no-nvml", "--interval", "0.5"),
            ]
            self._children.append(
                Child(f"agent {node}", agent, env, logs, logs / f"agent-{node}.log")
            )
        actions.wait_port(actions_metrics, 60)
        streams.wait_port(web, 120)
        agents = ", ".join(str(c.pid) for c in self._children[2:])
        self.say(
            f"workers: streams (pid {streams.pid}), actions (pid {actions.pid}, scheduler "
            f"slurm), {len(self._children) - 2} node agents (pids {agents}); logs in {logs}"
        )
        self.say(
            "actions: isolate (drain) and restart (requeue) on noncomm_hang, node_down and "
            "noncomm_slow"
        )

    def _check(self) -> None:
        for child in self._children:
            child.check()

    # --- the run ----------------------------------------------------------------------
    def run(self) -> SlurmOutcome:
        """Everything from the stack to the job's end; raises `DemoError` on a broken set-up."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self._stack()
        assert self._view is not None  # noqa: S101 - set by _stack
        view = self._view
        self._cluster_state()
        config = self._actions_config()
        self._start_workers(config)
        self._feed = Feed(
            self.settings.kafka_client_config(), self.settings.topic_prefix, f"{self.app_id}-feed"
        ).start()
        script = self.work / "job.sh"
        script.write_text(job_script(self.work, self.options.steps), encoding="utf-8")
        self._job = job = view.submit(script)
        self.say(
            f"job {job}: slurm_train.py, DDP over gloo on {JOB_NODES} nodes, "
            f"{self.options.steps} steps, each task under `srun c4 run`"
        )
        release = release_command(config, self._env(), self.logs)
        files = JobFiles(self.work / "train")
        self._faults = faults = Faults(view, self._feed, job, files, release, self._check, self.say)
        started_ns = time.time_ns()
        problem = ""
        try:
            first = faults.ready()
            self.say(f"job {job}: training on {', '.join(first.nodes)}")
            started_ns = faults.started_ns or started_ns
            problem = self._inject(faults)
            if not problem:
                self.say(f"job {job}: training on to its end ({self.options.steps} steps)")
                faults.wait_end(self.options.steps * SECONDS_PER_STEP + 120)
                for record in self._records:
                    if record.kind == "straggler" and record.ok:
                        faults.give_back(record)  # the cluster as it was found
        except DemoError as error:
            problem = str(error)
        end = view.end(job)
        found = figures(self._records, Bounds.defaults())
        others = faults.others(self._records, started_ns)
        outcome = SlurmOutcome(
            tuple(self._records), found, end, tuple(others), started_ns, self.work, problem
        )
        self._passed = outcome.ok
        if not self._temporary:
            document = report(self.run_id, self._records, found, end, others, started_ns)
            document["problem"] = problem
            (self.work / REPORT_NAME).write_bytes(
                orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"
            )
        return outcome

    def _inject(self, faults: Faults) -> str:
        """Each fault in turn; the first problem ends the series (returned)."""
        for index in range(self.options.hangs):
            record = faults.hang(index)
            self._records.append(record)
            if record.ok:
                faults.give_back(record)
            if not record.ok:
                return record.problem or f"hang {index + 1} not found and acted on"
        record = faults.straggler()
        self._records.append(record)
        return record.problem if not record.ok else ""

    # --- tear-down --------------------------------------------------------------------
    def close(self) -> None:
        """Stop everything this run started, newest first; never what it did not start.

        Ctrl-C and SIGTERM are held off meanwhile: a second one must not leave half of it."""
        held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._close()
        finally:
            for signum, handler in held.items():
                signal.signal(signum, handler)

    def _close(self) -> None:
        say = self.say
        if self._faults is not None:
            self._faults.close()
        if self._job is not None and self._view is not None:
            self._step("job", self._cancel)
        if not self._started_slurm and self._view is not None:
            self._step("drains", self._resume_drains)
        for child in reversed(self._children):
            child.stop()
        if self._feed is not None:
            self._feed.stop()
        if self._state is not None:
            if not self.options.keep_topics:
                self._step("keys", self._delete_keys)
            self._state.close()
        if not self.options.keep_topics and self._children:
            prefixes = (self.settings.topic_prefix, self.app_id)
            self._step("topics", lambda: delete_topics(self.settings, prefixes))
        if self._started_slurm:
            say("slurm: stopping the local Slurm cluster this run started")
            self._step("slurm", lambda: slurm_down(self.settings))
        if self._started_stack:
            say("stack: stopping the local Kafka and Redis this run started")
            self._step("stack", lambda: stack_down(self.settings))
        if self._temporary:
            if self._passed:
                shutil.rmtree(self.work, ignore_errors=True)
            else:
                say(f"logs kept in {self.work}")

    def _step(self, what: str, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception as error:  # noqa: BLE001 - the rest of the clean-up goes on
            self.say(f"clean-up of the {what} failed: {error}")

    def _cancel(self) -> None:
        assert self._view is not None and self._job is not None  # noqa: S101
        if self._view.job(self._job).state in ENDED_STATES:
            return
        state = self._view.cancel(self._job)
        self.say(f"job {self._job}: cancelled ({state})")

    def _resume_drains(self) -> None:
        """Slurm was running before this run: resume every node c4 drained for one of this
        run's findings and did not give back (only while the reason is still c4's)."""
        slurm = Slurm(CommandRunner(str(slurm_conf_path(self.settings))))
        ours = {r.diagnosis_id for r in self._records if r.diagnosis_id}
        if self._feed is not None:
            ours |= {d.id for d in self._feed.view().diagnoses if d.job == self._job}
        for name in node_names(self.settings):
            node = slurm.node(name)
            words = node.reason.split()
            if node.drained_by_c4 and words and words[0].removeprefix("c4:") in ours:
                slurm.resume(name)
                self.say(f"slurm: {name} resumed (drained by c4 in this run)")

    def _delete_keys(self) -> None:
        assert self._state is not None  # noqa: S101
        client = self._state.client
        keys = list(client.scan_iter(match=f"{self.settings.redis_key_prefix}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])


def print_outcome(outcome: SlurmOutcome, say: Say) -> None:
    """The timeline table, the figures and the verdict."""
    say("")
    say(format_rows(table(outcome.records, outcome.started_ns, outcome.others)))
    say("")
    if outcome.problem:
        say(f"STOPPED: {outcome.problem}")
    for line in summary_lines(outcome.records, outcome.figures, outcome.end, outcome.others):
        say(line)
