"""Building the corpus: run each case on real parts and keep its artifacts in the cache.

A case's directory, CACHE/<name>-<key>/, holds what users have after such a run: spans.otlp.json
(OTLP JSON, hex ids, one request per line), spans.pb.json (protobuf's JSON mapping, base64 ids),
spans.zipkin.json (the same spans from the SDK's Zipkin JSON exporter), db.pcap (the db's
port on the wire), events.parquet (the injected pauses, for pause cases), web.log (nginx's access log), or for lab
cases the run's point directory; and meta.json: the truth, the role map, what the checks measured.
The key hashes the case's definition and this builder's sources, so a rerun only re-analyses.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from cases import SERVICE, Case

HERE = Path(__file__).resolve().parent
#: the builder's sources, common to every case, and each system's own: a case is rebuilt when its
#: definition, the common sources or its system's sources change
SOURCES = ["build.py", "systems.py", "inject.py", "receiver.py"]
SYSTEM_SOURCES = {
    "flask": ["flask_shop/app.py"],
    "express": ["express_shop/app.js", "express_shop/tracing.js", "express_shop/package-lock.json"],
}
WARMUP_REQUESTS = 20
#: the span after a pause's end over which the db must run at its quota to count as saturated by
#: the burst: one window of the analysis (50 ms)
AFTER_PAUSE_NS = 50_000_000


def source_hash(system: str) -> str:
    h = hashlib.sha256()
    for rel in SOURCES + SYSTEM_SOURCES.get(system, []):
        h.update(rel.encode())
        h.update((HERE / rel).read_bytes())
    return h.hexdigest()


def case_key(case: Case, src: str) -> str:
    return hashlib.sha256((json.dumps(case.definition(), sort_keys=True) + src).encode()).hexdigest()[:12]


def case_dir(cache: Path, case: Case, src: str) -> Path:
    return cache / f"{case.name}-{case_key(case, src)}"


def evaluate(checks: dict, measured: dict) -> list[str]:
    """The checks the measurements fail (empty: the ground truth materialised)."""
    failed = []
    for key, want in checks.items():
        got = measured.get(key)
        if got is None:
            failed.append(f"{key}: not measured")
        elif isinstance(want, (list, tuple)):
            lo, hi = want
            if (lo is not None and got < lo) or (hi is not None and got > hi):
                failed.append(f"{key}={got} outside [{lo}, {hi}]")
        elif got < want:
            failed.append(f"{key}={got} < {want}")
    err_share = measured.get("error_share", 0.0)
    if err_share > checks.get("errors", 0.02):
        failed.append(f"error_share={err_share}")
    return failed


class AppStack:
    """PostgreSQL, the cgroups and the receiver, shared by the app cases of one build."""

    def __init__(self, log) -> None:
        import systems
        from receiver import Receiver

        self.systems = systems
        self.log = log
        self.tmp = Path(tempfile.mkdtemp(prefix="tierscope-diagnosis-"))
        os.chmod(self.tmp, 0o755)
        self.cgroups = systems.Cgroups()
        self.pg = None
        self.receiver = None
        t0 = time.monotonic()
        self.pg = systems.Postgres(self.tmp, self.cgroups)
        self.receiver = Receiver()
        log(
            f"  PostgreSQL 15 on 127.0.0.1:{self.pg.port} ({time.monotonic() - t0:.1f} s), receiver {self.receiver.url}"
        )

    def close(self) -> None:
        try:
            self.systems.stop_all()  # whatever an interrupted case left running
            if self.receiver is not None:
                self.receiver.close()
            if self.pg is not None:
                self.pg.close()
        finally:
            self.cgroups.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def run_case(self, case: Case, out: Path) -> dict:
        sy = self.systems
        service = SERVICE[case.system]
        work = Path(tempfile.mkdtemp(prefix=f"{case.name}-", dir=self.tmp))
        self.cgroups.set_cpu("app", case.app_cpu)
        self.cgroups.set_cpu("db", case.db_cpu)
        app = nginx = injector = sampler = wire = None
        cpu_traces: dict = {}
        disk_capped = bool(case.db_memory or case.db_read_iops)
        try:
            if case.docs:
                t0 = time.monotonic()
                self.pg.load_docs(case.docs)
                self.log(f"  docs table: {case.docs} rows ({time.monotonic() - t0:.0f} s)")
            if disk_capped:  # the db's cache shrinks to its memory cap: most reads of docs go to the disk
                self.cgroups.set_disk("db", case.db_memory, case.db_read_iops, self.pg.data)
            app = sy.App(work, case.system, service, self.pg, self.cgroups, self.receiver.url, pool=case.pool,
                         workers=case.workers, threads=case.threads, zipkin=self.receiver.zipkin_url)  # fmt: skip
            for i in range(WARMUP_REQUESTS):  # connections, caches, JIT: not part of the case
                with urllib.request.urlopen(f"http://127.0.0.1:{app.port}/page?q=1", timeout=30) as r:
                    r.read()
            time.sleep(0.6)
            self.receiver.take()
            nginx = sy.Nginx(work, app.port)
            fault = case.fault
            inj_log = work / "injector.jsonl"
            sampler = sy.Sampler(self.pg)
            sampler.start()
            cpu_traces = {tier: sy.CpuTrace(self.cgroups.usage_file(tier)) for tier in ("app", "db")}
            for trace in cpu_traces.values():
                trace.start()
            # the db's port on the wire: its own times, for the "spans+wire" form (what a user adds
            # with tcpdump when the database has no tracer)
            from tierscope.trace.capture import LiveCapture

            wire = LiveCapture("lo", work / "db.pcap", filter=f"tcp port {self.pg.port}").start()
            u_app, u_db = self.cgroups.usage_s("app"), self.cgroups.usage_s("db")
            r_app, r_db = self.cgroups.runnable_s("app"), self.cgroups.runnable_s("db")
            t0 = time.monotonic()
            if fault:
                argv = [sys.executable, str(HERE / "inject.py"), fault["kind"],
                        "--seconds", str(case.seconds - 1.5), "--start", "1.0", "--seed", str(case.seed),
                        "--log", str(inj_log)]  # fmt: skip
                for f in self.cgroups.procs_files(fault["target"]):
                    argv += ["--procs", f]
                if fault["kind"] == "pause":
                    argv += ["--period", str(fault["period"]), "--min-ms", str(fault["min_ms"]),
                             "--max-ms", str(fault["max_ms"]), "--jitter", str(fault["jitter"])]  # fmt: skip
                else:
                    argv += ["--on", str(fault["on"]), "--off", str(fault["off"])]
                injector = sy.popen(argv)
            counts = sy.closed_loop(nginx.port, list(case.mix), case.users, case.think, case.seconds, case.seed)
            elapsed = time.monotonic() - t0
            if injector is not None:
                injector.wait(30)
                injector = None
            d_app = self.cgroups.usage_s("app") - u_app
            d_db = self.cgroups.usage_s("db") - u_db
            busy = {}
            for tier, before in (("app", r_app), ("db", r_db)):
                after = self.cgroups.runnable_s(tier)
                busy[tier] = round(sum(v - before.get(t, 0.0) for t, v in after.items()) / elapsed, 3)
            pg_stats = sampler.stop()
            sampler = None
            cpu_samples = {tier: trace.stop() for tier, trace in cpu_traces.items()}
            cpu_traces = {}
            wire.stop()
            wire = None
            nginx.close()  # first: its upstream keep-alive connections would hold the app's graceful stop
            nginx = None
            app_user = app.user
            app.close()  # SIGTERM: the SDK flushes its last spans
            app = None
            with self.pg.connect() as c:  # queries the app left running must not load the next case
                c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")  # fmt: skip
            time.sleep(0.3)
            batches, zipkin_spans = self.receiver.take_both()
            for f in (work / f"{case.system}.log", work / "nginx" / "error.log"):  # for a look when a case fails
                if f.exists():
                    shutil.copy(f, out / f"{f.stem}.txt")
            ncpu = os.cpu_count() or 1
            total = counts["ok"] + counts["error"]
            measured = {
                "requests": total,
                "app_user": app_user,  # the OS user the app ran as (issue 21: never root)
                "throughput": round(total / elapsed, 1),
                "error_share": round(counts["error"] / max(1, total), 4),
                "app_util": round(d_app / elapsed / (case.app_cpu or ncpu), 3),
                "db_util": round(d_db / elapsed / (case.db_cpu or ncpu), 3),
                "app_busy": busy["app"],
                "db_busy": busy["db"],
                "app_sat": max(busy["app"], round(d_app / elapsed / (case.app_cpu or ncpu), 3)),
                "db_sat": max(busy["db"], round(d_db / elapsed / (case.db_cpu or ncpu), 3)),
                "app_cores": round(d_app / elapsed, 3),
                "db_cores": round(d_db / elapsed, 3),
                "resp_p50_ms": counts["resp_p50_ms"],
                "resp_mean_ms": counts["resp_mean_ms"],
                "db_active": pg_stats["active_mean"],
                "lock_wait": pg_stats["lock_wait_mean"],
                "io_wait": pg_stats["io_wait_mean"],
            }
            forms: dict[str, list[str]] = {}
            measured["spans"] = self.receiver.write(batches, out / "spans.otlp.json", out / "spans.pb.json")
            forms["spans"] = ["spans.otlp.json"]
            forms["spans-pb"] = ["spans.pb.json"]
            if zipkin_spans:  # the SDKs' Zipkin JSON exporters: microsecond times, no remote endpoints
                (out / "spans.zipkin.json").write_text(json.dumps(zipkin_spans, separators=(",", ":")) + "\n")
                measured["zipkin_spans"] = len(zipkin_spans)
                forms["zipkin"] = ["spans.zipkin.json"]
            shutil.copy(nginx_log := work / "nginx" / "web.log", out / "web.log")
            measured["log_lines"] = sum(1 for _ in open(nginx_log))
            forms["access-log"] = ["web.log"]
            # the tiers' CPU every 5 ms (wall clock ns, cpuacct ns): later checks need no rebuild
            (out / "cpu.json").write_text(json.dumps({t: smp for t, smp in cpu_samples.items()}))
            shutil.copy(work / "db.pcap", out / "db.pcap")
            # `tierscope trace db.pcap --server-map db.servers` names the db as the app's spans do
            (out / "db.servers").write_text(f"127.0.0.1:{self.pg.port} postgresql 127.0.0.1:{self.pg.port} postgres\n")
            forms["spans+wire"] = ["spans.otlp.json", "db.pcap"]
            if fault:
                shutil.copy(inj_log, out / "injector.jsonl")
                rows = [json.loads(line) for line in open(inj_log)]
                if fault["kind"] == "pause":
                    lengths = [(r["end_ns"] - r["start_ns"]) / 1e6 for r in rows]
                    measured["pauses"] = len(rows)
                    measured["pause_median_ms"] = round(statistics.median(lengths), 1) if lengths else 0
                    measured["pause_share"] = round(sum(lengths) / 1e3 / elapsed, 3)
                    # "saturated by the burst after each pause": the other tier ran at its quota (80 %
                    # of it or more) over the first window (50 ms) after the thaw
                    other = "db" if fault["target"] == "app" else "app"
                    cores = sy.cores_after(cpu_samples[other], [r["end_ns"] for r in rows], AFTER_PAUSE_NS)
                    seen = [c for c in cores if c == c]
                    full = 0.8 * (getattr(case, f"{other}_cpu") or os.cpu_count() or 1)
                    measured[f"{other}_after_pause"] = (
                        round(sum(c >= full for c in seen) / len(seen), 3) if seen else None
                    )
                    host = service if fault["target"] == "app" else "postgresql"
                    write_events(out / "events.parquet", rows, host)
                    forms["spans+events"] = ["spans.otlp.json", "events.parquet"]
                else:
                    measured["bursts"] = len(rows)
            role_map = {service: "app", "postgresql": "db", "web": "web", f"127.0.0.1:{self.pg.port}": "db",
                        f"localhost:{self.pg.port}": "db", "127.0.0.1": "db", "localhost": "db"}  # fmt: skip
            return {"measured": measured, "forms": forms, "role_map": role_map}
        finally:
            if disk_capped:
                self.cgroups.set_disk("db", None, None, self.pg.data)
            if injector is not None:
                sy.stop_proc(injector)
            if sampler is not None:
                sampler.stop()
            for trace in cpu_traces.values():
                trace.stop()
            if wire is not None:
                wire.stop(settle=False)
            if nginx is not None:
                nginx.close()
            if app is not None:
                app.close()
            for pid in self.cgroups.pids("app"):  # a burner or a straggler
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            shutil.rmtree(work, ignore_errors=True)


def write_events(path: Path, rows: list[dict], host: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tierscope.tables import EVENTS

    t = pa.table(
        {
            "start_ns": [r["start_ns"] for r in rows],
            "end_ns": [r["end_ns"] for r in rows],
            "host": [host] * len(rows),
            "kind": ["pause"] * len(rows),
            "detail": [f"SIGSTOP of {r['pids']} process(es) by the corpus injector" for r in rows],
        },
        schema=EVENTS,
    )
    pq.write_table(t, path)


def save(out: Path, case: Case, result: dict, key: str, seconds: float) -> None:
    failed = evaluate(case.checks, result["measured"])
    meta = {
        "case": case.definition(),
        "key": key,
        "label": case.label,
        "measured": result["measured"],
        "failed_checks": failed,
        "materialised": not failed,
        "forms": result["forms"],
        "role_map": result["role_map"],
        "build_seconds": round(seconds, 1),
    }
    tmp = out / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.rename(out / "meta.json")


def build_app_cases(todo: list[tuple[Case, Path]], log, on_built=None) -> None:
    if not todo:
        return
    stack = AppStack(log)
    try:
        for i, (case, out) in enumerate(todo, 1):
            t0 = time.monotonic()
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            result = stack.run_case(case, out)
            save(out, case, result, out.name.rsplit("-", 1)[1], time.monotonic() - t0)
            m = result["measured"]
            log(f"  [{i}/{len(todo)}] built {case.name} in {time.monotonic() - t0:.0f} s: {m['requests']} requests, "
                f"{m['spans']} spans, app {m['app_cores']} cores busy {m['app_busy']}, db {m['db_cores']} cores busy {m['db_busy']}"
                + (f", {m['pauses']} pauses (median {m['pause_median_ms']} ms)" if "pauses" in m else ""))  # fmt: skip
            if on_built is not None:
                on_built(case)
    finally:
        stack.close()
