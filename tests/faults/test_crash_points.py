"""SIGKILL-like deaths at each step of a round, exactly where they hurt.

Replica A brings round 1 to the step under test and stops gracefully; replica B starts with
one failpoint armed (`service/failpoints.py`) and dies there (exit 137, no cleanup) on the
first message that reaches it; replica C, started without failpoints, takes the leases over
once B's expire and must finish the round. Then: every upstream message of the round arrived
at least once and duplicates share an id (one id per message: no second `ready`), no
transition was applied twice (one version, one
event of each kind in the job's history, the round files and the deploy copy exactly right),
and a file being written or copied when B died was never seen half-done under its own name.
"""

from __future__ import annotations

import pytest

from service.failpoints import EXIT_CODE
from tests.faults.conftest import JOB, OLD_DEPLOY, QUIET_POLLS, Round, probe_of, wait_exit
from tests.stack import Stack
from tests.wait import wait_until

BIG_MODEL_BYTES = (5 << 20) // 2  # 2.5 MiB: the copy runs in 1 MiB blocks, B dies after one
#: Points whose subject is an effect run by the pool after its commit: B runs every effect
#: there (at `process-before-commit`, B has run the eval round inline: its result waits for
#: the commit B never makes)
POOL_ONLY = {"result-before-commit", "process-before-effects"}

# (failpoint, the report that makes replica B reach it)
POINTS = [
    ("intake-before-durable", "train"),
    ("intake-before-ack", "train"),
    ("process-before-commit", "train"),
    ("process-before-commit", "eval"),
    ("result-before-commit", "train"),
    ("process-before-effects", "train"),
    ("outbox-before-publish", "train"),
    ("blob-mid-write", "train"),
    ("blob-mid-copy", "eval"),
]


IDS = [p if [q for q, _ in POINTS].count(p) == 1 else f"{p}-at-{s}" for p, s in POINTS]


@pytest.mark.parametrize(("failpoint", "stage"), POINTS, ids=IDS)
def test_round_survives_a_crash_at(stack: Stack, failpoint: str, stage: str) -> None:
    cloud = stack.cloud
    game = Round(stack, model_bytes=BIG_MODEL_BYTES if failpoint == "blob-mid-copy" else 64)

    # A: round 1 up to the step under test, then a graceful stop with nothing left over
    a = game.start("a")
    if stage == "eval":
        game.train_completed()
        cloud.wait_status(JOB, "eval", "ready")
    with probe_of(stack.redis_url) as probe:
        wait_until(lambda: probe.outbox_depth() == 0, 10, "A's outbox to drain")
        assert a.stop() == 0
        assert probe.pending_effects() == 0

        # B: dies at the failpoint on the next report
        env = {**QUIET_POLLS, "LIFELONG_FAILPOINTS": failpoint}
        if failpoint in POOL_ONLY:
            env["LIFELONG_INLINE_EFFECT_BYTES"] = "0"
        b = stack.controller("b", env=env)
        if stage == "eval":
            game.eval_completed()
        else:
            game.train_completed()
        assert wait_exit(b) == EXIT_CODE
        assert f"failpoint {failpoint}" in b.log()
        eval_data = game.out / "data" / "eval" / "1" / "data.txt"
        if failpoint == "blob-mid-write":
            assert not eval_data.exists(), "a half-written round file is never in place"
        if failpoint == "blob-mid-copy":
            assert (game.out / "deploy" / "index.pkl").read_bytes() == OLD_DEPLOY
        if failpoint == "result-before-commit":
            # B wrote the eval round and handed its result to its own processor, then died
            # before the commit that applies it: the intent is still pending for C
            assert "wrote 2 samples" in b.log()
            assert eval_data.exists()
            assert probe.pending_effects() == 1
        if failpoint == "process-before-commit":
            # B wrote the eval round (or copied the model) on its processor's thread and died
            # before the commit that applies it: no intent was stored; the report waits
            assert probe.pending_effects() == 0
            if stage == "train":
                assert "wrote 2 samples" in b.log()
                assert eval_data.exists()
            else:
                assert (game.out / "deploy" / "index.pkl").read_bytes() == game.eval_model

        # C: finishes the round from wherever B stopped
        c = stack.controller("c")
        if stage == "train":
            cloud.wait_status(JOB, "eval", "ready", timeout_s=20)
            game.eval_completed()
        cloud.wait_status(JOB, "deploy", "ready", timeout_s=20)
        wait_until(lambda: probe.pending_effects() == 0, 10, "C's effects to finish")
        if failpoint == "result-before-commit" or (failpoint, stage) == (
            "process-before-commit", "train"
        ):
            assert "wrote 2 samples" in c.log(), "C redid the effect B's death left undone"
        game.assert_complete(probe)
    # seed bug 11 even across a crash: the staging file a dead writer left behind is swept
    # by the next write to the same place
    orphans = sorted(p.name for p in game.out.rglob(".*.tmp"))
    assert not orphans, f"staging files orphaned by the crash: {orphans}"
