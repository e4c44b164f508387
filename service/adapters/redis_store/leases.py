"""Leases with fencing tokens, the ingress holder's subscription marker, and the registry of
live replicas (with the GM link's state, written by its holder).
"""

from __future__ import annotations

import contextlib
import time

from service.adapters.redis_links import NotReplicated, Routed
from service.adapters.redis_store.calls import Commands, as_str, checked, store_errors
from service.errors import PermanentError, StoreUnavailable


class Leases:
    """Takes, renews and gives up leases; keeps the replica registry."""

    def __init__(self, redis: Commands) -> None:
        self._redis = redis
        self._keys = redis.keys

    def acquire(self, lease_key: str, fence_key: str, replica: str, ttl_ms: int) -> str | None:
        """Take a free lease: its token ``<replica>:<fence>``, or None while it is held.

        The fence never goes backwards, even when a failover lost the INCR that made the
        last token: it is also never below the wall clock in milliseconds (read here, not
        from a clock tests may move), so a token taken after a failover is larger than any
        taken before it as long as the controllers' clocks agree within the failover's
        duration. With replicas required, a token is returned only once they hold it; when
        they do not confirm it in time the lease is given back and ``StoreUnavailable``
        raised.
        """
        floor_ms = time.time_ns() // 1_000_000
        call = self._redis.call("acquire", (lease_key, fence_key), (replica, ttl_ms, floor_ms))
        try:
            with store_errors("acquire"):
                token = checked(
                    self._redis.eval_raw([call], what="acquire", confirm=self._redis.confirm)[0]
                )
        except StoreUnavailable as e:
            cause = e.__cause__
            if isinstance(cause, NotReplicated) and isinstance(cause.results[0], bytes):
                with contextlib.suppress(StoreUnavailable, PermanentError):
                    self.release(lease_key, as_str(cause.results[0]))
            raise
        return None if token is None else as_str(token)

    def renew(self, lease_key: str, token: str, ttl_ms: int) -> bool:
        """Extend the lease if ``token`` still holds it."""
        call = self._redis.call("renew", (lease_key,), (token, ttl_ms))
        return bool(self._redis.eval([call], what="renew")[0])

    def release(self, lease_key: str, token: str) -> bool:
        """Give the lease up if ``token`` still holds it."""
        call = self._redis.call("release", (lease_key,), (token,))
        return bool(self._redis.eval([call], what="release")[0])

    def lease_holder(self, lease_key: str) -> str | None:
        """The current holder's token ``<replica>:<fence>``, or None when the lease is free."""
        [token] = self._redis.run([Routed(lease_key, ("GET", lease_key))], what="lease_holder")
        return None if token is None else as_str(token)

    def mark_ingress_subscribed(self, token: str, ttl_ms: int) -> None:
        """Say that the ingress lease holder ``token`` has its subscription acknowledged,
        for ``ttl_ms`` (renewed with the lease, so it lapses with a dead holder)."""
        key = self._keys.ingress_subscribed()
        self._redis.run(
            [Routed(key, ("SET", key, token, "PX", ttl_ms))], what="mark_ingress_subscribed"
        )

    def ingress_subscribed(self) -> bool:
        """Whether the current ingress lease holder said its subscription is acknowledged."""
        keys = (self._keys.ingress_lease(), self._keys.ingress_subscribed())  # one slot
        [(lease, marker)] = self._redis.run(
            [Routed(keys[0], ("MGET", *keys))], what="ingress_subscribed"
        )
        return lease is not None and lease == marker

    def heartbeat(self, replica: str, now_ms: int, ttl_ms: int) -> list[str]:
        """Announce ``replica`` alive until now+ttl; the live replicas, sorted."""
        key = self._keys.replicas()
        replies = self._redis.run(
            [
                Routed(key, ("ZADD", key, now_ms + ttl_ms, replica)),
                Routed(key, ("ZREMRANGEBYSCORE", key, "-inf", now_ms)),
                Routed(key, ("ZRANGE", key, 0, -1)),
            ],
            what="heartbeat",
            atomic=True,
        )
        return sorted(map(as_str, replies[-1]))

    def live_replicas(self, now_ms: int) -> list[str]:
        """The replicas whose last heartbeat has not expired by ``now_ms``, sorted (a read:
        for the CLI, which is no replica)."""
        key = self._keys.replicas()
        [members] = self._redis.run(
            [Routed(key, ("ZRANGEBYSCORE", key, now_ms, "+inf"))], what="live_replicas"
        )
        return sorted(map(as_str, members))

    def leave(self, replica: str) -> None:
        key = self._keys.replicas()
        self._redis.run([Routed(key, ("ZREM", key, replica))], what="leave")

    def put_gm_link(self, status: bytes, ttl_ms: int) -> None:
        """Record the GM link's state (written by its holder, read by the CLI)."""
        key = self._keys.gm_link()
        self._redis.run([Routed(key, ("SET", key, status, "PX", ttl_ms))], what="put_gm_link")

    def gm_link(self) -> bytes | None:
        key = self._keys.gm_link()
        [status] = self._redis.run([Routed(key, ("GET", key))], what="gm_link")
        return None if status is None else bytes(status)
