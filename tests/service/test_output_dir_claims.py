"""Two jobs, one outputDir: the second is refused, naming the first.

Two jobs in different namespaces given the same outputDir used to overwrite each other's
round files and deployed model. Now each job claims its outputDir in Redis (one key per
outputDir) when inserted; the second job to claim it is refused on the errors topic with a
reason naming the holder, the claim survives a restart of the controller, and it is released
when its job is deleted, after which the other job can have the outputDir.
"""

from __future__ import annotations

from typing import Any

from service.adapters.redis_store import RedisStore
from service.keys import Keys, job_key
from tests.harness import job_resource
from tests.stack import Stack
from tests.wait import wait_until


def job_in(namespace: str, name: str, output_dir: str, **kw: Any) -> dict[str, Any]:
    job = job_resource(name, "some-dataset", output_dir, **kw)
    job["metadata"]["namespace"] = namespace
    return job


def test_an_output_dir_belongs_to_one_job_at_a_time(stack: Stack) -> None:
    cloud = stack.cloud
    shared = str(stack.workdir / "out" / "shared")
    controller = stack.serving()
    store = RedisStore(stack.redis_url, Keys())
    alpha, beta, gamma = (job_key("default", "alpha"), job_key("team-b", "beta"),
                          job_key("team-c", "gamma"))  # fmt: skip

    def exists(rkey: str) -> bool:
        return store.states.load([rkey])[rkey] is not None

    try:
        cloud.downstream("lifelonglearningjob", "insert", job_in("default", "alpha", shared))
        wait_until(lambda: exists(alpha), 15, "job alpha")
        cloud.downstream("lifelonglearningjob", "insert", job_in("team-b", "beta", shared + "/"))
        refusal = cloud.wait_for(cloud.errors, 15, "beta's refusal")[0]
        assert refusal["topic"].endswith("/downstream")
        assert f"outputDir {shared}/ is already used by job default/alpha" in refusal["reason"]
        assert not exists(beta)

        # the claim lives in Redis: a restarted controller still refuses a third job
        controller.stop()
        controller.start()
        controller.wait_ready()
        cloud.downstream("lifelonglearningjob", "insert", job_in("team-c", "gamma", shared))
        cloud.wait_for(lambda: len(cloud.errors()) == 2, 15, "gamma's refusal")
        assert "already used by job default/alpha" in cloud.errors()[1]["reason"]
        assert not exists(gamma)

        # deleting alpha releases the claim; beta may have the outputDir now
        cloud.downstream("lifelonglearningjob", "delete", None, name="alpha")
        wait_until(lambda: not exists(alpha), 15, "alpha deleted")
        again = job_in("team-b", "beta", shared, train_prob=0.7)  # not the first insert's bytes
        cloud.downstream("lifelonglearningjob", "insert", again)
        wait_until(lambda: exists(beta), 15, "job beta")
        assert len(cloud.errors()) == 2, cloud.errors()
    finally:
        store.close()
