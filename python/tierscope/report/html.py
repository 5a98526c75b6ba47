"""One self-contained HTML file: the summary in words first, what was analysed, then the figures.
Plotly's JavaScript is inlined once (no CDN, works offline); a section without data says so instead
of showing an empty plot.

Size: the inlined plotly.js is the package's ``package_data/plotly.min.js`` (already minified,
~4.8 MB with plotly 7), which is most of the page. Figures are embedded as JSON (numbers as base64
typed arrays) and drawn by one script at the end; their shared Plotly template is written once.
``compress_js=True`` inlines plotly.js gzipped and base64-encoded instead (~1.9 MB), unpacked by the
browser (DecompressionStream: Chrome 80, Firefox 113, Safari 16.4 or later) — still offline.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import html
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import plotly.graph_objects as go
import plotly.offline
from plotly.io.json import to_json_plotly

from tierscope import __version__
from tierscope.analysis.experiment import Analysis
from tierscope.analysis.study import Finding, label_of
from tierscope.analysis.summary import Summary, build_summary
from tierscope.report import figures

#: (id, title, what it shows in plain words, figure builder, why it can be missing)
SECTIONS: list[tuple[str, str, str, Callable[[Analysis], go.Figure | None], str]] = [
    (
        "timeline",
        "Load and throughput of every tier",
        "Per server and per window: the mean number of requests inside the server (load) and the requests it "
        "completed per second. A bottleneck shows as load climbing while throughput stays flat. Servers of one tier "
        "share a hue and differ by shade and dash; shaded bands are stalls (a server holding requests and "
        "completing none) and pauses (GC, injected freezes) — hover the marks above them.",
        figures.timeline,
        "needs per-request timings at the servers (requests table) and the fine-grained analysis",
    ),
    (
        "main-sequence",
        "Main sequence and saturation point N*",
        "Throughput against load, one dot per window. Throughput grows with load until the server saturates at "
        "N* (dashed line); windows to the right of it (red) are saturated.",
        figures.main_sequence,
        "needs the fine-grained analysis",
    ),
    (
        "strip",
        "Saturated windows, one row per tier",
        "Red where a tier was saturated. Rows that take turns are a bottleneck alternating between tiers; one row "
        "red most of the time is a single bottleneck. For simulated runs, rows marked (truth) show when the "
        "simulator knows the tier was saturated.",
        figures.saturation_strip,
        "needs the fine-grained analysis",
    ),
    (
        "correlation",
        "Correlation of load between tiers",
        "Pearson correlation of the tiers' loads per window. Inclusive load counts time spent waiting on the next "
        "tier, so a synchronous chain correlates positively; negative exclusive correlation means tiers take turns.",
        figures.correlation_matrix,
        "needs two or more tiers",
    ),
    (
        "load-curve",
        "Response time and throughput against workload",
        "The black-box view: throughput, and the median, 90th and 99th percentile response time (p90 solid, p50 "
        "and p99 dashed) per workload level; when requests failed, the error rate (% of all requests) on the right "
        "axis. The knee (dashed) is where response time starts to climb: the system reaches its capacity there.",
        figures.load_curve,
        "needs a run with two or more workload levels (users) and the generator's client_requests",
    ),
    (
        "density",
        "Utilisation densities",
        "How much of the time each resource spent at each utilisation, per workload level (seed 000 Fig. 1). A "
        "bright band at the right edge means the resource is saturated at that workload.",
        figures.utilisation_density,
        "needs resources.parquet with percent metrics",
    ),
    (
        "two-grains",
        "One host at two grains",
        "The CPU of the host most often saturated at the analysed point, as sampled and re-aggregated to 1 s from "
        "the same samples (seed 001): short saturations that the 1 s average hides show at the fine grain.",
        figures.two_grains_figure,
        "needs the analysed point's resources.parquet with CPU sampled finer than 1 s",
    ),
    (
        "bottleneck-map",
        "Bottleneck map",
        "Maximum throughput per configuration, with its primary bottleneck and its group of configurations with "
        "similar maximum throughput (seed 000 Fig. 2/3).",
        figures.bottleneck_map_figure,
        "needs two or more configurations",
    ),
    (
        "heavy",
        "Heavy requests",
        "Requests at least 100 times slower than the median of their kind (label): rare, but they can move the "
        "bottleneck (seed 000 §4).",
        figures.heavy_figure,
        "none found (or no labels to compare requests by)",
    ),
]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd}
.summary{background:#f6f8fa;border-left:4px solid #d62728;padding:1em 1.2em;margin:1em 0}
.summary .headline{font-size:1.2em;font-weight:600} .note{color:#666;font-style:italic}
table.facts{border-collapse:collapse;margin-top:.6em} table.facts td{padding:.15em .8em .15em 0;vertical-align:top}
table.facts td:first-child{color:#555;white-space:nowrap} .meta{color:#777;font-size:.9em}
.plot{width:100%}
.finding{background:#f6f8fa;border-left:4px solid #999;padding:.6em 1.2em;margin:1em 0}
.finding.holds{border-left-color:#2ca02c} .finding.fails{border-left-color:#d62728}
.finding h2{margin-top:.4em} .finding .verdict{font-weight:600}
table.figures{border-collapse:collapse} table.figures th,table.figures td{padding:.2em .8em .2em 0;text-align:left;
vertical-align:top} table.figures th{border-bottom:1px solid #ccc;font-weight:600}
"""

