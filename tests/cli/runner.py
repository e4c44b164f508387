"""Running `lifelong` as a user does: a subprocess with the environment a shell exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness import NODE
from tests.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
LIFELONG = [sys.executable, "-m", "service.cli"]


def cli_env(mqtt_url: str, redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "LIFELONG_MQTT_URL": mqtt_url,
        "LIFELONG_REDIS_URL": redis_url,
        "LIFELONG_NODE_NAME": NODE,
    }


def run_cli(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LIFELONG, *args],
        check=False,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def start_cli(
    env: dict[str, str], *args: str, stderr: int = subprocess.PIPE
) -> subprocess.Popen[str]:
    """`lifelong ARGS` started in the background, its stdout (and stderr) piped as text."""
    return subprocess.Popen(
        [*LIFELONG, *args], env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT
    )


def assert_one_clean_line(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def get_json(env: dict[str, str], kind: str) -> list[dict[str, Any]]:
    result = run_cli(env, "get", kind, "-o", "json")
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def wait_rows(
    env: dict[str, str], kind: str, predicate: Any, timeout_s: float = 15
) -> list[dict[str, Any]]:
    """`get KIND -o json` until its rows satisfy `predicate`."""
    last: list[list[dict[str, Any]]] = []

    def rows() -> tuple[list[dict[str, Any]]] | None:
        last[:] = [get_json(env, kind)]
        return (last[0],) if predicate(last[0]) else None  # a tuple: even [] counts as found

    (found,) = wait_until(rows, timeout_s, f"{kind} rows", detail=lambda: str(last))
    return found
