"""A small kustomize renderer for the features deploy/kubernetes uses, so tests need no kubectl.

It implements, as kustomize does: `resources` (files and directories with their own
kustomization.yaml), `patches` given by `path` (strategic merge, the target named by the
patch's kind and name; lists of containers, env, volumes and volumeMounts merge by `name`,
other lists are replaced), `namespace`, `namePrefix` (and the PersistentVolumeClaim names pod
templates refer to), `labels` with `includeSelectors`, and `images`. Anything else in a
kustomization is refused, so a manifest cannot quietly rely on a feature rendered wrong here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]

SUPPORTED = frozenset(
    {"apiVersion", "kind", "resources", "patches", "namespace", "namePrefix", "labels", "images"}
)
#: lists kustomize merges element by element, keyed by `name` (Kubernetes' patchMergeKey)
MERGE_BY_NAME = frozenset({"containers", "initContainers", "env", "volumes", "volumeMounts"})
#: where `labels: includeSelectors: true` adds its labels besides metadata.labels
SELECTOR_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (("spec", "selector", "matchLabels"), ("spec", "template", "metadata", "labels")),
    "Service": (("spec", "selector"),),
    "PodDisruptionBudget": (("spec", "selector", "matchLabels"),),
}


class Unsupported(Exception):
    """The kustomization uses something this renderer does not implement."""


def render(directory: Path) -> list[Resource]:
    """The resources `kustomize build directory` would print."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise Unsupported(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
    resources: list[Resource] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            resources += render(path)
        else:
            resources += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for patch in kustomization.get("patches", []):
        _patch(resources, directory, patch)
    if "namespace" in kustomization:
        for resource in resources:
            resource["metadata"]["namespace"] = kustomization["namespace"]
    if "namePrefix" in kustomization:
        _prefix(resources, kustomization["namePrefix"])
    for entry in kustomization.get("labels", []):
        _label(resources, entry)
    for image in kustomization.get("images", []):
        _image(resources, image)
    return resources


def pod_specs(resource: Resource) -> list[dict[str, Any]]:
    """The pod template spec of a workload (empty for other kinds)."""
    if resource["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
        return [resource["spec"]["template"]["spec"]]
    return []


def _patch(resources: list[Resource], directory: Path, patch: dict[str, Any]) -> None:
    if set(patch) != {"path"}:
        raise Unsupported(f"only `patches: - path:` is implemented, not {sorted(patch)}")
    body = yaml.safe_load((directory / patch["path"]).read_text())
    matches = [
        r
        for r in resources
        if (r["apiVersion"], r["kind"], r["metadata"]["name"])
        == (body["apiVersion"], body["kind"], body["metadata"]["name"])
    ]
    if len(matches) != 1:
        raise Unsupported(f"patch {patch['path']} matches {len(matches)} resources, not one")
    _merge(matches[0], body)


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        elif key in MERGE_BY_NAME and isinstance(target.get(key), list):
            by_name = {item["name"]: item for item in target[key]}
            for item in value:
                if item["name"] in by_name:
                    _merge(by_name[item["name"]], item)
                else:
                    target[key].append(copy.deepcopy(item))
        else:
            target[key] = copy.deepcopy(value)


def _prefix(resources: list[Resource], prefix: str) -> None:
    claims = {r["metadata"]["name"] for r in resources if r["kind"] == "PersistentVolumeClaim"}
    for resource in resources:
        resource["metadata"]["name"] = prefix + resource["metadata"]["name"]
        for spec in pod_specs(resource):
            for volume in spec.get("volumes", []):
                claim = volume.get("persistentVolumeClaim")
                if claim is not None and claim["claimName"] in claims:
                    claim["claimName"] = prefix + claim["claimName"]


def _label(resources: list[Resource], entry: dict[str, Any]) -> None:
    if set(entry) - {"pairs", "includeSelectors"}:
        raise Unsupported(f"labels: only pairs and includeSelectors are implemented: {entry}")
    pairs: dict[str, str] = entry["pairs"]
    for resource in resources:
        resource["metadata"].setdefault("labels", {}).update(pairs)
        if not entry.get("includeSelectors", False):
            continue
        for path in SELECTOR_PATHS.get(resource["kind"], ()):
            node = resource
            for key in path:
                node = node.setdefault(key, {})
            node.update(pairs)


def _image(resources: list[Resource], image: dict[str, str]) -> None:
    if set(image) - {"name", "newName", "newTag"}:
        raise Unsupported(f"images: only name, newName and newTag are implemented: {image}")
    for resource in resources:
        for spec in pod_specs(resource):
            for container in spec["containers"]:
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    new_tag = image.get("newTag", tag)
                    new_name = image.get("newName", name)
                    container["image"] = f"{new_name}:{new_tag}" if new_tag else new_name