#: Plotly's config for every figure
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


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


def _ms(x: object) -> str:
    return f"{1e3 * x:.0f} ms" if isinstance(x, int | float) else "-"


def _bottleneck_cell(f: dict) -> str:
    b = f.get("bottleneck")
    if b:
        users = f" at {f['users']:g} users" if isinstance(f.get("users"), int | float) else ""
        return f"{b['tier']} {b['resource']} ({b['host']} above 95 % in {100 * b['share']:.0f} % of the samples{users})"
    busiest = f.get("busiest")
    if busiest:
        return f"no saturated resource (busiest: {busiest['host']} {busiest['resource']}, mean {busiest['mean']:.0f} %)"
    return "-" if "users" not in f else "no saturated resource"


#: the columns of a finding's figures: (key, heading, cell); a column is shown when a figure has its key
_FIGURE_COLUMNS: list[tuple[str, str, Callable[[dict], str]]] = [
    ("label", "configuration", lambda f: str(f["label"])),
    ("mode", "mode", lambda f: str(f["mode"])),
    ("target", "target", lambda f: f"{f['target']} {f.get('workload', '')}".strip()),
    ("max_throughput", "max throughput", lambda f: f"{f['max_throughput']:.1f}/s"),
    ("bottleneck", "bottleneck", _bottleneck_cell),
    ("rt_mean", "mean response time", lambda f: _ms(f["rt_mean"])),
    ("rt_p90", "p90 response time", lambda f: _ms(f["rt_p90"])),
    ("rt_users", "response times at", lambda f: f"{f['rt_users']:g} users"),
    ("cpu", "mean CPU (% of its allowance)", lambda f: ", ".join(f"{h} {x:.0f} %" for h, x in f["cpu"].items())),
    ("sent", "sent", lambda f: str(f["sent"])),
    ("lost", "lost", lambda f: "unknown" if f["lost"] is None else str(f["lost"])),
    ("lost_share", "lost share", lambda f: "-" if f["lost_share"] is None else f"{100 * f['lost_share']:.1f} %"),
    ("kind", "verdict", lambda f: f"{f['kind']} ({', '.join(f.get('tiers') or [])})"),
    ("confidence", "confidence", lambda f: f"{f['confidence']:.2f}"),
    ("per_node", "per node", lambda f: ", ".join(f"{n} node(s): {x:g}" for n, x in f["per_node"].items())),
]


def finding_figures(finding: Finding) -> tuple[list[str], list[list[str]]]:
    """The figures a finding rests on as a table: (headings, one row per configuration or mode)."""
    figs = [f for f in finding.figures if isinstance(f, dict)]
    columns = [c for c in _FIGURE_COLUMNS if any(c[0] in f for f in figs)]
    rows = []
    for f in figs:
        row = []
        for key, _, cell in columns:
            try:
                row.append(cell(f) if f.get(key) is not None or key == "bottleneck" else "-")
            except (KeyError, TypeError, ValueError):
                row.append(str(f.get(key)))
        rows.append(row)
    return [c[1] for c in columns], rows


def _finding_html(finding: Finding | None) -> str:
    """The study's finding (as the terminal's "Finding:" line): what the study claims, whether it
    holds and why, what was found, and the figures behind it."""
    if finding is None:
        return ""
    verdict = {True: "holds", False: "does not hold", None: "cannot be decided"}[finding.holds]
    look = {True: "holds", False: "fails", None: "undecided"}[finding.holds]
    if finding.claim:
        said = (
            f'<p class="verdict">The study\'s finding {verdict}: {html.escape(finding.why)}</p>'
            f"<p><b>Claimed:</b> {html.escape(finding.claim)}</p>"
        )
    elif finding.holds is None:
        why = finding.why[:1].upper() + finding.why[1:]
        said = f'<p class="verdict">{html.escape(why)}.</p>' if why else ""
    else:
        said = f'<p class="verdict">The finding {verdict}: {html.escape(finding.why)}</p>'
    heads, rows = finding_figures(finding)
    table = ""
    if rows and heads:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in heads)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        table = f'<table class="figures"><tr>{head}</tr>{body}</table>'
    return (
        f'<section class="finding {look}" id="finding"><h2>Finding</h2>{said}'
        f"<p><b>Found:</b> {html.escape(finding.text)}</p>{table}</section>"
    )


