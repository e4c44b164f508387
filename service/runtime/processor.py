"""The processor: reads the owned shards' ingress, runs each resource's events through the
pure core, plans one commit per resource and commits them fenced by the shard's lease; then
hands the commit's work to the effect runner and its messages to the outbox.

The stages, in this module's order:

- The journal (`Journal`): every transition leaves a trace: a counter by event type and
  verdict, and a log line for those worth one (the same records the commit stored as the
  resource's history). A dataset's sample gauge is `DatasetHealth`'s, which also removes it.
- The state cache (`ShardStates`): the committed states of owned shards' resources, kept so
  the hot path skips a read, and the decode of what it read or committed once before; an
  effect run inline takes the Models it needs from it too.
- The planner (`plan`): folds the transitions of one resource's events into one commit,
  pure, so it is tested without Redis. Everything the transitions produced lands in one
  `Commit` (state, resource JSON, timer, acknowledged entries, upstream messages (built by
  `outbox.upstream_entry`, the GM's among them) and errors messages, effect intents,
  history, the records of rounds that ended), which Redis applies all-or-nothing, fenced by
  the shard's lease.
- The resource runner (`ResourceRunner`): one resource's events of a read, through the pure
  core and into one plan; or, when the resource's state or one of its entries cannot be
  decoded, its entries set aside by the quarantine (`rejections.Quarantines`). A small local
  effect a transition asks for is done right then (`executor.InlineEffects`) and its result
  event applied next, in the same plan, so one commit carries both.
- The processor itself (`Processor`): commits state + outbox + timers + effect intents +
  history + acks atomically, fenced by the shard's lease, every shard of a read in one round
  trip. Besides the ingress it takes what other threads hand it in process
  (`service.runtime.handoff`), each applied like an ingress entry: an effect's result, in a
  commit that retires its intent instead of acknowledging an entry; a message the intake
  took in, in a commit that sets its dedupe marker, acknowledged to the broker after it.
  Such a message is applied only after the shard's stream was read to its end (what the
  intake appended before it comes first) and once the shard's recovery ran under its
  current lease; a message of a shard no longer held is appended to the stream for its new
  owner. A resource whose state or entry cannot be decoded is quarantined
  (`rejections.Quarantines`) and the rest of its shard goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import typing
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from service import failpoints, history
from service.adapters.mqtt import Inbound
from service.adapters.redis_store import (
    Commit,
    Ingress,
    IngressEntry,
    Known,
    Markers,
    OutboxEntry,
    Outboxes,
    Quarantine,
    Records,
    States,
)
from service.config import Config
from service.core.effects import (
    Context,
    DatasetUnreadable,
    Forward,
    Note,
    Outcome,
    Publish,
    RecordRound,
    Refused,
    Reject,
    ScheduleCheck,
    Work,
    encode_work,
)
from service.core.events import Event, JobApplied, Tick
from service.core.rounds import encode_round
from service.core.state import DatasetState, JobState, State, decode_state, encode_state
from service.errors import LeaseLost, RejectCode, StoreUnavailable
from service.heartbeat import Clock, progress
from service.history import HistoryRecord, worth_keeping
from service.keys import parse_rkey, shard_of
from service.metrics import Metrics
from service.runtime.executor import EffectRunner, InlineEffects, KnownStates, OutputDirs
from service.runtime.handoff import Handoff, LocalResult, TakenMessage
from service.runtime.intake import Accepted, decode_accepted, encode_accepted, target_of
from service.runtime.leases import LeaseKeeper
from service.runtime.outbox import OutboxPublisher, upstream_entry
from service.runtime.rejections import (
    Cause,
    Held,
    Isolation,
    Quarantines,
    Rejections,
    guess_target,
    last_delete,
    rejection_record,
)

log = logging.getLogger(__name__)


class Journal:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def write(self, rkey: str, records: Iterable[HistoryRecord], changed: Iterable[bool]) -> None:
        """Count every record; log the applied ones and those that say something: at INFO
        when the transition changed the resource's view or said something, else at DEBUG
        (thousands of forwarded progress reports a second would otherwise cost more than
        applying them)."""
        for record, moved in zip(records, changed, strict=True):
            self._metrics.events.labels(type=record.event, outcome=record.outcome).inc()
            level = logging.INFO if moved or record.notes else logging.DEBUG
            if worth_keeping(record) and log.isEnabledFor(level):
                key = parse_rkey(rkey)
                log.log(
                    level,
                    "%s %s -> %s%s",
                    record.event,
                    record.outcome,
                    _view(record),
                    ("; " + "; ".join(record.notes)) if record.notes else "",
                    extra={key.kind: key.path, "event": record.event, "outcome": record.outcome},
                )


def _view(record: HistoryRecord) -> str:
    fields = {
        "phase": record.phase,
        "step": record.step,
        "version": record.version,
        "samples": record.samples,
    }
    return " ".join(f"{name}={value}" for name, value in fields.items() if value is not None)


Cached = bytes | State | None
"""A resource's state in `ShardStates`: as read (bytes), decoded, or None (there is none)."""


