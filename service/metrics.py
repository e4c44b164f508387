"""Prometheus metrics of one service instance.

Each `Metrics` owns its `CollectorRegistry` rather than using prometheus_client's global one,
so several services (replicas in one test process, benchmarks) never collide on names and
a test sees only its own counts.

The health gauges carry the node's name so that alerts can ask "does any replica of this
node hold the ingress" however the scraper labels its targets.
"""


import contextlib
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from service.core.state import JobState, State

# One event's load -> transition -> commit takes about a millisecond; a second is a stall.
TRANSITION_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class Family:
    """One metric family: its name, its help text and its label names."""

    name: str
    help: str
    labels: tuple[str, ...] = ()

    def counter(self, registry: CollectorRegistry) -> Counter:
        return Counter(self.name, self.help, self.labels, registry=registry)

    def gauge(self, registry: CollectorRegistry) -> Gauge:
        return Gauge(self.name, self.help, self.labels, registry=registry)


# -- the processor's and the effect runner's work --------------------------------------------
EVENTS = Family(
    "lifelong_events",
    "Events applied to jobs and datasets, by event type and outcome.",
    ("type", "outcome"),
)
TRANSITION_SECONDS = Family(
    "lifelong_transition_seconds",
    "Time from loading a job's state to committing the transition's result.",
)
OUTBOX_DEPTH = Family(
    "lifelong_outbox_depth",
    "Upstream messages committed but not yet acknowledged by the broker.",
)
LEASES_HELD = Family("lifelong_leases_held", "Shard leases this replica holds.")
EFFECTS = Family(
    "lifelong_effects",
    "Side effects run (sample files, model copies, publishes), by type and outcome.",
    ("type", "outcome"),
)
# -- what was refused or set aside -----------------------------------------------------------
REJECTIONS = Family(
    "lifelong_rejections",
    "Inbound messages rejected, by a short reason class (invalid_json, unknown_job...).",
    ("reason",),
)
QUARANTINED = Family(
    "lifelong_quarantined_resources",
    "Resources quarantined on the shards this replica holds: their stored state or "
    "an ingress entry could not be decoded (see the dead-letter stream).",
)
QUARANTINED_ENTRIES = Family(
    "lifelong_quarantined_entries",
    "Ingress entries set aside on the dead-letter stream by a quarantine, by cause "
    "(state: the resource's state cannot be decoded; entry: the entry cannot).",
    ("cause",),
)
SET_ASIDE = Family(
    "lifelong_set_aside_entries",
    "Entries of the outbox, the GM outbox or the effect intents that could not be decoded, "
    "moved to the dead-letter stream with the reason so the rest goes on, by queue.",
    ("queue",),
)
# -- datasets --------------------------------------------------------------------------------
DATASET_SAMPLES = Family(
    "lifelong_dataset_samples",
    "Samples last counted in each dataset.",
    ("namespace", "name"),
)
DATASET_UNREADABLE = Family(
    "lifelong_dataset_unreadable",
    "1 for each dataset whose source cannot be read now (missing, permission, S3 "
    "403/404); absent once it can be read or is deleted.",
    ("namespace", "name"),
)
DATASET_UNREADABLE_REPORTS = Family(
    "lifelong_dataset_unreadable_reports",
    "Datasets found unreadable, once per change of condition (not per poll).",
    ("namespace", "name"),
)
# -- this replica's health, by node ----------------------------------------------------------
READY = Family(
    "lifelong_ready",
    "1 when this replica is ready: MQTT and Redis connected, and its intake "
    "subscribed when it holds the ingress lease.",
    ("node",),
)
INGRESS_HELD = Family(
    "lifelong_ingress_held",
    "1 when this replica holds its node's ingress lease (it alone takes in messages).",
    ("node",),
)
REDIS_UP = Family(
    "lifelong_redis_up",
    "1 when this replica's last lease-keeping round (heartbeat, renewals) reached Redis.",
    ("node",),
)
MQTT_UP = Family(
    "lifelong_mqtt_up",
    "1 when this replica's publishing MQTT client is connected to the broker.",
    ("node",),
)
# -- this replica's threads -----------------------------------------------------------------
THREAD_STALLS = Family(
    "lifelong_thread_stalls",
    "Stalls of this replica's threads: no heartbeat for half the lease, or the thread "
    "ended; each stall is counted once and logged with the thread's stack.",
    ("thread",),
)
THREAD_BEAT_AGE = Family(
    "lifelong_thread_beat_age_seconds",
    "Seconds since each watched thread of this replica last beat, as of the watchdog's "
    "last look; past the lease /healthz fails.",
    ("thread",),
)
# -- jobs ------------------------------------------------------------------------------------
JOBS = Family(
    "lifelong_jobs",
    "Jobs on the shards this replica holds, by phase and step.",
    ("phase", "step"),
)
JOB_PHASE_ENTERED = Family(
    "lifelong_job_phase_entered_timestamp_seconds",
    "When each job on a shard this replica holds entered its current phase and step "
    "(Unix time); none for jobs waiting for samples, which may wait for ever.",
    ("namespace", "name", "phase", "step"),
)


