"""The demo's model: thermal comfort from temperature and humidity, by logistic regression.

`python -m service.demo.comfort train|eval` is what the demo's worker runs, reading the
environment a Sedna worker pod gets (TRAIN_DATASET_URL / TEST_DATASET_URL, MODEL_URLS,
OUTPUT_URL, and DEPLOYED_MODEL_URL when the job has a deploy condition) and writing its
results to `$LIFELONG_RESULTS_FILE`, so it doubles as an example of a worker command.
`python -m service.demo.comfort feed PATH` keeps appending samples to a dataset file (what
compose.yaml's feeder runs, so that `docker compose up` shows rounds). Small and numpy-only
on purpose: a round trains in milliseconds, which keeps the demo about the controller rather
than the model.

The data drift: the temperature people find comfortable rises season by season (`shift_c`),
so a model trained in an early season misjudges later samples and later rounds matter, while
one trained again within the same season is no better than the one it would replace.
The model file is JSON (weights plus feature scaling), never a pickle.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

CSV_HEADER = "temperature,humidity,comfortable"
MODEL_FILE = "model.json"
MODEL_FORMAT = "json"
BASE_LIMIT_C = 24.0
HUMIDITY_WEIGHT_C_PER_PCT = 0.08
LABEL_NOISE = 0.03
TRAIN_STEPS = 400
LEARNING_RATE = 0.5
MODEL_URL_SEPARATOR = ";"
DEPLOYED_MODEL_ENV = "DEPLOYED_MODEL_URL"
#: The comfortable temperature moves in steps, like seasons: the same for a stretch of
#: samples, then higher.
SEASON_SHIFT_C = 3.0
SEASON_SAMPLES = 1000

FloatArray = npt.NDArray[np.float64]


def comfort_rows(rng: np.random.Generator, count: int, shift_c: float) -> list[str]:
    """`count` labelled csv rows; comfortable when the felt temperature is under the limit.

    Felt temperature = temperature + 0.08 x (humidity - 50); the limit is 24 C + `shift_c`.
    A few labels are flipped, as real survey answers would be.
    """
    temperature = rng.uniform(14.0, 36.0, count)
    humidity = rng.uniform(20.0, 90.0, count)
    felt = temperature + HUMIDITY_WEIGHT_C_PER_PCT * (humidity - 50.0)
    comfortable = felt < BASE_LIMIT_C + shift_c
    flipped = rng.random(count) < LABEL_NOISE
    labels = np.where(flipped, ~comfortable, comfortable).astype(int)
    return [f"{t:.1f},{h:.0f},{y}" for t, h, y in zip(temperature, humidity, labels, strict=True)]


def drift_c(samples_so_far: int, season_samples: int = SEASON_SAMPLES) -> float:
    """The comfort boundary's shift once `samples_so_far` samples were collected: a step of
    3 C every `season_samples`. Within a season a new model is no better than the one
    before; after a step it clearly is (what a deploy gate tells apart)."""
    return SEASON_SHIFT_C * (samples_so_far // season_samples)


def append_samples(path: Path, rng: np.random.Generator, count: int, samples_so_far: int) -> None:
    """Append `count` rows to the csv at `path` (its header first when it is new or empty)."""
    header = "" if path.exists() and path.stat().st_size > 0 else CSV_HEADER + "\n"
    rows = comfort_rows(rng, count, drift_c(samples_so_far))
    with open(path, "a") as f:
        f.write(header + "".join(row + "\n" for row in rows))


def count_samples(path: Path) -> int:
    """Samples (non-empty lines after the header) already in the csv; 0 when it is absent."""
    if not path.exists():
        return 0
    with open(path) as f:
        return max(sum(1 for line in f if line.strip()) - 1, 0)


def feed(path: Path, *, every_s: float, batch: int, limit: int, seed: int) -> int:
    """Append `batch` samples every `every_s` seconds until the file holds `limit`; carries on
    from a file that already has some (the drift continues from its count). Returns how many
    it appended."""
    rng = np.random.default_rng(seed)
    have = count_samples(path)
    appended = 0
    while have < limit:
        count = min(batch, limit - have)
        append_samples(path, rng, count, have)
        have += count
        appended += count
        if have < limit:
            time.sleep(every_s)
    return appended


def read_csv(path: str) -> tuple[FloatArray, FloatArray]:
    """Features (n x 2) and labels (n) from a csv with the header line first."""
    rows = [
        line.split(",")
        for line in Path(path).read_text().splitlines()[1:]
        if line.strip()
    ]
    if not rows:
        raise ValueError(f"{path} holds no samples")
    data = np.array(rows, dtype=np.float64)
    return data[:, :2], data[:, 2]


@dataclass(frozen=True)
class Model:
    """Logistic regression on standardised features."""

    weights: FloatArray
    bias: float
    mean: FloatArray
    scale: FloatArray

    def predict(self, features: FloatArray) -> FloatArray:
        z = ((features - self.mean) / self.scale) @ self.weights + self.bias
        return (z > 0).astype(np.float64)

    def accuracy(self, features: FloatArray, labels: FloatArray) -> float:
        return float(np.mean(self.predict(features) == labels))

    def to_json(self) -> str:
        return json.dumps(
            {
                "weights": self.weights.tolist(),
                "bias": self.bias,
                "mean": self.mean.tolist(),
                "scale": self.scale.tolist(),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Model:
        raw = json.loads(text)
        return cls(
            weights=np.array(raw["weights"], dtype=np.float64),
            bias=float(raw["bias"]),
            mean=np.array(raw["mean"], dtype=np.float64),
            scale=np.array(raw["scale"], dtype=np.float64),
        )


def fit(features: FloatArray, labels: FloatArray, steps: int = TRAIN_STEPS) -> Model:
    """Full-batch gradient descent on the logistic loss."""
    mean = features.mean(axis=0)
    scale = np.where(features.std(axis=0) > 0, features.std(axis=0), 1.0)
    x = (features - mean) / scale
    weights = np.zeros(x.shape[1])
    bias = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(x @ weights + bias)))
        error = p - labels
        weights -= LEARNING_RATE * (x.T @ error) / len(labels)
        bias -= LEARNING_RATE * float(error.mean())
    return Model(weights=weights, bias=bias, mean=mean, scale=scale)


def train(env: Mapping[str, str]) -> dict[str, object]:
    """Fit on TRAIN_DATASET_URL, save OUTPUT_URL/model.json, report it with train accuracy."""
    features, labels = read_csv(env["TRAIN_DATASET_URL"])
    model = fit(features, labels)
    out = Path(env["OUTPUT_URL"])
    out.mkdir(parents=True, exist_ok=True)
    model_path = out / MODEL_FILE
    model_path.write_text(model.to_json())
    metrics = {"train_accuracy": [round(model.accuracy(features, labels), 4)],
               "samples": [len(labels)]}
    return {"results": [{"format": MODEL_FORMAT, "url": str(model_path), "metrics": metrics}]}


def evaluate(env: Mapping[str, str]) -> dict[str, object]:
    """Score models on TEST_DATASET_URL and report each with its accuracy (metrics are lists
    of numbers, as Sedna's are): every model of MODEL_URLS; or, given DEPLOYED_MODEL_URL (the
    eval of a job with a deploy condition), the new model and then the deployed one."""
    features, labels = read_csv(env["TEST_DATASET_URL"])
    urls = [url for url in env["MODEL_URLS"].split(MODEL_URL_SEPARATOR) if url]
    deployed = env.get(DEPLOYED_MODEL_ENV)
    if deployed:
        urls = [next((url for url in urls if url != deployed), deployed), deployed]
    results = []
    for url in urls:
        model = Model.from_json(Path(url).read_text())
        metrics = {"accuracy": [round(model.accuracy(features, labels), 4)],
                   "samples": [len(labels)]}
        results.append({"format": MODEL_FORMAT, "url": url, "metrics": metrics})
    return {"results": results}


def feed_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service.demo.comfort feed",
        description="Keep appending labelled thermal-comfort samples to a csv dataset.",
    )
    parser.add_argument("path", type=Path, help="the dataset file (created with its header)")
    parser.add_argument("--every", type=float, default=2.0, metavar="S",
                        help="seconds between batches (default 2)")
    parser.add_argument("--batch", type=int, default=25, metavar="N",
                        help="samples per batch (default 25)")
    parser.add_argument("--limit", type=int, default=100_000, metavar="N",
                        help="stop once the file holds N samples (default 100000)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["feed"]:
        options = feed_parser().parse_args(args[1:])
        try:
            feed(options.path, every_s=options.every, batch=options.batch, limit=options.limit,
                 seed=options.seed)  # fmt: skip
        except OSError as e:
            print(f"comfort feed: {e}", file=sys.stderr)
            return 1
        return 0
    if args not in (["train"], ["eval"]):
        print("usage: python -m service.demo.comfort train|eval|feed PATH", file=sys.stderr)
        return 2
    try:
        results = train(os.environ) if args[0] == "train" else evaluate(os.environ)
    except (KeyError, OSError, ValueError) as e:
        what = f"missing variable {e}" if isinstance(e, KeyError) else str(e)
        print(f"comfort {args[0]}: {what}", file=sys.stderr)
        return 1
    Path(os.environ["LIFELONG_RESULTS_FILE"]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