def _heavy_table(data: Analysis) -> str:
    if data.heavy_summary is None or data.heavy_summary.num_rows == 0:
        return ""
    head = "<tr><th>tier</th><th>label</th><th>heavy</th><th>of</th><th>median ms</th><th>max ms</th></tr>"
    rows = "".join(
        f"<tr><td>{html.escape(str(r['tier']))}</td><td>{html.escape(str(r['label']))}</td><td>{r['heavy']}</td>"
        f"<td>{r['requests']}</td><td>{r['median_ms']:.2f}</td><td>{r['max_ms']:.1f}</td></tr>"
        for r in data.heavy_summary.to_pylist()[:20]
    )
    return f'<table class="facts">{head}{rows}</table>'


def _levels(data: Analysis) -> list[float]:
    users = {
        float(u)
        for bb in data.blackbox.values()
        if "users" in bb.curve.column_names
        for u in bb.curve.column("users").to_pylist()
        if u is not None
    }
    users |= {float(p.users) for p in data.points if p.users is not None}
    return sorted(users)


def _config_rows(data: Analysis) -> list[tuple[str, str]]:
    """What is known about the run, one (name, value) a row."""
    rows: list[tuple[str, str]] = []
    if data.fine_point:
        rows.append(("analysed point", data.fine_point))
    rows.append(("window", f"{data.window_ns / 1e6:g} ms"))
    if data.blackbox:
        names = [label_of(data, c) for c in data.blackbox]
        rows.append(("configurations", ("; " if any("," in n for n in names) else ", ").join(names)))
    levels = _levels(data)
    if levels:
        rows.append(("workload levels", ", ".join(f"{u:g}" for u in levels) + " users"))
    if data.points:
        rows.append(("points", str(len(data.points))))
    if data.imported is not None:
        rows.append(("imported", data.imported.summary()))
    elif data.requests is not None:
        tiers = (
            sorted({t for t in data.requests.column("tier").to_pylist() if t is not None})
            if "tier" in data.requests.column_names
            else []
        )
        rows.append(("requests", f"{data.requests.num_rows} at {len(tiers)} tier(s) {', '.join(tiers)}".rstrip()))
    return rows


def _config_html(data: Analysis) -> str:
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in _config_rows(data))
    return f'<section id="configuration"><h2>What was analysed</h2><table class="facts">{body}</table></section>'


def _json_for_script(text: str) -> str:
    """JSON that cannot close its <script> element ("<" appears in JSON only inside strings)."""
    return text.replace("<", "\\u003c")


class _Figures:
    """Figures as JSON in the page, their Plotly templates written once (shared by all figures)."""

    def __init__(self) -> None:
        self.templates: dict[str, str] = {}

    def embed(self, fig: go.Figure, div_id: str) -> str:
        d = fig.to_dict()
        layout = d.get("layout", {})
        template = layout.pop("template", None)
        if template is not None:
            text = to_json_plotly(template)
            key = "t" + hashlib.sha1(text.encode()).hexdigest()[:10]
            self.templates.setdefault(key, text)
            layout["template"] = key
        height = layout.get("height")
        spec = _json_for_script(to_json_plotly({"data": d.get("data", []), "layout": layout}))
        style = f' style="height:{int(height)}px"' if isinstance(height, (int, float)) else ""
        return (
            f'<div id="{div_id}" class="plot"{style}></div>'
            f'<script type="application/json" class="tierscope-figure" data-div="{div_id}">{spec}</script>'
        )

    def script(self) -> str:
        """The one script that draws every figure: `tierscopeDraw()`."""
        templates = ",".join(f'"{k}":{_json_for_script(v)}' for k, v in self.templates.items())
        return (
            "<script>var TIERSCOPE_TEMPLATES={" + templates + "};"
            "function tierscopeDraw(){var C=" + json.dumps(PLOT_CONFIG) + ";"
            "document.querySelectorAll('script.tierscope-figure').forEach(function(s){"
            "var f=JSON.parse(s.textContent),t=f.layout.template;"
            "if(typeof t==='string'&&t in TIERSCOPE_TEMPLATES)"
            "f.layout.template=JSON.parse(JSON.stringify(TIERSCOPE_TEMPLATES[t]));"
            "Plotly.newPlot(s.getAttribute('data-div'),f.data,f.layout,C);});}</script>"
        )


