//! The recovery log (C-JDBC's): replicas that cannot drift.
//!
//! With `--recovery-log PATH`, every write unit the middleware broadcasts gets a sequence number
//! and is appended to PATH (the bytes sent to the backends); a unit that leaves no transaction open
//! (autocommit, or the one ending a transaction) is fsync'd, with every record before it, before its
//! client is answered (a unit inside a transaction is not: if the middleware dies first, the
//! backends roll the transaction back). Each backend keeps the number of the last unit it applied in a one-row table,
//! `tierscope_recovery(seq)`, updated by the unit itself, in the unit's own transaction where the
//! protocol allows (extended protocol: hidden Parse/Bind/Execute/Close before the Sync; a simple
//! Query: `;UPDATE ...` appended to its text, the extra CommandComplete hidden). A unit that fails
//! on a backend rolls its position back with it. A middleware starting over backends whose
//! positions differ replays the missing units from the log to the stale backends, on one
//! connection, before it serves anything; a backend the log cannot bring to the head (its units
//! are no longer in the log, or it is ahead of the log) is refused with one message naming it and
//! the positions, and never read. With every backend at the head, the log is emptied (a checkpoint):
//! numbering goes on from the backends' position.
//!
//! Record: seq (u64 LE), length (u32 LE), FNV-1a of the bytes (u32 LE), the bytes. A torn last
//! record (a crash while appending: never acknowledged) is cut off when the log is opened. Numbers
//! only grow; a number taken by a unit that was abandoned before it was logged leaves a gap.
//!
//! MySQL protocol (MariaDB backends): records are `my_record`'s (the middleware's `SET timestamp`
//! packets, `SET insert_id` when the unit took an AUTO_INCREMENT value, and the client's command; a
//! prepared statement as its SQL and COM_STMT_EXECUTE payload, re-prepared at replay: the
//! prepare+execute bytes, not literals); the position is kept by
//! `mysql_session/execute.rs::execute` (an UPDATE before the unit inside a transaction; otherwise the unit in
//! the middleware's BEGIN, then UPDATE + COMMIT on success or ROLLBACK on failure), and
//! `recover.rs` replays each missing unit with its own position (`verdict` and `head` decide, as for
//! PostgreSQL; `mysql_session/recover.rs` replays one unit).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;

use super::pool::Conn;
use super::sql;
use super::wire;

/// the table each backend keeps its position in (one row)
pub const TABLE: &str = "tierscope_recovery";

const HEADER: usize = 16;

