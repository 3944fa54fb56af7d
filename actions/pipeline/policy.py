"""The policy stage, pure: which steps a diagnosis gets, from the class map and the limits.

Input: the diagnosis and a `View` of the cluster state (the job's placement, the job's other
recent suspect nodes, each suspect node's leaves). Output: a `Plan`, the ordered steps
(isolate per target, restart per job, one alert per matching receiver, any other registered
action per suspect) and the components to mark ``suspect`` in the state; a resolved
diagnosis gets its alerts and the steps of the actions that undo (reroute gives its link
back), and every Alertmanager receiver of its class and job its resolution. Some steps come
already decided (skipped, or failed for an unknown job); the pipeline executes the others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from actions.config import Receiver, WorkerConfig
from actions.pipeline.outcome import Reason, Result, failed, skipped
from schemas.messages import Diagnosis, Suspect

NODE_LEVEL = frozenset({"node", "gpu", "rank"})
STATEFUL = ("isolate", "restart")
# Suspects the fabric correlator names from slow paths (a port's come from its counters).
CORRELATED = frozenset({"link", "switch"})
# The evidence of a finding the fabric correlator inferred from slow paths (how many).
SLOW_PATHS = "slow_paths"
# What a resolved finding may keep out of the plan until released (`kept_out`).
KEPT_OUT_KINDS = CORRELATED | {"port"}


@dataclass(frozen=True, slots=True)
class Step:
    """One action on one target; ``verdict`` is set when the policy already decided it."""

    action: str
    target: str
    kind: str  # what the target is: node port link switch job or a suspect type
    nodes: tuple[str, ...] = ()  # restart: the job's nodes to replace; escalation: suspects
    receiver: str | None = None
    escalation: bool = False
    # An alert sent only when an earlier step of the same diagnosis failed.
    conditional: bool = False
    verdict: Result | None = None

    @property
    def key(self) -> str:
        """Unique within a diagnosis: the step's record in the claim and its action id."""
        return f"{self.action}|{self.target}|{self.receiver or ''}"


@dataclass(frozen=True, slots=True)
class View:
    """What the policy reads from the cluster state for one diagnosis."""

    job_nodes: frozenset[str] | None = None  # None: the job is not known
    rank_nodes: Mapping[int, str] = field(default_factory=dict)
    recent_suspects: frozenset[str] = frozenset()  # the job's other suspect nodes in the window
    node_leaves: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Plan:
    """The ordered steps of a diagnosis and the components to mark suspect."""

    steps: tuple[Step, ...]
    marks: tuple[tuple[str, str], ...] = ()  # (kind, id) to mark suspect
    clears: bool = False  # resolved: return this diagnosis's suspect marks to healthy


def node_of(suspect: Suspect, rank_nodes: Mapping[int, str]) -> str | None:
    """The node a node-level suspect points at (``node-003/gpu1`` -> ``node-003``)."""
    if suspect.type == "node":
        return suspect.id
    if suspect.type == "gpu":
        node, slash, _ = suspect.id.partition("/")
        return node if slash and node else None
    if suspect.type == "rank":
        _, slash, rank = suspect.id.rpartition("/rank")
        return rank_nodes.get(int(rank)) if slash and rank.isdigit() else None
    return None


def suspect_nodes(diagnosis: Diagnosis, min_score: float, view: View) -> tuple[str, ...]:
    """The distinct nodes named at or above ``min_score``, best first."""
    nodes: dict[str, None] = {}
    for suspect in diagnosis.suspects:
        if suspect.score >= min_score and suspect.type in NODE_LEVEL:
            node = node_of(suspect, view.rank_nodes)
            if node is not None:
                nodes[node] = None
    return tuple(nodes)


