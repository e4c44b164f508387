"""Checking resources before they are sent: every problem found, each naming its field.

Manifests are checked with the service's own decoders: what `apply` accepts is exactly what
the controller accepts. msgspec stops at the first problem, so each problem found is patched
with the same field of a known-good document and the document checked again, until it passes
or a problem cannot be patched; `validate` thus reports every problem it can find.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service import wire
from service.cli.envelopes import envelope_problems, insert_envelope
from service.cli.kinds import (
    DATASET,
    FEDERATED_LEARNING,
    JOB,
    JOINT_INFERENCE,
    MODEL,
    kind_of_wire,
)
from service.cli.manifests import Document, documents_of
from service.errors import InvalidMessage
from service.logs import escape_controls, redact
from service.settings import node_name_problem
from service.wire import Resource
from service.wire_fields import unknown_spec_fields

DEFAULT_NAMESPACE = "default"
MAX_PROBLEMS_PER_DOCUMENT = 50
_MISSING_FIELD_RE = re.compile(r"missing required field `([^`]+)`")
_PATH_SEGMENT_RE = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")
_MISSING = object()

# Known-good documents: a field found wrong is replaced by the same field from here, so the
# next check can report the next problem instead of the same one again.
_REFERENCE: dict[str, dict[str, Any]] = {
    DATASET.wire: {
        "apiVersion": wire.SEDNA_API_VERSION,
        "kind": DATASET.title,
        "metadata": {"name": "example", "namespace": DEFAULT_NAMESPACE},
        "spec": {"url": "/data/example.txt", "format": "txt", "nodeName": "example-node"},
    },
    JOB.wire: {
        "apiVersion": wire.SEDNA_API_VERSION,
        "kind": JOB.title,
        "metadata": {"name": "example", "namespace": DEFAULT_NAMESPACE},
        "spec": {
            "dataset": {"name": "example", "trainProb": 0.8},
            "trainSpec": {
                "template": {},
                "trigger": {
                    "checkPeriodSeconds": 60,
                    "timer": {"start": "00:00", "end": "24:00"},
                    # no operator: patching a bad one must not make metric and threshold
                    # required, which the user may not have meant
                    "condition": {"operator": "", "threshold": 0, "metric": "num_of_samples"},
                },
            },
            "evalSpec": {"template": {}},
            "deploySpec": {
                "template": {},
                "trigger": {"condition": {"operator": "", "threshold": 0, "metric": "accuracy"}},
            },
            "outputDir": "/output",
        },
    },
    MODEL.wire: {
        "apiVersion": wire.SEDNA_API_VERSION,
        "kind": MODEL.title,
        "metadata": {"name": "example", "namespace": DEFAULT_NAMESPACE},
        "spec": {"url": "/models/example.pb", "format": "pb"},
    },
    JOINT_INFERENCE.wire: {
        "apiVersion": wire.SEDNA_API_VERSION,
        "kind": JOINT_INFERENCE.title,
        "metadata": {"name": "example", "namespace": DEFAULT_NAMESPACE},
        "spec": {
            "edgeWorker": {
                "model": {"name": "example"},
                "hardExampleMining": {"name": "", "parameters": []},
                "template": {},
            },
            "cloudWorker": {"model": {"name": "example"}, "template": {}},
        },
    },
    FEDERATED_LEARNING.wire: {
        "apiVersion": wire.SEDNA_API_VERSION,
        "kind": FEDERATED_LEARNING.title,
        "metadata": {"name": "example", "namespace": DEFAULT_NAMESPACE},
        "spec": {
            "aggregationWorker": {"model": {"name": "example"}, "template": {}},
            "trainingWorkers": [],
            "pretrainedModel": {"name": ""},
            "transmitter": {},
        },
    },
}
#: Where a resource names the node(s) it is sent to, by kind: a Dataset's node, the node of
#: a job's train worker or a service's edge worker, every training worker's node of a
#: federated-learning job (Sedna's GM sends it to each); `[*]` stands for each list item.
_NODE_PATHS: dict[str, str] = {
    DATASET.wire: "$.spec.nodeName",
    JOB.wire: "$.spec.trainSpec.template.spec.nodeName",
    JOINT_INFERENCE.wire: "$.spec.edgeWorker.template.spec.nodeName",
    FEDERATED_LEARNING.wire: "$.spec.trainingWorkers[*].template.spec.nodeName",
}


@dataclass(frozen=True)
class Checked:
    """A document after validation: what to send and where (no nodes: the default node), or
    why it cannot be sent."""

    where: str
    problems: tuple[InvalidMessage, ...]
    title: str = ""
    kind: str = ""
    namespace: str = ""
    name: str = ""
    nodes: tuple[str, ...] = ()
    envelope: bytes = b""

    @property
    def label(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def kind_title(self) -> str:
        """The kind as the manifest writes it (`LifelongLearningJob`)."""
        return kind_of_wire(self.kind).title

    def problem_lines(self) -> list[str]:
        """One line per problem: where, which field, why (secrets masked, control characters
        escaped: a manifest may come from anywhere)."""
        titled = f"{self.where} ({self.title})" if self.title else self.where
        return [escape_controls(redact(f"{titled}: {p}")) for p in self.problems]


def checked_documents(
    filenames: Sequence[str], namespace: str, default_node: str | None
) -> list[Checked]:
    """Every document of the files, checked."""
    return [
        check_document(doc, default_namespace=namespace, default_node=default_node)
        for doc in documents_of(list(filenames))
    ]


def check_document(
    doc: Document, *, default_namespace: str = DEFAULT_NAMESPACE, default_node: str | None = None
) -> Checked:
    """Validate one document as the controller would receive it from `apply`.

    Every field problem found is reported, every field of the spec the controller would not
    understand (a misspelling would otherwise fall back to a default unnoticed), and the node
    name a job's template gives; once the resource decodes, the insert and delete envelopes
    built for it are checked too.
    """
    obj = doc.obj
    if not isinstance(obj, dict):
        reason = f"expected a Kubernetes object (a mapping), got {type(obj).__name__}"
        return Checked(doc.where, (InvalidMessage(reason, "$"),))
    title = _title(obj)
    resource, problems = resource_problems(obj, default_namespace)
    problems += [InvalidMessage(field.reason, field.path) for field in unknown_spec_fields(obj)]
    nodes, node_problems = target_nodes(obj, default_node)
    problems += node_problems
    if resource is None or problems:
        return Checked(doc.where, tuple(problems), title)
    meta = resource.metadata
    kind = resource.kind.lower()
    envelope = insert_envelope(
        kind, meta.namespace, meta.name, _with_namespace(obj, meta.namespace)
    )
    problems += envelope_problems(envelope, kind, meta.namespace, meta.name)
    return Checked(
        doc.where, tuple(problems), title, kind=kind, namespace=meta.namespace, name=meta.name,
        nodes=nodes, envelope=envelope,
    )  # fmt: skip


def _title(obj: dict[str, Any]) -> str:
    """`Kind name` as the document gives them, for problem lines (before any validation)."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    kind = obj.get("kind")
    return " ".join(str(part)[:64] for part in (kind, name) if part is not None)


