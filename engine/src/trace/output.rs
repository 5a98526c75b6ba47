//! The `requests` table as Parquet (python/tierscope/tables.py REQUESTS is the contract): the
//! thirteen contract columns, then the tracer's own columns `protocol`, `server_addr`,
//! `server_port`, `client_addr`, `client_port`, `inferred`, `truncated`, `flags`. Columns the
//! tracer always fills are written REQUIRED (no definition levels to encode); readers conform
//! them to the contract's nullable types.
//!
//! Rows are collected and written as a row group every `ROW_GROUP` rows, so memory stays bounded
//! however long the capture. A row keeps little of its own: its times and byte counts, ids of its
//! interned label and status, its flag bits, its request id, and the slot of its connection in
//! the row group. The eight columns that are constant per connection (tier, server, client,
//! conn, protocol, addresses and ports) are expanded from that slot when the group is written,
//! through dictionaries built over the group's connections, so a row costs one hash lookup for
//! its connection, a cached lookup for its label, and no allocation beyond its request id.
//! `pqwrite` encodes the columns.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use super::exchange::{flag, Exchange, Status};
use super::hash::FxBuild;
use super::pqwrite::{FileWriter, Values};
use super::tcp::{Meta, Sink};

const ROW_GROUP: usize = 128 * 1024;

/// The interning tables are emptied (between row groups) when they grow past these sizes, so a
/// capture with endless distinct labels or connections does not grow memory without bound.
const MAX_STRINGS: usize = 1_000_000;
const MAX_CONNS: usize = 100_000;

const SCHEMA: &str = "message requests {
  REQUIRED BYTE_ARRAY tier (UTF8);
  REQUIRED BYTE_ARRAY server (UTF8);
  OPTIONAL BYTE_ARRAY request_id (UTF8);
  OPTIONAL BYTE_ARRAY parent_id (UTF8);
  OPTIONAL BYTE_ARRAY label (UTF8);
  REQUIRED INT64 arrival_ns;
  REQUIRED INT64 departure_ns;
  OPTIONAL BYTE_ARRAY status (UTF8);
  REQUIRED INT64 bytes_in;
  REQUIRED INT64 bytes_out;
  REQUIRED BYTE_ARRAY client (UTF8);
  REQUIRED INT64 conn;
  REQUIRED BYTE_ARRAY source (UTF8);
  REQUIRED BYTE_ARRAY protocol (UTF8);
  REQUIRED BYTE_ARRAY server_addr (UTF8);
  REQUIRED INT32 server_port;
  REQUIRED BYTE_ARRAY client_addr (UTF8);
  REQUIRED INT32 client_port;
  REQUIRED BOOLEAN inferred;
  REQUIRED BOOLEAN truncated;
  OPTIONAL BYTE_ARRAY flags (UTF8);
}";

/// No value: a null label or status.
const NONE: u32 = u32::MAX;

/// Interned strings with dense ids, so that per-row-group dictionaries map them through a Vec.
struct Strings {
    ids: HashMap<Box<str>, u32, FxBuild>,
    text: Vec<Box<str>>,
    /// id + 1 (0: empty) of a recently seen string, by a cheap fingerprint (see `id_recent`)
    recent: Box<[u32; RECENT]>,
}

const RECENT: usize = 256;

impl Default for Strings {
    fn default() -> Self {
        Strings { ids: HashMap::default(), text: Vec::new(), recent: Box::new([0; RECENT]) }
    }
}

impl Strings {
    fn id(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.text.len() as u32;
        self.text.push(s.into());
        self.ids.insert(s.into(), id);
        id
    }

