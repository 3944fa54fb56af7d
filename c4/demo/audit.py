"""The chaos run's audit: what the system did twice, or a spare it leaked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from schemas.messages import Action, Diagnosis


def audit(
    diagnoses: Sequence[Diagnosis],
    actions: Sequence[Action],
    spares_before: Iterable[str],
    snapshot: Mapping[str, Any],
) -> list[str]:
    """What the run did twice or leaked, one line each (empty: exactly once throughout).

    A diagnosis (id, state) on the topic more than once; an action done twice for one
    diagnosis and target (a record repeated with its own id is one outcome delivered
    twice, not a second action); a node isolated twice; a spare taken but placed in no
    job (or in two), or placed without a restart that says so.
    """
    problems = []
    for (ident, state), count in Counter((d.id, d.state) for d in diagnoses).items():
        if count > 1:
            problems.append(f"diagnosis {ident} ({state}) published {count} times")
    outcomes = {action.id: action for action in actions if action.status == "done"}
    # An alert goes once per receiver when a finding fires and once when it resolves.
    done = Counter(
        (a.diagnosis, a.action, a.target, a.detail.get("state"), a.detail.get("receiver"))
        for a in outcomes.values()
    )
    for (diagnosis, name, target, finding_state, _), count in done.items():
        if count > 1:
            when = f" ({finding_state})" if finding_state else ""
            problems.append(f"{name} {target} done {count} times for diagnosis {diagnosis}{when}")
    isolated = Counter(a.target for a in outcomes.values() if a.action == "isolate")
    for target, count in isolated.items():
        if count > 1:
            problems.append(f"{target} isolated {count} times")
    placed = []
    for action in outcomes.values():
        replaced = action.detail.get("replaced") if action.action == "restart" else None
        if isinstance(replaced, dict):
            placed += [str(new) for new in replaced.values()]
    taken = sorted(set(spares_before) - set(snapshot.get("spares", ())))
    if sorted(placed) != taken:
        problems.append(f"spares taken from the pool {taken}, placed by restarts {sorted(placed)}")
    jobs_of: Counter[str] = Counter(
        node for job in snapshot.get("jobs", ()) for node in job.get("nodes", ())
    )
    for node in taken:
        if jobs_of[node] != 1:
            problems.append(f"spare {node} taken from the pool but in {jobs_of[node]} jobs")
    return problems
