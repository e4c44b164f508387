"""Every kind Sedna's local controller manages, on real servers: Models, joint-inference
services and federated-learning jobs arrive over the GM link or MQTT, survive a restart and
go on delete; their workers' reports, over HTTP and MQTT, reach the MQTT upstream topic and
the GM in Sedna's shape (the GM only what its handlers take in); other owner kinds and
reports for unknown services are refused with the reason; the CLI shows them."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.runner import cli_env, run_cli, wait_rows
from tests.gm_standin import GmStandIn
from tests.harness import NODE, Controller
from tests.sedna_kinds import (
    FEDERATED_LEARNING,
    FEDERATED_LEARNING_YAML,
    FL_REPORT,
    JI_REPORT,
    JOINT_INFERENCE,
    JOINT_INFERENCE_YAML,
    MODEL_YAML,
    MODELS,
)
from tests.stack import Stack
from tests.wait import wait_until

JI = JOINT_INFERENCE["metadata"]["name"]
FL = FEDERATED_LEARNING["metadata"]["name"]


@pytest.fixture
def gm() -> Iterator[GmStandIn]:
    with GmStandIn() as standin:
        yield standin


def forwarded(stack: Stack, name: str) -> list[dict[str, Any]]:
    """Upstream envelopes of `name` on the MQTT upstream topic."""
    return stack.cloud.upstream(name)


def at_gm(gm: GmStandIn, name: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    statuses = gm.statuses(NODE)
    return [(h, json.loads(c or b"null")) for h, c in statuses if h["resourceName"] == name]


def test_reports_reach_mqtt_and_the_gm_in_sednas_shape(stack: Stack, gm: GmStandIn) -> None:
    controller = stack.controller("r1", env={"LIFELONG_GM_ADDRESS": gm.address})
    for resource in (*MODELS, JOINT_INFERENCE, FEDERATED_LEARNING):
        # Sedna's GM sends objects as Kubernetes keeps them: with their namespace
        gm.insert(NODE, {**resource, "metadata": {"namespace": "default", **resource["metadata"]}})
    env = cli_env(stack.mqtt_url, stack.redis_url)
    wait_rows(env, "fl", lambda rows: [r["name"] for r in rows] == [FL])

    # joint inference over HTTP, as Sedna's library reports it: no status, counts in ownerInfo
    assert controller.post_worker(JI_REPORT["name"], JI_REPORT) == (
        200, {"status": 200, "message": "OK"},
    )  # fmt: skip
    [envelope] = stack.cloud.wait_for(lambda: forwarded(stack, JI), 20, "the JI report upstream")
    assert {k: v for k, v in envelope["header"].items() if k != "id"} == {
        "namespace": "default", "resourceKind": "jointinferenceservice", "resourceName": JI,
        "operation": "status",
    }  # fmt: skip
    assert envelope["content"] == {
        "phase": "inference", "status": "", "output": {"ownerInfo": JI_REPORT["ownerInfo"]},
    }  # fmt: skip
    wait_until(lambda: at_gm(gm, JI), 20, "the JI report at the GM")
    assert at_gm(gm, JI)[0][1] == envelope["content"]

    # federated learning over MQTT, from Sedna's training pod: a report the GM cannot decode
    # (currentRound as text) goes to MQTT only; the good one after it reaches both
    bad = copy.deepcopy(FL_REPORT)
    bad["name"] = f"{FL}-trainworker-0"
    bad["ownerInfo"] = {**bad["ownerInfo"], "currentRound": "1", "sampleCount": 1}
    good = {**bad, "ownerInfo": FL_REPORT["ownerInfo"]}
    stack.cloud.publish_report(bad)
    stack.cloud.publish_report(good)
    stack.cloud.wait_for(lambda: len(forwarded(stack, FL)) == 2, 20, "both FL reports upstream")
    contents = [m["content"] for m in forwarded(stack, FL)]
    assert contents == [
        {"phase": "train", "status": "running",
         "output": {"models": FL_REPORT["results"], "ownerInfo": report["ownerInfo"]}}
        for report in (bad, good)
    ]  # fmt: skip
    assert {m["header"]["resourceKind"] for m in forwarded(stack, FL)} == {"federatedlearningjob"}
    wait_until(lambda: at_gm(gm, FL), 20, "the good FL report at the GM")
    assert [c for _, c in at_gm(gm, FL)] == [contents[1]], "the GM gets only what it decodes"

    # refusals, each with its reason
    refusals = {
        "reidjob": "must be one of 'lifelonglearningjob', 'incrementallearningjob'",
        "incrementallearningjob": "unknown job default/",  # routed to jobs, of which none
    }
    for owner_kind, reason in refusals.items():
        body = {**JI_REPORT, "ownerKind": owner_kind, "kind": "train", "status": "running"}
        code, answer = controller.post_worker(JI_REPORT["name"], body)
        assert code == 400 and reason in answer["message"], answer
    code, answer = controller.post_worker(JI_REPORT["name"], {**JI_REPORT, "ownerName": "nope"})
    assert code == 400 and "unknown joint inference service default/nope" in answer["message"]
    stack.cloud.publish_report({**FL_REPORT, "name": f"{FL}-trainworker-1", "ownerKind": "reidjob"})
    stack.cloud.wait_for(
        lambda: any("must be one of" in e["reason"] for e in stack.cloud.errors()), 20,
        "the MQTT refusal on the errors topic",
    )  # fmt: skip
    assert len(forwarded(stack, FL)) == 2


def apply(env: dict[str, str], tmp_path: Path, name: str, text: str, *flags: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    validated = run_cli(env, "validate", "-f", str(path))
    assert validated.returncode == 0, validated.stdout + validated.stderr
    applied = run_cli(env, "apply", "-f", str(path), *flags)
    assert applied.returncode == 0, applied.stderr


def test_stored_resources_survive_a_restart_and_go_on_delete(
    stack: Stack, tmp_path: Path
) -> None:
    controller = stack.controller("r1")
    env = cli_env(stack.mqtt_url, stack.redis_url)
    apply(env, tmp_path, "models.yaml", MODEL_YAML)
    apply(env, tmp_path, "ji.yaml", JOINT_INFERENCE_YAML)
    # its second training worker's node has no controller here: sent anyway
    apply(env, tmp_path, "fl.yaml", FEDERATED_LEARNING_YAML, "--force")
    wait_rows(env, "ji", lambda rows: [r["name"] for r in rows] == [JI])
    wait_rows(env, "fl", lambda rows: [r["name"] for r in rows] == [FL])

    controller.stop()
    restarted: Controller = stack.controller("r2")
    models = wait_rows(env, "models", lambda rows: len(rows) == 2)
    assert {(r["name"], r["format"], r["url"], r["devices"]) for r in models} == {
        ("little-model", "pb", "/data/little-model/yolov3_resnet18.pb", None),
        ("fl-model", "pb", "/model", "Ascend310,Ascend710"),
    }
    assert restarted.post_worker(JI_REPORT["name"], JI_REPORT)[0] == 200
    [row] = wait_rows(env, "ji", lambda rows: rows and rows[0]["reports"] == 1)
    assert row["last report"].startswith("inference/- ")
    described = run_cli(env, "describe", "ji", JI)
    assert described.returncode == 0, described.stderr
    for line in ("Edge worker:", "model little-model; node edge-node; image kubeedge/sedna-"
                 "example-joint-inference-helmet-detection-little:v0.3.0",
                 "Hard examples:  IBT", "Reports:        1 forwarded upstream"):  # fmt: skip
        assert line in described.stdout, described.stdout
    described = run_cli(env, "describe", "fl", FL)
    assert "Training:       dataset coco-dataset-2; node edge-node-2" in described.stdout
    described = run_cli(env, "describe", "model", "fl-model")
    assert "Devices:        Ascend310, Ascend710" in described.stdout, described.stdout

    deleted = run_cli(env, "delete", "ji", JI)
    assert deleted.returncode == 0, deleted.stderr
    wait_rows(env, "ji", lambda rows: rows == [])
    code, answer = restarted.post_worker(JI_REPORT["name"], JI_REPORT)
    assert code == 400 and f"unknown joint inference service default/{JI}" in answer["message"]
    assert len(wait_rows(env, "fl", lambda rows: len(rows) == 1)) == 1, "the others stay"
