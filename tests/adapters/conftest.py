"""Fixtures the adapter tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.servers import Server


@pytest.fixture
def raw(redis_proc: Server) -> Iterator[redis.Redis[bytes]]:
    """A plain redis-py client of the test's Redis, to look at it beside the code under
    test."""
    client: redis.Redis[bytes] = redis.Redis(port=redis_proc.port)
    yield client
    client.close()
