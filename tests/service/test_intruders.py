"""The production broker config keeps intruders out: real mosquitto, the shipped ACL, real logins.

`mosquitto/mosquitto.prod.conf` runs with only its listener address, file paths and port
replaced, and `mosquitto/acl` runs unchanged, against a password file made here with
`mosquitto_passwd` and, as root, given to the `mosquitto` user the way mosquitto/README.md
says (mosquitto started as root drops to that user before reading it). A namespace's
credentials can publish that namespace's report topics and nothing else, and read nothing;
strangers cannot log in; the controller, logging in as `lifelong`, still completes a whole
round with the workers reporting under their namespace, and with `lifelong worker` logging
in as the node's runner, while a logged-in intruder or another namespace's worker reads and
forges nothing.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from service.adapters.redis_store import RedisStore
from service.embedded.processes import Server, find_binary, free_port
from service.keys import NUM_SHARDS, Keys
from tests.harness import (
    NODE,
    NS,
    PREFIX,
    Cloud,
    append_lines,
    lines,
    model_file,
    samples_file,
    stop_paho,
    worker_message,
)
from tests.stack import Stack
from tests.wait import wait_until

#: the repository's broker configuration: the production mosquitto.conf and its ACL
MOSQUITTO = Path(__file__).resolve().parents[2] / "mosquitto"
PROD_CONF = MOSQUITTO / "mosquitto.prod.conf"
ACL = MOSQUITTO / "acl"

JOB = "guarded-job"
DATASET = "guarded-dataset"
TRAIN_WORKER = f"{JOB}-train-worker"
EVAL_WORKER = f"{JOB}-eval-worker"
OTHER_WORKER = "other-worker"
WORKERS = NS  # the workers of the job's namespace log in with its name
OTHER_NS = "team-b"  # another namespace's workers
RUNNER = NODE  # a node's runner logs in with the node's name
INTRUDER = "intruder"
# a worker user named as the shipped ACL used to name them: now granted nothing of its own
LEGACY_WORKER = TRAIN_WORKER
USERS = ("lifelong", "eventbus", WORKERS, OTHER_NS, RUNNER, INTRUDER, LEGACY_WORKER)

NOT_AUTHORIZED = 0x87
# PUBACK reasons meaning "accepted": success, and success with nobody subscribed
ACCEPTED = (0x00, 0x10)
BAD_CREDENTIALS = 0x86
GRANTED_QOS = (0, 1, 2)
MARKER = "marker/none"  # a topic nothing is published to: subscribed to as a marker


def caught_up(*watchers: Peer) -> None:
    """Until each watcher has everything the broker sent it so far. The broker answers a
    SUBSCRIBE after it has queued to that connection whatever it routed there before
    (retained messages of an earlier SUBSCRIBE included), and the client reads in order:
    once the SUBACK is in, nothing routed to it earlier is still on its way."""
    for watcher in watchers:
        watcher.subscribe(MARKER)


def upstream_flushed(stack: Stack, cloud: Cloud, marker_peer: Peer) -> None:
    """Until everything the controller committed for upstream has reached the cloud: its
    outbox is empty (an entry goes after the broker's PUBACK, when the broker has routed
    it), then a marker published to the upstream topic after that reaches the cloud."""
    store = RedisStore(stack.redis_url, Keys())
    try:
        wait_until(
            lambda: not any(store.outboxes.read(range(NUM_SHARDS)).values()),
            10,
            "the controller's outbox to drain",
        )
    finally:
        store.close()
    marker = {"header": {"resourceName": "upstream-marker"}, "content": {}}
    assert marker_peer.publish(UPSTREAM, _json(marker)) in ACCEPTED
    cloud.wait_for(lambda: cloud.upstream("upstream-marker"), 10, "the upstream marker")

DOWNSTREAM = f"{PREFIX}/{NODE}/downstream"
UPSTREAM = f"{PREFIX}/{NODE}/upstream"
ERRORS = f"{PREFIX}/{NODE}/errors"
PRESENCE = f"{PREFIX}/{NODE}/controllers/r1"


def worker_topic(worker: str, namespace: str = NS) -> str:
    """The report topic of a worker of `namespace`."""
    return f"{PREFIX}/{NODE}/workers/{namespace}/{worker}/info"


def legacy_topic(worker: str) -> str:
    """The report topic without a namespace level."""
    return f"{PREFIX}/{NODE}/workers/{worker}/info"


# ------------------------------------------------------------------------------ the broker


def prod_conf_text(port: int, workdir: Path, passwd: Path, acl: Path = ACL) -> str:
    """mosquitto.prod.conf with its listener, paths and port pointed at this test.

    Every other line is kept as shipped; a line the rewrite expects but cannot find fails
    the test, so the config and this test cannot drift apart silently.
    """
    replacements: dict[str, str] = {
        "listener": f"listener {port} 127.0.0.1",
        "password_file": f"password_file {passwd}",
        "acl_file": f"acl_file {acl}",
        "persistence_location": f"persistence_location {workdir}/",
    }
    seen: set[str] = set()
    out: list[str] = []
    for line in PROD_CONF.read_text().splitlines():
        key = line.split(" ", 1)[0]
        if key in replacements:
            assert key not in seen, f"{key} appears twice in {PROD_CONF.name}"
            seen.add(key)
            out.append(replacements[key])
        else:
            out.append(line)
    assert seen == set(replacements), f"{PROD_CONF.name} lacks {set(replacements) - seen}"
    return "\n".join(out) + "\n"


def make_passwd(path: Path, passwords: dict[str, str]) -> None:
    """A password file made the documented way: `mosquitto_passwd -b [-c] file user pass`."""
    binary = find_binary("mosquitto_passwd", "/usr/bin/mosquitto_passwd")
    for i, (user, password) in enumerate(passwords.items()):
        create = ["-c"] if i == 0 else []
        subprocess.run(
            [binary, *create, "-b", str(path), user, password], check=True, capture_output=True
        )


@dataclass
class SecureBroker:
    server: Server
    passwords: dict[str, str]

    @property
    def port(self) -> int:
        return self.server.port


def hand_to_broker_user(workdir: Path, passwd: Path) -> None:
    """mosquitto/README.md's steps: the password file readable by the broker's user only.

    Started as root, mosquitto drops to the `mosquitto` user before it reads the password
    file and writes its persistence, so both belong to that user (`chown`); otherwise it
    runs as whoever starts it, who owns them already.
    """
    if os.geteuid() == 0:
        broker = pwd.getpwnam("mosquitto")
        for path in (workdir, *workdir.iterdir()):
            os.chown(path, broker.pw_uid, broker.pw_gid)
    passwd.chmod(0o600)


@pytest.fixture
def secure_broker() -> Iterator[SecureBroker]:
    # Not under tmp_path: pytest makes its root 0700, which the `mosquitto` user mosquitto
    # drops to (when started as root) cannot pass. The ACL is copied for the same reason.
    workdir = Path(tempfile.mkdtemp(prefix="lifelong-mosquitto-"))
    try:
        acl = workdir / "acl"
        shutil.copyfile(ACL, acl)
        passwords = {user: secrets.token_urlsafe(12) for user in USERS}
        passwd = workdir / "passwd"
        make_passwd(passwd, passwords)
        port = free_port()
        conf = workdir / "mosquitto.conf"
        conf.write_text(prod_conf_text(port, workdir, passwd, acl))
        hand_to_broker_user(workdir, passwd)
        binary = find_binary("mosquitto", "/usr/sbin/mosquitto")
        server = Server("mosquitto", [binary, "-c", str(conf)], port, workdir)
        server.start()
        try:
            yield SecureBroker(server, passwords)
        finally:
            server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# ------------------------------------------------------------------------------ MQTT peers


class Peer:
    """One MQTT 5 client logged in as a user; records CONNACK, PUBACKs, SUBACKs and messages."""

    def __init__(self, port: int, username: str | None, password: str | None) -> None:
        self._cond = threading.Condition()
        self.connack: ReasonCode | None = None
        self.received: list[tuple[str, bytes, bool]] = []
        self._pubacks: dict[int, int] = {}
        self._subacks: dict[int, list[int]] = {}
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"{username or 'anonymous'}-{time.time_ns()}",
            protocol=paho.MQTTv5,
        )
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.wait_for(lambda: self.connack is not None, 5, "CONNACK")

    def _on_connect(self, _c: paho.Client, _u: Any, _f: Any, rc: ReasonCode, _p: Any) -> None:
        with self._cond:
            self.connack = rc
            self._cond.notify_all()

    def _on_publish(self, _c: paho.Client, _u: Any, mid: int, rc: ReasonCode, _p: Any) -> None:
        with self._cond:
            self._pubacks[mid] = rc.value
            self._cond.notify_all()

    def _on_subscribe(
        self, _c: paho.Client, _u: Any, mid: int, rcs: list[ReasonCode], _p: Any
    ) -> None:
        with self._cond:
            self._subacks[mid] = [rc.value for rc in rcs]
            self._cond.notify_all()

    def _on_message(self, _c: paho.Client, _u: Any, msg: paho.MQTTMessage) -> None:
        with self._cond:
            self.received.append((msg.topic, bytes(msg.payload), bool(msg.retain)))
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        return wait_until(predicate, timeout_s, what, condition=self._cond)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> int:
        """Publish at QoS 1 and return the PUBACK's reason code."""
        mid = self.client.publish(topic, payload, qos=1, retain=retain).mid
        self.wait_for(lambda: mid in self._pubacks, 5, f"PUBACK of {topic}")
        return self._pubacks[mid]

    def subscribe(self, *filters: str) -> list[int]:
        """Subscribe at QoS 1 and return the SUBACK's reason codes, one per filter."""
        _rc, mid = self.client.subscribe([(f, 1) for f in filters])
        assert mid is not None
        self.wait_for(lambda: mid in self._subacks, 5, f"SUBACK of {filters}")
        return self._subacks[mid]

    def topics(self) -> list[str]:
        with self._cond:
            return [topic for topic, _payload, _retain in self.received]

    def close(self) -> None:
        stop_paho(self.client)


