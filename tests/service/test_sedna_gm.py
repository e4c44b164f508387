"""The controller under a GM that behaves as Sedna's does (tests/sedna_gm): its conditions
drive every round, its copies lag, its pods run real workers that post to the controller.

Every scenario ends with the same checks: the rounds happened (no stall), every round's
conditions are in order with one pod per Ready, and the GM refused no status.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.runner import cli_env, run_cli
from tests.harness import NODE, Controller, append_lines, dataset_resource, job_resource, lines
from tests.sedna_gm.gm import SednaGm
from tests.sedna_gm.pods import Behaviour, PodInfo
from tests.sedna_gm.resources import il_job_resource, model_resource
from tests.service.test_gm import readyz
from tests.stack import Stack
from tests.wait import wait_until

pytestmark = [
    pytest.mark.timeout(600),
]

JOB = "sedna-job"
DATASET = "sedna-data"
OTHER_NODE = "edge-node-b"
GATE = '{"condition":{"operator":">","threshold":0.01,"metric":"accuracy_delta[0]"}}'

GmFactory = Callable[..., SednaGm]


@pytest.fixture
def sedna_gm() -> Iterator[GmFactory]:
    """Makes started GMs (options as `SednaGm` takes them); closes them at the end."""
    with contextlib.ExitStack() as closing:

        def make(**options: Any) -> SednaGm:
            gm = SednaGm(**options)
            closing.callback(gm.close)
            gm.start()
            return gm

        yield make


def url(controller: Controller) -> str:
    return f"http://127.0.0.1:{controller.http_port}"


def linked(stack: Stack, gm: SednaGm, name: str, node: str = NODE, **env: str) -> Controller:
    """A controller of ``node`` linked to the GM; its pods' reports go to it."""
    controller = stack.controller(
        name, env={"LIFELONG_GM_ADDRESS": gm.address, "LIFELONG_NODE_NAME": node, **env}
    )
    gm.lc_servers.setdefault(node, url(controller))
    return controller


class Feeder:
    """Grows the dataset by 5 samples each time the job finishes a round (or fails one), so
    every round's trigger has new samples to train on. With ``rounds``, only after a round
    ended and only enough for that many rounds: the job then stays between rounds."""

    def __init__(self, gm: SednaGm, path: Path, rounds: int | None = None) -> None:
        self._gm = gm
        self._path = path
        self._rounds = rounds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        fed, total = 0, 10
        while not self._stop.wait(0.05):
            conditions = self._gm.conditions(JOB)
            ends = conditions.count(("Train", "Waiting"))
            if self._rounds is not None:  # only once a round ended (the first Waiting starts
                # round 1, which may not have read the first samples yet), rounds - 1 times
                ends = min(ends - 1, self._rounds - 1)
            if ends > fed:
                append_lines(self._path, lines(total, total + 5))
                fed, total = ends, total + 5

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def apply(gm: SednaGm, stack: Stack, *, train_node: str = NODE,
          annotations: dict[str, str] | None = None,
          restart_policy: str = "", rounds: int | None = None) -> tuple[Path, Feeder]:  # fmt: skip
    """The dataset (10 samples, on NODE) and the job applied through the GM: the outputDir
    and the feeder that grows the dataset round by round."""
    data = stack.samples()
    out = stack.workdir / "out"
    gm.apply(dataset_resource(DATASET, str(data)))
    job = job_resource(JOB, DATASET, str(out))
    for spec in ("trainSpec", "evalSpec"):
        template = job["spec"][spec]["template"]["spec"]
        template["nodeName"] = train_node
        if restart_policy:
            template["restartPolicy"] = restart_policy
    if annotations:
        job["metadata"]["annotations"] = annotations
    gm.apply(job)
    return out, Feeder(gm, data, rounds)


def check(gm: SednaGm, rounds: int, timeout_s: float = 240) -> None:
    gm.wait_rounds(JOB, rounds, timeout_s)
    assert gm.order_problems(JOB) == [], described(gm)
    assert gm.refused == [], "the GM refused statuses"


