"""The settings table: every setting's field, LIFELONG_ variable, flag, Sedna fallbacks,
parser and help; where a setting's raw value is looked up; and how each kind of value is
parsed and checked (one function per kind of value).

A flag beats the variable, the variable beats Sedna's own name (so a Sedna LC manifest works
unchanged), and an empty variable counts as unset.

A parser takes the raw text and the name of the place it came from (a variable or a flag)
and returns the typed value or raises a ConfigError of one line that names that place and
never echoes a secret. `Config.__post_init__` runs the same parsers on the typed values, so a
Config built directly is as sound as a parsed one.
"""


import math
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from service import urls
from service.adapters import broker_url, gm_link
from service.adapters.broker_url import PROTOCOL_WORDS
from service.core.paths import segments, system_dir_of
from service.errors import ConfigError

LogFormat = Literal["text", "json"]

_UPSTREAM_PLACEHOLDERS = frozenset({"prefix", "node", "namespace"})
_LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
_MAX_NODE_NAME_CHARS = 253
# DNS-1123 subdomain, case-insensitive because hostnames (our last fallback) may be upper case.
_NODE_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", re.IGNORECASE)
# Braces are excluded because key names carry Redis Cluster hash tags (`{s<N>}`, `{ingress}`).
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
_MIN_RESOURCE_BYTES = 1 << 10
_MAX_RESOURCE_BYTES = 1 << 30
#: An effect run on the processor's thread holds back every other event of its pass: a
#: bigger one belongs in the pool.
_MAX_INLINE_BYTES = 64 << 20


def parse_mqtt_url(value: str, source: str) -> str:
    """Checked by the MQTT adapter's own parser, so config accepts exactly what it connects to."""
    try:
        broker_url.parse_mqtt_url(value)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return value


def parse_redis_url(value: str, source: str) -> str:
    urls.parse_redis_url(value, source)
    return value


def parse_min_replicas(value: str, source: str) -> int:
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


def parse_node_name(value: str, source: str) -> str:
    problem = node_name_problem(value)
    if problem is not None:
        raise ConfigError(f"{source}: {problem}")
    return value


def parse_topic_prefix(value: str, source: str) -> str:
    problem = _topic_level_problem(value, "topic prefix")
    if problem is not None:
        raise ConfigError(f"{source}: {problem}")
    return value


def parse_upstream_template(value: str, source: str) -> str:
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


def parse_volume_prefix(value: str, source: str) -> str:
    """Absolute or empty; a trailing '/' is dropped so joining with a local path is plain."""
    if value == "":
        return value
    if not value.startswith("/"):
        raise ConfigError(f"{source}: volume prefix {value!r} must be an absolute path or empty")
    if ".." in value.split("/") or "\0" in value:
        raise ConfigError(f"{source}: volume prefix {value!r} must not contain '..'")
    return value.rstrip("/")


def split_host_port(value: str, source: str) -> tuple[str, int]:
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


def parse_http_addr(value: str, source: str) -> str:
    host, port = split_host_port(value, source)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_allowed_hosts(value: str, source: str) -> str:
    """','-separated host names (DNS names, compared in lower case), `*` for any host, or
    empty for none; normalized to lower case without white space or a final dot."""
    if value.strip() == "":
        return ""
    names = [name.strip().lower().rstrip(".") for name in value.split(",")]
    if names == ["*"]:
        return "*"
    for name in names:
        if len(name) > _MAX_NODE_NAME_CHARS or not _NODE_NAME_RE.fullmatch(name):
            raise ConfigError(
                f"{source}: {name!r} is not a host name (letters, digits, '-' and '.'; "
                "names separated by ',', or '*' for any host)"
            )
    return ",".join(names)


def parse_key_prefix(value: str, source: str) -> str:
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


def parse_poll_seconds(value: str, source: str) -> float:
    return _parse_seconds(value, source, 0.0)


def parse_lease_seconds(value: str, source: str) -> float:
    return _parse_seconds(value, source, _MIN_LEASE_S)


def parse_gm_address(value: str, source: str) -> str:
    """Empty (no GM link), Sedna's `host:port`, or a ws:// / wss:// URL (TLS files in its query)."""
    if value == "":
        return value
    try:
        gm_link.parse_gm_address(value)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return value.strip()


def parse_log_format(value: str, source: str) -> LogFormat:
    lowered = value.strip().lower()
    for fmt in _LOG_FORMATS:
        if lowered == fmt:
            return fmt
    raise ConfigError(f"{source}: log format {value!r} must be one of {', '.join(_LOG_FORMATS)}")


