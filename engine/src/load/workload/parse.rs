//! The workload file's TOML to the model, one function per section; every error names the file,
//! the line and the thing (state, page, field) at fault.

use std::collections::BTreeMap;
use std::path::Path;

use toml::{Table, Value};

use super::error::WorkloadError;
use super::model::{Arrivals, Embedded, Method, Page, Policy, SessionType, Unit, Variant, Workload, DEFAULT_EMBEDDED_PATTERN, MAX_EMBEDDED};
use super::source::{check_keys, num, Result, Sec, Src};
use crate::load::markov::{Chain, Row, Target};
use crate::load::params::{Param, Template};

/// Session variables, by name, in file order.
type Vars = Vec<(String, Param)>;

pub fn parse(text: &str, path: &Path) -> Result<Workload> {
    let root: Table =
        text.parse::<Table>().map_err(|e| WorkloadError::Syntax { file: path.to_path_buf(), message: e.to_string().trim_end().to_string() })?;
    let src = Src { file: path, lines: text.lines().collect() };
    let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    check_keys(
        &src,
        &root,
        "",
        &["workload", "think", "users", "arrivals", "phases", "connection", "embedded", "session_vars", "session_types", "pages", "transitions"],
    )?;
    let w = Sec::of(&src, &root, "workload")?;
    let head = workload_section(&w, path)?;
    let think = think_section(&Sec::of(&src, &root, "think")?)?;
    let (users, arrivals) = users_or_arrivals(&src, &Sec::of(&src, &root, "users")?, &Sec::of(&src, &root, "arrivals")?)?;
    let phases = phases_section(&Sec::of(&src, &root, "phases")?)?;
    let conn = connection_section(&Sec::of(&src, &root, "connection")?)?;
    let embedded = embedded_section(&Sec::of(&src, &root, "embedded")?)?;
    let default_vars = session_vars(&src, &root, &base_dir)?;
    let pages = pages_section(&src, &root, &base_dir)?;
    let start = start_page(&src, &w, &pages)?;
    let (chains, chain_names) = transitions(&src, &root, &pages)?;
    let session_types = session_types(&src, &root, &base_dir, &default_vars, &chain_names)?;
    check_placeholders(&src, &pages, &session_types)?;
    Ok(Workload {
        file: path.to_path_buf(),
        name: head.name,
        start,
        max_transitions: head.max_transitions,
        session_min_mean_s: head.session_min_mean_s,
        session_min_max_s: head.session_min_max_s,
        back_on: head.back_on,
        error_markers: head.error_markers,
        think_mean_s: think.mean_s,
        think_dispersion: think.dispersion,
        think_contrast: think.contrast,
        think_quantum_ms: think.quantum_ms,
        users,
        arrivals,
        ramp_up_s: phases.ramp_up_s,
        run_s: phases.run_s,
        ramp_down_s: phases.ramp_down_s,
        policy: conn.policy,
        pool_size: conn.pool_size,
        connect_timeout_s: conn.connect_timeout_s,
        request_timeout_s: conn.request_timeout_s,
        pages,
        chains,
        chain_names,
        session_types,
        embedded,
    })
}

/// `[workload]` (but `start`, which needs the pages).
struct Head {
    name: String,
    max_transitions: u32,
    session_min_mean_s: f64,
    session_min_max_s: f64,
    back_on: Vec<Vec<u8>>,
    error_markers: Vec<Vec<u8>>,
}

fn workload_section(w: &Sec, path: &Path) -> Result<Head> {
    w.check_keys(&["name", "start", "max_transitions", "session_min_mean_s", "session_min_max_s", "back_on", "error_markers"])?;
    let name = w.str("name")?.unwrap_or_else(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default());
    let max_transitions = w.f64("max_transitions", 1000.0, 1.0)? as u32;
    let session_min_mean_s = w.f64("session_min_mean_s", 0.0, 0.0)?;
    let session_min_max_s = w.f64("session_min_max_s", 4.0 * session_min_mean_s, 0.0)?;
    let back_on = w.strings("back_on")?.into_iter().map(String::into_bytes).collect();
    let error_markers = w.strings("error_markers")?.into_iter().map(String::into_bytes).collect();
    Ok(Head { name, max_transitions, session_min_mean_s, session_min_max_s, back_on, error_markers })
}

