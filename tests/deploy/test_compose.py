"""compose.yaml and the Dockerfile, checked against the contract without a Docker engine.

Every controller and worker command must parse with the real CLI, every environment value
must be accepted by the real config, and the names, topics and ports the services use to
reach each other must agree. And a first `docker compose up` must work as a new user would
try it: the image carries the examples and can write where they point, no published port
clashes with a broker, Redis or controller already on the host, MinIO comes with its bucket
and the controllers with credentials for it, and a feeder keeps the dataset growing.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as paho
import pytest
import yaml

from service import config as config_mod
from service.adapters.s3 import S3Clients
from service.cli import build_parser
from service.demo import comfort

ROOT = Path(__file__).resolve().parents[2]
CONTROLLERS = ("controller-1", "controller-2")
SERVERS = ("mosquitto", "redis", "minio")
ONE_SHOT = ("minio-init",)  # runs to completion: depended on as completed, not healthy
#: host:container mappings, optionally on one address and with a ${VAR:-default} host port
PORT_MAPPING = re.compile(
    r"^(?:(?P<address>[\d.]+):)?(?:\$\{(?P<var>\w+):-(?P<default>\d+)\}|(?P<host>\d+))"
    r":(?P<container>\d+)$"
)


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
    # AWS_*: boto3's standard credential chain, which the contract falls back to for S3
    unknown = {k for k in env if not k.startswith("AWS_")} - known_env_names()
    assert not unknown, f"not contract settings: {unknown}"
    return config_mod.Config.from_env(env)


def test_all_services_present_with_health_checks(services: dict[str, Any]) -> None:
    assert set(services) >= {*SERVERS, *CONTROLLERS, *ONE_SHOT, "worker", "feeder"}
    for name in (*SERVERS, *CONTROLLERS):
        assert services[name]["healthcheck"]["test"][0] == "CMD", name
    for name in (*CONTROLLERS, *ONE_SHOT, "worker", "feeder"):
        for dep, spec in services[name]["depends_on"].items():
            wanted = "service_completed_successfully" if dep in ONE_SHOT else "service_healthy"
            assert spec["condition"] == wanted, (name, dep)
            assert dep in ONE_SHOT or "healthcheck" in services[dep], (name, dep)


def test_broker_uses_the_shipped_config(services: dict[str, Any]) -> None:
    mounts = services["mosquitto"]["volumes"]
    assert "./mosquitto/mosquitto.conf:/mosquitto/config/mosquitto.conf:ro" in mounts
    conf = (ROOT / "mosquitto" / "mosquitto.conf").read_text()
    [port] = re.findall(r"^listener (\d+)", conf, re.MULTILINE)
    assert [container_port(p) for p in services["mosquitto"]["ports"]] == [int(port)]
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
    assert args.train_command == "python -m service.demo.comfort train"
    assert args.eval_command == "python -m service.demo.comfort eval"
    worker_cfg = config_of(worker)
    controller = config_of(services[CONTROLLERS[0]])
    report_topic = f"{worker_cfg.topic_prefix}/{worker_cfg.node_name}/workers/w-train-1/info"
    assert paho.topic_matches_sub(controller.worker_topic_filter(), report_topic)
    assert paho.topic_matches_sub(
        worker_cfg.upstream_topic_filter(), controller.upstream_topic_for("ns")
    )
    # LC_SERVER handed to commands reaches a controller's HTTP port
    lc_host, lc_port = worker_cfg.http_host_port()
    assert lc_host in CONTROLLERS and lc_port == controller.http_host_port()[1]
    assert "data:/data" in worker["volumes"] and "data:/data" in services[CONTROLLERS[0]]["volumes"]


def test_dockerfile_builds_the_package_on_python_311() -> None:
    text = dockerfile()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.MULTILINE)
    assert 'ENTRYPOINT ["lifelong"]' in text
    # what the package's build reads is in the image before the install, setup.py (which
    # declares the C module) included, and the install has a C compiler
    copied = {
        src for srcs in re.findall(r"^COPY (.+) \S+$", text, re.MULTILINE) for src in srcs.split()
    }
    assert {"pyproject.toml", "setup.py", "README.md", "service"} <= copied
    assert re.search(r"apt-get install [^&]*\bgcc libc6-dev\b.*pip install --no-cache-dir \.", text)


# ------------------------------------------------------------------ a first `compose up`


def container_port(mapping: str) -> int:
    match = PORT_MAPPING.match(mapping)
    assert match is not None, f"unexpected port mapping {mapping!r}"
    return int(match["container"])


def dockerfile() -> str:
    """The Dockerfile with line continuations joined."""
    return (ROOT / "Dockerfile").read_text().replace("\\\n", " ")


def image_user_and_workdir() -> tuple[str, str]:
    text = dockerfile()
    [user] = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    [workdir] = re.findall(r"^WORKDIR (\S+)", text, re.MULTILINE)
    return user, workdir


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())  # type: ignore[no-any-return]


def test_the_image_carries_the_examples(services: dict[str, Any]) -> None:
    _user, workdir = image_user_and_workdir()
    copies = re.findall(r"^COPY (\S+) (\S+)$", dockerfile(), re.MULTILINE)
    assert ("examples", "./examples") in copies, "lifelong apply -f examples/... in the image"
    # every examples/ path the compose hints and the feeder use, relative to the workdir
    used = re.findall(r"examples/[\w.-]+", (ROOT / "compose.yaml").read_text())
    assert used, "compose.yaml shows how to apply the examples"
    for path in used:
        assert (ROOT / path).is_file(), f"{path} (from {workdir}) is not in the repository"


def test_the_examples_paths_are_writable_by_the_image_user(services: dict[str, Any]) -> None:
    user, _workdir = image_user_and_workdir()
    text = dockerfile()
    [made] = re.findall(r"mkdir -p ([^&;\n]+)", text)
    [(owner, owned)] = re.findall(r"chown (\S+) ([^&;\n]+)", text)
    assert owner == user
    dataset_dir = str(Path(example("dataset.yaml")["spec"]["url"]).parent)
    output_dir = example("lifelonglearningjob.yaml")["spec"]["outputDir"]
    for directory in (dataset_dir, output_dir):
        assert directory in made.split() and directory in owned.split(), directory
    # the replicas, the worker and the feeder share them through volumes mounted there
    volumes = {name: {v.split(":")[1] for v in spec.get("volumes", [])}
               for name, spec in services.items()}  # fmt: skip
    for name in (*CONTROLLERS, "worker"):
        assert {dataset_dir, output_dir} <= volumes[name], name
    assert dataset_dir in volumes["feeder"]


def test_the_examples_paths_are_within_the_controllers_data_roots(
    services: dict[str, Any],
) -> None:
    dataset_url = example("dataset.yaml")["spec"]["url"]
    output_dir = example("lifelonglearningjob.yaml")["spec"]["outputDir"]
    for name in CONTROLLERS:
        policy = config_of(services[name]).path_policy()
        assert policy.roots != ("/",), f"{name}: file access confined to the shared volumes"
        for path in (dataset_url, output_dir):
            assert policy.problem(path) is None, f"{name}: {policy.problem(path)}"


def test_no_published_port_clashes_with_servers_already_on_the_host(
    services: dict[str, Any],
) -> None:
    """The quick start installs mosquitto and redis-server on their default ports, and a
    `lifelong serve` listens on its default HTTP port: compose must not need any of them."""
    defaults = config_mod.Config.from_env({})
    taken = {
        urlsplit(defaults.mqtt_url).port, urlsplit(defaults.redis_url).port,
        defaults.http_host_port()[1], 8883,  # 8883: MQTT over TLS
    }  # fmt: skip
    published: list[int] = []
    for name, spec in services.items():
        for mapping in spec.get("ports", []):
            match = PORT_MAPPING.match(mapping)
            assert match is not None, mapping
            assert match["address"] == "127.0.0.1", f"{name} publishes {mapping} to every host"
            assert match["var"] and match["var"] in (ROOT / "compose.yaml").read_text()
            published.append(int(match["default"] or match["host"]))
    assert not taken & set(published), f"host ports {taken & set(published)} clash"
    assert len(published) == len(set(published)), "two services on one host port"
    header = (ROOT / "compose.yaml").read_text().split("\nname:")[0]
    for port in published:
        assert str(port) in header, f"host port {port} is not documented at the top"


def test_minio_has_its_bucket_and_the_controllers_credentials_for_it(
    services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    minio, init = services["minio"], services["minio-init"]
    command = minio["command"]
    api_port = int(command[command.index("--address") + 1].lstrip(":"))
    root = minio["environment"]
    assert init["image"].startswith("minio/mc")
    assert init["environment"] == root
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    script = shlex.split(init["command"][0].replace("$$", "$"))
    alias = script[script.index("alias") + 1 :][:4]
    assert alias == ["set", "local", f"http://minio:{api_port}", "$MINIO_ROOT_USER"]
    [bucket] = [w.removeprefix("local/") for w in script if w.startswith("local/")]
    assert "mb" in script and "--ignore-existing" in script, "made once, kept on restarts"
    assert f"s3://{bucket}/" in (ROOT / "compose.yaml").read_text(), "say which bucket"
    for name in CONTROLLERS:
        env = services[name]["environment"]
        config_of(services[name])
        assert env["AWS_ACCESS_KEY_ID"] == root["MINIO_ROOT_USER"]
        assert env["AWS_SECRET_ACCESS_KEY"] == root["MINIO_ROOT_PASSWORD"]
        # the service's own S3 client, built from that environment, talks to MinIO
        for key, value in env.items():
            if key.startswith("AWS_"):
                monkeypatch.setenv(key, str(value))
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        client = S3Clients().client(None)
        assert client.meta.endpoint_url == f"http://minio:{api_port}"
        credentials = client._request_signer._credentials  # test-only peek
        assert credentials.access_key == root["MINIO_ROOT_USER"]


def test_a_feeder_applies_the_examples_and_grows_their_dataset(
    services: dict[str, Any], tmp_path: Path
) -> None:
    feeder = services["feeder"]
    assert feeder["entrypoint"] == ["sh", "-c"]
    config_of(feeder)
    steps = [shlex.split(step) for step in feeder["command"][0].split("&&")]
    dataset_url = example("dataset.yaml")["spec"]["url"]
    applied = []
    feeds = []
    for step in steps:
        words = step[1:] if step[0] == "exec" else step
        if words[0] == "lifelong":
            args = build_parser().parse_args(words[1:])
            assert args.command == "apply"
            applied.append(words[words.index("-f") + 1])
        else:
            assert words[:3] == ["python", "-m", "service.demo.comfort"] and words[3] == "feed"
            feeds.append(comfort.feed_parser().parse_args(words[4:]))
    assert applied == ["examples/dataset.yaml", "examples/lifelonglearningjob.yaml"]
    assert steps.index(next(s for s in steps if "apply" in s)) == 1, "the file exists first"
    assert [str(f.path) for f in feeds] == [dataset_url, dataset_url]
    first, forever = feeds
    job = example("lifelonglearningjob.yaml")
    threshold = job["spec"]["trainSpec"]["trigger"]["condition"]["threshold"]
    assert forever.limit > 10 * threshold, "enough samples for many rounds"

    # the feed itself, on a real file: a header, then batches, resuming after a restart
    data = tmp_path / "trainData.csv"
    assert comfort.feed(data, every_s=0, batch=first.batch, limit=first.limit, seed=1) == 60
    assert comfort.feed(data, every_s=0, batch=first.batch, limit=first.limit, seed=1) == 0
    assert comfort.feed(data, every_s=0, batch=forever.batch, limit=110, seed=2) == 50
    lines = data.read_text().splitlines()
    assert lines[0] == comfort.CSV_HEADER and len(lines) == 111
    features, labels = comfort.read_csv(str(data))
    assert features.shape == (110, 2) and set(labels) <= {0.0, 1.0}
