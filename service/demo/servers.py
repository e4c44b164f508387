"""The servers the demo runs on: mosquitto and redis-server, and two controller replicas."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from service import embedded
from service.embedded import ControllerProcess
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


@contextlib.contextmanager
def controllers(workdir: Path, env: dict[str, str]) -> Iterator[list[ControllerProcess]]:
    """The demo's replicas, started and ready (BrokerUnavailable with a replica's log
    otherwise); stopped at the end."""
    started = [
        ControllerProcess(replica, workdir / f"controller-{replica}.log", env)
        for replica in REPLICAS
    ]
    try:
        for controller in started:
            controller.start()
        for controller in started:
            try:
                controller.wait_ready(READY_TIMEOUT_S)
            except (RuntimeError, TimeoutError) as e:
                raise BrokerUnavailable(str(e)) from e
        yield started
    finally:
        for controller in started:
            controller.stop()
