"""The heavy-query case (seed 000 §4): read policies compared on two CPU-limited replicas.

Two PostgreSQL replicas, each in a cgroup of its own with a CFS quota of `cpu` cores (a low-cost
node), hold the same data: a `small` table read by primary key (the light read) and a `big` table
searched the way RUBBoS's unoptimised comment search is (`LIKE '%...%'` over every row, then a sort
by date with an offset: a real CPU-heavy read, no pg_sleep). Two pgbench processes (the peer,
closed loop, no think time, fixed duration) run at once through the middleware: `clients` clients
sending the light read and `heavy_clients` clients sending the heavy one (a small share of the
reads: about 1 in 200-500). The same load is run once per policy, one middleware process per
policy, in one session. pgbench's per-transaction log is the ground truth
for the light reads' percentiles and for throughput; the middleware's stats give the reads per
replica and its 50 ms series of pending requests and heavy reads in flight per replica.

Run: `python -m tierscope.middleware.heavy --seconds 10` (needs root: cgroups, the postgres user).
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

from tierscope.middleware.balance import POLICIES

DB = "heavy"
LIGHT_SQL = "\\set id random(1, 10000)\nSELECT v FROM small WHERE id = :id;\n"
#: like RUBBoS's search on old_comments that the optimiser cannot use an index for (seed 000 §4)
HEAVY_SQL = ("SELECT id, subject, date FROM big WHERE subject LIKE '%indep%' "
             "ORDER BY date DESC LIMIT 25 OFFSET 25;\n")


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
    """Imbalance in the 50 ms series: mean pending per replica, the share of samples where the
    replicas' pending differ by 2 or more, and the share where a heavy read runs on exactly one
    replica while the other one has more pending (light reads pushed onto the busy one)."""
    pend = [series["pending"][n] for n in names]
    heavy = [series["heavy"][n] for n in names]
    n = len(pend[0]) if pend else 0
    if n == 0:
        return {"samples": 0}
    uneven = sum(1 for k in range(n) if abs(pend[0][k] - pend[1][k]) >= 2)
    one_heavy = [k for k in range(n) if (heavy[0][k] > 0) != (heavy[1][k] > 0)]
    busy_also_light = sum(1 for k in one_heavy
                          if pend[0 if heavy[0][k] else 1][k] - heavy[0 if heavy[0][k] else 1][k] > 0)
    return {
        "samples": n,
        "mean_pending": [round(sum(p) / n, 2) for p in pend],
        "max_pending": [max(p) for p in pend],
        "uneven_share": round(uneven / n, 3),
        "one_heavy_share": round(len(one_heavy) / n, 3),
        "light_next_to_heavy_share": round(busy_also_light / max(1, len(one_heavy)), 3),
    }


def run(policies: list[str], seconds: int = 8, clients: int = 8, heavy_clients: int = 1, cpu: float = 0.5,
        rows: int = 200_000, pool: int = 16, repeat: int = 1, log=print) -> dict:
    """Build the case, run every policy `repeat` times (interleaved), return the figures."""
    from tierscope.services.base import free_port
    from tierscope.services.middleware import Middleware
    from tierscope.services.postgres import Postgres, pg_bindir
    from tierscope.spec import NodeType
    from tierscope.testbed import cgroups
    from tierscope.testbed.host import Host

    class LabelledMiddleware(Middleware):  # heavy reads per replica are kept under every policy
        def command(self) -> list[str]:
            return super().command() + ["--labels", "--series-interval", "0.05"]

    reason = cgroups.unavailable_reason()
    if reason:
        raise RuntimeError(f"the heavy-query case needs CPU-limited replicas: {reason}")
    bindir = pg_bindir()
    work = Path(tempfile.mkdtemp(prefix="tierscope-mw-heavy-"))
    top = f"{cgroups.TOP}/mwheavy-{os.getpid()}"
    nt = NodeType(cpu=cpu)
    hosts, pgs, started = [], [], []
    results: dict = {"params": {"seconds": seconds, "clients": clients, "heavy_clients": heavy_clients, "cpu": cpu,
                                "rows": rows, "pool": pool, "repeat": repeat}, "runs": []}
    try:
        for i in (1, 2):
            rel = f"{top}/db{i}"
            controllers = cgroups.create(rel, nt, work)
            hosts.append(Host(f"db{i}", cgroup=rel, controllers=controllers))
        for i, h in enumerate(hosts, 1):
            p = Postgres(h, free_port(), work / f"db{i}", fsync=False, shared_buffers="64MB", max_connections=80,
                         settings={"max_parallel_workers_per_gather": "0", "jit": "off", "work_mem": "'16MB'"},
                         name=f"db{i}")
            p.start()
            started.append(p)
            pgs.append(p)
            p.create_database(DB)
            p.sql("CREATE TABLE small (id int PRIMARY KEY, v text)", DB)
            p.sql("INSERT INTO small SELECT g, md5(g::text) FROM generate_series(1, 10000) g", DB)
            p.sql("CREATE TABLE big (id int PRIMARY KEY, subject text, date timestamptz, body text)", DB)
            p.sql("INSERT INTO big SELECT g, md5(g::text) || ' ' || md5((g * 7)::text), "
                  "'2026-01-01'::timestamptz + g * interval '1 minute', repeat(md5((g * 3)::text), 2) "
                  f"FROM generate_series(1, {int(rows)}) g", DB)
            p.sql("VACUUM ANALYZE", DB)
            t0 = time.perf_counter()
            p.sql(HEAVY_SQL.rstrip().rstrip(";"), DB)
            p.sql(HEAVY_SQL.rstrip().rstrip(";"), DB)
            results.setdefault("heavy_direct_ms", []).append(round(1e3 * (time.perf_counter() - t0) / 2, 1))
        log(f"replicas up ({cpu} cores each); the heavy read takes {results['heavy_direct_ms']} ms directly")
        (work / "light.sql").write_text(LIGHT_SQL)
        (work / "heavy.sql").write_text(HEAVY_SQL)
        for rep in range(repeat):
            for policy in policies:
                name = f"mw-{policy}-{rep}"
                mw = LabelledMiddleware(Host.loopback(name), free_port(), work / name,
                                        backends=[p.address for p in pgs], database=DB, pool=pool, policy=policy,
                                        name=name)
                mw.start()
                started.append(mw)
                runs = []
                try:
                    for kind, n, script in (("light", clients, "light.sql"), ("heavy", heavy_clients, "heavy.sql")):
                        if n <= 0:
                            continue
                        argv = [str(bindir / "pgbench"), "-h", mw.host.address, "-p", str(mw.port), "-U", "postgres",
                                "-n", "-c", str(n), "-j", str(min(2, n)), "-T", str(seconds), "-M", "extended",
                                "-f", str(work / script), "-l", "--log-prefix", str(work / name / kind), DB]
                        runs.append((kind, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                            text=True, cwd=work)))
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
                light = [lat for _, lat, _ in read_pgbench_logs(work / name / "light")]
                heavy = [lat for _, lat, _ in read_pgbench_logs(work / name / "heavy")]
                txs = light + heavy
                names = [b["name"] for b in stats["backends"]]
                r = {
                    "policy": policy, "rep": rep, "transactions": len(txs), "tps": round(len(txs) / seconds, 1),
                    "light_tps": round(len(light) / seconds, 1), "heavy_tps": round(len(heavy) / seconds, 2),
                    "light_p50_ms": round(1e3 * percentile(light, 0.5), 2),
                    "light_p90_ms": round(1e3 * percentile(light, 0.9), 2),
                    "light_p99_ms": round(1e3 * percentile(light, 0.99), 2),
                    "heavy_mean_ms": round(1e3 * sum(heavy) / max(1, len(heavy)), 1),
                    "reads": [b["reads"] for b in stats["backends"]],
                    "heavy_reads": [b["heavy_reads"] for b in stats["backends"]],
                    "middleware_reads": stats["reads"],
                    "imbalance": summary(stats["series"], names),
                    "series": stats["series"],
                }
                results["runs"].append(r)
                log(f"{policy:6s} rep {rep}: {r['tps']:8.1f} tps ({r['light_tps']} light, {r['heavy_tps']} heavy/s), "
                    f"light p50 {r['light_p50_ms']} ms p90 {r['light_p90_ms']} ms p99 {r['light_p99_ms']} ms, "
                    f"heavy mean {r['heavy_mean_ms']} ms, reads {r['reads']}, heavy {r['heavy_reads']}, "
                    f"imbalance {r['imbalance']}")
    finally:
        for s in reversed(started):
            s.stop()
        for i in (1, 2):
            try:
                cgroups.remove(f"{top}/db{i}")
            except Exception as err:  # reported, the rest is still cleaned
                log(f"cannot remove cgroup {top}/db{i}: {err}")
        try:
            cgroups.remove(top)
        except Exception as err:
            log(f"cannot remove cgroup {top}: {err}")
        shutil.rmtree(work, ignore_errors=True)
    return results


def table(results: dict) -> str:
    """The runs as a Markdown table (medians over the repetitions)."""
    by: dict[str, list[dict]] = {}
    for r in results["runs"]:
        by.setdefault(r["policy"], []).append(r)

    def med(rs: list[dict], key: str) -> float:
        v = sorted(x[key] for x in rs)
        return v[len(v) // 2]

    lines = ["| policy | tps | light p50 ms | light p90 ms | light p99 ms | heavy mean ms | reads per replica | "
             "heavy reads per replica |", "|---|---|---|---|---|---|---|---|"]
    for policy, rs in by.items():
        lines.append(f"| {policy} | {med(rs, 'tps')} | {med(rs, 'light_p50_ms')} | {med(rs, 'light_p90_ms')} | "
                     f"{med(rs, 'light_p99_ms')} | {med(rs, 'heavy_mean_ms')} | "
                     f"{' / '.join(str(x) for x in rs[0]['reads'])} | "
                     f"{' / '.join(str(x) for x in rs[0]['heavy_reads'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tierscope.middleware.heavy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated (default: all)")
    ap.add_argument("--seconds", type=int, default=8, help="pgbench duration per policy (default 8)")
    ap.add_argument("--clients", type=int, default=8, help="pgbench clients sending light reads (default 8)")
    ap.add_argument("--heavy-clients", type=int, default=1, help="pgbench clients sending heavy reads (default 1)")
    ap.add_argument("--cpu", type=float, default=0.5, help="cores per replica (CFS quota; default 0.5)")
    ap.add_argument("--rows", type=int, default=200_000, help="rows of the big table (default 200000)")
    ap.add_argument("--pool", type=int, default=16, help="middleware connections per replica (default 16)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per policy, interleaved (default 1)")
    ap.add_argument("--json", metavar="PATH", help="write every figure (series included) here")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        ap.error(f"--policies: unknown {bad}; expected some of {POLICIES}")
    res = run(policies, args.seconds, args.clients, args.heavy_clients, args.cpu, args.rows, args.pool, args.repeat,
              log=lambda m: print(m, flush=True))
    print(table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
