"""Who may read the report pages: the admin key at /admin/report and a team's own key at
/v1/usage/report, each as a bearer token or as the password of HTTP Basic auth (what a browser
sends once asked by a 401 with `WWW-Authenticate: Basic`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from switchyard.billing.teams import digest, key_id_for
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_until

ADMIN_KEY = "sk-admin-report"
CHALLENGE = 'Basic realm="switchyard"'
PRICE = {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2}  # a cost: the keys' table is drawn
TEAMS = {"search": {"api_keys": ["sk-search"]}, "support": {"api_keys": ["sk-support"]}}


@contextmanager
def proxy(tmp_path: Path) -> Iterator[str]:
    """A proxy whose ledger holds one answer of each team."""
    with serve_in_thread(FakeOpenAIUpstream(FakeState())) as upstream:
        settings = Settings(
            models=[{"name": "m", "base_url": upstream + "/v1", "price": PRICE}],
            teams=TEAMS,
            auth={"admin_key": ADMIN_KEY},
            billing={"database_url": f"sqlite:///{tmp_path / 'usage.db'}", "spill_path": tmp_path / "spill.jsonl"},
        )
        app = create_app(settings)
        with serve_in_thread(app) as url:
            for key in ("sk-search", "sk-support"):
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                reply = httpx.post(url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
                assert reply.status_code == 200
            assert wait_until(lambda: len(read_ledger(app)) == 2, timeout_s=30)
            yield url


def _get(url: str, path: str, *, auth=None, headers=None, **params) -> httpx.Response:
    return httpx.get(url + path, auth=auth, headers=headers, params=params, timeout=60)


def _key_id(key: str) -> str:
    return key_id_for(digest(key))


def test_the_admin_report_takes_the_admin_key_as_a_basic_password_or_a_bearer_token(tmp_path):
    with proxy(tmp_path) as url:
        basic = _get(url, "/admin/report", auth=("any-user-name", ADMIN_KEY))
        bearer = _get(url, "/admin/report", headers={"authorization": f"Bearer {ADMIN_KEY}"}, team="search")
        wrong = _get(url, "/admin/report", auth=("analyst", "not-the-key"))
        browser = _get(url, "/admin/report", headers={"accept": "text/html,application/xhtml+xml"})
        team_key = _get(url, "/admin/report", auth=("analyst", "sk-search"))
        elsewhere = _get(url, "/admin/teams", auth=("analyst", ADMIN_KEY))  # Basic opens the report pages only
        document = _get(url, "/openapi.json").json()

    assert basic.status_code == 200 and basic.headers["content-type"].startswith("text/html")
    assert _key_id("sk-search") in basic.text and _key_id("sk-support") in basic.text  # every team
    assert bearer.status_code == 200 and _key_id("sk-support") not in bearer.text
    for refused in (wrong, browser, team_key):
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == CHALLENGE
    assert wrong.json()["error"]["code"] == "invalid_api_key"  # an API client: OpenAI's error body
    assert browser.headers["content-type"].startswith("text/html")  # a browser: a page, if it gives up
    assert "the key as the password" in browser.text
    assert elsewhere.status_code == 401 and "www-authenticate" not in elsewhere.headers
    # the OpenAPI document says so: the report pages take either, everything else the bearer key
    assert document["components"]["securitySchemes"]["basic"]["scheme"] == "basic"
    for path in ("/admin/report", "/v1/usage/report"):
        assert document["paths"][path]["get"]["security"] == [{"bearer": []}, {"basic": []}]
    assert "security" not in document["paths"]["/admin/teams"]["get"]  # the document's default: bearer


def test_a_team_key_reads_its_own_teams_report_only(tmp_path):
    with proxy(tmp_path) as url:
        own = _get(url, "/v1/usage/report", headers={"authorization": "Bearer sk-search"})
        basic = _get(url, "/v1/usage/report", auth=("lead", "sk-search"), since="2000-01-01")
        named = _get(url, "/v1/usage/report", auth=("lead", "sk-search"), team="search")
        other = _get(url, "/v1/usage/report", headers={"authorization": "Bearer sk-search"}, team="support")
        unknown = _get(url, "/v1/usage/report", auth=("lead", "sk-nobody"))
        anonymous = _get(url, "/v1/usage/report", headers={"accept": "text/html"})
        admin = _get(url, "/v1/usage/report", auth=("analyst", ADMIN_KEY), team="support")

    for page in (own, basic, named):
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "<dd>search</dd>" in page.text  # the team filter, in the page's header
        assert _key_id("sk-search") in page.text and _key_id("sk-support") not in page.text
    assert other.status_code == 403
    assert other.json()["error"] == {
        "message": "Your key belongs to team 'search'; it may not read the report of team 'support'.",
        "type": "permission_error",
        "param": "team",
        "code": "permission_denied",
    }
    assert unknown.status_code == 401 and unknown.headers["www-authenticate"] == CHALLENGE
    assert unknown.json()["error"]["code"] == "invalid_api_key"
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == CHALLENGE
    assert admin.status_code == 200 and _key_id("sk-support") in admin.text and _key_id("sk-search") not in admin.text


@pytest.mark.parametrize("header", ["Basic !!!", "Basic " + "bm8tY29sb24=", "Bearer"])
def test_a_malformed_authorization_is_asked_again(tmp_path, header):
    with proxy(tmp_path) as url:
        reply = _get(url, "/v1/usage/report", headers={"authorization": header})
    assert reply.status_code == 401 and reply.headers["www-authenticate"] == CHALLENGE
