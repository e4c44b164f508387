"""The service takes resources with fields it does not know, and says so once per version."""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import pytest

from service.runtime.intake import UnknownFields, accept_downstream
from tests.runtime.test_accept import JOB, envelope

LOGGER = "service.runtime.intake"


def told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def misspelt(train_prob: float = 0.8) -> dict[str, Any]:
    job = copy.deepcopy(JOB)
    job["spec"]["trainSpec"]["trigger"]["checkPeriodSecond"] = 30  # meant checkPeriodSeconds
    job["spec"]["outputDirectory"] = "/elsewhere"
    job["spec"]["dataset"]["trainProb"] = train_prob
    return job


def test_unknown_fields_are_logged_once_per_version(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    unknown = UnknownFields()
    for _ in range(3):  # a GM resync re-sends the same resource
        unknown.check(accept_downstream("t", envelope(misspelt()), 0))
    (line,) = told(caplog)
    assert "job default/job-a has fields this controller does not know" in line
    assert "$.spec.trainSpec.trigger.checkPeriodSecond: unknown field (did you mean " in line
    assert "$.spec.outputDirectory: unknown field (did you mean outputDir?)" in line
    unknown.check(accept_downstream("t", envelope(misspelt(train_prob=0.5)), 0))
    assert len(told(caplog)) == 2, "a changed spec is a new version, told again"


def test_known_fields_and_free_form_templates_say_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    job = copy.deepcopy(JOB)
    job["spec"]["trainSpec"]["template"]["spec"]["anything"] = {"goes": True}
    UnknownFields().check(accept_downstream("t", envelope(job), 0))
    assert told(caplog) == []
    assert json.loads(json.dumps(job))  # the template stayed free-form and accepted
