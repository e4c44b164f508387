"""Service configuration: environment variables, `lifelong serve` flags, Sedna fallbacks.

Every setting has one LIFELONG_ variable and one flag; a flag beats the variable, the
variable beats Sedna's own name (so a Sedna LC manifest works unchanged), and that beats the
default. A bad value stops start-up with a ConfigError of one line that names where the value
came from (variable or flag) and never echoes a password.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import socket
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from service.adapters.gm import parse_gm_address
from service.adapters.mqtt import PROTOCOL_WORDS, parse_mqtt_url
from service.core.paths import DataRoots, segments, system_dir_of
from service.errors import ConfigError
from service.urls import parse_redis_url

LogFormat = Literal["text", "json"]

_UPSTREAM_PLACEHOLDERS = frozenset({"prefix", "node", "namespace"})
_LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
_MAX_NODE_NAME_CHARS = 253
# DNS-1123 subdomain, case-insensitive because hostnames (our last fallback) may be upper case.
_NODE_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", re.IGNORECASE)
# Braces are excluded because key names carry a Redis Cluster hash tag `{ns/name}`.
_KEY_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:-]+")
_MIN_LEASE_S = 1.0
# RFC 6750's b64token; at least 16 characters so a guessable word is refused
_BEARER_TOKEN_RE = re.compile(r"[A-Za-z0-9._~+/-]{16,}=*")
_BEARER_TOKEN_RULE = (
    "a bearer token must be at least 16 letters, digits or - . _ ~ + / (then optional =)"
)
_KIB = 1 << 10
_SIZE_RE = re.compile(r"([0-9]+)\s*([KMGT]iB)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "kib": _KIB, "mib": _KIB**2, "gib": _KIB**3, "tib": _KIB**4}
_MIN_LINE_BYTES = 1 << 20  # one read block: lines are measured when they span blocks
_MAX_LINE_BYTES = 1 << 30
_HOSTNAME_VARIABLE = "HOSTNAME"


@dataclass(frozen=True, kw_only=True)
class Config:
    """Validated settings of one controller process; build it with `from_env` or `from_args`."""

    mqtt_url: str = "mqtt://127.0.0.1:1883"
    redis_url: str = "redis://127.0.0.1:6379/0"
    node_name: str
    topic_prefix: str = "sedna"
    upstream_topic: str = "{prefix}/{node}/upstream"
    volume_prefix: str = ""
    http_addr: str = "127.0.0.1:9100"
    key_prefix: str = "lifelong"
    redis_min_replicas: int | None = None
    dataset_poll_s: float = 60
    lease_s: float = 10
    log_format: LogFormat = "text"
    gm_address: str = ""
    http_token: str = dataclasses.field(default="", repr=False)
    http_token_file: str = ""
    data_roots: str = ""  # ':'-separated; empty: the volume prefix, else "/"
    max_model_bytes: int = 4 << 30
    max_line_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        """Validate again so a Config built directly (tests, tools) is as sound as a parsed one."""
        for setting in _SETTINGS:
            value = getattr(self, setting.field)
            if value is None:
                continue  # an optional setting left to its default
            setting.check(value if isinstance(value, str) else repr(value), setting.env)
        if self.http_token and self.http_token_file:
            raise ConfigError(
                "LIFELONG_HTTP_TOKEN and LIFELONG_HTTP_TOKEN_FILE: set one of them, not both"
            )

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str], overrides: Mapping[str, str | None] | None = None
    ) -> Config:
        """Read settings from `environ`; `overrides` (field name -> flag value) win when not None.

        An empty environment variable counts as unset (Kubernetes manifests often carry
        `value: ""`); an explicit empty flag is taken as given.
        """
        given = dict(overrides or {})
        unknown = sorted(set(given) - {s.field for s in _SETTINGS})
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        values: dict[str, object] = {}
        for setting in _SETTINGS:
            raw, source = _lookup(setting, environ, given.get(setting.field))
            if raw is not None:
                values[setting.field] = setting.parse(raw, source)
        if "node_name" not in values:
            values["node_name"] = _NODE_NAME.parse(socket.gethostname(), "hostname")
        return cls(**values)  # type: ignore[arg-type]

    def path_policy(self) -> DataRoots:
        """Where a job's local files may lie: the data roots (default: the volume prefix,
        the host's root as mounted, else "/") with the volume prefix."""
        if self.data_roots:
            roots = tuple(self.data_roots.split(":"))
        else:
            roots = (self.volume_prefix or "/",)
        return DataRoots(roots=roots, prefix=self.volume_prefix)

    def min_replicas(self) -> int:
        """Replicas a write must reach before it is acted on: as set, else 0 for a single
        Redis server and 1 behind Sentinel or in a Cluster."""
        if self.redis_min_replicas is not None:
            return self.redis_min_replicas
        return parse_redis_url(self.redis_url).default_min_replicas

    def upstream_topic_for(self, namespace: str) -> str:
        """The topic a status of a resource in `namespace` is published to."""
        return self.upstream_topic.format(
            prefix=self.topic_prefix, node=self.node_name, namespace=namespace
        )

    def downstream_topic(self) -> str:
        """Where the cloud sends resources for this node."""
        return f"{self.topic_prefix}/{self.node_name}/downstream"

    def upstream_topic_filter(self) -> str:
        """A subscription matching this node's upstream topic in every namespace: a level of
        the template that holds `{namespace}` becomes `+`."""
        levels = []
        for level in self.upstream_topic.split("/"):
            if "{namespace}" in level:
                levels.append("+")
            else:
                levels.append(level.format(prefix=self.topic_prefix, node=self.node_name))
        return "/".join(levels)

    def worker_topic_filter(self) -> str:
        """Subscription filter matching every worker's report topic on this node."""
        return f"{self.topic_prefix}/{self.node_name}/workers/+/info"

    def errors_topic(self) -> str:
        """Where rejected inbound messages are reported."""
        return f"{self.topic_prefix}/{self.node_name}/errors"

    def presence_topic(self, replica: str) -> str:
        """Retained online/offline topic of one controller replica."""
        return f"{self.topic_prefix}/{self.node_name}/controllers/{replica}"

    def presence_filter_all_nodes(self) -> str:
        """A subscription matching every replica's presence topic, on every node."""
        return f"{self.topic_prefix}/+/controllers/+"

    def node_of_presence_topic(self, topic: str) -> str | None:
        """The node a presence topic belongs to (None: not a presence topic under our prefix)."""
        levels = topic.split("/")
        is_presence = len(levels) == 4 and levels[0] == self.topic_prefix
        return levels[1] if is_presence and levels[2] == "controllers" else None

    def for_node(self, node_name: str) -> Config:
        """The same settings for another node (its topics), checked like any node name."""
        return dataclasses.replace(self, node_name=node_name)

    def http_host_port(self) -> tuple[str, int]:
        """The HTTP listen address split for `socket.bind` (IPv6 brackets removed)."""
        return _split_host_port(self.http_addr, "LIFELONG_HTTP_ADDR")

    def http_bearer_token(self) -> str:
        """The token HTTP clients must present ("" for none): the setting or the file's content.

        The file is read on every call, so a caller reads it once, at start-up.
        """
        if self.http_token_file:
            return _read_token_file(self.http_token_file, "LIFELONG_HTTP_TOKEN_FILE")
        return self.http_token


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting; each defaults to None so an absent flag leaves env in charge."""
    for setting in _SETTINGS:
        names = " / ".join((setting.env, *setting.fallbacks))
        parser.add_argument(
            setting.flag,
            dest=setting.field,
            default=None,
            metavar=setting.metavar,
            help=f"{setting.doc} (env {names}; default {setting.default_doc})",
        )


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Config:
    """Build a Config from parsed flags (added by `add_arguments`) over `environ`."""
    return Config.from_env(environ, _flag_values(args))


def _flag_values(args: argparse.Namespace) -> dict[str, str | None]:
    return {s.field: cast("str | None", getattr(args, s.field, None)) for s in _SETTINGS}


def node_name_chosen(args: argparse.Namespace, environ: Mapping[str, str]) -> bool:
    """Whether someone chose the node name: its flag, LIFELONG_NODE_NAME or NODENAME. The
    host name and HOSTNAME (set in every container) are fallbacks, not choices."""
    raw, source = _lookup(_NODE_NAME, environ, _flag_values(args)["node_name"])
    return raw is not None and source != _HOSTNAME_VARIABLE


def environment(cfg: Config, fields: Iterable[str]) -> dict[str, str]:
    """The variables that give another process these settings of `cfg`: {name: value}."""
    names = {s.field: s.env for s in _SETTINGS}
    return {names[f]: str(getattr(cfg, f)) for f in fields}


# --- parsing and validation, one function per kind of value -------------------------------


def _lookup(
    setting: _Setting, environ: Mapping[str, str], flag_value: str | None
) -> tuple[str | None, str]:
    """The raw value of a setting and the name of the place it came from."""
    if flag_value is not None:
        return flag_value, setting.flag
    for name in (setting.env, *setting.fallbacks):
        value = environ.get(name, "")
        if value != "":
            return value, name
    return None, setting.env


def _parse_mqtt_url(value: str, source: str) -> str:
    """Checked by the MQTT adapter's own parser, so config accepts exactly what it connects to."""
    try:
        parse_mqtt_url(value)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return value