fn fnv1a(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The log file: its records' offsets and the file appended to.
pub struct Log {
    pub path: PathBuf,
    file: Mutex<File>,
    /// seq -> offset of each record (read at start, then of each one appended), for a replay
    records: Mutex<Vec<(u64, u64)>>,
    /// next sequence number
    next: AtomicU64,
    /// its records are MySQL-protocol units (`my_record`), else PostgreSQL messages
    pub mysql: bool,
}

impl Log {
    /// Open (or create) the log and read its records; a torn tail is cut off.
    pub fn open(path: &Path) -> std::io::Result<Log> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = OpenOptions::new().read(true).append(true).create(true).open(path)?;
        let mut bytes = Vec::new();
        file.seek(SeekFrom::Start(0))?;
        file.read_to_end(&mut bytes)?;
        let mut records = Vec::new();
        let mut pos = 0usize;
        let mut last = 0u64;
        while pos + HEADER <= bytes.len() {
            let seq = u64::from_le_bytes(bytes[pos..pos + 8].try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(bytes[pos + 8..pos + 12].try_into().expect("4 bytes")) as usize;
            let sum = u32::from_le_bytes(bytes[pos + 12..pos + 16].try_into().expect("4 bytes"));
            let end = pos + HEADER + len;
            if end > bytes.len() || fnv1a(&bytes[pos + HEADER..end]) != sum || seq <= last {
                break;
            }
            records.push((seq, pos as u64));
            last = seq;
            pos = end;
        }
        if pos < bytes.len() {
            super::log(&format!("recovery log {}: a torn record at byte {pos} cut off ({} bytes)", path.display(), bytes.len() - pos));
            file.set_len(pos as u64)?;
            file.sync_all()?;
        }
        Ok(Log { path: path.to_path_buf(), file: Mutex::new(file), records: Mutex::new(records), next: AtomicU64::new(last + 1), mysql: false })
    }

    /// (first, last) sequence numbers held, None when empty.
    pub fn range(&self) -> Option<(u64, u64)> {
        let r = self.records.lock().unwrap_or_else(|e| e.into_inner());
        Some((r.first()?.0, r.last()?.0))
    }

    /// The records `from..=to` (bytes), read back from the file.
    pub fn read(&self, from: u64, to: u64) -> std::io::Result<Vec<(u64, Vec<u8>)>> {
        let r = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = File::open(&self.path)?;
        let mut out = Vec::new();
        for &(seq, off) in r.iter().filter(|(s, _)| (from..=to).contains(s)) {
            let mut head = [0u8; HEADER];
            f.seek(SeekFrom::Start(off))?;
            f.read_exact(&mut head)?;
            let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
            let mut data = vec![0u8; len];
            f.read_exact(&mut data)?;
            out.push((seq, data));
        }
        Ok(out)
    }

    /// Empty the log (every backend holds every record); numbering goes on after `head`.
    pub fn checkpoint(&self, head: u64) -> std::io::Result<()> {
        let f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        f.set_len(0)?;
        f.sync_all()?;
        self.records.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.next.store(head + 1, Ordering::Release);
        Ok(())
    }

    /// Cut the records after `head` (written, applied nowhere: never acknowledged).
    pub fn cut_after(&self, head: u64) -> std::io::Result<()> {
        let mut r = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = r.iter().position(|(s, _)| *s > head) {
            let f = self.file.lock().unwrap_or_else(|e| e.into_inner());
            f.set_len(r[i].1)?;
            f.sync_all()?;
            r.truncate(i);
        }
        self.next.store(head + 1, Ordering::Release);
        Ok(())
    }

    /// The record of a ROLLBACK unit in this log's protocol.
    pub fn rollback_record(&self) -> Vec<u8> {
        if self.mysql {
            my_record(true, &[], &[], b"\x03ROLLBACK")
        } else {
            wire::query("ROLLBACK")
        }
    }

    /// The number the next unit will get.
    pub fn peek_seq(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }

    /// The next unit's sequence number (taken under the write lock: log order is execution order).
    pub fn take_seq(&self) -> u64 {
        self.next.fetch_add(1, Ordering::AcqRel)
    }

    /// Append one record and fsync it (blocking: run it off the runtime's threads).
    pub fn append(&self, seq: u64, data: &[u8]) -> std::io::Result<()> {
        self.write(seq, data)?;
        self.sync()
    }

    /// fsync what was appended so far (blocking).
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.lock().unwrap_or_else(|e| e.into_inner()).sync_data()
    }

    /// Append one record without fsync (a unit inside a transaction: the fsync of the unit that
    /// ends it covers it; blocking).
    pub fn write(&self, seq: u64, data: &[u8]) -> std::io::Result<()> {
        let mut rec = Vec::with_capacity(HEADER + data.len());
        rec.extend_from_slice(&seq.to_le_bytes());
        rec.extend_from_slice(&(data.len() as u32).to_le_bytes());
        rec.extend_from_slice(&fnv1a(data).to_le_bytes());
        rec.extend_from_slice(data);
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let offset = f.seek(SeekFrom::End(0))?;
        f.write_all(&rec)?;
        // kept for a replay while serving (a backend that comes back: `recover::rejoin`); records
        // are appended under the write lock, in their units' order
        let mut r = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let at = r.partition_point(|&(s, _)| s < seq);
        r.insert(at, (seq, offset));
        Ok(())
    }
}

