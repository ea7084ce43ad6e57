"""report.html rendered by headless Chromium: every figure drew, and nothing was fetched.

The first test writes the report, appends a checking script to a copy of the page (the report
itself has no script), and runs `chromium --headless --dump-dom`: the script measures each figure's
SVG and its data marks (the `<figure id>-mark-<n>` groups the plots name) in the laid-out page and
writes what it found into the DOM, which Chromium prints. The second opens the page a running proxy
serves at /admin/report, signed in as a browser is, with HTTP Basic credentials in the URL, and
runs the same script in it over the DevTools protocol. Skips when Chromium is not installed
(`.ci/run` installs Debian's `chromium` when it is absent).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.sync.client import ClientConnection, connect

from switchyard.billing.refusals import refusal_record
from switchyard.billing.report import HTML_FILE, build_report
from switchyard.billing.store import open_database
from switchyard.core.prices import Price
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.components import unavailable
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until
from tests.unit.billing.test_report import T0, batches_of, ledger_records

CHECK = """
<script>
(function () {
  const result = {resources: performance.getEntriesByType("resource").map(e => e.name), figures: []};
  for (const figure of document.querySelectorAll("figure")) {
    const svg = figure.querySelector(":scope > svg");
    const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0, left: 0, top: 0, right: 0, bottom: 0};
    const marks = svg ? Array.from(svg.querySelectorAll('[id^="' + figure.id + '-mark-"]')) : [];
    let drawn = 0, filled = 0, inside = 0;
    for (const mark of marks) {
      const b = mark.getBBox();
      if (b.width > 0 || b.height > 0) drawn += 1;
      if (b.width > 0 && b.height > 0) filled += 1;
      const r = mark.getBoundingClientRect();
      if (r.right > box.left && r.left < box.right && r.bottom > box.top && r.top < box.bottom) inside += 1;
    }
    result.figures.push({id: figure.id, width: box.width, height: box.height, marks: marks.length,
                         drawn: drawn, filled: filled, inside: inside,
                         paths: svg ? svg.querySelectorAll("path").length : 0});
  }
  const pre = document.createElement("pre");
  pre.id = "report-check";
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
})();
</script>
"""


def chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        unavailable("Chromium is not installed (Debian's `chromium`; .ci/run installs it with apt-get when it can)")
    return path


def _flags(profile: Path) -> list[str]:
    return [
        chromium(),
        "--headless",
        "--no-sandbox",  # the suite may run as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ]


def render(page: Path, profile: Path) -> dict:
    completed = subprocess.run(
        [*_flags(profile), "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    found = re.search(r'<pre id="report-check">(.*?)</pre>', completed.stdout, re.S)
    assert found, f"chromium exited {completed.returncode}; stderr:\n{completed.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.slow
def test_every_plot_draws_in_chromium(tmp_path: Path) -> None:
    report = asyncio.run(build_report(batches_of(ledger_records()), prices={"big-c": Price(2.5, 10.0)}))
    report.write(tmp_path / "report")
    page = (tmp_path / "report" / HTML_FILE).read_text()
    checked = tmp_path / "checked.html"
    checked.write_text(page.replace("</body>", CHECK + "</body>"))

    result = render(checked, tmp_path / "profile")

    assert result["resources"] == []  # nothing fetched: the page opens offline
    assert [f["id"] for f in result["figures"]] == report.figure_ids
    assert len(report.figure_ids) == 7
    for figure in result["figures"]:
        assert figure["width"] > 300 and figure["height"] > 100, figure
        assert figure["marks"] > 0 and figure["drawn"] == figure["marks"], figure
        assert figure["filled"] > 0 and figure["inside"] == figure["marks"], figure
        assert figure["paths"] > 20, figure  # axes, ticks and glyphs drew too


class DevTools:
    """One page of a headless Chromium, driven over the DevTools protocol (its websocket). Requests
    pause at the browser's network layer (`Fetch`): an HTTP auth challenge is answered with the
    next of `logins` (user, password), as a user at the browser's sign-in prompt would; each
    challenge is kept in `challenges`."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.num_sent = 0
        self.events: list[dict] = []
        self.logins: list[tuple[str, str]] = []
        self.challenges: list[dict] = []

    def send(self, method: str, **params) -> int:
        self.num_sent += 1
        self.socket.send(json.dumps({"id": self.num_sent, "method": method, "params": params}))
        return self.num_sent

    def call(self, method: str, **params) -> dict:
        sent = self.send(method, **params)
        while True:
            message = self._receive()
            if message.get("id") == sent:
                assert "error" not in message, message
                return message["result"]
            self.events.append(message)

    def _receive(self) -> dict:
        message = json.loads(self.socket.recv(timeout=120))
        params = message.get("params", {})
        if message.get("method") == "Fetch.requestPaused":
            self.send("Fetch.continueRequest", requestId=params["requestId"])
        elif message.get("method") == "Fetch.authRequired":
            self.challenges.append(params["authChallenge"])
            if self.logins:
                user, password = self.logins.pop(0)
                answer = {"response": "ProvideCredentials", "username": user, "password": password}
            else:
                answer = {"response": "CancelAuth"}
            self.send("Fetch.continueWithAuth", requestId=params["requestId"], authChallengeResponse=answer)
        return message

    def open(self, url: str) -> None:
        """Navigate to `url` and wait for that navigation's load event (not an earlier page's)."""
        loader = self.call("Page.navigate", url=url)["loaderId"]

        def loaded(event: dict) -> bool:
            params = event.get("params", {})
            return event.get("method") == "Page.lifecycleEvent" and params == params | {
                "name": "load",
                "loaderId": loader,
            }

        while not any(loaded(event) for event in self.events):
            self.events.append(self._receive())
        self.events.clear()

    def evaluate(self, expression: str):
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in answer, answer
        return answer["result"]["value"]


