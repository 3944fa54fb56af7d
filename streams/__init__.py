"""Stream processing: the pure detection core and the Faust app around it."""


class StreamsError(Exception):
    """Root of every error raised by the streams layer."""
