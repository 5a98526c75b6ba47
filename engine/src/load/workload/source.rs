//! Finding things in the workload file's text for error messages (TOML values carry no
//! positions), and typed access to a section's fields.

use std::path::Path;

use toml::{Table, Value};

use super::error::{Loc, WorkloadError};

pub(super) type Result<T> = std::result::Result<T, WorkloadError>;

/// Locates lines in the source for error messages.
pub(super) struct Src<'a> {
    pub(super) file: &'a Path,
    pub(super) lines: Vec<&'a str>,
}

impl<'a> Src<'a> {
    pub(super) fn header_line(&self, header: &str) -> Option<usize> {
        self.lines.iter().position(|l| {
            let t = l.trim();
            t == header || t.starts_with(&format!("{header} ")) || t.starts_with(&format!("{header}#"))
        })
    }
    /// Line (1-based) of `key = ...` inside the section whose header is `header` ("" = top).
    pub(super) fn key_line(&self, header: &str, key: &str) -> Option<usize> {
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
    pub(super) fn page_line(&self, name: &str) -> Option<usize> {
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
    /// Line of the `n`th (0-based) `header` (e.g. `[[pages]]`).
    pub(super) fn nth_header(&self, header: &str, n: usize) -> Option<usize> {
        self.lines.iter().enumerate().filter(|(_, l)| l.trim_start().starts_with(header)).nth(n).map(|(i, _)| i + 1)
    }
    pub(super) fn loc(&self, line: Option<usize>) -> Loc {
        Loc { file: self.file.to_path_buf(), line }
    }
    /// An error at `line` of this file, said in words.
    pub(super) fn err(&self, line: Option<usize>, message: impl Into<String>) -> WorkloadError {
        WorkloadError::Invalid { at: self.loc(line), message: message.into() }
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

pub(super) fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Float(f) => Some(*f),
        Value::Integer(i) => Some(*i as f64),
        _ => None,
    }
}

pub(super) fn check_keys(src: &Src, t: &Table, header: &str, allowed: &[&str]) -> Result<()> {
    for k in t.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err(WorkloadError::UnknownKey {
                at: src.loc(src.key_line(header, k).or_else(|| src.header_line(header).map(|i| i + 1))),
                section: header.to_string(),
                key: k.clone(),
                expected: allowed.join(", "),
            });
        }
    }
    Ok(())
}

/// A `[section]` of the file (absent: every field takes its default).
pub(super) struct Sec<'a, 'b> {
    pub(super) src: &'a Src<'b>,
    pub(super) header: String,
    pub(super) t: Option<&'a Table>,
}

impl<'a, 'b> Sec<'a, 'b> {
    /// The section `[name]` of `root`.
    pub(super) fn of(src: &'a Src<'b>, root: &'a Table, name: &str) -> Result<Sec<'a, 'b>> {
        let header = format!("[{name}]");
        let t = match root.get(name) {
            None => None,
            Some(Value::Table(t)) => Some(t),
            Some(_) => return Err(src.err(src.key_line("", name), format!("{header} must be a table"))),
        };
        Ok(Sec { src, header, t })
    }
    /// Reject keys the section does not have.
    pub(super) fn check_keys(&self, allowed: &[&str]) -> Result<()> {
        match self.t {
            Some(t) => check_keys(self.src, t, &self.header, allowed),
            None => Ok(()),
        }
    }
    pub(super) fn f64(&self, key: &str, default: f64, min: f64) -> Result<f64> {
        let Some(v) = self.t.and_then(|t| t.get(key)) else { return Ok(default) };
        let x = num(v).ok_or_else(|| self.err(key, "a number"))?;
        if x < min || !x.is_finite() {
            return Err(self.err(key, &format!("a number >= {min}, got {x}")));
        }
        Ok(x)
    }
    pub(super) fn str(&self, key: &str) -> Result<Option<String>> {
        match self.t.and_then(|t| t.get(key)) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.err(key, "a string")),
        }
    }
    pub(super) fn strings(&self, key: &str) -> Result<Vec<String>> {
        match self.t.and_then(|t| t.get(key)) {
            None => Ok(vec![]),
            Some(Value::Array(a)) => a.iter().map(|v| v.as_str().map(str::to_string).ok_or_else(|| self.err(key, "a list of strings"))).collect(),
            Some(_) => Err(self.err(key, "a list of strings")),
        }
    }
    pub(super) fn err(&self, key: &str, expected: &str) -> WorkloadError {
        WorkloadError::Field {
            at: self.src.loc(self.src.key_line(&self.header, key)),
            section: self.header.clone(),
            field: key.to_string(),
            expected: expected.to_string(),
        }
    }
}
