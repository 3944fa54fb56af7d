"""The Slurm demo's faults, real ones, and what it measures after each.

A hang: every rank of one node of the running job stopped with SIGSTOP (their reporting
threads too; the ranks elsewhere block in their allreduce). A straggler: one node's ranks
throttled by a SIGSTOP/SIGCONT duty cycle, 30 ms of every 100 (a CPU quota in effect), until
a ``noncomm_slow`` names it. After each the demo polls Slurm and c4's findings until the job
runs again: when the finding came (its ``ts_ns``), when the node was drained and with which
reason (``sinfo -R``), when Slurm had requeued the job and when it ran again, its restart
count. A hang's node is given back afterwards (``c4 state release NODE --config``: the
cluster state, and c4's drain in Slurm), so that the next fault has a spare.

Only pids of this demo's own job are signalled; every one stopped is continued at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from actions.drivers.slurm.cli import ENDED_STATES, drained_for
from c4.dashboard.feed import Feed
from c4.demo import DemoError, Say
from c4.demo.slurm_figures import (
    HANG_CLASSES,
    NS_PER_S,
    POLL_S,
    STRAGGLER_CLASSES,
    FalseFinding,
    FaultKind,
    FaultRecord,
)
from c4.demo.slurm_job import JobFiles, SlurmView, wait_until
from schemas.messages import Diagnosis

READY_TIMEOUT_S = 180.0  # a requeued job's tasks: scheduled, python and torch imported, gloo up
HANG_TIMEOUT_S = 120.0
STRAGGLER_TIMEOUT_S = 180.0
STOP_S, PERIOD_S = 0.03, 0.1  # the straggler's duty cycle: stopped 30 ms of every 100
SETTLE_STEPS = 20  # the run trains this many steps before a fault (one checkpoint more)
RELEASE_TIMEOUT_S = 30.0
READY_TRIES = 3


class _RunChanged(DemoError):
    """The job was requeued while the demo waited for its run to train."""


class Throttle:
    """A SIGSTOP/SIGCONT duty cycle on some pids, in a thread, until `stop`."""

    def __init__(self, pids: Collection[int]) -> None:
        self._pids = tuple(pids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="c4-throttle", daemon=True)

    def start(self) -> Throttle:
        """Begin the duty cycle."""
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            if not _signal(self._pids, signal.SIGSTOP):
                return
            time.sleep(STOP_S)
            _signal(self._pids, signal.SIGCONT)
            time.sleep(PERIOD_S - STOP_S)

    def stop(self) -> None:
        """End the duty cycle and leave the pids running."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        _signal(self._pids, signal.SIGCONT)


def _signal(pids: Collection[int], signum: signal.Signals) -> bool:
    """Send ``signum`` to each pid still there; whether any was."""
    sent = False
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            continue
        sent = True
    return sent


def firing(feed: Feed, job: str) -> list[Diagnosis]:
    """The job's firing findings so far, each once, oldest first."""
    seen: dict[str, Diagnosis] = {}
    for diagnosis in feed.view().diagnoses:
        if diagnosis.state == "firing" and diagnosis.job == job:
            seen.setdefault(diagnosis.id, diagnosis)
    return sorted(seen.values(), key=lambda d: (d.ts_ns, d.id))


def suspect_node(diagnosis: Diagnosis) -> str | None:
    """The node of a finding's top suspect (``node-001/gpu0`` -> ``node-001``)."""
    return diagnosis.suspects[0].id.split("/", 1)[0] if diagnosis.suspects else None


@dataclass(frozen=True, slots=True)
class Run:
    """One run of the job (a restart count) as it trains: its nodes and ranks."""

    restart: int
    nodes: tuple[str, ...]
    ranks: Mapping[int, tuple[int, str]]  # rank -> (pid, node)

    def pids_on(self, node: str) -> tuple[int, ...]:
        """Every rank's pid on ``node``."""
        return tuple(pid for pid, where in self.ranks.values() if where == node)


