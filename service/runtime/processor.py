"""The processor: reads the owned shards' ingress, runs each resource's events through the
pure core, and commits state + outbox + timers + effect intents + history + acks atomically,
fenced by the shard's lease; then hands the commit's work to the effect runner and its
messages to the outbox. A resource whose state or entry cannot be decoded is quarantined
(`service.runtime.quarantine`) and the rest of its shard goes on."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import msgspec

from service import failpoints
from service.adapters.redis_store import (
    Commit,
    IngressEntry,
    OutboxEntry,
    Quarantine,
    RedisStore,
)
from service.config import Config
from service.core.state import DatasetState, decode_state
from service.errors import LeaseLost, StoreUnavailable
from service.heartbeat import progress
from service.keys import shard_of
from service.metrics import Metrics
from service.runtime.claims import OutputDirs
from service.runtime.clock import Clock
from service.runtime.dataset_health import DatasetHealth
from service.runtime.effects import EffectRunner
from service.runtime.journal import Journal
from service.runtime.leases import LeaseKeeper
from service.runtime.outbox import OutboxPublisher
from service.runtime.planner import Plan
from service.runtime.quarantine import (
    Held,
    Isolation,
    Quarantines,
)
from service.runtime.rejections import Rejections
from service.runtime.resources import UNKNOWN, ResourceRunner, Transition, entry_event
from service.runtime.state_cache import ShardStates

log = logging.getLogger(__name__)

READ_BATCH = 500
READ_BLOCK_MS = 200



@dataclass
class _ShardBatch:
    """One shard's part of a read: its events by resource and what applying them produced."""

    shard: int
    token: str
    states: dict[str, bytes | None]
    groups: dict[str, list[Held]]
    plans: list[Plan] = field(default_factory=list)
    isolations: list[Isolation] = field(default_factory=list)

    def ops(self) -> list[Commit | Quarantine]:
        return [p.commit for p in self.plans] + [i.op for i in self.isolations]


