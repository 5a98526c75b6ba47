//! Request parameters: templates over session variables, distributions, word lists, generated
//! text, and regex extraction over the previous response body (how RUBBoS follows links).

use std::path::Path;
use std::sync::Arc;

use rand::Rng;
use regex::bytes::Regex;
use toml::Value;

mod error;
pub use error::ParamError;
use error::KINDS;

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
    pub fn parse(s: &str) -> Result<Template, ParamError> {
        let mut parts = vec![];
        let mut rest = s;
        while let Some(i) = rest.find('{') {
            if i > 0 {
                parts.push(Part::Lit(rest[..i].to_string()));
            }
            let after = &rest[i + 1..];
            let j = after.find('}').ok_or_else(|| ParamError::UnclosedBrace { template: s.to_string() })?;
            let name = &after[..j];
            if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                return Err(ParamError::BadPlaceholder { template: s.to_string(), name: name.to_string() });
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
    pub fn from_value(v: &Value, base_dir: &Path, allow_extract: bool) -> Result<Param, ParamError> {
        Self::parse(v, base_dir, allow_extract, false)
    }

    pub fn parse(v: &Value, base_dir: &Path, allow_extract: bool, allow_learn: bool) -> Result<Param, ParamError> {
        let t = match v {
            Value::String(s) => return Ok(Param::Template(Template::parse(s)?)),
            Value::Integer(i) => return Ok(Param::Template(Template::parse(&i.to_string())?)),
            Value::Table(t) => t,
            other => return Err(ParamError::NotAParameter { got: shown(other) }),
        };
        let kinds: Vec<&str> = t.keys().map(String::as_str).filter(|k| KINDS.contains(k)).collect();
        let learn = t.get("learn");
        if kinds.len() > 1 {
            return Err(ParamError::SeveralKinds { kinds: kinds.iter().map(|k| k.to_string()).collect() });
        }
        if kinds.is_empty() && learn.is_none() {
            return Err(ParamError::NoKind);
        }
        let kind = kinds.first().copied().unwrap_or("learn");
        let allowed: &[&'static str] = match kind {
            "extract" => &["pick", "skip", "otherwise", "from", "value"],
            "digsyl" => &["syllables"],
            "when" => &["then", "else"],
            _ => &[],
        };
        for k in t.keys() {
            if k != kind && k != "learn" && !allowed.contains(&k.as_str()) && !MODIFIERS.contains(&k.as_str()) {
                let mut expected: Vec<&'static str> = allowed.to_vec();
                expected.extend(MODIFIERS);
                if allow_learn {
                    expected.push("learn");
                }
                return Err(ParamError::UnknownKey { kind: kind.to_string(), key: k.clone(), expected });
            }
        }
        let base =
            if kind == "learn" { Param::Template(Template { parts: vec![] }) } else { Self::parse_kind(kind, &t[kind], t, base_dir, allow_extract)? };
        let blank = match t.get("blank") {
            None => 0.0,
            Some(b) => match b.as_float().or_else(|| b.as_integer().map(|i| i as f64)) {
                Some(x) if (0.0..=1.0).contains(&x) => x,
                Some(_) => return Err(out_of_range("blank", "a probability in [0, 1]", b)),
                None => return Err(wrong_type("blank", "a probability in [0, 1]", b)),
            },
        };
        let lower = match t.get("lower") {
            None => false,
            Some(Value::Boolean(b)) => *b,
            Some(o) => return Err(wrong_type("lower", "true or false", o)),
        };
        let mut p = if blank > 0.0 || lower { Param::Mod { inner: Box::new(base), blank, lower } } else { base };
        if let Some(l) = learn {
            if !allow_learn {
                return Err(ParamError::LearnOutsideSession);
            }
            let re_s = l.as_str().ok_or_else(|| wrong_type("learn", "a regex string", l))?;
            let re = Regex::new(re_s).map_err(|error| ParamError::BadRegex { kind: "learn", error })?;
            if re.captures_len() < 2 {
                return Err(ParamError::NoCaptureGroup { kind: "learn", regex: re_s.to_string() });
            }
            p = Param::Learn { initial: Box::new(p), re };
        }
        Ok(p)
    }

    fn parse_kind(kind: &str, arg: &Value, t: &toml::Table, base_dir: &Path, allow_extract: bool) -> Result<Param, ParamError> {
        let ints = |a: &Value, n: usize, what: &'static str| -> Result<Vec<i64>, ParamError> {
            let arr = a.as_array().filter(|a| a.len() == n).ok_or_else(|| wrong_type(kind, what, a))?;
            arr.iter().map(|x| x.as_integer().ok_or_else(|| wrong_type(kind, what, a))).collect()
        };
        let pair = |a: &Value, what: &'static str| -> Result<(i64, i64), ParamError> {
            let v = ints(a, 2, what)?;
            if v[0] > v[1] {
                return Err(ParamError::Reversed { kind: kind.to_string(), lo: v[0], hi: v[1] });
            }
            Ok((v[0], v[1]))
        };
        let strings = |a: &Value| -> Result<Vec<String>, ParamError> {
            let list = || wrong_type(kind, "a list of strings", a);
            let arr = a.as_array().ok_or_else(list)?;
            let v: Vec<String> = arr.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<_>>().ok_or_else(list)?;
            if v.is_empty() {
                return Err(ParamError::EmptyList { kind: kind.to_string() });
            }
            Ok(v)
        };
        let nested = |within: &'static str| move |e: ParamError| ParamError::Nested { within, error: Box::new(e) };
        match kind {
            "uniform" => {
                let (lo, hi) = pair(arg, "[lo, hi] (integers)")?;
                Ok(Param::Uniform(lo, hi))
            }
            "nurand" => {
                let v = ints(arg, 3, "[A, x, y] (integers)")?;
                let (a, x, y) = (v[0], v[1], v[2]);
                if a < 0 || x > y {
                    return Err(ParamError::NURand { a, x, y });
                }
                Ok(Param::NURand(a, x, y))
            }
            "text" => {
                let (lo, hi) = pair(arg, "[lo, hi] (lengths in bytes)")?;
                if lo < 0 {
                    return Err(out_of_range("text", "lengths >= 0", arg));
                }
                Ok(Param::Text(lo as usize, hi as usize))
            }
            "words" => Ok(Param::Words(Arc::new(strings(arg)?))),
            "choice" => Ok(Param::Choice(strings(arg)?)),
            "words_file" => {
                let f = arg.as_str().ok_or_else(|| wrong_type("words_file", "a path (a string)", arg))?;
                let path = base_dir.join(f);
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    Err(error) => return Err(ParamError::WordsFile { path, error }),
                };
                // RUBBoS dictionary lines are "word  count": keep the first field
                let words: Vec<String> = text.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect();
                if words.is_empty() {
                    return Err(ParamError::NoWords { path });
                }
                Ok(Param::Words(Arc::new(words)))
            }
            "digsyl" => {
                let inner = Self::parse(arg, base_dir, allow_extract, false).map_err(nested("digsyl"))?;
                let syllables = match t.get("syllables") {
                    None => 0,
                    Some(v) => match v.as_integer() {
                        Some(n) if (0..=20).contains(&n) => n as usize,
                        Some(_) => return Err(out_of_range("digsyl syllables", "an integer in [0, 20]", v)),
                        None => return Err(wrong_type("digsyl syllables", "an integer in [0, 20]", v)),
                    },
                };
                Ok(Param::DigSyl { inner: Box::new(inner), syllables })
            }
            "when" => {
                let cond = Self::parse(arg, base_dir, allow_extract, false).map_err(nested("when"))?;
                let branch = |k: &'static str, within: &'static str| -> Result<Param, ParamError> {
                    match t.get(k) {
                        None => Ok(Param::Template(Template { parts: vec![] })),
                        Some(v) => Self::parse(v, base_dir, allow_extract, false).map_err(nested(within)),
                    }
                };
                let (then, other) = (branch("then", "when then")?, branch("else", "when else")?);
                Ok(Param::When { cond: Box::new(cond), then: Box::new(then), other: Box::new(other) })
            }
            "extract" => {
                if !allow_extract {
                    return Err(ParamError::ExtractOutsidePage);
                }
                let re_s = arg.as_str().ok_or_else(|| wrong_type("extract", "a regex string", arg))?;
                let re = Regex::new(re_s).map_err(|error| ParamError::BadRegex { kind: "extract", error })?;
                let value = match t.get("value") {
                    None => None,
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(o) => return Err(wrong_type("extract value", "a string", o)),
                };
                if re.captures_len() < 2 && value.is_none() {
                    return Err(ParamError::NoCaptureGroup { kind: "extract", regex: re_s.to_string() });
                }
                let random = match t.get("pick") {
                    None => false,
                    Some(v) => match v.as_str() {
                        Some("first") => false,
                        Some("random") => true,
                        _ => return Err(wrong_type("extract pick", "\"first\" or \"random\"", v)),
                    },
                };
                let from_url = match t.get("from") {
                    None => false,
                    Some(v) => match v.as_str() {
                        Some("body") => false,
                        Some("url") => true,
                        _ => return Err(wrong_type("extract from", "\"body\" or \"url\"", v)),
                    },
                };
                let skip = match t.get("skip") {
                    None => 0,
                    Some(v) => match v.as_integer() {
                        Some(n) if n >= 0 => n as usize,
                        Some(_) => return Err(out_of_range("extract skip", "an integer >= 0", v)),
                        None => return Err(wrong_type("extract skip", "an integer >= 0", v)),
                    },
                };
                let otherwise = match t.get("otherwise") {
                    None => Otherwise::Back,
                    Some(Value::String(s)) if s == "back" => Otherwise::Back,
                    Some(Value::String(s)) if s == "restart" => Otherwise::Restart,
                    Some(o) => Otherwise::Param(Box::new(Self::parse(o, base_dir, allow_extract, false).map_err(nested("extract otherwise"))?)),
                };
                Ok(Param::Extract { re, random, skip, otherwise, from_url, value })
            }
            _ => unreachable!("parse_kind is called with one of KINDS"),
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

/// A TOML value as the file would show it, for a message (long values cut).
fn shown(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}...", s.chars().take(57).collect::<String>())
    } else {
        s
    }
}

fn wrong_type(field: &str, expected: &'static str, got: &Value) -> ParamError {
    ParamError::WrongType { field: field.to_string(), expected, got: shown(got) }
}

fn out_of_range(field: &str, expected: &'static str, got: &Value) -> ParamError {
    ParamError::OutOfRange { field: field.to_string(), expected, got: shown(got) }
}

#[cfg(test)]
mod tests;
