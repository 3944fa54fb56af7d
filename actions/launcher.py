"""Handing a restart to the job launcher: a webhook (POST of the new placement), a command, or both.

The launcher gets an ``Idempotency-Key`` (``<diagnosis>:<job>``): a worker that dies after
calling it and before recording the call calls it again with the same key.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import orjson
from pydantic import JsonValue

from actions.config import Launcher
from actions.webhook import post_json
from schemas.codec import encode
from schemas.messages import Job

EX_TEMPFAIL = 75  # sysexits.h: "try again later"


@dataclass(frozen=True, slots=True)
class LaunchAnswer:
    """Whether the launcher took the restart; when not, whether a retry may help and why."""

    ok: bool
    retryable: bool = False
    error: str = ""


class JobLauncher:
    """Calls the configured webhook and/or command with a job's new placement."""

    def __init__(self, config: Launcher) -> None:
        self._config = config

    @property
    def configured(self) -> bool:
        """Whether any launcher is configured (without one, c4.job.v1 is the hand-off)."""
        return self._config.webhook is not None or self._config.command is not None

    def launch(self, placement: Job, diagnosis: str, replaced: dict[str, str]) -> LaunchAnswer:
        """Hand over one restart: the webhook first, then the command."""
        webhook = self._config.webhook
        if webhook is not None:
            body: dict[str, JsonValue] = {
                "job": placement.job,
                "diagnosis": diagnosis,
                "replaced": dict(replaced),
                "placement": orjson.loads(encode(placement)),
            }
            secret = webhook.secret.get_secret_value().encode() if webhook.secret else None
            answer = post_json(
                webhook.url,
                orjson.dumps(body),
                webhook.timeout_s,
                secret,
                {"Idempotency-Key": f"{diagnosis}:{placement.job}"},
            )
            if not answer.ok:
                return LaunchAnswer(False, answer.retryable, f"webhook: {answer.error}")
        command = self._config.command
        if command is not None:
            argv = [part.format(job=placement.job, diagnosis=diagnosis) for part in command]
            try:
                done = subprocess.run(  # noqa: S603 - argv from the operator's configuration
                    argv,
                    input=encode(placement),
                    capture_output=True,
                    timeout=self._config.command_timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                timeout = self._config.command_timeout_s
                return LaunchAnswer(False, True, f"command: no exit in {timeout} s")
            except OSError as error:
                return LaunchAnswer(False, False, f"command: {error.strerror or error}")
            if done.returncode != 0:
                tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
                why = f"command exited {done.returncode}" + (f": {tail[0]}" if tail else "")
                return LaunchAnswer(False, done.returncode == EX_TEMPFAIL, why)
        return LaunchAnswer(True)