def _parse_redis_url(value: str, source: str) -> str:
    parse_redis_url(value, source)
    return value


def _parse_min_replicas(value: str, source: str) -> int:
    if not value.strip().isdigit():
        raise ConfigError(f"{source}: {value!r} is not a whole number of replicas (0 or more)")
    return int(value)


def _topic_level_problem(value: str, what: str) -> str | None:
    if not value:
        return f"{what} must not be empty"
    bad = sorted(set(value) & {"+", "#", "/", "\0"})
    if bad:
        return f"{what} {value!r} must not contain {' '.join(bad)!r}"
    if value.startswith("$"):
        return f"{what} {value!r} must not start with '$' (broker-reserved)"
    return None


def node_name_problem(value: str) -> str | None:
    """Why `value` cannot name an edge node (it is a topic level and a DNS-1123 name), or
    None when it can: the one rule for node names, wherever one is given."""
    problem = _topic_level_problem(value, "node name")
    if problem is None and (
        len(value) > _MAX_NODE_NAME_CHARS or not _NODE_NAME_RE.fullmatch(value)
    ):
        problem = (
            f"node name {value!r} is not a DNS-1123 name "
            "(letters, digits, '-' and '.', starting and ending alphanumeric)"
        )
    return problem


def _parse_node_name(value: str, source: str) -> str:
    problem = node_name_problem(value)
    if problem is not None:
        raise ConfigError(f"{source}: {problem}")
    return value


