"""The resources the cloud sends down: Sedna's Dataset, LifelongLearningJob, Model,
JointInferenceService and FederatedLearningJob, their metadata and specs, and the envelope
that carries them.

`JobSpec` is what the lifecycle reads of a LifelongLearningJob, in these same types (the
core keeps it in the job's state): its dataset, its trigger, its outputDir and its deploy
gate, which `job_gate` takes from `deploySpec.trigger` or the deploy-trigger annotation.

Unknown fields are ignored (a newer Sedna may add some); `service.wire.downstream` names them
for the CLI.
"""

import json
import re
from typing import Any, Literal

import msgspec
import yaml

from service.errors import InvalidMessage
from service.wire.base import Wire
from service.wire.fields import (
    ClockTime,
    Count,
    DatasetFormat,
    DeviceSoc,
    DnsLabel,
    DnsSubdomain,
    MetricName,
    ModelFormat,
    NumericString,
    Operator,
    OptionalName,
    PeriodSeconds,
    Probability,
    ShortText,
    StorageUrl,
    invalid,
)

__all__ = [
    "CREDENTIAL_ANNOTATION",
    "DEPLOY_TRIGGER_ANNOTATION",
    "HOT_UPDATE_ANNOTATION",
    "HOT_UPDATE_CONTAINER_DIR",
    "MAX_TRIGGER_ANNOTATION_BYTES",
    "MINUTES_PER_DAY",
    "SEDNA_API_VERSION",
    "Condition",
    "Dataset",
    "DatasetSpec",
    "DeploySpec",
    "DeployTrigger",
    "Envelope",
    "EvalSpec",
    "FederatedLearningJob",
    "FederatedLearningJobSpec",
    "Header",
    "IncrementalDeploySpec",
    "IncrementalEvalSpec",
    "IncrementalLearningJob",
    "IncrementalLearningJobSpec",
    "IncrementalSpec",
    "JobCondition",
    "JobDatasetRef",
    "JobKind",
    "JobResourceStatus",
    "JobSpec",
    "JointInferenceService",
    "JointInferenceServiceSpec",
    "LearningJob",
    "LifelongLearningJob",
    "LifelongLearningJobSpec",
    "ModelResource",
    "ModelSpec",
    "ObjectMeta",
    "Timer",
    "TrainSpec",
    "Trigger",
    "gate_spec",
    "hot_update_config",
    "job_gate",
    "job_spec",
    "parse_hhmm",
]

CREDENTIAL_ANNOTATION = "sedna.io/credential"
#: Where the inference worker of an incremental-learning job with hot update reads which
#: model to load: a host path Sedna's GM sets on the job (`model_config.json`, under
#: `HOT_UPDATE_ROOT/<namespace>/incrementallearningjob/<name>/`), mounted into the worker's
#: container at `HOT_UPDATE_CONTAINER_DIR`.
HOT_UPDATE_ANNOTATION = "sedna.io/model-hot-update-config"
HOT_UPDATE_ROOT = "/var/lib/sedna/model-hot-update"
HOT_UPDATE_CONTAINER_DIR = "/model-hot-update"
#: The deploy gate of a job, as an annotation (`{"condition": {operator, threshold, metric}}`,
#: JSON or YAML): Sedna's CRD and its GM drop `deploySpec.trigger`, annotations reach the node.
DEPLOY_TRIGGER_ANNOTATION = "lifelong.sedna.io/deploy-trigger"
SEDNA_API_VERSION = "sedna.io/v1alpha1"
MINUTES_PER_DAY = 24 * 60
_HHMM_RE = re.compile(r"^(?P<h>\d{2}):(?P<m>\d{2})$")


class Header(Wire, frozen=True, kw_only=True):
    """Envelope header, as KubeEdge's Sedna messages carry it; `id` is set upstream only."""

    namespace: DnsLabel
    resource_kind: str
    resource_name: DnsSubdomain
    operation: str
    id: str | None = None


class Envelope(Wire, frozen=True, kw_only=True):
    """A downstream envelope; `content` is the resource, as an object or base64 of its JSON."""

    header: Header
    content: Any = None


class ObjectMeta(Wire, frozen=True, kw_only=True):
    """Kubernetes object metadata; unknown fields are ignored (Sedna may add some)."""

    name: DnsSubdomain
    namespace: DnsLabel = "default"
    annotations: dict[str, str] = {}
    labels: dict[str, str] = {}
    uid: str | None = None
    resource_version: str | None = None
    generation: Count | None = None

    def __repr__(self) -> str:
        """Mask the credential annotation: reprs end up in logs, secrets must not."""
        if CREDENTIAL_ANNOTATION not in self.annotations:
            return msgspec.Struct.__repr__(self)
        masked = {**self.annotations, CREDENTIAL_ANNOTATION: "<redacted>"}
        return msgspec.Struct.__repr__(msgspec.structs.replace(self, annotations=masked))


