#!/usr/bin/env bash
# The main job: the real local stack, then `c4 demo` (a simulated cluster with three jobs and
# four scripted faults through the streams and actions workers, live; the timeline at the end,
# the HTML report in ./c4-demo-report). Exit 1 unless every fault was diagnosed and acted on.
# Arguments go to c4 demo (e.g. --speed 2, --scenario FILE, --report DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
c4 stack up
exec c4 demo "$@"
