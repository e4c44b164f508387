"""Crash safety and replicas, against real `lifelong serve` subprocesses.

What these prove, from the outside only (MQTT, files, Redis keys, logs):

- a SIGKILL between any two steps of a round loses nothing and applies nothing twice: the
  restarted controller finishes the round, and every upstream message exists once (duplicates
  only as re-sends under the same `header.id`);
- two replicas split the jobs, each event applied by exactly one of them, and the survivor of a
  SIGKILL takes the dead one's shards (how soon is `make bench`'s figure 6.failover);
- SIGTERM is graceful: exit 0, a retained `offline` presence, leases released at once, so the
  successor takes every shard in its first lease round;
- a replica frozen past its lease (a zombie) writes nothing stale after it wakes, and rejoins.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
import redis
from paho.mqtt.enums import CallbackAPIVersion

from service.core.state import JobState, decode_state
from service.keys import NUM_SHARDS, Keys, shard_of
from tests import harness
from tests.harness import NODE, NS, PREFIX, Cloud, Controller, append_lines, lines, model_file
from tests.stack import Stack
from tests.wait import wait_until

DATASET = "lifelong-dataset"
KEYS = Keys("lifelong")


# ---------------------------------------------------------------- helpers
@pytest.fixture
def stack(stack: Stack) -> Iterator[Stack]:
    """The shared stack, whose leftover controllers are SIGKILLed rather than stopped: a
    graceful stop costs ~2 s each, and here only test 3 is about stopping gracefully."""
    yield stack
    for controller in stack.controllers:
        controller.kill()


def readyz(controller: Controller) -> str:
    """The /readyz detail line (`mqtt=.. redis=.. shards=N ingress=..`)."""
    return controller.get("/readyz", timeout_s=1)[1]


def holds_ingress(controller: Controller) -> bool:
    """Holding the MQTT-ingress lease with its client connected (`held` in older builds)."""
    return re.search(r"ingress=(held|up)\b", readyz(controller)) is not None


def shards_held(controller: Controller) -> int:
    match = re.search(r"shards=(\d+)", readyz(controller))
    return int(match.group(1)) if match else -1


def applied_jobs(controller: Controller) -> set[str]:
    """Jobs this replica applied an event for (the runtime logs one line per event)."""
    return set(re.findall(rf"job={NS}/(\S+) event=\w+ outcome=applied", controller.log()))


def lease_holder(store: redis.Redis, rkey: str) -> str | None:
    raw = store.get(KEYS.lease(shard_of(rkey)))
    return None if raw is None else raw.decode().rsplit(":", 1)[0]


def all_held_by(store: redis.Redis, replica: str) -> bool:
    """Every shard's lease and the MQTT-ingress lease are ``replica``'s, in Redis."""
    leases = [KEYS.lease(shard) for shard in range(NUM_SHARDS)] + [KEYS.ingress_lease()]
    return all(
        raw is not None and raw.decode().rsplit(":", 1)[0] == replica
        for raw in store.mget(leases)
    )


def ready_ids(cloud: Cloud, job: str, phase: str, suffix: str = "") -> set[str]:
    """Distinct ids of `phase` ready messages (for one version when `suffix` ends outputDir)."""
    return {
        m["header"]["id"]
        for m in cloud.upstream(job)
        if m["content"].get("phase") == phase
        and m["content"].get("status") == "ready"
        and m["content"].get("input", {}).get("outputDir", "").endswith(suffix)
    }


def forwarded(cloud: Cloud, job: str) -> set[tuple[str, str]]:
    return {
        (m["content"]["phase"], m["content"]["status"])
        for m in cloud.upstream(job)
        if "output" in m["content"]
    }


def retained_presence(port: int, replica: str) -> dict[str, Any]:
    """What a newcomer sees on the replica's presence topic: the retained message."""
    got: list[dict[str, Any]] = []
    arrived = threading.Event()

    def on_message(_c: paho.Client, _u: Any, msg: paho.MQTTMessage) -> None:
        got.append({"retain": msg.retain, **json.loads(msg.payload)})
        arrived.set()

    client = paho.Client(
        CallbackAPIVersion.VERSION2, client_id=f"probe-{time.time_ns()}", protocol=paho.MQTTv5
    )
    client.on_message = on_message
    client.on_connect = lambda c, *_: c.subscribe(f"{PREFIX}/{NODE}/controllers/{replica}", 1)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert arrived.wait(5), f"no retained presence for {replica}"
    finally:
        harness.stop_paho(client)
    return got[0]


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