class Processor:
    def __init__(
        self,
        *,
        config: Config,
        store: RedisStore,
        leases: LeaseKeeper,
        clock: Clock,
        transition: Transition,
        effects: EffectRunner,
        outbox: OutboxPublisher,
        journal: Journal,
        rejections: Rejections,
        datasets: DatasetHealth,
        metrics: Metrics,
        stop: threading.Event,
    ) -> None:
        self._config = config
        self._ingress = store.ingress
        self._stored = store.states
        self._outboxes = store.outboxes
        self._leases = leases
        self._clock = clock
        self._effects = effects
        self._outbox = outbox
        self._journal = journal
        self._rejections = rejections
        self._datasets = datasets
        self._metrics = metrics
        self._stop = stop
        self._states = ShardStates()
        self._quarantines = Quarantines(metrics)
        self._runner = ResourceRunner(
            config=config, clock=clock, transition=transition, quarantines=self._quarantines,
            output_dirs=OutputDirs(
                store.records, store.states, int(config.lease_s * 2000), config.volume_prefix
            ),
            metrics=metrics,
        )  # fmt: skip
        self._fresh: set[int] = set()
        self._fresh_lock = threading.Lock()
        self._pending_sweep_at_s = 0.0

    def on_acquired(self, shard: int) -> None:
        """A shard just became ours: its pending entries and effects are redone first."""
        with self._fresh_lock:
            self._fresh.add(shard)

    def run_once(self) -> None:
        try:
            self._process_owned()
        except StoreUnavailable:
            # Redis may be restarting and come back having lost its last writes (an AOF
            # fsynced every second): only what it holds then is the truth
            self._states.clear()
            raise

    def _process_owned(self) -> None:
        held = self._leases.held()
        self._states.keep_only(held)
        self._quarantines.keep_only(held)
        self._metrics.keep_jobs_of(held)
        self._datasets.keep_only(held)
        if not held:
            self._stop.wait(0.1)
            return
        fresh = self._take_fresh(held)
        if fresh:
            self._recover(fresh)
            return
        entries = self._ingress.read_ingress(
            sorted(held), count=READ_BATCH, block_ms=READ_BLOCK_MS, pending=False
        )
        self._apply(entries)

    def _take_fresh(self, held: dict[int, str]) -> list[int]:
        """Shards to recover now: the newly acquired ones, or every held one once per lease
        TTL. A replica waking past its lease (SIGSTOP, a long GC pause) may still read new
        entries of shards that moved on: reading is not fenced, its commit is, so they stay
        pending under the shared consumer name, where only a pending read finds them."""
        with self._fresh_lock:
            fresh = sorted(s for s in self._fresh if s in held)
            self._fresh.clear()
        self._report_jobs(fresh)
        now_s = self._clock.monotonic_s()
        if now_s >= self._pending_sweep_at_s:
            self._pending_sweep_at_s = now_s + self._config.lease_s
            fresh = sorted(held)
        return fresh

    def _report_jobs(self, shards: list[int]) -> None:
        """Set the gauges of the jobs and datasets on shards that just became ours: a job
        waiting for its worker may get no event for hours, a dataset none until its next
        poll, and would have no series here until then (the previous owner dropped its
        series when it lost the shard)."""
        if not shards:
            return
        try:
            states = self._stored.load(self._stored.list_rkeys(None, shards))
        except StoreUnavailable:
            with self._fresh_lock:
                self._fresh.update(shards)
            raise
        for rkey, raw in states.items():
            try:
                state = decode_state(raw) if raw is not None else None
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # quarantined when an event for it comes (or its retry timer)
            if isinstance(state, DatasetState):
                self._datasets.committed(rkey, state, ())
            else:
                self._metrics.job_changed(shard_of(rkey), None, state)

    def _recover(self, shards: list[int]) -> None:
        """Redo what is pending in shards just become ours (or whose commit's fate is unknown).

        Pending entries are replayed against the states Redis holds, never cached ones: had
        Redis lost a commit (its ack with it), the cache would already hold that commit's
        result and the replay would apply the event twice. A shard whose events fail (a
        bug) is left for the next sweep: its entries would come back at once, for ever.
        """
        replayed: set[int] = set()
        stuck: set[int] = set()
        try:
            self._quarantines.load(self._stored.quarantine_marks(self._still_ours(shards)))
            while True:
                progress()
                # only shards still ours: a lost one's entries stay pending for its new owner
                readable = [s for s in self._still_ours(shards) if s not in stuck]
                entries = self._ingress.read_ingress(
                    readable, count=READ_BATCH, block_ms=0, pending=True
                )
                if not entries:
                    break
                for shard in {entry.shard for entry in entries} - replayed:
                    self._states.forget(shard)
                    replayed.add(shard)
                stuck |= self._apply(entries)
            for shard, intents in self._outboxes.pending_effects(self._still_ours(shards)).items():
                for effect_id, data in intents.items():
                    self._effects.resubmit(shard, effect_id, data)
        except StoreUnavailable:
            with self._fresh_lock:
                self._fresh.update(shards)
            raise
        self._outbox.wake(set(shards))

    def _still_ours(self, shards: list[int]) -> list[int]:
        return [shard for shard in shards if self._leases.token(shard) is not None]

    # ------------------------------------------------------------ one read
    def _apply(self, entries: list[IngressEntry]) -> set[int]:
        """Apply a read's entries, every owned shard's commits in one round trip; the shards
        whose events failed (their entries stay pending)."""
        batches = self._batches(entries)
        if not batches:
            return set()
        try:
            self._load_missing(batches)
            ran = [batch for batch in batches if self._run_shard(batch)]
            failed = {batch.shard for batch in batches} - {batch.shard for batch in ran}
            batches = ran
            failpoints.hit("process-before-commit")
            outcomes = self._stored.commit([(b.shard, b.token, b.ops()) for b in batches])
        except BaseException as e:
            for batch in batches:
                self._states.forget(batch.shard)  # its fate unknown: Redis is the truth
            if isinstance(e, StoreUnavailable):
                with self._fresh_lock:  # the commit may or may not have happened
                    self._fresh.update(batch.shard for batch in batches)
            raise
        self._committed(batches, outcomes)
        return failed

    def _batches(self, entries: list[IngressEntry]) -> list[_ShardBatch]:
        by_shard: dict[int, dict[str, list[Held]]] = {}
        for entry in entries:
            rkey, held = entry_event(entry)
            groups = by_shard.setdefault(entry.shard, {})
            groups.setdefault(rkey, []).append(held)
        batches = []
        for shard, groups in by_shard.items():
            token = self._leases.token(shard)
            if token is None:
                continue  # no longer ours: the entries stay pending for the next owner
            batches.append(_ShardBatch(shard, token, self._states.of(shard, token), groups))
        return batches

    def _committed(
        self, batches: list[_ShardBatch], outcomes: list[list[list[str]] | LeaseLost]
    ) -> None:
        """Keep what committed, start its effects and publish its messages, then log, count
        and dead-letter it (after: the effects and messages are what a round waits for)."""
        done: list[tuple[_ShardBatch, list[list[str]]]] = []
        for batch, outcome in zip(batches, outcomes, strict=True):
            if isinstance(outcome, LeaseLost):
                self._states.forget(batch.shard)
                self._leases.lost(batch.shard, batch.token)
                continue
            for p in batch.plans:
                _remember(batch.states, p.commit)
            done.append((batch, outcome[: len(batch.plans)]))
        failpoints.hit("process-before-effects")
        upstream: list[tuple[int, list[tuple[str, OutboxEntry]]]] = []
        for batch, outbox_ids in done:
            for p, ids in zip(batch.plans, outbox_ids, strict=True):
                for effect_id, item in p.work:
                    self._effects.submit(batch.shard, effect_id, item)
                if ids:
                    upstream.append((batch.shard, list(zip(ids, p.commit.outbox, strict=True))))
        self._outbox.send(upstream)
        for batch, _ in done:
            self._record(batch)

    def _record(self, batch: _ShardBatch) -> None:
        """The journal, rejections, dataset health and quarantines of a committed batch."""
        for p in batch.plans:
            self._journal.write(p.commit.rkey, p.records, p.changed)
            for rejected in p.rejected:
                self._rejections.recorded(
                    rejected.topic, rejected.code, rejected.reason, rejected.record
                )
            self._datasets.committed(p.commit.rkey, p.state, p.unreadable)
            if p.commit.clear_mark:
                self._quarantines.ended(batch.shard, p.commit.rkey)
        for isolation in batch.isolations:
            self._quarantines.committed(isolation)
            for letter in isolation.letters:
                self._rejections.set_aside(
                    letter.topic, letter.reason, letter.payload, letter.at_ms
                )

    def _run_shard(self, batch: _ShardBatch) -> bool:
        """Run the transitions of one shard's events; False if that failed (a bug): its
        entries then stay pending, and the other shards of the read still commit."""
        try:
            for rkey, items in batch.groups.items():
                if rkey == UNKNOWN:
                    now_ms = self._clock.now_ms()
                    batch.isolations.append(
                        self._quarantines.set_aside_unknown(batch.shard, items, now_ms)
                    )
                    continue
                result = self._runner.plan(batch.shard, batch.token, rkey, batch.states, items)
                if isinstance(result, Plan):
                    batch.plans.append(result)
                else:
                    batch.isolations.append(result)
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
        loaded = self._stored.load(missing)
        for batch in batches:
            for rkey in batch.groups:
                if rkey not in batch.states:
                    batch.states[rkey] = loaded[rkey]



def _remember(states: dict[str, bytes | None], commit: Commit) -> None:
    """The cache follows what the commit wrote."""
    if commit.delete:
        states[commit.rkey] = None
    elif not commit.keep_state:
        states[commit.rkey] = commit.state
