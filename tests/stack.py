"""A whole-service test stack: a broker, a Redis, the cloud peer and controllers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from service.embedded import Server
from tests.harness import Cloud, Controller


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
