//! Request parameters: templates over session variables, distributions, word lists, generated
//! text, and regex extraction over the previous response body (how RUBBoS follows links).

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use rand::Rng;
use regex::bytes::Regex;
use toml::Value;

/// A `{name}` template: literal text and placeholders.
#[derive(Clone, Debug)]
pub struct Template {
    pub parts: Vec<Part>,
}

#[derive(Clone, Debug)]
pub enum Part {
    Lit(String),
    Var(String),
}

impl Template {
    pub fn parse(s: &str) -> Result<Template> {
        let mut parts = vec![];
        let mut rest = s;
        while let Some(i) = rest.find('{') {
            if i > 0 {
                parts.push(Part::Lit(rest[..i].to_string()));
            }
            let after = &rest[i + 1..];
            let j = after.find('}').ok_or_else(|| anyhow!("unclosed '{{' in \"{s}\""))?;
            let name = &after[..j];
            if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                bail!("bad placeholder {{{name}}} in \"{s}\" (expected {{name}} with letters, digits, _)");
            }
            parts.push(Part::Var(name.to_string()));
            rest = &after[j + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Lit(rest.to_string()));
        }
        Ok(Template { parts })
    }
    pub fn vars(&self) -> Vec<&str> {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Var(v) => Some(v.as_str()),
                Part::Lit(_) => None,
            })
            .collect()
    }
    pub fn is_literal(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }
    pub fn literal(&self) -> String {
        self.parts.iter().map(|p| if let Part::Lit(s) = p { s.as_str() } else { "" }).collect()
    }
}

#[derive(Clone, Debug)]
pub enum Otherwise {
    Back,
    Restart,
    Param(Box<Param>),
}

#[derive(Clone, Debug)]
pub enum Param {
    Template(Template),
    Uniform(i64, i64),
    /// TPC-W NURand(A, x, y) = ((random[0, A] | random[x, y]) mod (y - x + 1)) + x
    NURand(i64, i64, i64),
    Words(Arc<Vec<String>>),
    Text(usize, usize),
    Choice(Vec<String>),
    /// `from_url`: the regex runs over the previous request's path instead of its body;
    /// `value`: the value when the regex matches (instead of the first capture group)
    Extract {
        re: Regex,
        random: bool,
        skip: usize,
        otherwise: Otherwise,
        from_url: bool,
        value: Option<String>,
    },
    /// TPC-W DigSyl: the digits of the inner value as syllables (BA OG AL RI RE SE AT UL IN NG);
    /// `syllables` > 0 = exactly that many (the low digits, zero-padded), 0 = no leading zeros
    DigSyl {
        inner: Box<Param>,
        syllables: usize,
    },
    /// `then` when `cond` produces a non-empty value, else `other`
    When {
        cond: Box<Param>,
        then: Box<Param>,
        other: Box<Param>,
    },
    /// modifiers: the empty string with probability `blank`; lower-cased
    Mod {
        inner: Box<Param>,
        blank: f64,
        lower: bool,
    },
    /// a session variable that, while empty, takes the first capture of `re` in a response
    Learn {
        initial: Box<Param>,
        re: Regex,
    },
}

/// Why a value could not be produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Fallback {
    Back,
    Restart,
}

/// What a parameter may read: the session variables, the previous response body and path.
pub struct Env<'a> {
    pub vars: &'a [(Arc<str>, String)],
    pub body: &'a [u8],
    pub url: &'a str,
    pub words: &'a [String],
    /// `--dry-run`: every extraction finds "1"
    pub dry: bool,
}

impl<'a> Env<'a> {
    pub fn new(vars: &'a [(Arc<str>, String)], body: &'a [u8], url: &'a str, words: &'a [String]) -> Env<'a> {
        Env { vars, body, url, words, dry: false }
    }
}

const DIGSYL: [&str; 10] = ["BA", "OG", "AL", "RI", "RE", "SE", "AT", "UL", "IN", "NG"];

