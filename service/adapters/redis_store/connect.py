"""Opening the link a store's commands travel on, for the topology its URL names: one
server, a master found through Sentinel, or a Cluster.

Every new connection, its handshake done, loads the store's scripts before it is used, so
EVALSHA works on a fresh or restarted Redis, a promoted replica or a Cluster node. Replies
are read as RESP2, and nothing is retried here: a retried EVALSHA after a timeout could
apply twice, so the runtime retries whole operations.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import Connection
from redis.retry import Retry
from redis.sentinel import Sentinel

from service.adapters.redis_links import ClusterLink, Link, SingleLink
from service.adapters.redis_store.calls import Lua
from service.urls import RedisTarget

HEALTH_CHECK_INTERVAL_S = 30
#: What a new connection is handed to before it is used.
_Loader = Callable[[Connection], None]


def open_link(
    target: RedisTarget,
    barrier: Callable[[str], str],
    socket_timeout_s: float,
    scripts: Collection[Lua],
) -> Link:
    """The link to ``target``; ``barrier``: the barrier key of a key's hash slot."""
    timeouts: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
    }
    load_on = _script_loader(scripts)
    if target.topology == "single":
        return _single(target, barrier, timeouts, load_on)
    if target.topology == "sentinel":
        return _sentinel(target, barrier, timeouts, load_on)
    return _cluster(target, barrier, timeouts, load_on)


def _single(
    target: RedisTarget, barrier: Callable[[str], str], timeouts: dict[str, Any], load_on: _Loader
) -> Link:
    pool = redis.ConnectionPool.from_url(
        target.url,
        protocol=2,  # pinned: the reply shapes the store reads are RESP2's
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        retry=_no_retry(),
        redis_connect_func=_handshake_then(load_on),
        **timeouts,
    )
    return SingleLink(pool, barrier)


def _sentinel(
    target: RedisTarget, barrier: Callable[[str], str], timeouts: dict[str, Any], load_on: _Loader
) -> Link:
    tls = _tls_kwargs(target)
    # the URL's credentials are the data nodes'; sentinels are asked without them
    sentinel = Sentinel(list(target.hosts), sentinel_kwargs={**timeouts, **tls})
    master = sentinel.master_for(
        target.master,
        db=target.db,
        protocol=2,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        retry=_no_retry(),
        redis_connect_func=_handshake_then(load_on),
        username=target.username,
        password=target.password,
        **timeouts,
        **tls,
    )
    close = sentinel.close  # type: ignore[attr-defined]  # (stubs predate it)
    return SingleLink(master.connection_pool, barrier, close)


def _cluster(
    target: RedisTarget, barrier: Callable[[str], str], timeouts: dict[str, Any], load_on: _Loader
) -> Link:
    tls = _tls_kwargs(target)

    def make() -> RedisCluster[bytes]:
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.hosts],
            retry=_no_retry(),
            protocol=2,
            redis_connect_func=load_on,  # the cluster client does the handshake
            username=target.username,
            password=target.password,
            **timeouts,
            **tls,
        )

    return ClusterLink(make, barrier)


def _handshake_then(load_on: _Loader) -> _Loader:
    """Handshake, then load every script."""

    def on_connect(connection: Connection) -> None:
        connection.on_connect()
        load_on(connection)

    return on_connect


def _script_loader(scripts: Collection[Lua]) -> _Loader:
    """Loads every script on a connection, sent back to back: one round trip."""

    def load_on(connection: Connection) -> None:
        for script in scripts:
            connection.send_command("SCRIPT", "LOAD", script.text)
        for _ in scripts:
            connection.read_response()

    return load_on


def _no_retry() -> Retry:
    """No retries: a retried EVALSHA after a timeout could apply twice; the runtime retries
    whole operations above the store."""
    return Retry(NoBackoff(), 0)


def _tls_kwargs(target: RedisTarget) -> dict[str, Any]:
    """redis-py's TLS arguments for a Sentinel or Cluster target (none without TLS)."""
    if not target.tls:
        return {}
    return {"ssl": True, **dict(target.tls_options)}
