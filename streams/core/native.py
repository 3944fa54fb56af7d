"""The detection core compiled (mypyc), used only while it is the build of these sources.

`scripts/build_native.py` compiles every module of this package but this one and
``__init__`` into ``.native/`` at the project's root (``C4_NATIVE_DIR`` elsewhere), with a
manifest of the sources' hashes. `activate` (called by the package's ``__init__``) puts the
compiled modules first on the package's path only when the manifest names exactly the
sources here and this interpreter: an edited module, a checkout of another commit or
another Python runs the pure modules, never a stale build. Both give the same findings
(tests/unit/test_native_core.py, both scenario suites). ``C4_PURE_PYTHON=1`` forces the pure
modules. (The live scale-out failures once seen with the compiled core came from link
reports read behind the collectives under load, with either core: streams.core.alignment.)
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST = "manifest.json"
GROUP = "c4_core_native"  # the shared library every compiled module of the build links to
# share_wire: msgspec reads its structs' annotations, which mypyc's classes do not keep
# (decoding then expects a `type` where the share is); its decoding is msgspec's C anyway.
NOT_COMPILED = frozenset({"__init__.py", "native.py", "share_wire.py"})
PURE_ENV = "C4_PURE_PYTHON"
DIR_ENV = "C4_NATIVE_DIR"


def native_dir() -> Path:
    """Where the compiled core lives."""
    override = os.environ.get(DIR_ENV)
    return Path(override) if override else PACKAGE_DIR.parents[1] / ".native"


def compiled_sources() -> list[Path]:
    """The modules the build compiles, in a stable order."""
    return sorted(p for p in PACKAGE_DIR.glob("*.py") if p.name not in NOT_COMPILED)


def fingerprint() -> dict[str, object]:
    """What a build must match: this interpreter and the hash of every compiled source."""
    return {
        "python": sys.implementation.cache_tag,
        "suffix": importlib.machinery.EXTENSION_SUFFIXES[0],
        "sources": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in compiled_sources()},
    }


def status() -> str:
    """``compiled`` or ``pure (why)``: which core an import of the package runs."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"pure ({PURE_ENV} is set)"
    return build_status()


def build_status() -> str:
    """``compiled`` when a build of these sources for this interpreter is in place, else
    ``pure (why)``."""
    try:
        built = json.loads((native_dir() / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return "pure (not built: python scripts/build_native.py)"
    if not isinstance(built, dict) or built.get("fingerprint") != fingerprint():
        return "pure (the build is of other sources or another Python: rebuild it)"
    return "compiled"


def activate(package_path: list[str]) -> str:
    """Put the compiled modules ahead of the pure ones when they are this source's build."""
    state = status()
    if state != "compiled":
        return state
    root = native_dir()
    group = f"{GROUP}__mypyc"
    if group not in sys.modules:
        library = root / f"{group}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
        spec = importlib.util.spec_from_file_location(group, library)
        if spec is None or spec.loader is None:
            return f"pure (no compiled library at {library})"
        module = importlib.util.module_from_spec(spec)
        sys.modules[group] = module
        spec.loader.exec_module(module)
    package_path.insert(0, str(root / "streams" / "core"))
    return state
