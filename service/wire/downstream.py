"""What the cloud sends down, decoded: the envelope and resource decoders, the events they
yield (insert, delete or rollback of a dataset or job; insert or delete of a Model, a
joint-inference service or a federated-learning job, which are stored and not run), and the
fields a resource carries that its type does not know.

Decoders raise :class:`~service.errors.InvalidMessage` (reason + JSON path such as
``$.spec.dataset.trainProb``) and nothing else, whatever bytes arrive. Rules that span
fields, which the types cannot say, are checked after conversion.

The decoders ignore unknown fields on purpose (a newer Sedna GM may send more), so a misspelt
optional field (`checkPeriodSecond`) would silently fall back to its default.
`unknown_fields` walks a decoded JSON object beside its msgspec type and names every field the
type does not declare, with the declared field it most resembles. Known fields come from the
types themselves (wire spelling, after msgspec's renaming), never from a list kept by hand.
Mappings typed as free-form (`dict[str, Any]`: pod templates, annotations) are not entered.
"""


import base64
import binascii
import difflib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, NamedTuple, TypeVar

import msgspec

from service.errors import InvalidMessage
from service.wire.base import (
    MAX_ANNOTATIONS_BYTES,
    MAX_JOB_NAME_CHARS,
    MAX_TEMPLATE_BYTES,
    MAX_TEMPLATE_DEPTH,
    MAX_WORKER_NAME_CHARS,
    Wire,
    canonical,
    check_free_form,
    check_integers,
    decode_json_object,
    encode,
    json_type,
)
from service.wire.credentials import credential_of
from service.wire.fields import convert, invalid, quoted
from service.wire.resources import (
    SEDNA_API_VERSION,
    Condition,
    Dataset,
    Envelope,
    FederatedLearningJob,
    Header,
    IncrementalLearningJob,
    JointInferenceService,
    LearningJob,
    LifelongLearningJob,
    ModelResource,
    ObjectMeta,
)

__all__ = [
    "DatasetDelete",
    "DatasetInsert",
    "Downstream",
    "JobDelete",
    "JobInsert",
    "JobRollback",
    "Resource",
    "ResourceDelete",
    "ResourceInsert",
    "RollbackContent",
    "StoredResource",
    "UnknownField",
    "decode_dataset",
    "decode_envelope",
    "decode_job",
    "decode_resource",
    "decode_stored",
    "unknown_fields",
    "unknown_spec_fields",
]


class _Insert(msgspec.Struct, frozen=True, kw_only=True):
    """A resource was created or re-sent: the decoded resource, and `raw`, its canonical
    JSON (sorted keys)."""

    raw: bytes

    def __repr__(self) -> str:
        """Leave `raw` out: it may hold the credential annotation."""
        shown = [f"{f}={getattr(self, f)!r}" for f in self.__struct_fields__ if f != "raw"]
        return f"{type(self).__name__}({', '.join(shown)}, raw=<{len(self.raw)} bytes>)"


class _Delete(msgspec.Struct, frozen=True, kw_only=True):
    """A resource was deleted: its namespace and name."""

    namespace: str
    name: str


class DatasetInsert(_Insert, frozen=True, kw_only=True):
    """A dataset was created or re-sent; `raw` is its canonical JSON (sorted keys)."""

    dataset: Dataset


class DatasetDelete(_Delete, frozen=True, kw_only=True):
    """A dataset was deleted."""


class JobInsert(_Insert, frozen=True, kw_only=True):
    """A job was created, updated or re-sent; `raw` is its canonical JSON (sorted keys)."""

    job: LearningJob


class JobDelete(_Delete, frozen=True, kw_only=True):
    """A job was deleted."""


