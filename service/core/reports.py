"""What a worker's report means to its job: whether the job will hear it, and which of its
results are models the lifecycle can go on with.

A report is bound to its job, its namespace, its round and its stage; one that is not is
refused with the reason, changes nothing and is not forwarded upstream:

- **By name.** A report for job `J` must come from a worker named `J-<kind>-<suffix>` (the
  suffix one DNS label without '-': `J-train-3`, `J-eval-x7k2p`): how `lifelong worker`
  names its workers (`{job}-{kind}-{version}`) and how Sedna's GM names a job's pods.
  Deploy and inference reports come from the inference worker, named `J-inference-<suffix>`
  or `J-deploy-<suffix>`. Sedna's worker library reports over HTTP under its `WORKER_NAME`,
  which the GM sets to `train-worker-<suffix>`, `eval-worker-<suffix>` or
  `inferworker-<suffix>`, names that say nothing of the job; those are accepted over HTTP
  only, for reports of their kind.
- **By namespace.** The report's namespace names the job; the shell refuses a report whose
  topic carries another namespace (`{prefix}/{node}/workers/{namespace}/{worker}/info`,
  which the broker's ACL grants to that namespace's workers only).
- **By round.** A train or eval worker whose suffix is all digits carries its round: the
  `{job}-{kind}-{version}` name `lifelong worker` derives from the round's `ready`. Its
  reports (`running`, `failed`, `completed` alike) must carry the job's current version.
  The models of a `completed` train or eval report must lie where the round's `ready`
  message pointed the worker, for the job's current version v: a train report's under
  `{outputDir}/train/{v}/`; an eval report's under `{outputDir}/eval/{v}/`, or under
  `{outputDir}/train/{v}/` (the models it was given to evaluate, which a worker may report
  back with their scores); after its first model (the one to deploy), also the deployed
  model, which a deploy gate's eval scores too (its own round's file, as the ready message
  names it, or `{outputDir}/deploy/index.pkl`).
- **By stage.** A train or eval report is heard only while the job runs that stage (a
  `ready` went out and no report has ended it): a report of a stage that is over, or not
  begun, is refused. This is all that binds Sedna's library workers, whose names carry no
  round: one with the job's namespace and name, reporting while the stage runs, is heard.
"""


import re
from collections.abc import Iterable
from typing import Any

import msgspec

from service.core import kinds, paths
from service.core.effects import Reject
from service.core.events import OwnerReported, WorkerReported
from service.core.state import JobState, ModelRef, State
from service.logs import redact
from service.wire import MAX_URL_CHARS, STORAGE_URL_PATTERN, Model

_STORAGE_URL = re.compile(STORAGE_URL_PATTERN)
#: How many of a report's models a job keeps (TensorFlow workers report two, a deploy gate's
#: eval two): the job's state is rewritten on every event, and the next ready carries them.
MAX_MODELS_KEPT = 16
#: The most device SoC versions kept of a model (Sedna's models name one or a few).
MAX_DEVICES = 8
#: The longest model format kept (formats are short names: pkl, pb, ckpt, onnx...).
MAX_FORMAT_CHARS = 64
#: How much of a failed worker's stderr (its tail) and stated reason a job keeps.
STDERR_TAIL_CHARS = 400
REASON_CHARS = 200
#: The last part of a worker's name: Sedna's five random characters, our runner's version.
_SUFFIX = re.compile(r"[a-z0-9]+")
#: The kind levels a worker of each report kind may carry in its name.
_NAME_KINDS = {
    "train": ("train",),
    "eval": ("eval",),
    "deploy": ("inference", "deploy"),
    "inference": ("inference", "deploy"),
}
#: Sedna's GM sets WORKER_NAME to these plus a random suffix; its library reports over HTTP.
_SEDNA_LIBRARY_NAMES = {
    "train": "train-worker-",
    "eval": "eval-worker-",
    "deploy": "inferworker-",
    "inference": "inferworker-",
}


