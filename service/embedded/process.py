"""A server as a child process on a fixed port: started, stopped, restarted, frozen, thawed.

`Server` is what fault tests need of mosquitto or redis-server: a process on a port that
survives its own restarts (same port, same working directory), can be frozen (SIGSTOP) and
thawed, and logs to ``<workdir>/<name>.log``. Binaries come from the PATH; `find_binary`
names the Debian package to install when one is missing.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from service.errors import ConfigError


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


#: The Debian package of each binary started here.
_PACKAGES = {"mosquitto": "mosquitto", "redis-server": "redis-server", "redis-cli": "redis-tools"}


def find_binary(name: str, *fallbacks: str) -> str:
    found = shutil.which(name) or next((f for f in fallbacks if Path(f).exists()), None)
    if found is None:
        package = _PACKAGES.get(name, name)
        raise ConfigError(
            f"{name} not found on PATH: install it (Debian: apt-get install {package}) "
            "or use `docker compose up`"
        )
    return found


@dataclass
class Server:
    """A server process on a fixed port that can be stopped and started again."""

    name: str
    argv: list[str]
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        with open(self.workdir / f"{self.name}.log", "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT
            )
        wait_port(self.port)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a frozen server cannot act on SIGTERM
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    def freeze(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log_text(self) -> str:
        path = self.workdir / f"{self.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def running(*servers: Server) -> Iterator[tuple[Server, ...]]:
    started: list[Server] = []
    try:
        for server in servers:
            server.start()
            started.append(server)
        yield servers
    finally:
        for server in reversed(started):
            server.stop()
