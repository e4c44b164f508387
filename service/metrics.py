"""Prometheus metrics of one service instance.

Each `Metrics` owns its `CollectorRegistry` rather than using prometheus_client's global one,
so several services (replicas in one test process, benchmarks) never collide on names and
a test sees only its own counts.
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

# One event's load -> transition -> commit takes about a millisecond; a second is a stall.
TRANSITION_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Metrics:
    """The service's counters, gauges and histograms, registered in a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.events = Counter(
            "lifelong_events",
            "Events applied to jobs and datasets, by event type and outcome.",
            ["type", "outcome"],
            registry=self.registry,
        )
        self.transition_seconds = Histogram(
            "lifelong_transition_seconds",
            "Time from loading a job's state to committing the transition's result.",
            buckets=TRANSITION_BUCKETS_S,
            registry=self.registry,
        )
        self.outbox_depth = Gauge(
            "lifelong_outbox_depth",
            "Upstream messages committed but not yet acknowledged by the broker.",
            registry=self.registry,
        )
        self.leases_held = Gauge(
            "lifelong_leases_held",
            "Shard leases this replica holds.",
            registry=self.registry,
        )
        self.rejections = Counter(
            "lifelong_rejections",
            "Inbound messages rejected, by a short reason class (invalid_json, unknown_job...).",
            ["reason"],
            registry=self.registry,
        )
        self.dataset_samples = Gauge(
            "lifelong_dataset_samples",
            "Samples last counted in each dataset.",
            ["namespace", "name"],
            registry=self.registry,
        )
        self.quarantined = Gauge(
            "lifelong_quarantined_resources",
            "Resources quarantined on the shards this replica holds: their stored state or "
            "an ingress entry could not be decoded (see the dead-letter stream).",
            registry=self.registry,
        )
        self.quarantined_entries = Counter(
            "lifelong_quarantined_entries",
            "Ingress entries set aside on the dead-letter stream by a quarantine, by cause "
            "(state: the resource's state cannot be decoded; entry: the entry cannot).",
            ["cause"],
            registry=self.registry,
        )
        self.effects = Counter(
            "lifelong_effects",
            "Side effects run (sample files, model copies, publishes), by type and outcome.",
            ["type", "outcome"],
            registry=self.registry,
        )

        self.gm = GmLinkMetrics(self.registry)

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every metric and its HTTP content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class GmLinkMetrics:
    """The GM link's counters; an observer for `service.adapters.gm.GmLink`."""

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

    def frame(self, direction: Literal["in", "out"]) -> None:
        self.frames.labels(direction=direction).inc()

    def reconnected(self) -> None:
        self.reconnects.inc()

    def link_up(self, up: bool) -> None:
        self.up.set(1 if up else 0)
