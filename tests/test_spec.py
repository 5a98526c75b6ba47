"""The experiment spec: the #W/#A/#C/#D notation, validation errors that name the key, expansion."""

import pytest

from conftest import EXAMPLES, PRESETS
from tierscope.spec import (
    SpecError,
    expand,
    load_spec,
    parse_duration,
    parse_notation,
    parse_size,
    parse_spec,
)

MIN = "[workload]\nusers = [10]\n"


def points(text: str):
    return expand(parse_spec(text, where="t.toml"))


def error_of(text: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(text, where="t.toml")
    return str(info.value)


# --- notation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, counts, types, dbms",
    [
        ("1/2/0/1L", (1, 2, 0, 1), (None, None, None, "L"), None),
        ("1L/2S/0/1S-P", (1, 2, 0, 1), ("L", "S", None, "S"), "postgres"),
        ("1L/2S/1L/2S", (1, 2, 1, 2), ("L", "S", "L", "S"), None),  # seed 001's SysA
        ("1/1/1/1M", (1, 1, 1, 1), (None, None, None, None), "mariadb"),  # seed 000
        ("1/2/1/9ML", (1, 2, 1, 9), (None, None, None, "L"), "mariadb"),  # seed 000
        ("1/1/0/1P", (1, 1, 0, 1), (None, None, None, None), "postgres"),
        ("1/1/0/2-M", (1, 1, 0, 2), (None, None, None, None), "mariadb"),
        (" 1 / 3 / 0 / 12X-P ", (1, 3, 0, 12), (None, None, None, "X"), "postgres"),
    ],
)
def test_notation_parses_counts_node_types_and_dbms(text, counts, types, dbms):
    t = parse_notation(text)
    tiers = ("web", "app", "middleware", "db")
    assert tuple(t[k]["count"] for k in tiers) == counts
    assert tuple(t[k]["node_type"] for k in tiers) == types
    assert t["db"]["dbms"] == dbms


@pytest.mark.parametrize(
    "text, needle",
    [
        ("1/2/0", "expected four fields #W/#A/#C/#D"),
        ("1/2/0/1/1", "(5 fields)"),
        ("1/2M/0/1", "M is a DBMS letter, only allowed in the database field"),
        ("1/x/0/1", "app field 'x': expected a count"),
        ("1/1/0/1S-Q", "DBMS letter 'Q': expected M (MariaDB) or P (PostgreSQL)"),
        ("1/1/0/1-L", "DBMS letter 'L': expected M (MariaDB) or P (PostgreSQL)"),
        ("1/1/0/L", "database field 'L'"),
        ("1/1/0/1P-M", "database field '1P-M'"),
    ],
)
def test_notation_rejects_bad_fields_with_the_reason(text, needle):
    with pytest.raises(ValueError) as info:
        parse_notation(text)
    assert needle in str(info.value)


def test_omitted_node_type_is_the_default_and_omitted_dbms_the_spec_dbms():
    (p,) = points('topology = "1/2/0/1"\ndbms = "M"\n' + MIN)
    assert [(s.name, s.node_type) for s in p.config.servers()] == [
        ("web1", "S"), ("app1", "S"), ("app2", "S"), ("db1", "S"),
    ]  # fmt: skip
    assert p.config.topology.db.dbms == "mariadb"
    assert p.config.notation() == "1S/2S/0/1S-M"
    (q,) = points('topology = "1/1/0/1L"\ndefault_node_type = "L"\n' + MIN)
    assert {s.node_type for s in q.config.servers()} == {"L"}
    assert q.config.topology.db.dbms == "postgres"  # the default DBMS


def test_explicit_topology_table_with_per_server_node_types():
    text = """
[topology.web]
count = 1
[topology.app]
count = 3
node_type = ["L", "S", "L"]
[topology.middleware]
count = 1
[topology.db]
count = 2
node_type = "L"
dbms = "postgres"
[workload]
users = 5
"""
    (p,) = points(text)
    assert [(s.name, s.node_type) for s in p.config.servers()] == [
        ("web1", "S"), ("app1", "L"), ("app2", "S"), ("app3", "L"), ("mw1", "S"), ("db1", "L"), ("db2", "L"),
    ]  # fmt: skip
    assert p.config.topology.db.dbms == "postgres"
    msg = error_of(text.replace('["L", "S", "L"]', '["L", "S"]'))
    assert "t.toml: topology.app: " in msg and "expected 3 entries, got 2" in msg


