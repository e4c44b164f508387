"""deploy/kubernetes: valid Kubernetes objects that match the controller's configuration.

Every manifest is validated offline against the Kubernetes OpenAPI schemas bundled with
kubernetes-validate (strict: unknown fields fail), as written and as the overlay renders it
(tests/deploy/kustomize.py, no kubectl). The rendered controller's environment is then read
the way Kubernetes would fill it in and handed to the service's own configuration parser.
"""

from __future__ import annotations

import functools
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

from service.adapters.http_server import HttpServer
from service.cli import build_parser
from service.config import Config
from service.metrics import Metrics
from service.settings import SETTINGS
from tests.deploy.kustomize import Resource, pod_specs, render
from tests.harness import http_get

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAY = KUBERNETES / "overlays" / "edge-node-1"
NODE = "edge-node-1"
#: the oldest and newest Kubernetes whose schemas kubernetes-validate bundles (1.25, 1.37 in
#: kubernetes-validate 1.37)
VERSIONS = (all_versions()[0], kubernetes_validate.latest_version())
#: what the downward API gives a pod of this node (pod name and node IP are examples)
DOWNWARD = {
    "metadata.name": f"{NODE}-lifelong-controller-6d4cf56db6-x7k2q",
    "metadata.namespace": "sedna",
    "spec.nodeName": NODE,
    "status.hostIP": "192.0.2.10",
}
SETTING_NAMES = {name for s in SETTINGS for name in (s.env, *s.fallbacks)}
#: writable mounts and why: everything else a container sees is read-only
WRITABLE_MOUNTS = {
    ("controller", "/rootfs"),  # round files and the deploy copy are written on the host
    ("controller", "/tmp"),  # S3-bound round files are staged here
    ("redis", "/data"),  # the append-only file
}


def listed(field: str) -> list[Path]:
    """The files every kustomization under deploy/kubernetes lists in `field`."""
    files: set[Path] = set()
    for kustomization in KUBERNETES.rglob("kustomization.yaml"):
        for entry in yaml.safe_load(kustomization.read_text()).get(field, []):
            path = kustomization.parent / (entry if field == "resources" else entry["path"])
            if path.is_file():
                files.add(path.resolve())
    return sorted(files)


def manifest_files() -> list[Path]:
    """Whole objects (patches are partial: they are checked as part of the rendered overlay)."""
    return listed("resources")


@pytest.fixture(scope="module")
def rendered() -> list[Resource]:
    return render(OVERLAY)


def one(resources: list[Resource], kind: str, name: str) -> Resource:
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def container(resources: list[Resource], deployment: str, name: str) -> dict[str, Any]:
    spec = pod_specs(one(resources, "Deployment", deployment))[0]
    return next(c for c in spec["containers"] if c["name"] == name)


def pod_env(c: dict[str, Any]) -> dict[str, str]:
    """The container's environment as Kubernetes fills it in: downward API fields resolved and
    `$(NAME)` replaced by variables defined before it (others are left as written); the
    token file, which the Secret mounts in the pod, is one this test made."""
    env: dict[str, str] = {"HOSTNAME": DOWNWARD["metadata.name"]}  # set by the runtime
    for var in c.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = DOWNWARD[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = expand(var["value"], env)
    if env.get("LIFELONG_HTTP_TOKEN_FILE"):
        env["LIFELONG_HTTP_TOKEN_FILE"] = str(_token_file())
    return env


@functools.cache
def _token_file() -> Path:
    path = Path(tempfile.mkdtemp(prefix="lifelong-k8s-token-")) / "token"
    path.write_text("a-token-from-the-secret\n")
    return path


def expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), text)


# ------------------------------------------------------------------ schemas
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(KUBERNETES)))
def test_every_manifest_file_is_a_valid_kubernetes_object(path: Path, version: str) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert documents
    for document in documents:
        kubernetes_validate.validate(document, version, strict=True)


def test_every_file_is_a_resource_or_patch_of_a_kustomization() -> None:
    everything = {p.resolve() for p in KUBERNETES.rglob("*.yaml")}
    kustomizations = {p.resolve() for p in KUBERNETES.rglob("kustomization.yaml")}
    assert everything - kustomizations == set(listed("resources")) | set(listed("patches"))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_rendered_overlay_is_valid(rendered: list[Resource], version: str) -> None:
    for resource in rendered:
        kubernetes_validate.validate(resource, version, strict=True)


def test_the_schema_check_catches_a_misspelt_field() -> None:
    deployment = yaml.safe_load((KUBERNETES / "base" / "controller.yaml").read_text())
    pod_specs(deployment)[0]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


# ------------------------------------------------------------------ the overlay
def test_the_overlay_renders_one_nodes_controllers_and_redis(rendered: list[Resource]) -> None:
    assert sorted((r["kind"], r["metadata"]["name"]) for r in rendered) == [
        ("Deployment", f"{NODE}-lifelong-controller"),
        ("Deployment", f"{NODE}-lifelong-redis"),
        ("PersistentVolumeClaim", f"{NODE}-lifelong-redis-data"),
        ("PodDisruptionBudget", f"{NODE}-lifelong-controller"),
        ("Service", f"{NODE}-lifelong-controller"),
        ("Service", f"{NODE}-lifelong-redis"),
    ]
    for resource in rendered:
        assert resource["metadata"]["namespace"] == "sedna"
        assert resource["metadata"]["labels"]["lifelong.sedna.io/node"] == NODE


