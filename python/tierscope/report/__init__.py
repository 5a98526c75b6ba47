"""The report: one self-contained HTML file (Plotly inlined, works offline) and a Rich terminal
summary, from a run directory or from imported trace files.

>>> from tierscope.report import collect_run, write_report, build_summary
>>> data = collect_run("runs/sweep1")
>>> write_report(data, "report.html")
"""

from tierscope.report.data import ReportData, collect_files, collect_run
from tierscope.report.html import render_html, write_report
from tierscope.report.summary import Summary, build_summary, print_summary, rich_table

__all__ = ["ReportData", "Summary", "build_summary", "collect_files", "collect_run", "print_summary", "render_html",
           "rich_table", "write_report"]
