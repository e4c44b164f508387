"""A whole-service test stack: a broker, a Redis, the cloud peer and controllers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from service.config import Config
from service.core.state import State, decode_state
from service.embedded.processes import Server
from service.keys import Keys
from service.worker import Worker, WorkerSettings
from tests.harness import (
    NODE,
    Cloud,
    Controller,
    samples_file,
    wait_ingress,
)


@dataclass
class Stack:
    workdir: Path
    broker: Server
    redis: Server
    cloud: Cloud
    controllers: list[Controller] = field(default_factory=list)

    @property
    def mqtt_url(self) -> str:
        return f"mqtt://127.0.0.1:{self.broker.port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis.port}/0"

    def controller(
        self, name: str = "r1", *, start: bool = True, env: dict[str, str] | None = None
    ) -> Controller:
        controller = Controller(
            self.workdir / "controllers", self.mqtt_url, self.redis_url, name=name, extra_env=env
        )
        self.controllers.append(controller)
        if start:
            controller.start()
            controller.wait_ready()
        return controller

    def serving(self, name: str = "r1", *, env: dict[str, str] | None = None) -> Controller:
        """A started controller, once it is proven to take in what the cloud sends."""
        controller = self.controller(name, env=env)
        wait_ingress(controller, self.cloud)
        return controller

    def samples(self, rows: int = 10, name: str = "train.txt") -> Path:
        """A txt dataset file of `rows` samples in the test's data folder."""
        return samples_file(self.workdir / "data" / name, rows)

    def stored_state(self, rkey: str) -> State:
        """The state the controllers keep in Redis for a resource key (there must be one)."""
        client = redis.Redis.from_url(self.redis_url)
        try:
            raw = client.get(Keys("lifelong").state(rkey))
        finally:
            client.close()
        assert raw is not None, f"no state stored for {rkey}"
        return decode_state(raw)

    @contextlib.contextmanager
    def runner(self, client_id: str, commands: dict[str, tuple[str, ...]]) -> Iterator[Worker]:
        """The reference worker runner of the node, running these train and eval commands
        (it reports over MQTT), stopped at the end."""
        cfg = Config.from_env({"LIFELONG_MQTT_URL": self.mqtt_url, "LIFELONG_NODE_NAME": NODE})
        settings = WorkerSettings(
            commands=commands, lc_server="http://127.0.0.1:9", work_dir=self.workdir / "worker"
        )
        worker = Worker(cfg, settings, client_id=client_id)
        worker.start()
        try:
            yield worker
        finally:
            worker.stop()

    def job_at_train_ready(self, job: str, dataset: str) -> tuple[Controller, Path]:
        """A controller, a dataset of 10 samples and a job on it, once the cloud has seen the
        job's first train `ready` (where a round's tests start): the controller and the
        job's outputDir."""
        data = self.samples()
        out = self.workdir / "out"
        controller = self.serving()
        self.cloud.insert_dataset(dataset, data)
        self.cloud.insert_job(job, dataset, out)
        self.cloud.wait_status(job, "train", "ready")
        return controller, out


@contextlib.contextmanager
def stack_on(
    tmp_path: Path, broker: Server, redis: Server, *, durable: bool = False
) -> Iterator[Stack]:
    """A stack on these servers (its cloud `durable`, as `Cloud` says); every controller
    started in it is stopped at the end."""
    cloud = Cloud(broker.port, durable=durable)
    s = Stack(tmp_path, broker, redis, cloud)
    try:
        yield s
    finally:
        for controller in s.controllers:
            controller.stop()
        cloud.close()