def _parse_topic_prefix(value: str, source: str) -> str:
    problem = _topic_level_problem(value, "topic prefix")
    if problem is not None:
        raise ConfigError(f"{source}: {problem}")
    return value


def _parse_upstream_template(value: str, source: str) -> str:
    try:
        parsed = list(string.Formatter().parse(value))
    except ValueError as e:
        raise ConfigError(f"{source}: template {value!r} is malformed ({e})") from None
    for literal, field, spec, conversion in parsed:
        if set(literal) & {"+", "#", "\0"}:
            raise ConfigError(f"{source}: template {value!r} must not contain wildcards + or #")
        if field is None:
            continue
        if field not in _UPSTREAM_PLACEHOLDERS or spec or conversion:
            allowed = ", ".join(f"{{{p}}}" for p in sorted(_UPSTREAM_PLACEHOLDERS))
            raise ConfigError(
                f"{source}: unknown placeholder {{{field}}} in {value!r}; allowed: {allowed}"
            )
    if not value.strip() or value.startswith("$"):
        raise ConfigError(f"{source}: template {value!r} must be non-empty and not start with $")
    return value


def _parse_volume_prefix(value: str, source: str) -> str:
    """Absolute or empty; a trailing '/' is dropped so joining with a local path is plain."""
    if value == "":
        return value
    if not value.startswith("/"):
        raise ConfigError(f"{source}: volume prefix {value!r} must be an absolute path or empty")
    if ".." in value.split("/") or "\0" in value:
        raise ConfigError(f"{source}: volume prefix {value!r} must not contain '..'")
    return value.rstrip("/")


def _split_host_port(value: str, source: str) -> tuple[str, int]:
    """Parse `host:port`, `[v6]:port`, `:port` or a bare port (all interfaces, as Sedna binds)."""
    if value.isdigit():
        host, port_text = "0.0.0.0", value
    elif value.startswith("["):
        inner, bracket, port_text = value[1:].partition("]:")
        host = inner
        if not bracket or not inner:
            raise ConfigError(f"{source}: {value!r} is not [ipv6]:port")
    else:
        host, colon, port_text = value.rpartition(":")
        if not colon or ":" in host:
            raise ConfigError(f"{source}: {value!r} is not host:port (IPv6 needs [addr]:port)")
        host = host or "0.0.0.0"
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{source}: port {port_text!r} is not a number in 0..65535 (0: any free)")
    if any(c.isspace() for c in host):
        raise ConfigError(f"{source}: host {host!r} contains white space")
    return host, int(port_text)


def _parse_http_addr(value: str, source: str) -> str:
    host, port = _split_host_port(value, source)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_key_prefix(value: str, source: str) -> str:
    if not _KEY_PREFIX_RE.fullmatch(value):
        raise ConfigError(
            f"{source}: key prefix {value!r} must be non-empty letters, digits or _ . : -"
        )
    return value


