"""compose.yaml and the Dockerfile, checked against the contract without a Docker engine.

Every controller and worker command must parse with the real CLI, every environment value
must be accepted by the real config, and the names, topics and ports the services use to
reach each other must agree.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as paho
import pytest
import yaml

from service import config as config_mod
from service.cli import build_parser
from service.worker import upstream_filter

ROOT = Path(__file__).resolve().parents[2]
CONTROLLERS = ("controller-1", "controller-2")
SERVERS = ("mosquitto", "redis", "minio")


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return compose["services"]  # type: ignore[no-any-return]


def known_env_names() -> set[str]:
    parser = argparse.ArgumentParser()
    config_mod.add_arguments(parser)
    return {
        name
        for action in parser._actions
        for name in re.findall(r"\b(?:LIFELONG_[A-Z_]+)", action.help or "")
    }


def config_of(service: dict[str, Any]) -> config_mod.Config:
    env = {k: str(v) for k, v in service["environment"].items()}
    unknown = set(env) - known_env_names()
    assert not unknown, f"not contract settings: {unknown}"
    return config_mod.Config.from_env(env)


def test_all_services_present_with_health_checks(services: dict[str, Any]) -> None:
    assert set(services) >= {*SERVERS, *CONTROLLERS, "worker"}
    for name in (*SERVERS, *CONTROLLERS):
        assert services[name]["healthcheck"]["test"][0] == "CMD", name
    for name in (*CONTROLLERS, "worker"):
        conditions = {dep: spec["condition"] for dep, spec in services[name]["depends_on"].items()}
        assert set(conditions.values()) == {"service_healthy"}, name


def test_broker_uses_the_shipped_config(services: dict[str, Any]) -> None:
    mounts = services["mosquitto"]["volumes"]
    assert "./mosquitto/mosquitto.conf:/mosquitto/config/mosquitto.conf:ro" in mounts
    conf = (ROOT / "mosquitto" / "mosquitto.conf").read_text()
    [port] = re.findall(r"^listener (\d+)", conf, re.MULTILINE)
    assert f"{port}:{port}" in services["mosquitto"]["ports"]
    assert "set_tcp_nodelay true" in conf
    persistence = re.search(r"^persistence_location (\S+)", conf, re.MULTILINE)
    assert persistence is not None
    assert any(m.endswith(":" + persistence[1].rstrip("/")) for m in mounts)
    for name in (*CONTROLLERS, "worker"):
        url = urlsplit(config_of(services[name]).mqtt_url)
        assert (url.hostname, url.port) == ("mosquitto", int(port)), name


def test_redis_keeps_an_append_only_file(services: dict[str, Any]) -> None:
    command = services["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    for name in CONTROLLERS:
        url = urlsplit(config_of(services[name]).redis_url)
        assert (url.hostname, url.port) == ("redis", 6379)


def test_controllers_are_replicas_of_one_deployment(services: dict[str, Any]) -> None:
    configs = [config_of(services[name]) for name in CONTROLLERS]
    assert configs[0] == configs[1], "replicas must share broker, Redis, node and key prefix"
    replica_ids = set()
    for name in CONTROLLERS:
        args = build_parser().parse_args(services[name]["command"])
        assert args.command == "serve"
        replica_ids.add(args.replica_id)
        _host, port = configs[0].http_host_port()
        assert any(p.endswith(f":{port}") for p in services[name]["ports"]), name
        probe = " ".join(services[name]["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/readyz" in probe
    assert len(replica_ids) == len(CONTROLLERS)


def test_worker_speaks_the_controllers_topics(services: dict[str, Any]) -> None:
    worker = services["worker"]
    args = build_parser().parse_args(worker["command"])
    assert args.command == "worker"
    assert args.train_command == "python -m service.demo_model train"
    assert args.eval_command == "python -m service.demo_model eval"
    worker_cfg = config_of(worker)
    controller = config_of(services[CONTROLLERS[0]])
    report_topic = f"{worker_cfg.topic_prefix}/{worker_cfg.node_name}/workers/w-train-1/info"
    assert paho.topic_matches_sub(controller.worker_topic_filter(), report_topic)
    assert paho.topic_matches_sub(upstream_filter(worker_cfg), controller.upstream_topic_for("ns"))
    # LC_SERVER handed to commands reaches a controller's HTTP port
    lc_host, lc_port = worker_cfg.http_host_port()
    assert lc_host in CONTROLLERS and lc_port == controller.http_host_port()[1]
    assert "data:/data" in worker["volumes"] and "data:/data" in services[CONTROLLERS[0]]["volumes"]


def test_dockerfile_builds_the_package_on_python_311() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", dockerfile, re.MULTILINE)
    assert re.search(r"pip install --no-cache-dir \.", dockerfile)
    assert 'ENTRYPOINT ["lifelong"]' in dockerfile
