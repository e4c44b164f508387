"""Failed rounds back off: the n-th failure in a row waits checkPeriodSeconds x 2^(n-1),
capped at an hour, before the trigger may fire again; a completed deploy resets the count; the
job keeps why the last round failed (a worker's exit code and stderr tail, bounded, secrets
masked)."""

from __future__ import annotations

import itertools

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from service.core import reports
from service.core.effects import ScheduleCheck, WriteRound
from service.core.events import JobApplied, WorkerReported
from service.core.training import MAX_RETRY_DELAY_MS, retry_delay_ms
from service.wire import Trigger
from tests.core.driver import JOB, NS, Driver, report, spec

PERIOD_S = 10


def failing_job(period_s: int = PERIOD_S) -> Driver:
    """A job whose first round is running: it fires on any pending sample."""
    d = Driver()
    d.create(spec(trigger=Trigger(check_period_seconds=period_s)))
    d.dataset(10)
    d.written("train")
    assert d.job.step == "running"
    return d


def fail_report(**owner_info: object) -> WorkerReported:
    return WorkerReported(
        namespace=NS, name=JOB, worker=f"{JOB}-train-pod", kind="train", status="failed",
        owner_info=msgspec.json.encode(owner_info),
    )  # fmt: skip


def test_retry_delays_double_from_one_period_to_an_hour() -> None:
    assert [retry_delay_ms(1, n) for n in range(1, 8)] == [
        1000, 2000, 4000, 8000, 16000, 32000, 64000,
    ]  # fmt: skip
    assert retry_delay_ms(60, 6) == 1_920_000
    assert retry_delay_ms(60, 7) == MAX_RETRY_DELAY_MS  # 3,840 s capped
    assert retry_delay_ms(60, 10_000) == MAX_RETRY_DELAY_MS  # no overflow, no slow bigint
    assert retry_delay_ms(7200, 1) == 7_200_000, "the cap never brings a check forward"


@given(st.integers(1, 86_400), st.integers(1, 200))
def test_retry_delay_grows_and_stays_bounded(period_s: int, failures: int) -> None:
    delay = retry_delay_ms(period_s, failures)
    assert delay >= retry_delay_ms(period_s, max(failures - 1, 1))
    assert period_s * 1000 <= delay <= max(period_s * 1000, MAX_RETRY_DELAY_MS)


def test_a_worker_that_always_fails_waits_longer_each_time() -> None:
    d = failing_job(period_s=1)
    fired_at = [d.now_ms]
    for failures in range(1, 15):
        d.apply(report("train", "failed"))
        job = d.job
        assert (job.step, job.consecutive_failures) == ("waiting", failures)
        assert job.retry_at_ms == d.now_ms + retry_delay_ms(1, failures)
        # neither new samples nor an early check start a round before the retry time
        d.dataset(10 + failures)
        d.now_ms = job.retry_at_ms - 1
        d.tick()
        assert d.job.step == "waiting" and d.job.version == failures
        assert d.of(ScheduleCheck)[-1] == ScheduleCheck(due_ms=job.retry_at_ms)
        d.now_ms = job.retry_at_ms
        d.tick()
        assert d.job.step == "preparing" and d.job.version == failures + 1
        assert d.job.retry_at_ms is None, "no retry pending while a round runs"
        assert d.job.consecutive_failures == failures, "the count stays until a round completes"
        fired_at.append(d.now_ms)
        d.written("train")
    gaps = [b - a for a, b in itertools.pairwise(fired_at)]
    assert gaps[:5] == [1000, 2000, 4000, 8000, 16000]
    assert max(gaps) == MAX_RETRY_DELAY_MS == gaps[-1]


def test_a_completed_round_resets_the_count() -> None:
    d = failing_job()
    for _ in range(3):
        d.apply(report("train", "failed"))
        d.now_ms = d.job.retry_at_ms or 0
        d.tick()
        d.written("train")
    assert d.job.consecutive_failures == 3
    d.apply(report("train", "completed", "/output/train/4/m.pkl"))
    d.written("eval")
    d.apply(report("eval", "completed", "/output/eval/4/m.pkl"))
    assert d.job.consecutive_failures == 3, "only a completed deploy counts as success"
    d.copied()
    assert (d.job.consecutive_failures, d.job.retry_at_ms, d.job.last_error) == (0, None, None)
    # the next failure waits one period again
    d.dataset(20)
    d.now_ms += PERIOD_S * 1000
    d.tick()
    d.written("train")
    d.apply(report("train", "failed"))
    assert d.job.retry_at_ms == d.now_ms + PERIOD_S * 1000


