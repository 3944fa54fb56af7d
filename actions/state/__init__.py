"""The cluster state held in Redis: topology, component states, jobs, spares, claims, audit."""

from actions import ActionsError


class StateError(ActionsError):
    """A request the cluster state refuses (unknown id, wrong state); the message is one line."""


class StateUnavailable(ActionsError):  # noqa: N818 - reads as what it is
    """Redis did not answer or failed; the caller retries later, nothing was committed."""
