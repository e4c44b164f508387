"""What a command says when its servers or its settings are wrong: one line, the exit code."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from service.embedded.processes import Server, free_port
from tests.cli.documents import DATASET, UNROUTED_JOB
from tests.cli.runner import assert_one_clean_line, cli_env, run_cli
from tests.harness import NODE
from tests.servers import locked_mosquitto, running


def test_unreachable_servers_exit_3_with_one_line() -> None:
    closed = free_port()
    env = cli_env(f"mqtt://127.0.0.1:{closed}", f"redis://127.0.0.1:{closed}/0")
    for args in (
        ("get", "jobs"),
        ("describe", "job", "x"),
        ("delete", "job", "x", "--timeout", "1"),
        ("watch", "--timeout", "1"),
        ("apply", "-f", "examples/dataset.yaml", "--timeout", "1"),
    ):
        result = run_cli(env, *args)
        assert result.returncode == 3, (args, result.stderr)
        assert_one_clean_line(result)
        assert result.stderr.startswith("lifelong: cannot reach"), result.stderr


def test_bad_usage_and_config_exit_2() -> None:
    env = cli_env("mqtt://127.0.0.1:1", "redis://127.0.0.1:1/0")
    assert run_cli(env, "get", "pods").returncode == 2
    assert run_cli(env, "delete", "job", "Not_A_Name").returncode == 2
    bad_url = run_cli({**env, "LIFELONG_REDIS_URL": "http://x"}, "get", "jobs")
    assert bad_url.returncode == 2
    assert_one_clean_line(bad_url)
    assert "LIFELONG_REDIS_URL" in bad_url.stderr
    missing = run_cli(env, "validate", "-f", "no/such/file.yaml")
    assert missing.returncode == 2
    assert_one_clean_line(missing)


def test_broker_refusals_exit_1_with_the_brokers_reason(tmp_path: Path) -> None:
    """An ACL refusing a publish (PUBACK 0x87) and a wrong password are the broker's answers,
    not outages: exit 1 naming them, and nothing refused is reported as sent."""
    acl = "user cli\ntopic readwrite sedna/edge-1/#\n"
    broker = locked_mosquitto(tmp_path / "locked", {"cli": "right-password"}, acl)
    with running(broker):
        url = f"mqtt://cli:right-password@127.0.0.1:{broker.port}"
        env = cli_env(url, "redis://127.0.0.1:1/0")
        routed = json.loads(json.dumps(UNROUTED_JOB))  # to the default node, which cli may not use
        # --force: no controller serves these nodes here (the presence check: test_send.py)
        applied = run_cli(env, "apply", "-f", "-", "--force", stdin=json.dumps([DATASET, routed]))
        assert applied.returncode == 1, applied.stderr
        assert applied.stdout.splitlines() == ["dataset default/ds sent to sedna/edge-1/downstream"]
        assert_one_clean_line(applied)
        assert applied.stderr == (
            "lifelong: the MQTT broker refused lifelonglearningjob default/job "
            f"to sedna/{NODE}/downstream (Not authorized)\n"
        )

        deleted = run_cli(env, "delete", "job", "a", "b", "--force")
        assert deleted.returncode == 1, deleted.stderr
        assert "sent" not in deleted.stdout
        assert_one_clean_line(deleted)
        assert "refused delete of lifelonglearningjob default/a" in deleted.stderr
        assert "delete of lifelonglearningjob default/b" in deleted.stderr
        allowed = run_cli(env, "delete", "job", "a", "--node", "edge-1", "--force")
        assert allowed.returncode == 0, allowed.stderr

        for pin in ("", "?protocol=3.1.1"):
            wrong = cli_env(url.replace("right", "wrong") + pin, "redis://127.0.0.1:1/0")
            refused = run_cli(wrong, "apply", "-f", "-", stdin=json.dumps([DATASET]))
            assert refused.returncode == 1, refused.stderr
            assert_one_clean_line(refused)
            assert refused.stderr.startswith(
                f"lifelong: the MQTT broker at mqtt://cli:***@127.0.0.1:{broker.port}{pin} "
                "refused the connection: not authorised (the broker said: "
            ), refused.stderr
            assert "wrong-password" not in refused.stderr


def test_verbose_names_the_servers_each_command_uses(tmp_path: Path, redis_proc: Server) -> None:
    password = secrets.token_urlsafe(12)
    acl = "user operator\ntopic readwrite sedna/#\n"
    broker = locked_mosquitto(tmp_path / "locked", {"operator": password}, acl)
    redis_url = f"redis://127.0.0.1:{redis_proc.port}/0"
    with running(broker):
        env = cli_env(f"mqtt://operator:{password}@127.0.0.1:{broker.port}", redis_url)
        mqtt_shown = f"MQTT broker mqtt://operator:***@127.0.0.1:{broker.port}"
        commands = {
            ("apply", "-f", "examples/dataset.yaml", "--force", "-v"): mqtt_shown,
            ("delete", "dataset", "lifelong-dataset", "--force", "-v"): mqtt_shown,
            ("watch", "--timeout", "1", "-v"): mqtt_shown,
            ("get", "jobs", "-v"): f"Redis {redis_url}",
            ("describe", "job", "x", "-v"): f"Redis {redis_url}",
        }
        for args, server in commands.items():
            result = run_cli(env, *args)
            assert "Traceback" not in result.stderr, result.stderr
            assert server in result.stderr, (args, result.stderr)
            assert password not in result.stderr + result.stdout
            quiet = run_cli(env, *args[:-1])
            assert server not in quiet.stderr, "without -v, only what went wrong"
    # finding nothing, `get` says where it looked: the defaults may name another Redis
    empty = run_cli(env, "get", "datasets")
    assert empty.stderr == f"No dataset resources found in {redis_url}.\n"
