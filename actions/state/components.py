"""`ComponentStore`: the topology's components and their state machine, in Redis.

Loading a topology, what a component is and its state, where nodes hang off the fabric, and
every state change (one script: fenced by the claim, compared against the epoch, counted
against the rate limits, audited): isolation and suspect marks, the spare pool, release.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import redis

from actions.state import StateError
from actions.state import scripts as lua
from actions.state.base import guarded, redis_errors, text
from actions.state.keys import KINDS, Keys
from actions.state.model import STATES, Component, Transition, TransitionRequest
from actions.state.protocols import NodeJobs
from schemas.codec import Rejection, decode_object
from schemas.files import Topology
from topology import TopologyError
from topology.model import Fabric


class ComponentStore:
    """Components under one key prefix: topology, states, transitions, spares."""

    def __init__(self, client: redis.Redis, keys: Keys, jobs: NodeJobs) -> None:
        self._client = client
        self._keys = keys
        self._jobs = jobs
        self._transition = client.register_script(lua.PRELUDE + lua.TRANSITION)
        self._fabric: tuple[bytes | str, Fabric] | None = None  # the last document read, parsed

    @guarded
    def load_topology(self, topology: Topology) -> dict[str, int]:
        """Record every component of a topology (states of known ones are kept)."""
        fabric = Fabric.from_topology(topology)
        keys = self._keys
        counts = dict.fromkeys(KINDS, 0)
        pipe = self._client.pipeline(transaction=False)

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

    @guarded
    def fabric(self) -> Fabric | None:
        """The fabric of the topology last loaded, None when none was; `StateError` if invalid.

        The document is read each time (a reload takes effect at once) and parsed only when
        it changed.
        """
        raw = self._client.get(self._keys.topology)
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
            message = f"{self._keys.topology} holds no valid topology: {error}".splitlines()[0]
            raise StateError(message) from None
        self._fabric = (raw, fabric)
        return fabric

    @guarded
    def kind_of(self, ident: str) -> str | None:
        """Which kind of component an id is, or None when the topology does not have it."""
        pipe = self._client.pipeline(transaction=False)
        for kind in KINDS:
            pipe.sismember(self._keys.index(kind), ident)
        for kind, present in zip(KINDS, pipe.execute(), strict=True):
            if present:
                return kind
        return None

    @guarded
    def component(self, kind: str, ident: str) -> Component | None:
        """One component's state, or None when unknown."""
        fields = self._client.hmget(
            self._keys.obj(kind, ident), ["state", "epoch", "reason", "diagnosis", "ts_ns"]
        )
        if fields[1] is None:
            return None
        state, epoch, reason, diagnosis, ts_ns = (text(f) if f is not None else "" for f in fields)
        return Component(kind, ident, state, int(epoch), reason, diagnosis, int(ts_ns or 0))

    @guarded
    def node_leaves(self, nodes: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The leaves each node's ports hang off (empty for unknown nodes)."""
        ordered = list(nodes)
        pipe = self._client.pipeline(transaction=False)
        for node in ordered:
            pipe.hget(self._keys.obj("node", node), "leaves")
        return {
            node: tuple(x for x in text(value or b"").split(",") if x)
            for node, value in zip(ordered, pipe.execute(), strict=True)
        }

    def transition(self, request: TransitionRequest) -> Transition:
        """Change one component's state atomically (see scripts.TRANSITION)."""
        keys, claim, limits, job = self._keys, request.claim, request.limits, request.job
        with redis_errors():
            answer = self._transition(
                keys=[
                    keys.obj(request.kind, request.ident),
                    claim.key if claim else keys.prefix + ":no-claim",
                    keys.audit,
                    keys.rate_job(job or "-"),
                    keys.rate_cluster,
                    keys.spares,
                ],
                args=[
                    claim.fence if claim else "",
                    "" if request.expected_epoch is None else str(request.expected_epoch),
                    request.to,
                    ",".join(request.allowed_from),
                    request.reason,
                    request.diagnosis,
                    str(request.ts_ns),
                    str(request.now_ms),
                    request.actor,
                    request.action,
                    request.rate_member if limits else "",
                    str(limits.job if limits and job else 0),
                    str(limits.cluster if limits else 0),
                    str(limits.window_ms if limits else 0),
                    "1" if request.only_own else "",
                    request.ident,
                    request.kind,
                ],
            )
        parts = [text(part) for part in answer]
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
        jobs = self._jobs.on_node(node)
        if jobs:
            message = f"{node} runs {', '.join(jobs)}: not a spare"
            raise StateError(message)
        return self.transition(
            TransitionRequest(
                kind="node",
                ident=node,
                to="spare",
                action="spare",
                reason="added to the spare pool",
                ts_ns=ts_ns,
                now_ms=now_ms,
                actor=actor,
                allowed_from=("healthy",),
            )
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
            TransitionRequest(
                kind=kind,
                ident=ident,
                to="healthy",
                action="release",
                reason=f"released by {actor}",
                ts_ns=ts_ns,
                now_ms=now_ms,
                actor=actor,
                allowed_from=("isolated", "suspect"),
                expected_epoch=current.epoch,
            )
        )

    @guarded
    def spares(self) -> list[str]:
        """The spare pool, by node id."""
        return sorted(text(node) for node in self._client.smembers(self._keys.spares))

    @guarded
    def summary(self) -> dict[str, Any]:
        """Per kind: how many components are in each state, and those not healthy."""
        keys = self._keys
        components: dict[str, Any] = {}
        for kind in KINDS:
            ids = sorted(text(i) for i in self._client.smembers(keys.index(kind)))
            pipe = self._client.pipeline(transaction=False)
            for ident in ids:
                pipe.hmget(keys.obj(kind, ident), ["state", "epoch", "reason", "diagnosis"])
            counts = dict.fromkeys(STATES, 0)
            unusual = []
            for ident, fields in zip(ids, pipe.execute(), strict=True):
                state = text(fields[0] or b"healthy")
                counts[state] = counts.get(state, 0) + 1
                if state != "healthy":
                    unusual.append(
                        {
                            "id": ident,
                            "state": state,
                            "epoch": int(fields[1] or 0),
                            "reason": text(fields[2] or b""),
                            "diagnosis": text(fields[3] or b""),
                        }
                    )
            components[kind] = {"counts": counts, "not_healthy": unusual}
        return components
