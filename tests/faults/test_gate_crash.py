"""A SIGKILL-like death between the deploy gate's decision and the copy it calls for.

Replica A brings a gated job through round 1 (deployed) to round 2's eval and stops
gracefully; replica B starts with `process-before-effects` armed and dies right after it
committed round 2's gate decision (the deploy copy's intent with it, or none when the model
was held back), before the copy started or the decision was published; replica C takes over.
Then: a model that passed the gate is in the deploy file exactly once (one deploy ready, one
round record), and a held-back one never reaches it (one deploy completed, the old bytes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.core.rounds import decode_rounds
from service.failpoints import EXIT_CODE
from service.keys import dataset_key, job_key
from tests.faults.conftest import (
    QUIET_POLLS,
    QUIET_TRIGGER,
    Probe,
    distinct_upstream,
    probe_of,
    wait_exit,
)
from tests.harness import NS, Cloud, append_lines, job_resource, lines, model_file
from tests.stack import Stack
from tests.wait import wait_until

JOB = "gated-crash"
DATASET = "gated-crash-data"
CONDITION = {"operator": ">", "threshold": 0, "metric": "accuracy_delta[0]"}


def model(out: Path, version: int) -> str:
    path = out / "train" / str(version) / "model.bin"
    return model_file(path, b"model %d " % version * 1000)


def report(cloud: Cloud, kind: str, version: int, results: list[dict[str, Any]]) -> None:
    worker = f"{JOB}-{kind}-{version}"
    message = {
        "name": worker, "namespace": NS, "ownerName": JOB, "ownerKind": "LifelongLearningJob",
        "kind": kind, "status": "completed", "results": results,
    }  # fmt: skip
    cloud.publish(f"sedna/edge-node/workers/{worker}/info", json.dumps(message).encode())


def scored(url: str, accuracy: float) -> dict[str, Any]:
    return {"format": "bin", "url": url, "metrics": {"accuracy": [accuracy]}}


def decisions(cloud: Cloud) -> list[dict[str, Any]]:
    """The job's deploy decisions, once each (copies of a message share its id)."""
    return [m["content"] for m in distinct_upstream(cloud, JOB).values()
            if m["content"].get("phase") == "deploy"]  # fmt: skip


def wait_ready(cloud: Cloud, phase: str, version: int) -> None:
    """Wait for round `version`'s `phase` ready (its input's outputDir names the round)."""
    def found() -> bool:
        return any(
            (m["content"].get("phase"), m["content"]["status"]) == (phase, "ready")
            and m["content"]["input"]["outputDir"].endswith(f"/{phase}/{version}")
            for m in cloud.upstream(JOB)
        )

    wait_until(found, 20, f"round {version}'s {phase} ready", detail=cloud.summary)


def round_to_eval(stack: Stack, out: Path, version: int) -> None:
    wait_ready(stack.cloud, "train", version)
    report(stack.cloud, "train", version, [{"format": "bin", "url": model(out, version)}])
    wait_ready(stack.cloud, "eval", version)


@pytest.mark.parametrize(("accuracy", "deploys"), [(0.9, True), (0.5, False)],
                         ids=["passes-the-gate", "held-back"])  # fmt: skip
def test_a_death_between_gate_and_copy(stack: Stack, accuracy: float, deploys: bool) -> None:
    cloud = stack.cloud
    data = stack.samples()
    out = stack.workdir / "out"
    deploy_file = out / "deploy" / "index.pkl"
    job = job_resource(JOB, DATASET, str(out), trigger=QUIET_TRIGGER)
    job["spec"]["deploySpec"]["trigger"] = {"condition": CONDITION}

    # A: round 1 deployed, round 2 evaluated against it; the dataset then deleted, so that
    # no poll is due when B starts (its only commit must be the gate's decision)
    a = stack.controller("a")
    cloud.insert_dataset(DATASET, data)
    cloud.downstream("lifelonglearningjob", "insert", job)
    round_to_eval(stack, out, 1)
    report(cloud, "eval", 1, [scored(str(out / "train/1/model.bin"), 0.7)])
    wait_until(lambda: len(decisions(cloud)) == 1, 20, "round 1's deploy", detail=cloud.summary)
    append_lines(data, lines(10, 20))
    round_to_eval(stack, out, 2)
    cloud.downstream("dataset", "delete", None, name=DATASET)
    with probe_of(stack.redis_url) as probe:
        gone = dataset_key(NS, DATASET)
        wait_until(
            lambda: probe.store.states.load([gone])[gone] is None, 10, "A to apply the delete"
        )
        wait_until(lambda: _settled(probe), 10, "A to settle")
        assert a.stop() == 0
        assert deploy_file.read_bytes() == b"model 1 " * 1000

        # B: dies once it committed round 2's gate decision (the copy as an intent for the
        # pool, not done inline before the commit)
        armed = {
            **QUIET_POLLS, "LIFELONG_FAILPOINTS": "process-before-effects",
            "LIFELONG_INLINE_EFFECT_BYTES": "0",
        }  # fmt: skip
        b = stack.controller("b", env=armed)
        new, old = str(out / "train/2/model.bin"), str(out / "train/1/model.bin")
        report(cloud, "eval", 2, [scored(new, accuracy), scored(old, 0.7)])
        assert wait_exit(b) == EXIT_CODE
        assert "failpoint process-before-effects" in b.log()
        assert deploy_file.read_bytes() == b"model 1 " * 1000, "the copy had not started"
        state = probe.job(JOB)
        assert (state.phase, state.step) == (("deploy", "copying") if deploys
                                             else ("train", "waiting"))  # fmt: skip

        # C: runs the committed copy intent (or has none to run) and publishes the decision
        stack.controller("c", env=QUIET_POLLS)
        wait_until(lambda: len(decisions(cloud)) == 2, 20, "round 2's decision",
                   detail=cloud.summary)  # fmt: skip
        wait_until(lambda: _settled(probe), 10, "C to settle")
        state = probe.job(JOB)
        rounds = decode_rounds(probe.store.states.rounds(job_key(NS, JOB)))
    second = decisions(cloud)[1]
    assert second["gate"]["holds"] is deploys
    if deploys:
        assert second["status"] == "ready"
        assert deploy_file.read_bytes() == b"model 2 " * 1000
        assert state.deployed is not None and state.deployed.version == 2
    else:
        assert second["status"] == "completed"
        assert deploy_file.read_bytes() == b"model 1 " * 1000
        assert state.deployed is not None and state.deployed.version == 1
    assert [(r.version, r.outcome) for r in rounds] == [
        (1, "deployed"), (2, "deployed" if deploys else "held_back")
    ]
    assert not list(deploy_file.parent.glob(".*.tmp"))


def _settled(probe: Probe) -> bool:
    return probe.outbox_depth() == 0 and probe.pending_effects() == 0
