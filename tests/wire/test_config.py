"""Configuration: defaults, variables, Sedna fallbacks, flags, validation, topic helpers."""

from __future__ import annotations

import argparse
import dataclasses
import socket
from pathlib import Path

import pytest

from service.config import Config, add_arguments, from_args
from service.core.paths import DataRoots
from service.errors import ConfigError
from service.settings import SETTINGS

BASE = {"LIFELONG_NODE_NAME": "edge-1"}


def parse_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults() -> None:
    config = Config.from_env(BASE)
    assert config == Config(node_name="edge-1")
    assert config.mqtt_url == "mqtt://127.0.0.1:1883"
    assert config.redis_url == "redis://127.0.0.1:6379/0"
    assert config.topic_prefix == "sedna"
    assert config.upstream_topic == "{prefix}/{node}/upstream"
    assert config.volume_prefix == ""
    assert config.http_addr == "127.0.0.1:9100"
    assert config.key_prefix == "lifelong"
    assert config.dataset_poll_s == 60
    assert config.lease_s == 10
    assert config.log_format == "text"


def test_file_access_defaults_follow_the_volume_prefix() -> None:
    config = Config.from_env(BASE)
    assert (config.max_model_bytes, config.max_line_bytes) == (4 << 30, 1 << 20)
    # an allow-list of Sedna's directories, never "/" unless named
    hot = "/var/lib/sedna/model-hot-update"
    assert config.path_policy() == DataRoots(
        roots=("/data", "/output", "/models", hot), prefix=""
    )
    mounted = Config.from_env({**BASE, "ROOTFS_MOUNT_DIR": "/rootfs"})
    assert mounted.path_policy() == DataRoots(
        roots=("/rootfs/data", "/rootfs/output", "/rootfs/models", f"/rootfs{hot}"),
        prefix="/rootfs",
    )
    everything = Config.from_env({**BASE, "LIFELONG_DATA_ROOTS": "/"})
    assert everything.path_policy() == DataRoots(roots=("/",), prefix="")
    given = Config.from_env({**BASE, "LIFELONG_DATA_ROOTS": "/data:/srv", "ROOTFS_MOUNT_DIR": "/r"})
    assert given.path_policy() == DataRoots(roots=("/data", "/srv"), prefix="/r")


def test_node_name_defaults_to_hostname() -> None:
    expected = socket.gethostname()
    assert Config.from_env({}).node_name == expected


@pytest.mark.parametrize(
    "variable, value, field",
    [
        ("LIFELONG_MQTT_URL", "mqtts://u:p@broker:8883", "mqtt_url"),
        ("LIFELONG_REDIS_URL", "rediss://r:6380/2", "redis_url"),
        ("LIFELONG_REDIS_URL", "unix:///run/redis.sock", "redis_url"),
        ("LIFELONG_NODE_NAME", "node-7.example", "node_name"),
        ("LIFELONG_TOPIC_PREFIX", "kubeedge", "topic_prefix"),
        ("LIFELONG_UPSTREAM_TOPIC", "{namespace}/lc", "upstream_topic"),
        ("LIFELONG_HTTP_ADDR", "0.0.0.0:9200", "http_addr"),
        ("LIFELONG_HTTP_ADDR", "[::1]:9200", "http_addr"),
        ("LIFELONG_KEY_PREFIX", "site-a:lifelong", "key_prefix"),
        ("LIFELONG_DATA_ROOTS", "/", "data_roots"),
    ],
)
def test_each_variable_from_env_is_kept_as_given(variable: str, value: str, field: str) -> None:
    config = Config.from_env({**BASE, variable: value})
    assert getattr(config, field) == value


