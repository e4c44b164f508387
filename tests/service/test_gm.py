"""Sedna's GM as the only cloud peer: resources arrive over the websocket link, statuses go
back over it, through GM restarts and the death of the replica holding the link."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.runner import cli_env, run_cli
from tests.gm_standin import GmStandIn
from tests.harness import NODE, Controller, dataset_resource, job_resource, model_file
from tests.stack import Stack
from tests.wait import wait_until

JOB = "gm-job"
DATASET = "gm-dataset"


@pytest.fixture
def gm() -> Iterator[GmStandIn]:
    with GmStandIn() as standin:
        yield standin


def statuses(gm: GmStandIn) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Status frames the GM read from the node: header and decoded content."""
    return [(h, json.loads(c or b"null")) for h, c in gm.statuses(NODE)]


def phases(gm: GmStandIn) -> list[tuple[str, str]]:
    return [
        (c["phase"], c["status"])
        for h, c in statuses(gm)
        if h["resourceName"] == JOB and "input" in c
    ]


def mqtt_forwarded(stack: Stack) -> list[tuple[str, str]]:
    """Worker reports forwarded on the MQTT upstream topic: (phase, status)."""
    contents = [m["content"] for m in stack.cloud.upstream(JOB)]
    return [(c["phase"], c["status"]) for c in contents if "output" in c]


def wait_forwarded(gm: GmStandIn, phase: str, status: str) -> None:
    forwarded = lambda: [(c["phase"], c["status"]) for _, c in statuses(gm) if "output" in c]  # noqa: E731
    wait_until(lambda: (phase, status) in forwarded(), 20, f"{phase} {status} forwarded")


def wait_phase(gm: GmStandIn, phase: str, status: str = "ready", timeout_s: float = 20) -> None:
    wait_until(lambda: (phase, status) in phases(gm), timeout_s, f"{phase} {status} at the GM",
               detail=lambda: str(phases(gm)))  # fmt: skip


def readyz(controller: Controller) -> str:
    """The /readyz detail of a ready controller ("" while it is not ready)."""
    status, detail = controller.get("/readyz", timeout_s=2)
    return detail if status == 200 else ""


def linked(stack: Stack, gm: GmStandIn, name: str) -> Controller:
    return stack.controller(name, env={"LIFELONG_GM_ADDRESS": gm.address})


class Conditions:
    """The job's conditions as the GM keeps them; each `show` sends the GM's new copy."""

    def __init__(self, gm: GmStandIn, out: Path) -> None:
        self.gm = gm
        self.job = job_resource(JOB, DATASET, str(out))
        self.conditions: list[dict[str, str]] = []

    def show(self, stage: str, kind: str) -> None:
        """The GM's next copy: a status the controller reported is marked as the GM marks it;
        a Waiting is the GM's own."""
        condition = {"stage": stage, "type": kind, "status": "True"}
        if kind != "Waiting":
            condition["message"] = "reported by lc"
        self.conditions.append(condition)
        self.gm.insert(NODE, {**self.job, "status": {"conditions": list(self.conditions)}})


def start_round(stack: Stack, gm: GmStandIn) -> tuple[Path, Conditions]:
    """Dataset and job inserted by the GM, which shows Train/Waiting; returns the job's
    output dir and its conditions once train is ready."""
    data = stack.samples()
    out = stack.workdir / "out"
    gm.insert(NODE, dataset_resource(DATASET, str(data)))
    conditions = Conditions(gm, out)
    conditions.show("Train", "Waiting")
    wait_phase(gm, "train")
    conditions.show("Train", "Ready")
    return out, conditions


def model(out: Path, phase: str, version: int = 1) -> str:
    path = out / phase / str(version) / "model.pkl"
    return model_file(path, f"{phase} model".encode())


def on_to_eval(gm: GmStandIn, conditions: Conditions) -> None:
    """Train completed reaches the GM, which shows it; eval is then ready."""
    wait_forwarded(gm, "train", "completed")
    conditions.show("Train", "Completed")
    conditions.show("Eval", "Waiting")
    wait_phase(gm, "eval")


def on_to_deploy(stack: Stack, gm: GmStandIn, out: Path, conditions: Conditions) -> None:
    """The GM shows eval ready, the eval worker completes, and deploy is ready."""
    conditions.show("Eval", "Ready")
    stack.cloud.report(JOB, "eval", "completed", model(out, "eval"))
    wait_forwarded(gm, "eval", "completed")
    conditions.show("Eval", "Completed")
    conditions.show("Deploy", "Waiting")
    wait_phase(gm, "deploy")


