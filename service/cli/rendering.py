"""What the operator commands print: tables, ages, job, dataset and stored-resource views, watch
lines, and how `describe job` and `get jobs` show a job's rounds, its deployed model and its
gate.

Pure functions of stored state and messages, kept apart from the commands so they are
tested without servers; plain text (no colours, no box drawing) so output pipes
cleanly into grep, awk and CI logs. Free text passes through `redact` before it is shown, and
what workers, senders or stored state wrote (a worker's stderr, a reason, a name) has its
control characters escaped (`\x1b`, `\n`): a table cell, a watch line and each line of a
view stay one line, and nothing shown can drive the terminal.

Pure functions of stored state and round records, for `describe job` (a table of rounds with
a sparkline of the main metric, or the same data as JSON) and `get jobs` (the deployed
version and its main metric). The main metric is the deploy condition's (without `_delta`:
the quantity it compares, `name[i]` kept), else the first metric the rounds report.
"""


import json
import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from service import wire
from service.core import kinds, paths, samples
from service.core.gate import DELTA_SUFFIX, Metrics
from service.core.rounds import RoundRecord
from service.core.state import DatasetState, JobState, ModelInfo, ModelRef, ResourceState
from service.history import HistoryRecord, last_change_ms
from service.keys import rkey_path
from service.logs import escape_controls, redact
from service.runtime.intake import GmLinkRecord
from service.wire import LearningJob, StoredResource, rfc3339_utc

COLUMN_GAP = "   "
_SECOND_MS = 1000
_MINUTE_S = 60
_HOUR_S = 60 * _MINUTE_S
_DAY_S = 24 * _HOUR_S


#: A cell of `get`: text, a number, or None for "not known" (`-` in a table, null in JSON).
Cell = str | int | None


def render(headers: Sequence[str], rows: Sequence[Sequence[Cell]]) -> str:
    """Rows under upper-case headers, columns left-aligned, like `kubectl get`.

    None shows as `-`; trailing spaces are stripped so the last column never pads the line.
    """
    cells = [["-" if cell is None else escape_controls(str(cell)) for cell in row] for row in rows]
    table = [[h.upper() for h in headers], *cells]
    for row in table:
        if len(row) != len(headers):
            raise ValueError(f"row {row!r} has {len(row)} cells, expected {len(headers)}")
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    lines = [
        COLUMN_GAP.join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in table
    ]
    return "\n".join(line.rstrip() for line in lines)


def shown(lines: Sequence[str]) -> str:
    """Lines as printed: secrets masked, control characters escaped in each (so one line of
    a view stays one line)."""
    return "\n".join(escape_controls(redact(line)) for line in lines)


def format_age(age_ms: int) -> str:
    """A duration as kubectl shows ages: `45s`, `3m12s`, `5h4m`, `2d3h` (negative: `0s`)."""
    seconds = max(age_ms, 0) // _SECOND_MS
    if seconds < _MINUTE_S:
        return f"{seconds}s"
    if seconds < _HOUR_S:
        minutes, rest = divmod(seconds, _MINUTE_S)
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if seconds < _DAY_S:
        hours, rest = divmod(seconds, _HOUR_S)
        minutes = rest // _MINUTE_S
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, rest = divmod(seconds, _DAY_S)
    hours = rest // _HOUR_S
    return f"{days}d{hours}h" if hours else f"{days}d"


def format_time_ms(at_ms: int) -> str:
    """An epoch-milliseconds instant as RFC 3339 UTC with milliseconds."""
    return rfc3339_utc(datetime.fromtimestamp(at_ms / _SECOND_MS, UTC))


# ------------------------------------------------------------ views of stored state


def job_state_word(state: JobState) -> str:
    """STATE of `get jobs`: the step, unless the job cannot progress for want of its dataset
    or waits out the backoff after failed rounds."""
    if state.dataset is None:
        return "binding" if state.gm is not None else "no-dataset"
    if not state.dataset.present:
        return "paused"
    if state.step == "waiting" and state.retry_at_ms is not None:
        return "backoff"
    return state.step


def job_row(state: JobState, changed_ms: int | None, now_ms: int) -> dict[str, Cell]:
    """One `get jobs` row; keys are the column headers, counts are numbers."""
    return {
        "namespace": state.namespace,
        "name": state.name,
        "phase": state.phase,
        "state": job_state_word(state),
        "version": state.version,
        "pending": samples.count(state.pending),
        "eval-batches": len(state.eval_batches),
        "age": None if changed_ms is None else format_age(now_ms - changed_ms),
    }


