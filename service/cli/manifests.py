"""Manifests, from the file to the envelope: the resource kinds as the CLI names them, reading
manifests, checking the resources they hold, and the downstream envelopes that carry them.

The resource kinds as the CLI names them: every spelling a user may type, derived from
the kinds `service.keys` defines (the store kind of a resource key and its wire kind, an
envelope's `resourceKind`), with the title a manifest gives each.

Reading manifests: files or stdin, YAML streams or JSON, as kubectl reads them.

A manifest is checked before it is built into objects, from the parser's events: a document
over `MAX_DOCUMENT_BYTES`, nested deeper than `MAX_DEPTH`, or whose aliases stand for more
than `MAX_ALIAS_NODES` nodes in all (a 905-byte "billion laughs" stands for billions, and
converting it took minutes and gigabytes) is refused in one line naming the document and the
line. Input beyond `MAX_INPUT_BYTES` is not read at all.

Downstream envelopes, built as Sedna's cloud sends them and checked by the service's own
decoder, so what the CLI sends is exactly what the controller accepts.

Checking resources before they are sent: every problem found, each naming its field.

Manifests are checked with the service's own decoders: what `apply` accepts is exactly what
the controller accepts. msgspec stops at the first problem, so each problem found is patched
with the same field of a known-good document and the document checked again, until it passes
or a problem cannot be patched; `validate` thus reports every problem it can find.
"""


import copy
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from service import wire
from service.errors import ConfigError, InvalidMessage
from service.keys import (
    DATASET_KIND,
    FEDERATED_LEARNING_KIND,
    JOB_KIND,
    JOINT_INFERENCE_KIND,
    MODEL_KIND,
    WIRE_KINDS,
)
from service.keys import Kind as StoreKind
from service.logs import escape_controls, redact
from service.runtime.intake import downstream_event
from service.settings import node_name_problem
from service.wire import Resource, unknown_spec_fields


@dataclass(frozen=True)
class Kind:
    """One resource kind under all its names."""

    #: as a manifest writes it: `Dataset`, `LifelongLearningJob`, `Model`...
    title: str
    store: StoreKind
    plural: str
    short: str
    #: the wire name of a kind stored under another kind's store kind (the two job kinds
    #: share `job`); None: the store kind's own
    own_wire: str | None = None
    #: more short names
    aliases: tuple[str, ...] = ()

    @property
    def wire(self) -> str:
        """As an envelope header and upstream status carry it: `dataset`, `lifelonglearningjob`."""
        return self.own_wire or WIRE_KINDS[self.store]

    def names(self) -> tuple[str, ...]:
        """Every spelling that means this kind (compared in lower case); the store kind's
        name means its own kind only."""
        store = (self.store,) if self.own_wire is None else ()
        return (self.wire, self.wire + "s", *store, self.plural, self.short, *self.aliases)


DATASET = Kind("Dataset", DATASET_KIND, plural="datasets", short="ds")
JOB = Kind("LifelongLearningJob", JOB_KIND, plural="jobs", short="llj")
INCREMENTAL_JOB = Kind(
    "IncrementalLearningJob", JOB_KIND, plural="incrementallearningjobs", short="ij",
    own_wire="incrementallearningjob", aliases=("ilj",),
)  # fmt: skip
MODEL = Kind("Model", MODEL_KIND, plural="models", short="mo")
JOINT_INFERENCE = Kind(
    "JointInferenceService", JOINT_INFERENCE_KIND, plural="jointinferenceservices", short="ji"
)
FEDERATED_LEARNING = Kind(
    "FederatedLearningJob", FEDERATED_LEARNING_KIND, plural="federatedlearningjobs", short="fl"
)
KINDS = (DATASET, JOB, INCREMENTAL_JOB, MODEL, JOINT_INFERENCE, FEDERATED_LEARNING)
#: The kinds the controller runs as jobs (both stored under `job`), which a rollback takes.
JOB_KINDS = (JOB, INCREMENTAL_JOB)
_BY_NAME = {name: kind for kind in KINDS for name in kind.names()}


def kind_named(text: str) -> Kind | None:
    """The kind a user means by `text` (any case), or None."""
    return _BY_NAME.get(text.lower())


def kind_of_wire(wire: str) -> Kind:
    """The kind of a wire name (as checked manifests carry it)."""
    found = _BY_NAME.get(wire)
    if found is None or found.wire != wire:
        raise ValueError(f"not a wire kind: {wire!r}")
    return found


#: All the manifests of one file or of stdin.
MAX_INPUT_BYTES = 16 << 20
#: One document: four times what a controller takes in one message (1 MiB of JSON).
MAX_DOCUMENT_BYTES = 4 << 20
#: The controller refuses JSON nested deeper than 64 levels.
MAX_DEPTH = 64
#: Nodes the aliases of one document may stand for, together: anchors reused a few times pass.
MAX_ALIAS_NODES = 10_000


