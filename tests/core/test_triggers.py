"""The train trigger's semantics as tables: operators, epsilon, metrics, timer windows."""

from __future__ import annotations

import pytest

from service.core.triggers import EPSILON, in_window, metric_value, parse_threshold, should_fire
from service.wire import Condition, Timer, Trigger, parse_hhmm

NOON = 12 * 60


def cond(operator: str, threshold: float, metric: str = "num_of_samples") -> Trigger:
    return Trigger(condition=Condition(operator=operator, threshold=threshold, metric=metric))


# (operator aliases, fires below / at / above the threshold 10)
OPERATOR_TABLE = [
    (("gt", ">"), (False, False, True)),
    (("ge", ">="), (False, True, True)),
    (("eq", "=", "=="), (False, True, False)),
    (("ne", "!="), (True, False, True)),
    (("lt", "<"), (True, False, False)),
    (("le", "<="), (True, True, False)),
]


@pytest.mark.parametrize(("aliases", "expected"), OPERATOR_TABLE)
def test_each_operator_below_at_and_above_threshold(
    aliases: tuple[str, ...], expected: tuple[bool, bool, bool]
) -> None:
    for operator in aliases:
        got = tuple(
            should_fire(cond(operator, 10), {"num_of_samples": value}, NOON)
            for value in (9, 10, 11)
        )
        assert got == expected, operator


@pytest.mark.parametrize(("aliases", "expected"), OPERATOR_TABLE)
def test_epsilon_makes_values_within_1e_6_equal(
    aliases: tuple[str, ...], expected: tuple[bool, bool, bool]
) -> None:
    at = expected[1]
    for operator in aliases:
        for value in (10 + EPSILON / 2, 10 - EPSILON / 2):
            assert should_fire(cond(operator, 10), {"num_of_samples": value}, NOON) == at
        # a hair beyond epsilon is really above / below
        assert (
            should_fire(cond(operator, 10), {"num_of_samples": 10 + 3 * EPSILON}, NOON)
            == (expected[2])
        )


def test_indexed_metric_selects_list_element() -> None:
    spec = cond("gt", 0.5, "accuracy[1]")
    assert should_fire(spec, {"accuracy": [0.1, 0.9]}, NOON)
    assert not should_fire(spec, {"accuracy": [0.9, 0.1]}, NOON)


@pytest.mark.parametrize(
    "metrics",
    [{}, {"other": 5}, {"accuracy": [0.9]}, {"accuracy": 0.9}, {"accuracy": ["x", "y"]}],
)
def test_missing_or_unusable_metric_never_fires(metrics: dict[str, object]) -> None:
    assert not should_fire(cond("ge", 0, "accuracy[1]"), metrics, NOON)


def test_no_condition_fires_on_one_pending_sample() -> None:
    assert should_fire(Trigger(), {"num_of_samples": 1}, NOON)
    assert not should_fire(Trigger(), {"num_of_samples": 0}, NOON)


@pytest.mark.parametrize(
    ("start", "end", "inside", "outside"),
    [
        ("02:00", "20:00", ["02:00", "12:00", "20:00"], ["01:59", "20:01", "00:00"]),
        ("22:00", "02:00", ["22:00", "23:59", "00:00", "02:00"], ["02:01", "21:59", "12:00"]),
        ("20:00", "24:00", ["20:00", "23:59"], ["19:59", "00:01"]),
        ("00:00", "24:00", ["00:00", "12:00", "23:59"], []),
        ("12:00", "12:00", ["12:00"], ["11:59", "12:01"]),
    ],
)
def test_timer_windows_inclusive_and_wrapping(
    start: str, end: str, inside: list[str], outside: list[str]
) -> None:
    window = (parse_hhmm(start), parse_hhmm(end))
    for t in inside:
        assert in_window(window, parse_hhmm(t) % 1440), t
    for t in outside:
        assert not in_window(window, parse_hhmm(t)), t


def test_timer_and_condition_must_both_hold() -> None:
    spec = Trigger(
        timer=Timer(start="02:00", end="04:00"),
        condition=Condition(operator="ge", threshold=5, metric="num_of_samples"),
    )
    three_am, noon = 3 * 60, NOON
    assert should_fire(spec, {"num_of_samples": 5}, three_am)
    assert not should_fire(spec, {"num_of_samples": 4}, three_am)
    assert not should_fire(spec, {"num_of_samples": 500}, noon)


def test_timer_alone_fires_inside_window_with_a_pending_sample() -> None:
    spec = Trigger(timer=Timer(start="02:00", end="04:00"))
    assert should_fire(spec, {"num_of_samples": 1}, 3 * 60)
    assert not should_fire(spec, {"num_of_samples": 1}, NOON)
    assert not should_fire(spec, {"num_of_samples": 0}, 3 * 60)


@pytest.mark.parametrize("text", ["24:01", "25:00", "12:60", "1:00", "12:5", "noon", ""])
def test_bad_hhmm_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_hhmm(text)


@pytest.mark.parametrize(("raw", "value"), [("500", 500.0), (500, 500.0), (0.5, 0.5), ("1e3", 1e3)])
def test_thresholds_from_strings_ints_and_floats(raw: str | int | float, value: float) -> None:
    assert parse_threshold(raw) == value


@pytest.mark.parametrize("raw", ["many", None, True, "nan", "inf"])
def test_bad_thresholds_rejected(raw: object) -> None:
    with pytest.raises(ValueError):
        parse_threshold(raw)  # type: ignore[arg-type]


def test_metric_value_forms() -> None:
    assert metric_value({"n": 3}, "n") == 3.0
    assert metric_value({"n": [1, 2]}, "n[1]") == 2.0
    assert metric_value({"n": [1, 2]}, "n[2]") is None
    assert metric_value({"n": True}, "n") is None
    assert metric_value({"n": 3}, "bad name") is None