def _json_bytes(obj: object) -> bytes:
    try:
        return json.dumps(obj, allow_nan=False, ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError) as e:
        raise InvalidMessage(f"not representable as JSON ({e})", "$") from None


def resource_problems(
    obj: dict[str, Any], default_namespace: str = DEFAULT_NAMESPACE
) -> tuple[Resource | None, list[InvalidMessage]]:
    """The decoded resource (None if invalid) and every problem found on the way.

    The service's decoder stops at the first problem; each one found is patched with the same
    field of a known-good document (or removed when that has none) and the document decoded
    again, until it passes or a problem cannot be patched.
    """
    current = copy.deepcopy(obj)
    reference = _REFERENCE.get(str(obj.get("kind", "")).lower())
    problems: list[InvalidMessage] = []
    for _ in range(MAX_PROBLEMS_PER_DOCUMENT):
        try:
            resource = wire.decode_resource(
                _json_bytes(current), default_namespace=default_namespace
            )
        except InvalidMessage as e:
            problems.append(_presentable(e, current))
            if reference is None or not _patch(current, e, reference):
                return None, problems
            continue
        return (None if problems else resource), problems
    return None, problems


def parse_path(path: str) -> tuple[list[str | int], bool]:
    """A msgspec error path (`$.spec.a[0].b`) as segments, and whether all of it parsed.

    Dict keys show up as `[...]` and stop the parse: the segments before them remain usable.
    """
    segments: list[str | int] = []
    if not path.startswith("$"):
        return segments, False
    pos = 1
    while pos < len(path):
        match = _PATH_SEGMENT_RE.match(path, pos)
        if match is None:
            return segments, False
        segments.append(match[1] if match[1] is not None else int(match[2]))
        pos = match.end()
    return segments, True