/// Append a record off the runtime's threads (fsync'd with `sync`); the result when it is written.
pub async fn append<D: AsRef<[u8]> + Send + Sync + 'static>(log: Arc<Log>, seq: u64, data: Arc<D>, sync: bool) -> Result<(), String> {
    let path = log.path.clone();
    match tokio::task::spawn_blocking(move || if sync { log.append(seq, (*data).as_ref()) } else { log.write(seq, (*data).as_ref()) }).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("recovery log {}: cannot append unit {seq}: {e}", path.display())),
        Err(e) => Err(format!("recovery log {}: cannot append unit {seq}: {e}", path.display())),
    }
}

/// fsync the log off the runtime's threads.
pub async fn sync(log: Arc<Log>) -> Result<(), String> {
    let path = log.path.clone();
    match tokio::task::spawn_blocking(move || log.sync()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("recovery log {}: cannot fsync: {e}", path.display())),
        Err(e) => Err(format!("recovery log {}: cannot fsync: {e}", path.display())),
    }
}

/// The statement that records position `seq` in a backend.
pub fn position_sql(seq: u64) -> String {
    format!("UPDATE {TABLE} SET seq = {seq}")
}

/// The position of a backend a replay left different from the others: refused at every start.
pub fn position_sql_refused() -> String {
    format!("UPDATE {TABLE} SET seq = -1")
}

/// A MySQL-protocol unit's record: whether it succeeded (on the backend that answered the client),
/// the middleware's packets sent before the client's command (`SET insert_id`, `SET timestamp =
/// ...` for time functions), those sent after it, then the client's command: one byte (1: it
/// succeeded), `u32 LE length + pre packets`, `u32 LE length + post packets`, the command. The command is a
/// COM_QUERY payload (0x03 + the text) or, for a prepared statement, 0x17 (COM_STMT_EXECUTE),
/// `u32 LE length + the statement's SQL`, then the COM_STMT_EXECUTE payload after the statement
/// id (flags, iterations, the NULL bitmap, the parameter types and the parameters in binary, as
/// the client sent them): a replay prepares the SQL on its own connection and executes it with
/// these bytes.
pub fn my_record(ok: bool, pre: &[u8], post: &[u8], command: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + pre.len() + post.len() + command.len());
    out.push(ok as u8);
    out.extend_from_slice(&(pre.len() as u32).to_le_bytes());
    out.extend_from_slice(pre);
    out.extend_from_slice(&(post.len() as u32).to_le_bytes());
    out.extend_from_slice(post);
    out.extend_from_slice(command);
    out
}

/// A MySQL-protocol record's parts (`my_record`).
#[derive(Debug, PartialEq, Eq)]
pub struct MyRecord<'a> {
    pub ok: bool,
    pub pre: &'a [u8],
    pub post: &'a [u8],
    pub command: &'a [u8],
}

/// The parts of a record `my_record` made; None when it is not one.
pub fn my_unrecord(rec: &[u8]) -> Option<MyRecord<'_>> {
    let ok = match rec.first()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let rec = &rec[1..];
    let n = u32::from_le_bytes(rec.get(0..4)?.try_into().ok()?) as usize;
    let pre = rec.get(4..4 + n)?;
    let at = 4 + n;
    let m = u32::from_le_bytes(rec.get(at..at + 4)?.try_into().ok()?) as usize;
    let post = rec.get(at + 4..at + 4 + m)?;
    let command = rec.get(at + 4 + m..)?;
    if command.is_empty() {
        return None;
    }
    Some(MyRecord { ok, pre, post, command })
}

/// A prepared statement's command in a MySQL record: 0x17, the SQL's length and the SQL, the
/// COM_STMT_EXECUTE payload after the statement id.
pub fn my_execute_command(sql: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + sql.len() + body.len());
    out.push(0x17);
    out.extend_from_slice(&(sql.len() as u32).to_le_bytes());
    out.extend_from_slice(sql);
    out.extend_from_slice(body);
    out
}

/// (SQL, COM_STMT_EXECUTE payload after the statement id) of `my_execute_command`'s bytes.
pub fn my_execute_parts(command: &[u8]) -> Option<(&[u8], &[u8])> {
    if command.first() != Some(&0x17) {
        return None;
    }
    let n = u32::from_le_bytes(command.get(1..5)?.try_into().ok()?) as usize;
    Some((command.get(5..5 + n)?, command.get(5 + n..)?))
}

