"""docker/: the Prometheus config, alerts and dashboard, the compose file and the proxy configs it
mounts, checked with the tools that read them (promtool, docker-compose, `switchyard check-config`).
Nothing is started; a test whose tool is absent skips, naming the package (.ci/run installs both).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from switchyard.cli import app
from tests.components import unavailable

DOCKER = Path(__file__).resolve().parents[2] / "docker"
PROMETHEUS = DOCKER / "prometheus"

# The metric contract of issue 17 (docs/deploy.md): the alerts and the dashboard may name only these.
CONTRACT_METRICS = {
    "switchyard_requests_total",
    "switchyard_time_to_first_token_seconds_bucket",
    "switchyard_inter_token_latency_seconds_bucket",
    "switchyard_request_duration_seconds_bucket",
    "switchyard_proxy_overhead_seconds_bucket",
    "switchyard_classifier_decision_seconds_bucket",
    "switchyard_cascade_escalations_total",
    "switchyard_routed_requests_total",
    "switchyard_request_ttfb_seconds_bucket",
    "switchyard_request_ttlb_seconds_bucket",
    "switchyard_breaker_state",
    "switchyard_cost_usd_total",
    "switchyard_tokens_total",
    "switchyard_budget_used_ratio",
    "switchyard_queue_depth_tokens",
    "switchyard_model_saturated",
    # issue 41's drift gauges (docs/learning.md#drift)
    "switchyard_drift_psi",
    "switchyard_drift_psi_alert",
    "switchyard_drift_rate",
}


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (Debian's `{package}`; .ci/run installs it with apt-get when it can)")
    return path


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=cwd, check=False)


def test_promtool_checks_the_scrape_config_and_its_rules() -> None:
    promtool = tool("promtool", "prometheus")
    completed = run(promtool, "check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "1 rule files found" in completed.stdout


def test_promtool_checks_the_alert_rules() -> None:
    promtool = tool("promtool", "prometheus")
    completed = run(promtool, "check", "rules", str(PROMETHEUS / "alerts.yml"))
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "6 rules found" in completed.stdout


def test_each_alert_fires_on_its_unit_test_series() -> None:
    promtool = tool("promtool", "prometheus")
    completed = run(promtool, "test", "rules", str(PROMETHEUS / "alerts_test.yml"))
    assert completed.returncode == 0, completed.stdout + completed.stderr
    tested = set(re.findall(r"alertname: (\w+)", (PROMETHEUS / "alerts_test.yml").read_text()))
    defined = {rule["alert"] for group in load(PROMETHEUS / "alerts.yml")["groups"] for rule in group["rules"]}
    assert tested == defined


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("> 0.9", "> 0.96"),
        ("> 0.6", "> 0.75"),
        ("== 2", "== 1"),
        ("max(switchyard_drift_psi_alert)", "2 * max(switchyard_drift_psi_alert)"),
        ("for: 30m", "for: 15m"),
    ],
)
def test_the_unit_tests_fail_when_a_threshold_moves(tmp_path: Path, old: str, new: str) -> None:
    promtool = tool("promtool", "prometheus")
    alerts = (PROMETHEUS / "alerts.yml").read_text()
    assert old in alerts
    (tmp_path / "alerts.yml").write_text(alerts.replace(old, new))
    shutil.copy(PROMETHEUS / "alerts_test.yml", tmp_path / "alerts_test.yml")
    completed = run(promtool, "test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert completed.returncode != 0
    assert "FAILED" in completed.stdout + completed.stderr


def test_alerts_and_dashboard_name_only_metrics_of_the_contract() -> None:
    alerts = (PROMETHEUS / "alerts.yml").read_text()
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "switchyard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    named = set(re.findall(r"switchyard_[a-z_]+", alerts + "\n".join(exprs)))
    assert named <= CONTRACT_METRICS, named - CONTRACT_METRICS
    panel_metrics = set(re.findall(r"switchyard_[a-z_]+", "\n".join(exprs)))
    for metric in (
        "switchyard_model_saturated",
        "switchyard_queue_depth_tokens",
        "switchyard_cost_usd_total",
        "switchyard_drift_psi",
        "switchyard_drift_rate",
    ):
        assert metric in panel_metrics


@pytest.mark.parametrize(
    ("profile", "services"),
    [
        ("cpu", {"switchyard-cpu", "postgres", "valkey", "prometheus", "grafana"}),
        ("gpu", {"switchyard-gpu", "vllm-7b", "vllm-70b", "postgres", "valkey", "prometheus", "grafana"}),
    ],
)
def test_compose_parses_for_each_profile(profile: str, services: set[str]) -> None:
    compose = tool("docker-compose", "docker-compose")
    completed = run(compose, "-f", str(DOCKER / "compose.yaml"), "--profile", profile, "config")
    assert completed.returncode == 0, completed.stderr
    resolved = yaml.safe_load(completed.stdout)
    in_profile = {name for name, spec in resolved["services"].items() if profile in spec.get("profiles", [])}
    assert in_profile == services
    assert {"postgres-data", "valkey-data"} <= set(resolved["volumes"])
    for name in services:
        assert resolved["services"][name].get("restart") == "unless-stopped", name
        assert "healthcheck" in resolved["services"][name], name
    if profile == "gpu":
        big = resolved["services"]["vllm-70b"]
        assert "--tensor-parallel-size=4" in big["command"]
        assert {"--enable-prefix-caching", "--enable-lora"} <= set(big["command"])
        assert big["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 4


@pytest.mark.parametrize("name", ["switchyard.cpu.yaml", "switchyard.gpu.yaml"])
def test_the_proxy_configs_pass_check_config(name: str) -> None:
    result = CliRunner().invoke(app, ["check-config", "--config", str(DOCKER / name)])
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.output)
    assert resolved["billing"]["redis_url"] == "redis://valkey:6379/0"
    assert resolved["billing"]["database_url"] == "postgresql://switchyard:***@postgres:5432/switchyard"
    backends = {model["name"]: model["backend"] for model in resolved["models"]}
    if name == "switchyard.gpu.yaml":
        assert backends == {"qwen-7b": "vllm", "llama-70b": "vllm"}
    else:
        assert backends == {"local-small": "embedded", "local-embed": "embedded"}


def test_compose_mounts_files_that_exist() -> None:
    compose = load(DOCKER / "compose.yaml")
    sources = [volume.split(":")[0] for spec in compose["services"].values() for volume in spec.get("volumes", [])]
    files = [source for source in sources if source.startswith(".")]
    assert len(files) >= 5, sources  # the proxy configs, Prometheus, Grafana's provisioning and dashboards
    assert [source for source in files if not (DOCKER / source).exists()] == []
    # every other source is a named volume the file declares (a typo would be an anonymous path)
    assert set(sources) - set(files) <= set(compose["volumes"]), set(sources) - set(files) - set(compose["volumes"])


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_the_dashboard_reads_the_provisioned_data_source() -> None:
    provisioned = load(DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
    uid = provisioned["datasources"][0]["uid"]
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "switchyard.json").read_text())
    assert {panel["datasource"]["uid"] for panel in dashboard["panels"]} == {uid}
    provider = load(DOCKER / "grafana" / "provisioning" / "dashboards" / "switchyard.yaml")
    mounted = {v.split(":")[1] for v in load(DOCKER / "compose.yaml")["services"]["grafana"]["volumes"]}
    assert provider["providers"][0]["options"]["path"] in mounted


def test_the_image_copies_the_package_folder() -> None:
    """The build installs from a copy of the tree: a package folder it misses breaks the image only."""
    pyproject = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["include"] == ["switchyard*"]
    dockerfile = (DOCKER / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\S+) \./\S+$", dockerfile, flags=re.MULTILINE))
    assert "switchyard" in copied, copied
    # The top-level folders are links into switchyard/: a link copied alone would dangle in the image.
    assert not {path.name for path in DOCKER.parent.iterdir() if path.is_symlink()} & copied
    assert re.search(r"^USER switchyard$", dockerfile, flags=re.MULTILINE)
    assert '"/health/live"' in dockerfile or "/health/live'" in dockerfile
    assert 'ENTRYPOINT ["switchyard", "serve"]' in dockerfile


def test_prometheus_scrapes_with_the_token_compose_gives_the_proxy() -> None:
    """The proxy configs have keys, so /metrics needs server.metrics_token: Prometheus's file and
    compose's default for the proxy must hold the same one."""
    scrape = load(PROMETHEUS / "prometheus.yml")["scrape_configs"][0]
    token_file = PROMETHEUS / scrape["authorization"]["credentials_file"]
    environment = load(DOCKER / "compose.yaml")["x-proxy"]["environment"]
    default = re.fullmatch(r"\$\{METRICS_TOKEN:-(.+)\}", environment["SWITCHYARD__SERVER__METRICS_TOKEN"])
    assert default is not None and default[1] == token_file.read_text().strip()
