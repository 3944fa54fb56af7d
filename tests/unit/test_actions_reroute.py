"""The reroute executor against in-memory state, plans and outbox: order, retries, reasons."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import orjson
import pytest

from actions.config import Backoff, RerouteSettings
from actions.drivers.reroute.executor import GivenBack, RerouteExecutor, give_back, told_field
from actions.drivers.reroute.plan_store import (
    PlanStoreError,
    Saved,
    StalePlanError,
    StoreUnavailableError,
)
from actions.pipeline.executor import Context
from actions.pipeline.outcome import Reason, Result
from actions.pipeline.policy import Step
from actions.pipeline.step_stages import run_with_retry
from actions.state import StateError
from actions.state.model import Claim
from planner.reroute import CurrentPlan, reroute
from schemas.base import C4Model
from schemas.messages import Diagnosis, Job, Route
from tests.unit.test_reroute import JOBS, TS, diagnosis
from topology.ecmp import choose_spine, hash_model
from topology.generate import Shape, generate
from topology.model import Fabric

CLAIM = Claim("test:diagnosis:d-1:firing", "1")


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    # 8 nodes x 2 NICs x 2 ports; 2 nodes per leaf: 4 leaves and 4 spines per plane.
    return Fabric.from_topology(generate(Shape(nodes=8, spines=4, nics=2, nodes_per_leaf=2)))


@dataclass
class FakeState:
    """The cluster state's parts the executor uses (fabric, jobs, claims), in memory."""

    topology: Fabric | None
    placed: list[Job]
    claims: dict[str, dict[str, str]] = field(default_factory=dict)
    fenced: bool = False
    broken: str = ""

    def fabric(self) -> Fabric | None:
        return self.topology

    def active(self) -> list[Job]:
        if self.broken:
            raise StateError(self.broken)
        return list(self.placed)

    def records(self, claim: Claim) -> dict[str, str]:
        return dict(self.claims.get(claim.key, {}))

    def record(self, claim: Claim, name: str, value: str) -> bool:
        if self.fenced:
            return False
        self.claims.setdefault(claim.key, {})[name] = value
        return True


@dataclass
class FakePlans:
    """A plan store with the real one's compare-and-set; hooks fail or race a call."""

    log: list[str]
    plan: CurrentPlan | None = None
    saved: list[CurrentPlan] = field(default_factory=list)
    down_for: int = 0  # this many calls fail as if Redis were away
    before_replace: Callable[[], None] | None = None
    invalid: bool = False

    def _maybe_down(self) -> None:
        if self.down_for > 0:
            self.down_for -= 1
            message = "redis failed: Connection refused"
            raise StoreUnavailableError(message)

    def current(self) -> CurrentPlan | None:
        self._maybe_down()
        if self.invalid:
            message = "c4:plan:current holds no valid plan: 1 validation error"
            raise PlanStoreError(message)
        return self.plan

    def replace(self, new: CurrentPlan, expected: str | None) -> Saved:
        if self.before_replace is not None:
            self.before_replace()
            self.before_replace = None
        self._maybe_down()
        self.log.append(f"save {new.id}")
        in_force = self.plan.id if self.plan else None
        if in_force == new.id:
            return Saved(stored=False)
        if in_force != expected:
            message = f"the plan in force is no longer {expected or 'absent'}"
            raise StalePlanError(message)
        self.plan = new
        self.saved.append(new)
        return Saved(stored=True)


@dataclass
class FakeOutbox:
    """Records what was published, in order with flushes and saves."""

    log: list[str]
    published: list[tuple[Route, str | None]] = field(default_factory=list)

    def publish(self, message: C4Model, key: str | None = None) -> None:
        assert isinstance(message, Route)
        self.published.append((message, key))
        self.log.append(f"publish {message.node}")

    def flush(self) -> None:
        self.log.append("flush")


@dataclass
class Rig:
    state: FakeState
    plans: FakePlans
    outbox: FakeOutbox
    executor: RerouteExecutor
    saved: list[tuple[float, int]]
    links: list[dict[str, float]]


