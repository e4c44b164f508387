"""An incremental-learning job as a user runs it beside a lifelong-learning one: apply, get,
describe and delete, each a subprocess against a real broker, Redis and controller. Each
kind lists and describes only its own jobs; the two share one namespace/name space."""

from __future__ import annotations

from pathlib import Path

from tests.cli.runner import assert_one_clean_line, cli_env, get_json, run_cli, wait_rows
from tests.harness import NODE, append_lines, lines
from tests.stack import Stack

IL_JOB = "helmet"
LL_JOB = "comfort"
DATASET = "il-dataset"

MANIFEST = """\
apiVersion: sedna.io/v1alpha1
kind: Dataset
metadata: {{name: {dataset}}}
spec: {{url: "{data}", format: txt, nodeName: {node}}}
---
apiVersion: sedna.io/v1alpha1
kind: Model
metadata: {{name: initial-model}}
spec: {{url: "{initial}", format: ckpt}}
---
apiVersion: sedna.io/v1alpha1
kind: Model
metadata: {{name: deploy-model}}
spec: {{url: "{deploy}", format: pb}}
---
apiVersion: sedna.io/v1alpha1
kind: IncrementalLearningJob
metadata: {{name: {il_job}}}
spec:
  initialModel: {{name: initial-model}}
  dataset: {{name: "{dataset}", trainProb: 0.8}}
  trainSpec:
    template: {{spec: {{nodeName: $WORKER_NODE}}}}
    trigger:
      checkPeriodSeconds: 1
      timer: {{start: 00:00, end: 24:00}}
      condition: {{operator: ">", threshold: 0, metric: num_of_samples}}
  evalSpec: {{template: {{}}}}
  deploySpec:
    model: {{name: deploy-model, hotUpdateEnabled: false}}
    trigger: {{condition: {{operator: ">", threshold: 0.1, metric: precision_delta}}}}
    template: {{}}
  outputDir: "{il_out}"
---
apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata: {{name: {ll_job}}}
spec:
  dataset: {{name: "{dataset}", trainProb: 0.8}}
  trainSpec: {{template: {{spec: {{nodeName: {node}}}}}}}
  evalSpec: {{template: {{}}}}
  deploySpec: {{template: {{}}}}
  outputDir: "{ll_out}"
"""


def applied(stack: Stack, tmp_path: Path, ll_job: str = LL_JOB) -> dict[str, str]:
    """The environment of `lifelong` once the manifest's resources are applied (the
    lifelong-learning job named `ll_job`)."""
    data = tmp_path / "train.txt"
    append_lines(data, lines(0, 10))
    initial, deploy = tmp_path / "models" / "base.ckpt", tmp_path / "deploy" / "model.pb"
    initial.parent.mkdir()
    initial.write_bytes(b"base")
    manifest = tmp_path / "resources.yaml"
    manifest.write_text(MANIFEST.format(
        dataset=DATASET, data=data, node=NODE, initial=initial, deploy=deploy, il_job=IL_JOB,
        ll_job=ll_job, il_out=tmp_path / "il", ll_out=tmp_path / "ll",
    ))  # fmt: skip
    stack.controller()
    env = cli_env(stack.mqtt_url, stack.redis_url)
    result = run_cli(env, "apply", "-f", str(manifest))
    assert result.returncode == 0, result.stderr
    assert f"incrementallearningjob default/{IL_JOB} sent to sedna/{NODE}/downstream" in (
        result.stdout
    )
    return env


def test_each_job_kind_lists_and_describes_its_own(stack: Stack, tmp_path: Path) -> None:
    env = applied(stack, tmp_path)
    initial, deploy = tmp_path / "models" / "base.ckpt", tmp_path / "deploy" / "model.pb"
    stack.cloud.wait_status(IL_JOB, "train", "ready")

    rows = wait_rows(env, "ij", lambda r: [j["name"] for j in r] == [IL_JOB])
    assert rows[0]["phase"] == "train"
    assert [j["name"] for j in get_json(env, "jobs")] == [LL_JOB]
    assert [j["name"] for j in get_json(env, "llj")] == [LL_JOB]

    described = run_cli(env, "describe", "ij", IL_JOB)
    assert described.returncode == 0, described.stderr
    shown = {ln.split(":", 1)[0]: ln for ln in described.stdout.splitlines() if ":" in ln}
    assert shown["Initial model"] == (
        f"Initial model:  initial-model: ckpt {initial} (round 1 trains from it)"
    )
    assert shown["Deploy model"].startswith("Deploy model:   deploy-model: not looked up yet")
    assert shown["Hot update"] == "Hot update:     off"
    assert shown["Deploy target"] == (
        "Deploy target:  the url of Model deploy-model (an eval round looks it up)"
    )
    assert deploy.name == "model.pb"
    assert "Deploy gate:    deploy when precision_delta > 0.1" in described.stdout

    # a job of the other kind: found under its own kind, not this one
    for kind, name, words in (("ij", LL_JOB, "a lifelong-learning job (lifelong describe llj"),
                              ("job", IL_JOB, "an incremental-learning job (lifelong describe ij")):
        other = run_cli(env, "describe", kind, name)
        assert other.returncode == 1, other.stdout
        assert_one_clean_line(other)
        assert words in other.stderr, other.stderr
    assert "Initial model" not in run_cli(env, "describe", "job", LL_JOB).stdout

    deleted = run_cli(env, "delete", "ij", IL_JOB)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.startswith(f"delete of incrementallearningjob default/{IL_JOB} sent")
    wait_rows(env, "ij", lambda r: r == [])
    assert [j["name"] for j in get_json(env, "jobs")] == [LL_JOB]


def test_a_job_of_the_other_kind_with_the_same_name_is_refused(
    stack: Stack, tmp_path: Path
) -> None:
    """One namespace/name space: the second kind's insert (applied after the first) is
    refused and the first job stays as it was."""
    env = applied(stack, tmp_path, ll_job=IL_JOB)
    stack.cloud.wait_for(stack.cloud.errors, 15, "the refusal of the second kind")
    assert [j["name"] for j in get_json(env, "ij")] == [IL_JOB]
    assert get_json(env, "jobs") == []
