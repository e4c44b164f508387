"""A Sentinel topology: a master, its replicas and sentinels watching them, on free ports.

Sentinels decide a master is down after a second and promote the replica with the most
data; a killed master restarted later rejoins as a replica (empty, then synced).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.embedded.process import Server, find_binary, free_port
from service.embedded.replicated import (
    DATA_NODE_ARGS,
    caught_up,
    poll_until,
    redis_client,
    role_of,
    server_info,
)
from service.embedded.servers import redis_server

SENTINEL_MASTER = "lifelong"
#: Sentinels' failover-timeout: after a failover of a master they start none for the same
#: master within twice this (tests killing masters in a row wait that long in between).
SENTINEL_FAILOVER_TIMEOUT_MS = 3_000


@dataclass
class SentinelTopology:
    """A master, its replicas and three sentinels watching them, all on free ports.

    Sentinels decide a master is down after ``down_after_ms`` and promote the replica with
    the most data; a killed master restarted later rejoins as a replica (empty, then synced).
    """

    workdir: Path
    data: list[Server]
    sentinels: list[Server]
    name: str = SENTINEL_MASTER

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.name}"

    def start(self) -> None:
        for server in self.data:
            server.start()
        self.wait_synced()
        for sentinel in self.sentinels:
            sentinel.start()
        poll_until(self._watched, 30, "every sentinel to see the replicas and the other sentinels")

    def _watched(self) -> bool:
        want_replicas = len(self.data) - 1
        for sentinel in self.sentinels:
            with redis_client(sentinel.port) as client:
                state: dict[str, str] = client.execute_command("SENTINEL", "MASTER", self.name)
            if isinstance(state, list):  # RESP2 pairs
                state = dict(zip(state[::2], state[1::2], strict=True))
            if int(state["num-slaves"]) < want_replicas:
                return False
            if int(state["num-other-sentinels"]) < len(self.sentinels) - 1:
                return False
        return True

    def stop(self) -> None:
        for server in [*self.sentinels, *self.data]:
            server.stop()

    def master(self) -> Server:
        """The data node the sentinels call master now."""
        for sentinel in self.sentinels:
            if sentinel.proc is None:
                continue
            with redis_client(sentinel.port) as client:
                _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
            return next(s for s in self.data if s.port == int(port))
        raise RuntimeError("no sentinel is running")

    def wait_promoted(self, old: Server, timeout_s: float = 30) -> Server:
        """Block until the sentinels made another node master and it acts as one."""
        poll_until(
            lambda: (
                self.master() is not old
                and server_info(self.master().port, "replication")["role"] == "master"
            ),
            timeout_s,
            f"a replica promoted in place of the master on port {old.port}",
        )
        return self.master()

    def restart_as_replica(self, server: Server) -> None:
        """Start a stopped data node again as a replica of the current master (as an operator
        brings a failed master back; the sentinels would otherwise turn it into one only at
        their next look at it, up to 10 s later)."""
        master = self.master()
        argv = server.argv
        if "--replicaof" in argv:
            at = argv.index("--replicaof")
            del argv[at : at + 3]
        argv += ["--replicaof", "127.0.0.1", str(master.port)]
        server.start()

    def wait_synced(self, timeout_s: float = 30) -> None:
        """Block until every running replica is connected to the master and caught up."""
        poll_until(self._synced, timeout_s, "the replicas to sync with the master")

    def _synced(self) -> bool:
        masters = [s for s in self.data if s.proc is not None and role_of(s.port) == "master"]
        if len(masters) != 1:
            return False
        replicas = sum(1 for s in self.data if s.proc is not None) - 1
        return caught_up(masters[0].port, replicas)


def sentinel_topology(workdir: Path, replicas: int = 1, sentinels: int = 3) -> SentinelTopology:
    """A master with ``replicas`` replicas and ``sentinels`` sentinels (not started)."""
    master = redis_server(workdir / "data-0", *DATA_NODE_ARGS)
    data = [master] + [
        redis_server(
            workdir / f"data-{i}", *DATA_NODE_ARGS, "--replicaof", "127.0.0.1", str(master.port)
        )
        for i in range(1, replicas + 1)
    ]
    watchers = []
    for i in range(sentinels):
        port = free_port()
        home = workdir / f"sentinel-{i}"
        home.mkdir(parents=True, exist_ok=True)
        conf = home / "sentinel.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {home}\n"
            f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master.port} 2\n"
            f"sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n"
            f"sentinel failover-timeout {SENTINEL_MASTER} {SENTINEL_FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SENTINEL_MASTER} 1\n"
        )
        binary = find_binary("redis-server", "/usr/bin/redis-server")
        watchers.append(Server("sentinel", [binary, str(conf), "--sentinel"], port, home))
    return SentinelTopology(workdir, data, watchers)
