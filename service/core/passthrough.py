"""Resources the controller stores and runs nothing of: Models, joint-inference services and
federated-learning jobs. Pure.

A Model is kept for the jobs that name it. A joint-inference service or a federated-learning
job is kept so that its workers' reports are bound to it and forwarded upstream, as Sedna's
local controller forwards them: header {namespace, resourceKind, resourceName, operation
`status`}, content `{phase: <report kind>, status, output: {ownerInfo}}` for a joint-inference
service (its inference counts, hard examples and upload ratio live in ownerInfo) and
`{phase, status, output: {models: <results>, ownerInfo}}` for a federated-learning job.

A report is bound to a stored resource of its kind (same namespace and name) and to a worker
named for it, as Sedna's GM names them:

- **Joint inference.** The GM runs the workers as Deployments `{service}-deployment-edge` and
  `{service}-deployment-cloud` (pods `{service}-deployment-edge-<hash>-<hash>`): a worker is
  named `{service}-<role>-<rest>`, role one of `deployment`, `edge`, `cloud`, `inference`.
- **Federated learning.** The GM names the pods `{job}-aggworker` and `{job}-trainworker-<i>`:
  a worker is named `{job}-aggworker` or `{job}-<role>-<rest>`, role one of `aggworker`,
  `trainworker`, `agg`, `train`.

Sedna's worker library reports over HTTP under its `WORKER_NAME`, which the GM sets to
`edgeworker-`/`cloudworker-` (joint inference) or `aggworker-`/`trainworker-` (federated
learning) plus five random characters, names that say nothing of the owner; over HTTP
(unauthenticated, so a name proves nothing anyway) those are accepted too. Under the broker's
ACL a worker publishes only under its own name, so the name is what ties it to its owner.
"""


import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import msgspec

from service.core import reports
from service.core.effects import Forward, Recorder, Reject
from service.core.events import OwnerReported, ResourceApplied, ResourceDeleted, StoredEvent
from service.core.state import ResourceState, State
from service.keys import FEDERATED_LEARNING_KIND, JOINT_INFERENCE_KIND, MODEL_KIND
from service.wire import ReportOutput, ReportStatus

replace = msgspec.structs.replace

#: How each stored kind is named in notes and refusals.
NOUNS: Mapping[str, str] = MappingProxyType(
    {
        MODEL_KIND: "model",
        JOINT_INFERENCE_KIND: "joint inference service",
        FEDERATED_LEARNING_KIND: "federated learning job",
    }
)
#: The role level a worker's name carries after `{owner}-`, by owner kind.
_ROLES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        JOINT_INFERENCE_KIND: ("deployment", "edge", "cloud", "inference"),
        FEDERATED_LEARNING_KIND: ("aggworker", "trainworker", "agg", "train"),
    }
)
#: Names a worker carries whole after `{owner}-` (Sedna's aggregation worker pod).
_WHOLE: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {JOINT_INFERENCE_KIND: (), FEDERATED_LEARNING_KIND: ("aggworker",)}
)
#: Sedna's GM sets WORKER_NAME to these plus a random suffix; its library reports over HTTP.
_SEDNA_LIBRARY_NAMES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        JOINT_INFERENCE_KIND: ("edgeworker-", "cloudworker-"),
        FEDERATED_LEARNING_KIND: ("aggworker-", "trainworker-"),
    }
)
_SUFFIX = re.compile(r"[a-z0-9]+")
#: The rest of a worker's name after its role (a DNS-1123 subdomain's characters).
_REST = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def apply(state: State | None, event: StoredEvent, out: Recorder) -> State | None:
    """Apply one event to a stored resource (None: it does not exist, or no longer does)."""
    if state is not None and not isinstance(state, ResourceState):
        out.note(f"{type(event).__name__} does not apply to a {type(state).__name__}")
        return state
    if isinstance(event, ResourceApplied):
        return _applied(state, event, out)
    if isinstance(event, ResourceDeleted):
        if state is None:
            out.note(f"{NOUNS[event.kind]} {event.namespace}/{event.name} does not exist")
            return None
        out.note(f"{NOUNS[event.kind]} deleted")
        return None
    return _reported(state, event, out)


def _applied(state: ResourceState | None, event: ResourceApplied, out: Recorder) -> ResourceState:
    if state is not None and state.digest == event.digest:
        return state  # Sedna's GM re-sends every resource on each resync: nothing changes
    if state is None:
        out.note(f"{NOUNS[event.kind]} stored")
        return ResourceState(
            kind=event.kind, namespace=event.namespace, name=event.name, digest=event.digest,
            model=event.model,
        )  # fmt: skip
    out.note(f"{NOUNS[event.kind]} updated")
    return replace(state, digest=event.digest, model=event.model)