/// TPC-W DigSyl(d, n): `digits` as syllables; `n` > 0 gives exactly n syllables (the low n
/// digits, zero-padded), 0 gives one per digit without leading zeros (DigSyl(0) = "").
/// A value that is not a non-negative integer gives the empty string.
pub fn digsyl(digits: &str, n: usize, out: &mut String) {
    let d = digits.trim();
    if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
        return;
    }
    let d = d.trim_start_matches('0').as_bytes();
    if n == 0 {
        for &b in d {
            out.push_str(DIGSYL[(b - b'0') as usize]);
        }
    } else {
        for i in 0..n {
            // position i of n, counted from the left; the low n digits of d
            let from_right = n - 1 - i;
            let b = if from_right < d.len() { d[d.len() - 1 - from_right] } else { b'0' };
            out.push_str(DIGSYL[(b - b'0') as usize]);
        }
    }
}

/// TPC-W NURand(A, x, y) (as the Wisconsin RBE: no run-time constant C).
pub fn nurand<R: Rng>(a: i64, x: i64, y: i64, rng: &mut R) -> i64 {
    ((rng.gen_range(0..=a) | rng.gen_range(x..=y)) % (y - x + 1)) + x
}

const KINDS: [&str; 10] = ["uniform", "nurand", "words", "words_file", "text", "choice", "extract", "digsyl", "when", "learn"];
const MODIFIERS: [&str; 2] = ["blank", "lower"];

impl Param {
    /// Whether producing the value may read the previous response body.
    pub fn reads_body(&self) -> bool {
        match self {
            Param::Extract { from_url, otherwise, .. } => !*from_url || matches!(otherwise, Otherwise::Param(p) if p.reads_body()),
            Param::DigSyl { inner, .. } | Param::Mod { inner, .. } => inner.reads_body(),
            Param::Learn { .. } => true,
            Param::When { cond, then, other } => cond.reads_body() || then.reads_body() || other.reads_body(),
            _ => false,
        }
    }
    pub fn template_vars(&self) -> Vec<&str> {
        match self {
            Param::Template(t) => t.vars(),
            Param::Extract { otherwise: Otherwise::Param(p), .. } => p.template_vars(),
            Param::DigSyl { inner, .. } | Param::Mod { inner, .. } => inner.template_vars(),
            Param::Learn { initial, .. } => initial.template_vars(),
            Param::When { cond, then, other } => {
                let mut v = cond.template_vars();
                v.extend(then.template_vars());
                v.extend(other.template_vars());
                v
            }
            _ => vec![],
        }
    }

    /// `allow_extract`: page parameters (there is a previous response); `allow_learn`: session
    /// variables (a value learnt from responses).
    pub fn from_value(v: &Value, base_dir: &Path, allow_extract: bool) -> Result<Param> {
        Self::parse(v, base_dir, allow_extract, false)
    }