class ShardStates:
    """The committed states of owned shards' resources, each shard's valid for one lease token.

    While a replica holds a shard's lease it is the only writer of the shard's states (every
    commit is fenced), so what it committed is what Redis holds and need not be read back. A
    new token (the shard came back, maybe changed by another replica meanwhile) starts empty;
    a commit that failed or whose fate is unknown empties it, replaying a shard's pending
    entries empties it, and any Redis outage empties all. Used by the processor thread only.

    A state is held as read from Redis (`Cached` bytes) until a pass decodes it, then as
    the decoded state, as is the state a commit wrote: states are frozen values, so the next
    pass starts from the same object instead of decoding the same bytes again.
    """

    def __init__(self) -> None:
        self._by_shard: dict[int, tuple[str, dict[str, Cached]]] = {}

    def of(self, shard: int, token: str) -> dict[str, Cached]:
        current = self._by_shard.get(shard)
        if current is None or current[0] != token:
            current = (token, {})
            self._by_shard[shard] = current
        return current[1]

    def forget(self, shard: int) -> None:
        self._by_shard.pop(shard, None)

    def known(
        self, rkeys: Sequence[str], token_of: Callable[[int], str | None]
    ) -> dict[str, Cached]:
        """The states of ``rkeys`` cached under their shards' current lease tokens
        (``token_of``); the rest are left out, to be read from Redis."""
        found: dict[str, Cached] = {}
        for rkey in rkeys:
            shard = shard_of(rkey)
            current = self._by_shard.get(shard)
            if current is not None and current[0] == token_of(shard) and rkey in current[1]:
                found[rkey] = current[1][rkey]
        return found

    def clear(self) -> None:
        self._by_shard.clear()

    def keep_only(self, shards: Collection[int]) -> None:
        for shard in [s for s in self._by_shard if s not in shards]:
            del self._by_shard[shard]


@dataclass(frozen=True)
class Step:
    """One ingress entry of the resource and what its transition gave (None: the entry could
    not be decoded; it is acknowledged and dropped)."""

    entry_id: str
    accepted: Accepted | None
    outcome: Outcome | None
    at_ms: int
    #: an effect's result handed over in process: the intent the commit retires (the step
    #: then has no ingress entry to acknowledge)
    effect_id: str | None = None
    #: a message the intake handed over in process (no ingress entry to acknowledge)
    taken: bool = False
    #: the result of an effect run inline (`InlineEffects`) for the step before it: no
    #: entry to acknowledge, no intent to retire
    inline: bool = False
    #: the ids of this step's effects run inline: no intent is stored for them
    ran: Collection[str] = ()


@dataclass(frozen=True)
class Rejected:
    """A refusal the commit publishes on the errors topic; the caller logs and counts it."""

    topic: str
    code: RejectCode
    reason: str
    record: bytes


@dataclass(frozen=True)
class Plan:
    commit: Commit
    work: tuple[tuple[str, Work], ...]
    #: the history record of every transition, kept or not (the journal counts them all)
    records: tuple[history.HistoryRecord, ...]
    #: for each record, whether its transition changed the resource's view (phase, step,
    #: version, sample count): the journal logs those and the records that say something at
    #: INFO, the rest (a forwarded progress report) at DEBUG
    changed: tuple[bool, ...]
    rejected: tuple[Rejected, ...]
    #: datasets found unreadable (newly, or for a new reason): on the errors topic, counted
    unreadable: tuple[DatasetUnreadable, ...] = ()
    #: the resource's state once the commit applies (None: it is gone), and before the
    #: plan's first step (the job metrics count the move once the commit is done)
    state: State | None = None
    initial: State | None = None


def plan(
    rkey: str, token: str, initial: State | None, steps: Sequence[Step], config: Config
) -> Plan:
    """One commit carrying everything the steps did to the resource."""
    fold = _Fold(rkey, initial)
    view = history.view_of(initial)
    for step in steps:
        if step.accepted is None or step.outcome is None:
            continue
        fold.add(step, step.accepted, step.outcome, config)
        event = type(step.accepted.event).__name__
        record = history.record_of(event, step.outcome, at_ms=step.at_ms, token=token)
        fold.records.append(record)
        fold.changed.append(record.view() != view)
        view = record.view()
    ack_ids = tuple(
        s.entry_id for s in steps if s.effect_id is None and not s.taken and not s.inline
    )
    retire = tuple(step.effect_id for step in steps if step.effect_id is not None)
    commit = fold.commit(ack_ids, retire)
    return Plan(
        commit, tuple(fold.work), tuple(fold.records), tuple(fold.changed),
        tuple(fold.rejected), tuple(fold.unreadable), fold.state, initial,
    )  # fmt: skip


