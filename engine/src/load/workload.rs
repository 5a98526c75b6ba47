//! The workload file (docs/workload.md): TOML -> a validated, index-based model.
//!
//! Every error names the file, the line and the thing (state, page, field) at fault.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use toml::{Table, Value};

use super::markov::{Chain, Row, Target};
use super::params::{Param, Template};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

#[derive(Debug)]
pub struct Page {
    pub name: String,
    pub method: Method,
    pub url: Template,
    /// page-local parameters, by name (URL placeholders and form fields look here first)
    pub params: Vec<(String, Param)>,
    /// form fields in file order (POST body)
    pub form: Vec<(String, Param)>,
    pub think_mean_s: Option<f64>,
    /// alternative parameter sets, one drawn (by weight) per request; their params are looked
    /// up before the page's own
    pub variants: Vec<Variant>,
}

#[derive(Debug)]
pub struct Variant {
    pub weight: f64,
    pub params: Vec<(String, Param)>,
}

/// `[embedded]`: fetch the objects a page embeds (images), as a browser does (TPC-W WIRT).
#[derive(Debug, Clone)]
pub struct Embedded {
    /// parallel connections per user (a small kept-alive pool of its own)
    pub connections: usize,
    /// capture group 1 = the object's URL
    pub pattern: regex::bytes::Regex,
    /// distinct objects fetched per page at most (<= MAX_EMBEDDED)
    pub max_objects: usize,
}

/// The hard cap on embedded objects per page.
pub const MAX_EMBEDDED: usize = 64;

/// The default `[embedded] pattern`: the src of <img> and <input type="image"> tags.
pub const DEFAULT_EMBEDDED_PATTERN: &str = r#"(?i)<(?:img|input)\b[^>]*?\ssrc\s*=\s*["']([^"']+)["']"#;

#[derive(Debug)]
pub struct SessionType {
    pub name: String,
    pub weight: f64,
    pub chain: usize,
    /// session variables (name, how drawn); names index `Workload::var_names`
    pub vars: Vec<(String, Param)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    PerUser,
    PerRequest,
    Pool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Request,
    Session,
}

#[derive(Clone, Debug)]
pub struct Arrivals {
    pub rate_per_s: f64,
    pub dispersion: f64,
    pub contrast: f64,
    pub unit: Unit,
}

#[allow(dead_code)]
#[derive(Debug)]
pub struct Workload {
    pub file: PathBuf,
    pub name: String,
    pub start: usize,
    pub max_transitions: u32,
    /// TPC-W user session minimum duration (USMD): negative-exponential mean (0 = off) and cap
    pub session_min_mean_s: f64,
    pub session_min_max_s: f64,
    pub back_on: Vec<Vec<u8>>,
    pub error_markers: Vec<Vec<u8>>,
    pub think_mean_s: f64,
    pub think_dispersion: f64,
    pub think_contrast: f64,
    pub think_quantum_ms: f64,
    pub users: u32,
    pub arrivals: Option<Arrivals>,
    pub ramp_up_s: f64,
    pub run_s: f64,
    pub ramp_down_s: f64,
    pub policy: Policy,
    pub pool_size: usize,
    pub connect_timeout_s: f64,
    pub request_timeout_s: f64,
    pub pages: Vec<Page>,
    pub chains: Vec<Chain>,
    pub chain_names: Vec<String>,
    pub session_types: Vec<SessionType>,
    pub embedded: Option<Embedded>,
}

impl Workload {
    /// Whether any response body must be kept (markers or extraction need it).
    pub fn needs_body(&self) -> bool {
        !self.back_on.is_empty()
            || !self.error_markers.is_empty()
            || self.embedded.is_some()
            || self
                .pages
                .iter()
                .any(|p| p.params.iter().chain(p.form.iter()).chain(p.variants.iter().flat_map(|v| v.params.iter())).any(|(_, v)| v.reads_body()))
            || self.session_types.iter().any(|t| t.vars.iter().any(|(_, v)| v.reads_body()))
    }
    #[allow(dead_code)]
    pub fn page_index(&self, name: &str) -> Option<usize> {
        self.pages.iter().position(|p| p.name == name)
    }
}

/// Locates lines in the source for error messages (TOML values carry no positions).
struct Src<'a> {
    file: &'a Path,
    lines: Vec<&'a str>,
}

