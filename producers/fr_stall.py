"""Which ranks stopped issuing work, from the lagging sequence ids of every group.

Every member of a process group issues the group's collectives in one order, numbered by
``collective_seq_id``. In a group with an unfinished collective, the members that issued
fewer than the others are behind. A rank behind is taken for stopped (a thread holding the
GIL, a GPU error that hangs the next CUDA call) unless it is waiting:
- its last call is unfinished and it is behind only in groups that span pipeline stages
  (groups holding both ranks of a point-to-point pair, such as the world): their members are
  at other points of the step, so lagging there is what a host held at a sync looks like
  (an NCCL call returns once enqueued; the host stops where it reads a result);
- or its last call holds its thread (a CPU backend: gloo, or one the hook records) and no
  member of that call's group issued more there (it waits in it, as its group does).
Tensor-, data- and expert-parallel groups run one part of the model in step, so a member
ahead there went past where the others wait: a rank behind there stopped on its own.

How far a rank issued and finished in each group comes from its entries and from
``pg_status`` (last enqueued and completed collective per group, kept whole when the ring
buffer dropped the entries). ``pg_status`` is keyed by the rank's own index of the group
(``pg_id``): entries pair the two, and where the ring buffer kept no entry of a group, the
k-th of the rank's groups in ``pg_config`` (in the order torch names them) is its k-th index.
With timing off this is what tells a stopped rank from one that waits: nothing says whether
an issued operation started. A GPU that stops while its host waits in a sync leaves nothing
in such a dump to tell it from the GPUs waiting for it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from producers.fr_dump import RankDump
from producers.fr_entries import Entry, scalar_text


@dataclass(slots=True)
class Progress:
    """How far one rank issued and finished the collectives of one group (-1: none)."""

    issued: int = -1
    finished: int = -1


@dataclass(slots=True)
class RankState:
    """What a rank's dumps say of its progress."""

    groups: dict[str, Progress] = field(default_factory=dict)
    last: Entry | None = None  # its last call


def _local_names(rank_dump: RankDump) -> dict[str, str]:
    """A dump's ``pg_id`` (as ``pg_status`` keys it) -> global group name."""
    names: dict[str, str] = {}
    for entry in rank_dump.dump["entries"]:
        if not isinstance(entry, Mapping):
            continue
        try:
            pg_id = scalar_text(entry.get("pg_id"))
            group = entry.get("process_group")
            name = scalar_text(group[0]) if isinstance(group, list | tuple) and group else None
        except TypeError:
            continue
        if name is not None:
            names.setdefault(pg_id, name)
    config = rank_dump.dump.get("pg_config")
    if not isinstance(config, Mapping):
        return names
    # Groups are created in the order of their names (a counter), a rank's own indexes count
    # them up from 0: used only where it agrees with every pair the entries show.
    ordered = sorted(
        (key for key in config if isinstance(key, str) and key.isascii() and key.isdigit()),
        key=lambda key: (len(key.lstrip("0")), key.lstrip("0")),  # as numbers, however long
    )
    by_order = {str(index): name for index, name in enumerate(ordered)}
    if all(by_order.get(pg_id) == name for pg_id, name in names.items()):
        for pg_id, name in by_order.items():
            names.setdefault(pg_id, name)
    return names


def _status_of(rank_dump: RankDump) -> dict[str, Progress]:
    status = rank_dump.dump.get("pg_status")
    result: dict[str, Progress] = {}
    if not isinstance(status, Mapping):
        return result
    names = _local_names(rank_dump)
    for key, value in status.items():
        name = names.get(key) if isinstance(key, str) else None
        if name is None or not isinstance(value, Mapping):
            continue
        issued = value.get("last_enqueued_collective")
        finished = value.get("last_completed_collective")
        progress = result.setdefault(name, Progress())
        if isinstance(issued, int) and not isinstance(issued, bool):
            progress.issued = max(progress.issued, issued)
        if isinstance(finished, int) and not isinstance(finished, bool):
            progress.finished = max(progress.finished, finished)
    return result


