"""`lifelong worker` as a user runs it (a subprocess) against a running controller, attacked:
its commands must not see its secrets, and a forged ready message must not steer its paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.runner import LIFELONG, ROOT
from tests.harness import NODE, NS, PREFIX
from tests.stack import Stack
from tests.wait import wait_until

JOB = "edge-job"
DATASET = "edge-data"
TOKEN = "runner-token-0123456789"
REDIS_PASSWORD = "redis-pw-never-shown"
# Writes a model and reports the whole environment it was given.
DUMP_ENV = """
import json, os, pathlib
out = pathlib.Path(os.environ["OUTPUT_URL"]); out.mkdir(parents=True, exist_ok=True)
model = out / "model.bin"; model.write_bytes(b"m")
result = {"format": "bin", "url": str(model), "metrics": {"accuracy": 0.5}}
pathlib.Path(os.environ["LIFELONG_RESULTS_FILE"]).write_text(
    json.dumps({"results": [result], "ownerInfo": {"env": dict(os.environ)}}))
"""


class RunnerProcess:
    """`lifelong worker` in a subprocess, its log in a file."""

    def __init__(self, stack: Stack, work_dir: Path, *extra: str, env: dict[str, str]) -> None:
        self.log_path = stack.workdir / "worker.log"
        command = f"{sys.executable} -c '{DUMP_ENV}'"
        argv = [*LIFELONG, "worker", "--train-command", command, "--eval-command", command,
                "--work-dir", str(work_dir), "--client-id", "edge-worker", *extra]  # fmt: skip
        environ = {
            **os.environ,
            "LIFELONG_MQTT_URL": stack.mqtt_url,
            "LIFELONG_NODE_NAME": NODE,
            **env,
        }
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, env=environ, cwd=ROOT, stdout=log, stderr=log)
        wait_until(lambda: "worker serving node" in self.log(), 30, "the worker subscribed",
                   detail=self.log)  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture
def runners() -> Iterator[list[RunnerProcess]]:
    started: list[RunnerProcess] = []
    yield started
    for runner in started:
        runner.stop()


def start_job(stack: Stack) -> Path:
    data = stack.samples()
    out = stack.workdir / "out"
    stack.cloud.insert_dataset(DATASET, data)
    stack.cloud.insert_job(JOB, DATASET, out)
    return out


def reported_env(stack: Stack, kind: str) -> dict[str, str]:
    def found() -> dict[str, str] | None:
        for message in stack.cloud.upstream(JOB):
            content = message["content"]
            if (content["phase"], content["status"]) == (kind, "completed") and "output" in content:
                env: dict[str, str] = content["output"]["ownerInfo"]["env"]
                return env
        return None

    return wait_until(found, 60, f"{kind} completed with the command's environment")


def test_commands_get_a_minimal_environment_without_the_runners_secrets(
    stack: Stack, runners: list[RunnerProcess]
) -> None:
    stack.controller()
    secrets = {
        "LIFELONG_HTTP_TOKEN": TOKEN,
        "LIFELONG_REDIS_URL": f"redis://:{REDIS_PASSWORD}@127.0.0.1:1/0",
        "UNRELATED_SECRET": "not-for-commands",
    }
    env = {**secrets, "WANTED_BY_THE_MODEL": "yes", "LC_ALL": "C.UTF-8"}
    work = stack.workdir / "work"
    runners.append(RunnerProcess(stack, work, "--pass-env", "WANTED_BY_THE_MODEL", env=env))
    start_job(stack)
    env = reported_env(stack, "train")
    leaked = [name for name, value in env.items() if TOKEN in value or REDIS_PASSWORD in value]
    assert leaked == []
    assert sorted(n for n in env if n.startswith("LIFELONG_")) == ["LIFELONG_RESULTS_FILE"]
    assert "UNRELATED_SECRET" not in env
    assert env["WANTED_BY_THE_MODEL"] == "yes" and env["LC_ALL"] == "C.UTF-8"
    assert env["PATH"] == os.environ["PATH"]
    assert {"NAMESPACE", "JOB_NAME", "WORKER_NAME", "TRAIN_DATASET_URL", "OUTPUT_URL",
            "LC_SERVER"} <= set(env)  # fmt: skip


def test_the_token_is_not_taken_as_a_flag_nor_passed_on(tmp_path: Path) -> None:
    result = subprocess.run(
        [*LIFELONG, "worker", "--train-command", "true", "--http-token", TOKEN],
        check=False, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--http-token is not taken: a flag shows in the process list" in result.stderr
    assert TOKEN not in result.stderr + result.stdout
    refused = subprocess.run(
        [*LIFELONG, "worker", "--train-command", "true", "--pass-env", "LIFELONG_HTTP_TOKEN"],
        check=False, capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "LIFELONG_NODE_NAME": NODE},
    )  # fmt: skip
    assert refused.returncode != 0
    assert "are never passed to a command" in refused.stderr
    assert "Traceback" not in refused.stderr


def forged_ready(resource: str, output_dir: str, namespace: str = NS) -> bytes:
    envelope: dict[str, Any] = {
        "header": {"id": f"forged-{resource}-{output_dir}", "namespace": namespace,
                   "resourceKind": "lifelonglearningjob", "resourceName": resource,
                   "operation": "status"},
        "content": {"phase": "train", "status": "ready",
                    "input": {"dataURL": "/data/x.txt", "outputDir": output_dir}},
    }  # fmt: skip
    return json.dumps(envelope).encode()


def test_a_forged_ready_cannot_steer_the_runners_paths(
    stack: Stack, runners: list[RunnerProcess]
) -> None:
    """`resourceName: "../victim"` made the runner remove `<work dir>/../victim-train-1`; a
    relative outputDir made it create directories wherever it was started."""
    stack.controller()
    victim = stack.workdir / "victim-train-1"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    work = stack.workdir / "work"
    runner = RunnerProcess(stack, work, env={})
    runners.append(runner)
    topic = f"{PREFIX}/{NODE}/upstream"
    forgeries = [
        forged_ready("../victim", "/tmp/lifelong-forged/train/1"),
        forged_ready("ok-name", "relative/../../escape/train/1"),
        forged_ready("ok-name", "/tmp/a/../../escape/train/1"),
        forged_ready("ok-name", "/tmp/lifelong-forged/train/1", namespace="../ns"),
    ]
    for payload in forgeries:
        stack.cloud.client.publish(topic, payload, qos=1).wait_for_publish(10)
    # a real round after them: the runner takes messages in order, so by its end the
    # forgeries have been read, and the runner still works
    out = start_job(stack)
    reported_env(stack, "train")
    assert (victim / "precious.txt").read_text() == "keep me"
    assert not (ROOT / "relative").exists() and not Path("/tmp/escape").exists()
    assert f"{JOB}-train-1" in {p.name for p in work.iterdir()}
    assert all(p.name.startswith(f"{JOB}-") for p in work.iterdir())
    assert (out / "train" / "1" / "model.bin").exists()
    log = runner.log()
    assert "job name '../victim' is not a DNS-1123 subdomain" in log
    assert "outputDir 'relative/../../escape/train/1' is neither an absolute path" in log
    assert "namespace '../ns' is not a DNS-1123 label" in log
