"""The real parts of the diagnosis corpus: cgroups, PostgreSQL, nginx, the two apps, a load generator.

Everything runs on loopback, on free ports, in temp dirs and in cgroups under
/sys/fs/cgroup/<controller>/tierscope-diagnosis-<pid>/; run as root, the apps and nginx's workers
run as the lab's unprivileged system user (as in tierscope's own labs), PostgreSQL as postgres;
`Stack.close()` ends every process it started and removes what it made, also after a failure.
"""

from __future__ import annotations

import http.client
import os
import pwd
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tierscope.services._accounts import group_name, lab_account, open_the_way, run_as

HERE = Path(__file__).resolve().parent
PG_BIN = Path("/usr/lib/postgresql/15/bin")
CPU_PERIOD_US = 10_000  # a 10 ms CFS period: a capped tier runs smoothly, not on/off at 100 ms
NGINX_FORMAT = (
    "'$remote_addr $msec $request_time $upstream_response_time $request_id $status '\n"
    "                       '$body_bytes_sent $request_length $connection $connection_requests \"$request\"'"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what or 'process'} exited with status {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what or 'server'} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


#: every process this module started (its own session): stop_all() ends those still running
STARTED: list[subprocess.Popen] = []


def popen(argv: list[str], **kw) -> subprocess.Popen:
    proc = subprocess.Popen(argv, start_new_session=True, **kw)
    STARTED.append(proc)
    return proc


def stop_all() -> None:
    for proc in reversed(STARTED):
        stop_proc(proc, 5)
    STARTED.clear()


def stop_proc(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGCONT + SIGTERM the process group, then SIGKILL it if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)


