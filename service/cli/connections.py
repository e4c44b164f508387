"""The servers a command talks to: its settings, its broker session, its Redis store, and
what each failure means as an exit code.

Exit codes: 0 success; 1 the command ran and found a problem; 2 bad usage or configuration;
3 a server the command needs is unreachable. Failures print one line, never a traceback,
and never a password: URLs are shown through `redact_url`, free text through `redact`.

The broker's answers reach the user at two places only: `_connected` (a refused CONNECT)
and `publish_all` (a refused PUBLISH), each with the broker's reason.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import queue
import secrets
import time
from collections.abc import Iterator, Sequence

from service import config as config_mod
from service.adapters.mqtt import Inbound, MqttClient, MqttSettings
from service.adapters.redis_store import RedisStore
from service.errors import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    ServiceError,
    StoreUnavailable,
    TransientError,
)
from service.keys import Keys
from service.logs import setup_logging
from service.urls import redact_url

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
