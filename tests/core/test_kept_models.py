"""A job keeps a bounded part of what a report names: the first 16 usable models, each with a
url and a format of bounded length, so its state (rewritten on every event) and the next
ready message stay small whatever a worker reports."""

from __future__ import annotations

from service.core import reports
from service.core.effects import Note
from service.core.state import encode_state
from service.wire import Trigger
from tests.core.driver import Driver, report, spec


def running() -> Driver:
    d = Driver()
    d.create(spec(trigger=Trigger()))
    d.dataset(10)
    d.written("train")
    return d


def test_75000_models_keep_16_and_the_state_small() -> None:
    d = running()
    results = [{"format": "pkl", "url": f"/output/train/1/m{i}.pkl"} for i in range(75_000)]
    effects = d.apply(report("train", "completed", results=results))
    assert len(d.job.train_models) == reports.MAX_MODELS_KEPT == 16
    assert [m.url for m in d.job.train_models][-1] == "/output/train/1/m15.pkl"
    notes = [e.reason for e in effects if isinstance(e, Note)]
    assert "kept the first 16 of the 75000 models job-a-train-pod reported" in notes
    assert len(encode_state(d.job)) < 2048  # 75,000 models kept would be ~2 MB
    d.written("eval")
    ready = d.published()[-1]
    assert len(ready["input"]["models"]) == 16


def test_overlong_urls_and_formats_are_no_models() -> None:
    long_url = "/output/train/1/" + "m" * 5000
    results = [
        {"format": "pkl", "url": long_url},
        {"format": "p" * (reports.MAX_FORMAT_CHARS + 1), "url": "/output/train/1/a"},
        {"format": "p" * reports.MAX_FORMAT_CHARS, "url": "/output/train/1/b"},
    ]
    assert [m.url for m in reports.usable_models(results)] == ["/output/train/1/b"]
