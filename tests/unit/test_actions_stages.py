"""The retry stage, action records and the recorded plan; the webhook and launcher answers."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from actions.config import Backoff, Launcher, WebhookLauncher
from actions.launcher import JobLauncher
from actions.pipeline.outcome import Reason, Result, done, failed, skipped
from actions.pipeline.policy import Plan, Step
from actions.pipeline.recording import action_id, action_record, plan_from_json, plan_json
from actions.pipeline.step_stages import run_with_retry
from actions.webhook import Answer, post_json
from schemas.messages import Diagnosis, Job

DIAGNOSIS = Diagnosis.model_validate(
    {
        "v": 1,
        "kind": "diagnosis",
        "id": "d-1",
        "job": "job-1",
        "state": "firing",
        "class": "node_down",
        "onset_ns": 1,
        "ts_ns": 2,
        "suspects": [{"type": "node", "id": "node-001", "score": 1.0}],
    }
)


def attempts(*results: Result) -> tuple[list[int], Callable[[], Result]]:
    calls: list[int] = []
    queue = list(results)

    def attempt() -> Result:
        calls.append(1)
        return queue.pop(0)

    return calls, attempt


def test_retry_stage_retries_retryable_failures_with_exponential_backoff() -> None:
    slept: list[float] = []
    flaky = failed(Reason.RECEIVER_UNAVAILABLE, "HTTP 500", retryable=True)
    calls, attempt = attempts(flaky, flaky, done())
    result = run_with_retry(
        attempt, Backoff(tries=5, backoff_s=0.5, max_backoff_s=0.8), slept.append
    )
    assert result.status == "done"
    assert result.detail["tries"] == 3
    assert slept == [0.5, 0.8]
    assert len(calls) == 3


def test_retry_stage_stops_at_the_last_try_and_on_a_final_failure() -> None:
    slept: list[float] = []
    down = failed(Reason.RECEIVER_UNAVAILABLE, "refused", retryable=True)
    calls, attempt = attempts(down, down, down, down)
    result = run_with_retry(attempt, Backoff(tries=3, backoff_s=0.1), slept.append)
    assert (result.status, result.reason, result.detail["tries"]) == (
        "failed",
        Reason.RECEIVER_UNAVAILABLE,
        3,
    )
    assert slept == [0.1, 0.2]
    rejected = failed(Reason.RECEIVER_REJECTED, "HTTP 400")
    calls, attempt = attempts(rejected, done())
    result = run_with_retry(attempt, Backoff(tries=3), slept.append)
    assert result.reason is Reason.RECEIVER_REJECTED
    assert "tries" not in result.detail
    assert len(calls) == 1


def test_action_records_carry_the_reason_and_a_stable_id() -> None:
    step = Step("restart", "job-1", "job", nodes=("node-001",))
    result = failed(Reason.NO_SPARE, "no spare node left", node="node-001")
    record = action_record(DIAGNOSIS, step, result, 5)
    assert record.status == "failed"
    assert record.detail["reason"] == "no_spare"
    assert record.detail["message"] == "no spare node left"
    assert record.detail["nodes"] == ["node-001"]
    assert record.id == action_id(DIAGNOSIS, step) == action_record(DIAGNOSIS, step, result, 9).id
    other = Step("alert", "job-1", "diagnosis", receiver="b")
    assert action_id(DIAGNOSIS, other) != action_id(
        DIAGNOSIS, Step("alert", "job-1", "diagnosis", receiver="a")
    )


def test_the_recorded_plan_reads_back_the_same() -> None:
    planned = Plan(
        (
            Step("isolate", "node-001", "node"),
            Step("restart", "job-1", "job", nodes=("node-001",)),
            Step("isolate", "node-002", "node", verdict=skipped(Reason.BLAST_RADIUS, "many")),
            Step("alert", "leaf-0a", "switch", ("a", "b"), "oncall", True, True),
        ),
        marks=(("switch", "leaf-0a"),),
    )
    again = plan_from_json(plan_json(planned))
    assert again == planned


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        status = int(self.path.strip("/"))
        self.send_response(status)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"nope")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        del format, args


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize(
    ("status", "ok", "retryable"),
    [
        (200, True, False),
        (204, True, False),
        (400, False, False),
        (404, False, False),
        (408, False, True),
        (429, False, True),
        (500, False, True),
        (503, False, True),
    ],
)
def test_webhook_answers(server: str, status: int, ok: bool, retryable: bool) -> None:
    answer = post_json(f"{server}/{status}", b"{}", 5)
    assert (answer.status, answer.ok, answer.retryable) == (status, ok, retryable)
    if not ok:
        assert answer.error == f"HTTP {status}: nope"


def test_no_listener_is_retryable() -> None:
    answer = post_json("http://127.0.0.1:9/", b"{}", 2)
    assert answer == Answer(None, answer.error)
    assert answer.retryable
    assert answer.error.startswith("cannot connect")


JOB = Job.model_validate(
    {
        "v": 1,
        "kind": "job",
        "job": "job-1",
        "ts_ns": 1,
        "state": "restarting",
        "ranks": [{"rank": 0, "node": "node-002"}],
        "comms": {},
    }
)


def test_launcher_command_gets_the_placement_on_stdin(tmp_path: Path) -> None:
    out = tmp_path / "placement.json"
    script = "import sys; open(sys.argv[1], 'wb').write(sys.stdin.buffer.read())"
    launcher = JobLauncher(Launcher(command=(sys.executable, "-c", script, str(out))))
    assert launcher.launch(JOB, "d-1", {"node-001": "node-002"}).ok
    assert b'"node":"node-002"' in out.read_bytes()


@pytest.mark.parametrize(("code", "retryable"), [(75, True), (1, False)])
def test_launcher_command_failures(code: int, retryable: bool) -> None:
    script = f"import sys; print('cannot schedule', file=sys.stderr); sys.exit({code})"
    answer = JobLauncher(Launcher(command=(sys.executable, "-c", script))).launch(JOB, "d-1", {})
    assert (answer.ok, answer.retryable) == (False, retryable)
    assert answer.error == f"command exited {code}: cannot schedule"


def test_launcher_webhook_rejection_is_final(server: str) -> None:
    launcher = JobLauncher(Launcher(webhook=WebhookLauncher(url=f"{server}/409")))
    answer = launcher.launch(JOB, "d-1", {})
    assert (answer.ok, answer.retryable, answer.error) == (False, False, "webhook: HTTP 409: nope")
    assert not JobLauncher(Launcher()).configured
