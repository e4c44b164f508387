"""The deploy gate: whether a newly evaluated model replaces the one deployed. Pure.

As in Sedna's incremental-learning job, the eval worker scores the new model and the deployed
one on the same eval data and reports two results in that order, each with `metrics` (name ->
list of numbers). For every metric `m` the new model reports, the gate reads `m` (the new
model's values) and `m_delta` (new minus deployed, element by element), and evaluates
`deploySpec.trigger.condition` on them with the train trigger's operators and epsilon;
`name[i]` picks one value of a list; a bare name reads a bare number only (on a list it is
refused, where Sedna's own controller read a bare list name as 0).

It fails safe: a value it cannot read (a metric missing, a non-number, NaN or an infinity,
lists of different lengths, an index past the end, a bare name on a list) holds the
model back, and the reason says which. While nothing is deployed (or the report has only the
new model's result), there is nothing to beat: a condition on `m_delta` holds as long as the
new model's own `m` is there to read, and one on `m` is evaluated as usual.
"""


import math
import re
from collections.abc import Mapping

import msgspec

from service.core.triggers import OPERATORS
from service.wire import Condition

DELTA_SUFFIX = "_delta"
#: What a job keeps of a model's metrics (state, history, /metrics): names and values each.
KEPT_METRICS = 8
KEPT_VALUES = 4

Values = tuple[float, ...]
Metrics = dict[str, Values]

_NAME_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<index>\d+)\])?$")


class GateVerdict(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the gate decided: whether the condition holds, the value it read (None when
    there was none to read, or nothing to beat), and why, with the values compared."""

    holds: bool
    reason: str
    value: float | None = None


def judge(spec: Condition, candidate: object, deployed: object | None) -> GateVerdict:
    """The verdict on a candidate's reported `metrics` against the deployed model's.

    `deployed` is None when nothing is deployed yet or the report has only one result.
    Never raises, whatever the reports hold.
    """
    match = _NAME_RE.match(spec.metric)
    if match is None or spec.operator not in OPERATORS:
        return GateVerdict(holds=False, reason=f"the condition {_text(spec)} cannot be read")
    name, index = match["name"], match["index"]
    new = _as_mapping(candidate)
    base = name[: -len(DELTA_SUFFIX)] if name.endswith(DELTA_SUFFIX) else None
    if base is not None and base in new:
        return _judge_delta(spec, base, index, new, deployed)
    value, problem = _read(new, name, index, "the new model")
    return _compare(spec, value, problem)


def _judge_delta(
    spec: Condition, base: str, index: str | None, new: Mapping[str, object], deployed: object
) -> GateVerdict:
    mine, problem = _read(new, base, index, "the new model")
    if problem is not None:
        return GateVerdict(holds=False, reason=problem)
    if deployed is None:
        shown = f"{base}{_suffix(index)} = {_num(mine)}"
        reason = f"nothing deployed to compare with: {spec.metric} holds ({shown})"
        return GateVerdict(holds=True, reason=reason)
    old = _as_mapping(deployed)
    delta, problem = _delta(_values(new.get(base)), _values(old.get(base)), base)
    if problem is not None:
        return GateVerdict(holds=False, reason=problem)
    value, problem = _pick(delta, index, spec.metric, "the difference")
    return _compare(spec, value, problem)


def _compare(spec: Condition, value: float | None, problem: str | None) -> GateVerdict:
    if problem is not None or value is None:
        return GateVerdict(holds=False, reason=problem or f"{spec.metric} cannot be read")
    holds = OPERATORS[spec.operator](value, spec.threshold_value or 0.0)
    verb = "holds" if holds else "does not hold"
    reason = f"{spec.metric} = {_num(value)}: {_text(spec)} {verb}"
    return GateVerdict(holds=holds, reason=reason, value=value)


def _read(
    metrics: Mapping[str, object], name: str, index: str | None, whose: str
) -> tuple[float | None, str | None]:
    """One value of a reported metric, or why it cannot be read."""
    if name not in metrics:
        reported = ", ".join(sorted(metrics)[:KEPT_METRICS]) or "none"
        return None, f"{whose} has no metric {name} (reported: {reported})"
    if index is None and isinstance(metrics[name], list | tuple):
        return None, (
            f"{name} of {whose} is a list of values: the condition must name one, as "
            f"{name}[i] (a bare name is refused, never read as 0)"
        )
    values = _values(metrics[name])
    if values is None:
        return None, f"{name} of {whose} is not a number or a list of numbers"
    return _pick(values, index, name + _suffix(index), whose)


def _pick(
    values: Values, index: str | None, label: str, whose: str
) -> tuple[float | None, str | None]:
    if index is None:
        if len(values) != 1:
            what = f"{len(values)} values" if values else "no value"
            return None, f"{label} of {whose} has {what}: name one as {label}[i]"
        value = values[0]
    elif int(index) >= len(values):
        return None, f"{label} is past the end: {whose} has {len(values)} values"
    else:
        value = values[int(index)]
    if not math.isfinite(value):
        return None, f"{label} of {whose} is {value}, not a finite number"
    return value, None


def _delta(new: Values | None, old: Values | None, base: str) -> tuple[Values, str | None]:
    """New minus deployed, element by element, or why there is no such difference."""
    if new is None:
        return (), f"{base} of the new model is not a number or a list of numbers"
    if old is None:
        return (), f"the deployed model has no usable {base}"
    if len(new) != len(old):
        return (), (
            f"{base} has {len(new)} values for the new model and {len(old)} for the "
            "deployed one"
        )
    return tuple(a - b for a, b in zip(new, old, strict=True)), None


def _values(value: object) -> Values | None:
    """A metric's values: a list of numbers, or one bare number; None for anything else."""
    items = value if isinstance(value, list | tuple) else [value]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in items):
        return None
    try:
        return tuple(float(v) for v in items)  # type: ignore[arg-type]
    except OverflowError:  # an integer too large for a float
        return None


def _as_mapping(metrics: object) -> Mapping[str, object]:
    if not isinstance(metrics, Mapping):
        return {}
    return {k: v for k, v in metrics.items() if isinstance(k, str)}


def kept(metrics: object) -> Metrics:
    """What a job keeps of reported metrics: the first few names (sorted) and the first
    few values of each; metrics that are not all finite numbers are left out (the gate's
    reason already says what was wrong with the one it read)."""
    kept_metrics: Metrics = {}
    for name, value in sorted(_as_mapping(metrics).items()):
        values = _values(value)
        if not values or not all(math.isfinite(v) for v in values):
            continue
        kept_metrics[name[:64]] = values[:KEPT_VALUES]
        if len(kept_metrics) == KEPT_METRICS:
            break
    return kept_metrics


def _text(spec: Condition) -> str:
    return f"{spec.metric} {spec.operator} {_num(spec.threshold_value)}"


def _suffix(index: str | None) -> str:
    return "" if index is None else f"[{index}]"


def _num(value: float | None) -> str:
    return "none" if value is None else f"{value:.6g}"