    /// `id` for strings that repeat a lot (labels): a capture holds few distinct statements and
    /// paths, and comparing with the recent string of the same length and ends is cheaper than
    /// hashing every byte again. A miss (or a collision) falls back to the hash table.
    fn id_recent(&mut self, s: &str) -> u32 {
        let b = s.as_bytes();
        let word = |i: usize| b.get(i..i + 8).map_or(0, |w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
        let print = (b.len() as u64) ^ word(0) ^ word(b.len().saturating_sub(8)).rotate_left(29);
        let slot = (print.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % RECENT;
        let known = self.recent[slot];
        if known != 0 && *self.text[known as usize - 1] == *s {
            return known - 1;
        }
        let id = self.id(s);
        self.recent[slot] = id + 1;
        id
    }

    fn text(&self, id: u32) -> &str {
        &self.text[id as usize]
    }
}

/// What a row takes from its connection.
#[derive(Clone, Copy)]
struct ConnRow {
    conn: u64,
    tier: u32,
    server: u32,
    client: u32,
    protocol: u32,
    server_addr: u32,
    client_addr: u32,
    server_port: u16,
    client_port: u16,
}

struct ConnEntry {
    row: ConnRow,
    /// the row group (by number) in which the connection has slot `slot`
    group: u64,
    slot: u32,
}

/// One row as collected: what is not constant per connection (its connection's slot in the
/// group stands for the rest), its request id aside.
#[derive(Clone, Copy)]
struct Row {
    arrival: i64,
    departure: i64,
    bytes_in: i64,
    bytes_out: i64,
    slot: u32,
    label: u32,
    status: u32,
    flags: u16,
    has_request_id: bool,
}

/// The row group being collected: the rows, the connections they refer to (by slot), and the
/// request ids present (PLAIN encoded, in row order).
#[derive(Default)]
struct Group {
    conns: Vec<ConnRow>,
    rows: Vec<Row>,
    request_id: Vec<u8>,
    request_ids: usize,
}

impl Group {
    /// Empty the group, keeping the allocations for the next one.
    fn clear(&mut self) {
        self.conns.clear();
        self.rows.clear();
        self.request_id.clear();
        self.request_ids = 0;
    }
}

pub struct ParquetSink {
    file: Option<FileWriter<BufWriter<File>>>,
    strings: Strings,
    conns: HashMap<u64, ConnEntry, FxBuild>,
    group: Group,
    groups: u64,
    /// string ids of HTTP status codes (NONE until seen) and of "OK"
    http_status: Vec<u32>,
    ok: u32,
    enc: Encoder,
    /// rows per row group (ROW_GROUP; smaller in tests)
    row_group: usize,
    pub rows_written: u64,
}

impl ParquetSink {
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let file = File::create(path).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
        let created_by = format!("tierscope-engine {} trace", env!("CARGO_PKG_VERSION"));
        let mut sink = ParquetSink {
            file: Some(FileWriter::new(BufWriter::with_capacity(1 << 20, file), SCHEMA, created_by)?),
            strings: Strings::default(),
            conns: HashMap::default(),
            group: Group::default(),
            groups: 0,
            http_status: Vec::new(),
            ok: NONE,
            enc: Encoder::default(),
            row_group: ROW_GROUP,
            rows_written: 0,
        };
        sink.clear_strings();
        Ok(sink)
    }

    /// Forget every interned string (and the connections, which hold string ids).
    fn clear_strings(&mut self) {
        self.strings = Strings::default();
        self.conns.clear();
        self.http_status = vec![NONE; 1000];
        self.ok = self.strings.id("OK");
    }

    fn status(&mut self, s: Status) -> u32 {
        match s {
            Status::None => NONE,
            Status::Ok => self.ok,
            Status::Http(c) if (c as usize) < self.http_status.len() => {
                let id = &mut self.http_status[c as usize];
                if *id == NONE {
                    *id = self.strings.id(&c.to_string());
                }
                *id
            }
            other => other.text().map_or(NONE, |t| self.strings.id(&t)),
        }
    }

    /// The connection's slot in the row group, giving it one on its first row in the group.
    fn conn_slot(&mut self, m: &Meta) -> u32 {
        let entry = match self.conns.entry(m.conn) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => {
                let s = &mut self.strings;
                let row = ConnRow {
                    conn: m.conn,
                    tier: s.id(&m.tier),
                    server: s.id(&m.server),
                    client: s.id(&m.client),
                    protocol: s.id(m.protocol),
                    server_addr: s.id(&m.server_addr),
                    client_addr: s.id(&m.client_addr),
                    server_port: m.server_port,
                    client_port: m.client_port,
                };
                v.insert(ConnEntry { row, group: u64::MAX, slot: 0 })
            }
        };
        if entry.group != self.groups {
            entry.group = self.groups;
            entry.slot = self.group.conns.len() as u32;
            self.group.conns.push(entry.row);
        }
        entry.slot
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        let rows = self.group.rows.len();
        if rows == 0 {
            return Ok(());
        }
        let w = self.file.as_mut().expect("writer open");
        let (g, s, e) = (&self.group, &self.strings, &mut self.enc);
        let r = &g.rows[..];
        w.begin_row_group(rows);
        e.conn_text(w, g, s, |c| c.tier)?;
        e.conn_text(w, g, s, |c| c.server)?;
        e.request_ids(w, g)?;
        e.nulls(w, rows)?; // parent_id: the tracer does not see parents
        e.optional_text(w, r, |r| r.label, s)?;
        e.ints(w, r, |r| r.arrival, true)?;
        e.ints(w, r, |r| r.departure, true)?;
        e.optional_text(w, r, |r| r.status, s)?;
        e.ints(w, r, |r| r.bytes_in, false)?;
        e.ints(w, r, |r| r.bytes_out, false)?;
        e.conn_text(w, g, s, |c| c.client)?;
        e.conn_ids(w, g)?;
        e.constant_text(w, rows, "trace")?; // source
        e.conn_text(w, g, s, |c| c.protocol)?;
        e.conn_text(w, g, s, |c| c.server_addr)?;
        e.conn_port(w, g, |c| c.server_port)?;
        e.conn_text(w, g, s, |c| c.client_addr)?;
        e.conn_port(w, g, |c| c.client_port)?;
        e.flag_bit(w, r, flag::INFERRED)?;
        e.flag_bit(w, r, flag::TRUNCATED)?;
        e.flag_names(w, r)?;
        w.end_row_group()?;

        self.rows_written += rows as u64;
        self.groups += 1;
        self.group.clear();
        if self.strings.text.len() > MAX_STRINGS {
            self.clear_strings();
        } else if self.conns.len() > MAX_CONNS {
            self.conns.clear();
        }
        Ok(())
    }

