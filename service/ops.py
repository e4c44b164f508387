"""`lifelong apply | delete | get | describe | watch | validate`: the operator's commands.

The operator talks to the controller the way Sedna's cloud does: resources go down the node's
downstream topic as insert/delete envelopes, status comes back on the upstream and errors
topics, and state is read from the same Redis the controller writes. Nothing here changes
state directly, so a command can never bypass the lifecycle.

Manifests are checked with the service's own decoders before anything is sent: what `apply`
accepts is exactly what the controller accepts, and `validate` reports every problem it can
find (msgspec stops at the first, so each problem found is patched with a known-good value
and the document checked again).

Exit codes (see service/cli.py): 0 ok, 1 problem found, 2 bad usage or configuration,
3 a server is unreachable. Secrets never reach the terminal: credential annotations are shown
as present, never by value, and every free text goes through `redact`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import queue
import re
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import yaml

from service import config as config_mod
from service import messages
from service.adapters.mqtt import Inbound, MqttClient, MqttSettings
from service.adapters.redis_store import RedisStore
from service.core.state import DatasetState, JobState, State, decode_state
from service.errors import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    InvalidMessage,
    PermanentError,
    StoreUnavailable,
)
from service.history import decode_records, last_change_ms
from service.keys import DATASET_KIND, JOB_KIND, Keys, rkey
from service.logs import redact, setup_logging
from service.messages import Dataset, LifelongLearningJob
from service.tables import (
    dataset_row,
    describe_dataset,
    describe_job,
    history_lines,
    job_row,
    render,
    watch_line,
)
from service.urls import redact_url

EXIT_OK = 0
EXIT_PROBLEM = 1
DEFAULT_NAMESPACE = "default"
DEFAULT_TIMEOUT_S = 10.0
STORE_TIMEOUT_S = 3.0
HISTORY_FOR_AGE = 100
DEFAULT_HISTORY = 20
MAX_PROBLEMS_PER_DOCUMENT = 50
DATASET_WIRE_KIND = "dataset"
JOB_WIRE_KIND = "lifelonglearningjob"
_NODE_NAME_RE = re.compile(messages.DNS_SUBDOMAIN_PATTERN)
_MISSING_FIELD_RE = re.compile(r"missing required field `([^`]+)`")
_PATH_SEGMENT_RE = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")
_MISSING = object()
NODE_NAME_REASON = "must be a DNS-1123 subdomain naming the edge node (it is a topic level)"

#: Every spelling `delete`, `get` and `describe` accept, to the wire kind.
KIND_ALIASES = {
    "dataset": DATASET_WIRE_KIND,
    "datasets": DATASET_WIRE_KIND,
    "ds": DATASET_WIRE_KIND,
    "lifelonglearningjob": JOB_WIRE_KIND,
    "lifelonglearningjobs": JOB_WIRE_KIND,
    "job": JOB_WIRE_KIND,
    "jobs": JOB_WIRE_KIND,
    "llj": JOB_WIRE_KIND,
}
_STORE_KIND = {DATASET_WIRE_KIND: DATASET_KIND, JOB_WIRE_KIND: JOB_KIND}
_WIRE_NAME = {DATASET_WIRE_KIND: "Dataset", JOB_WIRE_KIND: "LifelongLearningJob"}

# Known-good documents: a field found wrong is replaced by the same field from here, so the
# next check can report the next problem instead of the same one again.
_REFERENCE: dict[str, dict[str, Any]] = {
    DATASET_WIRE_KIND: {
        "apiVersion": messages.SEDNA_API_VERSION,
        "kind": "Dataset",
        "metadata": {"name": "example", "namespace": DEFAULT_NAMESPACE},
        "spec": {"url": "/data/example.txt", "format": "txt", "nodeName": "example-node"},
    },
    JOB_WIRE_KIND: {
        "apiVersion": messages.SEDNA_API_VERSION,
        "kind": "LifelongLearningJob",
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
            "deploySpec": {"template": {}},
            "outputDir": "/output",
        },
    },
}

_COMMON_NOTE = """
exit codes: 0 ok, 1 problem found, 2 bad usage or configuration, 3 server unreachable.
Broker and Redis come from LIFELONG_MQTT_URL and LIFELONG_REDIS_URL (or the flags above)."""

APPLY_EXAMPLES = (
    """examples:
  lifelong apply -f examples/dataset.yaml -f examples/lifelonglearningjob.yaml
  cat job.json | lifelong apply -f -
  lifelong apply -f all.yaml -n team-a       # namespace for documents that name none