@pytest.fixture
def peers(secure_broker: SecureBroker) -> Iterator[Callable[[str], Peer]]:
    """Log in as one of the broker's users with the right password."""
    made: list[Peer] = []

    def login(user: str) -> Peer:
        peer = Peer(secure_broker.port, user, secure_broker.passwords[user])
        made.append(peer)
        assert peer.connack is not None and not peer.connack.is_failure, (user, peer.connack)
        return peer

    yield login
    for peer in made:
        peer.close()


def refused(port: int, username: str | None, password: str | None) -> int:
    """The CONNACK reason of a login attempt that is expected to fail."""
    peer = Peer(port, username, password)
    peer.close()
    assert peer.connack is not None
    return int(peer.connack.value)


# ------------------------------------------------------------------------------ tests


def test_strangers_cannot_log_in(secure_broker: SecureBroker) -> None:
    port = secure_broker.port
    assert refused(port, None, None) in (NOT_AUTHORIZED, BAD_CREDENTIALS)
    assert refused(port, "lifelong", "not-the-password") in (NOT_AUTHORIZED, BAD_CREDENTIALS)
    assert refused(port, "nobody", "whatever") in (NOT_AUTHORIZED, BAD_CREDENTIALS)
    # a worker's password does not open another user's account
    worker_password = secure_broker.passwords[WORKERS]
    assert refused(port, "lifelong", worker_password) in (NOT_AUTHORIZED, BAD_CREDENTIALS)


