"""The real `prometheus` binary scraping a live proxy every second: every query of the Grafana
dashboard returns data once traffic has gone through every route, and the alert rules load.

Skipped when the `prometheus` binary is not installed (Debian/Ubuntu: `apt-get install prometheus`)."""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.components import unavailable
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until
from tests.tiny_model import build_tiny_model

PROMETHEUS = shutil.which("prometheus")
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "switchyard.json"
ALERTS = ROOT / "docker" / "prometheus" / "alerts.yml"
PRICE = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
KEY = {"authorization": "Bearer sk-research"}
METRICS_TOKEN = "scrape-token"
# Grafana's variables, as Grafana would fill them in for a 1 s scrape (4 x scrape interval), but for a
# rate window long enough that the queries still see the traffic's rise however long this machine
# takes to get to them after it
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1s", "$__range": "15m"}
# Queries that cannot return data from this setup, with the reason. None today: queue depth comes
# from the embedded tiny model, saturation and breaker state are listed for every model.
EXCEPTIONS: dict[str, str] = {}

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _needs_prometheus() -> None:
    if PROMETHEUS is None:
        unavailable("no `prometheus` binary (Debian's `prometheus`; .ci/run installs it with apt-get when it can)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every target in the dashboard, nested rows included."""
    found: list[tuple[str, str]] = []

    def walk(panels: list) -> None:
        for panel in panels:
            found.extend((panel.get("title", ""), t["expr"]) for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return found


def concrete(expr: str) -> str:
    for variable, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a Grafana variable this test does not fill in: {expr}"
    return expr


@pytest.fixture
def proxy(tmp_path):
    states = {
        "small": FakeState(behaviour=FakeBehaviour(words=("small",), logprobs=[-3.0])),
        "large": FakeState(behaviour=FakeBehaviour(words=("large",))),
        "broken": FakeState(behaviour=FakeBehaviour(failure="500")),
    }
    model_dir = build_tiny_model(tmp_path / "tiny")
    engine = {"num_blocks": 64, "page_size": 16, "context_window": 256, "default_max_tokens": 8}
    with ExitStack() as stack:
        urls = {name: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for name, s in states.items()}
        settings = Settings(
            models=[
                {"name": "m-small", "base_url": urls["small"], "tier": "small", "price": PRICE},
                {"name": "m-large", "base_url": urls["large"], "tier": "large", "price": PRICE},
                {"name": "broken", "base_url": urls["broken"]},
                {"name": "tiny", "backend": "embedded", "model": str(model_dir), "engine": engine},
            ],
            routing={
                "auto": {
                    "tiers": ["small", "large"],
                    "thresholds": [0.45],
                    "warm_up": False,
                    "deadline_ms": 10_000,
                    "max_wait_ms": 1,
                }
            },
            cascade={"ladder": ["m-small", "m-large"], "scorer": "mean_logprob", "threshold": -1.0},
            teams={"research": {"api_keys": ["sk-research"], "budget_usd_per_day": 1.0}},
            server={"metrics_token": METRICS_TOKEN},  # Prometheus scrapes with it (docs/metrics.md)
            resilience={"max_attempts": 1},
            # a health probe late on a busy machine must not take a tier out of the routes
            upstream={"health_interval_s": 0.2, "health_timeout_s": 30},
            billing={"ledger_path": None},
            drift={"window": 10, "min_samples": 1},  # a reference from the first 10 values (the warm-up below)
        )
        # the score is read out of the prompt, so the route is known in advance
        app = create_app(settings, score_batch=lambda texts: np.array([float(t.rsplit("=", 1)[-1]) for t in texts]))
        base = stack.enter_context(serve_in_thread(app))
        assert wait_until(lambda: app.state.services.registry.get("tiny").backend.is_ready(), timeout_s=60)
        for i in range(10):  # the drift monitors' warm-up: the waves' scores and confidences then have a PSI
            assert _chat(base, "auto", f"score=0.{2 + 7 * (i % 2)}").status_code == 200
            assert _chat(base, "cascade").status_code == 200
        yield base


@pytest.fixture
def prometheus(proxy, tmp_path):
    port = _free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "switchyard",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [proxy.removeprefix("http://")]}],
            }
        ],
    }
    token_path = tmp_path / "metrics-token"
    token_path.write_text(METRICS_TOKEN + "\n")
    config["scrape_configs"][0]["authorization"] = {"credentials_file": str(token_path)}
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                return httpx.get(url + "/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(up, timeout_s=30, interval_s=0.2), (tmp_path / "prometheus.log").read_text()[-2000:]
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _chat(base: str, model: str, content: str = "hi", stream: bool = False) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": stream}
    if stream:
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, headers=KEY, timeout=30) as reply:
            assert "[DONE]" in reply.read().decode()
            return reply
    return httpx.post(base + "/v1/chat/completions", json=body, headers=KEY, timeout=30)


