"""A Redis Cluster of masters with one replica each, on free ports (`redis-cli --cluster
create`).

A node whose master has been unreachable for ``cluster-node-timeout`` (1 s here) is promoted
by its peers; a killed node restarted later rejoins as a replica.
"""

from __future__ import annotations

import itertools
import subprocess
from dataclasses import dataclass
from pathlib import Path

from redis.crc import key_slot

from service.embedded.process import Server, find_binary, free_port
from service.embedded.replicated import DATA_NODE_ARGS, poll_until, redis_client, role_of
from service.embedded.servers import redis_server


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
