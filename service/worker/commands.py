"""Running one task's command, and reading the results it leaves."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from service.worker.tasks import RESULTS_ENV

STDERR_TAIL_BYTES = 2048
_POLL_S = 0.2


@dataclass(frozen=True)
class Outcome:
    """How a command ended, as the report will say it."""

    status: Literal["completed", "failed"]
    results: list[dict[str, Any]] = field(default_factory=list)
    owner_info: dict[str, Any] = field(default_factory=dict)


class Stopped(Exception):
    """The runner is stopping; the command was ended and nothing is reported."""


def run_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    task_dir: Path,
    timeout_s: float | None,
    stop: threading.Event | None = None,
) -> Outcome:
    """Run one task's command with exactly the environment `env`; its stdout and stderr go to
    files in `task_dir`.

    Raises `Stopped` when `stop` is set meanwhile: the command's process group is killed.
    """
    results_file = Path(env[RESULTS_ENV])
    stderr_path = task_dir / "stderr.log"
    try:
        exit_code = _run(argv, env, task_dir, timeout_s, stop)
    except OSError as e:
        return Outcome("failed", owner_info={"reason": f"cannot run {argv[0]!r}: {e}"})
    if exit_code is None:
        info = {"reason": f"timed out after {timeout_s:g}s", "stderr": _tail(stderr_path)}
        return Outcome("failed", owner_info=info)
    if exit_code != 0:
        failed: dict[str, Any] = {"exitCode": exit_code, "stderr": _tail(stderr_path)}
        return Outcome("failed", owner_info=failed)
    return read_results(results_file)


def _run(
    argv: Sequence[str],
    env: Mapping[str, str],
    task_dir: Path,
    timeout_s: float | None,
    stop: threading.Event | None,
) -> int | None:
    """The exit code, or None when the command outlived `timeout_s` and was killed."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with open(task_dir / "stdout.log", "wb") as out, open(task_dir / "stderr.log", "wb") as err:
        proc = subprocess.Popen(
            list(argv), env=dict(env), stdout=out, stderr=err, start_new_session=True
        )
        try:
            while True:
                try:
                    return proc.wait(_POLL_S)
                except subprocess.TimeoutExpired:
                    pass
                if stop is not None and stop.is_set():
                    raise Stopped()
                if deadline is not None and time.monotonic() > deadline:
                    _kill_group(proc)
                    return None
        except BaseException:
            _kill_group(proc)  # stopping or interrupted: take the command along
            raise


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - STDERR_TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def read_results(path: Path) -> Outcome:
    """A finished command's results: a JSON list of results, or {"results", "ownerInfo"?}.

    No file means a successful command that reported no model; the controller then ends the
    round with "no usable model" (or it was a Sedna-library worker that reported by itself).
    """
    if not path.exists():
        return Outcome("completed")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return Outcome("failed", owner_info={"reason": f"results file unreadable: {e}"})
    if isinstance(data, list):
        data = {"results": data}
    results, owner_info = (
        (data.get("results"), data.get("ownerInfo", {})) if isinstance(data, dict) else (0, 0)
    )
    if not isinstance(results, list) or not isinstance(owner_info, dict):
        reason = 'results file must hold a list or {"results": [...], "ownerInfo": {...}}'
        return Outcome("failed", owner_info={"reason": reason})
    return Outcome("completed", [r for r in results if isinstance(r, dict)], owner_info)
