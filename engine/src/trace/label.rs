//! Labels: what a request was, with the parts that vary per request taken out, so that requests
//! of one kind group together.
//!
//! * HTTP: `METHOD /path` with numeric, UUID and long hex path segments replaced by `{id}`,
//!   `{uuid}`, `{hex}`, and query values replaced by `?` (`GET /story/{id}?page=?`).
//! * SQL: a fingerprint: comments dropped, string/number literals and `$n` placeholders -> `?`,
//!   `IN (?, ?, ?)` -> `IN (?+)`, whitespace collapsed, trailing `;` dropped.
//! * A label whose source bytes were cut by the snapshot length ends with ` [truncated]`.
//!
//! Request ids: the `X-Request-Id` header (HTTP) or a sqlcommenter comment
//! `/*request_id='<url-encoded id>'*/` anywhere in the statement.

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;

use super::hash::FxBuild;

pub const TRUNCATED_MARK: &str = " [truncated]";
const MAX_LABEL: usize = 512;

/// Which SQL dialect's quoting rules apply.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dialect {
    Postgres,
    MySql,
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// The fingerprint of a SQL statement (see module docs) and the request id from a sqlcommenter
/// comment, if any. `cut` says the statement text was truncated by the capture.
pub fn sql_fingerprint(sql: &[u8], dialect: Dialect, cut: bool) -> (String, Option<String>) {
    let mut out: Vec<u8> = Vec::with_capacity(sql.len().min(MAX_LABEL) + 16);
    let mut rid = None;
    let n = sql.len();
    let mut i = 0;
    let mut space = false;
    let push_space = |out: &mut Vec<u8>, space: &mut bool| {
        if *space && !out.is_empty() {
            out.push(b' ');
        }
        *space = false;
    };
    while i < n && out.len() < MAX_LABEL {
        let c = sql[i];
        match c {
            b' ' | b'\t' | b'\r' | b'\n' | 0x0c => {
                space = true;
                i += 1;
            }
            b'/' if i + 1 < n && sql[i + 1] == b'*' => {
                let end = find(&sql[i + 2..], b"*/").map(|p| i + 2 + p).unwrap_or(n);
                if rid.is_none() {
                    rid = sqlcommenter_request_id(&sql[i + 2..end]);
                }
                i = (end + 2).min(n);
                space = true;
            }
            b'-' if i + 1 < n && sql[i + 1] == b'-' => {
                i = sql[i..].iter().position(|&b| b == b'\n').map(|p| i + p + 1).unwrap_or(n);
                space = true;
            }
            b'#' if dialect == Dialect::MySql => {
                i = sql[i..].iter().position(|&b| b == b'\n').map(|p| i + p + 1).unwrap_or(n);
                space = true;
            }
            b'\'' | b'"' | b'`' => {
                let q = c;
                let mut j = i + 1;
                while j < n {
                    if sql[j] == b'\\' && dialect == Dialect::MySql && q != b'`' {
                        j += 2;
                        continue;
                    }
                    if sql[j] == q {
                        if j + 1 < n && sql[j + 1] == q {
                            j += 2;
                            continue;
                        }
                        break;
                    }
                    j += 1;
                }
                let end = (j + 1).min(n);
                push_space(&mut out, &mut space);
                let is_string = q == b'\'' || (q == b'"' && dialect == Dialect::MySql);
                if is_string {
                    // E'..', N'..', B'..', X'..' prefixes were already emitted as identifiers: drop them
                    if let Some(&p) = out.last() {
                        if matches!(p, b'E' | b'e' | b'N' | b'n' | b'B' | b'b' | b'X' | b'x') && (out.len() == 1 || !is_ident(out[out.len() - 2])) {
                            out.pop();
                        }
                    }
                    out.push(b'?');
                } else {
                    out.extend_from_slice(&sql[i..end]);
                }
                i = end;
            }
            b'$' if dialect == Dialect::Postgres && (i == 0 || !is_ident(sql[i - 1])) => {
                // $1 placeholder or $tag$ ... $tag$ dollar quoting
                let mut j = i + 1;
                while j < n && sql[j].is_ascii_digit() {
                    j += 1;
                }
                push_space(&mut out, &mut space);
                if j > i + 1 {
                    out.push(b'?');
                    i = j;
                    continue;
                }
                let mut k = i + 1;
                while k < n && (sql[k].is_ascii_alphanumeric() || sql[k] == b'_') {
                    k += 1;
                }
                if k < n && sql[k] == b'$' {
                    let tag = &sql[i..=k];
                    let end = find(&sql[k + 1..], tag).map(|p| k + 1 + p + tag.len()).unwrap_or(n);
                    out.push(b'?');
                    i = end;
                } else {
                    out.push(b'$');
                    i += 1;
                }
            }
            b'0'..=b'9' if i == 0 || !is_ident(sql[i - 1]) => {
                let mut j = i;
                if c == b'0' && j + 1 < n && (sql[j + 1] == b'x' || sql[j + 1] == b'X') {
                    j += 2;
                    while j < n && sql[j].is_ascii_hexdigit() {
                        j += 1;
                    }
                } else {
                    while j < n && (sql[j].is_ascii_digit() || sql[j] == b'.') {
                        j += 1;
                    }
                    if j < n && (sql[j] == b'e' || sql[j] == b'E') {
                        let mut k = j + 1;
                        if k < n && (sql[k] == b'+' || sql[k] == b'-') {
                            k += 1;
                        }
                        if k < n && sql[k].is_ascii_digit() {
                            j = k;
                            while j < n && sql[j].is_ascii_digit() {
                                j += 1;
                            }
                        }
                    }
                }
                push_space(&mut out, &mut space);
                out.push(b'?');
                i = j;
            }
            _ => {
                // punctuation needs no space before , ) and none after (
                if space && !matches!(c, b',' | b')' | b';') && out.last() != Some(&b'(') {
                    push_space(&mut out, &mut space);
                }
                space = false;
                out.push(c);
                i += 1;
                if is_ident(c) {
                    // the rest of a word goes out as it is (digits and `$` after an identifier
                    // character are not literals): copy the run at once, within MAX_LABEL
                    let run = sql[i..].iter().position(|&b| !is_ident(b)).unwrap_or(n - i);
                    let run = run.min(MAX_LABEL.saturating_sub(out.len()));
                    out.extend_from_slice(&sql[i..i + run]);
                    i += run;
                }
            }
        }
    }
    let truncated = cut || i < n;
    while matches!(out.last(), Some(b';') | Some(b' ')) {
        out.pop();
    }
    let text = String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    let has_list = memchr::memchr_iter(b',', text.as_bytes()).any(|p| p > 0 && text.as_bytes()[p - 1] == b'?');
    let mut s = if has_list { collapse_in_lists(&text) } else { text };
    if truncated {
        s.push_str(TRUNCATED_MARK);
    }
    (s, rid)
}