def described(gm: SednaGm) -> str:
    """The job's conditions, one a line, with who made each (the GM, or a status "reported
    by lc") and when; and its pods."""
    conditions = gm.job(JOB)["status"]["conditions"] or []
    return "\n".join(
        [f"{i + 1}: {c['stage']}/{c['type']} {c['lastTransitionTime']} {c['message']!r}"
         for i, c in enumerate(conditions)]
        + [f"pod {p.name} ({p.type}): {p.phase}" for p in gm.pods(JOB)]
    )  # fmt: skip


def running(gm: SednaGm, stage: str, after_rounds: int) -> Callable[[], bool]:
    return lambda: (
        gm.rounds(JOB) >= after_rounds and gm.conditions(JOB)[-1:] == [(stage, "Running")]
    )


def test_thirty_rounds_under_a_lagging_gm(stack: Stack, sedna_gm: GmFactory) -> None:
    gm = sedna_gm(lag=(0.0, 0.05))
    linked(stack, gm, "r1")
    _, feeder = apply(gm, stack)
    try:
        check(gm, 30, timeout_s=500)
    finally:
        feeder.close()
    pods = gm.pods(JOB)
    assert len([p for p in pods if p.type == "train"]) in (30, 31)
    assert all(r.answer == 200 for p in pods for r in p.reports)


def test_a_failed_pod_fails_its_round_and_the_next_is_tried(
    stack: Stack, sedna_gm: GmFactory
) -> None:
    def behaviour(info: PodInfo) -> Behaviour:
        if info.type == "train" and info.number in (2, 3):
            return Behaviour(exit_code=1, report_failed=info.number == 2)
        return Behaviour()

    gm = sedna_gm(behaviour=behaviour)
    linked(stack, gm, "r1")
    _, feeder = apply(gm, stack, restart_policy="Never")
    try:
        check(gm, 3)
    finally:
        feeder.close()
    # pod 2's worker reports `failed` (forwarded: one Failed condition) and its pod fails
    # (the GM's own); pod 3 fails without a report: at least one Failed for each
    assert gm.conditions(JOB).count(("Train", "Failed")) >= 2
    failed = [p.phase for p in gm.pods(JOB) if p.type == "train"][1:3]
    assert failed == ["Failed", "Failed"]


def test_a_pod_ending_well_without_a_report_fails_its_round_and_the_next_goes_on(
    stack: Stack, sedna_gm: GmFactory
) -> None:
    """Round 1's train worker ends well but reports no model: the GM moves on to
    Eval/Waiting from its pod, the job waits `LIFELONG_GM_RESEND_SECONDS` for a report, then
    fails the round where the GM is, and the next round goes through."""

    def behaviour(info: PodInfo) -> Behaviour:
        return Behaviour(report_completed=(info.type, info.number) != ("train", 1))

    gm = sedna_gm(behaviour=behaviour)
    linked(stack, gm, "r1", LIFELONG_GM_RESEND_SECONDS="1")
    _, feeder = apply(gm, stack)
    try:
        check(gm, 1)
    finally:
        feeder.close()
    conditions = gm.conditions(JOB)
    failed = conditions.index(("Eval", "Failed"))
    assert conditions[failed - 1 : failed + 2] == [
        ("Eval", "Waiting"), ("Eval", "Failed"), ("Train", "Waiting")
    ]  # fmt: skip
    reasons = [m["content"].get("reason", "") for m in stack.cloud.upstream(JOB)]
    assert any("no worker reported the round's model within 1 s" in r for r in reasons)


def test_a_gm_restart_mid_round(stack: Stack, sedna_gm: GmFactory) -> None:
    gm = sedna_gm(lag=(0.0, 0.05), behaviour=lambda _i: Behaviour(run_s=1.0))
    linked(stack, gm, "r1")
    _, feeder = apply(gm, stack)
    try:
        gm.wait(running(gm, "Train", 1), 120, "round 2's training")
        gm.restart()
        gm.wait(running(gm, "Eval", 2), 120, "round 3's evaluation")
        gm.restart()
        check(gm, 4)
    finally:
        feeder.close()