class SednaObject(Wire, frozen=True, kw_only=True):
    """What every Sedna resource carries besides its `kind` and its `spec`: its apiVersion
    (defaulted: informer objects often omit it) and its metadata."""

    api_version: str = SEDNA_API_VERSION
    metadata: ObjectMeta


class DatasetSpec(Wire, frozen=True, kw_only=True):
    """Where a dataset's samples live and how they are laid out."""

    url: StorageUrl
    format: DatasetFormat
    node_name: DnsSubdomain
    credential_name: DnsSubdomain | None = None

    @property
    def normalized_format(self) -> Literal["txt", "csv"]:
        """The format in lower case; the wire keeps whatever case the user wrote."""
        return "csv" if self.format.lower() == "csv" else "txt"


class Dataset(SednaObject, frozen=True, kw_only=True):
    """Sedna's Dataset resource (apiVersion/kind default: informer objects often omit them)."""

    kind: str = "Dataset"
    spec: DatasetSpec


class Condition(Wire, frozen=True, kw_only=True):
    """A trigger's condition: `metric` (`name` or `name[i]`) compared with `threshold`; an
    empty operator means "no condition" (Sedna sends it unset)."""

    operator: Operator = ""
    threshold: NumericString | int | float | None = None
    metric: MetricName = ""

    @property
    def threshold_value(self) -> float | None:
        """The threshold as a float (validation guarantees it converts and is finite)."""
        return None if self.threshold is None else float(self.threshold)


class Timer(Wire, frozen=True, kw_only=True):
    """Daily window, controller-local time, inclusive; wraps past midnight if start > end."""

    start: ClockTime
    end: ClockTime

    @property
    def window(self) -> tuple[int, int]:
        """(start, end) in minutes of the day."""
        return parse_hhmm(self.start), parse_hhmm(self.end)


class Trigger(Wire, frozen=True, kw_only=True):
    """When a train round may start: checked every checkPeriodSeconds, it fires inside the
    timer's window (no timer: any time) when the condition holds (no condition, or an empty
    operator, as Sedna sends an unset one: as soon as a train sample is pending)."""

    check_period_seconds: PeriodSeconds = 60
    timer: Timer | None = None
    condition: Condition | None = None

    @property
    def window(self) -> tuple[int, int] | None:
        """The timer's (start, end) in minutes of the day; None: no timer."""
        return self.timer.window if self.timer is not None else None

    @property
    def has_condition(self) -> bool:
        return self.condition is not None and self.condition.operator != ""


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


class JobDatasetRef(Wire, frozen=True, kw_only=True):
    """The job's dataset and the share of each new batch that goes to training."""

    name: DnsSubdomain
    train_prob: Probability


class TrainSpec(Wire, frozen=True, kw_only=True):
    """Train worker template (opaque, passed on) and its trigger."""

    template: dict[str, Any] = {}
    trigger: Trigger = msgspec.field(default_factory=Trigger)


class EvalSpec(Wire, frozen=True, kw_only=True):
    """Eval worker template (opaque, passed on)."""

    template: dict[str, Any] = {}


class DeployTrigger(Wire, frozen=True, kw_only=True):
    """When an evaluated model is deployed, as Sedna's IncrementalLearningJob says it: the
    condition is evaluated on the eval report's metrics, `m` (the new model's) and `m_delta`
    (new minus deployed); unset or with an empty operator, every evaluated model is."""

    condition: Condition | None = None


class DeploySpec(Wire, frozen=True, kw_only=True):
    """Deploy worker template (opaque, passed on) and the deploy gate."""

    template: dict[str, Any] = {}
    trigger: DeployTrigger | None = None


class LifelongLearningJobSpec(Wire, frozen=True, kw_only=True):
    """What a lifelong-learning job trains on, how, and where its files go."""

    dataset: JobDatasetRef
    train_spec: TrainSpec
    eval_spec: EvalSpec
    deploy_spec: DeploySpec
    output_dir: StorageUrl
    credential_name: DnsSubdomain | None = None


class JobCondition(Wire, frozen=True, kw_only=True):
    """One of the conditions Sedna's GM keeps in a job's status: a stage (`Train`, `Eval`,
    `Deploy`) and where it is (`Waiting`, `Ready`, `Starting`, `Running`, `Completed`,
    `Failed`); `data` is the JSON text of the status that made it (`{input, output}`), when
    a local controller reported it, and then `message` says "reported by lc". Times and
    reason are not read."""

    type: str = ""
    stage: str = ""
    data: str = ""
    message: str = ""