def test_both_workloads_are_pinned_to_the_node(rendered: list[Resource]) -> None:
    for name in ("lifelong-controller", "lifelong-redis"):
        spec = pod_specs(one(rendered, "Deployment", f"{NODE}-{name}"))[0]
        assert spec["nodeSelector"]["kubernetes.io/hostname"] == NODE


def test_each_selector_picks_exactly_its_own_nodes_pods(rendered: list[Resource]) -> None:
    """A Service or budget of one node must never select another node's pods."""
    templates = {
        r["metadata"]["name"]: r["spec"]["template"]["metadata"]["labels"]
        for r in rendered
        if r["kind"] == "Deployment"
    }
    selectors = [
        (r["kind"], r["metadata"]["name"], r["spec"]["selector"])
        for r in rendered
        if r["kind"] == "Service"
    ] + [
        (r["kind"], r["metadata"]["name"], r["spec"]["selector"]["matchLabels"])
        for r in rendered
        if r["kind"] in ("PodDisruptionBudget", "Deployment")
    ]
    for kind, name, selector in selectors:
        assert selector.get("lifelong.sedna.io/node") == NODE, f"{kind}/{name}"
        picked = [d for d, labels in templates.items() if selector.items() <= labels.items()]
        assert picked == [name], f"{kind}/{name} selects {picked}"


def test_two_controller_replicas_and_a_budget_that_keeps_one(rendered: list[Resource]) -> None:
    deployment = one(rendered, "Deployment", f"{NODE}-lifelong-controller")
    budget = one(rendered, "PodDisruptionBudget", f"{NODE}-lifelong-controller")
    assert deployment["spec"]["replicas"] == 2
    assert budget["spec"]["minAvailable"] == 1
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


# ------------------------------------------------------------------ the controller's configuration
def test_every_env_var_is_a_setting_or_feeds_one(rendered: list[Resource]) -> None:
    c = container(rendered, f"{NODE}-lifelong-controller", "controller")
    referenced = set(re.findall(r"\$\((\w+)\)", json.dumps([c.get("args", []), c["env"]])))
    for var in c["env"]:
        assert var["name"] in SETTING_NAMES or var["name"] in referenced, (
            f"{var['name']} is neither a setting (service/config.py) nor used by one"
        )
    helpers = {v["name"] for v in c["env"]} - SETTING_NAMES
    assert all("valueFrom" in v for v in c["env"] if v["name"] in helpers)


def test_every_setting_is_in_the_manifest(rendered: list[Resource]) -> None:
    """Operators see every knob with its value; a new setting must be added here too."""
    c = container(rendered, f"{NODE}-lifelong-controller", "controller")
    names = {v["name"] for v in c["env"]}
    missing = sorted(s.env for s in SETTINGS if s.env not in names)
    assert not missing, f"add {missing} to deploy/kubernetes/base/controller.yaml"


def test_the_environment_parses_as_the_service_would(rendered: list[Resource]) -> None:
    c = container(rendered, f"{NODE}-lifelong-controller", "controller")
    config = Config.from_env(pod_env(c))
    assert config.node_name == NODE  # the node, not the pod's HOSTNAME
    assert config.mqtt_url == f"mqtt://{DOWNWARD['status.hostIP']}:1883"
    assert config.redis_url == f"redis://{NODE}-lifelong-redis:6379/0"
    assert config.volume_prefix == "/rootfs"


def test_http_address_ports_and_scrape_annotations_agree(rendered: list[Resource]) -> None:
    c = container(rendered, f"{NODE}-lifelong-controller", "controller")
    host, port = Config.from_env(pod_env(c)).http_host_port()
    assert host == "0.0.0.0", "probes, the Service and Prometheus connect from outside the pod"
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named == {"http": port}
    service = one(rendered, "Service", f"{NODE}-lifelong-controller")
    (service_port,) = service["spec"]["ports"]
    assert named[service_port["targetPort"]] == port
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port
    assert annotations["prometheus.io/path"] == "/metrics"
    for probe in ("livenessProbe", "readinessProbe"):
        assert named[c[probe]["httpGet"]["port"]] == port


def test_probe_paths_are_served_by_the_http_server(rendered: list[Resource]) -> None:
    """Liveness answers 200 while the replica is not ready (a Redis outage must not restart
    pods); readiness answers 503 then, and 200 once ready."""
    c = container(rendered, f"{NODE}-lifelong-controller", "controller")
    state = {"ready": False}
    server = HttpServer(
        "127.0.0.1",
        0,
        ready=lambda: (state["ready"], "detail"),
        metrics=Metrics().render,
        worker_info=lambda _worker, _body: (200, "OK"),
    )
    server.start()
    try:

        def status(path: str) -> int:
            return http_get(f"http://127.0.0.1:{server.port}{path}")[0]

        liveness = c["livenessProbe"]["httpGet"]["path"]
        readiness = c["readinessProbe"]["httpGet"]["path"]
        annotations = one(rendered, "Service", f"{NODE}-lifelong-controller")["metadata"][
            "annotations"
        ]
        assert (status(liveness), status(readiness)) == (200, 503)
        state["ready"] = True
        assert (status(liveness), status(readiness)) == (200, 200)
        assert status(annotations["prometheus.io/path"]) == 200
    finally:
        server.stop()


