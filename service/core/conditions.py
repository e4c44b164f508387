"""Jobs managed by Sedna's global manager (GM): the GM's conditions drive them.

Sedna's GM runs each job's stage machine as a list of conditions (stage Train, Eval or
Deploy; type Waiting, Ready, Starting, Running, Completed or Failed) and re-sends the whole
job, status included, after every change. It writes a job's status whole from a cached copy
that may lag, so a condition the controller appends while the GM works on an older copy can
be overwritten: a `ready` sent right behind a `completed` is lost, and the job stalls. Sedna's
own local controller therefore acts level-triggered on the latest copy, and so does this
one, for every job that came over the GM link:

    GM shows Train/Waiting  -> judge the trigger; fired: write the round's train data -> ready
    GM shows Eval/Waiting   -> write the eval data (the train stage is done) -> eval ready
    GM shows Deploy/Waiting -> the deploy decision: copy -> deploy ready, or, when the deploy
                               gate holds the model back, deploy completed (nothing deployed)

Until the GM shows it, a due stage waits in step `staged`. A stage is "shown" only by a copy
that holds every status the job sent the GM: the GM appends one condition marked "reported
by lc" per status it takes in, so the copy must hold as many of them as the job has sent
(`gm_reported`); once one did, every later copy counts too, also one whose write-back lost
a status again (it was written after the GM took the status in). A ready thus never follows
the completed before it until the GM has taken that in, and goes out at most once per
(round, stage). When no copy is seen holding a status the job sent (the write-back dropped
it before its copy went out), the job believes the GM's latest copy `STAGED_DOUBT_MS` after
it last sent something when a stage waits to start (a staged stage, or the next round's
train trigger at Train/Waiting), else after `Context.gm_resend_ms`. While the GM still
shows a stage `Waiting` `gm_resend_ms` after its ready went out (the frame died with its
connection, or the write-back dropped it), the same ready is sent again.

When the GM moves the job elsewhere mid-round (a pod failed: `*/Failed`, then
`Train/Waiting`), the job follows: the round fails as on a worker's `failed` report. When the
GM shows a stage completed that this controller did not hear (its worker ran on another
node and reported there), the models come from the GM's condition data, bound to the round
like a report's. A controller without the job's dataset is not its dataset node: it only
binds and forwards its workers' reports (`reports` reads the round from `round_dir`).

Only statuses the GM accepts go to it (`Publish.to_gm`): ready, completed, failed and
waiting of the train, eval and deploy phases, and dataset statuses; everything else (worker
`running` reports, inference and deploy-worker reports) goes to the MQTT upstream topic only.
"""

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from service.core import deploys, reports, training
from service.core.effects import GM_PHASES, Publish, Recorder
from service.core.events import Tick, WorkerReported
from service.core.state import GmSent, GmView, JobState, Phase
from service.wire import DatasetStatus, JobCondition, JobStatus

replace = msgspec.structs.replace

#: How many models of a condition's data a view keeps (as a report's models are kept).
_MODELS_KEPT = reports.MAX_MODELS_KEPT
#: The stages whose condition makes a running stage's end: the GM went past it, or back.
_FAILED = "failed"

#: How long a job with a stage waiting to start (staged, or its train trigger) doubts a copy
#: that lacks a status it sent the GM. The GM takes a status in and sends the copy that
#: holds it within milliseconds; when its write-back dropped the status before that copy
#: went out (a forwarded `completed` racing the GM's own pod-succeeded path), no copy ever
#: holds it, and the job believes the latest copy after this long instead of after
#: `Context.gm_resend_ms`.
STAGED_DOUBT_MS = 2_000

_status_decoder = msgspec.json.Decoder(JobStatus)
_encoder = msgspec.json.Encoder()


# ================================================================= the GM's copy
class _Input(msgspec.Struct, frozen=True):
    output_dir: object = msgspec.field(default=None, name="outputDir")


class _Output(msgspec.Struct, frozen=True):
    models: object = None


class _Data(msgspec.Struct, frozen=True):
    """What a condition's data holds that the controller reads (the GM writes it from the
    status that made the condition: `{input, output}`)."""

    input: _Input | None = None
    output: _Output | None = None


_data_decoder = msgspec.json.Decoder(_Data)
#: The message of the conditions Sedna's GM appends for the statuses a node reports.
REPORTED_BY_LC = "reported by lc"


