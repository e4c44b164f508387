"""The resource kinds as the CLI names them: every spelling a user may type, derived from
the kinds `service.keys` defines (the store kind of a resource key and its wire kind, an
envelope's `resourceKind`) and the resource types of `service.messages`.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.keys import DATASET_KIND, JOB_KIND, WIRE_KINDS
from service.keys import Kind as StoreKind
from service.messages import Dataset, LifelongLearningJob


@dataclass(frozen=True)
class Kind:
    """One resource kind under all its names."""

    resource: type[Dataset] | type[LifelongLearningJob]
    store: StoreKind
    plural: str
    short: str

    @property
    def title(self) -> str:
        """As a manifest writes it: `Dataset`, `LifelongLearningJob`."""
        return self.resource.__name__

    @property
    def wire(self) -> str:
        """As an envelope header and upstream status carry it: `dataset`, `lifelonglearningjob`."""
        return WIRE_KINDS[self.store]

    def names(self) -> tuple[str, ...]:
        """Every spelling that means this kind (compared in lower case)."""
        return (self.wire, self.wire + "s", self.store, self.plural, self.short)


DATASET = Kind(Dataset, DATASET_KIND, plural="datasets", short="ds")
JOB = Kind(LifelongLearningJob, JOB_KIND, plural="jobs", short="llj")
KINDS = (DATASET, JOB)
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