def test_workers_may_only_publish_their_namespaces_topics_and_read_nothing(
    peers: Callable[[str], Peer],
) -> None:
    controller = peers("lifelong")  # sees downstream and every worker topic
    assert all(
        code in GRANTED_QOS
        for code in controller.subscribe(
            DOWNSTREAM, f"{PREFIX}/+/workers/+/info", f"{PREFIX}/+/workers/+/+/info"
        )
    )
    cloud = peers("eventbus")  # sees upstream, errors and presence
    assert all(
        code in GRANTED_QOS
        for code in cloud.subscribe(UPSTREAM, ERRORS, f"{PREFIX}/{NODE}/controllers/#")
    )
    worker = peers(WORKERS)
    other = peers(OTHER_NS)

    # The worker listens for everything it can think of. mosquitto 2.0's acl_file checks
    # reads at delivery, so a SUBACK may say "granted": what counts is that nothing arrives.
    for code in worker.subscribe(
        "#", UPSTREAM, ERRORS, DOWNSTREAM, worker_topic(OTHER_WORKER, OTHER_NS)
    ):
        assert code in (*GRANTED_QOS, NOT_AUTHORIZED)

    # its own topic: accepted and delivered to the controller
    own = worker_message(JOB, "train", "running", worker=TRAIN_WORKER)
    assert worker.publish(worker_topic(TRAIN_WORKER), _json(own)) in ACCEPTED
    controller.wait_for(lambda: worker_topic(TRAIN_WORKER) in controller.topics(), 5, "own report")

    # anything else: refused with 0x87 and never delivered
    forged = {
        worker_topic(OTHER_WORKER, OTHER_NS): b"a report in another namespace",
        legacy_topic(OTHER_WORKER): b"a report without a namespace",
        legacy_topic(TRAIN_WORKER): b"a report without a namespace",
        f"{PREFIX}/other-node/workers/{OTHER_NS}/{OTHER_WORKER}/info": b"another namespace",
        DOWNSTREAM: b'{"header":{"operation":"insert"},"content":"a forged job"}',
        UPSTREAM: b"a forged status for the cloud",
        ERRORS: b"a forged rejection",
    }
    for topic, payload in forged.items():
        assert worker.publish(topic, payload) == NOT_AUTHORIZED, topic
    # nor may it leave a retained "offline" in a controller's name
    assert worker.publish(PRESENCE, b'{"state":"offline"}', retain=True) == NOT_AUTHORIZED

    # Real traffic the worker would love to read: status upstream, another worker's report.
    assert controller.publish(UPSTREAM, b"status") in ACCEPTED
    assert controller.publish(PRESENCE, b'{"state":"online"}', retain=True) in ACCEPTED
    other_topic = worker_topic(OTHER_WORKER, OTHER_NS)
    assert other.publish(other_topic, b"other's report") in ACCEPTED
    controller.wait_for(lambda: other_topic in controller.topics(), 5, "other")
    cloud.wait_for(lambda: PRESENCE in cloud.topics() and UPSTREAM in cloud.topics(), 5, "up")
    caught_up(worker, controller, cloud)
    assert worker.received == [], "a worker read traffic it has no right to"
    assert controller.topics().count(other_topic) == 1, "forgery got through"
    assert [t for t in controller.topics() if "/workers/" in t] == [
        worker_topic(TRAIN_WORKER),
        other_topic,
    ]
    assert DOWNSTREAM not in controller.topics()
    assert cloud.topics().count(UPSTREAM) == 1 and ERRORS not in cloud.topics()
    assert [p for t, p, _r in cloud.received if t == PRESENCE] == [b'{"state":"online"}']

    # a late subscriber is not handed a retained message either
    late = peers(OTHER_NS)
    late.subscribe(f"{PREFIX}/#")
    caught_up(late)
    assert late.received == []


