from __future__ import annotations

import pytest

from schemas.codec import KINDS, MODELS, Rejection, decode, encode
from tests.contract import CONTRACT, SHARED_CONTRACT, contract_examples


def test_contract_copy_matches_shared() -> None:
    """The project's contract is the published one, word for word, plus its additions."""
    if SHARED_CONTRACT.is_file():
        published = SHARED_CONTRACT.read_text(encoding="utf-8")
        ours = CONTRACT.read_text(encoding="utf-8")
        assert ours.startswith(published)
        assert ours[len(published) :].lstrip().startswith("## Additions to v1")
    else:
        assert CONTRACT.is_file()


def test_every_kind_has_an_example() -> None:
    assert sorted(contract_examples()) == sorted(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_example_decodes_to_its_model(kind: str) -> None:
    example = contract_examples()[kind]
    result = decode(encode_raw(example))
    assert not isinstance(result, Rejection), result
    assert isinstance(result, MODELS[kind])
    again = decode(encode(result))
    assert again == result


def test_unknown_fields_are_accepted_and_dropped() -> None:
    example = dict(contract_examples()["link"])
    example["vendor_extra"] = {"anything": [1, 2]}
    result = decode(encode_raw(example))
    assert not isinstance(result, Rejection)
    assert b"vendor_extra" not in encode(result)


def test_optional_fields_are_left_out_but_required_nulls_kept() -> None:
    example = dict(contract_examples()["diagnosis"], job=None)
    result = decode(encode_raw(example))
    assert not isinstance(result, Rejection)
    assert b'"job":null' in encode(result)
    collective = dict(contract_examples()["collective"])
    del collective["node"], collective["conns"]
    decoded = decode(encode_raw(collective))
    assert not isinstance(decoded, Rejection)
    assert b'"node"' not in encode(decoded) and b'"conns"' not in encode(decoded)
    assert b'"end_ns":[1733129999180000000,null]' in encode(decoded)


def encode_raw(obj: object) -> bytes:
    import orjson

    return orjson.dumps(obj)
