"""Shared fixtures: real mosquitto, redis-server and moto S3 servers on free ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import Server, mosquitto_server, moto_server, redis_server, running


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Server]:
    with running(mosquitto_server(tmp_path / "mosquitto")) as server:
        yield server


@pytest.fixture
def redis_proc(tmp_path: Path) -> Iterator[Server]:
    with running(redis_server(tmp_path / "redis")) as server:
        yield server


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(moto_server(tmp_path_factory.mktemp("moto"))) as server:
        yield server


@pytest.fixture(scope="session")
def s3_endpoint(s3_server: Server) -> str:
    return f"http://127.0.0.1:{s3_server.port}"
