"""Which job writes to an outputDir: two jobs (in different namespaces, say) given the same
one, or one inside the other's, would overwrite each other's round files and deployed model
(a job whose outputDir is another's `deploy/index.pkl` makes that file a directory).

Each job claims its outputDir when an insert leaves it with one (`Records.claim_output_dir`);
the second job to claim a directory that is taken, inside one that is taken or above one,
has its insert refused, naming the holder. Claims are keyed by the directory as it lies on
disk (the volume prefix added, canonical: `paths.claim_dir`), so two spellings of one
directory meet. A job gives its claim up when it is deleted or moves to another outputDir
(a `ReleaseOutputDir` effect, committed with the state, so a crash cannot lose it). A claim
whose job is gone, or has moved elsewhere, is stale and taken over, but only once it is
older than two lease periods: a new job's claim precedes its first commit by a moment, and
that commit may wait for a shard's next owner.
"""

from __future__ import annotations

import msgspec

from service.adapters.redis_store import Records, States
from service.core import paths
from service.core.state import JobState, decode_state
from service.keys import parse_rkey

#: How many stale holders one claim takes over before it gives up and names the next.
_MAX_TAKEOVERS = 8


class OutputDirs:
    def __init__(
        self, records: Records, states: States, grace_ms: int, volume_prefix: str = ""
    ) -> None:
        self._records = records
        self._states = states
        self._grace_ms = grace_ms
        self._prefix = volume_prefix

    def claim(self, job_rkey: str, output_dir: str, now_ms: int) -> str | None:
        """Claim the (worker-visible) outputDir for the job: None when it is the job's, else
        the job in the way, as `namespace/name` and what it holds."""
        directory = paths.claim_dir(self._prefix, output_dir)
        found = self._records.claim_output_dir(directory, job_rkey, now_ms, grace_ms=self._grace_ms)
        for _ in range(_MAX_TAKEOVERS):
            if found is None or not self._stale(*found):
                break
            found = self._records.claim_output_dir(
                directory, job_rkey, now_ms, stale=found[0], grace_ms=self._grace_ms
            )
        return None if found is None else self._described(directory, *found)

    def _stale(self, holder: str, held: str) -> bool:
        """Whether the holder no longer writes to ``held``: gone, or moved to another
        outputDir. A holder whose state cannot be read (quarantined) keeps its claim."""
        raw = self._states.load([holder]).get(holder)
        if raw is None:
            return True
        try:
            state = decode_state(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        if not isinstance(state, JobState):
            return True
        return paths.claim_dir(self._prefix, state.spec.output_dir) != held

    def _described(self, directory: str, holder: str, held: str) -> str:
        """The holder as `namespace/name`, and how its outputDir meets this one when it is
        not the same directory (paths as workers see them)."""
        name = _named(holder)
        if held == directory:
            return name
        shown = paths.trim_prefix(self._prefix, held)
        if paths.is_beneath(directory, held):
            return f"{name}, whose outputDir {shown} contains it"
        return f"{name}, whose outputDir {shown} lies inside it"


def _named(rkey: str) -> str:
    try:
        return parse_rkey(rkey).path
    except ValueError:
        return rkey