/// `[think]`
struct Think {
    mean_s: f64,
    dispersion: f64,
    contrast: f64,
    quantum_ms: f64,
}

fn think_section(th: &Sec) -> Result<Think> {
    th.check_keys(&["mean_s", "dispersion", "contrast", "quantum_ms"])?;
    let mean_s = th.f64("mean_s", 7.0, 0.0)?;
    let dispersion = th.f64("dispersion", 1.0, 1.0)?;
    let contrast = th.f64("contrast", 0.8, 0.0)?;
    let quantum_ms = th.f64("quantum_ms", 1.0, 0.0)?;
    if contrast >= 1.0 {
        return Err(th.err("contrast", "a number in [0, 1)"));
    }
    Ok(Think { mean_s, dispersion, contrast, quantum_ms })
}

/// `[users]` (closed loop) or `[arrivals]` (open loop), not both.
fn users_or_arrivals(src: &Src, us: &Sec, ar: &Sec) -> Result<(u32, Option<Arrivals>)> {
    us.check_keys(&["count"])?;
    let users = us.f64("count", 1.0, 0.0)? as u32;
    if ar.t.is_none() {
        return Ok((users, None));
    }
    ar.check_keys(&["rate_per_s", "dispersion", "contrast", "unit"])?;
    if us.t.is_some() {
        return Err(src.err(src.header_line("[arrivals]").map(|i| i + 1), "give either [users] (closed loop) or [arrivals] (open loop), not both"));
    }
    let unit = match ar.str("unit")?.as_deref() {
        None | Some("request") => Unit::Request,
        Some("session") => Unit::Session,
        Some(other) => return Err(ar.err("unit", &format!("\"request\" or \"session\", got \"{other}\""))),
    };
    let contrast = ar.f64("contrast", 0.8, 0.0)?;
    if contrast >= 1.0 {
        return Err(ar.err("contrast", "a number in [0, 1)"));
    }
    let arrivals = Arrivals { rate_per_s: ar.f64("rate_per_s", 1.0, 0.0)?, dispersion: ar.f64("dispersion", 1.0, 1.0)?, contrast, unit };
    Ok((users, Some(arrivals)))
}

/// `[phases]`
struct Phases {
    ramp_up_s: f64,
    run_s: f64,
    ramp_down_s: f64,
}

fn phases_section(ph: &Sec) -> Result<Phases> {
    ph.check_keys(&["ramp_up_s", "run_s", "ramp_down_s"])?;
    Ok(Phases { ramp_up_s: ph.f64("ramp_up_s", 0.0, 0.0)?, run_s: ph.f64("run_s", 60.0, 0.0)?, ramp_down_s: ph.f64("ramp_down_s", 0.0, 0.0)? })
}

/// `[connection]`
struct Connection {
    policy: Policy,
    pool_size: usize,
    connect_timeout_s: f64,
    request_timeout_s: f64,
}

fn connection_section(co: &Sec) -> Result<Connection> {
    co.check_keys(&["policy", "pool_size", "connect_timeout_s", "request_timeout_s"])?;
    let policy = match co.str("policy")?.as_deref() {
        None | Some("per-user") => Policy::PerUser,
        Some("per-request") => Policy::PerRequest,
        Some("pool") => Policy::Pool,
        Some(other) => return Err(co.err("policy", &format!("\"per-user\", \"per-request\" or \"pool\", got \"{other}\""))),
    };
    let pool_size = co.f64("pool_size", 50.0, 1.0)? as usize;
    let connect_timeout_s = co.f64("connect_timeout_s", 3.0, 0.001)?;
    let request_timeout_s = co.f64("request_timeout_s", 30.0, 0.001)?;
    Ok(Connection { policy, pool_size, connect_timeout_s, request_timeout_s })
}

