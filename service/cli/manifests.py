"""Reading manifests: files or stdin, YAML streams or JSON, as kubectl reads them.

A manifest is checked before it is built into objects, from the parser's events: a document
over `MAX_DOCUMENT_BYTES`, nested deeper than `MAX_DEPTH`, or whose aliases stand for more
than `MAX_ALIAS_NODES` nodes in all (a 905-byte "billion laughs" stands for billions, and
converting it took minutes and gigabytes) is refused in one line naming the document and the
line. Input beyond `MAX_INPUT_BYTES` is not read at all.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

import yaml

from service.errors import ConfigError, InvalidMessage

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
