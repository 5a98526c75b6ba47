//! The session's pure rules: which Query is decoded for a DEALLOCATE, which statements reset the
//! statements prepared on a connection, which change the session's settings.

use super::outgoing::resets_statements;
use super::units::{may_begin, may_deallocate, sets};

#[test]
fn only_a_query_that_may_be_a_deallocate_is_decoded_for_it() {
    for body in [&b"DEALLOCATE x\0"[..], b" \t\x0b\x0cdeallocate all\0", b"\xc2\xa0DEALLOCATE x\0", b"\xff\0"] {
        assert!(may_deallocate(body), "{body:?}");
    }
    for body in [&b"SELECT 1\0"[..], b"DEALLOC\0", b"\0", b"", b"  \0DEALLOCATE x"] {
        assert!(!may_deallocate(body), "{body:?}");
    }
}

#[test]
fn ddl_and_settings_reset_prepared_statements() {
    for text in
        ["CREATE TABLE t (id int)", "alter table t add c int", "SELECT 1; DROP TABLE t", "SET search_path = x", "DISCARD ALL", "deallocate all"]
    {
        assert!(resets_statements(text), "{text}");
    }
    for text in ["INSERT INTO t VALUES (1)", "UPDATE t SET created = 1", "BEGIN", "SELECT 'DROP TABLE t'", "-- DROP\nCOMMIT"] {
        assert!(!resets_statements(text), "{text}");
    }
}

#[test]
fn only_a_begin_without_options_is_answered_here() {
    use crate::middleware::sql::plain_begin;
    for text in ["BEGIN", "begin;", " Begin Work ", "BEGIN TRANSACTION;", "start transaction", "BEGIN -- a comment\n"] {
        assert!(plain_begin(text), "{text}");
    }
    for text in [
        "BEGIN ISOLATION LEVEL SERIALIZABLE",
        "START TRANSACTION READ ONLY",
        "BEGIN; SELECT 1",
        "BEGIN;;",
        "COMMIT",
        "SELECT 'BEGIN'",
        "BEGIN WORK TRANSACTION",
        "",
    ] {
        assert!(!plain_begin(text), "{text}");
    }
}

#[test]
fn a_plain_begin_is_answered_here_in_either_protocol() {
    use super::units::deferred_begin;
    use crate::middleware::wire::{self, Message};
    let msg = |kind: u8, body: &[u8]| Message { kind, body: body.to_vec() };
    let deferred_begin = |unit: &[Message]| deferred_begin(unit).ok().expect("a well-formed unit");
    let kinds = |answer: &[u8]| {
        let mut ks = Vec::new();
        let mut i = 0;
        while i < answer.len() {
            ks.push(answer[i]);
            i += 1 + wire::header_length(answer, i).unwrap() + 4;
        }
        ks
    };
    let simple = deferred_begin(&[msg(wire::QUERY, b"begin;\0")]).unwrap();
    assert_eq!(kinds(&simple.answer), [wire::COMMAND_COMPLETE, wire::READY]);
    assert!(simple.query == b"begin;\0" && simple.parse.is_none());
    assert_eq!(*simple.answer.last().unwrap(), b'T');
    // pgbench -M extended: Parse, Bind, Describe portal, Execute, Sync
    let parse = msg(wire::PARSE, b"\0BEGIN;\0\0\0");
    let bind = msg(wire::BIND, b"\0\0\0\0\0\0\0\0");
    let describe = msg(wire::DESCRIBE, b"P\0");
    let execute = msg(wire::EXECUTE, b"\0\0\0\0\0");
    let sync = msg(wire::SYNC, b"");
    let ext = deferred_begin(&[parse.clone(), bind.clone(), describe.clone(), execute.clone(), sync.clone()]).unwrap();
    assert_eq!(kinds(&ext.answer), [wire::PARSE_COMPLETE, wire::BIND_COMPLETE, wire::NO_DATA, wire::COMMAND_COMPLETE, wire::READY]);
    assert_eq!(ext.query, b"BEGIN;\0");
    assert_eq!(ext.parse.as_ref().map(|p| p.sql.as_str()), Some("BEGIN;"));
    let plain = deferred_begin(&[parse.clone(), bind.clone(), execute.clone(), sync.clone()]).unwrap();
    assert_eq!(kinds(&plain.answer), [wire::PARSE_COMPLETE, wire::BIND_COMPLETE, wire::COMMAND_COMPLETE, wire::READY]);
    // anything else goes as it comes
    let one_param = msg(wire::BIND, b"\0\0\0\0\0\x01\0\0\0\x01x\0\0");
    let named = msg(wire::PARSE, b"s1\0BEGIN\0\0\0");
    let typed = msg(wire::PARSE, b"\0BEGIN\0\0\x01\0\0\0\x17");
    let other_portal = msg(wire::EXECUTE, b"p\0\0\0\0\0");
    for unit in [
        vec![msg(wire::QUERY, b"BEGIN ISOLATION LEVEL SERIALIZABLE\0")],
        vec![msg(wire::QUERY, b"SELECT 1\0")],
        vec![parse.clone(), one_param, execute.clone(), sync.clone()],
        vec![named, bind.clone(), execute.clone(), sync.clone()],
        vec![typed, bind.clone(), execute.clone(), sync.clone()],
        vec![parse.clone(), bind.clone(), other_portal, sync.clone()],
        vec![parse.clone(), bind.clone(), execute.clone()],
        vec![msg(wire::PARSE, b"\0SELECT 1\0\0\0"), bind, execute, sync],
    ] {
        assert!(deferred_begin(&unit).is_none(), "{:?}", unit.iter().map(|m| m.kind as char).collect::<String>());
    }
}