@pytest.mark.parametrize(
    ("variable", "raw", "field", "expected"),
    [
        ("LIFELONG_VOLUME_PREFIX", "/rootfs/", "volume_prefix", "/rootfs"),
        ("LIFELONG_HTTP_ADDR", ":9200", "http_addr", "0.0.0.0:9200"),
        ("LIFELONG_DATASET_POLL_SECONDS", "0.5", "dataset_poll_s", 0.5),
        ("LIFELONG_LEASE_SECONDS", "3", "lease_s", 3.0),
        ("LIFELONG_LOG_FORMAT", "JSON", "log_format", "json"),
        ("LIFELONG_DATA_ROOTS", "/data/:/srv//jobs", "data_roots", "/data:/srv/jobs"),
        ("LIFELONG_MAX_MODEL_BYTES", "512MiB", "max_model_bytes", 512 << 20),
        ("LIFELONG_MAX_MODEL_BYTES", "1000", "max_model_bytes", 1000),
        ("LIFELONG_MAX_MODEL_BYTES", "2 gib", "max_model_bytes", 2 << 30),
        ("LIFELONG_MAX_LINE_BYTES", "4MiB", "max_line_bytes", 4 << 20),
        ("LIFELONG_MAX_LINE_BYTES", "1048576", "max_line_bytes", 1 << 20),
    ],
)
def test_each_variable_from_env_is_normalised(
    variable: str, raw: str, field: str, expected: object
) -> None:
    config = Config.from_env({**BASE, variable: raw})
    assert getattr(config, field) == expected


@pytest.mark.parametrize(
    ("environ", "field", "expected"),
    [
        ({"NODENAME": "sedna-node", "HOSTNAME": "pod-x"}, "node_name", "sedna-node"),
        ({"HOSTNAME": "pod-x"}, "node_name", "pod-x"),
        ({"LIFELONG_NODE_NAME": "mine", "NODENAME": "sedna-node"}, "node_name", "mine"),
        ({"LIFELONG_NODE_NAME": "", "NODENAME": "sedna-node"}, "node_name", "sedna-node"),
        ({**BASE, "ROOTFS_MOUNT_DIR": "/rootfs"}, "volume_prefix", "/rootfs"),
        ({**BASE, "ROOTFS_MOUNT_DIR": "/a", "LIFELONG_VOLUME_PREFIX": "/b"}, "volume_prefix", "/b"),
        ({**BASE, "BIND_PORT": "9000"}, "http_addr", "0.0.0.0:9000"),
        ({**BASE, "BIND_PORT": "9000", "LIFELONG_HTTP_ADDR": "127.0.0.1:1"}, "http_addr",
         "127.0.0.1:1"),
    ],
)  # fmt: skip
def test_sedna_fallbacks_and_precedence(environ: dict[str, str], field: str, expected: str) -> None:
    assert getattr(Config.from_env(environ), field) == expected


def test_flags_override_env() -> None:
    environ = {
        **BASE,
        "LIFELONG_MQTT_URL": "mqtt://env:1883",
        "LIFELONG_LEASE_SECONDS": "5",
        "ROOTFS_MOUNT_DIR": "/rootfs",
    }
    args = parse_flags(
        "--mqtt-url", "mqtt://flag:1884", "--node-name", "flag-node",
        "--lease-seconds", "2.5", "--volume-prefix", "", "--log-format", "json",
        "--upstream-topic", "{prefix}/{namespace}/{node}/up", "--http-addr", "9300",
    )  # fmt: skip
    config = from_args(args, environ)
    assert config.mqtt_url == "mqtt://flag:1884"
    assert config.node_name == "flag-node"
    assert config.lease_s == 2.5
    assert config.volume_prefix == ""  # an explicit empty flag beats ROOTFS_MOUNT_DIR
    assert config.log_format == "json"
    assert config.http_addr == "0.0.0.0:9300"
    assert config.redis_url == "redis://127.0.0.1:6379/0"  # untouched: default


