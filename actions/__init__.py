"""Action workers, the traffic planner and the Redis-held cluster state."""


class ActionsError(Exception):
    """Root of every error raised by the actions layer."""
