"""Which edge nodes a live controller serves, from the replicas' retained presence messages.

Every replica keeps a retained `{"replica", "state": "online"|"offline", "since"}` on
`{prefix}/{node}/controllers/{replica}` (its last will says offline), so subscribing to
`{prefix}/+/controllers/+` makes the broker hand over the current presence of every replica
of every node at once. A node is served when one of its replicas says online. `apply` and
`delete` check it before sending: a resource sent to a node nobody serves waits unread, and
the user would otherwise be told "sent".

Anyone allowed to publish there could leave a retained `online` behind, so a presence counts
only when its payload names the replica of its topic and that replica is live in Redis (its
heartbeat in the replicas' registry has not expired); and every replica publishes its
presence again periodically, so one overwritten on its own topic is put right.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterable

import msgspec

from service.adapters.mqtt import Inbound
from service.cli.connections import store_session
from service.config import Config
from service.errors import PermanentError, StoreUnavailable
from service.wire import Presence

#: How long to wait for the presence of every node: retained messages follow the SUBACK at
#: once, so this only bounds the wait when a node has none (the answer is then "not served").
PRESENCE_WAIT_S = 1.0

_decoder = msgspec.json.Decoder(Presence)


def online_replicas(
    cfg: Config, inbound: queue.SimpleQueue[Inbound], wanted: Iterable[str], wait_s: float
) -> dict[str, set[str]]:
    """Node -> its replicas that say online and are live in Redis, from the presence
    messages arriving on `inbound` (subscribed to `cfg.presence_filter_all_nodes()`), until
    every wanted node has one or `wait_s` passed. Unreadable presence messages, and those
    whose payload names another replica than their topic, count as no presence.

    Raises `StoreUnavailable` (saying --force sends anyway) when Redis cannot be read."""
    live = _live_replicas(cfg)
    states: dict[tuple[str, str], bool] = {}
    missing = set(wanted)
    deadline = time.monotonic() + wait_s
    while missing and (remaining := deadline - time.monotonic()) > 0:
        try:
            msg = inbound.get(timeout=remaining)
        except queue.Empty:
            break
        node = cfg.node_of_presence_topic(msg.topic)
        if node is None:
            continue
        replica = msg.topic.rpartition("/")[2]
        states[node, replica] = replica in live and _says_online(msg.payload, replica)
        if states[node, replica]:
            missing.discard(node)
    online: dict[str, set[str]] = {}
    for (node, replica), is_online in states.items():
        if is_online:
            online.setdefault(node, set()).add(replica)
    return online


def _live_replicas(cfg: Config) -> set[str]:
    try:
        with store_session(cfg) as store:
            return set(store.leases.live_replicas(int(time.time() * 1000)))
    except StoreUnavailable as e:
        raise StoreUnavailable(
            f"{e}; the live controllers are not known without it (--force sends anyway)"
        ) from e


def _says_online(payload: bytes, replica: str) -> bool:
    try:
        presence = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False  # an empty payload clears a retained presence
    return presence.state == "online" and presence.replica == replica


def require_served(cfg: Config, nodes: Iterable[str], online: dict[str, set[str]]) -> None:
    """Raise, naming the nodes nobody serves and the nodes that are served, unless every
    node in `nodes` has a replica online."""
    unserved = sorted(set(nodes) - set(online))
    if not unserved:
        return
    served = ", ".join(sorted(online)) or f"none on {cfg.presence_filter_all_nodes()}"
    which = "node " if len(unserved) == 1 else "nodes "
    raise PermanentError(
        f"no live controller serves {which}{', '.join(unserved)} (nodes served: {served}); "
        "nothing sent. Start one (lifelong serve --node-name NODE), check "
        "LIFELONG_MQTT_URL and LIFELONG_NODE_NAME, or send anyway with --force"
    )
