"""The cascade tuning's table, plot (PNG) and self-contained HTML page."""

from __future__ import annotations

import html
from pathlib import Path

from rich.table import Table

from switchyard.evals.cascade import CascadeReport
from switchyard.evals.report import figure_svg, html_page


def _auroc(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def summary_lines(report: CascadeReport) -> list[str]:
    t = report.test
    lines = [
        f"scorer {report.scorer.name}: escalate {report.weak} -> {report.strong} when confidence < "
        f"{report.threshold:.4g}",
    ]
    for name, point in (("train", report.train), ("test", report.test)):
        lines.append(
            f"  {name:5}: quality {point['quality']:.3f} (weak {point['quality_weak']:.3f}, strong "
            f"{point['quality_strong']:.3f}), {point['escalation_rate'] * 100:.1f}% escalated, "
            f"${point['cost_usd'] * 1000:.4f} / 1k prompts (strong alone ${point['cost_strong_usd'] * 1000:.4f}), "
            f"AUROC {_auroc(point['auroc'])}"
        )
    if t["num_unjudged"]:
        lines.append(f"  {t['num_unjudged']} test answers carry no logprobs: always escalated")
    return lines + list(report.notes)


def auroc_table(report: CascadeReport) -> Table:
    table = Table(title="Confidence vs a correct weak answer (AUROC; 0.5 is chance)", title_justify="left")
    for column in ("scorer", "train", "test"):
        table.add_column(column, justify="left" if column == "scorer" else "right")
    for name, train in report.train_auroc.items():
        label = name + (" (chosen)" if name == report.scorer.name else "")
        table.add_row(label, _auroc(train), _auroc(report.test_auroc.get(name)))
    return table


def _figure(title: str, report: CascadeReport):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve, t = report.curve, report.test
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    left.plot(curve.escalation_rate * 100, curve.quality, label=f"cascade ({report.scorer.name})")
    left.plot([t["escalation_rate"] * 100], [t["quality"]], "o", color="crimson", label="chosen threshold")
    right.plot(curve.cost_usd * 1000, curve.quality, label="cascade")
    right.plot([t["cost_usd"] * 1000], [t["quality"]], "o", color="crimson", label="chosen threshold")
    right.plot([t["cost_weak_usd"] * 1000], [t["quality_weak"]], "s", label=f"{report.weak} alone")
    right.plot([t["cost_strong_usd"] * 1000], [t["quality_strong"]], "s", label=f"{report.strong} alone")
    for axis in (left, right):
        axis.axhline(t["quality_strong"], color="grey", linewidth=0.8, linestyle=":")
        axis.axhline(t["quality_weak"], color="grey", linewidth=0.8, linestyle=":")
        axis.grid(alpha=0.3)
        axis.set_ylabel("quality (share answered correctly)")
        axis.legend(fontsize=8, loc="lower right")
    from matplotlib.ticker import MaxNLocator

    right.xaxis.set_major_locator(MaxNLocator(5))
    left.set_xlabel("prompts escalated (%)")
    left.set_title("Quality vs escalation rate (test split)")
    right.set_xlabel("cost (USD per 1k prompts)")
    right.set_title("Quality vs cost (test split)")
    fig.suptitle(title)
    fig.tight_layout()
    return fig, plt


def write_plot(path: Path, title: str, report: CascadeReport) -> None:
    fig, plt = _figure(title, report)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_html(path: Path, title: str, report: CascadeReport) -> None:
    svg = figure_svg(*_figure(title, report))
    rows = "".join(
        f"<tr><td>{html.escape(name)}{' (chosen)' if name == report.scorer.name else ''}</td>"
        f"<td>{_auroc(train)}</td><td>{_auroc(report.test_auroc.get(name))}</td></tr>"
        for name, train in report.train_auroc.items()
    )
    summary = "".join(f"<li>{html.escape(line.strip())}</li>" for line in summary_lines(report))
    path.write_text(
        html_page(
            title,
            f"""<ul>{summary}</ul>
{svg}
<h2>Which confidence signal separates right from wrong weak answers</h2>
<p>AUROC of each scorer against the weak answer being right (train: the learned scorer by 5-fold
cross-validation). The threshold was picked on the train split; every number on the curve is from
the test split. An escalated prompt pays for both answers.</p>
<table><thead><tr><th>scorer</th><th>train AUROC</th><th>test AUROC</th></tr></thead><tbody>{rows}</tbody></table>""",
        )
    )