class JobResourceStatus(Wire, frozen=True, kw_only=True):
    """The status Sedna's GM sends with a job: its conditions, oldest first (the stage
    machine the GM runs; the latest one says where the job is)."""

    conditions: list[JobCondition] = []


class LifelongLearningJob(SednaObject, frozen=True, kw_only=True):
    """Sedna's LifelongLearningJob resource; `status` as Sedna's GM sends it (absent from
    the cloud's MQTT envelopes)."""

    kind: str = "LifelongLearningJob"
    spec: LifelongLearningJobSpec
    status: JobResourceStatus | None = None


#: The job kinds, as the wire spells them (`resourceKind`, `ownerKind`).
JobKind = Literal["lifelonglearningjob", "incrementallearningjob"]


class IncrementalSpec(Wire, frozen=True, kw_only=True):
    """What an incremental-learning job adds to a job's spec: the Models it names (the
    initial model its first round trains from, the one its evals compare with before
    anything is deployed: `evalSpec.initialEvalModel`, else the deploy model; the deploy
    model, whose url a deployed model is copied to) and, with hot update, the host path of
    the inference worker's model config file (None: no hot update)."""

    initial_model: DnsSubdomain
    eval_model: DnsSubdomain | None = None
    deploy_model: DnsSubdomain
    hot_update_config: str | None = None

    @property
    def compared_model(self) -> str:
        """The Model an eval compares the new model with while nothing is deployed."""
        return self.eval_model or self.deploy_model


class JobSpec(Wire, frozen=True, kw_only=True):
    """What the lifecycle reads of a LifelongLearningJob or an IncrementalLearningJob, kept
    in the job's state: the wire's own values, without the worker templates (the resource
    is stored beside the state). `gate` is the deploy condition (`deploySpec.trigger
    .condition` or the annotation's, its threshold a number; None: every evaluated model is
    deployed); `incremental` is set for an incremental-learning job."""

    dataset: DnsSubdomain
    train_prob: Probability
    trigger: Trigger = msgspec.field(default_factory=Trigger)
    output_dir: StorageUrl
    gate: Condition | None = None
    incremental: IncrementalSpec | None = None

    @property
    def kind(self) -> JobKind:
        """The job's kind as the wire spells it (`resourceKind`, `ownerKind`)."""
        return "incrementallearningjob" if self.incremental else "lifelonglearningjob"


class ModelSpec(Wire, frozen=True, kw_only=True):
    """Where a model lives, its format, and the device SoC versions it runs on."""

    url: StorageUrl
    format: ModelFormat = ""
    devices: list[DeviceSoc] = msgspec.field(default_factory=list, name="device_soc_versions")
    credential_name: DnsSubdomain | None = None


class ModelResource(SednaObject, frozen=True, kw_only=True):
    """Sedna's Model resource: a model jobs name (an incremental-learning job's initial and
    deploy model, a service's worker models); its S3 credential comes in the annotation."""

    kind: str = "Model"
    spec: ModelSpec


class NameRef(Wire, frozen=True, kw_only=True):
    """Another resource named by a spec (a worker's Model, a training worker's Dataset)."""

    name: DnsSubdomain


class OptionalNameRef(Wire, frozen=True, kw_only=True):
    """An optional reference, which Sedna's GM sends as `{"name": ""}` when unset."""

    name: OptionalName = ""


class Parameter(Wire, frozen=True, kw_only=True):
    """One `key`/`value` parameter of a hard-example-mining algorithm."""

    key: ShortText
    value: ShortText = ""


class HardExampleMining(Wire, frozen=True, kw_only=True):
    """The edge worker's hard-example-mining algorithm and its parameters."""

    name: ShortText = ""
    parameters: list[Parameter] = []


class EdgeWorker(Wire, frozen=True, kw_only=True):
    """A joint-inference service's edge worker: its small model, hard-example mining, pod
    template and autoscaling (templates and `hpa` are kept, never read)."""

    model: NameRef
    hard_example_mining: HardExampleMining | None = None
    template: dict[str, Any] = {}
    hpa: dict[str, Any] | None = None


class CloudWorker(Wire, frozen=True, kw_only=True):
    """A joint-inference service's cloud worker: its big model and pod template."""

    model: NameRef
    template: dict[str, Any] = {}
    hpa: dict[str, Any] | None = None


