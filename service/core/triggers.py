"""The train trigger: a condition on metrics and a daily time window, both pure.

Sedna's trigger (pkg/localcontroller/trigger) compares a metric against a threshold and
checks a "HH:MM" window. Here both are plain functions of their inputs; the caller passes
the local minute of the day, so no clock is read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

import msgspec

EPSILON = 1e-6
NUM_OF_SAMPLES = "num_of_samples"
MINUTES_PER_DAY = 24 * 60

_METRIC_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<index>\d+)\])?$")
_HHMM_RE = re.compile(r"^(?P<h>\d{2}):(?P<m>\d{2})$")


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


class TriggerSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The interpreted part of `trainSpec.trigger`.

    `window` is (start, end) in minutes of the day, both inclusive; `None` means no timer.
    An empty `operator` means no condition (Sedna sends the condition even when unset).
    """

    check_period_s: int = 60
    window: tuple[int, int] | None = None
    operator: str = ""
    threshold: float = 0.0
    metric: str = ""

    @property
    def has_condition(self) -> bool:
        return self.operator != ""


def parse_hhmm(text: str) -> int:
    """Minutes of the day for "HH:MM" (00:00..23:59, and 24:00 = 1440). ValueError otherwise."""
    match = _HHMM_RE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not HH:MM")
    hours, minutes = int(match["h"]), int(match["m"])
    if (hours, minutes) == (24, 0):
        return MINUTES_PER_DAY
    if hours > 23 or minutes > 59:
        raise ValueError(f"{text!r} is not a time of day (00:00..23:59 or 24:00)")
    return hours * 60 + minutes


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


def condition_holds(spec: TriggerSpec, metrics: Mapping[str, object]) -> bool:
    compare = OPERATORS.get(spec.operator)
    value = metric_value(metrics, spec.metric)
    if compare is None or value is None:
        return False
    return compare(value, spec.threshold)


def should_fire(spec: TriggerSpec, metrics: Mapping[str, object], minute_of_day: int) -> bool:
    """Whether the trigger fires now.

    Both condition and timer present: both must hold; an absent one holds trivially. With
    neither, the trigger fires as soon as one train sample is pending; the caller never fires
    a round without a pending sample whatever the condition says (an empty round trains on
    nothing).
    """
    if spec.window is not None and not in_window(spec.window, minute_of_day):
        return False
    if spec.has_condition:
        return condition_holds(spec, metrics)
    return (metric_value(metrics, NUM_OF_SAMPLES) or 0.0) >= 1


__all__ = [
    "EPSILON",
    "NUM_OF_SAMPLES",
    "OPERATORS",
    "TriggerSpec",
    "condition_holds",
    "in_window",
    "metric_value",
    "parse_hhmm",
    "parse_threshold",
    "should_fire",
    "valid_metric",
]
