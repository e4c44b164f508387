"""Resources the CLI tests share, as dicts (what a manifest holds once read)."""

from __future__ import annotations

import json
from typing import Any

from service.history import HistoryRecord

DATASET: dict[str, Any] = {
    "apiVersion": "sedna.io/v1alpha1",
    "kind": "Dataset",
    "metadata": {"name": "ds"},
    "spec": {"url": "/data/d.txt", "format": "txt", "nodeName": "edge-1"},
}
JOB: dict[str, Any] = {
    "kind": "LifelongLearningJob",
    "metadata": {"name": "job", "namespace": "team-a"},
    "spec": {
        "dataset": {"name": "ds", "trainProb": 0.5},
        "trainSpec": {"template": {"spec": {"nodeName": "edge-2"}}},
        "evalSpec": {"template": {}},
        "deploySpec": {"template": {}},
        "outputDir": "/out",
    },
}

# A job naming no node: it goes to LIFELONG_NODE_NAME.
UNROUTED_JOB: dict[str, Any] = {
    "apiVersion": "sedna.io/v1alpha1",
    "kind": "LifelongLearningJob",
    "metadata": {"name": "job"},
    "spec": {
        "dataset": {"name": "ds", "trainProb": 0.5},
        "trainSpec": {"template": {}},
        "evalSpec": {"template": {}},
        "deploySpec": {"template": {}},
        "outputDir": "/out",
    },
}


def copy(obj: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(json.dumps(obj))
    return result


# A job's history: created, an idle check, round 2 starting, eval reached, another idle check.
RECORDS = [
    HistoryRecord(at_ms=1_000, event="JobApplied", notes=("job created",), outcome="applied",
                  phase="train", step="waiting", version=0),
    HistoryRecord(at_ms=2_000, event="Tick", outcome="ignored",
                  phase="train", step="waiting", version=0),
    HistoryRecord(at_ms=3_000, event="DatasetChanged", outcome="applied",
                  phase="train", step="running", version=2),
    HistoryRecord(at_ms=4_000, event="WorkerReported", outcome="applied",
                  phase="eval", step="running", version=2),
    HistoryRecord(at_ms=5_000, event="Tick", outcome="ignored",
                  phase="eval", step="running", version=2),
]  # fmt: skip
