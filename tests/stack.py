"""A whole-service test stack: a broker, a Redis, the cloud peer and controllers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from service.embedded.processes import Server
from tests.harness import (
    Cloud,
    Controller,
    append_lines,
    dataset_resource,
    job_resource,
    lines,
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

    def job_at_train_ready(self, job: str, dataset: str) -> tuple[Controller, Path]:
        """A controller, a dataset of 10 samples and a job on it, once the cloud has seen the
        job's first train `ready` (where a round's tests start): the controller and the
        job's outputDir."""
        data = self.workdir / "data" / "train.txt"
        data.parent.mkdir()
        append_lines(data, lines(0, 10))
        out = self.workdir / "out"
        controller = self.controller()
        wait_ingress(controller, self.cloud)
        self.cloud.downstream("dataset", "insert", dataset_resource(dataset, str(data)))
        self.cloud.downstream("lifelonglearningjob", "insert", job_resource(job, dataset, str(out)))
        self.cloud.wait_status(job, "train", "ready")
        return controller, out


@contextlib.contextmanager
def stack_on(
    tmp_path: Path, broker: Server, redis: Server, cloud_type: type[Cloud] = Cloud
) -> Iterator[Stack]:
    """A stack on these servers; every controller started in it is stopped at the end."""
    cloud = cloud_type(broker.port)
    s = Stack(tmp_path, broker, redis, cloud)
    try:
        yield s
    finally:
        for controller in s.controllers:
            controller.stop()
        cloud.close()