@dataclass
class _Fold:
    """What the steps so far add up to."""

    rkey: str
    initial: State | None
    state: State | None = None
    outbox: list[OutboxEntry] = field(default_factory=list)
    work: list[tuple[str, Work]] = field(default_factory=list)
    records: list[history.HistoryRecord] = field(default_factory=list)
    changed: list[bool] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    unreadable: list[DatasetUnreadable] = field(default_factory=list)
    rounds: list[bytes] = field(default_factory=list)
    timer_ms: int | None = None
    resource: bytes | None = None

    def __post_init__(self) -> None:
        self.state = self.initial

    def add(self, step: Step, accepted: Accepted, outcome: Outcome, config: Config) -> None:
        entry_id, at_ms = step.entry_id, step.at_ms
        self.state = outcome.state
        if accepted.resource is not None and self.state is not None:
            self.resource = accepted.resource
        for effect in outcome.effects:
            if isinstance(effect, ScheduleCheck):
                self.timer_ms = effect.due_ms
            elif isinstance(effect, Publish | Forward):
                self.outbox.append(upstream_entry(self.rkey, effect, config))
            elif isinstance(effect, Reject):
                refusal = _rejected(accepted, effect, at_ms)
                self.rejected.append(refusal)
                rejection_id = f"{entry_id}/rejection"
                self.outbox.append(OutboxEntry(rejection_id, config.errors_topic(), refusal.record))
            elif isinstance(effect, Refused):
                refusal = _refused(effect, at_ms, config)
                self.rejected.append(refusal)
                entry = OutboxEntry(f"{entry_id}/refused", config.errors_topic(), refusal.record)
                self.outbox.append(entry)
            elif isinstance(effect, DatasetUnreadable):
                self.unreadable.append(effect)
                record = _unreadable_record(effect, at_ms, config)
                entry = OutboxEntry(f"{entry_id}/unreadable", config.errors_topic(), record)
                self.outbox.append(entry)
            elif isinstance(effect, RecordRound):
                self.rounds.append(encode_round(effect.record))
            elif not isinstance(effect, Note) and effect.id not in step.ran:
                self.work.append((effect.id, effect))

    def commit(self, ack_ids: tuple[str, ...], retire: tuple[str, ...]) -> Commit:
        """The commit of the steps: it acknowledges ``ack_ids`` and retires the intents
        ``retire`` (those whose results the steps applied)."""
        outbox = tuple(self.outbox)
        if self.state is None and self.initial is None:
            # a resource that never was stored sends the GM nothing
            outbox = tuple(dataclasses.replace(e, gm=False) if e.gm else e for e in outbox)
            return Commit(
                rkey=self.rkey, state=None, keep_state=True, ack_ids=ack_ids, outbox=outbox,
                retire=retire,
            )  # fmt: skip
        intents = tuple((effect_id, encode_work(item)) for effect_id, item in self.work)
        if self.state is None:
            return Commit(
                rkey=self.rkey, state=None, delete=True, ack_ids=ack_ids, outbox=outbox,
                effects=intents, retire=retire,
            )  # fmt: skip
        kept = tuple(history.encode_record(r) for r in self.records if history.worth_keeping(r))
        unchanged = self.state == self.initial  # a forwarded report: nothing to rewrite
        return Commit(
            rkey=self.rkey,
            state=None if unchanged else encode_state(self.state),
            keep_state=unchanged,
            resource=self.resource,
            timer_due_ms=self.timer_ms,
            ack_ids=ack_ids,
            outbox=outbox,
            effects=intents,
            history=kept,
            rounds=tuple(self.rounds),
            retire=retire,
        )


def _unreadable_record(effect: DatasetUnreadable, at_ms: int, config: Config) -> bytes:
    """The errors-topic record of an unreadable dataset, shaped like a rejection: the topic
    its resource came on, the reason, and its URL as the payload."""
    reason = f"dataset {effect.namespace}/{effect.name} cannot be read: {effect.reason}"
    return rejection_record(config.downstream_topic(), reason, effect.url.encode(), at_ms)


def _refused(effect: Refused, at_ms: int, config: Config) -> Rejected:
    """The errors-topic record of a request refused after it was taken in (a rollback whose
    copy failed), shaped like a rejection: the downstream topic it came on, the reason, and
    its subject as the payload."""
    topic = config.downstream_topic()
    record = rejection_record(topic, effect.reason, effect.subject.encode(), at_ms)
    return Rejected(topic, effect.code, effect.reason, record)


def _rejected(accepted: Accepted, effect: Reject, at_ms: int) -> Rejected:
    topic = accepted.topic or "internal"
    record = rejection_record(topic, effect.reason, accepted.head, accepted.received_ms or at_ms)
    return Rejected(topic, effect.code, effect.reason, record)


Transition = Callable[[State | None, Event, Context], Outcome]
#: The `Work` types, as a tuple (`isinstance` takes one faster than a union).
_WORK = typing.get_args(Work)
#: The group of a read's entries whose resource cannot be told.
UNKNOWN = ""


