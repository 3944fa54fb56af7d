"""What the torch instrumentation needs of c10d: its op names, and every group created later.

`HOOK_OPS` maps c10d's ``HookOpName`` members to the contract's ops; `watch_new_groups`
wraps c10d's process-group factory once, so that a watcher (an instrumentation's
``attach``) hooks every group at its birth. torch is imported only when these are called.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from schemas.messages import OpName

GroupWatcher = Callable[[Any, list[int] | None], None]  # (process group, its global ranks)

# c10d's HookOpName members -> the contract's op (gather and scatter have none: not recorded)
HOOK_OPS: dict[str, OpName] = {
    "SEND": "send",
    "RECV": "recv",
    "BROADCAST": "broadcast",
    "ALLREDUCE": "allreduce",
    "ALLREDUCE_COALESCED": "allreduce",
    "REDUCE": "reduce",
    "ALLGATHER": "allgather",
    "ALLGATHER_BASE": "allgather",
    "ALLGATHER_COALESCED": "allgather",
    "ALLGATHER_INTO_TENSOR_COALESCED": "allgather",
    "REDUCE_SCATTER": "reducescatter",
    "REDUCE_SCATTER_BASE": "reducescatter",
    "REDUCE_SCATTER_TENSOR_COALESCED": "reducescatter",
    "ALLTOALL": "alltoall",
    "ALLTOALL_BASE": "alltoall",
    "BARRIER": "barrier",
}


def c10d_hook_names() -> Any:
    """c10d's HookOpName enum."""
    from torch._C import _distributed_c10d

    return _distributed_c10d.HookOpName


def hook_ops() -> dict[Any, OpName]:
    """c10d's HookOpName members (those this torch has) -> the contract's op."""
    names = c10d_hook_names()
    return {getattr(names, name): op for name, op in HOOK_OPS.items() if hasattr(names, name)}


_GROUP_WATCHERS: list[GroupWatcher] = []
_WATCHING: dict[str, bool] = {}


def watch_new_groups(c10d: Any, watcher: GroupWatcher) -> None:
    """Call ``watcher(group, members)`` for every process group created from now on."""
    _GROUP_WATCHERS.append(watcher)
    _wrap_group_factory(c10d)


def stop_watching(watcher: GroupWatcher) -> None:
    """No more calls to ``watcher`` (nothing when it was not watching)."""
    if watcher in _GROUP_WATCHERS:
        _GROUP_WATCHERS.remove(watcher)


def _wrap_group_factory(c10d: Any) -> None:
    """Wrap c10d's group factory once, so every group created later is hooked at birth."""
    if _WATCHING.get("helper"):
        return
    original = c10d._new_process_group_helper

    @functools.wraps(original)
    def helper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        members = kwargs.get("global_ranks_in_group", args[2] if len(args) > 2 else None)
        for watcher in list(_GROUP_WATCHERS):
            watcher(result[0], list(members) if members is not None else None)
        return result

    c10d._new_process_group_helper = helper
    _WATCHING["helper"] = True
