"""Child processes on free ports: local mosquitto and redis-server servers (`serve --embedded`,
the demo, tests) and controller replicas (`lifelong serve`) for the demo, the tests and the
benchmarks alike.

`Server` is what fault tests need of mosquitto or redis-server: a process on a port that
survives its own restarts (same port, same working directory), can be frozen (SIGSTOP) and
thawed, and logs to ``<workdir>/<name>.log``. Binaries come from the PATH; `find_binary`
names the Debian package to install when one is missing.

`mosquitto_server` and `redis_server` make one each, not started yet: both keep their data
in their working directory; the broker is configured as the configs
shipped with the controller (in-flight cap, persistence) and speaks on 127.0.0.1 only.

`ControllerProcess` starts the command with the environment given, on an HTTP port of its
own (``LIFELONG_HTTP_ADDR``), logging to one file; waits until it listens or is ready (and
fails with the log's tail if it exits first); stops it with SIGTERM (SIGKILL after a grace
period), kills, freezes and thaws it. What settings a replica runs with is its caller's
business: the demo's, the tests' and the benchmarks' differ.
"""

import contextlib
import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from service.errors import ConfigError

#: Where `free_port` looks when the kernel's ephemeral range cannot be read.
_EPHEMERAL_LOW = 32768
#: The lowest port `free_port` hands out: above the well-known and common service ports.
_LOWEST = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_LOW


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class _Ports:
    """The ports handed out on this machine: one sequence below the kernel's ephemeral range,
    shared by every process that draws (a counter in a file, under an exclusive lock), each
    port checked by binding it.

    A port the kernel hands out itself (bind to port 0) is one it may give any outgoing
    connection the moment it is released, such as the client connections of a replica
    already running; the server it was meant for then fails with "address already in use".
    Below that range only servers take ports. Between a draw and the server's listen (a
    replica takes a second to import) the bind check cannot see the port taken, so no draw
    may repeat another's until the sequence wraps, in this process or any other (pytest's
    workers, a controller started by a test): sequences walked by each process from its own
    start meet once one walks faster, and then take each other's ports for good."""

    def __init__(self, counter: Path) -> None:
        self._counter = counter

    def draw(self) -> int:
        low, high = _LOWEST, _ephemeral_low()
        if high - low < 1000:  # a kernel range leaving too little below it: ask the kernel
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                return int(s.getsockname()[1])
        with open(self._counter, "a+", encoding="ascii") as counter:
            # each open is its own lock holder, threads of one process included; the lock
            # goes with the file's close
            fcntl.flock(counter, fcntl.LOCK_EX)
            counter.seek(0)
            text = counter.read().strip()
            following = int(text) if text.isdigit() else 0
            if not low <= following < high:  # a new counter, or a range changed since
                following = random.SystemRandom().randrange(low, high)
            for _ in range(high - low):
                port = following
                following = port + 1 if port + 1 < high else low
                if _bindable(port):
                    counter.seek(0)
                    counter.truncate()
                    counter.write(str(following))
                    return port
        raise OSError(f"no free port on 127.0.0.1 between {low} and {high}")


_PORTS = _Ports(Path(tempfile.gettempdir()) / f"lifelong-free-ports-{os.getuid()}")


def free_port() -> int:
    """A port on 127.0.0.1 that nothing is bound to now, for a server started next: see
    `_Ports` for why it is not one the kernel picks."""
    return _PORTS.draw()


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


#: The Debian package of each binary started here.
_PACKAGES = {"mosquitto": "mosquitto", "redis-server": "redis-server", "redis-cli": "redis-tools"}


def find_binary(name: str, *fallbacks: str) -> str:
    found = shutil.which(name) or next((f for f in fallbacks if Path(f).exists()), None)
    if found is None:
        package = _PACKAGES.get(name, name)
        raise ConfigError(
            f"{name} not found on PATH: install it (Debian: apt-get install {package}) "
            "or use `docker compose up`"
        )
    return found


def end_process(proc: subprocess.Popen[bytes], sig: int, grace_s: float) -> None:
    """Send `sig` to a running child (after SIGCONT: a frozen process cannot act on SIGTERM)
    and wait for its end; SIGKILL if it has not ended after ``grace_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(sig)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class ChildProcess:
    """What a child process can be made to do whatever it runs: frozen and thawed."""

    proc: subprocess.Popen[bytes] | None

    def freeze(self) -> None:
        """SIGSTOP: every thread stands still, the process stays."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