def dataset_row(state: DatasetState, changed_ms: int | None, now_ms: int) -> dict[str, Cell]:
    """One `get datasets` row; keys are the column headers, the sample count a number
    (None until the dataset was first read)."""
    return {
        "namespace": state.namespace,
        "name": state.name,
        "format": state.format,
        "samples": None if state.num_samples < 0 else state.num_samples,
        "status": dataset_status(state),
        "url": redact(state.url),
        "age": None if changed_ms is None else format_age(now_ms - changed_ms),
    }


def dataset_status(state: DatasetState) -> str | None:
    """STATUS of `get datasets`: `unreadable` while its source cannot be read, `ok` once it
    was read, None before the first read."""
    if state.unreadable is not None:
        return "unreadable"
    return None if state.num_samples < 0 else "ok"


def _field(label: str, value: object) -> str:
    return f"{label + ':':<16}{value}"


def _clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def trigger_summary(state: JobState) -> str:
    """The trigger as the controller interprets it (not as written)."""
    trigger = state.spec.trigger
    parts = [f"check every {trigger.check_period_seconds}s"]
    window = trigger.window
    if window is not None:
        parts.append(f"timer {_clock(window[0])}-{_clock(window[1])}")
    condition = trigger.condition
    if condition is not None and trigger.has_condition:
        threshold = condition.threshold_value or 0.0
        parts.append(f"when {condition.metric} {condition.operator} {threshold:g}")
    else:
        parts.append("when any train sample is pending")
    return "; ".join(parts)


def _dataset_summary(state: JobState) -> str:
    share = f"train share {state.spec.train_prob:g}"
    if state.dataset is None:
        return f"{state.spec.dataset} ({share}); not known yet: the job waits for it"
    suffix = "" if state.dataset.present else "; deleted: the job is paused until it returns"
    return (f"{state.spec.dataset} ({share}), {state.dataset.url} "
            f"({state.dataset.format}){suffix}")  # fmt: skip


def _models(models: Sequence[ModelRef]) -> str:
    return ", ".join(f"{m.format or '?'} {m.url}" for m in models) or "-"


def _workers(job: LearningJob | None) -> str:
    """Worker images per template: enough to recognise a job without printing the pods."""
    if job is None:
        return "-"
    parts = []
    templates = (("train", job.spec.train_spec.template), ("eval", job.spec.eval_spec.template),
                 ("deploy", job.spec.deploy_spec.template))  # fmt: skip
    for kind, template in templates:
        pod = template.get("spec")
        containers = pod.get("containers") if isinstance(pod, dict) else None
        images = [c.get("image") for c in containers or [] if isinstance(c, dict)]
        named = [i for i in images if isinstance(i, str)]
        if named:
            parts.append(f"{kind} {', '.join(named)}")
    return "; ".join(parts) or "-"


def _credential(job: LearningJob | None) -> str:
    if job is None:
        return "-"
    parts = []
    if wire.CREDENTIAL_ANNOTATION in job.metadata.annotations:
        parts.append(f"annotation {wire.CREDENTIAL_ANNOTATION} (hidden)")
    if job.spec.credential_name:
        parts.append(f"credentialName {job.spec.credential_name}")
    return ", ".join(parts) or "none (default AWS chain for s3://)"


def round_files(state: JobState, records: Sequence[HistoryRecord]) -> list[tuple[str, str]]:
    """The files of the latest round, for the phases it reached (from state and history)."""
    if state.version < 1 or state.dataset is None:
        return []
    version, out, fmt = state.version, state.spec.output_dir, state.dataset.format
    reached = {r.phase for r in records if r.version == version} | {state.phase}
    files = []
    for phase in ("train", "eval"):
        if phase not in reached:
            continue
        files.append((f"{phase} data", paths.round_data_file(out, phase, version, fmt)))
        if paths.needs_index(state.dataset.url, fmt):
            files.append((f"{phase} index", paths.round_index_file(out, phase, version)))
        files.append((f"{phase} output", paths.round_output_dir(out, phase, version)))
    if "deploy" in reached:
        files.append(("deployed model", deploy_target(state)))
    return files


