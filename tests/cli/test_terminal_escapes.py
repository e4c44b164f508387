"""Terminal escapes in untrusted text (a worker's stderr, a sender's reason, a dataset url)
reach `describe`, `get` and `watch` (the real CLI, subprocesses, against a real controller)
escaped: no output can clear the screen or write the clipboard, nor add a line."""

from __future__ import annotations

import json

from tests.cli.runner import cli_env, run_cli, start_cli, wait_rows
from tests.harness import NODE, PREFIX, dataset_resource, worker_message
from tests.stack import Stack

JOB = "escape-job"
DATASET = "escape-data"
# OSC 52 writes the clipboard; CSI 2J clears the screen; U+009B is the one-character CSI
CLIPBOARD = "\x1b]52;c;ZXZpbA==\x07"
CLEAR = "\x1b[2J"
C1_CSI = "\u009b2J"
RAW = ("\x1b", "\x07", "\u009b", "\r")


def assert_inert(text: str) -> None:
    assert not [c for c in RAW if c in text], repr(text)


def test_describe_get_and_watch_escape_what_others_wrote(stack: Stack) -> None:
    controller, _out = stack.job_at_train_ready(JOB, DATASET)
    env = cli_env(stack.mqtt_url, stack.redis_url)
    failed = worker_message(JOB, "train", "failed")
    failed["ownerInfo"] = {"exitCode": 1, "stderr": f"boom{CLIPBOARD}{CLEAR}\rforged: ok\n"}
    assert controller.post_worker(failed["name"], failed)[0] == 200

    def described() -> str | None:
        result = run_cli(env, "describe", "job", JOB)
        return result.stdout if "boom" in result.stdout else None

    text = stack.cloud.wait_for(described, 30, "the failure in describe")
    assert_inert(text)
    [last_error] = [line for line in text.splitlines() if line.startswith("Last error:")]
    assert "boom\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J" in last_error

    # a dataset url may hold C1 controls (the wire refuses C0 only): `get` shows it escaped
    url = f"{stack.workdir}/data/{C1_CSI}.txt"
    stack.cloud.downstream("dataset", "insert", dataset_resource("c1-data", url))
    wait_rows(env, "datasets", lambda rows: any(r["name"] == "c1-data" for r in rows))
    table = run_cli(env, "get", "datasets")
    assert table.returncode == 0, table.stderr
    assert_inert(table.stdout + table.stderr)
    assert "\\x9b2J.txt" in table.stdout

    # watch: an upstream status and a rejection, each carrying escapes
    watch = start_cli(env, "watch", "--count", "2", "--timeout", "60")
    assert watch.stderr is not None
    assert watch.stderr.readline().startswith("watching")
    status = {"header": {"resourceKind": "lifelonglearningjob", "namespace": "default",
                         "resourceName": f"x{CLEAR}"},
              "content": {"phase": "train", "status": "failed", "reason": f"r{CLIPBOARD}\rz"}}
    rejection = {"topic": f"t{CLEAR}", "reason": f"why{C1_CSI}\nforged line", "payload": "",
                 "receivedAt": "2026-01-01T00:00:00Z"}  # fmt: skip
    for level, body in (("upstream", status), ("errors", rejection)):
        topic = f"{PREFIX}/{NODE}/{level}"
        stack.cloud.client.publish(topic, json.dumps(body), qos=1).wait_for_publish(10)
    out, err = watch.communicate(timeout=60)
    assert watch.returncode == 0, err
    assert_inert(out + err)
    shown = out.splitlines()
    assert len(shown) == 2, shown
    assert "x\\x1b[2J" in shown[0] and "reason: r\\x1b]52;c;ZXZpbA==\\x07\\rz" in shown[0]
    assert "why\\x9b2J\\nforged line" in shown[1]
