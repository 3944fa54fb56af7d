"""Detector state that outlives the worker: each key's snapshot in a changelog-backed table.

The Faust app hands this module plain mappings (its tables); nothing here imports Faust, so
the restore logic is tested with dicts. It reads and writes a stage's state only through
`streams.core.stage.DetectionStage` (``snapshot``, ``restore``, ``drop``). A job's state is
keyed by the job (the key of its collective and job messages), a node's hardware state by the
node (the key of its link and gpu messages): a table partition travels with its topic
partition on a rebalance, so the worker that takes a partition over finds the state of
exactly its jobs and nodes.

When state is written: at once when a finding fires or resolves (a restarted worker must not
publish it again), otherwise every ``snapshot_interval_s`` for what changed since, or less
often when writing takes longer than `SNAPSHOT_BUDGET` of the time in between: a worker
holding many large jobs (a 128-rank 3D job's state is 2.8 MB of JSON, 40 ms to build,
encode and compress here) would otherwise spend a third of its time on snapshots while it
drains a backlog. A restarted worker infers what the reports after its snapshot said about
earlier operations (`streams.core.comm`), so a longer gap costs samples, not findings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from schemas.messages import Diagnosis
from streams.core.snapshot import (
    SnapshotError,
    StateTable,
    delete_snapshot,
    is_part_key,
    read_snapshot,
    write_snapshot,
)
from streams.core.stage import DetectionStage, StateKey
from streams.metrics import StreamMetrics

log = logging.getLogger(__name__)

# The share of wall time periodic snapshots may take: the interval stretches to keep to it.
SNAPSHOT_BUDGET = 0.1


@dataclass(slots=True)
class SnapshotCounters:
    """Snapshots written and restored, and blobs that could not be read back."""

    written: int = 0
    restored: int = 0
    unreadable: int = 0


class SnapshotStore:
    """A stage's per-key state in one state table per kind of key (``tables``).

    ``owns(key)`` says whether this worker holds the partition of a key now; state of
    anything else in the tables (a standby copy, a partition just revoked) is left alone.
    A key is taken over from its table the first time this worker sees it (``adopt``), or
    from the timer for every owned key the tables hold (``adopt_owned``).
    """

    def __init__(
        self,
        tables: Mapping[str, StateTable],
        owns: Callable[[StateKey], bool],
        *,
        snapshot_interval_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: StreamMetrics | None = None,
    ) -> None:
        self._tables = dict(tables)
        self._owns = owns
        self._interval_s = snapshot_interval_s
        self._monotonic = monotonic
        self._metrics = metrics or StreamMetrics()
        self._last_save = monotonic()
        self._save_cost_s = 0.0  # how long the last snapshot round took
        self._dirty: set[StateKey] = set()
        # Keys this worker took over or looked up already: not read from the table again.
        self._adopted: set[StateKey] = set()
        self.counters = SnapshotCounters()

    # --- around the stage's input ---------------------------------------------------------
    def before_message(self, stage: DetectionStage, key: StateKey | None) -> None:
        """A message of ``key`` comes: restore the key first if this worker just got it."""
        if key is not None:
            self.adopt(stage, key)
            self._dirty.add(key)

    def after_message(self, stage: DetectionStage, found: list[Diagnosis]) -> None:
        """A finding fired or resolved: its key's state is written at once (a restarted
        worker must not publish it again)."""
        if found:
            self._dirty.update(self._keys_of(stage, found))
            self.save(stage, self._dirty)

    def after_timer(self, stage: DetectionStage, found: list[Diagnosis]) -> None:
        """After the timer: at once what a finding changed, else what changed since the
        last round, once ``snapshot_every_s`` passed."""
        if found:
            self.after_message(stage, found)
        elif self._monotonic() - self._last_save >= self.snapshot_every_s():
            self.save(stage, self._dirty)

    def snapshot_every_s(self) -> float:
        """The periodic snapshot interval now: the configured one, or longer while a round
        of snapshots costs more than `SNAPSHOT_BUDGET` of it."""
        return max(self._interval_s, self._save_cost_s / SNAPSHOT_BUDGET)

    def revoke(self, stage: DetectionStage, keys: Iterable[StateKey]) -> None:
        """Partitions went to another worker: save what changed of their keys, then drop
        them from the stage (not from the tables: the next owner goes on from there)."""
        keys = list(keys)
        if keys:
            log.info("partitions revoked: handing over %d %s(s)", len(keys), keys[0].kind)
        for key in keys:
            if key in self._dirty:
                self.save(stage, [key])
            stage.drop(key)
            self._adopted.discard(key)

    # --- state ---------------------------------------------------------------------------
    def adopt_owned(self, stage: DetectionStage) -> None:
        """Restore every key of the tables that this worker owns and has not taken yet."""
        for kind, table in self._tables.items():
            for raw in list(table.keys()):
                if is_part_key(raw):
                    continue  # a part of a large snapshot, read with its head
                key = StateKey(kind, raw.decode("utf-8", errors="replace"))
                if key not in self._adopted and self._owns(key):
                    self.adopt(stage, key)

    def adopt(self, stage: DetectionStage, key: StateKey) -> None:
        """Restore ``key`` from its table, once (nothing there: it starts afresh)."""
        if key in self._adopted:
            return
        self._adopted.add(key)
        try:
            state = read_snapshot(self._tables[key.kind], key.id.encode())
            if state is None:
                return
            stage.restore(key, state)
        except (SnapshotError, KeyError, TypeError, ValueError) as error:
            # A state we cannot read is relearnt, never trusted half-way.
            self.counters.unreadable += 1
            log.warning("could not restore %s %s from its snapshot: %s", key.kind, key.id, error)
            stage.drop(key)
            return
        self.counters.restored += 1
        self._metrics.restored.inc()
        log.info("took over %s %s from its snapshot", key.kind, key.id)

    def save(self, stage: DetectionStage, keys: Iterable[StateKey]) -> None:
        """Write the state of these keys (one the stage no longer holds: deleted)."""
        keys = list(keys)
        started = self._monotonic()
        states = stage.snapshot(keys)
        for key in keys:
            state = states.get(key)
            table = self._tables[key.kind]
            if state is None:
                delete_snapshot(table, key.id.encode())
            else:
                write_snapshot(table, key.id.encode(), state)
                self.counters.written += 1
                self._metrics.snapshots.inc()
            self._dirty.discard(key)
        self._last_save = self._monotonic()
        self._save_cost_s = self._last_save - started

    @staticmethod
    def _keys_of(stage: DetectionStage, found: list[Diagnosis]) -> set[StateKey]:
        keys = (stage.key_of_finding(diagnosis) for diagnosis in found)
        return {key for key in keys if key is not None}