    /// Write the remaining rows and the file footer.
    pub fn close(mut self) -> anyhow::Result<u64> {
        self.flush()?;
        if let Some(w) = self.file.take() {
            w.finish()?;
        }
        Ok(self.rows_written)
    }
}

impl Sink for ParquetSink {
    fn push(&mut self, m: &Meta, ex: &Exchange) -> anyhow::Result<()> {
        let slot = self.conn_slot(m);
        let label = if ex.label.is_empty() { NONE } else { self.strings.id_recent(&ex.label) };
        let status = self.status(ex.status);
        let g = &mut self.group;
        if let Some(r) = &ex.request_id {
            g.request_id.extend_from_slice(&(r.len() as u32).to_le_bytes());
            g.request_id.extend_from_slice(r.as_bytes());
            g.request_ids += 1;
        }
        g.rows.push(Row {
            arrival: ex.arrival_ns,
            departure: ex.departure_ns.max(ex.arrival_ns),
            bytes_in: ex.bytes_in as i64,
            bytes_out: ex.bytes_out as i64,
            slot,
            label,
            status,
            flags: ex.flags,
            has_request_id: ex.request_id.is_some(),
        });
        if g.rows.len() >= self.row_group {
            self.flush()?;
        }
        Ok(())
    }
}

fn min_max(v: &[i64]) -> Option<(i64, i64)> {
    let first = *v.first()?;
    Some(v.iter().fold((first, first), |(lo, hi), &x| (lo.min(x), hi.max(x))))
}

/// The comma-separated names of a set of flags (the `flags` column).
fn flag_names(bits: u16) -> String {
    let names: Vec<&str> = flag::NAMES.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| *n).collect();
    names.join(",")
}

