"""The composition root: one `Replica` per process builds the adapters, wires the
collaborators and supervises their threads; with the replica's durable timers.

    intake    MQTT messages (while holding the ingress lease) -> durable ingress, then ack
    leases    heartbeat, renew, rebalance shards, hold or give up the ingress lease
    processor ingress -> transition -> one fenced commit per resource
    timers    due trigger checks and dataset polls -> ingress
    outbox    committed upstream messages -> broker (and the GM), forgotten once sent
    presence  the retained online/offline topic, and the replica's gauges
    effects   a small pool running effect intents, results back as events
    watchdog  every thread above beats a heartbeat; a silent one is logged with its stack,
              counted, and past the lease fails /healthz and costs the replica its leases

`Timers`: due trigger checks and dataset polls move into the ingress
  streams.

Nothing here decides anything about a job or a dataset: that is `service.core`.
"""


import logging
import math
import os
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

from service.adapters.blobs import BlobStore
from service.adapters.dataset_sources import DatasetReader
from service.adapters.files import LocalFiles
from service.adapters.http_server import HttpServer
from service.adapters.mqtt import Inbound, MqttClient, MqttSettings
from service.adapters.redis_store import Ingress, RedisStore
from service.adapters.s3 import S3Clients
from service.config import Config
from service.core.lifecycle import transition
from service.errors import ServiceError, StoreUnavailable
from service.heartbeat import Beat, Clock, Heartbeats, SystemClock
from service.keys import Keys
from service.metrics import Metrics
from service.runtime.executor import EffectRunner, Executor, InlineEffects
from service.runtime.handoff import Handoff
from service.runtime.intake import (
    Admission,
    GmBridge,
    GmFactory,
    Intake,
    WorkerEndpoint,
    ingress_client_factory,
)
from service.runtime.leases import LeaseKeeper, Presence, presence_payload
from service.runtime.outbox import IDLE_WAIT_S as OUTBOX_IDLE_WAIT_S
from service.runtime.outbox import OutboxPublisher
from service.runtime.processor import DatasetHealth, Journal, Processor, Transition
from service.runtime.rejections import Rejections

log = logging.getLogger(__name__)


#: How often the owned shards' timer sets are checked.
TIMER_INTERVAL_S = 0.25


class Timers:
    def __init__(self, ingress: Ingress, leases: LeaseKeeper, clock: Clock) -> None:
        self._ingress = ingress
        self._leases = leases
        self._clock = clock

    def fire_due(self) -> None:
        """Every owned shard's due timers into its ingress, in one round trip; a shard whose
        lease turned out to be gone is dropped."""
        held = self._leases.held()
        if not held:
            return
        for shard, fired in self._ingress.fire_due_timers(held, self._clock.now_ms()).items():
            if fired is None:
                self._leases.lost(shard, held[shard])


