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
same files through its hostPath mounts), post Sedna's WorkerMessage to
``{LC_SERVER}/sedna/workers/{WORKER_NAME}/info`` (``running``, then ``completed`` with
results or ``failed``), and exit. A train worker counts the samples of its TRAIN_DATASET_URL
and writes ``{OUTPUT_URL}/model.pkl``; an eval worker reports every model of MODEL_URLS with
metrics; an inference worker loads MODEL_URLS and runs until its pod is deleted. Like the
library, a worker whose report cannot be delivered logs it and carries on.
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

OWNER_KIND = "lifelonglearningjob"  # what Sedna's library sends as ownerKind
DEFAULT_METRICS: Mapping[str, list[float]] = {"accuracy": [0.9]}


@dataclass(frozen=True)
class PodInfo:
    """What a behaviour is chosen by: the job, the pod's type (train, eval, inference), the
    how-many-th pod of that type the job got (1-based), the container attempt, the node."""

    job: str
    type: str
    number: int
    attempt: int
    node: str


@dataclass(frozen=True)
class Behaviour:
    """How one worker run goes. ``exit_code`` non-zero fails it (after a ``failed`` report
    when ``report_failed``); ``metrics`` are an eval worker's, one per model it was given
    (missing ones get `DEFAULT_METRICS`); ``start_delay_s`` keeps the pod Pending,
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
    metrics: tuple[Mapping[str, list[float]], ...] = ()


@dataclass
class Report:
    """One report a worker posted and what the controller answered (0: unreachable)."""

    message: dict[str, Any]
    answer: int


@dataclass
class PodRecord:
    """A pod as the tests see it: its name, type, node, environment, phase, the reports its
    worker posted, the model bytes an inference worker loaded, and the number of the
    stage's Ready condition it was created for."""

    name: str
    job: str
    type: str
    node: str
    env: dict[str, str]
    ready_number: int
    phase: str = "Pending"
    reports: list[Report] = field(default_factory=list)
    loaded: list[bytes] = field(default_factory=list)


@dataclass(eq=False)
class Kubelet:
    """Runs the store's pods; ``lc_server(node)`` is the URL a node's pods post to (None: the
    node does not exist and its pods stay Pending); a pod stays Pending until
    ``admitted(pod)``. Watches the store from the start."""

    store: Store
    lc_server: Callable[[str], str | None]
    behaviour: Callable[[PodInfo], Behaviour]
    _: KW_ONLY
    admitted: Callable[[dict[str, Any]], bool] = lambda _pod: True
    token: str = ""
    restart_backoff_s: float = 10.0
    post_retry_s: float = 30.0
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
        record = PodRecord(name, job, type_, pod["spec"]["nodeName"], dict(pod["env"]),
                           pod["readyNumber"])  # fmt: skip
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
        env = record.env
        attempt = 1
        behaviour = self.behaviour(PodInfo(record.job, record.type, number, attempt, record.node))
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
            info = PodInfo(record.job, record.type, number, attempt, record.node)
            behaviour = self.behaviour(info)

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
            for url in env["MODEL_URLS"].split(";"):
                try:
                    record.loaded.append(Path(url).read_bytes())
                except OSError as e:
                    log.warning("inference worker %s: %s", record.name, e)
            stop.wait()
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
            results = self._train(env) if record.type == "train" else self._eval(env, behaviour)
        except OSError as e:
            log.warning("worker %s failed: %s", record.name, e)
            self._report(record, env, "failed")
            return 1
        self._report(record, env, "completed", results)
        return 0

    @staticmethod
    def _train(env: Mapping[str, str]) -> list[dict[str, Any]]:
        samples = len(Path(env["TRAIN_DATASET_URL"]).read_text().splitlines())
        model = Path(env["OUTPUT_URL"]) / "model.pkl"
        model.parent.mkdir(parents=True, exist_ok=True)
        model.write_text(f"{env['JOB_NAME']} model of {env['WORKER_NAME']}, {samples} samples")
        return [{
            "format": "pkl", "url": str(model), "metrics": dict(DEFAULT_METRICS),
            "classes": ["cold", "comfortable", "hot"],
            "current_metric": {"task-0": {"accuracy": DEFAULT_METRICS["accuracy"][0]}},
            "number_of_labeled_unseen_sample": samples,
        }]  # fmt: skip

    @staticmethod
    def _eval(env: Mapping[str, str], behaviour: Behaviour) -> list[dict[str, Any]]:
        Path(env["TEST_DATASET_URL"]).read_bytes()
        results = []
        for i, url in enumerate(u for u in env.get("MODEL_URLS", "").split(";") if u):
            Path(url).read_bytes()  # the model must be there to be evaluated
            metrics = behaviour.metrics[i] if i < len(behaviour.metrics) else DEFAULT_METRICS
            results.append({"format": "pkl", "url": url, "metrics": dict(metrics)})
        return results

    def _report(self, record: PodRecord, env: Mapping[str, str], status: str,
                results: list[dict[str, Any]] | None = None) -> None:  # fmt: skip
        message: dict[str, Any] = {
            "name": env["WORKER_NAME"], "namespace": env["NAMESPACE"],
            "ownerName": env["JOB_NAME"], "ownerKind": OWNER_KIND, "kind": record.type,
            "status": status,
        }  # fmt: skip
        if results:
            message["results"] = results
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
