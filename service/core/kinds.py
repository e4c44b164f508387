"""What differs between the two job kinds: where a round's models come from, what an eval
compares, and where a deployed model goes. Pure; everything else about a round (trigger,
round files, reports, gate, backoff, history, rollback) is the same for both.

A lifelong-learning job trains from scratch each round, compares the new model with the one
deployed only when it has a deploy gate, and deploys to its outputDir's `deploy/index.pkl`.

An incremental-learning job (Sedna's IncrementalLearningJob) names Models: its first round
trains from its initial Model, every later one from the model the round before trained; each
eval scores the new model and the deployed one (before any deploy: `evalSpec
.initialEvalModel`, else the deploy Model as it is), so its deploy trigger can compare them;
a model that passes is copied to the deploy Model's url and, with hot update, also next to
the inference worker's model config file, which is then rewritten to name it. Where a train
worker reports several models (one per device SoC, say), the one used is chosen as Sedna
chooses: the first in the target Model's format and, when the Model lists device SoC
versions and the model names exactly one, one of them.
"""

import posixpath
from collections.abc import Sequence

from service.core.effects import HotUpdate
from service.core.paths import add_prefix, deploy_model
from service.core.rounds import Deployment
from service.core.state import JobState, ModelInfo
from service.wire import HOT_UPDATE_CONTAINER_DIR, ModelRef


def ref(model: ModelInfo) -> ModelRef:
    """A Model as a worker's input names it."""
    return ModelRef(format=model.format, url=model.url, devices=list(model.devices))


def choose(models: Sequence[ModelRef], target: ModelInfo) -> ModelRef | None:
    """The first of `models` that fits `target`: its format (any, when the Model names
    none) and, when the Model lists device SoC versions and the model names exactly one,
    one of those; None when none fits."""
    for model in models:
        if target.format and model.format != target.format:
            continue
        if target.devices and len(model.devices) == 1 and model.devices[0] not in target.devices:
            continue
        return model
    return None


def _described(target: ModelInfo, name: str) -> str:
    devices = f" and device SoC versions {', '.join(target.devices)}" if target.devices else ""
    return f"Model {name}'s format {target.format or '(any)'}{devices}"


def train_models(job: JobState) -> tuple[tuple[ModelRef, ...], str | None]:
    """The models a train round starts from, and a note when the choice needs one: none for
    a lifelong-learning job; the initial Model for an incremental-learning job's first
    round (or when none of the last training's models fits it), else the last trained."""
    spec = job.spec.incremental
    initial = job.models.initial if job.models is not None else None
    if spec is None or initial is None:
        return (), None
    if not job.train_models:
        return (ref(initial),), None
    chosen = choose(job.train_models, initial)
    if chosen is None:
        fits = _described(initial, spec.initial_model)
        note = (
            f"none of the last training's models fits {fits}: this round trains from the "
            "initial model again"
        )
        return (ref(initial),), note
    return (chosen,), None


def eval_models(job: JobState) -> tuple[tuple[ModelRef, ...], str | None]:
    """The trained models an eval scores (before the compared one), or why there is none:
    every model the round trained for a lifelong-learning job; for an incremental-learning
    job, the one that fits the Model its evals compare with."""
    spec = job.spec.incremental
    if spec is None:
        return job.train_models, None
    target = job.models.compared if job.models is not None else None
    chosen = choose(job.train_models, target) if target is not None else None
    if target is None or chosen is None:
        fits = f"Model {spec.compared_model}" if target is None else _described(
            target, spec.compared_model
        )  # fmt: skip
        return (), f"no trained model fits {fits}"
    return (chosen,), None


def compared(job: JobState) -> Deployment | None:
    """The deployment an eval compares the new model with: the one deployed, or the one a
    rollback in flight restores, named by its round's own model file. A lifelong-learning
    job compares only with a deploy gate; an incremental-learning job always does, with
    its compared Model (as version 0) while nothing is deployed."""
    deployed = job.rollback or job.deployed
    if job.spec.incremental is None:
        return deployed if job.spec.gate is not None else None
    compared_model = job.models.compared if job.models is not None else None
    if deployed is not None or compared_model is None:
        return deployed
    return Deployment(version=0, model=ref(compared_model), at_ms=0)


def deployed_models(job: JobState) -> list[ModelRef]:
    """What a deploy `ready` names: the models the eval scored (lifelong learning); the
    deployed model and the deploy Model (incremental learning, as Sedna's controller says
    it)."""
    deploy = job.models.deploy if job.models is not None else None
    if job.spec.incremental is None or deploy is None:
        return list(job.eval_models)
    return [*job.eval_models[:1], ref(deploy)]


def deploy_target(job: JobState, model_url: str, prefix: str) -> tuple[str, HotUpdate | None]:
    """Where a deployed model of `model_url` goes, as on disk: the outputDir's deploy file
    (lifelong learning), or the deploy Model's url and, with hot update, beside the
    inference worker's config file under its own file name (incremental learning)."""
    spec = job.spec.incremental
    if spec is None:
        return add_prefix(prefix, deploy_model(job.spec.output_dir)), None
    deploy = job.models.deploy if job.models is not None else None
    assert deploy is not None, "the eval round that led here looked the deploy Model up"
    target = add_prefix(prefix, deploy.url)
    if spec.hot_update_config is None:
        return target, None
    name = posixpath.basename(model_url.rstrip("/")) or "model"
    directory = posixpath.dirname(spec.hot_update_config)
    return target, HotUpdate(
        config=add_prefix(prefix, spec.hot_update_config),
        model_file=add_prefix(prefix, posixpath.join(directory, name)),
        model_path=posixpath.join(HOT_UPDATE_CONTAINER_DIR, name),
    )
