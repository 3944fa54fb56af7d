"""docker-compose.yml read by compose-go, the loader Docker Compose itself uses.

There is no Docker engine here; `scripts/compose-config` (a small Go program on compose-go)
does what ``docker compose config`` does: validate against the Compose specification,
interpolate the variables from the environment and the .env file, print the result. It is
built from the Go module proxy on first use, into the stack's cache folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from c4.settings import Settings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "scripts" / "compose-config"


@pytest.fixture(scope="module")
def compose_config() -> Path:
    """The compose-config binary, built once per version of its sources."""
    go = shutil.which("go")
    assert go is not None, "go is not on PATH: the checker is built with it"
    digest = hashlib.sha256()
    for name in ("main.go", "go.mod", "go.sum"):
        digest.update((SOURCE / name).read_bytes())
    binary = Settings().stack_dir / "tools" / f"compose-config-{digest.hexdigest()[:12]}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        built = subprocess.run(
            [go, "build", "-o", str(binary), "."],
            cwd=SOURCE,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert built.returncode == 0, built.stderr
    return binary


def run(binary: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("C4_")}
    return subprocess.run(
        [str(binary), *args],
        capture_output=True,
        text=True,
        env=clean | env,
        timeout=60,
        check=False,
    )


def test_the_compose_file_is_valid_with_its_documented_env(
    compose_config: Path, tmp_path: Path
) -> None:
    env_file = tmp_path / ".env"
    example = (REPO / ".env.example").read_text(encoding="utf-8")
    env_file.write_text(
        example.replace("C4_REDIS_PASSWORD=\n", "C4_REDIS_PASSWORD=r3d1s\n").replace(
            "C4_GRAFANA_ADMIN_PASSWORD=\n", "C4_GRAFANA_ADMIN_PASSWORD=gr4f4na\n"
        ),
        encoding="utf-8",
    )
    done = run(compose_config, str(REPO / "docker-compose.yml"), str(env_file), env={})
    assert done.returncode == 0, done.stderr
    model = yaml.safe_load(done.stdout)
    services = model["services"]
    assert {"prometheus", "alertmanager", "grafana", "streams", "actions"} <= set(services)
    assert services["actions"]["environment"]["C4_REDIS_PASSWORD"] == "r3d1s"  # noqa: S105
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "gr4f4na"  # noqa: S105


def test_a_missing_secret_is_named(compose_config: Path) -> None:
    done = run(
        compose_config,
        str(REPO / "docker-compose.yml"),
        str(REPO / ".env.example"),
        env={},
    )
    assert done.returncode == 1
    assert "set C4_REDIS_PASSWORD in .env" in done.stderr


def test_a_broken_compose_file_is_refused(compose_config: Path, tmp_path: Path) -> None:
    broken = tmp_path / "compose.yml"
    broken.write_text("services:\n  a:\n    image: x\n    bogus: 1\n", encoding="utf-8")
    done = run(compose_config, str(broken), env={})
    assert done.returncode == 1 and "bogus" in done.stderr, done.stderr
