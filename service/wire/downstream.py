"""What the cloud sends down, decoded: the envelope and resource decoders, and the events
they yield (insert, delete or rollback of a dataset or job).

Decoders raise :class:`~service.errors.InvalidMessage` (reason + JSON path such as
``$.spec.dataset.trainProb``) and nothing else, whatever bytes arrive. Rules that span
fields, which the types cannot say, are checked after conversion.
"""

import base64
import binascii
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, TypeVar

import msgspec

from service.errors import InvalidMessage
from service.wire.base import Wire, canonical, encode
from service.wire.credentials import credential_of
from service.wire.fields import convert, invalid, quoted
from service.wire.json_input import check_free_form, check_integers, decode_json_object, json_type
from service.wire.limits import (
    MAX_ANNOTATIONS_BYTES,
    MAX_JOB_NAME_CHARS,
    MAX_TEMPLATE_BYTES,
    MAX_TEMPLATE_DEPTH,
    MAX_WORKER_NAME_CHARS,
)
from service.wire.resources import (
    SEDNA_API_VERSION,
    Condition,
    Dataset,
    Envelope,
    Header,
    LifelongLearningJob,
    ObjectMeta,
)


class DatasetInsert(msgspec.Struct, frozen=True, kw_only=True):
    """A dataset was created or re-sent; `raw` is its canonical JSON (sorted keys)."""

    dataset: Dataset
    raw: bytes

    def __repr__(self) -> str:
        """Leave `raw` out: it may hold the credential annotation."""
        return f"DatasetInsert(dataset={self.dataset!r}, raw=<{len(self.raw)} bytes>)"


class DatasetDelete(msgspec.Struct, frozen=True, kw_only=True):
    """A dataset was deleted."""

    namespace: str
    name: str


class JobInsert(msgspec.Struct, frozen=True, kw_only=True):
    """A job was created, updated or re-sent; `raw` is its canonical JSON (sorted keys)."""

    job: LifelongLearningJob
    raw: bytes

    def __repr__(self) -> str:
        """Leave `raw` out: it may hold the credential annotation."""
        return f"JobInsert(job={self.job!r}, raw=<{len(self.raw)} bytes>)"


class JobDelete(msgspec.Struct, frozen=True, kw_only=True):
    """A job was deleted."""

    namespace: str
    name: str


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


Downstream = DatasetInsert | DatasetDelete | JobInsert | JobDelete | JobRollback
R = TypeVar("R", Dataset, LifelongLearningJob)


_RESOURCE_KINDS: Mapping[str, str] = MappingProxyType(
    {"dataset": "Dataset", "lifelonglearningjob": "LifelongLearningJob"}
)


def decode_envelope(data: bytes) -> Downstream:
    """Decode and validate a downstream envelope (insert or delete of a dataset or job).

    Content paths in errors are relative to the resource (`$.spec.outputDir`), header paths
    to the envelope (`$.header.namespace`).
    """
    envelope = convert(decode_json_object(data), Envelope)
    header = envelope.header
    kind = header.resource_kind.lower()
    if kind not in _RESOURCE_KINDS:
        expected = " or ".join(_RESOURCE_KINDS)
        reason = f"unknown resourceKind {quoted(header.resource_kind)}; expected {expected}"
        raise InvalidMessage(reason, "$.header.resourceKind")
    operation = header.operation.lower()
    if operation == "delete":
        if kind == "dataset":
            return DatasetDelete(namespace=header.namespace, name=header.resource_name)
        return JobDelete(namespace=header.namespace, name=header.resource_name)
    if operation == "rollback" and kind == "lifelonglearningjob":
        return _rollback(header, envelope.content)
    if operation != "insert":
        expected = "insert, delete or rollback" if kind != "dataset" else "insert or delete"
        reason = f"unknown operation {quoted(header.operation)}; expected {expected}"
        raise InvalidMessage(reason, "$.header.operation")
    content = _with_defaults(
        _content_object(envelope.content), header.namespace, _RESOURCE_KINDS[kind]
    )
    if kind == "dataset":
        dataset = _resource_object(content, Dataset)
        _check_matches_header(dataset.metadata, header)
        return DatasetInsert(dataset=dataset, raw=canonical(content))
    job = _resource_object(content, LifelongLearningJob)
    _check_matches_header(job.metadata, header)
    # the status Sedna's GM sends grows with every round: read once, never stored
    return JobInsert(job=job, raw=canonical({k: v for k, v in content.items() if k != "status"}))


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


def decode_resource(
    data: bytes, *, default_namespace: str = "default"
) -> Dataset | LifelongLearningJob:
    """Decode a resource whose `kind` says what it is (`apply -f`, `validate -f`)."""
    obj = decode_json_object(data)
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind.lower() not in _RESOURCE_KINDS:
        expected = " or ".join(_RESOURCE_KINDS.values())
        raise InvalidMessage(f"must be {expected}", "$.kind")
    obj = _with_defaults(obj, default_namespace, kind)
    if kind.lower() == "dataset":
        return _resource_object(obj, Dataset)
    return _resource_object(obj, LifelongLearningJob)


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
    if resource.kind.lower() != type_.__name__.lower():
        raise InvalidMessage(f"{quoted(resource.kind)} is not {type_.__name__}", "$.kind")
    _check_annotations(resource.metadata)
    if isinstance(resource, LifelongLearningJob):
        _check_job_name(resource.metadata.name)
        spec = resource.spec
        for name, template in (
            ("trainSpec", spec.train_spec.template),
            ("evalSpec", spec.eval_spec.template),
            ("deploySpec", spec.deploy_spec.template),
        ):
            text = encode(template)
            path = f"$.spec.{name}.template"
            check_free_form(text, path, MAX_TEMPLATE_BYTES, MAX_TEMPLATE_DEPTH)
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
