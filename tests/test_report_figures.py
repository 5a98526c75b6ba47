"""The report's figures on hand-built Analysis: line styles, percentiles and error rate on the load
curve, pause/stall bands on the timeline, one host at two grains, the configuration table, and the
size of the page (plotly.js inlined once, plain or gzipped)."""

import contextlib
import re
import types

import numpy as np
import plotly.offline
import pyarrow as pa
import pytest

from tierscope.analysis.blackbox import BlackBox, Knee
from tierscope.analysis.experiment import Analysis
from tierscope.analysis.points import LazyTables, Point
from tierscope.analysis.summary import Summary
from tierscope.ingest import ImportResult
from tierscope.report import figures, render_html, write_report

S = 1_000_000_000
MS = 1_000_000
T0 = 1_763_800_000 * S
W = 50 * MS
SUMMARY = Summary(headline="hand-built", confidence="none")


def _series(servers: list[tuple[str, str]], n: int = 200, pause_at: dict | None = None) -> pa.Table:
    """A fine-grained series: per server, n windows of 50 ms with some load and throughput."""
    rng = np.random.default_rng(1)
    cols: dict[str, list] = {
        "tier": [],
        "server": [],
        "window_start_ns": [],
        "load": [],
        "throughput": [],
        "saturated": [],
        "pause_ratio": [],
    }
    for tier, server in servers:
        ratio = np.zeros(n)
        for k in (pause_at or {}).get(server, []):
            ratio[k] = 0.5
        cols["tier"] += [tier] * n
        cols["server"] += [server] * n
        cols["window_start_ns"] += [T0 + k * W for k in range(n)]
        cols["load"] += rng.uniform(0, 10, n).tolist()
        cols["throughput"] += rng.uniform(0, 500, n).tolist()
        cols["saturated"] += (rng.uniform(0, 1, n) > 0.8).tolist()
        cols["pause_ratio"] += ratio.tolist()
    return pa.table(cols)


def _fine(series: pa.Table) -> types.SimpleNamespace:
    return types.SimpleNamespace(series=series, n_star={}, pairs=None, pauses=None)


def _curve(errors: list[int] | None = None) -> pa.Table:
    users = [10.0, 50.0, 100.0, 150.0, 200.0]
    ok = [100, 500, 900, 1000, 1000]
    return pa.table(
        {
            "users": users,
            "requests": pa.array(ok, pa.int64()),
            "errors": pa.array(errors or [0] * len(users), pa.int64()),
            "seconds": [10.0] * 5,
            "throughput": [10.0, 50.0, 90.0, 100.0, 100.0],
            "rt_mean": [0.05, 0.05, 0.1, 0.5, 1.0],
            "rt_p50": [0.04, 0.04, 0.08, 0.4, 0.9],
            "rt_p90": [0.06, 0.07, 0.15, 0.7, 1.3],
            "rt_p99": [0.09, 0.1, 0.3, 1.2, 2.0],
        }
    )


def _blackbox(curve: pa.Table) -> BlackBox:
    return BlackBox(curve, Knee(users=100.0, method="kneedle", index=2, detail=""), 100.0, 150.0)


def _requests(n: int = 50) -> pa.Table:
    a = T0 + np.arange(n, dtype=np.int64) * 10 * MS
    return pa.table(
        {
            "tier": ["web"] * n + ["db"] * n,
            "server": ["web1"] * n + ["db1"] * n,
            "request_id": [f"r{i}" for i in range(2 * n)],
            "arrival_ns": np.concatenate([a, a + MS]),
            "departure_ns": np.concatenate([a + 5 * MS, a + 4 * MS]),
        }
    )


