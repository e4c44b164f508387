"""The pods the GM creates, and a kubelet that runs each as a real worker.

A pod is a `Store` object of kind ``pod``; `Kubelet` watches the store and runs every new
pod in a thread: ``Pending`` until admitted and for the behaviour's start delay, then
``Running`` while its worker runs, then ``Succeeded`` (exit 0) or, under restartPolicy
Never, ``Failed``; under OnFailure (what the GM sets on train and eval pods unless the
template says otherwise) or Always a failed worker is started again after the kubelet's
back-off and the pod stays ``Running``. Deleting the pod stops it. Each phase change is a
store update, which the GM's pod informer sees.

The workers behave as Sedna's worker library does: they read the environment the GM gave
them (paths are used as they are: the worker runs on this host, where a pod would see the
same files through its hostPath mounts; a path under a mount the GM declared on the pod,
such as an inference pod's /model-hot-update, is read from the mounted host directory,
which the kubelet creates as a DirectoryOrCreate hostPath), post Sedna's WorkerMessage to
``{LC_SERVER}/sedna/workers/{WORKER_NAME}/info`` (``running``, then ``completed`` with
results or ``failed``; ownerKind the job's kind in lower case, ``lifelonglearningjob`` or
``incrementallearningjob``), and exit. Like the library, a worker whose report cannot be
delivered logs it and carries on.

- A lifelong-learning train worker counts the samples of its TRAIN_DATASET_URL and writes
  ``{OUTPUT_URL}/model.pkl``; an incremental-learning one first reads its BASE_MODEL_URL
  (the model it starts from: it fails when that is missing; `PodRecord.base_model`) and
  writes ``{MODEL_URL}/model.pkl`` (MODEL_URL is its output directory), reporting the
  model as Sedna's estimators do: format, url and metrics only.
- An eval worker reports one result per MODEL_URLS entry, in order, the i-th with the
  behaviour's i-th metrics (an incremental-learning LC lists the new model first, then the
  one it is compared with).
- An inference worker loads its model (an incremental-learning job's MODEL_URL, a
  lifelong-learning job's MODEL_URLS) and runs until its pod is deleted. With
  MODEL_HOT_UPDATE=true it also polls MODEL_HOT_UPDATE_CONFIG every
  MODEL_POLL_PERIOD_SECONDS (the kubelet's ``hot_update_poll_s`` instead, when set), as
  Sedna's ModelLoadingThread does: a config naming a new ``model_update_time`` and an
  existing ``model_path`` is loaded and reported (kind ``deploy``, ``completed``). Every
  model loaded is kept, in order, in `PodRecord.loaded`.
- The incremental-learning library reports no ``ownerInfo``; the lifelong-learning one
  sends the pod's name there.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from tests.sedna_gm.kube import Change, NotFound, Store

log = logging.getLogger(__name__)

LL = "lifelonglearningjob"  # a job kind as Sedna's library sends it as ownerKind
IL = "incrementallearningjob"
DEFAULT_METRICS: Mapping[str, list[float]] = {"accuracy": [0.9]}


@dataclass(frozen=True)
class PodInfo:
    """What a behaviour is chosen by: the job, the pod's type (train, eval, inference), the
    how-many-th pod of that type the job got (1-based), the container attempt, the node, the
    job's kind (`LL` or `IL`)."""

    job: str
    type: str
    number: int
    attempt: int
    node: str
    kind: str = LL


@dataclass(frozen=True)
class Behaviour:
    """How one worker run goes. ``exit_code`` non-zero fails it (after a ``failed`` report
    when ``report_failed``); ``metrics`` are an eval worker's, one per model it was given
    (missing ones get `DEFAULT_METRICS`); ``report_completed`` false: a worker that ends
    well reports nothing; ``start_delay_s`` keeps the pod Pending,
    ``run_s`` is how long the work takes. ``outlasts_delivery``: the work also lasts until
    the node's controller took one of its `running` reports (posted again until then), as a
    real run outlasts the job's way to a node the GM sends it to only once the pod runs.
    ``until``: the work also lasts until this holds (a fact of the test's choosing, such as
    the GM having seen the pod run)."""

    start_delay_s: float = 0.0
    run_s: float = 0.0
    outlasts_delivery: bool = False
    until: Callable[[], bool] | None = None
    exit_code: int = 0
    report_failed: bool = True
    report_completed: bool = True
    metrics: tuple[Mapping[str, list[float]], ...] = ()


