"""The link's connections against a real redis-server: each thread keeps its own between
calls, and gets a working one again whatever became of it meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from service.adapters.redis_link import Routed, SingleLink, load_scripts, open_link
from service.keys import Keys
from service.urls import parse_redis_url
from tests.servers import Server
from tests.wait import wait_until


@pytest.fixture
def link(redis_proc: Server) -> Iterator[SingleLink]:
    target = parse_redis_url(f"redis://127.0.0.1:{redis_proc.port}/0", "redis URL")
    link = open_link(target, Keys("t").barrier, 2.0, load_scripts().values())
    assert isinstance(link, SingleLink)
    yield link
    link.close()


def client_id(link: SingleLink) -> int:
    [found] = link.run([Routed(None, ("CLIENT", "ID"))])
    assert isinstance(found, int)
    return found


def in_thread(link: SingleLink) -> int:
    found: list[int] = []
    thread = threading.Thread(target=lambda: found.append(client_id(link)))
    thread.start()
    thread.join()
    return found[0]


def connected(raw: redis.Redis[bytes]) -> set[int]:
    return {int(c["id"]) for c in raw.client_list()}


def test_a_thread_keeps_its_connection_between_calls(link: SingleLink) -> None:
    first = client_id(link)
    assert client_id(link) == first, "one connection serves the thread's calls"
    assert in_thread(link) != first, "another thread has its own"


def test_a_kept_connection_the_server_closed_is_made_anew(
    link: SingleLink, raw: redis.Redis[bytes]
) -> None:
    """Closed while the thread was not using it (an idle timeout, a restart): the next call
    connects again instead of failing."""
    first = client_id(link)
    raw.client_kill_filter(_id=str(first))
    wait_until(lambda: first not in connected(raw), 5, "the server to close the connection")
    assert client_id(link) != first


def test_the_connection_of_a_thread_that_ends_goes_back_to_the_pool(
    link: SingleLink, raw: redis.Redis[bytes]
) -> None:
    """Not one more connection per thread that comes and goes: the one a thread kept is
    given back when it ends, and the next thread takes it."""
    first = in_thread(link)
    assert in_thread(link) == first
    assert first in connected(raw), "given back open"