class ResourceRunner:
    """Used by the processor thread only."""

    def __init__(
        self,
        *,
        config: Config,
        clock: Clock,
        transition: Transition,
        quarantines: Quarantines,
        output_dirs: OutputDirs,
        inline: InlineEffects,
        known: KnownStates,
        metrics: Metrics,
    ) -> None:
        """``known``: the stored states an effect run inline may take without reading
        Redis (the processor's cache)."""
        self._config = config
        self._clock = clock
        self._transition = transition
        self._quarantines = quarantines
        self._output_dirs = output_dirs
        self._inline = inline
        self._known = known
        self._metrics = metrics

    def plan(
        self,
        shard: int,
        token: str,
        rkey: str,
        states: dict[str, Cached],
        items: list[Held],
    ) -> Plan | Isolation:
        """The resource's plan, or its entries set aside when it is (or now becomes)
        quarantined: see `service.runtime.rejections`."""
        now_ms = self._clock.now_ms()
        mark = self._quarantines.mark_of(shard, rkey)
        corrupt = next((i for i, item in enumerate(items) if item.accepted is None), None)
        delete = last_delete(items)
        failure: tuple[Cause, str] | None
        if corrupt is not None:
            failure = ("entry", f"ingress entry {items[corrupt].entry_id} cannot be decoded: "
                       f"{items[corrupt].error}")  # fmt: skip
        elif mark is not None and now_ms < mark.retry_at_ms:
            failure = None  # waiting for its next try
        else:
            cached = states[rkey]
            try:
                initial = decode_state(cached) if isinstance(cached, bytes) else cached
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                failure = ("state", f"its stored state cannot be decoded: {e}")
            else:
                states[rkey] = initial
                result = self._fold(shard, token, rkey, initial, items)
                if mark is None:
                    return result
                return _with_commit(result, dataclasses.replace(result.commit, clear_mark=True))
        if delete is not None and (corrupt is None or corrupt < delete):
            return self._deleted(shard, token, rkey, items, delete)
        if failure is None:
            return self._quarantines.isolate(shard, rkey, items, now_ms, None)
        return self._quarantines.isolate(shard, rkey, items, now_ms, failure)

    def _deleted(self, shard: int, token: str, rkey: str, items: list[Held], delete: int) -> Plan:
        """A quarantined resource was deleted: its state goes, the quarantine ends, what came
        before the delete is dropped (into the commit's acks) and what came after applies to
        a resource that does not exist yet."""
        result = self._fold(shard, token, rkey, None, items[delete + 1 :])
        commit = result.commit
        dropped = tuple(item.entry_id for item in items[: delete + 1])
        commit = dataclasses.replace(
            commit,
            ack_ids=dropped + commit.ack_ids,
            clear_mark=True,
            keep_state=False,
            delete=commit.keep_state or commit.delete,
        )
        log.info("quarantined %s deleted", rkey)
        return _with_commit(result, commit)

    def _fold(
        self, shard: int, token: str, rkey: str, initial: State | None, items: list[Held]
    ) -> Plan:
        """Run a resource's events through the core in order, then fold them into a plan.

        Stream entry ids are only unique within one shard's stream (shards appended to in the
        same millisecond get the same id), so the event id carries the shard: effect and
        upstream message ids derive from it and must be unique across all shards.
        """
        state, steps = initial, []
        for item in items:
            assert item.accepted is not None
            entry_id, accepted, effect_id, taken, inline = (
                item.entry_id, item.accepted, item.effect_id, item.taken, False
            )  # fmt: skip
            # the item, then the results of the effects its transitions ran inline, each
            # applied right after the transition that asked for it
            results: list[tuple[str, Accepted]] = []
            while True:
                now_ms = self._clock.now_ms()
                ctx = self._context(shard, entry_id, now_ms)
                outcome = self._claimed(rkey, state, accepted.event, ctx)
                state = outcome.state
                ran = self._run_inline(shard, token, rkey, outcome)
                steps.append(
                    Step(entry_id, accepted, outcome, now_ms, effect_id, taken, inline, ran)
                )
                if ran:
                    results += [(f"{entry_id}+{n}", r) for n, r in enumerate(ran.values())]
                elif not results:
                    break
                (entry_id, accepted), results = results[0], results[1:]
                effect_id, taken, inline = None, False, True
        return plan(rkey, token, initial, steps, self._config)

    def _run_inline(
        self, shard: int, token: str, rkey: str, outcome: Outcome
    ) -> dict[str, Accepted]:
        """The results of the outcome's effects run inline (`InlineEffects`), by effect id."""
        ran: dict[str, Accepted] = {}
        for effect in outcome.effects:
            if isinstance(effect, _WORK):
                result = self._inline.run(shard, token, rkey, effect, self._known)
                if result is not None:
                    ran[effect.id] = Accepted(event=result)
        return ran

    def _claimed(self, rkey: str, state: State | None, event: Event, ctx: Context) -> Outcome:
        """The event's outcome; a job insert that leaves the job with an outputDir first
        claims it, and one whose outputDir another job holds is run again saying so (the
        core then refuses it)."""
        outcome = self._run(state, event, ctx)
        after = outcome.state
        if not isinstance(event, JobApplied) or not isinstance(after, JobState):
            return outcome
        if outcome.verdict == "rejected":
            return outcome
        holder = self._output_dirs.claim(rkey, after.spec.output_dir, ctx.now_ms)
        if holder is None:
            return outcome
        return self._run(state, msgspec.structs.replace(event, output_dir_holder=holder), ctx)

    def _run(self, state: State | None, event: Event, ctx: Context) -> Outcome:
        started = time.perf_counter()
        outcome = self._transition(state, event, ctx)
        self._metrics.transition_seconds.observe(time.perf_counter() - started)
        return outcome

    def _context(self, shard: int, entry_id: str, now_ms: int) -> Context:
        return Context(
            now_ms=now_ms,
            minute_of_day=self._clock.minute_of_day(),
            event_id=f"s{shard}-{entry_id}",
            volume_prefix=self._config.volume_prefix,
            dataset_poll_ms=int(self._config.dataset_poll_s * 1000),
            gm_resend_ms=int(self._config.gm_resend_s * 1000),
        )


