"""Effects: the intents a commit left, run on a small thread pool, each completed under the
shard's lease with its outcome as the next event; and the outputDir claims that keep two
jobs from writing to one directory.

- Output-dir claims (`OutputDirs`). Which job writes to an outputDir: two jobs (in different
  namespaces, say) given the same one, or one inside the other's, would overwrite each
  other's round files and deployed model (a job whose outputDir is another's
  `deploy/index.pkl` makes that file a directory). Each job claims its outputDir when an
  insert leaves it with one (`Records.claim_output_dir`); the second job to claim a
  directory that is taken, inside one that is taken or above one, has its insert refused,
  naming the holder. Claims are keyed by the directory as it lies on disk (the volume
  prefix added, canonical: `paths.claim_dir`), so two spellings of one directory meet. A job
  gives its claim up when it is deleted or moves to another outputDir (a `ReleaseOutputDir`
  effect, committed with the state, so a crash cannot lose it). A claim whose job is gone,
  or has moved elsewhere, is stale and taken over, but only once it is older than two lease
  periods: a new job's claim precedes its first commit by a moment, and that commit may
  wait for a shard's next owner.
- The executor (`Executor`) runs the effects that do I/O and turns their outcome into the
  next event. Every effect here is idempotent by construction (its paths are fixed by job
  and version), so redoing one after a crash is harmless. Permanent failures and transient
  failures past the blob adapter's retry budget come back as events carrying the reason
  (the lifecycle then reports `failed` upstream); a store outage is raised so the caller
  retries the intent later.
- Inline effects (`InlineEffects`): a round file or deploy copy small and local enough is
  done on the processor's thread before the commit of the event that asks for it, its
  result applied in that same commit, and no intent stored for it.
- The effect runner (`EffectRunner`) runs effect intents on a small thread pool and hands
  each result to the processor, whose next commit applies it and retires the intent in one
  fenced transaction (or, when that is not this replica's to do now, retires the intent
  under the shard's lease with its result appended to the ingress). An intent found in
  Redis that cannot be decoded (not written by this service) is set aside
  (`Rejections.unreadable`) and retired, so the intents after it still run.
"""


import copy
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Self

import msgspec

from service import wire
from service.adapters.blobs import BlobStore, local_size
from service.adapters.dataset_sources import Cursor, DatasetReader
from service.adapters.redis_store import Ingress, Outboxes, Records, States
from service.core import datasets, paths
from service.core.effects import (
    AttachDataset,
    CopyModel,
    DetachDataset,
    HotUpdate,
    NotifyJobs,
    PollDataset,
    ReleaseOutputDir,
    Work,
    WriteRound,
    decode_work,
)
from service.core.events import DatasetPolled, Event, ModelCopied, RoundWritten
from service.core.state import (
    DatasetState,
    JobModels,
    JobState,
    ModelInfo,
    ResourceState,
    State,
    decode_state,
)
from service.errors import (
    InvalidMessage,
    LeaseLost,
    PermanentError,
    StoreUnavailable,
    TransientError,
)
from service.heartbeat import Clock, Heartbeats, progress
from service.keys import MODEL_KIND, dataset_key, job_key, parse_rkey, rkey, rkey_path, shard_of
from service.logs import redact
from service.metrics import Metrics
from service.runtime.handoff import Handoff, LocalResult
from service.runtime.intake import Accepted, encode_accepted, target_of
from service.runtime.leases import LeaseKeeper
from service.runtime.rejections import Rejections

#: How many stale holders one claim takes over before it gives up and names the next.
_MAX_TAKEOVERS = 8


