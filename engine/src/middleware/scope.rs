//! What a write touches, for the row scheduler (`--scheduler rows`, issue 25 item 3): from a
//! statement's text alone its *shape* (`shape`), then with the table's facts from the catalog and
//! the Bind's parameters its *scope* (`resolve`): no lock (a read, or an INSERT that commutes with
//! every other write), the rows it names (an UPDATE or DELETE of one row by its primary key), or
//! the whole database (anything else).
//!
//! Two write units whose scopes do not meet commute: run in either order on each replica they
//! leave the same rows. So the scheduler lets them run side by side and keeps replicas identical
//! by ordering only the units whose scopes meet. Everything here errs towards the database: a
//! statement this module does not understand takes it, as every write did under the one write
//! lock.
//!
//! The rules (the shared cases are `engine/tests/sql_cases.json`'s "scope" list):
//! - one statement (an optional `;`), not a read;
//! - `UPDATE t SET c = e [, c = e]* WHERE k = v` and `DELETE FROM t WHERE k = v`, where `t` and
//!   `c` are plain names, `k` is `t`'s single-column primary key (integer or text), `v` a
//!   parameter (in text, or a binary integer of a declared type), a number or a string, and every
//!   `e` uses only `t`'s columns, parameters,
//!   literals, operators, casts and the time macros (rewritten to one literal for every replica):
//!   no function call, no subquery. No assigned column may be in a unique index.
//! - `INSERT INTO t [(cols)] VALUES (e, ...) [, (...)]`, the same expressions, into a table with no
//!   unique index, no identity, serial or generated column: an insert commutes with every other
//!   insert and with keyed updates (none can name a row of a table without a key).
//! - `t` has no trigger (foreign keys are triggers too), rule, row security, child or partition.
//! - the database's default isolation is READ COMMITTED (under a snapshot the order of commits on
//!   each replica could decide whether an update fails).

use std::borrow::Cow;
use std::collections::HashMap;

use super::sql::{self, Kind, TokKind, Token};

/// A key's value as the statement gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyValue {
    /// `$n` (1-based), its text from the Bind
    Param(usize),
    /// a number literal (with its sign)
    Number(String),
    /// a string literal's content
    Text(String),
}

/// What a statement touches, from its text alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// it only reads
    Read,
    /// it begins or ends a transaction (or a savepoint), with no options
    Control(Control),
    /// UPDATE (the columns it assigns in `set`) or DELETE of the rows whose `column` is `value`
    Row { table: String, column: String, value: KeyValue, set: Vec<String> },
    /// INSERT of rows given by values
    Insert { table: String },
    /// anything else
    Database,
}

/// A table's facts from the catalog (`FACTS_SQL`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableFacts {
    /// its single-column primary key and whether that is an integer (else text)
    pub key: Option<(String, bool)>,
    /// columns in a unique index or an exclusion constraint (all of them: `None`, when an index
    /// is on an expression)
    pub unique_columns: Option<Vec<String>>,
    pub has_unique: bool,
    /// an identity, serial (nextval default) or generated column
    pub has_serial: bool,
    /// no trigger, rule, row security, child table or partition
    pub plain: bool,
}

/// The facts the scopes are resolved with.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Facts {
    pub tables: HashMap<String, TableFacts>,
    pub read_committed: bool,
}

/// A row: its table and its key's canonical text.
pub type RowKey = (String, String);

/// What a unit must hold before it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// nothing of its own (reads, commuting inserts): only what keeps it apart from a unit that
    /// takes the database
    Shared,
    Rows(Vec<RowKey>),
    Database,
}

impl Scope {
    /// The scope of two statements of one unit.
    pub fn join(self, other: Scope) -> Scope {
        match (self, other) {
            (Scope::Database, _) | (_, Scope::Database) => Scope::Database,
            (Scope::Rows(mut a), Scope::Rows(b)) => {
                for k in b {
                    if !a.contains(&k) {
                        a.push(k);
                    }
                }
                Scope::Rows(a)
            }
            (Scope::Rows(a), Scope::Shared) | (Scope::Shared, Scope::Rows(a)) => Scope::Rows(a),
            (Scope::Shared, Scope::Shared) => Scope::Shared,
        }
    }
}