def _resources(interval_ns: int, seconds: int = 20) -> pa.Table:
    """db1: a 100 ms burst at 100 % in every second, idle otherwise; app1 at a steady 70 %."""
    n = seconds * S // interval_ns
    per_s = S // interval_ns
    db = np.zeros(n)
    for sec in range(seconds):
        db[sec * per_s : sec * per_s + max(1, per_s // 10)] = 100.0
    rows: dict[str, list] = {"ts_ns": [], "host": [], "metric": [], "value": [], "unit": []}
    for host, values in (("app1", np.full(n, 70.0)), ("db1", db)):
        rows["ts_ns"] += [T0 + (i + 1) * interval_ns for i in range(n)]
        rows["host"] += [host] * n
        rows["metric"] += ["cpu_util"] * n
        rows["value"] += values.tolist()
        rows["unit"] += ["percent"] * n
    return pa.table(rows)


# --- distinguishable lines ------------------------------------------------------------------------


def test_timeline_styles_unique_per_colour_and_dash_with_many_servers():
    """Twelve app servers and two db servers: every trace is named tier/server, servers of one tier
    share a hue family and differ by dash, and no (colour, dash) pair repeats (the old palette of
    ten solid colours repeated one)."""
    servers = [("app", f"app{i:02d}") for i in range(12)] + [("db", "db1"), ("db", "db2")]
    data = Analysis(title="t", fine=_fine(_series(servers, n=20)))
    fig = figures.timeline(data)
    load = [t for t in fig.data if t.xaxis == "x" and t.name != "pauses and stalls (shaded)"]
    assert sorted(t.name for t in load) == sorted(f"{t}/{s}" for t, s in servers)
    pairs = [(t.line.color, t.line.dash) for t in load]
    assert len(set(pairs)) == len(pairs) == 14
    app = [t for t in load if t.name.startswith("app/")]
    assert len({t.line.dash for t in app}) == len(figures.DASHES)  # dashes vary within a tier
    assert {t.line.color for t in app} <= set(figures.FAMILIES[0])  # one hue family per tier
    assert {t.line.color for t in load if t.name.startswith("db/")} <= set(figures.FAMILIES[1])
    # the throughput panel uses the same style and name as the load panel, per server
    thr = {t.name: (t.line.color, t.line.dash) for t in fig.data if t.xaxis == "x2"}
    assert thr == {t.name: (t.line.color, t.line.dash) for t in load}
    # the main sequence: the same names and colours
    ms = figures.main_sequence(data)
    assert {t.name: t.marker.colorscale[0][1] for t in ms.data} == {t.name: t.line.color for t in load}


def test_styles_never_repeat_even_past_the_palette():
    """More series than families x shades x dashes (nine tiers wrap round the eight families, one
    tier has 40 servers): still no repeated (colour, dash)."""
    pairs = [(f"t{k}", f"s{j}") for k in range(9) for j in range(6)] + [("big", f"b{j}") for j in range(40)]
    styles = figures.server_styles(pairs)
    assert len(set(styles.values())) == len(pairs)
    palette = figures.SeriesStyles()
    taken = [palette.take(0, 0, "solid") for _ in range(len(figures.FAMILIES[0]) * len(figures.DASHES) + 3)]
    assert len(set(taken)) == len(taken)


# --- load curve -----------------------------------------------------------------------------------


def test_load_curve_has_p50_p90_p99_and_no_error_axis_without_errors():
    data = Analysis(title="t", blackbox={"c1": _blackbox(_curve())})
    fig = figures.load_curve(data)
    rt = {t.name: t for t in fig.data if "response time" in t.name}
    assert set(rt) == {"p50 response time", "p90 response time", "p99 response time"}
    assert rt["p90 response time"].line.dash == "solid"
    assert rt["p50 response time"].line.dash == rt["p99 response time"].line.dash == "dash"
    np.testing.assert_allclose(rt["p99 response time"].y, [90, 100, 300, 1200, 2000])
    assert not any("error" in t.name for t in fig.data)
    assert "yaxis3" not in fig.layout.to_plotly_json()  # no secondary axis at all


def test_load_curve_error_rate_on_a_secondary_axis_when_requests_failed():
    """Errors at the two top levels: the error rate is errors over all requests (the curve's
    `requests` counts the successful ones), on the secondary axis of the response-time panel."""
    curves = {"c1": _blackbox(_curve([0, 0, 0, 250, 1000])), "c2": _blackbox(_curve())}
    fig = figures.load_curve(Analysis(title="t", blackbox=curves, focus_config="c1"))
    errors = [t for t in fig.data if t.name.startswith("error rate")]
    assert [t.name for t in errors] == ["error rate c1", "error rate c2"]
    np.testing.assert_allclose(errors[0].y, [0, 0, 0, 20, 50])
    axis = errors[0].yaxis
    assert axis != "y2" and all(t.yaxis == "y2" for t in fig.data if "response time" in t.name)
    layout = fig.layout.to_plotly_json()
    assert layout["yaxis" + axis[1:]]["title"]["text"] == "errors (% of requests)"
    assert layout["yaxis" + axis[1:]]["overlaying"] == "y2"
    pairs = [(t.line.color, t.line.dash) for t in fig.data]
    assert len(set(pairs)) == len(pairs)  # two configurations, nine traces, all distinguishable


# --- pause and stall bands ------------------------------------------------------------------------


def _stalls(n: int, server: str = "app1") -> pa.Table:
    start = T0 + np.arange(n, dtype=np.int64) * 20 * MS
    dur = (np.arange(n) % 7 + 1) * MS
    return pa.table(
        {
            "tier": ["app"] * n,
            "server": [server] * n,
            "start_ns": start,
            "end_ns": start + dur,
            "duration_ns": dur,
            "requests": [3] * n,
            "labels": ["q"] * n,
        }
    )


def test_timeline_draws_one_band_per_stall_with_hover_text():
    servers = [("app", "app1"), ("db", "db1")]
    data = Analysis(title="t", fine=_fine(_series(servers)), stalls=_stalls(7))
    fig = figures.timeline(data)
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(bands) == data.stalls.num_rows
    assert all(s.yref == "paper" and s.opacity < 0.5 for s in bands)
    assert bands[0].x0 == 0 and bands[0].x1 == pytest.approx(0.001)
    marks = next(t for t in fig.data if t.name == "pauses and stalls (shaded)")
    assert len(marks.hovertext) == 7 and marks.hovertext[0] == "app/app1 stalled for 1 ms, holding 3 request(s) (q)"
    assert "7 stalls" in fig.layout.title.text
    # no stalls, no pauses: no bands, no title
    quiet = figures.timeline(Analysis(title="t", fine=_fine(_series(servers))))
    assert not quiet.layout.shapes and quiet.layout.title.text is None


def test_timeline_pauses_from_the_series_and_the_cap():
    """Windows with a pause ratio give one band per run of consecutive windows; more than
    MAX_BANDS bands keep the longest and the title says so."""
    servers = [("app", "app1"), ("db", "db1")]
    data = Analysis(title="t", fine=_fine(_series(servers, pause_at={"db1": [10, 11, 12, 40]})))
    fig = figures.timeline(data)
    assert len(fig.layout.shapes) == 2 and "2 pauses" in fig.layout.title.text
    assert (fig.layout.shapes[0].x0, fig.layout.shapes[0].x1) == pytest.approx((0.5, 0.65))
    many = Analysis(title="t", fine=_fine(_series(servers, n=20)), stalls=_stalls(figures.MAX_BANDS + 100))
    fig = figures.timeline(many)
    assert len(fig.layout.shapes) == figures.MAX_BANDS
    assert f"the {figures.MAX_BANDS} longest of {figures.MAX_BANDS + 100} stalls" in fig.layout.title.text
    widths = sorted(s.x1 - s.x0 for s in fig.layout.shapes)
    assert widths[0] > 0.0011  # the 100 shortest (1 ms) left out


# --- one host at two grains -----------------------------------------------------------------------


def test_two_grains_figure_of_the_most_saturated_host():
    res = _resources(50 * MS)
    fig = figures.two_grains_figure(res)
    assert fig.layout.title.text == "db1 CPU at 50 ms and at 1 s"
    assert len(fig.data) == 2
    assert len(fig.data[0].x) == 400 and len(fig.data[1].x) == 20  # 20 s at 50 ms, and at 1 s
    assert max(fig.data[0].y) == 100 and max(fig.data[1].y) == pytest.approx(10)
    assert "10.0% of samples" in fig.data[0].name and "0.0% of samples" in fig.data[1].name
    # sampled at 1 s: nothing finer to show
    assert figures.two_grains_figure(_resources(S)) is None


def test_two_grains_from_the_analysed_point_of_a_report(tmp_path):
    """Analysis has no resources field: the analysed point is found among data.points by its
    label, and its resources table is used."""
    other, chosen = LazyTables(), LazyTables()
    other["resources"] = _resources(S)
    chosen["resources"] = _resources(100 * MS)
    points = [
        Point(tmp_path / "u10", "u10", users=10.0, config="c1", tables=other),
        Point(tmp_path / "u50", "u50", users=50.0, config="c1", tables=chosen),
    ]
    data = Analysis(title="t", points=points, fine_point="c1 u50 (50 users)")
    fig = figures.two_grains_figure(data)
    assert fig.layout.title.text == "db1 CPU at 100 ms and at 1 s" and len(fig.data[0].x) == 200
    data.fine_point = "c1 u10 (10 users)"
    assert figures.two_grains_figure(data) is None


# --- the page -------------------------------------------------------------------------------------


def test_configuration_table_for_a_run_and_for_imported_requests():
    data = Analysis(
        title="run",
        window_ns=20 * MS,
        blackbox={"1/1/0/1": _blackbox(_curve()), "1/1/0/2": _blackbox(_curve())},
        fine_point="1/1/0/1 u0100 (100 users)",
    )
    page = render_html(data, SUMMARY)
    table = re.search(r'<section id="configuration">(.*?)</section>', page).group(1)
    for text in (
        "What was analysed",
        "<td>analysed point</td><td>1/1/0/1 u0100 (100 users)</td>",
        "<td>window</td><td>20 ms</td>",
        "<td>configurations</td><td>1/1/0/1, 1/1/0/2</td>",
        "<td>workload levels</td><td>10, 50, 100, 150, 200 users</td>",
    ):
        assert text in table
    assert page.index('id="summary"') < page.index('id="configuration"') < page.index('id="load-curve"')
    # only requests (an imported trace): the table still renders, with what is known
    reqs = _requests()
    page = render_html(Analysis(title="trace", requests=reqs))
    assert "<td>requests</td><td>100 at 2 tier(s) db, web</td>" in page and "<td>window</td><td>50 ms</td>" in page
    imported = ImportResult(requests=reqs, skipped=2, skipped_at=["a.log:3 bad", "a.log:9 bad"])
    page = render_html(Analysis(title="trace", requests=reqs, imported=imported))
    assert "<td>imported</td><td>100 requests at 2 tier(s) db, web; skipped 2 malformed record(s)" in page


def _full(tmp_path) -> Analysis:
    servers = [("app", "app1"), ("db", "db1"), ("web", "web1")]
    chosen = LazyTables()
    chosen["resources"] = _resources(50 * MS)
    return Analysis(
        title="full",
        fine=_fine(_series(servers, n=3000)),
        stalls=_stalls(20),
        blackbox={"c1": _blackbox(_curve([0, 0, 0, 5, 50]))},
        fine_point="c1 u50 (50 users)",
        points=[Point(tmp_path / "u50", "u50", users=50.0, config="c1", tables=chosen)],
    )


# measured 2026-11-25 (plotly 7.1, plotly.js 4.1.1): the page of `_full` without plotly.js is 305 kB
# (803 kB before: plotly.py's to_html, double precision, x arrays, one template per figure, colour
# names per marker); plotly.js is 4.82 MB inlined as it is, 1.96 MB gzipped and base64-encoded
FIGURES_BOUND = 340_000
COMPRESSED_JS_BOUND = 2_000_000


def test_report_size(tmp_path):
    js = plotly.offline.get_plotlyjs()
    page = render_html(_full(tmp_path), SUMMARY)
    for sid in ("timeline", "main-sequence", "load-curve", "two-grains"):
        assert f'id="{sid}"' in page
    assert page.count(js[:300]) == 1 and page.count(js[-300:]) == 1  # the minified library, once
    figs = page.count('class="tierscope-figure"')
    assert figs >= 4 and len(re.findall(r'"template":"(t[0-9a-f]+)"', page)) == figs
    assert len(set(re.findall(r'"template":"(t[0-9a-f]+)"', page))) == 1  # one template, written once:
    assert page.count('"layout":{"annotationdefaults"') == 1
    assert len(page.encode()) - len(js.encode()) < FIGURES_BOUND
    packed = render_html(_full(tmp_path), SUMMARY, compress_js=True)
    assert js[:300] not in packed and not re.search(r"<script[^>]+src=", packed)
    assert len(packed.encode()) < COMPRESSED_JS_BOUND + FIGURES_BOUND


CHROMIUM = None
with contextlib.suppress(ImportError):  # run from elsewhere than tests/
    from test_report import CHROMIUM, dump_dom  # noqa: F811


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian package chromium)")
@pytest.mark.parametrize("compress", [False, True])
def test_report_draws_in_headless_chromium(tmp_path, compress):
    """Both ways of inlining plotly.js draw every figure (the gzipped one unpacks it first)."""
    path = write_report(_full(tmp_path), tmp_path / "r.html", SUMMARY, compress_js=compress)
    dom = dump_dom(path)
    sections = [s for s in re.findall(r'<section id="([a-z-]+)"><h2>', dom) if s not in ("configuration", "omitted")]
    assert len(sections) >= 4
    drawn = re.findall(r'<div id="fig-([a-z-]+)" class="plot[^"]*"[^>]*>\s*<div class="plot-container', dom)
    assert sorted(drawn) == sorted(sections)
    assert dom.count('class="main-svg"') >= len(sections)
    lines = re.findall(r'class="js-line"[^>]*d="M([^"]+)"', dom)
    assert len([d for d in lines if len(d) > 100]) >= 6