# --- validation errors name the file and key path ---------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ('topology = "1/2/0"\n' + MIN, "t.toml: topology: expected four fields"),
        (
            'topology = "1/1/0/1Q"\n' + MIN,
            "t.toml: topology.db: node type 'Q' is not defined (defined: L, S; add a [node_types.Q] table)",
        ),
        (
            "[workload]\nusers = [10]\nthink_tme = 3\n",
            "t.toml: workload.think_tme: unknown key (expected one of: users, think_time, dispersion, "
            "session_min, ramp_up, run, ramp_down)",
        ),
        ("[workload]\nusers = [0]\n", "t.toml: workload.users[0]: Input should be greater than or equal to 1"),
        ('[workload]\nusers = "5..1"\n', "t.toml: workload.users: expected from <= to and step > 0"),
        (
            '[workload]\nusers = [1]\nrun = "fast"\n',
            't.toml: workload.run: expected a duration such as 30, "50ms", "1.5s" or "2m", got \'fast\'',
        ),
        (
            MIN + '[monitor]\ninterval = "10ms"\n',
            "t.toml: monitor.interval: expected a resource interval between 50ms and 60s, got 0.01s",
        ),
        (MIN + "[node_types.X]\ncpu = -1\n", "t.toml: node_types.X.cpu: Input should be greater than 0"),
        (MIN + '[node_types.L]\nmemory = "lots"\n', "t.toml: node_types.L.memory: expected a size such as"),
        (MIN + "[node_types.P]\ncpu = 1\n", "node type 'P': expected one upper-case letter other than M and P"),
        (MIN + '[node_types.X]\ncpus = "one"\n', "t.toml: node_types.X.cpus: expected a CPU list"),
        ('[monitor]\ninterval = "1s"\n', "t.toml: workload: missing required key"),
        (
            MIN + '[[interference.pause]]\ntier = "app"\nperiod = "1s"\nduration = "2s"\n',
            "t.toml: interference.pause[0]: expected 0 < duration < period, got duration 2s and period 1s",
        ),
        (
            MIN + '[[interference.pause]]\nserver = "app7"\nperiod = "1s"\nduration = "200ms"\n',
            "t.toml: interference.pause[0].server: no server 'app7' in this topology (servers: app1, db1, web1)",
        ),
        (
            MIN + '[[interference.pause]]\nperiod = "1s"\nduration = "200ms"\n',
            "t.toml: interference.pause[0]: expected exactly one of tier",
        ),
        (
            MIN + '[[interference.noisy_neighbour]]\ntier = "db"\nutilization = 0.5\nburstiness = 0.5\n',
            "t.toml: interference.noisy_neighbour[0].burstiness: Input should be greater than or equal to 1",
        ),
        (
            'mix = "shopping"\n' + MIN,
            "t.toml: mix: expected one of browse_only, read_write, read_write_paged, got 'shopping'",
        ),
        ('topology = "0/1/0/1"\n' + MIN, "t.toml: topology.web: RUBBoS needs at least one web server"),
        (MIN + "[soft.app]\nthreads = 0\n", "t.toml: soft.app.threads: Input should be greater than or equal to 1"),
        (MIN + "[soft.db]\ncache = true\n", "t.toml: soft.db.cache: expected a size"),
        ("[workload\nusers = [1]\n", "t.toml: not valid TOML: "),
        (
            MIN + '[sweep.matrix]\n"workload.think_time" = ["fast"]\n',
            't.toml: workload.think_time: expected a duration such as 30, "50ms", "1.5s" or "2m", '
            "got 'fast' [sweep point workload.think_time='fast']",
        ),
        (
            MIN + '[sweep.matrix]\ntopology = "1/1/0/1"\n',
            "t.toml: sweep.matrix.topology: expected a list of values to sweep, got '1/1/0/1'",
        ),
        (
            MIN + '[sweep]\nfilters = ["__import__(1)"]\n',
            "t.toml: sweep.filters[0]: '__import__(1)': Call is not allowed",
        ),
        (MIN + '[sweep]\nfilters = ["foo > 1"]\n', "t.toml: sweep.filters[0]: 'foo > 1': unknown name 'foo'"),
        (MIN + '[sweep]\nfilters = ["users > 100"]\n', "t.toml: sweep.filters: no point is left after the filters"),
        (MIN + "[sweep]\nrepeats = 0\n", "t.toml: sweep.repeats: Input should be greater than or equal to 1"),
        (
            MIN + "[sweep]\nrepeat = 2\n",
            "t.toml: sweep.repeat: unknown key (expected one of: matrix, filters, repeats)",
        ),
        (
            MIN + "[node_types.X]\ncpuu = 1\n",
            "t.toml: node_types.X.cpuu: unknown key (expected one of: description, cpu, cpus, cpu_period, memory,",
        ),
        (
            MIN + '[[interference.pause]]\ntier = "app"\nperiod = "1s"\nduration = "1ms"\nlength = 2\n',
            "t.toml: interference.pause[0].length: unknown key (expected one of: tier, server, period, duration,",
        ),
        (
            "scale = -1\n" + MIN,
            "t.toml: scale: expected a fraction of the paper's data set (0 < scale <= 100) or a preset name (rubbos: tiny, small, paper; tpcw: tiny, small, large, paper), got -1",
        ),
        (
            'scale = "huge"\n' + MIN,
            "t.toml: scale: expected a fraction of the paper's data set (0 < scale <= 100) or one of tiny, small, paper, got 'huge'",
        ),
        ("scale = true\n" + MIN, "t.toml: scale: expected a fraction"),
        ("colour = 1\n" + MIN, "t.toml: colour: unknown key"),
        (
            'topology = "1/1/1/2"\n' + MIN + '[soft.middleware]\npolicy = "wrr"\nweights = [1, 2, 3]\n',
            "t.toml: soft.middleware.weights: expected one weight per database server (2), one of them > 0",
        ),
        (
            'topology = "1/1/1/2"\n' + MIN + "[soft.middleware]\nweights = [1, 2]\n",
            "soft.middleware.weights: only with policy = \"wrr\" (policy is 'lprf')",
        ),
        (
            'topology = "1/1/1/2"\n' + MIN + '[soft.middleware]\nimplementation = "java"\n',
            't.toml: soft.middleware.implementation: expected "rust" (the only middleware, `tierscope-engine '
            "middleware`), got 'java'",
        ),
        (
            'topology = "1/1/1/2"\n' + MIN + '[soft.middleware]\nimplementation = "python"\n',
            "t.toml: soft.middleware.implementation: the Python middleware (`python -m tierscope.middleware`) was "
            "removed (issue 25)",
        ),
        (
            'topology = "1/1/1/2"\n' + MIN + '[soft.middleware]\npolicy = "random"\n',
            "t.toml: soft.middleware.policy: Input should be 'lprf', 'rr', 'wrr', 'lrt' or 'aware'",
        ),
        (
            'topology = "1/1/0/2"\n' + MIN,
            "t.toml: topology: the topology has 2 database servers and no clustering middleware",
        ),
        (
            'topology = "1/1/1/2"\n' + MIN + '[soft.middleware]\nscheduler = "table"\n',
            "t.toml: soft.middleware.scheduler: Input should be 'lock' or 'rows'",
        ),
        (
            'topology = "1/1/1/2M"\n' + MIN + '[soft.middleware]\nscheduler = "rows"\n',
            't.toml: soft.middleware.scheduler: "rows" needs PostgreSQL database servers (the DBMS is mariadb;',
        ),
    ],
)
def test_bad_specs_name_the_key_and_what_was_expected(text, expected):
    assert expected in error_of(text)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "nope.toml")
    assert str(tmp_path / "nope.toml") in str(info.value) and "cannot read" in str(info.value)


