"""`lifelong worker`: the reference worker runner for places without Kubernetes.

Sedna's global manager turns every train/eval "ready" status into a pod. Without Kubernetes
something else has to: this runner listens upstream, and for each ready message runs the
user's command with the environment a Sedna worker pod gets (NAMESPACE, JOB_NAME,
WORKER_NAME, TRAIN_DATASET_URL or TEST_DATASET_URL, MODEL_URLS, OUTPUT_URL,
ORIGINAL_DATASET_URL, LC_SERVER; DEPLOYED_MODEL_URL for the eval of a job with a deploy
condition; BASE_MODEL_URL and MODEL_URL for an incremental-learning job's train), reports
`running`, and then `completed` with the results the command wrote to
`$LIFELONG_RESULTS_FILE`, or `failed` with its exit code and stderr tail.

Why it looks the way it does:
- Upstream delivery is at least once, so ready messages are deduplicated by `header.id`, and
  the MQTT session is persistent with the PUBACK sent only after the final report: a runner
  killed mid-task gets the message again and reruns it.
- Tasks run one at a time, in arrival order: a reference runner for one edge box, where two
  trainings at once would only compete for the same cores.
- Reports go over MQTT (`{prefix}/{node}/workers/{namespace}/{worker}/info`, the topic the
  broker's ACL lets the node's runner publish for every namespace) or, with `--lc-server`,
  to the controller's HTTP endpoint, which is also what Sedna's own worker library posts to
  (LC_SERVER + /sedna/workers/{WORKER_NAME}/info). Workers are named for their round
  (`{job}-{kind}-{version}`), which binds their reports to it. A library-driven worker
  reports its own completion first; the runner's later report of the same stage is then
  refused (the stage is over) and changes nothing.
- Commands run in their own session so a Ctrl-C at the terminal reaches the runner, which
  then ends the command's whole process group itself.
- Ready messages and commands are not trusted: a ready message's names and output dir are
  checked before they become paths, and a command gets a minimal environment, never the
  runner's own settings (the broker password, the HTTP token).

In order below: the task a ready message asks for and the environment its command runs in
(a ready message is not trusted: its namespace and job name must be DNS-1123 names, its output
dir an absolute path without `..` or an `s3://` URL, and anything else is ignored with a
warning; a command gets the variables a Sedna worker pod gets, the few that make a process
work and those the operator names); running a command and reading its results; delivering
reports over MQTT or HTTP; and the runner's loop. `lifelong worker` on the command line is
`service.cli.running`'s.
"""


import contextlib
import hashlib
import json
import logging
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from service import config as config_mod
from service.adapters.mqtt import Inbound, MqttClient, MqttSettings
from service.errors import BrokerUnavailable, ConfigError, PermanentError, TransientError
from service.wire import DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, STORAGE_URL_PATTERN

log = logging.getLogger("service.worker")

TaskKind = Literal["train", "eval"]
RESULTS_ENV = "LIFELONG_RESULTS_FILE"
MODEL_URL_SEPARATOR = ";"  # Sedna joins MODEL_URLS with ';'
#: The deployed model an eval compares the new one with (also last in MODEL_URLS).
DEPLOYED_MODEL_ENV = "DEPLOYED_MODEL_URL"
_MAX_WORKER_NAME_CHARS = 253
_MAX_NAMESPACE_CHARS = 63
_NAMESPACE_RE = re.compile(DNS_LABEL_PATTERN)
_NAME_RE = re.compile(DNS_SUBDOMAIN_PATTERN)
_STORAGE_URL_RE = re.compile(STORAGE_URL_PATTERN)
#: What a command inherits from the runner's environment: where programs and the home are,
#: the user, locale and time zone, the temporary directory, Python's path, the GPUs to use.
INHERITED_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "PYTHONPATH", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES",
)  # fmt: skip
_INHERITED_PREFIX = "LC_"  # the locale's categories
#: The runner's own settings (broker and Redis URLs with passwords, the HTTP token) start so.
RUNNER_ENV_PREFIX = "LIFELONG_"