def entry_event(entry: IngressEntry) -> tuple[str, Held]:
    """The entry's resource and the entry; one that cannot be decoded goes with the
    resource it still names, if any (else `UNKNOWN`), carrying why."""

    if entry.timer_rkey is not None:
        try:
            key = parse_rkey(entry.timer_rkey)
        except ValueError as e:
            return UNKNOWN, Held(entry.entry_id, None, entry.timer_rkey.encode(), str(e))
        kind = key.kind
        if kind not in ("job", "dataset"):
            reason = f"a timer of {entry.timer_rkey}: only jobs and datasets have timers"
            return UNKNOWN, Held(entry.entry_id, None, entry.timer_rkey.encode(), reason)
        tick = Tick(
            kind=kind, namespace=key.namespace, name=key.name,
            due_ms=entry.timer_due_ms or 0,
        )  # fmt: skip
        return entry.timer_rkey, Held(entry.entry_id, Accepted(event=tick))
    raw = entry.event or b""
    try:
        accepted = decode_accepted(raw)
        rkey = target_of(accepted.event)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        held = Held(entry.entry_id, None, raw, str(e) if raw else "no event in the entry")
        return guess_target(entry.shard, raw) or UNKNOWN, held
    if shard_of(rkey) != entry.shard:
        return UNKNOWN, Held(entry.entry_id, None, raw, f"its resource {rkey} is not here")
    return rkey, Held(entry.entry_id, accepted)


def _with_commit(result: Plan, commit: Commit) -> Plan:
    return dataclasses.replace(result, commit=commit)


READ_BATCH = 500
READ_BLOCK_MS = 200
#: While an effect started moments ago runs (`EffectRunner.expecting`), the processor waits
#: this long for its result in process, then reads the ingress without blocking, in turn.
RESULT_WAIT_S = 0.002


@dataclass
class _ShardBatch:
    """One shard's part of a read: its events by resource and what applying them produced."""

    shard: int
    token: str
    states: dict[str, Cached]
    groups: dict[str, list[Held]]
    plans: list[Plan] = field(default_factory=list)
    isolations: list[Isolation] = field(default_factory=list)
    #: items handed over in process for a resource whose entries are set aside: they take
    #: the ingress stream once the batch committed (a result as `EffectRunner`'s other way,
    #: a message as the intake's), so that the quarantine sees them as entries
    deferred: list[Held] = field(default_factory=list)
    #: the messages the intake handed over, by the entry id they are held under, in order
    taken: dict[str, TakenMessage] = field(default_factory=dict)

    def ops(self) -> list[Commit | Quarantine]:
        return [p.commit for p in self.plans] + [i.op for i in self.isolations]

    def applied(self) -> list[TakenMessage]:
        """The messages handed over that the commit applies (the deferred ones it does not)."""
        deferred = {held.entry_id for held in self.deferred}
        return [m for entry_id, m in self.taken.items() if entry_id not in deferred]

    def markers(self) -> Markers | None:
        """The dedupe markers the commit sets for the messages it applies."""
        applied = self.applied()
        if not applied:
            return None
        items = tuple((m.digest, m.dup) for m in applied if m.digest is not None)
        return Markers(applied[0].ingress_token, items)


