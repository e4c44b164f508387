"""The intake's resource counts, without servers: what counts as new, when a count drops,
and what happens while Redis cannot be read."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from service.adapters.redis_store import States
from service.config import Config
from service.errors import InvalidMessage, StoreUnavailable
from service.runtime.intake import Accepted, Admission, accept_downstream
from tests.harness import dataset_resource


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def monotonic_s(self) -> float:
        return self.now_s

    def now_ms(self) -> int:
        return int(self.now_s * 1000)


class Index(States):
    def __init__(self) -> None:
        self.rkeys: list[str] = []
        self.down = False

    def list_rkeys(self, kind: str | None, shards: Sequence[int]) -> list[str]:
        if self.down:
            raise StoreUnavailable("redis is away")
        return list(self.rkeys)


def message(name: str, operation: str = "insert", namespace: str = "default") -> Accepted:
    resource = dataset_resource(name, "/data/train.txt")
    resource["metadata"]["namespace"] = namespace
    header = {"namespace": namespace, "resourceKind": "dataset", "resourceName": name,
              "operation": operation}  # fmt: skip
    payload = json.dumps({"header": header, "content": resource}).encode()
    return accept_downstream("t", payload, 0)


def admission(index: Index, clock: Clock, most: int = 2) -> Admission:
    config = Config(node_name="edge-node", max_resources=most, max_namespace_resources=most)
    return Admission(config=config, index=index, clock=clock)


def test_updates_pass_the_cap_and_a_delete_of_an_unstored_insert_frees_its_place() -> None:
    index, clock = Index(), Clock()
    gate = admission(index, clock)
    gate.check(message("a"))
    gate.check(message("b"))
    gate.check(message("a"))  # an update: not counted again
    with pytest.raises(InvalidMessage, match="keeps 2 resources"):
        gate.check(message("c"))
    gate.check(message("b", "delete"))  # b was never seen stored: its place is free at once
    gate.check(message("c"))


def test_stored_resources_count_until_their_delete_is_applied() -> None:
    index, clock = Index(), Clock()
    index.rkeys = ["dataset:default/a", "dataset:default/b"]
    gate = admission(index, clock)
    gate.check(message("b", "delete"))
    with pytest.raises(InvalidMessage):
        gate.check(message("c"))
    index.rkeys = ["dataset:default/a"]  # the delete was applied
    clock.now_s += 1
    gate.check(message("c"))


def test_while_redis_is_away_the_last_counts_stand() -> None:
    index, clock = Index(), Clock()
    index.rkeys = ["dataset:default/a"]
    gate = admission(index, clock)
    gate.check(message("a"))
    index.down = True
    clock.now_s += 5
    gate.check(message("b"))  # the known counts and the pending insert, not an exception
    with pytest.raises(InvalidMessage):
        gate.check(message("c"))
