"""The dashboard in real headless Chromium: a node isolated and a finding open, as during a run.

The cluster state is a real Redis (unique key prefix), the findings and actions real Kafka
topics (unique prefix) read by the dashboard's feed; the page must load with no console
error, colour the isolated node's cell red, list the open finding with its heatmap, and the
action log.
"""

from __future__ import annotations

import asyncio
import io
import time
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

from actions.state.model import TransitionRequest
from actions.state.store import RedisState
from c4.dashboard.feed import Feed
from c4.dashboard.server import DashboardServer, Source
from producers.publisher import Publisher
from schemas.messages import Action, Diagnosis, Suspect
from schemas.topics import ALL_TOPICS
from tests.integration.chromium import Browser
from tests.integration.workers import create_topics
from topology.generate import Shape, generate

pytestmark = pytest.mark.integration

ISOLATED_RGB = (0xD6, 0x27, 0x28)  # .state-isolated in the page's style
HEALTHY_RGB = (0x2C, 0xA0, 0x2C)


def _close(rgb: tuple[int, ...], want: tuple[int, int, int]) -> bool:
    return all(abs(a - b) <= 12 for a, b in zip(rgb[:3], want, strict=True))


def test_page_shows_isolated_node_and_open_finding(
    kafka_bootstrap: str, redis_url: str, unique: str, tmp_path: Path
) -> None:
    prefix = f"test.{unique}."
    create_topics(kafka_bootstrap, [prefix + topic.name for topic in ALL_TOPICS], partitions=1)
    state = RedisState.connect(redis_url, None, f"test:{unique}")
    state.components.load_topology(generate(Shape(nodes=8, spines=2, nics=8, planes=2)))
    now = time.time_ns()
    moved = state.components.transition(
        TransitionRequest(
            kind="node",
            ident="node-003",
            to="isolated",
            action="isolate",
            reason="test: straggler",
            ts_ns=now,
            now_ms=now // 1_000_000,
            actor="test",
            diagnosis="d-1",
            allowed_from=("healthy",),
        )
    )
    assert moved.outcome == "ok"
    state.components.add_spare("node-007", now, now // 1_000_000, "test")
    throughput = [[r, (r + 1) % 16, 60.0 if r == 5 else 190.0] for r in range(16)]
    finding = Diagnosis.model_validate(
        {
            "v": 1,
            "kind": "diagnosis",
            "id": "d-1",
            "job": "job-t",
            "state": "firing",
            "class": "comm_slow",
            "onset_ns": now - 5_000_000_000,
            "ts_ns": now,
            "suspects": [Suspect(type="port", id="node-003/mlx5_5:1", score=0.9)],
            "evidence": {"comm": "c1", "slowdown": 2.1, "throughput": throughput},
        }
    )
    isolated = Action(
        v=1,
        kind="action",
        id="a-1",
        diagnosis="d-1",
        ts_ns=now,
        action="isolate",
        target="node-003",
        status="done",
        detail={"kind": "node"},
    )
    publisher = Publisher({"bootstrap.servers": kafka_bootstrap}, prefix)
    publisher.publish(finding)
    publisher.publish(isolated)
    publisher.flush(30)
    feed = Feed({"bootstrap.servers": kafka_bootstrap}, prefix, f"test-{unique}").start()
    server = DashboardServer(Source(state, feed, "c4 test")).start()
    try:
        png, found = asyncio.run(_browse(server.url, tmp_path))
        with urllib.request.urlopen(server.url + "metrics", timeout=10) as answer:  # noqa: S310
            metrics = answer.read().decode()
    finally:
        server.stop()
        feed.stop()
        for key in state.client.scan_iter(f"test:{unique}:*"):
            state.client.delete(key)
        state.close()
    errors, cell, finding_text, actions_text, heat_cells = found
    assert errors == []
    assert 'c4_dashboard_requests_total{endpoint="state",status="200"}' in metrics
    assert "c4_dashboard_open_findings 1.0" in metrics
    assert cell["state"] == "isolated"
    assert "comm_slow" in finding_text and "node-003/mlx5_5:1" in finding_text
    assert "isolate node-003" in actions_text
    assert heat_cells == 16
    image = Image.open(io.BytesIO(png)).convert("RGB")
    (tmp_path / "dashboard.png").write_bytes(png)
    # A corner inside the cell, away from its left-aligned text.
    corner = (int(cell["x"] + cell["w"] - 4), int(cell["y"] + cell["h"] - 4))
    assert _close(image.getpixel(corner), ISOLATED_RGB), image.getpixel(corner)
    healthy = (int(cell["hx"] + cell["w"] - 4), int(cell["hy"] + cell["h"] - 4))
    assert _close(image.getpixel(healthy), HEALTHY_RGB), image.getpixel(healthy)


async def _browse(url: str, profile: Path) -> tuple[bytes, tuple[object, ...]]:
    async with Browser(profile / "chromium") as browser:
        await browser.send("Page.navigate", url=url)
        await browser.wait_for("document.body.dataset.loaded === '1'")
        await browser.wait_for("document.querySelectorAll('.finding').length > 0")
        await browser.wait_for("document.querySelectorAll('#actions tr').length > 0")
        cell = await browser.evaluate(
            """(() => {
                 const c = document.getElementById('node-node-003').getBoundingClientRect();
                 const h = document.getElementById('node-node-000').getBoundingClientRect();
                 return {x: c.x, y: c.y, w: c.width, h: c.height, hx: h.x, hy: h.y,
                         state: document.getElementById('node-node-003').dataset.state};
               })()"""
        )
        finding_text = await browser.evaluate("document.getElementById('findings').innerText")
        actions_text = await browser.evaluate("document.getElementById('actions').innerText")
        heat_cells = await browser.evaluate("document.querySelectorAll('.heat div').length")
        png = await browser.screenshot()
        return png, (list(browser.errors), cell, finding_text, actions_text, heat_cells)