class Processor:
    def __init__(
        self,
        *,
        config: Config,
        ingress: Ingress,
        states: States,
        outboxes: Outboxes,
        records: Records,
        leases: LeaseKeeper,
        clock: Clock,
        transition: Transition,
        effects: EffectRunner,
        inline: InlineEffects,
        handoff: Handoff,
        outbox: OutboxPublisher,
        journal: Journal,
        rejections: Rejections,
        datasets: DatasetHealth,
        metrics: Metrics,
        stop: threading.Event,
    ) -> None:
        self._config = config
        self._ingress = ingress
        self._stored = states
        self._outboxes = outboxes
        self._leases = leases
        self._clock = clock
        self._effects = effects
        self._inline = inline
        self._handoff = handoff
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
                records, states, int(config.lease_s * 2000), config.volume_prefix
            ),
            inline=inline, known=lambda rkeys: self._states.known(rkeys, leases.token),
            metrics=metrics,
        )  # fmt: skip
        self._fresh: set[int] = set()
        self._fresh_lock = threading.Lock()
        self._pending_sweep_at_s = 0.0
        self._handed_seq = 0  # numbers the items handed over, for their event ids
        self._stream_due = False  # the last pass applied results only: read the stream next
        #: messages handed over, kept for a later pass (their shard's recovery first, or a
        #: stream read that may not have reached the end)
        self._held_back: list[TakenMessage] = []
        #: per shard, the lease token its last recovery ran under: messages handed over are
        #: applied only then (the previous owner's pending entries come first)
        self._recovered: dict[int, str] = {}

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
            # what is handed over meanwhile takes the stream's way, and its retries
            self._handoff.close()
            raise
        self._handoff.open()

    def _process_owned(self) -> None:
        held = self._leases.held()
        self._states.keep_only(held)
        self._quarantines.keep_only(held)
        self._metrics.keep_jobs_of(held)
        self._datasets.keep_only(held)
        if not held:
            results, messages = self._take_handed()
            self._effects.settled(r.effect_id for r in results)  # no shard: still pending
            self._pass_on(messages)
            self._stop.wait(0.1)
            return
        fresh = self._take_fresh(held)
        if fresh:
            self._recover(fresh)
            return
        self._apply(*self._next_read(held))

    def _next_read(
        self, held: dict[int, str]
    ) -> tuple[list[IngressEntry], list[LocalResult], list[TakenMessage]]:
        """The ingress entries and the items handed over in process to apply next.

        Results handed over alone are applied at once, with no Redis read; but never twice
        in a row while the ingress waits unread. Messages handed over come with a read that
        does not block, and wait for the next one when this one may not have reached the
        end of the stream (what the intake appended before them comes first). While an
        effect started moments ago runs, its result is awaited in process (briefly, in turns
        with reads that do not block); otherwise the read blocks in Redis, a message handed
        over meanwhile ends it and is applied with it (`Handoff`), and a result goes through
        the stream."""
        results, messages = self._take_handed()
        if results and not messages and not self._stream_due:
            self._stream_due = True
            return [], results, []
        self._stream_due = False
        block_ms = 0
        if not results and not messages:
            if self._effects.expecting():
                if self._handoff.wait(RESULT_WAIT_S):
                    results, messages = self._take_handed()
                    if not messages:
                        self._stream_due = True
                        return [], results, []
            elif self._handoff.begin_blocking():
                block_ms = READ_BLOCK_MS
            else:
                results, messages = self._take_handed()
        vouched = 0
        try:
            entries = self._ingress.read(
                sorted(held), count=READ_BATCH, block_ms=block_ms, pending=False,
                on_blocked=self._handoff.blocked if block_ms else None,
            )  # fmt: skip
        except BaseException:
            self._effects.settled(r.effect_id for r in results)  # dropped: still pending
            self._held_back = messages
            raise
        finally:
            if block_ms:
                vouched = self._handoff.end_blocking()
        if vouched and not entries:
            # offered while the read blocked, which their wake-up ended: every stream was
            # at its end after them (any offered later wait for the next read)
            results, messages = self._take_handed(vouched)
        if len(entries) >= READ_BATCH:
            self._held_back, messages = messages, []
        return entries, results, messages

    def _take_handed(
        self, limit: int | None = None
    ) -> tuple[list[LocalResult], list[TakenMessage]]:
        """What was handed over (its first ``limit`` messages, if given), after the messages
        held back from an earlier pass."""
        results, messages = self._handoff.take(limit)
        held_back, self._held_back = self._held_back, []
        return results, held_back + messages

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
                entries = self._ingress.read(readable, count=READ_BATCH, block_ms=0, pending=True)
                if not entries:
                    break
                for shard in {entry.shard for entry in entries} - replayed:
                    self._states.forget(shard)
                    replayed.add(shard)
                stuck |= self._apply(entries)
            # the tokens before the read: an intent pending then is pending under them
            tokens = {shard: self._leases.token(shard) for shard in self._still_ours(shards)}
            self._recovered.update((s, t) for s, t in tokens.items() if t is not None)
            for shard, intents in self._outboxes.pending_effects(list(tokens)).items():
                token = tokens[shard]
                for effect_id, data in intents.items():
                    if token is not None:
                        self._effects.resubmit(shard, effect_id, data, token)
        except StoreUnavailable:
            with self._fresh_lock:
                self._fresh.update(shards)
            raise
        self._outbox.wake(set(shards))

    def _still_ours(self, shards: list[int]) -> list[int]:
        return [shard for shard in shards if self._leases.token(shard) is not None]

    # ------------------------------------------------------------ one read
    def _apply(
        self,
        entries: list[IngressEntry],
        results: Sequence[LocalResult] = (),
        messages: Sequence[TakenMessage] = (),
    ) -> set[int]:
        """Apply a read's entries and the items handed over in process, every owned shard's
        commits in one round trip; the shards whose events failed (their entries stay
        pending, the intents of their results too, their messages are held back).

        Each result handed over is settled (`EffectRunner.settled`) once its commit is done
        or its fate is unknown: its intent, if still pending in Redis, runs again when
        recovery finds it."""
        try:
            batches, gone = self._batches(entries, results, messages)
            try:
                failed = self._apply_batches(batches)
            except BaseException:
                self._held_back += gone
                raise
            self._pass_on(gone)  # messages of shards no longer held: for their next owner
            return failed
        finally:
            self._effects.settled(r.effect_id for r in results)

    def _apply_batches(self, batches: list[_ShardBatch]) -> set[int]:
        if not batches:
            return set()
        try:
            self._load_missing(batches)
            self._inline.begin_pass()
            ran = [batch for batch in batches if self._run_shard(batch)]
            failed = {batch.shard for batch in batches} - {batch.shard for batch in ran}
            # a failed shard's messages become entries, pending like its others
            stuck = [m for b in batches if b.shard in failed for m in b.taken.values()]
            batches = ran
            self._pass_on(stuck)
            failpoints.hit("process-before-commit")  # an effect run inline waits here too
            if any(p.commit.retire for b in batches for p in b.plans):
                failpoints.hit("result-before-commit")  # an effect ran; its result waits here
            markers = {b.shard: m for b in batches if (m := b.markers()) is not None}
            outcomes = self._stored.commit(
                [(b.shard, b.token, b.ops()) for b in batches], markers=markers
            )
        except BaseException as e:
            for batch in batches:
                self._states.forget(batch.shard)  # its fate unknown: Redis is the truth
                # applied or not: as redeliveries, their markers tell which
                self._held_back += [dataclasses.replace(m, dup=True) for m in batch.applied()]
                self._held_back += [batch.taken[h.entry_id] for h in batch.deferred if h.taken]
            if isinstance(e, StoreUnavailable):
                with self._fresh_lock:  # the commit may or may not have happened
                    self._fresh.update(batch.shard for batch in batches)
            raise
        self._committed(batches, outcomes)
        return failed

    def _batches(
        self,
        entries: list[IngressEntry],
        results: Sequence[LocalResult],
        messages: Sequence[TakenMessage],
    ) -> tuple[list[_ShardBatch], list[TakenMessage]]:
        """The read's shard batches, and the messages handed over of shards no longer held."""
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
        by_token = {batch.shard: batch for batch in batches}

        def batch_of(shard: int, token: str) -> _ShardBatch:
            batch = by_token.get(shard)
            if batch is None:
                batch = _ShardBatch(shard, token, self._states.of(shard, token), {})
                by_token[shard] = batch
                batches.append(batch)
            return batch

        for result in results:
            token = self._leases.token(result.shard)
            if token != result.token:
                # the lease moved since the intent was submitted (another owner may have
                # applied its result already): dropped, the intent's owner redoes it; if
                # that is this replica again, its recovery now (the intent was skipped
                # as running when the shard came back)
                if token is not None:
                    with self._fresh_lock:
                        self._fresh.add(result.shard)
                continue
            batch = batch_of(result.shard, token)
            batch.groups.setdefault(target_of(result.event), []).append(self._held(result))
        gone: list[TakenMessage] = []
        waiting: set[int] = set()  # shards with a message held back: the later ones wait too
        for message in messages:
            token = self._leases.token(message.shard)
            if token is None:
                gone.append(message)
                continue
            batch = batch_of(message.shard, token)
            first = next(iter(batch.taken.values()), message)
            if (
                message.shard in waiting
                or self._recovered.get(message.shard) != token
                or first.ingress_token != message.ingress_token
            ):
                # its shard's recovery first, or a commit of its own (one marker token each)
                waiting.add(message.shard)
                self._held_back.append(message)
                continue
            held = self._taken_held(message, token)
            batch.taken[held.entry_id] = message
            batch.groups.setdefault(target_of(message.accepted.event), []).append(held)
        return [batch for batch in batches if batch.groups], gone

    def _held(self, result: LocalResult) -> Held:
        """A result handed over, held like an ingress entry (`_handed_id`)."""
        entry_id = self._handed_id("L", result.token)
        return Held(entry_id, Accepted(event=result.event), effect_id=result.effect_id)

    def _taken_held(self, message: TakenMessage, token: str) -> Held:
        """A message handed over, held like an ingress entry (`_handed_id`)."""
        return Held(self._handed_id("T", token), message.accepted, taken=True)

    def _handed_id(self, kind: str, token: str) -> str:
        """The id of an item handed over (for the event id that effect and message ids
        derive from): unique to the lease token's fence and this process (a token's fence
        is never given out twice)."""
        self._handed_seq += 1
        return f"{kind}{token.rpartition(':')[2]}.{self._handed_seq}"

    def _pass_on(self, messages: Sequence[TakenMessage]) -> None:
        """Append messages handed over to their shards' streams (each under the ingress
        token it was taken in under), then acknowledge them; those not appended are held
        back (the store unreachable: raised)."""
        if not messages:
            return
        try:
            for token in dict.fromkeys(m.ingress_token for m in messages):
                items = [m for m in messages if m.ingress_token == token]
                self._ingress.append_many(
                    [(m.shard, encode_accepted(m.accepted), m.digest, m.dup) for m in items],
                    token=token,
                )
                messages = [m for m in messages if m.ingress_token != token]
                _acknowledge(self._handoff, items)
        except StoreUnavailable:
            self._held_back += [dataclasses.replace(m, dup=True) for m in messages]
            raise

    def _committed(
        self, batches: list[_ShardBatch], outcomes: list[list[list[str]] | LeaseLost | Known]
    ) -> None:
        """Keep what committed, start its effects and publish its messages, then log, count
        and dead-letter it (after: the effects and messages are what a round waits for)."""
        done: list[tuple[_ShardBatch, list[list[str]]]] = []
        for batch, outcome in zip(batches, outcomes, strict=True):
            if isinstance(outcome, LeaseLost):
                self._states.forget(batch.shard)
                self._leases.lost(batch.shard, batch.token)
                self._held_back += batch.taken.values()  # to the stream, for the next owner
                continue
            if isinstance(outcome, Known):
                self._known(batch, outcome)
                continue
            for p in batch.plans:
                _remember(batch.states, p)
            done.append((batch, outcome[: len(batch.plans)]))
        failpoints.hit("process-before-effects")
        upstream: list[tuple[int, list[tuple[str, OutboxEntry]]]] = []
        for batch, outbox_ids in done:
            for p, ids in zip(batch.plans, outbox_ids, strict=True):
                for effect_id, item in p.work:
                    self._effects.submit(batch.shard, effect_id, item, batch.token)
                if ids:
                    upstream.append((batch.shard, list(zip(ids, p.commit.outbox, strict=True))))
        self._outbox.send(upstream)
        applied = [m for batch, _ in done for m in batch.applied()]
        if applied:
            failpoints.hit("taken-before-ack")
            failpoints.hit("intake-before-ack")  # the same moment, for messages handed over
            _acknowledge(self._handoff, applied)
        for batch, _ in done:
            self._record(batch)
        for batch, _ in done:
            for held in batch.deferred:
                assert held.accepted is not None
                if held.taken:
                    self._pass_on([batch.taken[held.entry_id]])
                    continue
                assert held.effect_id is not None
                data = encode_accepted(held.accepted)
                self._outboxes.complete_effect(batch.shard, batch.token, held.effect_id, data)

    def _known(self, batch: _ShardBatch, known: Known) -> None:
        """A commit refused for messages handed over that were taken in already (by another
        ingress holder first): those are dropped and acknowledged, the rest held back, and
        the shard recovered first (its entries of this read are pending again; its marks
        reloaded). The shard's quarantine ops ran all the same (other scripts of its
        transaction): their entries are out of the stream, so their dead letters are
        written."""
        with_marker = [m for m in batch.applied() if m.digest is not None]
        dropped = [with_marker[i] for i in known.markers]
        for message in dropped:
            log.info("shard %d: a message on %s was taken in already; dropped",
                     batch.shard, message.msg.topic)  # fmt: skip
        _acknowledge(self._handoff, dropped)
        self._held_back += [m for m in batch.taken.values() if m not in dropped]
        self._record_isolations(batch)
        self._states.forget(batch.shard)
        with self._fresh_lock:
            self._fresh.add(batch.shard)

    def _record(self, batch: _ShardBatch) -> None:
        """The journal, rejections, dataset health, job metrics and quarantines of a
        committed batch."""
        for p in batch.plans:
            self._journal.write(p.commit.rkey, p.records, p.changed)
            for rejected in p.rejected:
                self._rejections.recorded(
                    rejected.topic, rejected.code, rejected.reason, rejected.record
                )
            self._datasets.committed(p.commit.rkey, p.state, p.unreadable)
            self._metrics.job_changed(batch.shard, p.initial, p.state)
            if p.commit.clear_mark:
                self._quarantines.ended(batch.shard, p.commit.rkey)
        self._record_isolations(batch)

    def _record_isolations(self, batch: _ShardBatch) -> None:
        """The quarantines and dead letters of a batch's entries set aside (applied)."""
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
            for rkey, group in batch.groups.items():
                if rkey == UNKNOWN:
                    now_ms = self._clock.now_ms()
                    batch.isolations.append(
                        self._quarantines.set_aside_unknown(batch.shard, group, now_ms)
                    )
                    continue
                items = self._without_deferred(batch, rkey, group)
                if not items:
                    continue
                result = self._runner.plan(batch.shard, batch.token, rkey, batch.states, items)
                if isinstance(result, Isolation) and any(i.in_process for i in items):
                    # newly set aside: what was handed over goes the stream's way, after
                    batch.deferred.extend(i for i in items if i.in_process)
                    items = [i for i in items if not i.in_process]
                    if not items:
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

    def _without_deferred(self, batch: _ShardBatch, rkey: str, items: list[Held]) -> list[Held]:
        """The resource's items to plan: what was handed over in process is deferred to the
        stream when its entries are set aside (quarantined, or one of them cannot be
        decoded), so the quarantine sees them as entries like any other."""
        if not any(i.in_process for i in items):
            return items
        if self._quarantines.mark_of(batch.shard, rkey) is None and all(
            i.accepted is not None for i in items
        ):
            return items
        batch.deferred.extend(i for i in items if i.in_process)
        return [i for i in items if not i.in_process]

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


