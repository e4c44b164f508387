"""What the demo runs and what it shows: its Dataset and LifelongLearningJob, the drifting
sample feed, and each round as seen from upstream, as lines or a live table.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from service.demo.comfort import CSV_HEADER, comfort_rows, drift_c

NODE = "demo-node"
#: The controller replicas the demo runs (sharing its broker and Redis).
REPLICAS = ("r1", "r2")
NAMESPACE = "default"
JOB = "thermal-comfort"
DATASET = "comfort-samples"
TRIGGER_SAMPLES = 200
TRAIN_PROB = 0.8
INITIAL_SAMPLES = 60
DEPLOY_CONDITION = {"operator": ">", "threshold": 0.05, "metric": "accuracy_delta[0]"}


@dataclass(frozen=True)
class Pace:
    """How fast samples arrive and the controllers look at them."""

    batch_samples: int
    interval_s: float
    dataset_poll_s: float
    #: samples per season of the drift: a few rounds each, whatever the pace
    season_samples: int

    @classmethod
    def of(cls, fast: bool) -> Pace:
        return cls(60, 0.25, 0.5, 1500) if fast else cls(25, 0.5, 1.0, 1000)


class Feeder:
    """Appends labelled samples to the dataset file at a steady pace, the comfort boundary
    stepping up every season (`Pace.season_samples`)."""

    def __init__(self, path: Path, pace: Pace, seed: int) -> None:
        self._path = path
        self._pace = pace
        self._rng = np.random.default_rng(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self.total = 0
        path.write_text(CSV_HEADER + "\n")
        self.append(INITIAL_SAMPLES)

    @property
    def shift_c(self) -> float:
        return drift_c(self.total, self._pace.season_samples)

    def append(self, count: int) -> None:
        rows = comfort_rows(self._rng, count, self.shift_c)
        with open(self._path, "a") as f:
            f.write("".join(row + "\n" for row in rows))
        self.total += count

    def _run(self) -> None:
        while not self._stop.wait(self._pace.interval_s):
            self.append(self._pace.batch_samples)

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


# --- resources --------------------------------------------------------------------------------


def dataset_resource(url: str) -> dict[str, Any]:
    return {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "Dataset",
        "metadata": {"name": DATASET, "namespace": NAMESPACE},
        "spec": {"url": url, "format": "csv", "nodeName": NODE},
    }


def job_resource(output_dir: str) -> dict[str, Any]:
    template = {"spec": {"nodeName": NODE, "containers": [{"name": "demo", "image": "local"}]}}
    return {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "LifelongLearningJob",
        "metadata": {"name": JOB, "namespace": NAMESPACE},
        "spec": {
            "dataset": {"name": DATASET, "trainProb": TRAIN_PROB},
            "trainSpec": {
                "template": template,
                "trigger": {
                    "checkPeriodSeconds": 1,
                    "condition": {
                        "operator": ">=",
                        "threshold": TRIGGER_SAMPLES,
                        "metric": "num_of_samples",
                    },
                },
            },
            "evalSpec": {"template": template},
            # Sedna's IncrementalLearningJob deploy trigger: deploy a new model only when
            # it beats the deployed one by more than 5 points on the same eval data
            "deploySpec": {
                "template": template,
                "trigger": {"condition": DEPLOY_CONDITION},
            },
            "outputDir": output_dir,
        },
    }


def envelope(kind: str, resource: dict[str, Any]) -> bytes:
    """A downstream insert, as the cloud (Sedna's GM through KubeEdge) would send it."""
    header = {
        "namespace": NAMESPACE,
        "resourceKind": kind,
        "resourceName": resource["metadata"]["name"],
        "operation": "insert",
    }
    return json.dumps({"header": header, "content": resource}).encode()


@dataclass
class Round:
    version: int
    train_samples: int = 0
    eval_samples: int = 0
    train_accuracy: float | None = None
    accuracy: float | None = None
    deployed_accuracy: float | None = None
    state: str = "train"


@dataclass
class Progress:
    """The job as seen from upstream: what the live view and the last line report."""

    samples: int = 0
    phase: str = "waiting"
    rounds: dict[int, Round] = field(default_factory=dict)
    deployed: int = 0
    held_back: int = 0
    failed: int = 0
    last_accuracy: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def finished(self) -> int:
        """Rounds that came to an end: deployed, held back by the gate, or failed."""
        return self.deployed + self.held_back + self.failed

    def update(self, message: dict[str, Any]) -> str | None:
        """Take one upstream message in; returns a line worth printing, if any."""
        content = message.get("content")
        if not isinstance(content, dict):
            return None
        if "numberOfSamples" in content:
            self.samples = int(content["numberOfSamples"])
            return None
        phase, status = content.get("phase"), content.get("status")
        if phase == "deploy" and ("input" in content or "gate" in content):
            return self._decided(str(status), content)
        if "input" in content:
            return self._entered(str(phase), str(status), content["input"])
        output = content.get("output")
        if isinstance(output, dict) and status in ("completed", "failed"):
            return self._reported(str(phase), str(status), output)
        return None

    def _decided(self, status: str, content: dict[str, Any]) -> str | None:
        """The controller's deploy decision: deployed, held back by the gate, or failed."""
        self.phase = "deploy" if status == "ready" else f"deploy {status}"
        current = self._current()
        if current is None:
            return None
        gate = content.get("gate")
        judged = _judged(gate) if isinstance(gate, dict) else ""
        if status == "ready":
            current.state = "deployed"
            self.deployed += 1
            self.last_accuracy = current.accuracy
            return f"round {current.version}: deployed{judged}"
        if status == "completed":
            current.state = "held back"
            self.held_back += 1
            return f"round {current.version}: held back by the deploy gate{judged}"
        current.state = "deploy failed"
        self.failed += 1
        return f"round {current.version}: deploy failed: {content.get('reason')}"

    def _entered(self, phase: str, status: str, task_input: dict[str, Any]) -> str | None:
        self.phase = phase if status == "ready" else f"{phase} {status}"
        version = _version(task_input.get("outputDir"))
        if version is None:
            return None
        this = self.rounds.setdefault(version, Round(version))
        count = _samples_in(task_input.get("dataURL"))
        this.state = phase
        if phase == "train":
            this.train_samples = count
            return f"round {version}: training on {count} samples"
        this.eval_samples = count
        against = " (and the deployed model)" if task_input.get("deployedModel") else ""
        return f"round {version}: evaluating on {count} samples{against}"

    def _reported(self, phase: str, status: str, output: dict[str, Any]) -> str | None:
        current = self._current()
        if current is None:
            return None
        if status == "failed":
            current.state = f"{phase} failed"
            self.failed += phase in ("train", "eval")
            return f"round {current.version}: {phase} failed: {output.get('ownerInfo')}"
        new, deployed = _metrics(output, 0), _metrics(output, 1)
        if phase == "train":
            current.train_accuracy = _number(new.get("train_accuracy"))
        if phase == "eval":
            current.accuracy = _number(new.get("accuracy"))
            current.deployed_accuracy = _number(deployed.get("accuracy"))
            if current.accuracy is None:
                return None
            line = f"round {current.version}: eval accuracy {current.accuracy:.2f}"
            if current.deployed_accuracy is not None:
                line += f" (deployed model {current.deployed_accuracy:.2f})"
            return line
        return None

    def _current(self) -> Round | None:
        return self.rounds[max(self.rounds)] if self.rounds else None

    def table(self, target_rounds: int, elapsed_s: float) -> Table:
        condition = DEPLOY_CONDITION
        gate = f"{condition['metric']} {condition['operator']} {condition['threshold']}"
        table = Table(
            title=f"lifelong demo: job {JOB} ({len(REPLICAS)} controller replicas)",
            caption=f"phase {self.phase} | dataset {self.samples} samples | "
            f"{self.deployed}/{target_rounds} rounds deployed, {self.held_back} held back by "
            f"the deploy gate ({gate}) | {elapsed_s:.0f}s",
        )
        for column in ("round", "state", "train samples", "train acc", "eval samples",
                       "new model acc", "deployed acc"):
            table.add_column(column, justify="left" if column == "state" else "right")
        for r in sorted(self.rounds.values(), key=lambda r: r.version):
            table.add_row(str(r.version), r.state, str(r.train_samples),
                          pct(r.train_accuracy), str(r.eval_samples), pct(r.accuracy),
                          pct(r.deployed_accuracy))
        return table


def _judged(gate: dict[str, Any]) -> str:
    """How the gate judged, for a progress line: ` (accuracy_delta[0] = +0.01, needs > 0.03)`."""
    value = _number(gate.get("value"))
    needs = f"needs {gate.get('operator')} {gate.get('threshold')}"
    if value is None:
        return f" ({gate.get('metric')}: nothing deployed to beat)" if gate.get("holds") else (
            f" ({gate.get('metric')} missing, {needs})"
        )
    return f" ({gate.get('metric')} = {value:+.2f}, {needs})"


def _version(output_dir: object) -> int | None:
    tail = str(output_dir or "").rstrip("/").rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _samples_in(data_url: object) -> int:
    """Samples in a round's csv file (header excluded); 0 if it cannot be read."""
    try:
        with open(str(data_url), "rb") as f:
            return max(0, sum(1 for _ in f) - 1)
    except OSError:
        return 0


def _metrics(output: dict[str, Any], index: int) -> dict[str, Any]:
    """The metrics of the report's `index`-th result (the new model first, then the
    deployed one); empty when there is no such result."""
    models = output.get("models")
    if isinstance(models, list) and len(models) > index and isinstance(models[index], dict):
        metrics = models[index].get("metrics")
        return metrics if isinstance(metrics, dict) else {}
    return {}


def _number(value: object) -> float | None:
    """A metric's value: a number, or the first of a list of numbers (Sedna's shape)."""
    if isinstance(value, list) and value:
        value = value[0]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