# ---------------------------------------------------------------- one job's round, step by step
@dataclass
class Round:
    """Drives one job through round 1 (and the start of round 2) as cloud + workers would."""

    stack: Stack
    job: str
    data: Path
    out: Path

    @classmethod
    def make(cls, stack: Stack, job: str, data: Path) -> Round:
        out = stack.workdir / "out" / job
        out.mkdir(parents=True)
        return cls(stack, job, data, out)

    @property
    def cloud(self) -> Cloud:
        return self.stack.cloud

    def model(self, kind: str, body: bytes) -> str:
        path = self.out / kind / "1" / "model.pkl"
        return model_file(path, body)

    def insert(self) -> None:
        self.cloud.insert_job(self.job, DATASET, self.out)

    def wait_train_ready(self, timeout_s: float = 20) -> None:
        ready = self.cloud.wait_status(self.job, "train", "ready", timeout_s)
        assert ready["content"]["input"]["outputDir"] == f"{self.out}/train/1"

    def report_train_running(self) -> None:
        self.cloud.report(self.job, "train", "running")

    def report_train_completed(self) -> None:
        self.cloud.report(self.job, "train", "completed", self.model("train", b"trained"))

    def wait_eval_ready(self, timeout_s: float = 20) -> None:
        ready = self.cloud.wait_status(self.job, "eval", "ready", timeout_s)
        assert ready["content"]["input"]["models"] == [
            {"format": "pkl", "url": f"{self.out}/train/1/model.pkl"}
        ]
        assert ready["content"]["input"]["outputDir"] == f"{self.out}/eval/1"

    def report_eval_completed(self) -> None:
        self.cloud.report(
            self.job, "eval", "completed", self.model("eval", b"evaluated " + self.job.encode())
        )

    def wait_deploy_ready(self, timeout_s: float = 20) -> None:
        ready = self.cloud.wait_status(self.job, "deploy", "ready", timeout_s)
        assert ready["content"]["input"]["models"] == [
            {"format": "pkl", "url": f"{self.out}/eval/1/model.pkl"}
        ]
        deployed = self.out / "deploy" / "index.pkl"
        assert deployed.read_bytes() == b"evaluated " + self.job.encode()

    def assert_round_one(self) -> None:
        """Exactly one distinct id per lifecycle step of round 1; the files hold the samples."""
        assert len(ready_ids(self.cloud, self.job, "train", "/train/1")) == 1
        assert len(ready_ids(self.cloud, self.job, "eval", "/eval/1")) == 1
        assert len(ready_ids(self.cloud, self.job, "deploy")) == 1
        assert read_lines(self.out / "data/train/1/data.txt") == lines(0, 8)
        assert read_lines(self.out / "data/eval/1/data.txt") == lines(8, 10)


def two_replicas(stack: Stack) -> tuple[Controller, Controller]:
    """r1 taking in the downstream, then r2, once they split the shards 8/8."""
    r1 = stack.serving("r1")
    r2 = stack.controller("r2")
    wait_until(
        lambda: shards_held(r1) == shards_held(r2) == NUM_SHARDS // 2, 10, "an 8/8 shard split"
    )
    return r1, r2


def wait_round_two(rnd: Round) -> None:
    """Grow the dataset; round 2 trains exactly the new train share."""
    before = len(rnd.cloud.upstream(rnd.job))
    append_lines(rnd.data, lines(10, 20))

    def round_two() -> dict[str, Any] | None:
        return next(
            (m for m in rnd.cloud.upstream(rnd.job)[before:]
             if (m["content"].get("phase"), m["content"].get("status")) == ("train", "ready")
             and m["content"]["input"]["outputDir"] == f"{rnd.out}/train/2"),
            None,
        )  # fmt: skip

    ready = rnd.cloud.wait_for(round_two, 20, "round 2's train ready")
    assert read_lines(Path(ready["content"]["input"]["dataURL"])) == lines(10, 18)
    # anything else since is a message the crashed replica had published and a successor
    # sent again (its acknowledgement not yet recorded): the same id as the original
    upstream = rnd.cloud.upstream(rnd.job)
    earlier = {m["header"]["id"] for m in upstream[:before]}
    again = [m for m in upstream[before:] if m is not ready and m["content"].get("input")]
    assert all(m["header"]["id"] in earlier for m in again if m["content"]["phase"] == "train"
               and m["content"]["input"]["outputDir"] != f"{rnd.out}/train/2"), again  # fmt: skip