/// MySQL statements that open a transaction or change autocommit: a unit running one is not
/// wrapped in the middleware's own BEGIN ... COMMIT (its position is recorded after it, inside
/// the transaction it opened).
pub fn my_opens_transaction(text: &str) -> bool {
    let toks = sql::tokens(text);
    sql::statements(&toks).iter().any(|st| {
        let w = |i: usize| st.get(i).map(|t| t.text.as_str()).unwrap_or("");
        matches!(w(0), "BEGIN" | "XA")
            || (w(0) == "START" && w(1) == "TRANSACTION")
            || (w(0) == "SET" && st.iter().any(|t| t.text == "AUTOCOMMIT" || t.text == "@@AUTOCOMMIT"))
    })
}

/// What a middleware starting over backends at `positions` does with the one at `p` (the head is
/// the log's last unit or the highest position; the log holds `range`): Ok(None) when it is at the
/// head, Ok(Some((from, to))) for the units to replay to it, Err(why) when the log cannot bring it
/// to the head.
pub fn verdict(p: u64, head: u64, range: Option<(u64, u64)>, path: &str) -> Result<Option<(u64, u64)>, String> {
    if p == head {
        return Ok(None);
    }
    if range.is_some_and(|(first, last)| last == head && first <= p + 1 && p < head) {
        return Ok(Some((p + 1, head)));
    }
    Err(if p > head {
        format!("it is ahead of the recovery log {path} (head {head})")
    } else {
        match range {
            Some((first, last)) => format!("the recovery log {path} holds units {first}..{last} only"),
            None => format!("the recovery log {path} is empty"),
        }
    })
}

/// The head: the log's last unit or the highest position.
pub fn head(positions: &[Option<u64>], range: Option<(u64, u64)>) -> u64 {
    let top = positions.iter().flatten().copied().max().unwrap_or(0);
    range.map_or(top, |r| r.1.max(top))
}

/// Every sequence of the database and its state (last value, called), in name order.
pub async fn sequences(conn: &mut Conn) -> Result<Vec<(String, String)>, String> {
    let q = "SELECT quote_ident(schemaname) || '.' || quote_ident(sequencename) || '=' || coalesce(last_value::text, '-') \
             FROM pg_sequences ORDER BY schemaname, sequencename";
    Ok(name_values(simple_query(conn, q).await?))
}

/// MySQL protocol: the AUTO_INCREMENT counters of the database's tables (the next value of each
/// table that has one), "`table`=value" in name order, as `name_values` takes them.
pub const MY_AUTO_INCREMENTS: &str = "SELECT CONCAT('`', REPLACE(TABLE_NAME, '`', '``'), '`=', AUTO_INCREMENT) \
     FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND AUTO_INCREMENT IS NOT NULL ORDER BY TABLE_NAME";

/// Rows of "name=value" (a counter and its state) as (name, value), in their order.
pub fn name_values(rows: Vec<Option<String>>) -> Vec<(String, String)> {
    rows.into_iter()
        .flatten()
        .map(|r| match r.rsplit_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (r, String::new()),
        })
        .collect()
}

/// The counters (sequences, AUTO_INCREMENT counters) whose state differs, "name: mine against theirs".
pub fn differences(mine: &[(String, String)], theirs: &[(String, String)]) -> String {
    let theirs: std::collections::HashMap<&str, &str> = theirs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut out: Vec<String> = mine
        .iter()
        .filter(|(k, v)| theirs.get(k.as_str()) != Some(&v.as_str()))
        .map(|(k, v)| format!("{k}: {v} against {}", theirs.get(k.as_str()).unwrap_or(&"none")))
        .collect();
    let names: std::collections::HashSet<&str> = mine.iter().map(|(k, _)| k.as_str()).collect();
    out.extend(theirs.keys().filter(|k| !names.contains(*k)).map(|k| format!("{k}: none against {}", theirs[k])));
    out.join(", ")
}

