"""A study's finding across its configurations and its configurations' labels by what differs
(issue 22, item 2): `tierscope.analysis.study` on synthetic configurations and figures, the
claims of presets/studies.toml, and the finding of a small synthetic run directory (no lab)."""

from __future__ import annotations

import json
import tomllib

import pytest

from conftest import PRESETS
from tierscope.analysis.alternation import Verdict
from tierscope.analysis.study import (
    Finding,
    bottleneck_finding,
    busiest_finding,
    check_claim,
    compare_finding,
    configuration_labels,
    field_words,
    loss_finding,
    ratio_finding,
    value_words,
    verdict_finding,
)

# --- labels ------------------------------------------------------------------------------------


def test_a_memory_sweep_is_named_by_the_db_hosts_memory_not_by_its_topology():
    configs = [{"topology": "1W/1A/0/1D-P", "node_types.D.memory": m} for m in ("150MiB", "300MiB", "1GiB")]
    assert configuration_labels(configs) == ["db memory 150 MiB", "db memory 300 MiB", "db memory 1 GiB"]


def test_a_topology_sweep_is_named_by_its_topologies_and_two_fields_by_both():
    tops = ["1W/1A/1C/1L", "1W/1A/1C/2L"]
    assert configuration_labels([{"topology": t} for t in tops]) == tops
    grid = [{"topology": t, "soft.middleware.policy": p} for t in tops for p in ("lprf", "aware")]
    assert configuration_labels(grid) == [
        "1W/1A/1C/1L, middleware policy lprf",
        "1W/1A/1C/1L, middleware policy aware",
        "1W/1A/1C/2L, middleware policy lprf",
        "1W/1A/1C/2L, middleware policy aware",
    ]


def test_the_neighbours_burstiness_and_fields_alike_everywhere_are_left_out():
    configs = [
        {"topology": "1W/1A/0/1L-P", "interference.noisy_neighbour.0.burstiness": i, "seed": 42} for i in (1, 400)
    ]
    assert configuration_labels(configs) == ["neighbour burstiness 1", "neighbour burstiness 400"]


def test_one_configuration_is_its_topology_and_alike_ones_are_numbered():
    assert configuration_labels([{"topology": "1W/1A/0/1L-P"}]) == ["1W/1A/0/1L-P"]
    assert configuration_labels([{}]) == ["this system"]
    assert configuration_labels([{"topology": "1/1/0/1"}] * 2) == ["configuration 1", "configuration 2"]


def test_field_and_value_words():
    assert field_words("node_types.L.cpu", "1W/2A/1C/2L") == "db CPU"
    assert field_words("node_types.A.memory", "1W/2A/1C/2L") == "app memory"
    assert field_words("node_types.X.memory", "1W/2A/1C/2L") == "node type X memory"  # no tier uses X
    assert field_words("node_types.D.disk_read_iops", "1W/1A/0/1D-P") == "db disk read IOPS"
    assert field_words("workload.think_time") == "think time"
    assert value_words("64MiB") == "64 MiB" and value_words(True) == "on" and value_words(0.25) == "0.25"


# --- findings ----------------------------------------------------------------------------------


DISK = {"host": "db1", "tier": "db", "resource": "disk", "share": 0.76}
CPU_QUOTA = {"host": "db1", "tier": "db", "resource": "CPU quota", "share": 0.89}


def _memory_figs(second):
    figs = [
        {
            "label": "db memory 150 MiB",
            "params": {"m": "150MiB"},
            "bottleneck": DISK,
            "users": 400,
            "max_throughput": 41,
        },
        {
            "label": "db memory 1 GiB",
            "params": {"m": "1GiB"},
            "bottleneck": second,
            "users": 400,
            "max_throughput": 179,
        },
    ]
    for f in figs:
        f["parts"] = [("db memory", f["label"].removeprefix("db memory "))]
    if second is None:
        figs[1]["busiest"] = {"host": "app1", "resource": "CPU", "mean": 62.4}
    return figs


def test_the_memory_finding_names_each_configurations_bottleneck_and_holds():
    f = bottleneck_finding(_memory_figs(CPU_QUOTA), {"150MiB": "db disk", "1GiB": "db CPU"})
    assert f.text == (
        "db memory 150 MiB: disk-bound (db1 disk above 95 % in 76 % of the samples at 400 users), max 41 req/s; "
        "1 GiB: CPU-bound (db1 CPU above 95 % in 89 % of the samples at 400 users), max 179 req/s"
    )
    assert f.holds is True
    assert "Finding" not in f.line() and f.line().endswith(
        "holds: db disk at db memory 150 MiB, db CPU at db memory 1 GiB"
    )


