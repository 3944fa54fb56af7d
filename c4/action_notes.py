"""An action record said in a few words, for the demo's timeline and the dashboard alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from schemas.messages import Action


@dataclass(frozen=True, slots=True)
class ActionNote:
    """One recorded action, said in a few words."""

    action: str
    target: str
    status: str
    text: str
    ts_ns: int
    detail: Mapping[str, object]


def note(action: Action) -> ActionNote:
    """An action record in a few words (``restart job-a: node-005 -> node-000 (same leaf)``)."""
    detail = action.detail
    text = f"{action.action} {action.target}"
    replaced = detail.get("replaced")
    if action.action == "restart" and isinstance(replaced, dict):
        tiers = detail.get("tiers")
        moves = []
        for old, new in replaced.items():
            tier = tiers.get(str(new)) if isinstance(tiers, dict) else None
            moves.append(f"{old} -> {new}" + (f" ({tier})" if tier else ""))
        text += ": " + ", ".join(moves)
    elif action.action == "reroute":
        before, after = _number(detail, "before_max_util"), _number(detail, "after_max_util")
        bound = _number(detail, "bound")
        if after is not None:
            was = "-" if before is None else f"{before:.2f}"
            text += f": max link util {was} -> {after:.2f}"
            if before is not None and bound is not None and after > before:
                # The plan before had the failed links: losing them can force a higher
                # maximum. Say how high it must be, so a raise reads as what it is.
                text += f" (at least {bound:.2f} without it)"
        moved = detail.get("moved")
        if isinstance(moved, int | list):
            count = moved if isinstance(moved, int) else len(moved)
            text += f", {count} flows moved"
    elif action.action == "alert" and isinstance(detail.get("receiver"), str):
        text = f"alert {detail['receiver']}"
    if action.status != "done":
        text += f" [{action.status}: {detail.get('reason', '')}]"
    return ActionNote(action.action, action.target, action.status, text, action.ts_ns, detail)


def _number(detail: Mapping[str, object], key: str) -> float | None:
    value = detail.get(key)
    return float(value) if isinstance(value, int | float) else None