def test_a_spec_that_is_not_utf8_names_line_and_column(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'name = "x"\n# caf\xe9\n' + MIN.encode())
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}:2:6: not UTF-8 (byte 0xe9)")


# --- scalars -----------------------------------------------------------------------------------


def test_durations_and_sizes():
    assert parse_duration(30) == 30.0
    assert parse_duration("50ms") == pytest.approx(0.05)
    assert parse_duration("2m") == 120.0
    assert parse_duration("100us") == pytest.approx(1e-4)
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("512M") == 512 * 2**20
    assert parse_size("100MB") == 100_000_000
    assert parse_size("1.5G") == int(1.5 * 2**30)
    assert parse_size(4096) == 4096
    for bad in ("5 parsecs", "-1s", True):
        with pytest.raises(ValueError):
            parse_duration(bad)
    with pytest.raises(ValueError):
        parse_size("12 bananas")


# --- expansion ---------------------------------------------------------------------------------


def test_users_range_gives_one_point_per_level_like_the_papers():
    pts = points("[workload]\nusers = { from = 1000, to = 13000, step = 1000 }\n")
    assert [p.config.workload.users for p in pts] == [[u] for u in range(1000, 13001, 1000)]
    assert [p.params["workload.users"] for p in pts] == list(range(1000, 13001, 1000))
    assert len(points('[workload]\nusers = "1000..13000 step 1000"\n')) == 13


