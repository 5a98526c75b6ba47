//! Pages to requests: a page's URL and form rendered from its parameters, the session variables
//! and the previous response, and the HTTP request bytes sent for it.

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::Rng;

use super::ctx::Ctx;
use crate::load::params::{encode_into, Env, Fallback, Part};
use crate::load::workload::{Method, Page, Policy, Variant, Workload};

/// A rendered request: path (with query) and form body; what history remembers for BACK.
#[derive(Clone, Debug)]
pub struct Req {
    pub path: Arc<str>,
    pub form: Option<Arc<str>>,
}

/// Render page `i` of `wl`: the path (after `prefix`) with its placeholders filled in, and the
/// form body of a POST. A page with variants draws one per request.
pub(super) fn render_page(wl: &Workload, prefix: &str, i: usize, env: &Env, rng: &mut SmallRng) -> Result<Req, Fallback> {
    let page = &wl.pages[i];
    let variant = pick_variant(page, rng);
    let mut path = String::with_capacity(64);
    path.push_str(prefix);
    let mut tmp = String::new();
    for part in &page.url.parts {
        match part {
            Part::Lit(s) => path.push_str(s),
            Part::Var(name) => {
                tmp.clear();
                lookup(page, variant, name, env, rng, &mut tmp)?;
                encode_into(&tmp, &mut path);
            }
        }
    }
    let form = if page.method == Method::Post {
        let mut f = String::new();
        for (k, p) in &page.form {
            if !f.is_empty() {
                f.push('&');
            }
            encode_into(k, &mut f);
            f.push('=');
            tmp.clear();
            p.value(env, rng, &mut tmp)?;
            encode_into(&tmp, &mut f);
        }
        Some(Arc::from(f))
    } else {
        None
    };
    Ok(Req { path: Arc::from(path), form })
}

fn pick_variant<'a>(page: &'a Page, rng: &mut SmallRng) -> Option<&'a Variant> {
    match page.variants.len() {
        0 => None,
        1 => page.variants.first(),
        _ => {
            let total: f64 = page.variants.iter().map(|v| v.weight).sum();
            let mut u = rng.gen::<f64>() * total;
            for v in &page.variants {
                if u < v.weight {
                    return Some(v);
                }
                u -= v.weight;
            }
            page.variants.last()
        }
    }
}

/// A placeholder's value: the variant's params, the page's params and form, the session variables.
fn lookup(page: &Page, variant: Option<&Variant>, name: &str, env: &Env, rng: &mut SmallRng, out: &mut String) -> Result<(), Fallback> {
    if let Some((_, p)) = variant.and_then(|v| v.params.iter().find(|(k, _)| k == name)) {
        return p.value(env, rng, out);
    }
    if let Some((_, p)) = page.params.iter().chain(page.form.iter()).find(|(k, _)| k == name) {
        return p.value(env, rng, out);
    }
    if let Some((_, v)) = env.vars.iter().find(|(k, _)| &**k == name) {
        out.push_str(v);
    }
    Ok(())
}

impl Ctx {
    /// Session variables drawn when a session starts.
    pub(super) fn draw_vars(&self, stype: usize, rng: &mut SmallRng) -> Vec<(Arc<str>, String)> {
        let st = &self.wl.session_types[stype];
        st.vars
            .iter()
            .zip(&self.var_names[stype])
            .map(|((_, p), name)| {
                let mut v = String::new();
                let _ = p.value(&Env::new(&[], b"", "", &self.words), rng, &mut v);
                (name.clone(), v)
            })
            .collect()
    }
    /// Learn `learn` session variables that are still empty from a response body.
    pub(super) fn learn(&self, stype: usize, vars: &mut [(Arc<str>, String)], body: &[u8]) {
        if body.is_empty() || !self.learns[stype] {
            return;
        }
        for ((_, p), (_, v)) in self.wl.session_types[stype].vars.iter().zip(vars.iter_mut()) {
            if v.is_empty() {
                if let Some(x) = p.learn_from(body) {
                    *v = x;
                }
            }
        }
    }
    /// Render page `i` (URL and form) from the session variables and the previous response.
    pub(super) fn render(&self, i: usize, env: &Env, rng: &mut SmallRng) -> Result<Req, Fallback> {
        if let Some(p) = &self.static_paths[i] {
            return Ok(Req { path: p.clone(), form: None });
        }
        render_page(&self.wl, &self.target.prefix, i, env, rng)
    }
    /// The start page of a session (no previous response).
    pub(super) fn render_start(&self, vars: &[(Arc<str>, String)], rng: &mut SmallRng) -> Req {
        let start = self.wl.start;
        self.render(start, &Env::new(vars, b"", "", &self.words), rng).unwrap_or_else(|_| Req { path: self.static_or_empty(start), form: None })
    }
    pub(super) fn static_or_empty(&self, i: usize) -> Arc<str> {
        self.static_paths[i].clone().unwrap_or_else(|| Arc::from(format!("{}{}", self.target.prefix, self.wl.pages[i].url.literal())))
    }
    /// The pre-built request of a page with a literal URL and no body (None for the others).
    pub(super) fn static_request(&self, page: usize) -> Option<Arc<[u8]>> {
        self.static_paths[page].as_ref().map(|p| {
            let req = Req { path: p.clone(), form: None };
            Arc::from(self.build_request(page, &req, self.policy == Policy::PerRequest))
        })
    }

    pub(super) fn request_bytes(&self, page: usize, req: &Req, close: bool) -> ReqBytes {
        if let Some(b) = &self.static_requests[page] {
            return ReqBytes::Shared(b.clone());
        }
        ReqBytes::Owned(self.build_request(page, req, close))
    }
    /// A GET of an embedded object.
    pub(super) fn object_request(&self, path: &str, close: bool) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + path.len() + self.target.host_header.len());
        b.extend_from_slice(b"GET ");
        b.extend_from_slice(path.as_bytes());
        b.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        b.extend_from_slice(self.target.host_header.as_bytes());
        b.extend_from_slice(b"\r\nUser-Agent: tierscope\r\n");
        if close {
            b.extend_from_slice(b"Connection: close\r\n");
        }
        b.extend_from_slice(b"\r\n");
        b
    }
    pub(super) fn build_request(&self, page: usize, req: &Req, close: bool) -> Vec<u8> {
        let method = self.wl.pages[page].method;
        let form_len = req.form.as_ref().map_or(0, |f| f.len());
        let mut b = Vec::with_capacity(96 + req.path.len() + self.target.host_header.len() + form_len);
        b.extend_from_slice(if method == Method::Post { b"POST " } else { b"GET " });
        b.extend_from_slice(req.path.as_bytes());
        b.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        b.extend_from_slice(self.target.host_header.as_bytes());
        b.extend_from_slice(b"\r\nUser-Agent: tierscope\r\n");
        if close {
            b.extend_from_slice(b"Connection: close\r\n");
        }
        if let Some(f) = &req.form {
            b.extend_from_slice(b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: ");
            b.extend_from_slice(f.len().to_string().as_bytes());
            b.extend_from_slice(b"\r\n\r\n");
            b.extend_from_slice(f.as_bytes());
        } else {
            b.extend_from_slice(b"\r\n");
        }
        b
    }
}

/// Request bytes: shared for pages whose request never changes, built otherwise.
pub(super) enum ReqBytes {
    Shared(Arc<[u8]>),
    Owned(Vec<u8>),
}

impl std::ops::Deref for ReqBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReqBytes::Shared(a) => a,
            ReqBytes::Owned(v) => v,
        }
    }
}
