"""The report's figures (Plotly). Each builder returns a figure, or None when it has no data.

Long series are thinned for the page (at most `MAX_POINTS` per trace): windows are merged in
groups keeping the maximum load (a spike stays visible) and the mean throughput. Plain SVG traces
(no WebGL) so the page renders anywhere, headless browsers included.

Colours (`SeriesStyles`): each tier (or configuration) gets a hue family, each server of it a shade
of that family and a dash style; no two series of a figure share both colour and dash, however
many there are (after 8 families x 5 shades x 6 dashes, fresh colours are made up).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly
import plotly.graph_objects as go
import pyarrow as pa
import pyarrow.compute as pc
from plotly.subplots import make_subplots

from tierscope.analysis.experiment import Analysis
from tierscope.analysis.study import label_of
from tierscope.analysis.whitebox import two_grains

MAX_POINTS = 3000
MAX_BANDS = 500  # pause/stall bands drawn on the timeline (the longest ones when there are more)
SATURATED = "#d62728"
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def _family(name: str) -> tuple[str, ...]:
    """Five shades of a ColorBrewer sequence, ordered so that neighbours contrast (dark, mid, ...)."""
    seq = getattr(plotly.colors.sequential, name)
    return tuple(seq[i] for i in (7, 5, 8, 6, 4))


#: one hue family per tier (or configuration), in order; red comes late (it means "saturated")
FAMILIES: tuple[tuple[str, ...], ...] = tuple(
    _family(n) for n in ("Blues", "Oranges", "Greens", "Purples", "Greys", "RdPu", "YlOrBr", "Reds")
)


class SeriesStyles:
    """Hands out (colour, dash) pairs, never the same pair twice: `take(family, shade, dash)` returns
    the asked shade of the family with the asked dash when free, else the next free shade of the
    family with that dash, else the next free (shade, dash) of the family, else a made-up colour."""

    def __init__(self) -> None:
        self.used: set[tuple[str, str]] = set()
        self._fresh = 0

    def take(self, family: int, shade: int = 0, dash: str = "solid") -> tuple[str, str]:
        fam = FAMILIES[family % len(FAMILIES)]
        n, dashes = len(fam), list(DASHES)
        first = dashes.index(dash) if dash in dashes else 0
        candidates = [(fam[(shade + k) % n], dash) for k in range(n)]
        candidates += [(fam[(shade + k) % n], dashes[(first + k) % len(dashes)]) for k in range(n * len(dashes))]
        candidates += [(c, d) for c in fam for d in dashes]
        for pair in candidates:
            if pair not in self.used:
                self.used.add(pair)
                return pair
        while True:  # every pair of the family is taken: a colour of its own (golden-angle hues)
            hue = (self._fresh * 137.508) % 360
            self._fresh += 1
            pair = (f"hsl({hue:.1f},{55 + self._fresh % 3 * 10}%,{35 + self._fresh % 4 * 8}%)", dash)
            if pair not in self.used:
                self.used.add(pair)
                return pair

    def servers(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, str]]:
        """(colour, dash) per (tier, server): a hue family per tier, and per server of the tier the
        next shade (5) and the next dash (6): pairs repeat within a tier only after 30 servers."""
        tiers = sorted({t for t, _ in pairs})
        seen: dict[str, int] = {}
        out = {}
        for tier, server in pairs:
            j = seen.get(tier, 0)
            seen[tier] = j + 1
            family = tiers.index(tier)
            # a tier that wraps round to a used family starts further along its shades and dashes
            j += 7 * (family // len(FAMILIES))
            out[(tier, server)] = self.take(family, j, DASHES[j % len(DASHES)])
        return out


def server_styles(pairs: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, str]]:
    """The (colour, dash) of every (tier, server), the same in every figure of a report."""
    return SeriesStyles().servers(sorted(pairs))


def series_name(tier: str, server: str) -> str:
    """The legend name of a server's series: "tier/server"."""
    return f"{tier}/{server}"


LAYOUT: dict[str, Any] = dict(
    template="plotly_white", margin=dict(l=60, r=20, t=40, b=40), legend=dict(orientation="h", y=-0.15)
)


def _np(table: pa.Table, column: str) -> np.ndarray:
    return np.asarray(table.column(column).to_numpy(zero_copy_only=False))


def _f4(a: np.ndarray) -> np.ndarray:
    """Single precision for the page (7 digits are plenty on a screen; half the bytes)."""
    return np.asarray(a, np.float32)