/// Statements PostgreSQL refuses inside a transaction block: a unit running one gets no position
/// update (its replay, should it happen, is harmless: they are idempotent or fail again).
pub fn outside_transactions(text: &str) -> bool {
    let toks = sql::tokens(text);
    sql::statements(&toks).iter().any(|st| {
        let w = |i: usize| st.get(i).map(|t| t.text.as_str()).unwrap_or("");
        matches!(w(0), "VACUUM" | "CLUSTER" | "REINDEX")
            || (w(0) == "ALTER" && w(1) == "SYSTEM")
            || (matches!(w(0), "CREATE" | "DROP") && matches!(w(1), "DATABASE" | "TABLESPACE"))
            || st.iter().any(|t| t.text == "CONCURRENTLY")
    })
}

/// Messages in `data` (kind, start offset, body range).
pub fn messages(data: &[u8]) -> Vec<(u8, usize, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 5 <= data.len() {
        let Ok(n) = wire::header_length(data, pos) else { break };
        if pos + 5 + n > data.len() {
            break;
        }
        out.push((data[pos], pos, pos + 5..pos + 5 + n));
        pos += 5 + n;
    }
    out
}

/// Run one simple query on a connection: the first column of its rows, or the error.
pub async fn simple_query(conn: &mut Conn, text: &str) -> Result<Vec<Option<String>>, String> {
    conn.stream.write_all(&wire::query(text)).await.map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    let mut error = None;
    loop {
        let (kind, body) = conn.read_message().await.map_err(|e| e.0)?;
        match kind {
            wire::DATA_ROW => {
                let n = i32::from_be_bytes(body.get(2..6).and_then(|b| b.try_into().ok()).unwrap_or([255; 4]));
                rows.push(if n < 0 { None } else { body.get(6..6 + n as usize).map(|v| String::from_utf8_lossy(v).into_owned()) });
            }
            wire::ERROR if error.is_none() => error = Some(wire::error_text(&body)),
            wire::READY => {
                conn.status = body.first().copied().unwrap_or(b'I');
                return match error {
                    Some(e) => Err(e),
                    None => Ok(rows),
                };
            }
            _ => {}
        }
    }
}

