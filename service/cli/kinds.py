"""The resource kinds as the CLI names them: every spelling a user may type, derived from
the kinds `service.keys` defines (the store kind of a resource key and its wire kind, an
envelope's `resourceKind`), with the title a manifest gives each.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.keys import (
    DATASET_KIND,
    FEDERATED_LEARNING_KIND,
    JOB_KIND,
    JOINT_INFERENCE_KIND,
    MODEL_KIND,
    WIRE_KINDS,
)
from service.keys import Kind as StoreKind


@dataclass(frozen=True)
class Kind:
    """One resource kind under all its names."""

    #: as a manifest writes it: `Dataset`, `LifelongLearningJob`, `Model`...
    title: str
    store: StoreKind
    plural: str
    short: str

    @property
    def wire(self) -> str:
        """As an envelope header and upstream status carry it: `dataset`, `lifelonglearningjob`."""
        return WIRE_KINDS[self.store]

    def names(self) -> tuple[str, ...]:
        """Every spelling that means this kind (compared in lower case)."""
        return (self.wire, self.wire + "s", self.store, self.plural, self.short)


DATASET = Kind("Dataset", DATASET_KIND, plural="datasets", short="ds")
JOB = Kind("LifelongLearningJob", JOB_KIND, plural="jobs", short="llj")
MODEL = Kind("Model", MODEL_KIND, plural="models", short="mo")
JOINT_INFERENCE = Kind(
    "JointInferenceService", JOINT_INFERENCE_KIND, plural="jointinferenceservices", short="ji"
)
FEDERATED_LEARNING = Kind(
    "FederatedLearningJob", FEDERATED_LEARNING_KIND, plural="federatedlearningjobs", short="fl"
)
KINDS = (DATASET, JOB, MODEL, JOINT_INFERENCE, FEDERATED_LEARNING)
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
