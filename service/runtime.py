"""The imperative shell: decode -> ingress -> lease -> load -> transition -> commit -> effects.

One `Replica` per process. Its threads each do one job:

- intake: MQTT messages (only while this replica holds the ingress lease) are decoded,
  validated and appended to their shard's durable ingress stream, then acknowledged to the
  broker; bad ones become rejections (errors topic, dead-letter stream, log line, counter).
- leases: heartbeat, renew, rebalance shards, hold or give up the MQTT ingress lease.
- processor: reads the owned shards' ingress, applies `transition` per resource and commits
  state + outbox + timers + effect intents + history + ack atomically, fenced by the lease.
- timers: moves due trigger checks and dataset polls into the ingress streams.
- outbox: publishes committed upstream messages and forgets them after PUBACK.
- effects: a small pool runs effect intents and reports their outcome as events.

Nothing in the lifecycle is decided here: that is `service.transition`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import msgspec

from service import failpoints, history, messages
from service.adapters.blobs import BlobStore
from service.adapters.datasets import DatasetReader
from service.adapters.http import HttpServer
from service.adapters.mqtt import Inbound as MqttInbound
from service.adapters.mqtt import MqttClient, MqttSettings
from service.adapters.redis_store import Commit, IngressEntry, OutboxEntry, RedisStore
from service.adapters.s3 import S3Clients
from service.config import Config
from service.errors import InvalidMessage, LeaseLost, ServiceError, StoreUnavailable
from service.executor import Executor
from service.ingress import (
    Inbound,
    decode_inbound,
    encode_inbound,
    take_in,
    target_of,
    worker_topic_name,
)
from service.keys import Keys, shard_of
from service.leases import LeaseKeeper
from service.metrics import Metrics
from service.outbox import OutboxPublisher
from service.state import (
    Context,
    DatasetState,
    Effect,
    Event,
    JobState,
    Note,
    Publish,
    Reject,
    ScheduleCheck,
    State,
    Tick,
    Work,
    decode_state,
    decode_work,
    encode,
)
from service.transition import transition

log = logging.getLogger("service.runtime")

READ_BATCH = 500
READ_BLOCK_MS = 200
TIMER_INTERVAL_S = 0.25
EFFECT_WORKERS = 4
EFFECT_RETRY_S = 1.0
SESSION_EXPIRY_S = 7 * 24 * 3600
OUTBOX_FINISH_S = 2.0


class Clock(Protocol):
    """The one source of time: tests move it; timer windows and periods read it."""

    def now_ms(self) -> int: ...

    def minute_of_day(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def minute_of_day(self) -> int:
        local = time.localtime()
        return local.tm_hour * 60 + local.tm_min


@dataclass(frozen=True)
class Tuning:
    """Knobs tests shrink; production keeps the defaults."""

    blob_attempts: int = 5
    blob_max_backoff_s: float = 8.0
    puback_timeout_s: float = 10.0


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


class Replica:
    """One controller process: owns a fair share of the shards, shares the rest."""

    def __init__(
        self,
        config: Config,
        *,
        replica_id: str | None = None,
        clock: Clock | None = None,
        tuning: Tuning | None = None,
    ) -> None:
        self.config = config
        self.replica = replica_id or default_replica_id()
        self.clock: Clock = clock or SystemClock()
        tuning = tuning or Tuning()
        self.metrics = Metrics()
        self.keys = Keys(config.key_prefix)
        self.store = RedisStore(config.redis_url, self.keys)
        s3 = S3Clients()
        blobs = BlobStore(
            s3, attempts=tuning.blob_attempts, max_backoff_s=tuning.blob_max_backoff_s
        )
        self.executor = Executor(self.store, blobs, DatasetReader(s3))
        self._stop = threading.Event()
        self._inbound: queue.SimpleQueue[MqttInbound] = queue.SimpleQueue()
        self._fresh: set[int] = set()
        self._pending_sweep_at_s = 0.0
        self._fresh_lock = threading.Lock()
        self._effects = ThreadPoolExecutor(EFFECT_WORKERS, thread_name_prefix="effects")
        self._states = ShardStates()
        self._running: set[str] = set()
        self._running_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._ingress: MqttClient | None = None
        self._ingress_lock = threading.Lock()
        self._presence_due = threading.Event()
        self.publisher = MqttClient(
            MqttSettings(
                url=config.mqtt_url,
                client_id=f"{config.key_prefix}-{config.node_name}-{self.replica}",
                will=(config.presence_topic(self.replica), self._presence("offline"), True),
            ),
            on_connection_change=self._on_publisher_connection,
        )
        self.leases = LeaseKeeper(
            self.store,
            self.replica,
            int(config.lease_s * 1000),
            now_ms=self.clock.now_ms,
            on_acquired=self._on_acquired,
            on_ingress=self._on_ingress_lease,
        )
        self.outbox = OutboxPublisher(
            self.store,
            self.publisher,
            lambda: sorted(self.leases.held()),
            puback_timeout_s=tuning.puback_timeout_s,
            on_depth=self.metrics.outbox_depth.set,
        )
        host, port = config.http_host_port()
        self.http = HttpServer(
            host,
            port,
            ready=self.ready,
            metrics=self.metrics.render,
            worker_info=self.http_worker_info,
        )

    # ================================================================ lifecycle
    def start(self) -> None:
        self.http.start()
        self.publisher.start()
        try:
            self.store.ensure_groups()
        except StoreUnavailable as e:
            log.warning("redis not reachable yet (%s); will keep trying", e)
        for name, loop, interval_s in (
            ("leases", self.leases.tick, self.config.lease_s / 3),
            ("timers", self._fire_timers, TIMER_INTERVAL_S),
            ("intake", self._intake_once, 0.0),
            ("processor", self._process_once, 0.0),
            ("outbox", self._outbox_once, 0.0),
            ("presence", self._presence_once, 0.5),
        ):
            thread = threading.Thread(
                target=self._guarded, args=(name, loop, interval_s), name=name, daemon=True
            )
            thread.start()
            self._threads.append(thread)
        log.info("replica %s started on node %s", self.replica, self.config.node_name)

    def stop(self) -> None:
        """Graceful: stop intake, finish the commit in flight, release leases, say offline."""
        if self._stop.is_set():
            return
        log.info("replica %s stopping", self.replica)
        self._stop.set()
        self._on_ingress_lease(False)
        self.http.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        self._effects.shutdown(wait=True, cancel_futures=True)
        try:
            self.outbox.finish(OUTBOX_FINISH_S)
        except ServiceError as e:
            log.warning("could not forget acknowledged upstream messages: %s", e)
        try:
            self.leases.release_all()
        except ServiceError as e:
            log.warning("could not release leases: %s", e)
        ticket = self.publisher.publish(
            self.config.presence_topic(self.replica), self._presence("offline"), retain=True
        )
        ticket.wait(2.0)
        self.publisher.stop()
        self.store.close()
        log.info("replica %s stopped", self.replica)

    def wait(self) -> None:
        self._stop.wait()

    def _guarded(self, name: str, loop: Callable[[], None], interval_s: float) -> None:
        """Run one loop until stop; no exception ever escapes a thread's top."""
        while not self._stop.is_set():
            try:
                loop()
            except StoreUnavailable as e:
                log.warning("%s: redis unavailable: %s", name, e)
                self._stop.wait(0.5)
            except Exception:
                log.exception("%s loop failed; continuing", name)
                self._stop.wait(0.5)
            if interval_s:
                self._stop.wait(interval_s)

    # ================================================================ health
    def ready(self) -> tuple[bool, str]:
        """Ready: MQTT and Redis connected and, when this replica holds the ingress lease, its
        subscribing client connected too (so a message sent now is not missed)."""
        with self._ingress_lock:
            ingress = self._ingress
        mqtt_ok = self.publisher.connected
        redis_ok = self.leases.store_ok
        intake_ok = ingress.connected if ingress is not None else not self.leases.holds_ingress
        held = len(self.leases.held())
        intake = "standby" if ingress is None else ("up" if intake_ok else "connecting")
        detail = (
            f"mqtt={'up' if mqtt_ok else 'down'} redis={'up' if redis_ok else 'down'} "
            f"shards={held} ingress={intake}"
        )
        return mqtt_ok and redis_ok and intake_ok, detail

    def _presence(self, state: str) -> bytes:
        presence = messages.Presence(
            replica=self.replica,
            state=state,  # type: ignore[arg-type]
            since=_iso(self.clock.now_ms()),
        )
        return messages.encode(presence)

    def _on_publisher_connection(self, connected: bool) -> None:
        if connected:
            self._presence_due.set()
            self.outbox.wake(None)

    def _presence_once(self) -> None:
        if self._presence_due.is_set() and self.publisher.connected:
            self._presence_due.clear()
            self.publisher.publish(
                self.config.presence_topic(self.replica), self._presence("online"), retain=True
            )
        self.metrics.leases_held.set(len(self.leases.held()))
        self.metrics.set_health(
            self.config.node_name,
            ready=self.ready()[0],
            ingress_held=self.leases.holds_ingress,
            redis_up=self.leases.store_ok,
            mqtt_up=self.publisher.connected,
        )

    # ================================================================ intake
    def _on_ingress_lease(self, held: bool) -> None:
        """Only the ingress lease holder subscribes, under one fixed client id whose
        persistent session the next holder resumes (mosquitto does not hand a departed
        shared-subscription member's messages to the others)."""
        with self._ingress_lock:
            if held and self._ingress is None and not self._stop.is_set():
                client = MqttClient(
                    MqttSettings(
                        url=self.config.mqtt_url,
                        client_id=f"{self.config.key_prefix}-{self.config.node_name}-ingress",
                        clean_start=False,
                        session_expiry_s=SESSION_EXPIRY_S,
                        manual_ack=True,
                    ),
                    subscriptions=[
                        self.config.downstream_topic(),
                        self.config.worker_topic_filter(),
                    ],
                    inbound=self._inbound,
                )
                client.start()
                self._ingress = client
            elif not held and self._ingress is not None:
                self._ingress.stop()
                self._ingress = None

    def _intake_once(self) -> None:
        try:
            first = self._inbound.get(timeout=0.2)
        except queue.Empty:
            return
        batch = [first]
        while len(batch) < READ_BATCH:
            try:
                batch.append(self._inbound.get_nowait())
            except queue.Empty:
                break
        self._take_in(batch)

    def _take_in(self, batch: list[MqttInbound]) -> None:
        accepted: list[tuple[MqttInbound, int, bytes, str]] = []
        for msg in batch:
            now_ms = self.clock.now_ms()
            try:
                inbound = self._decode_mqtt(msg, now_ms)
            except InvalidMessage as e:
                self._reject(
                    msg.topic, e.path + ": " + e.reason if e.path else e.reason, msg.payload, now_ms
                )
                self._ack(msg)
                continue
            digest = hashlib.sha256(msg.topic.encode() + b"\0" + msg.payload).hexdigest()
            shard = shard_of(target_of(inbound.event))
            accepted.append((msg, shard, encode_inbound(inbound), digest))
        if not accepted:
            return
        failpoints.hit("intake-before-durable")
        while not self._stop.is_set():
            try:
                # the token fences a holder frozen past its lease: messages the new holder
                # already took in are dropped by their marker, not taken in twice
                self.store.append_many(
                    [(s, data, d, m.dup) for m, s, data, d in accepted],
                    token=self.leases.ingress_token,
                )
                break
            except StoreUnavailable as e:
                log.warning("ingress not durable yet, holding %d messages: %s", len(accepted), e)
                self._stop.wait(0.5)
        else:
            return  # stopping: not acknowledged, the broker redelivers to the next holder
        failpoints.hit("intake-before-ack")
        for msg, *_ in accepted:
            self._ack(msg)

    def _ack(self, msg: MqttInbound) -> None:
        with self._ingress_lock:
            if self._ingress is not None:
                self._ingress.ack(msg)

    def _decode_mqtt(self, msg: MqttInbound, now_ms: int) -> Inbound:
        if msg.topic == self.config.downstream_topic():
            return take_in("downstream", msg.topic, msg.payload, now_ms)
        worker = worker_topic_name(msg.topic)
        if worker is None:
            raise InvalidMessage(f"no handler for topic {msg.topic!r}")
        inbound = take_in("worker", msg.topic, msg.payload, now_ms)
        self._check_worker_name(worker, inbound)
        return inbound

    @staticmethod
    def _check_worker_name(worker: str, inbound: Inbound) -> None:
        reported = getattr(inbound.event, "worker", None)
        if reported != worker:
            raise InvalidMessage(
                f"worker name {reported!r} does not match {worker!r} in the topic or path", "$.name"
            )

    def http_worker_info(self, worker: str, body: bytes) -> tuple[int, str]:
        """`POST /sedna/workers/{worker}/info`: the same as the MQTT worker topic."""
        now_ms = self.clock.now_ms()
        topic = f"http:/sedna/workers/{worker}/info"
        try:
            inbound = take_in("worker", topic, body, now_ms)
            self._check_worker_name(worker, inbound)
            job = target_of(inbound.event)
            if self.store.load([job])[job] is None:
                raise InvalidMessage(f"unknown job {job.partition(':')[2]}", "$.ownerName")
            self.store.append_ingress(shard_of(job), encode_inbound(inbound))
        except InvalidMessage as e:
            reason = f"{e.path}: {e.reason}" if e.path else e.reason
            self._reject(topic, reason, body, now_ms, publish=False)
            return 400, reason
        except StoreUnavailable:
            return 503, "state store unavailable; retry"
        self.metrics.events.labels(type="worker-reported", outcome="accepted").inc()
        return 200, "OK"

    def _reject(
        self, topic: str, reason: str, payload: bytes, now_ms: int, *, publish: bool = True
    ) -> None:
        """Errors topic, dead-letter stream, a log line and a counter; then carry on."""
        data = self._record_rejection(topic, reason, payload, now_ms)
        if publish:
            try:
                self.publisher.publish(self.config.errors_topic(), data)
            except ServiceError as e:
                log.warning("could not publish rejection: %s", e)

    # ================================================================ processing
    def _on_acquired(self, shard: int) -> None:
        with self._fresh_lock:
            self._fresh.add(shard)

    def _process_once(self) -> None:
        try:
            self._process_owned()
        except StoreUnavailable:
            # Redis may be restarting and come back having lost its last writes (an AOF
            # fsynced every second): only what it holds then is the truth
            self._states.clear()
            raise

    def _process_owned(self) -> None:
        held = self.leases.held()
        self._states.keep_only(held)
        self.metrics.keep_jobs_of(held)
        if not held:
            self._stop.wait(0.1)
            return
        with self._fresh_lock:
            fresh = sorted(s for s in self._fresh if s in held)
            self._fresh.clear()
        self._report_jobs(fresh)
        if time.monotonic() >= self._pending_sweep_at_s:
            # A replica waking past its lease (SIGSTOP, a long GC pause) may still read new
            # entries of shards that moved on: read is not fenced, its commit is, so they
            # stay pending under the shared consumer name, where only a pending read finds
            # them. The owner therefore re-reads its shards' pending entries every lease TTL.
            self._pending_sweep_at_s = time.monotonic() + self.config.lease_s
            fresh = sorted(held)
        if fresh:
            self._recover(fresh)
            return
        entries = self.store.read_ingress(
            sorted(held), count=READ_BATCH, block_ms=READ_BLOCK_MS, pending=False
        )
        self._apply(entries)

    def _report_jobs(self, shards: list[int]) -> None:
        """Set the phase gauges of the jobs on shards that just became ours: a job waiting for
        its worker may get no event for hours, and would have no series here until then."""
        if not shards:
            return
        try:
            states = self.store.load(self.store.list_rkeys("job", shards))
        except StoreUnavailable:
            with self._fresh_lock:
                self._fresh.update(shards)
            raise
        for rkey, raw in states.items():
            if raw is not None:
                self.metrics.job_changed(shard_of(rkey), None, decode_state(raw))

    def _recover(self, shards: list[int]) -> None:
        """A shard just became ours (or a commit's fate is unknown): redo what is pending.

        Pending entries are replayed against the states Redis holds, never cached ones: had
        Redis lost a commit (its ack with it), the cache would already hold that commit's
        result and the replay would apply the event twice.
        """
        replayed: set[int] = set()
        try:
            while True:
                # only shards still ours: a lost one's entries stay pending for its new owner
                entries = self.store.read_ingress(
                    self._still_ours(shards), count=READ_BATCH, block_ms=0, pending=True
                )
                if not entries:
                    break
                for shard in {entry.shard for entry in entries} - replayed:
                    self._states.forget(shard)
                    replayed.add(shard)
                self._apply(entries)
            for shard, intents in self.store.pending_effects(self._still_ours(shards)).items():
                for effect_id, data in intents.items():
                    self._submit(shard, effect_id, decode_work(data))
        except StoreUnavailable:
            with self._fresh_lock:
                self._fresh.update(shards)
            raise
        self.outbox.wake(set(shards))

    def _still_ours(self, shards: list[int]) -> list[int]:
        return [shard for shard in shards if self.leases.token(shard) is not None]

    def _apply(self, entries: list[IngressEntry]) -> None:
        """Apply a read's entries, every owned shard's commits in one round trip."""
        by_shard: dict[int, dict[str, list[tuple[str, Inbound | None]]]] = {}
        for entry in entries:
            rkey, inbound = self._entry_event(entry)
            groups = by_shard.setdefault(entry.shard, {})
            groups.setdefault(rkey, []).append((entry.entry_id, inbound))
        batches: list[_ShardBatch] = []
        for shard, groups in by_shard.items():
            token = self.leases.token(shard)
            if token is None:
                continue  # no longer ours: the entries stay pending for the next owner
            batches.append(_ShardBatch(shard, token, self._states.of(shard, token), groups))
        if not batches:
            return
        try:
            self._load_missing(batches)
            batches = [batch for batch in batches if self._run_shard(batch)]
            failpoints.hit("process-before-commit")
            outcomes = self.store.commit([(b.shard, b.token, b.commits) for b in batches])
        except BaseException as e:
            for batch in batches:
                self._states.forget(batch.shard)  # its fate unknown: Redis is the truth
            if isinstance(e, StoreUnavailable):
                with self._fresh_lock:  # the commit may or may not have happened
                    self._fresh.update(batch.shard for batch in batches)
            raise
        done: list[tuple[_ShardBatch, list[list[str]]]] = []
        for batch, outcome in zip(batches, outcomes, strict=True):
            if isinstance(outcome, LeaseLost):
                self._states.forget(batch.shard)
                self.leases.lost(batch.shard, batch.token)
                continue
            for commit in batch.commits:
                if commit.delete:
                    batch.states[commit.rkey] = None
                elif not commit.keep_state:
                    batch.states[commit.rkey] = commit.state
            done.append((batch, outcome))
        failpoints.hit("process-before-effects")
        for batch, _ in done:
            for effect_id, item in batch.work:
                self._submit(batch.shard, effect_id, item)
        for batch, outbox_ids in done:
            for commit, ids in zip(batch.commits, outbox_ids, strict=True):
                if ids:
                    self.outbox.send(batch.shard, list(zip(ids, commit.outbox, strict=True)))

    def _run_shard(self, batch: _ShardBatch) -> bool:
        """Run the transitions of one shard's events; False if that failed (a bug): its
        entries then stay pending, and the other shards of the read still commit."""
        try:
            for rkey, items in batch.groups.items():
                commit, todo = self._run_resource(
                    batch.shard, batch.token, rkey, batch.states[rkey], items
                )
                batch.commits.append(commit)
                batch.work.extend(todo)
        except Exception:
            log.exception("shard %d: applying its events failed; they stay pending", batch.shard)
            self._states.forget(batch.shard)
            return False
        return True

    def _load_missing(self, batches: list[_ShardBatch]) -> None:
        """Read the states the cache lacks, every shard's in one round trip."""
        missing = [rkey for b in batches for rkey in b.groups if rkey not in b.states]
        if not missing:
            return
        loaded = self.store.load(missing)
        for batch in batches:
            for rkey in batch.groups:
                if rkey not in batch.states:
                    batch.states[rkey] = loaded[rkey]

    def _entry_event(self, entry: IngressEntry) -> tuple[str, Inbound | None]:
        if entry.timer_rkey is not None:
            kind, _, path = entry.timer_rkey.partition(":")
            namespace, _, name = path.partition("/")
            tick = Tick(
                kind="dataset" if kind == "dataset" else "job",
                namespace=namespace,
                name=name,
                due_ms=entry.timer_due_ms or 0,
            )
            return entry.timer_rkey, Inbound(event=tick)
        try:
            inbound = decode_inbound(entry.event or b"")
        except msgspec.DecodeError as e:
            log.error(
                "undecodable ingress entry %s on shard %d: %s", entry.entry_id, entry.shard, e
            )
            return f"corrupt:{entry.entry_id}", None
        return target_of(inbound.event), inbound

    def _run_resource(
        self,
        shard: int,
        token: str,
        rkey: str,
        raw: bytes | None,
        items: list[tuple[str, Inbound | None]],
    ) -> tuple[Commit, list[tuple[str, Work]]]:
        """Apply a resource's events in order; one commit carries all of it.

        Stream entry ids are only unique within one shard's stream (shards appended to in
        the same millisecond get the same id), so the event id carries the shard: effect and
        upstream message ids derive from it and must be unique across all shards.
        """
        state: State | None = decode_state(raw) if raw is not None else None
        initial = state
        outbox: list[OutboxEntry] = []
        work: list[tuple[str, Work]] = []
        history: list[bytes] = []
        timer: int | None = None
        resource: bytes | None = None
        for entry_id, inbound in items:
            if inbound is None:
                continue
            started = time.perf_counter()
            now_ms = self.clock.now_ms()
            ctx = Context(
                now_ms=now_ms,
                minute_of_day=self.clock.minute_of_day(),
                event_id=f"s{shard}-{entry_id}",
                volume_prefix=self.config.volume_prefix,
                dataset_poll_ms=int(self.config.dataset_poll_s * 1000),
            )
            before = state
            outcome = transition(state, inbound.event, ctx)
            self.metrics.transition_seconds.observe(time.perf_counter() - started)
            state = outcome.state
            if inbound.resource is not None and state is not None:
                resource = inbound.resource
            for effect in outcome.effects:
                if isinstance(effect, ScheduleCheck):
                    timer = effect.due_ms
                elif isinstance(effect, Publish):
                    outbox.append(self._upstream(effect))
                    self._count_dataset(effect)
                elif isinstance(effect, Reject):
                    outbox.append(self._rejection_entry(entry_id, inbound, effect, now_ms))
                elif not isinstance(effect, Note):
                    work.append((effect.id, effect))
            record = self._history(
                rkey, inbound.event, outcome.effects,
                before=before, state=state, now_ms=now_ms, token=token,
            )  # fmt: skip
            if record is not None:
                history.append(record)
        self.metrics.job_changed(shard, initial, state)
        if state is None and initial is None:
            return Commit(
                rkey=rkey, state=None, keep_state=True, ack_ids=_ids(items), outbox=tuple(outbox)
            ), work
        if state is None:
            return Commit(
                rkey=rkey,
                state=None,
                delete=True,
                ack_ids=_ids(items),
                outbox=tuple(outbox),
                effects=_intents(work),
            ), work
        return Commit(
            rkey=rkey,
            state=encode(state),
            resource=resource,
            timer_due_ms=timer,
            ack_ids=_ids(items),
            outbox=tuple(outbox),
            effects=_intents(work),
            history=tuple(history),
        ), work

    def _upstream(self, effect: Publish) -> OutboxEntry:
        header = messages.Header(
            namespace=effect.namespace,
            resource_kind=effect.kind,
            resource_name=effect.name,
            operation="status",
            id=effect.id,
        )
        payload = msgspec.json.encode({"header": header, "content": effect.content})
        return OutboxEntry(effect.id, self.config.upstream_topic_for(effect.namespace), payload)

    def _rejection_entry(
        self, entry_id: str, inbound: Inbound, effect: Reject, now_ms: int
    ) -> OutboxEntry:
        topic = inbound.topic or "internal"
        data = self._record_rejection(
            topic, effect.reason, inbound.head, inbound.received_ms or now_ms
        )
        return OutboxEntry(f"{entry_id}/rejection", self.config.errors_topic(), data)

    def _record_rejection(self, topic: str, reason: str, payload: bytes, at_ms: int) -> bytes:
        """The Rejection record of a refused message: logged, counted, dead-lettered; returned
        encoded for the errors topic (published at once or through the outbox by the caller)."""
        received = datetime.fromtimestamp(at_ms / 1000, UTC)
        data = messages.encode(messages.make_rejection(topic, reason, payload, received))
        log.warning("rejected message on %s: %s", topic, reason, extra={"outcome": "rejected"})
        self.metrics.rejections.labels(reason=_reason_class(reason)).inc()
        try:
            self.store.dead_letter(data)
        except StoreUnavailable as e:
            log.warning("dead-letter stream unavailable: %s", e)
        return data

    def _count_dataset(self, effect: Publish) -> None:
        if effect.kind == "dataset":
            count = effect.content.get("numberOfSamples")
            if isinstance(count, int):
                self.metrics.dataset_samples.labels(
                    namespace=effect.namespace, name=effect.name
                ).set(count)

    def _history(
        self,
        rkey: str,
        event: Event,
        effects: tuple[Effect, ...],
        *,
        before: State | None,
        state: State | None,
        now_ms: int,
        token: str,
    ) -> bytes | None:
        """A counter increment, a log line and a history record per event.

        An event that changed nothing but its own timer (an idle trigger check, a poll that
        found nothing new) and says nothing is counted only: 10,000 idle jobs must not fill
        the logs and Redis with their heartbeats.
        """
        notes = tuple(e.reason for e in effects if isinstance(e, Note | Reject))
        if any(isinstance(e, Reject) for e in effects):
            outcome: history.Outcome = "rejected"
        elif _material(before) == _material(state) and not any(
            isinstance(e, Publish) for e in effects
        ):
            outcome = "ignored"
        else:
            outcome = "applied"
        event_type = type(event).__name__
        if isinstance(state, JobState):
            record = history.HistoryRecord(
                at_ms=now_ms, event=event_type, outcome=outcome, notes=notes, token=token,
                phase=state.phase, step=state.step, version=state.version,
            )  # fmt: skip
        elif isinstance(state, DatasetState) and state.num_samples >= 0:
            record = history.HistoryRecord(
                at_ms=now_ms, event=event_type, outcome=outcome, notes=notes, token=token,
                samples=state.num_samples,
            )  # fmt: skip
        else:
            record = history.HistoryRecord(
                at_ms=now_ms, event=event_type, outcome=outcome, notes=notes, token=token
            )
        self.metrics.events.labels(type=event_type, outcome=outcome).inc()
        if outcome == "ignored" and not notes:
            return None
        view = {"phase": record.phase, "step": record.step, "version": record.version,
                "samples": record.samples}  # fmt: skip
        log.info(
            "%s %s -> %s%s",
            event_type,
            outcome,
            " ".join(f"{k}={v}" for k, v in view.items() if v is not None),
            ("; " + "; ".join(notes)) if notes else "",
            extra={
                "job" if rkey.startswith("job:") else "dataset": rkey.partition(":")[2],
                "event": event_type,
                "outcome": outcome,
            },
        )
        return history.encode_record(record)

    # ================================================================ effects
    def _submit(self, shard: int, effect_id: str, work: Work) -> None:
        if self._stop.is_set():
            return  # the intent stays in Redis; the next owner runs it
        with self._running_lock:
            if effect_id in self._running:
                return  # recovery found an intent this process is already running
            self._running.add(effect_id)
        self._effects.submit(self._run_effect, shard, effect_id, work)

    def _run_effect(self, shard: int, effect_id: str, work: Work) -> None:
        try:
            self._run_effect_until_done(shard, effect_id, work)
        finally:
            with self._running_lock:
                self._running.discard(effect_id)

    def _run_effect_until_done(self, shard: int, effect_id: str, work: Work) -> None:
        """Do the work, then complete the intent under the shard's lease as held NOW.

        The lease may have moved while the work ran (even back to this replica under a new
        token, whose recovery then skipped the intent as already running). The result does
        not depend on who computed it, so completing under the current token is correct;
        with no lease, the next owner finds the intent and redoes it.
        """
        kind = type(work).__name__
        while not self._stop.is_set():
            try:
                result = self.executor.run(work, self.clock.now_ms())
                data = encode_inbound(Inbound(event=result)) if result is not None else None
                token = self.leases.token(shard)
                if token is None:
                    log.info(
                        "effect %s done but shard %d moved: its owner redoes it", effect_id, shard
                    )
                    return
                self.store.complete_effect(shard, token, effect_id, data)
                self.metrics.effects.labels(type=kind, outcome="done").inc()
                return
            except LeaseLost:
                log.info(
                    "effect %s: shard %d moved while it ran; its owner redoes it", effect_id, shard
                )
                return
            except StoreUnavailable as e:
                log.warning("effect %s waits for redis: %s", effect_id, e)
            except Exception:
                log.exception("effect %s (%s) failed unexpectedly; retrying", effect_id, kind)
                self.metrics.effects.labels(type=kind, outcome="error").inc()
            self._stop.wait(EFFECT_RETRY_S)

    # ================================================================ timers and outbox
    def _fire_timers(self) -> None:
        """Due trigger checks and dataset polls into the ingress, all owned shards at once."""
        held = self.leases.held()
        if not held:
            return
        for shard, fired in self.store.fire_due_timers(held, self.clock.now_ms()).items():
            if fired is None:
                self.leases.lost(shard, held[shard])

    def _outbox_once(self) -> None:
        self.outbox.run_once()
        self.outbox.wait(self._stop)


