"""The Redis store: the only place state lives.

Durable, atomic, fenced primitives over redis-py, on one server, behind Sentinel or on a
Cluster (``service.urls.parse_redis_url`` reads which from the URL; ``redis_links`` carries
the commands). State and effects are opaque ``bytes``; the runtime decides what they mean.
Every write that depends on owning a shard runs as a Lua script (``*.lua`` in this package)
that first compares the shard's lease with the caller's token, so a replica whose lease
expired or was taken can never write again (fencing). Every script touches one hash slot: a
shard's keys share the tag ``{s<N>}``, the ingress lease and its fence ``{ingress}``.

The hot path per batch is exactly three round trips: ``read_ingress``, ``load`` and
``commit`` (on a Cluster an idle read takes a second one, to block on one shard).

Replication is asynchronous, so a failover may lose the last writes the old master took.
With ``min_replicas`` > 0 every write the controller acts on (an event taken in before the
broker or an HTTP client is answered, a commit before its upstream messages and effects, a
lease before its fencing token is used, an effect's outcome) is followed, in the same
exchange, by ``WAIT min_replicas``; too few confirmations within the bound raise
``StoreUnavailable``, and the caller treats the write as not done. Reads whose content is
about to be acted on (unsent outbox and GM outbox entries, pending effect intents) end with
a barrier write and the same WAIT, so nothing a failover could take back goes out.

Library errors never leave this package: connection-level failures, a topology in motion
and unconfirmed writes become ``StoreUnavailable``, a fenced script ``LeaseLost``, anything
else ``PermanentError``.

- `values`: what the store takes and gives (commits, quarantines, ingress and outbox entries).
- `calls`: commands and script calls in one round trip, confirmations, error translation.
- `connect`: the link for the URL's topology, loading the scripts on every connection.
- `ingress`: the per-shard ingress streams and the timers that fire into them.
- `state`: resource state, the fenced commit, quarantine marks.
- `outbox`: the outbox, the GM outbox and effect intents.
- `leases`: leases with fencing tokens, the replica registry, the GM link's state.
- `records`: the dead-letter stream, outputDir claims, which jobs use each dataset.
- `store`: `RedisStore`, composing them.

The names other code uses are importable from this package.
"""

from service.adapters.redis_store.store import RedisStore
from service.adapters.redis_store.values import (
    Commit,
    IngressEntry,
    OutboxEntry,
    Quarantine,
    Unreadable,
)

__all__ = ["Commit", "IngressEntry", "OutboxEntry", "Quarantine", "RedisStore", "Unreadable"]