/// Send unit `seq` (its bytes `data`, as they were sent to the others) to a backend and read its
/// answers (dropped; a unit that failed everywhere fails again): whether it answered with an error.
pub async fn replay_unit(conn: &mut Conn, seq: u64, data: &[u8]) -> Result<bool, String> {
    let readies = messages(data).iter().filter(|m| m.0 == wire::SYNC || m.0 == wire::QUERY).count();
    conn.stream.write_all(data).await.map_err(|e| format!("replaying unit {seq}: {e}"))?;
    let mut seen = 0;
    let mut failed = false;
    while seen < readies {
        let (kind, body) = conn.read_message().await.map_err(|e| format!("replaying unit {seq}: {}", e.0))?;
        match kind {
            wire::ERROR => failed = true,
            wire::READY => {
                seen += 1;
                conn.status = body.first().copied().unwrap_or(b'I');
            }
            _ => {}
        }
    }
    Ok(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_its_records_and_cuts_a_torn_tail() {
        let dir = std::env::temp_dir().join(format!("tierscope-rlog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("recovery.log");
        let log = Log::open(&path).unwrap();
        assert_eq!(log.range(), None);
        for data in [&b"one"[..], b"two", b"three"] {
            let seq = log.take_seq();
            log.append(seq, data).unwrap();
        }
        // what was appended can be read back at once (a replay while serving)
        assert_eq!(log.range(), Some((1, 3)));
        assert_eq!(log.read(1, 2).unwrap(), vec![(1, b"one".to_vec()), (2, b"two".to_vec())]);
        drop(log);
        // a torn record: half a header
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&[4, 0, 0]).unwrap();
        let log = Log::open(&path).unwrap();
        assert_eq!(log.range(), Some((1, 3)));
        assert_eq!(log.read(2, 3).unwrap(), vec![(2, b"two".to_vec()), (3, b"three".to_vec())]);
        assert_eq!(log.take_seq(), 4);
        log.cut_after(2).unwrap();
        drop(log);
        let log = Log::open(&path).unwrap();
        assert_eq!(log.range(), Some((1, 2)));
        log.checkpoint(7).unwrap();
        assert_eq!(log.range(), None);
        assert_eq!(log.take_seq(), 8);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_mysql_record_gives_back_its_parts() {
        let pre = b"\x19\0\0\0\x03SET timestamp = 1.000000";
        let rec = my_record(true, pre, b"", b"\x03INSERT INTO t VALUES (NOW())");
        assert_eq!(my_unrecord(&rec), Some(MyRecord { ok: true, pre: &pre[..], post: b"", command: b"\x03INSERT INTO t VALUES (NOW())" }));
        let cmd = my_execute_command(b"UPDATE t SET a = ? WHERE id = ?", &[0, 1, 0, 0, 0, 0, 1, 3, 0, 3, 0, 7, 0, 0, 0, 9, 0, 0, 0]);
        let rec = my_record(false, b"", b"", &cmd);
        let r = my_unrecord(&rec).unwrap();
        assert!(!r.ok);
        let c = r.command;
        let (sql, body) = my_execute_parts(c).unwrap();
        assert_eq!(sql, b"UPDATE t SET a = ? WHERE id = ?");
        assert_eq!(body.len(), 19);
        assert_eq!(my_unrecord(&rec[..6]), None);
        assert_eq!(my_unrecord(&my_record(true, b"", b"", b"")), None);
        assert_eq!(my_unrecord(b"\x07\0\0\0\0\0\0\0\0\x03x"), None);
        assert_eq!(my_execute_parts(b"\x03SELECT 1"), None);
    }

    #[test]
    fn mysql_statements_opening_a_transaction_are_recognised() {
        for t in [
            "BEGIN",
            "begin work",
            "START TRANSACTION READ WRITE",
            "SET autocommit = 0",
            "set @@autocommit=1",
            "INSERT INTO t VALUES (1); BEGIN",
            "XA START 'x'",
        ] {
            assert!(my_opens_transaction(t), "{t}");
        }
        for t in ["INSERT INTO t VALUES (1)", "COMMIT", "ROLLBACK", "SELECT 'BEGIN'", "SET @a = 1", "CREATE TABLE t (a int)"] {
            assert!(!my_opens_transaction(t), "{t}");
        }
    }

    #[test]
    fn a_stale_backend_is_replayed_when_the_log_covers_it_and_refused_otherwise() {
        let p = "r.log";
        assert_eq!(head(&[Some(3), Some(7), None], Some((2, 9))), 9);
        assert_eq!(head(&[Some(3), Some(7)], None), 7);
        assert_eq!(verdict(9, 9, Some((2, 9)), p), Ok(None));
        assert_eq!(verdict(3, 9, Some((2, 9)), p), Ok(Some((4, 9))));
        assert_eq!(verdict(1, 9, Some((2, 9)), p), Ok(Some((2, 9))));
        assert_eq!(verdict(0, 9, Some((2, 9)), p), Err("the recovery log r.log holds units 2..9 only".into()));
        assert_eq!(verdict(3, 7, None, p), Err("the recovery log r.log is empty".into()));
        assert_eq!(verdict(8, 7, Some((1, 7)), p), Err("it is ahead of the recovery log r.log (head 7)".into()));
    }

    #[test]
    fn statements_refused_in_a_transaction_block_are_recognised() {
        for t in ["VACUUM t", "vacuum", "CREATE DATABASE x", "drop tablespace y", "CREATE INDEX CONCURRENTLY i ON t (a)", "ALTER SYSTEM SET x = 1"] {
            assert!(outside_transactions(t), "{t}");
        }
        for t in ["UPDATE t SET a = 1", "CREATE TABLE t (a int)", "DROP TABLE t", "SELECT 'VACUUM'", "BEGIN"] {
            assert!(!outside_transactions(t), "{t}");
        }
    }
}
