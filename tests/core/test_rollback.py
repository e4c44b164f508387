"""Rollbacks in the pure core: which version, the copy, the refusals (and why), the record,
and a deploy copy that waits for a rollback's."""

from __future__ import annotations

import msgspec
import pytest

from service.core.effects import CopyModel, Publish, RecordRound, Refused, Reject
from service.core.events import ModelCopied, RollbackRequested
from service.core.rounds import ModelDigest
from service.wire import Condition
from tests.core.driver import JOB, NS, Driver, content, report
from tests.core.test_deploy_gate import (
    deploy_round,
    eval_report,
    gated,
    results,
    to_eval,
)

GATE = Condition(operator=">", threshold=0.0, metric="accuracy_delta[0]")


def rollback(d: Driver, version: int | None = None) -> tuple[object, ...]:
    return d.apply(RollbackRequested(namespace=NS, name=JOB, version=version))


def rollback_copied(d: Driver, version: int, error: str | None = None) -> tuple[object, ...]:
    return d.apply(
        ModelCopied(namespace=NS, name=JOB, version=version, error=error, rollback=True)
    )


def three_deployed(gate: Condition | None = None) -> Driver:
    """Rounds 1, 2 and 3 deployed, each with its own model file."""
    d = gated(gate, check_period_s=1)
    for version in (1, 2, 3):
        d.now_ms += 1000
        to_eval(d, version * 10)
        accuracy = 0.5 + version / 10
        rs = results(accuracy, accuracy - 0.1) if version > 1 else results(accuracy)
        rs[0]["url"] = f"/output/train/{version}/model.json"
        d.apply(eval_report(d, rs))
        d.copied()
    assert d.job.deployed is not None and d.job.deployed.version == 3
    d.effects.clear()
    return d


def refusal(effects: tuple[object, ...]) -> str:
    [reject] = [e for e in effects if isinstance(e, Reject)]
    assert reject.code == "rollback_refused"
    return reject.reason


def test_rollback_defaults_to_the_previously_deployed_version() -> None:
    d = three_deployed()
    before = d.job
    effects = rollback(d)
    [copy] = [e for e in effects if isinstance(e, CopyModel)]
    assert copy.rollback and copy.version == 2
    assert (copy.src_url, copy.dst_url) == (
        "/output/train/2/model.json", "/output/deploy/index.pkl"
    )
    assert d.job.rollback is not None and d.job.rollback.version == 2
    assert d.job.deployed == before.deployed, "nothing changes until the copy is done"
    d.now_ms += 50
    effects = rollback_copied(d, 2)
    [ready] = [content(e) for e in effects if isinstance(e, Publish)]
    assert ready == {
        "phase": "deploy", "status": "ready",
        "reason": "rolled back from version 3 to version 2",
        "input": {"models": [{"format": "json", "url": "/output/train/2/model.json"}]},
        "rollback": {"toVersion": 2, "fromVersion": 3},
    }  # fmt: skip
    assert d.job.deployed is not None and d.job.deployed.version == 2
    assert d.job.deployed.metrics == {"accuracy": (0.7,)}
    assert [dep.version for dep in d.job.deployments] == [1, 3]
    assert d.job.rollback is None
    [record] = [e.record for e in effects if isinstance(e, RecordRound)]
    assert (record.kind, record.version, record.outcome, record.deployed_version) == (
        "rollback", 2, "rolled_back", 3
    )
    assert record.ended_ms == (record.deploy_started_ms or 0) + 50
    # the previously deployed version is now 3: a second default rollback undoes the first
    rollback(d)
    assert d.job.rollback is not None and d.job.rollback.version == 3


def test_rollback_to_a_named_version() -> None:
    d = three_deployed()
    rollback(d, 1)
    rollback_copied(d, 1)
    assert d.job.deployed is not None and d.job.deployed.version == 1
    assert [dep.version for dep in d.job.deployments] == [2, 3]


@pytest.mark.parametrize(
    ("version", "words"),
    [
        (3, "version 3 is deployed already"),
        (7, "version 7 was not deployed recently (it can restore: 2, 1)"),
    ],
)
def test_a_version_it_cannot_restore_is_refused(version: int, words: str) -> None:
    d = three_deployed()
    before = d.state
    reason = refusal(rollback(d, version))
    assert reason == f"rollback of job {NS}/{JOB} refused: {words}"
    assert d.state == before
    assert not d.of(CopyModel)


def test_nothing_to_roll_back_to() -> None:
    d = gated()
    assert refusal(rollback(d)).endswith("nothing has been deployed yet")
    deploy_round(d, 10, 0.7)
    only = "version 1 is the only one deployed so far: no earlier one"
    assert refusal(rollback(d)).endswith(only)


def test_a_rollback_of_an_unknown_job_is_refused() -> None:
    d = Driver()
    [reject] = [e for e in rollback(d) if isinstance(e, Reject)]
    assert reject.code == "unknown_job"
    assert reject.reason == f"rollback of job {NS}/{JOB} refused: unknown job {NS}/{JOB}"
    assert d.state is None


def test_a_missing_model_file_refuses_the_rollback_after_all() -> None:
    d = three_deployed()
    rollback(d, 1)
    error = "copying model /output/train/1/model.json ... failed: model ... does not exist"
    effects = rollback_copied(d, 1, error)
    [refused] = [e for e in effects if isinstance(e, Refused)]
    assert refused.code == "rollback_refused"
    assert refused.reason == f"rollback of job {NS}/{JOB} to version 1 refused: {error}"
    assert refused.subject == '{"job": "default/job-a", "version": 1}'
    assert not [e for e in effects if isinstance(e, Publish)], "nothing was deployed"
    assert d.job.deployed is not None and d.job.deployed.version == 3
    assert d.job.rollback is None
    [record] = [e.record for e in effects if isinstance(e, RecordRound)]
    assert (record.outcome, record.reason) == ("refused", error)


