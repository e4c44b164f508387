"""The TLS files a broker URL names in its query: ``ca=``, ``cert=``, ``key=``, ``insecure=``.

The MQTT URL (``mqtts://``) and the GM address (``wss://``) take these four options with one
meaning, parsed here once: ``ca`` the CA bundle to verify the server with (default: the
system's trust store), ``cert`` and ``key`` a client certificate (given together), and
``insecure`` mosquitto_sub's ``--insecure``: the certificate chain is still verified, only
the host name check is skipped. Every problem is raised as the caller's `ConfigError`, made
by its ``fail`` function, so the message names the URL the way the caller shows it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl

from service.errors import ConfigError

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
