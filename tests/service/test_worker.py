"""The reference worker runner against a running controller, over MQTT and over HTTP."""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.config import Config
from service.worker import Worker, WorkerSettings, parse_ready
from tests.harness import NODE, lines
from tests.stack import Stack

JOB = "comfort-job"
DATASET = "comfort-data"

# Writes a model into OUTPUT_URL and names it in the results file, echoing the env it got.
WRITE_MODEL = """
import json, os, pathlib
out = pathlib.Path(os.environ["OUTPUT_URL"]); out.mkdir(parents=True, exist_ok=True)
model = out / "model.bin"
model.write_bytes(("model of " + os.environ["WORKER_NAME"]).encode())
keys = ["NAMESPACE", "JOB_NAME", "WORKER_NAME", "TRAIN_DATASET_URL", "TEST_DATASET_URL",
        "MODEL_URLS", "OUTPUT_URL", "LC_SERVER", "ORIGINAL_DATASET_URL"]
env = {k: os.environ[k] for k in keys if k in os.environ}
url = os.environ.get("MODEL_URLS", str(model)).split(";")[0]
result = {"format": "bin", "url": url, "metrics": {"accuracy": 0.75}}
pathlib.Path(os.environ["LIFELONG_RESULTS_FILE"]).write_text(
    json.dumps({"results": [result], "ownerInfo": {"env": env}}))
"""

FAIL = "import sys; sys.stderr.write('loading data\\nboom: no GPU here\\n'); sys.exit(3)"

# What Sedna's worker library does on completion (sedna.service.client.LCClient.send): POST
# the WorkerMessage to LC_SERVER + /sedna/workers/WORKER_NAME/info, and write no results file.
SEDNA_LIBRARY = """
import json, os, pathlib, urllib.request
out = pathlib.Path(os.environ["OUTPUT_URL"]); out.mkdir(parents=True, exist_ok=True)
model = out / "model.pb"; model.write_bytes(b"tf")
message = {"name": os.environ["WORKER_NAME"], "namespace": os.environ["NAMESPACE"],
           "ownerName": os.environ["JOB_NAME"], "ownerKind": "lifelonglearningjob",
           "kind": "train", "status": "completed", "ownerInfo": {"by": "sedna-lib"},
           "results": [{"format": "pb", "url": str(model), "metrics": {}}]}
url = "{0}/sedna/workers/{1}/info".format(os.environ["LC_SERVER"], os.environ["WORKER_NAME"])
request = urllib.request.Request(url, data=json.dumps(message).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
assert json.load(urllib.request.urlopen(request, timeout=5)) == {"status": 200, "message": "OK"}
"""


def command(script: str) -> tuple[str, ...]:
    return (sys.executable, "-c", script)


def start_job(stack: Stack, samples: int = 10) -> Path:
    data = stack.samples(samples)
    out = stack.workdir / "out"
    stack.cloud.insert_dataset(DATASET, data)
    stack.cloud.insert_job(JOB, DATASET, out)
    return out


@pytest.fixture
def run_worker(stack: Stack) -> Iterator[Any]:
    """Starts workers (settings and env as `Worker` takes them); stops them at the end."""
    numbers = itertools.count()
    with contextlib.ExitStack() as stopping:

        def start(settings: WorkerSettings, **env: str) -> Worker:
            environ = {"LIFELONG_MQTT_URL": stack.mqtt_url, "LIFELONG_NODE_NAME": NODE, **env}
            cfg = Config.from_env(environ)
            worker = Worker(cfg, settings, client_id=f"worker-{next(numbers)}")
            stopping.callback(worker.stop)
            worker.start()
            return worker

        yield start


def wait_deployed(stack: Stack, out: Path, model: str, content: bytes) -> None:
    """Deploy becomes ready with the train model `model`, whose bytes the deploy file holds."""
    deploy = stack.cloud.wait_status(JOB, "deploy", "ready", timeout_s=30)
    assert deploy["content"]["input"]["models"] == [{"format": "bin", "url": model}]
    assert (out / "deploy" / "index.pkl").read_bytes() == content


def forwarded(stack: Stack, kind: str, status: str) -> list[dict[str, Any]]:
    return [
        m["content"]["output"]
        for m in stack.cloud.upstream(JOB)
        if "output" in m["content"]
        and (m["content"]["phase"], m["content"]["status"]) == (kind, status)
    ]


