"""The rejection log's limiter: per kind, the first few of each interval one by one, the
rest summed up exactly once the interval is over."""

from __future__ import annotations

import logging

import pytest

from service.runtime.rejections import LogLimiter


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def summaries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "more like this" in r.getMessage()]


def test_the_first_of_each_interval_are_logged_and_the_rest_summed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    limiter = LogLimiter(burst=3, interval_s=10, monotonic=clock)
    admitted = [limiter.admit("reason code invalid_json", f"#{i}") for i in range(1000)]
    assert admitted == [True] * 3 + [False] * 997
    # another kind is not held back by the flood of the first
    assert limiter.admit("reason code too_large", "big")
    with caplog.at_level(logging.WARNING):
        limiter.flush()
        assert summaries(caplog) == []  # the interval is not over yet
        clock.now += 10
        limiter.flush()
        limiter.flush()
    assert summaries(caplog) == [
        "997 more like this (reason code invalid_json) in 10s, not logged one by one; "
        "the last: #999"
    ]
    # a new interval starts with its own burst
    assert limiter.admit("reason code invalid_json", "again")


def test_a_warning_after_the_interval_summarises_the_last_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    limiter = LogLimiter(burst=1, interval_s=5, monotonic=clock)
    with caplog.at_level(logging.WARNING):
        assert [limiter.admit("k", "x") for _ in range(3)] == [True, False, False]
        clock.now += 6
        assert limiter.admit("k", "y")  # summarises the 2 held back, then logs this one
    assert [s.split(" (")[0] for s in summaries(caplog)] == ["2 more like this"]


def test_a_burst_within_the_limit_is_logged_whole_with_no_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    limiter = LogLimiter(burst=5, interval_s=10, monotonic=clock)
    assert all(limiter.admit("k", "x") for _ in range(5))
    clock.now += 10
    with caplog.at_level(logging.WARNING):
        limiter.flush()
    assert summaries(caplog) == []
