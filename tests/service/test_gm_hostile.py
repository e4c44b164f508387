"""A hostile GM against a real `lifelong serve`: one that redirects the link elsewhere, one
that sends datasets for another node, one that floods frames faster than they can be taken
in."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
import redis

from service.adapters.gm_link import DEFAULT_MAX_PENDING_BYTES
from service.embedded.processes import free_port
from tests.gm_standin import GmStandIn, go_frame, resource_json
from tests.harness import NODE, NS, dataset_resource, metric_sum
from tests.stack import Stack
from tests.wait import wait_until


@pytest.fixture
def gm() -> Iterator[GmStandIn]:
    with GmStandIn() as standin:
        yield standin


class Redirector:
    """An HTTP server answering every request with a redirect to ``location``."""

    def __init__(self, location: str) -> None:
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.requests += 1
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.port = free_port()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_the_link_follows_no_redirect(stack: Stack, gm: GmStandIn) -> None:
    redirector = Redirector(f"ws://{gm.address}/")
    try:
        controller = stack.controller(env={"LIFELONG_GM_ADDRESS": f"127.0.0.1:{redirector.port}"})
        # a second dial comes only after the first ended: a redirect followed would be by then
        wait_until(lambda: redirector.requests >= 2, 20, "two dials of the redirecting GM")
        assert gm.connects(NODE) == 0, "the redirect's target was never dialed"
        assert "HTTP 302 redirecting to 'ws://" in controller.log()
        assert "redirects are not followed" in controller.log()
    finally:
        redirector.close()


def test_a_dataset_for_another_node_from_the_gm_is_refused(stack: Stack, gm: GmStandIn) -> None:
    controller = stack.controller(env={"LIFELONG_GM_ADDRESS": gm.address})
    assert gm.wait(lambda: gm.connections(NODE) == 1), "the link is up"
    foreign = dataset_resource("elsewhere", str(stack.workdir / "train.txt"))
    foreign["spec"]["nodeName"] = "other-node"
    gm.insert(NODE, foreign)
    [error] = stack.cloud.wait_for(stack.cloud.errors, 10, "the refusal")
    assert error["topic"] == "gm"
    assert "the dataset is for node 'other-node'" in error["reason"]
    assert metric_sum(controller, "lifelong_rejections_total", reason="wrong_node") == 1


FLOOD = 400


def test_a_flooding_gm_is_slowed_down_while_redis_stalls(stack: Stack, gm: GmStandIn) -> None:
    # a long lease: the controller keeps its leases while Redis takes no writes
    controller = stack.controller(
        env={"LIFELONG_GM_ADDRESS": gm.address, "LIFELONG_LEASE_SECONDS": "60"}
    )
    assert gm.wait(lambda: gm.connections(NODE) == 1), "the link is up"
    frames = []
    for i in range(FLOOD):  # deletes of datasets nobody has, each ~80 KB on the wire
        resource = dataset_resource(f"flood-{i}", "/data/none.txt")
        resource["metadata"]["annotations"] = {"note": "x" * 60_000}
        frames.append(go_frame(NS, "dataset", f"flood-{i}", "delete", resource_json(resource)))
    raw = redis.Redis.from_url(stack.redis_url)
    raw.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")  # Redis stalls: nothing is durable
    try:
        gm.flood(NODE, frames)
        wait_until(
            lambda: metric_sum(controller, "lifelong_gm_link_reading_paused") == 1, 20,
            "the link to stop reading",
        )  # fmt: skip
        handed = metric_sum(controller, "lifelong_gm_frames_total", direction="in")
        assert handed <= DEFAULT_MAX_PENDING_BYTES // len(frames[0]) + 1, handed
        assert gm.queued(NODE) > 0, "the rest waits at the GM"
        assert "reading paused until it does" in controller.log()
    finally:
        raw.execute_command("CLIENT", "UNPAUSE")
        raw.close()
    # nothing is lost: once Redis is back every frame is taken in
    wait_until(
        lambda: metric_sum(controller, "lifelong_events_total", type="DatasetDeleted") == FLOOD,
        60, "every frame taken in",
    )  # fmt: skip
    assert gm.queued(NODE) == 0
    assert metric_sum(controller, "lifelong_gm_link_reading_paused") == 0