#[test]
fn a_setting_changed_anywhere_in_a_text_marks_the_session() {
    for text in ["SET search_path = x", "reset all", "BEGIN; SET LOCAL lock_timeout = 1", "/* c */ set TRANSACTION ISOLATION LEVEL SERIALIZABLE"] {
        assert!(sets(text), "{text:?}");
    }
    for text in ["UPDATE t SET v = 1 WHERE id = 2", "SELECT 'SET x'", "SELECT offset FROM t", "-- SET x\nSELECT 1", "BEGIN"] {
        assert!(!sets(text), "{text:?}");
    }
}

#[test]
fn the_recovery_log_keeps_a_transaction_holding_rows_until_it_commits() {
    use super::write::{logging, Hold, Logging};
    use crate::middleware::rowlocks::RowLocks;
    use crate::middleware::scope::{Control, Scope};

    let locks = RowLocks::new();
    let rows = Hold::Rows(locks.begin());
    let Hold::Rows(h) = &rows else { unreachable!() };
    futures_util::FutureExt::now_or_never(h.acquire(&Scope::Rows(vec![("t".into(), "1".into())]))).unwrap().unwrap();
    // (log, inside a transaction, how the unit ends it, aborted) -> how it is logged
    for (log, inside, ending, aborted, want) in [
        (false, true, None, false, Logging::Off),
        (true, false, None, false, Logging::Ordered), // autocommit: its own transaction
        (true, true, None, false, Logging::Kept),
        (true, true, Some(Control::Commit), false, Logging::Ordered),
        (true, true, Some(Control::Commit), true, Logging::Dropped), // COMMIT of an aborted one rolls back
        (true, true, Some(Control::Rollback), false, Logging::Dropped),
    ] {
        assert_eq!(logging(log, &rows, inside, ending, aborted), want, "{log} {inside} {ending:?} {aborted}");
    }
    // holding the whole database (or under the write lock) nothing runs beside it: every unit numbered
    let db = Hold::Rows(locks.begin());
    drop(rows);
    let Hold::Rows(h) = &db else { unreachable!() };
    futures_util::FutureExt::now_or_never(h.acquire(&Scope::Database)).unwrap().unwrap();
    for (inside, ending) in [(true, None), (false, None), (true, Some(Control::Commit))] {
        assert_eq!(logging(true, &db, inside, ending, false), Logging::Numbered);
    }
}

#[test]
fn only_sql_that_may_be_a_plain_begin_is_tokenized_for_it() {
    for text in [&b"BEGIN"[..], b"  begin work\0", b"\nSTART TRANSACTION", b"-- x\nBEGIN", b"/* x */ BEGIN", b"\xc2\xa0BEGIN"] {
        assert!(may_begin(text), "{text:?}");
    }
    for text in [&b"SELECT 1"[..], b"UPDATE t SET a = 1", b"BEGI", b"", b"   ", b"END"] {
        assert!(!may_begin(text), "{text:?}");
    }
    // every plain BEGIN passes the check first
    for text in ["BEGIN", "begin;", "BEGIN WORK", "begin transaction", "START TRANSACTION", " \t BEGIN"] {
        assert!(crate::middleware::sql::plain_begin(text) && may_begin(text.as_bytes()), "{text}");
    }
}
