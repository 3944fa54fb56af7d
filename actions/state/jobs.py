"""`JobStore`: the jobs' placements recorded from ``c4.job.v1``, and restarts' allocations.

A placement is kept unless a newer one is recorded (one script); a restart takes spares for
a job's failed nodes and rewrites its placement in one script, fenced by the claim.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis
from pydantic import ValidationError

from actions.state import StateError
from actions.state import scripts as lua
from actions.state.base import guarded, text
from actions.state.keys import Keys
from actions.state.model import AllocationRequest, allocation_field
from schemas.messages import Job, RankPlace


class JobStore:
    """Jobs under one key prefix: placements, their state, restarts."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._allocate = client.register_script(lua.PRELUDE + lua.ALLOCATE)
        self._record_job = client.register_script(lua.PRELUDE + lua.RECORD_JOB)
        self._count_restart = client.register_script(lua.COUNT_RESTART)

    @guarded
    def record(self, job: Job) -> bool:
        """Record a placement from ``c4.job.v1`` unless a newer one is recorded; True if kept."""
        keys = self._keys
        args: list[str] = [
            str(job.ts_ns),
            job.state,
            orjson.dumps(job.comms).decode(),
            job.job,
        ]
        for place in job.ranks:
            args += [str(place.rank), _stored(place)]
        epoch = self._record_job(
            keys=[keys.job(job.job), keys.job_ranks(job.job), keys.jobs], args=args
        )
        return int(epoch) > 0

    @guarded
    def placement(self, job: str) -> dict[int, RankPlace] | None:
        """A job's recorded ranks, or None when the job is unknown."""
        if not self._client.exists(self._keys.job(job)):
            return None
        return _places(self._client.hgetall(self._keys.job_ranks(job)))

    @guarded
    def active(self) -> list[Job]:
        """Every recorded job that is not stopped, by id, as the v1 job message recorded last.

        Its ranks are the placement in force (a restart's rewrite included). `StateError`
        when a recorded job is not a valid placement.
        """
        names = sorted(text(raw) for raw in self._client.smembers(self._keys.jobs))
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self._keys.job(name))
            pipe.hgetall(self._keys.job_ranks(name))
        answers = pipe.execute()
        found: list[Job] = []
        for i, name in enumerate(names):
            info = {text(k): text(v) for k, v in answers[2 * i].items()}
            if info.get("state", "stopped") == "stopped":
                continue
            try:
                ranks: list[tuple[int, dict[str, Any]]] = []
                for rank, value in answers[2 * i + 1].items():
                    place = _loaded(int(text(rank)), text(value))
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
                message = f"{self._keys.job(name)} holds no valid placement: {first}"
                raise StateError(message) from None
        return found

    @guarded
    def info(self, job: str) -> dict[str, str]:
        """A job's hash: state, ts_ns, restarts, epoch, comms."""
        return {text(k): text(v) for k, v in self._client.hgetall(self._keys.job(job)).items()}

    def message(self, job: str, ts_ns: int, state: str = "restarting") -> Job:
        """The job's recorded placement as a v1 job message."""
        places = self.placement(job)
        if places is None:
            message = f"unknown job {job!r}"
            raise StateError(message)
        comms = orjson.loads(self.info(job).get("comms", "{}"))
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

    @guarded
    def counted_for(self, job: str, diagnosis: str) -> bool:
        """Whether a restart of the job was counted for the diagnosis."""
        return bool(self._client.sismember(self._keys.job_restarted_for(job), diagnosis))

    @guarded
    def count_restart(self, job: str, diagnosis: str, max_restarts: int) -> tuple[str, int]:
        """Count a scheduler's restart of the job for a diagnosis, once however often it is
        asked (a retry after a crash), unless ``max_restarts`` are reached: the script's
        answer (counted, again, limit, unknown_job) and the count after it."""
        keys = [self._keys.job_restarted_for(job), self._keys.job(job)]
        answer, count = self._count_restart(keys=keys, args=[diagnosis, max_restarts])
        return text(answer), int(text(count))

    @guarded
    def on_node(self, node: str) -> list[str]:
        """The recorded jobs (not stopped) that have a rank on a node."""
        found = []
        for raw in sorted(self._client.smembers(self._keys.jobs)):
            job = text(raw)
            if text(self._client.hget(self._keys.job(job), "state") or b"") == "stopped":
                continue
            places = self._client.hvals(self._keys.job_ranks(job))
            if any(text(place).split("|", 1)[0] == node for place in places):
                found.append(job)
        return found

    @guarded
    def allocate(self, request: AllocationRequest) -> list[str]:
        """Take spares for a job's failed nodes and rewrite its placement (scripts.ALLOCATE)."""
        keys, job, limits = self._keys, request.job, request.limits
        answer = self._allocate(
            keys=[
                request.claim.key,
                keys.job(job),
                keys.job_ranks(job),
                keys.spares,
                keys.audit,
                keys.rate_job(job),
                keys.rate_cluster,
            ],
            args=[
                request.claim.fence,
                allocation_field(job),
                keys.prefix,
                ",".join(request.nodes),
                request.max_restarts,
                request.ts_ns,
                request.now_ms,
                request.diagnosis,
                request.actor,
                limits.job,
                limits.cluster,
                limits.window_ms,
                request.rate_member,
                job,
            ],
        )
        return [text(part) for part in answer]

    @guarded
    def summary(self) -> list[dict[str, Any]]:
        """Every recorded job: state, restarts, epoch, how many ranks on which nodes."""
        keys = self._keys
        jobs = []
        for raw in sorted(self._client.smembers(keys.jobs)):
            job = text(raw)
            info = {text(k): text(v) for k, v in self._client.hgetall(keys.job(job)).items()}
            places = self._client.hvals(keys.job_ranks(job))
            jobs.append(
                {
                    "job": job,
                    "state": info.get("state", ""),
                    "restarts": int(info.get("restarts", "0")),
                    "epoch": int(info.get("epoch", "0")),
                    "ranks": len(places),
                    "nodes": sorted({text(p).split("|", 1)[0] for p in places}),
                }
            )
        return jobs


def _stored(place: RankPlace) -> str:
    """A rank's place as the ranks hash holds it: ``node|gpu|port`` and ``|pod`` when known
    (a place without a pod is stored as before)."""
    gpu = "" if place.gpu is None else str(place.gpu)
    stored = f"{place.node}|{gpu}|{place.port or ''}"
    return f"{stored}|{place.pod}" if place.pod else stored


def _loaded(rank: int, value: str) -> dict[str, Any]:
    """A stored place as the fields of a `RankPlace` (a port never holds ``|``)."""
    node, gpu, rest = value.split("|", 2)
    port, _, pod = rest.partition("|")
    place: dict[str, Any] = {"rank": rank, "node": node}
    if gpu:
        place["gpu"] = int(gpu)
    if port:
        place["port"] = port
    if pod:
        place["pod"] = pod
    return place


def _places(ranks: dict[Any, Any]) -> dict[int, RankPlace]:
    """A job's ranks hash (rank -> ``node|gpu|port[|pod]``) as places."""
    places: dict[int, RankPlace] = {}
    for rank, value in ranks.items():
        number = int(text(rank))
        places[number] = RankPlace.model_validate(_loaded(number, text(value)))
    return places
