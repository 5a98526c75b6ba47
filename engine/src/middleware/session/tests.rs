//! The session's pure rules: which Query is decoded for a DEALLOCATE, which statements reset the
//! statements prepared on a connection.

use super::outgoing::resets_statements;
use super::units::may_deallocate;

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
