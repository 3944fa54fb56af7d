"""The alert action: one signed POST per alert step, the webhook payload to a webhook receiver
and the v2 alert to an Alertmanager; a dead letter when it gives up."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import orjson
from pydantic import JsonValue

from actions.config import Backoff, Receiver, WorkerConfig
from actions.drivers.alertmanager.client import AlertmanagerClient, MemoryAlerts
from actions.drivers.alertmanager.payload import payload
from actions.drivers.alertmanager.v2 import Kept
from actions.pipeline.executor import Context, DeadLetterSink, Executor, step_letter
from actions.pipeline.outcome import Reason, Result, done, failed, skipped
from actions.pipeline.policy import Step
from actions.webhook import Answer, post_json

PostFn = Callable[[str, bytes, float, bytes | None], Answer]  # one signed POST


class AlertExecutor(Executor):
    """POST one alert step: the signed webhook payload to a webhook receiver, the v2 alert to
    an Alertmanager (`actions.drivers.alertmanager.client`); dead letter when it gives up."""

    name = "alert"

    def __init__(
        self,
        config: WorkerConfig,
        dead_letter: DeadLetterSink,
        post: PostFn | None = None,
        alertmanagers: AlertmanagerClient | None = None,
        alertmanager_letter: DeadLetterSink | None = None,
    ) -> None:
        self._receivers: Mapping[str, Receiver] = {r.name: r for r in config.receivers}
        self._external_url = config.external_url
        self._dead_letter = dead_letter
        self._post = post or _default_post
        self._alertmanagers = alertmanagers or AlertmanagerClient(
            config.receivers, MemoryAlerts(), config.external_url
        )
        self._alertmanager_letter = alertmanager_letter or dead_letter

    def _kept(self, receiver: Receiver, step: Step, context: Context) -> Kept:
        return self._alertmanagers.alert(
            receiver,
            context.diagnosis,
            step.target,
            context.now_ns,
            context.earlier,
            step.nodes if step.escalation else (),
            context.partition,
        )

    def body(self, step: Step, context: Context) -> bytes:
        """The request body (identical on every try)."""
        receiver = self._receivers[step.receiver or ""]
        if receiver.kind == "alertmanager":
            kept = self._kept(receiver, step, context)
            return self._alertmanagers.body(receiver, [kept], context.now_ns)
        return orjson.dumps(
            payload(
                context.diagnosis,
                receiver.name,
                step.target,
                context.earlier,
                step.nodes if step.escalation else (),
                self._external_url,
            )
        )

    def execute(self, step: Step, context: Context) -> Result:
        receiver = self._receivers.get(step.receiver or "")
        if receiver is None:
            return skipped(Reason.NO_RECEIVER, f"no receiver named {step.receiver!r}")
        detail: dict[str, JsonValue] = {"receiver": receiver.name}
        if step.escalation:
            detail["escalation"] = "blast_radius"
        if receiver.kind == "alertmanager":
            kept = self._kept(receiver, step, context)
            answer = self._alertmanagers.send(receiver, context.diagnosis, kept, context.now_ns)
        else:
            secret = receiver.secret.get_secret_value().encode() if receiver.secret else None
            body = self.body(step, context)
            answer = self._post(receiver.url, body, receiver.timeout_s, secret)
        if answer.ok:
            return done(**detail, http_status=answer.status)
        reason = Reason.RECEIVER_UNAVAILABLE if answer.retryable else Reason.RECEIVER_REJECTED
        what = "alertmanager" if receiver.kind == "alertmanager" else "receiver"
        message = f"{what} {receiver.name}: {answer.error}"
        return failed(reason, message, answer.retryable, **detail)

    def retry_for(self, step: Step) -> Backoff | None:
        receiver = self._receivers.get(step.receiver or "")
        return receiver.retry if receiver else None

    def give_up(self, step: Step, result: Result, context: Context) -> None:
        receiver = self._receivers.get(step.receiver or "")
        if receiver is None:
            return
        body = self.body(step, context).decode()
        if receiver.kind == "alertmanager":
            letter = step_letter(f"alertmanager:{receiver.name}", context, result, body)
            self._alertmanager_letter(letter, receiver.name)
            return
        letter = step_letter(f"webhook:{receiver.name}", context, result, body)
        self._dead_letter(letter, receiver.name)


def _default_post(url: str, body: bytes, timeout_s: float, secret: bytes | None) -> Answer:
    return post_json(url, body, timeout_s, secret)