/// `[embedded]`: None when absent or `fetch = false`.
fn embedded_section(em: &Sec) -> Result<Option<Embedded>> {
    let Some(t) = em.t else { return Ok(None) };
    em.check_keys(&["fetch", "connections", "pattern", "max_objects"])?;
    let fetch = match t.get("fetch") {
        None => true,
        Some(Value::Boolean(b)) => *b,
        Some(_) => return Err(em.err("fetch", "true or false")),
    };
    let connections = em.f64("connections", 4.0, 1.0)?;
    if connections > MAX_EMBEDDED as f64 || connections.fract() != 0.0 {
        return Err(em.err("connections", &format!("an integer in [1, {MAX_EMBEDDED}]")));
    }
    let max_objects = em.f64("max_objects", MAX_EMBEDDED as f64, 1.0)?;
    if max_objects > MAX_EMBEDDED as f64 || max_objects.fract() != 0.0 {
        return Err(em.err("max_objects", &format!("an integer in [1, {MAX_EMBEDDED}]")));
    }
    let pat = em.str("pattern")?.unwrap_or_else(|| DEFAULT_EMBEDDED_PATTERN.to_string());
    let pattern = regex::bytes::Regex::new(&pat).map_err(|e| em.err("pattern", &format!("a regex ({e})")))?;
    if pattern.captures_len() < 2 {
        return Err(em.err("pattern", "a regex with a capture group (...) around the URL"));
    }
    Ok(fetch.then_some(Embedded { connections: connections as usize, pattern, max_objects: max_objects as usize }))
}

/// `[session_vars]`: the variables every session type has.
fn session_vars(src: &Src, root: &Table, base_dir: &Path) -> Result<Vars> {
    let mut vars = vec![];
    if let Some(v) = root.get("session_vars") {
        let t = v.as_table().ok_or_else(|| src.err(src.header_line("[session_vars]"), "[session_vars] must be a table"))?;
        for (k, v) in t {
            let line = src.key_line("[session_vars]", k);
            let p = Param::parse(v, base_dir, false, true).map_err(|e| src.err(line, format!("session variable '{k}': {e}")))?;
            vars.push((k.clone(), p));
        }
    }
    Ok(vars)
}

/// `[[pages]]`
fn pages_section(src: &Src, root: &Table, base_dir: &Path) -> Result<Vec<Page>> {
    let no_pages = || src.err(None, "no [[pages]] given");
    let pages_v = root.get("pages").and_then(Value::as_array).ok_or_else(no_pages)?;
    let mut pages: Vec<Page> = vec![];
    for (i, pv) in pages_v.iter().enumerate() {
        let page = page_entry(src, pv, i, &pages, base_dir)?;
        pages.push(page);
    }
    if pages.is_empty() {
        return Err(no_pages());
    }
    Ok(pages)
}