def rig(
    fabric: Fabric | None,
    current: CurrentPlan | None = None,
    settings: RerouteSettings | None = None,
) -> Rig:
    log: list[str] = []
    state = FakeState(fabric, list(JOBS))
    plans = FakePlans(log, current)
    outbox = FakeOutbox(log)
    saved: list[tuple[float, int]] = []
    links: list[dict[str, float]] = []

    def plan_saved(util: float, loads: Mapping[str, float], n: int) -> None:
        saved.append((util, n))
        links.append(dict(loads))

    executor = RerouteExecutor(state, state, state, plans, outbox, settings, plan_saved)
    return Rig(state, plans, outbox, executor, saved, links)


def run(rig: Rig, finding: Diagnosis, step: Step | None = None, tries: int = 1) -> Result:
    suspect = finding.suspects[0]
    chosen = step or Step("reroute", suspect.id, suspect.type)
    context = Context(finding, CLAIM, (), "test", TS + 7)
    backoff = Backoff(tries=tries, backoff_s=0)
    return run_with_retry(
        lambda: rig.executor.execute(chosen, context), backoff, lambda seconds: None
    )


def released(rig: Rig, kind: str, ident: str, now_ns: int, actor: str) -> GivenBack | None:
    """An operator's release given back to the plan, against the rig's fakes."""
    return give_back(rig.state, rig.state, rig.plans, rig.outbox, kind, ident, now_ns, actor)


def in_force(fabric: Fabric) -> CurrentPlan:
    """A plan of both jobs' flows, made for a plane-b link that no flow uses."""
    return reroute(fabric, JOBS, None, diagnosis([("link", "leaf-3b~spine-b-3")]), TS).current


def used_link(current: CurrentPlan) -> tuple[str, set[str]]:
    """A leaf~spine link the plan uses, and the flows crossing it."""
    link = sorted(link for p in current.plan.paths if p.via for link in p.links[1:-1])[0]
    return link, {p.flow for p in current.plan.paths if link in p.links}


def test_link_down_publishes_routes_per_node_then_saves_the_plan(fabric: Fabric) -> None:
    current = in_force(fabric)
    link, crossing = used_link(current)
    test = rig(fabric, current)
    result = run(test, diagnosis([("link", link)], ident="d-2"))

    assert result.status == "done", result
    (saved,) = test.plans.saved
    assert saved.down == tuple(sorted({link, *current.down})) and saved.diagnosis == "d-2"
    assert not any(link in p.links for p in saved.plan.paths)
    routes = [route for route, _ in test.outbox.published]
    assert all(key == route.node for route, key in test.outbox.published)
    assert all(route.plan == saved.id and route.ts_ns == TS + 7 for route in routes)
    senders = {p.links[0].split("/")[0] for p in saved.plan.paths if p.flow in crossing}
    assert {route.node for route in routes} == senders
    # Every route is delivered before the plan is saved.
    assert test.plans.log == [*(f"publish {r.node}" for r in routes), "flush", f"save {saved.id}"]
    detail = result.detail
    assert detail["plan"] == saved.id and detail["previous"] == current.id
    assert detail["strategy"] == "incremental" and detail["moved"] == len(crossing)
    assert detail["routes"] == len(routes) and detail["down"] == list(saved.down)
    assert detail["before_max_util"] == current.plan.max_util
    assert detail["after_max_util"] == saved.plan.max_util
    assert detail["stranded"] == [] and detail["skipped_hops"] == 0
    assert detail["phases"] == dict(saved.plan.phases or {})
    assert detail["phases"] and max(detail["phases"].values()) == saved.plan.max_util
    assert test.saved == [(saved.plan.max_util, len(routes))]
    # The links' utilisation of the plan in force: its busiest link is its max_util.
    (loads,) = test.links
    assert loads and max(loads.values()) == pytest.approx(saved.plan.max_util)
    assert link not in loads
    told = orjson.loads(test.state.claims[CLAIM.key][told_field(link)])
    assert told == sorted(senders)


