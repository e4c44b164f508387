"""The one wrapper the demo, the tests and the benchmarks run a replica with: a replica that
cannot start fails the wait at once with its log, not after the timeout; a frozen replica
still stops on SIGTERM."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from service.embedded.processes import ControllerProcess, free_port
from tests.harness import Controller
from tests.servers import Server


def test_a_replica_that_exits_fails_the_wait_with_its_log(tmp_path: Path) -> None:
    env = {"LIFELONG_MQTT_URL": "nonsense://", "LIFELONG_DATA_ROOTS": str(tmp_path)}
    replica = ControllerProcess("r1", tmp_path / "r1.log", env)
    replica.start()
    with pytest.raises(RuntimeError, match=r"controller r1 exited \(\d+\) before it was ready"):
        replica.wait_ready(600)  # the exit ends the wait, long before this
    assert "nonsense" in replica.log()
    assert replica.stop() not in (None, 0)


def test_a_frozen_replica_stops_on_sigterm(
    tmp_path: Path, mosquitto: Server, redis_proc: Server
) -> None:
    replica = Controller(
        tmp_path / "controllers",
        f"mqtt://127.0.0.1:{mosquitto.port}",
        f"redis://127.0.0.1:{redis_proc.port}/0",
    )
    replica.start()
    replica.wait_ready()
    replica.freeze()
    assert replica.stop(grace_s=60) == 0, "thawed, it shut down on SIGTERM"
    assert "shutting down" in replica.log()


def test_free_ports_lie_outside_the_range_outgoing_connections_take() -> None:
    """A server's port drawn from the ephemeral range can be taken by any client connection
    between the draw and the server's listen (a replica's HTTP port once was, by another
    replica's connection): free ports lie below that range, are never drawn twice in a row
    of draws (a replica binds its port a second after it is drawn, and a second draw of it
    meanwhile would find it still free), and nothing is bound to them."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(500)]
    assert all(port < low for port in ports), sorted(p for p in ports if p >= low)
    assert len(set(ports)) == len(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", free_port() + 1))  # the next draw's port, taken meanwhile
        assert free_port() != held.getsockname()[1]
    for port in ports[:20]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", port))


def test_another_process_draws_on_from_where_this_one_stopped() -> None:
    """One sequence of ports for every process: each walking its own from a random start,
    two processes (pytest's workers) met once one walked faster, and then took each other's
    ports drawn but not yet listened on, one test in ten failing with "address already in
    use". Another process's draw follows this one's (other workers may draw in between)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    draw = "from service.embedded.processes import free_port; print(free_port())"
    for _ in range(3):
        mine = free_port()
        theirs = int(subprocess.check_output([sys.executable, "-c", draw], text=True))
        assert 0 < (theirs - mine) % (low - 10_000) <= 200, (mine, theirs)
