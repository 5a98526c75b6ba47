//! The middleware held to its contract (`python/tierscope/contracts/middleware.json`, which the
//! Python side, the spec's checks and the lab's service read): the policies and which ones track
//! labels, the waits, protocols and schedulers the command line takes, its defaults, the password's variable,
//! the recovery table, and the stats' keys.

use std::collections::BTreeSet;

use clap::{CommandFactory, Parser};
use serde_json::Value;

use super::balance::Policy;
use super::{recovery, Manager, MiddlewareArgs, PASSWORD_ENV};

const CONTRACT: &str = include_str!("../../../python/tierscope/contracts/middleware.json");

fn contract() -> Value {
    serde_json::from_str(CONTRACT).expect("the contract is JSON")
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().expect("a list").iter().map(|x| x.as_str().expect("a string").to_string()).collect()
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().expect("an object").keys().cloned().collect()
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: MiddlewareArgs,
}

fn possible_values(flag: &str) -> Vec<String> {
    let cmd = Cli::command();
    let arg = cmd.get_arguments().find(|a| a.get_id() == flag).unwrap_or_else(|| panic!("no --{flag}"));
    arg.get_possible_values().iter().map(|v| v.get_name().to_string()).collect()
}

#[test]
fn the_policies_waits_and_protocols_are_the_contracts() {
    let c = contract();
    // (serde_json's objects are sorted by key: compared as sets)
    assert_eq!(keys(&c["policies"]), Policy::ALL.iter().map(|p| p.name().to_string()).collect());
    assert_eq!(possible_values("wait"), strings(&c["wait"]));
    assert_eq!(possible_values("protocol"), strings(&c["protocols"]));
    assert_eq!(possible_values("scheduler").into_iter().collect::<BTreeSet<_>>(), keys(&c["schedulers"]));
    assert_eq!(c["password_env"], PASSWORD_ENV);
    assert_eq!(c["recovery_table"], recovery::TABLE);
    // the labelled policies track labels from the start, the others only with --labels
    let labelled = strings(&c["labelled_policies"]);
    let addrs = ["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()];
    for p in Policy::ALL {
        let m = Manager::new(&addrs, "u", "pw", "d", 1, p, false, &[1.0, 1.0]).unwrap();
        assert_eq!(m.stats()["labels"]["tracked"], labelled.contains(&p.name().to_string()), "{}", p.name());
    }
}

#[test]
fn the_command_lines_defaults_are_the_contracts() {
    let d = &contract()["defaults"];
    let a = Cli::try_parse_from(["mw", "--listen", "127.0.0.1:6000", "--backend", "127.0.0.1:5432"]).unwrap().args;
    assert_eq!(keys(d).len(), 11, "a default added to the contract is checked here too");
    assert_eq!(d["protocol"], a.protocol.as_str());
    assert_eq!(d["db"], a.db.as_str());
    assert_eq!(d["user"], a.user.as_str());
    assert_eq!(d["pool"], a.pool);
    assert_eq!(d["policy"], a.policy.as_str());
    assert_eq!(d["heavy_factor"], a.heavy_factor);
    assert_eq!(d["wait"], a.wait.as_str());
    assert_eq!(d["connect_timeout"], a.connect_timeout);
    assert_eq!(d["series_interval"], a.series_interval);
    assert_eq!(d["threads"], a.threads);
    assert_eq!(d["scheduler"], a.scheduler.as_str());
}

#[test]
fn the_stats_keys_are_the_contracts() {
    let s = &contract()["stats"];
    let addrs = ["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()];
    let m = Manager::new(&addrs, "u", "pw", "d", 1, Policy::Aware, false, &[1.0, 1.0]).unwrap();
    let stats = m.stats();
    let set = |v: &Value| strings(v).into_iter().collect::<BTreeSet<_>>();
    assert_eq!(keys(&stats), set(&s["top"]));
    assert_eq!(keys(&stats["backends"][0]), set(&s["backend"]));
    assert_eq!(keys(&stats["labels"]), set(&s["labels"]));
    assert_eq!(keys(&stats["series"]), set(&s["series"]));
    assert_eq!(keys(&stats["scheduler"]), set(&s["scheduler"]));
}
