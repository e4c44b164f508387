"""The Redis master dies under two controller replicas, behind Sentinel and in a Cluster.

One lean failover of each kind (part of `make test`; the longer soaks with several kill
points are in test_redis_soak.py, `make soak`). Both start the same way: the master's
replica is frozen and cut off (its replication link closed by the master, so nothing
written from then on reaches it, not even into its socket buffer), reports arrive, the
master takes them in but cannot get them replicated; the master is then SIGKILLed and the
replica, which never saw them, promoted.
Each report the broker accepted must still be applied exactly once: the controller
acknowledges a message to the broker only once a replica holds it (WAIT), so the broker
still has every one the promoted replica lacks and delivers it again. Then the round and a
second one complete; every check of `Fleet.check` holds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from service.embedded import ClusterTopology, SentinelTopology, Server
from service.keys import Keys, shard_of
from tests.faults.rounds import Fleet, topology_stack, wait_until
from tests.integration.harness import NS

JOBS = 3
KEYS = Keys()


@contextlib.contextmanager
def cut_off(replica: Server, master: Server) -> Iterator[None]:
    """Freeze the replica and close its replication link: the master's later writes never
    reach it. Thawed on the way out (it then finds its master gone)."""
    replica.freeze()
    try:
        with redis.Redis(port=master.port) as raw:
            raw.client_kill_filter(_type="replica")
        yield
    finally:
        replica.thaw()


def markers(master: Server) -> int:
    """Messages the master took in recently (each leaves a dedupe marker for a minute)."""
    with redis.Redis(port=master.port) as raw:
        return sum(1 for _ in raw.scan_iter(match="lifelong:*:seen:*", count=1000))


def reached(master: Server, before: int) -> None:
    """Wait until the master took in one of the reports sent since it had ``before`` markers."""
    wait_until(lambda: markers(master) > before, 20, "a report to reach the master")


def replica_of(master: Server, nodes: list[Server]) -> Server:
    with redis.Redis(port=master.port, decode_responses=True) as raw:
        port = int(raw.info("replication")["slave0"]["port"])
    return next(n for n in nodes if n.port == port)


def test_sentinel_failover_loses_no_accepted_report(
    tmp_path: Path, mosquitto: Server, sentinel: SentinelTopology
) -> None:
    """[make test: the one Sentinel failover]"""
    with topology_stack(tmp_path, mosquitto, sentinel.url) as stack:
        stack.start("r1")
        stack.start("r2")
        fleet = Fleet.create(stack, JOBS)
        fleet.next_round()

        old = sentinel.master()
        replica = replica_of(old, sentinel.data)
        before = markers(old)
        with cut_off(replica, old):
            fleet.train_reports()  # accepted by the broker, taken in by the master only
            reached(old, before)
            old.kill()
        killed = time.monotonic()
        sentinel.wait_promoted(old)
        promoted_s = time.monotonic() - killed
        sentinel.restart_as_replica(old)

        fleet.finish_round()
        fleet.next_round()
        fleet.train_reports()
        fleet.finish_round()
        fleet.check(sentinel.url)
        assert promoted_s < 15


def test_cluster_failover_loses_no_accepted_report(
    tmp_path: Path, mosquitto: Server, cluster: ClusterTopology
) -> None:
    """[make test: the one Cluster failover]"""
    with topology_stack(tmp_path, mosquitto, cluster.url) as stack:
        stack.start("r1")
        stack.start("r2")
        fleet = Fleet.create(stack, JOBS)
        fleet.next_round()

        # the master serving the first job's shard; its replica frozen, so what it takes in
        # from now on stays unreplicated
        victim = cluster.master_of(KEYS.ingress(shard_of(f"job:{NS}/{fleet.jobs[0]}")))
        replica = replica_of(victim, cluster.nodes)
        before = markers(victim)
        with cut_off(replica, victim):
            fleet.train_reports()
            reached(victim, before)
            victim.kill()
        cluster.wait_promoted(victim)
        victim.start()  # rejoins as a replica of the promoted node
        cluster.wait_healthy()

        fleet.finish_round()
        fleet.next_round()
        fleet.train_reports()
        fleet.finish_round()
        fleet.check(cluster.url)