# ---------------------------------------------------------------- 1. SIGKILL at every step
STEPS = [
    "inserted",
    "train_ready",
    "train_running",
    "train_completed",
    "eval_ready",
    "eval_completed",
    "deploy_ready",
]
REPORT_STEPS = {"train_running", "train_completed", "eval_completed"}


def run_step(rnd: Round, step: str) -> None:
    if step == "inserted":
        rnd.cloud.insert_dataset(DATASET, rnd.data)
        rnd.insert()
    else:
        getattr(rnd, ("report_" if step in REPORT_STEPS else "wait_") + step)()


@pytest.mark.parametrize(
    ("kill_after", "successor"),
    [
        ("inserted", "r1"),
        ("train_ready", "r2"),
        ("train_running", "r1"),
        ("train_completed", "r2"),
        ("eval_ready", "r1"),
        ("eval_completed", "r2"),
    ],
)
def test_sigkill_between_steps_then_restart(
    stack: Stack, kill_after: str, successor: str
) -> None:
    data = stack.samples()
    rnd = Round.make(stack, "crash-job", data)
    first = stack.serving("r1")

    at = STEPS.index(kill_after)
    for step in STEPS[: at + 1]:
        run_step(rnd, step)
    first.kill()

    remaining = STEPS[at + 1 :]
    if remaining[0] in REPORT_STEPS:
        # no controller runs: the broker keeps it in the ingress session for the next holder
        run_step(rnd, remaining.pop(0))
    second = stack.controller(successor)
    for step in remaining:
        run_step(rnd, step)

    wait_round_two(rnd)
    rnd.assert_round_one()
    assert len(ready_ids(stack.cloud, rnd.job, "train", "/train/2")) == 1
    assert forwarded(stack.cloud, rnd.job) == {
        ("train", "running"),
        ("train", "completed"),
        ("eval", "completed"),
    }
    assert {10, 20} <= set(stack.cloud.samples(DATASET))
    stack.cloud.assert_each_message_once()
    assert stack.cloud.errors() == []
    # the successor takes the ingress lease once the killed one's lapses, which may come
    # after round two is done (when no report had to wait in the session for it)
    resumed = "as lifelong-edge-node-ingress (MQTTv5, session present: True)"
    wait_until(lambda: resumed in second.log(), 20, "the successor to resume the ingress session")


# ---------------------------------------------------------------- 2. two replicas, 20 jobs
def test_two_replicas_share_twenty_jobs_and_survive_a_sigkill(stack: Stack) -> None:
    cloud = stack.cloud
    data = stack.samples()
    r1, r2 = two_replicas(stack)

    rounds = [Round.make(stack, f"job-{i:02d}", data) for i in range(20)]
    cloud.insert_dataset(DATASET, data)
    for rnd in rounds:
        rnd.insert()
    for rnd in rounds:
        rnd.wait_train_ready()

    by_r1, by_r2 = applied_jobs(r1), applied_jobs(r2)
    assert by_r1 and by_r2, "both replicas did work"
    assert by_r1.isdisjoint(by_r2), f"a job was processed by both: {by_r1 & by_r2}"
    assert by_r1 | by_r2 == {rnd.job for rnd in rounds}

    # r1 dies mid-way; its jobs' reports go out while nobody owns their shards
    r1.kill()
    for rnd in rounds:
        rnd.report_train_running()
        rnd.report_train_completed()
    wait_until(lambda: shards_held(r2) == NUM_SHARDS, 20, "r2 taking every shard")
    wait_until(lambda: holds_ingress(r2), 10, "r2 taking the ingress lease")
    for rnd in rounds:
        rnd.wait_eval_ready()
    for rnd in rounds:
        rnd.report_eval_completed()
    for rnd in rounds:
        rnd.wait_deploy_ready()

    for rnd in rounds:
        rnd.assert_round_one()
        assert forwarded(cloud, rnd.job) == {
            ("train", "running"),
            ("train", "completed"),
            ("eval", "completed"),
        }
    assert applied_jobs(r2) >= by_r1, "the survivor finished the dead replica's jobs"
    cloud.assert_each_message_once()
    assert cloud.errors() == []


# ---------------------------------------------------------------- 3. graceful SIGTERM
def test_sigterm_is_graceful_and_hands_over_at_once(stack: Stack) -> None:
    data = stack.samples()
    rnd = Round.make(stack, "graceful-job", data)
    r1 = stack.serving("r1")
    for step in STEPS:
        run_step(rnd, step)

    assert r1.stop() == 0
    store = redis.Redis.from_url(stack.redis_url)
    try:
        held = [KEYS.lease(s) for s in range(NUM_SHARDS) if store.exists(KEYS.lease(s))]
        assert held == [], "shard leases released on SIGTERM"
        assert not store.exists(KEYS.ingress_lease()), "ingress lease released on SIGTERM"
    finally:
        store.close()
    presence = retained_presence(stack.broker.port, "r1")
    assert presence["retain"] and presence["state"] == "offline"
    assert presence["replica"] == "r1"
    presences = [m for t, m in stack.cloud.messages if t.endswith("/controllers/r1")]
    assert presences[-1]["state"] == "offline"

    # the successor finds every lease free and r1 gone from the live set: all 16 at once, in
    # its first lease round (one that waited for a lease, or counted r1 as live, would take
    # its shards over several rounds)
    r2 = stack.controller("r2")
    assert shards_held(r2) == NUM_SHARDS
    acquired = re.findall(r"acquired shards (\S+)", r2.log())
    assert acquired[:1] == [",".join(map(str, range(NUM_SHARDS)))], acquired
    wait_until(lambda: holds_ingress(r2), 10, "the ingress lease")
    wait_round_two(rnd)
    rnd.assert_round_one()
    stack.cloud.assert_each_message_once()
    assert stack.cloud.errors() == []


# ---------------------------------------------------------------- 4. a frozen replica (zombie)
def pick_job_owned_by(store: redis.Redis, replica: str) -> str:
    for i in range(100):
        job = f"zombie-job-{i}"
        if lease_holder(store, f"job:{NS}/{job}") == replica:
            return job
    raise AssertionError(f"{replica} holds no shard")


def test_frozen_replica_past_its_lease_writes_nothing_stale(stack: Stack) -> None:
    cloud = stack.cloud
    data = stack.samples()
    r1, r2 = two_replicas(stack)
    store = redis.Redis.from_url(stack.redis_url)
    try:
        job = pick_job_owned_by(store, "r1")
        rnd = Round.make(stack, job, data)
        for step in ("inserted", "train_ready", "train_running", "train_completed"):
            run_step(rnd, step)
        assert holds_ingress(r1)

        # r1 stops mid-flight, right after the train worker's completion was sent
        r1.freeze()
        try:
            rnd.wait_eval_ready()
            rnd.report_eval_completed()
            rnd.wait_deploy_ready(timeout_s=10)
            assert lease_holder(store, f"job:{NS}/{job}") == "r2"
            # r1's leases have all run out and r2 took every one: r1 wakes up fenced
            wait_until(lambda: all_held_by(store, "r2"), 15, "r2 holding every lease")
        finally:
            r1.thaw()

        # r1 wakes up believing it owns half the shards: it must be fenced, then rejoin
        wait_until(lambda: shards_held(r1) == NUM_SHARDS // 2, 10, "r1 rejoining (8 shards)")
        wait_until(lambda: shards_held(r2) == NUM_SHARDS // 2, 5, "r2 giving 8 shards back")
        wait_round_two(rnd)
        state = decode_state(store.get(KEYS.state(f"job:{NS}/{job}")) or b"")
        assert isinstance(state, JobState)
        assert (state.phase, state.version) == ("train", 2)
    finally:
        store.close()

    rnd.assert_round_one()
    assert len(ready_ids(cloud, job, "train", "/train/2")) == 1
    assert not ready_ids(cloud, job, "eval", "/eval/2"), "nothing beyond round 2's train"
    assert (rnd.out / "deploy" / "index.pkl").read_bytes() == b"evaluated " + job.encode()
    assert applied_jobs(r2) >= {job}, "r2 advanced the job while r1 was frozen"
    cloud.assert_each_message_once()
    assert cloud.errors() == []
    for controller in (r1, r2):
        log = controller.log()
        assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    assert "MQTT ingress lease lost" in r1.log(), "r1 noticed, on waking, that it was replaced"
    assert readyz(r1).startswith("mqtt=up redis=up") and "ingress=standby" in readyz(r1)
    assert holds_ingress(r2)