def rank_states(dumps: list[RankDump], entries: list[Entry]) -> dict[int, RankState]:
    """Each rank's progress per group (all its dumps together) and its last call."""
    states: dict[int, RankState] = defaultdict(RankState)
    for rank_dump in dumps:
        state = states[rank_dump.rank]
        for name, progress in _status_of(rank_dump).items():
            known = state.groups.setdefault(name, Progress())
            known.issued = max(known.issued, progress.issued)
            known.finished = max(known.finished, progress.finished)
    for entry in entries:
        state = states[dumps[entry.file].rank]
        if state.last is None or (entry.enter_ns, entry.order) > (
            state.last.enter_ns,
            state.last.order,
        ):
            state.last = entry
        if entry.p2p:
            continue
        progress = state.groups.setdefault(entry.group, Progress())
        progress.issued = max(progress.issued, entry.seq)
        if entry.end_ns is not None:
            progress.finished = max(progress.finished, entry.seq)
    return dict(states)


def stopped_ranks(
    dumps: list[RankDump], entries: list[Entry], members: Mapping[str, tuple[int, ...]]
) -> dict[int, str]:
    """Global rank -> why it is taken for stopped (one line), for each rank left behind."""
    states = rank_states(dumps, entries)

    def issued(rank: int, group: str) -> int | None:
        state = states.get(rank)
        progress = state.groups.get(group) if state is not None else None
        return progress.issued if progress is not None and progress.issued >= 0 else None

    behind: dict[int, dict[str, str]] = defaultdict(dict)
    for group, ranks in members.items():
        known = {rank: issued(rank, group) for rank in ranks}
        counts = {rank: n for rank, n in known.items() if n is not None}
        if len(counts) < 2 or len(set(counts.values())) < 2:
            continue
        front = max(counts.values())
        # Only what is still unfinished counts: a member that went on and finished is
        # just ahead (its dump written later), not waiting on the others.
        waiting = any(
            n == front and states[rank].groups[group].finished < n for rank, n in counts.items()
        )
        if not waiting:
            continue
        for rank, n in counts.items():
            if n < front:
                behind[rank][group] = f"{group} ({n} of {front})"

    spanning = _spanning(entries, members, {g for gs in behind.values() for g in gs})
    stopped: dict[int, str] = {}
    for rank, groups in sorted(behind.items()):
        last = states[rank].last
        if last is not None and last.end_ns is None:
            if all(g in spanning for g in groups):
                continue  # it waits in its last call; behind only ranks at other stages
            mine = issued(rank, last.group)
            if last.holds_thread and not any(
                (issued(peer, last.group) or -1) > (-1 if mine is None else mine)
                for peer in members.get(last.group, ())
            ):
                continue  # held in a call no member of its group went past
        why = "its GPU is idle" if last is None or last.end_ns is not None else "others went on"
        stopped[rank] = f"behind in group {', '.join(list(groups.values())[:4])}; {why}"
    return stopped


def _spanning(
    entries: list[Entry], members: Mapping[str, tuple[int, ...]], groups: set[str]
) -> set[str]:
    """Which of ``groups`` hold two members of a point-to-point group: they span pipeline stages
    (the members of a group that sends and receives between its members are at different
    stages). Found from any dump's entries of the point-to-point group, not each pair's: a
    rank's ring buffer may have kept none of its own.

    Tensor-, data- and expert-parallel groups run one part of the model in step: a member
    ahead there went past where the others wait. A group spanning the stages (the world)
    holds ranks at other points of the step, ahead or behind for no fault of theirs.
    """
    stages: dict[frozenset[int], int] = {}
    for name in sorted({entry.group for entry in entries if entry.p2p}):
        stages.setdefault(frozenset(members.get(name, ())), len(stages))
    stage_of: dict[int, list[int]] = defaultdict(list)
    for ranks, stage in stages.items():
        for rank in ranks:
            stage_of[rank].append(stage)
    spanning: set[str] = set()
    for name in groups:
        seen: set[int] = set()
        for rank in members.get(name, ()):
            mine = stage_of.get(rank, ())
            if seen.intersection(mine):
                spanning.add(name)
                break
            seen.update(mine)
    return spanning
