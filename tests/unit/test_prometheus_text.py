"""The exposition parser: what it takes, what it refuses (one line each), and that a bad line
never costs the good ones around it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.prometheus_text import MAX_PROBLEMS, Sample, parse


def only(text: str, **options: bool) -> Sample:
    result = parse(text, **options)
    assert result.problems == []
    assert len(result.samples) == 1
    return result.samples[0]


def test_help_type_and_samples_with_labels_in_order() -> None:
    text = (
        "# HELP node_infiniband_state_id State of the InfiniBand port (0: no change, 1: down)\n"
        "# TYPE node_infiniband_state_id gauge\n"
        'node_infiniband_state_id{device="mlx5_0",port="1"} 4\n'
        'node_infiniband_state_id{device="mlx5_0",port="2"} 1\n'
        "# a plain comment\n"
        "\n"
        "up 1\n"
    )
    result = parse(text)
    assert result.problems == []
    assert result.types == {"node_infiniband_state_id": "gauge"}
    assert result.helps["node_infiniband_state_id"].startswith("State of the InfiniBand port")
    assert [(s.name, dict(s.labels), s.value, s.line) for s in result.samples] == [
        ("node_infiniband_state_id", {"device": "mlx5_0", "port": "1"}, 4.0, 3),
        ("node_infiniband_state_id", {"device": "mlx5_0", "port": "2"}, 1.0, 4),
        ("up", {}, 1.0, 7),
    ]
    assert [s.line for s in result.named("up")] == [7]


def test_label_value_escapes() -> None:
    sample = only('m{a="back\\\\slash",b="say \\"hi\\"",c="two\\nlines",d="{,}= #"} 1')
    assert dict(sample.labels) == {
        "a": "back\\slash",
        "b": 'say "hi"',
        "c": "two\nlines",
        "d": "{,}= #",
    }


def test_help_escapes() -> None:
    result = parse("# HELP m a \\\\ and\\nnewline\nm 1\n")
    assert result.helps["m"] == "a \\ and\nnewline"


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("NaN", math.nan),
        ("+Inf", math.inf),
        ("-Inf", -math.inf),
        ("1e+06", 1e6),
        ("8.74564523062e+12", 8.74564523062e12),
        ("-0.5", -0.5),
        (".5", 0.5),
        ("612.456000", 612.456),
    ],
)
def test_values_as_go_writes_them(written: str, expected: float) -> None:
    sample = only(f"m {written}")
    if math.isnan(expected):
        assert math.isnan(sample.value)
    else:
        assert sample.value == expected
    assert sample.text == written


def test_integers_stay_exact_beyond_a_float() -> None:
    sample = only("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION 18446744073709551557")
    assert sample.as_int() == 18446744073709551557  # a float would round it
    assert only("m 4.503599627370492e+15").as_int() == 4503599627370492
    assert only("m 0.5").as_int() is None
    assert only("m NaN").as_int() is None


def test_timestamps_in_milliseconds_or_openmetrics_seconds() -> None:
    assert only("m 1 1733130000123").timestamp_s == pytest.approx(1733130000.123)
    assert only("m 1 -5").timestamp_s == pytest.approx(-0.005)
    assert only("m 1 1733130000.5", openmetrics=True).timestamp_s == pytest.approx(1733130000.5)
    assert only("m 1").timestamp_s is None
    result = parse("m 1 1733130000.5\n")  # not an integer: not Prometheus' text format
    assert result.samples == []
    assert result.problems == ["line 1: not a timestamp: '1733130000.5'"]


def test_whitespace_between_tokens_and_a_trailing_comma() -> None:
    # dcgm-exporter 2.x wrote a blank after each comma.
    sample = only('DCGM_FI_DEV_SM_CLOCK{gpu="0", UUID="GPU-6", } \t139\r')
    assert dict(sample.labels) == {"gpu": "0", "UUID": "GPU-6"}
    assert sample.value == 139


def test_openmetrics_eof_unit_types_and_exemplars() -> None:
    text = (
        "# TYPE a info\n"
        "# UNIT b_seconds seconds\n"
        "# TYPE b_seconds counter\n"
        'a_info{version="1"} 1\n'
        'b_seconds_total 3 # {trace_id="x"} 1 1.5\n'
        "# EOF\n"
    )
    result = parse(text, openmetrics=True)
    assert result.problems == []
    assert [s.name for s in result.samples] == ["a_info", "b_seconds_total"]
    late = parse(text + "c 1\n", openmetrics=True)
    assert late.problems == ["line 7: text after # EOF (line 6)"]
    assert parse("# TYPE a info\n").problems == ["line 1: unknown type 'info' for a"]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("9m 1", "expected a metric name at column 1, got '9m 1'"),
        ("m{a=1} 1", "expected '\"' at column 5"),
        ('m{a="x} 1', "unterminated label value"),
        ('m{a="\\t"} 1', "unknown escape \\t in a label value at column 6"),
        ('m{a="1",a="2"} 1', "duplicate label a"),
        ('m{a="1" b="2"} 1', "expected ',' or '}' after label a"),
        ('m{a="1"', "expected ',' or '}' after label a"),
        ("m{", "expected a label name or '}' at column 3, got end of line"),
        ("m", "expected a blank and a value after m, got end of line"),
        ("m 1 2 3", "unexpected text after the sample: '3'"),
        ("m one", "not a value: 'one'"),
        ("m 1_000", "not a value: '1_000'"),
        ("m 0x10", "not a value: '0x10'"),
        ("m{}1", "expected a blank and a value after m, got '1'"),
        ("m 1 1e3", "not a timestamp: '1e3'"),
        ("# TYPE m countr", "unknown type 'countr' for m"),
        ("# TYPE", "# TYPE without a metric name"),
        ("# HELP 1m x", "# HELP without a metric name"),
    ],
)
def test_a_malformed_line_is_one_problem_and_the_others_still_count(line: str, reason: str) -> None:
    result = parse(f"before 1\n{line}\nafter 2\n")
    assert result.problems == [f"line 2: {reason}"]
    assert [(s.name, s.value) for s in result.samples] == [("before", 1.0), ("after", 2.0)]


def test_a_second_type_or_help_and_a_duplicate_series_are_problems() -> None:
    text = (
        "# TYPE m gauge\n"
        "# TYPE m counter\n"
        "# HELP m one\n"
        "# HELP m two\n"
        'm{a="1",b="2"} 1\n'
        'm{b="2",a="1"} 9\n'
    )
    result = parse(text)
    assert result.problems == [
        "line 2: second # TYPE for m",
        "line 4: second # HELP for m",
        "line 6: duplicate series m{b='2',a='1'}",
    ]
    assert result.types == {"m": "gauge"}
    assert [s.value for s in result.samples] == [1.0]


def test_problems_are_capped_and_counted() -> None:
    text = "\n".join(["good 1", *("bad" for _ in range(50)), "also_good 2"])
    result = parse(text)
    assert len(result.problems) == MAX_PROBLEMS + 1
    assert result.problems[-1] == f"{50 - MAX_PROBLEMS} more malformed lines not listed"
    assert result.malformed == 50
    assert [s.name for s in result.samples] == ["good", "also_good"]


def test_long_garbage_is_shortened_in_the_problem() -> None:
    result = parse("m " + "x" * 10_000)
    assert len(result.problems) == 1
    assert len(result.problems[0]) < 120


def test_nothing_raises_on_arbitrary_bytes() -> None:
    text = bytes(range(256)).decode("latin-1") * 3
    result = parse(text)
    assert result.samples == []
    assert result.problems


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@settings(max_examples=300)
@given(
    st.dictionaries(
        st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True),
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
        max_size=5,
    ),
    st.integers(min_value=0, max_value=2**64),
)
def test_any_escaped_label_values_come_back_as_written(labels: dict[str, str], value: int) -> None:
    inner = ",".join(f'{name}="{escape(text)}"' for name, text in labels.items())
    sample = only(f"metric_name{{{inner}}} {value}")
    assert dict(sample.labels) == labels
    assert sample.as_int() == value


@settings(max_examples=300)
@given(st.text(max_size=200))
def test_any_text_parses_without_raising(text: str) -> None:
    result = parse(text)
    assert len(result.problems) <= MAX_PROBLEMS + 1
