"""The narrow interfaces the runtime's collaborators need of the outside world.

`service.adapters.redis_store.RedisStore` and `service.adapters.mqtt.MqttClient` satisfy
them; tests hand a collaborator a fake or a faulty one through its constructor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from service.adapters.mqtt import PublishTicket
from service.adapters.redis_store import Commit, IngressEntry, OutboxEntry, Quarantine, Unreadable
from service.errors import LeaseLost
from service.keys import Keys


class IngressAppend(Protocol):
    """Appends an accepted event to its shard's durable ingress stream."""

    def append_ingress(
        self,
        shard: int,
        event: bytes,
        *,
        dedupe: str | None = None,
        dup: bool = False,
        dedupe_ttl_ms: int = 60_000,
        token: str = "",
    ) -> str | None: ...


class IngressLog(IngressAppend, Protocol):
    """Per-shard durable streams of accepted events."""

    def append_many(
        self,
        items: Sequence[tuple[int, bytes, str | None, bool]],
        *,
        dedupe_ttl_ms: int = 60_000,
        token: str = "",
    ) -> list[str | None]: ...

    def read_ingress(
        self, shards: Sequence[int], *, count: int, block_ms: int, pending: bool
    ) -> list[IngressEntry]: ...


class StateStore(Protocol):
    """Resource states, read and committed (fenced by the shard's lease)."""

    def load(self, rkeys: Sequence[str]) -> dict[str, bytes | None]: ...

    def commit(
        self, batches: Sequence[tuple[int, str, Sequence[Commit | Quarantine]]]
    ) -> list[list[list[str]] | LeaseLost]: ...


class EffectStore(Protocol):
    """Effect intents committed with their transition, retired once done."""

    def pending_effects(self, shards: Sequence[int]) -> dict[int, dict[str, bytes]]: ...

    def complete_effect(
        self, shard: int, token: str, effect_id: str, result_event: bytes | None
    ) -> bool: ...


class ProcessorStore(IngressLog, StateStore, EffectStore, Protocol):
    """What the processor reads and writes (quarantine marks and outputDir claims too)."""

    def quarantine_marks(self, shards: Sequence[int]) -> dict[int, dict[str, bytes]]: ...

    def claim_output_dir(
        self, output_dir: str, job_rkey: str, now_ms: int, *, stale: str = "", grace_ms: int
    ) -> tuple[str, str] | None: ...

    def list_rkeys(self, kind: str | None = None, shards: Sequence[int] = ...) -> list[str]: ...


class OutboxStore(Protocol):
    def outbox_read(
        self,
        shards: Sequence[int],
        count: int = 1000,
        skip: Mapping[int, tuple[str, str]] | None = None,
    ) -> dict[int, list[tuple[str, OutboxEntry | Unreadable]]]: ...

    def outbox_done(self, done: Mapping[int, Sequence[str]]) -> None: ...


class TimerStore(Protocol):
    def fire_due_timers(
        self, tokens: Mapping[int, str], now_ms: int, limit: int = 500
    ) -> dict[int, int | None]: ...


class LeaseStore(Protocol):
    keys: Keys

    def heartbeat(self, replica: str, now_ms: int, ttl_ms: int) -> list[str]: ...

    def acquire(self, lease_key: str, fence_key: str, replica: str, ttl_ms: int) -> str | None: ...

    def renew(self, lease_key: str, token: str, ttl_ms: int) -> bool: ...

    def release(self, lease_key: str, token: str) -> bool: ...

    def leave(self, replica: str) -> None: ...

    def mark_ingress_subscribed(self, token: str, ttl_ms: int) -> None: ...

    def ingress_subscribed(self) -> bool: ...


class DeadLetters(Protocol):
    def dead_letter(self, rejection: bytes, maxlen: int = ...) -> None: ...


class Publisher(Protocol):
    """An MQTT connection that publishes (QoS 1 completes on the broker's PUBACK)."""

    @property
    def connected(self) -> bool: ...

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> PublishTicket: ...

    def batch(self) -> AbstractContextManager[None]:
        """Publishes made inside go out together, at the end at the latest."""
        ...


class ExecutorStore(StateStore, IngressAppend, Protocol):
    """What running effects reads and writes besides files: resource JSON (for credentials),
    the jobs of each dataset, and the ingress the results go to."""

    def load_resource(self, rkey: str) -> bytes | None: ...

    def dataset_jobs_add(self, dataset: str, job_rkey: str) -> None: ...

    def dataset_jobs_remove(self, dataset: str, job_rkey: str) -> None: ...

    def dataset_jobs(self, dataset: str) -> list[str]: ...

    def release_output_dir(self, output_dir: str, job_rkey: str) -> bool: ...


class GmOutboxStore(Protocol):
    """Upstream messages waiting for the GM link, and the link's recorded state."""

    def gm_outbox_read(
        self, shards: Sequence[int], count: int = 100
    ) -> dict[int, list[tuple[str, bytes | Unreadable]]]: ...

    def gm_outbox_done(self, shard: int, stream_ids: Sequence[str]) -> None: ...

    def gm_outbox_wait(self, shards: Sequence[int], block_ms: int) -> bool: ...

    def put_gm_link(self, status: bytes, ttl_ms: int) -> None: ...
