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

from pathlib import Path

from service.embedded.processes import Server
from service.embedded.topologies import ClusterTopology, SentinelTopology
from service.keys import Keys, shard_of
from tests.faults.rounds import fleet_on, replica_of
from tests.harness import NS
from tests.wait import wait_until

JOBS = 3
KEYS = Keys()


def test_sentinel_failover_loses_no_accepted_report(
    tmp_path: Path, mosquitto: Server, sentinel: SentinelTopology
) -> None:
    """[make test: the one Sentinel failover]"""
    with fleet_on(tmp_path, mosquitto, sentinel.url, JOBS) as fleet:
        fleet.next_round()

        old = sentinel.master()
        fleet.reports_lost_with(old, replica_of(old, sentinel.data))
        sentinel.wait_promoted(old)  # how soon: `make bench`'s figure 8.failover
        sentinel.restart_as_replica(old)
        fleet.finish_and_check(sentinel.url)


def test_cluster_failover_loses_no_accepted_report(
    tmp_path: Path, mosquitto: Server, cluster: ClusterTopology
) -> None:
    """[make test: the one Cluster failover]"""
    with fleet_on(tmp_path, mosquitto, cluster.url, JOBS) as fleet:
        fleet.next_round()

        # the master serving the first job's shard; its replica frozen, so what it takes in
        # from now on stays unreplicated
        victim = cluster.master_of(KEYS.ingress(shard_of(f"job:{NS}/{fleet.jobs[0]}")))
        fleet.reports_lost_with(victim, replica_of(victim, cluster.nodes))
        cluster.wait_promoted(victim)
        victim.start()  # rejoins as a replica of the promoted node
        cluster.wait_healthy()
        fleet.finish_and_check(cluster.url)


#: What a controller logs when it holds reports it could not make durable: the intake's
#: append, or the processor's commit of reports handed over to it, not confirmed by WAIT.
HELD = ("ingress not durable yet", "processor: redis unavailable: redis commit: written, but")


def test_a_replica_slower_than_the_wait_changes_nothing(
    tmp_path: Path, mosquitto: Server, sentinel: SentinelTopology
) -> None:
    """No failover: the replica stalls past the WAIT bound and then catches up, so writes
    the controller saw as not done did happen. Reports are still applied exactly once (the
    intake retries its appends, and the processor its commits of reports handed over in
    process, as redeliveries), the HTTP endpoint says 503 meanwhile (not accepted), and
    nothing goes upstream before the replica holds it."""
    with fleet_on(tmp_path, mosquitto, sentinel.url, 1, replicas=1) as fleet:
        stack, r1 = fleet.stack, fleet.stack.controllers["r1"]
        fleet.next_round()
        replica = replica_of(sentinel.master(), sentinel.data)
        published = len(stack.cloud.upstream())
        replica.freeze()
        try:
            fleet.train_reports()
            wait_until(
                lambda: any(held in r1.log() for held in HELD), 20, "the controller to hold reports"
            )
            assert fleet.post_running(r1, fleet.jobs[0]) == 503
            assert len(stack.cloud.upstream()) == published  # nothing acted on
        finally:
            replica.thaw()
        fleet.finish_round()
        fleet.check(sentinel.url, report_refusals=True)
