"""JSON Schema files (draft 2020-12), one per kind, generated from the models.

Cross-field rules that JSON Schema cannot state (equal array lengths, ``rank < comm_size``)
are listed under ``x-c4-rules`` of the object they apply to; readers that only have the
schema files enforce those by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from schemas.codec import MODELS

SCHEMA_DIR = Path(__file__).with_name("json")
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_for(kind: str) -> dict[str, Any]:
    """The JSON Schema of one kind, with its dialect and a stable ``$id``."""
    body = MODELS[kind].model_json_schema(by_alias=True, mode="validation")
    return {"$schema": DIALECT, "$id": f"urn:c4:schema:v1:{kind}", **body}


def render(kind: str) -> bytes:
    """The schema file's exact bytes: sorted keys, indented, newline at the end."""
    return orjson.dumps(schema_for(kind), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def schema_path(kind: str, directory: Path = SCHEMA_DIR) -> Path:
    """Where the schema file of a kind lives."""
    return directory / f"{kind}.schema.json"


def write_all(directory: Path = SCHEMA_DIR) -> list[Path]:
    """Regenerate every schema file; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in MODELS:
        path = schema_path(kind, directory)
        path.write_bytes(render(kind))
        written.append(path)
    return written


def stale(directory: Path = SCHEMA_DIR) -> list[str]:
    """Kinds whose schema file is missing or differs from what the models generate."""
    return [
        kind
        for kind in MODELS
        if not schema_path(kind, directory).is_file()
        or schema_path(kind, directory).read_bytes() != render(kind)
    ]
