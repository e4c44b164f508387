"""The GM stand-in alone, driven by a fake local controller over the websocket: the stage
machine, the stale status write-back, latest-wins queues, pruning, refusals, routing,
restarts and pods running real workers."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.harness import dataset_resource, job_resource
from tests.sedna_gm.gm import SednaGm
from tests.sedna_gm.kube import Change
from tests.sedna_gm.pods import Behaviour, PodInfo
from tests.wait import wait_until

NODE = "edge-node"  # the node of tests.harness resources
JOB = "sim-job"
DATASET = "sim-data"


class WorkerEndpoint:
    """The worker report endpoint of a local controller: records every POST, answers 200."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, dict[str, Any]]] = []
        reports = self.reports

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                reports.append((self.path, json.loads(self.rfile.read(length))))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class FakeLc:
    """A node's local controller on the GM's websocket: records frames, sends statuses."""

    gm: SednaGm
    node: str = NODE
    frames: list[tuple[dict[str, Any], dict[str, Any] | None]] = field(default_factory=list)
    #: how the GM ended the connection, when it did so without a clean close
    dropped: ConnectionClosed | None = None
    #: the kind of job whose statuses it sends and whose copies `jobs` lists
    kind: str = "lifelonglearningjob"

    def __post_init__(self) -> None:
        self._ws: ClientConnection = connect(
            f"ws://{self.gm.address}/", additional_headers={"Node-Name": self.node}
        ).__enter__()  # a context manager in form only: `close` ends it
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for message in self._ws:
                frame = json.loads(message)
                content = frame["content"]
                body = None if content is None else json.loads(base64.b64decode(content))
                self.frames.append((frame["header"], body))
        except ConnectionClosed as e:
            self.dropped = e

    def close(self) -> None:
        self._ws.close()
        self._thread.join(5)

    def send(self, kind: str, name: str, content: Any, operation: str = "status") -> None:
        header = {"namespace": "default", "resourceKind": kind, "resourceName": name,
                  "operation": operation}  # fmt: skip
        body = base64.b64encode(json.dumps(content).encode()).decode()
        self._ws.send(json.dumps({"header": header, "content": body}))

    def status(self, phase: str, status: str, **content: Any) -> None:
        self.send(self.kind, JOB, {"phase": phase, "status": status, **content})

    def jobs(self) -> list[tuple[str, dict[str, Any]]]:
        """Job frames received: operation and content."""
        return [(h["operation"], c) for h, c in list(self.frames)
                if h["resourceKind"] == self.kind and c is not None]  # fmt: skip

    def latest(self) -> tuple[str, str] | None:
        """The latest condition of the latest job copy received."""
        jobs = [c for op, c in self.jobs() if op == "insert"]
        conditions = jobs[-1]["status"].get("conditions") if jobs else None
        return (conditions[-1]["stage"], conditions[-1]["type"]) if conditions else None

    def wait(self, predicate: Callable[[], Any], what: str) -> Any:
        return wait_until(predicate, 10, what, detail=lambda: str(self.frames[-3:]))


@pytest.fixture
def endpoint() -> Iterator[WorkerEndpoint]:
    server = WorkerEndpoint()
    yield server
    server.close()


def make_gm(endpoint: WorkerEndpoint, **options: Any) -> SednaGm:
    nodes = {NODE: endpoint.url, "node-b": endpoint.url}
    gm = SednaGm(lc_servers=nodes, **options)
    gm.start()
    return gm


@pytest.fixture
def gm(endpoint: WorkerEndpoint) -> Iterator[SednaGm]:
    sim = make_gm(endpoint)
    yield sim
    sim.close()


def seen_running_gm(endpoint: WorkerEndpoint) -> SednaGm:
    """A GM whose workers run until its sync saw their pod Running (a pod done before
    that goes from Starting straight to Completed, and is never routed to)."""
    sim = make_gm(endpoint, behaviour=lambda info: Behaviour(until=sim.seen_running(info)))
    return sim