def test_controller_and_cloud_keep_to_their_side(peers: Callable[[str], Peer]) -> None:
    """The controller cannot inject resources or reports; the cloud cannot forge status."""
    controller = peers("lifelong")
    cloud = peers("eventbus")
    for topic in (DOWNSTREAM, worker_topic(TRAIN_WORKER)):
        assert controller.publish(topic, b"x") == NOT_AUTHORIZED, topic
    for topic in (UPSTREAM, ERRORS, PRESENCE, worker_topic(TRAIN_WORKER)):
        assert cloud.publish(topic, b"x") == NOT_AUTHORIZED, topic
    # what each may publish is accepted
    assert controller.publish(ERRORS, b"{}") in ACCEPTED
    assert cloud.publish(DOWNSTREAM, b"{}") in ACCEPTED


@dataclass
class SecureStack(Stack):
    """The usual stack, but the controller logs in as `lifelong`."""

    userinfo: str = ""

    @property
    def mqtt_url(self) -> str:
        return f"mqtt://{self.userinfo}@127.0.0.1:{self.broker.port}"


def test_controller_completes_a_round_under_the_acl(
    tmp_path: Path, secure_broker: SecureBroker, redis_proc: Server, peers: Callable[[str], Peer]
) -> None:
    passwords = secure_broker.passwords
    cloud = Cloud(secure_broker.port, username="eventbus", password=passwords["eventbus"])
    stack = SecureStack(
        tmp_path,
        secure_broker.server,
        redis_proc,
        cloud,
        userinfo=f"lifelong:{passwords['lifelong']}",
    )
    try:
        run_round(stack, peers)
    finally:
        for controller in stack.controllers:
            controller.stop()
        cloud.close()
    secure_broker.server.stop()  # mosquitto flushes its stdout log on exit
    # both of the controller's connections logged in as `lifelong`; its password, given in
    # LIFELONG_MQTT_URL, is in neither its log nor the broker's
    broker_log = secure_broker.server.log_text()
    for client_id in (f"lifelong-{NODE}-r1", f"lifelong-{NODE}-ingress"):
        assert f"as {client_id} " in broker_log, client_id
    assert "u'lifelong'" in broker_log
    controller_log = stack.controllers[0].log()
    assert passwords["lifelong"] not in controller_log + broker_log


