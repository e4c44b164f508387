"""A controller replica (`lifelong serve`) as a child process, for the demo, the tests and
the benchmarks alike.

`ControllerProcess` starts the command with the environment given, on an HTTP port of its
own (``LIFELONG_HTTP_ADDR``), logging to one file; waits until it listens or is ready (and
fails with the log's tail if it exits first); stops it with SIGTERM (SIGKILL after a grace
period), kills, freezes and thaws it. What settings a replica runs with is its caller's
business: the demo's, the tests' and the benchmarks' differ.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from service.embedded.process import free_port

#: How often a wait looks at the process and its port.
POLL_S = 0.05


def serve_command(replica: str) -> list[str]:
    """`lifelong serve` for ``replica``, run by this interpreter."""
    return [sys.executable, "-m", "service.cli", "serve", "--replica-id", replica]


class ControllerProcess:
    """One replica as a child process: ``command`` (default `serve_command`) run from
    ``cwd``, with ``env`` over this process's environment, logging to ``log_path``; set
    ``argv_prefix`` before `start` to run it under another command (e.g. `setpriv`)."""

    def __init__(
        self,
        replica: str,
        log_path: Path,
        env: Mapping[str, str],
        *,
        command: Sequence[str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = replica
        self.http_port = free_port()
        self.log_path = log_path
        self.env = {**os.environ, **env, "LIFELONG_HTTP_ADDR": f"127.0.0.1:{self.http_port}"}
        self.command = list(command or serve_command(replica))
        self.argv_prefix: list[str] = []
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"controller {self.name} is not running"
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        """Start the process (its log appended to); returns at once."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.argv_prefix, *self.command],
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_listening(self, timeout_s: float) -> None:
        """Until the HTTP port answers; RuntimeError if the process exits first,
        TimeoutError after ``timeout_s`` (both with the log's tail)."""
        self._wait(lambda: _listens(self.http_port), timeout_s, "listening")

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 now."""
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float = 15) -> None:
        """Until ``/readyz`` answers 200; RuntimeError if the process exits first,
        TimeoutError after ``timeout_s`` (both with the log's tail)."""
        self._wait(self.ready, timeout_s, "ready")

    def _wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"controller {self.name} exited ({self.proc.returncode}) before it was "
                    f"{what}: {self.log()[-3000:]}"
                )
            if done():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"controller {self.name} not {what}: {self.log()[-3000:]}")
            time.sleep(POLL_S)

    def stop(self, grace_s: float = 20) -> int | None:
        """SIGTERM, then SIGKILL if it has not ended after ``grace_s``; its exit code (None
        when it was not started)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a frozen process cannot act on SIGTERM
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL: the death of a power cut, nothing flushed."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: every thread stands still, the process stays."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
    except OSError:
        return False
    return True
