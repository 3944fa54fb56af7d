"""Action workers: the pipeline of a diagnosis, the drivers, the Redis-held cluster state."""


class ActionsError(Exception):
    """Root of every error raised by the actions layer."""


class SchedulerError(ActionsError):
    """A scheduler (Slurm, Kubernetes) refused a request or did not answer (``retryable``)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable
