"""Several jobs through several rounds on a replicated Redis, and the checks that nothing was
lost or applied twice however often its master died.

`Fleet` drives jobs as the cloud and the workers would (MQTT only), round by round, with a
stream of worker reports each round; every report carries its job, round and sequence number
in `ownerInfo`, so each is a distinct message upstream. The checks read the upstream traffic
and the controllers' Redis (histories with the lease token of each commit).
"""

from __future__ import annotations

import contextlib
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from service.adapters.redis_store import RedisStore
from service.embedded.processes import Server
from service.history import decode_records
from service.keys import NUM_SHARDS, Keys, shard_of
from tests.faults.conftest import kind_of
from tests.harness import NS, Cloud, Controller, append_lines, lines, model_file, samples_file
from tests.wait import wait_until

DATASET = "ha-dataset"
LINES_PER_ROUND = 10
RUNNING_REPORTS = 3  # "running" reports per job and round, besides the two that move it on


@dataclass
class TopologyStack:
    """A broker, a Redis topology's URL, the cloud peer and controller replicas."""

    workdir: Path
    broker: Server
    redis_url: str
    cloud: Cloud
    controllers: dict[str, Controller] = field(default_factory=dict)

    @property
    def mqtt_url(self) -> str:
        return f"mqtt://127.0.0.1:{self.broker.port}"

    def start(self, name: str, env: dict[str, str] | None = None) -> Controller:
        """Start replica ``name`` (again, when it ran before: same id, new process)."""
        controller = Controller(
            self.workdir / "controllers", self.mqtt_url, self.redis_url, name=name, extra_env=env
        )
        self.controllers[name] = controller
        controller.start()
        controller.wait_ready(30)
        return controller

    def logs(self) -> str:
        return "\n".join(c.log() for c in self.controllers.values())


@contextlib.contextmanager
def topology_stack(tmp_path: Path, broker: Server, redis_url: str) -> Iterator[TopologyStack]:
    cloud = Cloud(broker.port, durable=True)
    stack = TopologyStack(tmp_path, broker, redis_url, cloud)
    try:
        yield stack
    finally:
        for controller in stack.controllers.values():
            controller.kill()
        cloud.close()


@contextlib.contextmanager
def fleet_on(
    tmp_path: Path, broker: Server, redis_url: str, jobs: int, replicas: int = 2
) -> Iterator[Fleet]:
    """`jobs` jobs inserted under `replicas` controller replicas (r1, r2, ...) on this Redis
    (any topology's URL)."""
    with topology_stack(tmp_path, broker, redis_url) as stack:
        for i in range(replicas):
            stack.start(f"r{i + 1}")
        yield Fleet.create(stack, jobs)


@dataclass
class Fleet:
    """``jobs`` jobs on one growing dataset, driven round by round."""

    stack: TopologyStack
    jobs: list[str]
    version: int = 0
    sent: Counter[str] = field(default_factory=Counter)  # reports accepted per job
    # reports refused (HTTP 503): not accepted, yet they may have been written and so be
    # applied, once; a worker would send them again
    refused: Counter[str] = field(default_factory=Counter)
    posted: Counter[str] = field(default_factory=Counter)  # running reports accepted over HTTP
    seq: int = 0

    @classmethod
    def create(cls, stack: TopologyStack, count: int) -> Fleet:
        fleet = cls(stack, [f"ha-job-{i}" for i in range(count)])
        samples_file(fleet.data, LINES_PER_ROUND)
        stack.cloud.insert_dataset(DATASET, fleet.data)
        for job in fleet.jobs:
            stack.cloud.insert_job(job, DATASET, fleet.out(job))
        return fleet

    @property
    def data(self) -> Path:
        return self.stack.workdir / "data" / "train.txt"

    def out(self, job: str) -> Path:
        return self.stack.workdir / "out" / job

    # -------------------------------------------------------------- one round, step by step
    def next_round(self, timeout_s: float = 60) -> None:
        """Wait for every job's train ready of the next version (growing the dataset first
        from the second round on)."""
        self.version += 1
        if self.version > 1:
            start = (self.version - 1) * LINES_PER_ROUND
            append_lines(self.data, lines(start, start + LINES_PER_ROUND))
        self.wait_ready("train", f"/train/{self.version}", timeout_s)

    def report(self, job: str, kind: str, status: str, models: list[str] | None = None) -> None:
        self.stack.cloud.publish_report(self._message(job, kind, status, models))
        self.sent[job] += 1

    def post_running(self, controller: Controller, job: str) -> int:
        """A train running report over HTTP; its status code (200: accepted)."""
        message = self._message(job, "train", "running", None)
        status, _ = controller.post_worker(str(message["name"]), message)
        if status == 200:
            self.sent[job] += 1
            self.posted[job] += 1
        else:
            self.refused[job] += 1
        return status

    def _message(
        self, job: str, kind: str, status: str, models: list[str] | None
    ) -> dict[str, Any]:
        self.seq += 1
        return {
            "name": f"{job}-{kind}-worker",
            "namespace": NS,
            "ownerName": job,
            "ownerKind": "LifelongLearningJob",
            "ownerInfo": {"kind": kind, "round": self.version, "seq": self.seq},
            "kind": kind,
            "status": status,
            "results": [
                {"format": "pkl", "url": url, "metrics": {"acc": 0.9}} for url in models or []
            ],
        }

    def model(self, job: str, kind: str) -> str:
        path = self.out(job) / kind / str(self.version) / "model.pkl"
        return model_file(path, f"{kind} model {job} v{self.version}".encode())

    def train_reports(self) -> None:
        """A stream of running reports, then train completed, for every job."""
        for _ in range(RUNNING_REPORTS):
            for job in self.jobs:
                self.report(job, "train", "running")
        for job in self.jobs:
            self.report(job, "train", "completed", [self.model(job, "train")])

    def eval_reports(self) -> None:
        for job in self.jobs:
            self.report(job, "eval", "completed", [self.model(job, "eval")])

    def wait_ready(self, phase: str, suffix: str, timeout_s: float = 60) -> None:
        cloud = self.stack.cloud
        cloud.wait_for(
            lambda: all(self._ready(job, phase, suffix) for job in self.jobs),
            timeout_s,
            f"{phase} ready of round {self.version} for every job",
        )

    def _ready(self, job: str, phase: str, suffix: str) -> bool:
        return any(
            m["content"].get("phase") == phase
            and m["content"].get("status") == "ready"
            and m["content"].get("input", {}).get("outputDir", "").endswith(suffix)
            for m in self.stack.cloud.upstream(job)
        )

    def reports_lost_with(self, master: Server, replica: Server) -> None:
        """This round's train reports taken in by `master` alone (its `replica` cut off, so
        none of them reaches it), then `master` SIGKILLed: the broker must deliver them
        again to whoever is promoted."""
        before = markers(master)
        with cut_off(replica, master):
            self.train_reports()
            reached(master, before)
            master.kill()

    def finish_and_check(self, redis_url: str) -> None:
        """Finish this round, run one more whole round, then every check of `check`."""
        self.finish_round()
        self.next_round()
        self.train_reports()
        self.finish_round()
        self.check(redis_url)

    def finish_round(self, timeout_s: float = 60) -> None:
        """From the train reports sent to the deploy of this round's model."""
        self.wait_ready("eval", f"/eval/{self.version}", timeout_s)
        self.eval_reports()
        self.wait_deployed(timeout_s)

    def wait_deployed(self, timeout_s: float = 60) -> None:
        def deployed() -> bool:
            return all(
                (self.out(job) / "deploy" / "index.pkl").exists()
                and (self.out(job) / "deploy" / "index.pkl").read_bytes()
                == f"eval model {job} v{self.version}".encode()
                and self._deploy_ready(job) >= self.version
                for job in self.jobs
            )

        self.stack.cloud.wait_for(deployed, timeout_s, f"round {self.version} deployed")

    def _deploy_ready(self, job: str) -> int:
        return len(
            {
                m["header"]["id"]
                for m in self.stack.cloud.upstream(job)
                if kind_of(m["content"]) == ("deploy", "ready", "input")
            }
        )

    # -------------------------------------------------------------- the checks
    def _drops(self) -> str:
        """The controllers' log lines about messages dropped or refused (for a failure)."""
        return "\n".join(
            f"{name}: {line}"
            for name, controller in self.stack.controllers.items()
            for line in controller.log().splitlines()
            if "dropped" in line or "refused" in line or "rejected" in line
        )

    def check(self, redis_url: str, *, report_refusals: bool = False) -> None:
        """Everything accepted was applied exactly once; every round completed; copies of a
        message share one id; no shard was committed to by two replicas under one token; and
        nothing was refused, or with `report_refusals` (a run where the intake retried appends
        whose fate it could not know) nothing but a worker's report."""
        self.stack.cloud.assert_each_message_once()
        for job in self.jobs:
            upstream = Counter(kind_of(m["content"]) for m in distinct(self.stack.cloud, job))
            rounds = self.version
            running = upstream.pop(("train", "running", "output"), 0)
            low = RUNNING_REPORTS * rounds + self.posted[job]
            assert low <= running <= low + self.refused[job], (
                f"{job}: {running} forwarded, {low} sent; what the controllers dropped or "
                f"refused:\n{self._drops()}"
            )
            assert upstream == Counter(
                {
                    ("train", "ready", "input"): rounds,
                    ("train", "completed", "output"): rounds,
                    ("eval", "ready", "input"): rounds,
                    ("eval", "completed", "output"): rounds,
                    ("deploy", "ready", "input"): rounds,
                }
            ), f"{job}: {sorted(upstream.items())}"
        store = RedisStore(redis_url, Keys(), socket_timeout_s=5.0)
        try:
            for job in self.jobs:
                records = decode_records(store.states.history(f"job:{NS}/{job}", 1000))
                reported = sum(1 for r in records if r.event == "WorkerReported")
                most = self.sent[job] + self.refused[job]
                assert self.sent[job] <= reported <= most, f"{job}: {reported} applied"
            assert_tokens_unique(store)
        finally:
            store.close()
        errors = self.stack.cloud.errors()
        if report_refusals:
            errors = [e for e in errors if "/workers/" not in e["topic"]]
        assert errors == [], errors


def distinct(cloud: Cloud, job: str) -> list[dict[str, Any]]:
    by_id: dict[str, dict[str, Any]] = {}
    for message in cloud.upstream(job):
        by_id.setdefault(message["header"]["id"], message)
    return list(by_id.values())


def assert_tokens_unique(store: RedisStore) -> None:
    """From every history record's lease token: each fence of a shard belongs to one replica,
    and a resource's commits never go back to an older fence."""
    holders: dict[tuple[int, int], set[str]] = defaultdict(set)
    for rkey in store.states.list_rkeys():
        fences = []
        for record in decode_records(store.states.history(rkey, 1000)):
            assert record.token, f"{rkey}: a history record without its token"
            replica, _, fence = record.token.rpartition(":")
            holders[(shard_of(rkey), int(fence))].add(replica)
            fences.append(int(fence))
        assert fences == sorted(fences), f"{rkey}: commits under older tokens: {fences}"
    shared = {k: v for k, v in holders.items() if len(v) > 1}
    assert not shared, f"one shard's token used by two replicas: {shared}"
    assert {shard for shard, _ in holders} <= set(range(NUM_SHARDS))


# ------------------------------------------------------------------ breaking replication


@contextlib.contextmanager
def cut_off(replica: Server, master: Server) -> Iterator[None]:
    """Freeze the replica and close its replication link: the master's later writes never
    reach it. Thawed on the way out (it then finds its master gone)."""
    replica.freeze()
    try:
        with redis.Redis(port=master.port) as raw:
            raw.client_kill_filter(_type="replica")
        yield
    finally:
        replica.thaw()


def markers(master: Server) -> int:
    """Messages the master took in recently (each leaves a dedupe marker for a minute)."""
    with redis.Redis(port=master.port) as raw:
        return sum(1 for _ in raw.scan_iter(match="lifelong:*:seen:*", count=1000))


def reached(master: Server, before: int) -> None:
    """Wait until the master took in one of the reports sent since it had ``before`` markers."""
    wait_until(lambda: markers(master) > before, 20, "a report to reach the master")


def replica_of(master: Server, nodes: list[Server]) -> Server:
    with redis.Redis(port=master.port, decode_responses=True) as raw:
        port = int(raw.info("replication")["slave0"]["port"])
    return next(n for n in nodes if n.port == port)