@pytest.fixture
def running_gm(endpoint: WorkerEndpoint) -> Iterator[SednaGm]:
    sim = seen_running_gm(endpoint)
    yield sim
    sim.close()


def setup(gm: SednaGm, tmp_path: Path, **job: Any) -> tuple[Path, Path]:
    """A dataset file of 10 samples, the dataset and the job applied; their paths."""
    data = tmp_path / "data.txt"
    data.write_text("".join(f"sample-{i}\n" for i in range(10)))
    out = tmp_path / "out"
    gm.apply(dataset_resource(DATASET, str(data)))
    gm.apply(job_resource(JOB, DATASET, str(out), **job))
    return data, out


def stage_input(out: Path, data: Path, stage: str, models: list[str] | None = None) -> Any:
    given: dict[str, Any] = {"outputDir": f"{out}/{stage}/1", "dataURL": str(data)}
    if models:
        given["models"] = [{"format": "pkl", "url": url} for url in models]
    return given


def wait_latest(gm: SednaGm, condition: tuple[str, str]) -> None:
    gm.wait(lambda: gm.conditions(JOB)[-1:] == [condition], 10, f"{condition}",
            detail=lambda: str(gm.conditions(JOB)))  # fmt: skip


def train_ready(gm: SednaGm, tmp_path: Path) -> tuple[FakeLc, Path, Path]:
    """A node, the dataset and job applied (`setup`), Train/Waiting seen at the node and
    train ready reported back: the node, the data file and the output dir."""
    lc = FakeLc(gm)
    data, out = setup(gm, tmp_path)
    lc.wait(lambda: lc.latest() == ("Train", "Waiting"), "Train/Waiting")
    lc.status("train", "ready", input=stage_input(out, data, "train"))
    return lc, data, out


def test_a_round_through_the_stage_machine(
    running_gm: SednaGm, endpoint: WorkerEndpoint, tmp_path: Path
) -> None:
    gm = running_gm
    lc = FakeLc(gm)
    data, out = setup(gm, tmp_path)
    lc.wait(lambda: lc.latest() == ("Train", "Waiting"), "Train/Waiting at the node")
    assert gm.conditions(JOB) == [("Train", "Waiting")]

    lc.status("train", "ready", input=stage_input(out, data, "train"))
    wait_latest(gm, ("Eval", "Waiting"))
    train = gm.conditions(JOB)
    assert train == [("Train", "Waiting"), ("Train", "Ready"), ("Train", "Starting"),
                     ("Train", "Running"), ("Train", "Completed"), ("Eval", "Waiting")]  # fmt: skip
    (pod,) = gm.pods(JOB)
    assert pod.name.startswith(f"{JOB}-train-") and len(pod.name) == len(JOB) + 12
    assert pod.env["WORKER_NAME"].startswith("train-worker-")
    assert pod.env["OUTPUT_URL"] == f"{out}/train/1"
    assert pod.env["TRAIN_DATASET_URL"] == str(data)
    assert pod.env["LC_SERVER"] == endpoint.url and pod.phase == "Succeeded"
    model = out / "train" / "1" / "model.pkl"
    assert "10 samples" in model.read_text()
    path, report = endpoint.reports[-1]
    assert path == f"/sedna/workers/{pod.env['WORKER_NAME']}/info"
    assert [m.message["status"] for m in pod.reports] == ["running", "completed"]
    assert report["ownerKind"] == "lifelonglearningjob" and report["ownerName"] == JOB
    assert report["results"][0]["url"] == str(model)
    assert gm.job(JOB)["metadata"]["annotations"]["sedna.io/Train"] == NODE

    lc.status("eval", "ready", input=stage_input(out, data, "eval", [str(model)]))
    wait_latest(gm, ("Deploy", "Waiting"))
    evaluation = gm.pods(JOB)[1]
    assert evaluation.env["MODEL_URLS"] == str(model)
    assert evaluation.env["TEST_DATASET_URL"] == str(data)
    assert evaluation.reports[-1].message["results"] == [
        {"format": "pkl", "url": str(model), "metrics": {"accuracy": [0.9]}}
    ]

    (out / "deploy").mkdir()
    (out / "deploy" / "index.pkl").write_bytes(b"deployed")
    lc.status("deploy", "ready", input={"outputDir": str(out)})
    gm.wait_rounds(JOB, 1, 10)
    assert gm.conditions(JOB)[-3:] == [("Deploy", "Ready"), ("Deploy", "Completed"),
                                       ("Train", "Waiting")]  # fmt: skip
    # a sync on a copy still at Deploy/Ready (the pod informer ahead of the job's) restarts
    # the inference pod once more, as Sedna's GM does: the last one serves
    infer = [p for p in gm.pods(JOB) if p.type == "inference"][-1]
    assert infer.name.startswith(f"{JOB}-inference-")
    assert infer.env["WORKER_NAME"].startswith("inferworker-")
    assert infer.env["MODEL_URLS"] == f"{out}/deploy/index.pkl"
    wait_until(lambda: infer.loaded == [b"deployed"], 10, "the inference worker's model")
    assert gm.order_problems(JOB) == [] and gm.refused == []


def test_a_failed_pod_fails_the_stage_and_train_waits_again(
    endpoint: WorkerEndpoint, tmp_path: Path
) -> None:
    def behaviour(info: PodInfo) -> Behaviour:
        return Behaviour(exit_code=3, report_failed=info.number == 1)

    gm = make_gm(endpoint, behaviour=behaviour)
    try:
        lc = FakeLc(gm)
        data, out = tmp_path / "data.txt", tmp_path / "out"
        data.write_text("a\nb\n")
        gm.apply(dataset_resource(DATASET, str(data)))
        resource = job_resource(JOB, DATASET, str(out))
        resource["spec"]["trainSpec"]["template"]["spec"]["restartPolicy"] = "Never"
        gm.apply(resource)
        lc.wait(lambda: lc.latest() == ("Train", "Waiting"), "Train/Waiting")
        lc.status("train", "ready", input=stage_input(out, data, "train"))
        gm.wait(lambda: ("Train", "Failed") in gm.conditions(JOB), 10, "Train/Failed")
        wait_latest(gm, ("Train", "Waiting"))
        (pod,) = gm.pods(JOB)
        assert pod.phase == "Failed"
        assert [r.message["status"] for r in pod.reports] == ["running", "failed"]
        assert gm.conditions(JOB)[-2:] == [("Train", "Failed"), ("Train", "Waiting")]

        lc.status("train", "ready", input=stage_input(out, data, "train"))
        gm.wait(lambda: gm.conditions(JOB).count(("Train", "Failed")) == 2, 10, "2nd failure")
        wait_latest(gm, ("Train", "Waiting"))
        assert [r.message["status"] for r in gm.pods(JOB)[1].reports] == ["running"]
        assert gm.order_problems(JOB) == []
    finally:
        gm.close()


def test_a_failed_worker_is_restarted_in_its_pod_by_default(
    endpoint: WorkerEndpoint, tmp_path: Path
) -> None:
    """Train pods get restartPolicy OnFailure: the container restarts, the pod runs on."""

    def behaviour(info: PodInfo) -> Behaviour:
        return Behaviour(exit_code=1 if info.attempt == 1 else 0)

    gm = make_gm(endpoint, behaviour=behaviour, restart_backoff_s=0.2)
    try:
        train_ready(gm, tmp_path)
        wait_latest(gm, ("Eval", "Waiting"))
        (pod,) = gm.pods(JOB)
        statuses = [r.message["status"] for r in pod.reports]
        assert statuses == ["running", "failed", "running", "completed"]
        assert ("Train", "Failed") not in gm.conditions(JOB)
    finally:
        gm.close()


#: The lag of the GM's informers where a test needs a status to fall between the store and
#: the GM's cache.
LAG_S = 2.0
#: The lag of the LC's failed status in that test: it reaches the GM's cache only after the
#: GM synced the Ready before it and wrote back, however late a loaded machine runs that.
FAILED_LAG_S = 60.0


