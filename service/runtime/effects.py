"""Runs effect intents on a small thread pool and completes each under the shard's lease.

An intent found in Redis that cannot be decoded (not written by this service) is set aside
(`Rejections.unreadable`) and retired, so the intents after it still run."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import msgspec

from service.adapters.redis_store import Outboxes
from service.core.effects import Work, decode_work
from service.errors import LeaseLost, StoreUnavailable
from service.heartbeat import Heartbeats, progress
from service.metrics import Metrics
from service.runtime.accept import Accepted, encode_accepted
from service.runtime.clock import Clock
from service.runtime.executor import Executor
from service.runtime.leases import LeaseKeeper
from service.runtime.rejections import Rejections

log = logging.getLogger(__name__)

EFFECT_WORKERS = 4
EFFECT_RETRY_S = 1.0


class EffectRunner:
    """Each intent runs once per process at a time; its result event goes to the ingress in
    the same script that retires the intent.

    A pool thread is watched (`Heartbeats`) while it runs an intent, under its own name: it
    beats at each attempt, and the work beats as it goes (`service.heartbeat.progress`). An
    idle pool thread waits for work and is not watched."""

    def __init__(
        self,
        *,
        executor: Executor,
        outboxes: Outboxes,
        leases: LeaseKeeper,
        clock: Clock,
        metrics: Metrics,
        rejections: Rejections,
        stop: threading.Event,
        heartbeats: Heartbeats,
    ) -> None:
        self._executor = executor
        self._heartbeats = heartbeats
        self._outboxes = outboxes
        self._leases = leases
        self._clock = clock
        self._metrics = metrics
        self._rejections = rejections
        self._stop = stop
        self._pool = ThreadPoolExecutor(EFFECT_WORKERS, thread_name_prefix="effects")
        self._running: set[str] = set()
        self._lock = threading.Lock()

    def submit(self, shard: int, effect_id: str, work: Work) -> None:
        if self._stop.is_set():
            return  # the intent stays in Redis; the next owner runs it
        with self._lock:
            if effect_id in self._running:
                return  # recovery found an intent this process is already running
            self._running.add(effect_id)
        self._pool.submit(self._run, shard, effect_id, work)

    def resubmit(self, shard: int, effect_id: str, intent: bytes) -> None:
        """Run a pending intent as stored in Redis (`submit`); one that cannot be decoded is
        set aside and retired under the shard's lease (left for the next owner without it)."""
        try:
            work = decode_work(intent)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            token = self._leases.token(shard)
            if token is None:
                return
            self._rejections.unreadable(
                "effects", f"shard {shard} intent {effect_id}", f"not an effect intent: {e}",
                intent, self._clock.now_ms(),
            )  # fmt: skip
            self._outboxes.complete_effect(shard, token, effect_id, None)
            return
        self.submit(shard, effect_id, work)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, shard: int, effect_id: str, work: Work) -> None:
        beat = self._heartbeats.watch(threading.current_thread().name)
        try:
            with beat:
                self._run_until_done(shard, effect_id, work)
        finally:
            beat.close()  # idle in the pool from now on, whatever happened
            with self._lock:
                self._running.discard(effect_id)

    def _run_until_done(self, shard: int, effect_id: str, work: Work) -> None:
        """Do the work, then complete the intent under the shard's lease as held NOW.

        The lease may have moved while the work ran (even back to this replica under a new
        token, whose recovery then skipped the intent as already running). The result does
        not depend on who computed it, so completing under the current token is correct;
        with no lease, the next owner finds the intent and redoes it.
        """
        kind = type(work).__name__
        while not self._stop.is_set():
            progress()
            try:
                self._complete(shard, effect_id, work)
                self._metrics.effects.labels(type=kind, outcome="done").inc()
                return
            except LeaseLost:
                log.info("effect %s: shard %d moved while it ran; its owner redoes it",
                         effect_id, shard)  # fmt: skip
                return
            except StoreUnavailable as e:
                log.warning("effect %s waits for redis: %s", effect_id, e)
            except Exception:
                log.exception("effect %s (%s) failed unexpectedly; retrying", effect_id, kind)
                self._metrics.effects.labels(type=kind, outcome="error").inc()
            self._stop.wait(EFFECT_RETRY_S)

    def _complete(self, shard: int, effect_id: str, work: Work) -> None:
        result = self._executor.run(work, self._clock.now_ms())
        data = encode_accepted(Accepted(event=result)) if result is not None else None
        token = self._leases.token(shard)
        if token is None:
            raise LeaseLost(f"shard {shard} is no longer held")
        self._outboxes.complete_effect(shard, token, effect_id, data)