def parse_bearer_token(value: str, source: str) -> str:
    """Empty (no token required) or an RFC 6750 token; the value is never echoed."""
    if value and not _BEARER_TOKEN_RE.fullmatch(value):
        raise ConfigError(f"{source}: {_BEARER_TOKEN_RULE}")
    return value


def read_token_file(path: str, source: str) -> str:
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


def parse_token_file(value: str, source: str) -> str:
    """Empty or a readable file holding a valid token (read now so start-up fails early)."""
    if value:
        read_token_file(value, source)
    return value


def parse_data_roots(value: str, source: str) -> str:
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


def parse_model_bytes(value: str, source: str) -> int:
    return _parse_bytes(value, source, 1, 2**63 - 1)


def parse_inline_bytes(value: str, source: str) -> int:
    return _parse_bytes(value, source, 0, _MAX_INLINE_BYTES)


def parse_rounds_kept(value: str, source: str) -> int:
    """A count of rounds, at least 1 (the round being written)."""
    if not value.strip().isdecimal() or int(value) < 1:
        raise ConfigError(f"{source}: {value!r} is not a whole number of rounds >= 1")
    return int(value)


def parse_line_bytes(value: str, source: str) -> int:
    return _parse_bytes(value, source, _MIN_LINE_BYTES, _MAX_LINE_BYTES)


def parse_resource_count(value: str, source: str) -> int:
    """How many resources may be kept: a whole number, at least 1."""
    text = value.strip()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{source}: {value!r} is not a whole number of resources (1 or more)")
    return int(text)


def parse_resource_bytes(value: str, source: str) -> int:
    return _parse_bytes(value, source, _MIN_RESOURCE_BYTES, _MAX_RESOURCE_BYTES)


@dataclass(frozen=True)
class Setting:
    """One configurable value: where it is read from and how it is parsed."""

    field: str
    flag: str
    parser: Callable[[str, str], object]
    doc: str
    default_doc: str
    metavar: str
    fallbacks: tuple[str, ...] = ()
    #: a secret: its flag is refused, since a flag shows in the process list
    secret: bool = False

    @property
    def env(self) -> str:
        """Its variable, named after its flag: `--lease-seconds` is LIFELONG_LEASE_SECONDS."""
        return "LIFELONG_" + self.flag.removeprefix("--").upper().replace("-", "_")

    def parse(self, raw: str, source: str) -> object:
        return self.parser(raw, source)

    def check(self, value: str, source: str) -> None:
        """Validate an already-typed value (rendered as text) for `Config.__post_init__`."""
        self.parser(value, source)


def lookup(
    setting: Setting, environ: Mapping[str, str], flag_value: str | None
) -> tuple[str | None, str]:
    """The raw value of a setting and the name of the place it came from."""
    if flag_value is not None:
        return flag_value, setting.flag
    for name in (setting.env, *setting.fallbacks):
        value = environ.get(name, "")
        if value != "":
            return value, name
    return None, setting.env


#: Set in every container: a fallback for the node name, never a choice of one.
HOSTNAME_VARIABLE = "HOSTNAME"

