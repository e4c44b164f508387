"""Stored resources in the pure core: a Model, a joint-inference service or a
federated-learning job is kept until deleted; its workers' reports are forwarded in Sedna's
shape when bound to it (kind, namespace and name; a worker named for it), refused otherwise;
what Sedna's GM takes in is judged as its Go handlers decode it."""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec
import pytest

from service import wire
from service.core import passthrough
from service.core.effects import Context, Forward, Outcome, Reject
from service.core.events import Event, OwnerReported, ResourceApplied, ResourceDeleted
from service.core.lifecycle import transition
from service.core.state import ModelInfo, ResourceState, State

JI = "helmet"
FL = "yolo"


def run(state: State | None, event: Event, now_ms: int = 1000) -> Outcome:
    return transition(state, event, Context(now_ms=now_ms, minute_of_day=0, event_id="e1"))


def stored(kind: str, name: str, digest: str = "d1") -> ResourceState:
    outcome = run(None, ResourceApplied(kind=kind, namespace="default", name=name, digest=digest))
    assert isinstance(outcome.state, ResourceState)
    return outcome.state


def owner_report(
    kind: str,
    name: str,
    worker: str,
    *,
    status: Literal["ready", "running", "completed", "failed", ""] = "running",
    channel: Literal["mqtt", "http"] = "mqtt",
    results: tuple[dict[str, Any], ...] = (),
    owner_info: bytes = b'{"inferenceNumber": 4}',
) -> OwnerReported:
    return OwnerReported(
        kind=kind, namespace="default", name=name, worker=worker,
        phase="inference" if kind == "jointinference" else "train", status=status,
        results=results, owner_info=owner_info, channel=channel,
    )  # fmt: skip


def forwarded(outcome: Outcome) -> wire.ReportStatus:
    [forward] = [e for e in outcome.effects if isinstance(e, Forward)]
    return forward.status


def test_a_resource_is_stored_kept_on_an_identical_resend_updated_and_deleted() -> None:
    model = ModelInfo(url="/models/m.pb", format="pb", devices=("Ascend310",))
    created = run(None, ResourceApplied(kind="model", namespace="default", name="m", digest="a",
                                        model=model))  # fmt: skip
    assert isinstance(created.state, ResourceState) and created.state.model == model
    assert created.notes == ("model stored",)
    again = run(created.state, ResourceApplied(kind="model", namespace="default", name="m",
                                               digest="a", model=model))  # fmt: skip
    assert again.verdict == "ignored" and again.state == created.state
    moved = msgspec.structs.replace(model, url="/models/m2.pb")
    updated = run(created.state, ResourceApplied(kind="model", namespace="default", name="m",
                                                 digest="b", model=moved))  # fmt: skip
    assert isinstance(updated.state, ResourceState) and updated.state.model == moved
    deleted = run(updated.state, ResourceDeleted(kind="model", namespace="default", name="m"))
    assert deleted.state is None and deleted.notes == ("model deleted",)


def test_a_joint_inference_report_is_forwarded_with_its_owner_info_only() -> None:
    state = stored("jointinference", JI)
    outcome = run(state, owner_report("jointinference", JI, f"{JI}-deployment-edge-7d9f-x2k4p",
                                      status=""), now_ms=5000)  # fmt: skip
    status = forwarded(outcome)
    assert json.loads(wire.encode(status)) == {
        "phase": "inference", "status": "", "output": {"ownerInfo": {"inferenceNumber": 4}},
    }  # fmt: skip
    assert isinstance(outcome.state, ResourceState)
    assert (outcome.state.reports, outcome.state.last_report) == (1, "inference/-")
    assert outcome.state.last_report_ms == 5000


def test_a_federated_learning_report_is_forwarded_with_its_results_as_models() -> None:
    results = ({"format": "pb", "url": "/model/a.pb", "extra": [1]},)
    outcome = run(stored("federatedlearning", FL),
                  owner_report("federatedlearning", FL, f"{FL}-trainworker-0", results=results,
                               status="completed"))  # fmt: skip
    assert json.loads(wire.encode(forwarded(outcome))) == {
        "phase": "train", "status": "completed",
        "output": {"models": [{"format": "pb", "url": "/model/a.pb", "extra": [1]}],
                   "ownerInfo": {"inferenceNumber": 4}},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("state_kind", "report_kind"),
    [(None, "jointinference"), ("federatedlearning", "jointinference"),
     ("model", "federatedlearning")],
)  # fmt: skip
def test_a_report_for_an_unknown_owner_is_refused(state_kind: str | None, report_kind: str) -> None:
    name = JI if report_kind == "jointinference" else FL
    state = None if state_kind is None else stored(state_kind, name)
    worker = f"{name}-edge-1" if report_kind == "jointinference" else f"{name}-train-1"
    outcome = run(state, owner_report(report_kind, name, worker))
    assert outcome.verdict == "rejected"
    rejection = outcome.rejection
    assert rejection is not None and rejection.code == "unknown_job"
    noun = "joint inference service" if report_kind == "jointinference" else "federated"
    assert rejection.reason.startswith(f"unknown {noun}")
    assert not [e for e in outcome.effects if isinstance(e, Forward)]


