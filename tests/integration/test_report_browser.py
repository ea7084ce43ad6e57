"""report.html rendered by headless Chromium: every figure drew, and nothing was fetched.

The test writes the report, appends a checking script to a copy of the page (the report itself
has no script), and runs `chromium --headless --dump-dom`: the script measures each figure's SVG
and its data marks (the `<figure id>-mark-<n>` groups the plots name) in the laid-out page and
writes what it found into the DOM, which Chromium prints. Skips when Chromium is not installed
(`.ci/run` installs Debian's `chromium` when it is absent).
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from switchyard.billing.report import HTML_FILE, build_report
from switchyard.core.prices import Price
from tests.components import unavailable
from tests.unit.billing.test_report import batches_of, ledger_records

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


def render(page: Path, profile: Path) -> dict:
    completed = subprocess.run(
        [
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
            "--dump-dom",
            page.as_uri(),
        ],
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