def test_the_memory_finding_does_not_hold_when_the_big_memory_is_not_cpu_bound():
    f = bottleneck_finding(_memory_figs(None), {"150MiB": "db disk", "1GiB": "db CPU"})
    assert f.holds is False
    assert "1 GiB: no saturated resource (busiest: app1 CPU, mean 62 %)" in f.text
    assert f.why == "db memory 1 GiB: expected db CPU, found no saturated resource (busiest: app1 CPU, mean 62 %)"


def test_a_claimed_configuration_that_was_not_run_leaves_the_finding_undecided():
    figs = _memory_figs(CPU_QUOTA)[:1]
    f = bottleneck_finding(figs, {"150MiB": "db disk", "1GiB": "db CPU"})
    assert f.holds is None and f.why == "no result for 1GiB"
    assert bottleneck_finding(figs, None).holds is None
    assert bottleneck_finding([], {"*": "db"}).holds is None


def test_the_neighbour_ratio_is_the_bursty_mean_response_time_over_the_steady_one():
    steady = {"label": "neighbour burstiness 1", "rt_mean": 0.040, "cpu": {"db1": 80.0}}
    bursty = {"label": "neighbour burstiness 400", "rt_mean": 0.124, "cpu": {"db1": 84.0}}
    f = ratio_finding([steady, bursty], 1.5, host="db1", same_cpu=0.15)
    assert f.holds is True
    ratio = 0.124 / 0.040
    assert f.text.startswith(f"mean response time {ratio:.1f}x higher with neighbour burstiness 400 than with ")
    parts = {"parts": [("neighbour burstiness", "1")]}
    short = ratio_finding([steady | parts, bursty | {"parts": [("neighbour burstiness", "400")]}], 1.5)
    assert short.text.startswith(f"mean response time {ratio:.1f}x higher with neighbour burstiness 400 than with 1 (")
    assert "(124 ms against 40 ms) at db1 CPU 84 % against 80 %" in f.text
    # below the claimed ratio; or at an unequal mean CPU (84 / 60 - 1 = 40 % > 15 %)
    assert ratio_finding([steady, bursty], 3.5, host="db1").holds is False
    unequal = ratio_finding([steady | {"cpu": {"db1": 60.0}}, bursty], 1.5, host="db1", same_cpu=0.15)
    assert unequal.holds is False and unequal.why.startswith(f"db1's mean CPU differs by {100 * (84 / 60 - 1):.0f} %")
    assert ratio_finding([steady], 1.5).holds is None
    assert ratio_finding([steady | {"cpu": {}}, bursty], 1.5, host="db1").holds is None


def test_the_balancer_comparison_holds_only_where_it_is_claimed():
    def fig(top, policy, p90):
        return {"label": f"{top}, {policy}", "params": {"topology": top, "policy": policy}, "rt_p90": p90}

    figs = [fig("1/2/1/2", "lprf", 0.522), fig("1/2/1/2", "aware", 0.087), fig("1/2/1/4", "lprf", 0.025)]
    figs.append(fig("1/2/1/4", "aware", 0.034))
    f = compare_finding(figs, "policy", "aware", "lprf", "rt_p90", at=["1/2/1/2"])
    assert f.holds is True
    assert f.text == (
        f"p90 response time: 1/2/1/2: aware 87 ms, lprf 522 ms ({0.087 / 0.522:.2f}x); "
        f"1/2/1/4: aware 34 ms, lprf 25 ms ({0.034 / 0.025:.2f}x)"
    )
    everywhere = compare_finding(figs, "policy", "aware", "lprf", "rt_p90")
    assert everywhere.holds is False and "1/2/1/4 (1.36x)" in everywhere.why


def test_the_busiest_resource_is_checked_saturated_or_not():
    def fig(policy, host, resource, mean):
        busiest = {"host": host, "resource": resource, "mean": mean}
        return {"label": f"policy {policy}", "params": {"policy": policy}, "bottleneck": None, "busiest": busiest}

    figs = [fig("lprf", "db2", "disk", 94.0), fig("aware", "db1", "disk", 81.7)]
    f = busiest_finding(figs, {"*": "db disk"})
    assert f.holds is True and f.claim == "busiest: db disk"
    assert f.text == "policy lprf: busiest db2 disk, mean 94 %; policy aware: busiest db1 disk, mean 82 %"
    wrong = busiest_finding([figs[0], fig("aware", "app1", "CPU", 88.0)], {"*": "db disk"})
    assert wrong.holds is False and wrong.why == "policy aware: expected db disk, found busiest app1 CPU, mean 88 %"
    assert busiest_finding(figs, {"aware": "db CPU"}).holds is False
    assert busiest_finding(figs, {"lprf": "db"}).holds is True
    assert busiest_finding(figs, {"*": "none"}).holds is False
    assert busiest_finding([figs[0] | {"busiest": None}], {"*": "db disk"}).holds is None
    assert busiest_finding([], {"*": "db disk"}).holds is None
    assert busiest_finding(figs, {"round-robin": "db disk"}).holds is None
    check_claim({"kind": "busiest", "expect": {"*": "db disk"}}, "x")
    with pytest.raises(ValueError, match="x: expect: a table"):
        check_claim({"kind": "busiest", "expect": "db disk"}, "x")


