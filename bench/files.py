"""Datasets and round files: incremental ingestion and its memory, and round-file streaming
against `cp` of the same bytes."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path

from bench.common import (
    DOWNSTREAM,
    UPSTREAM,
    Peer,
    Result,
    Stack,
    dataset_resource,
    peak_rss_mb,
    rss_mb,
    write_lines,
)
from service.adapters.blobs import BlobStore
from service.adapters.dataset_sources import Cursor, DatasetReader
from service.adapters.s3 import S3Clients
from tests.harness import envelope

MEMORY_LIMIT_MB = 150


def _timed_poll(
    reader: DatasetReader, url: str, cursor: Cursor, repeats: int = 5
) -> tuple[float, Cursor, int]:
    """The median time of `repeats` polls from the same cursor (each reads the same bytes)."""
    times: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        poll = reader.poll(url, "txt", cursor, None)
        times.append(time.perf_counter() - started)
    return statistics.median(times), poll.cursor, poll.num_samples


def ingestion(s: Stack, *, lines: int, appended: int) -> list[Result]:
    """Reader timing in this process (full read vs the appended lines, each the median of 5
    polls from the same cursor), then the service's peak memory while it ingests the same
    number of lines as a dataset."""
    reader = DatasetReader(S3Clients())
    path = s.workdir / "reader.txt"
    write_lines(path, 0, lines)
    full_s, cursor, counted = _timed_poll(reader, str(path), Cursor())
    assert counted == lines, f"counted {counted} of {lines}"
    write_lines(path, lines, lines + appended)
    incremental_s, _, counted = _timed_poll(reader, str(path), cursor)
    assert counted == lines + appended, f"counted {counted} of {lines + appended}"
    rss = service_ingest(s, lines=lines, appended=appended)
    ratio = incremental_s / full_s
    return [
        Result(
            "3.incremental",
            f"dataset: ingest {appended:,} appended lines",
            incremental_s * 1000,
            "ms",
            baseline=full_s * 1000,
            baseline_name=f"full read of {lines:,} lines",
            ratio=ratio,
            target="<= 0.05x full read",
            passed=ratio <= 0.05,
            details={"lines": lines, "appended": appended},
        ),
        Result(
            "3.memory",
            f"dataset: service peak RSS while ingesting {lines:,} lines",
            rss["peak_mb"],
            "MB",
            baseline=rss["before_mb"],
            baseline_name="service RSS before the dataset",
            ratio=rss["peak_mb"] / MEMORY_LIMIT_MB,
            target=f"< {MEMORY_LIMIT_MB} MB",
            passed=rss["peak_mb"] < MEMORY_LIMIT_MB,
            details=rss,
        ),
    ]


def service_ingest(s: Stack, *, lines: int, appended: int) -> dict[str, float]:
    counts: list[tuple[int, float]] = []
    cond = threading.Condition()

    def on_message(_topic: str, payload: bytes, t: float) -> None:
        count = json.loads(payload)["content"].get("numberOfSamples")
        if count is not None:
            with cond:
                counts.append((count, t))
                cond.notify_all()

    def wait_count(n: int) -> float:
        with cond:
            if not cond.wait_for(lambda: any(c == n for c, _ in counts), 120):
                raise TimeoutError(f"the service never counted {n} samples: {counts[-3:]}")
            return next(t for c, t in counts if c == n)

    peer = Peer(s.broker.port, [UPSTREAM], on_message)
    controller = s.controller("r1")
    path = s.workdir / "dataset.txt"
    write_lines(path, 0, lines)
    before_mb = rss_mb(controller.pid)
    started = time.perf_counter()
    peer.publish(
        DOWNSTREAM, envelope(dataset_resource("big", str(path)), kind="dataset", name="big")
    )
    full_s = wait_count(lines) - started
    write_lines(path, lines, lines + appended)
    appended_at = time.perf_counter()
    incremental_s = wait_count(lines + appended) - appended_at
    peak = peak_rss_mb(controller.pid)
    peer.close()
    return {
        "before_mb": round(before_mb, 1),
        "peak_mb": round(peak, 1),
        "e2e_full_s": round(full_s, 3),
        "e2e_incremental_s_incl_poll_wait": round(incremental_s, 3),
        "poll_interval_s": 1.0,
    }


def durable_write(data: bytes, path: Path) -> None:
    """The least a durable writer of ``data`` does: a new file written from memory a MiB at
    a time, each MiB's writeback started at once (as the round writer does), then fsync.
    What it takes is the disk's part of a round file's time, which `cp` (no fsync) skips."""
    step = 1 << 20
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        for start in range(0, len(view), step):
            os.write(fd, view[start : start + step])
            os.posix_fadvise(fd, start, step, os.POSIX_FADV_DONTNEED)
        os.fsync(fd)
    finally:
        os.close(fd)


def round_file(s: Stack, *, samples: int, repeats: int = 5) -> list[Result]:
    """BlobStore.write_round of `samples` samples (one range, as a train round) against `cp`
    of the file it produced, and against a durable write of the same bytes from memory (what
    the disk alone costs); the median of `repeats` runs of each, interleaved, page cache
    warm."""
    source = s.workdir / "round-source.txt"
    write_lines(source, 0, samples + samples // 10)
    blobs = BlobStore(S3Clients(), tmp_dir=str(s.workdir))
    out = s.workdir / "round" / "data.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    copy = s.workdir / "round" / "copy.txt"
    floor = s.workdir / "round" / "durable.txt"
    cp = shutil.which("cp") or "/bin/cp"
    # the earlier suites' dirty pages (datasets, round files, logs) written back first: the
    # writer's closing fsync waits for the disk, and would otherwise wait behind their
    # writeback too, which `cp` (no fsync) never does
    os.sync()
    write_s: list[float] = []
    cp_s: list[float] = []
    durable_s: list[float] = []
    for _ in range(repeats):
        out.unlink(missing_ok=True)  # each writes a new file: none pays for freeing the last
        started = time.perf_counter()
        written = blobs.write_round(
            source_url=str(source),
            fmt="txt",
            ranges=((0, samples),),
            data_url=str(out),
            index_url=None,
            index_prefix=None,
            source_cred=None,
            dest_cred=None,
        )
        write_s.append(time.perf_counter() - started)
        assert written == samples, f"wrote {written} of {samples}"
        copy.unlink(missing_ok=True)
        started = time.perf_counter()
        subprocess.run([cp, str(out), str(copy)], check=True)
        cp_s.append(time.perf_counter() - started)
        data = out.read_bytes()
        floor.unlink(missing_ok=True)
        os.sync()  # cp's pages written back first: the floor's fsync waits for its own only
        started = time.perf_counter()
        durable_write(data, floor)
        durable_s.append(time.perf_counter() - started)
        del data
    size_mb = out.stat().st_size / 2**20
    write_rate = size_mb / statistics.median(write_s)
    cp_rate = size_mb / statistics.median(cp_s)
    durable_rate = size_mb / statistics.median(durable_s)
    ratio = write_rate / cp_rate
    return [
        Result(
            "4.round_file",
            f"round file: write {samples:,} samples",
            write_rate,
            "MB/s",
            baseline=cp_rate,
            baseline_name="cp of the same bytes",
            ratio=ratio,
            target=">= 0.5x cp",
            passed=ratio >= 0.5,
            details={
                "size_mb": round(size_mb, 1),
                "write_s": [round(x, 4) for x in write_s],
                "cp_s": [round(x, 4) for x in cp_s],
            },
        ),
        Result(
            "4.round_file_disk",
            "round file against the disk: the same bytes written durably from memory",
            write_rate,
            "MB/s",
            baseline=durable_rate,
            baseline_name="write, writeback hints, fsync",
            ratio=write_rate / durable_rate,
            details={
                "durable_s": [round(x, 4) for x in durable_s],
                "durable_vs_cp": round(durable_rate / cp_rate, 3),
            },
        ),
    ]