def refusal(state: State | None, report: WorkerReported, volume_prefix: str = "") -> Reject | None:
    """Why a job will not hear this report at all (None: it will).

    The worker endpoint asks this before answering, the transition before applying. The
    rules (the job exists, the worker is named for it, the report is of the current round
    and of the stage the job runs, its models lie in the round's output dir) are the
    module's docstring.
    """
    if not isinstance(state, JobState):
        return unknown_owner(report, "job")
    if report.owner != state.spec.kind:
        reason = (
            f"unknown {report.owner} {report.namespace}/{report.name}: the job of that name "
            f"is of kind {state.spec.kind}"
        )
        return Reject(code="unknown_job", reason=reason)
    if not worker_named_for(report):
        levels = " or ".join(f"'{report.name}-{k}-<suffix>'" for k in _NAME_KINDS[report.kind])
        return foreign_worker(
            report, "job", f"a {report.kind} worker of that job is named {levels}"
        )
    if report.kind not in ("train", "eval"):
        return None  # the inference worker's reports: forwarded, whatever the stage
    return (
        _other_round(state, report)
        or _stage_not_running(state, report)
        or _outside_round(state, report, volume_prefix)
    )


def unknown_owner(report: WorkerReported | OwnerReported, noun: str) -> Reject:
    """The refusal of a report for an owner (a `noun`) that does not exist."""
    return Reject(code="unknown_job", reason=f"unknown {noun} {report.namespace}/{report.name}")


def foreign_worker(report: WorkerReported | OwnerReported, noun: str, named: str) -> Reject:
    """The refusal of a report from a worker not named for its owner (a `noun`); `named`
    says how the owner's workers are named."""
    return Reject(
        code="foreign_worker",
        reason=(
            f"worker {report.worker!r} may not report for {noun} {report.namespace}/"
            f"{report.name}: {named}"
        ),
    )


def worker_named_for(report: WorkerReported) -> bool:
    """Whether the worker's name ties it to the report's job and kind."""
    worker = report.worker
    for level in _NAME_KINDS[report.kind]:
        prefix = f"{report.name}-{level}-"
        if worker.startswith(prefix) and _SUFFIX.fullmatch(worker[len(prefix) :]):
            return True
    library = _SEDNA_LIBRARY_NAMES[report.kind]
    return (
        report.channel == "http"
        and worker.startswith(library)
        and _SUFFIX.fullmatch(worker[len(library) :]) is not None
    )


def round_of(report: WorkerReported) -> int | None:
    """The round a worker's name carries: the digits after `{job}-{kind}-` (None: its name
    carries none)."""
    suffix = report.worker.removeprefix(f"{report.name}-{report.kind}-")
    if suffix == report.worker or not suffix.isascii() or not suffix.isdigit():
        return None
    return int(suffix)


def running_stage(job: JobState) -> tuple[str, int] | None:
    """The stage and round whose workers the job hears now: its own running stage; where
    Sedna's GM manages the job and this controller is not its dataset node (it keeps no
    rounds, only binds the reports of the workers on its node), the stage and round of the
    GM's latest `Ready` condition (its outputDir `{outputDir}/{stage}/{v}`) while the GM's
    latest condition is still of that stage. None: no stage runs."""
    dataset_here = job.dataset is not None and job.dataset.present
    if job.gm is None or dataset_here:
        return (job.phase, job.version) if job.step == "running" else None
    parent, _, last = job.gm.round_dir.rstrip("/").rpartition("/")
    stage = parent.rpartition("/")[2]
    if stage not in ("train", "eval") or not last.isdigit() or job.gm.stage != stage:
        return None
    return stage, int(last)


def _other_round(job: JobState, report: WorkerReported) -> Reject | None:
    """Refuses a report whose worker's name carries another round than the one running."""
    version = round_of(report)
    running = running_stage(job)
    current = running[1] if running is not None else job.version
    if version is None or version == current:
        return None
    return Reject(
        code="outside_round",
        reason=(
            f"{report.kind} worker {report.worker} reported {report.status} for round "
            f"{version}, but job {job.namespace}/{job.name} is at round {current}: a "
            "replayed report of another round"
        ),
    )


def _stage_not_running(job: JobState, report: WorkerReported) -> Reject | None:
    """Refuses a train/eval report while the job does not run that stage."""
    running = running_stage(job)
    if running is not None and running[0] == report.kind:
        return None
    return Reject(
        code="not_running",
        reason=(
            f"{report.kind} worker {report.worker} reported {report.status}, but job "
            f"{job.namespace}/{job.name} is not running its {report.kind} stage (it is "
            f"{job.phase}/{job.step} at round {job.version}): a report of a stage that is "
            "over or not begun"
        ),
    )


