"""One kind vocabulary: every spelling a user types maps to one wire kind and one store kind."""

from __future__ import annotations

import pytest

from service import keys, wire
from service.cli import manifests
from service.cli.manifests import delete_envelope


@pytest.mark.parametrize(
    ("typed", "wire", "store"),
    [("dataset", "dataset", keys.DATASET_KIND), ("DS", "dataset", keys.DATASET_KIND),
     ("datasets", "dataset", keys.DATASET_KIND),
     ("LifelongLearningJob", "lifelonglearningjob", keys.JOB_KIND),
     ("lifelonglearningjobs", "lifelonglearningjob", keys.JOB_KIND),
     ("job", "lifelonglearningjob", keys.JOB_KIND), ("jobs", "lifelonglearningjob", keys.JOB_KIND),
     ("llj", "lifelonglearningjob", keys.JOB_KIND),
     ("ij", "incrementallearningjob", keys.JOB_KIND),
     ("ilj", "incrementallearningjob", keys.JOB_KIND),
     ("IncrementalLearningJobs", "incrementallearningjob", keys.JOB_KIND),
     ("models", "model", keys.MODEL_KIND), ("Model", "model", keys.MODEL_KIND),
     ("ji", "jointinferenceservice", keys.JOINT_INFERENCE_KIND),
     ("JointInferenceServices", "jointinferenceservice", keys.JOINT_INFERENCE_KIND),
     ("fl", "federatedlearningjob", keys.FEDERATED_LEARNING_KIND),
     ("federatedlearningjob", "federatedlearningjob", keys.FEDERATED_LEARNING_KIND)],
)  # fmt: skip
def test_every_alias_names_one_kind(typed: str, wire: str, store: str) -> None:
    kind = manifests.kind_named(typed)
    assert kind is not None
    assert (kind.wire, kind.store) == (wire, store)
    assert manifests.kind_of_wire(wire) is kind


def test_unknown_names_are_no_kind() -> None:
    assert manifests.kind_named("pods") is None
    with pytest.raises(ValueError, match="not a wire kind"):
        manifests.kind_of_wire("job")  # a store kind, not a wire kind


def test_wire_kinds_are_what_the_controller_decodes() -> None:
    decoded = {
        type(wire.decode_envelope(delete_envelope(k.wire, "ns", "x"))) for k in manifests.KINDS
    }
    assert decoded == {wire.DatasetDelete, wire.JobDelete, wire.ResourceDelete}
    assert {k.title for k in manifests.KINDS} == {
        "Dataset", "LifelongLearningJob", "IncrementalLearningJob", "Model",
        "JointInferenceService", "FederatedLearningJob",
    }  # fmt: skip
