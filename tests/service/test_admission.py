"""What the intake admits, against a real `lifelong serve` and Redis: datasets only for the
controller's own node, and no more resources, or larger ones, than the node keeps (before:
a dataset for any node was taken and watched; 100 jobs of 853 KB grew Redis from 2.7 to
68 MB, without a limit). Each refusal says why, on the errors topic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.adapters.redis_store import RedisStore
from service.keys import Keys, dataset_key, job_key
from tests.harness import NS, dataset_resource, job_resource, metric_sum, wait_ingress
from tests.stack import Stack
from tests.wait import wait_until


def stored(store: RedisStore, rkey: str) -> bool:
    return store.states.load_resource(rkey) is not None


def reasons(stack: Stack) -> list[str]:
    return [str(e["reason"]) for e in stack.cloud.errors()]


def dataset(name: str, path: Path, *, namespace: str = NS, pad: int = 0) -> dict[str, Any]:
    resource = dataset_resource(name, str(path))
    resource["metadata"]["namespace"] = namespace
    if pad:
        resource["metadata"]["annotations"] = {"note": "x" * pad}
    return resource


def test_a_dataset_for_another_node_is_refused_and_jobs_are_not(stack: Stack) -> None:
    data = stack.workdir / "train.txt"
    data.write_text("a\n")
    controller = stack.serving()
    store = RedisStore(stack.redis_url, Keys())
    try:
        foreign = dataset("elsewhere", data)
        foreign["spec"]["nodeName"] = "other-node"
        stack.cloud.downstream("dataset", "insert", foreign)
        stack.cloud.wait_for(
            lambda: any("the dataset is for node 'other-node'" in r for r in reasons(stack)),
            10, "the refusal",
        )  # fmt: skip
        assert "$.spec.nodeName" in reasons(stack)[-1]
        assert metric_sum(controller, "lifelong_rejections_total", reason="wrong_node") == 1
        # the valid neighbours: a dataset for this node, a job whose pods run elsewhere
        stack.cloud.downstream("dataset", "insert", dataset("here", data))
        job = job_resource("a-job", "here", str(stack.workdir / "out"))
        job["spec"]["trainSpec"]["template"]["spec"]["nodeName"] = "other-node"
        stack.cloud.downstream("lifelonglearningjob", "insert", job)
        wait_until(
            lambda: stored(store, dataset_key(NS, "here")) and stored(store, job_key(NS, "a-job")),
            10, "the dataset and the job kept",
        )  # fmt: skip
        assert not stored(store, dataset_key(NS, "elsewhere"))
        assert len(reasons(stack)) == 1
    finally:
        store.close()


def test_caps_on_count_per_node_and_namespace_and_on_size(stack: Stack) -> None:
    data = stack.workdir / "train.txt"
    data.write_text("a\n")
    controller = stack.controller(env={
        "LIFELONG_MAX_RESOURCES": "3", "LIFELONG_MAX_NAMESPACE_RESOURCES": "2",
        "LIFELONG_MAX_RESOURCE_BYTES": "4KiB",
    })  # fmt: skip
    wait_ingress(controller, stack.cloud)
    store = RedisStore(stack.redis_url, Keys())
    cloud = stack.cloud

    def refused(text: str, count: int = 1) -> None:
        cloud.wait_for(lambda: sum(text in r for r in reasons(stack)) == count, 10, text)

    try:
        cloud.downstream("dataset", "insert", dataset("d1", data))
        cloud.downstream("dataset", "insert", dataset("d2", data))
        cloud.downstream("dataset", "insert", dataset("d3", data))  # a third in `default`
        refused("resources of namespace 'default', the most it may")
        cloud.downstream("dataset", "insert", dataset("o1", data, namespace="other"))
        cloud.downstream("dataset", "insert", dataset("o2", data, namespace="other"))
        refused("the node keeps 3 resources, the most it may (LIFELONG_MAX_RESOURCES=3)")
        wait_until(lambda: all(stored(store, dataset_key(ns, n)) for ns, n in
                               ((NS, "d1"), (NS, "d2"), ("other", "o1"))),
                   10, "the three within the caps kept")  # fmt: skip

        # an update of a kept resource is no new one: taken at the cap
        cloud.downstream("dataset", "insert", dataset("d1", data, pad=3000))
        wait_until(lambda: b"xxxx" in (store.states.load_resource(dataset_key(NS, "d1")) or b""),
                   10, "the update of d1")  # fmt: skip
        # but not beyond the size cap
        cloud.downstream("dataset", "insert", dataset("d1", data, pad=5000))
        refused("more than the 4096 a node keeps of one (LIFELONG_MAX_RESOURCE_BYTES)")
        assert metric_sum(controller, "lifelong_rejections_total", reason="too_many") == 2
        assert metric_sum(controller, "lifelong_rejections_total", reason="too_large") == 1

        # a delete makes room again, once it is applied
        cloud.downstream("dataset", "delete", dataset("d2", data))
        wait_until(lambda: not stored(store, dataset_key(NS, "d2")), 10, "d2 deleted")
        d3 = dataset("d3", data)

        def d3_kept() -> bool:
            if not stored(store, dataset_key(NS, "d3")):
                cloud.downstream("dataset", "insert", d3)  # the counts are read again within 1 s
            return stored(store, dataset_key(NS, "d3"))

        wait_until(d3_kept, 10, "d3 taken once d2 is gone")
    finally:
        store.close()