class Cgroups:
    """cgroup v1 cpu+cpuacct groups /sys/fs/cgroup/{cpu,cpuacct}/tierscope-diagnosis-<pid>/{db,app,driver}.

    The machine is shared (other tenants' tests run beside the corpus): the top group gets the
    largest cpu.shares so the system under test and its driver get the CPU first, bounded by CFS
    quotas (10 ms period): db and app per case, the driver one core. The analyses run outside
    (root group, nice 19): they must not take the CPU from a case being built, nor from others. This process moves itself into `driver` (nginx,
    the generator, the receiver and the analyses inherit it) and back out at close().
    """

    ROOT = Path("/sys/fs/cgroup")
    CONTROLLERS = ("cpu", "cpuacct")
    #: for the disk-bound cases: the db's memory (its page cache) and its disk reads
    LIMITS = ("memory", "blkio")

    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("the diagnosis corpus needs root (cgroups)")
        missing = [c for c in self.CONTROLLERS if not (self.ROOT / c / "cgroup.procs").exists()]
        if missing:
            raise RuntimeError(f"the diagnosis corpus needs the cgroup v1 controllers {missing} under {self.ROOT}")
        self.base = f"tierscope-diagnosis-{os.getpid()}"
        self.controllers = self.CONTROLLERS + tuple(c for c in self.LIMITS if (self.ROOT / c / "cgroup.procs").exists())
        self.made: list[str] = []
        self._mkdir("")
        (self.ROOT / "cpu" / self.base / "cpu.shares").write_text("262144")
        for name in ("db", "app", "driver"):
            self._mkdir(name)
            (self.ROOT / "cpu" / self.base / name / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        self.set_cpu("driver", 1.0)  # the generator, nginx and the receiver: at most one core
        for f in self.procs_files("driver"):
            Path(f).write_text(str(os.getpid()))

    def _mkdir(self, name: str) -> None:
        for c in self.controllers:
            d = self.ROOT / c / self.base / name
            d.mkdir(exist_ok=True)
        self.made.append(name)

    def set_cpu(self, name: str, cores: float | None) -> None:
        quota = -1 if cores is None else int(cores * CPU_PERIOD_US)
        (self.ROOT / "cpu" / self.base / name / "cpu.cfs_quota_us").write_text(str(quota))

    def set_disk(self, name: str, memory_mib: int | None, read_iops: int | None, path: Path) -> None:
        """Cap the group's memory (page cache included) and its reads from the disk holding `path`
        (None: no cap). Needs the cgroup v1 memory and blkio controllers."""
        missing = [c for c in self.LIMITS if c not in self.controllers]
        if (memory_mib or read_iops) and missing:
            raise RuntimeError(f"a disk-bound case needs the cgroup v1 controllers {missing} under {self.ROOT}")
        if "memory" in self.controllers:
            limit = str(memory_mib * 2**20) if memory_mib else "-1"
            (self.ROOT / "memory" / self.base / name / "memory.limit_in_bytes").write_text(limit)
        if "blkio" in self.controllers:
            from tierscope.testbed.cgroups import block_device

            dev = block_device(None, path)
            (self.ROOT / "blkio" / self.base / name / "blkio.throttle.read_iops_device").write_text(
                f"{dev} {read_iops or 0}"
            )

    def usage_file(self, name: str) -> Path:
        return self.ROOT / "cpuacct" / self.base / name / "cpuacct.usage"

    def usage_s(self, name: str) -> float:
        return int(self.usage_file(name).read_text()) / 1e9

    def procs_files(self, name: str) -> list[str]:
        return [str(self.ROOT / c / self.base / name / "cgroup.procs") for c in self.controllers]

    def pids(self, name: str) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files(name):
            try:
                out.update(int(x) for x in open(f).read().split())
            except OSError:
                pass
        return sorted(out)

    def runnable_s(self, name: str) -> dict[int, float]:
        """Per thread of the group: seconds on a CPU plus seconds runnable but waiting for one
        (/proc/<pid>/task/<tid>/schedstat; throttled time counts as waiting). Summed over the
        threads and divided by the elapsed time: the mean number of threads that wanted a CPU,
        which says "busy" whether the CPU went to a quota or to another tenant of the machine."""
        out: dict[int, float] = {}
        for pid in self.pids(name):
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    run, wait, _ = open(f"/proc/{pid}/task/{tid}/schedstat").read().split()
                except (OSError, ValueError):
                    continue
                out[int(tid)] = (int(run) + int(wait)) / 1e9
        return out

    def close(self) -> None:
        """Back to the root group, SIGKILL whatever is left in ours, remove them."""
        for c in self.controllers:
            try:
                (self.ROOT / c / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                pass
        for name in ("db", "app"):
            for pid in self.pids(name):
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
        for name in [n for n in reversed(self.made) if n] + [""]:
            for c in self.controllers:
                d = self.ROOT / c / self.base / name
                for _ in range(100):
                    try:
                        if d.exists():
                            d.rmdir()
                        break
                    except OSError:
                        time.sleep(0.05)
                else:
                    print(f"diagnosis: could not remove cgroup {d}", file=sys.stderr)
        self.made = []


def in_cgroup(procs_files: list[str], argv: list[str]) -> list[str]:
    """argv run by a shell that first moves itself into the cgroups (its children inherit them)."""
    script = "".join(f'echo $$ > "{f}"; ' for f in procs_files) + 'exec "$@"'
    return ["sh", "-c", script, "sh", *argv]


class Postgres:
    """A PostgreSQL 15 of its own: initdb as the postgres OS user, password auth, 127.0.0.1 only."""

    def __init__(self, root: Path, cgroups: Cgroups) -> None:
        self.dir = root / "pg"
        self.dir.mkdir()
        shutil.chown(self.dir, "postgres", "postgres")
        self.port = free_port()
        self.password = secrets.token_hex(12)
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        shutil.chown(pwfile, "postgres", "postgres")
        data = self.dir / "data"
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(PG_BIN / "initdb"), "-D", str(data), "-U", "shop",
             "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync"],
            check=True, capture_output=True, cwd=self.dir,
        )  # fmt: skip
        pwfile.unlink()
        argv = [
            "runuser", "-u", "postgres", "--", str(PG_BIN / "postgres"), "-D", str(data),
            "-c", "listen_addresses=127.0.0.1", "-c", f"port={self.port}", "-c", f"unix_socket_directories={self.dir}",
            "-c", "max_connections=100", "-c", "shared_buffers=64MB", "-c", "fsync=off",
            "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "log_min_messages=warning",
        ]  # fmt: skip
        self.log = open(self.dir / "postgres.log", "w")
        self.proc = popen(
            in_cgroup(cgroups.procs_files("db"), argv), stdout=self.log, stderr=subprocess.STDOUT,
            cwd=self.dir,
        )  # fmt: skip
        wait_port(self.port, 30, self.proc, "postgres")
        self.dsn = f"postgresql://shop:{self.password}@127.0.0.1:{self.port}/postgres"
        self.data = data
        self.docs = 0  # rows of the large table, loaded by the first case that reads it
        self._load()

    def connect(self):
        import psycopg

        for _ in range(50):
            try:
                return psycopg.connect(self.dsn, autocommit=True)
            except psycopg.OperationalError:
                time.sleep(0.1)
        return psycopg.connect(self.dsn, autocommit=True)

    def _load(self) -> None:
        with self.connect() as c:
            c.execute("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, price numeric NOT NULL)")
            c.execute("INSERT INTO items SELECT g, 'item ' || g, (g % 97) + 0.99 FROM generate_series(1, 10000) g")
            c.execute("CREATE TABLE counters (id int PRIMARY KEY, n bigint NOT NULL)")
            c.execute("INSERT INTO counters VALUES (1, 0)")
            c.execute("VACUUM ANALYZE")

    def load_docs(self, rows: int) -> None:
        """The large table of the disk-bound cases: about 1 KB a row (9 rows an 8 KB page, stored
        uncompressed), so `rows` random lookups touch about as many pages."""
        if self.docs >= rows:
            return
        with self.connect() as c:
            c.execute("DROP TABLE IF EXISTS docs")
            c.execute("CREATE TABLE docs (id int PRIMARY KEY, body text NOT NULL)")
            c.execute("INSERT INTO docs SELECT g, repeat(md5(g::text), 28) FROM generate_series(1, %s) g", (rows,))
            c.execute("VACUUM ANALYZE docs")
        self.docs = rows

    def close(self) -> None:
        stop_proc(self.proc, 20)
        self.log.close()


