"""The report renders what the analysis found (`tierscope.analysis.experiment`): one self-contained
HTML file (Plotly inlined, works offline) and the Rich terminal summary.

>>> from tierscope.analysis.experiment import analyze_run
>>> from tierscope.report import write_report
>>> write_report(analyze_run("runs/sweep1"), "report.html")
"""

from tierscope.report.html import render_html, write_report, write_study_page
from tierscope.report.summary import configuration_table, level_table, print_summary, rich_table

__all__ = [
    "configuration_table",
    "level_table",
    "print_summary",
    "render_html",
    "rich_table",
    "write_report",
    "write_study_page",
]
