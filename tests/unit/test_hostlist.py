"""Slurm host lists expanded without Slurm, as ``scontrol show hostnames`` lists them."""

from __future__ import annotations

import pytest

from producers.hostlist import MAX_HOSTS, HostlistError, expand_hostlist


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("node-001", ["node-001"]),
        ("node-[000-003,007]", ["node-000", "node-001", "node-002", "node-003", "node-007"]),
        ("a1,b2,c3", ["a1", "b2", "c3"]),
        ("gpu[1-2],cpu[9-11]", ["gpu1", "gpu2", "cpu9", "cpu10", "cpu11"]),
        ("n[08-10]", ["n08", "n09", "n10"]),  # the lower bound's padding
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[5]", ["n5"]),
        ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("n[1-3],n2,n[1-2]", ["n1", "n2", "n3"]),  # each name once, first place kept
        ("node-[000-001],login", ["node-000", "node-001", "login"]),
        ("", []),
        ("  n1  ", ["n1"]),
        ("n1,,n2", ["n1", "n2"]),
    ],
)
def test_expands_slurm_host_lists(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize(
    "text",
    [
        "n[1-3",  # unclosed
        "n1-3]",  # no opening bracket
        "n[[1-2]]",  # nested
        "n[3-1]",  # backwards
        "n[a-b]",  # not numbers
        "n[1-]",
        "n[-1]",
        "n[]",
        "n[1,,2]",
        "n[١-٣]",  # digits, but not ASCII ones
        "n1, n2",  # whitespace inside
    ],
)
def test_rejects_what_is_not_slurm_syntax(text: str) -> None:
    with pytest.raises(HostlistError):
        expand_hostlist(text)


def test_a_list_naming_too_many_hosts_is_refused_before_it_is_built() -> None:
    with pytest.raises(HostlistError, match="more than"):
        expand_hostlist("n[0-99999999999]")
    with pytest.raises(HostlistError, match="more than"):
        expand_hostlist("a[0-999]b[0-999]")  # 10^6 combinations
    with pytest.raises(HostlistError, match="more than 3"):
        expand_hostlist("n[1-4]", limit=3)
    assert len(expand_hostlist(f"n[1-{MAX_HOSTS}]")) == MAX_HOSTS