def view_of(conditions: Sequence[JobCondition]) -> GmView:
    """What a GM copy's conditions show: the latest one, how many, the round it runs, and
    the models its latest completed train and eval stages carry."""
    reported = sum(1 for c in conditions if c.message == REPORTED_BY_LC)
    view = GmView(count=len(conditions), reported=reported)
    if conditions:
        latest = conditions[-1]
        stage, kind = latest.stage.lower(), latest.type.lower()
        if stage in GM_PHASES:
            view = replace(view, stage=_phase(stage), type=kind)
    return replace(
        view,
        round_dir=_round_dir(conditions),
        trained=_completed_models(conditions, "train"),
        evaluated=_completed_models(conditions, "eval"),
    )


def _phase(stage: str) -> Phase:
    return "eval" if stage == "eval" else "deploy" if stage == "deploy" else "train"


def _data(condition: JobCondition) -> _Data:
    if not condition.data:
        return _Data()
    try:
        return _data_decoder.decode(condition.data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _Data()


def _round_dir(conditions: Sequence[JobCondition]) -> str:
    for condition in reversed(conditions):
        if condition.type.lower() == "ready":
            data = _data(condition)
            out = data.input.output_dir if data.input is not None else None
            if isinstance(out, str):
                return out
    return ""


def _completed_models(conditions: Sequence[JobCondition], stage: str) -> tuple[dict[str, Any], ...]:
    for condition in reversed(conditions):
        if condition.stage.lower() != stage or condition.type.lower() != "completed":
            continue
        data = _data(condition)
        models = data.output.models if data.output is not None else None
        if isinstance(models, list) and models:
            return tuple(_model_fields(m) for m in models[:_MODELS_KEPT] if isinstance(m, dict))
    return ()


def _model_fields(model: dict[str, Any]) -> dict[str, Any]:
    """What a job reads of a model in condition data: its format, url and metrics."""
    return {k: model[k] for k in ("format", "url", "metrics") if k in model}


# ================================================================= reading the view
def managed(job: JobState) -> bool:
    """Whether Sedna's GM drives the job (it came over the GM link)."""
    return job.gm is not None


def published_to_gm(out: Recorder) -> bool:
    """Whether this transition already said something the GM appends as a condition."""
    return any(isinstance(e, Publish) and e.to_gm for e in out.effects)


def caught_up(job: JobState) -> bool:
    """Whether the GM's latest copy holds every status the job sent it."""
    return job.gm is not None and job.gm.reported >= job.gm_reported


def shows(job: JobState, out: Recorder, stage: Phase, kind: str = "waiting") -> bool:
    """Whether the GM's latest copy, holding every status the job sent it, shows `stage`
    `kind` (and nothing was said to the GM in this very transition)."""
    gm = job.gm
    return (
        gm is not None
        and caught_up(job)
        and (gm.stage, gm.type) == (stage, kind)
        and not published_to_gm(out)
    )


def may_start(job: JobState, out: Recorder, stage: Phase) -> bool:
    """Whether a stage due now may start: always for an MQTT job; for a GM-managed one, only
    while the GM shows the stage `Waiting`."""
    return not managed(job) or shows(job, out, stage)


# ================================================================= following the GM
def follow(job: JobState, view: GmView, out: Recorder) -> JobState:
    """A new copy from the GM: remember what it shows and do what it asks for."""
    job = replace(job, gm=view)
    if view.reported >= job.gm_reported:
        # the GM holds every status sent so far: a later copy that lost one to the GM's
        # write-back was still written after the GM took it in, so it counts as caught up
        job = replace(job, gm_reported=0)
    sent = job.gm_sent
    if sent is not None and (view.stage, view.type) != (sent.stage, "waiting"):
        job = replace(job, gm_sent=None)  # the GM took the ready in (or moved on)
    if not training.active(job):
        return job  # not the dataset node (or the dataset is away): bind and forward only
    if _moved_back(job):
        return _failed_by_gm(job, out)
    return advance(job, out)


def advance(job: JobState, out: Recorder) -> JobState:
    """Start what the GM's latest copy lets start: the train trigger, a staged stage, a
    stage completed elsewhere, or a rollback's deploy ready."""
    where = (job.phase, job.step)
    if where == ("train", "waiting"):
        if job.gm_rollback is not None:
            return _rollback_ready(job, out)
        if _hot_update_running(job, out):
            return _hot_update_done(job, out)
        return training.check_trigger(job, out, reschedule=False)
    if where == ("eval", "staged") and shows(job, out, "eval"):
        return training.start_eval(job, out)
    if where == ("deploy", "staged") and shows(job, out, "deploy"):
        return deploys.decide(job, out)
    if job.step == "running" and caught_up(job):
        return _completed_elsewhere(job, out)
    return job


def _hot_update_running(job: JobState, out: Recorder) -> bool:
    """Whether the GM holds an incremental-learning job with hot update at Deploy/Starting
    or Deploy/Running: after a deploy `ready` it leaves the running inference worker alone
    and never moves the stage on by itself."""
    return (
        job.spec.incremental is not None
        and job.spec.incremental.hot_update_config is not None
        and any(shows(job, out, "deploy", kind) for kind in ("starting", "running"))
    )


def _hot_update_done(job: JobState, out: Recorder) -> JobState:
    """Tell the GM the deploy stage is over (the inference worker loads the deployed model
    from its config file), so that it moves the job on to Train/Waiting."""
    reason = "hot update: the inference worker loads the deployed model from its config file"
    training.publish(job, out, JobStatus(phase="deploy", status="completed", reason=reason))
    out.note(f"the GM shows the deploy of round {job.version} running: deploy completed sent")
    return job


def _moved_back(job: JobState) -> bool:
    """Whether the GM failed the stage under way: a newer copy shows a stage failed, or the
    job back at Train/Waiting, while the job is past its train trigger."""
    gm = job.gm
    if gm is None or not caught_up(job) or (job.phase, job.step) in _BETWEEN_ROUNDS:
        return False
    return gm.type == _FAILED or (gm.stage, gm.type) == ("train", "waiting")


_BETWEEN_ROUNDS = frozenset({("train", "waiting"), ("train", "preparing")})


def _failed_by_gm(job: JobState, out: Recorder) -> JobState:
    gm = job.gm
    assert gm is not None
    reason = (
        f"Sedna's GM moved the job to {gm.stage.capitalize()}/{gm.type.capitalize()} during "
        f"round {job.version}'s {job.phase} stage (its worker pod failed or was removed)"
    )
    job = training.back_to_train(job, out, reason)
    return advance(job, out)


def _completed_elsewhere(job: JobState, out: Recorder) -> JobState:
    """The GM shows the running stage completed (its worker reported to a controller on
    another node): go on with the models its condition data carries, bound to the round."""
    gm = job.gm
    assert gm is not None
    stage_done = gm.stage != job.phase or gm.type == "completed"
    if not stage_done:
        return job
    results = gm.trained if job.phase == "train" else gm.evaluated
    if job.phase == "deploy":
        return job
    if not results:
        return _unreported(job, out)  # the GM's own condition (its pod ended): a report may follow
    report = WorkerReported(
        namespace=job.namespace, name=job.name, worker=f"{job.name}-{job.phase}-gm",
        kind=job.phase, status="completed", results=results,
    )  # fmt: skip
    refusal = reports.refusal(job, report, out.ctx.volume_prefix)
    if refusal is not None:
        out.note(f"the GM's {job.phase} models are not this round's: {refusal.reason}")
        return _unreported(job, out)
    out.note(f"round {job.version}'s {job.phase} stage completed on another node, says the GM")
    if job.phase == "train":
        return training.train_completed(job, report, out)
    return deploys.eval_completed(job, report, out)


def _unreported(job: JobState, out: Recorder) -> JobState:
    """The GM shows the running stage over (its pod ended) and no model of this round was
    reported, here or through the GM. A report may still be on its way (a worker reports
    before its pod ends, and one on another node reaches the GM through that node's
    controller); `Context.gm_resend_ms` later the round fails, and the GM hears it, so it
    moves the job back to Train/Waiting instead of both waiting for each other for good."""
    now = out.ctx.now_ms
    seen = job.gm_unreported
    if seen is None or seen[:2] != (job.version, job.phase):
        due_ms = now + out.ctx.gm_resend_ms
        out.schedule(due_ms)
        out.note(
            f"the GM shows round {job.version}'s {job.phase} stage over with no model "
            f"reported: the round fails if none comes within {out.ctx.gm_resend_ms / 1000:g} s"
        )
        return replace(job, gm_unreported=(job.version, job.phase, now), next_check_ms=due_ms)
    if now < seen[2] + out.ctx.gm_resend_ms:
        return job
    reason = (
        f"Sedna's GM shows round {job.version}'s {job.phase} stage over (its pod ended), but "
        f"no worker reported the round's model within {out.ctx.gm_resend_ms / 1000:g} s"
    )
    # failed in the stage the GM shows now (the next one, which has nothing to start with):
    # the GM fails a stage where it is, then moves the job back to Train/Waiting
    shown = job.gm.stage if job.gm is not None else job.phase
    training.publish(job, out, JobStatus(phase=shown, status="failed", reason=reason))
    return training.back_to_train(replace(job, gm_unreported=None), out, reason)


def _rollback_ready(job: JobState, out: Recorder) -> JobState:
    """A rollback's deploy ready, once the GM shows the job between rounds."""
    rolled = job.gm_rollback
    if rolled is None or not shows(job, out, "train"):
        return job
    job = replace(job, gm_rollback=None)
    deploys.publish_rollback(job, rolled, out)
    return job


# ================================================================= after each transition
def after(job: JobState, out: Recorder) -> JobState:
    """Bookkeeping once a GM-managed job's transition is done: what it sent the GM raises
    the count of reported conditions a copy must hold; a ready it sent is remembered; a
    timer is set while the job waits on the GM."""
    if job.gm is None:
        return job
    sent = [e.status for e in out.effects if isinstance(e, Publish) and e.to_gm]
    if sent:
        expected = max(job.gm_reported, job.gm.reported) + len(sent)
        job = replace(job, gm_reported=expected, gm_sent_ms=out.ctx.now_ms)
    stage_ready = [s for s in _job_statuses(sent) if _resendable(s)]
    if stage_ready:
        status = stage_ready[-1]
        job = replace(
            job,
            gm_sent=GmSent(
                version=job.version, stage=_phase(status.phase), at_ms=out.ctx.now_ms,
                status=_encoder.encode(status),
            ),
        )  # fmt: skip
    return _wait_timer(job, out)


def _job_statuses(statuses: Iterable[JobStatus | DatasetStatus]) -> list[JobStatus]:
    return [s for s in statuses if isinstance(s, JobStatus)]


def _resendable(status: JobStatus) -> bool:
    """A status the GM waits for in a Waiting stage: a stage's ready, or deploy completed
    (the gate held the model back)."""
    return status.status == "ready" or (status.phase, status.status) == ("deploy", "completed")


def _waiting_on_gm(job: JobState) -> bool:
    return job.gm_sent is not None or not caught_up(job) or job.step == "staged"


def _doubt_ms(job: JobState, out: Recorder) -> int:
    """How long after its last status to the GM the job doubts a copy that lacks it: not
    long while a stage waits to start on the GM's word (a staged stage, or the next round's
    train trigger), else the resend interval."""
    if job.step == "staged" or (job.phase, job.step) == ("train", "waiting"):
        return min(STAGED_DOUBT_MS, out.ctx.gm_resend_ms)
    return out.ctx.gm_resend_ms


def _wait_timer(job: JobState, out: Recorder) -> JobState:
    """While the job waits on the GM, a timer `gm_resend_ms` after it last sent the GM
    something (or after its last ready), or, while it doubts the GM's copy, when the doubt
    ends; for `resend` to look again."""
    if not _waiting_on_gm(job):
        return job
    base_ms = job.gm_sent.at_ms if job.gm_sent is not None else job.gm_sent_ms
    due_ms = base_ms + out.ctx.gm_resend_ms
    if not caught_up(job):
        due_ms = min(due_ms, job.gm_sent_ms + _doubt_ms(job, out))
    due_ms = max(due_ms, out.ctx.now_ms + 1)
    if job.next_check_ms is not None and job.next_check_ms <= due_ms:
        return job
    out.schedule(due_ms)
    return replace(job, next_check_ms=due_ms)


def resend(job: JobState, event: Tick, out: Recorder) -> JobState:
    """A timer while the job waits on the GM. A status the job sent that no copy holds
    `gm_resend_ms` later (`STAGED_DOUBT_MS` while a stage waits to start) was dropped by
    the GM's write-back: the job believes the GM's latest copy (and starts what it shows).
    The last ready goes again if the GM still shows its stage `Waiting` `gm_resend_ms`
    after it went out."""
    gm = job.gm
    if gm is None:
        return job
    now = out.ctx.now_ms
    if not caught_up(job) and now >= job.gm_sent_ms + _doubt_ms(job, out):
        out.note(
            f"the GM's copy still lacks {job.gm_reported - gm.reported} of the statuses sent "
            f"to it {(now - job.gm_sent_ms) / 1000:g} s ago: following its latest copy"
        )
        job = replace(job, gm_reported=gm.reported)
        if training.active(job) and not _moved_back(job):
            job = advance(replace(job, next_check_ms=None), out)
    if job.gm_unreported is not None and job.step == "running" and caught_up(job):
        job = _completed_elsewhere(job, out)
    sent = job.gm_sent
    if sent is None or (gm.stage, gm.type) != (sent.stage, "waiting") or not caught_up(job):
        return job
    if now < sent.at_ms + out.ctx.gm_resend_ms or published_to_gm(out):
        return job
    status = _status_decoder.decode(sent.status)
    out.note(
        f"the GM still shows {sent.stage.capitalize()}/Waiting "
        f"{(now - sent.at_ms) / 1000:g} s after round {sent.version}'s "
        f"{sent.stage} {status.status}: sent again"
    )
    training.publish(job, out, status)
    return replace(job, next_check_ms=None)