def test_sweep_is_the_cartesian_product_then_filters_then_repeats():
    text = """
topology = "1/1/0/1"
[workload]
users = [100, 200, 300]
[sweep]
repeats = 2
filters = ["users < 300 or app == 2"]
[sweep.matrix]
topology = ["1/1/0/1L", "1/2/0/1L-M"]
node_types.L.cpu = [0.25, 0.5]
"""
    pts = points(text)
    # per repeat: topology 1/1: 2 cpus x 2 users (300 filtered); 1/2: 2 cpus x 3 users = 10
    assert len(pts) == 2 * (2 * 2 + 2 * 3)
    assert [p.index for p in pts] == list(range(20))
    first = pts[0]
    assert first.params == {"topology": "1/1/0/1L", "node_types.L.cpu": 0.25, "workload.users": 100}
    assert first.config.node_types["L"].cpu == 0.25
    assert first.config.node_types["L"].memory == 512 * 2**20  # the built-in L keeps its memory
    assert {p.config.topology.db.dbms for p in pts if p.config.topology.app.count == 2} == {"mariadb"}
    assert all(p.params["workload.users"] < 300 or p.config.topology.app.count == 2 for p in pts)
    assert len({p.id for p in pts}) == 20  # ids are unique
    # the seeds: one per workload level and repeat, the same for every configuration compared
    # there (common random numbers), another for the next repeat
    by_draw = {(p.params["workload.users"], p.repeat): p.seed for p in pts}
    assert all(p.seed == by_draw[(p.params["workload.users"], p.repeat)] for p in pts)
    assert len(set(by_draw.values())) == len(by_draw) == 2 * 3
    assert {p.repeat for p in pts} == {0, 1}
    assert pts[0].id.startswith("topology1_1_0_1L-cpu0.25-users100-r0-")


def test_point_ids_are_stable_and_change_with_the_configuration():
    text = '[workload]\nusers = [10, 20]\nrun = "30s"\n'
    a, b = points(text), points(text)
    assert [p.id for p in a] == [p.id for p in b]
    assert [p.seed for p in a] == [p.seed for p in b]
    c = points(text.replace('"30s"', '"31s"'))
    assert {p.id for p in a}.isdisjoint({p.id for p in c})
    d = points('description = "same run, other words"\n' + text)
    assert [p.id for p in d] == [p.id for p in a]


def test_filters_see_spec_keys_and_arithmetic():
    text = MIN.replace("[10]", "[10, 20, 40]") + '[sweep]\nfilters = ["workload.users * 2 in [20, 80]"]\n'
    assert [p.params["workload.users"] for p in points(text)] == [10, 40]


def test_node_types_interference_and_soft_resources_resolve():
    text = """
topology = "1/2/0/1X-P"
[node_types.X]
cpus = "1"
memory = "256MiB"
disk_read_bps = "10MB"
disk_write_iops = 200
[soft.app]
threads = 32
db_pool = 12
[soft.db]
cache = "64MiB"
[workload]
users = [10]
think_time = "7s"
dispersion = 100
[monitor]
interval = "50ms"
[[interference.pause]]
tier = "app"
period = "1s"
duration = "100ms"
[[interference.noisy_neighbour]]
server = "db1"
utilization = 0.3
burstiness = 400
"""
    (p,) = points(text)
    c = p.config
    x = c.node_types["X"]
    assert (x.cpus, x.memory, x.disk_read_bps, x.disk_write_iops) == ("1", 256 * 2**20, 10**7, 200)
    assert x.cores(machine_cores=2) == 1.0
    assert c.soft.app.threads == 32 and c.soft.app.db_pool == 12 and c.soft.db.cache == 64 * 2**20
    assert c.soft.web.workers == 1  # defaults fill what is not given
    assert c.workload.think_time == 7.0 and c.workload.dispersion == 100
    assert c.monitor.interval == pytest.approx(0.05) and c.monitor.capture is True
    assert c.interference.pause[0].tier == "app"
    assert c.interference.noisy_neighbour[0].burstiness == 400
    assert [s.name for s in c.tier_servers("app")] == ["app1", "app2"]