class CpuTrace(threading.Thread):
    """A cgroup's CPU time (cpuacct.usage) every 5 ms, stamped with the wall clock the injector
    uses (time.time_ns), so the CPU a tier used right after each pause can be measured."""

    def __init__(self, usage_file: Path) -> None:
        super().__init__(name="cpu-trace", daemon=True)
        self.usage_file = Path(usage_file)
        self.samples: list[tuple[int, int]] = []  # (time ns, usage ns)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.samples.append((time.time_ns(), int(self.usage_file.read_text())))
            self.halt.wait(0.005)

    def stop(self) -> list[tuple[int, int]]:
        self.halt.set()
        self.join(5)
        return self.samples


def cores_after(samples: list[tuple[int, int]], starts: list[int], span_ns: int) -> list[float]:
    """For each start time: the cores used (CPU seconds per second) over [start, start + span_ns],
    interpolated between the samples; NaN where the samples do not cover it."""
    import numpy as np

    if len(samples) < 2:
        return [float("nan")] * len(starts)
    t = np.asarray([a for a, _ in samples], np.float64)
    u = np.asarray([b for _, b in samples], np.float64)
    out = []
    for s in starts:
        if s < t[0] or s + span_ns > t[-1]:
            out.append(float("nan"))
            continue
        a, b = np.interp([s, s + span_ns], t, u)
        out.append(float((b - a) / span_ns))
    return out


class Sampler(threading.Thread):
    """pg_stat_activity every 100 ms: active backends, those waiting on a lock, on a read or write."""

    def __init__(self, pg: Postgres) -> None:
        super().__init__(name="pg-sampler", daemon=True)
        self.pg = pg
        self.samples: list[tuple[int, int, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        conn = self.pg.connect()
        try:
            while not self.halt.is_set():
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE state = 'active'),"
                    " count(*) FILTER (WHERE wait_event_type = 'Lock'),"
                    " count(*) FILTER (WHERE wait_event_type = 'IO')"
                    " FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                ).fetchone()
                self.samples.append((int(row[0]), int(row[1]), int(row[2])))
                self.halt.wait(0.1)
        finally:
            conn.close()

    def stop(self) -> dict:
        self.halt.set()
        self.join(10)
        n = max(1, len(self.samples))
        return {
            "samples": len(self.samples),
            "active_mean": round(sum(s[0] for s in self.samples) / n, 3),
            "lock_wait_mean": round(sum(s[1] for s in self.samples) / n, 3),
            "io_wait_mean": round(sum(s[2] for s in self.samples) / n, 3),
        }


class Nginx:
    """nginx in front of the app: proxy to 127.0.0.1:app_port, access log in the tierscope format."""

    def __init__(self, root: Path, app_port: int, name: str = "web") -> None:
        self.dir = root / "nginx"
        self.dir.mkdir()
        self.port = free_port()
        self.access_log = self.dir / f"{name}.log"
        conf = self.dir / "nginx.conf"
        user = ""
        if os.geteuid() == 0:  # the workers as the lab's unprivileged user, never root
            acct = lab_account()
            user = f"user {acct.pw_name} {group_name(acct)};"
        conf.write_text(f"""
daemon off;
{user}
worker_processes 1;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format tierscope {NGINX_FORMAT};
    access_log {self.access_log} tierscope;
    client_body_temp_path {self.dir}/body;
    proxy_temp_path {self.dir}/proxy;
    fastcgi_temp_path {self.dir}/fastcgi;
    uwsgi_temp_path {self.dir}/uwsgi;
    scgi_temp_path {self.dir}/scgi;
    upstream app {{ server 127.0.0.1:{app_port}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{self.port};
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_read_timeout 60s;
        }}
    }}
}}
""")
        self.proc = popen(
            ["nginx", "-c", str(conf), "-p", str(self.dir)], stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "stderr.log", "w"),
        )  # fmt: skip
        wait_port(self.port, 10, self.proc, "nginx")

    def close(self) -> None:
        stop_proc(self.proc, 10)


