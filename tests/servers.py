"""Real servers for tests: mosquitto, redis-server (service.embedded), replicated Redis
topologies (a Sentinel-watched master and replica, a Cluster) and moto's S3 server."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, TypeVar

from service.embedded.processes import (
    Server,
    find_binary,
    free_port,
    mosquitto_server,
    redis_server,
    wait_port,
)
from service.embedded.processes import running as running_all
from service.embedded.topologies import (
    ClusterTopology,
    SentinelTopology,
    cluster_topology,
    sentinel_topology,
)

__all__ = [
    "ClusterTopology",
    "SentinelTopology",
    "Server",
    "cluster_topology",
    "free_port",
    "locked_mosquitto",
    "mosquitto_server",
    "moto_server",
    "pipe",
    "redis_server",
    "running",
    "running_topology",
    "sentinel_topology",
    "wait_port",
]


def locked_mosquitto(workdir: Path, users: dict[str, str], acl: str) -> Server:
    """A mosquitto that lets in only `users` (name -> password, a password file made with
    mosquitto_passwd) and applies `acl` as its acl_file."""
    workdir.mkdir(parents=True, exist_ok=True)
    passwd, acl_file = workdir / "passwd", workdir / "acl"
    binary = find_binary("mosquitto_passwd", "/usr/bin/mosquitto_passwd")
    for i, (user, password) in enumerate(users.items()):
        create = ["-c"] if i == 0 else []
        subprocess.run(
            [binary, *create, "-b", str(passwd), user, password], check=True, capture_output=True
        )
    acl_file.write_text(acl)
    return mosquitto_server(
        workdir,
        f"allow_anonymous false\npassword_file {passwd}\nacl_file {acl_file}\n",
    )


class _Topology(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


T = TypeVar("T", bound=_Topology)


def moto_server(workdir: Path, port: int | None = None) -> Server:
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    return Server("moto", argv, port, workdir)


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """One direction of a TCP proxy: copy until `src` ends or fails, then end `dst`'s
    sending side (what the other end then reads as EOF)."""
    with contextlib.suppress(OSError):
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    with running_all(server):
        yield server


@contextlib.contextmanager
def running_topology(topology: T) -> Iterator[T]:
    """Start a Redis topology; stop every process of it afterwards (each by its pid)."""
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()