def _x(x: np.ndarray) -> dict:
    """The x of a trace: x0 and dx when evenly spaced (no array on the page), else the array."""
    if len(x) >= 3:
        step = np.diff(x.astype(float))
        if step[0] > 0 and np.allclose(step, step[0], rtol=1e-9, atol=1e-9 * abs(step[0])):
            return {"x0": float(x[0]), "dx": float(step[0])}
    return {"x": _f4(x)}


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


def _series(data: Analysis) -> pa.Table | None:
    series = getattr(data.fine, "series", None) if data.fine is not None else None
    return series if isinstance(series, pa.Table) and series.num_rows else None


def _servers(series: pa.Table) -> list[tuple[str, str]]:
    pairs = set(zip(series.column("tier").to_pylist(), series.column("server").to_pylist()))
    return sorted(pairs)


def timeline(data: Analysis) -> go.Figure | None:
    """Load and throughput of every server on one time axis; pauses and stalls as shaded bands."""
    series = _series(data)
    if series is None:
        return None
    t0 = pc.min(series.column("window_start_ns")).as_py()
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=("load (mean requests in the server)", "throughput (completions/s)"),
    )
    servers = _servers(series)
    styles = server_styles(servers)
    top = 0.0
    for tier, server in servers:
        s = series.filter(pc.and_(pc.equal(series.column("tier"), tier), pc.equal(series.column("server"), server)))
        s = s.sort_by("window_start_ns")
        x = (_np(s, "window_start_ns") - t0) / 1e9
        x, load, thr = _thin(x, (_np(s, "load"), "max"), (_np(s, "throughput"), "mean"))
        xs, load, thr = _x(x), _f4(load), _f4(thr)
        top = max(top, float(np.nanmax(load)) if len(load) else 0.0)
        name = series_name(tier, server)
        colour, dash = styles[(tier, server)]
        line = {"color": colour, "dash": dash, "width": 1.5}  # one style per server in both panels
        fig.add_trace(go.Scatter(**xs, y=load, mode="lines", name=name, legendgroup=name, line=line), row=1, col=1)
        fig.add_trace(
            go.Scatter(**xs, y=thr, mode="lines", name=name, legendgroup=name, showlegend=False, line=line),
            row=2,
            col=1,
        )
    bands, total = pause_bands(data, series)
    title = None
    if bands:
        shapes = []
        for b in bands:
            colour = styles.get((b["tier"], b["server"]), ("#7f7f7f", ""))[0]
            shapes.append(
                dict(
                    type="rect",
                    xref="x",
                    yref="paper",
                    x0=(b["start_ns"] - t0) / 1e9,
                    x1=(b["end_ns"] - t0) / 1e9,
                    y0=0,
                    y1=1,
                    fillcolor=colour,
                    opacity=0.18,
                    line_width=0,
                    layer="below",
                    name=f"{b['kind']} {series_name(b['tier'], b['server'])}",
                )
            )
        fig.update_layout(shapes=shapes)
        # shapes have no hover: a mark above each band carries its text
        mid = np.array([(b["start_ns"] + b["end_ns"]) / 2 - t0 for b in bands]) / 1e9
        fig.add_trace(
            go.Scatter(
                x=mid,
                y=np.full(len(bands), top * 1.05 if top > 0 else 1.0),
                mode="markers",
                marker=dict(symbol="triangle-down", size=8, color="#555"),
                hovertext=[b["text"] for b in bands],
                hoverinfo="text",
                name="pauses and stalls (shaded)",
            ),
            row=1,
            col=1,
        )
        kinds = sorted({b["kind"] for b in bands}, key=lambda k: k != "stall")
        what = " and ".join(f"{k}s" for k in kinds)
        title = (
            f"Shaded: the {len(bands)} longest of {total} {what} (at most {MAX_BANDS} drawn)"
            if total > len(bands)
            else f"Shaded: {total} {what} (hover the marks above the bands)"
        )
    fig.update_xaxes(title_text="seconds since the first window", row=2, col=1)
    layout = dict(LAYOUT)
    if title:
        layout["margin"] = dict(LAYOUT["margin"], t=70)
        layout["title"] = dict(text=title, font=dict(size=13))
    fig.update_layout(height=560, **layout)
    return fig


