"""The v1 wire contract: models, topic registry, codec and validating decoder."""


class SchemaError(Exception):
    """Root of every error raised by the schemas layer."""