@pytest.mark.parametrize(
    ("kind", "worker", "channel", "bound"),
    [
        ("jointinference", f"{JI}-deployment-edge-7d9f8c6b5-x2k4p", "mqtt", True),
        ("jointinference", f"{JI}-edge-1", "mqtt", True),
        ("jointinference", f"{JI}-cloud-a", "mqtt", True),
        ("jointinference", "edgeworker-x7k2p", "http", True),
        ("jointinference", "edgeworker-x7k2p", "mqtt", False),
        ("jointinference", f"{JI}-train-1", "mqtt", False),
        ("jointinference", f"{JI}x-edge-1", "mqtt", False),
        ("jointinference", "other-edge-1", "http", False),
        ("federatedlearning", f"{FL}-aggworker", "mqtt", True),
        ("federatedlearning", f"{FL}-trainworker-0", "mqtt", True),
        ("federatedlearning", "trainworker-q9z3m", "http", True),
        ("federatedlearning", "aggworker-q9z3m", "http", True),
        ("federatedlearning", "trainworker-q9z3m", "mqtt", False),
        ("federatedlearning", f"{FL}-edge-1", "mqtt", False),
        ("federatedlearning", f"{FL}-aggworker2", "mqtt", False),
    ],
)  # fmt: skip
def test_a_report_binds_to_a_worker_named_for_its_owner(
    kind: str, worker: str, channel: Literal["mqtt", "http"], bound: bool
) -> None:
    name = JI if kind == "jointinference" else FL
    outcome = run(stored(kind, name), owner_report(kind, name, worker, channel=channel))
    if bound:
        assert outcome.verdict == "applied" and forwarded(outcome)
        return
    rejection = outcome.rejection
    assert isinstance(rejection, Reject) and rejection.code == "foreign_worker"
    assert f"worker {worker!r} may not report for" in rejection.reason
    assert f"'{name}-" in rejection.reason, "the reason says how its workers are named"


def status(models: list[dict[str, Any]] | None, owner_info: object) -> wire.ReportStatus:
    raw = msgspec.Raw(json.dumps(owner_info).encode())
    output = wire.ReportOutput(models=models, owner_info=raw)
    return wire.ReportStatus(phase="train", status="running", output=output)


def test_the_gm_takes_every_joint_inference_report() -> None:
    assert passthrough.gm_accepts("jointinference", status(None, {"anything": ["goes"]}))


@pytest.mark.parametrize(
    ("models", "owner_info", "accepted"),
    [
        ([{"format": "pb", "url": "/m", "metrics": {"loss": [0.4]}}],
         {"currentRound": 2, "updateTime": "t", "sampleCount": 9}, True),
        ([], {}, True),
        ([{"URL": "/m", "classes": ["a", None], "history_metric": 0.5,
           "current_metric": {"m": {"acc": 0.9}}, "number_of_model": 3, "future": {}}],
         {"CurrentRound": None}, True),
        ([], {"currentRound": "2"}, False),
        ([], {"currentround": 1.5}, False),
        ([], {"updateTime": 5}, False),
        ([{"url": 5}], {}, False),
        ([{"metrics": [1]}], {}, False),
        ([{"classes": "a"}], {}, False),
        ([{"history_metric": 1e39}], {}, False),
        ([{"number_of_model": True}], {}, False),
        ([{"current_metric": {"m": {"acc": "x"}}}], {}, False),
        ([], [1], False),
    ],
)  # fmt: skip
def test_the_gm_takes_a_federated_learning_report_its_go_types_decode(
    models: list[dict[str, Any]], owner_info: object, accepted: bool
) -> None:
    assert passthrough.gm_accepts("federatedlearning", status(models, owner_info)) is accepted
