"""Redis over TLS with AUTH: the project's Redis clients take a ``rediss://`` URL.

A redis-server of this test's own (TLS port only, a self-signed certificate made with
openssl, ``requirepass`` in a 0600 config file) on a free port. The clients verify the
server against the CA named in the URL; without it they refuse the connection.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from actions.drivers.reroute.plan_store import PlanStore
from actions.state.store import RedisState
from c4.doctor import check_redis
from c4.settings import Settings

pytestmark = pytest.mark.integration

PASSWORD = f"tls-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class TlsRedis:
    port: int
    ca: Path

    def url(self, ca: bool = True) -> str:
        query = f"?ssl_ca_certs={self.ca}" if ca else ""
        return f"rediss://127.0.0.1:{self.port}/0{query}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    folder = tmp_path_factory.mktemp("redis-tls")
    openssl, server = shutil.which("openssl"), shutil.which("redis-server")
    assert openssl and server, "openssl and redis-server are needed (scripts/bootstrap.sh)"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(folder / "key.pem"),
            "-out",
            str(folder / "cert.pem"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    port = _free_port()
    config = folder / "redis.conf"
    descriptor = os.open(config, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(f'requirepass "{PASSWORD}"\n')
    process = subprocess.Popen(
        [
            server,
            str(config),
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            str(folder / "cert.pem"),
            "--tls-key-file",
            str(folder / "key.pem"),
            "--tls-ca-cert-file",
            str(folder / "cert.pem"),
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "no TLS redis"
                time.sleep(0.1)
        yield TlsRedis(port, folder / "cert.pem")
    finally:
        process.terminate()
        process.wait(15)


def test_state_and_plan_store_over_tls_with_auth(tls_redis: TlsRedis) -> None:
    state = RedisState.connect(tls_redis.url(), PASSWORD, f"tls:{uuid.uuid4().hex[:8]}")
    plans = PlanStore.from_url(tls_redis.url(), PASSWORD, f"tls:{uuid.uuid4().hex[:8]}:")
    try:
        assert state.client.ping()
        assert plans.current() is None
    finally:
        state.close()
        plans.close()


def test_doctor_checks_redis_over_tls(tls_redis: TlsRedis) -> None:
    settings = Settings(redis_url=tls_redis.url(), redis_password=SecretStr(PASSWORD))
    (line,) = check_redis(settings)
    assert line.startswith(f"redis rediss://127.0.0.1:{tls_redis.port}/0") and "round trip" in line
    assert PASSWORD not in line


def test_a_server_not_signed_by_a_trusted_ca_is_refused(tls_redis: TlsRedis) -> None:
    client = redis.Redis.from_url(tls_redis.url(ca=False), password=PASSWORD, socket_timeout=5)
    try:
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            client.ping()
    finally:
        client.close()
    plain = redis.Redis(host="127.0.0.1", port=tls_redis.port, password=PASSWORD, socket_timeout=3)
    try:
        with pytest.raises(redis.ConnectionError):
            plain.ping()
    finally:
        plain.close()
