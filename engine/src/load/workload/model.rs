//! The workload model: pages (with their parameters and variants), session types, chains,
//! phases, connection policy, embedded objects: validated and index-based.

use std::path::PathBuf;

use crate::load::markov::Chain;
use crate::load::params::{Param, Template};

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

#[allow(dead_code)] // `file` and `chain_names` describe the model (Debug, tests); the driver reads neither
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
    #[allow(dead_code)] // for tests and tools: the driver works with indices
    pub fn page_index(&self, name: &str) -> Option<usize> {
        self.pages.iter().position(|p| p.name == name)
    }
}
