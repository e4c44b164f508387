"""deploy/prometheus: the rules load in Prometheus and each alert passes its promtool unit test.

promtool comes with Debian's `prometheus` package (.ci/run installs it); without it these
tests are skipped, saying so.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "lifelong.rules.yml"
RULE_TESTS = PROMETHEUS / "lifelong.rules.test.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip(
            "promtool not on PATH: install Debian's prometheus package "
            "(apt-get install --no-install-recommends prometheus, as .ci/run does)"
        )
    return found


def run(promtool: str, *args: str) -> None:
    done = subprocess.run(
        [promtool, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_rules_load(promtool: str) -> None:
    run(promtool, "check", "rules", RULES.name)


def test_every_alert_passes_its_unit_tests(promtool: str) -> None:
    run(promtool, "test", "rules", RULE_TESTS.name)


def test_every_alert_has_a_test_where_it_fires_and_one_where_it_does_not() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    cases = [case for test in tests["tests"] for case in test.get("alert_rule_test", [])]
    for rule in alert_rules():
        name = rule["alert"]
        own = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in own), f"{name}: no test where it fires"
        series = [
            s["series"]
            for test in tests["tests"]
            if any(c["alertname"] == name for c in test.get("alert_rule_test", []))
            for s in test["input_series"]
        ]
        fired = {
            tuple(sorted(alert["exp_labels"].items()))
            for case in own
            for alert in case["exp_alerts"]
        }
        quiet = any(not case["exp_alerts"] for case in own) or len(series) > len(fired)
        assert quiet, f"{name}: no case where it must stay quiet"
