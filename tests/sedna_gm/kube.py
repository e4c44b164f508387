"""What the GM stands on in Kubernetes: the API server's store, informers whose caches lag
it, and client-go's work queue.

- `Store` is the API server: objects by (kind, namespace, name), each write bumps a global
  resourceVersion; `get` returns the fresh object (a copy); `update` runs a change under the
  store's lock (a Get and an Update with no conflict in between, which is what the GM's
  retried Get-then-Update amounts to). Watchers hear every change in order.
- `Informer` is a shared informer of one kind: it takes the store's changes in order and
  delivers each after a lag (fixed, or drawn per change from a range), first updating its
  cache, then calling the handlers with the cached object, as client-go does. A new
  informer lists the store first (every object an add).
- `WorkQueue` is client-go's work queue: a key added while queued is queued once; a key
  added while being processed is queued again once processing is done, so one key is never
  processed twice at once; `add_after` and `add_rate_limited` delay an add.
"""

from __future__ import annotations

import copy
import datetime
import heapq
import itertools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# (kind, namespace, name)
ObjectKey = tuple[str, str, str]


def now_rfc3339() -> str:
    """``metav1.Now()`` as the API marshals it: UTC, to the second."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NotFound(LookupError):
    """The API server's 404."""


@dataclass(frozen=True)
class Change:
    """One change of the store: ``added``, ``modified`` or ``deleted``, and the object after
    it (before it, for a deletion)."""

    type: str
    key: ObjectKey
    obj: dict[str, Any]


# a fixed lag in seconds, a (low, high) range drawn from uniformly per change, or the lag
# of each change
Lag = float | tuple[float, float] | Callable[[Change], float]


class Store:
    """The Kubernetes API server's objects (plain dicts of Go values; see `gojson`)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._objects: dict[ObjectKey, dict[str, Any]] = {}
        self._version = itertools.count(1)
        self._watchers: list[Callable[[Change], None]] = []

    def watch(self, watcher: Callable[[Change], None]) -> None:
        """List and watch: ``watcher`` hears every object now as added, then every change."""
        with self._lock:
            for key, obj in self._objects.items():
                watcher(Change("added", key, copy.deepcopy(obj)))
            self._watchers.append(watcher)

    def unwatch(self, watcher: Callable[[Change], None]) -> None:
        with self._lock:
            self._watchers.remove(watcher)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            obj = self._objects.get((kind, namespace, name))
            if obj is None:
                raise NotFound(f'{kind} "{namespace}/{name}" not found')
            return copy.deepcopy(obj)

    def list(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(o) for k, o in self._objects.items() if k[0] == kind]

    def create(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object: uid, generation and creation time set as the API server does."""
        with self._lock:
            meta = obj["metadata"]
            key = (kind, meta.get("namespace", ""), meta["name"])
            if key in self._objects:
                raise ValueError(f"{kind} {key[1]}/{key[2]} already exists")
            meta["uid"] = str(uuid.uuid4())
            meta["generation"] = 1
            meta["creationTimestamp"] = now_rfc3339()
            return self._write("added", key, obj)

    def update(
        self, kind: str, namespace: str, name: str, change: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any]:
        """Apply ``change`` to the fresh object and store it; NotFound when it is gone."""
        with self._lock:
            key = (kind, namespace, name)
            if key not in self._objects:
                raise NotFound(f'{kind} "{namespace}/{name}" not found')
            obj = copy.deepcopy(self._objects[key])
            change(obj)
            return self._write("modified", key, obj)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            key = (kind, namespace, name)
            obj = self._objects.pop(key, None)
            if obj is None:
                raise NotFound(f'{kind} "{namespace}/{name}" not found')
            self._notify(Change("deleted", key, obj))

    def _write(self, type_: str, key: ObjectKey, obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = str(next(self._version))
        self._objects[key] = obj
        self._notify(Change(type_, key, obj))
        return copy.deepcopy(obj)

    def _notify(self, change: Change) -> None:
        for watcher in self._watchers:
            watcher(Change(change.type, change.key, copy.deepcopy(change.obj)))


Handler = Callable[[str, dict[str, Any]], None]


class Informer:
    """A shared informer of one kind of `Store` object, its cache lagging the store.

    ``handler(type, cached_object)`` runs on the informer's thread for each delivered
    change, after the cache took it; an exception there is logged and the informer goes on
    (client-go's handlers cannot fail it either).
    """

    def __init__(self, store: Store, kind: str, lag: Lag, handler: Handler, name: str) -> None:
        self._store = store
        self._kind = kind
        self._lag = lag
        self._handler = handler
        self._cache: dict[ObjectKey, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._pending: list[tuple[float, int, Change]] = []
        self._sequence = itertools.count()
        self._last_due = 0.0
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        store.watch(self._on_change)
        self._thread.start()

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The cached object (a copy), None when the cache has none."""
        with self._cond:
            obj = self._cache.get((self._kind, namespace, name))
            return None if obj is None else copy.deepcopy(obj)

    def list(self) -> list[dict[str, Any]]:
        with self._cond:
            return [copy.deepcopy(obj) for obj in self._cache.values()]

    def stop(self) -> None:
        self._store.unwatch(self._on_change)
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(10)

    def _on_change(self, change: Change) -> None:
        if change.key[0] != self._kind:
            return
        if isinstance(self._lag, float | int):
            lag = self._lag
        elif isinstance(self._lag, tuple):
            lag = random.uniform(*self._lag)
        else:
            lag = self._lag(change)
        with self._cond:
            # changes are delivered in order: never before the one before
            self._last_due = max(self._last_due, time.monotonic() + lag)
            heapq.heappush(self._pending, (self._last_due, next(self._sequence), change))
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (
                    not self._pending or self._pending[0][0] > time.monotonic()
                ):
                    timeout = self._pending[0][0] - time.monotonic() if self._pending else None
                    self._cond.wait(timeout)
                if self._stopped:
                    return
                _, _, change = heapq.heappop(self._pending)
                if change.type == "deleted":
                    self._cache.pop(change.key, None)
                else:
                    self._cache[change.key] = copy.deepcopy(change.obj)
            try:
                self._handler(change.type, change.obj)
            except Exception:
                log.exception("informer handler failed on %s %s", change.type, change.key)


class WorkQueue:
    """client-go's rate-limiting work queue, for one worker."""

    def __init__(self, backoff_s: float, max_backoff_s: float) -> None:
        self._cond = threading.Condition()
        self._queue: list[str] = []
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._shutdown = False
        self._timers: list[threading.Timer] = []

    def add(self, key: str) -> None:
        with self._cond:
            if self._shutdown or key in self._dirty:
                return
            self._dirty.add(key)
            if key not in self._processing:
                self._queue.append(key)
                self._cond.notify_all()

    def add_after(self, key: str, delay_s: float) -> None:
        if delay_s <= 0:
            self.add(key)
            return
        timer = threading.Timer(delay_s, self.add, (key,))
        timer.daemon = True
        with self._cond:
            self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()

    def add_rate_limited(self, key: str) -> None:
        """Add after the item's exponential backoff (its failures so far)."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        self.add_after(key, min(self._backoff_s * 2**failures, self._max_backoff_s))

    def forget(self, key: str) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def requeues(self, key: str) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def get(self) -> str | None:
        """The next key, marked as being processed; None once shut down."""
        with self._cond:
            while not self._queue and not self._shutdown:
                self._cond.wait()
            if self._shutdown:
                return None
            key = self._queue.pop(0)
            self._processing.add(key)
            self._dirty.discard(key)
            return key

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify_all()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            for timer in self._timers:
                timer.cancel()
            self._cond.notify_all()
