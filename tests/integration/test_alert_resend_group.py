"""Two actions workers of one consumer group and one Alertmanager stand-in: each alert is
posted by one worker only, once per finding change, and again once per resend period while it
fires.

The alerts to resend are shared (Redis); each worker resends those whose finding came on a
partition of the diagnosis topic it owns. Each worker posts to its own path of a real local
HTTP receiver, so every post names its sender. Before, both workers resent every kept alert:
twice the posts, and a firing alert could be posted again after another worker's resolution.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from tests.integration.actions_harness import (
    Cluster,
    HttpReceiver,
    config,
    diagnosis,
    wait_for,
    worker,
)

pytestmark = pytest.mark.integration

RESEND_S = 1.0  # the smallest resend period a receiver may have
WATCH_S = 6.0  # how long the resends of the firing alerts are counted
GROUP = "resend"
SENDERS = ("/w1", "/w2")  # each worker's Alertmanager base URL on the receiver


@pytest.fixture
def cluster(kafka_bootstrap: str, redis_url: str, unique: str) -> Iterator[Cluster]:
    """The actions worker's world with two partitions per topic: one for each worker."""
    made = Cluster(kafka_bootstrap, redis_url, unique, partitions=2)
    try:
        yield made
    finally:
        made.close()


def sender_config(receiver: HttpReceiver, base: str) -> dict[str, Any]:
    """A worker's configuration: its Alertmanager ``am`` at its own path of the receiver."""
    data = config(receiver)
    data["receivers"].append(
        {
            "name": "am",
            "kind": "alertmanager",
            "url": receiver.url(base),
            "timeout_s": 2,
            "resend_s": RESEND_S,
            "retry": {"tries": 3, "backoff_s": 0.05, "max_backoff_s": 0.2},
        }
    )
    return data


def one_diagnosis_partition_each(cluster: Cluster, group: str) -> bool:
    """Whether the group is stable with two members, each owning one diagnosis partition."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    [future] = admin.describe_consumer_groups([group]).values()
    described = future.result(10)
    if described.state != ConsumerGroupState.STABLE or len(described.members) != 2:
        return False
    topic = cluster.topic("diagnosis")
    owned = sorted(
        sorted(tp.partition for tp in member.assignment.topic_partitions if tp.topic == topic)
        for member in described.members
    )
    return owned == [[0], [1]]


def posts(receiver: HttpReceiver, since_wall_s: float) -> list[tuple[float, str, str, str]]:
    """(when, sender, diagnosis, firing or resolved) of every alert posted to a stand-in. A
    firing alert ends a horizon ahead; a resolved one at its resolution, before the test."""
    found = []
    for base in SENDERS:
        for request in receiver.at(base + "/api/v2/alerts"):
            for alert in request.json():
                ends = datetime.fromisoformat(alert["endsAt"].replace("Z", "+00:00"))
                status = "resolved" if ends.timestamp() < since_wall_s else "firing"
                found.append((request.at_s, base, alert["labels"]["diagnosis"], status))
    return sorted(found)


def wait_alerted(cluster: Cluster, idents: Iterable[str], state: str) -> None:
    """Wait until the workers recorded the Alertmanager step of each diagnosis (one state)
    as done."""

    def done() -> bool:
        alerted = {
            a.diagnosis
            for a in cluster.actions()
            if a.action == "alert"
            and a.detail.get("receiver") == "am"
            and a.detail.get("state") == state
            and a.status == "done"
        }
        return alerted >= set(idents)

    wait_for(done, what=f"the {state} alerts of {sorted(idents)} posted")


def test_two_workers_of_a_group_post_each_alert_once_per_change_and_per_period(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    began_wall_s = time.time()
    group = f"{GROUP}-{cluster.unique}"
    first, second = (sender_config(receiver, base) for base in SENDERS)
    idents = {partition: f"d-p{partition}-{cluster.unique}" for partition in (0, 1)}
    firing = {
        partition: diagnosis(
            ident, f"job-{partition}", [("gpu", "node-005/gpu3", 0.93)], "comm_hang"
        )
        for partition, ident in idents.items()
    }
    with (
        worker(cluster, first, group=GROUP, housekeeping=True, actor="test-w1"),
        worker(cluster, second, group=GROUP, housekeeping=True, actor="test-w2"),
    ):
        wait_for(
            lambda: one_diagnosis_partition_each(cluster, group),
            timeout_s=60,
            what="each worker owning one diagnosis partition",
        )
        for partition, message in firing.items():
            cluster.send("diagnosis", message, key=f"job-{partition}", partition=partition)
        wait_alerted(cluster, idents.values(), "firing")
        watch_from = time.monotonic()
        # Counting resends needs their period to pass: the window is the measurement.
        time.sleep(WATCH_S)
        watch_to = time.monotonic()
        for partition, message in firing.items():
            resolved = {**message, "state": "resolved"}
            cluster.send("diagnosis", resolved, key=f"job-{partition}", partition=partition)
        wait_alerted(cluster, idents.values(), "resolved")
        time.sleep(3 * RESEND_S)  # three more resend periods in which nothing may fire again
        posted = posts(receiver, began_wall_s)

    senders = {ident: {base for _, base, i, _ in posted if i == ident} for ident in idents.values()}
    # One sender per alert, and each worker the sender of the partition it owns.
    assert all(len(bases) == 1 for bases in senders.values()), senders
    assert set.union(*senders.values()) == set(SENDERS), senders
    for ident in idents.values():
        mine = [(at, status) for at, _, i, status in posted if i == ident]
        watched = [at for at, status in mine if status == "firing" and watch_from <= at < watch_to]
        # One post per resend period while it fires (two workers posted about twice as many).
        assert WATCH_S / RESEND_S - 2 <= len(watched) <= WATCH_S / RESEND_S + 1, mine
        # Its resolution posted once, and never a firing post after it.
        [ended_at] = [at for at, status in mine if status == "resolved"]
        assert [at for at, status in mine if status == "firing" and at > ended_at] == [], mine
    assert cluster.state.alerts.all_kept("am") == {}
