"""The train trigger: a condition on metrics and a daily time window, both pure.

Sedna's trigger (pkg/localcontroller/trigger) compares a metric against a threshold and
checks a "HH:MM" window. Here both are plain functions of their inputs; the caller passes
the local minute of the day, so no clock is read. The trigger is the job spec's own
(`service.wire.Trigger`): this module is what its condition and window mean.
"""


import math
import re
from collections.abc import Callable, Mapping

from service.wire import MINUTES_PER_DAY, Condition, Trigger

EPSILON = 1e-6
NUM_OF_SAMPLES = "num_of_samples"

_METRIC_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<index>\d+)\])?$")


def _gt(a: float, b: float) -> bool:
    return a - b > EPSILON


def _ge(a: float, b: float) -> bool:
    return a - b > -EPSILON


def _lt(a: float, b: float) -> bool:
    return b - a > EPSILON


def _le(a: float, b: float) -> bool:
    return b - a > -EPSILON


def _eq(a: float, b: float) -> bool:
    return abs(a - b) <= EPSILON


def _ne(a: float, b: float) -> bool:
    return abs(a - b) > EPSILON


OPERATORS: Mapping[str, Callable[[float, float], bool]] = {
    "gt": _gt, ">": _gt,
    "ge": _ge, ">=": _ge,
    "lt": _lt, "<": _lt,
    "le": _le, "<=": _le,
    "eq": _eq, "=": _eq, "==": _eq,
    "ne": _ne, "!=": _ne,
}  # fmt: skip


def parse_threshold(value: str | int | float | None) -> float:
    """A threshold as a finite float; strings must be numeric. ValueError otherwise."""
    if value is None or isinstance(value, bool):
        raise ValueError("threshold must be a number or a numeric string")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("threshold must be finite")
    return number


def valid_metric(name: str) -> bool:
    return _METRIC_RE.match(name) is not None


def in_window(window: tuple[int, int], minute_of_day: int) -> bool:
    """Inclusive window; wraps past midnight when start > end. `24:00` equals midnight."""
    start, end = window[0] % MINUTES_PER_DAY, window[1]
    if start <= end:
        return start <= minute_of_day <= end
    return minute_of_day >= start or minute_of_day <= end


def metric_value(metrics: Mapping[str, object], metric: str) -> float | None:
    """The metric's value as a float, `name[i]` indexing a list metric; None when missing."""
    match = _METRIC_RE.match(metric)
    if match is None:
        return None
    value = metrics.get(match["name"])
    index = match["index"]
    if index is not None:
        if not isinstance(value, list | tuple):
            return None
        position = int(index)
        if position >= len(value):
            return None
        value = value[position]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def condition_holds(condition: Condition, metrics: Mapping[str, object]) -> bool:
    compare = OPERATORS.get(condition.operator)
    value = metric_value(metrics, condition.metric)
    if compare is None or value is None:
        return False
    return compare(value, condition.threshold_value or 0.0)


def should_fire(trigger: Trigger, metrics: Mapping[str, object], minute_of_day: int) -> bool:
    """Whether the trigger fires now.

    Both condition and timer present: both must hold; an absent one holds trivially. With
    neither, the trigger fires as soon as one train sample is pending; the caller never fires
    a round without a pending sample whatever the condition says (an empty round trains on
    nothing).
    """
    window = trigger.window
    if window is not None and not in_window(window, minute_of_day):
        return False
    if trigger.condition is not None and trigger.has_condition:
        return condition_holds(trigger.condition, metrics)
    return (metric_value(metrics, NUM_OF_SAMPLES) or 0.0) >= 1


__all__ = [
    "EPSILON",
    "NUM_OF_SAMPLES",
    "OPERATORS",
    "condition_holds",
    "in_window",
    "metric_value",
    "parse_threshold",
    "should_fire",
    "valid_metric",
]
