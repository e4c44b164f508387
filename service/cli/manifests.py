"""Reading manifests: files or stdin, YAML streams or JSON, as kubectl reads them."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import yaml

from service.errors import ConfigError, InvalidMessage


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


def documents_of(filenames: list[str]) -> list[Document]:
    """Every document of every file (`-`: stdin), in order."""
    documents: list[Document] = []
    for name in filenames:
        source = "stdin" if name == "-" else name
        documents += load_documents(read_source(name), source)
    return documents