@dataclass
class Report:
    """One report a worker posted and what the controller answered (0: unreachable)."""

    message: dict[str, Any]
    answer: int


@dataclass
class PodRecord:
    """A pod as the tests see it: its name, type, node, environment, the number of the
    stage's Ready condition it was created for, its job's kind, its host-path mounts
    (container path -> host path), phase, the reports its worker posted, the model bytes an
    inference worker loaded (at start, then each hot update, in order) and the base model an
    incremental-learning train worker started from."""

    name: str
    job: str
    type: str
    node: str
    env: dict[str, str]
    ready_number: int
    kind: str = LL
    mounts: dict[str, str] = field(default_factory=dict)
    phase: str = "Pending"
    reports: list[Report] = field(default_factory=list)
    loaded: list[bytes] = field(default_factory=list)
    base_model: bytes | None = None
    #: how many conditions the job copy the GM made it from had
    condition_count: int = 0

    def host_path(self, path: str) -> Path:
        """Where the worker's ``path`` is on this host: under a mount, the mounted host
        directory; anything else is the same path (see the module docstring)."""
        for inside, host in self.mounts.items():
            if path == inside or path.startswith(inside.rstrip("/") + "/"):
                return Path(host) / path[len(inside) :].lstrip("/")
        return Path(path)