@dataclass(frozen=True)
class Task:
    """One train or eval round a ready message asks for."""

    message_id: str
    namespace: str
    job: str
    kind: TaskKind
    data_url: str
    output_dir: str
    data_index_url: str | None = None
    model_urls: tuple[str, ...] = ()
    #: eval of a job with a deploy condition: the deployed model, to score beside the new one
    deployed_model_url: str | None = None
    #: the job's kind, as the ready message's `resourceKind` says it
    owner_kind: str = "lifelonglearningjob"

    @property
    def worker_name(self) -> str:
        """`{job}-{kind}-{version}`: stable per round, so a rerun reports under the same name.

        The version is the output dir's last segment (`<out>/train/3`); failing that, a short
        hash of the message id keeps the name unique and DNS-1123.
        """
        version = self.output_dir.rstrip("/").rsplit("/", 1)[-1]
        if not version.isdigit():
            version = hashlib.sha1(self.message_id.encode()).hexdigest()[:8]
        return f"{self.job}-{self.kind}-{version}"[:_MAX_WORKER_NAME_CHARS]


@dataclass(frozen=True)
class WorkerSettings:
    """What the runner serves and how it runs and reports."""

    commands: Mapping[TaskKind, tuple[str, ...]]
    lc_server: str
    report_http: bool = False
    jobs: frozenset[str] = frozenset()
    original_dataset_url: str | None = None
    timeout_s: float | None = None
    work_dir: Path | None = None
    #: further variables of the runner's environment the commands get (`--pass-env`)
    pass_env: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        runner_own = [name for name in self.pass_env if name.startswith(RUNNER_ENV_PREFIX)]
        if runner_own:
            raise ConfigError(
                f"--pass-env {runner_own[0]}: the runner's own LIFELONG_ settings (the broker "
                "URL with its password, the HTTP token) are never passed to a command"
            )


# --- decoding ready messages ------------------------------------------------------------------


def parse_ready(payload: bytes) -> Task | None:
    """The task a train/eval ready envelope asks for; None for every other upstream message."""
    try:
        envelope = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(envelope, dict):
        return None
    header, content = envelope.get("header"), envelope.get("content")
    if not isinstance(header, dict) or not isinstance(content, dict):
        return None
    kind, task_input = content.get("phase"), content.get("input")
    if content.get("status") != "ready" or kind not in ("train", "eval"):
        return None
    if not isinstance(task_input, dict):
        return None
    return _task(header, kind, task_input)


def _task(header: dict[str, Any], kind: TaskKind, task_input: dict[str, Any]) -> Task | None:
    names = (header.get("id"), header.get("namespace"), header.get("resourceName"))
    paths = (task_input.get("dataURL"), task_input.get("outputDir"))
    if not all(isinstance(v, str) and v for v in (*names, *paths)):
        log.warning("ignoring a %s ready message without id, names, dataURL or outputDir", kind)
        return None
    problem = _untrusted(str(names[1]), str(names[2]), str(paths[1]))
    if problem is not None:
        log.warning("ignoring a %s ready message: %s", kind, problem)
        return None
    models = task_input.get("models") or []
    urls = tuple(m["url"] for m in models if isinstance(m, dict) and isinstance(m.get("url"), str))
    index = task_input.get("dataIndexURL")
    deployed = task_input.get("deployedModel")
    deployed_url = deployed.get("url") if isinstance(deployed, dict) else None
    return Task(
        message_id=str(names[0]),
        namespace=str(names[1]),
        job=str(names[2]),
        kind=kind,
        data_url=str(paths[0]),
        output_dir=str(paths[1]),
        data_index_url=index if isinstance(index, str) and index else None,
        model_urls=urls,
        deployed_model_url=deployed_url if isinstance(deployed_url, str) and deployed_url else None,
        owner_kind=INCREMENTAL if str(header.get("resourceKind", "")).lower() == INCREMENTAL
        else OWNER_KIND,
    )  # fmt: skip


def _untrusted(namespace: str, job: str, output_dir: str) -> str | None:
    """Why a ready message's names or output dir cannot be used, or None. The values are
    quoted with repr, so no control character reaches a log line as itself."""
    if len(namespace) > _MAX_NAMESPACE_CHARS or not _NAMESPACE_RE.match(namespace):
        return f"namespace {namespace[:80]!r} is not a DNS-1123 label"
    if len(job) > _MAX_WORKER_NAME_CHARS or not _NAME_RE.match(job):
        return f"job name {job[:80]!r} is not a DNS-1123 subdomain"
    if not _STORAGE_URL_RE.match(output_dir):
        return (
            f"outputDir {output_dir[:200]!r} is neither an absolute path without '..' nor an "
            "s3:// URL"
        )
    return None


