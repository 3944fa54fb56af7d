"""Kubernetes as the action workers see it: node marks and the job's pods, through the API.

Every change is checked against the API server's own state first, so that a worker that
crashed half way and runs the step again changes nothing twice:
- c4's marks on a node are a cordon, a taint ``<taint_key>=<class>``, a node condition
  (``C4Healthy`` False, naming the diagnosis and the parts) and two annotations that say what
  c4 did: ``c4.io/isolated`` (each isolated part of the node and its diagnosis) and
  ``c4.io/cordoned`` (set only when c4 itself cordoned a schedulable node);
- a release removes c4's taint, condition and annotations and uncordons only a node that c4
  cordoned: a node a person cordoned stays cordoned;
- a restart touches only the job's pods on the failed nodes that were created before the
  finding began: a pod its controller placed again since is a new run, left alone.
Node changes carry the resourceVersion they were computed from; a conflict (another writer
in between) is read again and retried. With ``dry_run`` nothing is changed and the
requests are printed as the equivalent kubectl lines.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import orjson

from actions import SchedulerError
from actions.config import Scheduler

log = logging.getLogger("c4.actions.kube")

ISOLATED = "c4.io/isolated"  # annotation: {part: "<diagnosis> <class>"} of the node's parts
CORDONED = "c4.io/cordoned"  # annotation: "true" when c4 cordoned the node
ORIGIN = "c4.io/origin"  # annotation of a recreated pod: the first pod's name
GENERATION = "c4.io/generation"  # annotation of a recreated pod: how many times recreated
RESTARTED_FOR = "c4.io/restarted-for"  # annotation of a recreated pod: the diagnosis
CONFLICT_TRIES = 8
MAX_MESSAGE = 1000
# Fields of a pod that the API server sets; a recreated pod leaves them out.
_SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


class KubeError(SchedulerError):
    """A Kubernetes API request failed; ``retryable`` when the server could not answer."""


class Answer(StrEnum):
    """How a change request ended, the API server's state checked first."""

    DONE = "done"
    ALREADY = "already"  # the change was made before (a retry, or another worker)
    HELD = "held"  # a person cordoned the node before c4: c4 marked it, not cordoned it
    NOT_ISOLATED = "not_isolated"  # release: c4 has no mark on the node
    KEPT = "kept"  # release: c4 isolated another part of the node, which stays isolated


class Api(Protocol):
    """The few API requests c4 makes (the real ones: `official_api.ClientApi`)."""

    def get(self, path: str) -> dict[str, Any]:
        """GET a resource; KubeError (status 404 included) when it fails."""

    def patch(self, path: str, body: Any, content_type: str) -> dict[str, Any]:
        """PATCH a resource with a body of ``content_type``."""

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a new resource to a collection."""

    def delete(self, path: str, grace_period_s: int) -> None:
        """DELETE a resource with a grace period."""


class ApiStatus(KubeError):
    """The API server answered with an error status (404, 409...)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message, retryable=status == 429 or status >= 500)
        self.status = status


@dataclass(frozen=True, slots=True)
class PodRestart:
    """What a restart did to a job's pods on the failed nodes."""

    deleted: tuple[str, ...]  # namespace/name of pods deleted for their controller
    recreated: tuple[tuple[str, str], ...]  # (old, new) of plain pods placed off the nodes

    @property
    def changed(self) -> bool:
        """Whether any pod was deleted or recreated."""
        return bool(self.deleted or self.recreated)


def condition_reason(diagnosis_class: str) -> str:
    """A diagnosis class as a CamelCase condition reason (``noncomm_hang`` -> NoncommHang)."""
    return "".join(word.capitalize() for word in re.split(r"[^A-Za-z0-9]+", diagnosis_class))


def isolated_parts(node: dict[str, Any]) -> dict[str, str]:
    """The parts of a node c4 isolated (its annotation); empty when none or unreadable."""
    text = _annotations(node).get(ISOLATED)
    if not text:
        return {}
    try:
        parts = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(parts, dict):
        return {}
    return {str(part): str(why) for part, why in parts.items()}


