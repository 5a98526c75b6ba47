//! A small Parquet writer for tables whose caller already knows its dictionaries.
//!
//! The parquet crate's column writers take values one by one, hash every string again to build
//! their dictionaries and hold each byte array behind a refcount; for the tracer, which has
//! interned its strings already, that was most of the cost of writing a row. This writer takes
//! whole columns in their encoded form instead (dictionary indices, integers, plain bytes) and
//! writes one uncompressed data page per column chunk (format v1 pages, which every reader takes);
//! the file metadata uses the thrift structs of `parquet::format`, as the crate's own writer does,
//! so the footer is the same but for the encodings chosen.
//!
//! Encodings: dictionary indices and definition levels as RLE/bit-packed hybrid, integers that
//! are not from a small set as DELTA_BINARY_PACKED (times and byte counts compress to their
//! deltas' width without a general-purpose codec), the rest PLAIN.

use std::io::Write;
use std::sync::Arc;

use parquet::format::{
    ColumnChunk, ColumnMetaData, ColumnOrder, CompressionCodec, DataPageHeader, DictionaryPageHeader, Encoding, FileMetaData, PageHeader, PageType,
    RowGroup, SchemaElement, Statistics, Type, TypeDefinedOrder,
};
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::{to_thrift, SchemaDescriptor};
use parquet::thrift::{TCompactOutputProtocol, TSerializable};

const MAGIC: &[u8; 4] = b"PAR1";

/// What one leaf column of the schema is, as the writer checks it.
struct Leaf {
    name: String,
    physical: Type,
    optional: bool,
}