/// Maps keys (string ids, ports, flag sets) to indices in one column chunk's dictionary.
#[derive(Default)]
struct Dict {
    /// key -> index + 1; 0 while the key is not in the dictionary
    index: Vec<u32>,
    /// index -> key
    keys: Vec<u32>,
}

impl Dict {
    #[inline]
    fn get(&mut self, key: u32) -> u32 {
        match self.index.get(key as usize) {
            Some(&i) if i != 0 => i - 1,
            _ => self.insert(key),
        }
    }

    /// Out of line: a dictionary gets few keys, and is asked for them once per row.
    #[cold]
    fn insert(&mut self, key: u32) -> u32 {
        let k = key as usize;
        if k >= self.index.len() {
            self.index.resize(k + 1, 0);
        }
        self.keys.push(key);
        self.index[k] = self.keys.len() as u32;
        self.index[k] - 1
    }

    /// Start the next dictionary, touching only the entries this one used.
    fn reset(&mut self) {
        for &k in &self.keys {
            self.index[k as usize] = 0;
        }
        self.keys.clear();
    }
}

type Writer = FileWriter<BufWriter<File>>;

/// Builds each column chunk of a row group in buffers reused from one to the next.
#[derive(Default)]
struct Encoder {
    dict: Dict,
    /// the dictionary's values, PLAIN encoded
    dict_values: Vec<u8>,
    per_slot: Vec<u32>,
    indices: Vec<u32>,
    defs: Vec<u8>,
    ints: Vec<i64>,
}

impl Encoder {
    /// Dictionary indices of a per-connection value, by connection slot, then expanded to rows.
    fn conn_indices(&mut self, g: &Group, key: impl Fn(&ConnRow) -> u32) {
        self.dict.reset();
        let dict = &mut self.dict;
        self.per_slot.clear();
        self.per_slot.extend(g.conns.iter().map(|c| dict.get(key(c))));
        let per_slot = &self.per_slot;
        self.indices.clear();
        self.indices.extend(g.rows.iter().map(|r| per_slot[r.slot as usize]));
    }

    fn write_dict(&self, w: &mut Writer, defs: Option<&[u8]>) -> anyhow::Result<()> {
        let values = Values::Dict { dict: &self.dict_values, len: self.dict.keys.len(), indices: &self.indices };
        w.column(defs, values, None)
    }

    /// A string column constant per connection (tier, server, client, protocol, addresses).
    fn conn_text(&mut self, w: &mut Writer, g: &Group, s: &Strings, key: impl Fn(&ConnRow) -> u32) -> anyhow::Result<()> {
        self.conn_indices(g, key);
        self.dict_values.clear();
        for &k in &self.dict.keys {
            plain_str(&mut self.dict_values, s.text(k));
        }
        self.write_dict(w, None)
    }

    /// A port column (INT32).
    fn conn_port(&mut self, w: &mut Writer, g: &Group, port: impl Fn(&ConnRow) -> u16) -> anyhow::Result<()> {
        self.conn_indices(g, |c| port(c) as u32);
        self.dict_values.clear();
        for &k in &self.dict.keys {
            self.dict_values.extend_from_slice(&(k as i32).to_le_bytes());
        }
        self.write_dict(w, None)
    }

    /// The `conn` column: the group's connections are its dictionary, in slot order.
    fn conn_ids(&mut self, w: &mut Writer, g: &Group) -> anyhow::Result<()> {
        self.dict_values.clear();
        for c in &g.conns {
            self.dict_values.extend_from_slice(&(c.conn as i64).to_le_bytes());
        }
        let ids = || g.conns.iter().map(|c| c.conn as i64);
        let stats = ids().min().zip(ids().max());
        self.indices.clear();
        self.indices.extend(g.rows.iter().map(|r| r.slot));
        w.column(None, Values::Dict { dict: &self.dict_values, len: g.conns.len(), indices: &self.indices }, stats)
    }