def kept_out(diagnosis: Diagnosis, suspect_type: str) -> bool:
    """Whether a resolved diagnosis leaves its suspect out of service and out of the plan.

    A correlator's ``link_degraded`` or ``link_down`` (a dark link) of no job, naming a
    fabric link or a switch, rests on slow paths through it (its evidence counts them); the
    reroute took them away, so it resolves because of our own action. A degraded port's
    flows failed over to its NIC's sibling port, so nothing slow crosses it any more either.
    Giving either back would bring the traffic, then the finding, back (a flap): it stays
    out until an operator releases it (see `actions.drivers.reroute.executor`). A
    ``link_down`` told by what sees the link's own state (no slow paths), or a port's own,
    resolves when the link is up again: that is given back.
    """
    if diagnosis.state != "resolved":
        return False
    if diagnosis.job is None and suspect_type in CORRELATED:
        inferred = SLOW_PATHS in diagnosis.evidence
        return diagnosis.class_ == "link_degraded" or (diagnosis.class_ == "link_down" and inferred)
    return diagnosis.class_ == "link_degraded" and suspect_type == "port"


def shared_switch(nodes: tuple[str, ...], leaves: Mapping[str, tuple[str, ...]]) -> str | None:
    """The leaf that the most of the nodes hang off (ties: the lowest id), None if unknown."""
    counts = Counter(leaf for node in nodes for leaf in set(leaves.get(node, ())))
    if not counts:
        return None
    return min(counts, key=lambda leaf: (-counts[leaf], leaf))


def plan(
    diagnosis: Diagnosis, view: View, config: WorkerConfig, undoing: frozenset[str] = frozenset()
) -> Plan:
    """The steps for one diagnosis (see the module docstring).

    ``undoing`` names the actions that run again when their diagnosis resolves, to undo what
    they did (one step per confident suspect, as when firing).
    """
    policy = config.policy
    actions = policy.classes.get(diagnosis.class_, ())
    top = diagnosis.suspects[0] if diagnosis.suspects else None
    subject = top.id if top else diagnosis.job or "fabric"
    top_score = top.score if top else 0.0
    if not actions:
        verdict = skipped(Reason.NO_POLICY, f"no actions for class {diagnosis.class_}")
        return Plan((Step("alert", subject, "diagnosis", verdict=verdict),))
    conditional = "alert" not in actions
    confident = [s for s in diagnosis.suspects if s.score >= policy.min_score]
    if diagnosis.state == "resolved":
        undo = tuple(
            Step(action, s.id, s.type) for action in actions if action in undoing for s in confident
        )
        webhooks = tuple(r for r in config.receivers if r.kind != "alertmanager")
        alerts: tuple[Step, ...] = ()
        if undo or not conditional:
            alerts = _alerts(diagnosis, webhooks, subject, top_score, conditional)
        # An Alertmanager is sent a firing alert again until told that it ended, whatever
        # made it fire (a conditional alert of a failed step too): it always hears the end.
        managers = tuple(r for r in config.receivers if r.kind == "alertmanager")
        ends = _alerts(diagnosis, managers, subject, top_score)
        return Plan((*undo, *alerts, *ends), clears=True)
    nodes = suspect_nodes(diagnosis, policy.min_score, view)
    together = set(nodes) | (view.recent_suspects if diagnosis.job else set())
    if diagnosis.job and len(together) > policy.blast_radius:
        return _blast_radius(diagnosis, view, config, actions, tuple(sorted(together)))
    steps: list[Step] = []
    for action in actions:
        if action == "alert":
            continue
        if not confident:
            message = f"no suspect scores {policy.min_score} or more"
            verdict = skipped(Reason.BELOW_MIN_SCORE, message, top_score=top_score)
            steps.append(Step(action, subject, "diagnosis", verdict=verdict))
        elif action == "isolate":
            steps.extend(_isolations(confident, nodes))
        elif action == "restart":
            steps.append(_restart(diagnosis, view, nodes))
        else:
            steps.extend(Step(action, s.id, s.type, nodes=nodes) for s in confident)
    isolated = {(s.kind, s.target) for s in steps if s.action == "isolate" and not s.verdict}
    marks = tuple(t for t in _targets(confident, nodes) if t not in isolated)
    alerts = _alerts(diagnosis, config.receivers, subject, top_score, conditional)
    if not alerts and not conditional:
        verdict = skipped(Reason.NO_RECEIVER, "no alert receiver matches this diagnosis")
        alerts = (Step("alert", subject, "diagnosis", verdict=verdict),)
    return Plan((*steps, *alerts), marks=marks)