/// The `i`th `[[pages]]` entry (`before`: the pages read so far).
fn page_entry(src: &Src, pv: &Value, i: usize, before: &[Page], base_dir: &Path) -> Result<Page> {
    let t = pv.as_table().ok_or_else(|| src.err(None, format!("[[pages]] entry {} must be a table", i + 1)))?;
    let pname = match t.get("name") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(src.err(src.nth_header("[[pages]]", i), format!("[[pages]] entry {} has no name", i + 1))),
    };
    let line = src.page_line(&pname);
    let err = |message: String| src.err(line, message);
    for k in t.keys() {
        if !["name", "method", "url", "params", "form", "think_mean_s", "variants"].contains(&k.as_str()) {
            return Err(err(format!("page '{pname}': unknown key '{k}' (expected name, method, url, params, form, think_mean_s, variants)")));
        }
    }
    if pname == "BACK" || pname == "END" {
        return Err(err(format!("page '{pname}': BACK and END are reserved pseudo-states")));
    }
    if before.iter().any(|p| p.name == pname) {
        return Err(err(format!("page '{pname}' is listed twice")));
    }
    let url = match t.get("url") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(err(format!("page '{pname}' has no url (expected url = \"/path?query\")"))),
    };
    if !url.starts_with('/') {
        return Err(err(format!("page '{pname}': url must start with '/', got \"{url}\"")));
    }
    let method = match t.get("method").and_then(Value::as_str).unwrap_or("GET").to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "POST" => Method::Post,
        other => return Err(err(format!("page '{pname}': method must be GET or POST, got \"{other}\""))),
    };
    let mut params = vec![];
    let mut form = vec![];
    for (key, out) in [("params", &mut params), ("form", &mut form)] {
        if let Some(v) = t.get(key) {
            let pt = v.as_table().ok_or_else(|| err(format!("page '{pname}': {key} must be a table")))?;
            for (k, v) in pt {
                let p = Param::from_value(v, base_dir, true).map_err(|e| err(format!("page '{pname}' {key}.{k}: {e}")))?;
                out.push((k.clone(), p));
            }
        }
    }
    if method == Method::Get && !form.is_empty() {
        return Err(err(format!("page '{pname}': a form body needs method = \"POST\"")));
    }
    let think_mean_s = match t.get("think_mean_s") {
        None => None,
        Some(v) => match num(v) {
            Some(x) if x >= 0.0 => Some(x),
            _ => return Err(err(format!("page '{pname}': think_mean_s must be a number >= 0"))),
        },
    };
    let variants = match t.get("variants") {
        None => vec![],
        Some(v) => page_variants(src, line, &pname, v, base_dir)?,
    };
    let url = Template::parse(&url).map_err(|e| err(format!("page '{pname}' url: {e}")))?;
    Ok(Page { name: pname, method, url, params, form, think_mean_s, variants })
}

/// A page's `[[pages.variants]]`.
fn page_variants(src: &Src, line: Option<usize>, pname: &str, v: &Value, base_dir: &Path) -> Result<Vec<Variant>> {
    let err = |message: String| src.err(line, message);
    let arr = v.as_array().ok_or_else(|| err(format!("page '{pname}': variants must be [[pages.variants]] entries")))?;
    let mut variants = vec![];
    for (vi, vv) in arr.iter().enumerate() {
        let vt = vv.as_table().ok_or_else(|| err(format!("page '{pname}': variant {} must be a table", vi + 1)))?;
        for k in vt.keys() {
            if !["weight", "params"].contains(&k.as_str()) {
                return Err(err(format!("page '{pname}' variant {}: unknown key '{k}' (expected weight, params)", vi + 1)));
            }
        }
        let weight = match vt.get("weight") {
            None => 1.0,
            Some(w) => match num(w) {
                Some(x) if x >= 0.0 && x.is_finite() => x,
                _ => return Err(err(format!("page '{pname}' variant {}: weight must be a number >= 0", vi + 1))),
            },
        };
        let mut vparams = vec![];
        if let Some(pv) = vt.get("params") {
            let pt = pv.as_table().ok_or_else(|| err(format!("page '{pname}' variant {}: params must be a table", vi + 1)))?;
            for (k, v) in pt {
                let p = Param::from_value(v, base_dir, true).map_err(|e| err(format!("page '{pname}' variant {} params.{k}: {e}", vi + 1)))?;
                vparams.push((k.clone(), p));
            }
        }
        variants.push(Variant { weight, params: vparams });
    }
    if !variants.is_empty() && variants.iter().map(|v| v.weight).sum::<f64>() <= 0.0 {
        return Err(err(format!("page '{pname}': variant weights sum to 0")));
    }
    Ok(variants)
}