/// How the values of a column chunk are given.
pub enum Values<'a> {
    /// indices into a dictionary whose values are given PLAIN encoded (`dict`, `len` entries)
    Dict { dict: &'a [u8], len: usize, indices: &'a [u32] },
    /// integers, written DELTA_BINARY_PACKED (INT32 and INT64 columns)
    Delta(&'a [i64]),
    /// already PLAIN encoded values (`count` of them)
    Plain { bytes: &'a [u8], count: usize },
}

pub struct FileWriter<W: Write> {
    out: W,
    pos: u64,
    schema: Vec<SchemaElement>,
    leaves: Vec<Leaf>,
    created_by: String,
    row_groups: Vec<RowGroup>,
    /// the row group being written: its columns so far, first byte and row count
    columns: Vec<ColumnChunk>,
    group_start: u64,
    group_rows: usize,
    /// reused encoding buffers
    body: Vec<u8>,
    scratch: Vec<u8>,
    header: Vec<u8>,
}

impl<W: Write> FileWriter<W> {
    /// Start a file with the schema given in Parquet's message syntax.
    pub fn new(mut out: W, message: &str, created_by: String) -> anyhow::Result<Self> {
        let root = Arc::new(parse_message_type(message)?);
        let descr = SchemaDescriptor::new(root.clone());
        let leaves = descr
            .columns()
            .iter()
            .map(|c| Leaf { name: c.name().to_string(), physical: c.physical_type().into(), optional: c.max_def_level() > 0 })
            .collect();
        out.write_all(MAGIC)?;
        Ok(FileWriter {
            out,
            pos: MAGIC.len() as u64,
            schema: to_thrift(&root)?,
            leaves,
            created_by,
            row_groups: Vec::new(),
            columns: Vec::new(),
            group_start: 0,
            group_rows: 0,
            body: Vec::new(),
            scratch: Vec::new(),
            header: Vec::new(),
        })
    }

    pub fn begin_row_group(&mut self, rows: usize) {
        debug_assert!(self.columns.is_empty(), "row group not ended");
        self.group_start = self.pos;
        self.group_rows = rows;
    }

    /// Write the next column of the row group. `defs` holds one definition level (0 null, 1
    /// present) per row for optional columns, None for required ones; `values` holds the present
    /// values only. `min_max` becomes the chunk's statistics (integer columns).
    pub fn column(&mut self, defs: Option<&[u8]>, values: Values, min_max: Option<(i64, i64)>) -> anyhow::Result<()> {
        let leaf = &self.leaves[self.columns.len()];
        anyhow::ensure!(leaf.optional == defs.is_some(), "column {}: definition levels do not match the schema", leaf.name);
        if let Some(d) = defs {
            anyhow::ensure!(d.len() == self.group_rows, "column {}: {} levels for {} rows", leaf.name, d.len(), self.group_rows);
        }
        let present = defs.map_or(self.group_rows, |d| d.iter().filter(|&&l| l != 0).count());
        let count = match values {
            Values::Dict { indices, .. } => indices.len(),
            Values::Delta(v) => v.len(),
            Values::Plain { count, .. } => count,
        };
        anyhow::ensure!(count == present, "column {}: {count} values for {present} present", leaf.name);
        let (physical, path) = (leaf.physical, vec![leaf.name.clone()]);
        let start = self.pos;
        let mut dictionary_page_offset = None;
        let mut encodings = vec![Encoding::RLE];

        // The data page: [definition levels: u32 length, hybrid] then the values.
        self.body.clear();
        if let Some(d) = defs {
            self.scratch.clear();
            rle_hybrid(d, 1, &mut self.scratch);
            self.body.extend_from_slice(&(self.scratch.len() as u32).to_le_bytes());
            self.body.extend_from_slice(&self.scratch);
        }
        let encoding = match values {
            Values::Dict { dict, len, indices } => {
                dictionary_page_offset = Some(start as i64);
                let dict_header = DictionaryPageHeader { num_values: len as i32, encoding: Encoding::PLAIN, is_sorted: None };
                self.page(PageType::DICTIONARY_PAGE, None, Some(dict_header), dict)?;
                let width = bit_width(len.saturating_sub(1) as u64);
                self.body.push(width as u8);
                rle_hybrid(indices, width, &mut self.body);
                encodings.extend([Encoding::PLAIN, Encoding::RLE_DICTIONARY]);
                Encoding::RLE_DICTIONARY
            }
            Values::Delta(v) => {
                anyhow::ensure!(matches!(physical, Type::INT32 | Type::INT64), "delta encoding for a non-integer column");
                delta_binary_packed(v, physical == Type::INT32, &mut self.body);
                encodings.push(Encoding::DELTA_BINARY_PACKED);
                Encoding::DELTA_BINARY_PACKED
            }
            Values::Plain { bytes, .. } => {
                self.body.extend_from_slice(bytes);
                encodings.push(Encoding::PLAIN);
                Encoding::PLAIN
            }
        };
        let data_page_offset = self.pos as i64;
        let data_header = DataPageHeader {
            num_values: self.group_rows as i32,
            encoding,
            definition_level_encoding: Encoding::RLE,
            repetition_level_encoding: Encoding::RLE,
            statistics: None,
        };
        let body = std::mem::take(&mut self.body);
        let written = self.page(PageType::DATA_PAGE, Some(data_header), None, &body);
        self.body = body;
        written?;

        let size = (self.pos - start) as i64;
        let statistics = min_max.map(|(lo, hi)| {
            let (lo, hi) = match physical {
                Type::INT32 => ((lo as i32).to_le_bytes().to_vec(), (hi as i32).to_le_bytes().to_vec()),
                _ => (lo.to_le_bytes().to_vec(), hi.to_le_bytes().to_vec()),
            };
            Statistics {
                max: Some(hi.clone()),
                min: Some(lo.clone()),
                null_count: Some(0),
                distinct_count: None,
                max_value: Some(hi),
                min_value: Some(lo),
                is_max_value_exact: Some(true),
                is_min_value_exact: Some(true),
            }
        });
        let meta = ColumnMetaData::new(
            physical,
            encodings,
            path,
            CompressionCodec::UNCOMPRESSED,
            self.group_rows as i64,
            size,
            size,
            None,
            data_page_offset,
            None,
            dictionary_page_offset,
            statistics,
            None,
            None,
            None,
            None,
        );
        self.columns.push(ColumnChunk::new(None, 0, meta, None, None, None, None, None, None));
        Ok(())
    }

    /// Write one uncompressed page: its thrift header, then its bytes.
    fn page(&mut self, kind: PageType, data: Option<DataPageHeader>, dict: Option<DictionaryPageHeader>, body: &[u8]) -> anyhow::Result<()> {
        let size = i32::try_from(body.len()).map_err(|_| anyhow::anyhow!("page of {} bytes is too large", body.len()))?;
        let header = PageHeader::new(kind, size, size, None, data, None, dict, None);
        self.header.clear();
        header.write_to_out_protocol(&mut TCompactOutputProtocol::new(&mut self.header))?;
        self.out.write_all(&self.header)?;
        self.out.write_all(body)?;
        self.pos += (self.header.len() + body.len()) as u64;
        Ok(())
    }

    pub fn end_row_group(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.columns.len() == self.leaves.len(), "row group has {} of {} columns", self.columns.len(), self.leaves.len());
        let size = (self.pos - self.group_start) as i64;
        self.row_groups.push(RowGroup {
            columns: std::mem::take(&mut self.columns),
            total_byte_size: size,
            num_rows: self.group_rows as i64,
            sorting_columns: None,
            file_offset: Some(self.group_start as i64),
            total_compressed_size: Some(size),
            ordinal: Some(self.row_groups.len() as i16),
        });
        Ok(())
    }

    /// Write the footer and hand back the sink.
    pub fn finish(mut self) -> anyhow::Result<W> {
        anyhow::ensure!(self.columns.is_empty(), "row group not ended");
        let meta = FileMetaData {
            version: 1,
            schema: std::mem::take(&mut self.schema),
            num_rows: self.row_groups.iter().map(|g| g.num_rows).sum(),
            row_groups: std::mem::take(&mut self.row_groups),
            key_value_metadata: None,
            created_by: Some(std::mem::take(&mut self.created_by)),
            // every column's statistics use its type's own order (signed integers)
            column_orders: Some(self.leaves.iter().map(|_| ColumnOrder::TYPEORDER(TypeDefinedOrder {})).collect()),
            encryption_algorithm: None,
            footer_signing_key_metadata: None,
        };
        let mut footer = Vec::new();
        meta.write_to_out_protocol(&mut TCompactOutputProtocol::new(&mut footer))?;
        self.out.write_all(&footer)?;
        self.out.write_all(&(footer.len() as u32).to_le_bytes())?;
        self.out.write_all(MAGIC)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Bits needed to store `max`.
pub fn bit_width(max: u64) -> u32 {
    64 - max.leading_zeros()
}

/// Packs values of a fixed bit width, least significant bit first (Parquet's bit packing).
struct BitPacker<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    bits: u32,
}

impl<'a> BitPacker<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        BitPacker { out, acc: 0, bits: 0 }
    }

    /// Append the low `width` bits of `v` (the caller guarantees `v < 2^width`, `width <= 64`).
    #[inline]
    fn put(&mut self, v: u64, width: u32) {
        if width == 0 {
            return;
        }
        self.acc |= v << self.bits;
        let total = self.bits + width;
        if total >= 64 {
            self.out.extend_from_slice(&self.acc.to_le_bytes());
            self.bits = total - 64;
            // the high bits of v that did not fit in the word just written
            self.acc = if self.bits == 0 { 0 } else { v >> (width - self.bits) };
        } else {
            self.bits = total;
        }
    }

    /// Write the partial last word, whole bytes only.
    fn finish(self) {
        let n = self.bits.div_ceil(8) as usize;
        self.out.extend_from_slice(&self.acc.to_le_bytes()[..n]);
    }
}

