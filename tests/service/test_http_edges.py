"""Attacks on a running controller's HTTP endpoint: a flood of trickling connections from one
address while Redis hangs, and DNS rebinding (a foreign Host)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import urllib.request

from tests.harness import Controller, still_open, worker_message
from tests.stack import Stack

FLOOD = 250
ATTACKER = "127.0.0.2"  # any address of 127.0.0.0/8 reaches the loopback listener
PARTIAL_HEAD = b"POST /sedna/workers/w-1/info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
#: Generous: a test that fails waits this long once; a passing one is answered at once.
PROBE_TIMEOUT_S = 60


def trickler(port: int) -> socket.socket | None:
    """A connection from the attacker's address that sent half a request head, or None when
    the server refused it at once (it closed or reset the connection)."""
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.settimeout(PROBE_TIMEOUT_S)
    try:
        client.bind((ATTACKER, 0))
        client.connect(("127.0.0.1", port))
        client.sendall(PARTIAL_HEAD)
    except OSError:
        client.close()
        return None
    return client


def test_health_is_answered_while_one_client_floods_and_reports_hang(stack: Stack) -> None:
    """250 connections from one address trickle request heads, and worker reports hang on a
    frozen Redis: the liveness probe is still answered, while those connections are open."""
    controller = stack.controller()
    port = controller.http_port
    clients = [trickler(port) for _ in range(FLOOD)]
    stack.redis.freeze()
    outcomes: list[object] = []

    def report() -> None:
        body = worker_message("some-job", "train", "running")
        try:
            outcomes.append(controller.post_worker("some-job-train-worker", body))
        except OSError as e:
            outcomes.append(e)

    reports = [threading.Thread(target=report) for _ in range(8)]
    try:
        for thread in reports:
            thread.start()
        url = f"http://127.0.0.1:{port}/healthz"
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:
            assert (response.status, response.read()) == (200, b"ok")
        held = [c for c in clients if c is not None and still_open(c)]
        # answered while the flood held its connections and the reports still hung
        assert held, "every flooding connection was closed before /healthz was answered"
        assert outcomes == [], outcomes
    finally:
        stack.redis.thaw()
        for thread in reports:
            thread.join()
        for client in clients:
            if client is not None:
                client.close()
    assert "HTTP client 127.0.0.2 holds 20 connections, the cap per client" in controller.log()


def status_with_host(controller: Controller, method: str, path: str, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", controller.http_port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host)
        body = json.dumps(worker_message("some-job", "train", "running")).encode()
        if method == "POST":
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body if method == "POST" else None)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        with contextlib.suppress(OSError):
            conn.close()


def test_dns_rebinding_does_not_reach_the_worker_endpoint(stack: Stack) -> None:
    """A page on evil.example, its name re-pointed at the controller, sends Host evil.example:
    refused. The names the controller answers to (localhost, its listen address, those set in
    LIFELONG_HTTP_ALLOWED_HOSTS) and IP addresses reach the endpoint (here: 400, as the job is
    unknown)."""
    controller = stack.controller(env={"LIFELONG_HTTP_ALLOWED_HOSTS": "lifelong-controller"})
    report = "/sedna/workers/some-job-train-worker/info"
    port = controller.http_port
    foreign = (f"evil.example:{port}", "evil.example", f"lifelong-controller.evil.example:{port}")
    for host in foreign:
        assert status_with_host(controller, "POST", report, host) == 403
        assert status_with_host(controller, "GET", "/metrics", host) == 403
        assert status_with_host(controller, "GET", "/healthz", host) == 200
    for host in (f"localhost:{port}", f"lifelong-controller:{port}", f"127.0.0.1:{port}"):
        assert status_with_host(controller, "POST", report, host) == 400
        assert status_with_host(controller, "GET", "/metrics", host) == 200
    assert "the Host header names a host this endpoint does not answer to" in controller.log()
