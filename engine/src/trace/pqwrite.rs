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
    ColumnChunk, ColumnMetaData, ColumnOrder, CompressionCodec, DataPageHeader, DictionaryPageHeader, Encoding, FileMetaData,
    PageHeader, PageType, RowGroup, SchemaElement, Statistics, Type, TypeDefinedOrder,
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
                delta_binary_packed(v, &mut self.body);
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

/// Runs shorter than this stay in bit-packed groups: a run header costs as much as a few values.
const MIN_RUN: usize = 16;

/// RLE/bit-packed hybrid encoding of `values` at `width` bits (without the length prefix).
/// Runs of at least `MIN_RUN` equal values become RLE runs; everything between them is bit
/// packed in groups of 8, borrowing the first values of the following run to fill the last group.
pub fn rle_hybrid<T: Copy + Eq + Into<u64>>(values: &[T], width: u32, out: &mut Vec<u8>) {
    let n = values.len();
    if width == 0 {
        // every value is 0: one run, whatever its length (no zero-width bit packing for readers to trip on)
        if n > 0 {
            rle_run(0, n, 0, out);
        }
        return;
    }
    let mut literal_start = 0;
    let mut i = 0;
    while i < n {
        let v = values[i];
        let mut j = i + 1;
        while j < n && values[j] == v {
            j += 1;
        }
        if j - i >= MIN_RUN {
            let pad = (8 - (i - literal_start) % 8) % 8;
            bit_packed(&values[literal_start..i + pad], width, out);
            rle_run(v.into(), j - i - pad, width, out);
            literal_start = j;
        }
        i = j;
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
pub fn delta_binary_packed(values: &[i64], out: &mut Vec<u8>) {
    uleb128(out, DELTA_BLOCK as u64);
    uleb128(out, DELTA_MINIBLOCKS as u64);
    uleb128(out, values.len() as u64);
    zigzag(out, values.first().copied().unwrap_or(0));
    let mut deltas = [0i64; DELTA_BLOCK];
    let mut rest = values;
    while rest.len() > 1 {
        let n = (rest.len() - 1).min(DELTA_BLOCK);
        for k in 0..n {
            deltas[k] = rest[k + 1].wrapping_sub(rest[k]);
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
