"""Records kept beside the resources: the dead-letter stream of refused messages, the claim
each job holds on its outputDir, and which jobs use each dataset.
"""

from __future__ import annotations

from typing import Any

from service.adapters.redis_links import Routed
from service.adapters.redis_store.calls import Commands, as_str, field_map
from service.core.paths import ancestors, canonical_dir

DLQ_MAXLEN = 10_000


class Records:
    """The dead-letter stream, outputDir claims and the dataset-to-jobs index."""

    def __init__(self, redis: Commands) -> None:
        self._redis = redis
        self._keys = redis.keys

    def dead_letter(self, rejection: bytes, maxlen: int) -> None:
        """Keep a rejection for inspection; the stream is capped (approximately) at maxlen."""
        key = self._keys.dlq()
        command = ("XADD", key, "MAXLEN", "~", maxlen, "*", "r", rejection)
        self._redis.run([Routed(key, command)], what="dead_letter")

    def dlq(self, count: int) -> list[bytes]:
        """The newest ``count`` rejections, oldest first."""
        key = self._keys.dlq()
        command = ("XREVRANGE", key, "+", "-", "COUNT", count)
        [entries] = self._redis.run([Routed(key, command)], what="dlq")
        return [field_map(pairs)[b"r"] for _, pairs in reversed(entries)]

    def claim_output_dir(
        self, output_dir: str, job_rkey: str, now_ms: int, *, stale: str, grace_ms: int
    ) -> tuple[str, str] | None:
        """Claim an outputDir (as it lies on disk) for a job: None when the job holds it now,
        else the rkey of another job and the directory it holds: the same one, one inside it
        or one above it (`stale`: a holder found gone, whose claims in the way are taken over
        once older than `grace_ms`)."""
        found = self._claim(
            output_dir, ("claim", job_rkey, now_ms, stale, grace_ms), "claim_output_dir"
        )
        if not found:
            return None
        holder, held = found
        return as_str(holder), as_str(held)

    def release_output_dir(self, output_dir: str, job_rkey: str) -> bool:
        """Give up a job's claim on an outputDir; False when the job did not hold it."""
        return bool(self._claim(output_dir, ("release", job_rkey, 0, "", 0), "release_output_dir"))

    def _claim(self, output_dir: str, args: tuple[str | int, ...], what: str) -> Any:
        """The claim script's reply for ``args`` (operation, job, now, stale, grace) on the
        outputDir, canonical, with the directories above it."""
        directory = canonical_dir(output_dir)
        key = self._keys.output_claims()
        call = self._redis.call("claim", (key,), (*args, directory, *ancestors(directory)))
        return self._redis.eval([call], what=what, confirm=self._redis.confirm)[0]

    def dataset_jobs_add(self, dataset: str, job_rkey: str) -> None:
        """Say that the job ``job_rkey`` uses ``dataset`` (the dataset's rkey)."""
        self._dataset_jobs("SADD", dataset, job_rkey, "dataset_jobs_add")

    def dataset_jobs_remove(self, dataset: str, job_rkey: str) -> None:
        """Say that the job ``job_rkey`` no longer uses ``dataset``."""
        self._dataset_jobs("SREM", dataset, job_rkey, "dataset_jobs_remove")

    def _dataset_jobs(self, command: str, dataset: str, job_rkey: str, what: str) -> None:
        key = self._keys.dataset_jobs(dataset)
        self._redis.run(
            [Routed(key, (command, key, job_rkey))],
            what=what,
            confirm=self._redis.confirm,
        )

    def dataset_jobs(self, dataset: str) -> list[str]:
        """Job rkeys using ``dataset`` (the dataset's rkey), sorted."""
        key = self._keys.dataset_jobs(dataset)
        [members] = self._redis.run([Routed(key, ("SMEMBERS", key))], what="dataset_jobs")
        return sorted(map(as_str, members))