    pub fn parse(v: &Value, base_dir: &Path, allow_extract: bool, allow_learn: bool) -> Result<Param> {
        match v {
            Value::String(s) => Ok(Param::Template(Template::parse(s)?)),
            Value::Integer(i) => Ok(Param::Template(Template::parse(&i.to_string())?)),
            Value::Table(t) => {
                let kinds: Vec<&str> = t.keys().map(String::as_str).filter(|k| KINDS.contains(k) && *k != "learn").collect();
                let learn = t.get("learn");
                if kinds.len() > 1 {
                    bail!("give one of {} (got {})", KINDS[..9].join(", "), kinds.join(" and "));
                }
                if kinds.is_empty() && learn.is_none() {
                    bail!("expected a string or one of {{ uniform, nurand, words, words_file, text, choice, extract, digsyl, when }}");
                }
                let kind = kinds.first().copied().unwrap_or("learn");
                let allowed: &[&str] = match kind {
                    "extract" => &["pick", "skip", "otherwise", "from", "value"],
                    "digsyl" => &["syllables"],
                    "when" => &["then", "else"],
                    _ => &[],
                };
                for k in t.keys() {
                    if k != kind && k != "learn" && !allowed.contains(&k.as_str()) && !MODIFIERS.contains(&k.as_str()) {
                        let mut exp: Vec<&str> = allowed.to_vec();
                        exp.extend(MODIFIERS);
                        if allow_learn {
                            exp.push("learn");
                        }
                        bail!("{kind}: unknown key '{k}' (expected {})", exp.join(", "));
                    }
                }
                let base = if kind == "learn" {
                    Param::Template(Template { parts: vec![] })
                } else {
                    Self::parse_kind(kind, &t[kind], t, base_dir, allow_extract)?
                };
                let blank = match t.get("blank") {
                    None => 0.0,
                    Some(b) => match b.as_float().or_else(|| b.as_integer().map(|i| i as f64)) {
                        Some(x) if (0.0..=1.0).contains(&x) => x,
                        _ => bail!("blank: expected a probability in [0, 1]"),
                    },
                };
                let lower = match t.get("lower") {
                    None => false,
                    Some(Value::Boolean(b)) => *b,
                    Some(_) => bail!("lower: expected true or false"),
                };
                let mut p = if blank > 0.0 || lower { Param::Mod { inner: Box::new(base), blank, lower } } else { base };
                if let Some(l) = learn {
                    if !allow_learn {
                        bail!("learn is only possible for session variables ([session_vars] or a session type's vars)");
                    }
                    let re_s = l.as_str().ok_or_else(|| anyhow!("learn: expected a regex string"))?;
                    let re = Regex::new(re_s).map_err(|e| anyhow!("learn: bad regex: {e}"))?;
                    if re.captures_len() < 2 {
                        bail!("learn: the regex '{re_s}' needs a capture group (...)");
                    }
                    p = Param::Learn { initial: Box::new(p), re };
                }
                Ok(p)
            }
            _ => bail!("expected a string or a table like {{ uniform = [1, 10] }}"),
        }
    }

