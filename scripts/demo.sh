#!/usr/bin/env bash
# The main job. Until `c4 demo` lands: the real local stack and its topics, then a simulated
# cluster with three injected faults diagnosed and scored (exit 1 if one is missed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
c4 stack up
c4 topics create
c4 doctor
out=$(mktemp -d)
c4 simulate --scenario examples/scenario-demo.json --out "$out/run.jsonl"
c4 diagnose "$out/run.jsonl" > "$out/diagnoses.jsonl"
c4 score --truth "$out/run.jsonl.truth.jsonl" "$out/diagnoses.jsonl"
