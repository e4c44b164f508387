"""What a worker's report means to its job: whether the job will hear it, and which of its
results are models the lifecycle can go on with."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from service.core.effects import Reject
from service.core.events import WorkerReported
from service.core.state import ModelRef, State
from service.logs import redact
from service.messages import STORAGE_URL_PATTERN, Model

_STORAGE_URL = re.compile(STORAGE_URL_PATTERN)
#: How much of a failed worker's stderr (its tail) and stated reason a job keeps.
STDERR_TAIL_CHARS = 400
REASON_CHARS = 200


def refusal(state: State | None, report: WorkerReported) -> Reject | None:
    """Why a job will not hear this report at all (None: it will).

    The worker endpoint asks this before answering, the transition before applying.
    """
    if state is None:
        return Reject(code="unknown_job", reason=f"unknown job {report.namespace}/{report.name}")
    return None


def usable_models(results: Iterable[dict[str, Any]]) -> tuple[Model, ...]:
    """The results that describe a model the lifecycle can use, in order.

    A usable model has a string `format` (may be empty or absent) and a `url` that is an
    s3:// URL or an absolute local path without `..`: a worker is not trusted to point the
    deploy copy at arbitrary files.
    """
    return tuple(model for model in map(_model_of, results) if model is not None)


def model_refs(report: WorkerReported) -> tuple[ModelRef, ...]:
    """The usable models of a report, as the job keeps them."""
    return tuple(ModelRef(format=m.format, url=m.url) for m in usable_models(report.results))


def no_usable_model(report: WorkerReported) -> str:
    """The reason a `completed` report without a usable model fails its round."""
    return (
        f"{report.kind} worker {report.worker} completed without a usable model "
        f"({len(report.results)} results; each model needs a string url)"
    )


def failure(report: WorkerReported) -> str:
    """Why a worker failed, as its job keeps it: the exit code, reason and stderr tail its
    report carried in `ownerInfo` (what `lifelong worker` sends: `exitCode`, `stderr`,
    `reason`; Sedna's own worker library sends none), bounded and with secrets masked."""
    info = report.owner_info
    details = []
    code = info.get("exitCode")
    if isinstance(code, int) and not isinstance(code, bool):
        details.append(f"exit code {code}")
    reason = info.get("reason")
    if isinstance(reason, str) and reason.strip():
        details.append(_one_line(reason)[:REASON_CHARS])
    stderr = info.get("stderr")
    if isinstance(stderr, str) and stderr.strip():
        details.append(f"stderr: {_one_line(stderr)[-STDERR_TAIL_CHARS:]}")
    text = f"{report.kind} worker {report.worker} failed"
    if details:
        text += f" ({'; '.join(details)})"
    return text


def _one_line(text: str) -> str:
    """Secrets masked (before cutting: a cut could split a secret from the key naming it),
    then non-empty lines, stripped, joined with " | ": a reason fits one log line."""
    return " | ".join(line.strip() for line in redact(text).splitlines() if line.strip())


def _model_of(result: object) -> Model | None:
    if not isinstance(result, dict):
        return None
    url, model_format, metrics = result.get("url"), result.get("format", ""), result.get("metrics")
    if not isinstance(url, str) or not isinstance(model_format, str):
        return None
    if not _STORAGE_URL.search(url):
        return None
    return Model(
        format=model_format, url=url, metrics=metrics if isinstance(metrics, dict) else None
    )