def _acknowledge(handoff: Handoff, messages: Sequence[TakenMessage]) -> None:
    """PUBACK messages handed over, on the connections they came on, a batch per connection,
    once they are settled: committed, or appended to their shard's stream."""
    handoff.settled(messages)
    by_ack: dict[Callable[[Sequence[Inbound]], None], list[Inbound]] = {}
    for m in messages:
        by_ack.setdefault(m.ack, []).append(m.msg)
    for ack, msgs in by_ack.items():
        ack(msgs)


def _remember(states: dict[str, Cached], committed: Plan) -> None:
    """The cache follows what the plan's commit wrote."""
    commit = committed.commit
    if commit.delete:
        states[commit.rkey] = None
    elif not commit.keep_state:
        states[commit.rkey] = committed.state


class DatasetHealth:
    """Follows committed dataset states into gauges; used by the processor's thread only."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._shown: dict[str, tuple[str, str]] = {}  # dataset rkey -> (namespace, name)

    def committed(
        self, rkey: str, state: State | None, unreadable: Sequence[DatasetUnreadable]
    ) -> None:
        """A commit of `rkey` applied, leaving `state` (None: deleted)."""
        for report in unreadable:
            log.warning(
                "dataset %s/%s cannot be read: %s",
                report.namespace,
                report.name,
                report.reason,
                extra={"dataset": f"{report.namespace}/{report.name}"},
            )
            labels = {"namespace": report.namespace, "name": report.name}
            self._metrics.dataset_unreadable_reports.labels(**labels).inc()
        if parse_rkey(rkey).kind != "dataset":
            return
        if not isinstance(state, DatasetState):
            self._forget(rkey)
            return
        labels = {"namespace": state.namespace, "name": state.name}
        self._shown[rkey] = (state.namespace, state.name)
        if state.num_samples >= 0:
            self._metrics.dataset_samples.labels(**labels).set(state.num_samples)
        if state.unreadable is not None:
            self._metrics.dataset_unreadable.labels(**labels).set(1)
        else:
            with contextlib.suppress(KeyError):
                self._metrics.dataset_unreadable.remove(state.namespace, state.name)

    def keep_only(self, shards: Collection[int]) -> None:
        """Drop the gauges of datasets on shards no longer held."""
        for rkey in [r for r in self._shown if shard_of(r) not in shards]:
            self._forget(rkey)

    def _forget(self, rkey: str) -> None:
        """Remove the dataset's series, whether or not this replica showed them (a shard's
        first commit here may be the dataset's deletion)."""
        self._shown.pop(rkey, None)
        key = parse_rkey(rkey)
        for gauge in (self._metrics.dataset_samples, self._metrics.dataset_unreadable):
            with contextlib.suppress(KeyError):
                gauge.remove(key.namespace, key.name)
