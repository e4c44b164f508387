"""Local mosquitto and redis-server processes on free ports (`serve --embedded`, tests).

Each `Server` is a child process on a fixed port that can be stopped, restarted, frozen
(SIGSTOP) and thawed, which is what fault tests need. Binaries come from the PATH.
"""

from __future__ import annotations

import contextlib
import os
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


def find_binary(name: str, *fallbacks: str) -> str:
    found = shutil.which(name) or next((f for f in fallbacks if Path(f).exists()), None)
    if found is None:
        raise ConfigError(
            f"{name} not found on PATH: install it (Debian: apt-get install mosquitto "
            "redis-server) or use `docker compose up`"
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


def mosquitto_server(workdir: Path, extra_conf: str = "", port: int | None = None) -> Server:
    binary = find_binary("mosquitto", "/usr/sbin/mosquitto")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\n"
        + ("allow_anonymous true\n" if "allow_anonymous" not in extra_conf else "")
        + "set_tcp_nodelay true\n"
        + "persistence true\n"
        + f"persistence_location {workdir}/\n"
        + "autosave_interval 1\n"
        + "max_queued_messages 100000\n"
        + "max_inflight_messages 100\n"  # as the configs we ship
        # as root, mosquitto drops to the `mosquitto` user, who cannot write a 0700 temp dir
        + ("user root\n" if os.geteuid() == 0 and "user " not in extra_conf else "")
        + extra_conf
    )
    return Server("mosquitto", [binary, "-c", str(conf)], port, workdir)


def redis_server(workdir: Path, *extra: str, port: int | None = None) -> Server:
    binary = find_binary("redis-server", "/usr/bin/redis-server")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(workdir),
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        *extra,
    ]
    return Server("redis", argv, port, workdir)


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
