"""The report's figures (Plotly). Each builder returns a figure, or None when it has no data.

Long series are thinned for the page (at most `MAX_POINTS` per trace): windows are merged in
groups keeping the maximum load (a spike stays visible) and the mean throughput. Plain SVG traces
(no WebGL) so the page renders anywhere, headless browsers included.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly
import plotly.graph_objects as go
import pyarrow as pa
import pyarrow.compute as pc
from plotly.subplots import make_subplots

from tierscope.report.data import ReportData

MAX_POINTS = 3000
LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=40, b=40), legend=dict(orientation="h", y=-0.15))


def _np(table: pa.Table, column: str) -> np.ndarray:
    return np.asarray(table.column(column).to_numpy(zero_copy_only=False))


def _thin(x: np.ndarray, *ys: tuple[np.ndarray, str]) -> tuple[np.ndarray, ...]:
    """Merge consecutive points in groups so at most MAX_POINTS remain (max or mean per group)."""
    n = len(x)
    if n <= MAX_POINTS:
        return (x, *[y for y, _ in ys])
    k = int(np.ceil(n / MAX_POINTS))
    m = n // k * k
    out = [x[:m:k]]
    for y, how in ys:
        block = y[:m].astype(float).reshape(-1, k)
        out.append(block.max(axis=1) if how == "max" else block.mean(axis=1))
    return tuple(out)


def _series(data: ReportData) -> pa.Table | None:
    series = getattr(data.fine, "series", None) if data.fine is not None else None
    return series if isinstance(series, pa.Table) and series.num_rows else None


def _servers(series: pa.Table) -> list[tuple[str, str]]:
    pairs = set(zip(series.column("tier").to_pylist(), series.column("server").to_pylist()))
    return sorted(pairs)


def timeline(data: ReportData) -> go.Figure | None:
    """Load and throughput of every server on one time axis."""
    series = _series(data)
    if series is None:
        return None
    t0 = pc.min(series.column("window_start_ns")).as_py()
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("load (mean requests in the server)", "throughput (completions/s)"))
    palette = plotly.colors.qualitative.Plotly
    for i, (tier, server) in enumerate(_servers(series)):
        s = series.filter(pc.and_(pc.equal(series.column("tier"), tier), pc.equal(series.column("server"), server)))
        s = s.sort_by("window_start_ns")
        x = (_np(s, "window_start_ns") - t0) / 1e9
        x, load, thr = _thin(x, (_np(s, "load"), "max"), (_np(s, "throughput"), "mean"))
        name = server if server == tier else f"{tier}/{server}"
        line = {"color": palette[i % len(palette)]}  # one color per server in both panels
        fig.add_trace(go.Scatter(x=x, y=load, mode="lines", name=name, legendgroup=name, line=line), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=thr, mode="lines", name=name, legendgroup=name, showlegend=False, line=line),
                      row=2, col=1)
    fig.update_xaxes(title_text="seconds since the first window", row=2, col=1)
    fig.update_layout(height=560, **LAYOUT)
    return fig


def _n_star_for(fine: Any, tier: str, server: str) -> Any:
    stars = getattr(fine, "n_star", {}) or {}
    return stars.get(server) or stars.get(tier) or stars.get(f"{tier}/{server}")


def main_sequence(data: ReportData) -> go.Figure | None:
    """Per server: throughput against load per window, with the saturation point N*."""
    series = _series(data)
    if series is None:
        return None
    servers = _servers(series)
    cols = min(3, len(servers))
    rows = int(np.ceil(len(servers) / cols))
    titles = []
    for tier, server in servers:
        ns = _n_star_for(data.fine, tier, server)
        value = getattr(ns, "n_star", None)
        finite = isinstance(value, (int, float)) and np.isfinite(value)
        titles.append(f"{server}" + (f" — N* = {value:.1f}" if finite else " — no N* (not saturated)"))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.07, vertical_spacing=0.15)
    rng = np.random.default_rng(0)
    for i, (tier, server) in enumerate(servers):
        r, c = i // cols + 1, i % cols + 1
        s = series.filter(pc.and_(pc.equal(series.column("tier"), tier), pc.equal(series.column("server"), server)))
        load, thr = _np(s, "load"), _np(s, "throughput")
        if len(load) > MAX_POINTS:
            keep = rng.choice(len(load), MAX_POINTS, replace=False)
            load, thr = load[keep], thr[keep]
        sat = None
        if "saturated" in s.column_names:
            sat = np.asarray(s.column("saturated").fill_null(False).to_numpy(zero_copy_only=False), bool)
            if len(sat) > MAX_POINTS:
                sat = sat[keep]
        colour = np.where(sat, "#d62728", "#1f77b4") if sat is not None else "#1f77b4"
        fig.add_trace(go.Scatter(x=load, y=thr, mode="markers", marker=dict(size=4, color=colour, opacity=0.5),
                                 name=server, showlegend=False), row=r, col=c)
        ns = _n_star_for(data.fine, tier, server)
        value = getattr(ns, "n_star", None)
        if isinstance(value, (int, float)) and np.isfinite(value):
            fig.add_vline(x=value, line_dash="dash", line_color="#d62728", row=r, col=c)
        fig.update_xaxes(title_text="load", row=r, col=c)
        fig.update_yaxes(title_text="throughput /s", row=r, col=c)
    fig.update_layout(height=320 * rows, **LAYOUT)
    return fig


def saturation_strip(data: ReportData) -> go.Figure | None:
    """One row per tier: the share of its servers saturated in each window (red = saturated)."""
    series = _series(data)
    if series is None or "saturated" not in series.column_names:
        return None
    t0 = pc.min(series.column("window_start_ns")).as_py()
    w = data.window_ns
    starts = _np(series, "window_start_ns")
    idx = ((starts - t0) // w).astype(np.int64)
    n = int(idx.max()) + 1
    tiers = sorted(set(series.column("tier").to_pylist()))
    tier_col = np.asarray(series.column("tier").to_pylist())
    sat = np.asarray(series.column("saturated").fill_null(False).to_numpy(zero_copy_only=False), float)
    z = []
    for tier in tiers:
        m = tier_col == tier
        total = np.bincount(idx[m], minlength=n)
        hits = np.bincount(idx[m], weights=sat[m], minlength=n)
        z.append(np.divide(hits, total, out=np.zeros(n), where=total > 0))
    labels = list(tiers)
    truth = data.truth
    if truth is not None and truth.num_rows and {"tier", "start_ns", "end_ns"} <= set(truth.column_names):
        # the simulator's ground truth under each tier: the share of each window it was saturated
        for tier in sorted(set(truth.column("tier").to_pylist())):
            rows = truth.filter(pc.equal(truth.column("tier"), tier))
            cover = np.zeros(n)
            for s0, e0 in zip(_np(rows, "start_ns") - t0, _np(rows, "end_ns") - t0):
                for k in range(max(int(s0 // w), 0), min(int(e0 // w), n - 1) + 1):
                    cover[k] += max(0, min(e0, (k + 1) * w) - max(s0, k * w)) / w
            z.append(np.minimum(cover, 1.0))
            labels.append(f"{tier} (truth)")
    order = sorted(range(len(labels)), key=lambda i: (labels[i].replace(" (truth)", ""), "(truth)" not in labels[i]))
    labels = [labels[i] for i in order]  # each tier's truth row just below its own row
    z = [z[i] for i in order]
    x = np.arange(n) * w / 1e9
    thinned = [_thin(x, (row, "max")) for row in z]
    x = thinned[0][0]
    z = [t[1] for t in thinned]
    fig = go.Figure(go.Heatmap(z=z, x=x, y=labels, zmin=0, zmax=1, colorscale=[[0, "#f4f4f4"], [1, "#d62728"]],
                               colorbar=dict(title="saturated")))
    fig.update_layout(height=120 + 50 * len(labels), xaxis_title="seconds since the first window", **LAYOUT)
    return fig


def correlation_matrix(data: ReportData) -> go.Figure | None:
    """Pearson correlation of the tiers' loads per window: inclusive and exclusive of downstream waits."""
    pairs = getattr(data.fine, "pairs", None) if data.fine is not None else None
    if not isinstance(pairs, pa.Table) or pairs.num_rows == 0:
        return None
    rows = pairs.to_pylist()
    tiers = sorted({r["tier_a"] for r in rows} | {r["tier_b"] for r in rows})
    pos = {t: i for i, t in enumerate(tiers)}
    fig = make_subplots(rows=1, cols=2, subplot_titles=("inclusive load", "exclusive load"), horizontal_spacing=0.12)
    for col, key in ((1, "corr_inclusive"), (2, "corr_exclusive")):
        z = np.eye(len(tiers))
        for r in rows:
            v = r.get(key)
            v = np.nan if v is None else v
            z[pos[r["tier_a"]], pos[r["tier_b"]]] = z[pos[r["tier_b"]], pos[r["tier_a"]]] = v
        text = [[("" if np.isnan(v) else f"{v:.2f}") for v in row] for row in z]
        fig.add_trace(go.Heatmap(z=z, x=tiers, y=tiers, zmin=-1, zmax=1, colorscale="RdBu", reversescale=True,
                                 text=text, texttemplate="%{text}", showscale=col == 2), row=1, col=col)
    fig.update_layout(height=380, **LAYOUT)
    return fig


