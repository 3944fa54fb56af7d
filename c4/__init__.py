"""The c4 command line: settings, the local stack, topic administration."""


class C4Error(Exception):
    """Root of every error raised by the command-line layer."""
