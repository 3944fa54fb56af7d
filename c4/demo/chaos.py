"""``c4 demo --chaos``: kill -9 each of the system's processes once, at random moments.

One at a time, in a random order and after a random pause: the streams worker, the actions
worker, the node agent, the Kafka broker and Redis are killed with SIGKILL and started
again. A kill is over when the process is back and the pipeline has caught up (`PipelineWatch`):
every record the simulator handed to the agent more than `BEHIND_S` ago is in Kafka, the
streams worker is no further behind the log than the records of that span, and the actions
worker has handled every diagnosis. The time from the kill to that moment is its recovery
time; the next kill waits for it.
"""

from __future__ import annotations

import random
import threading
import time
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
from confluent_kafka import Consumer, KafkaException, TopicPartition

from c4.dashboard.feed import CLIENT_LOG
from c4.demo import DemoError
from c4.demo.processes import Child, port_answers
from c4.settings import Settings
from c4.stack import stack_kill, stack_up
from schemas.messages import Action, Diagnosis

TARGETS = ("streams worker", "actions worker", "node agent", "kafka", "redis")
RESTART_AFTER_S = 1.0  # a crashed process is back after a second (a supervisor's restart)
BEHIND_S = 2.0  # caught up: at most this far behind the simulator
RECOVERY_LIMIT_S = 120.0


class Target(Protocol):
    """A process the chaos run kills and starts again."""

    name: str

    def kill(self) -> None:
        """kill -9, and wait until it is gone."""
        ...

    def restart(self) -> None:
        """Start it again (may return before it is ready)."""
        ...

    def back(self) -> bool:
        """Whether it runs and serves again."""
        ...


@dataclass(slots=True)
class ChildTarget:
    """A worker or agent subprocess; served again when its port answers (if it has one)."""

    name: str
    child: Child
    port: int | None = None

    def kill(self) -> None:
        self.child.kill()

    def restart(self) -> None:
        self.child.restart()

    def back(self) -> bool:
        return self.child.alive and (self.port is None or port_answers(self.port))


@dataclass(slots=True)
class StackTarget:
    """Kafka or Redis of the local stack: killed by pid, started again by ``stack_up``."""

    name: str
    settings: Settings
    _starting: threading.Thread | None = None
    error: str | None = None

    def kill(self) -> None:
        stack_kill(self.settings, self.name)

    def restart(self) -> None:
        self._starting = threading.Thread(target=self._start, name=f"c4-chaos-{self.name}")
        self._starting.start()

    def _start(self) -> None:
        try:
            stack_up(self.settings)
        except Exception as error:  # noqa: BLE001 - reported by the run as one line
            self.error = f"{type(error).__name__}: {error}"

    def back(self) -> bool:
        if self.error is not None:
            message = f"{self.name} did not start again: {self.error}"
            raise ChaosFailed(message)
        settings = self.settings
        port = settings.stack_kafka_port if self.name == "kafka" else settings.stack_redis_port
        return self._starting is not None and not self._starting.is_alive() and port_answers(port)


class ChaosFailed(DemoError):
    """A killed process did not come back, or the pipeline did not catch up in time."""


@dataclass(slots=True)
class Kill:
    """One kill: when, what, and how long until the pipeline had recovered."""

    target: str
    pause_s: float  # after the previous recovery (or the start)
    killed_at: float | None = None  # monotonic
    restarted_at: float | None = None
    back_s: float | None = None  # kill -> the process serves again
    recovered_s: float | None = None  # kill -> the pipeline caught up


def kill_plan(seed: int, first_s: tuple[float, float], pause_s: tuple[float, float]) -> list[Kill]:
    """Every target once, in a random order, each after a random pause."""
    rng = random.Random(seed)  # noqa: S311 - a test schedule, not a secret
    order = list(TARGETS)
    rng.shuffle(order)
    kills = []
    for index, target in enumerate(order):
        low, high = first_s if index == 0 else pause_s
        kills.append(Kill(target, round(rng.uniform(low, high), 1)))
    return kills


