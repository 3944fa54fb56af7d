"""Node agent: sources of collective, link and GPU events, and the Kafka publisher."""


class ProducerError(Exception):
    """Root of every error raised by the producers layer."""