def run_round(stack: SecureStack, peers: Callable[[str], Peer]) -> None:
    cloud = stack.cloud
    data = stack.samples()
    out = stack.workdir / "out"
    stack.serving()
    # presence, the retained message and its will's topic, got past the ACL
    cloud.wait_for(
        lambda: any(t.endswith("/controllers/r1") for t, _ in cloud.messages), 10, "presence"
    )

    cloud.insert_dataset(DATASET, data)
    cloud.insert_job(JOB, DATASET, out)
    cloud.wait_status(JOB, "train", "ready")

    train = evaluator = peers(WORKERS)
    model = out / "train" / "1" / "model.pkl"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"trained")

    # A worker of another namespace, with the name of the job's train worker, tries to
    # finish (or fail) its training: the broker refuses it on the job's namespace's topic
    # and on the topic without a namespace (as a user named like the worker, which the
    # shipped ACL used to grant its own such topic), the controller on its own namespace's.
    forged = worker_message(JOB, "train", "completed", str(model), worker=TRAIN_WORKER)
    forged_bytes = _json(forged)
    failed = _json(worker_message(JOB, "train", "failed", worker=TRAIN_WORKER))
    stranger = peers(OTHER_NS)
    assert stranger.publish(worker_topic(TRAIN_WORKER), forged_bytes) == NOT_AUTHORIZED
    assert stranger.publish(legacy_topic(TRAIN_WORKER), failed) == NOT_AUTHORIZED
    assert peers(LEGACY_WORKER).publish(legacy_topic(TRAIN_WORKER), failed) == NOT_AUTHORIZED
    assert stranger.publish(worker_topic(TRAIN_WORKER, OTHER_NS), failed) in ACCEPTED
    rejection = cloud.wait_for(cloud.errors, 10, "rejection of the other namespace")[0]
    assert rejection["topic"] == worker_topic(TRAIN_WORKER, OTHER_NS)
    assert "namespace 'default' does not match 'team-b' in the topic" in rejection["reason"]
    assert cloud.status(JOB, "train", "failed") is None
    assert cloud.status(JOB, "eval", "ready") is None

    # the real workers report on their own topics with their own credentials
    assert train.publish(worker_topic(TRAIN_WORKER), forged_bytes) in ACCEPTED
    cloud.wait_status(JOB, "eval", "ready")
    scored = out / "eval" / "1" / "model.pkl"
    scored.parent.mkdir(parents=True)
    scored.write_bytes(b"evaluated")
    report = worker_message(JOB, "eval", "completed", str(scored), worker=EVAL_WORKER)
    assert evaluator.publish(worker_topic(EVAL_WORKER), _json(report)) in ACCEPTED
    deploy = cloud.wait_status(JOB, "deploy", "ready")
    assert deploy["content"]["input"]["models"] == [{"format": "pkl", "url": str(scored)}]
    assert (out / "deploy" / "index.pkl").read_bytes() == b"evaluated"
    assert len(cloud.errors()) == 1, cloud.errors()


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def test_an_intruder_cannot_drive_a_job_nor_a_worker_replay_a_round(
    tmp_path: Path, secure_broker: SecureBroker, redis_proc: Server, peers: Callable[[str], Peer]
) -> None:
    """Reports are bound to their job and round. Under the shipped ACL a user may publish
    its own report topic; `intruder` doing so with `ownerName` of another job used to drive
    that job through train -> eval -> deploy, and re-sending round 1's exact `train
    completed` during round 2 moved round 2 to eval with round 1's model. Both are refused
    now, with a reason on the errors topic, and change nothing."""
    passwords = secure_broker.passwords
    cloud = Cloud(secure_broker.port, username="eventbus", password=passwords["eventbus"])
    stack = SecureStack(
        tmp_path, secure_broker.server, redis_proc, cloud,
        userinfo=f"lifelong:{passwords['lifelong']}",
    )  # fmt: skip
    try:
        data = samples_file(tmp_path / "data" / "train.txt")
        out = tmp_path / "out"
        controller = stack.serving()
        cloud.insert_dataset(DATASET, data)
        cloud.insert_job(JOB, DATASET, out)
        cloud.wait_status(JOB, "train", "ready")

        def model(kind: str, version: int) -> str:
            path = out / kind / str(version) / "model.pkl"
            return model_file(path, f"{kind} {version}".encode())

        # a worker of the job's namespace not named for the job
        workers = peers(WORKERS)
        forged = worker_message(JOB, "train", "completed", model("train", 1), worker=INTRUDER)
        assert workers.publish(worker_topic(INTRUDER), _json(forged)) in ACCEPTED
        refusal = cloud.wait_for(cloud.errors, 10, "the intruder's refusal")[0]
        assert refusal["topic"] == worker_topic(INTRUDER)
        assert f"'{INTRUDER}' may not report for job default/{JOB}" in refusal["reason"]

        # round 1, by the job's own workers
        train = evaluator = workers
        round_1 = _json(worker_message(JOB, "train", "completed", model("train", 1),
                                       worker=TRAIN_WORKER))  # fmt: skip
        assert train.publish(worker_topic(TRAIN_WORKER), round_1) in ACCEPTED
        cloud.wait_status(JOB, "eval", "ready")
        scored = worker_message(JOB, "eval", "completed", model("eval", 1), worker=EVAL_WORKER)
        assert evaluator.publish(worker_topic(EVAL_WORKER), _json(scored)) in ACCEPTED
        cloud.wait_status(JOB, "deploy", "ready")

        # round 2 starts; round 1's exact report comes again
        before = len(cloud.upstream(JOB))
        append_lines(data, lines(10, 20))
        ready = cloud.wait_status(JOB, "train", "ready", after=before)
        assert ready["content"]["input"]["outputDir"] == f"{out}/train/2"
        after_ready = len(cloud.upstream(JOB))
        assert train.publish(worker_topic(TRAIN_WORKER), round_1) in ACCEPTED
        cloud.wait_for(lambda: len(cloud.errors()) == 2, 10, "the replay's refusal")
        replay = cloud.errors()[1]
        assert replay["topic"] == worker_topic(TRAIN_WORKER)
        assert f"not under {out}/train/2/, the output dir of round 2" in replay["reason"]
        # round 1's `failed`, which names no model: the name the runner gave its worker
        # carries its round
        runner_1 = f"{JOB}-train-1"
        stale = _json(worker_message(JOB, "train", "failed", worker=runner_1))
        assert train.publish(worker_topic(runner_1), stale) in ACCEPTED
        cloud.wait_for(lambda: len(cloud.errors()) == 3, 10, "the stale failure's refusal")
        assert (
            f"reported failed for round 1, but job {NS}/{JOB} is at round 2"
            in cloud.errors()[2]["reason"]
        )
        upstream_flushed(stack, cloud, peers("lifelong"))
        assert len(cloud.upstream(JOB)) == after_ready, "the replay changed something"

        # round 2's own report still moves it on
        round_2 = worker_message(JOB, "train", "completed", model("train", 2),
                                 worker=TRAIN_WORKER)  # fmt: skip
        assert train.publish(worker_topic(TRAIN_WORKER), _json(round_2)) in ACCEPTED
        eval_2 = cloud.wait_status(JOB, "eval", "ready", after=after_ready)
        assert eval_2["content"]["input"]["models"] == [
            {"format": "pkl", "url": model("train", 2)}
        ]
        # the train stage is over: a train `failed` now is refused, and not forwarded
        after_eval = len(cloud.upstream(JOB))
        late = _json(worker_message(JOB, "train", "failed", worker=TRAIN_WORKER))
        assert train.publish(worker_topic(TRAIN_WORKER), late) in ACCEPTED
        cloud.wait_for(lambda: len(cloud.errors()) == 4, 10, "the late failure's refusal")
        assert "is not running its train stage (it is eval/running" in cloud.errors()[3]["reason"]
        upstream_flushed(stack, cloud, peers("lifelong"))
        assert len(cloud.upstream(JOB)) == after_eval, "the late failure was forwarded"
        assert len(cloud.errors()) == 4, cloud.errors()
    finally:
        for controller in stack.controllers:
            controller.stop()
        cloud.close()


