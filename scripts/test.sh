#!/usr/bin/env bash
# The test command: venv + install, the real local stack, then ruff (lint and format), mypy
# --strict, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
c4 stack up
c4 topics create
ruff check .
ruff format --check .
mypy
c4 schemas check
# The dashboard's browser test drives Debian's headless Chromium.
command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }
command -v dot >/dev/null || { apt-get update -qq && apt-get install -y -qq graphviz; }
pytest "$@"
echo "test command finished in $(( $(date +%s) - started )) s"
