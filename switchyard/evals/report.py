"""Tables, the PNG plot and the self-contained HTML page of an evaluation."""

from __future__ import annotations

import html
import io
import math
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from switchyard.evals.artifact_compare import INTERVAL, QUALITY_TARGET, SetResult
from switchyard.evals.evaluate import Outcomes, RouterResult


def _num(value: float, fmt: str = ".3f") -> str:
    return "—" if math.isnan(value) else format(value, fmt)


def _share(value: float) -> str:
    return "—" if math.isnan(value) else f"{value * 100:.1f}%"


def rows(results: Sequence[RouterResult]) -> list[list[str]]:
    out = []
    for r in results:
        name = r.name + (" (reference)" if r.is_reference else "") + (" (fixed)" if r.is_fixed else "")
        cost = r.cost_at_95_usd * 1000
        out.append([name, _num(r.apgr), _share(r.cpt50), _share(r.cpt80), _num(cost, ".4f"), _num(r.aiq)])
    return out


HEADERS = ["router", "APGR", "CPT(50%)", "CPT(80%)", "$ / 1k prompts at 95% of strong quality", "AIQ"]


def rich_table(title: str, results: Sequence[RouterResult]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows(results):
        table.add_row(*row)
    return table


def _span(interval: tuple[float, float], signed: bool = False) -> str:
    fmt = "+.3f" if signed else ".3f"
    return "—" if math.isnan(interval[0]) else f"{interval[0]:{fmt}} … {interval[1]:{fmt}}"


def artifacts_table(results: Sequence[SetResult], reference: str) -> Table:
    """One row per set and artifact, chat sets first, each set's rows on the same prompts."""
    table = Table(
        title=f"Classifier artifacts on prompts none was fitted on ({INTERVAL:.0%} intervals, paired bootstrap)",
        title_justify="left",
    )
    headers = [
        "set",
        "prompts",
        "artifact",
        "APGR",
        "APGR interval",
        f"vs {reference}",
        "interval",
        "CPT(50%)",
        "CPT(80%)",
        f"strong calls at {QUALITY_TARGET:.0%} quality",
    ]
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i in (0, 2) else "right")
    for result in results:
        for i, a in enumerate(result.artifacts):
            first = i == 0
            table.add_row(
                (f"{result.dataset} (chat)" if result.is_chat else result.dataset) if first else "",
                f"{result.num_prompts} ({result.which_prompts})" if first else "",
                a.artifact,
                _num(a.apgr),
                _span(a.apgr_interval),
                "" if a.artifact == reference else _num(a.delta, "+.3f"),
                "" if a.artifact == reference else _span(a.delta_interval, signed=True),
                _share(a.cpt50),
                _share(a.cpt80),
                _share(a.strong_share_at_target),
                end_section=i == len(result.artifacts) - 1,
            )
    return table


def set_lines(results: Sequence[SetResult]) -> list[str]:
    return [f"{r.dataset}: {r.num_prompts} prompts ({r.which_prompts}), {r.weak} → {r.strong}" for r in results]


def anchors(test: Outcomes) -> str:
    return (
        f"test split: {len(test.traces)} prompts; weak quality {test.quality_weak:.3f} at "
        f"${test.c_weak.mean() * 1000:.4f} / 1k prompts; strong quality {test.quality_strong:.3f} at "
        f"${test.c_strong.mean() * 1000:.4f} / 1k prompts"
    )


def _figure(title: str, test: Outcomes, results: Sequence[RouterResult]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    for r in results:
        style = {"linestyle": "--"} if r.is_reference else {}
        if r.is_fixed:
            left.plot(r.curve.strong_share * 100, r.curve.quality, "o", label=r.name)
            right.plot(r.curve.cost_usd * 1000, r.curve.quality, "o", label=r.name)
            continue
        label = f"{r.name} (APGR {r.apgr:.3f})"
        left.plot(r.curve.strong_share * 100, r.curve.quality, label=label, **style)
        right.plot(r.curve.cost_usd * 1000, r.curve.quality, label=r.name, **style)
    for axis in (left, right):
        axis.axhline(test.quality_strong, color="grey", linewidth=0.8, linestyle=":")
        axis.axhline(test.quality_weak, color="grey", linewidth=0.8, linestyle=":")
        axis.grid(alpha=0.3)
        axis.set_ylabel("quality (share answered correctly)")
    left.set_xlabel("calls to the strong model (%)")
    left.set_title("Quality vs strong-model calls")
    right.set_xlabel("cost (USD per 1k prompts)")
    right.set_title("Quality vs cost")
    left.legend(fontsize=8, loc="lower right")
    right.legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    return fig, plt


def write_plot(path: Path, title: str, test: Outcomes, results: Sequence[RouterResult]) -> None:
    fig, plt = _figure(title, test, results)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure_svg(fig, plt) -> str:
    """The figure as inline SVG (closed afterwards)."""
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    plt.close(fig)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]


def html_page(title: str, body: str) -> str:
    """A self-contained page (no scripts) with the evals' table style."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #222; }}
table {{ border-collapse: collapse; margin: 1rem 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.3rem 0.7rem; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
svg {{ max-width: 100%; height: auto; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
{body}
</body></html>
"""


def write_html(path: Path, title: str, test: Outcomes, results: Sequence[RouterResult]) -> None:
    svg = figure_svg(*_figure(title, test, results))
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows(results))
    path.write_text(
        html_page(
            title,
            f"""<p>{html.escape(anchors(test))}</p>
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<p>APGR: area under the performance-gap-recovered curve (always-weak 0, always-strong 1, random about
0.5). CPT(x%): share of strong calls needed to recover x% of the quality gap. AIQ: mean quality under
the convex hull of (cost, quality) between the weak and the strong model's cost.</p>
{svg}""",
        )
    )