impl<'a> Src<'a> {
    fn header_line(&self, header: &str) -> Option<usize> {
        self.lines.iter().position(|l| {
            let t = l.trim();
            t == header || t.starts_with(&format!("{header} ")) || t.starts_with(&format!("{header}#"))
        })
    }
    /// Line (1-based) of `key = ...` inside the section whose header is `header` ("" = top).
    fn key_line(&self, header: &str, key: &str) -> Option<usize> {
        let from = if header.is_empty() { 0 } else { self.header_line(header)? + 1 };
        for (i, l) in self.lines.iter().enumerate().skip(from) {
            let t = l.trim_start();
            if i > from && t.starts_with('[') && !header.is_empty() {
                break;
            }
            if key_matches(t, key) {
                return Some(i + 1);
            }
        }
        None
    }
    /// Line of the `[[pages]]` entry named `name` (its `name = ...` line).
    fn page_line(&self, name: &str) -> Option<usize> {
        let q1 = format!("\"{name}\"");
        let q2 = format!("'{name}'");
        self.lines
            .iter()
            .position(|l| {
                let t = l.trim_start();
                key_matches(t, "name") && (t.contains(&q1) || t.contains(&q2))
            })
            .map(|i| i + 1)
    }
    fn at(&self, line: Option<usize>) -> String {
        match line {
            Some(n) => format!("{}:{}", self.file.display(), n),
            None => format!("{}", self.file.display()),
        }
    }
}

fn key_matches(t: &str, key: &str) -> bool {
    for cand in [key.to_string(), format!("\"{key}\""), format!("'{key}'")] {
        if let Some(rest) = t.strip_prefix(&cand) {
            if rest.trim_start().starts_with('=') {
                return true;
            }
        }
    }
    false
}

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Float(f) => Some(*f),
        Value::Integer(i) => Some(*i as f64),
        _ => None,
    }
}

fn check_keys(src: &Src, t: &Table, header: &str, allowed: &[&str]) -> Result<()> {
    for k in t.keys() {
        if !allowed.contains(&k.as_str()) {
            bail!(
                "{}: unknown key '{k}' in {header} (expected one of: {})",
                src.at(src.key_line(header, k).or_else(|| src.header_line(header).map(|i| i + 1))),
                allowed.join(", ")
            );
        }
    }
    Ok(())
}

struct Sec<'a, 'b> {
    src: &'a Src<'b>,
    header: String,
    t: Option<&'a Table>,
}

impl<'a, 'b> Sec<'a, 'b> {
    fn f64(&self, key: &str, default: f64, min: f64) -> Result<f64> {
        let Some(v) = self.t.and_then(|t| t.get(key)) else { return Ok(default) };
        let x = num(v).ok_or_else(|| self.err(key, "a number"))?;
        if !(x >= min) || !x.is_finite() {
            return Err(self.err(key, &format!("a number >= {min}, got {x}")));
        }
        Ok(x)
    }
    fn str(&self, key: &str) -> Result<Option<String>> {
        match self.t.and_then(|t| t.get(key)) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.err(key, "a string")),
        }
    }
    fn strings(&self, key: &str) -> Result<Vec<String>> {
        match self.t.and_then(|t| t.get(key)) {
            None => Ok(vec![]),
            Some(Value::Array(a)) => a.iter().map(|v| v.as_str().map(str::to_string).ok_or_else(|| self.err(key, "a list of strings"))).collect(),
            Some(_) => Err(self.err(key, "a list of strings")),
        }
    }
    fn err(&self, key: &str, expected: &str) -> anyhow::Error {
        anyhow!("{}: {} {key}: expected {expected}", self.src.at(self.src.key_line(&self.header, key)), self.header)
    }
}

pub fn load(path: &Path) -> Result<Workload> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow!("{}: cannot read: {e}", path.display()))?;
    parse(&text, path)
}