def test_a_failed_deploy_copy_counts_as_a_failure() -> None:
    d = failing_job()
    d.apply(report("train", "completed", "/output/train/1/m.pkl"))
    d.written("eval")
    d.apply(report("eval", "completed", "/output/eval/1/m.pkl"))
    d.copied("no such file")
    assert (d.job.phase, d.job.step, d.job.consecutive_failures) == ("train", "waiting", 1)
    assert d.job.last_error == "no such file"
    d.dataset(20)
    assert d.job.step == "waiting", "new samples wait out the backoff"


def test_a_changed_spec_ends_the_wait_but_keeps_the_count() -> None:
    d = failing_job()
    d.apply(report("train", "failed"))
    d.apply(report("train", "failed"))  # not running any more: forwarded only
    assert d.job.consecutive_failures == 1
    resent = JobApplied(namespace=NS, name=JOB, spec=d.job.spec, digest="d1")
    d.apply(resent)  # the GM's identical resync changes nothing
    assert d.job.retry_at_ms is not None
    changed = spec(trigger=Trigger(check_period_seconds=PERIOD_S), train_prob=0.5)
    d.apply(JobApplied(namespace=NS, name=JOB, spec=changed, digest="d2"))
    assert d.job.retry_at_ms is None and d.job.consecutive_failures == 1
    d.now_ms += PERIOD_S * 1000
    before = len(d.of(WriteRound))
    d.tick()
    assert len(d.of(WriteRound)) == before + 1


def test_last_error_carries_exit_code_and_stderr_tail() -> None:
    d = failing_job()
    stderr = "".join(f"line {i}\n" for i in range(500)) + "boom: no GPU here\n"
    d.apply(fail_report(exitCode=3, stderr=stderr))
    error = d.job.last_error
    assert error is not None
    assert error.startswith(f"train worker {JOB}-train-pod failed (exit code 3; stderr: ")
    assert error.endswith("line 499 | boom: no GPU here)")
    assert "line 1 |" not in error, "only the tail is kept"
    assert len(error) <= 100 + reports.STDERR_TAIL_CHARS
    assert any("exit code 3" in note for note in d.notes()), "the log line says it too"


def test_last_error_of_a_timeout_and_of_a_sedna_library_worker() -> None:
    d = failing_job()
    d.apply(fail_report(reason="timed out after 30s", stderr=""))
    assert d.job.last_error == f"train worker {JOB}-train-pod failed (timed out after 30s)"
    d.now_ms = d.job.retry_at_ms or 0
    d.tick()
    d.written("train")
    # Sedna's worker library sends no ownerInfo; odd types are not trusted either
    d.apply(fail_report(exitCode=True, stderr=["x"], reason=7))
    assert d.job.last_error == f"train worker {JOB}-train-pod failed"


def test_last_error_masks_secrets_even_where_the_tail_is_cut() -> None:
    secret = "s3cr3t-value-" * 3
    stderr = f"connecting to mqtt://worker:{secret}@broker:1883\nAWS_SECRET_ACCESS_KEY={secret}\n"
    d = failing_job()
    d.apply(fail_report(exitCode=1, stderr="x" * 5000 + stderr))
    error = d.job.last_error
    assert error is not None and "s3cr3t" not in error
    assert "mqtt://worker:***@broker:1883" in error
    # a cut landing inside a URL's password still leaves nothing of it behind
    url = f"mqtt://worker:{secret}@broker"
    pad = len("mqtt://worker:s3cr3") + reports.STDERR_TAIL_CHARS - len(url)
    cut = url + "y" * pad
    assert "s3cr3t" in cut[-reports.STDERR_TAIL_CHARS :], "the tail does cut the password"
    d.now_ms = d.job.retry_at_ms or 0
    d.tick()
    d.written("train")
    d.apply(fail_report(exitCode=1, stderr=cut))
    assert "s3cr3t" not in (d.job.last_error or "")
