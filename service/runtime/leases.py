"""Shard leases and presence: each replica holds a fair share of the shards, fenced and
renewed, and says on its retained presence topic whether the node takes messages.

A lease is `SET key token NX PX ttl` with a fencing token from INCR; every commit checks the
token, so a replica frozen past its lease can never write again. Every `ttl/3` the keeper
heartbeats, renews what it holds, gives back what exceeds its fair share and takes free
shards up to it, calling the leases concern (`Leases`) directly. The fair share is
ceil(shards / live replicas), so two replicas split 8/8 and a survivor takes all 16 once
the dead one's leases and heartbeat expire.

The ingress lease holder also says in Redis, with each renewal, when its subscription is
acknowledged; the other replicas read it, so each knows whether a message sent to the node
now is taken in (`ingress_ready`, which gates the `online` presence).

Presence (`Presence`): a replica's retained presence topic says `online` once it can take
messages, `offline` when it stops (or, through its last will, when it dies). "Can take
messages" means a message published to the node now is taken in: the ingress is subscribed
(SUBACK received), by this replica or by another live one. Saying `online` any earlier let
a cloud peer that sends on first sight lose its message on a first start, when the broker
holds no session for the ingress client id yet to queue it. `online` is published again
every `REPUBLISH_LEASES` lease times while it holds: a retained message anyone allowed on
the topic left there (a spoofed `offline`, garbage) does not last.
"""


import logging
import math
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from service import wire
from service.adapters.mqtt import PublishTicket
from service.adapters.redis_store import Leases
from service.config import Config
from service.errors import StoreUnavailable
from service.heartbeat import Clock
from service.keys import NUM_SHARDS
from service.runtime.rejections import Publisher

log = logging.getLogger(__name__)

#: Give leases up locally once renewal has failed for this fraction of the TTL, before the
#: store lets them expire and another replica may take them.
GIVE_UP_FRACTION = 0.8


def fair_share(live_replicas: int, shards: int = NUM_SHARDS) -> int:
    return math.ceil(shards / max(1, live_replicas))


def plan(
    held: Sequence[int], live_replicas: int, shards: int = NUM_SHARDS
) -> tuple[int, list[int]]:
    """(how many shards to try to acquire, which held shards to release) for a fair share."""
    target = fair_share(live_replicas, shards)
    if len(held) > target:
        return 0, sorted(held)[target:]
    return target - len(held), []


