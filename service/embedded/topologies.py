"""The replicated Redis topologies tests and the benchmark build from local redis-server
processes, on free ports: a master with replicas watched by sentinels, and a Redis Cluster of
masters with one replica each (`redis-cli --cluster create`).

Sentinels decide a master is down after a second and promote the replica with the most
data; in the Cluster, a node whose master has been unreachable for ``cluster-node-timeout``
(1 s here) is promoted by its peers. A killed master (or node) restarted later rejoins as a
replica (empty, then synced).

Probes ask a node with redis-py; `poll_until` repeats one until it holds, treating a node
that cannot answer (stopped, frozen, restarting) as "not yet".
"""

from __future__ import annotations

import itertools
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.crc import key_slot

from service.embedded.processes import Server, find_binary, free_port, redis_server

DATA_NODE_ARGS = (
    # a replica starts its sync at once instead of waiting 5 s for more replicas to join
    "--repl-diskless-sync-delay",
    "0",
    "--repl-ping-replica-period",
    "1",
)


def poll_until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """Return once ``predicate`` holds; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not _quietly(predicate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


def _quietly(predicate: Callable[[], object]) -> object:
    """The predicate's value, False while the server it asks cannot answer."""
    try:
        return predicate()
    except (redis.RedisError, OSError):
        return False


def redis_client(port: int) -> redis.Redis[str]:
    """A client of the node on 127.0.0.1:``port``, answering str."""
    return redis.Redis(port=port, socket_timeout=2, decode_responses=True)


def server_info(port: int, section: str) -> dict[str, object]:
    with redis_client(port) as client:
        return dict(client.info(section))


def caught_up(port: int, replicas: int) -> bool:
    """Whether ``replicas`` replicas hold everything the master on ``port`` took so far (a
    probe write, then WAIT for it; replication keeps the master's order)."""
    with redis_client(port) as client:
        client.set("embedded:sync-probe", "1", px=60_000)
        return int(client.wait(replicas, 500)) >= replicas


def role_of(port: int) -> object:
    """The node's replication role: "master" or "slave"."""
    return server_info(port, "replication")["role"]


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


@dataclass
class ClusterTopology:
    """A Redis Cluster of ``masters`` masters with one replica each, all on free ports.

    A node whose master has been unreachable for ``cluster-node-timeout`` (1 s here) is
    promoted by its peers; a killed node restarted later rejoins as a replica.
    """

    workdir: Path
    nodes: list[Server]
    masters: int

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{s.port}" for s in self.nodes[: self.masters])
        return f"redis+cluster://{seeds}"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        cli = find_binary("redis-cli", "/usr/bin/redis-cli")
        create = [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
        create += ["--cluster-replicas", "1", "--cluster-yes"]
        done = subprocess.run(create, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
        self.wait_healthy()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def roles(self) -> dict[int, str]:
        """Port -> "master" or "replica" of every node, as a running node sees the cluster."""
        for node in self.nodes:
            if node.proc is None:
                continue
            with redis_client(node.port) as client:
                text: str = client.execute_command("CLUSTER", "NODES")
            return _cluster_roles(text)
        raise RuntimeError("no cluster node is running")

    def primaries(self) -> list[Server]:
        roles = self.roles()
        return [n for n in self.nodes if roles.get(n.port) == "master"]

    def master_of(self, key: str) -> Server:
        """The node serving ``key``'s slot now."""
        for node in self.nodes:
            if node.proc is None:
                continue
            with redis_client(node.port) as client:
                slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
                for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        return next(n for n in self.nodes if n.port == int(primary[1]))
        raise RuntimeError(f"no node serves {key!r}")

    def wait_healthy(self, timeout_s: float = 60) -> None:
        """Block until every running node says the cluster is ok, each of the masters is a
        running node and has a running replica in sync."""
        poll_until(self._healthy, timeout_s, "the cluster to be ok with a replica per master")

    def _healthy(self) -> bool:
        if not self._slots_served():
            return False
        running = [n for n in self.nodes if n.proc is not None]
        masters = [n for n in running if role_of(n.port) == "master"]
        if len(masters) != self.masters:
            return False
        return all(_caught_up_in_cluster(master.port) for master in masters)

    def wait_promoted(self, old: Server, timeout_s: float = 30) -> None:
        """Block until the cluster replaced the dead master ``old`` and serves every slot."""
        poll_until(
            lambda: self.roles().get(old.port) != "master" and self._slots_served(),
            timeout_s,
            f"a replica promoted in place of the master on port {old.port}",
        )

    def _slots_served(self) -> bool:
        running = [n for n in self.nodes if n.proc is not None]
        for node in running:
            with redis_client(node.port) as client:
                text: str = client.execute_command("CLUSTER", "INFO")
            if "cluster_state:ok" not in text.split():
                return False
        return True


def _caught_up_in_cluster(port: int) -> bool:
    """`replicated.caught_up` for a cluster master and its one replica (the probe key
    hashes to a slot the master serves)."""
    with redis_client(port) as client:
        ranges = [
            (int(first), int(last))
            for first, last, primary, *_ in client.execute_command("CLUSTER", "SLOTS")
            if int(primary[1]) == port
        ]
        if not ranges:
            return False
        tag = next(
            str(i)
            for i in itertools.count()
            if any(first <= key_slot(str(i).encode()) <= last for first, last in ranges)
        )
        client.set(f"embedded:sync-probe:{{{tag}}}", "1", px=60_000)
        return int(client.wait(1, 500)) >= 1


def _cluster_roles(nodes_text: str) -> dict[int, str]:
    """Port -> role from CLUSTER NODES (a failed master counts as failed, not master)."""
    roles: dict[int, str] = {}
    for line in nodes_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        port = int(fields[1].split("@")[0].rpartition(":")[2])
        flags = fields[2].split(",")
        if "fail" in flags:
            roles[port] = "failed"
        else:
            roles[port] = "master" if "master" in flags else "replica"
    return roles


def cluster_topology(workdir: Path, masters: int = 3) -> ClusterTopology:
    """``masters`` masters with one replica each (not started; `start` creates the cluster)."""
    nodes = [
        redis_server(
            workdir / f"node-{i}",
            *DATA_NODE_ARGS,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
            # the bus port defaults to port + 10000, which may not exist for a high free port
            "--cluster-port",
            str(free_port()),
        )
        for i in range(2 * masters)
    ]
    return ClusterTopology(workdir, nodes, masters)
