"""The servers a command talks to: its settings, its broker session, its Redis store, what each
failure means as an exit code, and which edge nodes a live controller serves.

Exit codes: 0 success; 1 the command ran and found a problem; 2 bad usage or configuration;
3 a server the command needs is unreachable. Failures print one line, never a traceback,
and never a password: URLs are shown through `redact_url`, free text through `redact`.

The broker's answers reach the user at two places only: `_connected` (a refused CONNECT)
and `publish_all` (a refused PUBLISH), each with the broker's reason.

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


import argparse
import contextlib
import logging
import os
import queue
import secrets
import time
from collections.abc import Iterable, Iterator, Sequence

import msgspec

from service import config as config_mod
from service.adapters.mqtt import Inbound, MqttClient, MqttSettings
from service.adapters.redis_store import RedisStore
from service.config import Config
from service.errors import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    PermanentError,
    ServiceError,
    StoreUnavailable,
    TransientError,
)
from service.keys import Keys
from service.logs import setup_logging
from service.urls import redact_url
from service.wire import Presence

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130
STORE_TIMEOUT_S = 3.0
_STOP_TIMEOUT_S = 2.0

log = logging.getLogger("service.cli")


def exit_code(error: ServiceError) -> int:
    """The exit code a command's failure ends with."""
    if isinstance(error, ConfigError):
        return EXIT_USAGE
    if isinstance(error, TransientError):
        return EXIT_UNREACHABLE
    return EXIT_PROBLEM


def command_config(args: argparse.Namespace) -> config_mod.Config:
    """Settings from flags over the environment; logs (the servers used, the libraries'
    connection details) only with --verbose."""
    cfg = config_mod.from_args(args, os.environ)
    setup_logging(cfg.log_format, logging.INFO if args.verbose else logging.CRITICAL)
    return cfg


@contextlib.contextmanager
def mqtt_session(
    cfg: config_mod.Config,
    verb: str,
    timeout_s: float,
    *,
    subscriptions: Sequence[str] = (),
    inbound: queue.SimpleQueue[Inbound] | None = None,
) -> Iterator[MqttClient]:
    """A connected broker session under a fresh client id, closed on the way out; with
    ``subscriptions``, yielded once the broker acknowledged them (a message published after
    that reaches ``inbound``)."""
    log.info("MQTT broker %s (node %s)", redact_url(cfg.mqtt_url), cfg.node_name)
    client = MqttClient(
        MqttSettings(
            cfg.mqtt_url,
            client_id=f"lifelong-{verb}-{secrets.token_hex(3)}",
            connect_timeout_s=timeout_s,
        ),
        subscriptions=subscriptions,
        inbound=inbound,
    )
    client.start()
    try:
        _connected(client, cfg.mqtt_url, timeout_s)
        if subscriptions and not client.wait_subscribed(timeout_s):
            raise BrokerUnavailable(
                f"the MQTT broker at {redact_url(cfg.mqtt_url)} did not confirm the "
                f"subscriptions within {timeout_s:g}s"
            )
        yield client
    finally:
        client.stop(timeout_s=_STOP_TIMEOUT_S)


def _connected(client: MqttClient, url: str, timeout_s: float) -> None:
    """Wait for the session; a failure says which broker and why: refused (the broker's
    answer: bad password, not authorised) or not reached in time."""
    if not client.wait_connected(timeout_s, stop_on_refusal=True):
        if client.refusal is not None:
            raise BrokerRefused(
                f"the MQTT broker at {redact_url(url)} refused the connection: {client.refusal}"
            )
        raise BrokerUnavailable(
            f"cannot reach the MQTT broker at {redact_url(url)} within {timeout_s:g}s"
        )


@contextlib.contextmanager
def store_session(cfg: config_mod.Config) -> Iterator[RedisStore]:
    """A Redis store; connection failures name the (redacted) URL."""
    log.info("Redis %s (key prefix %s)", redact_url(cfg.redis_url), cfg.key_prefix)
    store = RedisStore(cfg.redis_url, Keys(cfg.key_prefix), socket_timeout_s=STORE_TIMEOUT_S)
    try:
        yield store
    except StoreUnavailable as e:
        raise StoreUnavailable(f"cannot reach Redis at {redact_url(cfg.redis_url)}: {e}") from e
    finally:
        store.close()


def publish_all(
    client: MqttClient, outgoing: Sequence[tuple[str, str, bytes]], timeout_s: float
) -> None:
    """Publish (label, topic, payload)s at QoS 1 and print each once the broker has it;
    raise `BrokerRefused` naming every one the broker refused (MQTT 5 only), with its reason."""
    tickets = [(label, topic, client.publish(topic, payload, qos=1))
               for label, topic, payload in outgoing]  # fmt: skip
    deadline = time.monotonic() + timeout_s
    refused: list[str] = []
    for label, topic, ticket in tickets:
        if not ticket.wait(max(deadline - time.monotonic(), 0.0)):
            raise BrokerUnavailable(f"the broker did not acknowledge {label} within {timeout_s:g}s")
        if ticket.refused:
            refused.append(f"{label} to {topic} ({ticket.reason})")
        else:
            print(f"{label} sent to {topic}", flush=True)
    if refused:
        raise BrokerRefused(f"the MQTT broker refused {'; '.join(refused)}")


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
