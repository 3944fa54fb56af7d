"""The simulator's root exception."""


class SimulatorError(Exception):
    """Root of every error raised by the cluster simulator."""
