"""The verdict in words (`analysis.summary.Summary`) for the terminal: the verdict line, the
per-level table, the configurations of a sweep, what to look at."""

from __future__ import annotations

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

from tierscope.analysis.study import label_of
from tierscope.analysis.summary import Summary


def rich_table(summary: Summary) -> Table:
    """The summary as a Rich table for the terminal."""
    table = Table(title="tierscope summary", show_header=False, expand=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("Bottleneck", escape(summary.headline))
    table.add_row("How sure", escape(summary.confidence))
    for i, line in enumerate(summary.look_at):
        table.add_row("Look at" if i == 0 else "", escape(line))
    for key, value in summary.facts:
        table.add_row(escape(key), escape(value))
    return table


def level_table(data) -> Table | None:
    """Per workload level of the focus configuration: users, throughput, p50/p90/p99 (ms), errors."""
    bb = data.blackbox.get(data.focus_config) if data.focus_config else next(iter(data.blackbox.values()), None)
    if bb is None or bb.curve.num_rows == 0:
        return None
    name = label_of(data, data.focus_config) if data.focus_config else "this system"
    table = Table(title=escape(f"workload levels ({name})"), expand=False)
    for name in ("users", "throughput/s", "p50 ms", "p90 ms", "p99 ms", "errors"):
        table.add_column(name, justify="right")
    for r in bb.curve.to_pylist():
        ms = [
            f"{r[k] * 1e3:.1f}" if r.get(k) is not None and r[k] == r[k] else "-"
            for k in ("rt_p50", "rt_p90", "rt_p99")
        ]
        table.add_row(f"{r['users']:g}", f"{r['throughput']:.1f}", *ms, str(r.get("errors", 0)))
    return table


def configuration_table(data) -> Table | None:
    """One row per configuration of a sweep (the bottleneck map), named by what differs between the
    configurations (`analysis.study.configuration_labels`): maximum throughput, the knee of
    its load curve, the most saturated resource at the maximum and every tier's saturated
    resources. None with fewer than two configurations."""
    bmap = getattr(data, "bmap", None)
    if bmap is None or bmap.num_rows < 2:
        return None
    table = Table(title="configurations (bottleneck map)", expand=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("configuration", "left"),
        ("max throughput/s", "right"),
        ("knee (users)", "right"),
        ("bottleneck", "left"),
        ("saturated", "left"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for r in bmap.to_pylist():
        bb = data.blackbox.get(r["config"])
        knee = f"{bb.knee.users:g}" if bb is not None and bb.knee is not None else "-"
        share = f" ({r['bottleneck_share']:.0%} of the time)" if r["bottleneck"] else ""
        table.add_row(
            escape(label_of(data, r["config"])),
            f"{r['max_throughput']:.1f}",
            knee,
            escape((r["bottleneck"] or "no saturated resource") + share),
            escape(r["saturated"] or "-"),
        )
    return table


def print_summary(summary: Summary, console: Console | None = None, verbose: bool = True, data=None) -> None:
    """The verdict line first; with `data`, the per-level table and the per-tier saturated shares;
    the rest (what to look at, the numbers behind it) when `verbose`."""
    console = console or Console()
    console.print(
        f"[bold]Bottleneck:[/bold] {escape(summary.headline)}  [bold]How sure:[/bold] {escape(summary.confidence)}",
        highlight=False,
    )
    if data is not None:
        configurations = configuration_table(data)
        if configurations is not None:
            console.print(configurations)
        levels = level_table(data)
        if levels is not None:
            console.print(levels)
        if data.fine is not None:
            shares = "  ".join(f"{t} {x:.0%}" for t, x in data.fine.saturated_share.items())
            console.print(
                f"saturated windows ({data.fine.window_ns / 1e6:g} ms): {shares}", highlight=False, markup=False
            )
    if verbose or data is None:
        console.print(rich_table(summary))
    elif summary.look_at:
        console.print(f"look at: {summary.look_at[0]}", highlight=False, markup=False)
