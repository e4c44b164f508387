"""What the demo shows: each round as seen from upstream, as lines or a live table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from service.demo.scenario import JOB
from service.demo.servers import REPLICAS


@dataclass
class Round:
    version: int
    train_samples: int = 0
    eval_samples: int = 0
    train_accuracy: float | None = None
    accuracy: float | None = None
    state: str = "train"


@dataclass
class Progress:
    """The job as seen from upstream: what the live view and the last line report."""

    samples: int = 0
    phase: str = "waiting"
    rounds: dict[int, Round] = field(default_factory=dict)
    deployed: int = 0
    last_accuracy: float | None = None
    notes: list[str] = field(default_factory=list)

    def update(self, message: dict[str, Any]) -> str | None:
        """Take one upstream message in; returns a line worth printing, if any."""
        content = message.get("content")
        if not isinstance(content, dict):
            return None
        if "numberOfSamples" in content:
            self.samples = int(content["numberOfSamples"])
            return None
        phase, status = content.get("phase"), content.get("status")
        if "input" in content:
            return self._entered(str(phase), str(status), content["input"])
        output = content.get("output")
        if isinstance(output, dict) and status in ("completed", "failed"):
            return self._reported(str(phase), str(status), output)
        return None

    def _entered(self, phase: str, status: str, task_input: dict[str, Any]) -> str | None:
        self.phase = phase if status == "ready" else f"{phase} {status}"
        if phase == "deploy":
            current = self._current()
            if current is None:
                return None
            current.state = "deployed" if status == "ready" else "deploy failed"
            self.deployed += status == "ready"
            self.last_accuracy = current.accuracy
            return f"round {current.version}: {current.state}"
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
        return f"round {version}: evaluating on {count} samples"

    def _reported(self, phase: str, status: str, output: dict[str, Any]) -> str | None:
        current = self._current()
        if current is None:
            return None
        if status == "failed":
            current.state = f"{phase} failed"
            return f"round {current.version}: {phase} failed: {output.get('ownerInfo')}"
        metrics = _first_metrics(output)
        if phase == "train" and "train_accuracy" in metrics:
            current.train_accuracy = float(metrics["train_accuracy"])
        if phase == "eval" and "accuracy" in metrics:
            current.accuracy = float(metrics["accuracy"])
            return f"round {current.version}: eval accuracy {current.accuracy:.2f}"
        return None

    def _current(self) -> Round | None:
        return self.rounds[max(self.rounds)] if self.rounds else None

    def table(self, target_rounds: int, elapsed_s: float) -> Table:
        table = Table(
            title=f"lifelong demo: job {JOB} ({len(REPLICAS)} controller replicas)",
            caption=f"phase {self.phase} | dataset {self.samples} samples | "
            f"{self.deployed}/{target_rounds} rounds deployed | {elapsed_s:.0f}s",
        )
        for column in ("round", "state", "train samples", "train acc", "eval samples",
                       "eval accuracy"):
            table.add_column(column, justify="left" if column == "state" else "right")
        for r in sorted(self.rounds.values(), key=lambda r: r.version):
            table.add_row(str(r.version), r.state, str(r.train_samples),
                          pct(r.train_accuracy), str(r.eval_samples), pct(r.accuracy))
        return table


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


def _first_metrics(output: dict[str, Any]) -> dict[str, Any]:
    models = output.get("models")
    if isinstance(models, list) and models and isinstance(models[0], dict):
        metrics = models[0].get("metrics")
        return metrics if isinstance(metrics, dict) else {}
    return {}


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