    fn parse_kind(kind: &str, arg: &Value, t: &toml::Table, base_dir: &Path, allow_extract: bool) -> Result<Param> {
        let ints = |a: &Value, n: usize, what: &str| -> Result<Vec<i64>> {
            let arr = a.as_array().filter(|a| a.len() == n).ok_or_else(|| anyhow!("{kind}: expected {what}"))?;
            arr.iter().map(|x| x.as_integer().ok_or_else(|| anyhow!("{kind}: expected integers"))).collect()
        };
        let pair = |a: &Value| -> Result<(i64, i64)> {
            let v = ints(a, 2, "[lo, hi]")?;
            if v[0] > v[1] {
                bail!("{kind}: lo {} > hi {}", v[0], v[1]);
            }
            Ok((v[0], v[1]))
        };
        let strings = |a: &Value| -> Result<Vec<String>> {
            let arr = a.as_array().ok_or_else(|| anyhow!("{kind}: expected a list of strings"))?;
            let v: Vec<String> =
                arr.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<_>>().ok_or_else(|| anyhow!("{kind}: expected strings"))?;
            if v.is_empty() {
                bail!("{kind}: the list is empty");
            }
            Ok(v)
        };
        match kind {
            "uniform" => {
                let (lo, hi) = pair(arg)?;
                Ok(Param::Uniform(lo, hi))
            }
            "nurand" => {
                let v = ints(arg, 3, "[A, x, y]")?;
                let (a, x, y) = (v[0], v[1], v[2]);
                if a < 0 || x > y {
                    bail!("nurand: expected A >= 0 and x <= y, got [{a}, {x}, {y}]");
                }
                Ok(Param::NURand(a, x, y))
            }
            "text" => {
                let (lo, hi) = pair(arg)?;
                if lo < 0 {
                    bail!("text: lengths must be >= 0");
                }
                Ok(Param::Text(lo as usize, hi as usize))
            }
            "words" => Ok(Param::Words(Arc::new(strings(arg)?))),
            "choice" => Ok(Param::Choice(strings(arg)?)),
            "words_file" => {
                let f = arg.as_str().ok_or_else(|| anyhow!("words_file: expected a path"))?;
                let p = base_dir.join(f);
                let text = std::fs::read_to_string(&p).map_err(|e| anyhow!("words_file {}: {e}", p.display()))?;
                // RUBBoS dictionary lines are "word  count": keep the first field
                let words: Vec<String> = text.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect();
                if words.is_empty() {
                    bail!("words_file {}: no words", p.display());
                }
                Ok(Param::Words(Arc::new(words)))
            }
            "digsyl" => {
                let inner = Self::parse(arg, base_dir, allow_extract, false).map_err(|e| anyhow!("digsyl: {e}"))?;
                let syllables = match t.get("syllables") {
                    None => 0,
                    Some(v) => match v.as_integer() {
                        Some(n) if (0..=20).contains(&n) => n as usize,
                        _ => bail!("digsyl: syllables must be an integer in [0, 20]"),
                    },
                };
                Ok(Param::DigSyl { inner: Box::new(inner), syllables })
            }
            "when" => {
                let cond = Self::parse(arg, base_dir, allow_extract, false).map_err(|e| anyhow!("when: {e}"))?;
                let branch = |k: &str| -> Result<Param> {
                    match t.get(k) {
                        None => Ok(Param::Template(Template { parts: vec![] })),
                        Some(v) => Self::parse(v, base_dir, allow_extract, false).map_err(|e| anyhow!("when {k}: {e}")),
                    }
                };
                Ok(Param::When { cond: Box::new(cond), then: Box::new(branch("then")?), other: Box::new(branch("else")?) })
            }
            "extract" => {
                if !allow_extract {
                    bail!("extract is only possible in page params/form (there is no previous response for a session variable)");
                }
                let re_s = arg.as_str().ok_or_else(|| anyhow!("extract: expected a regex string"))?;
                let re = Regex::new(re_s).map_err(|e| anyhow!("extract: bad regex: {e}"))?;
                let value = match t.get("value") {
                    None => None,
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(_) => bail!("extract: value must be a string"),
                };
                if re.captures_len() < 2 && value.is_none() {
                    bail!("extract: the regex '{re_s}' needs a capture group (...) (or give value = \"...\")");
                }
                let random = match t.get("pick").and_then(Value::as_str) {
                    None | Some("first") => false,
                    Some("random") => true,
                    Some(o) => bail!("extract: pick must be \"first\" or \"random\", got \"{o}\""),
                };
                let from_url = match t.get("from").map(|v| v.as_str()) {
                    None | Some(Some("body")) => false,
                    Some(Some("url")) => true,
                    Some(o) => bail!("extract: from must be \"body\" or \"url\", got {o:?}"),
                };
                let skip = t.get("skip").and_then(Value::as_integer).unwrap_or(0).max(0) as usize;
                let otherwise = match t.get("otherwise") {
                    None => Otherwise::Back,
                    Some(Value::String(s)) if s == "back" => Otherwise::Back,
                    Some(Value::String(s)) if s == "restart" => Otherwise::Restart,
                    Some(o) => {
                        let p = Self::parse(o, base_dir, allow_extract, false)
                            .map_err(|e| anyhow!("extract otherwise: {e} (or \"back\" / \"restart\")"))?;
                        Otherwise::Param(Box::new(p))
                    }
                };
                Ok(Param::Extract { re, random, skip, otherwise, from_url, value })
            }
            _ => unreachable!(),
        }
    }