def test_the_step_acts_on_its_own_suspect_only(fabric: Fabric) -> None:
    current = in_force(fabric)
    link, _ = used_link(current)
    test = rig(fabric, current)
    both = diagnosis([("link", link), ("link", "leaf-0b~spine-b-0")], ident="d-3")
    result = run(test, both, Step("reroute", "leaf-0b~spine-b-0", "link"))
    assert result.status == "done"
    assert test.plans.saved[0].down == tuple(sorted({"leaf-0b~spine-b-0", *current.down}))


def test_a_resolved_diagnosis_gives_its_link_back(fabric: Fabric) -> None:
    current = in_force(fabric)
    test = rig(fabric, current)
    resolved = diagnosis([("link", "leaf-3b~spine-b-3")], state="resolved")
    result = run(test, resolved)
    assert result.status == "done"
    assert test.plans.saved[0].down == ()
    assert result.detail["down"] == [] and result.detail["moved"] == 0
    assert test.outbox.published == []  # incremental: no flow moves back


def test_a_hash_model_puts_steering_source_ports_in_the_routes(fabric: Fabric) -> None:
    link = "leaf-0a~spine-a-1"
    test = rig(fabric, None, RerouteSettings(hash="crc32"))
    assert run(test, diagnosis([("link", link)])).status == "done"
    model = hash_model("crc32")
    paths = {p.flow: p for p in test.plans.saved[0].plan.paths}
    hops = [hop for route, _ in test.outbox.published for hop in route.paths]
    assert hops
    for hop in hops:
        path = paths[hop.flow]
        assert hop.sport is not None
        chosen = choose_spine(fabric, model, path.links[0], path.links[-1], hop.sport, [link])
        assert chosen == hop.via


@pytest.mark.parametrize(
    ("finding", "step", "message"),
    [
        (
            diagnosis([("link", "leaf-0a~spine-a-0")], cls="comm_slow"),
            None,
            "comm_slow is not a link finding",
        ),
        (
            diagnosis([("gpu", "node-001/gpu0"), ("link", "leaf-0a~spine-a-0")]),
            None,
            "gpu node-001/gpu0 is not a link, port or switch",
        ),
        (
            diagnosis([("link", "leaf-0a~spine-a-0")]),
            Step("reroute", "leaf-0a~spine-a-1", "link"),
            "link leaf-0a~spine-a-1 is not a link, port or switch",
        ),
    ],
)
def test_nothing_to_route_around_is_a_skip(
    fabric: Fabric, finding: Diagnosis, step: Step | None, message: str
) -> None:
    test = rig(fabric)
    result = run(test, finding, step)
    assert (result.status, result.reason) == ("skipped", Reason.NO_TARGET)
    assert message in result.message
    assert test.plans.log == []


def test_unknown_links_and_a_missing_topology_fail_without_publishing(fabric: Fabric) -> None:
    test = rig(fabric)
    result = run(test, diagnosis([("link", "leaf-9a~spine-a-0")]))
    assert (result.status, result.reason) == ("failed", Reason.UNKNOWN_TARGET)
    assert "names no link of the topology" in result.message
    bare = rig(None)
    result = run(bare, diagnosis([("link", "leaf-0a~spine-a-0")]))
    assert (result.status, result.reason) == ("failed", Reason.UNKNOWN_TARGET)
    assert result.message == "no topology in the cluster state (c4 state load --topology T)"
    assert test.plans.log == bare.plans.log == []


def test_invalid_state_fails_for_good(fabric: Fabric) -> None:
    test = rig(fabric)
    test.state.broken = "test:job:job-a holds no valid placement: bad"
    result = run(test, diagnosis([("link", "leaf-0a~spine-a-0")]), tries=3)
    assert (result.status, result.reason, result.retryable) == (
        "failed",
        Reason.STATE_INVALID,
        False,
    )
    assert "tries" not in result.detail
    test = rig(fabric)
    test.plans.invalid = True
    result = run(test, diagnosis([("link", "leaf-0a~spine-a-0")]), tries=3)
    assert (result.status, result.reason) == ("failed", Reason.STATE_INVALID)
    assert test.outbox.published == []


