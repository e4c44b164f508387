"""How `describe job` and `get jobs` show a job's rounds, its deployed model and its gate.

Pure functions of stored state and round records, for `describe job` (a table of rounds with
a sparkline of the main metric, or the same data as JSON) and `get jobs` (the deployed
version and its main metric). The main metric is the deploy condition's (without `_delta`:
the quantity it compares, `name[i]` kept), else the first metric the rounds report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from service.cli.rendering import Cell, format_time_ms, render
from service.core.gate import DELTA_SUFFIX, Metrics
from service.core.rounds import RoundRecord
from service.core.state import JobState
from service.logs import redact

SPARK_BARS = "▁▂▃▄▅▆▇█"
NO_VALUE = "·"
REASON_CHARS = 70
_NAME_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<index>\d+)\])?$")
_OUTCOME_WORDS = {
    "running": "running",
    "deployed": "deployed",
    "held_back": "held back",
    "failed": "failed",
    "rolled_back": "rolled back",
    "refused": "refused",
}


def main_metric(state: JobState, records: Sequence[RoundRecord] = ()) -> str | None:
    """The metric the views follow: the deploy condition's quantity, else the first one the
    newest round (or the deployed model) reported; None when there is none."""
    gate = state.spec.gate
    if gate is not None:
        match = _NAME_RE.match(gate.metric)
        if match is not None:
            name = match["name"]
            name = name.removesuffix(DELTA_SUFFIX) if name != DELTA_SUFFIX else name
            return name + (f"[{match['index']}]" if match["index"] is not None else "")
    for metrics in [r.candidate for r in reversed(records)] + [_deployed_metrics(state)]:
        if metrics:
            return sorted(metrics)[0]
    return None


def metric_value(metrics: Metrics, metric: str | None) -> float | None:
    """`name` (its first value) or `name[i]` of kept metrics; None when absent."""
    match = _NAME_RE.match(metric or "")
    if match is None:
        return None
    values = metrics.get(match["name"], ())
    index = int(match["index"] or 0)
    if index >= len(values) or not math.isfinite(values[index]):
        return None
    return values[index]


def sparkline(values: Sequence[float | None]) -> str:
    """One bar per value, scaled between the smallest and the largest; `·` for none."""
    known = [v for v in values if v is not None]
    if not known:
        return NO_VALUE * len(values)
    low, high = min(known), max(known)
    top = len(SPARK_BARS) - 1
    return "".join(
        NO_VALUE if v is None
        else SPARK_BARS[top // 2 if high == low else round((v - low) / (high - low) * top)]
        for v in values
    )  # fmt: skip


def _deployed_metrics(state: JobState) -> Metrics:
    return state.deployed.metrics if state.deployed is not None else {}


def get_columns(state: JobState) -> dict[str, Cell]:
    """The `get jobs` columns of the deploy: the deployed version and its main metric as
    measured in its round (None: nothing deployed, or no such metric)."""
    if state.deployed is None:
        return {"deployed": None, "metric": None}
    metric = main_metric(state)
    value = metric_value(state.deployed.metrics, metric)
    shown = None if value is None or metric is None else f"{metric}={value:.4g}"
    return {"deployed": state.deployed.version, "metric": shown}


def describe_lines(state: JobState, records: Sequence[RoundRecord]) -> list[str]:
    """What `describe job` adds: the deploy gate, the deployed model, and the rounds."""
    return [
        f"{'Deploy gate:':<16}{gate_summary(state)}",
        f"{'Deployed:':<16}{deployed_summary(state)}",
        *rounds_lines(records, main_metric(state, records)),
    ]


def gate_summary(state: JobState) -> str:
    gate = state.spec.gate
    if gate is None:
        return "none: every evaluated model is deployed"
    return (
        f"deploy when {gate.metric} {gate.operator} {gate.threshold:g} (eval scores the new "
        "model and the deployed one)"
    )


def deployed_summary(state: JobState) -> str:
    """The deployed version, its main metric and what a rollback can go back to."""
    if state.deployed is None:
        return "nothing yet"
    metric = main_metric(state)
    value = metric_value(state.deployed.metrics, metric)
    text = f"version {state.deployed.version} ({state.deployed.model.url})"
    if value is not None:
        text += f", {metric} {value:.4g}"
    earlier = ", ".join(str(d.version) for d in reversed(state.deployments))
    text += f"; rollback to: {earlier or '-'}"
    if state.rollback is not None:
        text += f"; rolling back to version {state.rollback.version}"
    return text


def _duration(start: int | None, end: int | None) -> str:
    if start is None or end is None:
        return "-"
    seconds = max(end - start, 0) / 1000
    return f"{seconds:.1f}s" if seconds < 100 else f"{seconds:.0f}s"


def _phases(record: RoundRecord) -> tuple[str, str, str]:
    """How long each phase took: train, eval, deploy (`-` if not reached or not over); a
    phase ends where the next one starts, the last one reached where the round ended."""
    train, evaluation, deploy = (
        record.train_started_ms, record.eval_started_ms, record.deploy_started_ms
    )
    end = record.ended_ms
    return (
        _duration(train, evaluation if evaluation is not None else end),
        _duration(evaluation, deploy if deploy is not None else end),
        _duration(deploy, end),
    )


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def rounds_lines(records: Sequence[RoundRecord], metric: str | None) -> list[str]:
    """The rounds as a table (oldest first) under a sparkline of the main metric."""
    if not records:
        return ["Rounds:         -"]
    values = [metric_value(r.candidate, metric) for r in records]
    label = metric or "no metric reported"
    lines = [f"Rounds (last {len(records)}, oldest first), {label}: {sparkline(values)}"]
    rows = []
    for record, value in zip(records, values, strict=True):
        started = record.train_started_ms or record.deploy_started_ms
        when = "-" if started is None else format_time_ms(started)
        train, evaluation, deploy = _phases(record)
        compared = metric_value(record.deployed, metric)
        against = "-" if record.deployed_version is None else f"v{record.deployed_version}"
        reason = redact(record.reason or "")
        if len(reason) > REASON_CHARS:
            reason = reason[: REASON_CHARS - 3] + "..."
        rows.append([
            f"v{record.version}", _what(record), when,
            train, evaluation, deploy, str(record.train_samples), str(record.eval_samples),
            _shown(value), against, _shown(compared), reason or "-",
        ])  # fmt: skip
    headers = ["round", "outcome", "started", "train", "eval", "deploy", "train-n", "eval-n",
               "new", "vs", "deployed", "reason"]  # fmt: skip
    lines += ["  " + line for line in render(headers, rows).splitlines()]
    return lines


def _what(record: RoundRecord) -> str:
    word = _OUTCOME_WORDS.get(record.outcome, record.outcome)
    return f"rollback {word}" if record.kind == "rollback" else word


def describe_json(state: JobState, records: Sequence[RoundRecord]) -> dict[str, Any]:
    """What `describe job -o json` prints: the job's progress, deployments, gate, main
    metric and every round as stored."""
    metric = main_metric(state, records)
    builtins = msgspec.to_builtins
    return {
        "namespace": state.namespace,
        "name": state.name,
        "phase": state.phase,
        "step": state.step,
        "version": state.version,
        "gate": builtins(state.spec.gate) if state.spec.gate is not None else None,
        "deployed": builtins(state.deployed) if state.deployed is not None else None,
        "deployments": builtins(state.deployments),
        "rollback": builtins(state.rollback) if state.rollback is not None else None,
        "lastError": state.last_error,
        "mainMetric": metric,
        "mainMetricValues": [metric_value(r.candidate, metric) for r in records],
        "rounds": [builtins(r) for r in records],
    }
