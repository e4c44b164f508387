"""Redis URLs: one server, Sentinel, Cluster; good values parsed, bad ones refused in one line
that names the variable and never shows the password; the replicas a write must reach."""

from __future__ import annotations

import argparse

import pytest

from service.config import Config, add_arguments, from_args
from service.errors import ConfigError
from service.urls import RedisTarget, parse_redis_url

BASE = {"LIFELONG_NODE_NAME": "edge-1"}


@pytest.mark.parametrize(
    "expected",
    [
        RedisTarget(url="redis://r:6380/2", topology="single", hosts=(("r", 6380),), db=2),
        RedisTarget(
            url="rediss://r/0?ssl_ca_certs=/ca.pem",
            topology="single",
            tls=True,
            hosts=(("r", 6379),),
        ),
        RedisTarget(url="unix:///run/redis.sock", topology="single"),
        RedisTarget(
            url="redis+sentinel://s1:26379,s2,[::1]:26381/mymaster",
            topology="sentinel",
            hosts=(("s1", 26379), ("s2", 26379), ("::1", 26381)),
            master="mymaster",
        ),
        RedisTarget(
            url="redis+sentinel://app:p%40ss@s1:5000/main/3",
            topology="sentinel",
            hosts=(("s1", 5000),),
            master="main",
            db=3,
            username="app",
            password="p@ss",
        ),
        RedisTarget(
            url="rediss+sentinel://:secret@s1/main?ssl_ca_certs=/ca.pem"
            "&ssl_check_hostname=no&ssl_cert_reqs=REQUIRED",
            topology="sentinel",
            tls=True,
            hosts=(("s1", 26379),),
            master="main",
            password="secret",
            tls_options=(
                ("ssl_ca_certs", "/ca.pem"),
                ("ssl_check_hostname", False),
                ("ssl_cert_reqs", "required"),
            ),
        ),
        RedisTarget(
            url="redis+cluster://n1:7000,n2:7001,n3",
            topology="cluster",
            hosts=(("n1", 7000), ("n2", 7001), ("n3", 6379)),
        ),
        RedisTarget(
            url="REDISS+CLUSTER://u:p@n1:7000/0?ssl_certfile=/c.pem&ssl_keyfile=/k.pem",
            topology="cluster",
            tls=True,
            hosts=(("n1", 7000),),
            username="u",
            password="p",
            tls_options=(("ssl_certfile", "/c.pem"), ("ssl_keyfile", "/k.pem")),
        ),
        RedisTarget(url="redis+cluster://n1:7000?", topology="cluster", hosts=(("n1", 7000),)),
    ],
    ids=lambda target: target.url,
)
def test_good_urls(expected: RedisTarget) -> None:
    assert parse_redis_url(expected.url) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("memcached://r:1", "scheme"),
        ("redis+sentinel", "scheme"),
        ("redis+replica://r/m", "scheme"),
        ("redis://r:6379/zero", "database 'zero'"),
        ("redis://r:70000/0", "bad port"),
        ("redis:///0", "names no Redis host"),
        ("unix://relative.sock", "absolute socket path"),
        ("redis+sentinel://s1:26379", "names no master"),
        ("redis+sentinel://s1:26379/", "names no master"),
        ("redis+sentinel://s1/m/x", "only a database number"),
        ("redis+sentinel://s1/m/0/extra", "only a database number"),
        ("redis+sentinel://s1:0/m", "not a number in 1..65535"),
        ("redis+sentinel://s1:abc/m", "not a number in 1..65535"),
        ("redis+sentinel://s1,,s2/m", "names no host"),
        ("redis+sentinel://:26379/m", "names no host"),
        ("redis+sentinel://::1:26379/m", "IPv6 needs [addr]:port"),
        ("redis+sentinel://[::1/m", "not [ipv6]:port"),
        ("redis+cluster://n1:7000/1", "only database 0"),
        ("redis+cluster://n1:7000?ssl_ca_certs=/ca.pem", "needs TLS"),
        ("rediss+cluster://n1:7000?timeout=3", "unknown option 'timeout'"),
        ("rediss+cluster://n1?ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of"),
        ("rediss+cluster://n1?ssl_check_hostname=perhaps", "true or false"),
        ("rediss+cluster://n1?ssl_ca_certs=", "has no value"),
    ],
)
def test_bad_urls_say_why_in_one_line(url: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_redis_url(url, "LIFELONG_REDIS_URL")
    message = str(caught.value)
    assert message.startswith("LIFELONG_REDIS_URL: ")
    assert reason in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://app:hunter2@s1:26379",
        "redis+sentinel://app:hunter2@s1:99999/m",
        "rediss+cluster://:hunter2@n1:7000/5",
        "redis+cluster://hunter2@n1?ssl_ca_certs=/x",
        "redis+sentinel://u:hunter2@s1/m/x",
        "redis://:hunter2@r:6379/db",
    ],
)
def test_errors_never_echo_a_password(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_env({**BASE, "LIFELONG_REDIS_URL": url})
    assert str(caught.value).startswith("LIFELONG_REDIS_URL: ")
    assert "hunter2" not in str(caught.value)
    assert "hunter2" not in repr(caught.value.__cause__)


def test_a_target_never_shows_its_password() -> None:
    target = parse_redis_url("redis+sentinel://app:hunter2@s1/m")
    assert "hunter2" not in repr(target)
    assert "app:***@s1" in repr(target)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, 0),
        ({"LIFELONG_REDIS_URL": "redis+sentinel://s1/m"}, 1),
        ({"LIFELONG_REDIS_URL": "redis+cluster://n1:7000"}, 1),
        ({"LIFELONG_REDIS_URL": "redis+cluster://n1", "LIFELONG_REDIS_MIN_REPLICAS": "0"}, 0),
        ({"LIFELONG_REDIS_MIN_REPLICAS": "2"}, 2),
        ({"LIFELONG_REDIS_MIN_REPLICAS": ""}, 0),  # empty counts as unset
    ],
)
def test_min_replicas_defaults_by_topology(environ: dict[str, str], expected: int) -> None:
    assert Config.from_env({**BASE, **environ}).min_replicas() == expected


@pytest.mark.parametrize("raw", ["-1", "one", "1.5", " "])
def test_bad_min_replicas_names_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"^LIFELONG_REDIS_MIN_REPLICAS: "):
        Config.from_env({**BASE, "LIFELONG_REDIS_MIN_REPLICAS": raw})


def test_min_replicas_flag_beats_the_variable() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--redis-min-replicas", "3"])
    config = from_args(args, {**BASE, "LIFELONG_REDIS_MIN_REPLICAS": "1"})
    assert config.min_replicas() == 3
    with pytest.raises(ConfigError, match=r"^--redis-min-replicas: "):
        from_args(parser.parse_args(["--redis-min-replicas", "x"]), BASE)


def test_direct_construction_checks_the_redis_url() -> None:
    with pytest.raises(ConfigError, match="LIFELONG_REDIS_URL"):
        Config(node_name="n", redis_url="redis+sentinel://s1")
    assert (
        Config(node_name="n", redis_url="redis+cluster://n1", redis_min_replicas=2).min_replicas()
        == 2
    )