class LeaseKeeper:
    """Holds this replica's shard leases and the single MQTT-ingress lease."""

    def __init__(
        self,
        leases: Leases,
        replica: str,
        ttl_ms: int,
        *,
        clock: Clock,
        on_acquired: Callable[[int], None],
        on_ingress: Callable[[bool], None],
        ingress_subscribed: Callable[[], bool] = lambda: False,
        live: Callable[[], bool] = lambda: True,
    ) -> None:
        self._leases = leases
        self._replica = replica
        self._ttl_ms = ttl_ms
        self._clock = clock
        self._on_acquired = on_acquired
        self._on_ingress = on_ingress
        self._ingress_subscribed = ingress_subscribed
        self._live = live
        self._stepped_down = False
        self._ready_elsewhere = False
        self._lock = threading.Lock()
        self._tokens: dict[int, str] = {}
        self._ingress_token: str | None = None
        self.store_ok = False
        self._renewed_at_s = clock.monotonic_s()

    def token(self, shard: int) -> str | None:
        with self._lock:
            return self._tokens.get(shard)

    def held(self) -> dict[int, str]:
        with self._lock:
            return dict(self._tokens)

    def lost(self, shard: int, token: str) -> None:
        """A commit was fenced: the lease is gone, whatever we thought."""
        with self._lock:
            if self._tokens.get(shard) == token:
                del self._tokens[shard]
        log.warning("lease on shard %d lost (fenced)", shard)

    @property
    def holds_ingress(self) -> bool:
        return self._ingress_token is not None

    @property
    def ingress_ready(self) -> bool:
        """A message sent to the node now is taken in: this replica holds the ingress and
        its client is subscribed, or another live replica's is (as it said in Redis at this
        replica's last tick)."""
        if self.holds_ingress:
            return self._ingress_subscribed()
        return self._ready_elsewhere

    @property
    def ingress_token(self) -> str:
        """The ingress lease token ("" when not held): marks what this holder takes in."""
        return self._ingress_token or ""

    def tick(self) -> None:
        """One round of heartbeat, renewal, rebalancing and the ingress lease; or, while the
        replica is not live (a thread of it stalled past the lease), none of that."""
        if not self._live():
            self._step_down()
            return
        if self._stepped_down:
            self._stepped_down = False
            log.warning("live again: taking a fair share of the shards")
        try:
            live = self._leases.heartbeat(self._replica, self._clock.now_ms(), self._ttl_ms)
            self._renew_all()
            self._renewed_at_s = self._clock.monotonic_s()
            self._rebalance(len(live))
            self._keep_ingress()
            self.store_ok = True
        except StoreUnavailable as e:
            self.store_ok = False
            log.warning("lease keeping paused: %s", e)
            unrenewed_s = self._clock.monotonic_s() - self._renewed_at_s
            if unrenewed_s > self._ttl_ms * GIVE_UP_FRACTION / 1000:
                self._give_up()

    def _give_up(self) -> None:
        """Unrenewed for most of the TTL: the leases are as good as gone. Drop them here too,
        above all the ingress: a holder that keeps its fixed MQTT client id after another
        replica took the lease would fight it for the id (each connect kicks the other)."""
        with self._lock:
            had = bool(self._tokens)
            self._tokens.clear()
        if had:
            log.warning("leases given up: not renewed for %d ms", self._ttl_ms)
        if self._ingress_token is not None:
            self._ingress_token = None
            self._on_ingress(False)

    def _step_down(self) -> None:
        """Not live: release every lease and leave the registry of live replicas, so the
        others take every shard at once (staying registered would keep their fair share at
        what it was). A thread stuck mid-commit cannot write after this: its token is gone."""
        if self._stepped_down:
            return
        log.error("not live (a thread stalled past the lease): giving up every lease")
        had_ingress = self._ingress_token is not None
        try:
            self.release_all()
        except StoreUnavailable as e:
            log.warning("could not release the leases (they expire): %s", e)
            with self._lock:
                self._tokens.clear()
            self._ingress_token = None
        self._stepped_down = True
        if had_ingress:
            self._on_ingress(False)

    def _renew_all(self) -> None:
        keys = self._leases.keys
        for shard, token in self.held().items():
            if not self._leases.renew(keys.lease(shard), token, self._ttl_ms):
                self.lost(shard, token)

    def _rebalance(self, live: int) -> None:
        keys = self._leases.keys
        wanted, release = plan(list(self.held()), live)
        released = []
        for shard in release:
            token = self.token(shard)
            if token is not None:
                with self._lock:
                    self._tokens.pop(shard, None)
                self._leases.release(keys.lease(shard), token)
                released.append(shard)
        if released:
            log.info("released shards %s (fair share with %d replicas)", _listed(released), live)
        acquired: dict[int, str] = {}
        for shard in self._free_shards():
            if len(acquired) >= wanted:
                break
            token = self._leases.acquire(
                keys.lease(shard), keys.fence(shard), self._replica, self._ttl_ms
            )
            if token is None:
                continue
            with self._lock:
                self._tokens[shard] = token
            acquired[shard] = token
            self._on_acquired(shard)
        if acquired:
            fences = ", ".join(token.rpartition(":")[2] for token in acquired.values())
            log.info("acquired shards %s (fences %s)", _listed(acquired), fences)

    def _free_shards(self) -> list[int]:
        held = self.held()
        # start at a replica-dependent offset so replicas starting together rarely collide
        start = sum(self._replica.encode()) % NUM_SHARDS
        order = [(start + i) % NUM_SHARDS for i in range(NUM_SHARDS)]
        return [s for s in order if s not in held]

    def _keep_ingress(self) -> None:
        keys = self._leases.keys
        if self._ingress_token is not None:
            if self._leases.renew(keys.ingress_lease(), self._ingress_token, self._ttl_ms):
                if self._ingress_subscribed():
                    self._leases.mark_ingress_subscribed(self._ingress_token, self._ttl_ms)
                return
            self._ingress_token = None
            log.warning("MQTT ingress lease lost")
            self._on_ingress(False)
        token = self._leases.acquire(
            keys.ingress_lease(), keys.ingress_fence(), self._replica, self._ttl_ms
        )
        if token is None:
            self._ready_elsewhere = self._leases.ingress_subscribed()
            return
        self._ingress_token = token
        self._ready_elsewhere = False
        log.info("holding the MQTT ingress lease (%s)", token)
        self._on_ingress(True)

    def release_all(self) -> None:
        keys = self._leases.keys
        for shard, token in self.held().items():
            self._leases.release(keys.lease(shard), token)
        with self._lock:
            self._tokens.clear()
        if self._ingress_token is not None:
            self._leases.release(keys.ingress_lease(), self._ingress_token)
            self._ingress_token = None
        self._leases.leave(self._replica)


def _listed(shards: Sequence[int] | dict[int, str]) -> str:
    return ",".join(map(str, sorted(shards)))


OFFLINE_WAIT_S = 2.0
REPUBLISH_LEASES = 3


def presence_payload(replica: str, state: wire.PresenceState, now_ms: int) -> bytes:
    since = datetime.fromtimestamp(now_ms / 1000, UTC).isoformat(timespec="milliseconds")
    return wire.encode(wire.Presence(replica=replica, state=state, since=since))


class Presence:
    def __init__(
        self,
        *,
        config: Config,
        replica: str,
        publisher: Publisher,
        clock: Clock,
        can_take_messages: Callable[[], bool],
    ) -> None:
        self._topic = config.presence_topic(replica)
        self._can_take_messages = can_take_messages
        self._replica = replica
        self._publisher = publisher
        self._clock = clock
        self._due = threading.Event()
        self._republish_s = REPUBLISH_LEASES * config.lease_s
        self._next_s = 0.0

    def on_connection(self, connected: bool) -> None:
        """The publisher (re)connected: say online again (the broker may have lost it)."""
        if connected:
            self._due.set()

    def announce(self) -> None:
        """Publish `online` when due (after a connection, and again every republish period),
        the publisher is connected and messages are taken in."""
        now_s = self._clock.monotonic_s()
        if now_s >= self._next_s:
            self._due.set()
        if self._due.is_set() and self._publisher.connected and self._can_take_messages():
            self._due.clear()
            self._next_s = now_s + self._republish_s
            self._publish("online")

    def offline(self) -> None:
        """Say `offline` (retained) and wait briefly for the broker to take it."""
        self._publish("offline").wait(OFFLINE_WAIT_S)

    def _publish(self, state: wire.PresenceState) -> PublishTicket:
        payload = presence_payload(self._replica, state, self._clock.now_ms())
        return self._publisher.publish(self._topic, payload, retain=True)
