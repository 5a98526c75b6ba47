//! The `requests` table as Parquet (python/tierscope/tables.py REQUESTS is the contract): the
//! thirteen contract columns, then the tracer's own nullable columns `protocol`, `server_addr`,
//! `server_port`, `client_addr`, `client_port`, `inferred`, `truncated`, `flags`.
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
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use super::exchange::{flag, Exchange};
use super::tcp::{Meta, Sink};

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
  OPTIONAL INT64 bytes_in;
  OPTIONAL INT64 bytes_out;
  OPTIONAL BYTE_ARRAY client (UTF8);
  OPTIONAL INT64 conn;
  OPTIONAL BYTE_ARRAY source (UTF8);
  OPTIONAL BYTE_ARRAY protocol (UTF8);
  OPTIONAL BYTE_ARRAY server_addr (UTF8);
  OPTIONAL INT32 server_port;
  OPTIONAL BYTE_ARRAY client_addr (UTF8);
  OPTIONAL INT32 client_port;
  OPTIONAL BOOLEAN inferred;
  OPTIONAL BOOLEAN truncated;
  OPTIONAL BYTE_ARRAY flags (UTF8);
}";

#[derive(Default)]
struct Strs {
    v: Vec<ByteArray>,
    def: Vec<i16>,
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
impl<T> Ints<T> {
    fn push(&mut self, v: T) {
        self.v.push(v);
        self.def.push(1);
    }
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

pub struct ParquetSink {
    writer: Option<SerializedFileWriter<File>>,
    cols: Columns,
    rows: usize,
    pub rows_written: u64,
    interned: HashMap<String, ByteArray>,
    flag_text: HashMap<u16, Option<ByteArray>>,
    source: ByteArray,
}

impl ParquetSink {
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let file = File::create(path).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
        let schema = Arc::new(parse_message_type(SCHEMA)?);
        let props = Arc::new(
            WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .set_created_by(format!("tierscope-engine {} trace", env!("CARGO_PKG_VERSION")))
                .build(),
        );
        Ok(ParquetSink {
            writer: Some(SerializedFileWriter::new(file, schema, props)?),
            cols: Columns::default(),
            rows: 0,
            rows_written: 0,
            interned: HashMap::new(),
            flag_text: HashMap::new(),
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
        if let Some(b) = self.flag_text.get(&bits) {
            return b.clone();
        }
        let names: Vec<&str> = flag::NAMES.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| *n).collect();
        let v = if names.is_empty() { None } else { Some(ByteArray::from(names.join(",").into_bytes())) };
        self.flag_text.insert(bits, v.clone());
        v
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
                8 => ints!(c.bytes_in, Int64Type, false),
                9 => ints!(c.bytes_out, Int64Type, false),
                10 => strs!(c.client, false),
                11 => ints!(c.conn, Int64Type, false),
                12 => strs!(c.source, false),
                13 => strs!(c.protocol, false),
                14 => strs!(c.server_addr, false),
                15 => ints!(c.server_port, Int32Type, false),
                16 => strs!(c.client_addr, false),
                17 => ints!(c.client_port, Int32Type, false),
                18 => ints!(c.inferred, BoolType, false),
                19 => ints!(c.truncated, BoolType, false),
                20 => strs!(c.flags, false),
                _ => anyhow::bail!("unexpected column {i}"),
            }
            col.close()?;
            i += 1;
        }
        rg.close()?;
        self.rows_written += self.rows as u64;
        self.rows = 0;
        self.cols = Columns::default();
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
        let tier = self.intern(&m.tier);
        let server = self.intern(&m.server);
        let label = if ex.label.is_empty() { None } else { Some(self.intern(&ex.label)) };
        let status = ex.status.text().map(|s| self.intern(&s));
        let client = self.intern(&m.client);
        let protocol = self.intern(m.protocol);
        let saddr = self.intern(&m.server_addr);
        let caddr = self.intern(&m.client_addr);
        let flags = self.flags(ex.flags);
        let source = self.source.clone();
        let c = &mut self.cols;
        c.tier.v.push(tier);
        c.server.v.push(server);
        c.request_id.push(ex.request_id.as_ref().map(|r| ByteArray::from(r.as_bytes().to_vec())));
        c.parent_id.push(None);
        c.label.push(label);
        c.arrival.v.push(ex.arrival_ns);
        c.departure.v.push(ex.departure_ns.max(ex.arrival_ns));
        c.status.push(status);
        c.bytes_in.push(ex.bytes_in as i64);
        c.bytes_out.push(ex.bytes_out as i64);
        c.client.push(Some(client));
        c.conn.push(m.conn as i64);
        c.source.push(Some(source));
        c.protocol.push(Some(protocol));
        c.server_addr.push(Some(saddr));
        c.server_port.push(m.server_port as i32);
        c.client_addr.push(Some(caddr));
        c.client_port.push(m.client_port as i32);
        c.inferred.push(ex.flags & flag::INFERRED != 0);
        c.truncated.push(ex.flags & flag::TRUNCATED != 0);
        c.flags.push(flags);
        self.rows += 1;
        if self.rows >= ROW_GROUP {
            self.flush()?;
        }
        Ok(())
    }
}