def label_value_ok(value: str) -> bool:
    """Whether a job id can be a label value (63 characters of ``[A-Za-z0-9_.-]``)."""
    return re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", value) is not None


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("annotations") or {})


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _timestamp_s(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Kube:
    """Isolate, release and restart, each idempotent against the API server's state."""

    def __init__(self, api: Api, scheduler: Scheduler, *, dry_run: bool = False) -> None:
        self._api = api
        self._scheduler = scheduler
        self.dry_run = dry_run

    # -- nodes -------------------------------------------------------------------------

    def node(self, name: str) -> dict[str, Any]:
        """One node as the API server has it; KubeError when it has none of that name."""
        try:
            return self._api.get(f"/api/v1/nodes/{name}")
        except ApiStatus as error:
            if error.status == 404:
                message = f"node {name!r} is not in the cluster"
                raise KubeError(message, retryable=False) from None
            raise

    def isolate(self, name: str, part: str, diagnosis: str, diagnosis_class: str) -> Answer:
        """Cordon, taint and condition a node for one of its parts (the node itself, a GPU,
        a port). A node cordoned by a person gets c4's taint and condition, and stays the
        person's cordon (``held``)."""
        answer = self._update_node(
            name, lambda node: self._isolated(node, part, diagnosis, diagnosis_class)
        )
        # The condition after the spec: a crash in between leaves the part recorded, and the
        # step run again sets the condition (it is set every time: one strategic merge).
        parts = isolated_parts(self.node(name))
        if self.dry_run:
            parts[part] = f"{diagnosis} {diagnosis_class}"
        self._set_condition(name, parts)
        return answer

    def release(self, name: str, part: str | None = None) -> Answer:
        """Undo c4's marks for a part (None or the node itself: every part of the node).

        The condition goes first, the taint, cordon and annotations after it: a crash in
        between leaves marks a second release still finds and removes.
        """
        parts = isolated_parts(self.node(name))
        if not parts:
            return Answer.NOT_ISOLATED
        left = {} if part in (None, name) else {p: w for p, w in parts.items() if p != part}
        if part not in (None, name) and part not in parts:
            return Answer.KEPT
        if left:
            self._update_node(name, lambda node: self._kept(node, left))
            self._set_condition(name, left)
            return Answer.KEPT
        self._remove_condition(name)
        self._update_node(name, self._cleared)
        return Answer.DONE

    def _isolated(
        self, node: dict[str, Any], part: str, diagnosis: str, diagnosis_class: str
    ) -> tuple[Answer, dict[str, Any] | None]:
        spec = node.get("spec", {})
        parts = isolated_parts(node)
        cordoned = spec.get("unschedulable") is True
        key = self._scheduler.taint_key
        others = [t for t in spec.get("taints") or [] if t.get("key") != key]
        ours = next((t for t in spec.get("taints") or [] if t.get("key") == key), None)
        if part in parts:
            if cordoned and ours is not None:
                return Answer.ALREADY, None
            answer = Answer.ALREADY  # recorded, a mark missing: put it back as it was
        elif cordoned and not parts and _annotations(node).get(CORDONED) != "true":
            answer = Answer.HELD  # a person cordoned it: c4 marks it, the cordon stays theirs
        else:
            answer = Answer.DONE
        if ours is None or part not in parts:
            effect = self._scheduler.effect_for(diagnosis_class)
            ours = {"key": key, "value": diagnosis_class, "effect": effect}
        annotations: dict[str, Any] = {
            ISOLATED: orjson.dumps({**parts, part: f"{diagnosis} {diagnosis_class}"}).decode()
        }
        if not cordoned:
            annotations[CORDONED] = "true"
        patch = {
            "metadata": {"annotations": annotations},
            "spec": {"unschedulable": True, "taints": [*others, ours]},
        }
        return answer, patch

    def _kept(
        self, node: dict[str, Any], left: dict[str, str]
    ) -> tuple[Answer, dict[str, Any] | None]:
        del node
        return Answer.KEPT, {"metadata": {"annotations": {ISOLATED: orjson.dumps(left).decode()}}}

    def _cleared(self, node: dict[str, Any]) -> tuple[Answer, dict[str, Any] | None]:
        spec = node.get("spec", {})
        key = self._scheduler.taint_key
        taints = [t for t in spec.get("taints") or [] if t.get("key") != key]
        patch: dict[str, Any] = {
            "metadata": {"annotations": {ISOLATED: None, CORDONED: None}},
            "spec": {"taints": taints or None},
        }
        if _annotations(node).get(CORDONED) == "true":
            patch["spec"]["unschedulable"] = None
        return Answer.DONE, patch

    def _update_node(
        self,
        name: str,
        change: Callable[[dict[str, Any]], tuple[Answer, dict[str, Any] | None]],
    ) -> Answer:
        """Read, compute the patch, write it against the version read; again on a conflict."""
        for _ in range(CONFLICT_TRIES):
            node = self.node(name)
            answer, patch = change(node)
            if patch is None:
                return answer
            patch["metadata"]["resourceVersion"] = node["metadata"]["resourceVersion"]
            try:
                self._write(
                    f"/api/v1/nodes/{name}",
                    patch,
                    "application/merge-patch+json",
                    _node_kubectl(name, patch),
                )
            except ApiStatus as error:
                if error.status == 409:
                    continue  # somebody wrote the node in between: read it again
                raise
            return answer
        message = f"node {name}: {CONFLICT_TRIES} conflicting writes in a row"
        raise KubeError(message, retryable=True)

    def _set_condition(self, name: str, parts: dict[str, str]) -> None:
        if not parts:
            return
        diagnosis_class = sorted(parts.values())[0].split(" ", 1)[-1]
        text = "; ".join(f"{part}: c4:{why}" for part, why in sorted(parts.items()))
        now = _now()
        condition = {
            "type": self._scheduler.condition_type,
            "status": "False",
            "reason": condition_reason(diagnosis_class),
            "message": f"c4 isolated {text}"[:MAX_MESSAGE],
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        self._write(
            f"/api/v1/nodes/{name}/status",
            {"status": {"conditions": [condition]}},
            "application/strategic-merge-patch+json",
            f"# node {name}: condition {self._scheduler.condition_type}=False",
        )

    def _remove_condition(self, name: str) -> None:
        conditions = self.node(name).get("status", {}).get("conditions") or []
        if not any(c.get("type") == self._scheduler.condition_type for c in conditions):
            return
        gone = {"type": self._scheduler.condition_type, "$patch": "delete"}
        body = {"status": {"conditions": [gone]}}
        self._write(
            f"/api/v1/nodes/{name}/status",
            body,
            "application/strategic-merge-patch+json",
            f"# node {name}: condition {self._scheduler.condition_type} removed",
        )

    def _write(self, path: str, body: Any, content_type: str, kubectl: str) -> None:
        if self.dry_run:
            print(kubectl, file=sys.stdout)
            return
        log.info("kubernetes: %s", kubectl)
        self._api.patch(path, body, content_type)

    # -- pods --------------------------------------------------------------------------

    def job_pods(
        self, job: str, nodes: Sequence[str], named: Sequence[str] = ()
    ) -> list[dict[str, Any]]:
        """The job's pods bound to any of ``nodes``: those labelled ``<job_label>=<job>``
        and those the ranks named in the job's placement (``named``), each once."""
        wanted = set(nodes)
        pods = {
            _ident(pod): pod
            for pod in self.labelled_pods(job)
            if pod.get("spec", {}).get("nodeName") in wanted
        }
        unlisted = [ident for ident in named if ident not in pods]
        for pod in self.named_pods(unlisted, nodes):
            pods[_ident(pod)] = pod
        return [pods[ident] for ident in sorted(pods)]

    def labelled_pods(self, job: str) -> list[dict[str, Any]]:
        """Every pod labelled ``<job_label>=<job>``, wherever it is bound."""
        if not label_value_ok(job):
            message = f"job id {job!r} cannot be a label value: no pod can carry it"
            raise KubeError(message, retryable=False)
        namespace = self._scheduler.namespace
        where = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        selector = f"{self._scheduler.job_label}={job}"
        return list(self._api.get(f"{where}?labelSelector={selector}").get("items") or [])

    def created_since(self, job: str, onset_ns: int) -> list[str]:
        """The job's labelled pods, wherever bound, created after ``onset_ns``: a run placed
        since a finding began."""
        return self.split_by_onset(self.labelled_pods(job), onset_ns)[1]

    def named_pods(self, idents: Sequence[str], nodes: Sequence[str]) -> list[dict[str, Any]]:
        """The pods named ``namespace/name`` (the ranks' own reports) bound to ``nodes``;
        a pod gone already is left out."""
        found = []
        for ident in sorted(set(idents)):
            namespace, _, name = ident.partition("/")
            if not namespace or not name:
                continue
            try:
                pod = self._api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            except ApiStatus as error:
                if error.status == 404:
                    continue
                raise
            if pod.get("spec", {}).get("nodeName") in set(nodes):
                found.append(pod)
        return found

    def split_by_onset(
        self, pods: Sequence[dict[str, Any]], onset_ns: int
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """The pods created before the finding began, and the names of those created after
        it (placed again since: a run the finding is not about)."""
        older, newer = [], []
        for pod in pods:
            meta = pod["metadata"]
            created = _timestamp_s(meta.get("creationTimestamp"))
            if created is not None and created > onset_ns / 1e9:
                newer.append(f"{meta['namespace']}/{meta['name']}")
            else:
                older.append(pod)
        return older, newer

    def restart(
        self,
        pods: Sequence[dict[str, Any]],
        diagnosis: str,
        nodes: Sequence[str],
        deleted: Callable[[], None] = lambda: None,
    ) -> PodRestart:
        """Take pods off ``nodes``: delete a controller's pods (the controller places them
        again, away from the cordoned nodes), recreate a plain pod with an affinity that
        keeps it off them."""
        gone: list[str] = []
        recreated: list[tuple[str, str]] = []
        for pod in pods:
            meta = pod["metadata"]
            ident = f"{meta['namespace']}/{meta['name']}"
            if meta.get("deletionTimestamp"):
                gone.append(ident)  # on its way out already (a retry, or its controller)
                continue
            if _controlled(pod):
                gone.append(ident)
            else:
                replacement = self._recreate(pod, diagnosis, nodes)
                recreated.append((ident, f"{meta['namespace']}/{replacement}"))
            self._delete_pod(meta["namespace"], meta["name"])
            deleted()  # a test's crash point: a pod deleted, the step not recorded
        return PodRestart(tuple(gone), tuple(recreated))

    def _recreate(self, pod: dict[str, Any], diagnosis: str, nodes: Sequence[str]) -> str:
        """Create the pod's replacement (a deterministic name: a retry finds it made)."""
        body = replacement_pod(pod, diagnosis, nodes)
        name = body["metadata"]["name"]
        namespace = pod["metadata"]["namespace"]
        if self.dry_run:
            print(f"# create pod {namespace}/{name} off {','.join(nodes)}", file=sys.stdout)
            return str(name)
        try:
            self._api.create(f"/api/v1/namespaces/{namespace}/pods", body)
        except ApiStatus as error:
            if error.status != 409:
                raise
        return str(name)

    def _delete_pod(self, namespace: str, name: str) -> None:
        grace = self._scheduler.grace_period_s
        line = shlex.join(
            ["kubectl", "delete", "pod", "-n", namespace, name, f"--grace-period={grace}"]
        )
        if self.dry_run:
            print(line, file=sys.stdout)
            return
        log.info("kubernetes: %s", line)
        try:
            self._api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", grace)
        except ApiStatus as error:
            if error.status != 404:
                raise


def _ident(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _controlled(pod: dict[str, Any]) -> bool:
    owners = pod.get("metadata", {}).get("ownerReferences") or []
    return any(owner.get("controller") is True for owner in owners)


def replacement_pod(pod: dict[str, Any], diagnosis: str, nodes: Sequence[str]) -> dict[str, Any]:
    """A plain pod's replacement: its spec unbound and kept off ``nodes``, its labels, a
    name that counts the times it was recreated."""
    meta = pod["metadata"]
    annotations = _annotations(pod)
    origin = annotations.get(ORIGIN, meta["name"])
    generation = int(annotations.get(GENERATION, "0") or "0") + 1
    name = f"{origin}-c4r{generation}"
    spec = {k: v for k, v in pod.get("spec", {}).items() if k != "nodeName"}
    spec["affinity"] = _kept_off(spec.get("affinity") or {}, nodes)
    metadata = {k: v for k, v in meta.items() if k not in (*_SERVER_FIELDS, "name", "selfLink")}
    metadata.pop("deletionTimestamp", None)
    metadata.pop("deletionGracePeriodSeconds", None)
    metadata["name"] = name
    metadata["annotations"] = {
        **annotations,
        ORIGIN: origin,
        GENERATION: str(generation),
        RESTARTED_FOR: diagnosis,
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _kept_off(affinity: dict[str, Any], nodes: Sequence[str]) -> dict[str, Any]:
    """An affinity with every required node term also excluding ``nodes`` by name."""
    field = {"key": "metadata.name", "operator": "NotIn", "values": sorted(set(nodes))}
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(term) for term in required.get("nodeSelectorTerms") or [{}]]
    for term in terms:
        fields = [f for f in term.get("matchFields") or [] if f != field]
        term["matchFields"] = [*fields, field]
    required["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    return {**affinity, "nodeAffinity": node_affinity}


def _node_kubectl(name: str, patch: dict[str, Any]) -> str:
    """A node patch as the kubectl line that does the same (for logs and dry runs)."""
    metadata = {k: v for k, v in patch["metadata"].items() if k != "resourceVersion"}
    body = {**patch, "metadata": metadata}
    return shlex.join(
        ["kubectl", "patch", "node", name, "--type=merge", "-p", orjson.dumps(body).decode()]
    )