class Metrics:
    """The service's counters, gauges and histograms, registered in a private registry.

    The families the runtime's collaborators update are attributes (`events`, `rejections`,
    `dataset_samples`, ...); the health gauges and the per-job series are kept by
    `HealthGauges` and `JobMetrics`, through `set_health`, `job_changed` and `keep_jobs_of`.
    """

    def __init__(self, *, gm_link: bool = False) -> None:
        """`gm_link`: export the GM link's series (only where a GM is configured, so that
        its alert never fires for a controller that has no link)."""
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.events = EVENTS.counter(registry)
        self.transition_seconds = Histogram(
            TRANSITION_SECONDS.name,
            TRANSITION_SECONDS.help,
            buckets=TRANSITION_BUCKETS_S,
            registry=registry,
        )
        self.outbox_depth = OUTBOX_DEPTH.gauge(registry)
        self.leases_held = LEASES_HELD.gauge(registry)
        self.rejections = REJECTIONS.counter(registry)
        self.dataset_samples = DATASET_SAMPLES.gauge(registry)
        self.quarantined = QUARANTINED.gauge(registry)
        self.quarantined_entries = QUARANTINED_ENTRIES.counter(registry)
        self.set_aside = SET_ASIDE.counter(registry)
        self.dataset_unreadable = DATASET_UNREADABLE.gauge(registry)
        self.dataset_unreadable_reports = DATASET_UNREADABLE_REPORTS.counter(registry)
        self.effects = EFFECTS.counter(registry)
        self.thread_stalls = THREAD_STALLS.counter(registry)
        self.thread_beat_age = THREAD_BEAT_AGE.gauge(registry)
        self._health = HealthGauges(registry)
        self._jobs = JobMetrics(registry)
        self.gm = GmLinkMetrics(registry) if gm_link else None

    def set_health(
        self, node: str, *, ready: bool, ingress_held: bool, redis_up: bool, mqtt_up: bool
    ) -> None:
        """This replica's health as 0/1 gauges (refreshed by the presence loop)."""
        self._health.set(
            node, ready=ready, ingress_held=ingress_held, redis_up=redis_up, mqtt_up=mqtt_up
        )

    def job_changed(self, shard: int, before: State | None, after: State | None) -> None:
        """Count a job in its phase and step, from the state a transition left it in
        (`JobMetrics.changed`)."""
        self._jobs.changed(shard, before, after)

    def keep_jobs_of(self, shards: Collection[int]) -> None:
        """Forget the jobs on shards this replica no longer holds (`JobMetrics.keep`)."""
        self._jobs.keep(shards)

    def thread_forgotten(self, thread: str) -> None:
        """A thread stopped on purpose: drop its silence gauge (its stall count stays)."""
        with contextlib.suppress(KeyError):  # KeyError: the watchdog never looked at it
            self.thread_beat_age.remove(thread)

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every metric and its HTTP content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class HealthGauges:
    """This replica's health, each gauge 0 or 1 and labelled with its node."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ready = READY.gauge(registry)
        self.ingress_held = INGRESS_HELD.gauge(registry)
        self.redis_up = REDIS_UP.gauge(registry)
        self.mqtt_up = MQTT_UP.gauge(registry)

    def set(
        self, node: str, *, ready: bool, ingress_held: bool, redis_up: bool, mqtt_up: bool
    ) -> None:
        self.ready.labels(node=node).set(float(ready))
        self.ingress_held.labels(node=node).set(float(ingress_held))
        self.redis_up.labels(node=node).set(float(redis_up))
        self.mqtt_up.labels(node=node).set(float(mqtt_up))


class JobMetrics:
    """The jobs on the shards this replica holds: a count by phase and step, when each
    entered its phase, and its model series (`ModelMetrics`), all under one lock."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.jobs = JOBS.gauge(registry)
        self.phase_entered = JOB_PHASE_ENTERED.gauge(registry)
        #: (namespace, name) -> (shard, phase, step, phase_since_ms) of each job counted
        self._jobs: dict[tuple[str, str], tuple[int, str, str, int]] = {}
        self._lock = threading.Lock()
        self._kept_shards: frozenset[int] | None = None
        self.models = ModelMetrics(registry)

    def changed(self, shard: int, before: State | None, after: State | None) -> None:
        """Count a job in its phase and step, from the state a transition left it in.

        A job that is not waiting for samples also has a phase-entry series, replaced when it
        moves on; a deleted job is forgotten. A job whose entry time is unknown (0: a state
        older than the field) is counted without a series.
        """
        if isinstance(after, JobState):
            key = (after.namespace, after.name)
            entry = (shard, after.phase, after.step, after.phase_since_ms)
            with self._lock:
                self.models.changed(shard, after)
                if self._jobs.get(key) == entry:
                    return  # the common case: an event that left the job where it was
                self._forget(key)
                self._jobs[key] = entry
                self.jobs.labels(after.phase, after.step).inc()
                if _has_series(entry):
                    self.phase_entered.labels(*key, after.phase, after.step).set(
                        after.phase_since_ms / 1000
                    )
        elif isinstance(before, JobState):
            with self._lock:
                self._forget((before.namespace, before.name))
                self.models.forget((before.namespace, before.name))

    def keep(self, shards: Collection[int]) -> None:
        """Forget the jobs on shards this replica no longer holds: their new owner reports
        them, and a stale copy here would look like a job stuck in its old phase.
        Cheap when the shards are those of the last call (the processor calls it often)."""
        kept = frozenset(shards)
        with self._lock:
            if kept == self._kept_shards:
                return
            self._kept_shards = kept
            for key in [k for k, (shard, *_) in self._jobs.items() if shard not in kept]:
                self._forget(key)
            self.models.keep(kept)

    def _forget(self, key: tuple[str, str]) -> None:
        known = self._jobs.pop(key, None)
        if known is None:
            return
        _shard, phase, step, _since = known
        self.jobs.labels(phase, step).dec()
        if _has_series(known):
            self.phase_entered.remove(*key, phase, step)


