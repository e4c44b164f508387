"""Where the GM link dials: Sedna's ``GM_ADDRESS`` (``host:port``) or a ``ws://``/``wss://`` URL.

Sedna's local controller dials ``ws://{GM_ADDRESS}/``; a ``wss://`` URL may name TLS files in
its query (``ca=``, ``cert=``, ``key=``, ``insecure=1``; see `service.adapters.tls_query`).
Configuration validates the address with `parse_gm_address` at startup; the link builds its
TLS context with `ssl_context`.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from functools import partial
from urllib.parse import urlsplit, urlunsplit

from service.adapters.tls_query import TLS_QUERY_KEYS, TlsFiles, query_options, tls_files
from service.errors import ConfigError
from service.urls import redact_url


@dataclass(frozen=True)
class GmEndpoint:
    """Where the link dials: the websocket URL (TLS query removed) and, for ``wss://``, its
    TLS files."""

    url: str
    tls: TlsFiles | None = None

    @property
    def shown(self) -> str:
        """The URL fit for logs: a password in it masked."""
        return redact_url(self.url)


def _address_error(address: str, problem: str) -> ConfigError:
    shown = redact_url(address if "://" in address else f"ws://{address}")
    if "://" not in address:
        shown = shown.removeprefix("ws://")
    return ConfigError(f"GM address {shown!r}: {problem}")


def parse_gm_address(address: str) -> GmEndpoint:
    """Parse ``host:port`` (Sedna's GM_ADDRESS, dialed as ``ws://host:port/``) or a
    ``ws://`` / ``wss://`` URL, whose query may name TLS files
    (``wss://gm:443/?ca=/ca.pem&cert=/tls.crt&key=/tls.key``).

    Raises `ConfigError` saying what is wrong; a password in the URL is never shown.
    """
    text = address.strip()
    if not text:
        raise _address_error(address, "empty")
    bare = "://" not in text
    if bare and any(c in text for c in "/?#@"):
        raise _address_error(address, "expected host:port or a ws:// or wss:// URL")
    try:
        parts = urlsplit(f"ws://{text}/" if bare else text)
        port = parts.port
    except ValueError:
        raise _address_error(address, "port must be a number in 1..65535") from None
    scheme = parts.scheme.lower()
    if scheme not in ("ws", "wss"):
        raise _address_error(address, f"scheme {scheme!r} is not ws:// or wss://")
    if not parts.hostname:
        raise _address_error(address, "no host")
    if port == 0:
        raise _address_error(address, "port must be in 1..65535")
    if parts.fragment:
        raise _address_error(address, "a GM URL takes no #fragment")
    fail = partial(_address_error, address)
    options = query_options(parts.query, TLS_QUERY_KEYS, fail)
    if scheme == "ws" and options:
        raise fail("ca=, cert=, key= and insecure= need wss://")
    tls = tls_files(options, fail) if scheme == "wss" else None
    url = urlunsplit((scheme, parts.netloc, parts.path or "/", "", ""))
    return GmEndpoint(url=url, tls=tls)


def ssl_context(tls: TlsFiles) -> ssl.SSLContext:
    """The client TLS context for ``tls``; `ConfigError` if a file cannot be loaded."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_path)
        if tls.cert_path is not None:
            context.load_cert_chain(tls.cert_path, tls.key_path)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise ConfigError(f"GM TLS files (ca/cert/key) could not be loaded: {e}") from e
    if tls.insecure:
        context.check_hostname = False
    return context