pub fn parse(text: &str, path: &Path) -> Result<Workload> {
    let root: Table = text.parse::<Table>().map_err(|e| anyhow!("{}: {}", path.display(), e.to_string().trim_end()))?;
    let src = Src { file: path, lines: text.lines().collect() };
    let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    check_keys(
        &src,
        &root,
        "",
        &["workload", "think", "users", "arrivals", "phases", "connection", "embedded", "session_vars", "session_types", "pages", "transitions"],
    )?;
    let section = |name: &str| -> Result<Sec> {
        let header = format!("[{name}]");
        let t = match root.get(name) {
            None => None,
            Some(Value::Table(t)) => Some(t),
            Some(_) => bail!("{}: {header} must be a table", src.at(src.key_line("", name))),
        };
        Ok(Sec { src: &src, header, t })
    };

    // [workload]
    let w = section("workload")?;
    if let Some(t) = w.t {
        check_keys(
            &src,
            t,
            "[workload]",
            &["name", "start", "max_transitions", "session_min_mean_s", "session_min_max_s", "back_on", "error_markers"],
        )?;
    }
    let name = w.str("name")?.unwrap_or_else(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default());
    let max_transitions = w.f64("max_transitions", 1000.0, 1.0)? as u32;
    let session_min_mean_s = w.f64("session_min_mean_s", 0.0, 0.0)?;
    let session_min_max_s = w.f64("session_min_max_s", 4.0 * session_min_mean_s, 0.0)?;
    let back_on: Vec<Vec<u8>> = w.strings("back_on")?.into_iter().map(String::into_bytes).collect();
    let error_markers: Vec<Vec<u8>> = w.strings("error_markers")?.into_iter().map(String::into_bytes).collect();

    // [think]
    let th = section("think")?;
    if let Some(t) = th.t {
        check_keys(&src, t, "[think]", &["mean_s", "dispersion", "contrast", "quantum_ms"])?;
    }
    let think_mean_s = th.f64("mean_s", 7.0, 0.0)?;
    let think_dispersion = th.f64("dispersion", 1.0, 1.0)?;
    let think_contrast = th.f64("contrast", 0.8, 0.0)?;
    let think_quantum_ms = th.f64("quantum_ms", 1.0, 0.0)?;
    if think_contrast >= 1.0 {
        return Err(th.err("contrast", "a number in [0, 1)"));
    }

    // [users] / [arrivals]
    let us = section("users")?;
    if let Some(t) = us.t {
        check_keys(&src, t, "[users]", &["count"])?;
    }
    let users = us.f64("count", 1.0, 0.0)? as u32;
    let ar = section("arrivals")?;
    let arrivals = match ar.t {
        None => None,
        Some(t) => {
            check_keys(&src, t, "[arrivals]", &["rate_per_s", "dispersion", "contrast", "unit"])?;
            if us.t.is_some() {
                bail!(
                    "{}: give either [users] (closed loop) or [arrivals] (open loop), not both",
                    src.at(src.header_line("[arrivals]").map(|i| i + 1))
                );
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
            Some(Arrivals { rate_per_s: ar.f64("rate_per_s", 1.0, 0.0)?, dispersion: ar.f64("dispersion", 1.0, 1.0)?, contrast, unit })
        }
    };

    // [phases]
    let ph = section("phases")?;
    if let Some(t) = ph.t {
        check_keys(&src, t, "[phases]", &["ramp_up_s", "run_s", "ramp_down_s"])?;
    }
    let ramp_up_s = ph.f64("ramp_up_s", 0.0, 0.0)?;
    let run_s = ph.f64("run_s", 60.0, 0.0)?;
    let ramp_down_s = ph.f64("ramp_down_s", 0.0, 0.0)?;

    // [connection]
    let co = section("connection")?;
    if let Some(t) = co.t {
        check_keys(&src, t, "[connection]", &["policy", "pool_size", "connect_timeout_s", "request_timeout_s"])?;
    }
    let policy = match co.str("policy")?.as_deref() {
        None | Some("per-user") => Policy::PerUser,
        Some("per-request") => Policy::PerRequest,
        Some("pool") => Policy::Pool,
        Some(other) => return Err(co.err("policy", &format!("\"per-user\", \"per-request\" or \"pool\", got \"{other}\""))),
    };
    let pool_size = co.f64("pool_size", 50.0, 1.0)? as usize;
    let connect_timeout_s = co.f64("connect_timeout_s", 3.0, 0.001)?;
    let request_timeout_s = co.f64("request_timeout_s", 30.0, 0.001)?;

    // [embedded]
    let em = section("embedded")?;
    let embedded = match em.t {
        None => None,
        Some(t) => {
            check_keys(&src, t, "[embedded]", &["fetch", "connections", "pattern", "max_objects"])?;
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
            fetch.then_some(Embedded { connections: connections as usize, pattern, max_objects: max_objects as usize })
        }
    };

    // [session_vars]
    let mut default_vars = vec![];
    if let Some(v) = root.get("session_vars") {
        let t = v.as_table().ok_or_else(|| anyhow!("{}: [session_vars] must be a table", src.at(src.header_line("[session_vars]"))))?;
        for (k, v) in t {
            let line = src.key_line("[session_vars]", k);
            let p = Param::parse(v, &base_dir, false, true).map_err(|e| anyhow!("{}: session variable '{k}': {e}", src.at(line)))?;
            default_vars.push((k.clone(), p));
        }
    }

    // [[pages]]
    let pages_v = root.get("pages").and_then(Value::as_array).ok_or_else(|| anyhow!("{}: no [[pages]] given", path.display()))?;
    let mut pages: Vec<Page> = vec![];
    for (i, pv) in pages_v.iter().enumerate() {
        let t = pv.as_table().ok_or_else(|| anyhow!("{}: [[pages]] entry {} must be a table", path.display(), i + 1))?;
        let pname = match t.get("name") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => bail!("{}: [[pages]] entry {} has no name", src.at(nth_header(&src, "[[pages]]", i)), i + 1),
        };
        let line = src.page_line(&pname);
        for k in t.keys() {
            if !["name", "method", "url", "params", "form", "think_mean_s", "variants"].contains(&k.as_str()) {
                bail!("{}: page '{pname}': unknown key '{k}' (expected name, method, url, params, form, think_mean_s, variants)", src.at(line));
            }
        }
        if pname == "BACK" || pname == "END" {
            bail!("{}: page '{pname}': BACK and END are reserved pseudo-states", src.at(line));
        }
        if pages.iter().any(|p| p.name == pname) {
            bail!("{}: page '{pname}' is listed twice", src.at(line));
        }
        let url = match t.get("url") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => bail!("{}: page '{pname}' has no url (expected url = \"/path?query\")", src.at(line)),
        };
        if !url.starts_with('/') {
            bail!("{}: page '{pname}': url must start with '/', got \"{url}\"", src.at(line));
        }
        let method = match t.get("method").and_then(Value::as_str).unwrap_or("GET").to_ascii_uppercase().as_str() {
            "GET" => Method::Get,
            "POST" => Method::Post,
            other => bail!("{}: page '{pname}': method must be GET or POST, got \"{other}\"", src.at(line)),
        };
        let mut params = vec![];
        let mut form = vec![];
        for (key, out) in [("params", &mut params), ("form", &mut form)] {
            if let Some(v) = t.get(key) {
                let pt = v.as_table().ok_or_else(|| anyhow!("{}: page '{pname}': {key} must be a table", src.at(line)))?;
                for (k, v) in pt {
                    let p = Param::from_value(v, &base_dir, true).map_err(|e| anyhow!("{}: page '{pname}' {key}.{k}: {e}", src.at(line)))?;
                    out.push((k.clone(), p));
                }
            }
        }
        if method == Method::Get && !form.is_empty() {
            bail!("{}: page '{pname}': a form body needs method = \"POST\"", src.at(line));
        }
        let think_mean_s = match t.get("think_mean_s") {
            None => None,
            Some(v) => match num(v) {
                Some(x) if x >= 0.0 => Some(x),
                _ => bail!("{}: page '{pname}': think_mean_s must be a number >= 0", src.at(line)),
            },
        };
        let mut variants = vec![];
        if let Some(v) = t.get("variants") {
            let arr = v.as_array().ok_or_else(|| anyhow!("{}: page '{pname}': variants must be [[pages.variants]] entries", src.at(line)))?;
            for (vi, vv) in arr.iter().enumerate() {
                let vt = vv.as_table().ok_or_else(|| anyhow!("{}: page '{pname}': variant {} must be a table", src.at(line), vi + 1))?;
                for k in vt.keys() {
                    if !["weight", "params"].contains(&k.as_str()) {
                        bail!("{}: page '{pname}' variant {}: unknown key '{k}' (expected weight, params)", src.at(line), vi + 1);
                    }
                }
                let weight = match vt.get("weight") {
                    None => 1.0,
                    Some(w) => match num(w) {
                        Some(x) if x >= 0.0 && x.is_finite() => x,
                        _ => bail!("{}: page '{pname}' variant {}: weight must be a number >= 0", src.at(line), vi + 1),
                    },
                };
                let mut vparams = vec![];
                if let Some(pv) = vt.get("params") {
                    let pt = pv.as_table().ok_or_else(|| anyhow!("{}: page '{pname}' variant {}: params must be a table", src.at(line), vi + 1))?;
                    for (k, v) in pt {
                        let p = Param::from_value(v, &base_dir, true)
                            .map_err(|e| anyhow!("{}: page '{pname}' variant {} params.{k}: {e}", src.at(line), vi + 1))?;
                        vparams.push((k.clone(), p));
                    }
                }
                variants.push(Variant { weight, params: vparams });
            }
            if !variants.is_empty() && variants.iter().map(|v| v.weight).sum::<f64>() <= 0.0 {
                bail!("{}: page '{pname}': variant weights sum to 0", src.at(line));
            }
        }
        let url = Template::parse(&url).map_err(|e| anyhow!("{}: page '{pname}' url: {e}", src.at(line)))?;
        pages.push(Page { name: pname, method, url, params, form, think_mean_s, variants });
    }
    if pages.is_empty() {
        bail!("{}: no [[pages]] given", path.display());
    }
    let start = match w.str("start")? {
        None => 0,
        Some(s) => pages
            .iter()
            .position(|p| p.name == s)
            .ok_or_else(|| anyhow!("{}: [workload] start: unknown page '{s}'", src.at(src.key_line("[workload]", "start"))))?,
    };

    // [transitions] or [transitions.<name>]
    let mut chains = vec![];
    let mut chain_names = vec![];
    match root.get("transitions") {
        None => {
            if pages.len() > 1 {
                bail!("{}: no [transitions] table (needed with more than one page)", path.display());
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
                    chains.push(parse_chain(&src, &header, v.as_table().unwrap(), &pages)?);
                    chain_names.push(cname.clone());
                }
            } else {
                chains.push(parse_chain(&src, "[transitions]", t, &pages)?);
                chain_names.push(String::new());
            }
        }
        Some(_) => bail!("{}: [transitions] must be a table", src.at(src.key_line("", "transitions"))),
    }

    // [[session_types]]
    let mut session_types = vec![];
    match root.get("session_types") {
        None => {
            if chains.len() > 1 {
                bail!("{}: several transition tables but no [[session_types]] saying who walks which", path.display());
            }
            session_types.push(SessionType { name: "user".into(), weight: 1.0, chain: 0, vars: default_vars.clone() });
        }
        Some(Value::Array(a)) => {
            for (i, v) in a.iter().enumerate() {
                let line = nth_header(&src, "[[session_types]]", i);
                let t = v.as_table().ok_or_else(|| anyhow!("{}: [[session_types]] entry must be a table", src.at(line)))?;
                for k in t.keys() {
                    if !["name", "weight", "transitions", "vars"].contains(&k.as_str()) {
                        bail!("{}: session type: unknown key '{k}' (expected name, weight, transitions, vars)", src.at(line));
                    }
                }
                let sname = t.get("name").and_then(Value::as_str).unwrap_or("user").to_string();
                let weight = match t.get("weight") {
                    None => 1.0,
                    Some(v) => match num(v) {
                        Some(x) if x >= 0.0 => x,
                        _ => bail!("{}: session type '{sname}': weight must be a number >= 0", src.at(line)),
                    },
                };
                let chain = match t.get("transitions").and_then(Value::as_str) {
                    None if chains.len() == 1 => 0,
                    None => bail!("{}: session type '{sname}': say which transitions table (one of: {})", src.at(line), chain_names.join(", ")),
                    Some(c) => chain_names.iter().position(|n| n == c).ok_or_else(|| {
                        anyhow!("{}: session type '{sname}': unknown transitions table '{c}' (have: {})", src.at(line), chain_names.join(", "))
                    })?,
                };
                let mut vars = default_vars.clone();
                if let Some(vt) = t.get("vars") {
                    let vt = vt.as_table().ok_or_else(|| anyhow!("{}: session type '{sname}': vars must be a table", src.at(line)))?;
                    for (k, v) in vt {
                        let p = Param::parse(v, &base_dir, false, true)
                            .map_err(|e| anyhow!("{}: session type '{sname}' var '{k}': {e}", src.at(line)))?;
                        match vars.iter_mut().find(|(n, _)| n == k) {
                            Some(slot) => slot.1 = p,
                            None => vars.push((k.clone(), p)),
                        }
                    }
                }
                session_types.push(SessionType { name: sname, weight, chain, vars });
            }
            if session_types.iter().map(|s| s.weight).sum::<f64>() <= 0.0 {
                bail!("{}: [[session_types]] weights sum to 0", path.display());
            }
        }
        Some(_) => bail!("{}: session_types must be written as [[session_types]] entries", path.display()),
    }

    // every placeholder must resolve: page params, form fields, or session vars of every type
    for page in &pages {
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
            for st in &session_types {
                if !st.vars.iter().any(|(k, _)| k == n) {
                    bail!(
                        "{}: page '{}': placeholder {{{n}}} is neither a page parameter nor a session variable{}",
                        src.at(src.page_line(&page.name)),
                        page.name,
                        if session_types.len() > 1 { format!(" of session type '{}'", st.name) } else { String::new() }
                    );
                }
            }
        }
    }

    Ok(Workload {
        file: path.to_path_buf(),
        name,
        start,
        max_transitions,
        session_min_mean_s,
        session_min_max_s,
        back_on,
        error_markers,
        think_mean_s,
        think_dispersion,
        think_contrast,
        think_quantum_ms,
        users,
        arrivals,
        ramp_up_s,
        run_s,
        ramp_down_s,
        policy,
        pool_size,
        connect_timeout_s,
        request_timeout_s,
        pages,
        chains,
        chain_names,
        session_types,
        embedded,
    })
}