def test_a_round_driven_only_by_the_gm(stack: Stack, gm: GmStandIn) -> None:
    controller = linked(stack, gm, "r1")
    out, conditions = start_round(stack, gm)
    assert gm.handshakes[0]["Node-Name"] == NODE
    header, content = next((h, c) for h, c in statuses(gm) if c.get("status") == "ready")
    assert header["resourceKind"] == "lifelonglearningjob" and header["operation"] == "status"
    assert header["id"], "the header keeps the upstream id"
    assert content["input"]["outputDir"] == f"{out}/train/1"
    wait_until(
        lambda: (
            {"numberOfSamples": 10}
            in [c for h, c in statuses(gm) if h["resourceKind"] == "dataset"]
        ),
        10,
        "the dataset's status at the GM",
    )

    stack.cloud.report(JOB, "train", "running")
    stack.cloud.report(JOB, "train", "completed", model(out, "train"))
    on_to_eval(gm, conditions)
    on_to_deploy(stack, gm, out, conditions)
    assert (out / "deploy" / "index.pkl").read_bytes() == b"eval model"
    assert "gm=up" in readyz(controller)
    forwarded = [(c["phase"], c["status"]) for _, c in statuses(gm) if "output" in c]
    assert forwarded == [("train", "completed"), ("eval", "completed")], "no running"
    assert ("train", "running") in mqtt_forwarded(stack), "running goes to MQTT only"
    ids = [h["id"] for h, _ in statuses(gm)]
    assert len(ids) == len(set(ids)), "each status once"
    assert stack.cloud.upstream(JOB), "the MQTT upstream topic gets them too"

    env = cli_env(stack.mqtt_url, stack.redis_url)
    described = run_cli(env, "describe", "job", JOB)
    assert described.returncode == 0, described.stderr
    link = next(line for line in described.stdout.splitlines() if line.startswith("GM link:"))
    assert "up for" in link and "held by r1" in link and gm.address in link
    listed = run_cli(env, "get", "jobs")
    assert "GM link:" in listed.stderr and JOB in listed.stdout


def test_statuses_wait_for_a_restarted_gm_and_go_in_order(stack: Stack, gm: GmStandIn) -> None:
    controller = linked(stack, gm, "r1")
    out, conditions = start_round(stack, gm)
    gm.stop()
    wait_until(lambda: "gm=up" not in readyz(controller), 10, "the link to notice")
    stack.cloud.report(JOB, "train", "completed", model(out, "train"))
    stack.cloud.wait_for(
        lambda: ("train", "completed") in mqtt_forwarded(stack), 20, "the forwarded completed"
    )  # while the GM is away
    gm.start()
    on_to_eval(gm, conditions)
    assert phases(gm) == [("train", "ready"), ("eval", "ready")]


def test_the_link_moves_with_its_holder_and_nothing_is_lost(stack: Stack, gm: GmStandIn) -> None:
    first = linked(stack, gm, "r1")
    second = linked(stack, gm, "r2")
    out, conditions = start_round(stack, gm)
    holder, other = (first, second) if "gm=up" in readyz(first) else (second, first)
    assert "gm=standby" in readyz(other), "one link per node"
    assert gm.connections(NODE) == 1
    holder.kill()
    stack.cloud.report(JOB, "train", "completed", model(out, "train"))
    wait_until(lambda: "gm=up" in readyz(other), 15, "the other replica to take the link")
    on_to_eval(gm, conditions)
    on_to_deploy(stack, gm, out, conditions)
    assert phases(gm)[-3:] == [("train", "ready"), ("eval", "ready"), ("deploy", "ready")]


def test_garbage_frames_are_rejected_and_the_link_stays(stack: Stack, gm: GmStandIn) -> None:
    controller = linked(stack, gm, "r1")
    wait_until(lambda: "gm=up" in readyz(controller), 10, "the link")
    gm.send_raw(NODE, "this is not json")
    gm.send_raw(NODE, json.dumps({"header": {"operation": "insert"}, "content": "!!"}))
    rejected = stack.cloud.wait_for(
        lambda: len(stack.cloud.errors()) >= 2 and stack.cloud.errors(), 15, "two rejections"
    )
    assert {r["topic"] for r in rejected} == {"gm"}
    assert base64.b64decode(rejected[0]["payload"]) == b"this is not json"
    assert "gm=up" in readyz(controller)
    start_round(stack, gm)  # and the link still takes good frames


def test_a_gm_that_sends_nothing_keeps_the_link_up(stack: Stack, gm: GmStandIn) -> None:
    controller = linked(stack, gm, "r1")
    wait_until(lambda: "gm=up" in readyz(controller), 10, "the link")
    connects = gm.connects(NODE)
    wait_until(lambda: len(controller.log()) > 0, 5, "a log")
    stack.controller("r2")  # time passes with activity elsewhere; the GM stays silent
    assert "gm=up" in readyz(controller) and gm.connects(NODE) == connects
