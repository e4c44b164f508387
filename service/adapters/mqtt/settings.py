"""What an MQTT client is told: the broker URL, the session to hold there, its will, timings.

`check_settings` refuses a combination the client could not honour, as a `ConfigError`,
before anything connects.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import ConfigError


@dataclass(frozen=True)
class MqttSettings:
    """How to reach the broker and which session to hold there.

    ``reconnect_min_s``..``reconnect_max_s`` bound paho's doubling delay between connect
    attempts during an outage. ``takeover_backoff_max_s`` caps the doubling delay after
    connections another client with our id took over; a connection that lasted twice this
    long resets that doubling (see `service.adapters.mqtt.policy`).
    """

    url: str
    client_id: str
    clean_start: bool = True
    session_expiry_s: int = 0
    keepalive_s: int = 30
    will: tuple[str, bytes, bool] | None = None
    manual_ack: bool = False
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 10.0
    connect_timeout_s: float = 5.0
    takeover_backoff_max_s: float = 30.0


def check_settings(settings: MqttSettings) -> None:
    """Raise `ConfigError` for settings no client could honour."""
    if not settings.client_id and not settings.clean_start:
        raise ConfigError("MQTT client_id is required for a persistent session (clean_start=False)")
    if not 0 < settings.reconnect_min_s <= settings.reconnect_max_s:
        raise ConfigError("MQTT reconnect delays need 0 < reconnect_min_s <= reconnect_max_s")
    if settings.takeover_backoff_max_s < settings.reconnect_min_s:
        raise ConfigError("MQTT takeover_backoff_max_s must be >= reconnect_min_s")
    if settings.keepalive_s < 1 or settings.session_expiry_s < 0:
        raise ConfigError("MQTT keepalive_s must be >= 1 and session_expiry_s >= 0")