def _problem_segments(problem: InvalidMessage) -> list[str | int]:
    segments, exact = parse_path(problem.path)
    missing = _MISSING_FIELD_RE.search(problem.reason)
    if missing and exact:
        segments.append(missing[1])
    return segments


def _lookup(obj: object, segments: Sequence[str | int]) -> object:
    for segment in segments:
        in_dict = isinstance(obj, dict) and isinstance(segment, str) and segment in obj
        in_list = isinstance(obj, list) and isinstance(segment, int) and 0 <= segment < len(obj)
        if not (in_dict or in_list):
            return _MISSING
        obj = obj[segment]  # type: ignore[index]
    return obj


def _patch(obj: dict[str, Any], problem: InvalidMessage, reference: dict[str, Any]) -> bool:
    """Replace the offending value with the reference's (or drop it); False: cannot."""
    segments = _problem_segments(problem)
    if not segments or segments == ["kind"]:
        return False
    parent, key = _lookup(obj, segments[:-1]), segments[-1]
    wanted = _lookup(reference, segments)
    if isinstance(parent, dict) and isinstance(key, str):
        if wanted is _MISSING:
            return parent.pop(key, _MISSING) is not _MISSING
        if parent.get(key, _MISSING) == wanted:
            return False
        parent[key] = copy.deepcopy(wanted)
        return True
    if isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent):
        del parent[key]
        return True
    return False


def _shell_variable_hint(value: object) -> str:
    """` ('$X' looks like an unexpanded shell variable)` for `$WORKER_NODE`-style values
    (Sedna's docs use them), else nothing."""
    if isinstance(value, str) and value.startswith("$"):
        return f" ({value[:40]!r} looks like an unexpanded shell variable)"
    return ""


def _presentable(problem: InvalidMessage, obj: dict[str, Any]) -> InvalidMessage:
    """The problem as the user should read it: a missing field named by its own path, and
    shell-variable placeholders pointed out as unexpanded."""
    segments, exact = parse_path(problem.path)
    missing = _MISSING_FIELD_RE.search(problem.reason)
    if missing and exact:
        return InvalidMessage("required field is missing", f"{problem.path}.{missing[1]}")
    hint = _shell_variable_hint(_lookup(obj, segments) if exact else _MISSING)
    return InvalidMessage(problem.reason + hint, problem.path) if hint else problem


def target_nodes(
    obj: dict[str, Any], default_node: str | None
) -> tuple[tuple[str, ...], list[InvalidMessage]]:
    """The nodes a resource is sent to (none: `default_node`'s, if given), and the problem
    with each node name it gives.

    A Dataset names its node in `spec.nodeName`; a lifelong-learning job in its train
    template's `spec.nodeName` (Sedna schedules the train worker there), a joint-inference
    service in its edge worker's, a federated-learning job in each training worker's (Sedna's
    GM sends it to every one of them); a Model names none. Templates are never validated by
    the controller, so the nodes they name are checked here.
    """
    kind = str(obj.get("kind", "")).lower()
    nodes: list[str] = []
    problems = []
    for path, node in _named_nodes(obj, _NODE_PATHS.get(kind)):
        if node is _MISSING or node is None or node == "":
            continue
        problem = node_name_problem(node) if isinstance(node, str) else "must be a node name"
        if problem is None and isinstance(node, str):
            if node not in nodes:
                nodes.append(node)
        elif kind != DATASET.wire:  # the Dataset's own schema reports it
            problems.append(InvalidMessage(f"{problem}{_shell_variable_hint(node)}", path))
    if not nodes and not problems and default_node is not None:
        nodes.append(default_node)
    return tuple(nodes), problems


def _named_nodes(obj: dict[str, Any], path: str | None) -> list[tuple[str, object]]:
    """The value at `path` in `obj`, or at each list item's where it says `[*]`, with the
    path of each."""
    if path is None:
        return []
    head, star, tail = path.partition("[*]")
    if not star:
        return [(path, _lookup(obj, parse_path(path)[0]))]
    items = _lookup(obj, parse_path(head)[0])
    if not isinstance(items, list):
        return []
    found = []
    for i, item in enumerate(items):
        where = f"{head}[{i}]{tail}"
        found.append((where, _lookup(item, parse_path("$" + tail)[0])))
    return found


def _with_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The resource as sent: metadata.namespace filled in, so header and content agree."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and metadata.get("namespace") != namespace:
        return {**obj, "metadata": {**metadata, "namespace": namespace}}
    return obj
