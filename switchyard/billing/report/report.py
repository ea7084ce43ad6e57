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
from switchyard.billing.report.page import render_page
from switchyard.billing.report.plots import Plot, draw_all
from switchyard.billing.report.tables import Table, build_summary, build_tables
from switchyard.core.prices import Price

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
        return {
            "object": "switchyard.report",
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "team": self.team,
            "generated_at": self.generated_at.isoformat(),
            **self.summary,
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
) -> Report:
    """The report over the records of `batches` whose UTC day is in since..until (inclusive, either
    open) and, when `team` is given, of that team. `prices` (model → `Price`) adds the list prices
    to the models table; `key_prefixes` (key id → its shown prefix) to the keys table. `progress`
    shows a bar on stderr over `total` records (`count_usage`).
    """
    since, until = _as_day(since), _as_day(until)
    aggregator = Aggregator(since=since, until=until, team=team)
    with _progress_bar() if progress else contextlib.nullcontext() as bar:
        task = bar.add_task("reading usage", total=total) if bar else None
        async for batch in batches:
            # ~20 µs a record: a batch of thousands would hold the event loop (the proxy's) too long
            await asyncio.to_thread(aggregator.add_batch, batch)
            if bar is not None and task is not None:
                bar.advance(task, len(batch))
    aggregator.finish()
    tables = build_tables(aggregator, prices, key_prefixes)
    summary = build_summary(aggregator)
    plots = tuple(await asyncio.to_thread(draw_all, tables)) if aggregator.num_records else ()
    return Report(since, until, team, datetime.now(UTC), summary, tables, plots)


def _progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    )
