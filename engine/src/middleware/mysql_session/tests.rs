//! The MySQL session's pure rules: the AUTO_INCREMENT value an answer reports, the statements
//! answered here.

use super::record::first_insert_id;
use super::units::{SET_NAMES, SOCKET, USE};
use crate::middleware::mysql_wire as my;

#[test]
fn the_first_auto_increment_value_of_an_answer_is_found() {
    let ok = |id: u64, status: u16| {
        let mut p = vec![0, 1];
        my::lenenc_into(&mut p, id);
        p.extend_from_slice(&status.to_le_bytes());
        p.extend_from_slice(&[0, 0]);
        p
    };
    let mut one = Vec::new();
    my::packet_into(&mut one, 1, &ok(300, my::STATUS_AUTOCOMMIT));
    assert_eq!(first_insert_id(&one), 300);
    // UPDATE ...; INSERT ...: the second result's
    let mut two = Vec::new();
    my::packet_into(&mut two, 1, &ok(0, my::STATUS_MORE_RESULTS));
    my::packet_into(&mut two, 2, &ok(12, 0));
    assert_eq!(first_insert_id(&two), 12);
    // SELECT (a row whose first byte is 0) then INSERT
    let mut rs = Vec::new();
    let payloads: Vec<Vec<u8>> = vec![
        vec![1],
        b"\x03def".to_vec(),
        my::eof(my::STATUS_MORE_RESULTS),
        vec![0, 7, 0, 0, 0, 0, 0, 0],
        my::eof(my::STATUS_MORE_RESULTS),
        ok(5, 0),
    ];
    for (i, p) in payloads.iter().enumerate() {
        my::packet_into(&mut rs, i as u8 + 1, p);
    }
    assert_eq!(first_insert_id(&rs), 5);
    let mut none = Vec::new();
    my::packet_into(&mut none, 1, &ok(0, 0));
    my::packet_into(&mut none, 2, &ok(8, 0)); // not a further result: the first said none follow
    assert_eq!(first_insert_id(&none), 0);
    assert_eq!(first_insert_id(&my::packet(1, &my::err(1062, "Duplicate entry", "23000"))), 0);
    assert_eq!(first_insert_id(&[]), 0);
}

#[test]
fn the_statements_answered_here_are_recognised() {
    assert_eq!(&USE.captures("use `mwtest`;").unwrap()[1], "mwtest");
    assert!(USE.captures("USE a; DROP TABLE t").is_none());
    assert!(SET_NAMES.is_match("SET NAMES 'utf8mb4' COLLATE 'utf8mb4_general_ci'"));
    assert!(SET_NAMES.is_match("set names utf8mb4"));
    assert!(!SET_NAMES.is_match("SET NAMES latin1"));
    assert!(SOCKET.is_match(" SELECT @@socket ;"));
    assert!(!SOCKET.is_match("SELECT @@socket, 1"));
}