fn nth_header(src: &Src, header: &str, n: usize) -> Option<usize> {
    src.lines.iter().enumerate().filter(|(_, l)| l.trim_start().starts_with(header)).nth(n).map(|(i, _)| i + 1)
}

fn parse_chain(src: &Src, header: &str, t: &Table, pages: &[Page]) -> Result<Chain> {
    let mut rows: Vec<Option<Row>> = (0..pages.len()).map(|_| None).collect();
    for (from, v) in t {
        let line = src.key_line(header, from);
        let at = src.at(line);
        let fi = pages
            .iter()
            .position(|p| &p.name == from)
            .ok_or_else(|| anyhow!("{at}: {header} row '{from}': unknown state '{from}' (pages: {})", names(pages)))?;
        let row = v.as_table().ok_or_else(|| anyhow!("{at}: {header} row '{from}': expected a table of {{ state = probability }}"))?;
        let mut targets = vec![];
        let mut sum = 0.0;
        let ordered: BTreeMap<&String, &Value> = row.iter().collect();
        for (to, pv) in ordered {
            let p = num(pv).ok_or_else(|| anyhow!("{at}: {header} row '{from}': probability of '{to}' must be a number"))?;
            if !(p >= 0.0) || !p.is_finite() {
                bail!("{at}: {header} row '{from}': negative probability {p} for '{to}'");
            }
            let target = match to.as_str() {
                "BACK" => Target::Back,
                "END" => Target::End,
                _ => Target::Page(
                    pages
                        .iter()
                        .position(|pg| &pg.name == to)
                        .ok_or_else(|| anyhow!("{at}: {header} row '{from}': unknown state '{to}' (pages: {}, BACK, END)", names(pages)))?,
                ),
            };
            sum += p;
            if p > 0.0 {
                targets.push((target, p));
            }
        }
        if sum > 1.0 + 1e-6 {
            bail!("{at}: {header} row '{from}': probabilities sum to {sum:.6}, above 1");
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

/// Words for generated text when no dictionary is given.
pub fn builtin_words() -> Arc<Vec<String>> {
    const W: &str = "the of and to in is that for it as was with be by on not he this are or his from at which but have an \
they you were her she there one all we their can has more been when who will no if out so said what up its about into than \
them only other new some could time these two may then do first any my now such like our over man me even most made after \
also did many before must through back years where much your way well down should because each just those people how too \
little state good very make world still own see men work long get here between both life being under never day same another \
know while last might us great old year off come since against go came right used take three story comment server browser";
    Arc::new(W.split_whitespace().map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "[workload]\nstart = \"A\"\n[[pages]]\nname = \"A\"\nurl = \"/a\"\n";

    fn err(text: &str) -> String {
        parse(text, Path::new("w.toml")).unwrap_err().to_string()
    }

    #[test]
    fn embedded_section_defaults_and_errors() {
        let wl = parse(BASE, Path::new("w.toml")).unwrap();
        assert!(wl.embedded.is_none());
        let wl = parse(&format!("{BASE}[embedded]\n"), Path::new("w.toml")).unwrap();
        let e = wl.embedded.as_ref().unwrap();
        assert_eq!((e.connections, e.max_objects), (4, 64));
        assert!(wl.needs_body());
        let wl = parse(&format!("{BASE}[embedded]\nfetch = false\nconnections = 2\n"), Path::new("w.toml")).unwrap();
        assert!(wl.embedded.is_none());
        let wl = parse(&format!("{BASE}[embedded]\nconnections = 2\nmax_objects = 8\npattern = 'src=\"([^\"]+)\"'\n"), Path::new("w.toml")).unwrap();
        let e = wl.embedded.unwrap();
        assert_eq!((e.connections, e.max_objects), (2, 8));
        assert!(err(&format!("{BASE}[embedded]\nconnections = 65\n")).contains("w.toml:7: [embedded] connections"));
        assert!(err(&format!("{BASE}[embedded]\nmax_objects = 100\n")).contains("[embedded] max_objects"));
        assert!(err(&format!("{BASE}[embedded]\npattern = 'src=\"[^\"]+\"'\n")).contains("capture group"));
        assert!(err(&format!("{BASE}[embedded]\nconection = 2\n")).contains("unknown key 'conection'"));
    }

    #[test]
    fn session_minimum_duration_keys() {
        let wl = parse(&BASE.replace("start = \"A\"", "start = \"A\"\nsession_min_mean_s = 900\n"), Path::new("w.toml")).unwrap();
        assert_eq!((wl.session_min_mean_s, wl.session_min_max_s), (900.0, 3600.0));
        let wl =
            parse(&BASE.replace("start = \"A\"", "start = \"A\"\nsession_min_mean_s = 60\nsession_min_max_s = 100\n"), Path::new("w.toml")).unwrap();
        assert_eq!((wl.session_min_mean_s, wl.session_min_max_s), (60.0, 100.0));
        assert_eq!(parse(BASE, Path::new("w.toml")).unwrap().session_min_mean_s, 0.0);
    }

    #[test]
    fn variants_and_learn_variables() {
        let text = r#"[workload]
start = "S"
[session_vars]
C_ID = { nurand = [1023, 1, 2880], blank = 0.2, learn = 'C_ID=(\d+)' }
SHOPPING_ID = { learn = 'SHOPPING_ID=(\d+)' }
[[pages]]
name = "S"
url = "/s?t={search_type}&q={search_string}&c={C_ID}"
[[pages.variants]]
weight = 2
params = { search_type = "author", search_string = { digsyl = { nurand = [511, 0, 1000] }, syllables = 7 } }
[[pages.variants]]
params = { search_type = "subject", search_string = { choice = ["ARTS", "TRAVEL"] } }
"#;
        let wl = parse(text, Path::new("w.toml")).unwrap();
        assert_eq!(wl.pages[0].variants.len(), 2);
        assert_eq!(wl.pages[0].variants[0].weight, 2.0);
        assert!(wl.needs_body()); // learn reads bodies
                                  // a placeholder only some variants give is an error
        let bad = text.replace("params = { search_type = \"subject\", search_string", "params = { search_type = \"subject\", other");
        assert!(err(&bad).contains("placeholder {search_string}"), "{}", err(&bad));
        // learn in a page parameter is an error
        let bad = text.replace("search_type = \"author\",", "search_type = { learn = 'x(y)' },");
        assert!(err(&bad).contains("only possible for session variables"), "{}", err(&bad));
    }
}
