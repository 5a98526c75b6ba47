//! What the drivers measure: per operation type a count, an error count and an HDR histogram of
//! latencies in µs; optionally one row per operation, written to Parquet at the end.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int32Type, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use serde_json::{json, Map, Value};

/// Nanoseconds since the Unix epoch, now.
pub fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// an intended rollback (TPC-C New-Order with an unused item): counted as done
    Rollback,
    Error,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Rollback => "rollback",
            Outcome::Error => "error",
        }
    }
}

/// One operation as logged; times in ns since the Unix epoch.
#[derive(Clone, Copy, Debug)]
pub struct OpRecord {
    pub thread: u32,
    pub op: u8,
    pub intended_ns: i64,
    pub start_ns: i64,
    pub end_ns: i64,
    pub outcome: Outcome,
}

/// Counts and latency histograms per operation type (one per thread, merged at the end).
pub struct Stats {
    pub names: Vec<&'static str>,
    pub count: Vec<u64>,
    pub rollbacks: Vec<u64>,
    pub errors: Vec<u64>,
    pub hist: Vec<Histogram<u64>>,
    /// the first error message of each operation type
    pub first_error: Vec<Option<String>>,
    /// per-operation rows (only when a log is asked for)
    pub records: Option<Vec<OpRecord>>,
}