def test_the_alternating_verdict_and_the_log_service_loss():
    alternating = Verdict("alternating", ["app", "db"], "bottleneck alternating between app and db", 0.8, "")
    assert verdict_finding(alternating, "alternating", ["app", "db"]).holds is True
    single = Verdict("single", ["db"], "single bottleneck at db", 0.9, "")
    assert verdict_finding(single, "alternating", ["app", "db"]).holds is False
    assert verdict_finding(None, "alternating").holds is None
    rows = [{"mode": "direct", "sent": 3000, "lost": 2988}, {"mode": "queue", "sent": 3000, "lost": 0}]
    f = loss_finding("direct loses ...", rows, {"direct": 0.98}, {"queue": 0.0})
    assert f.holds is True and f.why == f"direct {100 * 2988 / 3000:.1f} %, queue 0.0 %"
    assert [r["lost_share"] for r in f.figures] == [2988 / 3000, 0.0]
    lossy = [rows[0] | {"lost": 2900}, rows[1] | {"lost": 3}]
    f = loss_finding("", lossy, {"direct": 0.98}, {"queue": 0.0})
    assert f.holds is False and "direct lost 96.7 %" in f.why and "queue lost 0.1 %" in f.why
    assert loss_finding("", [rows[0] | {"lost": None}], {"direct": 0.98}).holds is None


def test_the_json_form_keeps_the_figures_without_the_label_parts():
    f = bottleneck_finding(_memory_figs(CPU_QUOTA), {"*": "db"})
    doc = json.loads(json.dumps(f.as_dict()))
    assert set(doc) == {"text", "holds", "why", "claim", "figures"} and doc["holds"] is True
    assert [x["label"] for x in doc["figures"]] == ["db memory 150 MiB", "db memory 1 GiB"]
    assert all("parts" not in x for x in doc["figures"])
    assert isinstance(Finding("t", None, "w").line(), str)


# --- the catalog's claims ----------------------------------------------------------------------


def test_every_spec_study_but_oltp_states_a_claim_that_names_swept_values_of_its_preset():
    from tierscope.cli.run import studies

    for s in studies():
        if s.kind == "oltp-scaling":
            continue
        assert s.claim is not None, s.name
        check_claim(s.claim, s.name)
        if s.claim["kind"] in ("bottleneck", "busiest"):
            raw = tomllib.loads(s.path.read_text())
            swept = {str(v) for values in raw.get("sweep", {}).get("matrix", {}).values() for v in values}
            assert set(s.claim["expect"]) <= swept | {"*"}, (s.name, s.claim["expect"], swept)


def test_a_wrong_claim_is_named():
    with pytest.raises(ValueError, match="x: kind: expected one of"):
        check_claim({"kind": "faster"}, "x")
    with pytest.raises(ValueError, match="x: hosts: unknown key for kind ratio"):
        check_claim({"kind": "ratio", "min_ratio": 2, "hosts": "db1"}, "x")
    assert (PRESETS / "studies.toml").is_file()


# --- a synthetic run directory -----------------------------------------------------------------