def _targets(confident: list[Suspect], nodes: tuple[str, ...]) -> list[tuple[str, str]]:
    found = [("node", node) for node in nodes]
    for suspect in confident:
        if suspect.type in {"port", "link", "switch"}:
            # A port's own cable is named by the port (contract): it is kept as the port.
            cable = suspect.type == "link" and "/" in suspect.id
            found.append(("port" if cable else suspect.type, suspect.id))
    return list(dict.fromkeys(found))


def _isolations(confident: list[Suspect], nodes: tuple[str, ...]) -> list[Step]:
    return [Step("isolate", target, kind) for kind, target in _targets(confident, nodes)]


def _restart(diagnosis: Diagnosis, view: View, nodes: tuple[str, ...]) -> Step:
    job = diagnosis.job
    if job is None:
        verdict = skipped(Reason.NO_JOB, "a fabric-wide finding names no job to restart")
        return Step("restart", "fabric", "job", verdict=verdict)
    if view.job_nodes is None:
        verdict = failed(Reason.UNKNOWN_JOB, f"no placement of {job} recorded from c4.job.v1")
        return Step("restart", job, "job", verdict=verdict)
    if not nodes:
        verdict = skipped(Reason.NO_TARGET, "no node-level suspect to replace")
        return Step("restart", job, "job", verdict=verdict)
    inside = tuple(node for node in nodes if node in view.job_nodes)
    if not inside:
        message = f"suspects {', '.join(nodes)} are not in the placement of {job}"
        return Step("restart", job, "job", verdict=skipped(Reason.NOT_IN_JOB, message))
    return Step("restart", job, "job", nodes=inside)


def _alerts(
    diagnosis: Diagnosis,
    receivers: tuple[Receiver, ...],
    subject: str,
    score: float,
    conditional: bool = False,
    escalation: bool = False,
    nodes: tuple[str, ...] = (),
) -> tuple[Step, ...]:
    return tuple(
        Step(
            "alert",
            subject,
            "switch" if escalation else "diagnosis",
            nodes=nodes,
            receiver=receiver.name,
            escalation=escalation,
            conditional=conditional,
        )
        for receiver in receivers
        if receiver.wants(diagnosis.class_, diagnosis.job, diagnosis.state, score)
    )


def _blast_radius(
    diagnosis: Diagnosis,
    view: View,
    config: WorkerConfig,
    actions: tuple[str, ...],
    together: tuple[str, ...],
) -> Plan:
    limit = config.policy.blast_radius
    message = (
        f"{len(together)} nodes of {diagnosis.job} are suspects at once (more than {limit}):"
        " suspecting a shared component instead"
    )
    steps: list[Step] = []
    for action in actions:
        if action == "isolate":
            steps.extend(
                Step("isolate", node, "node", verdict=skipped(Reason.BLAST_RADIUS, message))
                for node in together
            )
        elif action != "alert":
            target = diagnosis.job if action == "restart" and diagnosis.job else "fabric"
            verdict = skipped(Reason.BLAST_RADIUS, message)
            steps.append(Step(action, target, "job", verdict=verdict))
    switch = shared_switch(together, view.node_leaves)
    subject = switch or diagnosis.job or "fabric"
    score = max((s.score for s in diagnosis.suspects), default=0.0)
    alerts = _alerts(diagnosis, config.receivers, subject, score, escalation=True, nodes=together)
    if not alerts:
        verdict = skipped(Reason.NO_RECEIVER, "no alert receiver matches this escalation")
        alerts = (Step("alert", subject, "switch", nodes=together, verdict=verdict),)
    marks = tuple(("node", node) for node in together)
    if switch is not None:
        marks += (("switch", switch),)
    return Plan((*steps, *alerts), marks=marks)
