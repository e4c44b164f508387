"""What the intake admits beyond a message's own validity: a dataset only for this
controller's node, and no more resources, or larger ones, than the node keeps.

- A dataset whose ``spec.nodeName`` is another node is refused (``wrong_node``): its source
  lies on that node, and the controller of that node watches it. Jobs are not placed this
  way: a job is bound on every node its workers run on.
- A resource whose JSON exceeds ``max_resource_bytes`` is refused (``too_large``).
- An insert of a new resource is refused (``too_many``) once the node keeps
  ``max_resources`` resources, or ``max_namespace_resources`` of its namespace; an update
  of a kept one is never refused by these counts.

The counts are those of the resources stored (the shards' indexes, read again at most every
`REFRESH_S` while inserts arrive) plus the inserts this intake admitted that are not stored
yet, each counted until it is stored, deleted, or `PENDING_S` passed (an insert the
lifecycle then refused stops counting then). A stored resource counts until its delete is
applied.
"""

from __future__ import annotations

import logging
from collections import Counter

import msgspec

from service.adapters.redis_store import States
from service.config import Config
from service.core.events import DatasetApplied, DatasetDeleted, JobDeleted
from service.errors import InvalidMessage, StoreUnavailable
from service.keys import NUM_SHARDS
from service.runtime.accept import Accepted, target_of
from service.runtime.clock import Clock

log = logging.getLogger(__name__)

REFRESH_S = 1.0
PENDING_S = 60.0


class _Spec(msgspec.Struct, frozen=True, rename="camel"):
    node_name: str = ""


class _Placed(msgspec.Struct, frozen=True):
    spec: _Spec = _Spec()


_placed_decoder = msgspec.json.Decoder(_Placed)


class Admission:
    """Checks each accepted message before it is made durable (`check`); used by the intake
    only, on its one thread."""

    def __init__(self, *, config: Config, index: States, clock: Clock) -> None:
        self._node = config.node_name
        self._max = config.max_resources
        self._max_per_namespace = config.max_namespace_resources
        self._max_bytes = config.max_resource_bytes
        self._index = index
        self._clock = clock
        self._read_at = -REFRESH_S
        self._stored: set[str] = set()
        self._pending: dict[str, float] = {}  # admitted, not stored yet -> when admitted
        self._namespaces: Counter[str] = Counter()

    def check(self, accepted: Accepted) -> None:
        """Raise `InvalidMessage` with the reason when ``accepted`` may not go in; otherwise
        count it if it inserts a new resource."""
        resource = accepted.resource
        if isinstance(accepted.event, DatasetDeleted | JobDeleted):
            self._forget(target_of(accepted.event))
        if resource is None:
            return  # a delete, a rollback, a report: nothing is kept for it
        if isinstance(accepted.event, DatasetApplied):
            self._check_node(resource)
        if len(resource) > self._max_bytes:
            raise InvalidMessage(
                f"the resource holds {len(resource)} bytes, more than the "
                f"{self._max_bytes} a node keeps of one (LIFELONG_MAX_RESOURCE_BYTES)",
                code="too_large",
            )
        self._count(target_of(accepted.event))

    def _check_node(self, resource: bytes) -> None:
        node = _placed_decoder.decode(resource).spec.node_name
        if node != self._node:
            raise InvalidMessage(
                f"the dataset is for node {node!r}; this controller serves {self._node!r}",
                "$.spec.nodeName",
                code="wrong_node",
            )

    def _count(self, rkey: str) -> None:
        now_s = self._clock.monotonic_s()
        if now_s - self._read_at >= REFRESH_S:
            self._refresh(now_s)
        if rkey in self._stored or rkey in self._pending:
            return  # an update
        namespace = _namespace_of(rkey)
        total = len(self._stored) + len(self._pending)
        if total >= self._max:
            raise InvalidMessage(
                f"the node keeps {total} resources, the most it may "
                f"(LIFELONG_MAX_RESOURCES={self._max}); delete one first",
                code="too_many",
            )
        if self._namespaces[namespace] >= self._max_per_namespace:
            raise InvalidMessage(
                f"the node keeps {self._namespaces[namespace]} resources of namespace "
                f"{namespace!r}, the most it may (LIFELONG_MAX_NAMESPACE_RESOURCES="
                f"{self._max_per_namespace}); delete one first",
                code="too_many",
            )
        self._pending[rkey] = now_s
        self._namespaces[namespace] += 1

    def _forget(self, rkey: str) -> None:
        """A delete: an insert of ``rkey`` admitted but not stored yet counts no more (a
        stored one counts until the delete is applied)."""
        if self._pending.pop(rkey, None) is not None:
            self._namespaces[_namespace_of(rkey)] -= 1

    def _refresh(self, now_s: float) -> None:
        """Read the stored resources again; forget the pending ones now stored or too old.
        While Redis cannot be read the last counts stand (the batch still goes in; storing it
        waits for Redis anyway)."""
        try:
            self._stored = set(self._index.list_rkeys(None, range(NUM_SHARDS)))
        except StoreUnavailable as e:
            log.warning("resource counts not refreshed, the last ones stand: %s", e)
            return
        self._read_at = now_s
        self._pending = {
            rkey: at_s
            for rkey, at_s in self._pending.items()
            if rkey not in self._stored and now_s - at_s < PENDING_S
        }
        self._namespaces = Counter(map(_namespace_of, (*self._stored, *self._pending)))


def _namespace_of(rkey: str) -> str:
    """The namespace of a resource key, ``<kind>:<namespace>/<name>``, whatever its kind."""
    return rkey.partition(":")[2].partition("/")[0]
