"""`RedisState`: every read and write of the cluster state, over one Redis client.

Multi-key changes go through the Lua scripts of `actions.state.scripts` (atomic); reads are
plain commands. Every Redis failure comes out as `StateUnavailable` so that callers retry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import orjson
import redis
from pydantic import ValidationError

from actions.state import StateError, StateUnavailable
from actions.state import scripts as lua
from actions.state.keys import KINDS, Keys
from schemas.codec import Rejection, decode_object
from schemas.files import Topology
from schemas.messages import Job, RankPlace
from topology import TopologyError
from topology.model import Fabric

P = ParamSpec("P")
R = TypeVar("R")
STATES = ("healthy", "suspect", "isolated", "spare")


@contextmanager
def _redis_errors() -> Iterator[None]:
    try:
        yield
    except redis.RedisError as error:
        message = f"redis: {type(error).__name__}: {error}"
        raise StateUnavailable(message) from error


def _guarded(method: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with _redis_errors():
            return method(*args, **kwargs)

    return wrapper


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Component:
    """One component's recorded state."""

    kind: str
    id: str
    state: str
    epoch: int
    reason: str = ""
    diagnosis: str = ""
    ts_ns: int = 0


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's claim on one diagnosis: the key of its record and its fence token."""

    key: str
    fence: str


