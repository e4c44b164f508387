"""Sedna's global manager (GM) for lifelong-learning (LL) and incremental-learning (IL)
jobs, behaving as its Go code does.

One `SednaGm` is the Kubernetes side (the store and a kubelet running pods as real workers,
`tests.sedna_gm.pods`) plus one GM process (`_Process`): informers for datasets and pods
and, per job kind, a job controller (its informer, its work queue and its one worker), all
caches lagging the store; the upstream loop that reads the nodes' status frames, and the
downstream that re-sends every job and dataset update (and an IL job's Models) to the nodes
over the websocket transport of `tests.gm_standin` (per-node queue, latest wins per
kind/namespace/name). `restart` ends the process and starts a new one: queues and caches
are lost, the store and the pods are kept, and the new informers list everything again, so
every job and dataset is re-sent. `apply` takes Datasets, Models (kept in the store, kind
``model``; the GM reads them fresh, it has no Model informer) and both job kinds.

What a job controller does, as Sedna writes it (both kinds unless told):
- ``sync`` reads the job from the informer cache and moves its latest condition:
  none -> Train/Waiting; Waiting -> nothing (the local controller, LC, appends Ready);
  Ready -> create the stage's pod unless its latest pod is Pending or Running ->
  Starting; Starting/Running -> Running while the pod runs (annotating
  ``sedna.io/<Stage>`` with the pod's node), Completed when it succeeded, Failed when it
  failed; Completed -> the next stage's Waiting (Train -> Eval -> Deploy -> Train);
  Failed -> Train/Waiting. It then Gets the FRESH job and writes its whole status as the
  CACHED copy's status plus the new condition, so a condition the LC appended in between
  is lost (the GM's own bug, kept). A sync that fails (a missing object, no input in the
  condition data) is retried after the work queue's back-off, and recorded in
  `SednaGm.sync_failures`.
- Deploy/Ready, LL: delete and recreate the inference pod -> Deploy/Completed.
  IL without hot update the same; IL with ``deploySpec.model.hotUpdateEnabled``:
  -> Starting, then Running while the inference pod runs (annotating ``sedna.io/Deploy``),
  and there it stays: only a status the LC reports (deploy completed or failed) moves on.
- IL only: the first sync (no start time yet) creates the inference pod unless its latest
  one is Pending or Running: MODEL_URL is the deploy Model's url, HEM_NAME and
  HEM_PARAMETERS the hard-example mining; with hot update also MODEL_HOT_UPDATE=true,
  MODEL_POLL_PERIOD_SECONDS and MODEL_HOT_UPDATE_CONFIG=/model-hot-update/model_config.json,
  the host directory of `SednaGm.hot_update_config` mounted at /model-hot-update, and the
  job annotated ``sedna.io/model-hot-update-config`` with that file's host path. When the
  deploy Model is missing the sync just ends, and the job waits for its next event.
- Pods. LL train: OUTPUT_URL (input outputDir), TRAIN_DATASET_URL (input dataURL),
  ORIGINAL_DATASET_URL (input dataIndexURL, else the dataset's url), KB_SERVER,
  HAS_COMPLETED_INITIAL_TRAINING; LL eval: MODEL_URLS (the input model, else every input
  model, joined by ";"), TEST_DATASET_URL, ORIGINAL_DATASET_URL; LL inference: MODEL_URLS
  ``{outputDir}/deploy/index.pkl``. IL train: BASE_MODEL_URL (the first input model),
  MODEL_URL (input outputDir), TRAIN_DATASET_URL, ORIGINAL_DATASET_URL; IL eval as LL eval
  without OUTPUT_URL and KB_SERVER. IL's createPod first Gets the initial Model, the deploy
  Model and the dataset: a missing one fails the sync.
- ``updateFromEdge`` (a node's ``status`` frame) takes phases train/eval/deploy and
  statuses ready/completed/failed/waiting, in any case; anything else is refused and
  counted. It appends a condition (to the fresh job) whose ``data`` is the status
  re-marshalled through ConditionData (IL: IncrementalCondData, the same fields), message
  "reported by lc"; LL also fills ``status.knowledgeBase`` from the output models. A
  dataset's status replaces its status.
- Downstream, LL, ``routing="2022"`` (Sedna since 2022): a job goes to the dataset's node
  while its latest condition is Waiting, to the stage's worker node (the annotation) while
  Running; when a stage is Completed or Failed that node gets a ``delete`` unless it is the
  dataset's or the deploy node; a deleted job is deleted on every node it touched.
  ``routing="2021"``: every job update goes to the train template's node, and deploy Ready
  goes through Starting to Completed once the inference pod runs, as the 2021 code did.
- Downstream, IL (either routing): Train/Waiting and Eval/Waiting go to the dataset's
  node, Deploy/Waiting to the eval node; Running goes to the stage's worker node (the
  deploy node is the ``sedna.io/Deploy`` annotation, heeded only once the hot-update one is
  there), and Eval/Running deletes the job at the train node, Deploy/Running at the eval
  node, unless that node is the new one or the dataset's; Completed or Failed deletes it
  at the stage's node unless that is the dataset's or the deploy node (without hot update,
  the eval node). Before the job, Models go to the same node: Train/Waiting the initial
  Model; Eval/Waiting the deploy Model and the initialEvalModel if set; Deploy/Waiting the
  deploy Model and, without hot update, the initialEvalModel; Deploy/Running the
  initialEvalModel and the deploy Model (a missing one is skipped).
  Datasets go to their ``spec.nodeName``. What is sent is the object re-marshalled from
  Sedna's Go types (`tests.sedna_gm.gojson`), kind set and apiVersion empty as informer
  objects are.

Simplifications, none visible to a local controller: no secrets (credential annotations are
not injected), one store lock instead of optimistic concurrency (the GM's Get-then-Update
never races itself here), Go's random map order replaced by sorted order, no informer
resync (Sedna's informers re-deliver every object now and then: here a job whose sync
ended without a retry moves again only on its next event), and an IL train Ready without
an input model fails the sync (Sedna's GM indexes the missing first model and panics).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import itertools
import json
import logging
import os
import queue
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.gm_standin import GmStandIn, Received, Started
from tests.sedna_gm import gojson
from tests.sedna_gm.kube import Change, Informer, Lag, NotFound, Store, WorkQueue, now_rfc3339
from tests.sedna_gm.pods import Behaviour, Kubelet, PodInfo, PodRecord
from tests.wait import wait_until

log = logging.getLogger(__name__)

JOB = "lifelonglearningjob"
IL_JOB = "incrementallearningjob"
DATASET = "dataset"
MODEL = "model"
STAGES = ("Train", "Eval", "Deploy")
NEXT_STAGE = {"Train": "Eval", "Eval": "Deploy", "Deploy": "Train"}
POD_TYPE = {"Train": "train", "Eval": "eval", "Deploy": "inference"}
ANNOTATION_PREFIX = "sedna.io/"
KB_SERVER = "http://kb.sedna:9020"  # the GM config's knowledge-base server, unused here
HOT_UPDATE_ROOT = "/var/lib/sedna/model-hot-update"  # the host's, as Sedna's GM has it
HOT_UPDATE_MOUNT = "/model-hot-update"  # where an inference pod sees its host directory
HOT_UPDATE_FILE = "model_config.json"
HOT_UPDATE_ANNOTATION = "sedna.io/model-hot-update-config"


@dataclass(frozen=True)
class Sent:
    """A frame the GM queued for a node: operation, kind, name and the content as sent."""

    node: str
    operation: str
    kind: str
    name: str
    content: dict[str, Any]


@dataclass(frozen=True)
class Refusal:
    """A status frame the GM would not take, and why (its error log line)."""

    node: str
    kind: str
    name: str
    reason: str
    content: bytes | None


@dataclass(frozen=True)
class SyncFailure:
    """A sync of a job that ended in an error (the GM's log line): its kind, name, why, and
    whether the work queue takes the job again after its back-off (a failed first sync of
    an incremental-learning job is not retried)."""

    kind: str
    name: str
    reason: str
    retried: bool


def _suffix() -> str:
    """utilrand.String(5): Kubernetes' random name suffix."""
    return "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))


class SednaGm(Started):
    """Sedna's GM on a free port, with the Kubernetes store and pods it stands on.

    ``lag`` is the job and dataset informers' lag (seconds, or a (low, high) range drawn
    per update), ``pod_lag`` the pod informer's; ``lc_servers`` the URL of each node's
    local controller (the GM's LC_SERVER as a pod on that node reaches it; a node not
    listed does not exist); ``behaviour`` chooses how each worker run goes;
    ``http_token`` is sent as a bearer token with every report; ``retry_backoff_s`` is the
    work queues' first back-off after a failed sync (the GM's 10 s); ``hot_update_root`` is
    the host directory under which incremental-learning jobs' hot-update config files are
    (Sedna's path lower-cases it with the rest); ``hot_update_poll_s`` replaces the poll
    period a hot-updating inference worker is given.
    """

    def __init__(
        self,
        *,
        routing: str = "2022",
        lag: Lag = 0.0,
        pod_lag: Lag = 0.0,
        lc_servers: dict[str, str] | None = None,
        behaviour: Callable[[PodInfo], Behaviour] | None = None,
        http_token: str = "",
        retry_backoff_s: float = 10.0,
        restart_backoff_s: float = 10.0,
        hot_update_root: str | Path = HOT_UPDATE_ROOT,
        hot_update_poll_s: float | None = None,
        port: int | None = None,
    ) -> None:
        if routing not in ("2021", "2022"):
            raise ValueError(f"routing must be 2021 or 2022, not {routing!r}")
        self.routing = routing
        self.lag = lag
        self.pod_lag = pod_lag
        self.lc_servers = dict(lc_servers or {})
        self.retry_backoff_s = retry_backoff_s
        self.hot_update_root = str(hot_update_root)
        self.store = Store()
        #: every list of conditions each job held in the store, in order (`order_problems`)
        self._shown: dict[tuple[str, str], list[list[tuple[str, str]]]] = {}
        self.store.watch(self._record_shown)
        self.kubelet = Kubelet(
            self.store, self.lc_servers.get, behaviour or (lambda _info: Behaviour()),
            admitted=self._seen_starting, token=http_token, restart_backoff_s=restart_backoff_s,
            hot_update_poll_s=hot_update_poll_s,
        )  # fmt: skip
        self.standin = GmStandIn(port, on_frame=self._on_frame)
        self.sent: list[Sent] = []
        self.refused: list[Refusal] = []
        self.ignored: list[Refusal] = []
        self.sync_failures: list[SyncFailure] = []
        self._process: _Process | None = None
        self.pod_sequence = itertools.count(1)  # pods' creation order, across restarts

    # -- life cycle -----------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self.standin.address

    def start(self) -> None:
        """Start the GM process: its informers list the store and re-send everything."""
        if self._process is None:
            self.standin.start()
            self._process = _Process(self)

    def stop(self) -> None:
        """The GM process dies: connections dropped, queues and caches lost."""
        process, self._process = self._process, None
        self.standin.stop()
        if process is not None:
            process.stop()

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        self.kubelet.close()
        self.standin.close()

    def _seen_starting(self, pod: dict[str, Any]) -> bool:
        """Whether the GM's job cache holds the condition its sync wrote after creating
        ``pod`` (or the job or the GM process is gone). A real pod takes seconds to be
        scheduled and started, far longer than an informer's lag; a pod that ended before
        would meet the GM's stale-copy bug (a sync on a copy still at Ready finds its pod
        ended and creates another), which no local controller causes."""
        process = self._process
        if process is None:
            return True
        owner = pod["metadata"]["ownerReferences"][0]
        controller = process.controllers.get(owner["kind"].lower())
        namespace = pod["metadata"]["namespace"]
        job = None if controller is None else controller.jobs.get(namespace, owner["name"])
        return (job is None or job["metadata"]["uid"] != owner["uid"]
                or len(job["status"]["conditions"] or []) > pod["conditionCount"])  # fmt: skip

    def seen_running(self, info: PodInfo) -> Callable[[], bool] | None:
        """A train or eval worker's `Behaviour.until`: the GM wrote its stage's Running
        after the stage's latest Ready (so the GM annotated the job with the pod's node).
        None for an inference worker, which runs until its pod is deleted anyway."""
        stage = {"train": "Train", "eval": "Eval"}.get(info.type)
        if stage is None:
            return None

        def seen() -> bool:
            conditions = self.conditions(info.job, kind=info.kind)
            ready = max(i for i, c in enumerate(conditions) if c == (stage, "Ready"))
            return (stage, "Running") in conditions[ready:]

        return seen

    # -- kubectl --------------------------------------------------------------------------

    def apply(self, resource: dict[str, Any]) -> None:
        """``kubectl apply`` of a Dataset, Model, LifelongLearningJob or
        IncrementalLearningJob: create, or replace the spec and metadata labels/annotations
        of the existing one (status kept)."""
        kind = resource["kind"].lower()
        go_type = {JOB: gojson.LIFELONG_LEARNING_JOB, IL_JOB: gojson.INCREMENTAL_LEARNING_JOB,
                   DATASET: gojson.DATASET, MODEL: gojson.MODEL_RESOURCE}[kind]  # fmt: skip
        obj = gojson.decode(go_type, resource)
        obj["kind"] = obj["apiVersion"] = ""  # typed clients hand out objects without them
        meta = obj["metadata"]
        meta["namespace"] = meta["namespace"] or "default"

        def replace(current: dict[str, Any]) -> None:
            if current["spec"] != obj["spec"]:
                current["metadata"]["generation"] += 1
            current["spec"] = obj["spec"]
            for field in ("labels", "annotations"):
                current["metadata"][field] = meta[field]

        try:
            self.store.update(kind, meta["namespace"], meta["name"], replace)
        except NotFound:
            self.store.create(kind, obj)

    def delete(self, kind: str, name: str, namespace: str = "default") -> None:
        self.store.delete(kind.lower(), namespace, name)

    # -- what tests read ------------------------------------------------------------------

    def job(self, name: str, namespace: str = "default", kind: str | None = None
            ) -> dict[str, Any]:  # fmt: skip
        """The job as stored; of ``kind`` (``lifelonglearningjob`` or
        ``incrementallearningjob``), or of whichever kind has one of that name."""
        return self.store.get(kind or self._kind_of(name, namespace), namespace, name)

    def _kind_of(self, name: str, namespace: str) -> str:
        """The kind of the stored job of that name (lifelong learning when there is none)."""
        for kind in (IL_JOB, JOB):
            with contextlib.suppress(NotFound):
                self.store.get(kind, namespace, name)
                return kind
        return JOB

    def conditions(self, name: str, namespace: str = "default", kind: str | None = None
                   ) -> list[tuple[str, str]]:  # fmt: skip
        """The job's conditions in order, as (stage, type)."""
        try:
            job = self.job(name, namespace, kind)
        except NotFound:
            return []
        return [(c["stage"], c["type"]) for c in job["status"]["conditions"] or []]

    def hot_update_config(self, name: str, namespace: str = "default") -> Path:
        """GetModelHotUpdateConfigFile: the host path of an incremental-learning job's
        hot-update config file (what its annotation says once its inference pod exists)."""
        path = f"{self.hot_update_root}/{namespace}/{IL_JOB}/{name}/{HOT_UPDATE_FILE}"
        return Path(os.path.normpath(path).lower())

    def pods(self, job: str | None = None) -> list[PodRecord]:
        return [r for r in list(self.kubelet.records) if job is None or r.job == job]

    def rounds(self, name: str, namespace: str = "default") -> int:
        """Rounds completed: how often Train/Waiting follows Deploy/Completed (repeats and
        echoes left out)."""
        conditions = _collapsed(self.conditions(name, namespace))
        return sum(
            1
            for before, after in itertools.pairwise(conditions)
            if before == ("Deploy", "Completed") and after == ("Train", "Waiting")
        )

    def _record_shown(self, change: Change) -> None:
        if change.key[0] not in (JOB, IL_JOB) or change.type == "deleted":
            return
        conditions = (change.obj.get("status") or {}).get("conditions") or []
        shown = [(c["stage"], c["type"]) for c in conditions]
        self._shown.setdefault((change.key[1], change.key[2]), []).append(shown)

    def _erased_waiting(self, name: str, namespace: str, before: tuple[str, str],
                        after: tuple[str, str]) -> bool:  # fmt: skip
        """Whether the job's ``after`` (a Ready the node sent) follows the GM's ``before``
        (a stage's Completed) because the GM erased the next stage's Waiting it had shown in
        between: a sync on a copy lagging behind that Waiting wrote the stage's Completed
        back over it (the whole-status write-back), after the node had seen the Waiting."""
        if before[1] != "Completed" or after != (NEXT_STAGE[before[0]], "Ready"):
            return False
        now = self.conditions(name, namespace)
        versions = self._shown.get((namespace, name), [])
        waiting = (after[0], "Waiting")
        return any(
            now[j : j + 2] == [before, after]
            and any(v[: j + 1] == now[: j + 1] and v[j + 1 : j + 2] == [waiting] for v in versions)
            for j in range(len(now) - 1)
        )

    def order_problems(self, name: str, namespace: str = "default") -> list[str]:
        """What is out of order in the job's history (repeats and echoes left out): a move
        the stage machine does not make (a stage skipped; but for a Ready the node sent
        after a Waiting the GM showed and then erased, `_erased_waiting`), or more than one
        pod for one Ready condition."""
        conditions = _collapsed(self.conditions(name, namespace))
        if self._kind_of(name, namespace) == IL_JOB:
            deploy_ready = {"Completed", "Starting"}  # without or with hot update
        else:
            deploy_ready = {"Completed" if self.routing == "2022" else "Starting"}
        problems = [
            f"{b[0]}/{b[1]} -> {a[0]}/{a[1]} (condition {i + 1})"
            for i, (b, a) in enumerate(itertools.pairwise(conditions))
            if not _allowed(b, a, deploy_ready)
            and not _overruled(conditions[: i + 2])
            and not self._erased_waiting(name, namespace, b, a)
        ]
        per_ready: dict[tuple[str, int], list[PodRecord]] = {}
        for pod in self.pods(name):
            if pod.type != "inference":
                per_ready.setdefault((pod.type, pod.ready_number), []).append(pod)
        # each pod with the number of conditions of the copy it was made from, and the
        # conditions now: what tells a sync on a stale copy from a Ready counted twice
        history = ", ".join(f"{stage}/{type_}" for stage, type_ in self.conditions(name, namespace))
        problems += [
            f"{len(pods)} {type_} pods for its Ready #{number}: "
            + ", ".join(f"{p.name} (from a copy of {p.condition_count} conditions)" for p in pods)
            + f"; the conditions now: {history}"
            for (type_, number), pods in per_ready.items()
            if len(pods) > 1
        ]
        return problems

    def wait(self, predicate: Callable[[], Any], timeout_s: float, what: str,
             detail: Callable[[], str] | None = None) -> Any:  # fmt: skip
        """The predicate's first truthy value (polled: the store calls out under its lock, so
        a waiter must not hold a lock of its own while reading it)."""
        return wait_until(predicate, timeout_s, what, detail=detail)

    def wait_rounds(self, name: str, rounds: int, timeout_s: float) -> None:
        self.wait(lambda: self.rounds(name) >= rounds, timeout_s, f"{rounds} rounds of {name}",
                  detail=lambda: str(self.conditions(name)[-12:]))  # fmt: skip

    # -- wiring ---------------------------------------------------------------------------

    def _on_frame(self, frame: Received) -> None:
        process = self._process
        if process is not None:
            process.upstream.put(frame)

    def _record(self, into: list[Refusal], refusal: Refusal) -> None:
        log.warning("GM: %s %s from %s: %s", refusal.kind, refusal.name, refusal.node,
                    refusal.reason)  # fmt: skip
        into.append(refusal)

    def _send(self, node: str, operation: str, obj: dict[str, Any], go_type: gojson.GoType,
              kind: str) -> None:  # fmt: skip
        """SendResourceObject: the object marshalled, queued for the node (latest wins)."""
        obj = {**obj, "kind": kind}
        content = gojson.dumps(gojson.encode(go_type, obj))
        meta = obj["metadata"]
        self.sent.append(Sent(node, operation, kind.lower(), meta["name"], json.loads(content)))
        key = (kind.lower(), meta["namespace"], meta["name"])
        self.standin.send_content(node, operation, key, content)


def _collapsed(conditions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The conditions without repeats: a condition equal to the one before, and an echo (a
    stage's Completed or Failed reported again after the GM already moved on from it, as a
    status sent before the node saw the move is appended after it)."""
    kept: list[tuple[str, str]] = []
    for condition in conditions:
        moved_on = condition[1] in ("Completed", "Failed") and kept[-2:-1] == [condition]
        if kept[-1:] == [condition] or (moved_on and _allowed(condition, kept[-1], set())):
            continue
        kept.append(condition)
    return kept


def _overruled(conditions: list[tuple[str, str]]) -> bool:
    """Whether the last condition fails a stage the GM completed just before: Starting went
    to Completed on the stage's latest pod in the GM's pod cache, which, lagging, can be the
    last round's succeeded pod while this round's fails. Only the stage's failure, reported
    after the GM moved on, takes the job back to Train/Waiting (a Failed moves there from
    any stage); without it the GM would wait for an eval of a round whose train failed."""
    if len(conditions) < 3 or conditions[-1][1] != "Failed":
        return False
    stage = conditions[-1][0]
    return conditions[-3:-1] == [(stage, "Completed"), (NEXT_STAGE[stage], "Waiting")]


def _allowed(before: tuple[str, str], after: tuple[str, str], deploy_ready: set[str]) -> bool:
    """Whether the stage machine (the GM's and the LC's moves) goes from one to the other;
    ``deploy_ready`` is where Deploy/Ready may go."""
    (stage, type_), (next_stage, next_type) = before, after
    if next_type == "Failed":
        return next_stage == stage  # a stage may fail at any point
    if type_ == "Failed":
        return after == ("Train", "Waiting")
    if type_ == "Completed":
        return after == (NEXT_STAGE[stage], "Waiting")
    if next_stage != stage:
        return False
    moves = {
        "Waiting": {"Ready"} | ({"Completed"} if stage == "Deploy" else set()),
        "Ready": deploy_ready if stage == "Deploy" else {"Starting"},
        "Starting": {"Running", "Completed"},
        "Running": {"Completed"},
    }
    return next_type in moves.get(type_, set())


class _Process:
    """One run of the GM process: informers, one job controller per kind (each with its
    work queue and worker), the upstream loop."""

    def __init__(self, gm: SednaGm) -> None:
        self.gm = gm
        self.store = gm.store
        self.upstream: queue.Queue[Received | None] = queue.Queue()
        self.controllers: dict[str, _JobController] = {}
        self.datasets = Informer(self.store, DATASET, gm.lag, self._on_dataset, "gm-datasets")
        self.pods = Informer(self.store, "pod", gm.pod_lag, self._on_pod, "gm-pods")
        self.controllers.update({JOB: _LlController(self), IL_JOB: _IlController(self)})
        self._thread = threading.Thread(target=self._read_upstream, name="gm-upstream",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        for informer in (self.datasets, self.pods):
            informer.stop()
        for controller in self.controllers.values():
            controller.stop()
        self.upstream.put(None)
        self._thread.join(10)

    # -- informer handlers ----------------------------------------------------------------

    def _on_dataset(self, type_: str, dataset: dict[str, Any]) -> None:
        node = dataset["spec"]["nodeName"]
        if not node:
            log.warning("GM: dataset %s has no node name", dataset["metadata"]["name"])
            return
        operation = "delete" if type_ == "deleted" else "insert"
        self.gm._send(node, operation, dataset, gojson.DATASET, "Dataset")

    def _on_pod(self, type_: str, pod: dict[str, Any]) -> None:
        """enqueueByPod: the controller of the pod's owner kind wakes its job."""
        owner = pod["metadata"]["ownerReferences"][0]
        controller = self.controllers.get(owner["kind"].lower())
        if controller is not None:
            controller.on_pod(type_, pod)

    # -- upstream -------------------------------------------------------------------------

    def _read_upstream(self) -> None:
        while (frame := self.upstream.get()) is not None:
            try:
                self._status(frame)
            except Exception:
                log.exception("GM: handling a frame from %s broke", frame.node)

    def _status(self, frame: Received) -> None:
        try:
            message = json.loads(frame.data)
            header = message.get("header") or {}
            content = message.get("content")
            raw = None if content is None else base64.b64decode(content)
        except (ValueError, AttributeError) as e:
            self.gm._record(self.gm.ignored, Refusal(frame.node, "", "", f"unreadable: {e}",
                                                     frame.data))  # fmt: skip
            return
        kind = str(header.get("resourceKind", "")).lower()
        name = str(header.get("resourceName", ""))
        namespace = str(header.get("namespace", ""))
        operation = str(header.get("operation", ""))  # Go reads a missing one as ""
        if operation != "status":
            why = f"unknown operation {operation!r}"
            self.gm._record(self.gm.ignored, Refusal(frame.node, kind, name, why, raw))
            return
        handlers = {k: c.update_from_edge for k, c in self.controllers.items()}
        handler = {**handlers, DATASET: self._dataset_status}.get(kind)
        if handler is None:
            why = f"no handler for resource kind {kind}"
            self.gm._record(self.gm.ignored, Refusal(frame.node, kind, name, why, raw))
            return
        try:
            handler(namespace, name, raw)
        except (ValueError, NotFound) as e:
            self.gm._record(self.gm.refused, Refusal(frame.node, kind, name, str(e), raw))

    def _dataset_status(self, namespace: str, name: str, raw: bytes | None) -> None:
        status = gojson.decode(gojson.DATASET_STATUS, json.loads(raw or b""))
        status["updateTime"] = status["updateTime"] or now_rfc3339()

        def replace(fresh: dict[str, Any]) -> None:
            fresh["status"] = status

        self.store.update(DATASET, namespace, name, replace)


class _JobController:
    """A job controller as Sedna's lifelong- and incremental-learning controllers share it:
    the job informer, the work queue and its worker, ``sync`` with transitJobState, the pods,
    the annotations and updateFromEdge. A subclass says what differs: its kind, its Deploy
    stage, the pods it creates and where a job goes (``_to_edge``)."""

    kind: str  # the store's kind
    go_kind: str  # the Go kind, as sent and as pods' owner references name it
    go_type: gojson.GoType

    def __init__(self, process: _Process) -> None:
        self.process = process
        self.gm = process.gm
        self.store = process.store
        self.queue = WorkQueue(self.gm.retry_backoff_s, 360.0)
        self.jobs = Informer(self.store, self.kind, self.gm.lag, self._on_job, f"gm-{self.kind}")
        self._thread = threading.Thread(target=self._work, name=f"gm-{self.kind}-worker",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        self.jobs.stop()
        self.queue.shutdown()
        self._thread.join(10)

    # -- informer handlers ----------------------------------------------------------------

    def _on_job(self, type_: str, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        self.queue.add(f"{meta['namespace']}/{meta['name']}")
        self._to_edge(type_, job)

    def on_pod(self, type_: str, pod: dict[str, Any]) -> None:
        owner = pod["metadata"]["ownerReferences"][0]
        job = self.jobs.get(pod["metadata"]["namespace"], owner["name"])
        if job is None or job["metadata"]["uid"] != owner["uid"]:
            return
        key = f"{pod['metadata']['namespace']}/{owner['name']}"
        requeues = self.queue.requeues(key)
        if type_ != "deleted" and pod["status"]["phase"] == "Failed" and requeues > 0:
            self.queue.add_after(key, self.gm.retry_backoff_s * 2 ** (requeues - 1))
        else:
            self.queue.add(key)

    # -- downstream -----------------------------------------------------------------------

    def _to_edge(self, type_: str, job: dict[str, Any]) -> None:
        raise NotImplementedError

    def _send_job(self, node: str, operation: str, job: dict[str, Any]) -> None:
        self.gm._send(node, operation, job, self.go_type, self.go_kind)

    def _deleted_or_unroutable(self, type_: str, job: dict[str, Any], dataset_node: str,
                               nodes: Iterable[str]) -> bool:  # fmt: skip
        """syncToEdge's start: a deleted job is deleted on the dataset's node and each of
        ``nodes`` (True); otherwise True when it has no dataset node or no condition yet, so
        that nothing is sent."""
        if type_ == "deleted":
            for node in sorted({dataset_node, *nodes}):
                self._send_job(node, "delete", job)
            return True
        return not dataset_node or not job["status"]["conditions"]

    def _dataset_node(self, job: dict[str, Any]) -> str:
        """The node of the job's dataset (fresh from the API), "" when there is none."""
        try:
            dataset = self.store.get(DATASET, job["metadata"]["namespace"],
                                     job["spec"]["dataset"]["name"])  # fmt: skip
        except NotFound:
            return ""
        return str(dataset["spec"]["nodeName"])

    # -- the job controller ---------------------------------------------------------------

    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            try:
                self._sync(key)
            except Exception:
                log.exception("GM: syncing %s %s broke", self.kind, key)
            finally:
                self.queue.done(key)

    def _sync(self, key: str) -> None:
        namespace, name = key.split("/", 1)
        cached = self.jobs.get(namespace, name)
        if cached is None:
            self.queue.forget(key)  # deleted
            return
        job = copy.deepcopy(cached)
        if job["status"]["startTime"] is None:
            job["status"]["startTime"] = now_rfc3339()
            if not self._first_sync(job):
                return
        try:
            updated = self._transit(job)
        except (NotFound, ValueError) as e:
            self._failed(name, e, retried=True)
            self.queue.add_rate_limited(key)
            return
        if updated:
            try:
                self.store.update(self.kind, namespace, name, _set_status(job["status"]))
            except NotFound:
                self.queue.add_rate_limited(key)
                return
            self.queue.forget(key)

    def _failed(self, name: str, error: Exception, *, retried: bool) -> None:
        log.info("GM: syncing %s %s failed: %s", self.kind, name, error)
        self.gm.sync_failures.append(SyncFailure(self.kind, name, str(error), retried))

    def _first_sync(self, job: dict[str, Any]) -> bool:
        """What a job's first sync (no start time yet) does before its move; whether the
        sync goes on."""
        return True

    def _transit(self, job: dict[str, Any]) -> bool:
        """transitJobState: append the next condition to ``job``; whether it did."""
        conditions = job["status"]["conditions"] = job["status"]["conditions"] or []
        stage, type_ = ("Train", "") if not conditions else (
            conditions[-1]["stage"], conditions[-1]["type"])  # fmt: skip
        pod = self._latest_pod(job, stage) if conditions else None
        phase = pod["status"]["phase"] if pod is not None else "Unknown"
        new_stage, new_type = stage, type_
        if type_ == "":
            new_type = "Waiting"
        elif type_ == "Ready":
            if stage == "Deploy":
                new_type = self._deploy_ready(job)
            else:
                if phase not in ("Pending", "Running"):
                    self._create_pod(job, stage)
                new_type = "Starting"
        elif type_ in ("Starting", "Running"):
            if phase == "Running" and pod is not None:
                if stage == "Deploy" and not self._deploy_runs(job):
                    new_type = "Completed"
                else:
                    self._annotate(job, ANNOTATION_PREFIX + stage, pod["spec"]["nodeName"])
                    new_type = "Running"
            elif phase == "Succeeded":
                new_type = "Completed"
            elif phase == "Failed":
                new_type = "Failed"
        elif type_ == "Completed":
            new_stage, new_type = NEXT_STAGE[stage], "Waiting"
        elif type_ == "Failed":
            new_stage, new_type = "Train", "Waiting"
        if new_type == type_:
            return False
        conditions.append(_condition(new_type, new_stage))
        return True

    def _deploy_ready(self, job: dict[str, Any]) -> str:
        """What Deploy/Ready does; the condition type it moves to."""
        raise NotImplementedError

    def _deploy_runs(self, job: dict[str, Any]) -> bool:
        """Whether Deploy/Starting goes to Running (annotated) while the inference pod runs;
        else to Completed."""
        raise NotImplementedError

    def _create_pod(self, job: dict[str, Any], stage: str) -> None:
        raise NotImplementedError

    def _create_infer_pod(self, job: dict[str, Any]) -> None:
        raise NotImplementedError

    def _latest_pod(self, job: dict[str, Any], stage: str) -> dict[str, Any] | None:
        """getSpecifiedPods: the job's newest pod of the stage's type (in the pod cache)."""
        uid = job["metadata"]["uid"]
        pods = [
            p for p in self.process.pods.list()
            if p["metadata"]["ownerReferences"][0]["uid"] == uid
            and p["metadata"]["name"].split("-")[-2] == POD_TYPE[stage]
        ]  # fmt: skip
        return max(pods, key=lambda p: p["seq"], default=None)

    def _annotate(self, job: dict[str, Any], key: str, value: str) -> None:
        """addJobAnnotations: unless the job (as given) has it, patch the fresh one."""
        if (job["metadata"]["annotations"] or {}).get(key) == value:
            return

        def patch(fresh: dict[str, Any]) -> None:
            fresh["metadata"]["annotations"] = {**(fresh["metadata"]["annotations"] or {}),
                                                key: value}  # fmt: skip

        meta = job["metadata"]
        fresh = self.store.get(self.kind, meta["namespace"], meta["name"])
        if (fresh["metadata"]["annotations"] or {}).get(key) != value:
            self.store.update(self.kind, meta["namespace"], meta["name"], patch)

    def _restart_infer_pod(self, job: dict[str, Any]) -> None:
        """restartInferPod: delete the latest inference pod (if any), create a new one."""
        pod = self._latest_pod(job, "Deploy")
        if pod is not None:
            meta = pod["metadata"]
            with contextlib.suppress(NotFound):
                self.store.delete("pod", meta["namespace"], meta["name"])
        self._create_infer_pod(job)

    def _env(self, job: dict[str, Any], template: dict[str, Any], worker: str) -> dict[str, str]:
        """The environment every worker gets; ``worker`` is its WORKER_NAME's prefix."""
        node = (template["spec"] or {}).get("nodeName", "")
        meta = job["metadata"]
        return {"NAMESPACE": meta["namespace"], "JOB_NAME": meta["name"],
                "WORKER_NAME": f"{worker}-{_suffix()}",
                "LC_SERVER": self.gm.lc_servers.get(node, "")}  # fmt: skip

    @staticmethod
    def _input(job: dict[str, Any]) -> dict[str, Any]:
        """The input of the latest condition's data (a value Go cannot read leaves it nil)."""
        try:
            raw = json.loads(job["status"]["conditions"][-1]["data"])
            data = gojson.decode(gojson.CONDITION_DATA, raw)
        except ValueError:
            data = gojson.zero(gojson.CONDITION_DATA)
        given: dict[str, Any] | None = data["input"]
        if given is None:
            raise ValueError("empty input from condData")
        return given

    @staticmethod
    def _input_model_urls(given: dict[str, Any]) -> list[str]:
        """GetInputModelURLs: the one model's url, else every model's."""
        models = [given["model"]] if given["model"] is not None else given["models"] or []
        return [m["url"] for m in models]

    @staticmethod
    def _readies(job: dict[str, Any], stage: str) -> int:
        conditions = job["status"]["conditions"] or []
        return sum(1 for c in conditions if (c["stage"], c["type"]) == (stage, "Ready"))

    def _new_pod(self, job: dict[str, Any], type_: str, env: dict[str, str],
                 template: dict[str, Any], *, restart: str,
                 mounts: dict[str, str] | None = None) -> None:  # fmt: skip
        """CreatePodWithTemplate; the pod keeps its environment as a map (``env``), its
        host-path mounts as a map from container path to host path (``mounts``), its
        creation order (``seq``), the Ready it answers (``readyNumber``: how many Ready
        conditions its stage had) and how many conditions the job had then
        (``conditionCount``) beside it."""
        meta = job["metadata"]
        pod_spec = template["spec"] or {}
        name = f"{meta['name']}-{type_}-{_suffix()}"
        stage = {"train": "Train", "eval": "Eval"}.get(type_, "Deploy")
        self.store.create("pod", {
            "metadata": {"name": name, "namespace": meta["namespace"],
                         "ownerReferences": [{"kind": self.go_kind,
                                              "name": meta["name"], "uid": meta["uid"]}]},
            "spec": {"nodeName": pod_spec.get("nodeName", ""),
                     "restartPolicy": pod_spec.get("restartPolicy") or restart},
            "status": {"phase": "Pending"},
            "env": env, "mounts": dict(mounts or {}), "seq": next(self.gm.pod_sequence),
            "readyNumber": self._readies(job, stage),
            "conditionCount": len(job["status"]["conditions"] or []),
        })  # fmt: skip

    # -- upstream -------------------------------------------------------------------------

    def update_from_edge(self, namespace: str, name: str, raw: bytes | None) -> None:
        """updateFromEdge: a node's job status appended as a condition of the fresh job."""
        parsed = json.loads(raw or b"")
        head = gojson.decode(gojson.JOB_STATUS_HEAD, parsed)
        data = gojson.decode(gojson.CONDITION_DATA, parsed)
        stage = {"train": "Train", "eval": "Eval", "deploy": "Deploy"}.get(head["phase"].lower())
        if stage is None:
            raise ValueError(f"invalid condition stage: {head['phase']}")
        types = {"ready": "Ready", "completed": "Completed", "failed": "Failed",
                 "waiting": "Waiting"}  # fmt: skip
        type_ = types.get(head["status"].lower())
        if type_ is None:
            raise ValueError(f"invalid condition type: {head['status']}")
        condition = _condition(type_, stage)
        condition["data"] = gojson.dumps(gojson.encode(gojson.CONDITION_DATA, data)).decode()
        condition["message"] = "reported by lc"
        self._reported(namespace, name, data)

        def append(fresh: dict[str, Any]) -> None:
            fresh["status"]["conditions"] = [*(fresh["status"]["conditions"] or []), condition]

        self.store.update(self.kind, namespace, name, append)

    def _reported(self, namespace: str, name: str, data: dict[str, Any]) -> None:
        """What updateFromEdge does with a status's data before appending its condition."""


class _LlController(_JobController):
    """The lifelong-learning controller."""

    kind, go_kind, go_type = JOB, "LifelongLearningJob", gojson.LIFELONG_LEARNING_JOB

    def _deploy_ready(self, job: dict[str, Any]) -> str:
        self._restart_infer_pod(job)
        return "Starting" if self.gm.routing == "2021" else "Completed"

    def _deploy_runs(self, job: dict[str, Any]) -> bool:
        return False  # Deploy/Starting is only reached under the 2021 routing

    def _to_edge(self, type_: str, job: dict[str, Any]) -> None:
        if self.gm.routing == "2021":
            node = job["spec"]["trainSpec"]["template"]["spec"].get("nodeName", "")
            if node:
                self._send_job(node, "delete" if type_ == "deleted" else "insert", job)
            return
        dataset_node = self._dataset_node(job)
        annotations = job["metadata"]["annotations"] or {}
        stage_nodes = {s: annotations.get(ANNOTATION_PREFIX + s, "") for s in STAGES}
        if self._deleted_or_unroutable(type_, job, dataset_node, stage_nodes.values()):
            return
        latest = job["status"]["conditions"][-1]
        node = stage_nodes.get(latest["stage"], "")
        if latest["type"] == "Waiting":
            self._send_job(dataset_node, "insert", job)
        elif latest["type"] == "Running":
            self._send_job(node, "insert", job)
        elif latest["type"] in ("Completed", "Failed") and node not in {
            dataset_node,
            stage_nodes["Deploy"],
        }:
            self._send_job(node, "delete", job)

    def _create_pod(self, job: dict[str, Any], stage: str) -> None:
        meta, spec = job["metadata"], job["spec"]
        dataset = self.store.get(DATASET, meta["namespace"], spec["dataset"]["name"])
        given = self._input(job)
        original = given["dataIndexURL"] or dataset["spec"]["url"]
        worker = "train" if stage == "Train" else "eval"
        template = spec["trainSpec" if stage == "Train" else "evalSpec"]["template"]
        env = {**self._env(job, template, f"{worker}-worker"), "KB_SERVER": KB_SERVER,
               "OUTPUT_URL": given["outputDir"], "ORIGINAL_DATASET_URL": original}  # fmt: skip
        if stage == "Train":
            conditions = job["status"]["conditions"]
            trained = any(c["stage"] == "Train" and c["type"] == "Completed" for c in conditions)
            env["HAS_COMPLETED_INITIAL_TRAINING"] = str(trained).lower()
            env["TRAIN_DATASET_URL"] = given["dataURL"]
        else:
            env["MODEL_URLS"] = ";".join(self._input_model_urls(given))
            env["TEST_DATASET_URL"] = given["dataURL"]
        self._new_pod(job, worker, env, template, restart="OnFailure")

    def _create_infer_pod(self, job: dict[str, Any]) -> None:
        spec = job["spec"]
        template = spec["deploySpec"]["template"]
        env = {**self._env(job, template, "inferworker"), "OUTPUT_URL": spec["outputDir"],
               "MODEL_URLS": spec["outputDir"].rstrip("/") + "/deploy/index.pkl"}  # fmt: skip
        self._new_pod(job, "inference", env, template, restart="")

    def _reported(self, namespace: str, name: str, data: dict[str, Any]) -> None:
        models = (data["output"] or {}).get("models") or []
        if models:
            self.store.update(self.kind, namespace, name, _set_knowledge_base(models))


class _IlController(_JobController):
    """The incremental-learning controller."""

    kind, go_kind, go_type = IL_JOB, "IncrementalLearningJob", gojson.INCREMENTAL_LEARNING_JOB

    @staticmethod
    def _hot(job: dict[str, Any]) -> bool:
        return bool(job["spec"]["deploySpec"]["model"]["hotUpdateEnabled"])

    def _first_sync(self, job: dict[str, Any]) -> bool:
        """The inference pod is created unless the latest one is Pending or Running; when
        that fails, the sync ends with no error, so the job is not queued again (until its
        next informer event)."""
        pod = self._latest_pod(job, "Deploy")
        if pod is None or pod["status"]["phase"] not in ("Pending", "Running"):
            try:
                self._create_infer_pod(job)
            except NotFound as e:
                self._failed(job["metadata"]["name"], e, retried=False)
                return False
        return True

    def _deploy_ready(self, job: dict[str, Any]) -> str:
        if self._hot(job):
            return "Starting"
        self._restart_infer_pod(job)
        return "Completed"

    def _deploy_runs(self, job: dict[str, Any]) -> bool:
        return self._hot(job)

    def _model(self, job: dict[str, Any], name: str, what: str) -> dict[str, Any]:
        try:
            return self.store.get(MODEL, job["metadata"]["namespace"], name)
        except NotFound as e:
            raise NotFound(f"failed to get {what} {name}: {e}") from e

    def _create_pod(self, job: dict[str, Any], stage: str) -> None:
        spec = job["spec"]
        self._model(job, spec["initialModel"]["name"], "initial model")
        self._model(job, spec["deploySpec"]["model"]["name"], "deploy model")
        try:
            dataset = self.store.get(DATASET, job["metadata"]["namespace"],
                                     spec["dataset"]["name"])  # fmt: skip
        except NotFound as e:
            raise NotFound(f"failed to get dataset {spec['dataset']['name']}: {e}") from e
        given = self._input(job)
        urls = self._input_model_urls(given)
        if stage == "Train":
            if not urls:  # Go indexes the first URL: its worker goroutine panics
                raise ValueError("no input model to train from")
            worker, template = "train", spec["trainSpec"]["template"]
            env = {"BASE_MODEL_URL": urls[0], "MODEL_URL": given["outputDir"],
                   "TRAIN_DATASET_URL": given["dataURL"]}  # fmt: skip
        else:
            worker, template = "eval", spec["evalSpec"]["template"]
            env = {"MODEL_URLS": ";".join(urls), "TEST_DATASET_URL": given["dataURL"]}
        env["ORIGINAL_DATASET_URL"] = given["dataIndexURL"] or dataset["spec"]["url"]
        env = {**self._env(job, template, f"{worker}-worker"), **env}
        self._new_pod(job, worker, env, template, restart="OnFailure")

    def _create_infer_pod(self, job: dict[str, Any]) -> None:
        """createInferPod: MODEL_URL is the deploy Model's url; with hot update, the pod
        mounts the host directory of the job's hot-update config file at
        /model-hot-update and the job is annotated with that file's host path."""
        deploy = job["spec"]["deploySpec"]
        model = self._model(job, deploy["model"]["name"], "infer model")
        hem = deploy["hardExampleMining"]
        parameters = gojson.encode(gojson.slice_(gojson.KEY_VALUE), hem["parameters"])
        env = {**self._env(job, deploy["template"], "inferworker"), "HEM_NAME": hem["name"],
               "HEM_PARAMETERS": gojson.dumps(parameters).decode(),
               "MODEL_URL": model["spec"]["url"]}  # fmt: skip
        mounts: dict[str, str] = {}
        hot = self._hot(job)
        config = self.gm.hot_update_config(job["metadata"]["name"], job["metadata"]["namespace"])
        if hot:
            env.update({
                "MODEL_HOT_UPDATE": "true",
                "MODEL_POLL_PERIOD_SECONDS": str(deploy["model"]["pollPeriodSeconds"]),
                "MODEL_HOT_UPDATE_CONFIG": f"{HOT_UPDATE_MOUNT}/{HOT_UPDATE_FILE}",
            })  # fmt: skip
            mounts[HOT_UPDATE_MOUNT] = str(config.parent)
        self._new_pod(job, "inference", env, deploy["template"], restart="", mounts=mounts)
        if hot:
            with contextlib.suppress(NotFound):  # Go drops this error
                self._annotate(job, HOT_UPDATE_ANNOTATION, str(config))

    def _to_edge(self, type_: str, job: dict[str, Any]) -> None:
        """syncToEdge of the incremental-learning controller."""
        dataset_node = self._dataset_node(job)
        annotations = job["metadata"]["annotations"] or {}
        train, evaluation = (annotations.get(ANNOTATION_PREFIX + s, "") for s in ("Train", "Eval"))
        deploy = ""
        if HOT_UPDATE_ANNOTATION in annotations:
            deploy = annotations.get(ANNOTATION_PREFIX + "Deploy", "")
        if self._deleted_or_unroutable(type_, job, dataset_node, (train, evaluation, deploy)):
            return
        spec = job["spec"]
        deploy_model = spec["deploySpec"]["model"]["name"]
        initial_eval = (spec["evalSpec"]["initialEvalModel"] or {}).get("name")
        stage, latest = (job["status"]["conditions"][-1][k] for k in ("stage", "type"))
        if latest == "Waiting":
            node = {"Train": dataset_node, "Eval": dataset_node, "Deploy": evaluation}[stage]
            models = {"Train": [spec["initialModel"]["name"]], "Eval": [deploy_model]}.get(
                stage, [deploy_model])  # fmt: skip
            if initial_eval and (stage == "Eval" or (stage == "Deploy" and not self._hot(job))):
                models.append(initial_eval)
            self._send_models(job, models, node)
            self._send_job(node, "insert", job)
        elif latest == "Running":
            node = {"Train": train, "Eval": evaluation, "Deploy": deploy}[stage]
            before = {"Eval": train, "Deploy": evaluation}.get(stage)
            if before is not None and before not in (node, dataset_node):
                self._send_job(before, "delete", job)
            if stage == "Deploy":
                self._send_models(job, [m for m in (initial_eval, deploy_model) if m], node)
            self._send_job(node, "insert", job)
        elif latest in ("Completed", "Failed"):
            if not self._hot(job):
                deploy = evaluation
            node = {"Train": train, "Eval": evaluation, "Deploy": deploy}[stage]
            if node not in (dataset_node, deploy):
                self._send_job(node, "delete", job)

    def _send_models(self, job: dict[str, Any], names: list[str], node: str) -> None:
        """syncModelWithName for each: the Model (fresh from the API) sent to ``node``; a
        missing one is logged and skipped."""
        for name in names:
            try:
                model = self.store.get(MODEL, job["metadata"]["namespace"], name)
            except NotFound:
                log.warning("GM: model %s of %s not found", name, job["metadata"]["name"])
                continue
            self.gm._send(node, "insert", model, gojson.MODEL_RESOURCE, "Model")


def _condition(type_: str, stage: str) -> dict[str, Any]:
    now = now_rfc3339()
    return {"type": type_, "status": "True", "stage": stage, "lastHeartbeatTime": now,
            "lastTransitionTime": now, "reason": "", "message": "", "data": ""}  # fmt: skip


def _set_status(status: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """updateJobStatus: the fresh object's whole status becomes ``status``."""

    def change(fresh: dict[str, Any]) -> None:
        fresh["status"] = copy.deepcopy(status)

    return change


def _set_knowledge_base(models: list[dict[str, Any]]) -> Callable[[dict[str, Any]], None]:
    """updateStatusKnowledgeBase: models, classes and sample counts from the output models."""
    listed = []
    samples = 0
    for model in models:
        for model_id, metrics in sorted((model["current_metric"] or {}).items()):
            values = [metrics[k] for k in sorted(metrics)]
            precision = values[0] if values else 0.0
            samples_of = model["number_of_labeled_unseen_sample"]
            listed.append({"modelID": model_id, "averagePrecision": precision,
                           "numberOfTrainSamples": samples_of})  # fmt: skip
        samples += model["number_of_labeled_unseen_sample"]
    classes = models[0]["classes"]
    knowledge_base = {
        "AIModels": {"numberOfAIModels": len(listed), "listOfAIModels": listed},
        "AIClasses": {"numberOfAIClasses": len(classes or []), "listOfAIClasses": classes},
        "samples": {"numberOfLabeledUnseenSample": samples, "numberOfUnseenSample": 0},
    }  # fmt: skip

    def change(fresh: dict[str, Any]) -> None:
        fresh["status"]["knowledgeBase"] = knowledge_base

    return change
