"""Service configuration: `Config`, the validated settings of one controller process and what
follows from them (the topics of its node, the data roots, the replicas a write waits for, the
HTTP address and token), and the settings as command-line flags (`lifelong serve`, the worker,
the demo) and as the environment another process is given.

Every setting has one LIFELONG_ variable and, unless it is a secret (which a flag would show
in the process list), one flag; a flag beats the variable, the
variable beats Sedna's own name (so a Sedna LC manifest works unchanged), and that beats the
default. A bad value stops start-up with a ConfigError of one line that names where the value
came from (variable or flag) and never echoes a password. The table of settings and the
parsers of their values are in `service.settings`.
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

from service.core.paths import DataRoots
from service.errors import ConfigError
from service.settings import (
    HOSTNAME_VARIABLE,
    NODE_NAME,
    SETTINGS,
    LogFormat,
    lookup,
    read_token_file,
    split_host_port,
)
from service.urls import parse_redis_url

#: The default data roots, as the host sees them: the directories Sedna's examples keep
#: datasets (``/data``), output dirs (``/output``) and models (``/models``) in, and the one
#: Sedna's GM keeps each hot-updated inference worker's model config in. Anything else, "/"
#: included, must be named in LIFELONG_DATA_ROOTS.
SEDNA_DATA_ROOTS = ("/data", "/output", "/models", "/var/lib/sedna/model-hot-update")


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
    http_allowed_hosts: str = ""  # ','-separated, or "*"
    key_prefix: str = "lifelong"
    redis_min_replicas: int | None = None
    dataset_poll_s: float = 60
    lease_s: float = 10
    log_format: LogFormat = "text"
    gm_address: str = ""
    gm_resend_s: float = 30
    http_token: str = dataclasses.field(default="", repr=False)
    http_token_file: str = ""
    data_roots: str = ""  # ':'-separated; empty: SEDNA_DATA_ROOTS under the volume prefix
    max_model_bytes: int = 4 << 30
    max_line_bytes: int = 1 << 20
    max_dataset_bytes: int = 64 << 30
    max_round_bytes: int = 16 << 30
    inline_effect_bytes: int = 1 << 20
    rounds_kept: int = 3
    max_resources: int = 20_000
    max_namespace_resources: int = 20_000
    max_resource_bytes: int = 512 << 10

    def __post_init__(self) -> None:
        """Validate again so a Config built directly (tests, tools) is as sound as a parsed one."""
        for setting in SETTINGS:
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
        unknown = sorted(set(given) - {s.field for s in SETTINGS})
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        values: dict[str, object] = {}
        for setting in SETTINGS:
            raw, source = lookup(setting, environ, given.get(setting.field))
            if raw is not None:
                values[setting.field] = setting.parse(raw, source)
        if "node_name" not in values:
            values["node_name"] = NODE_NAME.parse(socket.gethostname(), "hostname")
        return cls(**values)  # type: ignore[arg-type]

    def path_policy(self) -> DataRoots:
        """Where a job's local files may lie: the data roots (default: Sedna's directories,
        ``SEDNA_DATA_ROOTS``, under the volume prefix) with the volume prefix."""
        if self.data_roots:
            roots = tuple(self.data_roots.split(":"))
        else:
            roots = tuple(self.volume_prefix + root for root in SEDNA_DATA_ROOTS)
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

    def namespaced_worker_topic_filter(self) -> str:
        """Subscription filter matching every worker's report topic on this node that names
        the worker's namespace (the one the broker's ACL can bind to a namespace's login)."""
        return f"{self.topic_prefix}/{self.node_name}/workers/+/+/info"

    def worker_topic(self, namespace: str, worker: str) -> str:
        """Where a worker of `namespace` on this node reports: the namespaced topic."""
        return f"{self.topic_prefix}/{self.node_name}/workers/{namespace}/{worker}/info"

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
        return split_host_port(self.http_addr, "LIFELONG_HTTP_ADDR")

    def http_allowed_hosts_list(self) -> list[str] | None:
        """The host names the HTTP endpoint answers to without a token: localhost, the listen
        host and those set (IP addresses are always answered); None for any host."""
        if self.http_allowed_hosts == "*":
            return None
        host, _ = self.http_host_port()
        names = ["localhost", host.lower()]
        return names + [name for name in self.http_allowed_hosts.split(",") if name]

    def http_bearer_token(self) -> str:
        """The token HTTP clients must present ("" for none): the setting or the file's content.

        The file is read on every call, so a caller reads it once, at start-up.
        """
        if self.http_token_file:
            return read_token_file(self.http_token_file, "LIFELONG_HTTP_TOKEN_FILE")
        return self.http_token


class _Refused(argparse.Action):
    """The flag of a secret: refused with the ways to give it, never echoing the value."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        self.variable = str(kwargs.pop("variable"))
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            f"{option_string} is not taken: a flag shows in the process list; set "
            f"{self.variable}, or name a file holding it with {option_string}-file"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting; each defaults to None so an absent flag leaves env in charge.
    The flag of a secret is there only to be refused: else argparse would take it as an
    abbreviation of the `-file` flag beside it and echo the secret as a file name."""
    for setting in SETTINGS:
        if setting.secret:
            parser.add_argument(setting.flag, dest=setting.field, action=_Refused,
                                default=None, variable=setting.env)  # fmt: skip
            continue
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
    return {s.field: cast("str | None", getattr(args, s.field, None)) for s in SETTINGS}


def node_name_chosen(args: argparse.Namespace, environ: Mapping[str, str]) -> bool:
    """Whether someone chose the node name: its flag, LIFELONG_NODE_NAME or NODENAME. The
    host name and HOSTNAME (set in every container) are fallbacks, not choices."""
    raw, source = lookup(NODE_NAME, environ, _flag_values(args)["node_name"])
    return raw is not None and source != HOSTNAME_VARIABLE


def environment(cfg: Config, fields: Iterable[str]) -> dict[str, str]:
    """The variables that give another process these settings of `cfg`: {name: value}."""
    names = {s.field: s.env for s in SETTINGS}
    return {names[f]: str(getattr(cfg, f)) for f in fields}