class Faults:
    """Injects the faults into the demo's job and follows each to the job's next run."""

    def __init__(
        self,
        view: SlurmView,
        feed: Feed,
        job: str,
        files: JobFiles,
        release: Callable[[str], tuple[int, str]],
        check: Callable[[], None],
        say: Say,
    ) -> None:
        self._view = view
        self._feed = feed
        self._job = job
        self._files = files
        self._release = release  # `c4 state release ID --config`: (exit status, output)
        self._check = check  # raises when a worker died
        self._say = say
        self._stopped: list[int] = []
        self._throttle: Throttle | None = None
        self._since_ns = time.time_ns()  # a placement older than this is an earlier run's
        self.restart = 0
        self.started_ns: int | None = None  # when the job was first seen running

    # --- the job trains -----------------------------------------------------------------
    def ready(self) -> Run:
        """The current run, once Slurm runs it, every rank reported where it runs, c4 has its
        placement and it trained `SETTLE_STEPS` steps. A run requeued meanwhile (by a finding
        with no fault behind it) is followed to the next one, a few times at most."""
        for _ in range(READY_TRIES - 1):
            try:
                return self._ready_once()
            except _RunChanged as changed:
                self._say(f"  job {self._job} requeued before a fault was injected: {changed}")
        return self._ready_once()

    def _ready_once(self) -> Run:
        job = self._job

        def running() -> tuple[str, ...] | None:
            info = self._view.job(job)
            if info.state in ENDED_STATES:
                message = f"job {job} ended {info.state} while the demo waited for it to run"
                raise DemoError(message)
            if info.state == "RUNNING" and info.restarts >= self.restart:
                if self.started_ns is None:
                    self.started_ns = time.time_ns()
                self.restart = info.restarts
                return tuple(self._view.nodes_of(info))
            return None

        nodes = wait_until(running, READY_TIMEOUT_S, f"job {job} running", self._check)
        restart = self.restart

        def still() -> None:
            self._check()
            info = self._view.job(job)
            if info.state != "RUNNING" or info.restarts != restart:
                message = f"run {restart} is {info.state}, restart count {info.restarts}"
                raise _RunChanged(message)

        def ranks() -> dict[int, tuple[int, str]] | None:
            found = self._files.ranks(restart)
            return found if {node for _, node in found.values()} == set(nodes) else None

        placed = wait_until(ranks, READY_TIMEOUT_S, f"the ranks of run {restart}", still)
        wait_until(self._placement(nodes), 60, f"c4's placement of job {job}", still)
        first = wait_until(
            lambda: self._files.progress(restart), READY_TIMEOUT_S, "training steps", still
        )

        def trained() -> bool | None:
            step = self._files.progress(restart)
            return True if step is not None and step >= first + SETTLE_STEPS else None

        wait_until(trained, READY_TIMEOUT_S, f"{SETTLE_STEPS} training steps", still)
        return Run(restart, nodes, placed)

    def _placement(self, nodes: tuple[str, ...]) -> Callable[[], bool | None]:
        def placed() -> bool | None:
            for job in self._feed.view().jobs:
                where = {place.node for place in job.ranks}
                if job.job == self._job and job.ts_ns >= self._since_ns and where == set(nodes):
                    return True
            return None

        return placed

    # --- the faults ---------------------------------------------------------------------
    def hang(self, index: int) -> FaultRecord:
        """Stop every rank of one node of the running job; follow it to the next run."""
        run = self.ready()
        culprit = run.ranks[1 + index % (len(run.ranks) - 1)][1]  # never rank 0's node
        pids = run.pids_on(culprit)
        seen = {d.id for d in firing(self._feed, self._job)}
        record = self._record("hang", culprit, pids)
        self._stopped.extend(pids)
        _signal(pids, signal.SIGSTOP)
        self._say(f"hang {index + 1}: SIGSTOP every rank on {culprit} (pids {_pids(pids)})")
        self._follow(record, seen, HANG_CLASSES, HANG_TIMEOUT_S)
        return record

    def straggler(self) -> FaultRecord:
        """Throttle one node's ranks until a noncomm_slow names it; follow it to the next run."""
        run = self.ready()
        culprit = run.ranks[max(run.ranks)][1]
        pids = run.pids_on(culprit)
        seen = {d.id for d in firing(self._feed, self._job)}
        self._throttle = throttle = Throttle(pids)
        record = self._record("straggler", culprit, pids)
        throttle.start()
        self._say(
            f"straggler: SIGSTOP/SIGCONT {STOP_S * 1000:.0f} ms of every {PERIOD_S * 1000:.0f}"
            f" on {culprit} (pids {_pids(pids)}) until a noncomm_slow names it"
        )
        try:
            self._follow(record, seen, STRAGGLER_CLASSES, STRAGGLER_TIMEOUT_S, throttle.stop)
        finally:
            throttle.stop()
        return record

    def _record(self, kind: FaultKind, culprit: str, pids: tuple[int, ...]) -> FaultRecord:
        now = time.time_ns()
        self._since_ns = now
        return FaultRecord(kind, culprit, pids, now, self.restart)

    def _follow(
        self,
        record: FaultRecord,
        seen: set[str],
        classes: frozenset[str],
        timeout_s: float,
        on_found: Callable[[], None] = lambda: None,
    ) -> None:
        """Poll c4's findings and Slurm until the job runs again (or ends, or time is up)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._check()
            if record.diagnosis is None and self._find(record, seen, classes):
                on_found()
                self._say(
                    f"  {record.diagnosis} {record.suspect} after "
                    f"{(record.latency_ns or 0) / NS_PER_S:.1f} s"
                )
            if record.drained_ns is None and self._view.node(record.culprit).drained:
                record.drained_ns = time.time_ns()
                record.reason, record.sinfo_line = self._view.reason(record.culprit)
                self._say(f"  {record.culprit} drained: {record.reason}")
            info = self._view.job(self._job)
            now = time.time_ns()
            record.job_state = info.state
            again = info.restarts > record.restarts_before
            if record.requeued_ns is None and (again or info.state != "RUNNING"):
                record.requeued_ns = now
            if info.state == "RUNNING" and again:
                record.running_ns, record.restarts = now, info.restarts
                record.nodes_after = tuple(self._view.nodes_of(info))
                self.restart = info.restarts
                self._say(
                    f"  job {self._job} running again (restart {info.restarts}) on "
                    f"{', '.join(record.nodes_after)}"
                )
                break
            if info.state in ENDED_STATES:
                record.restarts = info.restarts
                record.problem = f"job {self._job} ended {info.state} before it ran again" + (
                    ": give it more --steps" if info.state == "COMPLETED" else ""
                )
                break
            if time.monotonic() >= deadline:
                record.problem = f"job {self._job} did not run again within {timeout_s:.0f} s"
                break
            time.sleep(POLL_S)
        if record.diagnosis is None:  # the feed may trail Slurm by a moment
            end = time.monotonic() + 10
            while time.monotonic() < end and not self._find(record, seen, classes):
                time.sleep(0.2)
        if record.problem:
            self._say(f"  {record.problem}")

    def _find(self, record: FaultRecord, seen: set[str], classes: frozenset[str]) -> bool:
        for diagnosis in firing(self._feed, self._job):
            if (
                diagnosis.id not in seen
                and diagnosis.class_ in classes
                and suspect_node(diagnosis) == record.culprit
            ):
                record.diagnosis_id, record.diagnosis = diagnosis.id, diagnosis.class_
                record.suspect = diagnosis.suspects[0].id
                record.diagnosis_ts_ns = diagnosis.ts_ns
                return True
        return False

    # --- giving nodes back --------------------------------------------------------------
    def give_back(self, record: FaultRecord) -> None:
        """``c4 state release`` what c4 isolated for the fault, its drain in Slurm too."""
        if record.reason is None or not record.reason.startswith("c4:"):
            return
        part = drained_for(record.reason) or record.culprit
        code, said = self._release(part)
        record.released = said
        if code != 0:
            record.problem = record.problem or f"c4 state release {part} failed: {said}"
            self._say(f"  {record.problem}")
            return

        def resumed() -> bool | None:
            return True if not self._view.node(record.culprit).drained else None

        wait_until(resumed, RELEASE_TIMEOUT_S, f"{record.culprit} resumed", self._check)
        self._say(f"  {part} released: {said}")

    def wait_end(self, timeout_s: float) -> None:
        """Until the job has ended (completed, one hopes)."""

        def ended() -> str | None:
            state = self._view.job(self._job).state
            return state if state in ENDED_STATES else None

        wait_until(ended, timeout_s, f"job {self._job} to end", self._check)

    def others(self, records: list[FaultRecord], started_ns: int) -> list[FalseFinding]:
        """The job's firing findings that name no fault's node while it was out, with what
        the action worker did about each."""
        explained = {r.diagnosis_id for r in records}
        view = self._feed.view()
        out = []
        for diagnosis in firing(self._feed, self._job):
            if diagnosis.id in explained:
                continue
            node = suspect_node(diagnosis)
            if any(
                node == r.culprit
                and diagnosis.ts_ns >= r.injected_ns
                and diagnosis.ts_ns <= (r.running_ns or diagnosis.ts_ns)
                for r in records
            ):
                continue  # a second finding of the same fault
            actions = tuple(
                f"{a.action} {a.target} {a.status}"
                + ("" if a.status == "done" else f" ({a.detail.get('reason', '')})")
                for a in view.actions
                if a.diagnosis == diagnosis.id and a.action != "alert"
            )
            out.append(
                FalseFinding(
                    diagnosis.id,
                    diagnosis.class_,
                    diagnosis.suspects[0].id if diagnosis.suspects else "-",
                    diagnosis.ts_ns - started_ns,
                    actions,
                    any(
                        a.action == "isolate" and a.status == "done"
                        for a in view.actions
                        if a.diagnosis == diagnosis.id
                    ),
                )
            )
        return out

    def close(self) -> None:
        """End a duty cycle and continue every pid this demo stopped (Slurm ends them)."""
        if self._throttle is not None:
            self._throttle.stop()
        _signal(self._stopped, signal.SIGCONT)


def _pids(pids: tuple[int, ...]) -> str:
    return ", ".join(str(pid) for pid in pids)


def release_command(
    config: Path, env: Mapping[str, str], cwd: Path
) -> Callable[[str], tuple[int, str]]:
    """``c4 state release ID --config CONFIG`` as a subprocess: (exit status, its output)."""

    def release(part: str) -> tuple[int, str]:
        done = subprocess.run(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "c4.cli", "state", "release", part, "--config", str(config)],
            capture_output=True,
            text=True,
            env=dict(env),
            cwd=cwd,
            timeout=120,
            check=False,
        )
        said = " ".join((done.stdout + done.stderr).split())
        return done.returncode, said

    return release
