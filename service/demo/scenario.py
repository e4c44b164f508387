"""What the demo runs: its Dataset and LifelongLearningJob, and the drifting sample feed."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.demo_model import CSV_HEADER, comfort_rows, drift_c

NODE = "demo-node"
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