def test_every_field_has_a_flag_naming_its_variable() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert set(actions) == {f.name for f in dataclasses.fields(Config)}
    assert "LIFELONG_NODE_NAME" in (actions["node_name"].help or "")
    assert "NODENAME" in (actions["node_name"].help or "")
    assert "mqtt://127.0.0.1:1883" in (actions["mqtt_url"].help or "")
    assert all(a.default is None for a in actions.values())


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("LIFELONG_MQTT_URL", "http://broker:1883"),
        ("LIFELONG_MQTT_URL", "mqtt://broker:0"),
        ("LIFELONG_MQTT_URL", "mqtt://broker:70000"),
        ("LIFELONG_MQTT_URL", "mqtt://broker:port"),
        ("LIFELONG_MQTT_URL", "mqtt://"),
        ("LIFELONG_REDIS_URL", "memcached://r:1"),
        ("LIFELONG_REDIS_URL", "redis://r:6379/zero"),
        ("LIFELONG_REDIS_URL", "unix://relative.sock"),
        ("LIFELONG_NODE_NAME", "node/1"),
        ("LIFELONG_NODE_NAME", "node+"),
        ("LIFELONG_NODE_NAME", "#"),
        ("LIFELONG_NODE_NAME", "-bad-"),
        ("LIFELONG_NODE_NAME", "has space"),
        ("NODENAME", "a/b"),
        ("LIFELONG_TOPIC_PREFIX", "a/b"),
        ("LIFELONG_TOPIC_PREFIX", "+"),
        ("LIFELONG_TOPIC_PREFIX", "$SYS"),
        ("LIFELONG_UPSTREAM_TOPIC", "{prefix}/{nodename}/up"),
        ("LIFELONG_UPSTREAM_TOPIC", "{prefix}/+/up"),
        ("LIFELONG_UPSTREAM_TOPIC", "{prefix}/#"),
        ("LIFELONG_UPSTREAM_TOPIC", "{prefix/up"),
        ("LIFELONG_UPSTREAM_TOPIC", "{}/up"),
        ("LIFELONG_UPSTREAM_TOPIC", "{node!r}/up"),
        ("LIFELONG_VOLUME_PREFIX", "rootfs"),
        ("LIFELONG_VOLUME_PREFIX", "/root/../etc"),
        ("ROOTFS_MOUNT_DIR", "relative"),
        ("LIFELONG_HTTP_ADDR", "localhost"),
        ("LIFELONG_HTTP_ADDR", "127.0.0.1:65536"),
        ("LIFELONG_HTTP_ADDR", "::1:9100"),
        ("BIND_PORT", "99999"),
        ("LIFELONG_KEY_PREFIX", "a{b}"),
        ("LIFELONG_KEY_PREFIX", "has space"),
        ("LIFELONG_DATASET_POLL_SECONDS", "0"),
        ("LIFELONG_DATASET_POLL_SECONDS", "-1"),
        ("LIFELONG_DATASET_POLL_SECONDS", "soon"),
        ("LIFELONG_DATASET_POLL_SECONDS", "nan"),
        ("LIFELONG_LEASE_SECONDS", "0.5"),
        ("LIFELONG_LEASE_SECONDS", "inf"),
        ("LIFELONG_LOG_FORMAT", "xml"),
        ("LIFELONG_DATA_ROOTS", "data"),
        ("LIFELONG_DATA_ROOTS", "/data::/srv"),
        ("LIFELONG_DATA_ROOTS", "/data/../etc"),
        ("LIFELONG_DATA_ROOTS", "/etc"),
        ("LIFELONG_DATA_ROOTS", "/data:/usr/share"),
        ("LIFELONG_MAX_MODEL_BYTES", "0"),
        ("LIFELONG_MAX_MODEL_BYTES", "4GB"),
        ("LIFELONG_MAX_MODEL_BYTES", "-1"),
        ("LIFELONG_MAX_MODEL_BYTES", "lots"),
        ("LIFELONG_MAX_LINE_BYTES", "1000"),
        ("LIFELONG_MAX_LINE_BYTES", "2GiB"),
    ],
)
def test_bad_value_names_the_variable(variable: str, raw: str) -> None:
    environ = {variable: raw} if variable == "NODENAME" else {**BASE, variable: raw}
    with pytest.raises(ConfigError) as caught:
        Config.from_env(environ)
    message = str(caught.value)
    assert message.startswith(f"{variable}: ")
    assert "\n" not in message