class KubeYamlLoader(yaml.SafeLoader):
    """YAML read as kubectl reads it.

    PyYAML follows YAML 1.1, where `02:00` is the base-60 integer 120 and `2024-05-01` a
    date. Kubernetes reads YAML with Go's yaml package (YAML 1.1 too), which purposely drops
    base-60 numbers and hands a date to JSON as the string it is, so both stay strings.
    Sedna's own examples write `timer: {start: 02:00, end: 24:00}` unquoted, so without this
    they would not validate. Numbers are resolved as the Go package resolves them: integers
    in decimal, `0x`, `0o`, `0b` or a leading `0` (octal), floats with or without a dot
    before an exponent whose sign is optional (`1e3`, `1.5e3`: strings to PyYAML; `09`, not
    an octal integer, is the float 9), `_` between digits ignored.
    """


_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
KubeYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG, _TIMESTAMP_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
KubeYamlLoader.add_implicit_resolver(
    _INT_TAG,
    re.compile(
        r"""^(?:[-+]?0b[0-1_]+|[-+]?0o[0-7_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)
        |[-+]?0x[0-9a-fA-F_]+)$""",
        re.X,
    ),
    list("-+0123456789"),
)
KubeYamlLoader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9_]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


@dataclass(frozen=True)
class Document:
    """One resource read from a manifest; `where` says which (`file.yaml: document 2`)."""

    where: str
    obj: object


def read_source(name: str) -> str:
    """The text of a manifest file, or of stdin for `-`, up to `MAX_INPUT_BYTES`."""
    source = "stdin" if name == "-" else name
    try:
        if name == "-":
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            with open(name, "rb") as f:
                data = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read {source}: {e.strerror or e}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise ConfigError(f"cannot read {source}: more than {MAX_INPUT_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read {source}: not UTF-8 text") from None


@dataclass
class _Scan:
    """What the events of the document being read add up to."""

    number: int = 0
    start: yaml.Event | None = None  # the document's start, marked at its first character
    open_nodes: list[int] = field(default_factory=list)  # nodes in each open collection
    open_anchors: list[str | None] = field(default_factory=list)
    anchored: dict[str, int] = field(default_factory=dict)  # anchor -> nodes it stands for
    alias_nodes: int = 0

    def add(self, nodes: int) -> None:
        if self.open_nodes:
            self.open_nodes[-1] += nodes


def _mark(mark: object, attribute: str) -> int:
    """A mark's `index` or `line` (the parser marks every event; 0 should one not be)."""
    return int(getattr(mark, attribute, 0))


def _refusal(source: str, scan: _Scan, event: yaml.Event, problem: str) -> InvalidMessage:
    """The refusal of the document, naming the line of `event`."""
    line = _mark(event.start_mark, "line") + 1
    return InvalidMessage(f"{source}: document {scan.number} (line {line}): {problem}", "")


def _check_limits(text: str, source: str) -> None:
    """Refuse a document over the size, depth or alias limits, from the parser's events
    alone: nothing is built, so a bomb costs the time to read its text."""
    scan = _Scan()
    for event in yaml.parse(text, Loader=KubeYamlLoader):
        if isinstance(event, yaml.DocumentStartEvent):
            scan = _Scan(number=scan.number + 1, start=event)
        elif isinstance(event, yaml.DocumentEndEvent) and scan.start is not None:
            size = _mark(event.end_mark, "index") - _mark(scan.start.start_mark, "index")
            if size > MAX_DOCUMENT_BYTES:
                raise _refusal(source, scan, scan.start, f"more than {MAX_DOCUMENT_BYTES} bytes")
        elif isinstance(event, yaml.CollectionStartEvent):
            if len(scan.open_nodes) >= MAX_DEPTH:
                raise _refusal(source, scan, event, f"nested deeper than {MAX_DEPTH} levels")
            scan.open_nodes.append(1)
            scan.open_anchors.append(event.anchor)
        elif isinstance(event, yaml.CollectionEndEvent):
            nodes, anchor = scan.open_nodes.pop(), scan.open_anchors.pop()
            if anchor is not None:
                scan.anchored[anchor] = nodes
            scan.add(nodes)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                scan.anchored[event.anchor] = 1
            scan.add(1)
        elif isinstance(event, yaml.AliasEvent):
            nodes = scan.anchored.get(event.anchor or "", 1)  # an unknown one: the load says so
            scan.alias_nodes += nodes
            if scan.alias_nodes > MAX_ALIAS_NODES:
                raise _refusal(
                    source, scan, event,
                    f"its aliases stand for more than {MAX_ALIAS_NODES} nodes (an alias bomb?)",
                )  # fmt: skip
            scan.add(nodes)


