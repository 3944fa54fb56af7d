"""``c4 demo --chaos``: kill -9 each of the system's processes once, at random moments.

One at a time, in a random order and after a random pause: the streams worker, the actions
worker, the node agent, the Kafka broker and Redis are killed with SIGKILL and started
again. A kill is over when the process is back and the pipeline has caught up (judged by
`c4.demo.pipeline_watch.PipelineWatch`). The time from the kill to that moment is its
recovery time; the next kill waits for it. `c4.demo.audit` then checks the run did nothing
twice.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from c4.demo import DemoError
from c4.demo.processes import Child
from c4.settings import Settings
from c4.stack import port_answers, stack_kill, stack_up

TARGETS = ("streams worker", "actions worker", "node agent", "kafka", "redis")
RESTART_AFTER_S = 1.0  # a crashed process is back after a second (a supervisor's restart)
RECOVERY_LIMIT_S = 120.0
SEED_ENV = "C4_CHAOS_SEED"  # replays a chaos run: the same kill order and pauses
SEED_RANGE = 1_000_000


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


def chaos_seed(environ: Mapping[str, str]) -> tuple[int, str]:
    """The seed of a chaos run and how to replay it: ``C4_CHAOS_SEED`` when set, else a fresh
    one (each unseeded run tries another order); the second item is the line to print first,
    so that a failing run can be run again exactly as it went."""
    given = environ.get(SEED_ENV, "").strip()
    if given:
        try:
            seed = int(given)
        except ValueError:
            message = f"{SEED_ENV}={given!r} is not an integer seed"
            raise DemoError(message) from None
        source = f"from {SEED_ENV}"
    else:
        seed = random.SystemRandom().randrange(SEED_RANGE)
        source = "drawn for this run"
    return seed, f"chaos seed {seed} ({source}; {SEED_ENV}={seed} replays this run)"


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
