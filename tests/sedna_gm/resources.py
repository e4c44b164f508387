"""The incremental-learning resources a test applies to the GM stand-in (`SednaGm.apply`),
shaped as Sedna's helmet-detection example writes them: a Model, and an
IncrementalLearningJob whose initial model, deploy model and dataset are named."""

from typing import Any


def model_resource(
    name: str, url: str, fmt: str = "pkl", namespace: str = "default"
) -> dict[str, Any]:
    return {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "Model",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"url": url, "format": fmt},
    }


def il_job_resource(
    name: str,
    dataset: str,
    output_dir: str,
    *,
    initial_model: str,
    deploy_model: str,
    node: str,
    eval_node: str | None = None,
    hot_update: bool = False,
    poll_period_s: int = 60,
    initial_eval_model: str | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """An IncrementalLearningJob whose pods run on ``node`` (the eval pod on ``eval_node``
    when given); ``hot_update`` enables the deploy model's hot update."""

    def template(on: str) -> dict[str, Any]:
        return {"spec": {"nodeName": on, "containers": [{"image": "x", "name": "w"}]}}

    trigger = {"condition": {"operator": ">", "threshold": 0, "metric": "num_of_samples"}}
    deploy_model_spec: dict[str, Any] = {"name": deploy_model}
    if hot_update:
        deploy_model_spec |= {"hotUpdateEnabled": True, "pollPeriodSeconds": poll_period_s}
    eval_spec: dict[str, Any] = {"template": template(eval_node or node)}
    if initial_eval_model is not None:
        eval_spec["initialEvalModel"] = {"name": initial_eval_model}
    return {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "IncrementalLearningJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "initialModel": {"name": initial_model},
            "dataset": {"name": dataset, "trainProb": 0.8},
            "trainSpec": {
                "template": template(node),
                "trigger": {"checkPeriodSeconds": 1, **trigger},
            },
            "evalSpec": eval_spec,
            "deploySpec": {
                "model": deploy_model_spec,
                "trigger": {
                    "condition": {"operator": ">", "threshold": 0.1, "metric": "precision_delta"}
                },
                "hardExampleMining": {
                    "name": "IBT",
                    "parameters": [{"key": "threshold_img", "value": "0.9"}],
                },
                "template": template(node),
            },
            "outputDir": output_dir,
        },
    }
