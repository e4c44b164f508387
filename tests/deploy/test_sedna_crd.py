"""The patch to Sedna's LifelongLearningJob CRD: it adds spec.deploySpec.trigger where
Sedna's structural schema would prune it, with the values the controller accepts."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import yaml

from service.wire.fields import METRIC_PATTERN, Operator

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "sedna-crd"


def sedna_crd() -> dict[str, Any]:
    """The part of Sedna's CRD (build/crds/sedna.io_lifelonglearningjobs.yaml) the patch
    touches: the v1alpha1 schema of spec.deploySpec, which declares only `template`."""
    deploy_spec = {"type": "object", "properties": {"template": {"type": "object"}}}
    schema = {"properties": {"spec": {"properties": {"deploySpec": deploy_spec}}}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "lifelonglearningjobs.sedna.io"},
        "spec": {"versions": [{"name": "v1alpha1", "schema": {"openAPIV3Schema": schema}}]},
    }


def apply_add(document: dict[str, Any], operations: list[dict[str, Any]]) -> None:
    """JSON 6902 `add` operations (the only kind the patch uses)."""
    for operation in operations:
        assert operation["op"] == "add"
        *parents, last = operation["path"].strip("/").split("/")
        node: Any = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert last not in node, f"{operation['path']} exists already"
        node[last] = operation["value"]


def test_the_patch_targets_sednas_crd_and_adds_the_trigger() -> None:
    kustomization = yaml.safe_load((ROOT / "kustomization.yaml").read_text())
    (patch,) = kustomization["patches"]
    crd = sedna_crd()
    assert patch["target"]["name"] == crd["metadata"]["name"]
    assert patch["target"]["kind"] == crd["kind"]
    assert any(r.endswith("/build/crds/sedna.io_lifelonglearningjobs.yaml")
               for r in kustomization["resources"])  # fmt: skip
    apply_add(crd, yaml.safe_load((ROOT / patch["path"]).read_text()))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    trigger = schema["properties"]["spec"]["properties"]["deploySpec"]["properties"]["trigger"]
    condition = trigger["properties"]["condition"]["properties"]
    assert set(condition["operator"]["enum"]) == set(typing.get_args(Operator))
    assert condition["threshold"]["type"] == "number"
    pattern = re.compile(condition["metric"]["pattern"])
    ours = re.compile(METRIC_PATTERN)
    for metric in ("accuracy_delta[0]", "precision_delta", "m", "x[12]", "0bad", "a[", "a b"):
        assert bool(pattern.search(metric)) == bool(ours.search(metric) and metric), metric