def pause_bands(data: Analysis, series: pa.Table | None = None) -> tuple[list[dict], int]:
    """The stalls (`Analysis.stalls`: requests held by a stopped server) and the pauses the
    fine-grained analysis saw (windows of a server with a pause ratio above 0, consecutive ones
    merged), each a dict kind, tier, server, start_ns, end_ns, text; the `MAX_BANDS` longest (in
    time order) and how many there were."""
    bands: list[dict] = []
    st = data.stalls
    if isinstance(st, pa.Table) and st.num_rows and {"server", "start_ns"} <= set(st.column_names):
        rows = st.to_pylist()
        for r in rows:
            start = int(r["start_ns"])
            end = int(r["end_ns"]) if r.get("end_ns") is not None else start + int(r.get("duration_ns") or 0)
            tier = r.get("tier") or r["server"]
            text = f"{series_name(tier, r['server'])} stalled for {(end - start) / 1e6:.0f} ms"
            if r.get("requests") is not None:
                text += f", holding {r['requests']} request(s)"
            if r.get("labels"):
                text += f" ({r['labels']})"
            bands.append(dict(kind="stall", tier=tier, server=r["server"], start_ns=start, end_ns=end, text=text))
    series = series if series is not None else _series(data)
    if series is not None and "pause_ratio" in series.column_names:
        w = data.window_ns
        paused = series.filter(pc.greater(series.column("pause_ratio"), 0))
        for tier, server in _servers(paused) if paused.num_rows else []:
            s = paused.filter(pc.and_(pc.equal(paused.column("tier"), tier), pc.equal(paused.column("server"), server)))
            s = s.sort_by("window_start_ns")
            starts, ratio = _np(s, "window_start_ns").astype(np.int64), _np(s, "pause_ratio")
            cut = np.flatnonzero(np.diff(starts) > w) + 1  # runs of consecutive windows
            stalled = [(x["start_ns"], x["end_ns"]) for x in bands if x["kind"] == "stall" and x["server"] == server]
            for a, b in zip(np.concatenate([[0], cut]), np.concatenate([cut, [len(starts)]])):
                a0, b0 = int(starts[a]), int(starts[b - 1]) + w
                if any(x0 < b0 and a0 < x1 for x0, x1 in stalled):
                    continue  # the stall shows the same pause, to the ns
                ms = float(ratio[a:b].sum()) * w / 1e6
                bands.append(
                    dict(
                        kind="pause",
                        tier=tier,
                        server=server,
                        start_ns=a0,
                        end_ns=b0,
                        text=f"{series_name(tier, server)} paused for {ms:.0f} ms in "
                        f"{b - a} window(s) of {w / 1e6:g} ms",
                    )
                )
    total = len(bands)
    if total > MAX_BANDS:
        bands = sorted(bands, key=lambda b: b["start_ns"] - b["end_ns"])[:MAX_BANDS]
    return sorted(bands, key=lambda b: (b["start_ns"], b["server"])), total


def _n_star_for(fine: Any, tier: str, server: str) -> Any:
    stars = getattr(fine, "n_star", {}) or {}
    return stars.get(server) or stars.get(tier) or stars.get(f"{tier}/{server}")


def main_sequence(data: Analysis) -> go.Figure | None:
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
    styles = server_styles(servers)
    for i, (tier, server) in enumerate(servers):
        r, c = i // cols + 1, i % cols + 1
        s = series.filter(pc.and_(pc.equal(series.column("tier"), tier), pc.equal(series.column("server"), server)))
        load, thr = _np(s, "load"), _np(s, "throughput")
        keep = rng.choice(len(load), MAX_POINTS, replace=False) if len(load) > MAX_POINTS else None
        if keep is not None:
            load, thr = load[keep], thr[keep]
        sat = np.zeros(len(load), np.int8)
        if "saturated" in s.column_names:
            sat = np.asarray(s.column("saturated").fill_null(False).to_numpy(zero_copy_only=False), bool)
            sat = (sat[keep] if keep is not None else sat).astype(np.int8)
        colour, _dash = styles[(tier, server)]
        # the server's own colour, saturated windows red (0/1 through a two-colour scale: small on the page)
        marker = dict(size=4, opacity=0.5, color=sat, cmin=0, cmax=1, colorscale=[[0, colour], [1, SATURATED]])
        name = series_name(tier, server)
        fig.add_trace(
            go.Scatter(x=_f4(load), y=_f4(thr), mode="markers", marker=marker, name=name, legendgroup=name),
            row=r,
            col=c,
        )
        ns = _n_star_for(data.fine, tier, server)
        value = getattr(ns, "n_star", None)
        if isinstance(value, (int, float)) and np.isfinite(value):
            fig.add_vline(x=value, line_dash="dash", line_color=SATURATED, row=r, col=c)
        fig.update_xaxes(title_text="load", row=r, col=c)
        fig.update_yaxes(title_text="throughput /s", row=r, col=c)
    fig.update_layout(height=320 * rows, **LAYOUT)
    return fig


