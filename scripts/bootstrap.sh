#!/usr/bin/env bash
# Create .venv and install the project with its dev tools; a no-op when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "c4 needs Python 3.11+ (found $("$python" --version 2>&1))" >&2
  exit 2
fi
stamp=.venv/.c4-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # The distribution was called c4 before (a name PyPI gives another project): its editable
  # install's finder would go on mapping the packages, so it goes first.
  if .venv/bin/python -m pip show -q c4 >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -q -y c4
  fi
  .venv/bin/python -m pip install -q -e '.[dev]'
  echo "$want" > "$stamp"
fi
# The detection core compiled (mypyc, ~40 s; a no-op while it matches the sources).
.venv/bin/python scripts/build_native.py