@dataclass(eq=False)
class Kubelet:
    """Runs the store's pods; ``lc_server(node)`` is the URL a node's pods post to (None: the
    node does not exist and its pods stay Pending); a pod stays Pending until
    ``admitted(pod)``; ``hot_update_poll_s`` replaces a hot-updating inference worker's
    MODEL_POLL_PERIOD_SECONDS when set. Watches the store from the start."""

    store: Store
    lc_server: Callable[[str], str | None]
    behaviour: Callable[[PodInfo], Behaviour]
    _: KW_ONLY
    admitted: Callable[[dict[str, Any]], bool] = lambda _pod: True
    token: str = ""
    restart_backoff_s: float = 10.0
    post_retry_s: float = 30.0
    hot_update_poll_s: float | None = None
    records: list[PodRecord] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stops: dict[str, threading.Event] = {}
        self._threads: list[threading.Thread] = []
        self._counts: dict[tuple[str, str], int] = {}
        self._closed = threading.Event()
        self.store.watch(self._on_change)

    def close(self) -> None:
        self.store.unwatch(self._on_change)
        self._closed.set()
        with self._lock:
            for stop in self._stops.values():
                stop.set()
            threads = list(self._threads)
        for thread in threads:
            thread.join(10)

    def _on_change(self, change: Change) -> None:
        if change.key[0] != "pod" or self._closed.is_set():
            return
        name = change.key[2]
        if change.type == "deleted":
            with self._lock:
                stop = self._stops.get(name)
            if stop is not None:
                stop.set()
            return
        if change.type != "added":
            return
        pod = change.obj
        job = pod["metadata"]["ownerReferences"][0]["name"]
        type_ = name.split("-")[-2]
        kind = pod["metadata"]["ownerReferences"][0]["kind"].lower()
        record = PodRecord(name, job, type_, pod["spec"]["nodeName"], dict(pod["env"]),
                           pod["readyNumber"], kind, dict(pod.get("mounts") or {}),
                           condition_count=pod["conditionCount"])  # fmt: skip
        with self._lock:
            number = self._counts[(job, type_)] = self._counts.get((job, type_), 0) + 1
            stop = self._stops[name] = threading.Event()
            self.records.append(record)
            thread = threading.Thread(
                target=self._run, args=(pod, record, number, stop), name=f"pod-{name}",
                daemon=True,
            )  # fmt: skip
            self._threads.append(thread)
        thread.start()

    def _run(self, pod: dict[str, Any], record: PodRecord, number: int,
             stop: threading.Event) -> None:  # fmt: skip
        try:
            self._live(pod, record, number, stop)
        except Exception:
            log.exception("pod %s broke", record.name)

    def _live(self, pod: dict[str, Any], record: PodRecord, number: int,
              stop: threading.Event) -> None:  # fmt: skip
        if self.lc_server(record.node) is None:
            return  # no such node: Pending for good
        while not self.admitted(pod):
            if stop.wait(0.01):
                return
        for host in record.mounts.values():  # hostPath volumes of type DirectoryOrCreate
            try:
                Path(host).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                log.warning("pod %s: cannot create %s: %s", record.name, host, e)
        env = record.env
        attempt = 1
        behaviour = self.behaviour(self._info(record, number, attempt))
        if stop.wait(behaviour.start_delay_s):
            return
        self._phase(pod, record, "Running")
        policy = pod["spec"].get("restartPolicy") or "Always"
        while True:
            code = self._work(record, env, behaviour, stop)
            if stop.is_set():
                return
            if code == 0 and record.type != "inference":
                self._phase(pod, record, "Succeeded")
                return
            if policy == "Never":
                self._phase(pod, record, "Failed" if code else "Succeeded")
                return
            if stop.wait(self.restart_backoff_s):
                return
            attempt += 1
            behaviour = self.behaviour(self._info(record, number, attempt))

    @staticmethod
    def _info(record: PodRecord, number: int, attempt: int) -> PodInfo:
        return PodInfo(record.job, record.type, number, attempt, record.node, record.kind)

    def _phase(self, pod: dict[str, Any], record: PodRecord, phase: str) -> None:
        def change(obj: dict[str, Any]) -> None:
            obj["status"]["phase"] = phase

        meta = pod["metadata"]
        try:
            self.store.update("pod", meta["namespace"], meta["name"], change)
        except NotFound:
            return  # deleted meanwhile
        record.phase = phase

    # -- the workers ----------------------------------------------------------------------

    def _work(self, record: PodRecord, env: dict[str, str], behaviour: Behaviour,
              stop: threading.Event) -> int:  # fmt: skip
        if record.type == "inference":
            self._infer(record, env, stop)
            return 0
        self._report(record, env, "running")
        if stop.wait(behaviour.run_s):
            return 1
        while behaviour.outlasts_delivery and record.reports[-1].answer != 200:
            if stop.wait(0.1):
                return 1
            self._report(record, env, "running")
        while behaviour.until is not None and not behaviour.until():
            if stop.wait(0.01):
                return 1
        if behaviour.exit_code != 0:
            if behaviour.report_failed:
                self._report(record, env, "failed")
            return behaviour.exit_code
        try:
            if record.type == "eval":
                results = self._eval(env, behaviour)
            elif record.kind == IL:
                results = self._train_il(record, env)
            else:
                results = self._train(env)
        except OSError as e:
            log.warning("worker %s failed: %s", record.name, e)
            self._report(record, env, "failed")
            return 1
        if behaviour.report_completed:
            self._report(record, env, "completed", results)
        return 0

    @staticmethod
    def _write_model(env: Mapping[str, str], out_dir: str) -> tuple[Path, int]:
        """A train worker's work: count the samples, write ``{out_dir}/model.pkl``."""
        samples = len(Path(env["TRAIN_DATASET_URL"]).read_text().splitlines())
        model = Path(out_dir) / "model.pkl"
        model.parent.mkdir(parents=True, exist_ok=True)
        model.write_text(f"{env['JOB_NAME']} model of {env['WORKER_NAME']}, {samples} samples")
        return model, samples

    @classmethod
    def _train(cls, env: Mapping[str, str]) -> list[dict[str, Any]]:
        model, samples = cls._write_model(env, env["OUTPUT_URL"])
        return [{
            "format": "pkl", "url": str(model), "metrics": dict(DEFAULT_METRICS),
            "classes": ["cold", "comfortable", "hot"],
            "current_metric": {"task-0": {"accuracy": DEFAULT_METRICS["accuracy"][0]}},
            "number_of_labeled_unseen_sample": samples,
        }]  # fmt: skip

    @classmethod
    def _train_il(cls, record: PodRecord, env: Mapping[str, str]) -> list[dict[str, Any]]:
        """Sedna's IncrementalLearning.train: from the base model to ``{MODEL_URL}/model.pkl``
        (MODEL_URL is the output directory), reported as the estimator's model_info."""
        record.base_model = Path(env["BASE_MODEL_URL"]).read_bytes()
        model, _ = cls._write_model(env, env["MODEL_URL"])
        return [{"format": "pkl", "url": str(model), "metrics": dict(DEFAULT_METRICS)}]

    @staticmethod
    def _eval(env: Mapping[str, str], behaviour: Behaviour) -> list[dict[str, Any]]:
        Path(env["TEST_DATASET_URL"]).read_bytes()
        results = []
        for i, url in enumerate(u for u in env.get("MODEL_URLS", "").split(";") if u):
            Path(url).read_bytes()  # the model must be there to be evaluated
            metrics = behaviour.metrics[i] if i < len(behaviour.metrics) else DEFAULT_METRICS
            results.append({"format": "pkl", "url": url, "metrics": dict(metrics)})
        return results

    def _infer(self, record: PodRecord, env: Mapping[str, str], stop: threading.Event) -> None:
        """An inference worker: loads its model(s) (MODEL_URL of an incremental-learning job,
        MODEL_URLS of a lifelong-learning one), polls for hot updates when MODEL_HOT_UPDATE
        is true, and runs until its pod is deleted."""
        urls = [env["MODEL_URL"]] if "MODEL_URL" in env else env["MODEL_URLS"].split(";")
        for url in urls:
            try:
                record.loaded.append(Path(url).read_bytes())
            except OSError as e:
                log.warning("inference worker %s: %s", record.name, e)
        if env.get("MODEL_HOT_UPDATE", "").lower() == "true":
            self._hot_update(record, env, stop)
        stop.wait()

    def _hot_update(self, record: PodRecord, env: Mapping[str, str],
                    stop: threading.Event) -> None:  # fmt: skip
        """Sedna's ModelLoadingThread: every poll period, read the config file
        (``{"model_config": {"model_path": ..., "model_update_time": ...}}``); when its
        update time differs from the last one loaded and the model file exists, load the
        model and report ``completed`` (``failed`` when it cannot be read) with kind
        ``deploy`` and no owner info. Paths are the container's, read through the mounts."""
        period = self.hot_update_poll_s
        if period is None:
            given = int(env.get("MODEL_POLL_PERIOD_SECONDS") or 60)
            period = given if given >= 1 else 60
        version = "latest"
        config = record.host_path(env.get("MODEL_HOT_UPDATE_CONFIG", ""))
        while not stop.wait(period):
            try:
                model_config = json.loads(config.read_text())["model_config"]
                latest = str(model_config["model_update_time"])
                model = record.host_path(model_config["model_path"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # no config yet, or one being written
            if not model.exists() or latest == version:
                continue
            version = latest
            try:
                record.loaded.append(model.read_bytes())
                status = "completed"
            except OSError as e:
                log.warning("inference worker %s: %s", record.name, e)
                status = "failed"
            self._report(record, env, status, kind="deploy")

    def _report(self, record: PodRecord, env: Mapping[str, str], status: str,
                results: list[dict[str, Any]] | None = None, kind: str = "") -> None:  # fmt: skip
        """Post a WorkerMessage; ``kind`` defaults to the pod's type. Sedna's
        lifelong-learning library sends its task info as ``ownerInfo``; the
        incremental-learning one sends none."""
        message: dict[str, Any] = {
            "name": env["WORKER_NAME"], "namespace": env["NAMESPACE"],
            "ownerName": env["JOB_NAME"], "ownerKind": record.kind,
            "kind": kind or record.type, "status": status,
        }  # fmt: skip
        if results:
            message["results"] = results
        if record.kind == LL:
            message["ownerInfo"] = {"podName": record.name}
        answer = self._post(f"{env['LC_SERVER']}/sedna/workers/{env['WORKER_NAME']}/info",
                            message)  # fmt: skip
        record.reports.append(Report(message, answer))

    def _post(self, url: str, message: dict[str, Any]) -> int:
        """POST until the controller answers (a 5xx or no answer is retried a while)."""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        body = json.dumps(message).encode()
        delay_s, waited_s = 0.1, 0.0
        while True:
            request = urllib.request.Request(url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    return int(answer.status)
            except urllib.error.HTTPError as e:
                if e.code < 500:
                    log.warning("report to %s refused (%d): %s", url, e.code, e.read(300))
                    return e.code
            except OSError as e:
                log.info("report to %s not delivered yet: %s", url, e)
            if waited_s >= self.post_retry_s or self._closed.wait(delay_s):
                log.warning("report to %s not delivered", url)
                return 0
            waited_s += delay_s
            delay_s = min(delay_s * 2, 2.0)