def test_the_link_holder_killed_mid_round(stack: Stack, sedna_gm: GmFactory) -> None:
    gm = sedna_gm(lag=(0.0, 0.05), behaviour=lambda _i: Behaviour(run_s=1.0))
    first, second = linked(stack, gm, "r1"), linked(stack, gm, "r2")
    wait_until(lambda: "gm=up" in readyz(first) + readyz(second), 15, "a link")
    holder, other = (first, second) if "gm=up" in readyz(first) else (second, first)
    gm.lc_servers[NODE] = url(other)  # the pods' reports go to the replica that survives
    _, feeder = apply(gm, stack)
    try:
        gm.wait(running(gm, "Train", 1), 120, "round 2's training")
        holder.kill()
        check(gm, 3)
    finally:
        feeder.close()
    assert "gm=up" in readyz(other)


def test_workers_on_a_second_node(stack: Stack, sedna_gm: GmFactory) -> None:
    # The job reaches the worker node only once the GM saw the pod run (Train/Running): a
    # worker's first `running` report may come before it, and its work lasts until the
    # node's controller took one (a report refused for an unknown job is not sent again).
    gm = sedna_gm(lag=(0.0, 0.05), behaviour=lambda _i: Behaviour(outlasts_delivery=True))
    linked(stack, gm, "home", NODE, LIFELONG_KEY_PREFIX="home")
    linked(stack, gm, "worker", OTHER_NODE, LIFELONG_KEY_PREFIX="worker")
    _, feeder = apply(gm, stack, train_node=OTHER_NODE)
    try:
        check(gm, 3)
    finally:
        feeder.close()
    assert {p.node for p in gm.pods(JOB) if p.type != "inference"} == {OTHER_NODE}
    assert gm.job(JOB)["metadata"]["annotations"]["sedna.io/Train"] == OTHER_NODE
    to_worker = [s.operation for s in gm.sent if s.node == OTHER_NODE and s.name == JOB]
    assert "insert" in to_worker and "delete" in to_worker
    done = [r for p in gm.pods(JOB) for r in p.reports if r.message["status"] == "completed"]
    assert done and all(r.answer == 200 for r in done)


def test_the_gate_by_annotation_holds_back_a_worse_model(stack: Stack, sedna_gm: GmFactory) -> None:
    per_round: dict[int, tuple[dict[str, list[float]], ...]] = {
        1: ({"accuracy": [0.8]},),
        2: ({"accuracy": [0.85]}, {"accuracy": [0.8]}),  # better by 0.05: deployed
        3: ({"accuracy": [0.7]}, {"accuracy": [0.85]}),  # worse: held back
    }

    def behaviour(info: PodInfo) -> Behaviour:
        return Behaviour(metrics=per_round.get(info.number, ()) if info.type == "eval" else ())

    gm = sedna_gm(behaviour=behaviour)
    linked(stack, gm, "r1")
    out, feeder = apply(gm, stack, annotations={"lifelong.sedna.io/deploy-trigger": GATE})
    deployed = out / "deploy" / "index.pkl"
    try:
        check(gm, 2)
        second = deployed.read_bytes()
        check(gm, 3)
    finally:
        feeder.close()
    assert deployed.read_bytes() == second, "the deploy file is untouched"
    conditions = gm.conditions(JOB)
    last_deploy = conditions[len(conditions) - 1 - conditions[::-1].index(("Deploy", "Waiting")) :]
    assert last_deploy[:2] == [("Deploy", "Waiting"), ("Deploy", "Completed")]
    evals = [p for p in gm.pods(JOB) if p.type == "eval"]
    assert len(evals[2].env["MODEL_URLS"].split(";")) == 2, "eval is given both models"
    assert conditions.count(("Deploy", "Ready")) == 2, "two deploys, the third held back"
    # (the GM may restart the inference pod more than once per Deploy/Ready: a sync on a
    # copy still at Ready restarts it again; that is the GM's doing, not a second Ready)
    restarted = {p.ready_number for p in gm.pods(JOB) if p.type == "inference"}
    assert restarted == {1, 2}