def _parse_seconds(value: str, source: str, minimum_s: float) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{source}: {value!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds <= 0 or seconds < minimum_s:
        floor = f">= {minimum_s:g}" if minimum_s > 0 else "> 0"
        raise ConfigError(f"{source}: {value!r} seconds must be finite and {floor}")
    return seconds


def _parse_poll_seconds(value: str, source: str) -> float:
    return _parse_seconds(value, source, 0.0)


def _parse_lease_seconds(value: str, source: str) -> float:
    return _parse_seconds(value, source, _MIN_LEASE_S)


def _parse_gm_address(value: str, source: str) -> str:
    """Empty (no GM link), Sedna's `host:port`, or a ws:// / wss:// URL (TLS files in its query)."""
    if value == "":
        return value
    try:
        parse_gm_address(value)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return value.strip()


def _parse_log_format(value: str, source: str) -> LogFormat:
    lowered = value.strip().lower()
    for fmt in _LOG_FORMATS:
        if lowered == fmt:
            return fmt
    raise ConfigError(f"{source}: log format {value!r} must be one of {', '.join(_LOG_FORMATS)}")


def _parse_bearer_token(value: str, source: str) -> str:
    """Empty (no token required) or an RFC 6750 token; the value is never echoed."""
    if value and not _BEARER_TOKEN_RE.fullmatch(value):
        raise ConfigError(f"{source}: {_BEARER_TOKEN_RULE}")
    return value


def _read_token_file(path: str, source: str) -> str:
    """The token a file holds (surrounding white space and the final newline dropped)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else "not readable as UTF-8"
        raise ConfigError(f"{source}: cannot read {path!r}: {why}") from None
    token = text.strip()
    if not token:
        raise ConfigError(f"{source}: {path!r} is empty")
    if not _BEARER_TOKEN_RE.fullmatch(token):
        raise ConfigError(f"{source}: {path!r} holds no valid token: {_BEARER_TOKEN_RULE}")
    return token


def _parse_token_file(value: str, source: str) -> str:
    """Empty or a readable file holding a valid token (read now so start-up fails early)."""
    if value:
        _read_token_file(value, source)
    return value


def _parse_data_roots(value: str, source: str) -> str:
    """':'-separated absolute directories (as PATH), each normalized to no trailing '/';
    empty for the default. A system directory cannot be a root: nothing beneath it is
    allowed anyway."""
    if value == "":
        return value
    roots: list[str] = []
    for root in value.split(":"):
        parts = segments(root)
        if not root or parts is None:
            raise ConfigError(
                f"{source}: data root {root!r} must be an absolute path without '..' "
                "(roots are separated by ':')"
            )
        normal = "/" + "/".join(parts)
        system = system_dir_of(normal)
        if system not in (None, "/"):
            raise ConfigError(f"{source}: data root {root!r} is in the system directory {system}")
        roots.append(normal)
    return ":".join(roots)


def _parse_bytes(value: str, source: str, minimum: int, maximum: int) -> int:
    """A byte count: digits with an optional KiB, MiB, GiB or TiB."""
    match = _SIZE_RE.fullmatch(value.strip())
    if match is None:
        raise ConfigError(f"{source}: {value!r} is not a size (bytes, or with KiB/MiB/GiB/TiB)")
    size = int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").lower()]
    if not minimum <= size <= maximum:
        raise ConfigError(f"{source}: {value!r} must be between {minimum} and {maximum} bytes")
    return size


def _parse_model_bytes(value: str, source: str) -> int:
    return _parse_bytes(value, source, 1, 2**63 - 1)


def _parse_line_bytes(value: str, source: str) -> int:
    return _parse_bytes(value, source, _MIN_LINE_BYTES, _MAX_LINE_BYTES)


@dataclass(frozen=True)
class _Setting:
    """One configurable value: where it is read from and how it is parsed."""

    field: str
    env: str
    flag: str
    parser: Callable[[str, str], object]
    doc: str
    default_doc: str
    metavar: str
    fallbacks: tuple[str, ...] = ()

    def parse(self, raw: str, source: str) -> object:
        return self.parser(raw, source)

    def check(self, value: str, source: str) -> None:
        """Validate an already-typed value (rendered as text) for `Config.__post_init__`."""
        self.parser(value, source)


_NODE_NAME = _Setting(
    "node_name", "LIFELONG_NODE_NAME", "--node-name", _parse_node_name,
    "the edge node this controller serves", "the host name", "NAME",
    ("NODENAME", _HOSTNAME_VARIABLE),
)  # fmt: skip

_SETTINGS: tuple[_Setting, ...] = (
    _Setting(
        "mqtt_url", "LIFELONG_MQTT_URL", "--mqtt-url", _parse_mqtt_url,
        "MQTT broker URL (mqtts:// for TLS, user:pass@ for auth, ?protocol=5 or "
        f"?protocol=3.1.1 to pin the version; accepted: {', '.join(PROTOCOL_WORDS)})",
        "mqtt://127.0.0.1:1883", "URL",
    ),
    _Setting(
        "redis_url", "LIFELONG_REDIS_URL", "--redis-url", _parse_redis_url,
        "Redis URL: redis:// (rediss:// for TLS, unix:// for a socket), "
        "redis+sentinel://host:port[,...]/<master>[/<db>] or redis+cluster://host:port[,...]",
        "redis://127.0.0.1:6379/0", "URL",
    ),
    _Setting(
        "redis_min_replicas", "LIFELONG_REDIS_MIN_REPLICAS", "--redis-min-replicas",
        _parse_min_replicas,
        "replicas (Redis WAIT) that must hold a write before it is acknowledged or acted on",
        "0 for one server, 1 for Sentinel and Cluster", "N",
    ),
    _NODE_NAME,
    _Setting(
        "topic_prefix", "LIFELONG_TOPIC_PREFIX", "--topic-prefix", _parse_topic_prefix,
        "first level of every topic", "sedna", "LEVEL",
    ),
    _Setting(
        "upstream_topic", "LIFELONG_UPSTREAM_TOPIC", "--upstream-topic", _parse_upstream_template,
        "upstream topic template; placeholders {prefix} {node} {namespace}",
        "{prefix}/{node}/upstream", "TEMPLATE",
    ),
    _Setting(
        "volume_prefix", "LIFELONG_VOLUME_PREFIX", "--volume-prefix", _parse_volume_prefix,
        "host root mount added to local paths", "empty", "DIR", ("ROOTFS_MOUNT_DIR",),
    ),
    _Setting(
        "http_addr", "LIFELONG_HTTP_ADDR", "--http-addr", _parse_http_addr,
        "HTTP listen address host:port (a bare port listens on all interfaces)",
        "127.0.0.1:9100", "ADDR", ("BIND_PORT",),
    ),
    _Setting(
        "key_prefix", "LIFELONG_KEY_PREFIX", "--key-prefix", _parse_key_prefix,
        "Redis key namespace", "lifelong", "PREFIX",
    ),
    _Setting(
        "dataset_poll_s", "LIFELONG_DATASET_POLL_SECONDS", "--dataset-poll-seconds",
        _parse_poll_seconds, "seconds between dataset source checks", "60", "SECONDS",
    ),
    _Setting(
        "lease_s", "LIFELONG_LEASE_SECONDS", "--lease-seconds", _parse_lease_seconds,
        "lease time-to-live in seconds (>= 1)", "10", "SECONDS",
    ),
    _Setting(
        "log_format", "LIFELONG_LOG_FORMAT", "--log-format", _parse_log_format,
        "log line format: text or json", "text", "FORMAT",
    ),
    _Setting(
        "gm_address", "LIFELONG_GM_ADDRESS", "--gm-address", _parse_gm_address,
        "Sedna GM websocket: host:port, ws:// or wss:// URL (wss: ?ca=&cert=&key=)",
        "unset: no GM link", "ADDR", ("GM_ADDRESS",),
    ),
    _Setting(
        "http_token", "LIFELONG_HTTP_TOKEN", "--http-token", _parse_bearer_token,
        "bearer token the worker endpoint and /metrics then require (a flag shows in ps: "
        "prefer the variable or the file)", "none: open, as Sedna's worker library sends none",
        "TOKEN",
    ),
    _Setting(
        "http_token_file", "LIFELONG_HTTP_TOKEN_FILE", "--http-token-file", _parse_token_file,
        "file holding that token, e.g. a mounted Kubernetes secret (read at start-up)", "none",
        "FILE",
    ),
    _Setting(
        "data_roots", "LIFELONG_DATA_ROOTS", "--data-roots", _parse_data_roots,
        "':'-separated directories a job's local files (datasets, output dirs, models) must "
        "lie under", "the volume prefix if set, else /", "DIRS",
    ),
    _Setting(
        "max_model_bytes", "LIFELONG_MAX_MODEL_BYTES", "--max-model-bytes", _parse_model_bytes,
        "largest model the deploy copy takes (bytes, or with KiB/MiB/GiB)", "4GiB", "SIZE",
    ),
    _Setting(
        "max_line_bytes", "LIFELONG_MAX_LINE_BYTES", "--max-line-bytes", _parse_line_bytes,
        "longest dataset line (1MiB..1GiB); a longer one stops the dataset with a reason",
        "1MiB", "SIZE",
    ),
)  # fmt: skip
