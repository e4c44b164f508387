"""The baselines' other process: republish every message from one topic to another.

`python -m bench.relay PORT IN OUT [REDIS_PORT]` subscribes to IN at QoS 1 and republishes
each message to OUT at QoS 1 with paho's defaults plus TCP_NODELAY: the least an MQTT hop
costs. With REDIS_PORT it is the naive loop instead: each message runs one EVALSHA (a small
script writing a key) before it is republished, one at a time on paho's thread.
Prints `ready` once subscribed.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import paho.mqtt.client as paho
import redis

from bench.common import make_client

NAIVE_SCRIPT = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('INCR', KEYS[2])"


def main(argv: list[str]) -> int:
    port, topic_in, topic_out = int(argv[0]), argv[1], argv[2]
    store = redis.Redis(port=int(argv[3])) if len(argv) > 3 else None
    sha = ""
    if store is not None:
        sha = store.script_load(NAIVE_SCRIPT)  # type: ignore[no-untyped-call]
    subscribed = threading.Event()

    def on_message(client: paho.Client, _u: Any, msg: paho.MQTTMessage) -> None:
        if store is not None:
            keys = ("naive:state", "naive:count")
            store.evalsha(sha, 2, *keys, msg.payload)  # type: ignore[no-untyped-call]
        client.publish(topic_out, msg.payload, qos=1)

    client = make_client(f"bench-relay-{time.time_ns()}")
    client.on_connect = lambda c, *_: c.subscribe(topic_in, qos=1)
    client.on_subscribe = lambda *_: subscribed.set()
    client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.loop_start()
    if not subscribed.wait(10):
        return 1
    print("ready", flush=True)
    sys.stdin.read()  # run until the parent closes our stdin
    client.disconnect()
    client.loop_stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
