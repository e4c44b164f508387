"""Hostile manifests given to `validate` and `apply` (the real CLI, a subprocess): an alias
bomb, deep nesting and oversize documents are refused in one line before anything is built;
manifests just inside each limit still validate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.cli.manifests import MAX_ALIAS_NODES, MAX_DEPTH, MAX_DOCUMENT_BYTES, MAX_INPUT_BYTES
from tests.cli.runner import cli_env, run_cli

# "Billion laughs" in 905 bytes or so: nine levels of nine aliases stand for 9^9 strings.
BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [
        f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]"
        for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
    ]
    + ["kind: Dataset", "metadata: {name: ds}", "spec: {url: /data/d.txt, format: txt}"]
)
VALID_DATASET = (
    "apiVersion: sedna.io/v1alpha1\nkind: Dataset\nmetadata: {name: ds}\n"
    "spec: {url: /data/d.txt, format: txt, nodeName: edge-node}\n"
)


def job_yaml(template: str) -> str:
    """A valid job whose train template is `template` (YAML flow text)."""
    return (
        "apiVersion: sedna.io/v1alpha1\nkind: LifelongLearningJob\nmetadata: {name: job}\n"
        "spec:\n  dataset: {name: ds, trainProb: 0.5}\n"
        f"  trainSpec: {{template: {template}}}\n"
        "  evalSpec: {template: {}}\n  deploySpec: {template: {}}\n  outputDir: /out\n"
    )


ENV = cli_env("mqtt://127.0.0.1:1", "redis://127.0.0.1:1/0")


def refused_in_one_line(path: Path, expected: str) -> None:
    for command in ("validate", "apply"):
        result = run_cli(ENV, command, "-f", str(path))
        assert result.returncode != 0, (command, result.stdout)
        assert "Traceback" not in result.stderr
        lines = (result.stdout + result.stderr).strip().splitlines()
        assert len(lines) == 1, (command, lines)
        assert expected in lines[0], (command, lines[0])


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    assert len(BOMB) < 1000
    refused_in_one_line(
        bomb,
        f"bomb.yaml: document 1 (line 5): its aliases stand for more than {MAX_ALIAS_NODES} nodes",
    )


def test_deep_nesting_is_refused_in_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text(job_yaml("[" * 5000 + "]" * 5000))
    refused_in_one_line(deep, f"deep.yaml: document 1 (line 6): nested deeper than {MAX_DEPTH}")
    deep_json = tmp_path / "deep.json"
    deep_json.write_text('{"kind": "Dataset", "spec": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused_in_one_line(deep_json, f"nested deeper than {MAX_DEPTH} levels")


def test_oversize_documents_and_input_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(VALID_DATASET + "---\n" + job_yaml("{}") + "#" * MAX_DOCUMENT_BYTES + "\n")
    refused_in_one_line(big, f"big.yaml: document 2 (line 5): more than {MAX_DOCUMENT_BYTES}")
    huge = tmp_path / "huge.yaml"
    with open(huge, "w") as f:
        f.write(VALID_DATASET)
        f.write(("---\n" + VALID_DATASET) * (MAX_INPUT_BYTES // len(VALID_DATASET)))
    refused_in_one_line(huge, f"cannot read {huge}: more than {MAX_INPUT_BYTES} bytes")
    piped = run_cli(ENV, "validate", "-f", "-", stdin=huge.read_text())
    assert piped.returncode != 0
    assert f"cannot read stdin: more than {MAX_INPUT_BYTES} bytes" in piped.stderr


@pytest.mark.parametrize(
    "manifest",
    [
        # anchors reused: one template for train and eval, a label map shared
        "apiVersion: sedna.io/v1alpha1\nkind: LifelongLearningJob\n"
        "metadata: {name: job, labels: &labels {team: a, app: b}, annotations: *labels}\n"
        "spec:\n  dataset: {name: ds, trainProb: 0.5}\n"
        "  trainSpec: {template: &pod {spec: {containers: [{name: c, image: i}]}}}\n"
        "  evalSpec: {template: *pod}\n  deploySpec: {template: *pod}\n  outputDir: /out\n",
        # nesting within the pod template's own limit (32 levels)
        job_yaml("{spec: " + "[" * 25 + "]" * 25 + "}"),
        # one document just under the size limit
        job_yaml("{}") + "#" * (MAX_DOCUMENT_BYTES - 1000) + "\n",
        # a JSON manifest
        json.dumps({"apiVersion": "sedna.io/v1alpha1", "kind": "Dataset",
                    "metadata": {"name": "ds"},
                    "spec": {"url": "/data/d.txt", "format": "txt", "nodeName": "n"}}),
    ],
)  # fmt: skip
def test_manifests_within_the_limits_validate(tmp_path: Path, manifest: str) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(manifest)
    result = run_cli(ENV, "validate", "-f", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is valid" in result.stdout
