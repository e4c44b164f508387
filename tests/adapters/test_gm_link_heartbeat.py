"""The GM link's threads beat: its event loop while the link is up and idle, and a sender
waiting on a GM that does not read (waiting with a timeout is not a stall)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from service.adapters.gm_link import GmLink, GmLinkSettings, parse_gm_address
from service.heartbeat import Heartbeats
from tests.gm_standin import GmStandIn
from tests.wait import wait_until

NODE = "edge-1"
LEASE_S = 2.0  # not live after two seconds of silence (a loaded machine stalls for one)
STATUS_HEADER = {"namespace": "default", "resourceKind": "dataset", "resourceName": "ds-1",
                 "operation": "status", "id": "s1-17-0"}  # fmt: skip


@pytest.fixture
def gm() -> Iterator[GmStandIn]:
    with GmStandIn() as standin:
        yield standin


def live_until(heartbeats: Heartbeats, done: threading.Event) -> list[str]:
    """Every reason the replica was not live, looked at until ``done``."""
    dead: list[str] = []
    while not done.wait(0.05):
        live, why = heartbeats.live()
        if not live:
            dead.append(why)
    return dead


def test_an_idle_link_keeps_beating(gm: GmStandIn) -> None:
    heartbeats = Heartbeats(time.monotonic, LEASE_S)
    link = GmLink(parse_gm_address(gm.address), NODE, lambda _f: None, heartbeats=heartbeats)
    link.start()
    try:
        wait_until(lambda: link.state.status == "up", 10, "the link up")
        idle = threading.Event()
        threading.Timer(3 * LEASE_S, idle.set).start()  # three leases with nothing to do
        assert live_until(heartbeats, idle) == []
    finally:
        link.stop()
    assert heartbeats.live() == (True, "ok")  # stopped on purpose: no longer watched


def test_a_sender_waiting_on_a_gm_that_does_not_read_keeps_beating(gm: GmStandIn) -> None:
    heartbeats = Heartbeats(time.monotonic, LEASE_S)
    settings = GmLinkSettings(redial_s=0.3, send_timeout_s=3 * LEASE_S, close_timeout_s=0.5)
    link = GmLink(
        parse_gm_address(gm.address), NODE, lambda _f: None, settings=settings,
        heartbeats=heartbeats,
    )  # fmt: skip
    link.start()
    sent: list[bool] = []
    done = threading.Event()

    def send() -> None:
        with heartbeats.watch("gm-outbox"):
            huge = b'{"pad":"' + b"x" * (16 << 20) + b'"}'  # more than the socket buffers hold
            sent.append(link.send(STATUS_HEADER, huge))
        done.set()

    try:
        wait_until(lambda: link.state.status == "up", 10, "the link up")
        gm.freeze(NODE)
        sender = threading.Thread(target=send)
        sender.start()
        assert live_until(heartbeats, done) == []
        sender.join(10)
    finally:
        link.stop()
    assert sent == [False]  # the write timed out all the same
