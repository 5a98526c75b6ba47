//! The per-request log: the `client_requests` table (python/tierscope/tables.py CLIENT_REQUESTS)
//! as Parquet, written by a background thread in row groups so the event loop only appends to
//! a batch. Written with the `parquet` crate's low-level column writers (no Arrow).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{anyhow, Context, Result};
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int32Type, Int64Type};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::ColumnPath;

use super::http::ErrorKind;

pub const PHASES: [&str; 3] = ["ramp_up", "run", "ramp_down"];

/// One request as logged (times in ns since the Unix epoch).
#[derive(Clone, Debug)]
pub struct Record {
    pub user: u32,
    pub session: u64,
    pub state: u16,
    pub path: Arc<str>,
    pub intended_ns: i64,
    pub start_ns: i64,
    /// 0 = no byte received
    pub first_byte_ns: i64,
    pub end_ns: i64,
    /// 0 = no response
    pub status: u16,
    pub bytes: u64,
    pub error: Option<ErrorKind>,
    pub phase: u8,
    /// embedded objects fetched with the page (None: fetching is off, or no page arrived)
    pub embedded: Option<u32>,
    /// their response bytes on the wire
    pub embedded_bytes: u64,
    /// those that did not come back 2xx/3xx (transport error, 4xx, 5xx)
    pub embedded_failed: u32,
}

const SCHEMA: &str = "message client_requests {
  required int64 user;
  required int64 session;
  required binary state (UTF8);
  optional binary path (UTF8);
  optional int64 intended_ns;
  required int64 start_ns;
  optional int64 first_byte_ns;
  required int64 end_ns;
  optional int32 status;
  optional int64 bytes;
  optional binary error (UTF8);
  required binary phase (UTF8);
  optional int32 embedded;
  optional int64 embedded_bytes;
  optional int32 embedded_failed;
}";

/// The columns whose values are nearly all distinct (times, sessions).
const UNIQUE_COLUMNS: [&str; 5] = ["session", "intended_ns", "start_ns", "first_byte_ns", "end_ns"];

/// The string columns.
const NAME_COLUMNS: [&str; 4] = ["state", "path", "error", "phase"];

/// Rows per row group.
const ROW_GROUP: usize = 128 * 1024;

pub struct LogWriter {
    tx: Option<mpsc::Sender<Vec<Record>>>,
    handle: Option<JoinHandle<Result<u64>>>,
    pub path: PathBuf,
}

impl LogWriter {
    pub fn create(path: &Path, states: Vec<String>) -> Result<LogWriter> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).with_context(|| format!("--log {}: cannot create directory", path.display()))?;
            }
        }
        let file = File::create(path).with_context(|| format!("--log {}: cannot create", path.display()))?;
        let schema = Arc::new(parse_message_type(SCHEMA)?);
        let mut props = WriterProperties::builder().set_compression(Compression::SNAPPY).set_created_by("tierscope-engine load".into());
        // no dictionary for the columns whose values hardly repeat: it would hash every value
        // into a table as large as the row group's values for nothing
        for column in UNIQUE_COLUMNS {
            props = props.set_column_dictionary_enabled(ColumnPath::from(column), false);
        }
        // nor min/max statistics for the names (a string comparison per value): a reader filters
        // on the times, which keep theirs
        for column in NAME_COLUMNS {
            props = props.set_column_statistics_enabled(ColumnPath::from(column), EnabledStatistics::None);
        }
        let props = Arc::new(props.build());
        let mut writer = SerializedFileWriter::new(file, schema, props)?;
        let (tx, rx) = mpsc::channel::<Vec<Record>>();
        let handle = std::thread::Builder::new().name("log-writer".into()).spawn(move || -> Result<u64> {
            let names = Names {
                states: states.iter().map(|s| ByteArray::from(s.as_str())).collect(),
                phases: PHASES.iter().map(|&p| ByteArray::from(p)).collect(),
                errors: ErrorKind::ALL.iter().map(|e| ByteArray::from(e.name())).collect(),
            };
            let mut pending: Vec<Record> = Vec::with_capacity(ROW_GROUP);
            let mut rows = 0u64;
            let flush = |pending: &mut Vec<Record>, writer: &mut SerializedFileWriter<File>| -> Result<()> {
                if pending.is_empty() {
                    return Ok(());
                }
                write_group(writer, pending, &names)?;
                pending.clear();
                Ok(())
            };
            while let Ok(batch) = rx.recv() {
                rows += batch.len() as u64;
                pending.extend(batch);
                if pending.len() >= ROW_GROUP {
                    flush(&mut pending, &mut writer)?;
                }
            }
            flush(&mut pending, &mut writer)?;
            writer.close()?;
            Ok(rows)
        })?;
        Ok(LogWriter { tx: Some(tx), handle: Some(handle), path: path.to_path_buf() })
    }

    pub fn sender(&self) -> mpsc::Sender<Vec<Record>> {
        self.tx.clone().expect("log writer open")
    }

    /// Close the file (writes the footer); returns the number of rows.
    pub fn finish(mut self) -> Result<u64> {
        drop(self.tx.take());
        let h = self.handle.take().unwrap();
        h.join().map_err(|_| anyhow!("log writer thread panicked"))?.with_context(|| format!("writing {}", self.path.display()))
    }
}

