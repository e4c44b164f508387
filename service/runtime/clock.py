"""The one source of time for a replica, so tests can move it instead of sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Wall time for the lifecycle (timers, windows, periods) and a monotonic time for the
    replica's own deadlines (lease renewal, sweeps, redelivery timeouts)."""

    def now_ms(self) -> int: ...

    def minute_of_day(self) -> int: ...

    def monotonic_s(self) -> float: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def minute_of_day(self) -> int:
        local = time.localtime()
        return local.tm_hour * 60 + local.tm_min

    def monotonic_s(self) -> float:
        return time.monotonic()
