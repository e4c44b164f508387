"""Durable timers: due trigger checks and dataset polls move into the ingress streams."""

from __future__ import annotations

from service.adapters.redis_store import Ingress
from service.runtime.clock import Clock
from service.runtime.leases import LeaseKeeper

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