/// `[workload] start`: the index of the start page (default: the first).
fn start_page(src: &Src, w: &Sec, pages: &[Page]) -> Result<usize> {
    match w.str("start")? {
        None => Ok(0),
        Some(s) => pages
            .iter()
            .position(|p| p.name == s)
            .ok_or_else(|| src.err(src.key_line("[workload]", "start"), format!("[workload] start: unknown page '{s}'"))),
    }
}

/// `[transitions]` or `[transitions.<name>]`: the chains and their names ("" for the one chain).
fn transitions(src: &Src, root: &Table, pages: &[Page]) -> Result<(Vec<Chain>, Vec<String>)> {
    let mut chains = vec![];
    let mut chain_names = vec![];
    match root.get("transitions") {
        None => {
            if pages.len() > 1 {
                return Err(src.err(None, "no [transitions] table (needed with more than one page)"));
            }
            // a single page loops on itself
            chains.push(Chain::new(vec![Row::new(vec![])]));
            chain_names.push(String::new());
        }
        Some(Value::Table(t)) => {
            let named = !t.is_empty() && t.values().all(|v| v.as_table().is_some_and(|r| r.values().all(|x| x.is_table())));
            if named {
                for (cname, v) in t {
                    let header = format!("[transitions.{cname}]");
                    chains.push(parse_chain(src, &header, v.as_table().unwrap(), pages)?);
                    chain_names.push(cname.clone());
                }
            } else {
                chains.push(parse_chain(src, "[transitions]", t, pages)?);
                chain_names.push(String::new());
            }
        }
        Some(_) => return Err(src.err(src.key_line("", "transitions"), "[transitions] must be a table")),
    }
    Ok((chains, chain_names))
}

fn parse_chain(src: &Src, header: &str, t: &Table, pages: &[Page]) -> Result<Chain> {
    let mut rows: Vec<Option<Row>> = (0..pages.len()).map(|_| None).collect();
    for (from, v) in t {
        let line = src.key_line(header, from);
        let err = |message: String| src.err(line, format!("{header} row '{from}': {message}"));
        let fi = pages.iter().position(|p| &p.name == from).ok_or_else(|| err(format!("unknown state '{from}' (pages: {})", names(pages))))?;
        let row = v.as_table().ok_or_else(|| err("expected a table of { state = probability }".to_string()))?;
        let mut targets = vec![];
        let mut sum = 0.0;
        let ordered: BTreeMap<&String, &Value> = row.iter().collect();
        for (to, pv) in ordered {
            let p = num(pv).ok_or_else(|| err(format!("probability of '{to}' must be a number")))?;
            if p < 0.0 || !p.is_finite() {
                return Err(err(format!("negative probability {p} for '{to}'")));
            }
            let target = match to.as_str() {
                "BACK" => Target::Back,
                "END" => Target::End,
                _ => Target::Page(
                    pages
                        .iter()
                        .position(|pg| &pg.name == to)
                        .ok_or_else(|| err(format!("unknown state '{to}' (pages: {}, BACK, END)", names(pages))))?,
                ),
            };
            sum += p;
            if p > 0.0 {
                targets.push((target, p));
            }
        }
        if sum > 1.0 + 1e-6 {
            return Err(err(format!("probabilities sum to {sum:.6}, above 1")));
        }
        rows[fi] = Some(Row::new(targets));
    }
    // a page without a row stays where it is (all slack is the implicit self-loop)
    Ok(Chain::new(rows.into_iter().map(|r| r.unwrap_or_else(|| Row::new(vec![]))).collect()))
}

fn names(pages: &[Page]) -> String {
    let mut s: Vec<&str> = pages.iter().map(|p| p.name.as_str()).collect();
    if s.len() > 12 {
        s.truncate(12);
        s.push("...");
    }
    s.join(", ")
}