Each Dataset goes to the node in its spec.nodeName, each LifelongLearningJob to the node in
spec.trainSpec.template.spec.nodeName, anything else to LIFELONG_NODE_NAME. Nothing is sent
unless every document is valid."""
    + _COMMON_NOTE
)

DELETE_EXAMPLES = (
    """examples:
  lifelong delete lifelonglearningjob atcii-classifier-demo
  lifelong delete dataset lifelong-atcii-dataset -n team-a --node edge-2
"""
    + _COMMON_NOTE
)

GET_EXAMPLES = (
    """examples:
  lifelong get jobs
  lifelong get datasets -n default
  lifelong get jobs -o json | jq '.[].phase'

STATE is the job's step (waiting, preparing, running, copying), or no-dataset when its
dataset is unknown and paused when its dataset was deleted."""
    + _COMMON_NOTE
)

DESCRIBE_EXAMPLES = (
    """examples:
  lifelong describe job atcii-classifier-demo
  lifelong describe dataset lifelong-atcii-dataset -n team-a --history 50
"""
    + _COMMON_NOTE
)

WATCH_EXAMPLES = (
    """examples:
  lifelong watch                         # until Ctrl-C
  lifelong watch --count 3 --timeout 30  # stop after 3 messages or 30 s
  lifelong watch -o json | jq .

With --count, exit 1 when fewer messages arrived before the timeout."""
    + _COMMON_NOTE
)

VALIDATE_EXAMPLES = """examples:
  lifelong validate -f examples/lifelonglearningjob.yaml
  kubectl get lifelonglearningjobs -o yaml | lifelong validate -f -

Checks offline, with the controller's own rules; prints one line per problem, naming the
field (like $.spec.dataset.trainProb), and exits 1 when there is any.
exit codes: 0 valid, 1 problems found, 2 file unreadable."""


# ============================================================ registration


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add apply, delete, get, describe, watch and validate to the `lifelong` parser."""
    _add_apply(commands)
    _add_delete(commands)
    _add_get(commands)
    _add_describe(commands)
    _add_watch(commands)
    _add_validate(commands)


def _parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    epilog: str,
) -> argparse.ArgumentParser:
    return commands.add_parser(
        name,
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_connection_flags(parser: argparse.ArgumentParser) -> None:
    config_mod.add_arguments(parser)
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log connection details to stderr"
    )


def _add_files_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="YAML or JSON file of one or more resources; '-' reads stdin; repeatable",
    )