def test_a_store_outage_is_retried(fabric: Fabric) -> None:
    test = rig(fabric, in_force(fabric))
    test.plans.down_for = 1
    result = run(test, diagnosis([("link", "leaf-0a~spine-a-0")]), tries=3)
    assert result.status == "done" and result.detail["tries"] == 2
    test = rig(fabric, in_force(fabric))
    test.plans.down_for = 5
    result = run(test, diagnosis([("link", "leaf-0a~spine-a-0")]), tries=3)
    assert (result.status, result.reason, result.retryable) == (
        "failed",
        Reason.STORE_UNAVAILABLE,
        True,
    )


def test_a_failed_save_republishes_the_same_plan(fabric: Fabric) -> None:
    current = in_force(fabric)
    link, _ = used_link(current)
    test = rig(fabric, current)

    def outage() -> None:
        test.plans.down_for = 1

    test.plans.before_replace = outage
    result = run(test, diagnosis([("link", link)], ident="d-2"), tries=3)
    assert result.status == "done" and result.detail["tries"] == 2
    (saved,) = test.plans.saved
    routes = [route for route, _ in test.outbox.published]
    half = len(routes) // 2
    assert routes[:half] == routes[half:]  # the same messages, published again
    assert {route.plan for route in routes} == {saved.id}
    assert test.plans.log.count("flush") == 2


@pytest.mark.parametrize("same_link", [True, False])
def test_a_plan_changed_meanwhile_is_replanned_and_told_nodes_are_told_again(
    fabric: Fabric, same_link: bool
) -> None:
    current = in_force(fabric)
    link, _ = used_link(current)
    test = rig(fabric, current)
    # Another worker puts its plan in force first: made for another diagnosis of the same
    # link (then nothing is left to move: the nodes told are told again all the same), or
    # for another link.
    used = sorted({x for p in current.plan.paths if p.via for x in p.links[1:-1]})
    other_link = link if same_link else next(x for x in used if x != link)
    other = reroute(fabric, JOBS, current, diagnosis([("link", other_link)], ident="d-9"), TS)

    def race() -> None:
        test.plans.plan = other.current

    test.plans.before_replace = race
    result = run(test, diagnosis([("link", link)], ident="d-2"), tries=3)

    assert result.status == "done" and result.detail["tries"] == 2
    assert result.detail["previous"] == other.current.id
    (saved,) = test.plans.saved
    assert set(saved.down) == {link, other_link, *current.down}
    log = test.plans.log
    failed_save, good_save = (i for i, line in enumerate(log) if line.startswith("save"))
    assert log[good_save] == f"save {saved.id}" != log[failed_save]
    told_first = {line.split()[1] for line in log[:failed_save] if line.startswith("publish")}
    told_again = {
        line.split()[1] for line in log[failed_save:good_save] if line.startswith("publish")
    }
    assert told_first and told_first <= told_again
    last = {route.node: route for route, _ in test.outbox.published}
    for node in told_first:
        assert last[node].plan == saved.id
        mine = {p.flow for p in saved.plan.paths if p.links[0].startswith(node + "/")}
        assert {hop.flow for hop in last[node].paths} == mine
    recorded = orjson.loads(test.state.claims[CLAIM.key][told_field(link)])
    assert set(recorded) == told_again


def test_a_fenced_claim_publishes_nothing(fabric: Fabric) -> None:
    test = rig(fabric)
    test.state.fenced = True
    result = run(test, diagnosis([("link", "leaf-0a~spine-a-0")]))
    assert (result.status, result.reason) == ("failed", Reason.FENCED)
    assert test.outbox.published == [] and test.plans.saved == []


