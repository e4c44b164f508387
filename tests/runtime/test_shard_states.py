"""The processor's cache of committed states: valid for one lease token, emptied on doubt,
and decoded once."""

from __future__ import annotations

from typing import cast

import pytest

from service.core.events import DatasetChanged
from service.core.lifecycle import transition
from service.core.state import State, encode_state
from service.heartbeat import SystemClock
from service.keys import shard_of
from service.metrics import Metrics
from service.runtime import processor
from service.runtime.executor import Executor, InlineEffects, OutputDirs
from service.runtime.intake import Accepted
from service.runtime.leases import LeaseKeeper
from service.runtime.processor import Cached, Plan, ResourceRunner, ShardStates
from service.runtime.rejections import Held, Quarantines
from tests.core.driver import DATASET, JOB, NS, info, report
from tests.runtime.test_planner import CONFIG, RKEY, TOKEN, created


def test_states_are_kept_per_shard_and_token() -> None:
    states = ShardStates()
    states.of(3, "r1:1")["job:default/a"] = b"v1"
    assert states.of(3, "r1:1") == {"job:default/a": b"v1"}
    # the shard came back under a new token: another replica may have changed it meanwhile
    assert states.of(3, "r1:2") == {}
    states.of(3, "r1:2")["job:default/a"] = b"v2"
    states.of(4, "r1:7")["job:default/b"] = b"w"
    states.forget(3)  # a commit failed or its fate is unknown
    assert states.of(3, "r1:2") == {}
    states.keep_only({3})  # shard 4 is no longer held
    assert states.of(4, "r1:7") == {}
    states.of(5, "r1:9")["job:default/c"] = b"x"
    states.clear()  # Redis was unreachable: it may come back without its last writes
    assert states.of(5, "r1:9") == {}


def test_known_states_are_those_cached_under_their_shards_current_tokens() -> None:
    """What an effect may take from the cache instead of Redis: a state cached (or known
    absent) under its shard's current lease token; nothing of a shard cached under an
    older token, held no longer, or not cached at all."""
    states = ShardStates()
    a, b, c, d = (f"model:default/{n}" for n in "abcd")
    tokens = {shard_of(a): "r1:1", shard_of(b): "r1:1", shard_of(c): "r1:5"}
    states.of(shard_of(a), "r1:1")[a] = b"A"
    states.of(shard_of(b), "r1:1")[b] = None  # read: there is none
    states.of(shard_of(c), "r1:4")[c] = b"C"  # cached under the token before the current one
    assert states.known([a, b, c, d], tokens.get) == {a: b"A", b: None}
    assert states.known([a], lambda _shard: None) == {}, "a shard no longer held: nothing"


def test_a_state_is_decoded_once_then_kept_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the cache read from Redis stays bytes until a pass decodes it; from then on, and
    once a commit wrote the next state, it holds the decoded state, and the next pass starts
    from it without decoding again, planning what it would have planned from the bytes."""
    decoded: list[bytes] = []
    decode = processor.decode_state

    def counting(raw: bytes) -> State:
        decoded.append(raw)
        return decode(raw)

    monkeypatch.setattr(processor, "decode_state", counting)
    metrics = Metrics()
    runner = ResourceRunner(
        config=CONFIG,
        clock=SystemClock(),
        transition=transition,
        quarantines=Quarantines(metrics),
        output_dirs=cast(OutputDirs, None),  # claimed only by an insert; none comes here
        inline=InlineEffects(  # none runs inline: no bytes allowed
            executor=cast(Executor, None),
            leases=cast(LeaseKeeper, None), clock=SystemClock(), metrics=metrics, max_bytes=0,
        ),
        known=lambda _rkeys: {},
        metrics=metrics,
    )
    stored = encode_state(created())
    states: dict[str, Cached] = {RKEY: stored}
    changed = DatasetChanged(namespace=NS, name=JOB, dataset=DATASET, info=info(), num_samples=10)
    first = runner.plan(3, TOKEN, RKEY, states, [Held("1-0", Accepted(event=changed))])
    assert isinstance(first, Plan) and decoded == [stored]
    assert states[RKEY] == decode(stored)
    processor._remember(states, first)  # the commit went through
    assert states[RKEY] is first.state and first.commit.state is not None
    running = Held("1-1", Accepted(event=report("inference", "running")))
    second = runner.plan(3, TOKEN, RKEY, states, [running])
    assert decoded == [stored]
    from_bytes = runner.plan(3, TOKEN, RKEY, {RKEY: first.commit.state}, [running])
    assert isinstance(second, Plan) and isinstance(from_bytes, Plan)
    assert second.commit.outbox == from_bytes.commit.outbox
    assert second.state == from_bytes.state