def _failed_lags_behind(change: Change) -> float:
    """A job change whose latest condition is Failed waits `FAILED_LAG_S`, any other
    `LAG_S` (the informer delivers in order: what comes after it waits too)."""
    conditions = (change.obj.get("status") or {}).get("conditions") or []
    return FAILED_LAG_S if conditions and conditions[-1]["type"] == "Failed" else LAG_S


def test_the_status_write_back_is_stale_and_loses_a_condition_appended_meanwhile(
    endpoint: WorkerEndpoint, tmp_path: Path
) -> None:
    behaviour = Behaviour(start_delay_s=30)
    gm = make_gm(endpoint, lag=_failed_lags_behind, behaviour=lambda _i: behaviour)
    try:
        history: list[list[tuple[str, str]]] = []

        def record(change: Change) -> None:
            if change.key[0] == "lifelonglearningjob":
                conditions = change.obj["status"]["conditions"] or []
                history.append([(c["stage"], c["type"]) for c in conditions])

        gm.store.watch(record)
        lc, _, _ = train_ready(gm, tmp_path)
        wait_latest(gm, ("Train", "Ready"))
        # in the store now, and in the GM's cache only LAG_S after the Ready; the GM's sync
        # of the Ready then reads a copy without it and writes back over it
        lc.status("train", "failed")
        appended = [("Train", "Waiting"), ("Train", "Ready"), ("Train", "Failed")]
        written = [("Train", "Waiting"), ("Train", "Ready"), ("Train", "Starting")]
        gm.wait(lambda: appended in history and written in history[history.index(appended):],
                10, "the GM's write-back after the LC's failed", detail=lambda: str(history))
    finally:
        gm.close()


def test_without_lag_the_same_statuses_are_kept(endpoint: WorkerEndpoint, tmp_path: Path) -> None:
    """The valid neighbour: a status that arrives after the GM's cache caught up stays."""
    gm = make_gm(endpoint, behaviour=lambda _i: Behaviour(start_delay_s=5))
    try:
        lc, _, _ = train_ready(gm, tmp_path)
        wait_latest(gm, ("Train", "Starting"))
        lc.status("train", "failed")
        wait_latest(gm, ("Train", "Waiting"))
        assert gm.conditions(JOB)[-2:] == [("Train", "Failed"), ("Train", "Waiting")]
    finally:
        gm.close()


def test_queued_copies_of_one_job_coalesce_to_the_latest(gm: SednaGm, tmp_path: Path) -> None:
    _, out = setup(gm, tmp_path)
    gm.wait(lambda: gm.conditions(JOB) == [("Train", "Waiting")], 10, "Train/Waiting")
    for prob in (0.5, 0.6, 0.7):
        gm.apply(job_resource(JOB, DATASET, str(out), train_prob=prob))
    gm.wait(lambda: len([s for s in gm.sent if s.kind == "lifelonglearningjob"]) == 4, 10,
            "four copies queued")  # fmt: skip
    lc = FakeLc(gm)  # the node connects only now
    lc.wait(lambda: lc.jobs() and any(h["resourceKind"] == "dataset" for h, _ in lc.frames),
            "the job and the dataset")  # fmt: skip
    lc.send("dataset", DATASET, {"numberOfSamples": 10})  # a later marker: all was flushed
    gm.wait(lambda: gm.store.get("dataset", "default", DATASET)["status"]["numberOfSamples"],
            10, "the dataset status")  # fmt: skip
    lc.wait(lambda: len([h for h, _ in lc.frames if h["resourceKind"] == "dataset"]) == 2,
            "the dataset re-sent after its status")  # fmt: skip
    ((operation, job),) = lc.jobs()
    assert operation == "insert" and job["spec"]["dataset"]["trainProb"] == 0.7