    /// Produce the value (raw, not encoded).
    pub fn value<R: Rng>(&self, env: &Env, rng: &mut R, out: &mut String) -> Result<(), Fallback> {
        match self {
            Param::Template(t) => {
                for p in &t.parts {
                    match p {
                        Part::Lit(s) => out.push_str(s),
                        Part::Var(v) => {
                            if let Some((_, val)) = env.vars.iter().find(|(n, _)| &**n == v) {
                                out.push_str(val)
                            }
                        }
                    }
                }
            }
            Param::Uniform(lo, hi) => {
                use std::fmt::Write;
                let _ = write!(out, "{}", rng.gen_range(*lo..=*hi));
            }
            Param::NURand(a, x, y) => {
                use std::fmt::Write;
                let _ = write!(out, "{}", nurand(*a, *x, *y, rng));
            }
            Param::Words(w) => out.push_str(&w[rng.gen_range(0..w.len())]),
            Param::Choice(c) => out.push_str(&c[rng.gen_range(0..c.len())]),
            Param::Text(lo, hi) => {
                let words = env.words;
                let len = rng.gen_range(*lo..=*hi);
                let start = out.len();
                while out.len() - start < len {
                    if out.len() > start {
                        out.push(' ');
                    }
                    out.push_str(&words[rng.gen_range(0..words.len())]);
                }
                let mut cut = start + len;
                while !out.is_char_boundary(cut) {
                    cut -= 1;
                }
                out.truncate(cut);
            }
            Param::Extract { re, random, skip, otherwise, from_url, value } => {
                if env.dry {
                    out.push_str(value.as_deref().unwrap_or("1"));
                    return Ok(());
                }
                let hay: &[u8] = if *from_url { env.url.as_bytes() } else { env.body };
                let whole = value.is_some();
                let found = if *random {
                    let all: Vec<&[u8]> = re.captures_iter(hay).skip(*skip).filter_map(|c| group_of(c, whole)).collect();
                    if all.is_empty() {
                        None
                    } else {
                        Some(all[rng.gen_range(0..all.len())])
                    }
                } else {
                    re.captures_iter(hay).skip(*skip).find_map(|c| group_of(c, whole))
                };
                match found {
                    Some(b) => match value {
                        Some(v) => out.push_str(v),
                        None => out.push_str(&String::from_utf8_lossy(b)),
                    },
                    None => match otherwise {
                        Otherwise::Back => return Err(Fallback::Back),
                        Otherwise::Restart => return Err(Fallback::Restart),
                        Otherwise::Param(p) => return p.value(env, rng, out),
                    },
                }
            }
            Param::DigSyl { inner, syllables } => {
                let mut tmp = String::new();
                inner.value(env, rng, &mut tmp)?;
                digsyl(&tmp, *syllables, out);
            }
            Param::When { cond, then, other } => {
                let mut tmp = String::new();
                cond.value(env, rng, &mut tmp)?;
                if tmp.is_empty() {
                    other.value(env, rng, out)?;
                } else {
                    then.value(env, rng, out)?;
                }
            }
            Param::Mod { inner, blank, lower } => {
                if *blank > 0.0 && rng.gen::<f64>() < *blank {
                    return Ok(());
                }
                if *lower {
                    let mut tmp = String::new();
                    inner.value(env, rng, &mut tmp)?;
                    out.push_str(&tmp.to_lowercase());
                } else {
                    inner.value(env, rng, out)?;
                }
            }
            Param::Learn { initial, .. } => initial.value(env, rng, out)?,
        }
        Ok(())
    }

    /// For a `learn` session variable: the value learnt from a response body, if it matches.
    pub fn learn_from(&self, body: &[u8]) -> Option<String> {
        match self {
            Param::Learn { re, .. } => re.captures(body).and_then(|c| c.get(1)).map(|m| String::from_utf8_lossy(m.as_bytes()).into_owned()),
            _ => None,
        }
    }
}

/// The value of an extraction: capture group 1, or the whole match when a `value` replaces it.
fn group_of(c: regex::bytes::Captures<'_>, whole: bool) -> Option<&[u8]> {
    c.get(if whole { 0 } else { 1 }).map(|m| m.as_bytes())
}