def load_curve(data: ReportData) -> go.Figure | None:
    """Throughput and 90th-percentile response time against users, with the knee."""
    if not any(bb.curve.num_rows >= 2 for bb in data.blackbox.values()):
        return None
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for config, bb in data.blackbox.items():
        c = bb.curve
        users = _np(c, "users")
        tag = "" if len(data.blackbox) == 1 else f" {config}"
        fig.add_trace(go.Scatter(x=users, y=_np(c, "throughput"), mode="lines+markers", name=f"throughput{tag}"),
                      secondary_y=False)
        fig.add_trace(go.Scatter(x=users, y=_np(c, "rt_p90") * 1e3, mode="lines+markers", line=dict(dash="dot"),
                                 name=f"p90 response time{tag}"), secondary_y=True)
        if bb.knee is not None and (len(data.blackbox) == 1 or config == data.focus_config):
            fig.add_vline(x=bb.knee.users, line_dash="dash", line_color="#d62728",
                          annotation_text=f"knee {bb.knee.users:g}{tag}")
    fig.update_xaxes(title_text="users")
    fig.update_yaxes(title_text="throughput (requests/s)", secondary_y=False)
    fig.update_yaxes(title_text="p90 response time (ms)", secondary_y=True)
    fig.update_layout(height=420, **LAYOUT)
    return fig