fn uleb128(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(out: &mut Vec<u8>, v: i64) {
    uleb128(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Runs shorter than this many groups of 8 stay bit packed: a run header costs as much as a few values.
const MIN_RUN_GROUPS: usize = 2;

/// RLE/bit-packed hybrid encoding of `values` at `width` bits (without the length prefix).
/// The values are taken in groups of 8 (the bit-packed unit): consecutive groups of one repeated
/// value become an RLE run, the groups between runs are bit packed. Looking at whole groups
/// rather than at each value keeps the branches predictable on columns whose values alternate;
/// a run that starts or ends inside a group leaves at most 7 values on either side bit packed.
pub fn rle_hybrid<T: Copy + Eq + Into<u64>>(values: &[T], width: u32, out: &mut Vec<u8>) {
    if width == 0 {
        // every value is 0: one run, whatever its length (no zero-width bit packing for readers to trip on)
        if !values.is_empty() {
            rle_run(0, values.len(), 0, out);
        }
        return;
    }
    let uniform = |g: &[T]| g.iter().fold(0u64, |acc, &x| acc | (x.into() ^ g[0].into())) == 0;
    let full = values.len() / 8;
    let mut literal_start = 0;
    let mut g = 0;
    while g < full {
        let group = &values[g * 8..g * 8 + 8];
        if !uniform(group) {
            g += 1;
            continue;
        }
        let v = group[0];
        let mut h = g + 1;
        while h < full && uniform(&values[h * 8..h * 8 + 8]) && values[h * 8] == v {
            h += 1;
        }
        if h - g >= MIN_RUN_GROUPS {
            bit_packed(&values[literal_start..g * 8], width, out);
            rle_run(v.into(), (h - g) * 8, width, out);
            literal_start = h * 8;
        }
        g = h;
    }
    bit_packed(&values[literal_start..], width, out);
}

fn rle_run(v: u64, len: usize, width: u32, out: &mut Vec<u8>) {
    uleb128(out, (len as u64) << 1);
    out.extend_from_slice(&v.to_le_bytes()[..width.div_ceil(8) as usize]);
}

/// One bit-packed run of `values`, padded with zeros to a multiple of 8 values.
fn bit_packed<T: Copy + Into<u64>>(values: &[T], width: u32, out: &mut Vec<u8>) {
    if values.is_empty() {
        return;
    }
    let groups = values.len().div_ceil(8);
    uleb128(out, ((groups as u64) << 1) | 1);
    let mut p = BitPacker::new(out);
    for &v in values {
        p.put(v.into(), width);
    }
    for _ in values.len()..groups * 8 {
        p.put(0, width);
    }
    p.finish();
}

const DELTA_BLOCK: usize = 128;
const DELTA_MINIBLOCKS: usize = 4;
const DELTA_MINIBLOCK: usize = DELTA_BLOCK / DELTA_MINIBLOCKS;

/// DELTA_BINARY_PACKED encoding: the first value, then blocks of 128 deltas stored as their
/// offset from the block's smallest delta, in 4 miniblocks of 32 each packed at its own width.
/// The deltas of an INT32 column wrap at 32 bits, as its readers compute them.
pub fn delta_binary_packed(values: &[i64], int32: bool, out: &mut Vec<u8>) {
    uleb128(out, DELTA_BLOCK as u64);
    uleb128(out, DELTA_MINIBLOCKS as u64);
    uleb128(out, values.len() as u64);
    zigzag(out, values.first().copied().unwrap_or(0));
    let mut deltas = [0i64; DELTA_BLOCK];
    let mut rest = values;
    while rest.len() > 1 {
        let n = (rest.len() - 1).min(DELTA_BLOCK);
        for k in 0..n {
            deltas[k] = if int32 { (rest[k + 1] as i32).wrapping_sub(rest[k] as i32) as i64 } else { rest[k + 1].wrapping_sub(rest[k]) };
        }
        rest = &rest[n..];
        let block = &deltas[..n];
        let min = *block.iter().min().expect("block is not empty");
        zigzag(out, min);
        let mut widths = [0u32; DELTA_MINIBLOCKS];
        for (m, mini) in block.chunks(DELTA_MINIBLOCK).enumerate() {
            let max = mini.iter().map(|d| d.wrapping_sub(min) as u64).max().unwrap_or(0);
            widths[m] = bit_width(max);
        }
        out.extend(widths.iter().map(|&w| w as u8));
        for (m, mini) in block.chunks(DELTA_MINIBLOCK).enumerate() {
            let mut p = BitPacker::new(out);
            for &d in mini {
                p.put(d.wrapping_sub(min) as u64, widths[m]);
            }
            // a partial last miniblock is padded to its full size
            for _ in mini.len()..DELTA_MINIBLOCK {
                p.put(0, widths[m]);
            }
            p.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    const SCHEMA: &str = "message t {
      REQUIRED INT64 d;
      REQUIRED INT32 p;
      OPTIONAL BYTE_ARRAY s (UTF8);
      REQUIRED INT64 q;
      REQUIRED BOOLEAN b;
    }";

    /// Integers that exercise every delta width: steps, constants, full-range jumps.
    fn deltas(rng: &mut SmallRng, n: usize, kind: usize) -> Vec<i64> {
        let mut x: i64 = rng.gen();
        (0..n)
            .map(|i| match kind % 4 {
                0 => {
                    x = x.wrapping_add(rng.gen_range(0..5000));
                    x
                }
                1 => 42,
                2 => rng.gen(),
                _ => [i64::MIN, i64::MAX, 0, -1][i % 4],
            })
            .collect()
    }

    /// Dictionary indices below `len`, in runs of random length (1 to 40).
    fn indices(rng: &mut SmallRng, n: usize, len: usize) -> Vec<u32> {
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let (x, run) = (rng.gen_range(0..len) as u32, rng.gen_range(1..40usize));
            v.extend(std::iter::repeat_n(x, run.min(n - v.len())));
        }
        v
    }

    #[test]
    fn columns_read_back_through_the_parquet_crate() {
        let mut rng = SmallRng::seed_from_u64(7);
        let path = std::env::temp_dir().join(format!("tierscope-pqwrite-{}.parquet", std::process::id()));
        let mut w = FileWriter::new(std::io::BufWriter::new(std::fs::File::create(&path).unwrap()), SCHEMA, "test".into()).unwrap();
        let mut expected: Vec<Vec<Field>> = Vec::new();
        for (g, &rows) in [1usize, 2, 7, 8, 9, 16, 17, 127, 128, 129, 1000, 5000, 70_000].iter().enumerate() {
            let d = deltas(&mut rng, rows, g);
            let p: Vec<i64> = deltas(&mut rng, rows, g).iter().map(|&v| v as i32 as i64).collect();
            let texts: Vec<String> = (0..[1, 2, 300][g % 3]).map(|i| format!("text {i}")).collect();
            let defs: Vec<u8> = (0..rows).map(|i| if g % 2 == 0 { (i % 3 != 0) as u8 } else { 1 }).collect();
            let s_idx = indices(&mut rng, defs.iter().filter(|&&l| l == 1).count(), texts.len());
            let q_dict: Vec<i64> = (0..rows.min(70_000) as i64).map(|i| i * 1_000_003 - 5).collect();
            let q_idx = indices(&mut rng, rows, q_dict.len());
            let b: Vec<bool> = (0..rows).map(|_| rng.gen()).collect();

            let mut s_plain = Vec::new();
            for t in &texts {
                s_plain.extend_from_slice(&(t.len() as u32).to_le_bytes());
                s_plain.extend_from_slice(t.as_bytes());
            }
            let q_plain: Vec<u8> = q_dict.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut b_plain = vec![0u8; rows.div_ceil(8)];
            for (i, &x) in b.iter().enumerate() {
                b_plain[i / 8] |= (x as u8) << (i % 8);
            }
            w.begin_row_group(rows);
            w.column(None, Values::Delta(&d), Some((*d.iter().min().unwrap(), *d.iter().max().unwrap()))).unwrap();
            w.column(None, Values::Delta(&p), None).unwrap();
            w.column(Some(&defs), Values::Dict { dict: &s_plain, len: texts.len(), indices: &s_idx }, None).unwrap();
            w.column(None, Values::Dict { dict: &q_plain, len: q_dict.len(), indices: &q_idx }, None).unwrap();
            w.column(None, Values::Plain { bytes: &b_plain, count: rows }, None).unwrap();
            w.end_row_group().unwrap();

            let mut s = s_idx.iter();
            for i in 0..rows {
                let text = if defs[i] == 1 { Field::Str(texts[*s.next().unwrap() as usize].clone()) } else { Field::Null };
                expected.push(vec![Field::Long(d[i]), Field::Int(p[i] as i32), text, Field::Long(q_dict[q_idx[i] as usize]), Field::Bool(b[i])]);
            }
        }
        w.finish().unwrap();

        let r = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let got: Vec<Vec<Field>> =
            r.get_row_iter(None).unwrap().map(|row| row.unwrap().get_column_iter().map(|(_, f)| f.clone()).collect()).collect();
        assert_eq!(got.len(), expected.len());
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, e, "row {i}");
        }
        let stats = r.metadata().row_group(0).column(0).statistics().expect("statistics").clone();
        assert!(stats.min_bytes_opt().is_some());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_file_without_rows_is_valid() {
        let path = std::env::temp_dir().join(format!("tierscope-pqwrite-empty-{}.parquet", std::process::id()));
        let w = FileWriter::new(std::fs::File::create(&path).unwrap(), SCHEMA, "test".into()).unwrap();
        w.finish().unwrap();
        let r = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        assert_eq!(r.metadata().file_metadata().num_rows(), 0);
        assert_eq!(r.metadata().file_metadata().schema_descr().num_columns(), 5);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn hybrid_runs_and_groups() {
        // a mixed group of 8 bit packed (3 bytes at 3 bits), then three uniform groups as one run
        let mut out = Vec::new();
        let v: Vec<u32> = [1, 2, 3].into_iter().chain(std::iter::repeat_n(5, 29)).collect();
        rle_hybrid(&v, 3, &mut out);
        assert_eq!(out.len(), 1 + 3 + 2);
        assert_eq!(out[0], (1 << 1) | 1);
        assert_eq!(&out[4..], &[24 << 1, 5]);
    }
}
