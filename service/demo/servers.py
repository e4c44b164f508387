"""The servers the demo runs on: mosquitto and redis-server, and two controller replicas."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from service import embedded
from service.errors import BrokerUnavailable, ConfigError

REPLICAS = ("r1", "r2")
PACKAGES = ("mosquitto", "redis-server")
READY_TIMEOUT_S = 20.0


def ensure_servers() -> None:
    """mosquitto and redis-server on the PATH, installed with apt-get when root on Debian."""
    missing = [name for name in PACKAGES if not _found(name)]
    if not missing:
        return
    debian = Path("/etc/debian_version").exists() and shutil.which("apt-get") is not None
    if not (debian and os.geteuid() == 0):
        raise ConfigError(
            f"demo needs {' and '.join(missing)} on the PATH: install them "
            f"(Debian/Ubuntu: sudo apt-get install {' '.join(PACKAGES)}; macOS: brew install "
            "mosquitto redis) or run the stack with `docker compose up`"
        )
    print(f"installing {' '.join(missing)} with apt-get ...", file=sys.stderr, flush=True)
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise ConfigError(f"{' '.join(argv)} failed (exit {done.returncode})")


def _found(name: str) -> bool:
    try:
        embedded.find_binary(name, f"/usr/sbin/{name}", f"/usr/bin/{name}")
    except ConfigError:
        return False
    return True


class Controller:
    """One `lifelong serve` replica as a child process, logging to a file."""

    def __init__(self, replica: str, workdir: Path, env: dict[str, str]) -> None:
        self.replica = replica
        self.http_port = embedded.free_port()
        self.log_path = workdir / f"controller-{replica}.log"
        self._env = {**os.environ, **env, "LIFELONG_HTTP_ADDR": f"127.0.0.1:{self.http_port}"}
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "service.cli", "serve", "--replica-id", self.replica]
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen(argv, env=self._env, stdout=out, stderr=out)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.http_port}/readyz"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                break
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(url, timeout=1),
            ):
                return
            time.sleep(0.1)
        raise BrokerUnavailable(f"controller {self.replica} did not become ready:\n{self.tail()}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def tail(self, chars: int = 1500) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-chars:]


@contextlib.contextmanager
def controllers(workdir: Path, env: dict[str, str]) -> Iterator[list[Controller]]:
    started = [Controller(replica, workdir, env) for replica in REPLICAS]
    try:
        for controller in started:
            controller.start()
        for controller in started:
            controller.wait_ready(READY_TIMEOUT_S)
        yield started
    finally:
        for controller in started:
            controller.stop()
