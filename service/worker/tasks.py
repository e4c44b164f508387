"""What a ready message asks for: the task, and the environment its command runs in."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger("service.worker")

TaskKind = Literal["train", "eval"]
RESULTS_ENV = "LIFELONG_RESULTS_FILE"
MODEL_URL_SEPARATOR = ";"  # Sedna joins MODEL_URLS with ';'
#: The deployed model an eval compares the new one with (also last in MODEL_URLS).
DEPLOYED_MODEL_ENV = "DEPLOYED_MODEL_URL"
_MAX_WORKER_NAME_CHARS = 253


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