def utilisation_density(data: ReportData, max_resources: int = 6) -> go.Figure | None:
    """Kernel density of each resource's utilisation (x) per workload level (y), as heatmaps."""
    config = data.focus_config if data.focus_config in data.whitebox else next(iter(data.whitebox), None)
    if config is None:
        return None
    wb = data.whitebox[config]
    if wb.density.num_rows == 0:
        return None
    best: dict[tuple[str, str], float] = {}
    for r in wb.shares.to_pylist():
        key = (r["host"], r["metric"])
        best[key] = max(best.get(key, 0.0), r["share_above"], (r["mean"] or 0) / 1000)
    chosen = sorted(best, key=lambda k: -best[k])[:max_resources]
    cols = min(2, len(chosen))
    rows = int(np.ceil(len(chosen) / cols))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"{h} {m}" for h, m in chosen],
                        vertical_spacing=0.18, horizontal_spacing=0.1)
    for i, (host, metric) in enumerate(chosen):
        d = wb.density.filter(pc.and_(pc.equal(wb.density.column("host"), host),
                                      pc.equal(wb.density.column("metric"), metric)))
        users = np.unique(_np(d, "users"))
        util = np.unique(_np(d, "util"))
        z = _np(d, "density").reshape(len(users), len(util))
        fig.add_trace(go.Heatmap(z=z, x=util, y=[f"{u:g}" for u in users], colorscale="Viridis",
                                 showscale=i == 0, colorbar=dict(title="density")),
                      row=i // cols + 1, col=i % cols + 1)
        fig.update_xaxes(title_text="utilisation %", row=i // cols + 1, col=i % cols + 1)
        fig.update_yaxes(title_text="users", type="category", row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(height=300 * rows + 60, **LAYOUT)
    return fig


def bottleneck_map_figure(data: ReportData) -> go.Figure | None:
    """Seed 000 Fig. 2/3: maximum throughput per configuration, coloured by group, named by bottleneck."""
    if data.bmap is None or data.bmap.num_rows == 0:
        return None
    rows = data.bmap.to_pylist()
    if all(r["app"] is not None and r["db"] is not None for r in rows):
        apps = sorted({r["app"] for r in rows})
        dbs = sorted({r["db"] for r in rows})
        z = np.full((len(apps), len(dbs)), np.nan)
        text = [["" for _ in dbs] for _ in apps]
        for r in rows:
            i, j = apps.index(r["app"]), dbs.index(r["db"])
            z[i, j] = r["max_throughput"]
            text[i][j] = f"{r['config']}<br>{r['max_throughput']:.0f}/s<br>{r['bottleneck'] or 'none'} (g{r['group']})"
        fig = go.Figure(go.Heatmap(z=z, x=[str(d) for d in dbs], y=[str(a) for a in apps], text=text,
                                   texttemplate="%{text}", colorscale="Blues", colorbar=dict(title="max X /s")))
        fig.update_xaxes(title_text="database servers", type="category")
        fig.update_yaxes(title_text="application servers", type="category")
    else:
        fig = go.Figure(go.Bar(x=[r["config"] for r in rows], y=[r["max_throughput"] for r in rows],
                               text=[f"{r['bottleneck'] or 'none'} (g{r['group']})" for r in rows]))
        fig.update_yaxes(title_text="maximum throughput (requests/s)")
    fig.update_layout(height=420, **LAYOUT)
    return fig


def heavy_figure(data: ReportData) -> go.Figure | None:
    """Heavy requests over time: when they happened and how slow (log scale)."""
    h = data.heavy
    if h is None or h.num_rows == 0:
        return None
    t0 = pc.min(data.requests.column("arrival_ns")).as_py() if data.requests is not None else pc.min(
        h.column("arrival_ns")).as_py()
    fig = go.Figure()
    labels = h.column("label").to_pylist()
    tiers = h.column("tier").to_pylist()
    x = (_np(h, "arrival_ns") - t0) / 1e9
    y = _np(h, "duration_ns") / 1e6
    for key in sorted(set(zip(tiers, labels))):
        m = np.array([(t, lab) == key for t, lab in zip(tiers, labels)])
        fig.add_trace(go.Scatter(x=x[m], y=y[m], mode="markers", name=f"{key[0]}: {key[1]}"[:60]))
    fig.update_yaxes(type="log", title_text="residence time (ms)")
    fig.update_xaxes(title_text="seconds since the first request")
    fig.update_layout(height=360, **LAYOUT)
    return fig
