"""Broker URLs, parsed once: the MQTT URL and the TLS files a URL names in its query.

The MQTT URL is ``mqtt[s]://[user:pass@]host[:port][?query]``. Its query takes the TLS files
of an ``mqtts://`` URL (``ca=``, ``cert=``, ``key=``, ``insecure=1``) and ``protocol=``,
which pins the MQTT version: ``5`` (or ``5.0``) or ``3.1.1`` (or ``311``). Without a pin the
client tries MQTT 5 and falls back to 3.1.1 when the broker does not speak 5. Configuration
validates the URL with `parse_mqtt_url` at startup, and the client connects with what it
returns.

The MQTT URL (``mqtts://``) and the GM address (``wss://``) take the four TLS options with
one meaning, parsed here once (`query_options`, `tls_files`): ``ca`` the CA bundle to verify
the server with (default: the system's trust store), ``cert`` and ``key`` a client
certificate (given together), and ``insecure`` mosquitto_sub's ``--insecure``: the
certificate chain is still verified, only the host name check is skipped. Every problem is
raised as the caller's `ConfigError`, made by its ``fail`` function, so the message names
the URL the way the caller shows it.
"""


from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit

from paho.mqtt.enums import MQTTProtocolVersion

from service.errors import ConfigError
from service.urls import redact_url

TLS_QUERY_KEYS = ("ca", "cert", "key", "insecure")
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})

Fail = Callable[[str], ConfigError]
"""Makes the error to raise from a problem's description."""


@dataclass(frozen=True)
class TlsFiles:
    """TLS files from a URL's query; all None and ``insecure`` False when none is named."""

    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    insecure: bool = False


def query_options(query: str, allowed: Sequence[str], fail: Fail) -> dict[str, str]:
    """The ``name=value`` pairs of a URL's query, each name one of ``allowed`` and given once."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise fail("the query string is malformed") from None
    options: dict[str, str] = {}
    for name, value in pairs:
        if name not in allowed:
            raise fail(f"unknown query parameter {name!r} (allowed: {', '.join(allowed)})")
        if name in options:
            raise fail(f"query parameter {name!r} given twice")
        options[name] = value
    return options


def tls_files(options: Mapping[str, str], fail: Fail) -> TlsFiles:
    """The TLS files among ``options`` (see `query_options`); ``cert`` needs ``key``."""
    if ("cert" in options) != ("key" in options):
        raise fail("cert= and key= must be given together")
    return TlsFiles(
        ca_path=options.get("ca") or None,
        cert_path=options.get("cert") or None,
        key_path=options.get("key") or None,
        insecure=_flag(options.get("insecure", ""), "insecure", fail),
    )


def _flag(value: str, name: str, fail: Fail) -> bool:
    word = value.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise fail(f"{name}= must be 1 or 0, not {value!r}")


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