def deploy_target(state: JobState) -> str:
    """Where a deployed model goes, as workers see it: the outputDir's deploy file, or an
    incremental-learning job's deploy Model's url (its name until an eval round looked it
    up)."""
    spec = state.spec.incremental
    if spec is not None and (state.models is None or state.models.deploy is None):
        return f"the url of Model {spec.deploy_model} (an eval round looks it up)"
    target, _ = kinds.deploy_target(state, "", "")
    return target


def describe_job(
    state: JobState,
    job: LearningJob | None,
    records: Sequence[HistoryRecord],
    now_ms: int,
) -> list[str]:
    """`describe job`: spec summary, progress, models (an incremental-learning job's Models,
    hot update and deploy target too), last error and the round's files."""
    changed = last_change_ms(records)
    since = "" if changed is None else f" (since {format_age(now_ms - changed)} ago)"
    lines = [
        _field("Name", state.name),
        _field("Namespace", state.namespace),
        _field("Phase", f"{state.phase}, {job_state_word(state)}{since}"),
        _field("Version", state.version),
        _field("Dataset", _dataset_summary(state)),
        _field("Output dir", state.spec.output_dir),
        _field("Trigger", trigger_summary(state)),
        _field("Samples", f"taken {state.taken}, pending train {samples.count(state.pending)}, "
               f"in round {samples.count(state.round)}, eval batches {len(state.eval_batches)} "
               f"({samples.count(state.eval_batches)} samples)"),
        _field("Train models", _models(state.train_models)),
        _field("Eval models", _models(state.eval_models)),
        *incremental_lines(state),
        _field("Workers", _workers(job)),
        _field("Credential", _credential(job)),
        _field("Last error", state.last_error or "-"),
        _field("Failures", _failures(state, now_ms)),
    ]  # fmt: skip
    if state.gm is not None:
        lines.append(_field("Sedna GM", gm_summary(state)))
    files = round_files(state, records)
    if files:
        lines.append(f"Files of round {state.version}:")
        width = max(len(label) for label, _ in files) + 2
        lines += [f"  {label:<{width}}{path}" for label, path in files]
    return lines


def incremental_lines(state: JobState) -> list[str]:
    """What an incremental-learning job adds to `describe`: its Models (as the latest rounds
    that needed them looked them up), hot update and where a deployed model goes; nothing for a
    lifelong-learning job."""
    spec = state.spec.incremental
    if spec is None:
        return []
    models = state.models
    initial, compared, deploy = (
        (None, None, None) if models is None else (models.initial, models.compared, models.deploy)
    )
    evaluated = "evalSpec.initialEvalModel" if spec.eval_model else "the deploy Model"
    named = (
        ("Initial model", spec.initial_model, initial, "round 1 trains from it"),
        ("Eval model", spec.compared_model, compared,
         f"{evaluated}: evals compare with it until a model is deployed"),
        ("Deploy model", spec.deploy_model, deploy, "deployed models are copied to its url"),
    )  # fmt: skip
    lines = [
        _field(label, f"{name}: {_model_info(info)} ({role})") for label, name, info, role in named
    ]
    hot = "off"
    if spec.hot_update_config is not None:
        hot = (
            f"config {spec.hot_update_config} (rewritten to name each deployed model, copied "
            "beside it)"
        )
    lines += [_field("Hot update", hot), _field("Deploy target", deploy_target(state))]
    return lines


def _model_info(info: ModelInfo | None) -> str:
    """A Model's url, format and devices (None: not looked up yet)."""
    if info is None:
        return "not looked up yet (a round that needs it will)"
    devices = f", devices {', '.join(info.devices)}" if info.devices else ""
    credential = ", names a credential" if info.credential else ""
    return f"{info.format or '?'} {info.url}{devices}{credential}"


def gm_summary(state: JobState) -> str:
    """What Sedna's GM shows of a job it manages, and what the job waits for from it."""
    gm = state.gm
    assert gm is not None
    shown = f"{gm.stage.capitalize()}/{gm.type.capitalize()}" if gm.type else "no condition yet"
    text = f"shows {shown} ({gm.count} conditions)"
    if state.dataset is None:
        return text + "; not the dataset node here: binds and forwards its workers' reports"
    if state.step == "staged":
        text += f"; {state.phase} waits for the GM to show {state.phase.capitalize()}/Waiting"
    if state.gm_rollback is not None:
        text += (
            f"; the rollback to version {state.gm_rollback.to_version} is copied, its deploy "
            "ready waits for the GM to show Train/Waiting"
        )
    if state.gm_sent is not None:
        sent = state.gm_sent
        text += f"; sent round {sent.version}'s {sent.stage} status, not yet seen by the GM"
    return text