def command_env(environ: Mapping[str, str], pass_env: Iterable[str]) -> dict[str, str]:
    """What a command inherits of the runner's environment `environ`: `INHERITED_ENV`, the
    locale's `LC_*` and the names in `pass_env`; never a LIFELONG_ setting of the runner."""
    wanted = {*INHERITED_ENV, *pass_env}
    return {
        name: value
        for name, value in environ.items()
        if (name in wanted or name.startswith(_INHERITED_PREFIX))
        and not name.startswith(RUNNER_ENV_PREFIX)
    }


def task_env(task: Task, settings: WorkerSettings, results_file: Path) -> dict[str, str]:
    """The variables a Sedna worker pod of this kind gets, plus where to write results.

    MODEL_URLS lists every input model, as Sedna's GM mounts them; for the eval of a job with
    a deploy condition it ends with the deployed model, which DEPLOYED_MODEL_URL names too:
    the command reports the new model's result first and the deployed model's second.

    ORIGINAL_DATASET_URL is the data index when the controller wrote one (a remote txt
    dataset, as Sedna's GM passes it), else the `--original-dataset-url` given, else unset.
    """
    env = {
        "NAMESPACE": task.namespace,
        "JOB_NAME": task.job,
        "WORKER_NAME": task.worker_name,
        "OUTPUT_URL": task.output_dir,
        "LC_SERVER": settings.lc_server,
        RESULTS_ENV: str(results_file),
    }
    env["TRAIN_DATASET_URL" if task.kind == "train" else "TEST_DATASET_URL"] = task.data_url
    if task.model_urls:
        env["MODEL_URLS"] = MODEL_URL_SEPARATOR.join(task.model_urls)
    if task.owner_kind == INCREMENTAL and task.kind == "train":
        # an incremental-learning train pod's: the model it starts from, and where it writes
        env["MODEL_URL"] = task.output_dir
        if task.model_urls:
            env["BASE_MODEL_URL"] = task.model_urls[0]
    if task.deployed_model_url:
        env[DEPLOYED_MODEL_ENV] = task.deployed_model_url
    original = task.data_index_url or settings.original_dataset_url
    if original:
        env["ORIGINAL_DATASET_URL"] = original
    return env


STDERR_TAIL_BYTES = 2048
_POLL_S = 0.2


@dataclass(frozen=True)
class Outcome:
    """How a command ended, as the report will say it."""

    status: Literal["completed", "failed"]
    results: list[dict[str, Any]] = field(default_factory=list)
    owner_info: dict[str, Any] = field(default_factory=dict)


class Stopped(Exception):
    """The runner is stopping; the command was ended and nothing is reported."""


def run_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    task_dir: Path,
    timeout_s: float | None,
    stop: threading.Event | None = None,
) -> Outcome:
    """Run one task's command with exactly the environment `env`; its stdout and stderr go to
    files in `task_dir`.

    Raises `Stopped` when `stop` is set meanwhile: the command's process group is killed.
    """
    results_file = Path(env[RESULTS_ENV])
    stderr_path = task_dir / "stderr.log"
    try:
        exit_code = _run(argv, env, task_dir, timeout_s, stop)
    except OSError as e:
        return Outcome("failed", owner_info={"reason": f"cannot run {argv[0]!r}: {e}"})
    if exit_code is None:
        info = {"reason": f"timed out after {timeout_s:g}s", "stderr": _tail(stderr_path)}
        return Outcome("failed", owner_info=info)
    if exit_code != 0:
        failed: dict[str, Any] = {"exitCode": exit_code, "stderr": _tail(stderr_path)}
        return Outcome("failed", owner_info=failed)
    return read_results(results_file)