def _plotlyjs(compress: bool) -> tuple[str, str]:
    """(what goes in <head>, what draws the figures at the end of <body>)."""
    js = plotly.offline.get_plotlyjs()
    if not compress:
        return f'<script type="text/javascript">{js}</script>', "<script>tierscopeDraw();</script>"
    packed = base64.b64encode(gzip.compress(js.encode("utf-8"), 9, mtime=0)).decode("ascii")
    unpack = (
        "<script>(function(){var why='this browser cannot unpack the inlined plotly.js (it needs "
        "DecompressionStream: Chrome 80, Firefox 113, Safari 16.4 or later); write the report with "
        "compress_js=False';"
        "function fail(e){document.querySelectorAll('div.plot').forEach(function(d){d.textContent=why+"
        "(e?' ('+e+')':'');});}"
        "if(typeof DecompressionStream==='undefined'){fail();return;}"
        "var b=atob(document.getElementById('plotlyjs-gz').textContent.trim()),u=new Uint8Array(b.length);"
        "for(var i=0;i<b.length;i++)u[i]=b.charCodeAt(i);"
        "new Response(new Blob([u]).stream().pipeThrough(new DecompressionStream('gzip'))).text()"
        ".then(function(code){var s=document.createElement('script');s.text=code;document.head.appendChild(s);"
        "tierscopeDraw();}).catch(fail);})();</script>"
    )
    return (f'<script type="application/octet-stream" id="plotlyjs-gz">{packed}</script>', unpack)


def render_html(
    data: Analysis, summary: Summary | None = None, *, compress_js: bool = False, finding: Finding | None = None
) -> str:
    """The report as one HTML string (Plotly inlined once; gzipped with `compress_js`, see the
    module docstring); with `finding` (a shipped study's, `tierscope.studies.finding_of`), its
    section after the summary."""
    summary = summary or build_summary(data)
    parts, missing = [], []
    embedded = _Figures()
    for sid, title, words, build, why in SECTIONS:
        try:
            fig = build(data)
        except Exception as err:  # one broken figure must not lose the rest of the report
            fig, why = None, f"could not be drawn ({err.__class__.__name__}: {err})"
        if fig is None:
            missing.append((title, why))
            continue
        body = embedded.embed(fig, f"fig-{sid}")
        extra = _heavy_table(data) if sid == "heavy" else ""
        parts.append(
            f'<section id="{sid}"><h2>{html.escape(title)}</h2><p>{html.escape(words)}</p>{body}{extra}</section>'
        )
    notes = "".join(f"<li><b>{html.escape(t)}</b>: {html.escape(w)}</li>" for t, w in missing)
    notes += "".join(f"<li>{html.escape(n)}</li>" for n in data.notes)
    omitted = f'<section id="omitted"><h2>Not shown</h2><ul class="note">{notes}</ul></section>' if notes else ""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")

    head_js, draw = _plotlyjs(compress_js)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>tierscope report: {html.escape(data.title)}</title><style>{_CSS}</style>"
        f"{head_js}</head><body>"
        f"<h1>tierscope report: {html.escape(data.title)}</h1>"
        f'<p class="meta">tierscope {__version__}, {when}; window {data.window_ns / 1e6:g} ms</p>'
        f"{_summary_html(summary)}{_finding_html(finding)}{_config_html(data)}{''.join(parts)}{omitted}"
        f"{embedded.script()}{draw}</body></html>"
    )


def write_report(
    data: Analysis,
    path: str | Path,
    summary: Summary | None = None,
    *,
    compress_js: bool = False,
    finding: Finding | None = None,
) -> Path:
    """Write the HTML report to `path` (parent directories created); `compress_js`, `finding`: see
    render_html."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(data, summary, compress_js=compress_js, finding=finding), encoding="utf-8")
    return path


def _table_html(heads: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in heads)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="figures"><tr>{head}</tr>{body}</table>'


def render_study_page(
    title: str,
    finding: Finding | None,
    tables: list[tuple[str, list[str], list[list[str]]]],
    notes: Sequence[str] = (),
) -> str:
    """The report of a study whose runner is not the experiment runner (seed 003's log service,
    seed 002's scaling runner): its finding as `render_html` shows one, then each (caption,
    headings, rows) table and the notes. No figures, no JavaScript."""

    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = "".join(
        f"<section><h2>{html.escape(caption)}</h2>{_table_html(heads, rows)}</section>"
        for caption, heads, rows in tables
    )
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    noted = f'<section id="notes"><h2>Notes</h2><ul class="note">{items}</ul></section>' if items else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>tierscope report: {html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>tierscope report: {html.escape(title)}</h1>"
        f'<p class="meta">tierscope {__version__}, {when}</p>'
        f"{_finding_html(finding)}{parts}{noted}</body></html>"
    )


def write_study_page(
    path: str | Path,
    title: str,
    finding: Finding | None,
    tables: list[tuple[str, list[str], list[list[str]]]],
    notes: Sequence[str] = (),
) -> Path:
    """Write `render_study_page` to `path` (parent directories created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_study_page(title, finding, tables, notes), encoding="utf-8")
    return path