#: (model, metric) -> value: the series of one job's model metrics
ModelSeries = dict[tuple[str, str], float]


class ModelMetrics:
    """Per job: the deployed version, and the latest metrics of the new model
    (`model="candidate"`, from the latest eval) and of the deployed one (`model="deployed"`:
    what that eval measured for it, or its own round's metrics when it was deployed since,
    by a rollback say). At most SERIES_PER_MODEL metrics per model: a list metric's values
    are `name[i]`, a one-value list is `name`. Callers hold the jobs lock."""

    SERIES_PER_MODEL = 8

    def __init__(self, registry: CollectorRegistry) -> None:
        self.deployed_version = Gauge(
            "lifelong_job_deployed_version",
            "The round whose model each job's deploy file holds (jobs with one deployed).",
            ["namespace", "name"],
            registry=registry,
        )
        self.metric = Gauge(
            "lifelong_job_model_metric",
            "The latest eval's metrics of each job's new model (candidate) and of its "
            "deployed model (deployed); at most 8 per model.",
            ["namespace", "name", "model", "metric"],
            registry=registry,
        )
        #: (namespace, name) -> (shard, deployed version, series) of each job exported
        self._jobs: dict[tuple[str, str], tuple[int, int | None, ModelSeries]] = {}

    def changed(self, shard: int, job: JobState) -> None:
        key = (job.namespace, job.name)
        entry = (shard, *_view(job))
        known = self._jobs.get(key)
        if known == entry:
            return
        if entry[1] is None and not entry[2]:
            self.forget(key)
            return
        old_version, old_series = (known[1], known[2]) if known is not None else (None, {})
        if entry[1] is not None:
            self.deployed_version.labels(*key).set(entry[1])
        elif old_version is not None:
            self.deployed_version.remove(*key)
        for labels in old_series.keys() - entry[2].keys():
            self.metric.remove(*key, *labels)
        for labels, value in entry[2].items():
            self.metric.labels(*key, *labels).set(value)
        self._jobs[key] = entry

    def forget(self, key: tuple[str, str]) -> None:
        known = self._jobs.pop(key, None)
        if known is None:
            return
        if known[1] is not None:
            self.deployed_version.remove(*key)
        for labels in known[2]:
            self.metric.remove(*key, *labels)

    def keep(self, shards: frozenset[int]) -> None:
        for key in [k for k, (shard, *_) in self._jobs.items() if shard not in shards]:
            self.forget(key)


