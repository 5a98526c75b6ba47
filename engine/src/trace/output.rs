//! The `requests` table as Parquet (python/tierscope/tables.py REQUESTS is the contract): the
//! thirteen contract columns, then the tracer's own columns `protocol`, `server_addr`,
//! `server_port`, `client_addr`, `client_port`, `inferred`, `truncated`, `flags`. Columns the
//! tracer always fills are written REQUIRED (no definition levels to encode); readers conform
//! them to the contract's nullable types.
//!
//! Rows are buffered column by column and written as a row group every `ROW_GROUP` rows, so
//! memory stays bounded however long the capture. Repeated strings (tier, server, label, status,
//! client) are interned, so a row costs no allocation beyond its request id.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, Int32Type, Int64Type};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use super::exchange::{flag, Exchange, Status};
use super::tcp::{FxBuild, Meta, Sink};

const ROW_GROUP: usize = 128 * 1024;

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

#[derive(Default)]
struct Strs {
    v: Vec<ByteArray>,
    def: Vec<i16>,
}
impl Columns {
    /// Empty every column, keeping the allocations for the next row group.
    fn clear(&mut self) {
        for s in [
            &mut self.tier, &mut self.server, &mut self.request_id, &mut self.parent_id, &mut self.label, &mut self.status,
            &mut self.client, &mut self.source, &mut self.protocol, &mut self.server_addr, &mut self.client_addr, &mut self.flags,
        ] {
            s.v.clear();
            s.def.clear();
        }
        for i in [&mut self.arrival, &mut self.departure, &mut self.bytes_in, &mut self.bytes_out, &mut self.conn] {
            i.v.clear();
            i.def.clear();
        }
        for i in [&mut self.server_port, &mut self.client_port] {
            i.v.clear();
            i.def.clear();
        }
        for b in [&mut self.inferred, &mut self.truncated] {
            b.v.clear();
            b.def.clear();
        }
    }
}

impl Strs {
    fn push(&mut self, v: Option<ByteArray>) {
        match v {
            Some(b) => {
                self.v.push(b);
                self.def.push(1);
            }
            None => self.def.push(0),
        }
    }
}

#[derive(Default)]
struct Ints<T> {
    v: Vec<T>,
    def: Vec<i16>,
}

#[derive(Default)]
struct Columns {
    tier: Strs,
    server: Strs,
    request_id: Strs,
    parent_id: Strs,
    label: Strs,
    arrival: Ints<i64>,
    departure: Ints<i64>,
    status: Strs,
    bytes_in: Ints<i64>,
    bytes_out: Ints<i64>,
    client: Strs,
    conn: Ints<i64>,
    source: Strs,
    protocol: Strs,
    server_addr: Strs,
    server_port: Ints<i32>,
    client_addr: Strs,
    client_port: Ints<i32>,
    inferred: Ints<bool>,
    truncated: Ints<bool>,
    flags: Strs,
}

/// The per-connection strings of a row, made once per connection.
struct ConnStrings {
    tier: ByteArray,
    server: ByteArray,
    client: ByteArray,
    protocol: ByteArray,
    server_addr: ByteArray,
    client_addr: ByteArray,
}

pub struct ParquetSink {
    writer: Option<SerializedFileWriter<File>>,
    cols: Columns,
    rows: usize,
    pub rows_written: u64,
    interned: HashMap<String, ByteArray, FxBuild>,
    conns: HashMap<u64, ConnStrings, FxBuild>,
    flag_text: Vec<Option<Option<ByteArray>>>,
    http_status: Vec<Option<ByteArray>>,
    ok: ByteArray,
    source: ByteArray,
}

