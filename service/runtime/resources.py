"""One resource's events of a read, through the pure core and into one plan; or, when the
resource's state or one of its entries cannot be decoded, its entries set aside by the
quarantine (`service.runtime.quarantine`)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import msgspec

from service.adapters.redis_store import Commit, IngressEntry
from service.config import Config
from service.core.effects import Context, Outcome
from service.core.events import Event, JobApplied, Tick
from service.core.state import JobState, State, decode_state
from service.keys import parse_rkey, shard_of
from service.metrics import Metrics
from service.runtime.accept import Accepted, decode_accepted, target_of
from service.runtime.claims import OutputDirs
from service.runtime.clock import Clock
from service.runtime.planner import Plan, Step, plan
from service.runtime.quarantine import (
    Cause,
    Held,
    Isolation,
    Quarantines,
    guess_target,
    last_delete,
)

log = logging.getLogger(__name__)

Transition = Callable[[State | None, Event, Context], Outcome]
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
        metrics: Metrics,
    ) -> None:
        self._config = config
        self._clock = clock
        self._transition = transition
        self._quarantines = quarantines
        self._output_dirs = output_dirs
        self._metrics = metrics

    def plan(
        self,
        shard: int,
        token: str,
        rkey: str,
        states: dict[str, bytes | None],
        items: list[Held],
    ) -> Plan | Isolation:
        """The resource's plan, or its entries set aside when it is (or now becomes)
        quarantined: see `service.runtime.quarantine`."""
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
            raw = states[rkey]
            try:
                initial = decode_state(raw) if raw is not None else None
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                failure = ("state", f"its stored state cannot be decoded: {e}")
            else:
                result = self._fold(shard, token, rkey, initial, items)
                if mark is None:
                    return result
                return _with_commit(result, dataclasses.replace(result.commit, clear_mark=True))
        if delete is not None and (corrupt is None or corrupt < delete):
            return self._deleted(shard, token, rkey, items, delete)
        if failure is None:
            return self._quarantines.isolate(shard, rkey, items, now_ms, None)
        return self._quarantines.isolate(shard, rkey, items, now_ms, failure)

    def _deleted(
        self, shard: int, token: str, rkey: str, items: list[Held], delete: int
    ) -> Plan:
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
            now_ms = self._clock.now_ms()
            ctx = self._context(shard, item.entry_id, now_ms)
            outcome = self._claimed(rkey, state, item.accepted.event, ctx)
            state = outcome.state
            steps.append(Step(item.entry_id, item.accepted, outcome, now_ms))
        self._metrics.job_changed(shard, initial, state)
        return plan(rkey, token, initial, steps, self._config)

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
