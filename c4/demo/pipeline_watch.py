"""Whether the chaos run's pipeline has caught up with the simulator after a kill.

Caught up: every record the simulator handed to the node agent more than `BEHIND_S` ago is
in Kafka (the agent's delivery checkpoint covers it), the streams worker is no further
behind the log than the records of that span, and the actions worker has committed every
diagnosis.
"""

from __future__ import annotations

import time
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path

import orjson
from confluent_kafka import Consumer, KafkaException, TopicPartition

from c4.dashboard.feed import CLIENT_LOG

BEHIND_S = 2.0  # caught up: at most this far behind the simulator


class PipelineWatch:
    """Whether the pipeline has caught up with the simulator (see the module's docstring).

    ``sample`` is called often; it keeps (time, records sent, bytes handed over) so that
    "what was there `BEHIND_S` ago" can be looked up. ``written`` gives the bytes written
    so far per handoff file; the agent's checkpoint says how far each is delivered, and a
    file the agent deleted was delivered to its end.
    """

    def __init__(
        self,
        handoff: Path,
        checkpoint: Path,
        written: Callable[[], dict[str, int]],
        sent: Callable[[], int],
        streams_metrics_port: int,
        collective_topic: str,
        kafka_config: dict[str, str | int | float | bool],
        actions_group: str,
        diagnosis_topic: str,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._handoff, self._checkpoint = handoff, checkpoint
        self._written, self._sent = written, sent
        self._metrics_url = f"http://127.0.0.1:{streams_metrics_port}/metrics"
        self._lag_line = f'c4_stream_consumer_lag{{topic="{collective_topic}"}} '
        self._kafka_config = kafka_config
        self._actions_group, self._diagnosis_topic = actions_group, diagnosis_topic
        self._monotonic = monotonic
        self._history: deque[tuple[float, int, int]] = deque(maxlen=4000)
        self.last_reason = "not checked yet"

    def sample(self) -> None:
        """Note what the simulator has sent and handed over so far."""
        self._history.append((self._monotonic(), self._sent(), sum(self._written().values())))

    def _then(self, at: float) -> tuple[int, int] | None:
        """(records sent, bytes handed over) as of the last sample at or before ``at``."""
        found = None
        for when, sent, written in self._history:
            if when > at:
                break
            found = (sent, written)
        return found

    def caught_up(self, since: float) -> bool:
        """Whether the pipeline is now at most `BEHIND_S` behind, judged on what was handed
        over after ``since`` (the kill)."""
        now = self._monotonic()
        then = self._then(now - BEHIND_S)
        if then is None or now - BEHIND_S < since:
            self.last_reason = "too soon after the kill"
            return False
        sent_then, written_then = then
        delivered = self._delivered_bytes()
        if delivered is None or delivered < written_then:
            self.last_reason = f"agent: delivered {delivered} of {written_then} bytes"
            return False
        lag = self._streams_lag()
        allowed = max(50, self._sent() - sent_then)
        if lag is None or lag > allowed:
            self.last_reason = f"streams worker: lag {lag} records (allowed {allowed})"
            return False
        left = self._actions_left()
        if left is None or left > 0:
            self.last_reason = f"actions worker: {left} diagnoses not yet handled"
            return False
        self.last_reason = "caught up"
        return True

    def _delivered_bytes(self) -> int | None:
        try:
            committed = orjson.loads(self._checkpoint.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(committed, dict):
            return None
        total = 0
        for name, size in self._written().items():
            if name in committed:
                total += int(committed[name])
            elif not (self._handoff / name).exists():
                total += size  # deleted: the agent deletes only what it delivered
        return total

    def _streams_lag(self) -> int | None:
        """The streams worker's lag on the collective topic (None: no answer, no figure)."""
        try:
            with urllib.request.urlopen(self._metrics_url, timeout=2) as answer:  # noqa: S310
                text = answer.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(self._lag_line):
                return int(float(line.rsplit(" ", 1)[1]))
        return None

    def _actions_left(self) -> int | None:
        """Diagnoses on the log the actions worker has not committed (None: no answer)."""
        consumer = Consumer(
            {
                **self._kafka_config,
                "group.id": self._actions_group,
                "enable.auto.commit": False,
                "socket.timeout.ms": 2000,
            },
            logger=CLIENT_LOG,  # a broker away is an answer here (None), not log lines
        )
        try:
            metadata = consumer.list_topics(self._diagnosis_topic, timeout=2)
            partitions = [
                TopicPartition(self._diagnosis_topic, p)
                for p in metadata.topics[self._diagnosis_topic].partitions
            ]
            left = 0
            for tp in consumer.committed(partitions, timeout=2):
                _, high = consumer.get_watermark_offsets(tp, timeout=2)
                left += high - max(tp.offset, 0)
            return left
        except (KafkaException, KeyError):
            return None
        finally:
            consumer.close()