/// `[[session_types]]`: who walks which chain, with which variables (default: one type "user").
fn session_types(src: &Src, root: &Table, base_dir: &Path, default_vars: &Vars, chain_names: &[String]) -> Result<Vec<SessionType>> {
    let a = match root.get("session_types") {
        None => {
            if chain_names.len() > 1 {
                return Err(src.err(None, "several transition tables but no [[session_types]] saying who walks which"));
            }
            return Ok(vec![SessionType { name: "user".into(), weight: 1.0, chain: 0, vars: default_vars.clone() }]);
        }
        Some(Value::Array(a)) => a,
        Some(_) => return Err(src.err(None, "session_types must be written as [[session_types]] entries")),
    };
    let mut types = vec![];
    for (i, v) in a.iter().enumerate() {
        types.push(session_type(src, src.nth_header("[[session_types]]", i), v, base_dir, default_vars, chain_names)?);
    }
    if types.iter().map(|s| s.weight).sum::<f64>() <= 0.0 {
        return Err(src.err(None, "[[session_types]] weights sum to 0"));
    }
    Ok(types)
}

fn session_type(src: &Src, line: Option<usize>, v: &Value, base_dir: &Path, default_vars: &Vars, chain_names: &[String]) -> Result<SessionType> {
    let err = |message: String| src.err(line, message);
    let t = v.as_table().ok_or_else(|| err("[[session_types]] entry must be a table".to_string()))?;
    for k in t.keys() {
        if !["name", "weight", "transitions", "vars"].contains(&k.as_str()) {
            return Err(err(format!("session type: unknown key '{k}' (expected name, weight, transitions, vars)")));
        }
    }
    let sname = t.get("name").and_then(Value::as_str).unwrap_or("user").to_string();
    let weight = match t.get("weight") {
        None => 1.0,
        Some(v) => match num(v) {
            Some(x) if x >= 0.0 => x,
            _ => return Err(err(format!("session type '{sname}': weight must be a number >= 0"))),
        },
    };
    let chain = match t.get("transitions").and_then(Value::as_str) {
        None if chain_names.len() == 1 => 0,
        None => return Err(err(format!("session type '{sname}': say which transitions table (one of: {})", chain_names.join(", ")))),
        Some(c) => chain_names
            .iter()
            .position(|n| n == c)
            .ok_or_else(|| err(format!("session type '{sname}': unknown transitions table '{c}' (have: {})", chain_names.join(", "))))?,
    };
    let mut vars = default_vars.clone();
    if let Some(vt) = t.get("vars") {
        let vt = vt.as_table().ok_or_else(|| err(format!("session type '{sname}': vars must be a table")))?;
        for (k, v) in vt {
            let p = Param::parse(v, base_dir, false, true).map_err(|e| err(format!("session type '{sname}' var '{k}': {e}")))?;
            match vars.iter_mut().find(|(n, _)| n == k) {
                Some(slot) => slot.1 = p,
                None => vars.push((k.clone(), p)),
            }
        }
    }
    Ok(SessionType { name: sname, weight, chain, vars })
}

/// Every placeholder must resolve: page params, form fields, or session vars of every type.
fn check_placeholders(src: &Src, pages: &[Page], session_types: &[SessionType]) -> Result<()> {
    for page in pages {
        let mut names: Vec<&str> = page.url.vars();
        for (_, p) in page.params.iter().chain(page.form.iter()) {
            names.extend(p.template_vars());
        }
        for v in &page.variants {
            for (_, p) in &v.params {
                names.extend(p.template_vars());
            }
        }
        for n in names {
            // a page parameter: of the page, or of every variant
            if page.params.iter().any(|(k, _)| k == n)
                || page.form.iter().any(|(k, _)| k == n)
                || (!page.variants.is_empty() && page.variants.iter().all(|v| v.params.iter().any(|(k, _)| k == n)))
            {
                continue;
            }
            for st in session_types {
                if !st.vars.iter().any(|(k, _)| k == n) {
                    return Err(src.err(
                        src.page_line(&page.name),
                        format!(
                            "page '{}': placeholder {{{n}}} is neither a page parameter nor a session variable{}",
                            page.name,
                            if session_types.len() > 1 { format!(" of session type '{}'", st.name) } else { String::new() }
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}
