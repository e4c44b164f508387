"""The deploy gate as a pure function: delta arithmetic, indexing, missing metrics, NaN and
infinities, lists of different lengths, and any junk a report may hold."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.gate import judge, kept
from service.core.triggers import EPSILON, OPERATORS
from service.wire import Condition

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
operators = st.sampled_from(sorted(OPERATORS))


def gate(metric: str, operator: str = ">", threshold: float = 0.0) -> Condition:
    return Condition(operator=operator, threshold=threshold, metric=metric)


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda n: st.tuples(st.lists(finite, min_size=n, max_size=n),
                            st.lists(finite, min_size=n, max_size=n), st.integers(0, n - 1))
    ),
    operators,
    finite,
)  # fmt: skip
def test_delta_is_new_minus_deployed_element_by_element(
    lists: tuple[list[float], list[float], int], operator: str, threshold: float
) -> None:
    new, old, i = lists
    verdict = judge(gate(f"acc_delta[{i}]", operator, threshold), {"acc": new}, {"acc": old})
    delta = new[i] - old[i]
    assert verdict.value == delta
    assert verdict.holds == OPERATORS[operator](delta, threshold)
    assert "acc_delta[" in verdict.reason


@settings(max_examples=300, deadline=None)
@given(st.lists(finite, min_size=1, max_size=6), st.integers(0, 8), operators, finite)
def test_indexing_reads_one_value_and_past_the_end_holds_back(
    values: list[float], i: int, operator: str, threshold: float
) -> None:
    verdict = judge(gate(f"f1[{i}]", operator, threshold), {"f1": values}, None)
    if i < len(values):
        assert verdict.value == values[i]
        assert verdict.holds == OPERATORS[operator](values[i], threshold)
    else:
        assert not verdict.holds and verdict.value is None
        assert "past the end" in verdict.reason


def test_a_bare_name_reads_a_bare_number_and_is_refused_on_a_list() -> None:
    assert judge(gate("acc", ">", 0.5), {"acc": 0.9}, None).holds  # a bare number
    assert judge(gate("acc[0]", ">", 0.5), {"acc": [0.9]}, None).holds
    for values in ([0.9], [0.9, 0.8], []):
        refused = judge(gate("acc", ">", 0.5), {"acc": values}, None)
        assert not refused.holds and "the condition must name one, as acc[i]" in refused.reason
    bare_delta = judge(gate("acc_delta", ">", 0.0), {"acc": [0.9]}, {"acc": [0.5]})
    assert not bare_delta.holds and "never read as 0" in bare_delta.reason


def test_operators_and_epsilon_are_the_train_triggers() -> None:
    at = {"acc": [0.5 + EPSILON / 2]}
    assert judge(gate("acc[0]", "eq", 0.5), at, None).holds
    assert not judge(gate("acc[0]", "gt", 0.5), at, None).holds
    assert judge(gate("acc[0]", ">=", 0.5), at, None).holds
    assert judge(gate("acc_delta[0]", ">", 0.01), {"acc": [0.9]}, {"acc": [0.85]}).holds
    # within epsilon of the threshold is not "greater"
    assert not judge(gate("acc_delta[0]", ">", 0.05), {"acc": [0.9]}, {"acc": [0.85]}).holds


@pytest.mark.parametrize(
    ("metric", "new", "old", "words"),
    [
        ("acc", {}, None, "has no metric acc"),
        ("acc", {"loss": [1.0]}, None, "reported: loss"),
        ("acc_delta", {"loss": [1.0]}, {"acc": [0.5]}, "has no metric acc_delta"),
        ("acc_delta[0]", {"acc": [0.9]}, {"loss": [1.0]}, "deployed model has no usable acc"),
        ("acc_delta[0]", {"acc": [0.9]}, {"acc": ["high"]}, "deployed model has no usable acc"),
        ("acc[0]", {"acc": ["0.9"]}, None, "not a number"),
        ("acc[0]", {"acc": [True]}, None, "not a number"),
        ("acc", {"acc": {"x": 1}}, None, "not a number"),
        ("acc_delta[1]", {"acc": [0.9, 0.8]}, {"acc": [0.5]}, "2 values for the new model"),
        ("acc_delta[0]", {"acc": [0.9]}, {"acc": [0.5, 0.4]}, "1 values for the new model"),
        ("acc[", {"acc": [0.9]}, None, "cannot be read"),
    ],
)
def test_what_the_condition_needs_missing_holds_back_with_the_reason(
    metric: str, new: dict[str, Any], old: dict[str, Any] | None, words: str
) -> None:
    verdict = judge(gate(metric, ">", -1e9), new, old)
    assert not verdict.holds
    assert verdict.value is None
    assert words in verdict.reason


@settings(max_examples=200, deadline=None)
@given(
    st.lists(finite, min_size=2, max_size=4), st.integers(0, 1), non_finite, operators,
    st.booleans(),
)  # fmt: skip
def test_a_non_finite_value_read_holds_back_and_one_not_read_does_not_matter(
    values: list[float], i: int, bad: float, operator: str, in_deployed: bool
) -> None:
    poisoned = list(values)
    poisoned[i] = bad
    new, old = (values, poisoned) if in_deployed else (poisoned, values)
    read = judge(gate(f"acc_delta[{i}]", operator, 0.0), {"acc": new}, {"acc": old})
    assert not read.holds and read.value is None
    # the other index is not affected (unless the difference is not finite itself)
    other = 1 - i
    clean = judge(gate(f"acc_delta[{other}]", operator, 0.0), {"acc": new}, {"acc": old})
    assert clean.value == new[other] - old[other]
    own = judge(gate(f"acc[{i}]", operator, 0.0), {"acc": poisoned}, None)
    assert not own.holds and "not a finite number" in own.reason


def test_a_difference_that_overflows_holds_back() -> None:
    verdict = judge(gate("acc_delta[0]", ">", 0), {"acc": [1.7e308]}, {"acc": [-1.7e308]})
    assert not verdict.holds and "not a finite number" in verdict.reason


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=3), operators, finite)
def test_with_nothing_deployed_a_delta_holds_and_the_metric_itself_is_judged(
    values: list[float], operator: str, threshold: float
) -> None:
    delta = judge(gate("acc_delta[0]", operator, threshold), {"acc": values}, None)
    assert delta.holds and delta.value is None and "nothing deployed" in delta.reason
    own = judge(gate("acc[0]", operator, threshold), {"acc": values}, None)
    assert own.holds == OPERATORS[operator](values[0], threshold)
    # there is nothing to beat, but the new model's own value must be there to read
    missing = judge(gate("acc_delta", operator, threshold), {"loss": values}, None)
    assert not missing.holds


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                   max_size=4),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(json_values, json_values | st.none(), st.sampled_from(
    ["acc", "acc_delta", "acc[1]", "acc_delta[0]", "x_delta_delta", ""]
), operators)  # fmt: skip
def test_any_report_gets_a_verdict_never_an_exception(
    new: object, old: object, metric: str, operator: str
) -> None:
    verdict = judge(gate(metric, operator, 0.5), new, old)
    assert verdict.reason
    if verdict.holds and verdict.value is not None:
        assert math.isfinite(verdict.value)
    assert all(len(v) <= 4 for v in kept(new).values())
    assert len(kept(new)) <= 8


def test_kept_metrics_are_bounded_and_finite() -> None:
    many = {f"m{i:02}": [float(i)] * 10 for i in range(20)}
    many["bad"] = [math.nan]
    kept_metrics = kept(many)
    assert list(kept_metrics) == [f"m{i:02}" for i in range(8)]
    assert all(values == (float(i),) * 4 for i, values in enumerate(kept_metrics.values()))
    assert "bad" not in kept({"bad": [1.0, math.inf], "ok": 2})
    assert kept({"ok": 2}) == {"ok": (2.0,)}
