"""c4's build backend: setuptools' own, plus the ``c4-instrument.pth`` file in every wheel.

A ``.pth`` file must lie at the top of site-packages, where setuptools puts no file of its
own: `build_wheel` and `build_editable` (``pip install .``, ``pip wheel .``,
``pip install -e .``) let setuptools build the wheel, then add the file to it with its line
in the wheel's RECORD, so installers put it in place and remove it on uninstall. Every other
hook is setuptools' (``backend-path`` in pyproject.toml puts this folder on the path).
"""

from __future__ import annotations

import base64
import hashlib
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)
from setuptools.warnings import InformationOnly

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

PTH_NAME = "c4-instrument.pth"
# The same line as c4_autoinstrument.PTH_LINE (a test checks): only with C4_INSTRUMENT set
# does an interpreter import anything of c4.
PTH_LINE = "import os; 'C4_INSTRUMENT' in os.environ and __import__('c4_autoinstrument').run()"


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """setuptools' wheel, with the ``.pth`` file."""
    name: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    add_pth(Path(wheel_directory) / name)
    return name


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """setuptools' editable wheel, with the ``.pth`` file, without setuptools' notice on it."""
    with warnings.catch_warnings():
        # Several top-level packages in the project's root (a flat layout): setuptools maps
        # exactly those to their folders with a meta path finder and says so in a warning
        # ("folders in your working directory with the same name as your package ... may
        # take precedence"), which pip shows even with -q. Here those folders are the
        # packages the finder maps, so either import gives the same files. Only a src/
        # layout would avoid it; compat mode would put the whole root (tests/, bench/, ...)
        # on sys.path. Every other warning of the build is still shown.
        warnings.filterwarnings("ignore", message="Editable installation", category=InformationOnly)
        name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_pth(Path(wheel_directory) / name)
    return name


def add_pth(wheel: Path, name: str = PTH_NAME, line: str = PTH_LINE) -> None:
    """Put ``name`` (holding ``line``) at the top of ``wheel``, listed in its RECORD."""
    data = (line + "\n").encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    temporary = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(temporary, "w") as target:
        entries = source.infolist()
        records = [e for e in entries if e.filename.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            message = f"{wheel.name}: expected one .dist-info/RECORD, found {len(records)}"
            raise RuntimeError(message)
        record = records[0]
        pth = zipfile.ZipInfo(name, date_time=record.date_time)
        pth.external_attr = 0o644 << 16
        pth.compress_type = zipfile.ZIP_DEFLATED
        target.writestr(pth, data)  # before the .dist-info files, which come last
        for entry in entries:
            if entry.filename == name:
                continue  # a wheel built with it already: replaced
            content = source.read(entry)
            if entry is record:
                lines = [
                    row
                    for row in content.decode().splitlines()
                    if row and not row.startswith(name + ",")
                ]
                lines.insert(len(lines) - 1, f"{name},sha256={digest},{len(data)}")
                content = ("\n".join(lines) + "\n").encode()
            target.writestr(entry, content)
    os.replace(temporary, wheel)
