"""Soaks (`make soak`, not part of `make test`): many rounds, the Redis master killed at a
different step of the pipeline in each, behind Sentinel and in a Cluster.

Each scenario stops the controllers, starts replica r1 alone with one failpoint armed to
stall (`service/failpoints.py`), waits until r1 sits at that step (between taking a report
in and acknowledging it to the broker, just before a commit, just after one and before its
effects and upstream messages, half-way through writing a round file), SIGKILLs the Redis
master, lets it be replaced, and brings r2 back; r1 then carries on against the promoted
replica. Other rounds kill the master with its replica cut off (what it took in never
replicated) or simply mid-stream. At the end every check of `Fleet.check` holds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from service.embedded.processes import Server
from service.embedded.topologies import ClusterTopology, SentinelTopology
from service.keys import Keys, shard_of
from tests.faults.rounds import (
    Fleet,
    TopologyStack,
    fleet_on,
    replica_of,
)
from tests.harness import NS
from tests.wait import wait_until

pytestmark = [pytest.mark.soak, pytest.mark.timeout(900)]

JOBS = 4
STALL_S = 4  # longer than a promotion: the stalled step goes on against the new master
KEYS = Keys()


def armed(stack: TopologyStack, point: str) -> None:
    """Only r1 runs, with ``point`` armed to stall once."""
    for name in list(stack.controllers):
        stack.controllers[name].stop()
    stack.start("r1", {"LIFELONG_FAILPOINTS": f"{point}:{STALL_S}"})


def stalled_at(stack: TopologyStack, point: str) -> None:
    wait_until(
        lambda: f"failpoint {point}: stalling" in stack.controllers["r1"].log(),
        30,
        f"r1 to reach {point}",
    )


def kill_scenarios(
    fleet: Fleet,
    master: Callable[[], Server],
    heal: Callable[[Server], None],
    replica: Callable[[Server], Server],
) -> None:
    """Rounds, each with the master killed at another step. ``master``: the master to kill
    (on a Cluster, the one serving the first job's shard); ``heal``: wait until the killed
    one was replaced and bring it back as a replica; ``replica``: a master's replica."""
    stack = fleet.stack

    def kill() -> None:
        victim = master()
        victim.kill()
        heal(victim)

    fleet.next_round()  # 1: the replica cut off, reports taken in by the master alone
    victim = master()
    fleet.reports_lost_with(victim, replica(victim))
    heal(victim)
    fleet.finish_round()

    for point in (
        "intake-before-ack",
        "process-before-commit",
        "process-before-effects",
        "blob-mid-write",
    ):
        armed(stack, point)
        fleet.next_round()
        fleet.train_reports()
        stalled_at(stack, point)
        kill()
        stack.start("r2")
        fleet.finish_round()

    fleet.next_round()  # last: a plain kill while the eval reports stream in
    fleet.train_reports()
    fleet.wait_ready("eval", f"/eval/{fleet.version}")
    fleet.eval_reports()
    kill()
    fleet.wait_deployed()


def test_sentinel_soak(tmp_path: Path, mosquitto: Server, sentinel: SentinelTopology) -> None:
    def heal(old: Server) -> None:
        sentinel.wait_promoted(old)
        sentinel.restart_as_replica(old)
        sentinel.wait_synced()

    with fleet_on(tmp_path, mosquitto, sentinel.url, JOBS) as fleet:
        kill_scenarios(fleet, sentinel.master, heal, lambda old: replica_of(old, sentinel.data))
        fleet.check(sentinel.url)


def test_cluster_soak(tmp_path: Path, mosquitto: Server, cluster: ClusterTopology) -> None:
    def heal(old: Server) -> None:
        cluster.wait_promoted(old)
        old.start()  # rejoins as a replica of the promoted node
        cluster.wait_healthy()

    with fleet_on(tmp_path, mosquitto, cluster.url, JOBS) as fleet:
        key = KEYS.ingress(shard_of(f"job:{NS}/{fleet.jobs[0]}"))
        kill_scenarios(
            fleet, lambda: cluster.master_of(key), heal, lambda old: replica_of(old, cluster.nodes)
        )
        fleet.check(cluster.url)
