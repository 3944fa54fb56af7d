"""The reroute action: replan the jobs' flows around a diagnosis's link, or back onto it.

One step per link, port or switch suspect of a ``link_down`` / ``link_degraded`` diagnosis:
1. the diagnosis narrowed to the step's suspect, the fabric of the topology in the cluster
   state, the running jobs' placements (the cluster state's) and the plan in force go into
   `planner.reroute.reroute` (pure);
2. the nodes about to be told are recorded in the diagnosis's claim, then one
   ``c4.route.v1`` message per node is published, keyed by node, and delivered;
3. only then is the new plan saved: a compare-and-set on the id of the plan it was made from.

Publishing before saving means a failed save is retried by publishing again. After a Redis
outage the same plan (same id, same paths) is published again; after another worker put a
plan in force meanwhile (``plan_changed``) the flows are replanned from that one, and every
node told on an earlier try is told again from the new plan, so that no node is left on the
paths of a plan that never came into force. A resolved diagnosis gives its links back: they
are usable again and the plan in force says so (with the default incremental mode no flow
moves back onto them; with ``best`` flows move when that lowers ``max_util``).

Except where the reroute itself ends the finding: a ``link_degraded`` (or ``link_down``, a
dark link) finding of no job naming a fabric link or a switch rests on slow paths through it,
and the reroute took those paths away; a degraded port's flows failed over to the sibling port
of its NIC. Either resolves because of our own action, and giving it back would bring the
traffic, then the finding, back (a flap): the step is skipped (``kept_out``:
`actions.pipeline.policy.kept_out`) and the link or port stays out of the plan until an
operator releases it (`give_back`). A port that went down and came up again (``link_down``,
the port's own state) is given back, as is a link whose own state said it was down (a
``link_down`` without slow paths). An unexpected planner error
fails the step (``no_route``, logged with its traceback), it never ends the worker.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson

from actions.config import RerouteSettings
from actions.drivers.reroute.plan_store import (
    PlanStoreError,
    Saved,
    StalePlanError,
    StoreUnavailableError,
)
from actions.pipeline.executor import Context, Executor
from actions.pipeline.outcome import Reason, Result, done, failed, skipped
from actions.pipeline.policy import KEPT_OUT_KINDS, Step, kept_out
from actions.state import StateError
from actions.state.model import Claim
from actions.state.protocols import ActiveJobs, ClaimRecords, FabricSource
from planner.reroute import (
    LINK_SUSPECTS,
    REROUTE_CLASSES,
    CurrentPlan,
    RerouteError,
    failed_links,
    job_flows,
    link_utilization,
    node_routes,
    reroute,
)
from schemas.base import C4Model
from schemas.messages import Diagnosis
from topology.ecmp import hash_model

log = logging.getLogger("c4.actions")

# The new plan in force: its max_util, its links' utilisation, the route messages published.
PlanSaved = Callable[[float, Mapping[str, float], int], None]


class Plans(Protocol):
    """The plan in force (`actions.drivers.reroute.plan_store.PlanStore`)."""

    def current(self) -> CurrentPlan | None:
        """The plan in force, None when there is none."""

    def replace(self, new: CurrentPlan, expected: str | None) -> Saved:
        """Put ``new`` in force if ``expected`` still is; `StalePlanError` otherwise."""


class Publisher(Protocol):
    """Where route messages go (`actions.transport.Outbox`)."""

    def publish(self, message: C4Model, key: str | None = None) -> None:
        """Queue one v1 message on its topic."""

    def flush(self) -> None:
        """Wait until every queued message is delivered."""


def told_field(target: str) -> str:
    """The claim field listing the nodes a reroute step has published routes to."""
    return f"reroute:{target}:nodes"


class RerouteExecutor(Executor):
    """Replan around (or back onto) one link suspect; publish the routes; save the plan."""

    name = "reroute"
    undoes = True

    def __init__(
        self,
        fabric: FabricSource,
        jobs: ActiveJobs,
        claims: ClaimRecords,
        plans: Plans,
        outbox: Publisher,
        settings: RerouteSettings | None = None,
        saved: PlanSaved = lambda max_util, links, routes: None,
    ) -> None:
        self._fabric = fabric
        self._jobs = jobs
        self._claims = claims
        self._plans = plans
        self._outbox = outbox
        chosen = settings or RerouteSettings()
        self._mode = chosen.mode
        self._hash = hash_model(chosen.hash, chosen.seed) if chosen.hash else None
        self._saved = saved

    def execute(self, step: Step, context: Context) -> Result:
        diagnosis = context.diagnosis
        if diagnosis.class_ not in REROUTE_CLASSES:
            message = f"{diagnosis.class_} is not a link finding: nothing to route around"
            return skipped(Reason.NO_TARGET, message)
        suspect = next(
            (s for s in diagnosis.suspects if (s.type, s.id) == (step.kind, step.target)), None
        )
        if suspect is None or suspect.type not in LINK_SUSPECTS:
            message = f"{step.kind} {step.target} is not a link, port or switch"
            return skipped(Reason.NO_TARGET, message)
        if kept_out(diagnosis, suspect.type):
            message = (
                f"{suspect.type} {suspect.id} stays out of the plan: the finding resolved because"
                f" the reroute moved its slow paths away (c4 state release {suspect.id})"
            )
            return skipped(Reason.KEPT_OUT, message)
        narrowed = diagnosis.model_copy(update={"suspects": (suspect,)})
        try:
            fabric = self._fabric.fabric()
            jobs = self._jobs.active()
        except StateError as error:
            return failed(Reason.STATE_INVALID, str(error))
        if fabric is None:
            message = "no topology in the cluster state (c4 state load --topology T)"
            return failed(Reason.UNKNOWN_TARGET, message)
        try:
            failed_links(fabric, narrowed)
        except RerouteError as error:
            return failed(Reason.UNKNOWN_TARGET, str(error))
        try:
            current = self._plans.current()
        except StoreUnavailableError as error:
            return failed(Reason.STORE_UNAVAILABLE, str(error), retryable=True)
        except PlanStoreError as error:
            return failed(Reason.STATE_INVALID, str(error))
        try:
            result = reroute(
                fabric, jobs, current, narrowed, context.now_ns, self._hash, self._mode
            )
        except RerouteError as error:
            return failed(Reason.NO_ROUTE, str(error))
        except Exception as error:  # a planner bug: record a failed action, keep the worker
            log.exception("reroute of %s for %s failed unexpectedly", step.target, diagnosis.id)
            message = f"the planner failed: {type(error).__name__}: {error}"
            return failed(Reason.NO_ROUTE, message)
        new = result.current
        field = told_field(step.target)
        told = self._told(context.claim, field)
        routes = result.routes + node_routes(
            new.plan, told - {route.node for route in result.routes}, new.id, context.now_ns
        )
        nodes = told | {route.node for route in routes}
        if nodes != told and not self._claims.record(
            context.claim, field, orjson.dumps(sorted(nodes)).decode()
        ):
            return failed(Reason.FENCED, "another worker took this diagnosis over")
        for route in routes:
            self._outbox.publish(route, key=route.node)
        self._outbox.flush()  # TransportUnavailable: the worker handles the record again
        previous = current.id if current is not None else None
        try:
            self._plans.replace(new, previous)
        except StalePlanError as error:
            message = f"{error}: replanning from the plan now in force"
            return failed(Reason.PLAN_CHANGED, message, retryable=True)
        except StoreUnavailableError as error:
            return failed(Reason.STORE_UNAVAILABLE, str(error), retryable=True)
        flows = job_flows(fabric, jobs).flows
        demand = {flow.id: flow.gbps for flow in flows}
        phase = {flow.id: flow.phase for flow in flows}
        links = link_utilization(fabric, new.plan, demand, phase)
        self._saved(new.plan.max_util, links, len(routes))
        return done(
            plan=new.id,
            previous=previous,
            strategy=result.strategy,
            down=list(new.down),
            moved=len(result.moved),
            routes=len(routes),
            before_max_util=result.before_max_util,
            after_max_util=result.after_max_util,
            bound=result.bound,
            # Per phase of the running jobs' traffic, the new plan's max_util, its bound,
            # and where it is above the bound, by how much (0.25: 25% above).
            phases=dict(new.plan.phases or {}),
            phase_bounds=dict(result.phase_bounds),
            misses={phase: round(miss, 4) for phase, miss in result.misses.items()},
            extra_moves=result.extra_moves,
            failed_over=len(result.failed_over),
            stranded=list(result.stranded),
            skipped_hops=len(result.skipped),
        )

    def _told(self, claim: Claim, field: str) -> set[str]:
        raw = self._claims.records(claim).get(field)
        if raw is None:
            return set()
        try:
            nodes = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return set()  # written only by this executor: unreadable means nothing to add
        return {str(node) for node in nodes} if isinstance(nodes, list) else set()


@dataclass(frozen=True, slots=True)
class GivenBack:
    """A kept-out link, port or switch back in the plan: the new plan and what it moved."""

    plan: str
    links: tuple[str, ...]
    moved: int
    routes: int
    before_max_util: float | None
    after_max_util: float


def give_back(
    fabric: FabricSource,
    jobs: ActiveJobs,
    plans: Plans,
    outbox: Publisher,
    kind: str,
    ident: str,
    now_ns: int,
    actor: str,
) -> GivenBack | None:
    """An operator released a link, port or switch: if the plan in force keeps it out,
    replan with it usable again, publish the routes, then put the plan in force
    (compare-and-set); a port's failed-over flows come back to it.

    None when the plan in force does not keep it out (nothing to give back). `RerouteError`
    when it is not in the fabric; `StalePlanError` when another plan came into force
    meanwhile (run it again); `StoreUnavailableError` when Redis is away.
    """
    if kind not in KEPT_OUT_KINDS:
        return None
    current = plans.current()
    loaded = fabric.fabric()
    if current is None or loaded is None:
        return None
    release = Diagnosis.model_validate(
        {
            "v": 1,
            "kind": "diagnosis",
            "id": "d-release-" + hashlib.sha256(f"{ident}|{now_ns}".encode()).hexdigest()[:12],
            "job": None,
            "state": "resolved",
            "class": "link_degraded",
            "onset_ns": now_ns,
            "ts_ns": now_ns,
            "suspects": [{"type": kind, "id": ident, "score": 1.0}],
            "evidence": {"released_by": actor},
        }
    )
    links = set(failed_links(loaded, release)) & set(current.down)
    if not links:
        return None
    result = reroute(loaded, jobs.active(), current, release, now_ns)
    for route in result.routes:
        outbox.publish(route, key=route.node)
    outbox.flush()
    plans.replace(result.current, current.id)
    return GivenBack(
        result.current.id,
        tuple(sorted(links)),
        len(result.moved),
        len(result.routes),
        result.before_max_util,
        result.current.plan.max_util,
    )
