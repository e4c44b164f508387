"""URL helpers shared by configuration, adapters and the CLI: the one redactor, and the one
parser of Redis URLs (configuration validates with it, the store builds its client from it)."""


import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from service.errors import ConfigError

MASK = "***"
# scheme://user[:password]@ where the password may hold anything but '@' (even '/')
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:]*)(?P<pw>:[^@]*)?@")


def redact_url(url: str) -> str:
    """The URL with its password masked, fit for logs and error messages.

    ``scheme://user:pass@host`` becomes ``scheme://user:***@host``; userinfo without a colon
    is masked whole, since some clients read a bare ``secret@host`` as the password.
    """
    match = _USERINFO.match(url)
    if match is None:
        return url
    masked = f"{match['user']}:{MASK}" if match["pw"] is not None else MASK
    return f"{match['scheme']}{masked}@{url[match.end() :]}"


# --- Redis ------------------------------------------------------------------------------

Topology = Literal["single", "sentinel", "cluster"]

_SINGLE_SCHEMES = ("redis", "rediss", "unix")
_MANY_SCHEMES: dict[str, tuple[Topology, bool]] = {
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
_DEFAULT_PORTS: dict[Topology, int] = {"single": 6379, "sentinel": 26379, "cluster": 6379}
#: The options a Sentinel or Cluster URL takes (TLS files and checks), only with `rediss+`.
TLS_OPTIONS = frozenset(
    {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname"}
)
_CERT_REQS = ("none", "optional", "required")
_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


@dataclass(frozen=True, kw_only=True)
class RedisTarget:
    """Where the state store lives, parsed from one URL.

    ``single``: one server (``redis://``, ``rediss://``, ``unix://``), reached as redis-py's
    ``from_url`` reads ``url`` (its query options included). ``sentinel``: the master named
    ``master`` as the sentinels at ``hosts`` report it, database ``db``. ``cluster``: a Redis
    Cluster discovered from the seed nodes ``hosts``. ``username``/``password`` authenticate
    to the servers holding data (a Sentinel's master and replicas, every Cluster node), never
    to the sentinels themselves. ``tls``: every connection (sentinels included) speaks TLS,
    with ``tls_options`` (redis-py's ``ssl_*`` arguments).
    """

    url: str
    topology: Topology
    tls: bool = False
    hosts: tuple[tuple[str, int], ...] = ()
    master: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls_options: tuple[tuple[str, str | bool], ...] = ()

    @property
    def default_min_replicas(self) -> int:
        """Replicas a write must reach before it is acted on, unless configured: none for a
        lone server, one where a failover can promote a replica."""
        return 0 if self.topology == "single" else 1

    def __repr__(self) -> str:
        return f"RedisTarget({redact_url(self.url)!r})"


def parse_redis_url(value: str, source: str = "LIFELONG_REDIS_URL") -> RedisTarget:
    """Parse a Redis URL; a bad one raises ConfigError naming ``source``, password masked.

    ``redis://``, ``rediss://``, ``unix://``: one server. ``redis+sentinel://`` (``rediss+``):
    ``[user:pass@]host:port[,host:port...]/<master-name>[/<db>]``, the sentinels' addresses
    (default port 26379). ``redis+cluster://`` (``rediss+``): ``[user:pass@]host:port[,...]``,
    seed nodes of a Cluster (default port 6379; a Cluster has only database 0).
    """
    shown = redact_url(value)
    scheme, sep, rest = value.partition("://")
    scheme = scheme.lower()
    if not sep or (scheme not in _SINGLE_SCHEMES and scheme not in _MANY_SCHEMES):
        wanted = ", ".join(f"{s}://" for s in (*_SINGLE_SCHEMES, *_MANY_SCHEMES))
        raise ConfigError(f"{source}: scheme of {shown!r} must be one of {wanted}")
    if scheme in _SINGLE_SCHEMES:
        return _parse_single(value, scheme, source)
    topology, tls = _MANY_SCHEMES[scheme]
    rest, _, query = rest.partition("?")
    userinfo, at, located = rest.rpartition("@")
    hostlist, _, path = located.partition("/")
    username, password = _credentials(userinfo) if at else (None, None)
    hosts = tuple(_host_port(h, topology, source) for h in hostlist.split(","))
    master, db = _path(path, topology, source, shown)
    return RedisTarget(
        url=value, topology=topology, tls=tls, hosts=hosts, master=master, db=db,
        username=username, password=password, tls_options=_tls_options(query, tls, source),
    )  # fmt: skip


def _parse_single(value: str, scheme: str, source: str) -> RedisTarget:
    shown = redact_url(value)
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as e:
        kind = "bad port" if "port" in str(e).lower() else "malformed"
        raise ConfigError(f"{source}: {shown!r} is not a valid URL ({kind})") from None
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"{source}: port {port} is outside 1..65535")
    if scheme == "unix":
        if not parts.path.startswith("/"):
            raise ConfigError(f"{source}: a unix:// Redis URL needs an absolute socket path")
        return RedisTarget(url=value, topology="single")
    if not parts.hostname:
        raise ConfigError(f"{source}: {shown!r} names no Redis host")
    database = parts.path.lstrip("/")
    if database and not database.isdigit():
        raise ConfigError(f"{source}: Redis database {database!r} is not a number")
    return RedisTarget(
        url=value,
        topology="single",
        tls=scheme == "rediss",
        hosts=((parts.hostname, port or _DEFAULT_PORTS["single"]),),
        db=int(database or 0),
    )


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    """``user:pass``, ``:pass`` or a bare ``pass`` (as redis-py reads a lone userinfo)."""
    user, colon, password = userinfo.partition(":")
    if not colon:
        return None, unquote(user) or None
    return unquote(user) or None, unquote(password) or None


def _host_port(text: str, topology: Topology, source: str) -> tuple[str, int]:
    what = "sentinel" if topology == "sentinel" else "cluster node"
    if text.startswith("["):
        host, bracket, port_text = text[1:].partition("]")
        if not bracket or (port_text and not port_text.startswith(":")):
            raise ConfigError(f"{source}: {what} address {text!r} is not [ipv6]:port")
        port_text = port_text[1:]
    else:
        host, _, port_text = text.partition(":")
        if ":" in port_text:
            raise ConfigError(f"{source}: {what} address {text!r}: IPv6 needs [addr]:port")
    if not host or any(c.isspace() or c in "/?#" for c in host):
        raise ConfigError(f"{source}: {what} address {text!r} names no host")
    if not port_text:
        return host, _DEFAULT_PORTS[topology]
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"{source}: {what} port {port_text!r} is not a number in 1..65535")
    return host, int(port_text)


