//! What the request manager needs to know about SQL text: a port of
//! `python/tierscope/middleware/sql.py` (the same tokens, the same rules, the same results).
//!
//! `classify` says whether a statement may run on one replica (a read) or must run on all of them
//! (a write); `rewrite_macros` replaces the time macros by one literal, so every replica stores the
//! same value (C-JDBC's macro handling). Both look only at words outside string literals, quoted
//! identifiers and comments.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write,
    Copy,
}

/// first words of statements that only read (everything else is broadcast)
const READ_STARTS: [&str; 4] = ["SELECT", "SHOW", "VALUES", "TABLE"];
/// words that make a SELECT a write: row locks (MySQL's LOCK IN SHARE MODE too, as the Python rules)
const LOCKING: [&str; 5] = ["FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE", "FOR KEY SHARE", "LOCK IN SHARE MODE"];
/// sequence, lock and backend functions (MySQL's named locks too)
const WRITE_FUNCTIONS: [&str; 11] = [
    "NEXTVAL",
    "SETVAL",
    "PG_ADVISORY_LOCK",
    "PG_ADVISORY_XACT_LOCK",
    "LO_CREATE",
    "LO_UNLINK",
    "PG_TERMINATE_BACKEND",
    "PG_CANCEL_BACKEND",
    "GET_LOCK",
    "RELEASE_LOCK",
    "RELEASE_ALL_LOCKS",
];
const DATA_CHANGING: [&str; 8] = ["INSERT", "UPDATE", "DELETE", "MERGE", "TRUNCATE", "CREATE", "DROP", "ALTER"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokKind {
    Word,
    Punct,
    Param,
    Str,
    Number,
}

/// One token: its kind, its text (upper case for plain words) and its byte span in the SQL text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub kind: TokKind,
    pub text: String,
    pub start: usize,
    pub end: usize,
}

impl Token {
    fn is_punct(&self, c: &str) -> bool {
        self.kind == TokKind::Punct && self.text == c
    }
}

fn is_space(c: u8) -> bool {
    // Python's str.isspace over ASCII
    matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c | 0x1c..=0x1f)
}

/// Python's str.isspace (what `\\s` and `str.strip` take as whitespace): Unicode White_Space and the
/// separators U+001C..U+001F.
pub fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn is_word_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

fn find_from(s: &[u8], pat: &[u8], from: usize) -> Option<usize> {
    if from > s.len() {
        return None;
    }
    memchr::memmem::find(&s[from..], pat).map(|p| p + from)
}

/// The end of a `$tag$` at `i` (an ASCII `$`), if one starts there.
fn dollar_tag(s: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    if j < s.len() && is_word_start(s[j]) {
        j += 1;
        while j < s.len() && (s[j].is_ascii_alphanumeric() || s[j] == b'_') {
            j += 1;
        }
    }
    (j < s.len() && s[j] == b'$').then_some(j + 1)
}

/// The end of a number at `i` (`[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?`).
fn number_end(s: &[u8], i: usize) -> usize {
    let n = s.len();
    let mut j = i;
    while j < n && s[j].is_ascii_digit() {
        j += 1;
    }
    if j < n && s[j] == b'.' {
        j += 1;
        while j < n && s[j].is_ascii_digit() {
            j += 1;
        }
    }
    if j < n && (s[j] == b'e' || s[j] == b'E') {
        let mut k = j + 1;
        if k < n && (s[k] == b'+' || s[k] == b'-') {
            k += 1;
        }
        let digits = k;
        while k < n && s[k].is_ascii_digit() {
            k += 1;
        }
        if k > digits {
            j = k;
        }
    }
    j
}

/// Words, punctuation, numbers and literals of `sql`; comments and whitespace skipped.
pub fn tokens(sql: &str) -> Vec<Token> {
    tokens_upto(sql, usize::MAX)
}

