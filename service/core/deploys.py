"""A job's deploy decision, the deploy gate, and rollbacks.

    eval/running --eval completed--> [deploy gate] --holds--> deploy/copying --copied--> train
                                                   --fails--> train (held back: no copy)

Without a deploy condition every evaluated model is copied to the deploy file, as before.
With one, the gate (`service.core.gate`) judges the eval report; a model it holds back is
never copied: the deploy file keeps what it has, the cloud hears deploy `completed` (Sedna's
incremental-learning LC's "nothing to deploy") with the values compared, and the round's
train samples go back to the front of the pending set, so the next round learns from them
too; but only samples arriving from then on count for its trigger (a held-back model is not
retrained on the same data in a loop). A held-back round is not a failure: the failure count
resets as after a deploy.

A rollback copies an earlier deployment's model back to the deploy file with the same
whole-file copy. It may run beside a round in train, or in eval when the eval compares
nothing with the deployed model. It is refused (with the reason) while a deploy copy is in
flight or waiting, while another rollback's copy is in flight, and while an eval compares
its model with the deployed one (a rollback would change what the gate compares with). A
deploy copy that becomes due while a rollback's copy is in flight waits for it in
deploy/waiting, so the two never race for the file.
"""


import json
from typing import Any

import msgspec

from service.core import conditions, kinds, reports, samples, training
from service.core.effects import CopyModel, Recorder, RecordRound, Refused, Reject
from service.core.events import Event, ModelCopied, RollbackRequested, WorkerReported
from service.core.gate import GateVerdict, judge, kept
from service.core.paths import add_prefix
from service.core.rounds import Deployment, RoundRecord, Scores, remember
from service.core.state import JobState, ModelRef
from service.wire import GateResult, JobInput, JobOutput, JobStatus, RollbackResult

replace = msgspec.structs.replace


# ================================================================= the deploy decision
def eval_completed(job: JobState, event: Event, out: Recorder) -> JobState:
    assert isinstance(event, WorkerReported)
    models = training.kept_models(event, out)
    gated = job.spec.gate is not None
    if not models or (gated and not reports.usable_models(event.results[:1])):
        return training.no_usable_model(job, event, out)  # gated: the first is the new one
    new_metrics = reports.usable_models(event.results)[0].metrics
    old_metrics = _deployed_metrics(job, event) if gated else None
    scores = Scores(
        version=job.version,
        candidate=kept(new_metrics),
        deployed=kept(old_metrics) if old_metrics is not None else {},
        deployed_version=_compared_version(job) if old_metrics is not None else None,
    )
    current = replace(
        job.current or RoundRecord(version=job.version),
        deploy_started_ms=out.ctx.now_ms, candidate=scores.candidate, deployed=scores.deployed,
    )  # fmt: skip
    job = replace(
        job, phase="deploy", step="staged", eval_models=models, scores=scores, current=current,
        gm_sent=None,
    )  # fmt: skip
    if gated:
        verdict, result = _judge(job, new_metrics, old_metrics)
        job = replace(job, current=replace(current, gate=result, reason=verdict.reason))
    if conditions.may_start(job, out, "deploy"):
        return decide(job, out, list(event.results[:2]))
    out.note(
        f"round {job.version} evaluated; its deploy decision waits for Sedna's GM to show "
        "Deploy/Waiting"
    )
    return job


def decide(job: JobState, out: Recorder, results: list[dict[str, Any]] | None = None) -> JobState:
    """The evaluated model is deployed, unless the deploy gate held it back (`results`: the
    eval's, shown with the held-back status; by default those the job kept)."""
    gate = job.current.gate if job.current is not None else None
    if job.spec.gate is not None and gate is not None and not gate.holds:
        assert job.current is not None
        why = job.current.reason or "the deploy condition does not hold"
        return _hold_back(job, why, _results_kept(job) if results is None else results, out)
    return _deploy(job, out)


def _compared_version(job: JobState) -> int | None:
    return job.current.deployed_version if job.current is not None else None


def _deployed_metrics(job: JobState, event: WorkerReported) -> object | None:
    """The deployed model's reported metrics: the report's second result, when the eval was
    given a deployed model to score. None: nothing to compare with."""
    if _compared_version(job) is None or len(event.results) < 2:
        return None
    return event.results[1].get("metrics")


def _judge(
    job: JobState, new_metrics: object, old_metrics: object | None
) -> tuple[GateVerdict, GateResult]:
    gate = job.spec.gate
    assert gate is not None
    compared = _compared_version(job)
    deploying = kinds.compared(job)  # what the deploy target holds once copies land
    now_deployed = deploying.version if deploying is not None else None
    if compared is not None and compared != now_deployed:
        reason = (
            f"the deployed model changed during the eval (version {compared} then, "
            f"{now_deployed} now): the next round compares with it"
        )
        verdict = GateVerdict(holds=False, reason=reason)
    else:
        verdict = judge(gate, new_metrics, old_metrics)
        if compared is not None and old_metrics is None:
            note = "the report has only the new model's result: judged as if nothing deployed"
            verdict = replace(verdict, reason=f"{verdict.reason} ({note})")
    result = GateResult(
        metric=gate.metric, operator=gate.operator, threshold=gate.threshold_value or 0.0,
        value=verdict.value, holds=verdict.holds, version=job.version,
        deployed_version=compared if old_metrics is not None else None,
    )  # fmt: skip
    return verdict, result


