"""Reading manifests: YAML as kubectl reads it, several documents, lists, syntax errors."""

from __future__ import annotations

import json

import pytest

from service.cli import manifests
from service.errors import InvalidMessage
from tests.cli.documents import DATASET, JOB


def test_yaml_reads_times_and_dates_as_kubectl_does() -> None:
    text = "a: 02:00\nb: 24:00\nc: 2024-05-01\nd: 500\ne: 0.8\nf: true\ng: '7'\n"
    (doc,) = manifests.load_documents(text, "x")
    assert doc.obj == {"a": "02:00", "b": "24:00", "c": "2024-05-01", "d": 500, "e": 0.8,
                       "f": True, "g": "7"}  # fmt: skip


@pytest.mark.parametrize(
    ("plain", "value"),
    [("02:00", "02:00"), ("20:00", "20:00"), ("1:30:00", "1:30:00"), ("2024-05-01", "2024-05-01"),
     ("500", 500), ("-7", -7), ("1_000", 1000), ("0x1F", 31), ("0o17", 15), ("017", 15),
     ("0b101", 5), ("09", 9.0), ("0.8", 0.8), (".5", 0.5), ("1.", 1.0), ("1e3", 1000.0),
     ("1.5e3", 1500.0), ("2E-2", 0.02), ("1e", "1e"), ("1.2.3", "1.2.3"), ("0x", "0x")],
)  # fmt: skip
def test_plain_scalars_resolve_as_gos_yaml_resolves_them(plain: str, value: object) -> None:
    """As Kubernetes reads them (Go's yaml, YAML 1.1 without base-60 numbers; dates stay
    the text they are): `02:00` is a string, never PyYAML's 120."""
    (doc,) = manifests.load_documents(f"v: {plain}\n", "x")
    assert isinstance(doc.obj, dict) and doc.obj == {"v": value}
    assert type(doc.obj["v"]) is type(value)


def test_several_documents_lists_and_json_arrays_expand() -> None:
    text = "---\nkind: Dataset\n---\n\n---\nkind: List\nitems: [{a: 1}, {b: 2}]\n"
    docs = manifests.load_documents(text, "f.yaml")
    assert [d.where for d in docs] == [
        "f.yaml: document 1", "f.yaml: document 3 item 1", "f.yaml: document 3 item 2",
    ]  # fmt: skip
    array = manifests.load_documents(json.dumps([DATASET, JOB]), "stdin")
    assert [d.obj for d in array] == [DATASET, JOB]


def test_yaml_syntax_error_names_line_and_column() -> None:
    with pytest.raises(InvalidMessage, match=r"^f.yaml: not valid YAML at line 2, column 1"):
        manifests.load_documents("a: [1\n", "f.yaml")
