"""The labelled cases of the diagnosis corpus: a system, a fault at a load and size, and the truth.

The truth comes from the injection, never from the analysis: `kind` (single / alternating / none)
and the roles at fault (web / app / db). `checks` say what must be seen for the case to count (the
injector's own log, the cgroups' CPU, pg_stat_activity samples); a case whose checks fail is
dropped from the scorecard, and counted.

Check keys: pauses (at least this many injected pauses), app_util / db_util ((low, high) bounds on
the tier's CPU over the load, as a share of its cgroup quota; None = unbounded), app_sat / db_sat
(bounds on the larger of that share and the mean number of the tier's threads on a CPU or runnable
and waiting for one (schedstat): at 0.9 and more the tier always had work, whether its CPU went to
its quota or to another tenant of this shared machine), db_active (low
bound on the mean active backends), lock_wait (low bound on the mean backends waiting on a lock),
bursts (at least this many noisy-neighbour bursts), io_wait (low bound on the mean backends waiting
on a read or write), resp_p50_ms (bounds on the median response time
the generator saw), errors (at most this share of failed requests).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SERVICE = {"flask": "shop-flask", "express": "shop-express"}


@dataclass
class Case:
    name: str
    system: str  # flask | express | lab
    kind: str  # the truth: single | alternating | several | none
    roles: tuple[str, ...]  # the roles at fault: web / app / db
    why: str  # one line: what was injected and why that is the truth
    users: int = 10
    think: float = 0.5
    seconds: float = 15.0
    mix: tuple[tuple[float, str], ...] = ((1.0, "/page?q=2"),)
    pool: int = 8
    workers: int = 1
    threads: int = 16
    app_cpu: float | None = 1.0  # cores (cgroup quota)
    db_cpu: float | None = 1.0
    fault: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)
    subsets: tuple[str, ...] = ()
    seed: int = 1
    lab: dict = field(default_factory=dict)  # lab cases: preset, overrides, point
    docs: int = 0  # rows of the large table the `doc=N` lookups read (about 1 KB each)
    db_memory: int | None = None  # MiB: the db's memory cap (its page cache included)
    db_read_iops: int | None = None  # the db's reads from its disk, per second

    def definition(self) -> dict:
        d = asdict(self)
        d.pop("subsets")
        return d

    @property
    def label(self) -> str:
        return label(self.kind, self.roles)


def label(kind: str, roles) -> str:
    return kind if kind in ("none", "insufficient", "error") else f"{kind} {'+'.join(sorted(roles))}"


def _pause(target: str, lo: float, hi: float, period: float = 1.0) -> dict:
    return {"kind": "pause", "target": target, "period": period, "min_ms": lo, "max_ms": hi, "jitter": 0.2}


def _burn(target: str, on: float, off: float) -> dict:
    return {"kind": "burn", "target": target, "on": on, "off": off}


# Units of work per request, per system (calibrated so that one unit is ~1 ms of one core).
def app_cases(system: str) -> list[Case]:
    s = system
    py = s == "flask"
    out: list[Case] = []
    # 1. nothing saturated: light load, spare capacity everywhere
    for users, q in ((5, 2), (15, 3)):
        out.append(Case(f"{s}-none-u{users}", s, "none", (), "light load, every tier well below its capacity",
                        users=users, think=0.5, mix=((1.0, f"/page?q={q}&cpu=1"),),
                        checks={"app_sat": (None, 0.5), "db_sat": (None, 0.5)},
                        subsets=("fast",) if (not py and users == 5) else ()))  # fmt: skip
    # 2. the app paused (GC-like) while the db has spare capacity: the app alone is at fault
    for users, lo, hi in ((15, 100, 150), (30, 150, 200)):
        out.append(Case(f"{s}-apppause-u{users}-{hi}ms", s, "single", ("app",),
                        f"app SIGSTOPped {lo}-{hi} ms about once a second; db lightly loaded",
                        users=users, think=0.3, mix=((1.0, "/page?q=2&cpu=1"),),
                        fault=_pause("app", lo, hi),
                        checks={"pauses": 9, "db_sat": (None, 0.5), "db_after_pause": (None, 0.2)},
                        subsets=("fast",) if (py and users == 15) else ()))  # fmt: skip
    # 3. the app paused while the db runs near its capacity: the burst after each pause saturates the
    #    db -- the alternating bottleneck of seed 001
    for users, dbcpu, lo, hi in ((14, 3000, 150, 190), (24, 2200, 120, 170)):
        out.append(Case(f"{s}-alternating-u{users}-{hi}ms", s, "alternating", ("app", "db"),
                        f"app SIGSTOPped {lo}-{hi} ms about once a second; db on half a core, "
                        "busy 40-90 % on average, saturated by the burst after each pause",
                        users=users, think=0.4, db_cpu=0.5, mix=((1.0, f"/page?q=1&dbcpu={dbcpu}"),),
                        fault=_pause("app", lo, hi),
                        checks={"pauses": 9, "db_util": (0.3, 0.9), "db_after_pause": (0.5, None),
                                "resp_p50_ms": (None, 100)},
                        subsets=("fast",) if (py and users == 14) else ()))  # fmt: skip
    # 4. the database paused (all of PostgreSQL SIGSTOPped)
    for users, lo, hi in ((15, 100, 150), (20, 150, 200)):
        out.append(Case(f"{s}-dbpause-u{users}-{hi}ms", s, "single", ("db",),
                        f"every PostgreSQL process SIGSTOPped {lo}-{hi} ms about once a second; app lightly loaded",
                        users=users, think=0.3, mix=((1.0, "/page?q=2" if py and users == 20 else "/page?q=2&cpu=1"),),
                        fault=_pause("db", lo, hi),
                        checks={"pauses": 9, "app_sat": (None, 0.6 if users == 15 else 0.7),
                                "app_after_pause": (None, 0.2)}))  # fmt: skip
    # 5. CPU-bound app: one Python process (the GIL) / Node's one event loop
    for users, cpu in ((20, 12), (40, 20)):
        out.append(Case(f"{s}-appcpu-u{users}-{cpu}", s, "single", ("app",),
                        ("one gunicorn worker, 16 threads: CPU in the handler under one GIL" if py else
                         "CPU in the handler on Node's single event loop") + "; db idle",
                        users=users, think=0.2, workers=1, threads=16, mix=((1.0, f"/page?q=1&cpu={cpu}"),),
                        checks={"app_sat": (0.85, None), "db_sat": (None, 0.3)},
                        subsets=("fast",) if (not py and users == 20) else ()))  # fmt: skip
    # 6. CPU-bound database: CPU in SQL, PostgreSQL capped by its cgroup
    for users, dbcpu, cores in ((20, 3000, 0.25), (40, 5000, 0.5)):
        out.append(Case(f"{s}-dbcpu-u{users}-{cores}c", s, "single", ("db",),
                        f"md5 over generate_series in every query, PostgreSQL capped at {cores} core",
                        users=users, think=0.2, db_cpu=cores, mix=((1.0, f"/page?q=1&dbcpu={dbcpu}"),),
                        **({"pool": 48, "threads": 64} if users == 20 else {}),
                        checks={"db_sat": (0.85, None), "app_sat": (None, 0.7)},
                        subsets=("fast",) if (py and users == 20) else ()))  # fmt: skip
    # 7. connection-pool exhaustion: two connections, slow (sleeping) queries; the db does no work
    for users, sleep in ((30, 40), (50, 25)):
        out.append(Case(f"{s}-pool-u{users}-{sleep}ms", s, "single", ("app",),
                        f"a pool of 2 connections, each request holds one for a {sleep} ms pg_sleep: "
                        "requests wait for a connection in the app (a soft resource); db CPU idle",
                        users=users, think=0.2, pool=2, mix=((1.0, f"/page?q=1&sleep={sleep}"),),
                        checks={"db_active": 1.5, "db_sat": (None, 0.3), "app_sat": (None, 0.7)}))  # fmt: skip
    # 8. row-lock contention: every request updates the one hot row and holds its lock
    # (the Flask shop spends ~5 ms of CPU per request under its one GIL: fewer users keep it unsaturated)
    for users, hot in ((10, 25), (14, 20)) if py else ((20, 15), (40, 12)):
        out.append(Case(f"{s}-rowlock-u{users}-{hot}ms", s, "single", ("db",),
                        f"every request updates one hot row and holds its lock {hot} ms: requests queue on "
                        "the row lock in PostgreSQL",
                        users=users, think=0.1 if py else 0.2, pool=48, threads=64, mix=((1.0, f"/page?hot={hot}"),),
                        checks={"lock_wait": 1.0, "app_sat": (None, 0.7)}))  # fmt: skip
    # 9. a heavy query class among light ones saturates the database
    for users, heavy, share in ((10, 55000, 0.1), (14, 15000, 0.2)) if py else ((20, 20000, 0.1), (40, 8000, 0.2)):
        out.append(Case(f"{s}-heavyclass-u{users}-{int(share * 100)}pct", s, "single", ("db",),
                        f"{int(share * 100)} % of requests run a heavy SQL query, the rest primary-key "
                        "lookups; PostgreSQL capped at half a core",
                        users=users, think=0.2, db_cpu=0.5, pool=48, threads=64,
                        mix=((1 - share, "/page?q=2"), (share, f"/page?q=1&dbcpu={heavy}")),
                        checks={"db_sat": (0.85, None), "app_sat": (None, 0.7)}))  # fmt: skip
    # 10. a bursty noisy neighbour in the database's cgroup
    for users, on in ((20, 1.0), (25, 0.5)):
        out.append(Case(f"{s}-noisydb-u{users}-{on}s", s, "single", ("db",),
                        f"a CPU burner joins PostgreSQL's half-core cgroup {on} s on / {on} s off; the db, busy "
                        "about half its share alone, saturates whenever the burner runs",
                        users=users, think=0.2, db_cpu=0.5, pool=48, threads=64,
                        mix=((1.0, f"/page?q=1&dbcpu={800 if users != 20 else 1200}"),),
                        fault=_burn("db", on, on), checks={"bursts": 5, "db_sat": (0.85, None)}))  # fmt: skip
    # 11. ... and in the app's cgroup
    for users, on in ((20, 1.0), (25, 0.5)):
        out.append(Case(f"{s}-noisyapp-u{users}-{on}s", s, "single", ("app",),
                        f"a CPU burner joins the app's half-core cgroup {on} s on / {on} s off; the app, busy "
                        "about half its share alone, saturates whenever the burner runs",
                        users=users, think=0.2, app_cpu=0.5, mix=((1.0, "/page?q=1&cpu=2"),),
                        fault=_burn("app", on, on), checks={"bursts": 5, "app_sat": (0.85, None)}))  # fmt: skip
    # 12. a disk-bound database: a table three times the db's memory cap, read at random, from a disk
    #     that serves 150-250 reads a second (a small cloud volume); the db's CPU idles. The pool holds a
    #     connection per user: requests queue at the disk, not for a connection
    for users, doc, iops in ((15 if py else 20, 4, 250), (25, 3, 150)):
        out.append(Case(f"{s}-diskdb-u{users}-{iops}iops", s, "single", ("db",),
                        f"{doc} random lookups a request in a ~800 MB table; PostgreSQL's memory capped at "
                        f"256 MiB (its cache with it) and its disk reads at {iops} a second: requests queue "
                        "on the disk, the db's CPU idles",
                        users=users, think=0.2, pool=users + 2, threads=64, mix=((1.0, f"/page?doc={doc}"),),
                        docs=800_000, db_memory=256, db_read_iops=iops,
                        checks={"io_wait": 1.0, "db_sat": (None, 0.5), "app_sat": (None, 0.7)},
                        subsets=("fast",) if (py and users == 15) else ()))  # fmt: skip
    return out


def lab_cases() -> list[Case]:
    """tierscope's own lab (RUBBoS on namespaced hosts), analysed from the tracer's capture."""
    return [
        Case("lab-alternating-u80", "lab", "alternating", ("app", "db"),
             "demo-alternating preset: app SIGSTOPped 150 ms a second, db on a quarter core half busy; "
             "the burst after each pause saturates the db",
             lab={"preset": "demo-alternating", "users": [80], "run": "30s", "point": 0},
             checks={"pauses": 15, "db_util": (0.3, 0.9)}),
        Case("lab-demo-u20", "lab", "none", (),
             "demo preset at 20 users: the quarter-core db is far from its ~90 pages/s",
             lab={"preset": "demo", "users": [20, 400], "run": "20s", "point": 0},
             checks={"db_util": (None, 0.6)}),
        Case("lab-demo-u400", "lab", "single", ("db",),
             "demo preset at 400 users: the quarter-core db saturated",
             lab={"preset": "demo", "users": [20, 400], "run": "20s", "point": 1},
             checks={"db_util": (0.85, None)}),
    ]  # fmt: skip


def all_cases() -> list[Case]:
    return app_cases("flask") + app_cases("express") + lab_cases()


def select(subset: str) -> list[Case]:
    cases = all_cases()
    if subset == "full":
        return cases
    return [c for c in cases if subset in c.subsets]
