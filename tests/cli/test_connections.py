"""What a command says when its servers or its settings are wrong: one line, the exit code."""

from __future__ import annotations

import json
from pathlib import Path

from service.embedded import free_port
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
        applied = run_cli(env, "apply", "-f", "-", stdin=json.dumps([DATASET, routed]))
        assert applied.returncode == 1, applied.stderr
        assert applied.stdout.splitlines() == ["dataset default/ds sent to sedna/edge-1/downstream"]
        assert_one_clean_line(applied)
        assert applied.stderr == (
            "lifelong: the MQTT broker refused lifelonglearningjob default/job "
            f"to sedna/{NODE}/downstream (Not authorized)\n"
        )

        deleted = run_cli(env, "delete", "job", "a", "b")
        assert deleted.returncode == 1, deleted.stderr
        assert "sent" not in deleted.stdout
        assert_one_clean_line(deleted)
        assert "refused delete of lifelonglearningjob default/a" in deleted.stderr
        assert "delete of lifelonglearningjob default/b" in deleted.stderr
        allowed = run_cli(env, "delete", "job", "a", "--node", "edge-1")
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