@dataclass
class _ShardBatch:
    """One shard's part of a read: its events by resource and what applying them produced."""

    shard: int
    token: str
    states: dict[str, bytes | None]
    groups: dict[str, list[tuple[str, Inbound | None]]]
    commits: list[Commit] = field(default_factory=list)
    work: list[tuple[str, Work]] = field(default_factory=list)


class ShardStates:
    """The committed states of owned shards' resources, each shard's valid for one lease token.

    While a replica holds a shard's lease it is the only writer of the shard's states (every
    commit is fenced), so what it committed is what Redis holds and need not be read back. A
    new token (the shard came back, maybe changed by another replica meanwhile) starts empty;
    a commit that failed or whose fate is unknown empties it, replaying a shard's pending
    entries empties it, and any Redis outage empties all. Used by the processor thread only.
    """

    def __init__(self) -> None:
        self._by_shard: dict[int, tuple[str, dict[str, bytes | None]]] = {}

    def of(self, shard: int, token: str) -> dict[str, bytes | None]:
        current = self._by_shard.get(shard)
        if current is None or current[0] != token:
            current = (token, {})
            self._by_shard[shard] = current
        return current[1]

    def forget(self, shard: int) -> None:
        self._by_shard.pop(shard, None)

    def clear(self) -> None:
        self._by_shard.clear()

    def keep_only(self, shards: Collection[int]) -> None:
        for shard in [s for s in self._by_shard if s not in shards]:
            del self._by_shard[shard]


def _material(state: State | None) -> State | None:
    """The state without its bookkeeping of timers and polls in flight."""
    if isinstance(state, JobState):
        return msgspec.structs.replace(state, next_check_ms=None)
    if isinstance(state, DatasetState):
        return msgspec.structs.replace(state, polling=False)
    return state


def _ids(items: list[tuple[str, Inbound | None]]) -> tuple[str, ...]:
    return tuple(entry_id for entry_id, _ in items)


def _intents(work: list[tuple[str, Work]]) -> tuple[tuple[str, bytes], ...]:
    return tuple((effect_id, encode(item)) for effect_id, item in work)


def _reason_class(reason: str) -> str:
    """A short, bounded label for the rejections counter."""
    lowered = reason.lower()
    for needle, label in (
        ("too large", "too_large"),
        ("unknown job", "unknown_job"),
        ("does not match", "name_mismatch"),
        ("utf-8", "invalid_utf8"),  # before "json": the decoder says "not valid JSON: ...UTF-8"
        ("not valid json", "invalid_json"),
        ("json", "invalid_json"),
        ("nesting", "too_deep"),
        ("no handler", "unknown_topic"),
        ("cannot change", "immutable_field"),
    ):
        if needle in lowered:
            return label
    return "invalid"