def _traffic(base: str) -> None:
    assert _chat(base, "m-large").status_code == 200
    assert _chat(base, "m-large", stream=True).status_code == 200
    assert _chat(base, "tiny").status_code == 200
    assert _chat(base, "auto", "score=0.9").status_code == 200
    assert _chat(base, "auto", "score=0.2").headers["x-switchyard-model"] == "m-large"
    assert _chat(base, "cascade").headers["x-switchyard-model"] == "m-large"  # m-small escalated
    assert _chat(base, "broken").status_code >= 500


def _query(url: str, expr: str) -> list:
    reply = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10).json()
    assert reply["status"] == "success", (expr, reply)
    return reply["data"]["result"]


def _scrapes(url: str) -> float:
    result = _query(url, "count_over_time(up[10m])")
    return float(result[0]["value"][1]) if result else 0.0


def _wait_for_scrapes(url: str, n: int) -> None:
    """Until Prometheus has scraped the proxy `n` more times (bounded)."""
    start = _scrapes(url)
    assert wait_until(lambda: _scrapes(url) >= start + n, timeout_s=60, interval_s=0.25), "prometheus stopped scraping"


def _finite(result: list) -> bool:
    """At least one series with a number (histogram_quantile over no rise is NaN)."""
    return any(math.isfinite(float(series["value"][1])) for series in result)


def test_every_dashboard_query_returns_data_and_the_alert_rules_load(proxy, prometheus):
    queries = dashboard_queries()
    assert len(queries) >= 10
    # Two waves of traffic with scrapes between them: a labelled counter first shows up already
    # incremented, so only a second wave gives rate() and increase() a rise to see (a non-zero
    # rate, a finite quantile) rather than a flat line.
    for _ in range(2):
        _traffic(proxy)
        _wait_for_scrapes(prometheus, 3)
    # the latest scrape succeeded (one may time out on a busy machine: the next is a second away)
    assert wait_until(lambda: _query(prometheus, "up")[0]["value"][1] == "1", timeout_s=30)

    empty = []
    for title, expr in queries:
        if expr in EXCEPTIONS:
            continue
        expr = concrete(expr)
        if not wait_until(lambda e=expr: _finite(_query(prometheus, e)), timeout_s=30, interval_s=0.5):
            empty.append((title, expr, _query(prometheus, expr)))
    assert not empty, f"dashboard queries with no data (or only NaN): {empty}"

    # and the panels whose numbers this traffic pins down show them
    values = {title: _query(prometheus, concrete(expr)) for title, expr in queries}

    def value(title: str, **labels: str) -> float:
        return sum(
            float(s["value"][1]) for s in values[title] if all(s["metric"].get(k) == v for k, v in labels.items())
        )

    # per entry point: the cascade request escalated (every one), one of the two auto requests did
    assert value("Escalation rate (15 min)", entry="cascade") == 1
    assert 0 < value("Escalation rate (15 min)", entry="auto") < 1
    assert value("Error ratio (5xx)") > 0
    assert value("Cost by team (USD/hour)", team="research") > 0
    assert value("Route mix", route="cascade") > 0 and value("Route mix", route="auto") > 0
    assert 0 < value("Budget used", team="research") < 1

    def rules() -> list:
        groups = httpx.get(prometheus + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    loaded = yaml.safe_load(ALERTS.read_text())
    expected = {rule["alert"] for group in loaded["groups"] for rule in group["rules"] if "alert" in rule}
    assert wait_until(lambda: {r["name"] for r in rules()} >= expected, timeout_s=30)
    assert wait_until(lambda: all(r["health"] == "ok" for r in rules()), timeout_s=30), [
        (r["name"], r["health"], r.get("lastError")) for r in rules()
    ]
