"""`RedisStore`: the one object the runtime and the CLI hold for Redis.

It builds the link and the script calls (``calls``, ``connect``) and composes one helper
per concern; each method here is its helper's, documented there: ``ingress.Ingress``,
``state.States``, ``outbox.Outboxes``, ``leases.Leases``, ``records.Records``. The defaults
of the optional arguments are set here, once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from service.adapters.redis_store.calls import Commands, load_scripts
from service.adapters.redis_store.connect import open_link
from service.adapters.redis_store.ingress import Ingress
from service.adapters.redis_store.leases import Leases
from service.adapters.redis_store.outbox import Outboxes
from service.adapters.redis_store.records import DLQ_MAXLEN, Records
from service.adapters.redis_store.state import ROUNDS_MAXLEN, States
from service.adapters.redis_store.values import (
    Commit,
    IngressEntry,
    OutboxEntry,
    Quarantine,
    Unreadable,
)
from service.errors import LeaseLost
from service.keys import NUM_SHARDS, Keys
from service.urls import parse_redis_url

#: How long a write waits for its replicas before it counts as not done.
WAIT_TIMEOUT_MS = 1_000


class RedisStore:
    """Durable state, ingress, outbox, timers, effects and leases in Redis.

    ``url``: any URL ``parse_redis_url`` takes. ``min_replicas``: replicas that must hold a
    write before it is acted on (None: 0 on one server, 1 behind Sentinel or on a Cluster).
    """

    def __init__(
        self,
        url: str,
        keys: Keys,
        *,
        socket_timeout_s: float = 5.0,
        min_replicas: int | None = None,
    ) -> None:
        target = parse_redis_url(url, "redis URL")
        self.keys = keys
        scripts = load_scripts()
        link = open_link(target, keys.barrier, socket_timeout_s, scripts.values())
        replicas = target.default_min_replicas if min_replicas is None else min_replicas
        # the WAIT must end well before the socket gives up on its reply
        wait_ms = min(WAIT_TIMEOUT_MS, int(socket_timeout_s * 500))
        self._redis = redis = Commands(link, keys, scripts, replicas, wait_ms)
        self._ingress = Ingress(
            redis, cluster=target.topology == "cluster", socket_timeout_s=socket_timeout_s
        )
        self._states = States(redis)
        self._outboxes = Outboxes(
            redis, cluster=target.topology == "cluster", socket_timeout_s=socket_timeout_s
        )
        self._leases = Leases(redis)
        self._records = Records(redis)

    @property
    def min_replicas(self) -> int:
        return 0 if self._redis.confirm is None else self._redis.confirm.replicas

    def ping(self) -> bool:
        """Whether Redis answers now (for readiness), never raising."""
        return self._redis.ping()

    def close(self) -> None:
        self._redis.link.close()

    # -- ingress and timers (`ingress.Ingress`) --------------------------------------------

    def ensure_groups(self) -> None:
        self._ingress.ensure_groups()

    def append_ingress(
        self,
        shard: int,
        event: bytes,
        *,
        dedupe: str | None = None,
        dup: bool = False,
        dedupe_ttl_ms: int = 60_000,
        token: str = "",
    ) -> str | None:
        items = [(shard, event, dedupe, dup)]
        return self._ingress.append_many(items, dedupe_ttl_ms=dedupe_ttl_ms, token=token)[0]

    def append_many(
        self,
        items: Sequence[tuple[int, bytes, str | None, bool]],
        *,
        dedupe_ttl_ms: int = 60_000,
        token: str = "",
    ) -> list[str | None]:
        return self._ingress.append_many(items, dedupe_ttl_ms=dedupe_ttl_ms, token=token)

    def read_ingress(
        self, shards: Sequence[int], *, count: int, block_ms: int, pending: bool
    ) -> list[IngressEntry]:
        return self._ingress.read_ingress(shards, count=count, block_ms=block_ms, pending=pending)

    def fire_due_timers(
        self, tokens: Mapping[int, str], now_ms: int, limit: int = 500
    ) -> dict[int, int | None]:
        return self._ingress.fire_due_timers(tokens, now_ms, limit)

    def next_timer_ms(self, shard: int) -> int | None:
        return self._ingress.next_timer_ms(shard)

    # -- state and commits (`state.States`) ------------------------------------------------

    def load(self, rkeys: Sequence[str]) -> dict[str, bytes | None]:
        return self._states.load(rkeys)

    def load_resource(self, rkey: str) -> bytes | None:
        return self._states.load_resource(rkey)

    def list_rkeys(
        self, kind: str | None = None, shards: Sequence[int] = range(NUM_SHARDS)
    ) -> list[str]:
        return self._states.list_rkeys(kind, shards)

    def history(self, rkey: str, count: int = 100) -> list[bytes]:
        return self._states.history(rkey, count)

    def rounds(self, rkey: str, count: int = ROUNDS_MAXLEN) -> list[bytes]:
        return self._states.rounds(rkey, count)

    def commit(
        self, batches: Sequence[tuple[int, str, Sequence[Commit | Quarantine]]]
    ) -> list[list[list[str]] | LeaseLost]:
        return self._states.commit(batches)

    def quarantine_marks(self, shards: Sequence[int]) -> dict[int, dict[str, bytes]]:
        return self._states.quarantine_marks(shards)

    def quarantined(self) -> dict[str, bytes]:
        return self._states.quarantined()

    def quarantine_mark(self, rkey: str) -> bytes | None:
        return self._states.quarantine_mark(rkey)

    # -- outboxes and effects (`outbox.Outboxes`) ------------------------------------------

    def outbox_read(
        self,
        shards: Sequence[int],
        count: int = 1000,
        skip: Mapping[int, tuple[str, str]] | None = None,
    ) -> dict[int, list[tuple[str, OutboxEntry | Unreadable]]]:
        return self._outboxes.outbox_read(shards, count, skip)

    def outbox_done(self, done: Mapping[int, Sequence[str]]) -> None:
        self._outboxes.outbox_done(done)

    def gm_outbox_read(
        self, shards: Sequence[int], count: int = 100
    ) -> dict[int, list[tuple[str, bytes | Unreadable]]]:
        return self._outboxes.gm_outbox_read(shards, count)

    def gm_outbox_done(self, shard: int, stream_ids: Sequence[str]) -> None:
        self._outboxes.gm_outbox_done(shard, stream_ids)

    def gm_outbox_wait(self, shards: Sequence[int], block_ms: int) -> bool:
        return self._outboxes.gm_outbox_wait(shards, block_ms)

    def pending_effects(self, shards: Sequence[int]) -> dict[int, dict[str, bytes]]:
        return self._outboxes.pending_effects(shards)

    def complete_effect(
        self, shard: int, token: str, effect_id: str, result_event: bytes | None
    ) -> bool:
        return self._outboxes.complete_effect(shard, token, effect_id, result_event)

    # -- leases and replicas (`leases.Leases`) ---------------------------------------------

    def acquire(self, lease_key: str, fence_key: str, replica: str, ttl_ms: int) -> str | None:
        return self._leases.acquire(lease_key, fence_key, replica, ttl_ms)

    def renew(self, lease_key: str, token: str, ttl_ms: int) -> bool:
        return self._leases.renew(lease_key, token, ttl_ms)

    def release(self, lease_key: str, token: str) -> bool:
        return self._leases.release(lease_key, token)

    def lease_holder(self, lease_key: str) -> str | None:
        return self._leases.lease_holder(lease_key)

    def mark_ingress_subscribed(self, token: str, ttl_ms: int) -> None:
        self._leases.mark_ingress_subscribed(token, ttl_ms)

    def ingress_subscribed(self) -> bool:
        return self._leases.ingress_subscribed()

    def heartbeat(self, replica: str, now_ms: int, ttl_ms: int) -> list[str]:
        return self._leases.heartbeat(replica, now_ms, ttl_ms)

    def live_replicas(self, now_ms: int) -> list[str]:
        return self._leases.live_replicas(now_ms)

    def leave(self, replica: str) -> None:
        self._leases.leave(replica)

    def put_gm_link(self, status: bytes, ttl_ms: int) -> None:
        self._leases.put_gm_link(status, ttl_ms)

    def gm_link(self) -> bytes | None:
        return self._leases.gm_link()

    # -- dead letters, claims, dataset users (`records.Records`) ---------------------------

    def dead_letter(self, rejection: bytes, maxlen: int = DLQ_MAXLEN) -> None:
        self._records.dead_letter(rejection, maxlen)

    def dlq(self, count: int = 100) -> list[bytes]:
        return self._records.dlq(count)

    def claim_output_dir(
        self, output_dir: str, job_rkey: str, now_ms: int, *, stale: str = "", grace_ms: int
    ) -> tuple[str, str] | None:
        return self._records.claim_output_dir(
            output_dir, job_rkey, now_ms, stale=stale, grace_ms=grace_ms
        )

    def release_output_dir(self, output_dir: str, job_rkey: str) -> bool:
        return self._records.release_output_dir(output_dir, job_rkey)

    def dataset_jobs_add(self, dataset: str, job_rkey: str) -> None:
        self._records.dataset_jobs_add(dataset, job_rkey)

    def dataset_jobs_remove(self, dataset: str, job_rkey: str) -> None:
        self._records.dataset_jobs_remove(dataset, job_rkey)

    def dataset_jobs(self, dataset: str) -> list[str]:
        return self._records.dataset_jobs(dataset)
