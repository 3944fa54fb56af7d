"""The names a deployment owns, all derived from one setting: ``C4_DEPLOYMENT``.

Deployment ``D`` puts ``D.`` before each of today's names: its topics (``D.c4.job.v1``),
consumer groups (``D.c4-actions``), Faust app id (``D.c4-streams``, so its changelog and
internal topics too), Redis keys (``D.c4:...``), and it keeps its files in
``<stack dir>/deployments/D``. Two deployments on one broker and one Redis therefore share
no name. The empty deployment keeps today's names, so an existing one keeps its topics,
groups, state and keys.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

# Letters, digits, '-' and '_': valid in a topic name, a group id, a Redis key and a folder
# name. No '.': the first '.' of an owned name ends the deployment, so deployment "a" owns
# no name of deployment "a-b".
DEPLOYMENT_PATTERN = r"^([A-Za-z0-9][A-Za-z0-9_-]*)?$"
DEPLOYMENT_MAX_LENGTH = 48
SEPARATOR = "."

# Today's names: those of the empty deployment.
STREAMS_APP_ID = "c4-streams"
ACTIONS_GROUP = "c4-actions"
DASHBOARD_GROUP = "c4-dashboard"
REDIS_KEY_PREFIX = "c4"
DEPLOYMENTS_FOLDER = "deployments"
# The empty deployment's topics are named c4.<kind>.v1: a deployment "c4" would seem to own them.
RESERVED = frozenset({"c4"})


def checked_deployment(deployment: str) -> str:
    """``deployment`` if no name of another deployment starts with its own; ValueError if not."""
    if deployment in RESERVED:
        message = f"{deployment!r} is reserved: the plain topic names start with it"
        raise ValueError(message)
    return deployment


@dataclass(frozen=True, slots=True)
class DeploymentNames:
    """The names of one deployment (``deployment`` already validated; empty: today's)."""

    deployment: str = ""

    def owned(self, name: str) -> str:
        """``name`` as this deployment's: ``<deployment>.<name>``, or ``name`` for the empty one."""
        return f"{self.deployment}{SEPARATOR}{name}" if self.deployment else name

    @property
    def topic_prefix(self) -> str:
        """What goes before every topic name unless ``C4_TOPIC_PREFIX`` says otherwise."""
        return self.owned("")

    @property
    def redis_key_prefix(self) -> str:
        """What goes before every Redis key unless ``C4_REDIS_KEY_PREFIX`` says otherwise."""
        return self.owned(REDIS_KEY_PREFIX)

    @property
    def streams_app_id(self) -> str:
        """The streams workers' Faust app id: their consumer group and topic names' start."""
        return self.owned(STREAMS_APP_ID)

    @property
    def actions_group(self) -> str:
        """The actions workers' consumer group."""
        return self.owned(ACTIONS_GROUP)

    def dashboard_group(self) -> str:
        """A new consumer group for one dashboard's feed (each reads every record)."""
        return self.owned(f"{DASHBOARD_GROUP}-{uuid.uuid4().hex[:8]}")

    def data_dir(self, stack_dir: Path) -> Path:
        """The folder of this deployment's files (Faust state, agent spool) under the stack's."""
        return stack_dir / DEPLOYMENTS_FOLDER / self.deployment if self.deployment else stack_dir
