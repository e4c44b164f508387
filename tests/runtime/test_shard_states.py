"""The processor's cache of committed states: valid for one lease token, emptied on doubt."""

from __future__ import annotations

from service.runtime.processor import ShardStates


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
