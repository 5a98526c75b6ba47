"""The heavy-query case (seed 000 §4): read policies compared when a few reads are heavy.

Two PostgreSQL replicas hold the same data: a `small` table read by primary key (the light read,
well under a millisecond) and a `big` table searched the way RUBBoS's unoptimised comment search
is (`LIKE '%...%'` over every row, then a sort by date with an offset: a real CPU-heavy read of
~100-200 ms, no pg_sleep). The middleware keeps `pool` connections per replica (default 1: a replica
runs one query at a time and queues the others, in order: C-JDBC's per-backend connection pool as
the replica's capacity), so a light read routed to a replica running a heavy one waits for it.

Two pgbench processes (the peer; closed loop, fixed duration) run at once through the middleware:
`clients` clients each drawing, as often, the light read or a think-time script (one `\\sleep`
of `think_ms`), and `heavy_clients` clients sending the heavy read back to back (about 1 read in
30). The same load runs once per policy and repetition (interleaved), one middleware process each,
in one session. pgbench's per-transaction logs are the ground truth for the light reads'
percentiles and for throughput (think-time transactions are not counted); the middleware's stats
give the reads per replica and its 50 ms series of pending requests and heavy reads in flight per
replica. Optionally the replicas get a CFS quota (`cpu`, `period`) or a CPU each (`pin`).

Run: `python -m tierscope.studies.heavy` (needs root: PostgreSQL runs as the postgres user; the
middleware is `tierscope-engine middleware`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tierscope.contracts.middleware import POLICIES
from tierscope.services.base import Service, free_port
from tierscope.services.middleware import Middleware
from tierscope.services.postgres import Postgres, pg_bindir
from tierscope.spec import NodeType
from tierscope.testbed import cgroups
from tierscope.testbed.host import Host

DB = "heavy"
LIGHT_SQL = "\\set id random(1, 10000)\nSELECT v FROM small WHERE id = :id;\n"
#: like RUBBoS's search on old_comments that the optimiser cannot use an index for (seed 000 §4)
HEAVY_SQL = "SELECT id, subject, date FROM big WHERE subject LIKE '%indep%' ORDER BY date DESC LIMIT 25 OFFSET 25;\n"


def percentile(values: list[float], q: float) -> float:
    """The q-quantile by the nearest-rank method (the value below which q of the values lie)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 1)) - 1))
    return s[k]


def read_pgbench_logs(prefix: Path) -> list[tuple[int, float, float]]:
    """(script number, latency seconds, end time epoch seconds) of every transaction in pgbench's
    per-transaction logs `prefix.<pid>[.<thread>]` (format: client_id transaction_no time
    script_no time_epoch time_us)."""
    out = []
    for f in sorted(prefix.parent.glob(prefix.name + ".*")):
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) < 6:
                continue
            out.append((int(parts[3]), int(parts[2]) / 1e6, int(parts[4]) + int(parts[5]) / 1e6))
    return out


def summary(series: dict, names: list[str]) -> dict:
    """Imbalance in the 50 ms series: mean and largest pending per replica, the share of samples
    where the replicas' pending differ by 2 or more, the share where some replica runs a heavy
    read, and among those the share where a replica running heavy reads also has light reads
    pending (light reads behind or beside a heavy one)."""
    pend = [series["pending"][n] for n in names]
    heavy = [series["heavy"][n] for n in names]
    n = len(pend[0]) if pend else 0
    if n == 0:
        return {"samples": 0}
    uneven = sum(1 for k in range(n) if max(p[k] for p in pend) - min(p[k] for p in pend) >= 2)
    with_heavy = [k for k in range(n) if any(h[k] > 0 for h in heavy)]
    light_next = sum(1 for k in with_heavy if any(h[k] > 0 and p[k] > h[k] for p, h in zip(pend, heavy)))
    return {
        "samples": n,
        "mean_pending": [round(sum(p) / n, 2) for p in pend],
        "max_pending": [max(p) for p in pend],
        "uneven_share": round(uneven / n, 3),
        "heavy_share": round(len(with_heavy) / n, 3),
        "light_next_to_heavy_share": round(light_next / max(1, len(with_heavy)), 3),
    }