/// The first `limit` tokens of `sql`.
fn tokens_upto(sql: &str, limit: usize) -> Vec<Token> {
    let s = sql.as_bytes();
    let n = s.len();
    let mut out = Vec::new();
    let text = |a: usize, b: usize| String::from_utf8_lossy(&s[a..b]).into_owned();
    let mut i = 0;
    while i < n && out.len() < limit {
        let c = s[i];
        if is_space(c) {
            i += 1;
        } else if s[i..].starts_with(b"--") {
            i = match memchr::memchr(b'\n', &s[i..]) {
                Some(j) => i + j + 1,
                None => n,
            };
        } else if s[i..].starts_with(b"/*") {
            // nested comments, as PostgreSQL allows
            let (mut depth, mut j) = (1, i + 2);
            while j < n && depth > 0 {
                if s[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if s[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            i = j;
        } else if c == b'\'' || (b"eEbBxXnN".contains(&c) && i + 1 < n && s[i + 1] == b'\'') {
            let mut j = if c == b'\'' { i + 1 } else { i + 2 };
            let backslash = c == b'e' || c == b'E';
            while j < n {
                if backslash && s[j] == b'\\' {
                    j += 2;
                    continue;
                }
                if s[j] == b'\'' {
                    if s[j..].starts_with(b"''") {
                        j += 2;
                        continue;
                    }
                    break;
                }
                j += 1;
            }
            let end = (j + 1).min(n);
            out.push(Token { kind: TokKind::Str, text: text(i, end), start: i, end });
            i = j + 1;
        } else if c == b'"' {
            let mut j = find_from(s, b"\"", i + 1);
            while let Some(k) = j {
                if s[k..].starts_with(b"\"\"") {
                    j = find_from(s, b"\"", k + 2);
                } else {
                    break;
                }
            }
            let j = j.unwrap_or(n - 1);
            // a quoted identifier never matches a keyword
            out.push(Token { kind: TokKind::Word, text: text(i, j + 1), start: i, end: j + 1 });
            i = j + 1;
        } else if c == b'$' {
            if let Some(tag_end) = dollar_tag(s, i) {
                let tag = &s[i..tag_end];
                let end = match find_from(s, tag, tag_end) {
                    Some(e) => e + tag.len(),
                    None => n,
                };
                out.push(Token { kind: TokKind::Str, text: text(i, end), start: i, end });
                i = end;
            } else {
                let mut j = i + 1;
                while j < n && s[j].is_ascii_digit() {
                    j += 1;
                }
                if j == i + 1 {
                    j = i + 1;
                }
                out.push(Token { kind: TokKind::Param, text: text(i, j), start: i, end: j });
                i = j;
            }
        } else if is_word_start(c) {
            let mut j = i + 1;
            while j < n && is_word_char(s[j]) {
                j += 1;
            }
            out.push(Token { kind: TokKind::Word, text: sql[i..j].to_ascii_uppercase(), start: i, end: j });
            i = j;
        } else if c.is_ascii_digit() {
            let j = number_end(s, i);
            out.push(Token { kind: TokKind::Number, text: text(i, j), start: i, end: j });
            i = j;
        } else {
            // one character (a whole UTF-8 sequence for non-ASCII; skipped when it is whitespace to Python)
            let mut j = i + 1;
            while j < n && (s[j] & 0xC0) == 0x80 {
                j += 1;
            }
            if c >= 0x80 && sql[i..j].chars().next().is_some_and(py_isspace) {
                i = j;
                continue;
            }
            out.push(Token { kind: TokKind::Punct, text: text(i, j), start: i, end: j });
            i = j;
        }
    }
    out
}

/// The tokens of each `;`-separated statement (empty statements dropped).
pub fn statements(toks: &[Token]) -> Vec<&[Token]> {
    toks.split(|t| t.is_punct(";")).filter(|s| !s.is_empty()).collect()
}

/// Read or Write for one statement's tokens (`classify`'s rule).
pub fn classify_statement(toks: &[Token]) -> Kind {
    let words: Vec<&str> = toks.iter().filter(|t| t.kind == TokKind::Word).map(|t| t.text.as_str()).collect();
    let first = toks.iter().find(|t| !t.is_punct("(")).map(|t| t.text.as_str()).unwrap_or("");
    if first == "WITH" {
        // a read unless one of its parts changes data
        let w = words.iter().any(|w| DATA_CHANGING.contains(w)) || locks(&words) || calls_writer(toks);
        return if w { Kind::Write } else { Kind::Read };
    }
    if !READ_STARTS.contains(&first) {
        return Kind::Write;
    }
    if first == "SELECT" && words.contains(&"INTO") && select_into(toks) {
        return Kind::Write;
    }
    if locks(&words) || calls_writer(toks) {
        return Kind::Write;
    }
    Kind::Read
}

fn locks(words: &[&str]) -> bool {
    // every phrase has FOR or LOCK inside one word: no join without one
    if !words.iter().any(|w| w.contains("FOR") || w.contains("LOCK")) {
        return false;
    }
    let text = words.join(" ");
    LOCKING.iter().any(|p| text.contains(p))
}

fn calls_writer(toks: &[Token]) -> bool {
    toks.iter()
        .enumerate()
        .any(|(i, t)| t.kind == TokKind::Word && WRITE_FUNCTIONS.contains(&t.text.as_str()) && i + 1 < toks.len() && toks[i + 1].text == "(")
}

/// SELECT ... INTO table (creates a table), not INSERT INTO (handled as a write anyway).
fn select_into(toks: &[Token]) -> bool {
    let mut depth = 0i64;
    for t in toks {
        if t.text == "(" {
            depth += 1;
        } else if t.text == ")" {
            depth -= 1;
        } else if depth == 0 && t.kind == TokKind::Word && t.text == "INTO" {
            return true;
        }
    }
    false
}

/// Read when every statement in `sql` only reads (SELECT without row locks, SHOW, VALUES, TABLE,
/// WITH without data-changing parts), else Write. Empty text (only comments) is a read.
pub fn classify(sql: &str) -> Kind {
    let toks = tokens(sql);
    if statements(&toks).into_iter().any(|s| classify_statement(s) == Kind::Write) {
        Kind::Write
    } else {
        Kind::Read
    }
}

/// What the manager does with a statement text: Copy (refused), Read or Write (the text without its
/// trailing request-id comment is classified, as the Python manager does).
pub fn kind_of(text: &str) -> Kind {
    let key = strip_trailing_comment(text);
    if first_word(key) == "COPY" {
        Kind::Copy
    } else {
        classify(key)
    }
}

/// `sql` without a trailing /* ... */ comment (the sqlcommenter request id differs per request).
pub fn strip_trailing_comment(sql: &str) -> &str {
    let t = sql.trim_end_matches(py_isspace);
    if t.ends_with("*/") {
        if let Some(start) = t.rfind("/*") {
            let inner = if start < t.len() - 2 { &t[start..t.len() - 2] } else { "" };
            if start > 0 && !inner.contains("*/") {
                return &t[..start];
            }
        }
    }
    sql
}

/// The end of a string literal `'...'` ('' inside) starting at `i`, as the Python label's regex
/// `'(?:[^']|'')*'` matches it: greedy, and when the closing quote is missing, backtracking to the
/// first quote of the last `''` (None: no literal starts at `i`).
fn label_string_end(s: &[u8], i: usize) -> Option<usize> {
    let n = s.len();
    let mut j = i + 1;
    let mut last_pair = None;
    while j < n {
        if s[j] != b'\'' {
            j += 1;
        } else if j + 1 < n && s[j + 1] == b'\'' {
            last_pair = Some(j);
            j += 2;
        } else {
            return Some(j + 1);
        }
    }
    last_pair.map(|p| p + 1)
}

/// The statement's label for service-time statistics (the `aware` policy): the text without a
/// trailing comment, string and number literals replaced by `?` and whitespace collapsed, so
/// `... WHERE id = 7` and `... WHERE id = 8` (simple protocol) share one label, as do `$1` forms
/// (extended protocol). The same text as the Python `sql.label` (engine/tests/sql_cases.json).
pub fn label(sql: &str) -> String {
    let t = strip_trailing_comment(sql);
    let s = t.as_bytes();
    let n = s.len();
    // literals replaced (Python: `'(?:[^']|'')*'|(?<![A-Za-z0-9_$])[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?`)
    let mut lit = String::with_capacity(n);
    let (mut i, mut copied) = (0, 0);
    while i < n {
        let c = s[i];
        let end = if c == b'\'' {
            label_string_end(s, i)
        } else if c.is_ascii_digit() && (i == 0 || !is_word_char(s[i - 1])) {
            Some(number_end(s, i))
        } else {
            None
        };
        match end {
            Some(e) => {
                lit.push_str(&t[copied..i]);
                lit.push('?');
                i = e;
                copied = e;
            }
            None => i += 1,
        }
    }
    lit.push_str(&t[copied..]);
    // whitespace runs to one space, then stripped
    let mut out = String::with_capacity(lit.len());
    let mut space = false;
    for ch in lit.chars() {
        if py_isspace(ch) {
            space = true;
        } else {
            if space && !out.is_empty() {
                out.push(' ');
            }
            space = false;
            out.push(ch);
        }
    }
    out
}

/// A statement that only opens a transaction, with no options: `BEGIN`, `BEGIN WORK`, `BEGIN
/// TRANSACTION`, `START TRANSACTION` (any case, an optional `;`). The middleware answers it itself
/// and sends it to the backends with the transaction's first statement (an option, which the
/// server might refuse, would be refused too late: such a BEGIN is sent as it comes).
pub fn plain_begin(sql: &str) -> bool {
    let toks = tokens(sql);
    let words: Vec<&str> = match toks.split_last() {
        Some((last, rest)) if last.is_punct(";") => rest,
        _ => &toks[..],
    }
    .iter()
    .map(|t| if t.kind == TokKind::Word { t.text.as_str() } else { "" })
    .collect();
    matches!(words.as_slice(), ["BEGIN"] | ["BEGIN", "WORK" | "TRANSACTION"] | ["START", "TRANSACTION"])
}

pub fn first_word(sql: &str) -> String {
    match tokens_upto(sql, 1).into_iter().next() {
        Some(t) if t.kind == TokKind::Word => t.text,
        _ => String::new(),
    }
}

// --- macros --------------------------------------------------------------------------------------

/// An instant as microseconds since the Unix epoch (UTC).
pub type Micros = i64;

pub fn now_micros() -> Micros {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    d.as_micros() as i64
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's civil_from_days).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// "YYYY-MM-DD HH:MM:SS[.ffffff]" at UTC (Python's isoformat(sep=' ') without the offset).
pub fn iso_utc(at: Micros) -> String {
    let secs = at.div_euclid(1_000_000);
    let us = at.rem_euclid(1_000_000);
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    let base = format!("{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
    if us == 0 {
        base
    } else {
        format!("{base}.{us:06}")
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum MacroType {
    Timestamptz,
    Timestamp,
    Date,
}

/// macros rewritten to a literal: name -> (needs "()" after it, SQL type of the literal)
fn macro_spec(word: &str) -> Option<(bool, MacroType)> {
    Some(match word {
        "NOW" => (true, MacroType::Timestamptz),
        "CURRENT_TIMESTAMP" => (false, MacroType::Timestamptz),
        "LOCALTIMESTAMP" => (false, MacroType::Timestamp),
        "CURRENT_DATE" => (false, MacroType::Date),
        "TRANSACTION_TIMESTAMP" => (true, MacroType::Timestamptz),
        "STATEMENT_TIMESTAMP" => (true, MacroType::Timestamptz),
        _ => return None,
    })
}

/// A word `rewrite_macros` replaces by one literal (NOW, CURRENT_TIMESTAMP, ...; upper case).
pub fn is_time_macro(word: &str) -> bool {
    macro_spec(word).is_some()
}

/// statements whose macros are rewritten: not DDL (a column DEFAULT now() must stay a function)
const REWRITE_IN: [&str; 7] = ["INSERT", "UPDATE", "DELETE", "MERGE", "WITH", "SELECT", "VALUES"];

fn contains_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len() && hay.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}

fn macro_literal(kind: MacroType, at: Micros, precision: Option<&str>) -> String {
    let iso = iso_utc(at);
    match kind {
        MacroType::Date => format!("'{}'::date", &iso[..10]),
        MacroType::Timestamp => match precision {
            Some(p) => format!("'{iso}'::timestamp({p})"),
            None => format!("'{iso}'::timestamp"),
        },
        MacroType::Timestamptz => match precision {
            Some(p) => format!("'{iso}+00:00'::timestamptz({p})"),
            None => format!("'{iso}+00:00'::timestamptz"),
        },
    }
}

/// `sql` with NOW(), CURRENT_TIMESTAMP[(p)], LOCALTIMESTAMP[(p)], CURRENT_DATE,
/// TRANSACTION_TIMESTAMP() and STATEMENT_TIMESTAMP() replaced by literals of the instant `at` in
/// INSERT, UPDATE, DELETE, MERGE, WITH, SELECT and VALUES statements; returns the new text (None
/// when nothing was replaced) and the number of replacements.
pub fn rewrite_macros(sql: &str, at: Micros) -> (Option<String>, usize) {
    // cheap test first: no macro name anywhere (in any case), nothing to do
    if !["NOW", "CURRENT_", "LOCALTIMESTAMP", "_TIMESTAMP"].iter().any(|w| contains_ci(sql.as_bytes(), w.as_bytes())) {
        return (None, 0);
    }
    let toks = tokens(sql);
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let mut i = 0;
    let mut first: Option<&str> = None;
    while i < toks.len() {
        let t = &toks[i];
        if t.is_punct(";") {
            first = None;
            i += 1;
            continue;
        }
        if first.is_none() && !t.is_punct("(") {
            first = Some(t.text.as_str());
        }
        let spec = if t.kind == TokKind::Word { macro_spec(&t.text) } else { None };
        let prev_dot = i > 0 && toks[i - 1].text == ".";
        let Some((call, typ)) = spec else {
            i += 1;
            continue;
        };
        if !REWRITE_IN.contains(&first.unwrap_or("")) || prev_dot {
            // a column like t.now is no macro
            i += 1;
            continue;
        }
        let nxt = &toks[i + 1..(i + 4).min(toks.len())];
        if call {
            if nxt.len() >= 2 && nxt[0].text == "(" && nxt[1].text == ")" {
                edits.push((t.start, nxt[1].end, macro_literal(typ, at, None)));
                i += 3;
                continue;
            }
            i += 1;
            continue;
        }
        if nxt.len() >= 3 && nxt[0].text == "(" && nxt[1].kind == TokKind::Number && nxt[2].text == ")" && typ != MacroType::Date {
            edits.push((t.start, nxt[2].end, macro_literal(typ, at, Some(&nxt[1].text))));
            i += 4;
            continue;
        }
        edits.push((t.start, t.end, macro_literal(typ, at, None)));
        i += 1;
    }
    if edits.is_empty() {
        return (None, 0);
    }
    let mut out = sql.to_string();
    for (start, end, text) in edits.iter().rev() {
        out.replace_range(*start..*end, text);
    }
    (Some(out), edits.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases shared with the Python middleware's tests (tests/test_middleware_sql_cases.py).
    const CASES: &str = include_str!("../../tests/sql_cases.json");

    fn cases(section: &str) -> Vec<(String, String)> {
        let v: serde_json::Value = serde_json::from_str(CASES).expect("engine/tests/sql_cases.json is JSON");
        let field = if section == "classify" { "kind" } else { "label" };
        let list = v[section].as_array().unwrap_or_else(|| panic!("sql_cases.json has no {section} list"));
        assert!(list.len() >= 20, "{section}: {} cases", list.len());
        list.iter().map(|c| (c["sql"].as_str().unwrap().to_string(), c[field].as_str().unwrap().to_string())).collect()
    }

    #[test]
    fn classification_matches_the_shared_cases() {
        for (text, kind) in cases("classify") {
            let expected = match kind.as_str() {
                "read" => Kind::Read,
                "write" => Kind::Write,
                other => panic!("kind {other:?}"),
            };
            assert_eq!(classify(&text), expected, "{text:?}");
        }
        // the plain BEGINs the session answers itself are the cases marked deferred, and only those
        let v: serde_json::Value = serde_json::from_str(CASES).expect("engine/tests/sql_cases.json is JSON");
        let list = v["classify"].as_array().expect("a classify list");
        assert!(list.iter().filter(|c| c["deferred"] == true).count() >= 2);
        for c in list {
            let text = c["sql"].as_str().expect("sql");
            assert_eq!(plain_begin(text), c["deferred"] == true, "{text:?}");
        }
        // a function name in a subquery's INTO is not SELECT INTO
        assert_eq!(classify("SELECT (SELECT 1) FROM t"), Kind::Read);
        assert_eq!(kind_of("COPY t FROM STDIN"), Kind::Copy);
        assert_eq!(kind_of("copy t to stdout /* x */"), Kind::Copy);
        assert_eq!(first_word(" /* c */ select 1"), "SELECT");
        assert_eq!(first_word("'x' select"), "");
        assert_eq!(tokens_upto("a b c", 2).len(), 2);
    }

    #[test]
    fn labels_match_the_shared_cases() {
        for (text, expected) in cases("label") {
            assert_eq!(label(&text), expected, "{text:?}");
        }
        // literals differ, the label does not; a statement with another shape has another label
        assert_eq!(label("SELECT v FROM small WHERE id = 7"), label("SELECT  v FROM small\nWHERE id = 8 /*request_id='r'*/"));
        assert_ne!(label("SELECT 1"), label("SELECT 1 FROM big ORDER BY md5(x)"));
    }

    #[test]
    fn tokens_skip_comments_and_keep_literals() {
        let t = tokens("select 'a''b', \"Q\"\"x\", $1, 3.5e2 -- c\n; /* x */ now()");
        let kinds: Vec<_> = t.iter().map(|t| (t.kind, t.text.as_str())).collect();
        assert_eq!(
            kinds,
            vec![
                (TokKind::Word, "SELECT"),
                (TokKind::Str, "'a''b'"),
                (TokKind::Punct, ","),
                (TokKind::Word, "\"Q\"\"x\""),
                (TokKind::Punct, ","),
                (TokKind::Param, "$1"),
                (TokKind::Punct, ","),
                (TokKind::Number, "3.5e2"),
                (TokKind::Punct, ";"),
                (TokKind::Word, "NOW"),
                (TokKind::Punct, "("),
                (TokKind::Punct, ")"),
            ]
        );
    }

    #[test]
    fn trailing_comments_are_stripped_for_the_cache_key() {
        assert_eq!(strip_trailing_comment("SELECT 1 /*request_id='x'*/"), "SELECT 1 ");
        assert_eq!(strip_trailing_comment("/* only */"), "/* only */");
        assert_eq!(strip_trailing_comment("SELECT 1"), "SELECT 1");
        assert_eq!(strip_trailing_comment("SELECT /* a */ 1 /* b */ "), "SELECT /* a */ 1 ");
    }

    // 2026-11-22 16:30:05.123456 UTC, as in tests/test_middleware.py
    const AT: Micros = 1_795_365_005_123_456;
    const TS: &str = "'2026-11-22 16:30:05.123456+00:00'::timestamptz";

    #[test]
    fn dates_are_civil() {
        assert_eq!(iso_utc(AT), "2026-11-22 16:30:05.123456");
        assert_eq!(iso_utc(0), "1970-01-01 00:00:00");
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn macros_are_rewritten_like_the_python_middleware() {
        let cases: Vec<(&str, String, usize)> = vec![
            ("INSERT INTO t VALUES (NOW())", format!("INSERT INTO t VALUES ({TS})"), 1),
            ("UPDATE t SET at = now ( ) WHERE x = 1", format!("UPDATE t SET at = {TS} WHERE x = 1"), 1),
            ("INSERT INTO t VALUES (current_timestamp(3))", "INSERT INTO t VALUES ('2026-11-22 16:30:05.123456+00:00'::timestamptz(3))".into(), 1),
            (
                "INSERT INTO t VALUES (CURRENT_DATE, LOCALTIMESTAMP)",
                "INSERT INTO t VALUES ('2026-11-22'::date, '2026-11-22 16:30:05.123456'::timestamp)".into(),
                2,
            ),
            ("INSERT INTO t VALUES ('now()', \"now\", t.now)", "INSERT INTO t VALUES ('now()', \"now\", t.now)".into(), 0),
            ("CREATE TABLE t (at timestamptz DEFAULT now())", "CREATE TABLE t (at timestamptz DEFAULT now())".into(), 0),
            ("SELECT now; INSERT INTO t VALUES (now())", format!("SELECT now; INSERT INTO t VALUES ({TS})"), 1),
            ("INSERT INTO t VALUES (Now())", format!("INSERT INTO t VALUES ({TS})"), 1),
            // the cases of tests/test_middleware.py::test_macro_rewriting
            ("INSERT INTO c (date) VALUES (NOW())", format!("INSERT INTO c (date) VALUES ({TS})"), 1),
            ("insert into c values (now ( ), current_timestamp)", format!("insert into c values ({TS}, {TS})"), 2),
            ("UPDATE t SET d = current_date", "UPDATE t SET d = '2026-11-22'::date".into(), 1),
            (
                "INSERT INTO t VALUES ('now()') /*request_id='NOW()'*/ -- now()",
                "INSERT INTO t VALUES ('now()') /*request_id='NOW()'*/ -- now()".into(),
                0,
            ),
            ("UPDATE t SET a = x.now, b = \"now\"", "UPDATE t SET a = x.now, b = \"now\"".into(), 0),
            ("SELECT nowhere FROM t", "SELECT nowhere FROM t".into(), 0),
        ];
        for (text, expected, n) in cases {
            let (new, k) = rewrite_macros(text, AT);
            assert_eq!(new.unwrap_or_else(|| text.to_string()), expected, "{text}");
            assert_eq!(k, n, "{text}");
        }
    }
}