def test_a_synthetic_memory_sweep_gets_labels_and_its_finding(tmp_path):
    """Two configurations of one topology (db memory 128 MiB and 1 GiB) at two levels each: the
    128 MiB one's disk pinned at 100 %, the 1 GiB one's CPU; client requests at a fixed rate."""
    from synthetic_runs import memory_run
    from tierscope.analysis.experiment import analyze_run
    from tierscope.analysis.study import study_finding

    memory_run(tmp_path, {"128MiB": "disk_util", "330MiB": "app1:connections_util", "1GiB": "cpu_util"}, study=None)
    data = analyze_run(tmp_path)
    assert list(data.labels.values()) == ["db memory 128 MiB", "db memory 330 MiB", "db memory 1 GiB"]
    f = study_finding(
        data, {"kind": "bottleneck", "expect": {"128MiB": "db disk", "330MiB": "app connections", "1GiB": "db CPU"}}
    )
    assert f.holds is True, f
    assert f.text.startswith("db memory 128 MiB: disk-bound (db1 disk above 95 % in 100 % of the samples")
    assert "; 1 GiB: CPU-bound (db1 CPU above 95 % in 100 %" in f.text
    # `tierscope report RUN` checks the claim of the study its run.json names (tpcw-memory's)
    from tierscope.cli.run import finding_of_run

    assert finding_of_run(data, tmp_path) is None  # no run.json: not the runner's run
    (tmp_path / "run.json").write_text(json.dumps({"spec": str(PRESETS / "tpcw-memory.toml")}))
    shipped = finding_of_run(data, tmp_path)
    assert (
        shipped is not None
        and shipped.holds is True
        and shipped.claim == ("db disk at 128MiB; app connections at 330MiB; db CPU at 1GiB")
    )
    (tmp_path / "run.json").write_text(json.dumps({"spec": str(PRESETS / "rubbos-neighbour.toml")}))
    other = finding_of_run(data, tmp_path)  # the neighbour's claim: db1's CPU is not sampled at 128 MiB
    assert other is not None and other.holds is None
    assert other.why == "db1's CPU not measured: the same mean cannot be checked"
    from rich.console import Console

    from tierscope.report import configuration_table

    console = Console(width=200, record=True)
    console.print(configuration_table(data))
    out = console.export_text()
    assert "db memory 128 MiB" in out and "db memory 1 GiB" in out and "node_types" not in out


def test_the_scaling_finding_gives_the_throughput_per_node_from_the_fewest_nodes_to_the_most():
    from tierscope.analysis.study import scaling_finding

    rows = [
        {"target": "galera", "workload": "ycsb-b", "nodes": n, "metric": "ops/s", "throughput_per_node": x}
        for n, x in ((3, 301.0), (1, 812.0), (2, 450.5))
    ]
    rows.append({"target": "middleware", "workload": "tpcc", "nodes": 1, "metric": "tpmC", "throughput_per_node": 90})
    f = scaling_finding(rows)
    assert f.text == (
        f"galera ycsb-b 812 -> 301 ops/s per node over 1-3 nodes ({301 / 812:.2f}x); "
        "middleware tpcc 90 tpmC per node at 1 node(s)"
    )
    assert f.holds is None and f.figures[0]["per_node"] == {1: 812.0, 2: 450.5, 3: 301.0}
    assert scaling_finding([]).holds is None
    # Galera's rows carry the cluster's CPU per operation: its growth is stated beside
    for r, us in zip(rows[:3], (190.0, 88.0, 150.0)):
        r["db_cpu_us_per_op"] = us
    f = scaling_finding(rows)
    assert f.text.startswith(
        f"galera ycsb-b 812 -> 301 ops/s per node over 1-3 nodes ({301 / 812:.2f}x), "
        f"the cluster's CPU per operation 88 -> 190 us ({190 / 88:.2f}x); middleware"
    ), f.text
    assert f.figures[0]["db_cpu_us_per_op"] == {1: 88.0, 2: 150.0, 3: 190.0}


def test_the_line_says_whether_the_claim_holds_and_why():
    figs = _memory_figs(CPU_QUOTA)
    assert (
        bottleneck_finding(figs[:1], {"1GiB": "db CPU"})
        .line()
        .endswith("The study's finding cannot be decided: no result for 1GiB")
    )
    assert ". The study's finding does not hold: " in bottleneck_finding(figs, {"*": "app"}).line()
    unclaimed = bottleneck_finding(figs, None)
    assert unclaimed.line() == f"{unclaimed.text} (the study states no bottleneck to check)"


def test_the_log_services_modes_are_checked_against_the_ingest_claim(tmp_path):
    """What `tierscope run ingest` prints (and tests/test_logservice_seed.py asserts): the loss of
    each mode against [ingest.claim]; another file checks nothing."""
    from types import SimpleNamespace

    from tierscope.studies import loss_finding_of

    rows = [SimpleNamespace(mode="direct", sent=3000, lost=2990), SimpleNamespace(mode="queue", sent=3000, lost=0)]
    assert loss_finding_of("direct loses ...", rows, PRESETS / "ingest.toml").holds is True
    rows[1].lost = 1
    assert loss_finding_of("", rows, PRESETS / "ingest.toml").holds is False
    other = loss_finding_of("", rows, tmp_path / "mine.toml")
    assert other.holds is None and other.why == "no stated finding to check: not a shipped study"
