"""deploy/kubernetes/: both overlays rendered with `kubectl kustomize`, every object checked against
the Kubernetes schemas of a current release (kubernetes-validate, offline), and what a deployment
relies on asserted: probes, secrets kept out of the render, resources, a non-root and read-only
pod, network policies, the alert rules and dashboard equal to docker/'s, autoscaling, disruption
budgets, a grace period that covers the drain, vLLM's flags. `make chart-test` runs this file.
Nothing is applied to a cluster (docs/kubernetes.md says what was run and what was not).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.core.settings import Settings
from switchyard.proxy.app import DRAIN_TIMEOUT_S
from switchyard.proxy.edge import uvicorn_config
from tests.components import unavailable

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("trial", "production")
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}  # Prometheus Operator's: no schema in the package
SECRET_NAME = "switchyard-secrets"
SECRET_ENV = re.compile(r"KEY|TOKEN|PASSWORD")
WORKLOADS = {"Deployment", "StatefulSet"}


def _render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        unavailable("kubectl is not installed (it renders deploy/kubernetes with `kubectl kustomize`)")
    completed = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return [doc for doc in yaml.safe_load_all(completed.stdout) if doc]


@pytest.fixture(scope="module")
def renders() -> dict[str, list[dict[str, Any]]]:
    return {overlay: _render(overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="module")
def kubernetes_validate() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        unavailable("kubernetes-validate is not installed (a dev dependency: pip install -e '.[dev]')")
    return kubernetes_validate


def _one(objects: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [(o["kind"], o["metadata"]["name"]) for o in objects])
    return found[0]


def _pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    return [(o["metadata"]["name"], o["spec"]["template"]["spec"]) for o in objects if o["kind"] in WORKLOADS]


def _containers(objects: list[dict]) -> list[tuple[str, dict]]:
    return [(f"{name}/{c['name']}", c) for name, pod in _pod_specs(objects) for c in pod["containers"]]


def _switchyard_config(objects: list[dict]) -> dict:
    (config,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("switchyard-config")
    ]
    return yaml.safe_load(config["data"]["switchyard.yaml"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_for_a_current_kubernetes(renders, kubernetes_validate, overlay):
    version = kubernetes_validate.latest_version()
    assert tuple(int(part) for part in version.split(".")[:2]) >= (1, 33), version
    kinds = set()
    for obj in renders[overlay]:
        kinds.add(obj["kind"])
        if obj["kind"] in CUSTOM_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(obj, version, strict=True)  # raises on an unknown or mistyped field
    assert {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    assert {"NetworkPolicy", "ServiceMonitor", "PrometheusRule", "ServiceAccount"} <= kinds


def test_the_validator_rejects_a_misspelt_field(renders, kubernetes_validate):
    proxy = json.loads(json.dumps(_one(renders["trial"], "Deployment", "switchyard-proxy")))
    proxy["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = proxy["spec"]["template"]["spec"][
        "containers"
    ][0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(proxy, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_proxy_is_probed_on_its_health_endpoints(renders, overlay):
    pod = _one(renders[overlay], "Deployment", "switchyard-proxy")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8080}
    assert container["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "http"}
    assert container["args"] == ["--config", "/etc/switchyard/switchyard.yaml"]
    service = _one(renders[overlay], "Service", "switchyard")
    assert service["spec"]["selector"] == pod_labels(renders[overlay], "switchyard-proxy")


def pod_labels(objects: list[dict], deployment: str) -> dict:
    return _one(objects, "Deployment", deployment)["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_is_in_the_render(renders, overlay):
    objects = renders[overlay]
    assert [o for o in objects if o["kind"] == "Secret"] == []
    config = _switchyard_config(objects)
    settings = Settings(**config)
    assert settings.auth.admin_key is None and settings.server.metrics_token is None and not settings.teams
    assert settings.billing.database_url is None and settings.billing.redis_url is None
    for name, container in _containers(objects):
        from_secret = set()
        for env in container.get("env", []):
            reference = env.get("valueFrom", {}).get("secretKeyRef")
            if reference is not None:
                from_secret.add(env["name"])
                continue
            assert not SECRET_ENV.search(env["name"]), (name, env)  # a key or password only from the Secret
            if env["name"].endswith("_URL"):  # a URL's password only as a variable read from the Secret
                passwords = re.findall(r"://[^/@:]*:([^/@]+)@", env["value"])
                assert all(re.fullmatch(r"\$\(([A-Z_]+)\)", p)[1] in from_secret for p in passwords), (name, env)
    referenced = {
        env["valueFrom"]["secretKeyRef"]["name"]
        for _, container in _containers(objects)
        for env in container.get("env", [])
        if "secretKeyRef" in env.get("valueFrom", {})
    }
    assert referenced == {SECRET_NAME}


def test_the_trial_builds_its_database_url_from_the_secret(renders):
    env = _one(renders["trial"], "Deployment", "switchyard-proxy")["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names.index("POSTGRES_PASSWORD") < names.index("SWITCHYARD__BILLING__DATABASE_URL")  # expanded in order
    url = next(e["value"] for e in env if e["name"] == "SWITCHYARD__BILLING__DATABASE_URL")
    assert url == "postgresql://switchyard:$(POSTGRES_PASSWORD)@switchyard-postgres:5432/switchyard"
    _one(renders["trial"], "Service", "switchyard-postgres")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_resources_and_runs_unprivileged(renders, overlay):
    for name, pod in _pod_specs(renders[overlay]):
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] > 0, name
        assert pod["automountServiceAccountToken"] is False, name
        for container in pod["containers"]:
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), name
            assert "memory" in resources["limits"], name
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            if not name.startswith("vllm-"):  # vLLM writes caches and compiled kernels beside itself
                assert context["readOnlyRootFilesystem"] is True, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_switchyard_pods_run_as_the_images_user(renders, overlay):
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    uid = int(re.search(r"useradd --system --uid (\d+)", dockerfile)[1])
    for name in ("switchyard-proxy", "switchyard-worker"):
        pod = _one(renders[overlay], "Deployment", name)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == uid
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert {"/home/switchyard/.cache", "/tmp", "/etc/switchyard"} <= mounts  # writable beside a read-only root


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_proxy_and_the_workers_reach_stores_and_vllm(renders, overlay):
    objects = renders[overlay]
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    switchyard = {"proxy", "worker"}
    guarded = [
        (o["metadata"]["name"], o["spec"]["template"]["metadata"]["labels"])
        for o in objects
        if o["kind"] in WORKLOADS
        and o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] != "switchyard"
    ]
    assert guarded, "no store or vLLM in this overlay"
    for name, labels in guarded:
        selecting = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert selecting, f"no NetworkPolicy selects {name}"
        for policy in selecting:
            assert policy["spec"]["policyTypes"] == ["Ingress"]
            for rule in policy["spec"]["ingress"]:
                (peer,) = rule["from"]
                expressions = {e["key"]: set(e["values"]) for e in peer["podSelector"]["matchExpressions"]}
                assert expressions == {
                    "app.kubernetes.io/name": {"switchyard"},
                    "app.kubernetes.io/component": switchyard,
                }
    for component in switchyard:  # the proxies and workers carry the labels the policies admit
        pod = pod_labels(objects, f"switchyard-{component}")
        assert pod["app.kubernetes.io/name"] == "switchyard" and pod["app.kubernetes.io/component"] == component
    worker = _one(objects, "NetworkPolicy", "switchyard-worker")
    assert worker["spec"]["ingress"] == []  # no connection to a worker at all


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_alerts_and_dashboard_are_dockers(renders, overlay):
    rule = _one(renders[overlay], "PrometheusRule", "switchyard")
    assert rule["spec"] == yaml.safe_load((ROOT / "docker" / "prometheus" / "alerts.yml").read_text())
    dashboard = _one(renders[overlay], "ConfigMap", "switchyard-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    docker_dashboard = (ROOT / "docker" / "grafana" / "dashboards" / "switchyard.json").read_text()
    assert json.loads(dashboard["data"]["switchyard.json"]) == json.loads(docker_dashboard)


def test_the_copies_are_in_sync_with_docker():
    completed = subprocess.run(
        [sys.executable, str(KUBERNETES / "sync.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_scrapes_with_the_metrics_token(renders, overlay):
    objects = renders[overlay]
    (endpoint,) = _one(objects, "ServiceMonitor", "switchyard")["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["port"] == "http"
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": SECRET_NAME, "key": "metrics-token"}}
    monitor = _one(objects, "ServiceMonitor", "switchyard")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= _one(objects, "Service", "switchyard")["metadata"]["labels"].items()
    env = _one(objects, "Deployment", "switchyard-proxy")["spec"]["template"]["spec"]["containers"][0]["env"]
    token = next(e for e in env if e["name"] == "SWITCHYARD__SERVER__METRICS_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": SECRET_NAME, "key": "metrics-token"}


@pytest.mark.parametrize(("overlay", "replicas", "min_replicas"), [("trial", 1, 1), ("production", 3, 3)])
def test_replicas_autoscaling_and_disruption_budgets(renders, overlay, replicas, min_replicas):
    objects = renders[overlay]
    assert _one(objects, "Deployment", "switchyard-proxy")["spec"]["replicas"] == replicas
    hpa = _one(objects, "HorizontalPodAutoscaler", "switchyard-proxy")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "switchyard-proxy"}
    assert hpa["minReplicas"] == min_replicas and hpa["maxReplicas"] > min_replicas
    metrics = {m["type"]: m for m in hpa["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu"
    assert metrics["Pods"]["pods"]["metric"]["name"] == "switchyard_queue_depth_tokens"
    for name in ("switchyard-proxy", "switchyard-worker"):
        budget = _one(objects, "PodDisruptionBudget", name)["spec"]
        assert budget["selector"]["matchLabels"] == pod_labels(objects, name)
        if name == "switchyard-proxy" and replicas > 1:
            assert budget["minAvailable"] < replicas
        else:
            assert budget["maxUnavailable"] == 1  # one replica: a drain may still move it


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_grace_period_covers_the_drain(renders, overlay):
    pod = _one(renders[overlay], "Deployment", "switchyard-proxy")["spec"]["template"]["spec"]
    pre_stop_s = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    server = Settings().server
    uvicorn_shutdown_s = uvicorn_config(object(), server).timeout_graceful_shutdown
    assert uvicorn_shutdown_s is not None
    needed_s = pre_stop_s + uvicorn_shutdown_s + DRAIN_TIMEOUT_S
    assert pod["terminationGracePeriodSeconds"] >= needed_s + 10  # and the ledger's last flush
    worker = _one(renders[overlay], "Deployment", "switchyard-worker")["spec"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] >= 10 + 10  # its lines' 10 s, and its flush
    assert worker["containers"][0]["command"][:2] == ["switchyard", "worker"]


def test_the_trial_runs_the_embedded_engine_and_its_own_stores(renders):
    objects = renders["trial"]
    config = _switchyard_config(objects)
    assert {m["backend"] for m in config["models"]} == {"embedded"}
    valkey = _one(objects, "StatefulSet", "switchyard-valkey")["spec"]["template"]["spec"]["containers"][0]
    assert valkey["args"][:3] == ["valkey-server", "--appendonly", "yes"]
    _one(objects, "StatefulSet", "switchyard-postgres")
    assert _one(objects, "Deployment", "switchyard-proxy")["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "switchyard:cpu"
    )


def test_production_points_its_models_at_vllm_on_gpus(renders):
    objects = renders["production"]
    assert not [o for o in objects if o["kind"] == "StatefulSet"]  # the stores are external
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    for model in _switchyard_config(objects)["models"]:
        assert model["backend"] == "vllm"
        host, port = re.fullmatch(r"http://([a-z0-9-]+):(\d+)/v1", model["base_url"]).groups()
        assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}
        deployment = _one(objects, "Deployment", host)
        assert services[host]["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        args = container["args"]
        assert {"--enable-lora", "--enable-prefix-caching"} <= set(args)
        assert f"--max-loras={model['vllm']['max_loras']}" in args
        assert f"--served-model-name={model['upstream_model']}" in args
        gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
        assert gpus >= 1 and f"--tensor-parallel-size={gpus}" in args
    env = _one(objects, "Deployment", "switchyard-proxy")["spec"]["template"]["spec"]["containers"][0]["env"]
    stores = {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in env if "BILLING" in e["name"]}
    assert stores == {
        "SWITCHYARD__BILLING__DATABASE_URL": "database-url",
        "SWITCHYARD__BILLING__REDIS_URL": "redis-url",
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlays_config_passes_check_config(overlay):
    path = KUBERNETES / "overlays" / overlay / "switchyard.yaml"
    result = CliRunner().invoke(app, ["check-config", "--config", str(path)])
    assert result.exit_code == 0, result.output
