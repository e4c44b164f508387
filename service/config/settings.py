"""The settings table: every setting's field, LIFELONG_ variable, flag, Sedna fallbacks,
parser and help, and where a setting's raw value is looked up.

A flag beats the variable, the variable beats Sedna's own name (so a Sedna LC manifest works
unchanged), and an empty variable counts as unset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from service.adapters.broker_url import PROTOCOL_WORDS
from service.config import values


@dataclass(frozen=True)
class Setting:
    """One configurable value: where it is read from and how it is parsed."""

    field: str
    env: str
    flag: str
    parser: Callable[[str, str], object]
    doc: str
    default_doc: str
    metavar: str
    fallbacks: tuple[str, ...] = ()
    #: a secret: its flag is refused, since a flag shows in the process list
    secret: bool = False

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
    "node_name", "LIFELONG_NODE_NAME", "--node-name", values.parse_node_name,
    "the edge node this controller serves", "the host name", "NAME",
    ("NODENAME", HOSTNAME_VARIABLE),
)  # fmt: skip

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "mqtt_url", "LIFELONG_MQTT_URL", "--mqtt-url", values.parse_mqtt_url,
        "MQTT broker URL (mqtts:// for TLS, user:pass@ for auth, ?protocol=5 or "
        f"?protocol=3.1.1 to pin the version; accepted: {', '.join(PROTOCOL_WORDS)})",
        "mqtt://127.0.0.1:1883", "URL",
    ),
    Setting(
        "redis_url", "LIFELONG_REDIS_URL", "--redis-url", values.parse_redis_url,
        "Redis URL: redis:// (rediss:// for TLS, unix:// for a socket), "
        "redis+sentinel://host:port[,...]/<master>[/<db>] or redis+cluster://host:port[,...]",
        "redis://127.0.0.1:6379/0", "URL",
    ),
    Setting(
        "redis_min_replicas", "LIFELONG_REDIS_MIN_REPLICAS", "--redis-min-replicas",
        values.parse_min_replicas,
        "replicas (Redis WAIT) that must hold a write before it is acknowledged or acted on",
        "0 for one server, 1 for Sentinel and Cluster", "N",
    ),
    NODE_NAME,
    Setting(
        "topic_prefix", "LIFELONG_TOPIC_PREFIX", "--topic-prefix", values.parse_topic_prefix,
        "first level of every topic", "sedna", "LEVEL",
    ),
    Setting(
        "upstream_topic", "LIFELONG_UPSTREAM_TOPIC", "--upstream-topic",
        values.parse_upstream_template,
        "upstream topic template; placeholders {prefix} {node} {namespace}",
        "{prefix}/{node}/upstream", "TEMPLATE",
    ),
    Setting(
        "volume_prefix", "LIFELONG_VOLUME_PREFIX", "--volume-prefix", values.parse_volume_prefix,
        "host root mount added to local paths", "empty", "DIR", ("ROOTFS_MOUNT_DIR",),
    ),
    Setting(
        "http_addr", "LIFELONG_HTTP_ADDR", "--http-addr", values.parse_http_addr,
        "HTTP listen address host:port (a bare port listens on all interfaces)",
        "127.0.0.1:9100", "ADDR", ("BIND_PORT",),
    ),
    Setting(
        "http_allowed_hosts", "LIFELONG_HTTP_ALLOWED_HOSTS", "--http-allowed-hosts",
        values.parse_allowed_hosts,
        "','-separated host names the worker endpoint and /metrics answer to (the Host "
        "header) when no token is required, besides localhost, the listen address and any "
        "IP address; '*' for any (a name a browser page can reach is open to DNS rebinding)",
        "none beyond those", "HOSTS",
    ),
    Setting(
        "key_prefix", "LIFELONG_KEY_PREFIX", "--key-prefix", values.parse_key_prefix,
        "Redis key namespace", "lifelong", "PREFIX",
    ),
    Setting(
        "dataset_poll_s", "LIFELONG_DATASET_POLL_SECONDS", "--dataset-poll-seconds",
        values.parse_poll_seconds, "seconds between dataset source checks", "60", "SECONDS",
    ),
    Setting(
        "lease_s", "LIFELONG_LEASE_SECONDS", "--lease-seconds", values.parse_lease_seconds,
        "lease time-to-live in seconds (>= 1)", "10", "SECONDS",
    ),
    Setting(
        "log_format", "LIFELONG_LOG_FORMAT", "--log-format", values.parse_log_format,
        "log line format: text or json", "text", "FORMAT",
    ),
    Setting(
        "gm_address", "LIFELONG_GM_ADDRESS", "--gm-address", values.parse_gm_address,
        "Sedna GM websocket: host:port, ws:// or wss:// URL (wss: ?ca=&cert=&key=)",
        "unset: no GM link", "ADDR", ("GM_ADDRESS",),
    ),
    Setting(
        "gm_resend_s", "LIFELONG_GM_RESEND_SECONDS", "--gm-resend-seconds",
        values.parse_poll_seconds,
        "seconds a ready sent to Sedna's GM may go unseen (the GM still shows the stage "
        "Waiting) before it is sent again", "30", "SECONDS",
    ),
    Setting(
        "http_token", "LIFELONG_HTTP_TOKEN", "--http-token", values.parse_bearer_token,
        "bearer token the worker endpoint and /metrics then require (no flag: a flag shows "
        "in the process list)", "none: open, as Sedna's worker library sends none",
        "TOKEN", secret=True,
    ),
    Setting(
        "http_token_file", "LIFELONG_HTTP_TOKEN_FILE", "--http-token-file", values.parse_token_file,
        "file holding that token, e.g. a mounted Kubernetes secret (read at start-up)", "none",
        "FILE",
    ),
    Setting(
        "data_roots", "LIFELONG_DATA_ROOTS", "--data-roots", values.parse_data_roots,
        "':'-separated directories a job's local files (datasets, output dirs, models) must "
        "lie under (resolved once at start; a root in a directory others can change is "
        "refused)", "/data:/output:/models under the volume prefix", "DIRS",
    ),
    Setting(
        "max_model_bytes", "LIFELONG_MAX_MODEL_BYTES", "--max-model-bytes",
        values.parse_model_bytes,
        "largest model the deploy copy takes (bytes, or with KiB/MiB/GiB)", "4GiB", "SIZE",
    ),
    Setting(
        "max_line_bytes", "LIFELONG_MAX_LINE_BYTES", "--max-line-bytes", values.parse_line_bytes,
        "longest dataset line (1MiB..1GiB); a longer one stops the dataset with a reason",
        "1MiB", "SIZE",
    ),
    Setting(
        "max_dataset_bytes", "LIFELONG_MAX_DATASET_BYTES", "--max-dataset-bytes",
        values.parse_model_bytes,
        "largest dataset (its size, holes included); a larger one is reported unreadable",
        "64GiB", "SIZE",
    ),
    Setting(
        "max_round_bytes", "LIFELONG_MAX_ROUND_BYTES", "--max-round-bytes",
        values.parse_model_bytes,
        "most bytes one round's data files may hold; a larger round fails with the reason",
        "16GiB", "SIZE",
    ),
    Setting(
        "rounds_kept", "LIFELONG_ROUNDS_KEPT", "--rounds-kept", values.parse_rounds_kept,
        "rounds whose local data files are kept (the newest; the deployed round's and those "
        "a rollback can restore are kept too)", "3", "N",
    ),
    Setting(
        "max_resources", "LIFELONG_MAX_RESOURCES", "--max-resources",
        values.parse_resource_count,
        "most jobs, datasets and other resources the node keeps; an insert of a new one "
        "beyond is refused (an update is not)", "20000", "N",
    ),
    Setting(
        "max_namespace_resources", "LIFELONG_MAX_NAMESPACE_RESOURCES",
        "--max-namespace-resources", values.parse_resource_count,
        "most resources the node keeps of one namespace, the same way", "20000", "N",
    ),
    Setting(
        "max_resource_bytes", "LIFELONG_MAX_RESOURCE_BYTES", "--max-resource-bytes",
        values.parse_resource_bytes,
        "largest resource kept (its JSON; bytes, or with KiB/MiB); a larger one is refused",
        "512KiB", "SIZE",
    ),
)  # fmt: skip