OUTBOX_FINISH_S = 2.0
PRESENCE_INTERVAL_S = 0.5
THREAD_JOIN_S = 10.0
LOOP_FAILURE_PAUSE_S = 0.5
#: how often the main thread, waiting for the replica to stop, wakes to run signal handlers
MAIN_WAKE_S = 0.5
#: Each blocking call on a watched thread waits at most this fraction of the lease, so the
#: thread beats well within half of it (the stall limit) even when a call times out.
CALL_TIMEOUT_FRACTION = 0.4
REDIS_SOCKET_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Tuning:
    """Knobs tests shrink; production keeps the defaults."""

    blob_attempts: int = 5
    blob_max_backoff_s: float = 8.0
    puback_timeout_s: float = 10.0


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Replica:
    """One controller process: owns a fair share of the shards, shares the rest."""

    def __init__(
        self,
        config: Config,
        *,
        replica_id: str | None = None,
        clock: Clock | None = None,
        tuning: Tuning | None = None,
        transition: Transition = transition,
    ) -> None:
        self.config = config
        self.replica = replica_id or default_replica_id()
        self.clock: Clock = clock or SystemClock()
        self.metrics = Metrics(gm_link=bool(config.gm_address))
        self.heartbeats = Heartbeats(self.clock.monotonic_s, config.lease_s, metrics=self.metrics)
        self.store = RedisStore(
            config.redis_url, Keys(config.key_prefix), min_replicas=config.min_replicas(),
            socket_timeout_s=min(REDIS_SOCKET_TIMEOUT_S, self.call_timeout_s),
        )  # fmt: skip
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._build_messaging()
        self.leases = LeaseKeeper(
            self.store.leases, self.replica, int(config.lease_s * 1000), clock=self.clock,
            on_acquired=self._on_acquired, on_ingress=self._on_ingress_lease,
            ingress_subscribed=lambda: self.intake.subscribed,
            live=lambda: self.heartbeats.live()[0],
        )  # fmt: skip
        self.handoff = Handoff()
        self.intake = Intake(
            config=config, ingress=self.store.ingress, leases=self.leases,
            rejections=self.rejections, handoff=self.handoff,
            clock=self.clock, stop=self._stop, client_factory=ingress_client_factory(config),
            admission=Admission(config=config, index=self.store.states, clock=self.clock),
            gm_factory=self._gm_factory() if config.gm_address else None,
        )  # fmt: skip
        self._build_processing(tuning or Tuning(), transition)
        endpoint = WorkerEndpoint(
            states=self.store.states, ingress=self.store.ingress, rejections=self.rejections,
            clock=self.clock, metrics=self.metrics, volume_prefix=config.volume_prefix,
        )  # fmt: skip
        host, port = config.http_host_port()
        self.http = HttpServer(
            host, port, ready=self.ready, metrics=self.metrics.render, worker_info=endpoint.report,
            token=config.http_bearer_token(), live=self.heartbeats.live,
            allowed_hosts=config.http_allowed_hosts_list(),
        )  # fmt: skip

    def _build_messaging(self) -> None:
        """The publishing MQTT client (its last will says offline), presence, rejections."""
        config = self.config
        will = presence_payload(self.replica, "offline", self.clock.now_ms())
        self.publisher = MqttClient(
            MqttSettings(
                url=config.mqtt_url,
                client_id=f"{config.key_prefix}-{config.node_name}-{self.replica}",
                will=(config.presence_topic(self.replica), will, True),
            ),
            on_connection_change=self._on_publisher_connection,
        )
        self.presence = Presence(
            config=config, replica=self.replica, publisher=self.publisher, clock=self.clock,
            can_take_messages=lambda: self.leases.ingress_ready,
        )  # fmt: skip
        self.rejections = Rejections(
            dead_letters=self.store.records, publisher=self.publisher,
            errors_topic=config.errors_topic(), metrics=self.metrics,
        )  # fmt: skip

    def _gm_factory(self) -> GmFactory:
        """A new link to the GM each time this replica takes the ingress lease."""

        def build(inbound: queue.SimpleQueue[Inbound]) -> GmBridge:
            return GmBridge(
                address=self.config.gm_address, node=self.config.node_name,
                replica=self.replica, outboxes=self.store.outboxes, leases=self.store.leases,
                inbound=inbound,
                rejections=self.rejections, metrics=self.metrics, clock=self.clock,
                report_ttl_ms=int(self.config.lease_s * 3000), heartbeats=self.heartbeats,
            )  # fmt: skip

        return build

    def _build_processing(self, tuning: Tuning, transition: Transition) -> None:
        """The processor and what it hands its results to: effects, outbox, timers."""
        self.outbox = OutboxPublisher(
            self.store.outboxes, self.publisher, lambda: sorted(self.leases.held()),
            clock=self.clock,
            rejections=self.rejections, puback_timeout_s=tuning.puback_timeout_s,
            # its thread beats once per wait: idle, it must wake well within the stall limit
            idle_wait_s=min(OUTBOX_IDLE_WAIT_S, self.heartbeats.check_interval_s),
            on_depth=self.metrics.outbox_depth.set,
        )  # fmt: skip
        s3 = S3Clients()
        files = LocalFiles(self.config.path_policy())
        blobs = BlobStore(
            s3, files=files, max_model_bytes=self.config.max_model_bytes,
            max_line_bytes=self.config.max_line_bytes,
            max_dataset_bytes=self.config.max_dataset_bytes,
            max_round_bytes=self.config.max_round_bytes, attempts=tuning.blob_attempts,
            max_backoff_s=tuning.blob_max_backoff_s,
        )  # fmt: skip
        reader = DatasetReader(
            s3, files=files, max_line_bytes=self.config.max_line_bytes,
            max_dataset_bytes=self.config.max_dataset_bytes,
        )  # fmt: skip
        executor = Executor(
            states=self.store.states, records=self.store.records, ingress=self.store.ingress,
            blobs=blobs, reader=reader, rounds_kept=self.config.rounds_kept,
        )  # fmt: skip
        inline = InlineEffects(
            executor=executor.trying_once(), leases=self.leases, clock=self.clock,
            metrics=self.metrics, max_bytes=self.config.inline_effect_bytes,
        )  # fmt: skip
        self.effects = EffectRunner(
            executor=executor,
            outboxes=self.store.outboxes,
            leases=self.leases, clock=self.clock, metrics=self.metrics,
            rejections=self.rejections, stop=self._stop, heartbeats=self.heartbeats,
            handoff=self.handoff,
        )  # fmt: skip
        self.processor = Processor(
            config=self.config, ingress=self.store.ingress, states=self.store.states,
            outboxes=self.store.outboxes, records=self.store.records, leases=self.leases,
            clock=self.clock,
            transition=transition, effects=self.effects, inline=inline, handoff=self.handoff,
            outbox=self.outbox,
            journal=Journal(self.metrics), rejections=self.rejections,
            datasets=DatasetHealth(self.metrics), metrics=self.metrics, stop=self._stop,
        )  # fmt: skip
        self.timers = Timers(self.store.ingress, self.leases, self.clock)

    @property
    def call_timeout_s(self) -> float:
        """The longest a blocking call on a watched thread may wait."""
        return self.config.lease_s * CALL_TIMEOUT_FRACTION

    # ================================================================ lifecycle
    def start(self) -> None:
        self.http.start()
        self.publisher.start()
        try:
            self.store.ingress.ensure_groups()
        except StoreUnavailable as e:
            log.warning("redis not reachable yet (%s); will keep trying", e)
        loops: tuple[tuple[str, Callable[[], None], float], ...] = (
            ("leases", self.leases.tick, self.config.lease_s / 3),
            ("timers", self.timers.fire_due, TIMER_INTERVAL_S),
            ("intake", self.intake.run_once, 0.0),
            ("processor", self.processor.run_once, 0.0),
            ("outbox", self._outbox_once, 0.0),
            ("presence", self._presence_once, PRESENCE_INTERVAL_S),
        )
        for name, loop, interval_s in loops:
            thread = threading.Thread(
                target=self._guarded, args=(name, loop, interval_s), name=name, daemon=True
            )
            thread.start()
            self._threads.append(thread)
        watchdog = threading.Thread(
            target=self.heartbeats.run, args=(self._stop,), name="watchdog", daemon=True
        )
        watchdog.start()
        self._threads.append(watchdog)
        log.info("replica %s started on node %s", self.replica, self.config.node_name)

    def stop(self) -> None:
        """Graceful: stop intake, finish the commit in flight, release leases, say offline."""
        if self._stop.is_set():
            return
        log.info("replica %s stopping", self.replica)
        self._stop.set()
        self.intake.on_ingress_lease(False)
        self.http.stop()
        for thread in self._threads:
            thread.join(timeout=THREAD_JOIN_S)
        self.effects.shutdown()
        try:
            self.outbox.finish(OUTBOX_FINISH_S)
        except ServiceError as e:
            log.warning("could not forget acknowledged upstream messages: %s", e)
        try:
            self.leases.release_all()
        except ServiceError as e:
            log.warning("could not release leases: %s", e)
        self.presence.offline()
        self.publisher.stop()
        self.store.close()
        log.info("replica %s stopped", self.replica)

    def wait(self) -> None:
        """Until the replica stops, waking every `MAIN_WAKE_S`: Python runs a signal's
        handler only in the main thread, once that thread wakes, and the kernel may hand a
        SIGTERM to another thread (as it does right after a SIGCONT, for one): a main thread
        asleep with no timeout would then never act on it."""
        while not self._stop.wait(MAIN_WAKE_S):
            pass

    def _guarded(self, name: str, loop: Callable[[], None], interval_s: float) -> None:
        """Run one loop until stop, beating each time round; no exception ever escapes a
        thread's top. Should the thread end otherwise, its beat stays watched: the watchdog
        then reports it ended."""
        with self.heartbeats.watch(name) as beat:
            while not self._stop.is_set():
                beat()  # before and after the work: silent for the longer of it and the pause
                try:
                    loop()
                except StoreUnavailable as e:
                    log.warning("%s: redis unavailable: %s", name, e)
                    beat()
                    self._pause(LOOP_FAILURE_PAUSE_S, beat)
                except Exception:
                    log.exception("%s loop failed; continuing", name)
                    beat()
                    self._pause(LOOP_FAILURE_PAUSE_S, beat)
                beat()
                if interval_s:
                    self._pause(interval_s, beat)

    def _pause(self, seconds: float, beat: Beat) -> None:
        """Wait ``seconds`` (less once stopped), beating at least once per watchdog check: a
        loop that pauses as long as the stall limit (presence's 0.5 s on the shortest lease,
        1 s) must not be reported stalled between its runs."""
        slices = math.ceil(seconds / self.heartbeats.check_interval_s)
        for _ in range(slices):
            if self._stop.wait(seconds / slices):
                return
            beat()

    # ================================================================ health
    def ready(self) -> tuple[bool, str]:
        """Ready: MQTT and Redis connected and, when this replica holds the ingress lease, its
        client subscribed too (so a message sent now is not missed)."""
        intake = self.intake.state
        mqtt_ok = self.publisher.connected
        redis_ok = self.leases.store_ok
        intake_ok = intake == "up" or (intake == "standby" and not self.leases.holds_ingress)
        detail = (
            f"mqtt={'up' if mqtt_ok else 'down'} redis={'up' if redis_ok else 'down'} "
            f"shards={len(self.leases.held())} ingress={intake} gm={self.intake.gm_state}"
        )
        return mqtt_ok and redis_ok and intake_ok, detail

    # ================================================================ wiring
    def _on_acquired(self, shard: int) -> None:
        self.processor.on_acquired(shard)

    def _on_ingress_lease(self, held: bool) -> None:
        self.intake.on_ingress_lease(held)

    def _on_publisher_connection(self, connected: bool) -> None:
        self.presence.on_connection(connected)
        if connected:
            self.outbox.wake(None)

    def _presence_once(self) -> None:
        self.presence.announce()
        self.rejections.flush_log()
        self.metrics.leases_held.set(len(self.leases.held()))
        self.metrics.set_health(
            self.config.node_name,
            ready=self.ready()[0],
            ingress_held=self.leases.holds_ingress,
            redis_up=self.leases.store_ok,
            mqtt_up=self.publisher.connected,
        )

    def _outbox_once(self) -> None:
        self.outbox.run_once()
        self.outbox.wait(self._stop)
