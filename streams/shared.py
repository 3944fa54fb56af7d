"""Facts one partition learns and every worker needs: placements, port health, route plans.

Scaled out, a job's collective messages and the link messages of the nodes it runs on land
on different workers. These few, small, slowly changing facts are written to one table that
every worker holds entirely (a Faust GlobalTable), on change only, and read by the engine
through `streams.core.engine.SharedFacts`. Nothing here imports Faust: the table is a mapping.
"""

from __future__ import annotations

import secrets
from collections.abc import MutableMapping

from schemas.base import C4Model
from schemas.messages import Job, Link, Route
from streams.core.engine import Engine
from streams.core.places import gpu_id, port_id

FactTable = MutableMapping[bytes, bytes]

# The keys of a placement: a NIC port's job, a GPU's job.
_PLACE_KEYS = (b"port:", b"gpu:")
# Tokens rewritten (a fresh random value) after every change of a kind of fact, whichever
# worker made it: what a reader computed from those facts holds while the token it read is
# still there. A fresh value, not a counter, so that two workers changing facts at once
# cannot both write the same next number; it comes after the fact on the table's one
# changelog partition, so whoever reads the new token has the new fact.
_ROUTES_STAMP_KEY = "stamp:routes"
_HEALTH_STAMP_KEY = "stamp:health"
_HEALTHY = b"00"  # a port's health: down, degraded


class TableFacts:
    """`SharedFacts` read from, and learnt into, a table of small byte values."""

    def __init__(self, table: FactTable) -> None:
        self._table = table
        # The health this worker last wrote of each port its nodes reported: every link
        # report asks, and a table read per report was 5 % of a live worker. Only the
        # port's node writes its health; forgotten when partitions go (`forget_written`),
        # since the next owner writes it then.
        self._health_written: dict[str, str] = {}

    def _lookup(self, key: str) -> bytes | None:
        encoded = key.encode()
        # Asked first: a Faust table's ``get`` raises and catches KeyError on a miss, and
        # most keys asked (a connection's planned route) are misses: 5 % of a live worker.
        return self._table[encoded] if encoded in self._table else None

    def _get(self, key: str) -> str | None:
        value = self._lookup(key)
        return None if value is None else value.decode("utf-8", errors="replace")

    def _set(self, key: str, value: str, absent: bytes | None = None) -> bool:
        """Write on change only (it is a changelog); whether the value changed. ``absent``:
        the value a missing key stands for (writing it changes nothing)."""
        encoded = value.encode()
        known = self._lookup(key)
        if (known if known is not None else absent) == encoded:
            return False
        self._table[key.encode()] = encoded
        return True

    def _token(self, key: str) -> int:
        value = self._lookup(key)
        return int(value) if value is not None and value.isdigit() else 0

    def _renew(self, key: str) -> None:
        self._table[key.encode()] = str(secrets.randbits(62)).encode()

    # --- SharedFacts ---------------------------------------------------------------------
    def job_of_port(self, port: str) -> str | None:
        """The job using a NIC port."""
        return self._get(f"port:{port}")

    def job_of_gpu(self, gpu: str) -> str | None:
        """The job running on a GPU."""
        return self._get(f"gpu:{gpu}")

    def port_health(self, port: str) -> tuple[bool, bool]:
        """(down, degraded) as the port's node last said."""
        value = self._get(f"health:{port}") or _HEALTHY.decode()
        return value[:1] == "1", value[1:2] == "1"

    def via(self, flow: str) -> str | None:
        """The planned spine of a flow."""
        return self._via_entry(flow)[0]

    def moved_at(self, flow: str) -> int | None:
        """When a plan last moved the flow (event time of the worker that learnt it)."""
        return self._via_entry(flow)[1]

    def routes_token(self) -> int:
        """Changes whenever some flow's ``moved_at`` changes, on any worker."""
        return self._token(_ROUTES_STAMP_KEY)

    def health_token(self) -> int:
        """Changes whenever some port's ``port_health`` changes, on any worker."""
        return self._token(_HEALTH_STAMP_KEY)

    def _via_entry(self, flow: str) -> tuple[str | None, int | None]:
        # "spine|moved_ns": either part may be empty (unplanned; never moved).
        value = self._get(f"via:{flow}")
        if value is None:
            return None, None
        via, _, moved = value.partition("|")
        return via or None, int(moved) if moved.isdigit() else None

    # --- learning ------------------------------------------------------------------------
    def learn(self, message: C4Model, engine: Engine) -> None:
        """Record what a message (already processed by ``engine``) tells other workers."""
        if isinstance(message, Job):
            self._learn_job(message)
        elif isinstance(message, Route):
            moves = False
            for path in message.paths:
                known = self._get(f"via:{path.flow}")
                via, moved = self._via_entry(path.flow)
                if known is not None and via != path.via:
                    moved = engine.now_ns
                    moves = True
                self._set(f"via:{path.flow}", f"{path.via or ''}|{moved or ''}")
            if moves:
                self._renew(_ROUTES_STAMP_KEY)
        elif isinstance(message, Link):
            port = port_id(message.node, message.port)
            down, degraded = engine.port_state(port)
            health = f"{int(down)}{int(degraded)}"
            if self._health_written.get(port) == health:
                return
            self._health_written[port] = health
            # A port never written is healthy (`port_health`): a healthy cluster writes
            # nothing, and readers' caches keyed by the health token hold.
            if self._set(f"health:{port}", health, absent=_HEALTHY):
                self._renew(_HEALTH_STAMP_KEY)

    def forget_written(self) -> None:
        """Partitions went elsewhere: what this worker wrote may be rewritten by others."""
        self._health_written.clear()

    def placed_through(self, partition: int) -> int:
        """How far (next offset) the job topic's ``partition`` is learnt into the table."""
        value = self._get(f"placed:{partition}")
        return int(value) if value is not None and value.isdigit() else 0

    def learn_placed_through(self, partition: int, next_offset: int) -> None:
        """The placements of ``partition`` before ``next_offset`` are in the table.

        Written by the partition's owner after the placements themselves: the table's one
        changelog partition keeps that order, so a worker that reads this has them too.
        """
        if next_offset > self.placed_through(partition):
            self._set(f"placed:{partition}", str(next_offset))

    def _learn_job(self, job: Job) -> None:
        mine = job.job.encode()
        rows = list(self._table.items())
        for key in [k for k, v in rows if v == mine and k.startswith(_PLACE_KEYS)]:
            del self._table[key]
        if job.state == "stopped":
            return
        for place in job.ranks:
            if place.gpu is not None:
                self._set(f"gpu:{gpu_id(place.node, place.gpu)}", job.job)
            if place.port is not None:
                self._set(f"port:{port_id(place.node, place.port)}", job.job)