    /// An INT64 column (DELTA_BINARY_PACKED), with statistics if readers filter on it.
    fn ints(&mut self, w: &mut Writer, rows: &[Row], value: impl Fn(&Row) -> i64, stats: bool) -> anyhow::Result<()> {
        self.ints.clear();
        self.ints.extend(rows.iter().map(value));
        let stats = if stats { min_max(&self.ints) } else { None };
        w.column(None, Values::Delta(&self.ints), stats)
    }

    /// The `request_id` column: PLAIN, null where the request had none.
    fn request_ids(&mut self, w: &mut Writer, g: &Group) -> anyhow::Result<()> {
        self.defs.clear();
        self.defs.extend(g.rows.iter().map(|r| r.has_request_id as u8));
        w.column(Some(&self.defs), Values::Plain { bytes: &g.request_id, count: g.request_ids }, None)
    }

    /// An optional string column of interned ids (NONE for null).
    fn optional_text(&mut self, w: &mut Writer, rows: &[Row], id: impl Fn(&Row) -> u32, s: &Strings) -> anyhow::Result<()> {
        self.dict.reset();
        self.defs.clear();
        self.defs.extend(rows.iter().map(|r| (id(r) != NONE) as u8));
        let dict = &mut self.dict;
        self.indices.clear();
        self.indices.extend(rows.iter().map(&id).filter(|&i| i != NONE).map(|i| dict.get(i)));
        if self.indices.is_empty() {
            return w.column(Some(&self.defs), Values::Plain { bytes: &[], count: 0 }, None);
        }
        self.dict_values.clear();
        for &k in &self.dict.keys {
            plain_str(&mut self.dict_values, s.text(k));
        }
        let values = Values::Dict { dict: &self.dict_values, len: self.dict.keys.len(), indices: &self.indices };
        w.column(Some(&self.defs), values, None)
    }

    /// The `flags` column: the names of each row's flags, null when it has none.
    fn flag_names(&mut self, w: &mut Writer, rows: &[Row]) -> anyhow::Result<()> {
        self.dict.reset();
        self.defs.clear();
        self.defs.extend(rows.iter().map(|r| (r.flags != 0) as u8));
        let dict = &mut self.dict;
        self.indices.clear();
        self.indices.extend(rows.iter().filter(|r| r.flags != 0).map(|r| dict.get(r.flags as u32)));
        if self.indices.is_empty() {
            return w.column(Some(&self.defs), Values::Plain { bytes: &[], count: 0 }, None);
        }
        self.dict_values.clear();
        for &k in &self.dict.keys {
            plain_str(&mut self.dict_values, &flag_names(k as u16));
        }
        let values = Values::Dict { dict: &self.dict_values, len: self.dict.keys.len(), indices: &self.indices };
        w.column(Some(&self.defs), values, None)
    }

    /// A BOOLEAN column: whether each row has `bit` among its flags (PLAIN: one bit per row).
    fn flag_bit(&mut self, w: &mut Writer, rows: &[Row], bit: u16) -> anyhow::Result<()> {
        self.dict_values.clear();
        for chunk in rows.chunks(8) {
            let byte = chunk.iter().enumerate().fold(0u8, |b, (i, r)| b | (((r.flags & bit != 0) as u8) << i));
            self.dict_values.push(byte);
        }
        w.column(None, Values::Plain { bytes: &self.dict_values, count: rows.len() }, None)
    }

    /// A column with the same string in every row.
    fn constant_text(&mut self, w: &mut Writer, rows: usize, text: &str) -> anyhow::Result<()> {
        self.dict_values.clear();
        plain_str(&mut self.dict_values, text);
        self.indices.clear();
        self.indices.resize(rows, 0);
        w.column(None, Values::Dict { dict: &self.dict_values, len: 1, indices: &self.indices }, None)
    }

    /// An optional column that is null in every row.
    fn nulls(&mut self, w: &mut Writer, rows: usize) -> anyhow::Result<()> {
        self.defs.clear();
        self.defs.resize(rows, 0);
        w.column(Some(&self.defs), Values::Plain { bytes: &[], count: 0 }, None)
    }
}

