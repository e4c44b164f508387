"""Spec fields this controller does not know, logged once per resource version.

The service takes resources with unknown fields (a newer Sedna GM may add some), but a
misspelt optional field would silently fall back to its default; `lifelong validate` and
`apply` refuse them, and the service says so in its log, once for each version of a
resource (a GM resync re-sends every resource without a new line each time).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import msgspec

from service.core.events import DatasetApplied, JobApplied, ResourceApplied
from service.runtime.accept import Accepted, target_of
from service.wire import unknown_spec_fields

log = logging.getLogger(__name__)

#: resource versions remembered as already told; the oldest are forgotten first
REMEMBERED = 10_000


class UnknownFields:
    """Used by the intake thread only."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self._told: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._remembered = remembered

    def check(self, accepted: Accepted) -> None:
        event = accepted.event
        stored = JobApplied | DatasetApplied | ResourceApplied
        if not isinstance(event, stored) or accepted.resource is None:
            return
        version = (target_of(event), event.digest)
        if version in self._told:
            self._told.move_to_end(version)
            return
        self._told[version] = None
        if len(self._told) > self._remembered:
            self._told.popitem(last=False)
        unknown = unknown_spec_fields(msgspec.json.decode(accepted.resource))
        if unknown:
            log.warning(
                "%s %s/%s has fields this controller does not know (ignored): %s",
                type(event).__name__.removesuffix("Applied").lower(),
                event.namespace,
                event.name,
                "; ".join(f"{field.path}: {field.reason}" for field in unknown),
                extra={"outcome": "applied"},
            )