def _deploy(job: JobState, out: Recorder) -> JobState:
    if job.rollback is not None:
        out.note(
            f"round {job.version}: the deploy copy waits for the rollback to version "
            f"{job.rollback.version} to finish copying"
        )
        return replace(job, phase="deploy", step="waiting")
    out.add(_copy(job, job.eval_models[0], job.version, out))
    return replace(job, phase="deploy", step="copying")


def _copy(
    job: JobState, model: ModelRef, version: int, out: Recorder, *,
    rollback: Deployment | None = None,
) -> CopyModel:  # fmt: skip
    prefix = out.ctx.volume_prefix
    target, hot_update = kinds.deploy_target(job, model.url, prefix)
    return CopyModel(
        id=out.next_id(),
        namespace=job.namespace,
        name=job.name,
        version=version,
        src_url=add_prefix(prefix, model.url),
        dst_url=target,
        rollback=rollback is not None,
        expect=rollback.digest if rollback is not None else None,
        output_dir=add_prefix(prefix, job.spec.output_dir),
        hot_update=hot_update,
    )


def _hold_back(job: JobState, why: str, results: list[dict[str, Any]], out: Recorder) -> JobState:
    """No copy: the deploy file keeps its model; the samples wait for the next round. The
    cloud hears the values compared: `gate`, and the eval's `results` as `output.models`."""
    reason = f"held back by the deploy gate: {why}"
    output = JobOutput(models=results, owner_info=msgspec.Raw(b"{}"))
    gate = job.current.gate if job.current is not None else None
    status = JobStatus(phase="deploy", status="completed", reason=reason, output=output, gate=gate)
    training.publish(job, out, status)
    returned = samples.count(job.trained)
    job = replace(
        job, phase="train", step="waiting", pending=samples.concat(job.trained, job.pending),
        returned=returned, last_error=None, consecutive_failures=0, retry_at_ms=None,
        next_check_ms=None,
    )  # fmt: skip
    out.note(
        f"round {job.version} {reason}; its {returned} train samples join the next round, "
        "which starts when the trigger holds for samples arriving from now on"
    )
    job = training.end_round(job, out, "held_back", reason)
    return training.check_trigger(job, out, reschedule=True)


def model_copied(job: JobState, event: Event, out: Recorder) -> JobState:
    assert isinstance(event, ModelCopied)
    if training.stale_round(job, event, out):
        return job
    models = JobInput(models=kinds.deployed_models(job))
    gate = job.current.gate if job.current is not None else None
    job = replace(job, phase="train", step="waiting", next_check_ms=None)
    if event.error is not None:
        status = JobStatus(
            phase="deploy", status="failed", reason=event.error, input=models, gate=gate
        )
        training.publish(job, out, status)
        what = f"deploy of round {job.version} failed"
        return training.round_failed(job, out, what, event.error)
    training.publish(job, out, JobStatus(phase="deploy", status="ready", input=models, gate=gate))
    scores = job.scores if job.scores is not None and job.scores.version == job.version else None
    new = Deployment(
        version=job.version, model=job.eval_models[0], at_ms=out.ctx.now_ms,
        metrics=scores.candidate if scores is not None else {}, digest=event.digest,
    )  # fmt: skip
    job = replace(
        job, deployed=new, deployments=remember(job.deployments, job.deployed, new.version),
        last_error=None, consecutive_failures=0, retry_at_ms=None,
    )  # fmt: skip
    job = training.end_round(job, out, "deployed")
    return training.check_trigger(job, out, reschedule=True)


# ================================================================= rollback
def rollback_requested(
    state: JobState | None, event: RollbackRequested, out: Recorder
) -> JobState | None:
    what = f"rollback of job {event.namespace}/{event.name}"
    if state is None:
        reason = f"{what} refused: unknown job {event.namespace}/{event.name}"
        out.add(Reject(code="unknown_job", reason=reason))
        return None
    target, problem = _target(state, event.version)
    problem = _unsafe(state) or problem
    if problem is not None or target is None:
        out.add(Reject(code="rollback_refused", reason=f"{what} refused: {problem}"))
        return state
    out.add(_copy(state, target.model, target.version, out, rollback=target))
    deployed = state.deployed.version if state.deployed is not None else None
    out.note(f"rollback from version {deployed} to version {target.version}: copying its model")
    return replace(state, rollback=replace(target, at_ms=out.ctx.now_ms))