def test_the_job_is_sent_as_sednas_go_types_marshal_it(gm: SednaGm, tmp_path: Path) -> None:
    lc = FakeLc(gm)
    resource = job_resource(JOB, DATASET, "/out")
    resource["metadata"]["annotations"] = {"z": "1", "lifelong.sedna.io/deploy-trigger": "{}"}
    resource["spec"]["deploySpec"]["trigger"] = {"condition": {"operator": ">"}}
    resource["spec"]["unknown"] = True
    gm.apply(dataset_resource(DATASET, "/data.txt"))
    gm.apply(resource)
    lc.wait(lc.jobs, "the job")
    header, _ = next(f for f in lc.frames if f[0]["resourceKind"] == "lifelonglearningjob")
    assert header == {"namespace": "default", "resourceKind": "lifelonglearningjob",
                      "resourceName": JOB, "operation": "insert"}  # fmt: skip
    _, job = lc.jobs()[0]
    assert "trigger" not in job["spec"]["deploySpec"] and "unknown" not in job["spec"]
    assert job["kind"] == "LifelongLearningJob" and "apiVersion" not in job
    assert list(job["metadata"]["annotations"]) == ["lifelong.sedna.io/deploy-trigger", "z"]
    assert job["spec"]["deploySpec"]["template"]["metadata"] == {"creationTimestamp": None}
    assert job["status"]["knowledgeBase"]["AIModels"] == {"numberOfAIModels": 0}
    assert job["spec"]["trainSpec"]["trigger"]["condition"]["threshold"] == 0
    # the job's frame as sent (a dataset's may follow it)
    frame = next(s for s in reversed(gm.sent) if s.kind == "lifelonglearningjob")
    raw = json.dumps(frame.content)
    assert '"threshold": 0,' in raw, "Go writes a float64 zero as 0"