# ------------------------------------------------------------------------------ the runner

# A train or eval command: writes a model into OUTPUT_URL and names it in the results file.
WRITE_MODEL = """
import json, os, pathlib
out = pathlib.Path(os.environ["OUTPUT_URL"]); out.mkdir(parents=True, exist_ok=True)
model = out / "model.bin"
model.write_bytes(("model of " + os.environ["WORKER_NAME"]).encode())
result = {"format": "bin", "url": str(model), "metrics": {"accuracy": 0.75}}
pathlib.Path(os.environ["LIFELONG_RESULTS_FILE"]).write_text(json.dumps([result]))
"""


def test_runner_completes_a_round_under_the_acl_and_an_intruder_gets_nothing(
    tmp_path: Path, secure_broker: SecureBroker, redis_proc: Server, peers: Callable[[str], Peer]
) -> None:
    """`lifelong worker`, logged in as the node's runner, reads the ready messages and reports
    for the per-round worker names ({job}-train-1, {job}-eval-1) of its node; a logged-in
    intruder can neither read that traffic nor forge the runner's reports or anything else."""
    passwords = secure_broker.passwords
    port = secure_broker.port
    intruder = peers(INTRUDER)
    for code in intruder.subscribe("#", UPSTREAM, DOWNSTREAM, f"{PREFIX}/+/workers/+/info"):
        assert code in (*GRANTED_QOS, NOT_AUTHORIZED)  # granted or not, nothing may arrive
    runner_peer = peers(RUNNER)  # the runner's rights, tried by hand beside the real runner
    runner_peer.subscribe(DOWNSTREAM, ERRORS, worker_topic(TRAIN_WORKER),
                          f"{PREFIX}/other-node/upstream")  # fmt: skip

    cloud = Cloud(port, username="eventbus", password=passwords["eventbus"])
    stack = SecureStack(
        tmp_path, secure_broker.server, redis_proc, cloud,
        userinfo=f"lifelong:{passwords['lifelong']}",
    )  # fmt: skip
    runner_log = tmp_path / "runner.log"
    runner = start_runner(f"mqtt://{RUNNER}:{passwords[RUNNER]}@127.0.0.1:{port}", runner_log)
    try:
        wait_until(lambda: "subscribed to" in runner_log.read_text(), 15, "the runner serving")
        data = samples_file(tmp_path / "data" / "train.txt")
        out = tmp_path / "out"
        stack.controller()
        cloud.wait_for(lambda: any(t == PRESENCE for t, _ in cloud.messages), 10, "online")
        cloud.insert_dataset(DATASET, data)
        cloud.insert_job(JOB, DATASET, out)
        cloud.wait_status(JOB, "train", "ready")

        # the intruder forges the runner's report: refused by the broker, never applied
        forged = worker_message(JOB, "train", "completed", "/etc/passwd", worker=f"{JOB}-train-1")
        assert intruder.publish(worker_topic(f"{JOB}-train-1"), _json(forged)) == NOT_AUTHORIZED
        assert intruder.publish(legacy_topic(f"{JOB}-train-1"), _json(forged)) == NOT_AUTHORIZED
        for topic in (DOWNSTREAM, UPSTREAM, ERRORS, worker_topic(TRAIN_WORKER)):
            assert intruder.publish(topic, b"forged") == NOT_AUTHORIZED, topic
        assert intruder.publish(PRESENCE, b'{"state":"offline"}', retain=True) == NOT_AUTHORIZED

        deploy = cloud.wait_status(JOB, "deploy", "ready", timeout_s=30)
        model = f"{out}/eval/1/model.bin"
        assert deploy["content"]["input"]["models"] == [
            {"format": "bin", "url": model}
        ], "the runner's eval model was deployed"
        assert (out / "deploy" / "index.pkl").read_bytes() == f"model of {JOB}-eval-1".encode()
        reported = {
            (m["content"]["phase"], m["content"]["status"])
            for m in cloud.upstream(JOB) if "output" in m["content"]
        }  # fmt: skip
        assert reported == {("train", "running"), ("train", "completed"),
                            ("eval", "running"), ("eval", "completed")}  # fmt: skip

        # the runner's own rights stop at its node's reports and upstream
        for topic in (DOWNSTREAM, UPSTREAM, ERRORS, PRESENCE, legacy_topic(f"{JOB}-train-1"),
                      f"{PREFIX}/other-node/workers/{NS}/{JOB}-train-1/info"):  # fmt: skip
            assert runner_peer.publish(topic, b"x") == NOT_AUTHORIZED, topic
        # traffic the runner has no business reading: another node's status, the errors,
        # another worker's report (downstream resources flowed above)
        controller_peer = peers("lifelong")
        assert controller_peer.publish(f"{PREFIX}/other-node/upstream", b"o") in ACCEPTED
        assert controller_peer.publish(ERRORS, b"{}") in ACCEPTED
        report = worker_message("no-such-job", "train", "running", worker=TRAIN_WORKER)
        assert peers(WORKERS).publish(worker_topic(TRAIN_WORKER), _json(report)) in ACCEPTED
        # the controller refuses the report for an unknown job: errors traffic of its own
        cloud.wait_for(lambda: len(cloud.errors()) == 2, 10, "both errors messages")
        caught_up(intruder, runner_peer)
        assert intruder.received == [], "the intruder read traffic it has no right to"
        assert runner_peer.received == [], "the runner read beyond its node's upstream"
    finally:
        runner.terminate()
        runner.wait(15)
        for controller in stack.controllers:
            controller.stop()
        cloud.close()
    log = runner_log.read_text()
    assert "refused" not in log and "Traceback" not in log, log[-2000:]
    assert passwords[RUNNER] not in log


def start_runner(mqtt_url: str, log: Path) -> subprocess.Popen[bytes]:
    """`lifelong worker` as a user runs it, logging in as the node's runner."""
    command = shlex.join([sys.executable, "-c", WRITE_MODEL])
    env = {**os.environ, "LIFELONG_MQTT_URL": mqtt_url, "LIFELONG_NODE_NAME": NODE,
           "LIFELONG_LOG_FORMAT": "text"}  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "service.cli", "worker", "--train-command", command,
             "--eval-command", command, "--work-dir", str(log.parent / "runner")],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