def _view(job: JobState) -> tuple[int | None, ModelSeries]:
    """A job's deployed version and the series of its model metrics."""
    deployed = job.deployed
    scores = job.scores
    series: ModelSeries = {}
    if scores is not None:
        series.update(_series("candidate", scores.candidate))
    if deployed is not None:
        measured = scores is not None and scores.deployed_version == deployed.version
        latest = scores.deployed if measured and scores is not None else {}
        series.update(_series("deployed", latest or deployed.metrics))
    return (deployed.version if deployed is not None else None), series


def _series(model: str, metrics: Mapping[str, tuple[float, ...]]) -> ModelSeries:
    found: ModelSeries = {}
    for name, values in metrics.items():
        for i, value in enumerate(values):
            label = name if len(values) == 1 else f"{name}[{i}]"
            if len(found) == ModelMetrics.SERIES_PER_MODEL:
                return found
            found[(model, label)] = value
    return found


class GmLinkMetrics:
    """The GM link's counters; an observer for `service.adapters.gm_link.GmLink`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.frames = Counter(
            "lifelong_gm_frames",
            "Frames on the link to Sedna's GM: in (received, valid or not) and out (written).",
            ["direction"],
            registry=registry,
        )
        for direction in ("in", "out"):
            self.frames.labels(direction=direction)
        self.reconnects = Counter(
            "lifelong_gm_reconnects",
            "Times the link to Sedna's GM came back up after it had been up.",
            registry=registry,
        )
        self.up = Gauge(
            "lifelong_gm_link_up",
            "1 while this replica's link to Sedna's GM is connected, else 0.",
            registry=registry,
        )
        self.paused = Gauge(
            "lifelong_gm_link_reading_paused",
            "1 while the link to Sedna's GM reads nothing because the frames it handed on "
            "and the intake has not yet taken in are at their cap (backpressure), else 0.",
            registry=registry,
        )

    def frame(self, direction: Literal["in", "out"]) -> None:
        self.frames.labels(direction=direction).inc()

    def reconnected(self) -> None:
        self.reconnects.inc()

    def link_up(self, up: bool) -> None:
        self.up.set(1 if up else 0)

    def reading_paused(self, paused: bool) -> None:
        self.paused.set(1 if paused else 0)


def _has_series(entry: tuple[int, str, str, int]) -> bool:
    """Whether a counted job has a phase-entry series: known entry time, not waiting.

    Waiting for samples is where idle jobs spend their lives; thousands of them would make
    every scrape long, and no alert watches them.
    """
    _shard, _phase, step, since_ms = entry
    return step != "waiting" and since_ms > 0