def _failures(state: JobState, now_ms: int) -> str:
    """Failed rounds in a row and when the next round may start (the backoff)."""
    if not state.consecutive_failures:
        return "none in a row"
    text = f"{state.consecutive_failures} in a row"
    if state.retry_at_ms is not None:
        wait = state.retry_at_ms - now_ms
        when = f"in {format_age(wait)}" if wait > 0 else "now"
        text += f"; next try {format_time_ms(state.retry_at_ms)} ({when})"
    return text


def describe_dataset(
    state: DatasetState, users: Sequence[str], records: Sequence[HistoryRecord], now_ms: int
) -> list[str]:
    """`describe dataset`: source, whether it can be read, sample count, the jobs using it."""
    changed = last_change_ms(records)
    since = "-" if changed is None else f"{format_age(now_ms - changed)} ago"
    jobs = ", ".join(rkey_path(u) for u in users) or "-"
    return [
        _field("Name", state.name),
        _field("Namespace", state.namespace),
        _field("URL", state.url),
        _field("Format", state.format),
        _field("Unreadable", state.unreadable or "-"),
        _field("Samples", "not read yet" if state.num_samples < 0 else state.num_samples),
        _field("Last change", since),
        _field("Used by", jobs),
    ]


def resource_row(state: ResourceState, changed_ms: int | None, now_ms: int) -> dict[str, Cell]:
    """One `get models` row (what the model holds), or one `get ji`/`get fl` row (how many
    of its workers' reports were forwarded, and the latest)."""
    age = None if changed_ms is None else format_age(now_ms - changed_ms)
    if state.model is not None:
        return {
            "namespace": state.namespace,
            "name": state.name,
            "format": state.model.format or None,
            "url": redact(state.model.url),
            "devices": ",".join(state.model.devices) or None,
            "age": age,
        }
    last = None
    if state.last_report:
        last = f"{state.last_report} {format_age(now_ms - state.last_report_ms)} ago"
    return {
        "namespace": state.namespace,
        "name": state.name,
        "reports": state.reports,
        "last report": last,
        "age": age,
    }


def describe_resource(
    state: ResourceState,
    resource: StoredResource | None,
    records: Sequence[HistoryRecord],
    now_ms: int,
) -> list[str]:
    """`describe model|ji|fl`: what the controller keeps of the resource (a Model's url,
    format, devices and credential; the workers, models and nodes of a service or job) and
    the reports it forwarded."""
    changed = last_change_ms(records)
    lines = [
        _field("Name", state.name),
        _field("Namespace", state.namespace),
        _field("Last change", "-" if changed is None else f"{format_age(now_ms - changed)} ago"),
    ]
    if state.model is not None:
        model = state.model
        credential = f"annotation {wire.CREDENTIAL_ANNOTATION} (hidden)"
        lines += [
            _field("URL", model.url),
            _field("Format", model.format or "-"),
            _field("Devices", ", ".join(model.devices) or "-"),
            _field("Credential", credential if model.credential else "none"),
        ]
        return lines
    lines += _stored_spec_lines(resource)
    last = "-"
    if state.last_report:
        last = f"{state.last_report}, {format_age(now_ms - state.last_report_ms)} ago"
    lines += [_field("Reports", f"{state.reports} forwarded upstream"), _field("Last report", last)]
    return lines


def _stored_spec_lines(resource: StoredResource | None) -> list[str]:
    """The workers of a joint-inference service or a federated-learning job: their models,
    datasets, nodes and images."""
    if isinstance(resource, wire.JointInferenceService):
        edge, cloud = resource.spec.edge_worker, resource.spec.cloud_worker
        mining = edge.hard_example_mining.name if edge.hard_example_mining else ""
        return [
            _field("Edge worker", _worker_line(edge.model.name, edge.template)),
            _field("Hard examples", mining or "-"),
            _field("Cloud worker", _worker_line(cloud.model.name, cloud.template)),
        ]
    if isinstance(resource, wire.FederatedLearningJob):
        spec = resource.spec
        lines = [
            _field("Aggregation", _worker_line(spec.aggregation_worker.model.name,
                                               spec.aggregation_worker.template)),
        ]  # fmt: skip
        pretrained = spec.pretrained_model.name if spec.pretrained_model else ""
        lines.append(_field("Pretrained", pretrained or "-"))
        lines += [
            _field("Training", f"dataset {w.dataset.name}; {_pod_line(w.template)}")
            for w in spec.training_workers
        ]
        return lines
    return []


