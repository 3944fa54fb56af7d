"""The fabric: nodes, ports, leaf and spine switches, links, paths and the ECMP hash."""


class TopologyError(Exception):
    """Root of every error raised by the topology layer."""