class App:
    """One of the two shops, started in the app cgroup, exporting spans to the receiver."""

    def __init__(self, root: Path, system: str, service: str, pg: Postgres, cgroups: Cgroups, otlp: str,
                 pool: int, workers: int = 1, threads: int = 8, zipkin: str | None = None) -> None:  # fmt: skip
        self.port = free_port()
        env = dict(os.environ)
        env.update(
            SHOP_DSN=pg.dsn, SHOP_POOL=str(pool), SHOP_PORT=str(self.port), SHOP_OTLP=otlp,
            OTEL_SERVICE_NAME=service, OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
        )  # fmt: skip
        if zipkin:  # the same spans through the SDK's Zipkin JSON exporter too
            env["SHOP_ZIPKIN"] = zipkin
        if pg.docs:
            env["SHOP_DOCS"] = str(pg.docs)
        if system == "flask":
            venv_bin = Path(sys.executable).parent
            argv = [
                str(venv_bin / "gunicorn"), "-w", str(workers), "--threads", str(threads), "-k", "gthread",
                "-b", f"127.0.0.1:{self.port}", "--backlog", "2048", "--keep-alive", "75",
                "--graceful-timeout", "10", "--chdir", str(HERE / "flask_shop"), "app:app",
            ]  # fmt: skip
            cwd = HERE / "flask_shop"
        elif system == "express":
            env["OTEL_SEMCONV_STABILITY_OPT_IN"] = "database,http"
            app_dir = HERE / "express_shop"
            if not (app_dir / "node_modules").is_dir():
                raise RuntimeError(f"{app_dir}/node_modules missing: run `make setup` (npm ci)")
            argv = ["node", "--require", "./tracing.js", "app.js"]
            cwd = app_dir
        else:
            raise ValueError(system)
        if os.geteuid() == 0:  # as the lab's unprivileged user: it reads its code, writes nothing
            acct = lab_account()
            open_the_way(acct, [Path(argv[0]) if system == "flask" else cwd, cwd], f"the {system} app")
            argv = run_as(acct.pw_name, argv)
        self.log = open(root / f"{system}.log", "w")
        self.proc = popen(
            in_cgroup(cgroups.procs_files("app"), argv), env=env, cwd=cwd, stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_port(self.port, 60, self.proc, f"the {system} app")
        self.user = process_user(self.proc.pid)

    def close(self) -> None:
        stop_proc(self.proc, 20)
        self.log.close()


def process_user(pid: int) -> str:
    """The name of the user a process runs as (its real uid, from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return pwd.getpwuid(int(line.split()[1])).pw_name
    raise RuntimeError(f"no Uid line in /proc/{pid}/status")


def closed_loop(port: int, mix: list[tuple[float, str]], users: int, think: float, seconds: float,
                seed: int, max_requests: int = 200_000) -> dict:  # fmt: skip
    """N emulated users against nginx: request, wait for the answer, think (exponential), again.

    Bounded by `seconds` and `max_requests`; users start spread over the first second.
    """
    weights = [w for w, _ in mix]
    paths = [p for _, p in mix]
    t_end = time.monotonic() + seconds
    counts = {"ok": 0, "error": 0}
    latencies: list[float] = []
    lock = threading.Lock()

    def user(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        time.sleep(rng.uniform(0, 1.0))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while time.monotonic() < t_end:
            with lock:
                if counts["ok"] + counts["error"] >= max_requests:
                    break
            path = rng.choices(paths, weights)[0]
            t0 = time.monotonic()
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            with lock:
                counts["ok" if ok else "error"] += 1
                latencies.append(time.monotonic() - t0)
            if think > 0:
                time.sleep(min(rng.expovariate(1 / think), 10 * think))
        conn.close()

    threads = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    latencies.sort()
    counts["resp_p50_ms"] = round(latencies[len(latencies) // 2] * 1e3, 1) if latencies else None
    counts["resp_mean_ms"] = round(sum(latencies) / max(1, len(latencies)) * 1e3, 1)
    return counts