def test_bad_flag_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--lease-seconds: "):
        from_args(parse_flags("--lease-seconds", "0"), BASE)
    with pytest.raises(ConfigError, match=r"^--node-name: "):
        from_args(parse_flags("--node-name", ""), BASE)


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("LIFELONG_MQTT_URL", "http://user:hunter2@broker:1883"),
        ("LIFELONG_MQTT_URL", "mqtt://user:hunter2@broker:99999"),
        ("LIFELONG_MQTT_URL", "mqtt://user:hunter2@broker:x"),
        ("LIFELONG_MQTT_URL", "mqtt://user:hunter2@/path"),
        ("LIFELONG_REDIS_URL", "redis://:hunter2@r:6379/db"),
        ("LIFELONG_REDIS_URL", "tcp://:hunter2@r:6379/0"),
    ],
)
def test_errors_never_echo_a_password(variable: str, url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_env({**BASE, variable: url})
    assert variable in str(caught.value)
    assert "hunter2" not in str(caught.value)
    assert "hunter2" not in repr(caught.value.__cause__)


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ConfigError, match="LIFELONG_LEASE_SECONDS"):
        Config(node_name="n", lease_s=0.1)
    with pytest.raises(ConfigError, match="LIFELONG_NODE_NAME"):
        Config(node_name="a/b")


def test_unknown_override_is_refused() -> None:
    with pytest.raises(ConfigError, match="nodename"):
        Config.from_env(BASE, {"nodename": "x"})


def test_topic_helpers() -> None:
    config = Config.from_env({**BASE, "LIFELONG_TOPIC_PREFIX": "kubeedge"})
    assert config.downstream_topic() == "kubeedge/edge-1/downstream"
    assert config.worker_topic_filter() == "kubeedge/edge-1/workers/+/info"
    assert config.errors_topic() == "kubeedge/edge-1/errors"
    assert config.presence_topic("r-0") == "kubeedge/edge-1/controllers/r-0"
    assert config.upstream_topic_for("default") == "kubeedge/edge-1/upstream"
    assert config.for_node("edge-2").downstream_topic() == "kubeedge/edge-2/downstream"


def test_upstream_filter_matches_every_namespace() -> None:
    def upstream_filter(template: str) -> str:
        env = {"LIFELONG_NODE_NAME": "n", "LIFELONG_TOPIC_PREFIX": "p"}
        return Config.from_env({**env, "LIFELONG_UPSTREAM_TOPIC": template}).upstream_topic_filter()

    assert upstream_filter("{prefix}/{node}/upstream") == "p/n/upstream"
    assert upstream_filter("{namespace}/{prefix}-up/{node}") == "+/p-up/n"
    assert upstream_filter("x/ns-{namespace}/{node}") == "x/+/n"


def test_upstream_template_with_namespace() -> None:
    config = Config.from_env({**BASE, "LIFELONG_UPSTREAM_TOPIC": "{namespace}/{prefix}/{node}/up"})
    assert config.upstream_topic_for("team-a") == "team-a/sedna/edge-1/up"
    assert config.upstream_topic_for("default") == "default/sedna/edge-1/up"


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        ("127.0.0.1:9100", ("127.0.0.1", 9100)),
        ("9100", ("0.0.0.0", 9100)),
        ("[::1]:9100", ("::1", 9100)),
        ("localhost:80", ("localhost", 80)),
    ],
)
def test_http_host_port(addr: str, expected: tuple[str, int]) -> None:
    assert Config.from_env({**BASE, "LIFELONG_HTTP_ADDR": addr}).http_host_port() == expected


