"""Detector state that outlives the worker: snapshots in changelog-backed tables.

The Faust app hands this module plain mappings (its tables); nothing here imports Faust, so
the restore logic is tested with dicts. A job's state is keyed by the job (the key of its
collective and job messages), a node's hardware state by the node (the key of its link and
gpu messages): a table partition travels with its topic partition on a rebalance, so the
worker that takes a partition over finds the state of exactly its jobs and nodes.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from schemas.base import C4Model
from schemas.messages import Collective, Collectives, Diagnosis, Gpu, Job, Link, Member
from streams.core.hardware import node_of
from streams.core.snapshot import (
    SnapshotError,
    StateTable,
    delete_snapshot,
    is_part_key,
    read_snapshot,
    write_snapshot,
)
from streams.live import LiveDetection

log = logging.getLogger(__name__)

HARDWARE_CLASSES = frozenset({"link_down", "gpu_fault"})
# The share of wall time periodic snapshots may take: the interval stretches to keep to it.
SNAPSHOT_BUDGET = 0.1


@dataclass(slots=True)
class SnapshotCounters:
    """Snapshots written and restored, and blobs that could not be read back."""

    written: int = 0
    restored: int = 0
    unreadable: int = 0


def owner_key(message: C4Model) -> tuple[str, str] | None:
    """("job", id) or ("node", id): whose state a message changes; None for shared facts."""
    if isinstance(message, Collective | Collectives | Job | Member):
        return "job", message.job
    if isinstance(message, Link | Gpu):
        return "node", message.node
    return None


class DurableDetection:
    """`LiveDetection` whose per-job and per-node state is kept in two state tables.

    ``owns(kind, key)`` says whether this worker holds the partition of a job or node now;
    state of anything else in the tables (a standby copy, a partition just revoked) is left
    alone.
    """

    def __init__(
        self,
        live: LiveDetection,
        job_states: StateTable,
        node_states: StateTable,
        owns: Callable[[str, str], bool],
        *,
        snapshot_interval_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.live = live
        self.engine = live.engine
        self._tables = {"job": job_states, "node": node_states}
        self._owns = owns
        self._interval_s = snapshot_interval_s
        self._monotonic = monotonic
        self._last_save = monotonic()
        self._save_cost_s = 0.0  # how long the last snapshot round took
        self._dirty: set[tuple[str, str]] = set()
        # Ids this worker took over or looked up already: not read from the table again.
        self._adopted: set[tuple[str, str]] = set()
        self.counters = SnapshotCounters()

    # --- input ---------------------------------------------------------------------------
    def on_message(self, message: C4Model) -> list[Diagnosis]:
        """One decoded message: restore its job or node first if this worker just got it."""
        owner = owner_key(message)
        if owner is not None:
            self._adopt(owner)
            self._dirty.add(owner)
        found = self.live.on_message(message)
        if found:
            self._dirty.update(self._owners_of(found))
            self.save(self._dirty)
        return found

    def on_timer(self) -> list[Diagnosis]:
        """Take over what the tables hold for newly owned partitions; tick; save."""
        self.adopt_owned()
        found = self.live.on_timer()
        if found:
            self._dirty.update(self._owners_of(found))
            self.save(self._dirty)
        elif self._monotonic() - self._last_save >= self.snapshot_every_s():
            self.save(self._dirty)
        return found

    def snapshot_every_s(self) -> float:
        """The periodic snapshot interval now: the configured one, or longer while a round
        of snapshots costs more than `SNAPSHOT_BUDGET` of it."""
        return max(self._interval_s, self._save_cost_s / SNAPSHOT_BUDGET)

    def on_revoked(self, kind: str, keys: Iterable[str]) -> None:
        """Partitions went to another worker: forget their jobs or nodes (not their state)."""
        keys = list(keys)
        if keys:
            log.info("partitions revoked: handing over %d %s(s)", len(keys), kind)
        for key in keys:
            owner = (kind, key)
            if owner in self._dirty:
                self.save([owner])
            if kind == "job":
                self.engine.drop_job(key)
            else:
                self.engine.drop_node(key)
            self._adopted.discard(owner)

    def held(self, kind: str) -> list[str]:
        """The jobs or nodes whose state this worker holds now."""
        if kind == "job":
            # Also a job whose every report waits for link reports (no detector yet).
            return list(dict.fromkeys((*self.engine.jobs, *self.engine.alignment.waiting)))
        return sorted(self.engine.hardware.nodes())

    # --- state ---------------------------------------------------------------------------
    def adopt_owned(self) -> None:
        """Restore every job and node of the tables that this worker owns and lacks."""
        for kind, table in self._tables.items():
            for raw in list(table.keys()):
                if is_part_key(raw):
                    continue  # a part of a large snapshot, read with its head
                key = raw.decode("utf-8", errors="replace")
                if (kind, key) not in self._adopted and self._owns(kind, key):
                    self._adopt((kind, key))

    def _adopt(self, owner: tuple[str, str]) -> None:
        if owner in self._adopted:
            return
        self._adopted.add(owner)
        kind, key = owner
        try:
            state = read_snapshot(self._tables[kind], key.encode())
            if state is None:
                return
            if kind == "job":
                self.engine.restore_job(key, state)
            else:
                self.engine.restore_node(state)
        except (SnapshotError, KeyError, TypeError, ValueError) as error:
            # A state we cannot read is relearnt, never trusted half-way.
            self.counters.unreadable += 1
            log.warning("could not restore %s %s from its snapshot: %s", kind, key, error)
            if kind == "job":
                self.engine.drop_job(key)
            else:
                self.engine.drop_node(key)
            return
        self.counters.restored += 1
        self.live.metrics.restored.inc()
        log.info("took over %s %s from its snapshot", kind, key)

    def save(self, owners: Iterable[tuple[str, str]]) -> None:
        """Write the state of these jobs and nodes (one gone: its key deleted)."""
        owners = list(owners)
        started = self._monotonic()
        nodes = {key for kind, key in owners if kind == "node"}
        node_states = self.engine.node_states(nodes) if nodes else {}
        for kind, key in owners:
            state = self.engine.job_state(key) if kind == "job" else node_states.get(key)
            table = self._tables[kind]
            if state is None:
                delete_snapshot(table, key.encode())
            else:
                write_snapshot(table, key.encode(), state)
                self.counters.written += 1
                self.live.metrics.snapshots.inc()
            self._dirty.discard((kind, key))
        self._last_save = self._monotonic()
        self._save_cost_s = self._last_save - started

    @staticmethod
    def _owners_of(found: list[Diagnosis]) -> set[tuple[str, str]]:
        owners: set[tuple[str, str]] = set()
        for diagnosis in found:
            hardware = diagnosis.class_ in HARDWARE_CLASSES or (
                diagnosis.class_ == "link_degraded" and diagnosis.suspects[0].type == "port"
            )
            if hardware and diagnosis.suspects:
                owners.add(("node", node_of(diagnosis.suspects[0].id)))
            elif diagnosis.job is not None:
                owners.add(("job", diagnosis.job))
        return owners