def _target(job: JobState, version: int | None) -> tuple[Deployment | None, str | None]:
    """The deployment a rollback restores, or why there is none."""
    if job.deployed is None:
        return None, "nothing has been deployed yet"
    if version is None:
        if not job.deployments:
            current = job.deployed.version
            return None, f"version {current} is the only one deployed so far: no earlier one"
        return job.deployments[-1], None
    if version == job.deployed.version:
        return None, f"version {version} is deployed already"
    for deployment in job.deployments:
        if deployment.version == version:
            return deployment, None
    earlier = ", ".join(str(d.version) for d in reversed(job.deployments)) or "none"
    return None, f"version {version} was not deployed recently (it can restore: {earlier})"


def _unsafe(job: JobState) -> str | None:
    """Why a rollback cannot start now, mid-round (None: it can)."""
    if job.rollback is not None:
        return f"the rollback to version {job.rollback.version} is still copying"
    if job.phase == "deploy":
        doing = "in flight" if job.step == "copying" else "waiting to start"
        return f"round {job.version}'s deploy copy is {doing}; try again once it is done"
    compared = kinds.compared(job)
    if job.phase == "eval" and compared is not None:
        return (
            f"round {job.version} is in eval, comparing its model with the deployed version "
            f"{compared.version}; try again after its deploy decision"
        )
    return None


def rollback_copied(job: JobState, event: ModelCopied, out: Recorder) -> JobState:
    """A rollback's copy is done (or failed: then it is refused after all)."""
    target = job.rollback
    if target is None or target.version != event.version:
        out.note(f"rollback copy of version {event.version} while none is in flight: ignored")
        return job
    previous = job.deployed
    record = RoundRecord(
        version=target.version, kind="rollback", deploy_started_ms=target.at_ms,
        ended_ms=out.ctx.now_ms, candidate=target.metrics,
        deployed_version=previous.version if previous is not None else None,
    )  # fmt: skip
    job = replace(job, rollback=None)
    if event.error is not None:
        reason = f"rollback of job {job.namespace}/{job.name} to version {target.version} "
        subject = json.dumps({"job": f"{job.namespace}/{job.name}", "version": target.version})
        out.add(Refused(code="rollback_refused", reason=f"{reason}refused: {event.error}",
                        subject=subject))  # fmt: skip
        refused = replace(record, outcome="refused", reason=event.error, candidate={})
        out.add(RecordRound(record=refused))
        if _waiting_on(job, target.version):
            why = f"the rollback to version {target.version} it was compared with failed"
            return _hold_back(job, why, _results_kept(job), out)
        return _after_rollback(job, out)
    from_version = previous.version if previous is not None else None
    rolled = RollbackResult(to_version=target.version, from_version=from_version)
    reason = f"rolled back from version {from_version} to version {target.version}"
    job = replace(
        job, deployed=replace(target, at_ms=out.ctx.now_ms),
        deployments=remember(job.deployments, previous, target.version),
    )  # fmt: skip
    out.add(RecordRound(record=replace(record, outcome="rolled_back", reason=reason)))
    if conditions.managed(job):
        out.note(
            f"rollback to version {target.version} copied; its deploy ready waits for Sedna's "
            "GM to show Train/Waiting (between rounds)"
        )
        job = replace(job, gm_rollback=rolled)
        if (job.phase, job.step) == ("train", "waiting"):
            job = conditions.advance(job, out)
    else:
        publish_rollback(job, rolled, out)
    return _after_rollback(job, out)


def publish_rollback(job: JobState, rolled: RollbackResult, out: Recorder) -> None:
    """A rollback's deploy ready: the deploy file holds the rolled-back version's model."""
    reason = f"rolled back from version {rolled.from_version} to version {rolled.to_version}"
    models = [job.deployed.model] if job.deployed is not None else []
    status = JobStatus(
        phase="deploy", status="ready", reason=reason, input=JobInput(models=models),
        rollback=rolled,
    )  # fmt: skip
    training.publish(job, out, status)


def _waiting_on(job: JobState, version: int) -> bool:
    """Whether a deploy copy waits whose gate compared the new model with `version`."""
    compared = _compared_version(job) if job.spec.gate is not None else None
    return (job.phase, job.step) == ("deploy", "waiting") and compared == version


def _results_kept(job: JobState) -> list[dict[str, Any]]:
    """The eval's results as the job kept them: the new model and the metrics compared."""
    scores = job.scores or Scores(version=job.version)
    measured = (scores.candidate, scores.deployed)
    return [
        {"format": model.format, "url": model.url, "metrics": metrics}
        for model, metrics in zip(job.eval_models[:2], measured, strict=False)
    ]


def _after_rollback(job: JobState, out: Recorder) -> JobState:
    """A deploy copy that waited for the rollback's starts now."""
    if (job.phase, job.step) != ("deploy", "waiting"):
        return job
    out.add(_copy(job, job.eval_models[0], job.version, out))
    return replace(job, step="copying")
