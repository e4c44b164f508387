"""Downstream envelopes, built as Sedna's cloud sends them and checked by the service's own
decoder, so what the CLI sends is exactly what the controller accepts."""

from __future__ import annotations

from typing import Any

from service import wire
from service.errors import InvalidMessage
from service.runtime.intake import downstream_event


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