def test_statuses_are_taken_as_updatefromedge_takes_them(
    gm: SednaGm, endpoint: WorkerEndpoint, tmp_path: Path
) -> None:
    lc = FakeLc(gm)
    lc._ws.send('{"header":{"namespace":"","resourceKind":"","resourceName":"","operation":""}}')
    data, out = setup(gm, tmp_path)
    lc.wait(lambda: lc.latest() == ("Train", "Waiting"), "Train/Waiting")
    lc.status("train", "running")
    lc.status("Train", "READY", input={**stage_input(out, data, "train"), "extra": 1},
              output={"models": [{"url": "/m", "current_metric": {"t1": {"acc": 0.5}},
                                  "classes": ["a"], "number_of_labeled_unseen_sample": 4,
                                  "secret": "dropped"}]})  # fmt: skip
    gm.wait(lambda: ("Train", "Ready") in gm.conditions(JOB), 10, "Train/Ready")
    assert [r.reason for r in gm.refused] == ["invalid condition type: running"]
    assert [r.reason for r in gm.ignored] == ["unknown operation ''"]
    ready = next(c for c in gm.job(JOB)["status"]["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "reported by lc"
    data_json = json.loads(ready["data"])
    assert "extra" not in data_json["input"]
    assert data_json["output"]["models"] == [{
        "format": "", "url": "/m", "current_metric": {"t1": {"acc": 0.5}}, "classes": ["a"],
        "number_of_labeled_unseen_sample": 4,
    }]  # fmt: skip
    knowledge = gm.job(JOB)["status"]["knowledgeBase"]
    assert knowledge["AIModels"]["listOfAIModels"] == [
        {"modelID": "t1", "averagePrecision": 0.5, "numberOfTrainSamples": 4}
    ]
    assert knowledge["AIClasses"] == {"numberOfAIClasses": 1, "listOfAIClasses": ["a"]}
    lc.status("train", "completed", output={"models": [{"url": 3}]})
    gm.wait(lambda: len(gm.refused) == 2, 10, "a second refusal")
    assert "cannot unmarshal number" in gm.refused[1].reason


def test_routing_2022_follows_the_stage_to_its_worker_node(
    running_gm: SednaGm, tmp_path: Path
) -> None:
    gm = running_gm
    home, worker_node = FakeLc(gm), FakeLc(gm, "node-b")
    data, out = tmp_path / "d.txt", tmp_path / "out"
    data.write_text("a\nb\n")
    gm.apply(dataset_resource(DATASET, str(data)))
    resource = job_resource(JOB, DATASET, str(out))
    resource["spec"]["trainSpec"]["template"] = {"spec": {"nodeName": "node-b"}}
    gm.apply(resource)
    home.wait(lambda: home.latest() == ("Train", "Waiting"), "Train/Waiting at home")
    home.status("train", "ready", input=stage_input(out, data, "train"))
    home.wait(lambda: home.latest() == ("Eval", "Waiting"), "Eval/Waiting at home")
    # each node has its own queue: node-b's delete may come after home's Eval/Waiting
    worker_node.wait(
        lambda: ("delete", "Train", "Completed") in [
            (op, c["status"]["conditions"][-1]["stage"], c["status"]["conditions"][-1]["type"])
            for op, c in worker_node.jobs()
        ],
        "the delete at the worker node once its stage completed",
    )  # fmt: skip
    assert ("Train", "Running") in [
        (c["status"]["conditions"][-1]["stage"], c["status"]["conditions"][-1]["type"])
        for op, c in worker_node.jobs() if op == "insert"
    ]  # fmt: skip
    assert all(c["status"]["conditions"][-1]["type"] == "Waiting"
               for _, c in home.jobs())  # fmt: skip
    assert gm.job(JOB)["metadata"]["annotations"]["sedna.io/Train"] == "node-b"
    assert not [h for h, _ in worker_node.frames if h["resourceKind"] == "dataset"]
    gm.delete("lifelonglearningjob", JOB)
    worker_node.wait(lambda: worker_node.jobs()[-1][0] == "delete", "a delete")
    home.wait(lambda: home.jobs()[-1][0] == "delete", "a delete at home")


def test_routing_2021_sends_everything_to_the_train_node(
    endpoint: WorkerEndpoint, tmp_path: Path
) -> None:
    gm = make_gm(endpoint, routing="2021")
    try:
        lc, data, out = train_ready(gm, tmp_path)
        lc.wait(lambda: lc.latest() == ("Eval", "Waiting"), "Eval/Waiting")
        model = f"{out}/train/1/model.pkl"
        lc.status("eval", "ready", input=stage_input(out, data, "eval", [model]))
        lc.wait(lambda: lc.latest() == ("Deploy", "Waiting"), "Deploy/Waiting")
        lc.status("deploy", "ready", input={"outputDir": str(out)})
        gm.wait_rounds(JOB, 1, 10)
        assert gm.conditions(JOB)[-4:] == [
            ("Deploy", "Ready"), ("Deploy", "Starting"), ("Deploy", "Completed"),
            ("Train", "Waiting"),
        ]  # fmt: skip
        lc.wait(lambda: lc.latest() == ("Train", "Waiting"), "the round's end at the node")
        assert gm.order_problems(JOB) == []
        assert {s.node for s in gm.sent} == {NODE}
    finally:
        gm.close()


def test_a_restarted_gm_sends_every_job_and_dataset_again(gm: SednaGm, tmp_path: Path) -> None:
    lc = FakeLc(gm)
    setup(gm, tmp_path)
    lc.wait(lambda: lc.latest() == ("Train", "Waiting") and len(lc.frames) >= 2, "both")
    gm.restart()
    lc.wait(lambda: lc._ws.state.name == "CLOSED", "the connection to drop")
    again = FakeLc(gm)
    again.wait(lambda: {h["resourceKind"] for h, _ in again.frames} ==
               {"dataset", "lifelonglearningjob"}, "both again")  # fmt: skip
    assert again.latest() == ("Train", "Waiting")
    assert gm.conditions(JOB) == [("Train", "Waiting")], "the store survived"


def test_order_problems_name_a_skipped_stage_and_pass_an_echo_and_an_overruling(
    gm: SednaGm,
) -> None:
    gm.apply(dataset_resource(DATASET, "/d"))
    gm.apply(job_resource(JOB, DATASET, "/o"))
    gm.wait(lambda: gm.conditions(JOB), 10, "a condition")
    gm.stop()  # no GM moves the job meanwhile

    def rewrite(*conditions: tuple[str, str]) -> None:
        def change(job: dict[str, Any]) -> None:
            job["status"]["conditions"] = [{"stage": s, "type": t} for s, t in conditions]

        gm.store.update("lifelonglearningjob", "default", JOB, change)

    rewrite(("Train", "Waiting"), ("Train", "Ready"), ("Eval", "Waiting"))
    assert gm.order_problems(JOB) == ["Train/Ready -> Eval/Waiting (condition 2)"]
    # the LC's completed, sent before it saw the GM move on, appended after the move
    rewrite(("Train", "Waiting"), ("Train", "Ready"), ("Train", "Starting"),
            ("Train", "Completed"), ("Eval", "Waiting"), ("Train", "Completed"),
            ("Eval", "Waiting"), ("Eval", "Ready"))  # fmt: skip
    assert gm.order_problems(JOB) == []
    rewrite(("Train", "Completed"), ("Eval", "Waiting"), ("Eval", "Completed"))
    assert gm.order_problems(JOB) == ["Eval/Waiting -> Eval/Completed (condition 2)"]
    # the GM completed the train stage on the last round's pod; its worker then failed
    rewrite(("Train", "Ready"), ("Train", "Starting"), ("Train", "Completed"),
            ("Eval", "Waiting"), ("Train", "Failed"), ("Train", "Waiting"))  # fmt: skip
    assert gm.order_problems(JOB) == []
    rewrite(("Train", "Ready"), ("Eval", "Waiting"), ("Train", "Failed"))
    assert gm.order_problems(JOB) == [
        "Train/Ready -> Eval/Waiting (condition 1)",
        "Eval/Waiting -> Train/Failed (condition 2)",
    ]
    # an eval Ready right after the train's Completed, the GM never having shown Eval/Waiting
    completed = [("Deploy", "Completed"), ("Train", "Waiting"), ("Train", "Ready"),
                 ("Train", "Starting"), ("Train", "Completed")]  # fmt: skip
    rewrite(*completed, ("Eval", "Ready"))
    assert gm.order_problems(JOB) == ["Train/Completed -> Eval/Ready (condition 5)"]
    # the GM showed Eval/Waiting, a sync on a copy lagging behind it wrote the Completed
    # back over it, and the node's Ready (sent on the Waiting it saw) came after that
    rewrite(*completed, ("Eval", "Waiting"))
    rewrite(*completed)
    rewrite(*completed, ("Eval", "Ready"))
    assert gm.order_problems(JOB) == []


def test_two_pods_for_one_ready_are_named_with_the_copies_they_came_from(gm: SednaGm) -> None:
    gm.apply(dataset_resource(DATASET, "/d"))
    gm.apply(job_resource(JOB, DATASET, "/o"))
    gm.wait(lambda: gm.conditions(JOB), 10, "a condition")
    gm.stop()  # no GM moves the job or makes pods meanwhile
    uid = gm.job(JOB)["metadata"]["uid"]
    for suffix, count in (("aaaaa", 2), ("bbbbb", 4)):
        gm.store.create("pod", {
            "metadata": {"name": f"{JOB}-train-{suffix}", "namespace": "default",
                         "ownerReferences": [{"kind": "LifelongLearningJob", "name": JOB,
                                              "uid": uid}]},
            "spec": {"nodeName": "nowhere", "restartPolicy": "OnFailure"},
            "status": {"phase": "Pending"}, "env": {}, "seq": 0, "readyNumber": 1,
            "conditionCount": count,
        })  # fmt: skip
    gm.wait(lambda: len(gm.pods(JOB)) == 2, 10, "both pods recorded")
    assert gm.order_problems(JOB) == [
        f"2 train pods for its Ready #1: {JOB}-train-aaaaa (from a copy of 2 conditions), "
        f"{JOB}-train-bbbbb (from a copy of 4 conditions); the conditions now: Train/Waiting"
    ]
