"""What the replicated Redis topologies share: data node arguments and probing the nodes.

Probes ask a node with redis-py; `poll_until` repeats one until it holds, treating a node
that cannot answer (stopped, frozen, restarting) as "not yet".
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

DATA_NODE_ARGS = (
    # a replica starts its sync at once instead of waiting 5 s for more replicas to join
    "--repl-diskless-sync-delay",
    "0",
    "--repl-ping-replica-period",
    "1",
)


def poll_until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """Return once ``predicate`` holds; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not _quietly(predicate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


def _quietly(predicate: Callable[[], object]) -> object:
    """The predicate's value, False while the server it asks cannot answer."""
    try:
        return predicate()
    except (redis.RedisError, OSError):
        return False


def redis_client(port: int) -> redis.Redis[str]:
    """A client of the node on 127.0.0.1:``port``, answering str."""
    return redis.Redis(port=port, socket_timeout=2, decode_responses=True)


def server_info(port: int, section: str) -> dict[str, object]:
    with redis_client(port) as client:
        return dict(client.info(section))


def caught_up(port: int, replicas: int) -> bool:
    """Whether ``replicas`` replicas hold everything the master on ``port`` took so far (a
    probe write, then WAIT for it; replication keeps the master's order)."""
    with redis_client(port) as client:
        client.set("embedded:sync-probe", "1", px=60_000)
        return int(client.wait(replicas, 500)) >= replicas


def role_of(port: int) -> object:
    """The node's replication role: "master" or "slave"."""
    return server_info(port, "replication")["role"]