def _text_of(log_path: Path) -> str:
    return log_path.read_text(errors="replace") if log_path.exists() else ""


@dataclass
class Server(ChildProcess):
    """A server process on a fixed port that can be stopped and started again.

    ``own_session``: started in a session of its own, so that a terminal's Ctrl-C (SIGINT to
    its foreground process group) reaches only the process that started it, which stops the
    server after its own graceful stop (a controller's needs Redis and its broker to the
    end)."""

    name: str
    argv: list[str]
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    own_session: bool = False

    def start(self) -> None:
        with open(self.workdir / f"{self.name}.log", "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=self.own_session,
            )  # fmt: skip
        wait_port(self.port)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            end_process(self.proc, sig, grace_s=10)
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_text(self) -> str:
        return _text_of(self.workdir / f"{self.name}.log")


@contextlib.contextmanager
def running(*servers: Server) -> Iterator[tuple[Server, ...]]:
    started: list[Server] = []
    try:
        for server in servers:
            server.start()
            started.append(server)
        yield servers
    finally:
        for server in reversed(started):
            server.stop()


def mosquitto_server(workdir: Path, extra_conf: str = "", port: int | None = None) -> Server:
    binary = find_binary("mosquitto", "/usr/sbin/mosquitto")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\n"
        + ("allow_anonymous true\n" if "allow_anonymous" not in extra_conf else "")
        + "set_tcp_nodelay true\n"
        + "persistence true\n"
        + f"persistence_location {workdir}/\n"
        + "autosave_interval 1\n"
        + "max_queued_messages 100000\n"
        + "max_inflight_messages 100\n"  # as the configs we ship
        # as root, mosquitto drops to the `mosquitto` user, who cannot write a 0700 temp dir
        + ("user root\n" if os.geteuid() == 0 and "user " not in extra_conf else "")
        + extra_conf
    )
    return Server("mosquitto", [binary, "-c", str(conf)], port, workdir)


def redis_server(workdir: Path, *extra: str, port: int | None = None) -> Server:
    binary = find_binary("redis-server", "/usr/bin/redis-server")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(workdir),
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        *extra,
    ]
    return Server("redis", argv, port, workdir)


#: How often a wait looks at the process and its port.
POLL_S = 0.05


def serve_command(replica: str) -> list[str]:
    """`lifelong serve` for ``replica``, run by this interpreter."""
    return [sys.executable, "-m", "service.cli", "serve", "--replica-id", replica]


class ControllerProcess(ChildProcess):
    """One replica as a child process: ``command`` (default `serve_command`) run from
    ``cwd``, with ``env`` over this process's environment, logging to ``log_path``; set
    ``argv_prefix`` before `start` to run it under another command (e.g. `setpriv`)."""

    def __init__(
        self,
        replica: str,
        log_path: Path,
        env: Mapping[str, str],
        *,
        command: Sequence[str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = replica
        self.http_port = free_port()
        self.log_path = log_path
        self.env = {**os.environ, **env, "LIFELONG_HTTP_ADDR": f"127.0.0.1:{self.http_port}"}
        self.command = list(command or serve_command(replica))
        self.argv_prefix: list[str] = []
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"controller {self.name} is not running"
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        """Start the process (its log appended to); returns at once."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.argv_prefix, *self.command],
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_listening(self, timeout_s: float) -> None:
        """Until the HTTP port answers; RuntimeError if the process exits first,
        TimeoutError after ``timeout_s`` (both with the log's tail)."""
        self._wait(lambda: _listens(self.http_port), timeout_s, "listening")

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 now."""
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float = 15) -> None:
        """Until ``/readyz`` answers 200; RuntimeError if the process exits first,
        TimeoutError after ``timeout_s`` (both with the log's tail)."""
        self._wait(self.ready, timeout_s, "ready")

    def _wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"controller {self.name} exited ({self.proc.returncode}) before it was "
                    f"{what}: {self.log()[-3000:]}"
                )
            if done():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"controller {self.name} not {what}: {self.log()[-3000:]}")
            time.sleep(POLL_S)

    def stop(self, grace_s: float = 20) -> int | None:
        """SIGTERM, then SIGKILL if it has not ended after ``grace_s``; its exit code (None
        when it was not started)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        end_process(proc, signal.SIGTERM, grace_s)
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL: the death of a power cut, nothing flushed."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def log(self) -> str:
        return _text_of(self.log_path)


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
    except OSError:
        return False
    return True