def saturation_strip(data: Analysis) -> go.Figure | None:
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
    fig = go.Figure(
        go.Heatmap(
            z=_f4(np.asarray(z)),
            **_x(x),
            y=labels,
            zmin=0,
            zmax=1,
            colorscale=[[0, "#f4f4f4"], [1, "#d62728"]],
            colorbar=dict(title="saturated"),
        )
    )
    fig.update_layout(height=120 + 50 * len(labels), xaxis_title="seconds since the first window", **LAYOUT)
    return fig


def correlation_matrix(data: Analysis) -> go.Figure | None:
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
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=tiers,
                y=tiers,
                zmin=-1,
                zmax=1,
                colorscale="RdBu",
                reversescale=True,
                text=text,
                texttemplate="%{text}",
                showscale=col == 2,
            ),
            row=1,
            col=col,
        )
    fig.update_layout(height=380, **LAYOUT)
    return fig


def load_curve(data: Analysis) -> go.Figure | None:
    """Against users: throughput (top); p50, p90 and p99 response time (bottom; p90 solid, p50 and
    p99 dashed) and, when any request failed, the error rate (% of requests, right axis); the knee."""
    if not any(bb.curve.num_rows >= 2 for bb in data.blackbox.values()):
        return None

    def col(c: pa.Table, name: str) -> np.ndarray | None:
        return _np(c, name).astype(float) if name in c.column_names else None

    errors_any = False
    for bb in data.blackbox.values():
        e = col(bb.curve, "errors")
        errors_any |= e is not None and "requests" in bb.curve.column_names and bool(np.nansum(e) > 0)
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        row_heights=[0.4, 0.6],
        specs=[[{}], [{"secondary_y": errors_any}]],
        subplot_titles=("throughput", "response time" + (" and error rate" if errors_any else "")),
    )
    styles = SeriesStyles()
    many = len(data.blackbox) > 1
    for k, (config, bb) in enumerate(data.blackbox.items()):
        c = bb.curve
        users = _np(c, "users")
        tag = f" {label_of(data, config)}" if many else ""
        colour, dash = styles.take(k, 0, "solid")
        fig.add_trace(
            go.Scatter(
                x=users,
                y=col(c, "throughput"),
                mode="lines+markers",
                name=f"throughput{tag}",
                legendgroup=config,
                line=dict(color=colour, dash=dash),
            ),
            row=1,
            col=1,
        )
        for q, shade, dash in (("p50", 4, "dash"), ("p90", 1, "solid"), ("p99", 2, "dash")):
            y = col(c, f"rt_{q}")
            if y is None:
                continue
            colour, dash = styles.take(k, shade, dash)
            fig.add_trace(
                go.Scatter(
                    x=users,
                    y=y * 1e3,
                    mode="lines+markers",
                    name=f"{q} response time{tag}",
                    legendgroup=config,
                    line=dict(color=colour, dash=dash),
                ),
                row=2,
                col=1,
                **({"secondary_y": False} if errors_any else {}),
            )
        e, n = col(c, "errors"), col(c, "requests")
        if errors_any and e is not None and n is not None:
            total = e + n  # `requests` counts the successful ones (analysis.blackbox.point_summary)
            rate = np.divide(e, total, out=np.full(len(e), np.nan), where=total > 0) * 100
            colour, dash = styles.take(k, 3, "dot")
            fig.add_trace(
                go.Scatter(
                    x=users,
                    y=rate,
                    mode="lines+markers",
                    name=f"error rate{tag}",
                    legendgroup=config,
                    marker=dict(symbol="x"),
                    line=dict(color=colour, dash=dash),
                    hovertemplate="%{y:.2f} % errors at %{x} users",
                ),
                row=2,
                col=1,
                secondary_y=True,
            )
        if bb.knee is not None and (not many or config == data.focus_config):
            fig.add_vline(
                x=bb.knee.users,
                line_dash="dash",
                line_color=SATURATED,
                row=1,
                col=1,
                annotation_text=f"knee {bb.knee.users:g}{tag}",
            )
            fig.add_vline(x=bb.knee.users, line_dash="dash", line_color=SATURATED, row=2, col=1)
    fig.update_xaxes(title_text="users", row=2, col=1)
    fig.update_yaxes(title_text="requests/s", row=1, col=1)
    if errors_any:
        fig.update_yaxes(title_text="response time (ms)", row=2, col=1, secondary_y=False)
        fig.update_yaxes(
            title_text="errors (% of requests)", row=2, col=1, secondary_y=True, rangemode="tozero", showgrid=False
        )
    else:
        fig.update_yaxes(title_text="response time (ms)", row=2, col=1)
    fig.update_layout(height=620, **LAYOUT)
    return fig