def test_rounds_under_the_2021_routing(stack: Stack, sedna_gm: GmFactory) -> None:
    gm = sedna_gm(routing="2021", lag=(0.0, 0.05))
    linked(stack, gm, "r1")
    _, feeder = apply(gm, stack)
    try:
        check(gm, 3)
    finally:
        feeder.close()
    assert {s.node for s in gm.sent} == {NODE}


def test_a_rollback_between_rounds(stack: Stack, sedna_gm: GmFactory) -> None:
    """Two rounds deployed, then the job between rounds: a rollback copies round 1's model
    back at once, and its deploy `ready` goes to the GM, which shows Train/Waiting; the GM
    restarts the inference worker on it and the job waits for its next round."""
    gm = sedna_gm(lag=(0.0, 0.05))
    controller = linked(stack, gm, "r1")
    out, feeder = apply(gm, stack, rounds=2)
    deployed = out / "deploy" / "index.pkl"
    try:
        check(gm, 2)
        first = (out / "train" / "1" / "model.pkl").read_bytes()
        assert deployed.read_bytes() == (out / "train" / "2" / "model.pkl").read_bytes()
        between = len(gm.conditions(JOB))
        assert gm.conditions(JOB)[-1] == ("Train", "Waiting")
        rolled = run_cli(cli_env(stack.mqtt_url, stack.redis_url), "rollback", "job", JOB)
        assert rolled.returncode == 0, rolled.stderr
        gm.wait(
            lambda: (
                gm.conditions(JOB)[between:]
                == [("Deploy", "Ready"), ("Deploy", "Completed"), ("Train", "Waiting")]
            ),
            60,
            "the rollback's deploy through the GM",
            detail=lambda: str(gm.conditions(JOB)),
        )
    finally:
        feeder.close()
    assert deployed.read_bytes() == first, "round 1's model, byte for byte"
    ready = gm.job(JOB)["status"]["conditions"][between]
    assert ready["message"] == "reported by lc"
    assert json.loads(ready["data"])["input"]["models"][0]["url"].endswith("/train/1/model.pkl")
    assert gm.refused == []
    loaded = [p for p in gm.pods(JOB) if p.type == "inference" and p.ready_number == 3]
    assert loaded, "the GM restarted the inference worker for the rollback's Ready"
    assert "gm=up" in readyz(controller)


# ================================================================= incremental learning
IL_GATE = {"condition": {"operator": ">", "threshold": 0, "metric": "accuracy_delta[0]"}}
#: each round's eval: the new model's accuracy, then the compared one's (the deploy Model as
#: it is for round 1, then the deployed round's model): round 2's is worse and held back
IL_SCORES = {1: (0.7, 0.5), 2: (0.6, 0.7), 3: (0.9, 0.7)}


def apply_incremental(gm: SednaGm, stack: Stack, *, gate: dict[str, Any] | None = IL_GATE,
                      rounds: int = 3) -> tuple[Path, Path, Feeder]:  # fmt: skip
    """Models, the dataset (10 samples) and an IncrementalLearningJob with hot update applied
    through the GM: the deploy Model's file, the outputDir, the feeder."""
    models = stack.workdir / "models"
    models.mkdir()
    (models / "initial.pkl").write_bytes(b"the initial model")
    deploy = models / "deploy.pkl"
    deploy.write_bytes(b"the model served before any round")
    gm.apply(model_resource("initial-model", str(models / "initial.pkl")))
    gm.apply(model_resource("deploy-model", str(deploy)))
    data = stack.samples()
    out = stack.workdir / "out"
    gm.apply(dataset_resource(DATASET, str(data)))
    job = il_job_resource(JOB, DATASET, str(out), initial_model="initial-model",
                          deploy_model="deploy-model", node=NODE, hot_update=True)  # fmt: skip
    if gate is not None:
        job["spec"]["deploySpec"]["trigger"] = gate
    gm.apply(job)
    return deploy, out, Feeder(gm, data, rounds)


def il_behaviour(info: PodInfo) -> Behaviour:
    scores = IL_SCORES.get(info.number, (0.5, 0.5))
    metrics = tuple({"accuracy": [s]} for s in scores) if info.type == "eval" else ()
    return Behaviour(metrics=metrics)


