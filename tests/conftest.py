"""Shared fixtures: real mosquitto, redis-server and moto S3 servers on free ports."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

from tests import rabbitmq
from tests.servers import Server, mosquitto_server, moto_server, redis_server, running
from tests.stack import Stack, stack_on


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Server]:
    with running(mosquitto_server(tmp_path / "mosquitto")) as server:
        yield server


@pytest.fixture
def redis_proc(tmp_path: Path) -> Iterator[Server]:
    with running(redis_server(tmp_path / "redis")) as server:
        yield server


@pytest.fixture(scope="session")
def rabbitmq_node() -> Iterator[rabbitmq.RabbitNode]:
    """One private RabbitMQ node with the MQTT plugin for the whole session (~15 s to boot)."""
    why = rabbitmq.unavailable()
    if why is not None:
        pytest.skip(why)
    node = rabbitmq.RabbitNode()
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(moto_server(tmp_path_factory.mktemp("moto"))) as server:
        yield server


@pytest.fixture(scope="session")
def s3_endpoint(s3_server: Server) -> str:
    return f"http://127.0.0.1:{s3_server.port}"


@pytest.fixture
def s3c(s3_endpoint: str) -> Iterator[S3Client]:
    """A boto3 client of the moto server (moto takes any credentials)."""
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    yield client
    client.close()


@pytest.fixture
def bucket(s3c: S3Client) -> str:
    """A fresh bucket on the moto server."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3c.create_bucket(Bucket=name)
    return name


@pytest.fixture
def stack(tmp_path: Path, mosquitto: Server, redis_proc: Server) -> Iterator[Stack]:
    with stack_on(tmp_path, mosquitto, redis_proc) as s:
        yield s
