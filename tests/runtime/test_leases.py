"""Fair shares, and giving leases up when Redis cannot be reached for most of the TTL."""

from __future__ import annotations

from typing import Any

from service.adapters.redis_store import Leases, RedisStore
from service.errors import StoreUnavailable
from service.heartbeat import SystemClock
from service.keys import Keys
from service.runtime.leases import LeaseKeeper, fair_share, plan
from tests.servers import Server
from tests.wait import wait_until


def test_fair_share_and_plan() -> None:
    assert [fair_share(n) for n in (0, 1, 2, 3, 16, 20)] == [16, 16, 8, 6, 1, 1]
    assert plan([], 2) == (8, [])
    assert plan(list(range(16)), 2) == (0, list(range(8, 16)))
    assert plan([1, 2, 3], 1) == (13, [])


class FlakyStore(Leases):
    """Grants every lease until `down` is set, then fails like an unreachable Redis."""

    def __init__(self) -> None:
        self.keys = Keys()
        self.down = False
        self.fence = 0

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("connection refused")

    def heartbeat(self, replica: str, now_ms: int, ttl_ms: int) -> list[str]:
        self._check()
        return [replica]

    def renew(self, *_args: Any) -> bool:
        self._check()
        return True

    def acquire(self, *_args: Any) -> str:
        self._check()
        self.fence += 1
        return f"r:{self.fence}"


class StepClock:
    """A clock the test moves: no sleeping for lease deadlines."""

    def __init__(self) -> None:
        self.monotonic = 100.0

    def now_ms(self) -> int:
        return int(self.monotonic * 1000)

    def minute_of_day(self) -> int:
        return 0

    def monotonic_s(self) -> float:
        return self.monotonic


def test_leases_and_ingress_given_up_when_redis_unreachable_past_most_of_ttl() -> None:
    store = FlakyStore()
    clock = StepClock()
    ingress: list[bool] = []
    keeper = LeaseKeeper(
        store, "r", ttl_ms=200, clock=clock, on_acquired=lambda _s: None, on_ingress=ingress.append
    )
    keeper.tick()
    assert len(keeper.held()) == 16 and keeper.holds_ingress and ingress == [True]
    store.down = True
    clock.monotonic += 0.15  # unrenewed for 150 of 200 ms: a blip, keep going
    keeper.tick()
    assert len(keeper.held()) == 16 and keeper.holds_ingress
    clock.monotonic += 0.02  # now 170 ms, past 80% of the TTL: as good as gone
    keeper.tick()
    assert keeper.held() == {} and not keeper.holds_ingress
    assert ingress == [True, False], "the ingress client is stopped: no fight for its id"
    assert keeper.store_ok is False


def test_ingress_ready_only_once_the_holder_is_subscribed(redis_proc: Server) -> None:
    """A replica without the ingress lease counts the node able to take messages only once
    the holder said (in Redis, with its renewal) that its subscription is acknowledged."""
    store = RedisStore(f"redis://127.0.0.1:{redis_proc.port}/0", Keys("t"))
    clock = SystemClock()
    subscribed = {"a": False, "b": False}

    def keeper(name: str) -> LeaseKeeper:
        return LeaseKeeper(
            store.leases, name, ttl_ms=1_000, clock=clock, on_acquired=lambda _s: None,
            on_ingress=lambda _held: None, ingress_subscribed=lambda: subscribed[name],
        )  # fmt: skip

    try:
        a, b = keeper("a"), keeper("b")
        a.tick()
        b.tick()
        assert a.holds_ingress and not b.holds_ingress
        assert not a.ingress_ready and not b.ingress_ready, "held, but nobody listens yet"
        subscribed["a"] = True
        assert a.ingress_ready, "the holder knows at once"
        b.tick()
        assert not b.ingress_ready, "the holder has not said so yet"
        a.tick()
        b.tick()
        assert b.ingress_ready
        # a dies: its word lapses with its lease; b takes the ingress over, and is ready
        # once its own client is subscribed (the session a made keeps messages meanwhile)
        wait_until(lambda: (b.tick(), b.holds_ingress)[1], 5, "b taking the ingress over")
        assert not b.ingress_ready
        subscribed["b"] = True
        assert b.ingress_ready
    finally:
        store.close()