def _path(path: str, topology: Topology, source: str, shown: str) -> tuple[str, int]:
    """(master name, database) from the path after the hosts."""
    parts = [unquote(p) for p in path.split("/")] if path else []
    if topology == "cluster":
        if parts not in ([], [""], ["0"]):
            raise ConfigError(
                f"{source}: a Redis Cluster has only database 0; {shown!r} names another path"
            )
        return "", 0
    if not parts or not parts[0]:
        raise ConfigError(
            f"{source}: {shown!r} names no master; write redis+sentinel://host:port/<master-name>"
        )
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ConfigError(
            f"{source}: after the master name {parts[0]!r} only a database number may follow"
        )
    return parts[0], int(parts[1]) if len(parts) == 2 else 0


def _tls_options(query: str, tls: bool, source: str) -> tuple[tuple[str, str | bool], ...]:
    options: list[tuple[str, str | bool]] = []
    for name, raw in parse_qsl(query, keep_blank_values=True):
        if name not in TLS_OPTIONS:
            allowed = ", ".join(sorted(TLS_OPTIONS))
            raise ConfigError(f"{source}: unknown option {name!r}; this URL takes {allowed}")
        if not tls:
            raise ConfigError(f"{source}: option {name!r} needs TLS (rediss+...://)")
        value: str | bool = raw
        if name == "ssl_cert_reqs":
            value = raw.lower()
            if value not in _CERT_REQS:
                raise ConfigError(f"{source}: ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}")
        elif name == "ssl_check_hostname":
            if raw.lower() not in _BOOLEANS:
                raise ConfigError(f"{source}: ssl_check_hostname must be true or false")
            value = _BOOLEANS[raw.lower()]
        elif not raw:
            raise ConfigError(f"{source}: option {name!r} has no value")
        options.append((name, value))
    return tuple(options)