def test_an_incremental_learning_job_through_sednas_gm(stack: Stack, sedna_gm: GmFactory) -> None:
    """Three rounds driven by the GM's conditions: round 1 trains from the initial Model,
    each later one from the last trained; the deploy trigger holds round 2 back; each deploy
    reaches the deploy Model's file and the inference worker through the hot-update config
    file, and the GM's Deploy/Running after it is released with a deploy `completed`."""
    gm = sedna_gm(lag=(0.0, 0.05), behaviour=il_behaviour,
                  hot_update_root=stack.workdir / "hot", hot_update_poll_s=0.05)  # fmt: skip
    linked(stack, gm, "r1")
    deploy, out, feeder = apply_incremental(gm, stack)
    try:
        check(gm, 3)
    finally:
        feeder.close()
    trains = [p for p in gm.pods(JOB) if p.type == "train"]
    assert [p.base_model for p in trains[:3]] == [
        b"the initial model",
        (out / "train" / "1" / "model.pkl").read_bytes(),
        (out / "train" / "2" / "model.pkl").read_bytes(),
    ], "round 1 trains from the initial Model, each later one from the last trained"
    third = (out / "train" / "3" / "model.pkl").read_bytes()
    assert deploy.read_bytes() == third
    config = json.loads(gm.hot_update_config(JOB).read_text())["model_config"]
    assert config["model_path"] == "/model-hot-update/model.pkl"
    (inference,) = [p for p in gm.pods(JOB) if p.type == "inference"]
    wait_until(lambda: inference.loaded[-1:] == [third], 30, "the hot update of round 3")
    first = (out / "train" / "1" / "model.pkl").read_bytes()
    assert first in inference.loaded, "round 1's model was hot-loaded"
    conditions = gm.conditions(JOB)
    released = [i for i, c in enumerate(conditions) if c == ("Deploy", "Running")]
    assert len(released) >= 2, "rounds 1 and 3 hot-updated"
    for i in released:
        assert ("Deploy", "Completed") in conditions[i + 1 :], "released by the controller"

    # a rollback from the cloud: round 1's model back in the deploy Model's file and, once
    # the GM shows the job between rounds, its deploy ready hot-updates the worker again
    between = len(gm.conditions(JOB))
    stack.cloud.downstream("incrementallearningjob", "rollback", None, name=JOB)
    gm.wait(lambda: gm.conditions(JOB)[-1:] == [("Train", "Waiting")]
            and ("Deploy", "Completed") in gm.conditions(JOB)[between:], 60,
            "the rollback's deploy stage through the GM")  # fmt: skip
    assert gm.conditions(JOB)[between] == ("Deploy", "Ready")
    assert deploy.read_bytes() == first
    wait_until(lambda: inference.loaded[-1:] == [first], 30, "the hot update of the rollback")
    assert gm.refused == []


def test_sednas_helmet_trigger_on_a_list_metric_holds_back_with_the_reason(
    stack: Stack, sedna_gm: GmFactory
) -> None:
    """The helmet-detection example's deploy trigger names `precision_delta`, a list: Sedna's
    own controller read it as 0; here the model is held back and the reason says why."""

    def precision(info: PodInfo) -> Behaviour:
        metrics = ({"precision": [0.9]}, {"precision": [0.5]}) if info.type == "eval" else ()
        return Behaviour(metrics=metrics)

    gm = sedna_gm(behaviour=precision, hot_update_root=stack.workdir / "hot")
    linked(stack, gm, "r1")
    deploy, _, feeder = apply_incremental(gm, stack, gate=None, rounds=1)
    try:
        check(gm, 1)
    finally:
        feeder.close()
    assert deploy.read_bytes() == b"the model served before any round"
    [held] = [
        m["content"]
        for m in stack.cloud.upstream(JOB)
        if (m["content"].get("phase"), m["content"]["status"]) == ("deploy", "completed")
    ]
    assert held["reason"] == (
        "held back by the deploy gate: precision of the new model is a list of values: the "
        "condition must name one, as precision[i] (a bare name is refused, never read as 0)"
    )