def _worker_line(model: str, template: dict[str, Any]) -> str:
    return f"model {model}; {_pod_line(template)}"


def _pod_line(template: dict[str, Any]) -> str:
    """A pod template's node and images, as `node N; image I`."""
    pod = template.get("spec")
    pod = pod if isinstance(pod, dict) else {}
    node = pod.get("nodeName")
    images = [c.get("image") for c in pod.get("containers") or [] if isinstance(c, dict)]
    named = ", ".join(i for i in images if isinstance(i, str)) or "-"
    return f"node {node if isinstance(node, str) and node else '-'}; image {named}"


def history_lines(records: Sequence[HistoryRecord], now_ms: int) -> list[str]:
    """Transition history, oldest first: when, event, outcome, resulting view, and reasons."""
    if not records:
        return ["History:       -"]
    lines = [f"History (last {len(records)} events, oldest first):"]
    for record in records:
        at = record.at_ms
        view = ""
        if record.phase is not None:
            view = f"{record.phase}/{record.step or '?'} v{record.version or 0}"
        elif record.samples is not None:
            view = f"samples={record.samples}"
        lines.append(
            f"  {format_time_ms(at)}  {format_age(now_ms - at) + ' ago':>9}  "
            f"{record.event:<15} {record.outcome:<8} {view}".rstrip()
        )
        lines += [f"      {note}" for note in record.notes]
    return lines


def gm_link_line(record: GmLinkRecord | None, now_ms: int) -> str:
    """`GM link: ...` as its holder last recorded it (the record lapses with a dead holder)."""
    if record is None:
        return _field("GM link", "none (no GM configured, or no replica holds the link now)")
    link = record.link
    since = format_age(now_ms - int(link.since * 1000))
    parts = [f"{link.status} for {since}, held by {record.replica}, {record.address}"]
    parts.append(f"frames in {link.frames_in} out {link.frames_out}, reconnects {link.reconnects}")
    if link.last_error:
        parts.append(f"last error: {link.last_error}")
    return _field("GM link", "; ".join(parts))


def watch_line(topic: str, payload: bytes, received_at_s: float, output: str = "text") -> str:
    """One line for one upstream or errors message (secrets masked)."""
    try:
        body: Any = json.loads(payload)
    except ValueError:
        body = None
    if output == "json":  # JSON escapes every control character itself
        return redact(json.dumps({"topic": topic, "receivedAt": received_at_s, "payload": body}))
    when = format_time_ms(int(received_at_s * 1000))
    if not isinstance(body, dict):
        return shown([f"{when}  {topic}: unreadable payload ({len(payload)} bytes)"])
    if topic.endswith("/errors"):
        return shown([f"{when}  rejected on {body.get('topic', '?')}: {body.get('reason', '?')}"])
    header = _mapping(body.get("header"))
    content = _mapping(body.get("content"))
    who = f"{header.get('resourceKind', '?')} {header.get('namespace', '?')}/" \
          f"{header.get('resourceName', '?')}"  # fmt: skip
    return shown([f"{when}  {who}  {_status_text(content)}"])


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _status_text(content: dict[str, Any]) -> str:
    if "numberOfSamples" in content:
        return f"numberOfSamples={content['numberOfSamples']}"
    parts = [f"{content.get('phase', '?')}/{content.get('status', '?')}"]
    if content.get("reason"):
        parts.append(f"reason: {content['reason']}")
    job_input = content.get("input")
    if isinstance(job_input, dict):
        parts += [f"{k}={job_input[k]}" for k in ("dataURL", "outputDir") if job_input.get(k)]
        models = job_input.get("models")
        if isinstance(models, list) and models:
            parts.append(f"models={len(models)}")
    output = content.get("output")
    if isinstance(output, dict) and isinstance(output.get("models"), list):
        parts.append(f"reported models={len(output['models'])}")
    return "  ".join(parts)


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
    metric and every round as stored; for an incremental-learning job also the Models it
    names (`incremental`), as resolved (`models`, null before), and its deploy target."""
    metric = main_metric(state, records)
    builtins = msgspec.to_builtins
    incremental: dict[str, Any] = {}
    if state.spec.incremental is not None:
        incremental = {
            "incremental": builtins(state.spec.incremental),
            "models": builtins(state.models) if state.models is not None else None,
            "deployTarget": deploy_target(state),
        }
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
        **incremental,
    }