def test_rollback_is_refused_while_a_deploy_copy_is_in_flight() -> None:
    d = three_deployed()
    to_eval(d, 40)
    d.apply(eval_report(d, results(0.95)))
    assert d.job.step == "copying"
    reason = refusal(rollback(d))
    assert reason.endswith("round 4's deploy copy is in flight; try again once it is done")


def test_rollback_is_refused_while_another_rollback_copies() -> None:
    d = three_deployed()
    rollback(d)
    assert refusal(rollback(d, 1)).endswith("the rollback to version 2 is still copying")


def test_rollback_is_refused_while_a_gated_eval_compares_with_the_deployed_model() -> None:
    d = three_deployed(GATE)
    to_eval(d, 40)
    assert refusal(rollback(d)).endswith(
        "round 4 is in eval, comparing its model with the deployed version 3; try again "
        "after its deploy decision"
    )


def test_rollback_runs_beside_a_round_in_train_and_an_ungated_eval() -> None:
    d = three_deployed()
    d.dataset(40)
    assert (d.job.phase, d.job.step) == ("train", "preparing")
    assert not [e for e in rollback(d) if isinstance(e, Reject)]
    rollback_copied(d, 2)
    d.written("train")
    d.apply(report("train", "completed", "/output/train/4/model.json"))
    d.written("eval")
    assert not [e for e in rollback(d) if isinstance(e, Reject)]  # no gate: eval is safe


def test_a_deploy_copy_due_during_a_rollback_waits_for_it() -> None:
    d = three_deployed()
    d.dataset(40)
    d.written("train")
    d.apply(report("train", "completed", "/output/train/4/model.json"))
    d.written("eval")
    rollback(d)
    d.effects.clear()
    d.apply(eval_report(d, results(0.95)))
    assert (d.job.phase, d.job.step) == ("deploy", "waiting")
    assert not d.of(CopyModel), "never two copies to the deploy file at once"
    assert refusal(rollback(d, 1)).endswith("the rollback to version 2 is still copying")
    effects = rollback_copied(d, 2)
    [copy] = [e for e in effects if isinstance(e, CopyModel)]
    assert (copy.version, copy.rollback) == (4, False)
    assert d.job.step == "copying"
    d.copied()
    assert d.job.deployed is not None and d.job.deployed.version == 4
    assert [dep.version for dep in d.job.deployments] == [1, 3, 2]


def test_a_gated_round_compared_with_a_rollback_that_failed_is_held_back() -> None:
    d = three_deployed(GATE)
    d.dataset(40)
    rollback(d)  # in train: allowed; the eval then compares with version 2
    d.written("train")
    d.apply(report("train", "completed", "/output/train/4/model.json"))
    d.written("eval")
    assert d.job.current is not None and d.job.current.deployed_version == 2
    d.apply(eval_report(d, results(0.95, 0.7)))
    assert (d.job.phase, d.job.step) == ("deploy", "waiting")
    d.effects.clear()
    effects = rollback_copied(d, 2, "model gone")
    assert not [e for e in effects if isinstance(e, CopyModel)]
    held = [content(e) for e in effects if isinstance(e, Publish)][-1]
    assert held["status"] == "completed"
    assert "the rollback to version 2 it was compared with failed" in held["reason"]
    assert d.job.deployed is not None and d.job.deployed.version == 3
    assert (d.job.phase, d.job.step) == ("train", "waiting")


def test_a_gated_round_whose_deployed_model_changed_meanwhile_is_held_back() -> None:
    d = three_deployed(GATE)
    d.dataset(40)
    d.written("train")
    d.apply(report("train", "completed", "/output/train/4/model.json"))
    d.written("eval")  # compares with version 3
    d.state = msgspec.structs.replace(d.job, deployed=d.job.deployments[-1])  # changed
    d.apply(eval_report(d, results(0.95, 0.7)))
    assert d.job.step == "waiting"
    assert d.job.current is None
    assert "the deployed model changed during the eval" in d.notes()[-1]


def test_a_stale_rollback_copy_result_changes_nothing() -> None:
    d = three_deployed()
    before = d.state
    effects = rollback_copied(d, 2)
    assert d.state == before
    assert not [e for e in effects if isinstance(e, Publish | RecordRound)]


def test_each_deployment_keeps_what_its_copy_read_and_a_rollback_expects_it() -> None:
    """The copy checks the file against it before replacing the deploy file: a rollback to a
    file changed since its deploy is refused (by the copy, `tests/adapters/test_blobs.py`)."""
    d = three_deployed()
    assert d.job.deployed is not None and d.job.deployed.digest == ModelDigest(
        size=3, sha256=f"{3:064x}"
    )
    assert [dep.digest for dep in d.job.deployments] == [
        ModelDigest(size=v, sha256=f"{v:064x}") for v in (1, 2)
    ]
    [copy] = [e for e in rollback(d, 1) if isinstance(e, CopyModel)]
    assert copy.expect == ModelDigest(size=1, sha256=f"{1:064x}")
    rollback_copied(d, 1)
    assert d.job.deployed is not None and d.job.deployed.version == 1
    assert d.job.deployed.digest == copy.expect