def _run(
    argv: Sequence[str],
    env: Mapping[str, str],
    task_dir: Path,
    timeout_s: float | None,
    stop: threading.Event | None,
) -> int | None:
    """The exit code, or None when the command outlived `timeout_s` and was killed."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with open(task_dir / "stdout.log", "wb") as out, open(task_dir / "stderr.log", "wb") as err:
        proc = subprocess.Popen(
            list(argv), env=dict(env), stdout=out, stderr=err, start_new_session=True
        )
        try:
            while True:
                try:
                    return proc.wait(_POLL_S)
                except subprocess.TimeoutExpired:
                    pass
                if stop is not None and stop.is_set():
                    raise Stopped()
                if deadline is not None and time.monotonic() > deadline:
                    _kill_group(proc)
                    return None
        except BaseException:
            _kill_group(proc)  # stopping or interrupted: take the command along
            raise


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - STDERR_TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def read_results(path: Path) -> Outcome:
    """A finished command's results: a JSON list of results, or {"results", "ownerInfo"?}.

    No file means a successful command that reported no model; the controller then ends the
    round with "no usable model" (or it was a Sedna-library worker that reported by itself).
    """
    if not path.exists():
        return Outcome("completed")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return Outcome("failed", owner_info={"reason": f"results file unreadable: {e}"})
    if isinstance(data, list):
        data = {"results": data}
    results, owner_info = (
        (data.get("results"), data.get("ownerInfo", {})) if isinstance(data, dict) else (0, 0)
    )
    if not isinstance(results, list) or not isinstance(owner_info, dict):
        reason = 'results file must hold a list or {"results": [...], "ownerInfo": {...}}'
        return Outcome("failed", owner_info={"reason": reason})
    return Outcome("completed", [r for r in results if isinstance(r, dict)], owner_info)


OWNER_KIND = "lifelonglearningjob"
INCREMENTAL = "incrementallearningjob"
PUBACK_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 10.0
REPORT_RETRY_S = 60.0


def worker_message(
    task: Task,
    status: str,
    results: Sequence[dict[str, Any]] = (),
    owner_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Sedna's WorkerMessage for this task."""
    return {
        "name": task.worker_name,
        "namespace": task.namespace,
        "ownerName": task.job,
        "ownerKind": task.owner_kind,
        "ownerInfo": dict(owner_info or {}),
        "kind": task.kind,
        "status": status,
        "results": list(results),
    }


class Reporter(Protocol):
    """Delivers one worker report to the controller."""

    def report(self, worker: str, message: dict[str, Any]) -> None: ...


class MqttReporter:
    """Publishes reports on the worker topic of the task's namespace (the one the broker's
    ACL grants a namespace's workers and the node's runner) and waits for the PUBACK."""

    def __init__(self, client: MqttClient, cfg: config_mod.Config) -> None:
        self._client = client
        self._cfg = cfg

    def report(self, worker: str, message: dict[str, Any]) -> None:
        topic = self._cfg.worker_topic(message["namespace"], worker)
        ticket = self._client.publish(topic, json.dumps(message).encode())
        if not ticket.wait(PUBACK_TIMEOUT_S):
            # paho keeps the message and sends it after reconnecting; say so and go on
            log.warning(
                "no PUBACK for %s's %s report yet; it stays queued", worker, message["status"]
            )


class HttpReporter:
    """POSTs reports to `{lc_server}/sedna/workers/{worker}/info`, as Sedna's library does."""

    def __init__(self, lc_server: str, retry_s: float = REPORT_RETRY_S, token: str = "") -> None:
        self._base = lc_server.rstrip("/")
        self._retry_s = retry_s
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def report(self, worker: str, message: dict[str, Any]) -> None:
        retrying = Retrying(
            stop=stop_after_delay(self._retry_s),
            wait=wait_exponential_jitter(multiplier=0.2, max=5),
            retry=retry_if_exception_type(TransientError),
            reraise=True,
        )
        retrying(self._post, worker, json.dumps(message).encode())

    def _post(self, worker: str, body: bytes) -> None:
        request = urllib.request.Request(
            f"{self._base}/sedna/workers/{worker}/info",
            data=body,
            headers=self._headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S):
                return
        except urllib.error.HTTPError as e:
            reason = e.read(512).decode("utf-8", "replace")
            if e.code >= 500:
                raise TransientError(f"controller answered {e.code}: {reason}") from e
            refused = f"controller refused {worker}'s report ({e.code}): {reason}"
            raise PermanentError(refused) from e
        except (urllib.error.URLError, OSError) as e:
            raise TransientError(f"controller at {self._base} unreachable: {e}") from e


SEEN_IDS_MAX = 10_000
SESSION_EXPIRY_S = 3600


