"""The installed c4's version, as the workers report it (``c4_build_info``)."""

from __future__ import annotations

from importlib import metadata


def installed_version() -> str:
    """The c4 distribution's version; ``unknown`` when run from a tree not installed."""
    try:
        return metadata.version("c4")
    except metadata.PackageNotFoundError:
        return "unknown"
