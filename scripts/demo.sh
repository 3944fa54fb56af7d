#!/usr/bin/env bash
# The main job. Until `c4 demo` lands: the real local stack, the v1 topics, and a round trip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
c4 stack up
c4 topics create
c4 doctor
