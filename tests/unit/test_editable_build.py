"""``pip install -e .`` says nothing: the build backend's editable wheel raises no warning.

pip (26+) shows every warning a build backend raises, even with ``-q``; setuptools raises an
informational one for every flat-layout editable install (its meta path finder), which
``build_backend/c4_build.py`` leaves out. The build runs here as pip runs it (the project's
root as the working directory, ``backend-path`` on the path), with warnings as errors.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = "import sys, c4_build; print(c4_build.build_editable(sys.argv[1]))"


def test_the_editable_build_raises_no_warning_and_keeps_the_pth_file(tmp_path: Path) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    backend_path = pyproject["build-system"]["backend-path"]
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", BUILD, str(tmp_path)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(backend_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Warning" not in done.stderr
    wheel = tmp_path / done.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "c4-instrument.pth" in names
    assert any(name.startswith("__editable__") and name.endswith(".pth") for name in names)
