"""The committed states of owned shards' resources, kept so the hot path skips a read."""

from __future__ import annotations

from collections.abc import Collection


class ShardStates:
    """The committed states of owned shards' resources, each shard's valid for one lease token.

    While a replica holds a shard's lease it is the only writer of the shard's states (every
    commit is fenced), so what it committed is what Redis holds and need not be read back. A
    new token (the shard came back, maybe changed by another replica meanwhile) starts empty;
    a commit that failed or whose fate is unknown empties it, replaying a shard's pending
    entries empties it, and any Redis outage empties all. Used by the processor thread only.
    """

    def __init__(self) -> None:
        self._by_shard: dict[int, tuple[str, dict[str, bytes | None]]] = {}

    def of(self, shard: int, token: str) -> dict[str, bytes | None]:
        current = self._by_shard.get(shard)
        if current is None or current[0] != token:
            current = (token, {})
            self._by_shard[shard] = current
        return current[1]

    def forget(self, shard: int) -> None:
        self._by_shard.pop(shard, None)

    def clear(self) -> None:
        self._by_shard.clear()

    def keep_only(self, shards: Collection[int]) -> None:
        for shard in [s for s in self._by_shard if s not in shards]:
            del self._by_shard[shard]