/// The strings the log repeats, made once (a `ByteArray` clone shares its bytes).
struct Names {
    states: Vec<ByteArray>,
    phases: Vec<ByteArray>,
    /// by `ErrorKind::index`
    errors: Vec<ByteArray>,
}

fn write_group(writer: &mut SerializedFileWriter<File>, recs: &[Record], names: &Names) -> Result<()> {
    let mut rg = writer.next_row_group()?;
    let n = recs.len();
    let all_def = vec![1i16; n];
    let mut col = 0;
    while let Some(mut cw) = rg.next_column()? {
        match col {
            0 => {
                let v: Vec<i64> = recs.iter().map(|r| r.user as i64).collect();
                cw.typed::<Int64Type>().write_batch(&v, None, None)?;
            }
            1 => {
                let v: Vec<i64> = recs.iter().map(|r| r.session as i64).collect();
                cw.typed::<Int64Type>().write_batch(&v, None, None)?;
            }
            2 => {
                let v: Vec<ByteArray> = recs.iter().map(|r| names.states[r.state as usize].clone()).collect();
                cw.typed::<ByteArrayType>().write_batch(&v, None, None)?;
            }
            3 => {
                // one copy per distinct path string (rows of a page share theirs), not per row
                let mut last: Option<(*const u8, ByteArray)> = None;
                let v: Vec<ByteArray> = recs
                    .iter()
                    .map(|r| match &last {
                        Some((p, b)) if *p == r.path.as_ptr() => b.clone(),
                        _ => {
                            let b = ByteArray::from(r.path.as_bytes().to_vec());
                            last = Some((r.path.as_ptr(), b.clone()));
                            b
                        }
                    })
                    .collect();
                cw.typed::<ByteArrayType>().write_batch(&v, Some(&all_def), None)?;
            }
            4 => {
                let v: Vec<i64> = recs.iter().map(|r| r.intended_ns).collect();
                cw.typed::<Int64Type>().write_batch(&v, Some(&all_def), None)?;
            }
            5 => {
                let v: Vec<i64> = recs.iter().map(|r| r.start_ns).collect();
                cw.typed::<Int64Type>().write_batch(&v, None, None)?;
            }
            6 => {
                let def: Vec<i16> = recs.iter().map(|r| (r.first_byte_ns != 0) as i16).collect();
                let v: Vec<i64> = recs.iter().filter(|r| r.first_byte_ns != 0).map(|r| r.first_byte_ns).collect();
                cw.typed::<Int64Type>().write_batch(&v, Some(&def), None)?;
            }
            7 => {
                let v: Vec<i64> = recs.iter().map(|r| r.end_ns).collect();
                cw.typed::<Int64Type>().write_batch(&v, None, None)?;
            }
            8 => {
                let v: Vec<i32> = recs.iter().map(|r| r.status as i32).collect();
                cw.typed::<Int32Type>().write_batch(&v, Some(&all_def), None)?;
            }
            9 => {
                let v: Vec<i64> = recs.iter().map(|r| r.bytes as i64).collect();
                cw.typed::<Int64Type>().write_batch(&v, Some(&all_def), None)?;
            }
            10 => {
                let def: Vec<i16> = recs.iter().map(|r| r.error.is_some() as i16).collect();
                let v: Vec<ByteArray> = recs.iter().filter_map(|r| r.error).map(|e| names.errors[e.index()].clone()).collect();
                cw.typed::<ByteArrayType>().write_batch(&v, Some(&def), None)?;
            }
            11 => {
                let v: Vec<ByteArray> = recs.iter().map(|r| names.phases[r.phase as usize].clone()).collect();
                cw.typed::<ByteArrayType>().write_batch(&v, None, None)?;
            }
            12 => {
                let def: Vec<i16> = recs.iter().map(|r| r.embedded.is_some() as i16).collect();
                let v: Vec<i32> = recs.iter().filter_map(|r| r.embedded).map(|n| n as i32).collect();
                cw.typed::<Int32Type>().write_batch(&v, Some(&def), None)?;
            }
            13 => {
                let def: Vec<i16> = recs.iter().map(|r| r.embedded.is_some() as i16).collect();
                let v: Vec<i64> = recs.iter().filter(|r| r.embedded.is_some()).map(|r| r.embedded_bytes as i64).collect();
                cw.typed::<Int64Type>().write_batch(&v, Some(&def), None)?;
            }
            14 => {
                let def: Vec<i16> = recs.iter().map(|r| r.embedded.is_some() as i16).collect();
                let v: Vec<i32> = recs.iter().filter(|r| r.embedded.is_some()).map(|r| r.embedded_failed as i32).collect();
                cw.typed::<Int32Type>().write_batch(&v, Some(&def), None)?;
            }
            _ => unreachable!(),
        }
        cw.close()?;
        col += 1;
    }
    rg.close()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_readable_file_with_nulls() {
        let dir = std::env::temp_dir().join(format!("tierscope-log-{}", std::process::id()));
        let path = dir.join("x.parquet");
        let w = LogWriter::create(&path, vec!["Home".into(), "Item".into()]).unwrap();
        let tx = w.sender();
        let p: Arc<str> = Arc::from("/index.html");
        let recs: Vec<Record> = (0..1000)
            .map(|i| Record {
                user: i % 7,
                session: i as u64,
                state: (i % 2) as u16,
                path: p.clone(),
                intended_ns: 1,
                start_ns: 2,
                first_byte_ns: if i % 3 == 0 { 0 } else { 3 },
                end_ns: 4,
                status: 200,
                bytes: 10,
                error: if i % 3 == 0 { Some(ErrorKind::Connect) } else { None },
                phase: 1,
                embedded: if i % 2 == 0 { Some(5) } else { None },
                embedded_bytes: 5000,
                embedded_failed: 1,
            })
            .collect();
        tx.send(recs).unwrap();
        drop(tx);
        assert_eq!(w.finish().unwrap(), 1000);
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let r = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        assert_eq!(r.metadata().file_metadata().num_rows(), 1000);
        assert_eq!(r.metadata().file_metadata().schema_descr().num_columns(), 15);
        let _ = std::fs::remove_dir_all(dir);
    }

    fn record(i: u64, path: &Arc<str>, error: Option<ErrorKind>) -> Record {
        let t = 1_700_000_000_000_000_000 + 22_000 * i as i64;
        Record {
            user: (i % 50) as u32,
            session: i / 7,
            state: 0,
            path: path.clone(),
            intended_ns: t,
            start_ns: t + 17,
            first_byte_ns: t + 900_000 + (i % 977) as i64,
            end_ns: t + 950_000 + (i % 1013) as i64,
            status: if error.is_some() { 0 } else { 200 },
            bytes: 745,
            error,
            phase: (i % 3) as u8,
            embedded: None,
            embedded_bytes: 0,
            embedded_failed: 0,
        }
    }

    #[test]
    fn every_error_kind_and_phase_reads_back_by_its_name() {
        let dir = std::env::temp_dir().join(format!("tierscope-log-names-{}", std::process::id()));
        let path = dir.join("x.parquet");
        let w = LogWriter::create(&path, vec!["Home".into()]).unwrap();
        let p: Arc<str> = Arc::from("/index.html");
        let recs: Vec<Record> = (0..ErrorKind::ALL.len() as u64 * 3).map(|i| record(i, &p, Some(ErrorKind::ALL[i as usize / 3]))).collect();
        w.sender().send(recs).unwrap();
        assert_eq!(w.finish().unwrap(), 24);
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let r = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        let rows: Vec<_> = r.get_row_iter(None).unwrap().map(|row| row.unwrap()).collect();
        for (i, row) in rows.iter().enumerate() {
            let get = |name: &str| row.get_column_iter().find(|(n, _)| n.as_str() == name).map(|(_, f)| f.to_string()).unwrap();
            assert_eq!(get("error"), format!("{:?}", ErrorKind::ALL[i / 3].name()), "row {i}");
            assert_eq!(get("phase"), format!("{:?}", PHASES[i % 3]), "row {i}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The writer's CPU per row (`cargo test --release -- --ignored log_writer_cost --nocapture`):
    /// a million rows as a flat-out run logs them, the wall time from the first batch sent to the
    /// file closed (the writer's thread does nearly all of it).
    #[test]
    #[ignore]
    fn log_writer_cost() {
        let dir = std::env::temp_dir().join(format!("tierscope-log-cost-{}", std::process::id()));
        let path = dir.join("x.parquet");
        let p: Arc<str> = Arc::from("/index.html");
        let n = 1u64 << 20;
        let batches: Vec<Vec<Record>> = (0..n / 4096)
            .map(|b| (b * 4096..(b + 1) * 4096).map(|i| record(i, &p, if i % 1000 == 0 { Some(ErrorKind::Timeout) } else { None })).collect())
            .collect();
        let w = LogWriter::create(&path, vec!["Home".into()]).unwrap();
        let tx = w.sender();
        let t0 = std::time::Instant::now();
        for b in batches {
            tx.send(b).unwrap();
        }
        drop(tx);
        assert_eq!(w.finish().unwrap(), n);
        let ns = t0.elapsed().as_nanos() as f64 / n as f64;
        let bytes = std::fs::metadata(&path).unwrap().len();
        println!("log writer: {ns:.0} ns per row, {:.1} bytes per row", bytes as f64 / n as f64);
        let _ = std::fs::remove_dir_all(dir);
    }
}