class OutputDirs:
    def __init__(
        self, records: Records, states: States, grace_ms: int, volume_prefix: str = ""
    ) -> None:
        self._records = records
        self._states = states
        self._grace_ms = grace_ms
        self._prefix = volume_prefix

    def claim(self, job_rkey: str, output_dir: str, now_ms: int) -> str | None:
        """Claim the (worker-visible) outputDir for the job: None when it is the job's, else
        the job in the way, as `namespace/name` and what it holds."""
        directory = paths.claim_dir(self._prefix, output_dir)
        found = self._records.claim_output_dir(directory, job_rkey, now_ms, grace_ms=self._grace_ms)
        for _ in range(_MAX_TAKEOVERS):
            if found is None or not self._stale(*found):
                break
            found = self._records.claim_output_dir(
                directory, job_rkey, now_ms, stale=found[0], grace_ms=self._grace_ms
            )
        return None if found is None else self._described(directory, *found)

    def _stale(self, holder: str, held: str) -> bool:
        """Whether the holder no longer writes to ``held``: gone, or moved to another
        outputDir. A holder whose state cannot be read (quarantined) keeps its claim."""
        raw = self._states.load([holder]).get(holder)
        if raw is None:
            return True
        try:
            state = decode_state(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        if not isinstance(state, JobState):
            return True
        return paths.claim_dir(self._prefix, state.spec.output_dir) != held

    def _described(self, directory: str, holder: str, held: str) -> str:
        """The holder as `namespace/name`, and how its outputDir meets this one when it is
        not the same directory (paths as workers see them)."""
        name = rkey_path(holder)
        if held == directory:
            return name
        shown = paths.trim_prefix(self._prefix, held)
        if paths.is_beneath(directory, held):
            return f"{name}, whose outputDir {shown} contains it"
        return f"{name}, whose outputDir {shown} lies inside it"


log = logging.getLogger(__name__)

#: How many datasets' reasons `Executor` remembers (each is logged again once forgotten).
_MAX_WHYS = 4096
_cursor_encoder = msgspec.msgpack.Encoder()
_cursor_decoder = msgspec.msgpack.Decoder(Cursor)


KnownStates = Callable[[Sequence[str]], Mapping[str, State | bytes | None]]
"""The stored states of some of the resources asked for, as known without asking Redis
(the processor's cache of the shards it holds: `processor.ShardStates.known`); a resource
left out is read from Redis."""


class Executor:
    """Effect work against the blob, dataset and store adapters (no lifecycle decisions)."""

    def __init__(
        self,
        *,
        states: States,
        records: Records,
        ingress: Ingress,
        blobs: BlobStore,
        reader: DatasetReader,
        rounds_kept: int = 3,
    ) -> None:
        self._states = states
        self._records = records
        self._ingress = ingress
        self._blobs = blobs
        self._reader = reader
        self._rounds_kept = rounds_kept
        #: the failures a result event reports (any other is raised)
        self._reported: tuple[type[Exception], ...] = (PermanentError, TransientError)
        #: why each dataset whose source cannot be read now cannot, as last logged
        self._whys: dict[str, str] = {}
        self._whys_lock = threading.Lock()

    def trying_once(self) -> Self:
        """This executor (its stores, reader and blob files shared) trying each write or
        copy once and raising a transient failure instead of reporting it in the result
        event: for a caller that leaves such work to the pool, which retries it, rather
        than wait out the backoff (`InlineEffects`)."""
        once = copy.copy(self)
        once._blobs = self._blobs.trying_once()
        once._reported = (PermanentError,)
        return once

    def run(self, work: Work, now_ms: int, known: KnownStates | None = None) -> Event | None:
        """Do the work; return the event reporting its outcome (None: nothing to report).
        The stored states it needs come from ``known`` where it knows them."""
        match work:
            case WriteRound():
                return self._write_round(work, known)
            case CopyModel():
                return self._copy_model(work, now_ms)
            case PollDataset():
                return self._poll(work)
            case NotifyJobs():
                self._notify(work, now_ms)
            case AttachDataset():
                self._attach(work, now_ms)
            case DetachDataset():
                dataset = dataset_key(work.namespace, work.dataset)
                self._records.dataset_jobs_remove(dataset, job_key(work.namespace, work.name))
            case ReleaseOutputDir():
                job = job_key(work.namespace, work.name)
                self._records.release_output_dir(work.output_dir, job)
        return None

    # ------------------------------------------------------------ credentials
    def _credential(self, rkey: str, *urls: str) -> wire.S3Credential | None:
        """The S3 credential in the resource's `sedna.io/credential` annotation, if any;
        only looked up when one of `urls` is on S3 (local files need none)."""
        if not any(paths.is_remote(url) for url in urls):
            return None
        raw = self._states.load_resource(rkey)
        if raw is None:
            return None
        try:
            resource = wire.decode_resource(raw)
            return wire.credential_of(resource.metadata)
        except InvalidMessage:
            return None  # validated on the way in; a stored one cannot be wrong

    # ------------------------------------------------------------ the work
    def _write_round(self, work: WriteRound, known: KnownStates | None) -> RoundWritten:
        error = None
        try:
            written = self._blobs.write_round(
                source_url=work.source_url,
                fmt=work.format,
                ranges=work.ranges,
                data_url=work.data_url,
                index_url=work.index_url,
                index_prefix=work.index_prefix,
                source_cred=self._credential(
                    dataset_key(work.namespace, work.dataset), work.source_url
                ),
                dest_cred=self._credential(
                    job_key(work.namespace, work.name), work.data_url, work.index_url or ""
                ),
            )
            log.info(
                "wrote %s samples to %s",
                written,
                work.data_url,
                extra={"job": f"{work.namespace}/{work.name}", "effect": "write-round"},
            )
        except self._reported as e:
            error = redact(f"writing {work.phase} data of round {work.version} failed: {e}")
        else:
            self._prune(work)
            self._blobs.make_dirs(work.ahead)
        models = None
        if work.models is not None and error is None:
            models, error = self._models(work.namespace, work.phase, work.models, known)
        return RoundWritten(
            namespace=work.namespace,
            name=work.name,
            phase=work.phase,
            version=work.version,
            error=error,
            models=models,
        )

    def _models(
        self, namespace: str, phase: str, spec: wire.IncrementalSpec, known: KnownStates | None
    ) -> tuple[JobModels | None, str | None]:
        """The Models an incremental-learning job's round needs, as stored now (a train
        round: the initial model; an eval round: the compared and the deploy model), or why
        not all are there; those ``known`` knows are not read from Redis."""
        compared = "evalSpec.initialEvalModel" if spec.eval_model else "deploySpec.model"
        wanted = (
            {"initial": ("initialModel", spec.initial_model)}
            if phase == "train"
            else {"compared": (compared, spec.compared_model),
                  "deploy": ("deploySpec.model", spec.deploy_model)}
        )  # fmt: skip
        keys = {role: rkey(MODEL_KIND, namespace, name) for role, (_, name) in wanted.items()}
        names = list(set(keys.values()))
        stored: dict[str, State | bytes | None] = dict(known(names)) if known else {}
        missing = [name for name in names if name not in stored]
        if missing:
            stored.update(self._states.load(missing))
        found: dict[str, ModelInfo] = {}
        for role, key in keys.items():
            raw = stored[key]
            try:
                state = decode_state(raw) if isinstance(raw, bytes) else raw
            except (msgspec.DecodeError, msgspec.ValidationError):
                state = None  # quarantined: as good as missing until it is applied again
            if not isinstance(state, ResourceState) or state.model is None:
                field, name = wanted[role]
                return None, (
                    f"Model {namespace}/{name} (the job's {field}) does not exist on this "
                    "node: the round waits for it"
                )
            found[role] = state.model
        return JobModels(**found), None

    def _prune(self, work: WriteRound) -> None:
        """Remove the data files of this phase's rounds older than the newest
        ``rounds_kept``, but for those the job keeps (deployed, or a rollback target)."""
        oldest = work.version - self._rounds_kept + 1
        if oldest <= 0:
            return  # every round (its version a directory name, >= 0) is among the newest
        removed = self._blobs.prune_rounds(work.data_url, lambda v: v >= oldest or v in work.keep)
        if removed:
            log.info(
                "removed the %s data files of rounds %s",
                work.phase,
                ", ".join(map(str, removed)),
                extra={"job": f"{work.namespace}/{work.name}", "effect": "write-round"},
            )

    def _copy_model(self, work: CopyModel, now_ms: int) -> ModelCopied:
        error, digest = None, None
        cred = self._credential(job_key(work.namespace, work.name), work.src_url, work.dst_url)
        output_dir = work.output_dir or paths.output_dir_of(work.dst_url)
        target = work.dst_url
        try:
            digest = self._blobs.copy_model(
                src_url=work.src_url, dst_url=target, output_dir=output_dir, src_cred=cred,
                dst_cred=cred, expect=work.expect,
            )  # fmt: skip
            hot = work.hot_update
            if hot is not None:
                target = hot.model_file
                self._blobs.copy_model(
                    src_url=work.src_url, dst_url=target, output_dir=output_dir,
                    src_cred=cred, dst_cred=None, expect=digest,
                )  # fmt: skip
                target = hot.config
                self._blobs.write_file(target, hot_update_config(hot, now_ms), None)
        except self._reported as e:
            error = redact(f"copying model {work.src_url} to {target} failed: {e}")
        return ModelCopied(
            namespace=work.namespace, name=work.name, version=work.version, error=error,
            rollback=work.rollback, digest=digest,
        )  # fmt: skip

    def _poll(self, work: PollDataset) -> DatasetPolled:
        cursor = _cursor_of(work)
        cred = self._credential(dataset_key(work.namespace, work.name), work.url)
        polled = DatasetPolled(namespace=work.namespace, name=work.name, url=work.url)
        try:
            poll = self._reader.poll(work.url, work.format, cursor, cred)
        except PermanentError as e:  # permission denied, S3 403, a bad credential...
            return msgspec.structs.replace(polled, unreadable=redact(str(e)))
        except TransientError as e:
            return msgspec.structs.replace(polled, error=redact(str(e)))
        if poll.missing:
            # one reason for missing and forbidden alike: the errors topic must not tell
            # whoever named the dataset which files exist; the log says which, once
            self._tell_why(work, poll.why)
            return msgspec.structs.replace(polled, unreadable=unreadable(work.url))
        self._tell_why(work, "")
        # The byte count shows a poll reads only what was appended (Sedna's bug 13,
        # docs/lifecycle.md); a poll that found nothing new is not worth an info line every
        # period.
        progressed = poll.rewritten or poll.cursor != cursor
        log.log(
            logging.INFO if progressed else logging.DEBUG,
            "polled dataset %s/%s: %d samples, %d bytes read",
            work.namespace,
            work.name,
            poll.num_samples,
            poll.bytes_read,
            extra={"dataset": f"{work.namespace}/{work.name}", "effect": "poll-dataset"},
        )
        return msgspec.structs.replace(
            polled, num_samples=poll.num_samples, cursor=_cursor_encoder.encode(poll.cursor)
        )

    def _tell_why(self, work: PollDataset, why: str) -> None:
        """Log why a dataset's source cannot be read when that is news ("" once it can)."""
        key = dataset_key(work.namespace, work.name)
        with self._whys_lock:
            if self._whys.get(key, "") == why:
                return
            if why:
                if len(self._whys) >= _MAX_WHYS:  # deleted datasets leave theirs behind
                    self._whys.clear()
                self._whys[key] = why
            else:
                del self._whys[key]
        if why:
            log.warning(
                "source of dataset %s/%s unreadable: %s",
                work.namespace,
                work.name,
                redact(why),
                extra={"dataset": f"{work.namespace}/{work.name}", "effect": "poll-dataset"},
            )

    def _notify(self, work: NotifyJobs, now_ms: int) -> None:
        for job in self._records.dataset_jobs(dataset_key(work.namespace, work.dataset)):
            key = parse_rkey(job)
            self._send(job, datasets.change_for_job(key.namespace, key.name, work), now_ms)

    def _attach(self, work: AttachDataset, now_ms: int) -> None:
        dataset = dataset_key(work.namespace, work.dataset)
        job = job_key(work.namespace, work.name)
        self._records.dataset_jobs_add(dataset, job)
        raw = self._states.load([dataset])[dataset]
        if raw is None:
            return  # the job waits; the dataset's first poll will notify it
        try:
            state = decode_state(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            # the dataset is quarantined; its next poll after the quarantine tells the job
            log.warning("job %s waits: dataset %s cannot be decoded", job, dataset)
            return
        if isinstance(state, DatasetState):
            self._send(job, datasets.notice_for_job(work.namespace, work.name, state), now_ms)

    def _send(self, rkey: str, event: Event, now_ms: int) -> None:
        accepted = Accepted(event=event, received_ms=now_ms)
        self._ingress.append(shard_of(rkey), encode_accepted(accepted))


def hot_update_config(hot: HotUpdate, now_ms: int) -> bytes:
    """The inference worker's model config naming the model just deployed, with the time of
    the update (which tells the worker's poll the model changed)."""
    moment = datetime.fromtimestamp(now_ms / 1000, UTC)
    config = {"model_config": {"model_path": hot.model_path,
                               "model_update_time": wire.rfc3339_utc(moment)}}  # fmt: skip
    return json.dumps(config, indent=1).encode()


def unreadable(url: str) -> str:
    """What the errors topic says of a dataset source that is missing or may not be read."""
    return f"cannot read {url} (missing, or not readable by the controller)"


def _cursor_of(work: PollDataset) -> Cursor:
    """Where the last poll stopped; the start when none is known or the intent's cursor
    cannot be decoded (a full read then counts the dataset again, from its first sample)."""
    if not work.cursor:
        return Cursor()
    try:
        return _cursor_decoder.decode(work.cursor)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        log.warning("dataset %s/%s: its poll cursor cannot be decoded (%s); reading it whole",
                    work.namespace, work.name, e)  # fmt: skip
        return Cursor()


#: At most this many effects run inline (`InlineEffects`) per processor pass: in a burst of
#: rounds the rest go to the pool, which runs them side by side after the commit, so the
#: pass's other events wait for no more than these.
INLINE_PER_PASS = 4


class InlineEffects:
    """Effects run on the processor's thread before the commit of the transition that asked
    for them, their result applied in that same commit: one commit, and no hand-off to the
    pool and back, for a round's small local steps (a round file from a small local
    dataset, a small local model's deploy copy).

    Only a `WriteRound` or a `CopyModel` of the resource itself whose every path is local
    and whose source holds at most ``max_bytes``, on a shard still held under the pass's
    lease token, at most `INLINE_PER_PASS` a pass. No intent is stored for it: a crash, a
    lost lease or a failed commit leaves the event that asked for it unapplied (pending in
    its shard's stream, or unacknowledged to the broker), so whoever applies that event next
    asks for the effect again and redoes it; every effect is idempotent (`Executor`). The
    work is tried once: a failure the result does not report (a transient one, a store
    outage) leaves it to the pool, after the commit, which retries it.
    """

    def __init__(
        self,
        *,
        executor: Executor,
        leases: LeaseKeeper,
        clock: Clock,
        metrics: Metrics,
        max_bytes: int,
    ) -> None:
        """``executor`` tries once (`Executor.trying_once`): the pool retries, the processor
        does not wait."""
        self._executor = executor
        self._leases = leases
        self._clock = clock
        self._metrics = metrics
        self._max_bytes = max_bytes
        self._left = 0

    def begin_pass(self) -> None:
        """A processor pass starts: its allowance of inline effects is whole again."""
        self._left = INLINE_PER_PASS if self._max_bytes else 0

    def run(
        self, shard: int, token: str, rkey: str, work: Work, known: KnownStates | None = None
    ) -> Event | None:
        """The work's result, done now; None: not done here (it is left to the pool). The
        stored states it needs come from ``known`` where it knows them."""
        if self._left <= 0:
            return None
        source = _inline_source(work, rkey)
        if source is None:
            return None
        size = local_size(source)
        if size is None or size > self._max_bytes or self._leases.token(shard) != token:
            return None
        self._left -= 1
        kind = type(work).__name__
        try:
            result = self._executor.run(work, self._clock.now_ms(), known)
        except Exception as e:
            log.info("%s: its %s on the processor's thread failed (%s); the pool redoes it",
                     rkey, kind, e)  # fmt: skip
            return None
        if result is not None:
            self._metrics.effects.labels(type=kind, outcome="inline").inc()
        return result


def _inline_source(work: Work, rkey: str) -> str | None:
    """The file whose size decides whether the work may run inline; None: it may not."""
    if isinstance(work, WriteRound):
        urls: tuple[str, ...] = (work.source_url, work.data_url, work.index_url or "")
        source = work.source_url
    elif isinstance(work, CopyModel):
        urls, source = (work.src_url, work.dst_url), work.src_url
    else:
        return None
    if job_key(work.namespace, work.name) != rkey or any(paths.is_remote(u) for u in urls):
        return None
    return source


EFFECT_WORKERS = 4
EFFECT_RETRY_S = 1.0
#: How long after its start an intent's result is awaited in process (`EffectRunner.expecting`):
#: the processor then waits for it without blocking in Redis. Past that, it blocks in Redis
#: again, and a result that comes while it does goes through the ingress stream (which wakes it).
EXPECT_WINDOW_S = 0.05


class EffectRunner:
    """Each intent runs once per process at a time, from its submission until its outcome is
    settled in Redis; then, in one of two ways:

    - In process: a result event of a shard still held under the lease token the intent was
      submitted under is handed to the processor (`Handoff`), which applies it in its
      next commit and retires the intent in that same fenced transaction (`settled` then
      frees the intent). A crash before that commit leaves the intent pending: the next
      owner redoes it.
    - Through Redis: a result while the processor is blocked in its Redis read, no result,
      or a shard held under another token (it moved while the work ran, maybe back to this
      replica, whose recovery then skipped the intent as running) go to the ingress in the
      script that retires the intent, once (`Outboxes.complete_effect`).

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
        handoff: Handoff,
    ) -> None:
        self._executor = executor
        self._handoff = handoff
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
        self._started: dict[str, float] = {}  # when each running intent started

    def submit(self, shard: int, effect_id: str, work: Work, token: str) -> None:
        """Run the intent, pending in Redis under the shard's lease ``token``."""
        if self._stop.is_set():
            return  # the intent stays in Redis; the next owner runs it
        with self._lock:
            if effect_id in self._running:
                return  # recovery found an intent this process is already running
            self._running.add(effect_id)
            self._started[effect_id] = self._clock.monotonic_s()
        self._pool.submit(self._run, shard, effect_id, work, token)

    def resubmit(self, shard: int, effect_id: str, intent: bytes, token: str) -> None:
        """Run a pending intent as stored in Redis (`submit`); one that cannot be decoded is
        set aside and retired under the shard's lease (left for the next owner without it)."""
        try:
            work = decode_work(intent)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self._rejections.unreadable(
                "effects", f"shard {shard} intent {effect_id}", f"not an effect intent: {e}",
                intent, self._clock.now_ms(),
            )  # fmt: skip
            self._outboxes.complete_effect(shard, token, effect_id, None)
            return
        self.submit(shard, effect_id, work, token)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------ the processor's side
    def expecting(self) -> bool:
        """Whether an intent started less than `EXPECT_WINDOW_S` ago still runs (its result
        will likely be handed over soon)."""
        now = self._clock.monotonic_s()
        with self._lock:
            return any(now - t < EXPECT_WINDOW_S for t in self._started.values())

    def settled(self, effect_ids: Iterable[str]) -> None:
        """The handed-over results of these intents were committed or dropped: a pending
        intent among them may run again (recovery resubmits it)."""
        with self._lock:
            self._running.difference_update(effect_ids)

    # ------------------------------------------------------------ the pool's side
    def _run(self, shard: int, effect_id: str, work: Work, token: str) -> None:
        beat = self._heartbeats.watch(threading.current_thread().name)
        handed = False
        try:
            with beat:
                handed = self._run_until_done(shard, effect_id, work, token)
        finally:
            beat.close()  # idle in the pool from now on, whatever happened
            with self._lock:
                self._started.pop(effect_id, None)
                if not handed:
                    self._running.discard(effect_id)

    def _run_until_done(self, shard: int, effect_id: str, work: Work, token: str) -> bool:
        """Do the work, then settle the intent (see the class); True if its result was
        handed to the processor (the intent stays running until `settled`).

        With the shard held under another token now, the result does not depend on who
        computed it, so completing under the current token is correct; with no lease, the
        next owner finds the intent and redoes it.
        """
        kind = type(work).__name__
        while not self._stop.is_set():
            progress()
            try:
                handed = self._complete(shard, effect_id, work, token)
                self._metrics.effects.labels(type=kind, outcome="done").inc()
                return handed
            except LeaseLost:
                log.info("effect %s: shard %d moved while it ran; its owner redoes it",
                         effect_id, shard)  # fmt: skip
                return False
            except StoreUnavailable as e:
                log.warning("effect %s waits for redis: %s", effect_id, e)
            except Exception:
                log.exception("effect %s (%s) failed unexpectedly; retrying", effect_id, kind)
                self._metrics.effects.labels(type=kind, outcome="error").inc()
            self._stop.wait(EFFECT_RETRY_S)
        return False

    def _complete(self, shard: int, effect_id: str, work: Work, token: str) -> bool:
        result = self._executor.run(work, self._clock.now_ms())
        current = self._leases.token(shard)
        if current is None:
            raise LeaseLost(f"shard {shard} is no longer held")
        if (
            result is not None
            and current == token
            and shard_of(target_of(result)) == shard
            and self._handoff.offer_result(LocalResult(shard, token, effect_id, result))
        ):
            return True
        data = encode_accepted(Accepted(event=result)) if result is not None else None
        self._outboxes.complete_effect(shard, current, effect_id, data)
        return False