def utilisation_density(data: Analysis, max_resources: int = 6) -> go.Figure | None:
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
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[
            f"{h} {m}" + (f" ({label_of(data, config)})" if len(data.whitebox) > 1 else "") for h, m in chosen
        ],
        vertical_spacing=0.18,
        horizontal_spacing=0.1,
    )
    for i, (host, metric) in enumerate(chosen):
        d = wb.density.filter(
            pc.and_(pc.equal(wb.density.column("host"), host), pc.equal(wb.density.column("metric"), metric))
        )
        users = np.unique(_np(d, "users"))
        util = np.unique(_np(d, "util"))
        z = _np(d, "density").reshape(len(users), len(util))
        fig.add_trace(
            go.Heatmap(
                z=_f4(z),
                x=util,
                y=[f"{u:g}" for u in users],
                colorscale="Viridis",
                showscale=i == 0,
                colorbar=dict(title="density"),
            ),
            row=i // cols + 1,
            col=i % cols + 1,
        )
        fig.update_xaxes(title_text="utilisation %", row=i // cols + 1, col=i % cols + 1)
        fig.update_yaxes(title_text="users", type="category", row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(height=300 * rows + 60, **LAYOUT)
    return fig


def point_resources(data: Analysis) -> pa.Table | None:
    """The resources table of the analysed point: `Analysis.resources` when there is such a
    field, else the table of the point in `data.points` whose label is `data.fine_point` (as
    `analysis.experiment` computes it); None when neither is there (imported trace files)."""
    res = getattr(data, "resources", None)
    if isinstance(res, pa.Table):
        return res
    if data.fine_point is None:
        return None
    for p in data.points:
        label = f"{p.config + ' ' if p.config else ''}{p.name}" + (
            f" ({p.users:g} users)" if p.users is not None else ""
        )
        if label == data.fine_point and "resources" in p.tables:
            return p.tables["resources"]
    return None


def most_saturated_host(resources: pa.Table, coarse_ns: int = 1_000_000_000, threshold: float = 95.0) -> Any | None:
    """`analysis.whitebox.two_grains` of the host whose CPU samples are most often at or above
    `threshold` (the highest fine_share_above; ties: the highest mean), for the hosts sampled finer
    than `coarse_ns`; CPU is ``cpu_util``, else ``cpu`` (recorded, or derived from cpu_user and
    cpu_system). None when no host qualifies."""

    if (
        resources is None
        or resources.num_rows == 0
        or not {"ts_ns", "host", "metric", "value"} <= set(resources.column_names)
    ):
        return None
    best, key = None, None
    for host in sorted(set(resources.column("host").to_pylist())):
        rows = resources.filter(pc.equal(resources.column("host"), host))
        metrics = set(rows.column("metric").to_pylist())
        metric = "cpu_util" if "cpu_util" in metrics else "cpu" if metrics & {"cpu", "cpu_user"} else None
        if metric is None:
            continue
        try:
            g = two_grains(rows, host, metric=metric, coarse_ns=coarse_ns, threshold=threshold)
        except ValueError:  # fewer than two samples, or sampled at 1 s or coarser
            continue
        if g.fine_interval_ns >= coarse_ns:
            continue
        k = (g.fine_share_above, float(np.mean(_np(g.fine, "value"))) if g.fine.num_rows else 0.0)
        if key is None or k > key:
            best, key = g, k
    return best


def two_grains_figure(data: Analysis | pa.Table, threshold: float = 95.0) -> go.Figure | None:
    """Seed 001: the most saturated host's CPU at its sampling interval and re-aggregated to 1 s,
    the threshold dashed. `data`: a Analysis (its analysed point's resources) or a resources
    table. None without resources sampled finer than 1 s."""
    resources = data if isinstance(data, pa.Table) else point_resources(data)
    g = most_saturated_host(resources, threshold=threshold) if resources is not None else None
    if g is None:
        return None
    fine_ms = g.fine_interval_ns / 1e6
    origin = pc.min(g.fine.column("ts_ns")).as_py() - g.fine_interval_ns
    xf, yf = _thin((_np(g.fine, "ts_ns") - origin) / 1e9, (_np(g.fine, "value"), "max"))
    xc, yc = (_np(g.coarse, "ts_ns") - origin) / 1e9, _np(g.coarse, "value")
    # each sample is the mean over the interval ending at its time stamp: steps drawn leftwards ("vh")
    fig = go.Figure(
        [
            go.Scatter(
                x=xf,
                y=yf,
                mode="lines",
                line=dict(color="#6baed6", width=1, shape="vh"),
                name=f"{g.host} {g.metric} at {fine_ms:g} ms ({g.fine_share_above:.1%} of samples >= {threshold:g} %)",
            ),
            go.Scatter(
                x=xc,
                y=yc,
                mode="lines+markers",
                line=dict(color="#08306b", width=2.5, shape="vh"),
                name=f"the same at {g.coarse_interval_ns / 1e9:g} s "
                f"({g.coarse_share_above:.1%} of samples >= {threshold:g} %)",
            ),
        ]
    )
    fig.add_hline(y=threshold, line_dash="dash", line_color=SATURATED)
    fig.update_xaxes(title_text="seconds since the first sample")
    top = float(np.nanmax(yf)) if len(yf) else 100.0
    fig.update_yaxes(title_text=f"{g.metric} %", range=[0, 105] if top <= 100 else None)
    layout = dict(LAYOUT, margin=dict(LAYOUT["margin"], t=60))
    fig.update_layout(
        height=400, title=dict(text=f"{g.host} CPU at {fine_ms:g} ms and at {g.coarse_interval_ns / 1e9:g} s"), **layout
    )
    return fig


def bottleneck_map_figure(data: Analysis) -> go.Figure | None:
    """Seed 000 Fig. 2/3: maximum throughput per configuration, coloured by group, named by bottleneck."""
    if data.bmap is None or data.bmap.num_rows == 0:
        return None
    rows = data.bmap.to_pylist()
    cells = [(r["app"], r["db"]) for r in rows]
    # a grid of app x db servers only when each configuration has a cell of its own (a sweep of, say,
    # the database's memory has one topology: its configurations are bars)
    if all(a is not None and d is not None for a, d in cells) and len(set(cells)) == len(cells):
        apps = sorted({r["app"] for r in rows})
        dbs = sorted({r["db"] for r in rows})
        z = np.full((len(apps), len(dbs)), np.nan)
        text = [["" for _ in dbs] for _ in apps]
        for r in rows:
            i, j = apps.index(r["app"]), dbs.index(r["db"])
            z[i, j] = r["max_throughput"]
            text[i][j] = (
                f"{label_of(data, r['config'])}<br>{r['max_throughput']:.0f}/s<br>{r['bottleneck'] or 'none'} (g{r['group']})"
            )
        fig = go.Figure(
            go.Heatmap(
                z=z,
                x=[str(d) for d in dbs],
                y=[str(a) for a in apps],
                text=text,
                texttemplate="%{text}",
                colorscale="Blues",
                colorbar=dict(title="max X /s"),
            )
        )
        fig.update_xaxes(title_text="database servers", type="category")
        fig.update_yaxes(title_text="application servers", type="category")
    else:
        fig = go.Figure(
            go.Bar(
                x=[label_of(data, r["config"]) for r in rows],
                y=[r["max_throughput"] for r in rows],
                text=[f"{r['bottleneck'] or 'none'} (g{r['group']})" for r in rows],
            )
        )
        fig.update_yaxes(title_text="maximum throughput (requests/s)")
    fig.update_layout(height=420, **LAYOUT)
    return fig


def heavy_figure(data: Analysis) -> go.Figure | None:
    """Heavy requests over time: when they happened and how slow (log scale)."""
    h = data.heavy
    if h is None or h.num_rows == 0:
        return None
    t0 = (
        pc.min(data.requests.column("arrival_ns")).as_py()
        if data.requests is not None
        else pc.min(h.column("arrival_ns")).as_py()
    )
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