/// Percent-encode a value for a URL query or a form body (RFC 3986 unreserved kept).
pub fn encode_into(raw: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in raw.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 15) as usize] as char);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn p(s: &str) -> Param {
        let v: toml::Table = format!("x = {s}").parse().unwrap();
        Param::from_value(&v["x"], Path::new("."), true).unwrap()
    }

    #[test]
    fn extraction_first_random_skip_and_fallback() {
        let body = b"<a href=\"ViewStory?storyId=11\"> <a href=\"ViewStory?storyId=22\"> <a href=\"ViewStory?storyId=33\">";
        let mut rng = SmallRng::seed_from_u64(1);
        let w = vec!["a".to_string()];
        let mut out = String::new();
        p(r#"{ extract = 'storyId=(\d+)' }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out).unwrap();
        assert_eq!(out, "11");
        out.clear();
        p(r#"{ extract = 'storyId=(\d+)', skip = 1 }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out).unwrap();
        assert_eq!(out, "22");
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            out.clear();
            p(r#"{ extract = 'storyId=(\d+)', pick = "random" }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out).unwrap();
            seen.insert(out.clone());
        }
        assert_eq!(seen.len(), 3);
        assert_eq!(p(r#"{ extract = 'nope=(\d+)' }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out), Err(Fallback::Back));
        assert_eq!(
            p(r#"{ extract = 'nope=(\d+)', otherwise = "restart" }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out),
            Err(Fallback::Restart)
        );
        out.clear();
        p(r#"{ extract = 'nope=(\d+)', otherwise = { uniform = [5, 5] } }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out).unwrap();
        assert_eq!(out, "5");
    }

    #[test]
    fn text_length_and_uniform_range_and_encoding() {
        let mut rng = SmallRng::seed_from_u64(2);
        let w = crate::load::workload::builtin_words();
        for _ in 0..500 {
            let mut out = String::new();
            p("{ text = [10, 99] }").value(&Env::new(&[], b"", "", &w), &mut rng, &mut out).unwrap();
            assert!((10..=99).contains(&out.len()), "{out:?}");
            out.clear();
            p("{ uniform = [3, 7] }").value(&Env::new(&[], b"", "", &w), &mut rng, &mut out).unwrap();
            let k: i64 = out.parse().unwrap();
            assert!((3..=7).contains(&k));
        }
        let mut e = String::new();
        encode_into("a b&c=d/é", &mut e);
        assert_eq!(e, "a%20b%26c%3Dd%2F%C3%A9");
        let mut out = String::new();
        let vars = vec![(Arc::from("k"), "42".to_string())];
        p(r#""user{k}""#).value(&Env::new(&vars, b"", "", &w), &mut rng, &mut out).unwrap();
        assert_eq!(out, "user42");
    }

    fn val(p: &Param, vars: &[(Arc<str>, String)], body: &[u8], url: &str, rng: &mut SmallRng) -> Result<String, Fallback> {
        let w = crate::load::workload::builtin_words();
        let mut out = String::new();
        p.value(&Env::new(vars, body, url, &w), rng, &mut out)?;
        Ok(out)
    }

    fn bad(s: &str, allow_extract: bool, allow_learn: bool) -> String {
        let v: toml::Table = format!("x = {s}").parse().unwrap();
        Param::parse(&v["x"], Path::new("."), allow_extract, allow_learn).unwrap_err().to_string()
    }

    #[test]
    fn digsyl_as_tpcw_defines_it() {
        let d = |s: &str, n: usize| {
            let mut o = String::new();
            digsyl(s, n, &mut o);
            o
        };
        assert_eq!(d("12", 0), "OGAL");
        assert_eq!(d("1234567890", 0), "OGALRIRESEATULINNGBA");
        assert_eq!(d("0", 0), "");
        assert_eq!(d("007", 0), "UL");
        assert_eq!(d("12", 7), "BABABABABAOGAL");
        assert_eq!(d("0", 3), "BABABA");
        // more digits than syllables: the low digits (as the Wisconsin RBE)
        assert_eq!(d("12345678", 7), "ALRIRESEATULIN");
        assert_eq!(d("", 7), "");
        assert_eq!(d("12a", 0), "");
        let mut rng = SmallRng::seed_from_u64(1);
        let vars = vec![(Arc::from("C_ID"), "4096".to_string())];
        assert_eq!(val(&p(r#"{ digsyl = "{C_ID}" }"#), &vars, b"", "", &mut rng).unwrap(), "REBANGAT");
        assert_eq!(val(&p(r#"{ digsyl = "{C_ID}", lower = true }"#), &vars, b"", "", &mut rng).unwrap(), "rebangat");
        for _ in 0..200 {
            let s = val(&p("{ digsyl = { nurand = [63, 0, 100] }, syllables = 7 }"), &[], b"", "", &mut rng).unwrap();
            assert_eq!(s.len(), 14, "{s}");
            assert!(s.starts_with("BABABABA"), "{s}");
        }
    }

    /// NURand(A, x, y): the exact distribution (enumerated over both uniform draws) vs 200k
    /// draws, chi-square; and it is far from uniform.
    #[test]
    fn nurand_matches_its_exact_distribution() {
        let (a, x, y) = (63i64, 0i64, 100i64);
        let span = (y - x + 1) as usize;
        let mut exact = vec![0f64; span];
        for r1 in 0..=a {
            for r2 in x..=y {
                exact[(((r1 | r2) % (y - x + 1)) + x - x) as usize] += 1.0;
            }
        }
        let tot: f64 = exact.iter().sum();
        for e in exact.iter_mut() {
            *e /= tot;
        }
        let mut rng = SmallRng::seed_from_u64(42);
        let n = 200_000;
        let mut counts = vec![0f64; span];
        let param = p("{ nurand = [63, 0, 100] }");
        for _ in 0..n {
            let v: i64 = val(&param, &[], b"", "", &mut rng).unwrap().parse().unwrap();
            assert!((x..=y).contains(&v));
            counts[(v - x) as usize] += 1.0;
        }
        let mut chi2 = 0.0;
        let mut df = 0;
        for i in 0..span {
            let e = exact[i] * n as f64;
            if e > 0.0 {
                chi2 += (counts[i] - e).powi(2) / e;
                df += 1;
            } else {
                assert_eq!(counts[i], 0.0);
            }
        }
        df -= 1;
        // chi-square with df ~ 100: mean df, sd sqrt(2 df) ~ 14; 5 sd
        assert!(chi2 < df as f64 + 5.0 * (2.0 * df as f64).sqrt(), "chi2 {chi2} df {df}");
        // non-uniform: 63 = 0b111111 makes values with those bits set far more likely
        assert!(exact[63] > 5.0 * exact[64], "{} vs {}", exact[63], exact[64]);
    }

    #[test]
    fn when_blank_and_extract_from_the_url() {
        let mut rng = SmallRng::seed_from_u64(3);
        let known = vec![(Arc::from("C_ID"), "17".to_string())];
        let anon = vec![(Arc::from("C_ID"), String::new())];
        let flag = p(r#"{ when = "{C_ID}", then = "Y", else = "N" }"#);
        assert_eq!(val(&flag, &known, b"", "", &mut rng).unwrap(), "Y");
        assert_eq!(val(&flag, &anon, b"", "", &mut rng).unwrap(), "N");
        let fname = p(r#"{ when = "{C_ID}", else = { text = [8, 15] } }"#);
        assert_eq!(val(&fname, &known, b"", "", &mut rng).unwrap(), "");
        assert!(val(&fname, &anon, b"", "", &mut rng).unwrap().len() >= 8);
        // blank: the empty string with probability 0.2
        let b = p("{ nurand = [1023, 1, 2880], blank = 0.2 }");
        let n = 20_000;
        let empty = (0..n).filter(|_| val(&b, &[], b"", "", &mut rng).unwrap().is_empty()).count() as f64 / n as f64;
        assert!((empty - 0.2).abs() < 0.015, "blank share {empty}");
        // extraction over the previous request's path, with a fixed value when it matches
        let iid = p(r#"{ extract = 'ProductDetail\?I_ID=(\d+)', from = "url", otherwise = "" }"#);
        assert_eq!(val(&iid, &[], b"I_ID=5", "/tpcw/ProductDetail?I_ID=42&C_ID=1", &mut rng).unwrap(), "42");
        assert_eq!(val(&iid, &[], b"ProductDetail?I_ID=5", "/tpcw/Home?C_ID=1", &mut rng).unwrap(), "");
        let add = p(r#"{ extract = '/ProductDetail\?', from = "url", value = "Y", otherwise = "N" }"#);
        assert_eq!(val(&add, &[], b"", "/tpcw/ProductDetail?I_ID=42", &mut rng).unwrap(), "Y");
        assert_eq!(val(&add, &[], b"", "/tpcw/Home", &mut rng).unwrap(), "N");
        assert!(!iid.reads_body() && p(r#"{ extract = 'I_ID=(\d+)' }"#).reads_body());
        // a cart refresh: from Product Detail its item; from the cart a random line's item
        // (extraction nested in `otherwise` and `when`); from anywhere else nothing
        let cart = p(
            r#"{ extract = '/ProductDetail\?I_ID=(\d+)', from = "url", otherwise = { when = { extract = '/ShoppingCart\?', from = "url", value = "1", otherwise = "" }, then = { extract = 'name="I_ID" value="(\d+)"', pick = "random", otherwise = "" } } }"#,
        );
        let body = br#"<input type="hidden" name="I_ID" value="7"><input type="hidden" name="I_ID" value="9">"#;
        assert_eq!(val(&cart, &[], body, "/tpcw/ProductDetail?I_ID=42", &mut rng).unwrap(), "42");
        assert_eq!(val(&cart, &[], body, "/tpcw/Home", &mut rng).unwrap(), "");
        let lines: std::collections::HashSet<String> =
            (0..50).map(|_| val(&cart, &[], body, "/tpcw/ShoppingCart?ADD_FLAG=N", &mut rng).unwrap()).collect();
        assert_eq!(lines, ["7".to_string(), "9".to_string()].into_iter().collect());
        assert!(cart.reads_body());
        // a dry run finds "1" (or the fixed value)
        let w = crate::load::workload::builtin_words();
        let mut out = String::new();
        add.value(&Env { vars: &[], body: b"", url: "", words: &w, dry: true }, &mut rng, &mut out).unwrap();
        assert_eq!(out, "Y");
    }

    #[test]
    fn learn_takes_the_first_match_while_empty() {
        let v: toml::Table = r#"x = { learn = 'SHOPPING_ID=(\d+)' }
y = { nurand = [1023, 1, 2880], blank = 1.0, learn = 'C_ID=(\d+)' }"#
            .parse()
            .unwrap();
        let x = Param::parse(&v["x"], Path::new("."), false, true).unwrap();
        let y = Param::parse(&v["y"], Path::new("."), false, true).unwrap();
        let mut rng = SmallRng::seed_from_u64(5);
        assert_eq!(val(&x, &[], b"", "", &mut rng).unwrap(), "");
        assert_eq!(val(&y, &[], b"", "", &mut rng).unwrap(), "");
        assert_eq!(x.learn_from(b"<a href=\"/tpcw/Home?SHOPPING_ID=77&C_ID=3\">").as_deref(), Some("77"));
        assert_eq!(y.learn_from(b"<a href=\"/tpcw/Home?SHOPPING_ID=77&C_ID=3\">").as_deref(), Some("3"));
        assert_eq!(x.learn_from(b"nothing"), None);
        assert!(x.reads_body());
    }

    #[test]
    fn bad_forms_are_named() {
        assert!(bad("{ learn = 'C_ID=(\\d+)' }", true, false).contains("only possible for session variables"));
        assert!(bad("{ nurand = [63, 10, 1] }", false, false).contains("x <= y"));
        assert!(bad("{ nurand = [63, 1] }", false, false).contains("[A, x, y]"));
        assert!(bad("{ uniform = [1, 2], nurand = [1, 1, 2] }", false, false).contains("give one of"));
        assert!(bad("{ uniform = [1, 2], blank = 2 }", false, false).contains("blank"));
        assert!(bad("{ uniform = [1, 2], pick = \"first\" }", false, false).contains("unknown key 'pick'"));
        assert!(bad("{ digsyl = \"{k}\", syllables = -1 }", false, false).contains("syllables"));
        assert!(bad("{ extract = '(x)', from = \"head\" }", true, false).contains("from must be"));
        assert!(bad("{ extract = 'x' }", true, false).contains("capture group"));
        assert!(bad("{ when = \"{k}\", then = { extract = 'a(b)' } }", false, false).contains("extract is only possible"));
    }
}
