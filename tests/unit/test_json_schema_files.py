from __future__ import annotations

from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from schemas.codec import KINDS, MODELS, Rejection, decode
from schemas.jsonschema import render, schema_path, stale
from tests.contract import contract_examples
from tests.invalid_cases import Case, invalid_cases


def validator(kind: str) -> Draft202012Validator:
    schema = orjson.loads(schema_path(kind).read_bytes())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def schema_kind(obj: Any) -> str:
    kind = obj.get("kind") if isinstance(obj, dict) else None
    return kind if kind in MODELS else "collective"


def test_schema_files_are_generated_from_the_models() -> None:
    assert stale() == []
    for kind in KINDS:
        assert schema_path(kind).read_bytes() == render(kind)


@pytest.mark.parametrize("kind", KINDS)
def test_schema_accepts_the_contract_example(kind: str) -> None:
    errors = list(validator(kind).iter_errors(contract_examples()[kind]))
    assert errors == []


@pytest.mark.parametrize("case", invalid_cases(), ids=lambda case: case.name)
def test_schema_agrees_with_the_models(case: Case) -> None:
    try:
        obj = orjson.loads(case.data)
    except orjson.JSONDecodeError:
        assert isinstance(decode(case.data), Rejection)
        return
    schema_rejects = not validator(schema_kind(obj)).is_valid(obj)
    model_rejects = isinstance(decode(case.data), Rejection)
    assert model_rejects
    if case.beyond_schema:
        # The rule is one JSON Schema cannot state: the schema file must at least name it.
        assert not schema_rejects
        if case.code.value == "inconsistent":
            assert b"x-c4-rules" in schema_path(schema_kind(obj)).read_bytes()
    else:
        assert schema_rejects
