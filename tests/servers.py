"""Real servers for tests: mosquitto, redis-server (service.embedded) and moto's S3 server."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from service.embedded import Server, free_port, mosquitto_server, redis_server, wait_port
from service.embedded import running as running_all

__all__ = [
    "Server",
    "free_port",
    "mosquitto_server",
    "moto_server",
    "redis_server",
    "running",
    "wait_port",
]


def moto_server(workdir: Path, port: int | None = None) -> Server:
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    return Server("moto", argv, port, workdir)


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    with running_all(server):
        yield server