class JointInferenceServiceSpec(Wire, frozen=True, kw_only=True):
    """The two workers of a joint-inference service."""

    edge_worker: EdgeWorker
    cloud_worker: CloudWorker


class JointInferenceService(SednaObject, frozen=True, kw_only=True):
    """Sedna's JointInferenceService: stored so its workers' reports are bound to it and
    forwarded upstream; the controller runs nothing of it."""

    kind: str = "JointInferenceService"
    spec: JointInferenceServiceSpec


class AggregationWorker(Wire, frozen=True, kw_only=True):
    """A federated-learning job's aggregation worker: the Model it trains, its template."""

    model: NameRef
    template: dict[str, Any] = {}


class TrainingWorker(Wire, frozen=True, kw_only=True):
    """One training worker of a federated-learning job: its Dataset and its template."""

    dataset: NameRef
    template: dict[str, Any] = {}


class S3Transmitter(Wire, frozen=True, kw_only=True):
    """Aggregation data exchanged through S3."""

    agg_data_path: StorageUrl = msgspec.field(name="aggDataPath")
    credential_name: DnsSubdomain | None = None


class Transmitter(Wire, frozen=True, kw_only=True):
    """How workers and the aggregator exchange data: S3, a websocket (`ws: {}`), or both."""

    s3: S3Transmitter | None = None
    ws: dict[str, Any] | None = None


class FederatedLearningJobSpec(Wire, frozen=True, kw_only=True):
    """A federated-learning job's aggregation worker, training workers, pretrained model
    and transmitter."""

    aggregation_worker: AggregationWorker
    training_workers: list[TrainingWorker]
    pretrained_model: OptionalNameRef | None = None
    transmitter: Transmitter | None = None


class FederatedLearningJob(SednaObject, frozen=True, kw_only=True):
    """Sedna's FederatedLearningJob: stored so its workers' reports are bound to it and
    forwarded upstream; the controller runs nothing of it."""

    kind: str = "FederatedLearningJob"
    spec: FederatedLearningJobSpec


class InitialEvalModel(Wire, frozen=True, kw_only=True):
    """The Model an incremental-learning job's evals compare with before anything is
    deployed (Sedna's `evalSpec.initialEvalModel`)."""

    name: DnsSubdomain


class IncrementalEvalSpec(Wire, frozen=True, kw_only=True):
    """An incremental-learning job's eval worker template (opaque) and the Model its evals
    compare with before anything is deployed (unset: the deploy model)."""

    template: dict[str, Any] = {}
    initial_model: InitialEvalModel | None = msgspec.field(default=None, name="initialEvalModel")


class DeployModel(Wire, frozen=True, kw_only=True):
    """The Model a deployed model is copied to; with hot update the inference worker polls
    its config file every `pollPeriodSeconds` and loads the model it names."""

    name: DnsSubdomain
    hot_update_enabled: bool = False
    poll_period_seconds: Count = 0


class IncrementalDeploySpec(Wire, frozen=True, kw_only=True):
    """An incremental-learning job's deploy: its Model, its deploy trigger (the gate), the
    inference worker's hard-example mining and template (both passed on)."""

    model: DeployModel
    trigger: DeployTrigger | None = None
    hard_example_mining: HardExampleMining | None = None
    template: dict[str, Any] = {}


class IncrementalLearningJobSpec(Wire, frozen=True, kw_only=True):
    """What an incremental-learning job trains on, from which model, how, where its files
    go, and where its deployed model goes."""

    dataset: JobDatasetRef
    initial_model: NameRef
    train_spec: TrainSpec
    eval_spec: IncrementalEvalSpec = msgspec.field(default_factory=IncrementalEvalSpec)
    deploy_spec: IncrementalDeploySpec
    output_dir: StorageUrl
    credential_name: DnsSubdomain | None = None


class IncrementalLearningJob(SednaObject, frozen=True, kw_only=True):
    """Sedna's IncrementalLearningJob resource; `status` as Sedna's GM sends it (absent from
    the cloud's MQTT envelopes)."""

    kind: str = "IncrementalLearningJob"
    spec: IncrementalLearningJobSpec
    status: JobResourceStatus | None = None


#: The job kinds the controller runs.
LearningJob = LifelongLearningJob | IncrementalLearningJob


# ================================================================= what the lifecycle reads
def job_spec(job: LearningJob) -> JobSpec:
    """The part of a job the lifecycle reads (its deploy gate: `job_gate`)."""
    spec = job.spec
    return JobSpec(
        dataset=spec.dataset.name,
        train_prob=spec.dataset.train_prob,
        trigger=spec.train_spec.trigger,
        output_dir=spec.output_dir,
        gate=job_gate(job),
        incremental=_incremental(job) if isinstance(job, IncrementalLearningJob) else None,
    )