class Worker:
    """Listens upstream and runs one task at a time until `stop`."""

    def __init__(
        self,
        cfg: config_mod.Config,
        settings: WorkerSettings,
        *,
        client_id: str | None = None,
    ) -> None:
        self._cfg = cfg
        self._settings = settings
        self._stopping = threading.Event()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._work_root = settings.work_dir or Path(tempfile.mkdtemp(prefix="lifelong-worker-"))
        self._own_work_root = settings.work_dir is None
        self._client = MqttClient(
            MqttSettings(
                url=cfg.mqtt_url,
                client_id=client_id or f"lifelong-worker-{cfg.node_name}",
                clean_start=False,
                session_expiry_s=SESSION_EXPIRY_S,
                manual_ack=True,
            ),
            subscriptions=[cfg.upstream_topic_filter()],
        )
        self._reporter: Reporter = (
            HttpReporter(settings.lc_server, token=cfg.http_bearer_token())
            if settings.report_http
            else MqttReporter(self._client, cfg)
        )
        self._thread = threading.Thread(target=self._loop, name="worker", daemon=True)
        self.tasks_done = 0

    def start(self, connect_timeout_s: float = 10.0) -> None:
        """Connect, subscribe and begin serving; raises BrokerUnavailable if the broker stays
        away. Returns once the broker acknowledged the subscription: on a first start it
        holds no session for the runner yet, and a ready message published before that
        would never reach it."""
        self._client.start()
        deadline = time.monotonic() + connect_timeout_s
        while not self._client.subscribed:
            if self._stopping.is_set():
                return  # a signal asked to stop meanwhile: `wait` returns at once
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerUnavailable(
                    f"worker: not connected and subscribed after {connect_timeout_s:g}s"
                )
            self._stopping.wait(_POLL_S / 4)
        log.info("worker serving node %s: subscribed to %s", self._cfg.node_name,
                 self._cfg.upstream_topic_filter())  # fmt: skip
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the runner to stop (safe from a signal handler); a running command is killed."""
        self._stopping.set()

    def stop(self) -> None:
        """Stop serving: end a running command unreported (its message stays unacknowledged,
        so the broker hands it to the next session) and disconnect. Idempotent."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._client.stop()
        if self._own_work_root:
            shutil.rmtree(self._work_root, ignore_errors=True)

    def wait(self) -> None:
        """Block until `stop` (from a signal handler or another thread)."""
        while not self._stopping.wait(1.0):
            pass

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                msg = self._client.inbound.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            try:
                self._handle(msg)
            except Stopped:
                log.info("worker stopped mid-task; the round is rerun on the next start")
                return
            except Exception:
                log.exception("worker: handling a message on %s failed", msg.topic)

    def _handle(self, msg: Inbound) -> None:
        task = parse_ready(msg.payload)
        if task is None or not self._wanted(task):
            self._client.ack(msg)
            return
        if task.message_id in self._seen:
            log.info("duplicate ready %s for %s: already run", task.message_id, task.worker_name)
            self._client.ack(msg)
            return
        self._run_task(task)
        self._remember(task.message_id)
        self._client.ack(msg)

    def _wanted(self, task: Task) -> bool:
        jobs = self._settings.jobs
        return task.kind in self._settings.commands and (not jobs or task.job in jobs)

    def _remember(self, message_id: str) -> None:
        self._seen[message_id] = None
        while len(self._seen) > SEEN_IDS_MAX:
            self._seen.popitem(last=False)

    def _task_dir(self, worker: str) -> Path:
        """The task's directory, made empty: a rerun starts clean, with no stale results file.
        `worker` is a DNS-1123 name (`parse_ready` refuses others), so this is a child of the
        work root; whatever was planted there is removed (a link is never followed)."""
        task_dir = self._work_root / worker
        if task_dir.is_symlink() or task_dir.is_file():
            task_dir.unlink()
        elif task_dir.exists():
            shutil.rmtree(task_dir)
        task_dir.mkdir(parents=True)
        return task_dir

    def _run_task(self, task: Task) -> None:
        worker = task.worker_name
        task_dir = self._task_dir(worker)
        if "://" not in task.output_dir:
            Path(task.output_dir).mkdir(parents=True, exist_ok=True)
        env = command_env(os.environ, self._settings.pass_env)
        env |= task_env(task, self._settings, task_dir / "results.json")
        log.info("%s: running %s", worker, shlex.join(self._settings.commands[task.kind]))
        self._report(task, worker_message(task, "running"))
        outcome = run_command(
            self._settings.commands[task.kind], env, task_dir, self._settings.timeout_s,
            self._stopping,
        )
        log.info("%s: %s %s", worker, outcome.status, json.dumps(outcome.owner_info)[:300])
        self._report(task, worker_message(task, outcome.status, outcome.results,
                                          outcome.owner_info))
        self.tasks_done += 1

    def _report(self, task: Task, message: dict[str, Any]) -> None:
        try:
            self._reporter.report(task.worker_name, message)
        except (TransientError, PermanentError) as e:
            log.error("%s: %s report not delivered: %s", task.worker_name, message["status"], e)


def default_lc_server(cfg: config_mod.Config) -> str:
    """The controller's HTTP address as a URL (a wildcard bind is reached on loopback)."""
    host, port = cfg.http_host_port()
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
