"""Fuzzing the ``c4`` command line: random argv never gives a traceback.

Every subcommand's parser gets random argv built from its own options (found by walking the
parser, so new options are fuzzed too), hostile values (odd unicode, huge, negative and
non-finite numbers) and files of hostile content. Usage errors exit 2 with one
``c4 ...: error: ...`` line last; the offline subcommands are run to the end and exit 0, 1
or 2, never with an exception.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from c4.cli import build_parser, main
from tests.contract import contract_examples

FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
ERROR_LINE = re.compile(r"^c4(?: [\w-]+)*: error: \S")
# Run to the end: they need no broker, no Redis and write only where told (a temporary cwd).
OFFLINE = (
    ("validate",),
    ("diagnose",),
    ("score",),
    ("plan",),
    ("topology", "gen"),
    ("convert", "flight-recorder"),
    ("convert", "nccl-inspector"),
    ("simulate",),
)
# Never run: they would talk to the network or start long-running workers.
NOT_RUN_OPTIONS = frozenset({"--kafka", "-h", "--help"})


def leaf_parsers(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield prefix, parser
    for action in subcommands:
        for name, sub in action.choices.items():
            yield from leaf_parsers(sub, (*prefix, name))


def options_of(parser: argparse.ArgumentParser) -> list[tuple[str, bool, tuple[str, ...]]]:
    """(option, takes a value, its choices) for every optional argument."""
    found = []
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and option not in NOT_RUN_OPTIONS:
                choices = tuple(str(c) for c in action.choices or ())
                found.append((option, action.nargs != 0, choices))
    return found


LEAVES = dict(leaf_parsers(build_parser()))
TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00", exclude_categories=["Cs"]),
    max_size=12,
)
NUMBERS = st.sampled_from(
    ["0", "-1", "1", "3", "8", "1.5", "1e999", "-1e999", "nan", "inf", "99999999999999999999", ""]
)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cwd of its own holding the files the fuzzer names."""
    monkeypatch.chdir(tmp_path)
    examples = contract_examples()
    (tmp_path / "topology.json").write_bytes(orjson.dumps(examples["topology"]))
    (tmp_path / "flows.json").write_bytes(orjson.dumps(examples["flows"]))
    lines = [orjson.dumps(examples[kind]) for kind in ("collective", "job", "diagnosis")]
    (tmp_path / "messages.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "dump0").write_bytes(b"\x80\x04garbage")
    (tmp_path / "folder" / "rank0.log").write_bytes(b'{"header": 1}\n{cut')
    return tmp_path


FILES = [
    "topology.json",
    "flows.json",
    "messages.jsonl",
    "hostile.bin",
    "folder",
    "missing.json",
    "-",
    ".",
]


@st.composite
def argvs(draw: st.DrawFn, command: tuple[str, ...]) -> list[str]:
    parser = LEAVES[command]
    options = options_of(parser)
    argv = list(command)
    # Usually give the required options a file, so most runs get past the parser.
    for action in parser._actions:
        if action.required and action.option_strings and draw(st.integers(0, 3)) > 0:
            argv += [action.option_strings[0], draw(st.sampled_from(FILES[:5]))]
    for _ in range(draw(st.integers(0, 6))):
        what = draw(st.integers(0, 9))
        if what == 0:
            argv.append(draw(st.one_of(TEXT, st.sampled_from(FILES))))  # a positional or junk
            continue
        if what == 1:
            argv.append("--" + draw(TEXT))  # an option that does not exist
            continue
        if not options:
            continue
        option, takes_value, choices = draw(st.sampled_from(options))
        argv.append(option)
        if takes_value and draw(st.integers(0, 7)) > 0:
            values = [st.sampled_from(FILES), NUMBERS, TEXT]
            if choices:
                values.append(st.sampled_from(choices))
            argv.append(draw(st.one_of(*values)))
    return argv


def run_main(argv: list[str], stdin: bytes) -> tuple[int, str, str]:
    """``c4 argv`` in this process: exit code, stdout, stderr."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: Any = main(argv)
            except SystemExit as exit_:
                code = exit_.code
    finally:
        sys.stdin = saved
    out.flush()
    err.flush()
    return (
        code if isinstance(code, int) else 1,
        out.buffer.getvalue().decode(errors="replace"),  # type: ignore[attr-defined]
        err.buffer.getvalue().decode(errors="replace"),  # type: ignore[attr-defined]
    )


def assert_clean_exit(argv: list[str], code: int, err: str) -> None:
    assert "Traceback" not in err, (argv, err)
    assert code in (0, 1, 2), (argv, code, err)
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines and ERROR_LINE.match(lines[-1]), (argv, err)


@FUZZ
@given(st.sampled_from(sorted(LEAVES)).flatmap(argvs))
def test_every_parser_gives_usage_errors_in_one_line(argv: list[str]) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exit_:
            assert exit_.code == 2, (argv, exit_.code)
            lines = err.getvalue().strip().splitlines()
            assert lines and ERROR_LINE.match(lines[-1]), (argv, err.getvalue())


@FUZZ
@given(
    st.sampled_from(OFFLINE).flatmap(argvs),
    st.binary(max_size=200),
    st.binary(max_size=200),
)
def test_offline_commands_exit_cleanly_on_any_argv(
    workdir: Path, argv: list[str], content: bytes, stdin: bytes
) -> None:
    (workdir / "hostile.bin").write_bytes(content)
    code, _, err = run_main(argv, stdin)
    assert_clean_exit(argv, code, err)


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--topology", "topology.json", "--flows", "hostile.bin"],
        ["topology", "gen", "--nodes", "-1"],
        ["topology", "gen", "--nodes", "99999999999999999999"],
        ["convert", "flight-recorder", "folder", "--job", ""],
        ["convert", "nccl-inspector", "folder", "--job", "\u202e"],
        ["simulate", "--scenario", "hostile.bin"],
        ["score", "--truth", "missing.json", "messages.jsonl"],
        ["validate", "--kind", "flows", "hostile.bin"],
        ["validate", "--kind", "nope"],
        ["diagnose", "--params", "hostile.bin", "messages.jsonl"],
        # Made up front: unbounded, these took the machine's memory (the fuzzer found it).
        ["diagnose", "--node-stages", "99999999999999999999", "messages.jsonl"],
        ["diagnose", "--workers", "99999999999999999999", "messages.jsonl"],
    ],
)
def test_hostile_arguments_exit_with_one_line(workdir: Path, argv: list[str]) -> None:
    (workdir / "hostile.bin").write_bytes(b'{"v": 1, "kind": "flows", "flows": [NaN]}')
    code, _, err = run_main(argv, b"")
    assert_clean_exit(argv, code, err)
    assert code != 0, (argv, err)
