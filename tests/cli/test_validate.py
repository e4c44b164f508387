"""`validate` (and `apply`'s check before sending): every bad field named, Sedna's own
examples accepted as they are."""

from __future__ import annotations

from pathlib import Path

from tests.cli.runner import cli_env, run_cli

BAD_MANIFEST = """\
apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata:
  name: bad-job
spec:
  dataset:
    name: ds
    trainProb: 1.5
  trainSpec:
    trigger:
      checkPeriodSeconds: 0
  evalSpec: {}
  deploySpec: {}
  outputDir: relative/out
---
apiVersion: sedna.io/v1alpha1
kind: Dataset
metadata:
  name: ds
spec:
  url: /data/d.txt
  format: xml
  nodeName: edge-node
"""


def test_validate_names_every_bad_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_MANIFEST)
    env = cli_env("mqtt://127.0.0.1:1", "redis://127.0.0.1:1/0")
    result = run_cli(env, "validate", "-f", str(bad))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    problems = result.stdout.splitlines()
    fields = [line.split(": ")[2] for line in problems]
    assert fields == [
        "$.spec.dataset.trainProb",
        "$.spec.trainSpec.trigger.checkPeriodSeconds",
        "$.spec.outputDir",
        "$.spec.format",
    ], problems
    assert problems[0].startswith(f"{bad}: document 1 (LifelongLearningJob bad-job): ")

    # nothing of an invalid file is sent, and apply says why with the same lines
    applied = run_cli(env, "apply", "-f", str(bad))
    assert applied.returncode == 1
    assert applied.stderr.splitlines()[:4] == problems


def test_sedna_examples_validate_as_they_are() -> None:
    env = cli_env("mqtt://127.0.0.1:1", "redis://127.0.0.1:1/0")
    result = run_cli(
        env, "validate", "-f", "examples/dataset.yaml", "-f", "examples/lifelonglearningjob.yaml"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "LifelongLearningJob default/atcii-classifier-demo is valid" in result.stdout


MISSPELT = """\
apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata:
  name: misspelt
  creationTimestamp: "2024-05-01T00:00:00Z"
spec:
  dataset:
    name: ds
    trainProb: 0.8
    trainProbability: 0.5
  trainSpec:
    template:
      spec:
        nodeName: edge-node
        anythingGoes: here
    trigger:
      checkPeriodSecond: 5
  evalSpec:
    template: {}
  deploySpec:
    template: {}
  outputDirectory: /elsewhere
  outputDir: /out
"""


def test_misspelt_fields_are_rejected_with_a_hint(tmp_path: Path) -> None:
    manifest = tmp_path / "misspelt.yaml"
    manifest.write_text(MISSPELT)
    env = cli_env("mqtt://127.0.0.1:1", "redis://127.0.0.1:1/0")
    result = run_cli(env, "validate", "-f", str(manifest))
    assert result.returncode == 1, result.stdout
    where = f"{manifest}: document 1 (LifelongLearningJob misspelt)"
    assert result.stdout.splitlines() == [
        f"{where}: $.spec.dataset.trainProbability: unknown field (did you mean trainProb?)",
        f"{where}: $.spec.trainSpec.trigger.checkPeriodSecond: unknown field "
        "(did you mean checkPeriodSeconds?)",
        f"{where}: $.spec.outputDirectory: unknown field (did you mean outputDir?)",
    ]
    # apply checks the same way and sends nothing: it never reaches for the (closed) broker
    applied = run_cli(env, "apply", "-f", str(manifest))
    assert applied.returncode == 1
    assert applied.stderr.splitlines()[:3] == result.stdout.splitlines()


GATED = """\
apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata:
  name: gated
  annotations:
    lifelong.sedna.io/deploy-trigger: {annotation}
spec:
  dataset: {{name: ds, trainProb: 0.8}}
  trainSpec: {{template: {{spec: {{nodeName: edge-node}}}}}}
  evalSpec: {{}}
  deploySpec: {deploy}
  outputDir: /output/gated
"""
TRIGGER = '{condition: {operator: ">", threshold: 0.01, metric: "accuracy_delta[0]"}}'


def test_the_deploy_gate_by_annotation_is_checked_like_the_spec(tmp_path: Path) -> None:
    env = cli_env("mqtt://127.0.0.1:1", "redis://127.0.0.1:1/0")
    cases = {
        "annotation-only": (repr(TRIGGER), "{}", 0, "is valid"),
        "same-in-both": (repr(TRIGGER), f"{{trigger: {TRIGGER}}}", 0, "is valid"),
        "different": (
            repr(TRIGGER), f"{{trigger: {TRIGGER.replace('0.01', '0.2')}}}", 1,
            "set different deploy conditions: keep one of them",
        ),
        "alias": ("'{a: &x [1], b: *x}'", "{}", 1, "YAML anchors and aliases are not allowed"),
        "bad-operator": (
            repr(TRIGGER.replace('">"', '"~"')), "{}", 1,
            "$.metadata.annotations['lifelong.sedna.io/deploy-trigger'].condition.operator",
        ),
    }  # fmt: skip
    for name, (annotation, deploy, code, words) in cases.items():
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(GATED.format(annotation=annotation, deploy=deploy))
        result = run_cli(env, "validate", "-f", str(manifest))
        assert result.returncode == code, (name, result.stdout, result.stderr)
        assert words in result.stdout, (name, result.stdout)