class Chaos:
    """Drives the kill plan from the demo's watch loop (`step` every fraction of a second)."""

    def __init__(
        self,
        kills: list[Kill],
        targets: dict[str, Target],
        caught_up: Callable[[float], bool],
        say: Callable[[str], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        missing = [kill.target for kill in kills if kill.target not in targets]
        if missing:
            message = f"no process to kill for {', '.join(missing)}"
            raise ChaosFailed(message)
        self.kills = kills
        self._targets = targets
        self._caught_up = caught_up
        self._say = say
        self._monotonic = monotonic
        self._index = 0
        self._since = monotonic()

    @property
    def holding(self) -> str | None:
        """The target killed and not yet back (its process may be missing meanwhile)."""
        if self.done:
            return None
        kill = self.kills[self._index]
        return kill.target if kill.killed_at is not None and kill.back_s is None else None

    @property
    def done(self) -> bool:
        """Whether every kill is over (its process back, the pipeline caught up)."""
        return self._index >= len(self.kills)

    def step(self) -> None:
        """Kill, restart or check for recovery, as due."""
        if self.done:
            return
        now = self._monotonic()
        kill = self.kills[self._index]
        target = self._targets[kill.target]
        if kill.killed_at is None:
            if now - self._since >= kill.pause_s:
                target.kill()
                kill.killed_at = self._monotonic()
                self._say(f"chaos: kill -9 {kill.target}")
            return
        if kill.restarted_at is None:
            if now - kill.killed_at >= RESTART_AFTER_S:
                target.restart()
                kill.restarted_at = now
            return
        if kill.back_s is None:
            if target.back():
                kill.back_s = now - kill.killed_at
        elif self._caught_up(kill.killed_at):
            kill.recovered_s = now - kill.killed_at
            self._say(
                f"chaos: {kill.target} back after {kill.back_s:.1f} s, "
                f"pipeline caught up after {kill.recovered_s:.1f} s"
            )
            self._index += 1
            self._since = now
            return
        if now - kill.killed_at > RECOVERY_LIMIT_S:
            message = f"{kill.target} killed {RECOVERY_LIMIT_S:.0f} s ago: " + (
                "not back" if kill.back_s is None else "the pipeline has not caught up"
            )
            raise ChaosFailed(message)


def recovery_table(kills: Sequence[Kill]) -> list[tuple[str, ...]]:
    """Rows for the closing table (header first): what was killed after how long a pause,
    and how long until it served again and until the pipeline had caught up."""
    rows: list[tuple[str, ...]] = [("kill -9", "pause s", "back after s", "caught up after s")]
    for kill in kills:
        rows.append(
            (
                kill.target,
                f"{kill.pause_s:.1f}",
                "-" if kill.back_s is None else f"{kill.back_s:.1f}",
                "-" if kill.recovered_s is None else f"{kill.recovered_s:.1f}",
            )
        )
    return rows


class PipelineWatch:
    """Whether the pipeline has caught up with the simulator (see the module's docstring).

    ``sample`` is called often; it keeps (time, records sent, bytes handed over) so that
    "what was there `BEHIND_S` ago" can be looked up. ``written`` gives the bytes written
    so far per handoff file; the agent's checkpoint says how far each is delivered, and a
    file the agent deleted was delivered to its end.
    """

    def __init__(
        self,
        handoff: Path,
        checkpoint: Path,
        written: Callable[[], dict[str, int]],
        sent: Callable[[], int],
        streams_metrics_port: int,
        collective_topic: str,
        kafka_config: dict[str, str | int | float | bool],
        actions_group: str,
        diagnosis_topic: str,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._handoff, self._checkpoint = handoff, checkpoint
        self._written, self._sent = written, sent
        self._metrics_url = f"http://127.0.0.1:{streams_metrics_port}/metrics"
        self._lag_line = f'c4_stream_consumer_lag{{topic="{collective_topic}"}} '
        self._kafka_config = kafka_config
        self._actions_group, self._diagnosis_topic = actions_group, diagnosis_topic
        self._monotonic = monotonic
        self._history: deque[tuple[float, int, int]] = deque(maxlen=4000)
        self.last_reason = "not checked yet"

    def sample(self) -> None:
        """Note what the simulator has sent and handed over so far."""
        self._history.append((self._monotonic(), self._sent(), sum(self._written().values())))

    def _then(self, at: float) -> tuple[int, int] | None:
        """(records sent, bytes handed over) as of the last sample at or before ``at``."""
        found = None
        for when, sent, written in self._history:
            if when > at:
                break
            found = (sent, written)
        return found

    def caught_up(self, since: float) -> bool:
        """Whether the pipeline is now at most `BEHIND_S` behind, judged on what was handed
        over after ``since`` (the kill)."""
        now = self._monotonic()
        then = self._then(now - BEHIND_S)
        if then is None or now - BEHIND_S < since:
            self.last_reason = "too soon after the kill"
            return False
        sent_then, written_then = then
        delivered = self._delivered_bytes()
        if delivered is None or delivered < written_then:
            self.last_reason = f"agent: delivered {delivered} of {written_then} bytes"
            return False
        lag = self._streams_lag()
        allowed = max(50, self._sent() - sent_then)
        if lag is None or lag > allowed:
            self.last_reason = f"streams worker: lag {lag} records (allowed {allowed})"
            return False
        left = self._actions_left()
        if left is None or left > 0:
            self.last_reason = f"actions worker: {left} diagnoses not yet handled"
            return False
        self.last_reason = "caught up"
        return True

    def _delivered_bytes(self) -> int | None:
        try:
            committed = orjson.loads(self._checkpoint.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(committed, dict):
            return None
        total = 0
        for name, size in self._written().items():
            if name in committed:
                total += int(committed[name])
            elif not (self._handoff / name).exists():
                total += size  # deleted: the agent deletes only what it delivered
        return total

    def _streams_lag(self) -> int | None:
        """The streams worker's lag on the collective topic (None: no answer, no figure)."""
        try:
            with urllib.request.urlopen(self._metrics_url, timeout=2) as answer:  # noqa: S310
                text = answer.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(self._lag_line):
                return int(float(line.rsplit(" ", 1)[1]))
        return None

    def _actions_left(self) -> int | None:
        """Diagnoses on the log the actions worker has not committed (None: no answer)."""
        consumer = Consumer(
            {
                **self._kafka_config,
                "group.id": self._actions_group,
                "enable.auto.commit": False,
                "socket.timeout.ms": 2000,
            },
            logger=CLIENT_LOG,  # a broker away is an answer here (None), not log lines
        )
        try:
            metadata = consumer.list_topics(self._diagnosis_topic, timeout=2)
            partitions = [
                TopicPartition(self._diagnosis_topic, p)
                for p in metadata.topics[self._diagnosis_topic].partitions
            ]
            left = 0
            for tp in consumer.committed(partitions, timeout=2):
                _, high = consumer.get_watermark_offsets(tp, timeout=2)
                left += high - max(tp.offset, 0)
            return left
        except (KafkaException, KeyError):
            return None
        finally:
            consumer.close()


def audit(
    diagnoses: Sequence[Diagnosis],
    actions: Sequence[Action],
    spares_before: Iterable[str],
    snapshot: Mapping[str, Any],
) -> list[str]:
    """What the run did twice or leaked, one line each (empty: exactly once throughout).

    A diagnosis (id, state) on the topic more than once; an action done twice for one
    diagnosis and target (a record repeated with its own id is one outcome delivered
    twice, not a second action); a node isolated twice; a spare taken but placed in no
    job (or in two), or placed without a restart that says so.
    """
    problems = []
    for (ident, state), count in Counter((d.id, d.state) for d in diagnoses).items():
        if count > 1:
            problems.append(f"diagnosis {ident} ({state}) published {count} times")
    outcomes = {action.id: action for action in actions if action.status == "done"}
    # An alert goes once per receiver when a finding fires and once when it resolves.
    done = Counter(
        (a.diagnosis, a.action, a.target, a.detail.get("state"), a.detail.get("receiver"))
        for a in outcomes.values()
    )
    for (diagnosis, name, target, finding_state, _), count in done.items():
        if count > 1:
            when = f" ({finding_state})" if finding_state else ""
            problems.append(f"{name} {target} done {count} times for diagnosis {diagnosis}{when}")
    isolated = Counter(a.target for a in outcomes.values() if a.action == "isolate")
    for target, count in isolated.items():
        if count > 1:
            problems.append(f"{target} isolated {count} times")
    placed = []
    for action in outcomes.values():
        replaced = action.detail.get("replaced") if action.action == "restart" else None
        if isinstance(replaced, dict):
            placed += [str(new) for new in replaced.values()]
    taken = sorted(set(spares_before) - set(snapshot.get("spares", ())))
    if sorted(placed) != taken:
        problems.append(f"spares taken from the pool {taken}, placed by restarts {sorted(placed)}")
    jobs_of: Counter[str] = Counter(
        node for job in snapshot.get("jobs", ()) for node in job.get("nodes", ())
    )
    for node in taken:
        if jobs_of[node] != 1:
            problems.append(f"spare {node} taken from the pool but in {jobs_of[node]} jobs")
    return problems