TOKEN = "k8s-secret-token-0123456789"


def test_http_token_from_env_flag_or_file(tmp_path: Path) -> None:
    assert Config.from_env(BASE).http_bearer_token() == ""  # off by default
    assert Config.from_env({**BASE, "LIFELONG_HTTP_TOKEN": TOKEN}).http_bearer_token() == TOKEN
    secret = tmp_path / "token"
    secret.write_text(f"{TOKEN}\n")
    from_flag = from_args(parse_flags("--http-token-file", str(secret)), BASE)
    assert from_flag.http_bearer_token() == TOKEN
    config = Config.from_env({**BASE, "LIFELONG_HTTP_TOKEN_FILE": str(secret)})
    assert config.http_bearer_token() == TOKEN
    assert TOKEN not in repr(config) and TOKEN not in repr(Config.from_env(
        {**BASE, "LIFELONG_HTTP_TOKEN": TOKEN}))  # fmt: skip


def test_a_token_given_as_a_flag_is_refused_unechoed(capsys: pytest.CaptureFixture[str]) -> None:
    """A flag shows in the process list: `--http-token` is refused, and not taken as an
    abbreviation of `--http-token-file` (which would echo the token as a file name)."""
    for argv in (["--http-token", TOKEN], [f"--http-token={TOKEN}"]):
        with pytest.raises(SystemExit):
            parse_flags(*argv)
        error = capsys.readouterr().err
        assert "--http-token is not taken: a flag shows in the process list" in error
        assert "LIFELONG_HTTP_TOKEN" in error and TOKEN not in error


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"LIFELONG_HTTP_TOKEN": "short"}, r"^LIFELONG_HTTP_TOKEN: a bearer token must be at"),
        ({"LIFELONG_HTTP_TOKEN": "has space in it 0123456789"}, r"^LIFELONG_HTTP_TOKEN: a bearer"),
        ({"LIFELONG_HTTP_TOKEN": TOKEN + "\n"}, r"^LIFELONG_HTTP_TOKEN: a bearer"),
        ({"LIFELONG_HTTP_TOKEN_FILE": "/nonexistent/token"},
         r"^LIFELONG_HTTP_TOKEN_FILE: cannot read '/nonexistent/token': No such file"),
    ],
)  # fmt: skip
def test_bad_http_token_settings(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        Config.from_env({**BASE, **environ})
    assert "\n" not in str(caught.value)
    assert TOKEN not in str(caught.value) and "short" not in str(caught.value)


def test_token_and_token_file_together_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN)
    environ = {**BASE, "LIFELONG_HTTP_TOKEN": TOKEN, "LIFELONG_HTTP_TOKEN_FILE": str(secret)}
    with pytest.raises(ConfigError, match="set one of them, not both"):
        Config.from_env(environ)


@pytest.mark.parametrize("content", ["", "\n", "weak\n", f"{TOKEN} {TOKEN}\n"])
def test_a_bad_token_file_names_the_file_not_the_token(tmp_path: Path, content: str) -> None:
    secret = tmp_path / "token"
    secret.write_text(content)
    with pytest.raises(ConfigError, match=r"^LIFELONG_HTTP_TOKEN_FILE: ") as caught:
        Config.from_env({**BASE, "LIFELONG_HTTP_TOKEN_FILE": str(secret)})
    assert str(secret) in str(caught.value)
    assert "weak" not in str(caught.value) and TOKEN not in str(caught.value)


def test_every_setting_is_in_the_readmes_configuration_table() -> None:
    """The table users read is the contract: each variable and its Sedna fallbacks are in it."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| LIFELONG_")]
    for setting in SETTINGS:
        row = next((r for r in rows if r.startswith(f"| {setting.env} ")), None)
        assert row is not None, f"{setting.env} is missing from README.md's configuration table"
        for fallback in setting.fallbacks:
            assert fallback in row, f"{setting.env}'s fallback {fallback} is not in its row"
