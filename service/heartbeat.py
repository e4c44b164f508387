"""Time in a replica: its clock, the thread heartbeats read against it, and the watchdog that
reads them: no thread of a replica stalls silently.

`Clock` is the one source of time for a replica's collaborators (`SystemClock` in service),
so tests can move it instead of sleeping.

Each long-lived thread of a replica holds a `Beat` (`Heartbeats.watch`) and beats it every
time round its loop; every blocking call in such a loop has a timeout well under half the
lease, so a healthy thread always beats in time. Waiting is not stalling: a loop waiting on a
queue with a timeout beats each time round. Work that lasts longer than that (a model copy, a
first poll of a big dataset) beats as it goes by calling `progress()`, which beats whatever
`Beat` the calling thread holds (and does nothing on a thread that holds none).

The watchdog (`Heartbeats.check`, run by one thread of its own) looks at every beat:

- older than half the lease (`stall_after_s`): the thread is stalled. Logged once per stall
  with the stack the thread is in at that moment, and counted in
  ``lifelong_thread_stalls_total{thread}``; ``lifelong_thread_beat_age_seconds{thread}`` shows
  every watched thread's silence. The thread's next beat ends the stall (logged too).
- older than the whole lease (`dead_after_s`), or its thread ended without closing its beat
  (it crashed, or returned when it should not): the replica is not live. `live` says so, with
  the thread's name and how long it has been silent: ``/healthz`` answers 503 with that, so
  Kubernetes restarts the pod, and the lease keeper gives its leases up, so another replica
  takes the shards over at once. It is live again once the thread beats.

`live` is computed from the beats when asked, not from the watchdog's last pass, so a stalled
watchdog cannot hide a stall (it watches itself like any other thread).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from service.metrics import Metrics

log = logging.getLogger(__name__)


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

#: The watchdog looks this many times per stall limit, so a stall is seen within a quarter
#: of the limit after it began.
CHECKS_PER_LIMIT = 4

_current = threading.local()


def progress() -> None:
    """The calling thread made progress: beat the `Beat` it holds, if any."""
    beat: Beat | None = getattr(_current, "beat", None)
    if beat is not None:
        beat()


def current_beat() -> Callable[[], None]:
    """The beat of the calling thread's `Beat` (a no-op if it holds none), for work that
    another thread does on its behalf (an S3 transfer's callbacks)."""
    beat: Beat | None = getattr(_current, "beat", None)
    return beat if beat is not None else _no_beat


def _no_beat() -> None:
    return None


@dataclass
class _Watched:
    """One watched thread: its last beat and what the watchdog already said of it."""

    name: str
    thread: threading.Thread
    last_s: float
    #: the last beat before the stall the watchdog reported (None: not stalled)
    stalled_since_s: float | None = None
    ended_reported: bool = False


class Beat:
    """A watched thread's heartbeat: call it to beat; `close` when the thread stops on
    purpose. As a context manager it is also the thread's `progress()` target, and is
    closed on a normal exit only: a thread that leaves by an exception stays watched and
    counts as ended."""

    def __init__(self, heartbeats: Heartbeats, watched: _Watched) -> None:
        self._heartbeats = heartbeats
        self._watched = watched

    @property
    def name(self) -> str:
        return self._watched.name

    def __call__(self) -> None:
        self._watched.last_s = self._heartbeats.monotonic()

    def close(self) -> None:
        """The thread stops on purpose: no longer watched."""
        self._heartbeats.forget(self._watched)

    def __enter__(self) -> Beat:
        _current.beat = self
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _current.beat = None
        if exc_type is None:
            self.close()


class Heartbeats:
    """The beats of one replica's threads, its watchdog, and whether the replica is live.

    ``monotonic``: the clock beats are read with (a replica's `Clock.monotonic_s`);
    ``lease_s``: the lease time-to-live, of which half is the stall limit and the whole the
    liveness limit.
    """

    def __init__(
        self, monotonic: Callable[[], float], lease_s: float, *, metrics: Metrics | None = None
    ) -> None:
        self.monotonic = monotonic
        self.stall_after_s = lease_s / 2
        self.dead_after_s = lease_s
        self._metrics = metrics
        self._lock = threading.Lock()
        self._watched: dict[str, _Watched] = {}
        self._checked_s: float | None = None  # when the watchdog last looked

    @property
    def check_interval_s(self) -> float:
        """How often the watchdog looks (and how often an idle watched loop should beat at
        least, with room to spare)."""
        return self.stall_after_s / CHECKS_PER_LIMIT

    def watch(self, name: str, thread: threading.Thread | None = None) -> Beat:
        """Start watching ``thread`` (default: the calling one) under ``name``, beaten now.
        A name watched already is taken over (an effect worker's next effect)."""
        watched = _Watched(name, thread or threading.current_thread(), self.monotonic())
        with self._lock:
            self._watched[name] = watched
        if self._metrics is not None:  # the stall count exists (at 0) from the first watch
            self._metrics.thread_stalls.labels(thread=name)
        return Beat(self, watched)

    def forget(self, watched: _Watched) -> None:
        with self._lock:
            if self._watched.get(watched.name) is not watched:
                return  # taken over by a newer watch of the same name
            del self._watched[watched.name]
        if self._metrics is not None:
            self._metrics.thread_forgotten(watched.name)

    def live(self) -> tuple[bool, str]:
        """(False, which threads and how long they have been silent) when a watched thread
        ended or has not beaten for the whole lease; else (True, "ok"). Right after a pause
        of the whole process (`_paused`) the answer is True: no thread is to blame."""
        now = self.monotonic()
        with self._lock:
            watched = list(self._watched.values())
            paused = self._paused(now, watched)
        if paused:
            return True, "ok"
        dead = [
            _silence(w, now) for w in watched
            if not w.thread.is_alive() or now - w.last_s > self.dead_after_s
        ]  # fmt: skip
        if not dead:
            return True, "ok"
        return False, "; ".join(sorted(dead)) + f" (limit {self.dead_after_s:g} s)"

    def check(self) -> None:
        """One look at every beat: report new stalls (with their stacks) and ended
        threads, note stalls that ended, and set the silence gauges.

        When the watchdog itself looks again only after more than the stall limit, the whole
        process was paused (SIGSTOP, a frozen VM): every beat is old for that reason alone,
        so no thread is blamed; the beats count from now."""
        now = self.monotonic()
        with self._lock:
            watched = list(self._watched.values())
            paused = self._paused(now, watched)
            self._checked_s = now
        if paused:
            return
        frames = None
        for w in watched:
            age = now - w.last_s
            if self._metrics is not None:
                self._metrics.thread_beat_age.labels(thread=w.name).set(age)
            if not w.thread.is_alive():
                if not w.ended_reported:
                    w.ended_reported = True
                    self._count(w.name)
                    log.error("thread %s ended (silent for %.1f s): the replica is not live",
                              w.name, age)  # fmt: skip
                continue
            last = w.last_s
            if w.stalled_since_s is not None and last != w.stalled_since_s:
                log.warning("thread %s beats again after %.1f s of silence",
                            w.name, last - w.stalled_since_s)  # fmt: skip
                w.stalled_since_s = None
            if w.stalled_since_s is None and age > self.stall_after_s:
                w.stalled_since_s = last
                self._count(w.name)
                if frames is None:
                    frames = sys._current_frames()
                log.error(
                    "thread %s stalled: no beat for %.1f s (limit %g s; past %g s the replica "
                    "is not live); it is in:\n%s",
                    w.name, age, self.stall_after_s, self.dead_after_s,
                    _stack(frames.get(w.thread.ident or -1)),
                )  # fmt: skip

    def _paused(self, now: float, watched: list[_Watched]) -> bool:
        """Whether the watchdog last looked more than the stall limit ago, as only a pause of
        the whole process explains (SIGSTOP, a frozen VM): then the beats count from now, so
        that neither the watchdog nor a liveness question asked first after the pause
        blames a thread for it. Called under the lock."""
        gap = 0.0 if self._checked_s is None else now - self._checked_s
        if gap <= self.stall_after_s:
            return False
        self._checked_s = now
        for w in watched:
            w.last_s = max(w.last_s, now)
        log.warning(
            "the whole process was paused for %.1f s (every thread at once, the watchdog "
            "too): no thread is blamed", gap,
        )  # fmt: skip
        return True

    def run(self, stop: threading.Event) -> None:
        """The watchdog's loop, until ``stop``; it beats like every watched thread."""
        with self.watch("watchdog") as beat:
            while not stop.is_set():
                beat()
                try:
                    self.check()
                except Exception:
                    log.exception("watchdog check failed; continuing")
                stop.wait(self.check_interval_s)

    def _count(self, name: str) -> None:
        if self._metrics is not None:
            self._metrics.thread_stalls.labels(thread=name).inc()


def _silence(w: _Watched, now: float) -> str:
    state = "ended" if not w.thread.is_alive() else "silent"
    return f"thread {w.name} {state} for {now - w.last_s:.1f} s"


def _stack(frame: FrameType | None) -> str:
    if frame is None:
        return "  (no stack: the thread is not running Python code)"
    return "".join(traceback.format_stack(frame)).rstrip()