impl Stats {
    pub fn new(names: &[&'static str], keep_records: bool) -> Stats {
        let n = names.len();
        Stats {
            names: names.to_vec(),
            count: vec![0; n],
            rollbacks: vec![0; n],
            errors: vec![0; n],
            hist: (0..n).map(|_| Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")).collect(),
            first_error: vec![None; n],
            records: if keep_records { Some(Vec::new()) } else { None },
        }
    }

    /// Record one finished operation; `latency_us` is what the summary's percentiles are of.
    pub fn record(&mut self, op: usize, latency_us: u64, outcome: Outcome) {
        match outcome {
            Outcome::Error => self.errors[op] += 1,
            Outcome::Rollback => {
                self.rollbacks[op] += 1;
                self.count[op] += 1;
                self.hist[op].saturating_record(latency_us.max(1));
            }
            Outcome::Ok => {
                self.count[op] += 1;
                self.hist[op].saturating_record(latency_us.max(1));
            }
        }
    }

    /// Keep the first error message of operation `op`.
    pub fn note_error(&mut self, op: usize, msg: impl FnOnce() -> String) {
        if self.first_error[op].is_none() {
            self.first_error[op] = Some(msg());
        }
    }

    pub fn merge(&mut self, mut other: Stats) {
        for i in 0..self.names.len() {
            self.count[i] += other.count[i];
            self.rollbacks[i] += other.rollbacks[i];
            self.errors[i] += other.errors[i];
            self.hist[i].add(&other.hist[i]).expect("same histogram bounds");
            if self.first_error[i].is_none() {
                self.first_error[i] = other.first_error[i].take();
            }
        }
        if let (Some(mine), Some(theirs)) = (self.records.as_mut(), other.records) {
            mine.extend(theirs);
        }
    }

    pub fn total_ok(&self) -> u64 {
        self.count.iter().sum()
    }

    pub fn total_errors(&self) -> u64 {
        self.errors.iter().sum()
    }

    /// The percentile `q` (0..100) of operation `op`, µs (0 when none was recorded).
    pub fn percentile_us(&self, op: usize, q: f64) -> u64 {
        if self.hist[op].is_empty() {
            0
        } else {
            self.hist[op].value_at_quantile(q / 100.0)
        }
    }

    /// `{NAME: {count, errors, rollbacks, mean_us, p50_us, p90_us, p99_us, max_us}}` for the
    /// operation types that ran.
    pub fn per_op_json(&self) -> Value {
        let mut m = Map::new();
        for (i, name) in self.names.iter().enumerate() {
            if self.count[i] == 0 && self.errors[i] == 0 {
                continue;
            }
            let h = &self.hist[i];
            let mut o = json!({
                "count": self.count[i],
                "errors": self.errors[i],
                "mean_us": if h.is_empty() { 0.0 } else { (h.mean() * 10.0).round() / 10.0 },
                "p50_us": self.percentile_us(i, 50.0),
                "p90_us": self.percentile_us(i, 90.0),
                "p99_us": self.percentile_us(i, 99.0),
                "max_us": if h.is_empty() { 0 } else { h.max() },
            });
            if let Some(e) = &self.first_error[i] {
                o["first_error"] = json!(e);
            }
            if self.rollbacks[i] > 0 {
                o["rollbacks"] = json!(self.rollbacks[i]);
            }
            m.insert(name.to_string(), o);
        }
        Value::Object(m)
    }
}

/// CPU seconds (user, system) this process has used so far.
pub fn cpu_seconds() -> (f64, f64) {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0.0, 0.0);
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

const SCHEMA: &str = "message oltp_ops {
  required int32 thread;
  required binary op (UTF8);
  required int64 intended_ns;
  required int64 start_ns;
  required int64 end_ns;
  required int64 latency_us;
  required binary status (UTF8);
}";

/// Write the per-operation rows to `path` (Parquet, snappy); returns the number of rows.
/// `latency_us` is from the intended start when `from_intended`, else from the actual start.
pub fn write_ops(path: &Path, names: &[&'static str], recs: &mut [OpRecord], from_intended: bool, creator: &str) -> Result<u64> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create directory", path.display()))?;
        }
    }
    recs.sort_by_key(|r| r.start_ns);
    let file = File::create(path).with_context(|| format!("{}: cannot create", path.display()))?;
    let schema = Arc::new(parse_message_type(SCHEMA)?);
    let props = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).set_created_by(creator.into()).build());
    let mut writer = SerializedFileWriter::new(file, schema, props)?;
    let op_names: Vec<ByteArray> = names.iter().map(|n| ByteArray::from(*n)).collect();
    for chunk in recs.chunks(128 * 1024) {
        let mut rg = writer.next_row_group()?;
        let mut col = 0;
        while let Some(mut cw) = rg.next_column()? {
            match col {
                0 => {
                    let v: Vec<i32> = chunk.iter().map(|r| r.thread as i32).collect();
                    cw.typed::<Int32Type>().write_batch(&v, None, None)?;
                }
                1 => {
                    let v: Vec<ByteArray> = chunk.iter().map(|r| op_names[r.op as usize].clone()).collect();
                    cw.typed::<ByteArrayType>().write_batch(&v, None, None)?;
                }
                2..=5 => {
                    let v: Vec<i64> = chunk
                        .iter()
                        .map(|r| match col {
                            2 => r.intended_ns,
                            3 => r.start_ns,
                            4 => r.end_ns,
                            _ => (r.end_ns - if from_intended { r.intended_ns } else { r.start_ns }) / 1000,
                        })
                        .collect();
                    cw.typed::<Int64Type>().write_batch(&v, None, None)?;
                }
                6 => {
                    let v: Vec<ByteArray> = chunk.iter().map(|r| ByteArray::from(r.outcome.name())).collect();
                    cw.typed::<ByteArrayType>().write_batch(&v, None, None)?;
                }
                _ => unreachable!(),
            }
            cw.close()?;
            col += 1;
        }
        rg.close()?;
    }
    writer.close()?;
    Ok(recs.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_merge() {
        let mut a = Stats::new(&["READ", "UPDATE"], true);
        let mut b = Stats::new(&["READ", "UPDATE"], true);
        for i in 1..=100u64 {
            a.record(0, i * 10, Outcome::Ok);
        }
        b.record(1, 5, Outcome::Error);
        b.record(1, 7, Outcome::Rollback);
        a.merge(b);
        assert_eq!(a.count, vec![100, 1]);
        assert_eq!(a.errors, vec![0, 1]);
        let p90 = a.percentile_us(0, 90.0);
        assert!((899..=901).contains(&p90), "{p90}");
        let j = a.per_op_json();
        assert_eq!(j["UPDATE"]["rollbacks"], 1);
        assert_eq!(j["READ"]["max_us"], 1000);
    }

    #[test]
    fn writes_parquet() {
        let dir = std::env::temp_dir().join(format!("tierscope-oltp-{}", std::process::id()));
        let path = dir.join("ops.parquet");
        let mut recs: Vec<OpRecord> = (0..1000)
            .map(|i| OpRecord {
                thread: i % 4,
                op: (i % 2) as u8,
                intended_ns: i as i64 * 1000,
                start_ns: i as i64 * 1000 + 5,
                end_ns: i as i64 * 1000 + 9000,
                outcome: Outcome::Ok,
            })
            .collect();
        assert_eq!(write_ops(&path, &["READ", "UPDATE"], &mut recs, true, "test").unwrap(), 1000);
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let r = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        assert_eq!(r.metadata().file_metadata().num_rows(), 1000);
        let _ = std::fs::remove_dir_all(dir);
    }
}