def test_worker_runs_a_full_round_over_mqtt(stack: Stack, run_worker: Any) -> None:
    stack.controller()
    lc_server = "http://127.0.0.1:9999"
    run_worker(
        WorkerSettings(
            commands={"train": command(WRITE_MODEL), "eval": command(WRITE_MODEL)},
            lc_server=lc_server,
            original_dataset_url="/data/original.txt",
        )
    )
    out = start_job(stack)
    model = f"{out}/train/1/model.bin"
    wait_deployed(stack, out, model, b"model of comfort-job-train-1")
    [train_running] = forwarded(stack, "train", "running")
    [train_done] = forwarded(stack, "train", "completed")
    assert train_running == {"models": [], "ownerInfo": {}}
    assert train_done["models"] == [{"format": "bin", "url": model, "metrics": {"accuracy": 0.75}}]
    assert train_done["ownerInfo"]["env"] == {
        "NAMESPACE": "default",
        "JOB_NAME": JOB,
        "WORKER_NAME": "comfort-job-train-1",
        "TRAIN_DATASET_URL": f"{out}/data/train/1/data.txt",
        "OUTPUT_URL": f"{out}/train/1",
        "LC_SERVER": lc_server,
        "ORIGINAL_DATASET_URL": "/data/original.txt",
    }
    [eval_done] = forwarded(stack, "eval", "completed")
    eval_env = eval_done["ownerInfo"]["env"]
    assert eval_env["TEST_DATASET_URL"] == f"{out}/data/eval/1/data.txt"
    assert eval_env["MODEL_URLS"] == model
    assert eval_env["WORKER_NAME"] == "comfort-job-eval-1"
    assert "TRAIN_DATASET_URL" not in eval_env
    assert stack.cloud.errors() == []


def test_failing_command_reports_exit_code_and_stderr(stack: Stack, run_worker: Any) -> None:
    stack.controller()
    run_worker(WorkerSettings(commands={"train": command(FAIL)}, lc_server="http://x:1"))
    start_job(stack)
    cloud = stack.cloud
    cloud.wait_for(lambda: forwarded(stack, "train", "failed"), 30, "train failed")
    failed = forwarded(stack, "train", "failed")[0]
    assert failed["models"] == []
    assert failed["ownerInfo"]["exitCode"] == 3
    assert failed["ownerInfo"]["stderr"].endswith("boom: no GPU here\n")
    # the controller takes the round back: the retry is version 2 with the same samples
    retry = cloud.wait_for(
        lambda: [
            m for m in cloud.upstream(JOB)
            if m["content"].get("status") == "ready"
            and m["content"]["input"].get("outputDir", "").endswith("/train/2")
        ],
        30,
        "train ready v2",
    )
    assert Path(retry[0]["content"]["input"]["dataURL"]).read_text().splitlines() == lines(0, 8)


def test_http_reporting_with_a_sedna_library_worker(stack: Stack, run_worker: Any) -> None:
    controller = stack.controller()
    lc_server = f"http://127.0.0.1:{controller.http_port}"
    run_worker(
        WorkerSettings(
            commands={"train": command(SEDNA_LIBRARY), "eval": command(WRITE_MODEL)},
            lc_server=lc_server,
            report_http=True,
        )
    )
    out = start_job(stack)
    wait_deployed(stack, out, f"{out}/train/1/model.pb", b"tf")
    # running came from the runner over HTTP, completed from the library, then the runner's own
    # (result-less) completed, which the controller only forwards: the job went on to eval
    train_done = forwarded(stack, "train", "completed")
    assert train_done[0]["ownerInfo"] == {"by": "sedna-lib"}
    assert forwarded(stack, "train", "running") == [{"models": [], "ownerInfo": {}}]
    assert forwarded(stack, "eval", "completed")[0]["ownerInfo"]["env"]["LC_SERVER"] == lc_server
    assert not forwarded(stack, "train", "failed")
    assert stack.cloud.errors() == []


def test_http_reporting_to_a_controller_that_requires_a_token(
    stack: Stack, run_worker: Any
) -> None:
    token = "runner-token-0123456789"
    controller = stack.controller(env={"LIFELONG_HTTP_TOKEN": token})
    settings = WorkerSettings(
        commands={"train": command(WRITE_MODEL), "eval": command(WRITE_MODEL)},
        lc_server=f"http://127.0.0.1:{controller.http_port}",
        report_http=True,
    )
    run_worker(settings, LIFELONG_HTTP_TOKEN=token)  # the runner sends the same setting
    out = start_job(stack)
    deploy = stack.cloud.wait_status(JOB, "deploy", "ready", timeout_s=30)
    model = f"{out}/train/1/model.bin"
    assert deploy["content"]["input"]["models"] == [{"format": "bin", "url": model}]
    assert [len(forwarded(stack, kind, "completed")) for kind in ("train", "eval")] == [1, 1]
    assert stack.cloud.errors() == []


def test_parse_ready_ignores_everything_but_train_and_eval_ready() -> None:
    header = {"namespace": "default", "resourceName": JOB, "id": "m1", "operation": "status"}

    def envelope(content: dict[str, Any]) -> bytes:
        return json.dumps({"header": header, "content": content}).encode()

    train = {"phase": "train", "status": "ready",
             "input": {"dataURL": "/o/data/train/4/data.txt", "outputDir": "/o/train/4"}}
    task = parse_ready(envelope(train))
    assert task is not None and task.worker_name == f"{JOB}-train-4" and task.kind == "train"
    assert parse_ready(envelope({"phase": "deploy", "status": "ready",
                                 "input": {"models": []}})) is None
    assert parse_ready(envelope({"phase": "train", "status": "completed",
                                 "output": {"models": [], "ownerInfo": {}}})) is None
    assert parse_ready(envelope({"numberOfSamples": 3})) is None
    assert parse_ready(b"not json") is None