@contextlib.contextmanager
def devtools(profile: Path) -> Iterator[DevTools]:
    browser = subprocess.Popen(
        [*_flags(profile), "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"  # the port Chromium chose, once it listens
        assert wait_until(lambda: port_file.exists() and port_file.read_text().strip(), timeout_s=60)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as listing:
            page = next(target for target in json.load(listing) if target["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=60) as socket:
            tools = DevTools(socket)
            tools.call("Page.enable")
            tools.call("Page.setLifecycleEventsEnabled", enabled=True)
            tools.call("Fetch.enable", handleAuthRequests=True)
            yield tools
    finally:
        browser.terminate()
        browser.wait(timeout=60)


ADMIN_KEY = "sk-admin-browser"


def _seeded_ledger(path: Path) -> list:
    """The hand-worked ledger, and two refusals of team search (the records written)."""
    refusals = [
        refusal_record(
            request_id=f"refused-{n}",
            reason=reason,
            started_at=T0 + 3600 * n,
            duration_ms=1.0,
            team="search",
            key_id="key_search",
            requested_model="big-c",
        )
        for n, reason in enumerate(("budget", "rate_limit"))
    ]

    async def seed() -> None:
        database = await open_database(f"sqlite:///{path}")
        try:
            await database.insert_usage([*ledger_records(), *refusals])
        finally:
            await database.aclose()

    asyncio.run(seed())
    return [*ledger_records(), *refusals]


@pytest.mark.slow
def test_the_admin_report_opens_in_a_browser_with_basic_auth(tmp_path: Path, monkeypatch) -> None:
    records = _seeded_ledger(tmp_path / "usage.db")
    monkeypatch.setenv("SWITCHYARD__BILLING__LEDGER_PATH", str(tmp_path / "usage.db"))  # over the suite's own
    expected = asyncio.run(build_report(batches_of(sorted(records, key=lambda r: r.started_at))))
    with serve_in_thread(FakeOpenAIUpstream(FakeState())) as upstream:
        settings = Settings(
            models=[{"name": "big-c", "base_url": upstream + "/v1"}],
            auth={"admin_key": ADMIN_KEY},
        )
        with serve_in_thread(create_app(settings)) as url, devtools(tmp_path / "profile") as browser:
            # the sign-in prompt: a wrong password first (asked again), then the admin key
            browser.logins = [("analyst", "not-the-key"), ("analyst", ADMIN_KEY)]
            browser.open(url + "/admin/report")
            script = CHECK.replace("<script>", "").replace("</script>", "")
            result = json.loads(browser.evaluate(script + ';document.getElementById("report-check").textContent'))
            refusals = browser.evaluate('document.querySelector("#refusals table").innerText')

    assert [(c["scheme"].lower(), c["realm"]) for c in browser.challenges] == [("basic", "switchyard")] * 2
    assert result["resources"] == []  # nothing fetched: the page opens offline
    assert [f["id"] for f in result["figures"]] == expected.figure_ids and len(expected.figure_ids) >= 7
    for figure in result["figures"]:
        assert figure["width"] > 300 and figure["height"] > 100, figure
        assert figure["marks"] > 0 and figure["drawn"] == figure["marks"], figure
        assert figure["filled"] > 0 and figure["inside"] == figure["marks"], figure
        assert figure["paths"] > 20, figure
    assert "search\tkey_search" in refusals and "budget" in refusals and "rate_limit" in refusals