def run(
    policies: list[str],
    seconds: int = 5,
    clients: int = 6,
    heavy_clients: int = 2,
    cpu: float | None = None,
    rows: int = 300_000,
    pool: int = 1,
    repeat: int = 1,
    pin: bool = False,
    period: float = 0.02,
    think_ms: float = 10.0,
    log=print,
) -> dict:
    """Build the case, run every policy `repeat` times (interleaved), return the figures."""

    class LabelledMiddleware(Middleware):  # heavy reads per replica are kept under every policy
        def command(self) -> list[str]:
            return super().command() + ["--labels", "--series-interval", "0.05"]

    limited = pin or bool(cpu)
    reason = cgroups.unavailable_reason() if limited else None
    if reason:
        raise RuntimeError(f"replicas on CPUs of their own need cgroups: {reason}")
    cpus = cgroups.machine_cpus() if pin else []
    if pin and len(cpus) < 2:
        raise RuntimeError(f"replicas on CPUs of their own need 2 CPUs; this machine has {cpus}")
    bindir = pg_bindir()
    work = Path(tempfile.mkdtemp(prefix="tierscope-mw-heavy-"))
    top = f"{cgroups.TOP}/mwheavy-{os.getpid()}"
    hosts, pgs = [], []
    started: list[Service] = []
    results: dict = {
        "params": {
            "seconds": seconds,
            "clients": clients,
            "heavy_clients": heavy_clients,
            "cpu": cpu,
            "rows": rows,
            "pool": pool,
            "repeat": repeat,
            "pin": pin,
            "period": period,
            "think_ms": think_ms,
        },
        "runs": [],
    }
    try:
        for i in (1, 2):
            if limited:
                rel = f"{top}/db{i}"
                nt = NodeType(cpu=cpu or None, cpu_period=period, cpus=str(cpus[i - 1]) if pin else None)
                controllers = cgroups.create(rel, nt, work)
                hosts.append(Host(f"db{i}", cgroup=rel, controllers=controllers))
            else:
                hosts.append(Host.loopback(f"db{i}"))
        for i, h in enumerate(hosts, 1):
            p = Postgres(
                h,
                free_port(),
                work / f"db{i}",
                fsync=False,
                shared_buffers="64MB",
                max_connections=80,
                settings={"max_parallel_workers_per_gather": "0", "jit": "off", "work_mem": "'16MB'"},
                name=f"db{i}",
            )
            p.start()
            started.append(p)
            pgs.append(p)
            p.create_database(DB)
            p.sql("CREATE TABLE small (id int PRIMARY KEY, v text)", DB)
            p.sql("INSERT INTO small SELECT g, md5(g::text) FROM generate_series(1, 10000) g", DB)
            p.sql("CREATE TABLE big (id int PRIMARY KEY, subject text, date timestamptz, body text)", DB)
            p.sql(
                "INSERT INTO big SELECT g, md5(g::text) || ' ' || md5((g * 7)::text), "
                "'2026-01-01'::timestamptz + g * interval '1 minute', repeat(md5((g * 3)::text), 2) "
                f"FROM generate_series(1, {int(rows)}) g",
                DB,
            )
            p.sql("VACUUM ANALYZE", DB)
            p.sql("CHECKPOINT", DB, admin=True)  # the load's dirty pages written now, not during the runs
            t0 = time.perf_counter()
            p.sql(HEAVY_SQL.rstrip().rstrip(";"), DB)
            p.sql(HEAVY_SQL.rstrip().rstrip(";"), DB)
            results.setdefault("heavy_direct_ms", []).append(round(1e3 * (time.perf_counter() - t0) / 2, 1))
        where = f"CPUs {cpus[0]} and {cpus[1]}" if pin else "any CPU"
        quota = f"{cpu} cores per {period * 1e3:g} ms" if cpu else "no quota"
        log(
            f"replicas up on {where} ({quota} each, pool {pool}); the heavy read takes {results['heavy_direct_ms']} ms directly"
        )
        (work / "light.sql").write_text(LIGHT_SQL)
        (work / "heavy.sql").write_text(HEAVY_SQL)
        (work / "think.sql").write_text(f"\\sleep {int(think_ms * 1000)} us\n")
        lat_by_policy: dict[str, dict] = {}
        for rep in range(repeat):
            for policy in policies:
                name = f"mw-{policy}-{rep}"
                mw = LabelledMiddleware(
                    Host.loopback(name),
                    free_port(),
                    work / name,
                    backends=[p.address for p in pgs],
                    database=DB,
                    pool=pool,
                    policy=policy,
                    name=name,
                )
                mw.start()
                started.append(mw)
                runs = []
                try:
                    for kind, n, scripts in (
                        ("light", clients, ["light.sql@1"] + (["think.sql@1"] if think_ms else [])),
                        ("heavy", heavy_clients, ["heavy.sql"]),
                    ):
                        if n <= 0:
                            continue
                        argv = [
                            str(bindir / "pgbench"),
                            "-h",
                            mw.host.address,
                            "-p",
                            str(mw.port),
                            "-U",
                            mw.user,
                            "-n",
                            "-c",
                            str(n),
                            "-j",
                            str(min(2, n)),
                            "-T",
                            str(seconds),
                            "-M",
                            "extended",
                            *(a for sc in scripts for a in ("-f", str(work / sc))),
                            "-l",
                            "--log-prefix",
                            str(work / name / kind),
                            DB,
                        ]
                        runs.append(
                            (
                                kind,
                                subprocess.Popen(
                                    argv,
                                    stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE,
                                    text=True,
                                    cwd=work,
                                    env={**os.environ, "PGPASSWORD": mw.password},
                                ),
                            )
                        )
                    for kind, proc in runs:
                        try:
                            out, err = proc.communicate(timeout=seconds + 120)
                        except subprocess.TimeoutExpired:
                            proc.kill()
                            out, err = proc.communicate()
                        if proc.returncode != 0:
                            raise RuntimeError(f"pgbench ({kind}) through {policy} failed:\n{out}\n{err}")
                finally:
                    for _, proc in runs:
                        if proc.poll() is None:
                            proc.kill()
                            proc.wait()
                    mw.stop()
                    started.remove(mw)
                stats = mw.stats()
                light = [lat for sc, lat, _ in read_pgbench_logs(work / name / "light") if sc == 0]
                heavy = [lat for _, lat, _ in read_pgbench_logs(work / name / "heavy")]
                txs = light + heavy
                names = [b["name"] for b in stats["backends"]]
                r = {
                    "policy": policy,
                    "implementation": stats.get("implementation"),
                    "rep": rep,
                    "transactions": len(txs),
                    "tps": round(len(txs) / seconds, 1),
                    "light_tps": round(len(light) / seconds, 1),
                    "heavy_tps": round(len(heavy) / seconds, 2),
                    "light_p50_ms": round(1e3 * percentile(light, 0.5), 2),
                    "light_p90_ms": round(1e3 * percentile(light, 0.9), 2),
                    "light_p99_ms": round(1e3 * percentile(light, 0.99), 2),
                    "heavy_mean_ms": round(1e3 * sum(heavy) / max(1, len(heavy)), 1),
                    "reads": [b["reads"] for b in stats["backends"]],
                    "heavy_reads": [b["heavy_reads"] for b in stats["backends"]],
                    "middleware_reads": stats["reads"],
                    "pgbench_reads": len(light) + len(heavy),
                    "imbalance": summary(stats["series"], names),
                    "series": stats["series"],
                }
                results["runs"].append(r)
                pooled = lat_by_policy.setdefault(policy, {"light": [], "heavy": [], "runs": 0})
                pooled["light"] += light
                pooled["heavy"] += heavy
                pooled["runs"] += 1
                log(
                    f"{policy:6s} rep {rep}: {r['tps']:8.1f} tps ({r['light_tps']} light, {r['heavy_tps']} heavy/s), "
                    f"light p50 {r['light_p50_ms']} ms p90 {r['light_p90_ms']} ms p99 {r['light_p99_ms']} ms, "
                    f"heavy mean {r['heavy_mean_ms']} ms, reads {r['reads']}, heavy {r['heavy_reads']}, "
                    f"imbalance {r['imbalance']}"
                )
        # every repetition's transactions together, per policy
        results["policies"] = {
            policy: {
                "runs": x["runs"],
                "light": len(x["light"]),
                "heavy": len(x["heavy"]),
                "tps": round((len(x["light"]) + len(x["heavy"])) / (x["runs"] * seconds), 1),
                "light_tps": round(len(x["light"]) / (x["runs"] * seconds), 1),
                "light_p50_ms": round(1e3 * percentile(x["light"], 0.5), 2),
                "light_p90_ms": round(1e3 * percentile(x["light"], 0.9), 2),
                "light_p99_ms": round(1e3 * percentile(x["light"], 0.99), 2),
                "heavy_mean_ms": round(1e3 * sum(x["heavy"]) / max(1, len(x["heavy"])), 1),
            }
            for policy, x in lat_by_policy.items()
        }
    finally:
        for s in reversed(started):
            s.stop()
        for rel in (f"{top}/db1", f"{top}/db2", top) if limited else ():
            try:
                cgroups.remove(rel)
            except Exception as err:  # reported, the rest is still cleaned
                log(f"cannot remove cgroup {rel}: {err}")
        shutil.rmtree(work, ignore_errors=True)
    return results