def _reported(
    state: ResourceState | None, report: OwnerReported, out: Recorder
) -> ResourceState | None:
    rejection = refusal(state, report)
    if rejection is not None:
        out.add(rejection)
        return state
    assert state is not None  # refusal() refuses a report for no resource
    models = list(report.results) if report.kind == FEDERATED_LEARNING_KIND else None
    output = ReportOutput(models=models, owner_info=msgspec.Raw(report.owner_info))
    status = ReportStatus(phase=report.phase, status=report.status, output=output)
    out.add(Forward(id=out.next_id(), namespace=state.namespace, name=state.name, status=status))
    return replace(
        state,
        reports=state.reports + 1,
        last_report=f"{report.phase}/{report.status or '-'}",
        last_report_ms=out.ctx.now_ms,
    )


def refusal(state: State | None, report: OwnerReported) -> Reject | None:
    """Why a stored resource will not forward this report (None: it will): there is no such
    resource of the report's kind, or the worker is not named for it (the module's
    docstring). The worker endpoint asks this before answering, the transition before
    applying."""
    noun = NOUNS[report.kind]
    if not isinstance(state, ResourceState) or state.kind != report.kind:
        return reports.unknown_owner(report, noun)
    if worker_named_for(report):
        return None
    roles = " or ".join(f"'{report.name}-{role}-<suffix>'" for role in _ROLES[report.kind])
    whole = "".join(f" or '{report.name}-{name}'" for name in _WHOLE[report.kind])
    return reports.foreign_worker(report, noun, f"its workers are named {roles}{whole}")


def worker_named_for(report: OwnerReported) -> bool:
    """Whether the worker's name ties it to the report's owner."""
    worker, prefix = report.worker, f"{report.name}-"
    if worker.startswith(prefix):
        rest = worker[len(prefix) :]
        if rest in _WHOLE[report.kind]:
            return True
        for role in _ROLES[report.kind]:
            if rest.startswith(f"{role}-") and _REST.fullmatch(rest[len(role) + 1 :]):
                return True
    return report.channel == "http" and any(
        worker.startswith(library) and _SUFFIX.fullmatch(worker[len(library) :]) is not None
        for library in _SEDNA_LIBRARY_NAMES[report.kind]
    )


# ================================================================= what Sedna's GM takes in
def gm_accepts(kind: str, status: ReportStatus) -> bool:
    """Whether Sedna's GM takes this forwarded report in (the rest goes to MQTT only).

    The GM's joint-inference handler reads any status (it keeps ownerInfo's values as the
    service's metrics). Its federated-learning handler decodes the status into Go types and
    drops the whole status when one value does not fit: each of `output.models` must be a
    model (`format`, `url` strings, `metrics` an object, `device_soc_versions` and `classes`
    lists of strings, `history_metric` a 32-bit float, `current_metric` metric objects, the
    `number_of_*` counts integers) and ownerInfo's `currentRound` an integer and
    `updateTime` a string. Go matches field names in any case, and so does this check.
    """
    if kind != FEDERATED_LEARNING_KIND:
        return True
    try:
        owner_info = msgspec.json.decode(status.output.owner_info)
    except msgspec.DecodeError:
        return False
    models = status.output.models or []
    return _fits(owner_info, _JOB_INFO) and all(_fits(model, _MODEL) for model in models)


_INT64 = (-(2**63), 2**63 - 1)
_FLOAT32_MAX = 3.4028234663852886e38


def _string(value: object) -> bool:
    return value is None or isinstance(value, str)


def _integer(value: object) -> bool:
    return value is None or (
        isinstance(value, int) and not isinstance(value, bool) and _INT64[0] <= value <= _INT64[1]
    )


def _float32(value: object) -> bool:
    if value is None:
        return True
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and abs(value) <= _FLOAT32_MAX
    )


def _object(value: object) -> bool:
    return value is None or isinstance(value, dict)


def _strings(value: object) -> bool:
    return value is None or (isinstance(value, list) and all(map(_string, value)))


def _metric_sets(value: object) -> bool:
    """Go's `map[string]map[string]float32`."""
    if value is None:
        return True
    if not isinstance(value, dict):
        return False
    return all(
        metrics is None or (isinstance(metrics, dict) and all(map(_float32, metrics.values())))
        for metrics in value.values()
    )


#: The Go types of the fields the GM decodes, by lower-case field name.
_MODEL: Mapping[str, Any] = MappingProxyType(
    {
        "format": _string,
        "url": _string,
        "device_soc_versions": _strings,
        "metrics": _object,
        "history_metric": _float32,
        "current_metric": _metric_sets,
        "classes": _strings,
        "number_of_labeled_unseen_sample": _integer,
        "number_of_model": _integer,
        "number_of_unseen_sample": _integer,
    }
)
_JOB_INFO: Mapping[str, Any] = MappingProxyType({"currentround": _integer, "updatetime": _string})


def _fits(value: object, fields: Mapping[str, Any]) -> bool:
    """Whether a JSON value decodes into a Go struct of these fields (null: the zero value)."""
    if value is None:
        return True
    if not isinstance(value, dict):
        return False
    return all(fields.get(key.lower(), _anything)(item) for key, item in value.items())


def _anything(_value: object) -> bool:
    return True