def _outside_round(job: JobState, report: WorkerReported, volume_prefix: str) -> Reject | None:
    """Refuses a completed train/eval report naming a model outside the current round."""
    if report.status != "completed":
        return None
    out = paths.trim_prefix(volume_prefix, job.spec.output_dir)
    running = running_stage(job)
    version = running[1] if running is not None else job.version
    round_dir = paths.round_output_dir(out, report.kind, version)
    trained = paths.round_output_dir(out, "train", version)
    given = {paths.deploy_model(out)} | {
        paths.trim_prefix(volume_prefix, deployment.model.url)
        for deployment in (job.deployed, job.rollback, kinds.compared(job))
        if deployment is not None
    }
    for i, model in enumerate(usable_models(report.results)):
        url = paths.trim_prefix(volume_prefix, model.url)
        if paths.is_beneath(url, round_dir):
            continue
        if report.kind == "eval" and paths.is_beneath(url, trained):
            continue
        if report.kind == "eval" and i > 0 and url in given:
            continue  # the deployed model a gate compares with, never the one deployed now
        return Reject(
            code="outside_round",
            reason=(
                f"{report.kind} worker {report.worker} reported model {url!r}, which is not "
                f"under {round_dir}/, the output dir of round {version} of job "
                f"{job.namespace}/{job.name}: a replayed report of another round, or a file "
                "the job does not own"
            ),
        )
    return None


def usable_models(results: Iterable[dict[str, Any]]) -> tuple[Model, ...]:
    """The results that describe a model the lifecycle can use, in order.

    A usable model has a string `format` (may be empty or absent; at most
    `MAX_FORMAT_CHARS`) and a `url` that is an s3:// URL or an absolute local path without
    `..`, of at most `MAX_URL_CHARS`: a worker is not trusted to point the deploy copy at
    arbitrary files, nor to make its job's state large.
    """
    return tuple(model for model in map(_model_of, results) if model is not None)


def model_refs(report: WorkerReported) -> tuple[ModelRef, ...]:
    """The usable models of a report, as the job keeps them: the first `MAX_MODELS_KEPT`."""
    models = usable_models(report.results)[:MAX_MODELS_KEPT]
    return tuple(ModelRef(format=m.format, url=m.url, devices=m.devices) for m in models)


def models_left_out(report: WorkerReported) -> str | None:
    """What a job says when it keeps only some of a report's usable models."""
    count = len(usable_models(report.results))
    if count <= MAX_MODELS_KEPT:
        return None
    return f"kept the first {MAX_MODELS_KEPT} of the {count} models {report.worker} reported"


def no_usable_model(report: WorkerReported) -> str:
    """The reason a `completed` report without a usable model fails its round."""
    return (
        f"{report.kind} worker {report.worker} completed without a usable model "
        f"({len(report.results)} results; each model needs a string url)"
    )


def failure(report: WorkerReported) -> str:
    """Why a worker failed, as its job keeps it: the exit code, reason and stderr tail its
    report carried in `ownerInfo` (what `lifelong worker` sends: `exitCode`, `stderr`,
    `reason`; Sedna's own worker library sends none), bounded and with secrets masked.
    Only those three fields are read out of the ownerInfo text."""
    try:
        info = msgspec.json.decode(report.owner_info, type=_FailureInfo)
    except (msgspec.DecodeError, msgspec.ValidationError):
        info = _FailureInfo()
    details = []
    code = info.exit_code
    if isinstance(code, int) and not isinstance(code, bool):
        details.append(f"exit code {code}")
    reason = info.reason
    if isinstance(reason, str) and reason.strip():
        details.append(_one_line(reason)[:REASON_CHARS])
    stderr = info.stderr
    if isinstance(stderr, str) and stderr.strip():
        details.append(f"stderr: {_one_line(stderr)[-STDERR_TAIL_CHARS:]}")
    text = f"{report.kind} worker {report.worker} failed"
    if details:
        text += f" ({'; '.join(details)})"
    return text


class _FailureInfo(msgspec.Struct, frozen=True):
    """What `failure` reads of a report's ownerInfo (other fields are skipped unparsed)."""

    exit_code: object = msgspec.field(default=None, name="exitCode")
    reason: object = None
    stderr: object = None


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
    if len(url) > MAX_URL_CHARS or len(model_format) > MAX_FORMAT_CHARS:
        return None
    if not _STORAGE_URL.search(url):
        return None
    devices = result.get("devices")
    if not isinstance(devices, list) or not all(
        isinstance(d, str) and 0 < len(d) <= MAX_FORMAT_CHARS for d in devices
    ):
        devices = []
    return Model(
        format=model_format, url=url, metrics=metrics if isinstance(metrics, dict) else None,
        devices=devices[:MAX_DEVICES],
    )  # fmt: skip