@dataclass(frozen=True, slots=True)
class Transition:
    """What a transition script answered: ``ok same unknown fenced stale refused
    rate_limited``, with the epoch, the current state or the limit that was hit."""

    outcome: str
    epoch: int = 0
    state: str = ""
    diagnosis: str = ""
    limit: str = ""


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Per-job and cluster-wide limits on state-changing actions."""

    job: int
    cluster: int
    window_ms: int


class RedisState:
    """The cluster state under one key prefix."""

    def __init__(self, client: redis.Redis, prefix: str = "c4") -> None:
        self.client = client
        self.keys = Keys(prefix)
        self._claim = client.register_script(lua.PRELUDE + lua.CLAIM)
        self._renew = client.register_script(lua.PRELUDE + lua.RENEW)
        self._record = client.register_script(lua.PRELUDE + lua.RECORD)
        self._finish = client.register_script(lua.PRELUDE + lua.FINISH)
        self._transition = client.register_script(lua.PRELUDE + lua.TRANSITION)
        self._allocate = client.register_script(lua.PRELUDE + lua.ALLOCATE)
        self._record_job = client.register_script(lua.PRELUDE + lua.RECORD_JOB)
        self._fabric: tuple[bytes | str, Fabric] | None = None  # the last document read, parsed

    @classmethod
    def connect(cls, url: str, password: str | None = None, prefix: str = "c4") -> RedisState:
        """A client for a Redis URL, with socket timeouts so an outage is seen quickly."""
        client = redis.Redis.from_url(
            url,
            password=password,
            socket_timeout=5,
            socket_connect_timeout=5,
            health_check_interval=10,
        )
        return cls(client, prefix)

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()

    # --- topology, spares, release: the ``c4 state`` commands ------------------------------

    @_guarded
    def load_topology(self, topology: Topology) -> dict[str, int]:
        """Record every component of a topology (states of known ones are kept)."""
        fabric = Fabric.from_topology(topology)
        keys = self.keys
        counts = dict.fromkeys(KINDS, 0)
        pipe = self.client.pipeline(transaction=False)

        def add(kind: str, ident: str, **fields: str | int) -> None:
            key = keys.obj(kind, ident)
            pipe.hsetnx(key, "state", "healthy")
            pipe.hsetnx(key, "epoch", 0)
            for name, value in fields.items():
                pipe.hset(key, name, value)
            pipe.sadd(keys.index(kind), ident)
            counts[kind] += 1

        for node in topology.nodes:
            leaves = sorted({port.leaf for port in node.ports})
            planes = sorted({fabric.plane_of(f"{node.id}/{port.id}").index for port in node.ports})
            add(
                "node",
                node.id,
                leaves=",".join(leaves),
                planes=",".join(str(plane) for plane in planes),
                gpus=str(node.gpus),
            )
            for gpu in range(node.gpus):
                add("gpu", f"{node.id}/gpu{gpu}")
            for port in node.ports:
                add("port", f"{node.id}/{port.id}", leaf=port.leaf)
        for switch in fabric.leaves + fabric.spines:
            add("switch", switch)
        for link in topology.links:
            add("link", link.id, a=link.a, b=link.b)
        pipe.set(keys.topology, orjson.dumps(topology.model_dump(by_alias=True)))
        pipe.execute()
        return counts

    @_guarded
    def fabric(self) -> Fabric | None:
        """The fabric of the topology last loaded, None when none was; `StateError` if invalid.

        The document is read each time (a reload takes effect at once) and parsed only when
        it changed.
        """
        raw = self.client.get(self.keys.topology)
        if raw is None:
            return None
        if self._fabric is not None and self._fabric[0] == raw:
            return self._fabric[1]
        try:
            topology = decode_object(orjson.loads(raw), "topology")
            if isinstance(topology, Rejection):
                raise StateError(topology.reason)
            if not isinstance(topology, Topology):
                error = "not a topology document"
                raise StateError(error)
            fabric = Fabric.from_topology(topology)
        except (orjson.JSONDecodeError, StateError, TopologyError) as error:
            message = f"{self.keys.topology} holds no valid topology: {error}".splitlines()[0]
            raise StateError(message) from None
        self._fabric = (raw, fabric)
        return fabric

    @_guarded
    def kind_of(self, ident: str) -> str | None:
        """Which kind of component an id is, or None when the topology does not have it."""
        pipe = self.client.pipeline(transaction=False)
        for kind in KINDS:
            pipe.sismember(self.keys.index(kind), ident)
        for kind, present in zip(KINDS, pipe.execute(), strict=True):
            if present:
                return kind
        return None

    @_guarded
    def component(self, kind: str, ident: str) -> Component | None:
        """One component's state, or None when unknown."""
        fields = self.client.hmget(
            self.keys.obj(kind, ident), ["state", "epoch", "reason", "diagnosis", "ts_ns"]
        )
        if fields[1] is None:
            return None
        state, epoch, reason, diagnosis, ts_ns = (_text(f) if f is not None else "" for f in fields)
        return Component(kind, ident, state, int(epoch), reason, diagnosis, int(ts_ns or 0))

    @_guarded
    def jobs_of_node(self, node: str) -> list[str]:
        """The recorded jobs (not stopped) that have a rank on a node."""
        found = []
        for raw in sorted(self.client.smembers(self.keys.jobs)):
            job = _text(raw)
            if _text(self.client.hget(self.keys.job(job), "state") or b"") == "stopped":
                continue
            places = self.client.hvals(self.keys.job_ranks(job))
            if any(_text(place).split("|", 1)[0] == node for place in places):
                found.append(job)
        return found

    def transition(
        self,
        kind: str,
        ident: str,
        to: str,
        *,
        action: str,
        reason: str,
        ts_ns: int,
        now_ms: int,
        actor: str,
        diagnosis: str = "",
        allowed_from: Iterable[str] = (),
        expected_epoch: int | None = None,
        claim: Claim | None = None,
        job: str | None = None,
        limits: RateLimits | None = None,
        rate_member: str = "",
        only_own: bool = False,
    ) -> Transition:
        """Change one component's state atomically (see scripts.TRANSITION)."""
        keys = self.keys
        with _redis_errors():
            answer = self._transition(
                keys=[
                    keys.obj(kind, ident),
                    claim.key if claim else keys.prefix + ":no-claim",
                    keys.audit,
                    keys.rate_job(job or "-"),
                    keys.rate_cluster,
                    keys.spares,
                ],
                args=[
                    claim.fence if claim else "",
                    "" if expected_epoch is None else str(expected_epoch),
                    to,
                    ",".join(allowed_from),
                    reason,
                    diagnosis,
                    str(ts_ns),
                    str(now_ms),
                    actor,
                    action,
                    rate_member if limits else "",
                    str(limits.job if limits and job else 0),
                    str(limits.cluster if limits else 0),
                    str(limits.window_ms if limits else 0),
                    "1" if only_own else "",
                    ident,
                    kind,
                ],
            )
        parts = [_text(part) for part in answer]
        outcome = parts[0]
        if outcome in {"ok", "same", "stale"}:
            return Transition(outcome, epoch=int(parts[1]))
        if outcome == "refused":
            return Transition(outcome, state=parts[1], diagnosis=parts[2])
        if outcome == "rate_limited":
            return Transition(outcome, limit=parts[1])
        return Transition(outcome)

    def add_spare(self, node: str, ts_ns: int, now_ms: int, actor: str) -> Transition:
        """Put a healthy node that runs no job into the spare pool."""
        if self.kind_of(node) != "node":
            message = f"unknown node {node!r} (load the topology first: c4 state load)"
            raise StateError(message)
        jobs = self.jobs_of_node(node)
        if jobs:
            message = f"{node} runs {', '.join(jobs)}: not a spare"
            raise StateError(message)
        return self.transition(
            "node",
            node,
            "spare",
            action="spare",
            reason="added to the spare pool",
            ts_ns=ts_ns,
            now_ms=now_ms,
            actor=actor,
            allowed_from=("healthy",),
        )

    def release(self, ident: str, ts_ns: int, now_ms: int, actor: str) -> Transition:
        """Return an isolated or suspect component to service (healthy), audited."""
        kind = self.kind_of(ident)
        if kind is None:
            message = f"unknown component {ident!r}"
            raise StateError(message)
        current = self.component(kind, ident)
        if current is None or current.state not in {"isolated", "suspect"}:
            state = current.state if current else "unknown"
            message = f"{kind} {ident} is {state}, not isolated or suspect"
            raise StateError(message)
        return self.transition(
            kind,
            ident,
            "healthy",
            action="release",
            reason=f"released by {actor}",
            ts_ns=ts_ns,
            now_ms=now_ms,
            actor=actor,
            allowed_from=("isolated", "suspect"),
            expected_epoch=current.epoch,
        )

    @_guarded
    def snapshot(self) -> dict[str, Any]:
        """Everything ``c4 state show`` prints: counts, non-healthy components, spares, jobs."""
        keys = self.keys
        components: dict[str, Any] = {}
        for kind in KINDS:
            ids = sorted(_text(i) for i in self.client.smembers(keys.index(kind)))
            pipe = self.client.pipeline(transaction=False)
            for ident in ids:
                pipe.hmget(keys.obj(kind, ident), ["state", "epoch", "reason", "diagnosis"])
            counts = dict.fromkeys(STATES, 0)
            unusual = []
            for ident, fields in zip(ids, pipe.execute(), strict=True):
                state = _text(fields[0] or b"healthy")
                counts[state] = counts.get(state, 0) + 1
                if state != "healthy":
                    unusual.append(
                        {
                            "id": ident,
                            "state": state,
                            "epoch": int(fields[1] or 0),
                            "reason": _text(fields[2] or b""),
                            "diagnosis": _text(fields[3] or b""),
                        }
                    )
            components[kind] = {"counts": counts, "not_healthy": unusual}
        jobs = []
        for raw in sorted(self.client.smembers(keys.jobs)):
            job = _text(raw)
            info = {_text(k): _text(v) for k, v in self.client.hgetall(keys.job(job)).items()}
            places = self.client.hvals(keys.job_ranks(job))
            jobs.append(
                {
                    "job": job,
                    "state": info.get("state", ""),
                    "restarts": int(info.get("restarts", "0")),
                    "epoch": int(info.get("epoch", "0")),
                    "ranks": len(places),
                    "nodes": sorted({_text(p).split("|", 1)[0] for p in places}),
                }
            )
        spares = sorted(_text(node) for node in self.client.smembers(keys.spares))
        audit = int(self.client.xlen(keys.audit))
        return {
            "prefix": keys.prefix,
            "components": components,
            "spares": spares,
            "jobs": jobs,
            "audit_entries": audit,
        }

    @_guarded
    def audit(self, count: int = 100) -> list[dict[str, str]]:
        """The newest audit entries, oldest first."""
        entries = self.client.xrevrange(self.keys.audit, count=count) or []
        return [
            {"id": _text(entry_id), **{_text(k): _text(v) for k, v in (fields or {}).items()}}
            for entry_id, fields in reversed(entries)
        ]

    # --- jobs -----------------------------------------------------------------------------

    @_guarded
    def record_job(self, job: Job) -> bool:
        """Record a placement from ``c4.job.v1`` unless a newer one is recorded; True if kept."""
        keys = self.keys
        args: list[str] = [
            str(job.ts_ns),
            job.state,
            orjson.dumps(job.comms).decode(),
            job.job,
        ]
        for place in job.ranks:
            gpu = "" if place.gpu is None else str(place.gpu)
            args += [str(place.rank), f"{place.node}|{gpu}|{place.port or ''}"]
        epoch = self._record_job(
            keys=[keys.job(job.job), keys.job_ranks(job.job), keys.jobs], args=args
        )
        return int(epoch) > 0

    @_guarded
    def placement(self, job: str) -> dict[int, RankPlace] | None:
        """A job's recorded ranks, or None when the job is unknown."""
        if not self.client.exists(self.keys.job(job)):
            return None
        return _places(self.client.hgetall(self.keys.job_ranks(job)))

    @_guarded
    def jobs(self) -> list[Job]:
        """Every recorded job that is not stopped, by id, as the v1 job message recorded last.

        Its ranks are the placement in force (a restart's rewrite included). `StateError`
        when a recorded job is not a valid placement.
        """
        names = sorted(_text(raw) for raw in self.client.smembers(self.keys.jobs))
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self.keys.job(name))
            pipe.hgetall(self.keys.job_ranks(name))
        answers = pipe.execute()
        found: list[Job] = []
        for i, name in enumerate(names):
            info = {_text(k): _text(v) for k, v in answers[2 * i].items()}
            if info.get("state", "stopped") == "stopped":
                continue
            try:
                ranks: list[tuple[int, dict[str, Any]]] = []
                for rank, value in answers[2 * i + 1].items():
                    node, gpu, port = _text(value).split("|", 2)
                    place: dict[str, Any] = {"rank": int(_text(rank)), "node": node}
                    if gpu:
                        place["gpu"] = int(gpu)
                    if port:
                        place["port"] = port
                    ranks.append((place["rank"], place))
                ranks.sort(key=lambda item: item[0])
                # One validation of the whole message (the places are checked inside it).
                found.append(
                    Job.model_validate(
                        {
                            "v": 1,
                            "kind": "job",
                            "job": name,
                            "ts_ns": int(info.get("ts_ns", "")),
                            "state": info["state"],
                            "ranks": [place for _, place in ranks],
                            "comms": orjson.loads(info.get("comms", "{}")),
                        }
                    )
                )
            except (ValueError, KeyError, ValidationError) as error:
                first = str(error).splitlines()[0] if str(error) else type(error).__name__
                message = f"{self.keys.job(name)} holds no valid placement: {first}"
                raise StateError(message) from None
        return found

    @_guarded
    def job_info(self, job: str) -> dict[str, str]:
        """A job's hash: state, ts_ns, restarts, epoch, comms."""
        return {_text(k): _text(v) for k, v in self.client.hgetall(self.keys.job(job)).items()}

    def job_message(self, job: str, ts_ns: int, state: str = "restarting") -> Job:
        """The job's recorded placement as a v1 job message."""
        places = self.placement(job)
        if places is None:
            message = f"unknown job {job!r}"
            raise StateError(message)
        comms = orjson.loads(self.job_info(job).get("comms", "{}"))
        return Job.model_validate(
            {
                "v": 1,
                "kind": "job",
                "job": job,
                "ts_ns": ts_ns,
                "state": state,
                "ranks": [places[rank].model_dump() for rank in sorted(places)],
                "comms": comms,
            }
        )

    @_guarded
    def note_suspects(self, job: str, nodes: Iterable[str], now_ms: int, window_ms: int) -> None:
        """Remember a job's suspect nodes for the blast-radius window."""
        key = self.keys.job_suspects(job)
        members = {node: now_ms for node in nodes}
        if not members:
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.zadd(key, members)
        pipe.zremrangebyscore(key, "-inf", f"({now_ms - window_ms}")
        pipe.pexpire(key, window_ms)
        pipe.execute()

    @_guarded
    def recent_suspects(self, job: str, now_ms: int, window_ms: int) -> frozenset[str]:
        """A job's suspect nodes seen within the window."""
        found = self.client.zrangebyscore(self.keys.job_suspects(job), now_ms - window_ms, "+inf")
        return frozenset(_text(node) for node in found)

    @_guarded
    def node_leaves(self, nodes: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The leaves each node's ports hang off (empty for unknown nodes)."""
        ordered = list(nodes)
        pipe = self.client.pipeline(transaction=False)
        for node in ordered:
            pipe.hget(self.keys.obj("node", node), "leaves")
        return {
            node: tuple(x for x in _text(value or b"").split(",") if x)
            for node, value in zip(ordered, pipe.execute(), strict=True)
        }

    # --- claims ---------------------------------------------------------------------------

    @_guarded
    def claim(
        self, diagnosis: str, state: str, owner: str, now_ms: int, lease_ms: int, ttl_s: int
    ) -> tuple[str, Claim | None, int]:
        """Claim a diagnosis: ("claimed", claim, 0), ("done", None, 0) or ("busy", None, until)."""
        key = self.keys.claim(diagnosis, state)
        answer = [_text(x) for x in self._claim(keys=[key], args=[owner, now_ms, lease_ms, ttl_s])]
        if answer[0] == "claimed":
            return "claimed", Claim(key, answer[1]), 0
        if answer[0] == "busy":
            return "busy", None, int(answer[1])
        return "done", None, 0

    @_guarded
    def renew(self, claim: Claim, now_ms: int, lease_ms: int) -> bool:
        """Extend the claim's lease; False when another worker has taken it over."""
        return bool(self._renew(keys=[claim.key], args=[claim.fence, now_ms, lease_ms]))

    @_guarded
    def record(self, claim: Claim, field: str, value: str) -> bool:
        """Write one field of the claim's record (step outcomes, phases); False when fenced."""
        return bool(self._record(keys=[claim.key], args=[claim.fence, field, value]))

    @_guarded
    def records(self, claim: Claim) -> dict[str, str]:
        """Every field of the claim's record."""
        return {_text(k): _text(v) for k, v in self.client.hgetall(claim.key).items()}

    @_guarded
    def finish(self, claim: Claim, ttl_s: int) -> bool:
        """Mark the diagnosis handled (later deliveries are duplicates); False when fenced."""
        return bool(self._finish(keys=[claim.key], args=[claim.fence, ttl_s]))

    # --- restart --------------------------------------------------------------------------

    @_guarded
    def allocate(
        self,
        claim: Claim,
        job: str,
        nodes: Iterable[str],
        *,
        max_restarts: int,
        ts_ns: int,
        now_ms: int,
        diagnosis: str,
        actor: str,
        limits: RateLimits,
        rate_member: str,
    ) -> list[str]:
        """Take spares for a job's failed nodes and rewrite its placement (scripts.ALLOCATE)."""
        keys = self.keys
        answer = self._allocate(
            keys=[
                claim.key,
                keys.job(job),
                keys.job_ranks(job),
                keys.spares,
                keys.audit,
                keys.rate_job(job),
                keys.rate_cluster,
            ],
            args=[
                claim.fence,
                allocation_field(job),
                keys.prefix,
                ",".join(nodes),
                max_restarts,
                ts_ns,
                now_ms,
                diagnosis,
                actor,
                limits.job,
                limits.cluster,
                limits.window_ms,
                rate_member,
                job,
            ],
        )
        return [_text(part) for part in answer]


def _places(ranks: dict[Any, Any]) -> dict[int, RankPlace]:
    """A job's ranks hash (rank -> ``node|gpu|port``) as places."""
    places: dict[int, RankPlace] = {}
    for rank, value in ranks.items():
        node, gpu, port = _text(value).split("|", 2)
        number = int(_text(rank))
        places[number] = RankPlace(
            rank=number, node=node, gpu=int(gpu) if gpu else None, port=port or None
        )
    return places


def allocation_field(job: str) -> str:
    """The claim field holding a job's allocation record."""
    return f"alloc:{job}"