NODE_NAME = Setting(
    "node_name", "--node-name", parse_node_name,
    "the edge node this controller serves", "the host name", "NAME",
    ("NODENAME", HOSTNAME_VARIABLE),
)  # fmt: skip

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "mqtt_url", "--mqtt-url", parse_mqtt_url,
        "MQTT broker URL (mqtts:// for TLS, user:pass@ for auth, ?protocol=5 or "
        f"?protocol=3.1.1 to pin the version; accepted: {', '.join(PROTOCOL_WORDS)})",
        "mqtt://127.0.0.1:1883", "URL",
    ),
    Setting(
        "redis_url", "--redis-url", parse_redis_url,
        "Redis URL: redis:// (rediss:// for TLS, unix:// for a socket), "
        "redis+sentinel://host:port[,...]/<master>[/<db>] or redis+cluster://host:port[,...]",
        "redis://127.0.0.1:6379/0", "URL",
    ),
    Setting(
        "redis_min_replicas", "--redis-min-replicas", parse_min_replicas,
        "replicas (Redis WAIT) that must hold a write before it is acknowledged or acted on",
        "0 for one server, 1 for Sentinel and Cluster", "N",
    ),
    NODE_NAME,
    Setting(
        "topic_prefix", "--topic-prefix", parse_topic_prefix,
        "first level of every topic", "sedna", "LEVEL",
    ),
    Setting(
        "upstream_topic", "--upstream-topic", parse_upstream_template,
        "upstream topic template; placeholders {prefix} {node} {namespace}",
        "{prefix}/{node}/upstream", "TEMPLATE",
    ),
    Setting(
        "volume_prefix", "--volume-prefix", parse_volume_prefix,
        "host root mount added to local paths", "empty", "DIR", ("ROOTFS_MOUNT_DIR",),
    ),
    Setting(
        "http_addr", "--http-addr", parse_http_addr,
        "HTTP listen address host:port (a bare port listens on all interfaces)",
        "127.0.0.1:9100", "ADDR", ("BIND_PORT",),
    ),
    Setting(
        "http_allowed_hosts", "--http-allowed-hosts", parse_allowed_hosts,
        "','-separated host names the worker endpoint and /metrics answer to (the Host "
        "header) when no token is required, besides localhost, the listen address and any "
        "IP address; '*' for any (a name a browser page can reach is open to DNS rebinding)",
        "none beyond those", "HOSTS",
    ),
    Setting(
        "key_prefix", "--key-prefix", parse_key_prefix,
        "Redis key namespace", "lifelong", "PREFIX",
    ),
    Setting(
        "dataset_poll_s", "--dataset-poll-seconds", parse_poll_seconds,
        "seconds between dataset source checks", "60", "SECONDS",
    ),
    Setting(
        "lease_s", "--lease-seconds", parse_lease_seconds,
        "lease time-to-live in seconds (>= 1)", "10", "SECONDS",
    ),
    Setting(
        "log_format", "--log-format", parse_log_format,
        "log line format: text or json", "text", "FORMAT",
    ),
    Setting(
        "gm_address", "--gm-address", parse_gm_address,
        "Sedna GM websocket: host:port, ws:// or wss:// URL (wss: ?ca=&cert=&key=)",
        "unset: no GM link", "ADDR", ("GM_ADDRESS",),
    ),
    Setting(
        "gm_resend_s", "--gm-resend-seconds", parse_poll_seconds,
        "seconds a ready sent to Sedna's GM may go unseen (the GM still shows the stage "
        "Waiting) before it is sent again", "30", "SECONDS",
    ),
    Setting(
        "http_token", "--http-token", parse_bearer_token,
        "bearer token the worker endpoint and /metrics then require (no flag: a flag shows "
        "in the process list)", "none: open, as Sedna's worker library sends none",
        "TOKEN", secret=True,
    ),
    Setting(
        "http_token_file", "--http-token-file", parse_token_file,
        "file holding that token, e.g. a mounted Kubernetes secret (read at start-up)", "none",
        "FILE",
    ),
    Setting(
        "data_roots", "--data-roots", parse_data_roots,
        "':'-separated directories a job's local files (datasets, output dirs, models) must "
        "lie under (resolved once at start; a root in a directory others can change is "
        "refused)",
        "/data:/output:/models:/var/lib/sedna/model-hot-update under the volume prefix", "DIRS",
    ),
    Setting(
        "max_model_bytes", "--max-model-bytes", parse_model_bytes,
        "largest model the deploy copy takes (bytes, or with KiB/MiB/GiB)", "4GiB", "SIZE",
    ),
    Setting(
        "max_line_bytes", "--max-line-bytes", parse_line_bytes,
        "longest dataset line (1MiB..1GiB); a longer one stops the dataset with a reason",
        "1MiB", "SIZE",
    ),
    Setting(
        "max_dataset_bytes", "--max-dataset-bytes", parse_model_bytes,
        "largest dataset (its size, holes included); a larger one is reported unreadable",
        "64GiB", "SIZE",
    ),
    Setting(
        "max_round_bytes", "--max-round-bytes", parse_model_bytes,
        "most bytes one round's data files may hold; a larger round fails with the reason",
        "16GiB", "SIZE",
    ),
    Setting(
        "inline_effect_bytes", "--inline-effect-bytes", parse_inline_bytes,
        "a local round file or model copy whose source holds at most this many bytes (up "
        "to 64MiB) runs before the commit of the event that asks for it, its result applied "
        "in that commit (one commit instead of two); 0: every effect runs after its commit",
        "1MiB", "SIZE",
    ),
    Setting(
        "rounds_kept", "--rounds-kept", parse_rounds_kept,
        "rounds whose local data files are kept (the newest; the deployed round's and those "
        "a rollback can restore are kept too)", "3", "N",
    ),
    Setting(
        "max_resources", "--max-resources", parse_resource_count,
        "most jobs, datasets and other resources the node keeps; an insert of a new one "
        "beyond is refused (an update is not)", "20000", "N",
    ),
    Setting(
        "max_namespace_resources", "--max-namespace-resources", parse_resource_count,
        "most resources the node keeps of one namespace, the same way", "20000", "N",
    ),
    Setting(
        "max_resource_bytes", "--max-resource-bytes", parse_resource_bytes,
        "largest resource kept (its JSON; bytes, or with KiB/MiB); a larger one is refused",
        "512KiB", "SIZE",
    ),
)  # fmt: skip