/// An exact-text cache in front of `sql_fingerprint`, for statement texts that repeat verbatim on
/// a connection (extended-protocol Parse, prepared statements): hashing the text costs a fraction
/// of fingerprinting it, and the label is shared instead of rebuilt. The fingerprint is a
/// function of the text alone, so a hit returns exactly what `sql_fingerprint` would. Bounded
/// (entries and text length): memory stays proportional to the open connections.
/// Statement text -> (fingerprint, request id).
type Fingerprints = HashMap<Box<[u8]>, (Rc<str>, Option<String>), FxBuild>;

pub struct FingerprintCache {
    dialect: Dialect,
    map: Fingerprints,
}

impl FingerprintCache {
    const MAX_ENTRIES: usize = 128;
    const MAX_TEXT: usize = 1024;

    pub fn new(dialect: Dialect) -> Self {
        FingerprintCache { dialect, map: HashMap::default() }
    }

    /// `sql_fingerprint(sql, dialect, cut)`, from the cache when `sql` was seen before.
    pub fn fingerprint(&mut self, sql: &[u8], cut: bool) -> (Rc<str>, Option<String>) {
        if cut || sql.len() > Self::MAX_TEXT {
            let (l, rid) = sql_fingerprint(sql, self.dialect, cut);
            return (l.into(), rid);
        }
        if let Some((l, rid)) = self.map.get(sql) {
            return (l.clone(), rid.clone());
        }
        let (l, rid) = sql_fingerprint(sql, self.dialect, false);
        let l: Rc<str> = l.into();
        if self.map.len() < Self::MAX_ENTRIES {
            self.map.insert(sql.into(), (l.clone(), rid.clone()));
        }
        (l, rid)
    }
}