def _add_apply(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    apply = _parser(commands, "apply", "send resources to their edge nodes", APPLY_EXAMPLES)
    _add_files_flag(apply)
    apply.add_argument(
        "-n", "--namespace", type=_namespace_arg, default=DEFAULT_NAMESPACE,
        help="namespace of documents that name none (default: default)",
    )  # fmt: skip
    apply.add_argument(
        "--timeout", type=_seconds_arg, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
        help="how long to wait for the broker (default: 10)",
    )  # fmt: skip
    _add_connection_flags(apply)
    apply.set_defaults(func=_apply)


def _add_delete(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    delete = _parser(commands, "delete", "delete resources from an edge node", DELETE_EXAMPLES)
    delete.add_argument(
        "kind", type=_kind_arg, metavar="KIND", help="dataset or lifelonglearningjob"
    )
    delete.add_argument("names", nargs="+", type=_name_arg, metavar="NAME")
    delete.add_argument(
        "-n", "--namespace", type=_namespace_arg, default=DEFAULT_NAMESPACE,
        help="the resource's namespace (default: default)",
    )  # fmt: skip
    delete.add_argument(
        "--node", type=_node_arg, default=None, help="edge node (default: LIFELONG_NODE_NAME)"
    )
    delete.add_argument(
        "--timeout", type=_seconds_arg, default=DEFAULT_TIMEOUT_S, metavar="SECONDS"
    )
    _add_connection_flags(delete)
    delete.set_defaults(func=_delete)


def _add_get(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    get = _parser(commands, "get", "list jobs or datasets with their progress", GET_EXAMPLES)
    get.add_argument("kind", type=_kind_arg, metavar="jobs|datasets")
    get.add_argument(
        "-n", "--namespace", type=_namespace_arg, default=None,
        help="only this namespace (default: all)",
    )  # fmt: skip
    get.add_argument("-o", "--output", choices=("table", "json"), default="table")
    _add_connection_flags(get)
    get.set_defaults(func=_get)


def _add_describe(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    describe = _parser(
        commands, "describe", "show one job or dataset in detail, with its history",
        DESCRIBE_EXAMPLES,
    )  # fmt: skip
    describe.add_argument("kind", type=_kind_arg, metavar="job|dataset")
    describe.add_argument("name", type=_name_arg, metavar="NAME")
    describe.add_argument(
        "-n", "--namespace", type=_namespace_arg, default=DEFAULT_NAMESPACE,
        help="the resource's namespace (default: default)",
    )  # fmt: skip
    describe.add_argument(
        "--history", type=_count_arg, default=DEFAULT_HISTORY, metavar="N",
        help=f"history events to show (default: {DEFAULT_HISTORY}, at most 100)",
    )  # fmt: skip
    _add_connection_flags(describe)
    describe.set_defaults(func=_describe)


def _add_watch(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    watch = _parser(
        commands, "watch", "print upstream status and rejections as they happen", WATCH_EXAMPLES
    )
    watch.add_argument("--count", type=_count_arg, default=None, metavar="N",
                       help="stop after N messages")  # fmt: skip
    watch.add_argument("--timeout", type=_seconds_arg, default=None, metavar="SECONDS",
                       help="stop after this long")  # fmt: skip
    watch.add_argument("--node", type=_node_arg, default=None,
                       help="edge node (default: LIFELONG_NODE_NAME)")  # fmt: skip
    watch.add_argument("-o", "--output", choices=("text", "json"), default="text")
    _add_connection_flags(watch)
    watch.set_defaults(func=_watch)


def _add_validate(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    validate = _parser(
        commands, "validate", "check resource files offline, naming each bad field",
        VALIDATE_EXAMPLES,
    )  # fmt: skip
    _add_files_flag(validate)
    validate.add_argument(
        "-n", "--namespace", type=_namespace_arg, default=DEFAULT_NAMESPACE,
        help="namespace of documents that name none (default: default)",
    )  # fmt: skip
    validate.set_defaults(func=_validate)


# ------------------------------------------------------------ argument types (exit 2 on error)


def _kind_arg(text: str) -> str:
    kind = KIND_ALIASES.get(text.lower())
    if kind is None:
        raise argparse.ArgumentTypeError(
            f"unknown kind {text!r}: use dataset or lifelonglearningjob"
        )
    return kind


def _header_arg(namespace: str, name: str) -> None:
    """Check names with the controller's own header rules, so CLI and service agree."""
    try:
        messages.decode_envelope(delete_envelope(DATASET_WIRE_KIND, namespace, name))
    except InvalidMessage as e:
        raise argparse.ArgumentTypeError(f"{e.reason}") from None


def _name_arg(text: str) -> str:
    _header_arg(DEFAULT_NAMESPACE, text)
    return text


def _namespace_arg(text: str) -> str:
    _header_arg(text, "example")
    return text


def _node_arg(text: str) -> str:
    if len(text) > 253 or not _NODE_NAME_RE.search(text):
        raise argparse.ArgumentTypeError(f"{text!r}: {NODE_NAME_REASON}")
    return text


def _seconds_arg(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be positive")
    return seconds


def _count_arg(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


# ============================================================ reading manifests


class KubeYamlLoader(yaml.SafeLoader):
    """YAML read as kubectl reads it.

    PyYAML follows YAML 1.1, where `02:00` is the base-60 integer 120 and `2024-05-01` a
    date; Kubernetes' parser keeps both as strings. Sedna's own example writes
    `timer: {start: 02:00, end: 24:00}` unquoted, so without this it would not validate.
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
        r"""^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$""",
        re.X,
    ),
    list("-+0123456789"),
)
KubeYamlLoader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
        |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
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
    """The text of a manifest file, or of stdin for `-`."""
    if name == "-":
        return sys.stdin.read()
    try:
        with open(name, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"cannot read {name}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read {name}: not UTF-8 text") from None


def load_documents(text: str, source: str) -> list[Document]:
    """Every resource in a YAML stream (`---` separated) or JSON text.

    Empty documents are skipped; a JSON array and a Kubernetes `kind: List` are expanded
    into their items (what `kubectl get -o yaml` prints for several objects).
    """
    try:
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


# ============================================================ checking resources


@dataclass(frozen=True)
class Checked:
    """A document after validation: what to send and where, or why it cannot be sent."""

    where: str
    problems: tuple[InvalidMessage, ...]
    title: str = ""
    kind: str = ""
    namespace: str = ""
    name: str = ""
    node: str | None = None
    envelope: bytes = b""

    @property
    def label(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    def problem_lines(self) -> list[str]:
        """One line per problem: where, which field, why (secrets masked)."""
        titled = f"{self.where} ({self.title})" if self.title else self.where
        return [redact(f"{titled}: {p}") for p in self.problems]


def check_document(
    doc: Document, *, default_namespace: str = DEFAULT_NAMESPACE, default_node: str | None = None
) -> Checked:
    """Validate one document as the controller would receive it from `apply`.

    Every field problem found is reported, and the node name a job's template gives; once
    the resource decodes, the insert and delete envelopes built for it are checked too.
    """
    obj = doc.obj
    if not isinstance(obj, dict):
        reason = f"expected a Kubernetes object (a mapping), got {type(obj).__name__}"
        return Checked(doc.where, (InvalidMessage(reason, "$"),))
    title = _title(obj)
    resource, problems = resource_problems(obj, default_namespace)
    node, node_problem = target_node(obj, default_node)
    problems += [node_problem] if node_problem else []
    if resource is None or problems:
        return Checked(doc.where, tuple(problems), title)
    meta = resource.metadata
    kind = resource.kind.lower()
    envelope = insert_envelope(
        kind, meta.namespace, meta.name, _with_namespace(obj, meta.namespace)
    )
    problems += _envelope_problems(envelope, kind, meta)
    return Checked(
        doc.where, tuple(problems), title, kind=kind, namespace=meta.namespace, name=meta.name,
        node=node, envelope=envelope,
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
) -> tuple[Dataset | LifelongLearningJob | None, list[InvalidMessage]]:
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
            resource = messages.decode_resource(
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


def _presentable(problem: InvalidMessage, obj: dict[str, Any]) -> InvalidMessage:
    """The problem as the user should read it: a missing field named by its own path, and
    `$WORKER_NODE`-style placeholders (Sedna's docs use them) pointed out as unexpanded."""
    segments, exact = parse_path(problem.path)
    missing = _MISSING_FIELD_RE.search(problem.reason)
    if missing and exact:
        return InvalidMessage("required field is missing", f"{problem.path}.{missing[1]}")
    value = _lookup(obj, segments) if exact else _MISSING
    if isinstance(value, str) and value.startswith("$"):
        hint = f"{problem.reason} ({value[:40]!r} looks like an unexpanded shell variable)"
        return InvalidMessage(hint, problem.path)
    return problem


def target_node(
    obj: dict[str, Any], default_node: str | None
) -> tuple[str | None, InvalidMessage | None]:
    """The node a resource is sent to, and the problem with the name it gives, if any.

    A Dataset names its node in `spec.nodeName`; a job in its train template's
    `spec.nodeName` (Sedna schedules the train worker there). Otherwise: `default_node`.
    Templates are never validated by the controller, so the job's node is checked here.
    """
    is_dataset = str(obj.get("kind", "")).lower() == DATASET_WIRE_KIND
    path = "$.spec.nodeName" if is_dataset else "$.spec.trainSpec.template.spec.nodeName"
    node = _lookup(obj, parse_path(path)[0])
    if node is _MISSING or node is None or node == "":
        return default_node, None
    if isinstance(node, str) and len(node) <= 253 and _NODE_NAME_RE.search(node):
        return node, None
    if is_dataset:
        return None, None  # the Dataset's own schema reports it
    reason = NODE_NAME_REASON
    if isinstance(node, str) and node.startswith("$"):
        reason += f" ({node[:40]!r} looks like an unexpanded shell variable)"
    return None, InvalidMessage(reason, path)


def _with_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The resource as sent: metadata.namespace filled in, so header and content agree."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and metadata.get("namespace") != namespace:
        return {**obj, "metadata": {**metadata, "namespace": namespace}}
    return obj


def insert_envelope(kind: str, namespace: str, name: str, content: dict[str, Any]) -> bytes:
    """A downstream insert, as Sedna's GM sends it (content as a JSON object)."""
    return _envelope(kind, namespace, name, "insert", content)


def delete_envelope(kind: str, namespace: str, name: str) -> bytes:
    """A downstream delete: the header alone names the resource."""
    return _envelope(kind, namespace, name, "delete", None)


def _envelope(kind: str, namespace: str, name: str, operation: str, content: object) -> bytes:
    header = messages.Header(
        namespace=namespace, resource_kind=kind, resource_name=name, operation=operation
    )
    return messages.encode(messages.Envelope(header=header, content=content))


def _envelope_problems(
    envelope: bytes, kind: str, meta: messages.ObjectMeta
) -> list[InvalidMessage]:
    """The header rules of insert and delete, checked by the controller's own decoder."""
    problems = []
    for data in (envelope, delete_envelope(kind, meta.namespace, meta.name)):
        try:
            messages.decode_envelope(data)
        except InvalidMessage as e:
            problems.append(e)
    return problems


def downstream_topic(prefix: str, node: str) -> str:
    """The downstream topic of any node (Config.downstream_topic is this node's only)."""
    return f"{prefix}/{node}/downstream"


def upstream_filter(template: str, prefix: str, node: str) -> str:
    """A subscription filter for the upstream template: a `{namespace}` level becomes `+`."""
    levels = []
    for level in template.split("/"):
        if "{namespace}" in level:
            levels.append("+")
        else:
            levels.append(level.format(prefix=prefix, node=node))
    return "/".join(levels)


# ============================================================ connections


def _config(args: argparse.Namespace) -> config_mod.Config:
    """Settings from flags over the environment; library logs only with --verbose."""
    cfg = config_mod.from_args(args, os.environ)
    setup_logging(cfg.log_format, logging.INFO if args.verbose else logging.CRITICAL)
    return cfg


@contextlib.contextmanager
def _mqtt(
    cfg: config_mod.Config,
    verb: str,
    timeout_s: float,
    *,
    subscriptions: Sequence[str] = (),
    inbound: queue.SimpleQueue[Inbound] | None = None,
) -> Iterator[MqttClient]:
    """A connected broker session under a fresh client id, closed on the way out."""
    client_id = f"lifelong-{verb}-{secrets.token_hex(3)}"
    client = MqttClient(
        MqttSettings(cfg.mqtt_url, client_id=client_id, connect_timeout_s=timeout_s),
        subscriptions=subscriptions,
        inbound=inbound,
    )
    client.start()
    try:
        if not client.wait_connected(timeout_s, stop_on_refusal=True):
            if client.refusal is not None:
                raise BrokerRefused(
                    f"the MQTT broker at {redact_url(cfg.mqtt_url)} refused the connection: "
                    f"{client.refusal}"
                )
            raise BrokerUnavailable(
                f"cannot reach the MQTT broker at {redact_url(cfg.mqtt_url)} within {timeout_s:g}s"
            )
        yield client
    finally:
        client.stop(timeout_s=2.0)


@contextlib.contextmanager
def _store(cfg: config_mod.Config) -> Iterator[RedisStore]:
    """A Redis store; connection failures name the (redacted) URL."""
    store = RedisStore(cfg.redis_url, Keys(cfg.key_prefix), socket_timeout_s=STORE_TIMEOUT_S)
    try:
        yield store
    except StoreUnavailable as e:
        raise StoreUnavailable(f"cannot reach Redis at {redact(cfg.redis_url)}: {e}") from e
    finally:
        store.close()


def _publish_all(
    client: MqttClient, outgoing: Sequence[tuple[str, str, bytes]], timeout_s: float
) -> None:
    """Publish (label, topic, payload)s at QoS 1 and print each once the broker has it;
    raise `BrokerRefused` naming every one the broker refused (MQTT 5 only), with its reason."""
    tickets = [(label, topic, client.publish(topic, payload, qos=1))
               for label, topic, payload in outgoing]  # fmt: skip
    deadline = time.monotonic() + timeout_s
    refused: list[str] = []
    for label, topic, ticket in tickets:
        if not ticket.wait(max(deadline - time.monotonic(), 0.0)):
            raise BrokerUnavailable(f"the broker did not acknowledge {label} within {timeout_s:g}s")
        if ticket.refused:
            refused.append(f"{label} to {topic} ({ticket.reason})")
        else:
            print(f"{label} sent to {topic}", flush=True)
    if refused:
        raise BrokerRefused(f"the MQTT broker refused {'; '.join(refused)}")


# ============================================================ commands


def _checked_documents(
    filenames: Sequence[str], namespace: str, default_node: str | None
) -> list[Checked]:
    checked: list[Checked] = []
    for name in filenames:
        source = "stdin" if name == "-" else name
        for doc in load_documents(read_source(name), source):
            checked.append(
                check_document(doc, default_namespace=namespace, default_node=default_node)
            )
    return checked


def _validate(args: argparse.Namespace) -> int:
    try:
        checked = _checked_documents(args.filename, args.namespace, None)
    except InvalidMessage as e:
        print(redact(str(e)), flush=True)
        return EXIT_PROBLEM
    lines = [line for c in checked for line in c.problem_lines()]
    for line in lines:
        print(line)
    if not checked:
        print(f"{', '.join(args.filename)}: no resources found")
        return EXIT_PROBLEM
    if lines:
        print(f"{len(lines)} problem(s) in {len(checked)} resource(s)", file=sys.stderr)
        return EXIT_PROBLEM
    for c in checked:
        routed = f", for node {c.node}" if c.node else ""
        print(f"{c.where}: {_WIRE_NAME[c.kind]} {c.namespace}/{c.name} is valid{routed}")
    return EXIT_OK


def _apply(args: argparse.Namespace) -> int:
    cfg = _config(args)
    checked = _checked_documents(args.filename, args.namespace, cfg.node_name)
    lines = [line for c in checked for line in c.problem_lines()]
    for line in lines:
        print(line, file=sys.stderr)
    if lines:
        print(f"nothing sent: {len(lines)} problem(s)", file=sys.stderr)
        return EXIT_PROBLEM
    if not checked:
        raise InvalidMessage(f"no resources found in {', '.join(args.filename)}", "")
    outgoing = [
        (c.label, downstream_topic(cfg.topic_prefix, c.node or cfg.node_name), c.envelope)
        for c in checked
    ]
    with _mqtt(cfg, "apply", args.timeout) as client:
        _publish_all(client, outgoing, args.timeout)
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    cfg = _config(args)
    topic = downstream_topic(cfg.topic_prefix, args.node or cfg.node_name)
    outgoing = []
    for name in args.names:
        envelope = delete_envelope(args.kind, args.namespace, name)
        messages.decode_envelope(envelope)  # the controller's own header rules
        outgoing.append((f"delete of {args.kind} {args.namespace}/{name}", topic, envelope))
    with _mqtt(cfg, "delete", args.timeout) as client:
        _publish_all(client, outgoing, args.timeout)
    return EXIT_OK


def _get(args: argparse.Namespace) -> int:
    cfg = _config(args)
    store_kind = _STORE_KIND[args.kind]
    with _store(cfg) as store:
        keys = [k for k in store.list_rkeys(store_kind) if _in_namespace(k, args.namespace)]
        raw_states = store.load(keys)
        changed = {
            k: last_change_ms(decode_records(store.history(k, HISTORY_FOR_AGE))) for k in keys
        }
    now_ms = time.time_ns() // 1_000_000
    rows = []
    for key, raw in raw_states.items():
        state = None if raw is None else _state_or_none(key, raw)
        if isinstance(state, JobState):
            rows.append(job_row(state, changed[key], now_ms))
        elif isinstance(state, DatasetState):
            rows.append(dataset_row(state, changed[key], now_ms))
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    elif not rows:
        where = f" in namespace {args.namespace}" if args.namespace else ""
        print(f"No {args.kind} resources found{where}.", file=sys.stderr)
    else:
        print(render(list(rows[0]), [list(row.values()) for row in rows]))
    return EXIT_OK


def _state_or_none(resource_key: str, raw: bytes) -> State | None:
    """A stored state, or None (said on stderr) when it cannot be read: one bad record must
    not hide the others."""
    try:
        return decode_state(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        print(f"lifelong: skipped {resource_key}: its stored state is unreadable", file=sys.stderr)
        return None


def _in_namespace(resource_key: str, namespace: str | None) -> bool:
    return namespace is None or resource_key.partition(":")[2].startswith(f"{namespace}/")


def _describe(args: argparse.Namespace) -> int:
    cfg = _config(args)
    key = rkey(_STORE_KIND[args.kind], args.namespace, args.name)
    with _store(cfg) as store:
        raw = store.load([key]).get(key)
        if raw is None:
            raise PermanentError(f"{args.kind} {args.namespace}/{args.name} not found")
        resource = store.load_resource(key)
        records = decode_records(store.history(key, max(args.history, HISTORY_FOR_AGE)))
        users = store.dataset_jobs(key) if args.kind == DATASET_WIRE_KIND else []
    state = _state_or_none(key, raw)
    if state is None:
        return EXIT_PROBLEM
    now_ms = time.time_ns() // 1_000_000
    if isinstance(state, JobState):
        lines = describe_job(state, _decoded_job(resource), records, now_ms)
    else:
        lines = describe_dataset(state, users, records, now_ms)
    lines += history_lines(records[-args.history :], now_ms)
    print(redact("\n".join(lines)))
    return EXIT_OK


def _decoded_job(raw: bytes | None) -> LifelongLearningJob | None:
    if raw is None:
        return None
    try:
        return messages.decode_job(raw)
    except InvalidMessage:
        return None


def _watch(args: argparse.Namespace) -> int:
    cfg = _config(args)
    node = args.node or cfg.node_name
    topics = [
        upstream_filter(cfg.upstream_topic, cfg.topic_prefix, node),
        f"{cfg.topic_prefix}/{node}/errors",
    ]
    inbound: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
    connect_s = args.timeout or DEFAULT_TIMEOUT_S
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    seen = 0
    with _mqtt(cfg, "watch", connect_s, subscriptions=topics, inbound=inbound):
        print(f"watching {' and '.join(topics)}", file=sys.stderr, flush=True)
        while args.count is None or seen < args.count:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            try:
                msg = inbound.get(timeout=remaining)
            except queue.Empty:
                break
            seen += 1
            print(watch_line(msg.topic, msg.payload, msg.received_at, args.output), flush=True)
    if args.count is not None and seen < args.count:
        print(f"watch: {seen} of {args.count} messages before the timeout", file=sys.stderr)
        return EXIT_PROBLEM
    return EXIT_OK
