"""The analysts' report: CSV files, a JSON summary and one self-contained HTML page with plots.

`build_report(batches, since=…, until=…, team=…)` aggregates usage records streamed in batches
(no database here) into a `Report`; `Report.write(out_dir)` writes the files and `Report.html()`
returns the page (what `/admin/report` serves).
"""

from switchyard.billing.report.compare import previous_period
from switchyard.billing.report.drift import DriftReferences
from switchyard.billing.report.plots import Plot
from switchyard.billing.report.report import HTML_FILE, SUMMARY_FILE, Report, build_report
from switchyard.billing.report.tables import COLUMNS, Table

__all__ = [
    "COLUMNS",
    "HTML_FILE",
    "SUMMARY_FILE",
    "DriftReferences",
    "Plot",
    "Report",
    "Table",
    "build_report",
    "previous_period",
]
