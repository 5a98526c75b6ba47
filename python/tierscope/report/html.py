"""One self-contained HTML file: the summary in words first, then the figures. Plotly's JavaScript is
inlined once (no CDN, works offline); a section without data says so instead of showing an empty
plot."""

from __future__ import annotations

import html
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import plotly.graph_objects as go
import plotly.offline

from tierscope.report import figures
from tierscope.report.data import ReportData
from tierscope.report.summary import Summary, build_summary

#: (id, title, what it shows in plain words, figure builder, why it can be missing)
SECTIONS: list[tuple[str, str, str, Callable[[ReportData], go.Figure | None], str]] = [
    ("timeline", "Load and throughput of every tier",
     "Per server and per window: the mean number of requests inside the server (load) and the requests it "
     "completed per second. A bottleneck shows as load climbing while throughput stays flat.",
     figures.timeline, "needs per-request timings at the servers (requests table) and the fine-grained analysis"),
    ("main-sequence", "Main sequence and saturation point N*",
     "Throughput against load, one dot per window. Throughput grows with load until the server saturates at "
     "N* (dashed line); windows to the right of it (red) are saturated.",
     figures.main_sequence, "needs the fine-grained analysis"),
    ("strip", "Saturated windows, one row per tier",
     "Red where a tier was saturated. Rows that take turns are a bottleneck alternating between tiers; one row "
     "red most of the time is a single bottleneck. For simulated runs, rows marked (truth) show when the "
     "simulator knows the tier was saturated.",
     figures.saturation_strip, "needs the fine-grained analysis"),
    ("correlation", "Correlation of load between tiers",
     "Pearson correlation of the tiers' loads per window. Inclusive load counts time spent waiting on the next "
     "tier, so a synchronous chain correlates positively; negative exclusive correlation means tiers take turns.",
     figures.correlation_matrix, "needs two or more tiers"),
    ("load-curve", "Response time and throughput against workload",
     "The black-box view: throughput and 90th-percentile response time per workload level. The knee (dashed) is "
     "where response time starts to climb: the system reaches its capacity there.",
     figures.load_curve, "needs a run with two or more workload levels (users) and the generator's client_requests"),
    ("density", "Utilisation densities",
     "How much of the time each resource spent at each utilisation, per workload level (seed 000 Fig. 1). A "
     "bright band at the right edge means the resource is saturated at that workload.",
     figures.utilisation_density, "needs resources.parquet with percent metrics"),
    ("bottleneck-map", "Bottleneck map",
     "Maximum throughput per configuration, with its primary bottleneck and its group of configurations with "
     "similar maximum throughput (seed 000 Fig. 2/3).",
     figures.bottleneck_map_figure, "needs two or more configurations"),
    ("heavy", "Heavy requests",
     "Requests at least 100 times slower than the median of their kind (label): rare, but they can move the "
     "bottleneck (seed 000 §4).",
     figures.heavy_figure, "none found (or no labels to compare requests by)"),
]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd}
.summary{background:#f6f8fa;border-left:4px solid #d62728;padding:1em 1.2em;margin:1em 0}
.summary .headline{font-size:1.2em;font-weight:600} .note{color:#666;font-style:italic}
table.facts{border-collapse:collapse;margin-top:.6em} table.facts td{padding:.15em .8em .15em 0;vertical-align:top}
table.facts td:first-child{color:#555;white-space:nowrap} .meta{color:#777;font-size:.9em}
"""


def _summary_html(summary: Summary) -> str:
    look = "".join(f"<li>{html.escape(line)}</li>" for line in summary.look_at)
    facts = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in summary.facts)
    return (
        '<section class="summary" id="summary">'
        f'<div class="headline">{html.escape(summary.headline)}</div>'
        f"<p><b>How sure:</b> {html.escape(summary.confidence)}</p>"
        + (f"<p><b>What to look at:</b></p><ul>{look}</ul>" if look else "")
        + (f'<table class="facts">{facts}</table>' if facts else "")
        + "</section>"
    )


def _heavy_table(data: ReportData) -> str:
    if data.heavy_summary is None or data.heavy_summary.num_rows == 0:
        return ""
    head = "<tr><th>tier</th><th>label</th><th>heavy</th><th>of</th><th>median ms</th><th>max ms</th></tr>"
    rows = "".join(
        f"<tr><td>{html.escape(str(r['tier']))}</td><td>{html.escape(str(r['label']))}</td><td>{r['heavy']}</td>"
        f"<td>{r['requests']}</td><td>{r['median_ms']:.2f}</td><td>{r['max_ms']:.1f}</td></tr>"
        for r in data.heavy_summary.to_pylist()[:20])
    return f'<table class="facts">{head}{rows}</table>'


def render_html(data: ReportData, summary: Summary | None = None) -> str:
    """The report as one HTML string (Plotly inlined once)."""
    summary = summary or build_summary(data)
    parts, missing = [], []
    for sid, title, words, build, why in SECTIONS:
        try:
            fig = build(data)
        except Exception as err:  # one broken figure must not lose the rest of the report
            fig, why = None, f"could not be drawn ({err.__class__.__name__}: {err})"
        if fig is None:
            missing.append((title, why))
            continue
        body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{sid}",
                           config={"displaylogo": False, "responsive": True})
        extra = _heavy_table(data) if sid == "heavy" else ""
        parts.append(f'<section id="{sid}"><h2>{html.escape(title)}</h2><p>{html.escape(words)}</p>{body}{extra}'
                     "</section>")
    notes = "".join(f"<li><b>{html.escape(t)}</b>: {html.escape(w)}</li>" for t, w in missing)
    notes += "".join(f"<li>{html.escape(n)}</li>" for n in data.notes)
    omitted = (f'<section id="omitted"><h2>Not shown</h2><ul class="note">{notes}</ul></section>' if notes else "")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    from tierscope import __version__

    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>tierscope report: {html.escape(data.title)}</title><style>{_CSS}</style>"
        f"<script type=\"text/javascript\">{plotly.offline.get_plotlyjs()}</script></head><body>"
        f"<h1>tierscope report: {html.escape(data.title)}</h1>"
        f'<p class="meta">tierscope {__version__}, {when}; window {data.window_ns / 1e6:g} ms</p>'
        f"{_summary_html(summary)}{''.join(parts)}{omitted}</body></html>"
    )


def write_report(data: ReportData, path: str | Path, summary: Summary | None = None) -> Path:
    """Write the HTML report to `path` (parent directories created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(data, summary), encoding="utf-8")
    return path
