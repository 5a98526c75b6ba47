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
    Words(Arc<Vec<String>>),
    Text(usize, usize),
    Choice(Vec<String>),
    Extract { re: Regex, random: bool, skip: usize, otherwise: Otherwise },
}

/// Why a value could not be produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Fallback {
    Back,
    Restart,
}

impl Param {
    pub fn is_extract(&self) -> bool {
        match self {
            Param::Extract { .. } => true,
            _ => false,
        }
    }
    pub fn template_vars(&self) -> Vec<&str> {
        match self {
            Param::Template(t) => t.vars(),
            Param::Extract { otherwise: Otherwise::Param(p), .. } => p.template_vars(),
            _ => vec![],
        }
    }

    pub fn from_value(v: &Value, base_dir: &Path, allow_extract: bool) -> Result<Param> {
        match v {
            Value::String(s) => Ok(Param::Template(Template::parse(s)?)),
            Value::Integer(i) => Ok(Param::Template(Template::parse(&i.to_string())?)),
            Value::Table(t) => {
                let (kind, arg) = t
                    .iter()
                    .find(|(k, _)| ["uniform", "words", "words_file", "text", "choice", "extract"].contains(&k.as_str()))
                    .ok_or_else(|| anyhow!("expected a string or one of {{ uniform, words, words_file, text, choice, extract }}"))?;
                let pair = |a: &Value| -> Result<(i64, i64)> {
                    let arr = a.as_array().filter(|a| a.len() == 2).ok_or_else(|| anyhow!("{kind}: expected [lo, hi]"))?;
                    let lo = arr[0].as_integer().ok_or_else(|| anyhow!("{kind}: expected integers"))?;
                    let hi = arr[1].as_integer().ok_or_else(|| anyhow!("{kind}: expected integers"))?;
                    if lo > hi {
                        bail!("{kind}: lo {lo} > hi {hi}");
                    }
                    Ok((lo, hi))
                };
                let strings = |a: &Value| -> Result<Vec<String>> {
                    let arr = a.as_array().ok_or_else(|| anyhow!("{kind}: expected a list of strings"))?;
                    let v: Vec<String> = arr.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<_>>().ok_or_else(|| anyhow!("{kind}: expected strings"))?;
                    if v.is_empty() {
                        bail!("{kind}: the list is empty");
                    }
                    Ok(v)
                };
                match kind.as_str() {
                    "uniform" => {
                        let (lo, hi) = pair(arg)?;
                        Ok(Param::Uniform(lo, hi))
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
                    "extract" => {
                        if !allow_extract {
                            bail!("extract is only possible in page params/form (there is no previous response for a session variable)");
                        }
                        let re_s = arg.as_str().ok_or_else(|| anyhow!("extract: expected a regex string"))?;
                        let re = Regex::new(re_s).map_err(|e| anyhow!("extract: bad regex: {e}"))?;
                        if re.captures_len() < 2 {
                            bail!("extract: the regex '{re_s}' needs a capture group (...)");
                        }
                        let random = match t.get("pick").and_then(Value::as_str) {
                            None | Some("first") => false,
                            Some("random") => true,
                            Some(o) => bail!("extract: pick must be \"first\" or \"random\", got \"{o}\""),
                        };
                        let skip = t.get("skip").and_then(Value::as_integer).unwrap_or(0).max(0) as usize;
                        let otherwise = match t.get("otherwise") {
                            None => Otherwise::Back,
                            Some(Value::String(s)) if s == "back" => Otherwise::Back,
                            Some(Value::String(s)) if s == "restart" => Otherwise::Restart,
                            Some(o) => {
                                let p = Param::from_value(o, base_dir, false).map_err(|e| anyhow!("extract otherwise: {e} (or \"back\" / \"restart\")"))?;
                                Otherwise::Param(Box::new(p))
                            }
                        };
                        for k in t.keys() {
                            if !["extract", "pick", "skip", "otherwise"].contains(&k.as_str()) {
                                bail!("extract: unknown key '{k}' (expected pick, skip, otherwise)");
                            }
                        }
                        Ok(Param::Extract { re, random, skip, otherwise })
                    }
                    _ => unreachable!(),
                }
            }
            _ => bail!("expected a string or a table like {{ uniform = [1, 10] }}"),
        }
    }

    /// Produce the value (raw, not encoded). `vars` are the session variables (name, value).
    pub fn value<R: Rng>(&self, vars: &[(Arc<str>, String)], body: &[u8], words: &[String], rng: &mut R, out: &mut String) -> Result<(), Fallback> {
        match self {
            Param::Template(t) => {
                for p in &t.parts {
                    match p {
                        Part::Lit(s) => out.push_str(s),
                        Part::Var(v) => {
                            if let Some((_, val)) = vars.iter().find(|(n, _)| &**n == v) {
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
            Param::Words(w) => out.push_str(&w[rng.gen_range(0..w.len())]),
            Param::Choice(c) => out.push_str(&c[rng.gen_range(0..c.len())]),
            Param::Text(lo, hi) => {
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
            Param::Extract { re, random, skip, otherwise } => {
                let found = if *random {
                    let all: Vec<&[u8]> = re.captures_iter(body).skip(*skip).filter_map(|c| c.get(1).map(|m| m.as_bytes())).collect();
                    if all.is_empty() {
                        None
                    } else {
                        Some(all[rng.gen_range(0..all.len())])
                    }
                } else {
                    re.captures_iter(body).skip(*skip).find_map(|c| c.get(1).map(|m| m.as_bytes()))
                };
                match found {
                    Some(b) => out.push_str(&String::from_utf8_lossy(b)),
                    None => match otherwise {
                        Otherwise::Back => return Err(Fallback::Back),
                        Otherwise::Restart => return Err(Fallback::Restart),
                        Otherwise::Param(p) => return p.value(vars, body, words, rng, out),
                    },
                }
            }
        }
        Ok(())
    }
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
        p(r#"{ extract = 'storyId=(\d+)' }"#).value(&[], body, &w, &mut rng, &mut out).unwrap();
        assert_eq!(out, "11");
        out.clear();
        p(r#"{ extract = 'storyId=(\d+)', skip = 1 }"#).value(&[], body, &w, &mut rng, &mut out).unwrap();
        assert_eq!(out, "22");
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            out.clear();
            p(r#"{ extract = 'storyId=(\d+)', pick = "random" }"#).value(&[], body, &w, &mut rng, &mut out).unwrap();
            seen.insert(out.clone());
        }
        assert_eq!(seen.len(), 3);
        assert_eq!(p(r#"{ extract = 'nope=(\d+)' }"#).value(&[], body, &w, &mut rng, &mut out), Err(Fallback::Back));
        assert_eq!(p(r#"{ extract = 'nope=(\d+)', otherwise = "restart" }"#).value(&[], body, &w, &mut rng, &mut out), Err(Fallback::Restart));
        out.clear();
        p(r#"{ extract = 'nope=(\d+)', otherwise = { uniform = [5, 5] } }"#).value(&[], body, &w, &mut rng, &mut out).unwrap();
        assert_eq!(out, "5");
    }

    #[test]
    fn text_length_and_uniform_range_and_encoding() {
        let mut rng = SmallRng::seed_from_u64(2);
        let w = crate::load::workload::builtin_words();
        for _ in 0..500 {
            let mut out = String::new();
            p("{ text = [10, 99] }").value(&[], b"", &w, &mut rng, &mut out).unwrap();
            assert!((10..=99).contains(&out.len()), "{out:?}");
            out.clear();
            p("{ uniform = [3, 7] }").value(&[], b"", &w, &mut rng, &mut out).unwrap();
            let k: i64 = out.parse().unwrap();
            assert!((3..=7).contains(&k));
        }
        let mut e = String::new();
        encode_into("a b&c=d/é", &mut e);
        assert_eq!(e, "a%20b%26c%3Dd%2F%C3%A9");
        let mut out = String::new();
        let vars = vec![(Arc::from("k"), "42".to_string())];
        p(r#""user{k}""#).value(&vars, b"", &w, &mut rng, &mut out).unwrap();
        assert_eq!(out, "user42");
    }
}