_HOT_UPDATE_FIELD = f"$.metadata.annotations[{HOT_UPDATE_ANNOTATION!r}]"


def _incremental(job: IncrementalLearningJob) -> IncrementalSpec:
    spec = job.spec
    evaluated = spec.eval_spec.initial_model
    return IncrementalSpec(
        initial_model=spec.initial_model.name,
        eval_model=evaluated.name if evaluated is not None else None,
        deploy_model=spec.deploy_spec.model.name,
        hot_update_config=hot_update_config(job),
    )


def hot_update_config(job: LearningJob) -> str | None:
    """The host path of the inference worker's model config file of an incremental-learning
    job with hot update (None: another job): the annotation Sedna's GM sets when it creates
    the worker, or for a job sent over MQTT without it the path the GM would have set."""
    if not isinstance(job, IncrementalLearningJob):
        return None
    if not job.spec.deploy_spec.model.hot_update_enabled:
        return None
    meta = job.metadata
    default = f"{HOT_UPDATE_ROOT}/{meta.namespace}/incrementallearningjob/{meta.name}"
    config = meta.annotations.get(HOT_UPDATE_ANNOTATION, f"{default}/model_config.json".lower())
    if not config.startswith("/") or ".." in config.split("/") or "\0" in config:
        raise InvalidMessage(
            "must be an absolute host path without '..'", _HOT_UPDATE_FIELD, code="invalid"
        )
    return config


#: The longest deploy-trigger annotation read (a condition is a few dozen bytes).
MAX_TRIGGER_ANNOTATION_BYTES = 4096
_ANNOTATION_FIELD = f"$.metadata.annotations[{DEPLOY_TRIGGER_ANNOTATION!r}]"


def job_gate(job: LearningJob) -> Condition | None:
    """The deploy gate of a job: `deploySpec.trigger`, or the annotation
    `lifelong.sedna.io/deploy-trigger` (Sedna's CRD and GM drop the former, annotations reach
    the node). Both set and different: refused, saying which."""
    from_spec = gate_spec(job.spec.deploy_spec.trigger)
    text = job.metadata.annotations.get(DEPLOY_TRIGGER_ANNOTATION)
    if text is None:
        return from_spec
    from_annotation = gate_spec(_trigger_annotation(text))
    if job.spec.deploy_spec.trigger is not None and from_spec != from_annotation:
        raise InvalidMessage(
            f"deploySpec.trigger and the annotation {DEPLOY_TRIGGER_ANNOTATION} "
            "set different deploy conditions: keep one of them",
            _ANNOTATION_FIELD,
            code="invalid",
        )
    return from_annotation


def _trigger_annotation(text: str) -> DeployTrigger:
    """The annotation's `{"condition": {...}}`, as JSON or YAML (no anchors or aliases)."""
    if len(text.encode("utf-8", "replace")) > MAX_TRIGGER_ANNOTATION_BYTES:
        raise InvalidMessage(
            f"over {MAX_TRIGGER_ANNOTATION_BYTES} bytes", _ANNOTATION_FIELD, code="invalid"
        )
    obj: Any
    try:
        obj = json.loads(text)
    except ValueError:
        obj = _plain_yaml(text)
    if not isinstance(obj, dict):
        raise InvalidMessage(
            'expected an object such as {"condition": {"operator": ">", "threshold": 0.01, '
            '"metric": "accuracy_delta[0]"}}',
            _ANNOTATION_FIELD,
            code="invalid",
        )
    try:
        return msgspec.convert(obj, DeployTrigger)
    except msgspec.ValidationError as e:
        raise invalid(e, _ANNOTATION_FIELD) from None


def _plain_yaml(text: str) -> Any:
    try:
        if any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text, Loader=yaml.SafeLoader)):
            raise InvalidMessage("YAML anchors and aliases are not allowed", _ANNOTATION_FIELD)
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        reason = f"neither JSON nor YAML: {str(e).splitlines()[0]}"
        raise InvalidMessage(reason, _ANNOTATION_FIELD, code="invalid") from None


def gate_spec(trigger: DeployTrigger | None) -> Condition | None:
    """The deploy gate a deploy trigger's condition sets, its threshold a number (None: no
    condition, or an empty operator, as Sedna sends an unset one)."""
    condition = trigger.condition if trigger is not None else None
    if condition is None or not condition.operator:
        return None
    return msgspec.structs.replace(condition, threshold=condition.threshold_value or 0.0)
