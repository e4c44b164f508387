"""Real servers for tests: mosquitto, redis-server and moto's S3 server on free ports.

Each server is a child process the test owns, so a test can stop, restart, freeze
(SIGSTOP) and break it. LIFELONG_TEST_MQTT_URL / LIFELONG_TEST_REDIS_URL point the
fixtures at external servers instead (then stop/restart are unavailable).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


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


@dataclass
class Server:
    """A server process on a fixed port that can be stopped and started again."""

    name: str
    argv: list[str]
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        log = open(self.workdir / f"{self.name}.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            self.argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        wait_port(self.port)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
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
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
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
        + extra_conf
    )
    return Server("mosquitto", [binary, "-c", str(conf)], port, workdir)


def redis_server(workdir: Path, *extra: str, port: int | None = None) -> Server:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
        "--save", "", "--appendonly", "no", "--daemonize", "no", *extra,
    ]
    return Server("redis", argv, port, workdir)


def moto_server(workdir: Path, port: int | None = None) -> Server:
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    return Server("moto", argv, port, workdir)


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


def env_url(name: str) -> str | None:
    return os.environ.get(name) or None
