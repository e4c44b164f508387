"""The MQTT broker URL: ``mqtt[s]://[user:pass@]host[:port][?query]``, parsed once.

The query takes the TLS files of an ``mqtts://`` URL (``ca=``, ``cert=``, ``key=``,
``insecure=1``; see `service.adapters.tls_query`) and ``protocol=``, which pins the MQTT
version: ``5`` (or ``5.0``) or ``3.1.1`` (or ``311``). Without a pin the client tries MQTT 5
and falls back to 3.1.1 when the broker does not speak 5. Configuration validates the URL
with `parse_mqtt_url` at startup, and the client connects with what it returns.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from paho.mqtt.enums import MQTTProtocolVersion

from service.adapters.tls_query import TLS_QUERY_KEYS, TlsFiles, query_options, tls_files
from service.errors import ConfigError
from service.urls import redact_url

DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883
_QUERY_KEYS = (*TLS_QUERY_KEYS, "protocol")
# What ``?protocol=`` accepts.
PROTOCOL_WORDS: dict[str, MQTTProtocolVersion] = {
    "5": MQTTProtocolVersion.MQTTv5,
    "5.0": MQTTProtocolVersion.MQTTv5,
    "3.1.1": MQTTProtocolVersion.MQTTv311,
    "311": MQTTProtocolVersion.MQTTv311,
}


class MqttEndpoint(NamedTuple):
    """The parsed broker URL.

    ``protocol`` is the one ``?protocol=`` pins, or None to try MQTT 5 and fall back to 3.1.1.
    """

    host: str
    port: int
    username: str | None
    password: str | None
    tls: bool
    tls_options: TlsFiles
    protocol: MQTTProtocolVersion | None = None


def _url_error(url: str, problem: str) -> ConfigError:
    return ConfigError(f"MQTT URL {redact_url(url)!r}: {problem}")


def _tls_options(url: str, options: dict[str, str], tls: bool) -> TlsFiles:
    if not tls and not set(TLS_QUERY_KEYS).isdisjoint(options):
        raise _url_error(url, "ca=, cert=, key= and insecure= need the mqtts:// scheme")
    return tls_files(options, partial(_url_error, url))


def _protocol_option(url: str, options: dict[str, str]) -> MQTTProtocolVersion | None:
    if "protocol" not in options:
        return None
    word = options["protocol"].strip().lower()
    if word not in PROTOCOL_WORDS:
        allowed = ", ".join(PROTOCOL_WORDS)
        raise _url_error(url, f"protocol= must be one of {allowed}, not {options['protocol']!r}")
    return PROTOCOL_WORDS[word]


def parse_mqtt_url(url: str) -> MqttEndpoint:
    """Split ``mqtt[s]://[user:pass@]host[:port][?ca=..&cert=..&key=..&insecure=1&protocol=5]``.

    ``protocol=5`` (or ``5.0``) and ``protocol=3.1.1`` (or ``311``) pin the MQTT version:
    no fallback. Raises `ConfigError` naming the problem; the message shows the URL with its
    password masked and the exception is raised ``from None`` so no library message leaks it.
    """
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        host = parts.hostname
        port = parts.port
    except ValueError:
        raise _url_error(url, "not a valid URL (port must be a number in 1..65535)") from None
    if scheme not in ("mqtt", "mqtts"):
        raise _url_error(url, f"unsupported scheme {scheme or '(none)'!r}; use mqtt:// or mqtts://")
    if not host:
        raise _url_error(url, "no host")
    if parts.path not in ("", "/") or parts.fragment:
        raise _url_error(url, "an MQTT URL takes no path or fragment")
    if port == 0:
        raise _url_error(url, "port must be in 1..65535")
    tls = scheme == "mqtts"
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    options = query_options(parts.query, _QUERY_KEYS, partial(_url_error, url))
    return MqttEndpoint(
        host=host,
        port=port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT),
        username=username or None,
        password=password,
        tls=tls,
        tls_options=_tls_options(url, options, tls),
        protocol=_protocol_option(url, options),
    )