class RollbackContent(Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The content of a downstream `rollback` of a job: the round whose model goes back in
    the deploy file; absent (or no content at all): the version deployed before the current
    one. Unknown fields are refused: a misspelt `version` must not roll back to the default."""

    version: Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)] | None = None


class JobRollback(msgspec.Struct, frozen=True, kw_only=True):
    """A job's deploy file is to hold round `version`'s model again (None: the previous)."""

    namespace: str
    name: str
    version: int | None = None


#: The resources the controller stores without running anything of them.
StoredResource = ModelResource | JointInferenceService | FederatedLearningJob
Resource = Dataset | LifelongLearningJob | IncrementalLearningJob | StoredResource


class ResourceInsert(_Insert, frozen=True, kw_only=True):
    """A Model, joint-inference service or federated-learning job was created or re-sent;
    `raw` is its canonical JSON (sorted keys, without the status Sedna's GM sends)."""

    resource: StoredResource

    @property
    def kind(self) -> str:
        """The resource's kind as an envelope header carries it (`model`, ...)."""
        return self.resource.kind.lower()


class ResourceDelete(msgspec.Struct, frozen=True, kw_only=True):
    """A Model, joint-inference service or federated-learning job was deleted; `kind` as an
    envelope header carries it (`model`, `jointinferenceservice`, `federatedlearningjob`)."""

    kind: str
    namespace: str
    name: str


Downstream = (
    DatasetInsert
    | DatasetDelete
    | JobInsert
    | JobDelete
    | JobRollback
    | ResourceInsert
    | ResourceDelete
)
R = TypeVar("R", bound=Resource)


class _Kind(NamedTuple):
    """A resource kind: as manifests write it, and its type."""

    title: str
    type: type[Resource]


#: Every kind the cloud may send down, by `resourceKind` (lower case).
_RESOURCE_KINDS: Mapping[str, _Kind] = MappingProxyType(
    {
        "dataset": _Kind("Dataset", Dataset),
        "lifelonglearningjob": _Kind("LifelongLearningJob", LifelongLearningJob),
        "incrementallearningjob": _Kind("IncrementalLearningJob", IncrementalLearningJob),
        "model": _Kind("Model", ModelResource),
        "jointinferenceservice": _Kind("JointInferenceService", JointInferenceService),
        "federatedlearningjob": _Kind("FederatedLearningJob", FederatedLearningJob),
    }
)
#: The job kinds, which the controller runs (a downstream `rollback` is theirs alone).
_JOB_KINDS = frozenset({"lifelonglearningjob", "incrementallearningjob"})


def decode_envelope(data: bytes) -> Downstream:
    """Decode and validate a downstream envelope (insert or delete of a dataset or job).

    Content paths in errors are relative to the resource (`$.spec.outputDir`), header paths
    to the envelope (`$.header.namespace`).
    """
    envelope = convert(decode_json_object(data), Envelope)
    header = envelope.header
    kind = _kind_of(header.resource_kind, "$.header.resourceKind", "resourceKind")
    operation = header.operation.lower()
    if operation == "delete":
        if kind == "dataset":
            return DatasetDelete(namespace=header.namespace, name=header.resource_name)
        if kind in _JOB_KINDS:
            return JobDelete(namespace=header.namespace, name=header.resource_name)
        return ResourceDelete(kind=kind, namespace=header.namespace, name=header.resource_name)
    if operation == "rollback" and kind in _JOB_KINDS:
        return _rollback(header, envelope.content)
    if operation != "insert":
        rollback = kind in _JOB_KINDS
        expected = "insert, delete or rollback" if rollback else "insert or delete"
        reason = f"unknown operation {quoted(header.operation)}; expected {expected}"
        raise InvalidMessage(reason, "$.header.operation")
    title, type_ = _RESOURCE_KINDS[kind]
    content = _with_defaults(_content_object(envelope.content), header.namespace, title)
    resource = _resource_object(content, type_)
    _check_matches_header(resource.metadata, header)
    if isinstance(resource, Dataset):
        return DatasetInsert(dataset=resource, raw=canonical(content))
    # the status Sedna's GM sends grows with every round: read once, never stored
    raw = canonical({k: v for k, v in content.items() if k != "status"})
    if isinstance(resource, LifelongLearningJob | IncrementalLearningJob):
        return JobInsert(job=resource, raw=raw)
    return ResourceInsert(resource=resource, raw=raw)


def _kind_of(text: str, path: str, field: str) -> str:
    """A kind named by an envelope's `resourceKind` or a manifest's `kind` (`field`), in lower
    case; refused when this controller does not take it, saying why."""
    kind = text.lower()
    if kind not in _RESOURCE_KINDS:
        expected = ", ".join(_RESOURCE_KINDS)
        reason = f"unknown {field} {quoted(text)}; expected one of {expected}"
        raise InvalidMessage(reason, path)
    return kind


def _rollback(header: Header, content: object) -> JobRollback:
    """A job's rollback: content `{"version": V}` (inline or base64), or none for the previous
    version. Paths in errors are relative to the content (`$.content.version`)."""
    obj = {} if content is None else _content_object(content)
    try:
        request = msgspec.convert(obj, RollbackContent)
    except msgspec.ValidationError as e:
        raise invalid(e, "$.content") from None
    return JobRollback(
        namespace=header.namespace, name=header.resource_name, version=request.version
    )


def decode_dataset(data: bytes, *, default_namespace: str = "default") -> Dataset:
    """Decode and validate a Dataset resource on its own (stored raw bytes, `validate -f`)."""
    obj = _with_defaults(decode_json_object(data), default_namespace, "Dataset")
    return _resource_object(obj, Dataset)


def decode_job(data: bytes, *, default_namespace: str = "default") -> LifelongLearningJob:
    """Decode and validate a LifelongLearningJob resource on its own."""
    obj = _with_defaults(decode_json_object(data), default_namespace, "LifelongLearningJob")
    return _resource_object(obj, LifelongLearningJob)


def decode_resource(data: bytes, *, default_namespace: str = "default") -> Resource:
    """Decode a resource whose `kind` says what it is (`apply -f`, `validate -f`)."""
    obj = decode_json_object(data)
    kind = obj.get("kind")
    if not isinstance(kind, str):
        expected = ", ".join(k.title for k in _RESOURCE_KINDS.values())
        raise InvalidMessage(f"must be one of {expected}", "$.kind")
    title, type_ = _RESOURCE_KINDS[_kind_of(kind, "$.kind", "kind")]
    return _resource_object(_with_defaults(obj, default_namespace, title), type_)


def decode_stored(data: bytes) -> StoredResource:
    """Decode a stored Model, joint-inference service or federated-learning job (the raw
    resource JSON kept beside its state)."""
    resource = decode_resource(data)
    if isinstance(resource, Dataset | LifelongLearningJob | IncrementalLearningJob):
        raise InvalidMessage(f"{resource.kind} is not a stored-only resource", "$.kind")
    return resource


def _content_object(content: object) -> dict[str, Any]:
    """The resource object: given inline, or as base64 of its JSON (Go's []byte), or as text."""
    if isinstance(content, dict):
        return content
    if not isinstance(content, str):
        raise InvalidMessage(
            f"expected an object or a base64 string, got {json_type(content)}", "$.content"
        )
    if content.lstrip().startswith("{"):
        return decode_json_object(content.encode("utf-8", "surrogatepass"), "$.content")
    try:
        decoded = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidMessage("not valid base64", "$.content") from None
    return decode_json_object(decoded, "$.content")


def _with_defaults(obj: dict[str, Any], namespace: str, kind: str) -> dict[str, Any]:
    """Fill in what Kubernetes clients leave out, so stored raw bytes describe themselves.

    Objects from informer caches carry no apiVersion/kind, and metadata.namespace may be
    absent or empty (it then means the header's namespace).
    """
    filled = {**obj, "apiVersion": obj.get("apiVersion") or SEDNA_API_VERSION}
    filled["kind"] = obj.get("kind") or kind
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and not metadata.get("namespace"):
        filled["metadata"] = {**metadata, "namespace": namespace}
    return filled


def _resource_object(obj: dict[str, Any], type_: type[R]) -> R:
    resource = convert(obj, type_)
    check_integers(obj)
    title = next(k.title for k in _RESOURCE_KINDS.values() if k.type is type_)
    if resource.kind.lower() != title.lower():
        raise InvalidMessage(f"{quoted(resource.kind)} is not {title}", "$.kind")
    _check_annotations(resource.metadata)
    for path, template in _templates(resource):
        check_free_form(encode(template), path, MAX_TEMPLATE_BYTES, MAX_TEMPLATE_DEPTH)
    if isinstance(resource, LifelongLearningJob):
        _check_job_name(resource.metadata.name)
        spec = resource.spec
        _check_condition(spec.train_spec.trigger.condition, "$.spec.trainSpec.trigger.condition")
        deploy = spec.deploy_spec.trigger
        if deploy is not None:
            _check_condition(deploy.condition, "$.spec.deploySpec.trigger.condition")
    credential_of(resource.metadata)
    return resource


def _check_job_name(name: str) -> None:
    """A job's workers are named `{job}-train-{version}` and the like, DNS-1123 subdomains
    of at most 253 characters: a longer job name could never hear its workers."""
    if len(name) > MAX_JOB_NAME_CHARS:
        reason = (
            f"a job name may hold at most {MAX_JOB_NAME_CHARS} characters ({len(name)} given): "
            f"its workers' names ('<job>-train-<version>', '<job>-inference-<suffix>') must "
            f"fit {MAX_WORKER_NAME_CHARS}"
        )
        raise InvalidMessage(reason, "$.metadata.name", code="too_long")
def _templates(resource: Resource) -> Iterator[tuple[str, dict[str, Any]]]:
    """The free-form parts of a resource (pod templates, autoscaling), each with its path:
    kept and passed on, never read, each within the template caps."""
    if isinstance(resource, LifelongLearningJob):
        spec = resource.spec
        yield "$.spec.trainSpec.template", spec.train_spec.template
        yield "$.spec.evalSpec.template", spec.eval_spec.template
        yield "$.spec.deploySpec.template", spec.deploy_spec.template
    elif isinstance(resource, JointInferenceService):
        for name, worker in (
            ("edgeWorker", resource.spec.edge_worker),
            ("cloudWorker", resource.spec.cloud_worker),
        ):
            yield f"$.spec.{name}.template", worker.template
            if worker.hpa is not None:
                yield f"$.spec.{name}.hpa", worker.hpa
    elif isinstance(resource, FederatedLearningJob):
        yield "$.spec.aggregationWorker.template", resource.spec.aggregation_worker.template
        for i, training in enumerate(resource.spec.training_workers):
            yield f"$.spec.trainingWorkers[{i}].template", training.template


def _check_annotations(metadata: ObjectMeta) -> None:
    annotations = metadata.annotations.items()
    size = sum(len(f"{k}{v}".encode("utf-8", "surrogatepass")) for k, v in annotations)
    if size > MAX_ANNOTATIONS_BYTES:
        reason = f"larger than {MAX_ANNOTATIONS_BYTES} bytes together ({size})"
        raise InvalidMessage(reason, "$.metadata.annotations", code="too_large")


def _check_condition(condition: Condition | None, path: str) -> None:
    """What a condition's types cannot say: a finite threshold, and both a metric and a
    threshold when an operator is given."""
    if condition is None:
        return
    if condition.threshold is not None and not _finite(condition.threshold):
        raise InvalidMessage("must be a finite number", f"{path}.threshold")
    if condition.operator and not condition.metric:
        reason = f"required when operator is {condition.operator!r}"
        raise InvalidMessage(reason, f"{path}.metric")
    if condition.operator and condition.threshold is None:
        reason = f"required when operator is {condition.operator!r}"
        raise InvalidMessage(reason, f"{path}.threshold")


def _finite(value: str | int | float) -> bool:
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _check_matches_header(metadata: ObjectMeta, header: Header) -> None:
    if metadata.namespace != header.namespace:
        reason = f"{quoted(metadata.namespace)} does not match header namespace"
        raise InvalidMessage(reason, "$.metadata.namespace", code="name_mismatch")
    if metadata.name != header.resource_name:
        reason = f"{quoted(metadata.name)} does not match header resourceName"
        raise InvalidMessage(reason, "$.metadata.name", code="name_mismatch")


_HINT_CUTOFF = 0.6
#: The kinds whose spec the controller interprets, by `kind` in lower case (a joint-inference
#: service's or federated-learning job's spec is stored and passed on, like a template).
_RESOURCES: Mapping[str, type[Dataset] | type[LearningJob] | type[ModelResource]] = {
    "dataset": Dataset,
    "lifelonglearningjob": LifelongLearningJob,
    "incrementallearningjob": IncrementalLearningJob,
    "model": ModelResource,
}


@dataclass(frozen=True)
class UnknownField:
    """A field its type does not declare: where, and the declared ones it may have meant."""

    path: str
    known: tuple[str, ...]

    @property
    def suggestion(self) -> str | None:
        """The declared field whose name is closest to this one, if any is close."""
        name = self.path.rpartition(".")[2]
        lowered = {k.lower(): k for k in self.known}
        close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=_HINT_CUTOFF)
        return lowered[close[0]] if close else None

    @property
    def reason(self) -> str:
        """`unknown field (did you mean x?)`, or the fields known there when none is close."""
        suggestion = self.suggestion
        if suggestion is not None:
            return f"unknown field (did you mean {suggestion}?)"
        return f"unknown field (known here: {', '.join(self.known)})"


def unknown_fields(value: object, type_: type[Any], path: str = "$") -> list[UnknownField]:
    """Every field of `value` (a decoded JSON object) that `type_` does not declare, in
    document order, with its path (`$.spec.trainSpec.trigger.checkPeriodSecond`)."""
    return list(_walk(value, _type_info(type_), path))


_TYPE_INFO: dict[object, msgspec.inspect.Type] = {}


def _type_info(type_: object) -> msgspec.inspect.Type:
    """`msgspec.inspect.type_info`, once per type: it evaluates every annotation of the
    type's structs again on each call (about a millisecond for a job's spec)."""
    info = _TYPE_INFO.get(type_)
    if info is None:
        info = _TYPE_INFO[type_] = msgspec.inspect.type_info(type_)
    return info


def unknown_spec_fields(obj: Mapping[str, Any]) -> list[UnknownField]:
    """The unknown fields of a Dataset's, LifelongLearningJob's or Model's `spec`, the part
    the controller interprets (its metadata, status and worker templates are not checked)."""
    resource = _RESOURCES.get(str(obj.get("kind", "")).lower())
    if resource is None:
        return []
    spec_type = next(f.type for f in msgspec.structs.fields(resource) if f.encode_name == "spec")
    return unknown_fields(obj.get("spec"), spec_type, "$.spec")


def _walk(value: object, info: msgspec.inspect.Type, path: str) -> Iterator[UnknownField]:
    struct = _struct_of(info)
    if struct is None or not isinstance(value, dict):
        return
    declared = {f.encode_name: f.type for f in struct.fields}
    for name, item in value.items():
        where = f"{path}.{name}"
        if name not in declared:
            yield UnknownField(where, tuple(declared))
        else:
            yield from _walk(item, declared[name], where)


def _struct_of(info: msgspec.inspect.Type) -> msgspec.inspect.StructType | None:
    """The struct a field holds, through `X | None` and `Annotated[X, ...]`."""
    if isinstance(info, msgspec.inspect.Metadata):
        return _struct_of(info.type)
    if isinstance(info, msgspec.inspect.UnionType):
        structs = [s for s in map(_struct_of, info.types) if s is not None]
        return structs[0] if len(structs) == 1 else None
    return info if isinstance(info, msgspec.inspect.StructType) else None
