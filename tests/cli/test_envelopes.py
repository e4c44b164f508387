"""Downstream envelopes as the CLI builds them."""

from __future__ import annotations

from service import wire
from service.cli import manifests


def test_delete_envelope_decodes_as_a_delete() -> None:
    decoded = wire.decode_envelope(manifests.delete_envelope("lifelonglearningjob", "ns", "j"))
    assert decoded == wire.JobDelete(namespace="ns", name="j")