/// The catalog query (one row, one JSON text) the facts are read from, on the first enabled
/// backend: every ordinary table the middleware's search_path sees.
pub const FACTS_SQL: &str = "SELECT json_build_object(\
'read_committed', current_setting('default_transaction_isolation') = 'read committed', \
'tables', coalesce((SELECT json_agg(json_build_object(\
'table', c.relname, \
'plain', NOT (c.relhastriggers OR c.relhasrules OR c.relhassubclass OR c.relrowsecurity OR c.relispartition), \
'key', (SELECT json_build_array(a.attname, a.atttypid IN (20, 21, 23)) FROM pg_index i JOIN pg_attribute a \
ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] WHERE i.indrelid = c.oid AND i.indisprimary AND i.indnkeyatts = 1 \
AND a.atttypid IN (20, 21, 23, 25, 1043)), \
'unique_exprs', EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND (i.indisunique OR i.indisexclusion) \
AND (i.indexprs IS NOT NULL OR i.indpred IS NOT NULL)), \
'unique_columns', (SELECT coalesce(json_agg(DISTINCT a.attname), '[]') FROM pg_index i JOIN pg_attribute a \
ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) WHERE i.indrelid = c.oid AND (i.indisunique OR i.indisexclusion)), \
'has_unique', EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND (i.indisunique OR i.indisexclusion)), \
'has_serial', EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
AND (a.attidentity <> '' OR a.attgenerated <> '')) OR EXISTS (SELECT 1 FROM pg_attrdef d WHERE d.adrelid = c.oid \
AND pg_get_expr(d.adbin, d.adrelid) ILIKE '%nextval%')\
)) FROM pg_class c WHERE c.relkind IN ('r', 'p') AND pg_table_is_visible(c.oid) \
AND c.relnamespace <> 'pg_catalog'::regnamespace AND c.relnamespace <> 'information_schema'::regnamespace), '[]'::json))::text";

/// The facts from `FACTS_SQL`'s answer (None: not that JSON).
pub fn parse_facts(json: &str) -> Option<Facts> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let mut tables = HashMap::new();
    for t in v["tables"].as_array()? {
        let name = t["table"].as_str()?.to_string();
        let key = t["key"].as_array().and_then(|k| Some((k.first()?.as_str()?.to_string(), k.get(1)?.as_bool()?)));
        let unique_columns = if t["unique_exprs"].as_bool()? {
            None
        } else {
            Some(t["unique_columns"].as_array()?.iter().filter_map(|c| c.as_str().map(str::to_string)).collect())
        };
        let facts = TableFacts {
            key,
            unique_columns,
            has_unique: t["has_unique"].as_bool()?,
            has_serial: t["has_serial"].as_bool()?,
            plain: t["plain"].as_bool()?,
        };
        tables.insert(name, facts);
    }
    Some(Facts { tables, read_committed: v["read_committed"].as_bool()? })
}

/// A name as PostgreSQL folds it: a plain word in lower case, a quoted one as written.
fn name(t: &Token) -> Option<String> {
    if t.kind != TokKind::Word {
        return None;
    }
    if let Some(q) = t.text.strip_prefix('"') {
        return Some(q.strip_suffix('"')?.replace("\"\"", "\""));
    }
    Some(t.text.to_ascii_lowercase())
}

fn punct(t: Option<&Token>, c: &str) -> bool {
    t.is_some_and(|t| t.kind == TokKind::Punct && t.text == c)
}

fn word(t: Option<&Token>, w: &str) -> bool {
    t.is_some_and(|t| t.kind == TokKind::Word && t.text == w)
}

/// words that may not appear in an expression: a subquery, another clause
const NOT_IN_EXPRESSIONS: [&str; 11] = ["SELECT", "VALUES", "TABLE", "FROM", "WHERE", "RETURNING", "WITH", "ON", "USING", "DEFAULT", "EXISTS"];

/// An expression of the allowed tokens (no function call but the time macros, no subquery).
fn plain_expression(toks: &[Token]) -> bool {
    !toks.is_empty()
        && toks.iter().enumerate().all(|(i, t)| match t.kind {
            TokKind::Number | TokKind::Str | TokKind::Param => true,
            TokKind::Punct => matches!(t.text.as_str(), "+" | "-" | "*" | "/" | "%" | "(" | ")" | ":" | "|"),
            TokKind::Word => {
                let call = punct(toks.get(i + 1), "(");
                let cast = i > 0 && punct(toks.get(i - 1), ":");
                !NOT_IN_EXPRESSIONS.contains(&t.text.as_str()) && (!call || cast || sql::is_time_macro(&t.text))
            }
        })
}