@pytest.mark.parametrize("name", ["tiny.toml", "demo.toml", "demo-alternating.toml", "tpcw-memory.toml"])
def test_example_specs_load(name):
    pts = expand(load_spec((EXAMPLES if name == "tiny.toml" else PRESETS) / name))
    assert pts, name
    if name == "tiny.toml":
        assert len(pts) == 2
    if name == "demo.toml":
        assert len(pts) == 4 and pts[0].config.monitor.capture
        c = pts[0].config
        assert c.mix == "browse_only" and c.topology.db.dbms == "postgres"
        per_point = c.workload.ramp_up + c.workload.run + c.workload.ramp_down
        assert 4 * per_point < 240  # leaves time for start/stop and the data load within 5 min
    if name == "demo-alternating.toml":
        assert pts[0].config.interference.pause[0].tier == "app"
    if name == "tpcw-memory.toml":  # 3 memory sizes x 5 levels; fsync on, the cache warmed, reads limited
        assert len(pts) == 15
        assert sorted({p.params["node_types.D.memory"] for p in pts}) == ["128MiB", "1GiB", "330MiB"]
        c = pts[0].config
        assert c.benchmark == "tpcw" and c.soft.db.fsync and c.soft.db.warm
        assert c.node_types["D"].disk_read_ms == 16.7 and c.node_types["D"].read_iops_limit() == 60
        assert c.soft.app.workers * c.soft.app.db_pool == 2 and c.workload.session_min == 20


def test_demo_memory_is_the_memory_study_cut_to_two_sizes_and_two_levels_within_five_minutes():
    from tierscope.cli.demo import MEMORY_DEMO
    from tierscope.cli.run import changed_spec

    pts = expand(changed_spec(PRESETS / "tpcw-memory.toml", MEMORY_DEMO))
    assert [(p.params["node_types.D.memory"], p.params["workload.users"]) for p in pts] == [
        ("128MiB", 50),
        ("128MiB", 400),
        ("1GiB", 50),
        ("1GiB", 400),
    ]
    w = pts[0].config.workload
    # about 21 s of warm-up read and 10 s of starting and stopping per point, the load once
    assert 4 * (w.ramp_up + w.run + w.ramp_down + 31) + 25 < 300


def test_the_complete_example_in_the_docs_is_valid():
    doc = (EXAMPLES.parent.parent / "docs" / "spec.md").read_text()
    section = doc.split("## A complete example", 1)[1]
    toml = section.split("```toml\n", 1)[1].split("```", 1)[0]
    pts = expand(parse_spec(toml, where="docs/spec.md"))
    assert len(pts) == 7  # as the text below the example says
    c = pts[0].config
    assert c.client.node_type == "C" and c.node_types["C"].cpus == "1"
    assert c.node_types["S"].cpu == 0.5 and c.node_types["S"].memory == 2 * 2**30
    assert "changed: cpu=0.5" in c.node_types["S"].description


def test_scale_is_a_fraction_or_a_preset_the_data_generator_knows():
    (p,) = points('scale = "small"\n' + MIN)
    assert p.config.scale == "small"
    (q,) = points("scale = 0.5\n" + MIN)
    assert q.config.scale == 0.5
    from tierscope.apps.rubbos import datagen
    from tierscope.spec import SCALE_PRESETS

    assert set(SCALE_PRESETS["rubbos"]) == set(datagen.PRESETS)


def test_the_rust_middleware_takes_the_aware_policy_and_labels(tmp_path):
    """Issue 25: `implementation = "rust"` (the only middleware, still accepted) with `policy = "aware"`
    and `labels`; the Middleware service starts `tierscope-engine middleware` with both flags."""
    from tierscope.services.middleware import Middleware
    from tierscope.testbed.host import Host

    text = (
        'topology = "1/1/1/2"\n' + MIN + '[soft.middleware]\nimplementation = "rust"\npolicy = "aware"\nlabels = true\n'
    )
    (pt,) = points(text)
    mw = pt.config.soft.middleware
    assert (mw.implementation, mw.policy, mw.labels) == ("rust", "aware", True)
    svc = Middleware(
        Host.loopback("mw1"),
        25322,
        tmp_path / "mw1",
        backends=["127.0.0.1:5433", "127.0.0.1:5434"],
        user="u",
        password="p",
        policy=mw.policy,
        labels=mw.labels,
    )
    argv = svc.command()
    exe = next(i for i, a in enumerate(argv) if a.endswith("tierscope-engine"))  # after setpriv as root
    assert argv[exe + 1] == "middleware"
    assert argv[argv.index("--policy") + 1] == "aware" and "--labels" in argv
