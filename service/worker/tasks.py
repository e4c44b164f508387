"""What a ready message asks for: the task, and the environment its command runs in.

A ready message comes off the broker, so it is not trusted: its namespace and job name must be
DNS-1123 names (the job's name becomes the task's directory under the work root), and its
output dir an absolute path without `..` or an `s3://` URL, as the controller itself requires;
anything else is ignored with a warning. A command gets a minimal environment: the variables a
Sedna worker pod gets, the few that make a process work (`INHERITED_ENV`) and those the
operator names; never the runner's own settings (the broker URL with its password, the HTTP
token).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from service.errors import ConfigError
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
    )


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
    if task.deployed_model_url:
        env[DEPLOYED_MODEL_ENV] = task.deployed_model_url
    original = task.data_index_url or settings.original_dataset_url
    if original:
        env["ORIGINAL_DATASET_URL"] = original
    return env
