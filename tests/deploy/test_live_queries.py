"""Every dashboard query and every rule runs against a real Prometheus scraping real replicas.

Two controllers run a lifelong-learning round through a real broker and Redis, refuse a
malformed message and count a dataset, while Debian's Prometheus scrapes their /metrics every
second with deploy/prometheus/lifelong.rules.yml loaded. Then, through Prometheus' HTTP API:
- each Grafana panel's query parses and returns data;
- each recording rule's series exists;
- each alert's expression parses and is empty, as it must be on this healthy system. Since an
  empty answer proves little, the metrics each alert reads (its selectors without their label
  matchers) must return data carrying every label the alert matches or groups on.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.embedded.processes import Server, free_port, running
from tests.gm_standin import GmStandIn
from tests.harness import NODE, append_lines, lines
from tests.stack import Stack, stack_on
from tests.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "lifelong.json"
RULES = ROOT / "deploy" / "prometheus" / "lifelong.rules.yml"
#: what Grafana puts for its interval macros (at least four of the test's 1 s scrapes)
MACROS = {"$__rate_interval": "1m", "$__interval": "15s"}
SELECTOR = re.compile(r"\b(lifelong[a-z0-9_:]*)(\{[^}]*\})?(\[[^\]]*\])?")
MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
DATA_TIMEOUT_S = 60


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query with Grafana's macros filled in) of every panel target."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queries = []
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"]
            for macro, value in MACROS.items():
                expr = expr.replace(macro, value)
            assert "$" not in expr, f"{panel['title']}: unknown Grafana variable in {expr}"
            queries.append((panel["title"], expr))
    return queries


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


class Prometheus:
    """Prometheus' HTTP API on a local port."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
        assert body["status"] == "success", f"{path} {params}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result; a parse or evaluation error fails the test."""
        data = self.get("query", query=expr)
        assert data["resultType"] == "vector", expr
        return data["result"]  # type: ignore[no-any-return]

    def query_until_data(self, expr: str, what: str) -> list[dict[str, Any]]:
        return wait_until(lambda: self.query(expr), DATA_TIMEOUT_S, f"{what}: data for {expr}")


def prometheus_server(workdir: Path, targets: list[str]) -> Server:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip(
            "prometheus not on PATH: install Debian's prometheus package "
            "(apt-get install --no-install-recommends prometheus, as .ci/run does)"
        )
    workdir.mkdir(parents=True)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "lifelong", "static_configs": [{"targets": targets}]}],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        binary,
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return Server("prometheus", argv, port, workdir)


@pytest.fixture
def stack(tmp_path: Path, mosquitto: Server, redis_proc: Server) -> Iterator[Stack]:
    with stack_on(tmp_path, mosquitto, redis_proc) as s:
        yield s


def drive(stack: Stack) -> None:
    """A full round for one job, a second job left training, a rejection, a dataset."""
    cloud = stack.cloud
    data = stack.workdir / "data.txt"
    append_lines(data, lines(0, 10))
    out = stack.workdir / "out"
    cloud.insert_dataset("ds", data)
    for job in ("round", "busy"):
        cloud.insert_job(job, "ds", out / job)
    cloud.wait_status("round", "train", "ready")
    cloud.wait_status("busy", "train", "ready")  # and no worker ever reports: train/running
    for phase in ("train", "eval"):
        model = out / "round" / phase / "1" / "model.pkl"
        model.parent.mkdir(parents=True, exist_ok=True)
        model.write_bytes(b"model")
        cloud.report("round", phase, "completed", str(model))
        cloud.wait_status("round", "eval" if phase == "train" else "deploy", "ready")
    cloud.publish(f"sedna/{NODE}/downstream", b"{not json")
    cloud.wait_for(cloud.errors, 15, "the rejection of a malformed message")


@pytest.mark.timeout(300)
def test_dashboard_and_rule_queries_against_real_prometheus(tmp_path: Path, stack: Stack) -> None:
    gm = GmStandIn()  # the link's series exist only where a GM is configured
    gm.start()
    env = {"LIFELONG_GM_ADDRESS": gm.address}
    try:
        check_queries(tmp_path, stack, env)
    finally:
        gm.close()


def check_queries(tmp_path: Path, stack: Stack, env: dict[str, str]) -> None:
    first = stack.serving("r1", env=env)
    second = stack.controller("r2", env=env)
    targets = [f"127.0.0.1:{c.http_port}" for c in (first, second)]
    with running(prometheus_server(tmp_path / "prometheus", targets)) as (server,):
        drive(stack)
        api = Prometheus(server.port)

        for title, expr in dashboard_queries():
            api.query_until_data(expr, f"panel {title!r}")

        for rule in rules():
            if "record" in rule:
                api.query_until_data(rule["record"], f"recording rule {rule['record']}")
                continue
            name, expr = rule["alert"], rule["expr"]
            assert api.query(expr) == [], f"{name} holds on a healthy system"
            selectors = SELECTOR.findall(expr)
            assert selectors, f"{name} reads no lifelong metric"
            labels: set[str] = set()
            for metric, matchers, _range in selectors:
                series = api.query_until_data(metric, f"{name}: metric {metric}")
                labels |= {label for s in series for label in s["metric"]}
                for wanted in MATCHER_LABEL.findall(matchers):
                    assert wanted in labels, f"{name}: {metric} has no label {wanted}"
            for grouping in GROUPING.findall(expr):
                for wanted in filter(None, (g.strip() for g in grouping.split(","))):
                    assert wanted in labels, f"{name}: groups by {wanted}, which no series has"

        groups = api.get("rules")["groups"]
        loaded = [r for g in groups for r in g["rules"]]
        assert len(loaded) == len(rules())
        assert [r for r in loaded if r["health"] != "ok"] == []
        assert api.query("ALERTS") == []


def test_the_dashboard_has_the_panels_operators_look_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {
        "Jobs by phase",
        "Transitions per second",
        "Transition latency",
        "Outbox depth",
        "Leases per replica",
        "Rejections by reason",
        "Dataset samples",
    } <= titles
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        for holder in (panel, *panel["targets"]):
            assert holder["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