/// A BYTE_ARRAY value, PLAIN encoded: its length (u32, little endian), then its bytes.
fn plain_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;

    fn meta(conn: u64) -> Meta {
        Meta {
            tier: if conn.is_multiple_of(2) { "web".into() } else { "db".into() },
            server: format!("server{}", conn % 3),
            protocol: if conn.is_multiple_of(2) { "http" } else { "postgres" },
            server_addr: "10.0.0.2".into(),
            server_port: if conn.is_multiple_of(2) { 80 } else { 5432 },
            client_addr: format!("10.0.1.{}", conn % 5),
            client_port: 40000 + conn as u16,
            client: format!("10.0.1.{}", conn % 5),
            conn,
        }
    }

    fn exchange(i: u64) -> Exchange {
        let mut e = Exchange::new(1_700_000_000_000_000_000 + i as i64 * 1000, [0, flag::TRUNCATED | flag::GAP, flag::PIPELINED][i as usize % 3]);
        // departure before arrival is written as arrival
        e.departure_ns = if i.is_multiple_of(7) { e.arrival_ns - 5 } else { e.arrival_ns + 250 + i as i64 % 13 };
        e.label = if i.is_multiple_of(4) { String::new() } else { format!("SELECT {}", i % 5) };
        e.request_id = i.is_multiple_of(6).then(|| format!("req-{i}"));
        e.status =
            [Status::None, Status::Ok, Status::Http(200), Status::Http(1200), Status::SqlState(*b"42P01"), Status::MyErr(1064)][i as usize % 6];
        e.bytes_in = i * 3;
        e.bytes_out = u64::MAX - i; // written as i64, wrapping
        e
    }

    fn text(s: &str) -> Field {
        Field::Str(s.to_string())
    }

    /// The row as the file should hold it, in column order.
    fn expected(m: &Meta, e: &Exchange) -> Vec<Field> {
        let opt = |s: Option<String>| s.map_or(Field::Null, Field::Str);
        let flags = flag_names(e.flags);
        vec![
            text(&m.tier),
            text(&m.server),
            opt(e.request_id.clone()),
            Field::Null,
            opt((!e.label.is_empty()).then(|| e.label.clone())),
            Field::Long(e.arrival_ns),
            Field::Long(e.departure_ns.max(e.arrival_ns)),
            opt(e.status.text()),
            Field::Long(e.bytes_in as i64),
            Field::Long(e.bytes_out as i64),
            text(&m.client),
            Field::Long(m.conn as i64),
            text("trace"),
            text(m.protocol),
            text(&m.server_addr),
            Field::Int(m.server_port as i32),
            text(&m.client_addr),
            Field::Int(m.client_port as i32),
            Field::Bool(e.flags & flag::INFERRED != 0),
            Field::Bool(e.flags & flag::TRUNCATED != 0),
            opt((!flags.is_empty()).then_some(flags)),
        ]
    }

    #[test]
    fn rows_read_back_in_order_across_row_groups() {
        let path = std::env::temp_dir().join(format!("tierscope-requests-{}.parquet", std::process::id()));
        let mut sink = ParquetSink::create(&path).unwrap();
        sink.row_group = 100;
        let mut want = Vec::new();
        for i in 0..1234u64 {
            // connections come and go: some in one row group only, some across several
            let m = meta(if i < 600 { i % 11 } else { 20 + i % 37 });
            let e = exchange(i);
            sink.push(&m, &e).unwrap();
            want.push(expected(&m, &e));
        }
        assert_eq!(sink.close().unwrap(), 1234);

        let r = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        assert_eq!(r.metadata().num_row_groups(), 13);
        let got: Vec<Vec<Field>> =
            r.get_row_iter(None).unwrap().map(|row| row.unwrap().get_column_iter().map(|(_, f)| f.clone()).collect()).collect();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "row {i}");
        }
        let _ = std::fs::remove_file(&path);
    }
}
