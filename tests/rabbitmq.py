"""A private RabbitMQ node with the MQTT plugin, beside (never touching) the machine's own.

Everything the node owns is private: its node name, ports (AMQP, MQTT, Erlang distribution),
an epmd of its own on a free port, its config, data, log, plugins and feature-flag files, and
its Erlang cookie (HOME). Debian's start script runs the node as the `rabbitmq` user, so the
node's directory belongs to that user and the processes are started as it, which needs root.
Booting takes ~10-20 s, so tests share one node per session.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from tests.servers import free_port, wait_port

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
CTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
USER = "rabbitmq"
BOOT_TIMEOUT_S = 120.0


def unavailable() -> str | None:
    """Why a private node cannot run here, or None if it can."""
    if not SERVER.exists() or not CTL.exists() or shutil.which("epmd") is None:
        return "rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server)"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no {USER!r} user (it comes with Debian's rabbitmq-server)"
    if os.geteuid() != 0:
        return "a private RabbitMQ node must be started by root (it runs as the rabbitmq user)"
    return None


class RabbitNode:
    """One RabbitMQ node (plus its own epmd), started and stopped by pid."""

    def __init__(self) -> None:
        self.name = f"lifelong-test-{uuid.uuid4().hex[:8]}@localhost"
        self.amqp_port = free_port()
        self.mqtt_port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        # Not under pytest's 0700 temp dirs: the rabbitmq user must reach it.
        self.base = Path(tempfile.mkdtemp(prefix="lifelong-rabbitmq-"))
        self._epmd: subprocess.Popen[bytes] | None = None
        self._server: subprocess.Popen[bytes] | None = None

    @property
    def mqtt_url(self) -> str:
        return f"mqtt://127.0.0.1:{self.mqtt_port}"

    def start(self) -> None:
        self._write_files()
        user = pwd.getpwnam(USER)
        for path in (self.base, *self.base.rglob("*")):
            os.chown(path, user.pw_uid, user.pw_gid)
        self.base.chmod(0o755)
        epmd = shutil.which("epmd") or "epmd"
        self._epmd = self._spawn([epmd, "-address", "127.0.0.1", "-port", str(self.epmd_port)])
        wait_port(self.epmd_port, 10)
        self._server = self._spawn([str(SERVER)])
        try:
            wait_port(self.mqtt_port, BOOT_TIMEOUT_S)
        except TimeoutError:
            out = (self.base / "out.log").read_text(errors="replace")[-2000:]
            self.stop()
            raise TimeoutError(f"RabbitMQ node {self.name} did not boot: {out}") from None

    def stop(self) -> None:
        """`rabbitmqctl stop`; by pid (the VM's, then ours) if that fails; then epmd."""
        if self._server is not None:
            stopped = self._ctl("stop").returncode == 0
            if not stopped:
                self._kill_vm()
            self._end(self._server)
            self._server = None
        if self._epmd is not None:
            self._end(self._epmd)
            self._epmd = None
        shutil.rmtree(self.base, ignore_errors=True)

    # -- internals --------------------------------------------------------------------------

    def _write_files(self) -> None:
        (self.base / "mnesia").mkdir()
        (self.base / "log").mkdir()
        (self.base / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
            f"mqtt.listeners.tcp.default = 127.0.0.1:{self.mqtt_port}\n"
            "mqtt.allow_anonymous = true\n"
        )
        (self.base / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        # Replaces /etc/rabbitmq/rabbitmq-env.conf, which names the machine's own node.
        (self.base / "rabbitmq-env.conf").write_text("")

    def _env(self) -> dict[str, str]:
        base = self.base
        return {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(base),  # the node's own Erlang cookie
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(base / "feature_flags"),
            "RABBITMQ_PID_FILE": str(base / "pid"),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def _as_node(self) -> dict[str, Any]:
        """How each of the node's processes runs: in its folder, with its environment, as
        the unprivileged USER."""
        return {"cwd": self.base, "env": self._env(), "user": USER, "group": USER,
                "extra_groups": []}  # fmt: skip

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.base / "out.log", "ab") as out:
            return subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                **self._as_node(),
            )  # fmt: skip

    def _ctl(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(
                [str(CTL), "-n", self.name, *args],
                capture_output=True,
                timeout=60,
                check=False,
                **self._as_node(),
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([str(CTL)], 1)

    def _kill_vm(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.base / "pid").read_text().strip())
            os.kill(pid, signal.SIGKILL)

    @staticmethod
    def _end(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

