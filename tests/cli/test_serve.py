"""`serve --embedded` as a new user starts it: one shell serves, a second shell uses the
`export` line it printed and applies the shipped examples, which name the node it serves."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.runner import LIFELONG, ROOT, run_cli, start_cli, wait_rows

# What a fresh shell has: no LIFELONG_ settings, and a HOSTNAME that is not the examples' node.
FRESH_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("LIFELONG_")},
    "HOSTNAME": "some-laptop",
    "LIFELONG_HTTP_ADDR": "127.0.0.1:0",  # the only setting: a free port for the endpoint
}
FRESH_ENV.pop("NODENAME", None)


@pytest.fixture
def embedded_serve() -> Iterator[subprocess.Popen[str]]:
    proc = start_cli(FRESH_ENV, "serve", "--embedded", stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)  # it stops its own mosquitto and redis-server
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


def exported(proc: subprocess.Popen[str]) -> tuple[list[str], dict[str, str]]:
    """The lines printed up to and including the `export` line, and its variables."""
    assert proc.stdout is not None
    printed: list[str] = []
    while not printed or not printed[-1].startswith("export "):
        line = proc.stdout.readline()
        assert line, f"serve ended before printing its exports: {printed}"
        printed.append(line.rstrip("\n"))
    words = shlex.split(printed[-1])[1:]
    return printed, dict(word.split("=", 1) for word in words)


@pytest.mark.timeout(90)
def test_a_second_shell_applies_the_examples_with_the_printed_exports(
    embedded_serve: subprocess.Popen[str],
) -> None:
    printed, variables = exported(embedded_serve)
    assert set(variables) == {"LIFELONG_MQTT_URL", "LIFELONG_REDIS_URL", "LIFELONG_NODE_NAME"}
    assert variables["LIFELONG_NODE_NAME"] == "edge-node", "the node the examples name"
    assert any("serving node edge-node" in line for line in printed), printed

    second_shell = {**FRESH_ENV, **variables}
    applied = run_cli(
        second_shell,
        "apply",
        "-f",
        "examples/dataset.yaml",
        "-f",
        "examples/lifelonglearningjob.yaml",
    )
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.splitlines() == [
        "dataset default/lifelong-dataset sent to sedna/edge-node/downstream",
        "lifelonglearningjob default/atcii-classifier-demo sent to sedna/edge-node/downstream",
    ]
    rows = wait_rows(
        second_shell, "jobs", lambda r: [j["name"] for j in r] == ["atcii-classifier-demo"]
    )
    assert rows[0]["phase"] == "train"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGHUP])
def test_ctrl_c_stops_the_replica_gracefully_then_its_servers(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    """A terminal's Ctrl-C is SIGINT to its whole foreground process group. It reached the
    embedded redis-server and mosquitto too, which died first: the replica's graceful stop
    then found Redis gone ("could not release leases"). They now stop after it. A closed
    terminal (SIGHUP) stops them all the same way: in sessions of their own, the servers
    would otherwise outlive it."""
    with open(tmp_path / "stderr", "w+") as stderr:
        proc = subprocess.Popen(
            [*LIFELONG, "serve", "--embedded"], env=FRESH_ENV, stdout=subprocess.PIPE,
            stderr=stderr, text=True, cwd=ROOT, start_new_session=True,  # a shell's job
        )  # fmt: skip
        try:
            printed, variables = exported(proc)
            os.killpg(proc.pid, stop_signal)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            if proc.stdout is not None:
                proc.stdout.close()
        stderr.seek(0)
        log = stderr.read()
    assert f"signal {stop_signal.name}: shutting down" in log
    assert "redis unavailable" not in log and "could not release" not in log, log
    for url in (variables["LIFELONG_MQTT_URL"], variables["LIFELONG_REDIS_URL"]):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
            pass  # stopped with the replica
    assert any(line.startswith("embedded mosquitto") for line in printed), printed
