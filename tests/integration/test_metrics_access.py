"""Who may read `/metrics`, and the access log without credentials.

`/metrics` names teams and their spend: open while the config has no key, else only for
`server.metrics_token` or the admin key as a bearer token, unless `server.metrics_public` opens it.
uvicorn's access log (`server.access_log`) masks a key sent in the query string, in every form.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from uvicorn.logging import AccessFormatter

from switchyard.core.settings import Settings
from switchyard.proxy.access_log import RedactingFilter
from switchyard.proxy.app import create_app
from tests.conftest import closed_port
from tests.fakes.server import serve_in_thread

ADMIN_KEY = "sk-admin-0000"
METRICS_TOKEN = "scrape-token-1111"
TEAM_KEY = "sk-team-2222"
SECRET = "sk-leaked-3333"


def _settings(**overrides) -> Settings:
    models = [{"name": "m", "base_url": f"http://127.0.0.1:{closed_port()}/v1"}]
    return Settings(models=models, billing={"ledger_path": None}, **overrides)


@pytest.fixture(scope="module")
def keyed() -> Iterator[TestClient]:
    """A config with every kind of key: a team's, the admin key and a metrics token."""
    settings = _settings(
        teams={"research": {"api_keys": [TEAM_KEY]}},
        auth={"admin_key": ADMIN_KEY},
        server={"metrics_token": METRICS_TOKEN},
    )
    with TestClient(create_app(settings)) as client:
        yield client


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_without_any_key_configured_metrics_stay_open():
    with TestClient(create_app(_settings())) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    assert "switchyard_requests_total" in response.text


@pytest.mark.parametrize(
    "headers",
    [
        {},
        _bearer("wrong"),
        _bearer(TEAM_KEY),  # a team's key reads its own usage, not every team's
        {"authorization": f"Basic {METRICS_TOKEN}"},
        {"x-api-key": METRICS_TOKEN},
    ],
    ids=["none", "wrong", "team-key", "not-bearer", "x-api-key"],
)
def test_with_keys_configured_metrics_need_the_token(keyed, headers):
    response = keyed.get("/metrics", headers=headers)
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and "server.metrics_token" in error["message"]
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "research" not in response.text


@pytest.mark.parametrize("token", [METRICS_TOKEN, ADMIN_KEY], ids=["metrics-token", "admin-key"])
def test_the_metrics_token_or_the_admin_key_reads_them(keyed, token):
    keyed.post("/v1/chat/completions", headers=_bearer(TEAM_KEY), json={"model": "m", "messages": []})
    response = keyed.get("/metrics", headers=_bearer(token))
    assert response.status_code == 200
    assert 'team="research"' in response.text  # team names stay labels, behind the token


def test_team_keys_alone_close_metrics_and_metrics_public_opens_them():
    teams = {"research": {"api_keys": [TEAM_KEY]}}
    with TestClient(create_app(_settings(teams=teams))) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=_bearer(TEAM_KEY)).status_code == 401
    public = _settings(teams=teams, auth={"admin_key": ADMIN_KEY}, server={"metrics_public": True})
    with TestClient(create_app(public)) as client:
        assert client.get("/metrics").status_code == 200


def test_a_metrics_token_alone_closes_metrics():
    with TestClient(create_app(_settings(server={"metrics_token": METRICS_TOKEN}))) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=_bearer(METRICS_TOKEN)).status_code == 200


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


TARGETS = {  # each form a credential may take in a request target -> what the log shows instead
    f"/health/live?api_key={SECRET}": "/health/live?api_key=***",
    f"/health/live?x=1&key={SECRET}": "/health/live?x=1&key=***",
    f"/health/live?token={SECRET}&x=1": "/health/live?token=***&x=1",
    f"/health/live?API_KEY={SECRET}": "/health/live?API_KEY=***",
    f"/health/live?access_token={SECRET}": "/health/live?access_token=***",
    f"/health/live?base_url=http://user:{SECRET}@host/v1": "/health/live?base_url=http://user:***@host/v1",
    f"/health/live?base_url=http://{SECRET}@host/v1": "/health/live?base_url=http://***@host/v1",
    "/health/live?monkey=see&tokens=2": "/health/live?monkey=see&tokens=2",  # not a credential: as it came
}


def test_the_access_log_masks_credentials_in_query_strings():
    lines = _Lines()
    access = logging.getLogger("uvicorn.access")
    app = create_app(_settings(server={"access_log": True}))
    with serve_in_thread(app, log_level="info", access_log=True) as url:
        # Importing LiteLLM puts a filter of its own there (the whole query string `REDACTED`), in
        # this process only if a test before imported it: ours alone here, so its form is known.
        others = [f for f in access.filters if not isinstance(f, RedactingFilter)]
        assert any(isinstance(f, RedactingFilter) for f in access.filters)
        for other in others:
            access.removeFilter(other)
        access.addHandler(lines)
        try:
            for target in TARGETS:
                assert httpx.get(url + target, timeout=30).status_code == 200
        finally:
            access.removeHandler(lines)
            for other in others:
                access.addFilter(other)
    formatter = AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False)
    written = [formatter.format(record) for record in lines.records]
    assert len(written) == len(TARGETS), written
    for line, shown in zip(written, TARGETS.values(), strict=True):
        assert SECRET not in line
        assert f'"GET {shown} HTTP/1.1" 200' in line, line
