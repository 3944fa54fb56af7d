"""The example messages of contract v1, read from the contract document itself."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
CONTRACT = REPO / "docs" / "contract-v1.md"
SHARED_CONTRACT = REPO.parent / "shared" / "contract-v1.md"


def contract_examples() -> dict[str, dict[str, Any]]:
    """Every ```json block of the contract, by its kind."""
    text = CONTRACT.read_text(encoding="utf-8")
    examples: dict[str, dict[str, Any]] = {}
    for block in re.findall(r"```json\n(.*?)```", text, re.S):
        obj = orjson.loads(block)
        examples[obj["kind"]] = obj
    return examples
