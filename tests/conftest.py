"""Shared fixtures: real mosquitto, redis-server and moto S3 servers on free ports."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
import pytest

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

from tests import rabbitmq
from tests.servers import (
    Server,
    cluster_topology,
    mosquitto_server,
    moto_server,
    redis_server,
    running,
    running_topology,
    sentinel_topology,
)
from tests.stack import Stack, stack_on

T = TypeVar("T")

#: How much of each controller's log a failed whole-service test shows.
LOG_TAIL_CHARS = 12_000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test of a whole-service stack shows the tail of each controller's log: a
    failure met once in a clean-clone run can then be read from that run's output alone."""
    report = yield
    stack = getattr(item, "funcargs", {}).get("stack")
    if report.when == "call" and report.failed and isinstance(stack, Stack):
        for controller in stack.controllers:
            tail = controller.log()[-LOG_TAIL_CHARS:]
            report.sections.append((f"controller {controller.name}: its log's tail", tail))
    return report


def per_test(name: str, start: Callable[[Path], AbstractContextManager[T]]) -> Any:
    """A fixture called `name`: what `start(tmp_path)` runs, stopped when the test ends."""

    def fixture(tmp_path: Path) -> Iterator[T]:
        with start(tmp_path) as running_thing:
            yield running_thing

    return pytest.fixture(fixture, name=name)


mosquitto = per_test("mosquitto", lambda tmp: running(mosquitto_server(tmp / "mosquitto")))
redis_proc = per_test("redis_proc", lambda tmp: running(redis_server(tmp / "redis")))
#: A Redis master and one replica watched by three sentinels (down after 1 s).
sentinel = per_test("sentinel", lambda tmp: running_topology(sentinel_topology(tmp / "sentinel")))
#: A Redis Cluster of three masters with one replica each (node timeout 1 s).
cluster = per_test("cluster", lambda tmp: running_topology(cluster_topology(tmp / "cluster")))


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


@dataclass(frozen=True)
class DeniedS3:
    """An S3 object that exists, and the keys of a user allowed nothing: every request they
    make is answered 403 (AccessDenied), as by a bucket whose policy shuts them out."""

    endpoint: str
    bucket: str
    key: str
    access_key_id: str
    secret_access_key: str


#: The requests `s3_denied` makes before IAM is enforced: bucket, object, user, access key.
_UNAUTHENTICATED_SETUP = 4


@pytest.fixture
def s3_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DeniedS3]:
    """A moto server of its own that enforces IAM once its first requests (the setup) are
    done (moto's INITIAL_NO_AUTH_ACTION_COUNT); the shared one lets everybody in."""
    server = moto_server(tmp_path / "moto-iam")
    with monkeypatch.context() as env:
        env.setenv("INITIAL_NO_AUTH_ACTION_COUNT", str(_UNAUTHENTICATED_SETUP))
        server.start()
    try:
        endpoint = f"http://127.0.0.1:{server.port}"
        admin = {"endpoint_url": endpoint, "region_name": "us-east-1",
                 "aws_access_key_id": "setup", "aws_secret_access_key": "setup"}  # fmt: skip
        s3 = boto3.client("s3", **admin)  # type: ignore[call-overload]
        s3.create_bucket(Bucket="guarded")
        s3.put_object(Bucket="guarded", Key="data/train.txt", Body=b"a\nb\n")
        iam = boto3.client("iam", **admin)  # type: ignore[call-overload]
        iam.create_user(UserName="outsider")
        key = iam.create_access_key(UserName="outsider")["AccessKey"]
        s3.close()
        iam.close()
        yield DeniedS3(
            endpoint, "guarded", "data/train.txt", key["AccessKeyId"], key["SecretAccessKey"]
        )
    finally:
        server.stop()


@pytest.fixture
def durable_cloud() -> bool:
    """Whether the `stack`'s cloud keeps a persistent session (see `Cloud`)."""
    return False


@pytest.fixture
def stack(
    tmp_path: Path, mosquitto: Server, redis_proc: Server, durable_cloud: bool
) -> Iterator[Stack]:
    with stack_on(tmp_path, mosquitto, redis_proc, durable=durable_cloud) as s:
        yield s