/// `(?, ?, ?)` and `(?,?)` -> `(?+)`.
fn collapse_in_lists(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'(' {
            let mut j = i + 1;
            let mut count = 0;
            loop {
                if j < b.len() && b[j] == b'?' {
                    count += 1;
                    j += 1;
                    if j < b.len() && b[j] == b',' {
                        j += 1;
                        if j < b.len() && b[j] == b' ' {
                            j += 1;
                        }
                        continue;
                    }
                }
                break;
            }
            if count >= 2 && j < b.len() && b[j] == b')' {
                out.push_str("(?+)");
                i = j + 1;
                continue;
            }
        }
        let ch_len = utf8_len(b[i]);
        out.push_str(&s[i..(i + ch_len).min(b.len())]);
        i += ch_len;
    }
    out
}

fn utf8_len(b: u8) -> usize {
    match b {
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => 1,
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

/// `request_id='abc%2F1'` inside a sqlcommenter comment body -> `abc/1`.
pub fn sqlcommenter_request_id(comment: &[u8]) -> Option<String> {
    let key = b"request_id=";
    let mut from = 0;
    while let Some(p) = find(&comment[from..], key) {
        let at = from + p;
        let before_ok = at == 0 || matches!(comment[at - 1], b' ' | b',' | b'\t' | b'\n');
        let v = &comment[at + key.len()..];
        if before_ok && !v.is_empty() && (v[0] == b'\'' || v[0] == b'"') {
            let q = v[0];
            let end = v[1..].iter().position(|&b| b == q)?;
            return Some(url_decode(&v[1..1 + end]));
        }
        from = at + key.len();
    }
    None
}

pub fn url_decode(v: &[u8]) -> String {
    if memchr::memchr(b'%', v).is_none() {
        return String::from_utf8_lossy(v).into_owned(); // nothing encoded: the common case
    }
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        if v[i] == b'%' && i + 2 < v.len() {
            if let (Some(h), Some(l)) = (hexval(v[i + 1]), hexval(v[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(v[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hexval(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `GET /users/42/orders?id=7&x=y` -> `GET /users/{id}/orders?id=?&x=?`.
pub fn http_label(method: &[u8], target: &[u8], cut: bool) -> String {
    let mut out = String::with_capacity(method.len() + target.len() + 8);
    out.push_str(&String::from_utf8_lossy(method));
    out.push(' ');
    // absolute-form: drop scheme://host
    let mut t = target;
    if let Some(p) = find(t, b"://") {
        let rest = &t[p + 3..];
        t = rest.iter().position(|&b| b == b'/').map(|q| &rest[q..]).unwrap_or(b"/");
    }
    let (path, query) = match t.iter().position(|&b| b == b'?') {
        Some(q) => (&t[..q], Some(&t[q + 1..])),
        None => (t, None),
    };
    let mut first = true;
    for seg in path.split(|&b| b == b'/') {
        if !first {
            out.push('/');
        }
        first = false;
        out.push_str(&template_segment(seg));
        if out.len() > MAX_LABEL {
            break;
        }
    }
    if let Some(q) = query {
        out.push('?');
        let mut firstp = true;
        for pair in q.split(|&b| b == b'&') {
            if pair.is_empty() {
                continue;
            }
            if !firstp {
                out.push('&');
            }
            firstp = false;
            let key = pair.split(|&b| b == b'=').next().unwrap_or(b"");
            out.push_str(&String::from_utf8_lossy(key));
            if pair.contains(&b'=') {
                out.push_str("=?");
            }
            if out.len() > MAX_LABEL {
                break;
            }
        }
    }
    if cut {
        out.push_str(TRUNCATED_MARK);
    }
    out
}

fn template_segment(seg: &[u8]) -> Cow<'_, str> {
    if seg.is_empty() {
        return Cow::Borrowed("");
    }
    if seg.iter().all(|b| b.is_ascii_digit()) {
        return "{id}".into();
    }
    let is_uuid =
        seg.len() == 36 && seg.iter().enumerate().all(|(i, &b)| if matches!(i, 8 | 13 | 18 | 23) { b == b'-' } else { b.is_ascii_hexdigit() });
    if is_uuid {
        return "{uuid}".into();
    }
    if seg.len() >= 16 && seg.iter().all(|b| b.is_ascii_hexdigit()) && seg.iter().any(|b| b.is_ascii_digit()) {
        return "{hex}".into();
    }
    String::from_utf8_lossy(seg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_literals_become_placeholders() {
        let (fp, rid) =
            sql_fingerprint(b"SELECT  abalance FROM pgbench_accounts\n WHERE aid = 4711 AND name = 'O''Brien';", Dialect::Postgres, false);
        assert_eq!(fp, "SELECT abalance FROM pgbench_accounts WHERE aid = ? AND name = ?");
        assert_eq!(rid, None);
    }

    #[test]
    fn extended_placeholders_match_simple_literals() {
        let a = sql_fingerprint(b"UPDATE t SET x = x + $1 WHERE id = $2", Dialect::Postgres, false).0;
        let b = sql_fingerprint(b"UPDATE t SET x = x + -5 WHERE id = 12;", Dialect::Postgres, false).0;
        assert_eq!(a, "UPDATE t SET x = x + ? WHERE id = ?");
        assert_eq!(b, "UPDATE t SET x = x + -? WHERE id = ?");
    }

    #[test]
    fn in_lists_collapse_and_identifiers_keep_digits() {
        let (fp, _) = sql_fingerprint(b"select t1.c2 from t1 where id IN (1, 2, 3) and c IN ('a','b')", Dialect::MySql, false);
        assert_eq!(fp, "select t1.c2 from t1 where id IN (?+) and c IN (?+)");
    }

    #[test]
    fn sqlcommenter_request_id_is_decoded_and_comment_dropped() {
        let (fp, rid) = sql_fingerprint(b"SELECT * FROM stories WHERE id = 3 /*request_id='ab%2Fc-1',traceparent='00-x'*/", Dialect::MySql, false);
        assert_eq!(fp, "SELECT * FROM stories WHERE id = ?");
        assert_eq!(rid.as_deref(), Some("ab/c-1"));
        let (_, rid) = sql_fingerprint(b"/* request_id='r9' */ SELECT 1", Dialect::Postgres, false);
        assert_eq!(rid.as_deref(), Some("r9"));
    }

    #[test]
    fn mysql_backslash_escapes_and_dollar_quotes() {
        let (fp, _) = sql_fingerprint(br"INSERT INTO c VALUES ('it\'s', 0x1F, 2.5e3)", Dialect::MySql, false);
        assert_eq!(fp, "INSERT INTO c VALUES (?+)");
        let (fp, _) = sql_fingerprint(b"SELECT $fn$ body; 'x' $fn$, E'a\\'", Dialect::Postgres, false);
        assert_eq!(fp, "SELECT ?, ?");
    }

    #[test]
    fn fingerprints_shared_with_the_trace_importers() {
        // engine/tests/fingerprint_cases.json: python/tierscope/ingest/sql_label.py gives the same
        let cases: serde_json::Value = serde_json::from_str(include_str!("../../tests/fingerprint_cases.json")).unwrap();
        for case in cases["cases"].as_array().unwrap() {
            let sql = case["sql"].as_str().unwrap();
            let dialect = if case["mysql"].as_bool().unwrap() { Dialect::MySql } else { Dialect::Postgres };
            assert_eq!(sql_fingerprint(sql.as_bytes(), dialect, false).0, case["label"].as_str().unwrap(), "{sql}");
        }
    }

    #[test]
    fn truncated_statement_is_marked() {
        let (fp, _) = sql_fingerprint(b"SELECT a FROM t WHERE b = 'abc", Dialect::Postgres, true);
        assert_eq!(fp, "SELECT a FROM t WHERE b = ? [truncated]");
    }

    #[test]
    fn http_paths_are_templated() {
        assert_eq!(http_label(b"GET", b"/users/42/orders?id=7&x=y", false), "GET /users/{id}/orders?id=?&x=?");
        assert_eq!(http_label(b"POST", b"http://h:8080/o/123e4567-e89b-12d3-a456-426614174000", false), "POST /o/{uuid}");
        assert_eq!(http_label(b"GET", b"/PHP/ViewStory.php?storyId=12", true), "GET /PHP/ViewStory.php?storyId=? [truncated]");
        assert_eq!(http_label(b"GET", b"/", false), "GET /");
    }
}