@pytest.mark.parametrize(("kind", "ident"), [("link", "leaf-3b~spine-b-3"), ("switch", "leaf-3b")])
def test_a_resolved_correlator_finding_keeps_its_link_out(
    fabric: Fabric, kind: str, ident: str
) -> None:
    # The correlator's link_degraded resolves because the reroute moved its slow paths away:
    # giving the link back would bring them, and the finding, back.
    current = in_force(fabric)
    test = rig(fabric, current)
    resolved = diagnosis([(kind, ident)], cls="link_degraded", state="resolved")
    result = run(test, resolved)
    assert (result.status, result.reason) == ("skipped", Reason.KEPT_OUT)
    assert f"{kind} {ident} stays out of the plan" in result.message
    assert f"c4 state release {ident}" in result.message
    assert test.plans.log == [] and test.plans.plan == current  # nothing replanned or sent


def test_a_resolved_degraded_port_stays_out_until_released(fabric: Fabric) -> None:
    # Its flows failed over to the sibling port: nothing slow crosses it, so the finding
    # resolves because of the reroute; giving it back would flap.
    cable = "node-002/mlx5_0:2"
    start = in_force(fabric)
    current = CurrentPlan(start.id, start.plan, (*start.down, cable), TS)
    port = rig(fabric, current)
    back = diagnosis([("port", cable)], cls="link_degraded", state="resolved")
    result = run(port, back)
    assert (result.status, result.reason) == ("skipped", Reason.KEPT_OUT)
    assert f"c4 state release {cable}" in result.message
    assert port.plans.log == [] and port.plans.plan == current


def test_a_port_up_again_or_a_job_finding_still_gives_its_link_back(fabric: Fabric) -> None:
    cable = "node-002/mlx5_0:2"
    start = in_force(fabric)
    current = CurrentPlan(start.id, start.plan, (*start.down, cable), TS)
    port = rig(fabric, current)
    back = diagnosis([("port", cable)], cls="link_down", state="resolved")
    result = run(port, back)
    assert result.status == "done" and cable not in port.plans.saved[0].down
    link = "leaf-3b~spine-b-3"
    job = rig(fabric, start)
    of_job = diagnosis([("link", link)], cls="link_degraded", state="resolved")
    result = run(job, of_job.model_copy(update={"job": "job-a"}))
    assert result.status == "done" and job.plans.saved[0].down == ()


def test_an_unexpected_planner_error_is_a_failed_step_not_a_dead_worker(
    fabric: Fabric, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError(-1)

    monkeypatch.setattr("actions.drivers.reroute.executor.reroute", broken)
    test = rig(fabric, in_force(fabric))
    with caplog.at_level(logging.ERROR, logger="c4.actions"):
        result = run(test, diagnosis([("switch", "leaf-1a")], cls="link_degraded"), tries=3)
    assert (result.status, result.reason, result.retryable) == ("failed", Reason.NO_ROUTE, False)
    assert result.message == "the planner failed: KeyError: -1"
    (record,) = caplog.records
    assert record.exc_info is not None and "leaf-1a" in record.getMessage()
    assert test.plans.saved == [] and test.outbox.published == []


def test_a_released_link_the_plan_kept_out_is_given_back(fabric: Fabric) -> None:
    current = in_force(fabric)
    link, crossing = used_link(current)
    kept = reroute(fabric, JOBS, current, diagnosis([("link", link)]), TS).current
    assert link in kept.down
    test = rig(fabric, kept)
    back = released(test, "link", link, TS + 9, "operator")
    assert back is not None and back.links == (link,)
    assert test.plans.plan is not None and link not in test.plans.plan.down
    assert back.plan == test.plans.plan.id != kept.id
    # Routes first, then the compare-and-set, as the reroute step does.
    assert test.plans.log[-1] == f"save {back.plan}"
    assert back.routes == len(test.outbox.published)
    # Released again: nothing kept out any more, nothing to give back.
    assert released(test, "link", link, TS + 10, "op") is None
    assert crossing


def test_only_a_kept_out_link_or_switch_is_given_back(fabric: Fabric) -> None:
    test = rig(fabric, in_force(fabric))
    assert released(test, "node", "node-002", TS, "op") is None
    free = "leaf-0a~spine-a-0"
    assert released(test, "link", free, TS, "op") is None
    assert test.plans.log == [] and test.outbox.published == []
    nothing = rig(fabric, None)
    assert released(nothing, "link", free, TS, "op") is None