impl ParquetSink {
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let file = File::create(path).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
        let schema = Arc::new(parse_message_type(SCHEMA)?);
        // Statistics only where readers prune on them (times, connection); no dictionary for
        // the columns whose values are (nearly) all different.
        let mut props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_statistics_enabled(EnabledStatistics::None)
            .set_column_dictionary_enabled(ColumnPath::from("request_id"), false)
            .set_column_dictionary_enabled(ColumnPath::from("arrival_ns"), false)
            .set_column_dictionary_enabled(ColumnPath::from("departure_ns"), false)
            .set_column_dictionary_enabled(ColumnPath::from("bytes_in"), false)
            .set_column_dictionary_enabled(ColumnPath::from("bytes_out"), false)
            .set_column_dictionary_enabled(ColumnPath::from("client_port"), false)
            .set_created_by(format!("tierscope-engine {} trace", env!("CARGO_PKG_VERSION")));
        for c in ["arrival_ns", "departure_ns", "conn"] {
            props = props.set_column_statistics_enabled(ColumnPath::from(c), EnabledStatistics::Chunk);
        }
        Ok(ParquetSink {
            writer: Some(SerializedFileWriter::new(file, schema, Arc::new(props.build()))?),
            cols: Columns::default(),
            rows: 0,
            rows_written: 0,
            interned: HashMap::default(),
            conns: HashMap::default(),
            flag_text: vec![None; 1 << flag::NAMES.len()],
            http_status: vec![None; 1000],
            ok: ByteArray::from("OK"),
            source: ByteArray::from("trace"),
        })
    }

    fn intern(&mut self, s: &str) -> ByteArray {
        if let Some(b) = self.interned.get(s) {
            return b.clone();
        }
        if self.interned.len() > 1_000_000 {
            self.interned.clear();
        }
        let b = ByteArray::from(s.as_bytes().to_vec());
        self.interned.insert(s.to_string(), b.clone());
        b
    }

    fn flags(&mut self, bits: u16) -> Option<ByteArray> {
        let i = bits as usize & (self.flag_text.len() - 1);
        if let Some(v) = &self.flag_text[i] {
            return v.clone();
        }
        let names: Vec<&str> = flag::NAMES.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| *n).collect();
        let v = if names.is_empty() { None } else { Some(ByteArray::from(names.join(",").into_bytes())) };
        self.flag_text[i] = Some(v.clone());
        v
    }

    fn status(&mut self, s: Status) -> Option<ByteArray> {
        match s {
            Status::None => None,
            Status::Ok => Some(self.ok.clone()),
            Status::Http(c) if (c as usize) < self.http_status.len() => {
                if self.http_status[c as usize].is_none() {
                    self.http_status[c as usize] = Some(ByteArray::from(c.to_string().into_bytes()));
                }
                self.http_status[c as usize].clone()
            }
            other => other.text().map(|t| self.intern(&t)),
        }
    }

    fn conn_strings(&mut self, m: &Meta) -> &ConnStrings {
        if !self.conns.contains_key(&m.conn) {
            if self.conns.len() > 100_000 {
                self.conns.clear();
            }
            let c = ConnStrings {
                tier: self.intern(&m.tier),
                server: self.intern(&m.server),
                client: ByteArray::from(m.client.as_bytes().to_vec()),
                protocol: self.intern(m.protocol),
                server_addr: self.intern(&m.server_addr),
                client_addr: self.intern(&m.client_addr),
            };
            self.conns.insert(m.conn, c);
        }
        &self.conns[&m.conn]
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        let w = self.writer.as_mut().expect("writer open");
        let mut rg = w.next_row_group()?;
        let c = &mut self.cols;
        let mut i = 0;
        while let Some(mut col) = rg.next_column()? {
            macro_rules! strs {
                ($s:expr, $req:expr) => {{
                    let defs = if $req { None } else { Some(&$s.def[..]) };
                    col.typed::<ByteArrayType>().write_batch(&$s.v, defs, None)?;
                }};
            }
            macro_rules! ints {
                ($s:expr, $t:ty, $req:expr) => {{
                    let defs = if $req { None } else { Some(&$s.def[..]) };
                    col.typed::<$t>().write_batch(&$s.v, defs, None)?;
                }};
            }
            match i {
                0 => strs!(c.tier, true),
                1 => strs!(c.server, true),
                2 => strs!(c.request_id, false),
                3 => strs!(c.parent_id, false),
                4 => strs!(c.label, false),
                5 => ints!(c.arrival, Int64Type, true),
                6 => ints!(c.departure, Int64Type, true),
                7 => strs!(c.status, false),
                8 => ints!(c.bytes_in, Int64Type, true),
                9 => ints!(c.bytes_out, Int64Type, true),
                10 => strs!(c.client, true),
                11 => ints!(c.conn, Int64Type, true),
                12 => strs!(c.source, true),
                13 => strs!(c.protocol, true),
                14 => strs!(c.server_addr, true),
                15 => ints!(c.server_port, Int32Type, true),
                16 => strs!(c.client_addr, true),
                17 => ints!(c.client_port, Int32Type, true),
                18 => ints!(c.inferred, BoolType, true),
                19 => ints!(c.truncated, BoolType, true),
                20 => strs!(c.flags, false),
                _ => anyhow::bail!("unexpected column {i}"),
            }
            col.close()?;
            i += 1;
        }
        rg.close()?;
        self.rows_written += self.rows as u64;
        self.rows = 0;
        self.cols.clear();
        Ok(())
    }

    /// Write the remaining rows and the file footer.
    pub fn close(mut self) -> anyhow::Result<u64> {
        self.flush()?;
        if let Some(w) = self.writer.take() {
            w.close()?;
        }
        Ok(self.rows_written)
    }
}

impl Sink for ParquetSink {
    fn push(&mut self, m: &Meta, ex: &Exchange) -> anyhow::Result<()> {
        let label = if ex.label.is_empty() { None } else { Some(self.intern(&ex.label)) };
        let status = self.status(ex.status);
        let flags = self.flags(ex.flags);
        let source = self.source.clone();
        let cs = self.conn_strings(m);
        let (tier, server, client, protocol, saddr, caddr) =
            (cs.tier.clone(), cs.server.clone(), cs.client.clone(), cs.protocol.clone(), cs.server_addr.clone(), cs.client_addr.clone());
        let c = &mut self.cols;
        c.tier.v.push(tier);
        c.server.v.push(server);
        c.request_id.push(ex.request_id.as_ref().map(|r| ByteArray::from(r.as_bytes().to_vec())));
        c.parent_id.push(None);
        c.label.push(label);
        c.arrival.v.push(ex.arrival_ns);
        c.departure.v.push(ex.departure_ns.max(ex.arrival_ns));
        c.status.push(status);
        c.bytes_in.v.push(ex.bytes_in as i64);
        c.bytes_out.v.push(ex.bytes_out as i64);
        c.client.v.push(client);
        c.conn.v.push(m.conn as i64);
        c.source.v.push(source);
        c.protocol.v.push(protocol);
        c.server_addr.v.push(saddr);
        c.server_port.v.push(m.server_port as i32);
        c.client_addr.v.push(caddr);
        c.client_port.v.push(m.client_port as i32);
        c.inferred.v.push(ex.flags & flag::INFERRED != 0);
        c.truncated.v.push(ex.flags & flag::TRUNCATED != 0);
        c.flags.push(flags);
        self.rows += 1;
        if self.rows >= ROW_GROUP {
            self.flush()?;
        }
        Ok(())
    }
}
