"""Which job writes to an outputDir: two jobs (in different namespaces, say) given the same
one would overwrite each other's round files and deployed model.

Each job claims its outputDir when an insert leaves it with one (a key per outputDir:
`RedisStore.claim_output_dir`); the second job to claim a taken outputDir has its insert
refused, naming the holder. A job gives its claim up when it is deleted or moves to another
outputDir (a `ReleaseOutputDir` effect, committed with the state, so a crash cannot lose it).
A claim whose job is gone, or has moved elsewhere, is stale and taken over, but only once it
is older than two lease periods: a new job's claim precedes its first commit by a moment,
and that commit may wait for a shard's next owner.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from service.core import paths
from service.core.state import JobState, decode_state
from service.keys import parse_rkey


class ClaimStore(Protocol):
    def claim_output_dir(
        self, output_dir: str, job_rkey: str, now_ms: int, *, stale: str = "", grace_ms: int
    ) -> str | None: ...

    def load(self, rkeys: list[str]) -> dict[str, bytes | None]: ...


class OutputDirs:
    def __init__(self, store: ClaimStore, grace_ms: int) -> None:
        self._store = store
        self._grace_ms = grace_ms

    def claim(self, job_rkey: str, output_dir: str, now_ms: int) -> str | None:
        """Claim the outputDir for the job: None when it is the job's, else the job that
        holds it, as `namespace/name`."""
        holder = self._store.claim_output_dir(
            output_dir, job_rkey, now_ms, grace_ms=self._grace_ms
        )
        if holder is not None and self._stale(holder, output_dir):
            holder = self._store.claim_output_dir(
                output_dir, job_rkey, now_ms, stale=holder, grace_ms=self._grace_ms
            )
        return None if holder is None else _named(holder)

    def _stale(self, holder: str, output_dir: str) -> bool:
        """Whether the holder no longer writes there: gone, or moved to another outputDir.
        A holder whose state cannot be read (quarantined) keeps its claim."""
        raw = self._store.load([holder]).get(holder)
        if raw is None:
            return True
        try:
            state = decode_state(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        if not isinstance(state, JobState):
            return True
        return paths.canonical_dir(state.spec.output_dir) != paths.canonical_dir(output_dir)


def _named(rkey: str) -> str:
    try:
        return parse_rkey(rkey).path
    except ValueError:
        return rkey