/// `toks` split at the commas outside parentheses.
fn split_commas(toks: &[Token]) -> Vec<&[Token]> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, t) in toks.iter().enumerate() {
        if t.kind == TokKind::Punct {
            match t.text.as_str() {
                "(" => depth += 1,
                ")" => depth -= 1,
                "," if depth == 0 => {
                    out.push(&toks[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
    }
    out.push(&toks[start..]);
    out
}

/// `k = v`: the key's column and value.
fn key_equals(toks: &[Token]) -> Option<(String, KeyValue)> {
    let (col, rest) = toks.split_first()?;
    let col = name(col)?;
    if !punct(rest.first(), "=") {
        return None;
    }
    let value = match &rest[1..] {
        [v] if v.kind == TokKind::Param => KeyValue::Param(v.text[1..].parse().ok().filter(|&n| n >= 1)?),
        [v] if v.kind == TokKind::Number => KeyValue::Number(v.text.clone()),
        [s, v] if s.kind == TokKind::Punct && (s.text == "-" || s.text == "+") && v.kind == TokKind::Number => {
            KeyValue::Number(format!("{}{}", s.text, v.text))
        }
        [v] if v.kind == TokKind::Str && v.text.starts_with('\'') && v.text.len() >= 2 && v.text.ends_with('\'') => {
            KeyValue::Text(v.text[1..v.text.len() - 1].replace("''", "'"))
        }
        _ => return None,
    };
    Some((col, value))
}

/// The shape of one statement text (see the module's rules).
pub fn shape(text: &str) -> Shape {
    let toks = sql::tokens(sql::strip_trailing_comment(text));
    let sts = sql::statements(&toks);
    match sts.as_slice() {
        [] => Shape::Read,
        [st] if sql::classify_statement(st) == Kind::Read => Shape::Read,
        [st] => match control(st) {
            Some(c) => Shape::Control(c),
            None => statement_shape(st).unwrap_or(Shape::Database),
        },
        _ => Shape::Database,
    }
}

/// What a control statement does to the transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// BEGIN, START TRANSACTION
    Begin,
    /// COMMIT, END
    Commit,
    /// ROLLBACK, ABORT (not to a savepoint)
    Rollback,
    /// SAVEPOINT, RELEASE, ROLLBACK TO: inside the transaction
    Savepoint,
}

/// BEGIN, COMMIT, END, ROLLBACK, ABORT (WORK or TRANSACTION after them), START TRANSACTION,
/// SAVEPOINT, RELEASE and ROLLBACK TO, with no options: what it does; None for anything else.
fn control(st: &[Token]) -> Option<Control> {
    if !st.iter().all(|t| t.kind == TokKind::Word) {
        return None;
    }
    let w: Vec<&str> = st.iter().map(|t| t.text.as_str()).collect();
    Some(match w.as_slice() {
        ["BEGIN"] | ["BEGIN", "WORK" | "TRANSACTION"] | ["START", "TRANSACTION"] => Control::Begin,
        ["COMMIT" | "END"] | ["COMMIT" | "END", "WORK" | "TRANSACTION"] => Control::Commit,
        ["ROLLBACK" | "ABORT"] | ["ROLLBACK" | "ABORT", "WORK" | "TRANSACTION"] => Control::Rollback,
        ["SAVEPOINT" | "RELEASE", _]
        | ["RELEASE", "SAVEPOINT", _]
        | ["ROLLBACK", "TO", _]
        | ["ROLLBACK", "TO", "SAVEPOINT", _]
        | ["ROLLBACK", "WORK" | "TRANSACTION", "TO", _]
        | ["ROLLBACK", "WORK" | "TRANSACTION", "TO", "SAVEPOINT", _] => Control::Savepoint,
        _ => return None,
    })
}

fn statement_shape(st: &[Token]) -> Option<Shape> {
    let at = |w: &str| st.iter().position(|t| t.kind == TokKind::Word && t.text == w);
    if word(st.first(), "UPDATE") {
        let table = name(st.get(1)?)?;
        if !word(st.get(2), "SET") {
            return None;
        }
        let where_at = at("WHERE")?;
        let mut set = Vec::new();
        for a in split_commas(&st[3..where_at]) {
            let (col, rest) = a.split_first()?;
            if !punct(rest.first(), "=") || !plain_expression(&rest[1..]) {
                return None;
            }
            set.push(name(col)?);
        }
        let (column, value) = key_equals(&st[where_at + 1..])?;
        return Some(Shape::Row { table, column, value, set });
    }
    if word(st.first(), "DELETE") && word(st.get(1), "FROM") && word(st.get(3), "WHERE") {
        let table = name(st.get(2)?)?;
        let (column, value) = key_equals(&st[4..])?;
        return Some(Shape::Row { table, column, value, set: Vec::new() });
    }
    if word(st.first(), "INSERT") && word(st.get(1), "INTO") {
        let table = name(st.get(2)?)?;
        let mut i = 3;
        if punct(st.get(i), "(") {
            let close = i + st[i..].iter().position(|t| punct(Some(t), ")"))?;
            if !st[i + 1..close].iter().all(|t| t.kind == TokKind::Word || punct(Some(t), ",")) {
                return None;
            }
            i = close + 1;
        }
        if !word(st.get(i), "VALUES") {
            return None;
        }
        for row in split_commas(&st[i + 1..]) {
            let [open, inner @ .., close] = row else { return None };
            if !punct(Some(open), "(") || !punct(Some(close), ")") || !split_commas(inner).iter().all(|e| plain_expression(e)) {
                return None;
            }
        }
        return Some(Shape::Insert { table });
    }
    None
}

/// A key's canonical text for its column type (None: not a value of that type).
fn canonical(text: &str, integer: bool) -> Option<String> {
    if integer {
        let t = text.trim();
        let t = t.strip_prefix('+').unwrap_or(t);
        return t.parse::<i64>().ok().map(|v| v.to_string());
    }
    Some(text.to_string())
}

/// A statement's scope: its shape with the table's facts, and `params` (the Bind's parameters in
/// text, `bind_params`; None for a NULL one or one whose binary form is not known).
pub fn resolve<S: AsRef<str>>(shape: &Shape, params: &[Option<S>], facts: &Facts) -> Scope {
    match shape {
        Shape::Read | Shape::Control(_) => Scope::Shared,
        Shape::Database => Scope::Database,
        _ if !facts.read_committed => Scope::Database,
        Shape::Insert { table } => match facts.tables.get(table) {
            Some(t) if t.plain && !t.has_unique && !t.has_serial => Scope::Shared,
            _ => Scope::Database,
        },
        Shape::Row { table, column, value, set } => {
            let Some(t) = facts.tables.get(table) else { return Scope::Database };
            let Some((key, integer)) = &t.key else { return Scope::Database };
            let Some(unique) = &t.unique_columns else { return Scope::Database };
            if !t.plain || key != column || set.iter().any(|c| unique.contains(c) || c == key) {
                return Scope::Database;
            }
            let text = match value {
                KeyValue::Param(n) => params.get(n - 1).and_then(|p| p.as_ref()).map(|p| p.as_ref()),
                KeyValue::Number(s) if *integer => Some(s.as_str()),
                KeyValue::Text(s) => Some(s.as_str()),
                KeyValue::Number(_) => None,
            };
            match text.and_then(|v| canonical(v, *integer)) {
                Some(k) => Scope::Rows(vec![(table.clone(), k)]),
                None => Scope::Database,
            }
        }
    }
}

/// A Bind's parameters as text (`rest`: after its portal and statement names; `types`: its
/// Parse's parameter types as sent, a count and the OIDs): a text one as sent, a binary int2, int4
/// or int8 (by its declared type, as psycopg sends integers) in decimal, None for any other binary
/// one or a NULL; the whole list None when it does not parse.
pub fn bind_params<'a>(rest: &'a [u8], types: &[u8]) -> Option<Vec<Option<Cow<'a, str>>>> {
    let u16_at = |i: usize| rest.get(i..i + 2).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize);
    let declared = |i: usize| types.get(2 + 4 * i..6 + 4 * i).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
    let nf = u16_at(0)?;
    let formats: Vec<usize> = (0..nf).map(|i| u16_at(2 + 2 * i)).collect::<Option<_>>()?;
    let mut pos = 2 + 2 * nf;
    let np = u16_at(pos)?;
    pos += 2;
    let mut out = Vec::with_capacity(np);
    for i in 0..np {
        let len = i32::from_be_bytes(rest.get(pos..pos + 4)?.try_into().ok()?);
        pos += 4;
        let binary = match nf {
            0 => false,
            1 => formats[0] == 1,
            _ => *formats.get(i)? == 1,
        };
        if len < 0 {
            out.push(None);
            continue;
        }
        let v = rest.get(pos..pos + len as usize)?;
        pos += len as usize;
        out.push(if !binary {
            std::str::from_utf8(v).ok().map(Cow::Borrowed)
        } else {
            let int = match (declared(i), v.len()) {
                (21, 2) => Some(i16::from_be_bytes([v[0], v[1]]) as i64),
                (23, 4) => Some(i32::from_be_bytes([v[0], v[1], v[2], v[3]]) as i64),
                (20, 8) => Some(i64::from_be_bytes(v.try_into().ok()?)),
                _ => None,
            };
            int.map(|n| Cow::Owned(n.to_string()))
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CASES: &str = include_str!("../../tests/sql_cases.json");

    fn facts() -> Facts {
        let mut tables = HashMap::new();
        let keyed = |k: &str, int: bool| TableFacts {
            key: Some((k.to_string(), int)),
            unique_columns: Some(vec![k.to_string()]),
            has_unique: true,
            has_serial: false,
            plain: true,
        };
        tables.insert("pgbench_accounts".to_string(), keyed("aid", true));
        tables.insert("pgbench_branches".to_string(), keyed("bid", true));
        tables.insert("users".to_string(), keyed("name", false));
        tables.insert("pgbench_history".to_string(), TableFacts { plain: true, unique_columns: Some(vec![]), ..Default::default() });
        let mut t = keyed("id", true);
        t.plain = false; // a trigger
        tables.insert("audited".to_string(), t);
        let mut t = keyed("id", true);
        t.unique_columns = Some(vec!["id".into(), "email".into()]);
        tables.insert("people".to_string(), t);
        tables.insert("serials".to_string(), TableFacts { plain: true, has_serial: true, unique_columns: Some(vec![]), ..Default::default() });
        Facts { tables, read_committed: true }
    }

    fn scope_text(s: &Scope) -> String {
        match s {
            Scope::Shared => "shared".into(),
            Scope::Database => "database".into(),
            Scope::Rows(r) => r.iter().map(|(t, k)| format!("{t}:{k}")).collect::<Vec<_>>().join(" "),
        }
    }

    #[test]
    fn scopes_match_the_shared_cases() {
        let v: serde_json::Value = serde_json::from_str(CASES).expect("engine/tests/sql_cases.json is JSON");
        let list = v["scope"].as_array().expect("sql_cases.json has a scope list");
        assert!(list.len() >= 25, "{} cases", list.len());
        let f = facts();
        for c in list {
            let text = c["sql"].as_str().unwrap();
            let params: Vec<Option<&str>> = c["params"].as_array().map(|p| p.iter().map(|x| x.as_str()).collect()).unwrap_or_default();
            let got = scope_text(&resolve(&shape(text), &params, &f));
            assert_eq!(got, c["scope"].as_str().unwrap(), "{text:?} {params:?}");
        }
    }

    #[test]
    fn a_database_not_at_read_committed_takes_the_database_for_every_write() {
        let mut f = facts();
        let up = shape("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 3");
        assert_eq!(resolve::<&str>(&up, &[], &f), Scope::Rows(vec![("pgbench_accounts".into(), "3".into())]));
        f.read_committed = false;
        assert_eq!(resolve::<&str>(&up, &[], &f), Scope::Database);
        assert_eq!(resolve::<&str>(&shape("SELECT 1"), &[], &f), Scope::Shared);
    }

    #[test]
    fn control_statements_say_what_they_do_to_the_transaction() {
        use Control::*;
        for (text, want) in [
            ("BEGIN", Some(Begin)),
            ("start transaction;", Some(Begin)),
            ("COMMIT", Some(Commit)),
            ("end work -- done", Some(Commit)),
            ("ROLLBACK", Some(Rollback)),
            ("abort transaction", Some(Rollback)),
            ("ROLLBACK TO SAVEPOINT s1", Some(Savepoint)),
            ("rollback work to s1", Some(Savepoint)),
            ("SAVEPOINT s1", Some(Savepoint)),
            ("RELEASE s1", Some(Savepoint)),
            ("COMMIT AND CHAIN", None),
            ("BEGIN ISOLATION LEVEL SERIALIZABLE", None),
            ("COMMIT; BEGIN", None),
            ("UPDATE t SET a = 1 WHERE id = 1", None),
            ("SELECT 'COMMIT'", None),
        ] {
            let got = match shape(text) {
                Shape::Control(c) => Some(c),
                _ => None,
            };
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn scopes_join_to_the_larger() {
        let r = |k: &str| Scope::Rows(vec![("t".into(), k.into())]);
        assert_eq!(r("1").join(r("2")).join(r("1")), Scope::Rows(vec![("t".into(), "1".into()), ("t".into(), "2".into())]));
        assert_eq!(Scope::Shared.join(r("1")), r("1"));
        assert_eq!(r("1").join(Scope::Database), Scope::Database);
        assert_eq!(Scope::Shared.join(Scope::Shared), Scope::Shared);
    }

    #[test]
    fn bind_parameters_in_text_binary_and_null() {
        let text = |v: Option<Vec<Option<Cow<str>>>>| v.map(|ps| ps.into_iter().map(|p| p.map(|c| c.into_owned())).collect::<Vec<_>>());
        // two format codes (text, binary) for three parameters: not a Bind
        let mut rest = vec![0, 2, 0, 0, 0, 1, 0, 3];
        rest.extend_from_slice(&3i32.to_be_bytes());
        rest.extend_from_slice(b"123");
        rest.extend_from_slice(&4i32.to_be_bytes());
        rest.extend_from_slice(&[0, 0, 0, 7]);
        rest.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(text(bind_params(&rest, &[])), None, "three parameters with two format codes");
        // all text: one as sent, one NULL
        let mut rest = vec![0, 0, 0, 2];
        rest.extend_from_slice(&2i32.to_be_bytes());
        rest.extend_from_slice(b"42");
        rest.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(text(bind_params(&rest, &[])), Some(vec![Some("42".into()), None]));
        // all binary: int8 and int2 declared by the Parse, then an int4 whose type was not declared
        let mut rest = vec![0, 1, 0, 1, 0, 3];
        for v in [(-7i64).to_be_bytes().to_vec(), 300i16.to_be_bytes().to_vec(), 9i32.to_be_bytes().to_vec()] {
            rest.extend_from_slice(&(v.len() as i32).to_be_bytes());
            rest.extend_from_slice(&v);
        }
        let mut types = vec![0, 2];
        types.extend_from_slice(&20u32.to_be_bytes());
        types.extend_from_slice(&21u32.to_be_bytes());
        assert_eq!(text(bind_params(&rest, &types)), Some(vec![Some("-7".into()), Some("300".into()), None]));
        // an int4 declared, but 8 bytes: not decoded
        let mut rest = vec![0, 1, 0, 1, 0, 1];
        rest.extend_from_slice(&8i32.to_be_bytes());
        rest.extend_from_slice(&5i64.to_be_bytes());
        let mut types = vec![0, 1];
        types.extend_from_slice(&23u32.to_be_bytes());
        assert_eq!(text(bind_params(&rest, &types)), Some(vec![None]));
        assert_eq!(text(bind_params(&[0, 0, 0, 1, 0, 0, 0, 9, b'1'], &[])), None, "truncated");
    }

    #[test]
    fn the_catalogs_answer_parses() {
        let json = r#"{"read_committed": true, "tables": [
            {"table": "a", "plain": true, "key": ["id", true], "unique_exprs": false, "unique_columns": ["id"],
             "has_unique": true, "has_serial": false},
            {"table": "h", "plain": true, "key": null, "unique_exprs": false, "unique_columns": [],
             "has_unique": false, "has_serial": false},
            {"table": "x", "plain": false, "key": null, "unique_exprs": true, "unique_columns": ["v"],
             "has_unique": true, "has_serial": true}]}"#;
        let f = parse_facts(json).unwrap();
        assert!(f.read_committed);
        assert_eq!(f.tables["a"].key, Some(("id".into(), true)));
        assert_eq!(f.tables["h"].key, None);
        assert_eq!(f.tables["x"].unique_columns, None);
        assert!(f.tables["x"].has_serial && !f.tables["x"].plain);
        assert_eq!(parse_facts("[]"), None);
    }
}
