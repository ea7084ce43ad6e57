"""`build_report`: usage records streamed in batches → a `Report` (tables, summary, figures, page).

The caller reads the ledger (`Database.iter_usage`, ordered by `started_at`) and passes the
batches; nothing here touches a database. Each batch is aggregated, and the figures are drawn
(matplotlib, CPU-bound), on a worker thread, so a report served by the proxy does not stall it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from switchyard.billing.records import UsageRecord
from switchyard.billing.report.aggregate import Aggregator
from switchyard.billing.report.compare import compare_periods, previous_period
from switchyard.billing.report.drift import DriftReferences
from switchyard.billing.report.drift_plot import drift
from switchyard.billing.report.page import render_page
from switchyard.billing.report.plots import Plot, draw_all
from switchyard.billing.report.tables import Table, build_summary, build_tables
from switchyard.core.prices import Price, round_usd

SUMMARY_FILE = "summary.json"
HTML_FILE = "report.html"


@dataclass(frozen=True)
class Report:
    since: date | None
    until: date | None
    team: str | None
    generated_at: datetime
    summary: dict[str, Any]  # the headline numbers; summary.json is this plus the period and the file list
    tables: dict[str, Table]
    plots: tuple[Plot, ...] = field(default=())

    @property
    def is_empty(self) -> bool:
        num_records: int = self.summary["records"]
        return num_records == 0

    @property
    def figure_ids(self) -> list[str]:
        """The ids of the `<figure>` elements on the page (figures with nothing to draw have none)."""
        return [p.id for p in self.plots if p.svg is not None]

    def summary_json(self) -> dict[str, Any]:
        """summary.json: USD amounts rounded as every output rounds them (`round_usd`)."""
        return {
            "object": "switchyard.report",
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "team": self.team,
            "generated_at": self.generated_at.isoformat(),
            **_money_rounded(self.summary),
            "files": [t.file_name for t in self.tables.values()] + [SUMMARY_FILE, HTML_FILE],
        }

    def html(self) -> str:
        return render_page(
            since=self.since,
            until=self.until,
            team=self.team,
            generated_at=self.generated_at,
            summary=self.summary,
            plots=self.plots,
            tables=self.tables,
        )

    def write(self, out_dir: str | Path) -> list[Path]:
        """Writes one CSV per table, summary.json and report.html into `out_dir` (created if absent)."""
        out = Path(out_dir).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for table in self.tables.values():
            paths.append(out / table.file_name)
            paths[-1].write_text(table.to_csv(), encoding="utf-8")
        paths.append(out / SUMMARY_FILE)
        paths[-1].write_text(json.dumps(self.summary_json(), indent=2) + "\n", encoding="utf-8")
        paths.append(out / HTML_FILE)
        paths[-1].write_text(self.html(), encoding="utf-8")
        return paths


def _is_money(key: str) -> bool:
    return key.endswith("_usd") or "usd_per_mtok" in key


def _money_rounded(value: Any, is_money: bool = False) -> Any:
    """`value` with every float under a USD key (`cost_usd`, `usd_per_mtok`, …) rounded, at any depth."""
    if isinstance(value, dict):
        return {k: _money_rounded(v, is_money or (isinstance(k, str) and _is_money(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [_money_rounded(v, is_money) for v in value]
    return round_usd(value) if is_money and isinstance(value, float) else value


def _as_day(value: date | None) -> date | None:
    return value.date() if isinstance(value, datetime) else value


async def build_report(
    batches: AsyncIterable[list[UsageRecord]],
    *,
    prices: Mapping[str, Price] | None = None,
    since: date | None = None,
    until: date | None = None,
    team: str | None = None,
    total: int | None = None,
    progress: bool = False,
    key_prefixes: Mapping[str, str] | None = None,
    hosting: Mapping[str, str] | None = None,
    previous_batches: AsyncIterable[list[UsageRecord]] | None = None,
    previous_total: int | None = None,
    drift: DriftReferences | None = None,
    judged: Mapping[str, float] | None = None,
) -> Report:
    """The report over the records of `batches` whose UTC day is in since..until (inclusive, either
    open) and, when `team` is given, of that team. `prices` (model → `Price`) adds the list prices
    to the models table; `key_prefixes` (key id → its shown prefix) to the keys table; `hosting`
    (model → `self-hosted` or `commercial`) overrides what the records say. `previous_batches`: the
    records of `previous_period(since, until)`, compared in the summary. `drift`: the loaded
    version's references, for the Drift section (None: it says there is none). `progress` shows a bar on
    stderr over `total` records (`count_usage`), and one over `previous_total`. `judged` (request id
    -> the judged quality of its answer, 0..1) adds judged quality to the routing versions' table.
    """
    since, until = _as_day(since), _as_day(until)
    aggregator = Aggregator(since=since, until=until, team=team, hosting=hosting, drift=drift, judged=judged)
    before = previous_period(since, until)
    earlier = Aggregator(since=before[0], until=before[1], team=team, hosting=hosting) if before else None
    with _progress_bar() if progress else contextlib.nullcontext() as bar:
        await _aggregate(aggregator, batches, bar, "reading usage", total)
        if earlier is not None and previous_batches is not None:
            await _aggregate(earlier, previous_batches, bar, "reading the previous period", previous_total)
    aggregator.finish()
    tables = build_tables(aggregator, prices, key_prefixes)
    summary = build_summary(aggregator, prices)
    if before is not None and earlier is not None and previous_batches is not None:
        earlier.finish()
        summary["previous"], summary["change"] = compare_periods(summary, build_summary(earlier, prices), *before)
    plots = tuple(await asyncio.to_thread(_draw_figures, tables)) if aggregator.num_records else ()
    return Report(since, until, team, datetime.now(UTC), summary, tables, plots)


def _draw_figures(tables: Mapping[str, Table]) -> list[Plot]:
    return [*draw_all(tables), drift(tables)]


async def _aggregate(
    aggregator: Aggregator,
    batches: AsyncIterable[list[UsageRecord]],
    bar: Progress | None,
    what: str,
    total: int | None,
) -> None:
    task = bar.add_task(what, total=total) if bar else None
    async for batch in batches:
        # ~20 µs a record: a batch of thousands would hold the event loop (the proxy's) too long
        await asyncio.to_thread(aggregator.add_batch, batch)
        if bar is not None and task is not None:
            bar.advance(task, len(batch))


def _progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    )