def test_each_replica_is_named_after_its_pod(rendered: list[Resource]) -> None:
    c = container(rendered, f"{NODE}-lifelong-controller", "controller")
    assert "command" not in c, "the image's entrypoint (`lifelong`) runs"
    assert re.search(r'^ENTRYPOINT \["lifelong"\]$', (ROOT / "Dockerfile").read_text(), re.M)
    env = pod_env(c)
    args = build_parser().parse_args([expand(a, env) for a in c["args"]])
    assert args.command == "serve"
    assert args.replica_id == DOWNWARD["metadata.name"]


def test_the_volume_prefix_is_the_host_root_mount(rendered: list[Resource]) -> None:
    spec = pod_specs(one(rendered, "Deployment", f"{NODE}-lifelong-controller"))[0]
    c = container(rendered, f"{NODE}-lifelong-controller", "controller")
    host_root = [v["name"] for v in spec["volumes"] if v.get("hostPath", {}).get("path") == "/"]
    mounts = [m["mountPath"] for m in c["volumeMounts"] if m["name"] in host_root]
    assert mounts == [Config.from_env(pod_env(c)).volume_prefix]


# ------------------------------------------------------------------ Redis
def test_the_controllers_redis_url_names_the_rendered_redis(rendered: list[Resource]) -> None:
    c = container(rendered, f"{NODE}-lifelong-controller", "controller")
    url = Config.from_env(pod_env(c)).redis_url
    host, port = re.fullmatch(r"redis://([^:/]+):(\d+)/\d+", url).groups()  # type: ignore[union-attr]
    service = one(rendered, "Service", host)
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == int(port)
    redis = container(rendered, f"{NODE}-lifelong-redis", "redis")
    assert {p["name"]: p["containerPort"] for p in redis["ports"]}[
        service_port["targetPort"]
    ] == 6379


def test_redis_keeps_an_append_only_file_on_its_claim(rendered: list[Resource]) -> None:
    redis = container(rendered, f"{NODE}-lifelong-redis", "redis")
    args = redis["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--appendfsync") + 1] == "everysec"
    data_dir = args[args.index("--dir") + 1]
    spec = pod_specs(one(rendered, "Deployment", f"{NODE}-lifelong-redis"))[0]
    (mount,) = [m for m in redis["volumeMounts"] if m["mountPath"] == data_dir]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    one(rendered, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    redis_deployment = one(rendered, "Deployment", f"{NODE}-lifelong-redis")
    assert redis_deployment["spec"]["replicas"] == 1
    assert redis_deployment["spec"]["strategy"]["type"] == "Recreate"


# ------------------------------------------------------------------ least privilege
def test_no_api_access_non_root_and_read_only_where_possible(rendered: list[Resource]) -> None:
    workloads = [r for r in rendered if r["kind"] == "Deployment"]
    assert len(workloads) == 2
    for workload in workloads:
        for spec in pod_specs(workload):
            assert spec["automountServiceAccountToken"] is False
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec.get("hostNetwork", False) is False
            for c in spec["containers"]:
                security = c["securityContext"]
                assert security["readOnlyRootFilesystem"] is True
                assert security["allowPrivilegeEscalation"] is False
                assert security["capabilities"]["drop"] == ["ALL"]
                assert {"cpu", "memory"} <= set(c["resources"]["requests"])
                assert "memory" in c["resources"]["limits"]
                writable = {
                    (c["name"], m["mountPath"])
                    for m in c.get("volumeMounts", [])
                    if not m.get("readOnly", False)
                }
                assert writable <= WRITABLE_MOUNTS, f"{c['name']}: {writable - WRITABLE_MOUNTS}"


def test_the_worker_endpoint_needs_the_token_and_stays_on_the_node(
    rendered: list[Resource],
) -> None:
    """The pod's port 9100 is reachable from any pod of the cluster: the controller requires
    the bearer token, from a Secret the pods cannot start without, and the Service routes
    only clients on the controllers' own node."""
    c = container(rendered, f"{NODE}-lifelong-controller", "controller")
    token_file = {v["name"]: v.get("value") for v in c["env"]}["LIFELONG_HTTP_TOKEN_FILE"]
    assert token_file
    assert Config.from_env(pod_env(c)).http_bearer_token() == "a-token-from-the-secret"
    pod = one(rendered, "Deployment", f"{NODE}-lifelong-controller")["spec"]["template"]["spec"]
    (mount,) = [m for m in c["volumeMounts"] if token_file.startswith(m["mountPath"] + "/")]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "lifelong-http-token"
    assert volume["secret"].get("optional", False) is False
    service = one(rendered, "Service", f"{NODE}-lifelong-controller")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