def table(results: dict) -> str:
    """Every policy's figures (all its repetitions together) as a Markdown table."""
    lines = [
        "| policy | tps (light + heavy) | heavy/s | light p50 ms | light p90 ms | light p99 ms | heavy mean ms | "
        "samples with light reads next to a heavy one |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for policy, f in results["policies"].items():
        share = [r["imbalance"].get("light_next_to_heavy_share", 0) for r in results["runs"] if r["policy"] == policy]
        heavy_s = round(f["tps"] - f["light_tps"], 1)
        lines.append(
            f"| {policy} | {f['tps']} | {heavy_s} | {f['light_p50_ms']} | {f['light_p90_ms']} | "
            f"{f['light_p99_ms']} | {f['heavy_mean_ms']} | {' / '.join(f'{100 * x:.0f} %' for x in share)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tierscope.studies.heavy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated (default: all)")
    ap.add_argument("--seconds", type=int, default=5, help="pgbench duration per policy and repetition (default 5)")
    ap.add_argument("--clients", type=int, default=6, help="pgbench clients sending light reads (default 6)")
    ap.add_argument("--heavy-clients", type=int, default=2, help="pgbench clients sending heavy reads (default 2)")
    ap.add_argument("--cpu", type=float, default=0, help="cores per replica as a CFS quota (default 0: none)")
    ap.add_argument(
        "--period",
        type=float,
        default=0.02,
        help="the CFS period, s (default 0.02: a replica whose quota is spent waits at most 16 ms)",
    )
    ap.add_argument(
        "--think-ms",
        type=float,
        default=10.0,
        help="light clients think between reads: a pgbench script of one \\sleep this long, drawn as "
        "often as the read (0: none; default 10)",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="put each replica on a CPU of its own (cpuset: db1 on the first CPU, db2 on the second)",
    )
    ap.add_argument("--rows", type=int, default=300_000, help="rows of the big table (default 300000)")
    ap.add_argument(
        "--pool",
        type=int,
        default=1,
        help="middleware connections per replica: queries a replica runs at once (default 1)",
    )
    ap.add_argument("--repeat", type=int, default=2, help="runs per policy, interleaved (default 2)")
    ap.add_argument("--json", metavar="PATH", help="write every figure (series included) here")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        ap.error(f"--policies: unknown {bad}; expected some of {POLICIES}")
    res = run(
        policies,
        args.seconds,
        args.clients,
        args.heavy_clients,
        args.cpu,
        args.rows,
        args.pool,
        args.repeat,
        args.pin,
        args.period,
        args.think_ms,
        log=lambda m: print(m, flush=True),
    )
    print(table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