def load_documents(text: str, source: str) -> list[Document]:
    """Every resource in a YAML stream (`---` separated) or JSON text.

    Empty documents are skipped; a JSON array and a Kubernetes `kind: List` are expanded
    into their items (what `kubectl get -o yaml` prints for several objects). A document over
    the limits (module docstring) is refused before anything is built of it.
    """
    try:
        _check_limits(text, source)
        loaded = list(yaml.load_all(text, Loader=KubeYamlLoader))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InvalidMessage(f"{source}: not valid YAML{where}: {e.problem}", "") from None
    except yaml.YAMLError as e:
        raise InvalidMessage(f"{source}: not valid YAML: {e}", "") from None
    documents: list[Document] = []
    for number, obj in enumerate(loaded, start=1):
        where = f"{source}: document {number}"
        documents.extend(_expand(obj, where))
    return documents


def _expand(obj: object, where: str) -> list[Document]:
    if obj is None:
        return []
    items: object = None
    if isinstance(obj, list):
        items = obj
    elif isinstance(obj, dict) and str(obj.get("kind", "")).lower() == "list":
        items = obj.get("items")
        if not isinstance(items, list):
            return [Document(where, obj)]
    if isinstance(items, list):
        return [Document(f"{where} item {i}", item) for i, item in enumerate(items, start=1)]
    return [Document(where, obj)]


def documents_of(filenames: list[str]) -> list[Document]:
    """Every document of every file (`-`: stdin), in order."""
    documents: list[Document] = []
    for name in filenames:
        source = "stdin" if name == "-" else name
        documents += load_documents(read_source(name), source)
    return documents


def insert_envelope(kind: str, namespace: str, name: str, content: dict[str, Any]) -> bytes:
    """A downstream insert, as Sedna's GM sends it (content as a JSON object)."""
    return _envelope(kind, namespace, name, "insert", content)


def delete_envelope(kind: str, namespace: str, name: str) -> bytes:
    """A downstream delete: the header alone names the resource."""
    return _envelope(kind, namespace, name, "delete", None)


def _envelope(kind: str, namespace: str, name: str, operation: str, content: object) -> bytes:
    header = wire.Header(
        namespace=namespace, resource_kind=kind, resource_name=name, operation=operation
    )
    return wire.encode(wire.Envelope(header=header, content=content))


def envelope_problems(
    envelope: bytes, kind: str, namespace: str, name: str
) -> list[InvalidMessage]:
    """The header rules of insert and delete and the rules across fields (a job's deploy
    condition given twice, say), checked by the controller's own decoder and intake."""
    problems = []
    for data in (envelope, delete_envelope(kind, namespace, name)):
        try:
            downstream_event(wire.decode_envelope(data))
        except InvalidMessage as e:
            problems.append(e)
    return problems


DEFAULT_NAMESPACE = "default"
MAX_PROBLEMS_PER_DOCUMENT = 50
_MISSING_FIELD_RE = re.compile(r"missing required field `([^`]+)`")
_PATH_SEGMENT_RE = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")
_MISSING = object()

# What the known-good documents of the two job kinds share.
_JOB_DATASET = {"name": "example", "trainProb": 0.8}
_JOB_TRAIN_SPEC = {
    "template": {},
    "trigger": {
        "checkPeriodSeconds": 60,
        "timer": {"start": "00:00", "end": "24:00"},
        # no operator: patching a bad one must not make metric and threshold
        # required, which the user may not have meant
        "condition": {"operator": "", "threshold": 0, "metric": "num_of_samples"},
    },
}
_DEPLOY_TRIGGER = {"condition": {"operator": "", "threshold": 0, "metric": "accuracy"}}

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
            "dataset": _JOB_DATASET,
            "trainSpec": _JOB_TRAIN_SPEC,
            "evalSpec": {"template": {}},
            "deploySpec": {"template": {}, "trigger": _DEPLOY_TRIGGER},
            "outputDir": "/output",
        },
    },
    INCREMENTAL_JOB.wire: {
        "apiVersion": wire.SEDNA_API_VERSION,
        "kind": INCREMENTAL_JOB.title,
        "metadata": {"name": "example", "namespace": DEFAULT_NAMESPACE},
        "spec": {
            "initialModel": {"name": "example"},
            "dataset": _JOB_DATASET,
            "trainSpec": _JOB_TRAIN_SPEC,
            "evalSpec": {"template": {}},
            "deploySpec": {
                "model": {"name": "example", "hotUpdateEnabled": False, "pollPeriodSeconds": 60},
                "trigger": _DEPLOY_TRIGGER,
                "template": {},
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
#: a lifelong-learning job's train worker or a service's edge worker, every training
#: worker's node of a federated-learning job (Sedna's GM sends it to each); `[*]` stands for
#: each list item. An incremental-learning job names none: Sedna's GM sends it (and its
#: Models) to its Dataset's node, which the job does not name, and its templates are
#: opaque (Sedna's own example holds `$WORKER_NODE` there).
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
    GM sends it to every one of them); a Model and an incremental-learning job name none.
    Templates are never validated by the controller, so the nodes they name are checked here.
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
