//! Segment files: their names and header, the cursor that decodes records out of them, and the
//! scan that verifies a segment and rebuilds its sparse index when the log opens.
//!
//! A segment is `<first seq, 20 digits>.seg`: the 8-byte magic `SVCSTRM1`, then records back to
//! back (see `frame`). Names sort in sequence order, so the directory listing is the log order.
//!
//! The index is rebuilt by scanning rather than persisted. Recovery has to read and verify the
//! last segment anyway; verifying the older ones too turns silent media damage into a log line
//! at start instead of a surprise at read time; and there is no second file to keep consistent
//! with the first. The price is an open time proportional to the retained bytes (sequential
//! reads plus CRC at disk speed). A per-segment index file written when a segment is sealed is
//! the upgrade if that ever hurts.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::frame::{self, Decoded};

/// The first bytes of every segment; the trailing digit is the format version.
pub const MAGIC: &[u8; 8] = b"SVCSTRM1";

/// Where the first record of a segment starts.
pub const FILE_HEADER_LEN: u64 = MAGIC.len() as u64;

/// One index entry per this many bytes of records: a read from any sequence or time decodes at
/// most this much before reaching its first record, and 64 MiB of segment costs 2,048 entries.
const INDEX_INTERVAL: u64 = 32 * 1024;

/// A cursor's first read is one index block plus room for the record that straddles its end,
/// so a point read costs about one block; each further read doubles, up to the maximum, so long
/// scans settle into large sequential reads.
const FIRST_READ: usize = INDEX_INTERVAL as usize + 4 * 1024;
const MAX_READ: usize = 1024 * 1024;

pub fn file_name(base_seq: u64) -> String {
    format!("{base_seq:020}.seg")
}

/// The first sequence a segment file is named after; `None` for any other file (and for 0,
/// which is never a sequence).
pub fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&seq| seq > 0)
}

/// What the first bytes of a segment file say about it.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderState {
    Valid,
    /// Shorter than the magic, or zeros where it belongs: a crash while the file was being
    /// created, before any record could have been acknowledged in it.
    Missing,
    /// Some other file that happens to have our name.
    Foreign,
}

pub fn header_state(file: &File) -> io::Result<HeaderState> {
    let mut header = [0u8; MAGIC.len()];
    if file.metadata()?.len() < FILE_HEADER_LEN {
        return Ok(HeaderState::Missing);
    }
    file.read_exact_at(&mut header, 0)?;
    Ok(if &header == MAGIC {
        HeaderState::Valid
    } else if header == [0; MAGIC.len()] {
        HeaderState::Missing
    } else {
        HeaderState::Foreign
    })
}

/// A block of records starting at `offset`, whose first record is `seq`.
#[derive(Debug, Clone, Copy)]
pub struct IndexEntry {
    pub seq: u64,
    pub offset: u64,
    /// The latest timestamp in the block. Timestamps come from callers and need not be
    /// monotonic, so time lookups use per-block maxima instead of assuming order.
    pub max_timestamp_ms: i64,
}

/// Bytes found bad at open that readers step over.
#[derive(Debug, Clone)]
pub struct Damage {
    pub offset: u64,
    /// Where the next good record starts (the file's end when none follows).
    pub resume_offset: u64,
    pub after_seq: u64,
    pub reason: &'static str,
}

/// A segment as readers see it: everything up to `len` is durable and verified.
#[derive(Debug)]
pub struct Segment {
    pub base_seq: u64,
    pub path: PathBuf,
    /// A read handle shared with readers; it stays readable after retention unlinks the file.
    pub file: Arc<File>,
    pub len: u64,
    pub first_seq: Option<u64>,
    /// `base_seq - 1` while the segment holds no record.
    pub last_seq: u64,
    pub records: u64,
    pub max_timestamp_ms: i64,
    pub index: Vec<IndexEntry>,
    pub damage: Vec<Damage>,
    /// Set after damage so the next good record starts its own index block.
    force_index_entry: bool,
}

impl Segment {
    pub fn empty(base_seq: u64, path: PathBuf, file: Arc<File>) -> Self {
        Segment {
            base_seq,
            path,
            file,
            len: FILE_HEADER_LEN,
            first_seq: None,
            last_seq: base_seq - 1,
            records: 0,
            max_timestamp_ms: i64::MIN,
            index: Vec::new(),
            damage: Vec::new(),
            force_index_entry: false,
        }
    }

    /// Accounts for one verified, durable record of `len` bytes at `offset`.
    pub fn note_record(&mut self, seq: u64, timestamp_ms: i64, offset: u64, len: u64) {
        match self.index.last_mut() {
            Some(last) if !self.force_index_entry && offset - last.offset < INDEX_INTERVAL => {
                last.max_timestamp_ms = last.max_timestamp_ms.max(timestamp_ms);
            }
            _ => self.index.push(IndexEntry {
                seq,
                offset,
                max_timestamp_ms: timestamp_ms,
            }),
        }
        self.force_index_entry = false;
        self.first_seq.get_or_insert(seq);
        self.last_seq = seq;
        self.records += 1;
        self.max_timestamp_ms = self.max_timestamp_ms.max(timestamp_ms);
        self.len = offset + len;
    }

    /// Where to start decoding to reach `seq`: the block that holds it, or the first block.
    pub fn offset_for_seq(&self, seq: u64) -> u64 {
        let blocks_at_or_before = self.index.partition_point(|entry| entry.seq <= seq);
        match blocks_at_or_before.checked_sub(1) {
            Some(block) => self.index[block].offset,
            None => FILE_HEADER_LEN,
        }
    }

    /// The byte range of the first block holding a record at or after `timestamp_ms`.
    pub fn block_for_time(&self, timestamp_ms: i64) -> Option<(u64, u64)> {
        let block = self
            .index
            .iter()
            .position(|entry| entry.max_timestamp_ms >= timestamp_ms)?;
        let end = self
            .index
            .get(block + 1)
            .map_or(self.len, |next| next.offset);
        Some((self.index[block].offset, end))
    }
}

/// One step of a [`Cursor`].
pub enum Step<'a> {
    Record {
        seq: u64,
        timestamp_ms: i64,
        payload: &'a [u8],
        len: u64,
    },
    /// The offset is exactly the end of the readable range.
    End,
    /// The readable range ends inside a record.
    Incomplete,
    Corrupt(&'static str),
}

/// Decodes records from a file up to a fixed end, reading in large chunks with `pread`, so any
/// number of readers share one handle without seeking it.
pub struct Cursor<'f> {
    file: &'f File,
    end: u64,
    buffer: Vec<u8>,
    buffer_start: u64,
    read_size: usize,
}

impl<'f> Cursor<'f> {
    pub fn new(file: &'f File, end: u64) -> Self {
        Cursor {
            file,
            end,
            buffer: Vec::new(),
            buffer_start: 0,
            read_size: FIRST_READ,
        }
    }

    /// Makes the buffer hold `[offset, offset + want)`, or as much of it as lies before `end`.
    fn fill(&mut self, offset: u64, want: usize) -> io::Result<()> {
        let buffer_end = self.buffer_start + self.buffer.len() as u64;
        let want_end = offset.saturating_add(want as u64).min(self.end);
        if offset >= self.buffer_start && want_end <= buffer_end {
            return Ok(());
        }
        let size = (self.end - offset).min(want.max(self.read_size) as u64) as usize;
        self.read_size = (self.read_size * 2).min(MAX_READ);
        // The read overwrites all `size` bytes, so the buffer only needs that length. Not
        // `resize`: at the crate's opt-level "s" its fill of the new part is a byte-at-a-time
        // loop (most of a point read's CPU: it starts from an empty buffer of 36 KiB);
        // `vec![0; n]` is one zeroed allocation.
        if self.buffer.len() < size {
            self.buffer = vec![0; size];
        } else {
            self.buffer.truncate(size);
        }
        self.file.read_exact_at(&mut self.buffer, offset)?;
        self.buffer_start = offset;
        Ok(())
    }

    fn window(&self, offset: u64) -> &[u8] {
        &self.buffer[(offset - self.buffer_start) as usize..]
    }

    pub fn decode_at(&mut self, offset: u64) -> io::Result<Step<'_>> {
        if offset >= self.end {
            return Ok(Step::End);
        }
        self.fill(offset, frame::HEADER_LEN)?;
        if let Some(len) = frame::claimed_len(self.window(offset)) {
            if len <= frame::encoded_len(frame::MAX_PAYLOAD) {
                self.fill(offset, len)?;
            }
        }
        Ok(match frame::decode(self.window(offset)) {
            Decoded::Record {
                seq,
                timestamp_ms,
                payload,
                len,
            } => Step::Record {
                seq,
                timestamp_ms,
                payload,
                len: len as u64,
            },
            Decoded::Incomplete { .. } => Step::Incomplete,
            Decoded::Corrupt(reason) => Step::Corrupt(reason),
        })
    }

    /// The first offset at or after `from` where a verified record with a sequence above
    /// `after_seq` starts. Only offsets whose claimed sequence is plausible (no further ahead
    /// than the file has room for records) pay for a checksum.
    pub fn resync(&mut self, from: u64, after_seq: u64) -> io::Result<Option<u64>> {
        let header_len = frame::HEADER_LEN as u64;
        let highest_plausible = after_seq.saturating_add(self.end / header_len + 1);
        let mut offset = from;
        while offset.saturating_add(header_len) <= self.end {
            self.fill(offset, frame::HEADER_LEN)?;
            let plausible = frame::claimed_seq(self.window(offset))
                .is_some_and(|seq| seq > after_seq && seq <= highest_plausible);
            if plausible && matches!(self.decode_at(offset)?, Step::Record { .. }) {
                return Ok(Some(offset));
            }
            offset += 1;
        }
        Ok(None)
    }
}

/// Whether every byte of `file` from `offset` to `end` is zero.
fn zeros_to_end(file: &File, offset: u64, end: u64) -> io::Result<bool> {
    let mut buffer = vec![0u8; MAX_READ];
    let mut at = offset;
    while at < end {
        let size = (end - at).min(MAX_READ as u64) as usize;
        file.read_exact_at(&mut buffer[..size], at)?;
        if buffer[..size].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at += size as u64;
    }
    Ok(true)
}

/// A verified segment and, if its end held no valid record, where the bad bytes start.
pub struct Scanned {
    pub segment: Segment,
    pub bad_tail: Option<(u64, &'static str)>,
}

/// Reads a whole segment, checking every checksum and that sequences follow each other. Bad
/// bytes followed by a good record become [`Damage`] that readers step over; bad bytes with
/// nothing good after them are reported as `bad_tail` for the caller to truncate or keep.
/// With `zero_tail_is_end` (the segment being written, whose space is allocated ahead of its
/// records), zeros from the first bad byte to the end of the file are the end, not a bad tail.
pub fn scan(
    base_seq: u64,
    path: PathBuf,
    file: Arc<File>,
    zero_tail_is_end: bool,
) -> io::Result<Scanned> {
    let file_len = file.metadata()?.len();
    let mut segment = Segment::empty(base_seq, path, Arc::clone(&file));
    let mut cursor = Cursor::new(&file, file_len);
    let mut offset = FILE_HEADER_LEN;
    let mut resuming = false;
    let bad_tail = loop {
        let reason = match cursor.decode_at(offset)? {
            Step::End => break None,
            Step::Record {
                seq,
                timestamp_ms,
                len,
                ..
            } => {
                let in_order = if resuming {
                    seq > segment.last_seq
                } else {
                    seq == segment.last_seq + 1
                };
                if in_order {
                    segment.note_record(seq, timestamp_ms, offset, len);
                    offset += len;
                    resuming = false;
                    continue;
                }
                "sequence out of order"
            }
            Step::Incomplete => "record cut short",
            Step::Corrupt(reason) => reason,
        };
        // The rest of the file never written: space the writer allocated ahead of its
        // records (see writer.rs), not damage.
        if zero_tail_is_end && zeros_to_end(&file, offset, file_len)? {
            break None;
        }
        match cursor.resync(offset + 1, segment.last_seq)? {
            Some(resume_offset) => {
                segment.damage.push(Damage {
                    offset,
                    resume_offset,
                    after_seq: segment.last_seq,
                    reason,
                });
                segment.force_index_entry = true;
                offset = resume_offset;
                resuming = true;
            }
            None => break Some((offset, reason)),
        }
    };
    Ok(Scanned { segment, bad_tail })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names() {
        let cases = [
            ("00000000000000000001.seg", Some(1)),
            ("00000000000000065536.seg", Some(65_536)),
            ("18446744073709551615.seg", Some(u64::MAX)),
            ("00000000000000000000.seg", None),
            ("0000000000000000001.seg", None),
            ("00000000000000000001.idx", None),
            ("0000000000000000000x.seg", None),
            ("99999999999999999999.seg", None),
        ];
        for (name, expected) in cases {
            assert_eq!(parse_file_name(name), expected, "{name}");
        }
        assert_eq!(file_name(65_536), "00000000000000065536.seg");
    }

    #[test]
    fn index_blocks_and_lookups() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        let mut segment = Segment::empty(10, PathBuf::from("x"), file);
        // Records of 10 KiB: a block every four records. Timestamps go back and forth.
        let timestamps = [100, 50, 300, 200, 150, 400, 120, 130, 900];
        let mut offset = FILE_HEADER_LEN;
        for (i, timestamp_ms) in timestamps.into_iter().enumerate() {
            segment.note_record(10 + i as u64, timestamp_ms, offset, 10 * 1024);
            offset += 10 * 1024;
        }
        let blocks: Vec<(u64, i64)> = segment
            .index
            .iter()
            .map(|entry| (entry.seq, entry.max_timestamp_ms))
            .collect();
        assert_eq!(blocks, [(10, 300), (14, 400), (18, 900)]);
        let seq_cases = [(1, 0), (10, 0), (13, 0), (14, 4), (17, 4), (18, 8), (99, 8)];
        for (seq, block) in seq_cases {
            let expected = FILE_HEADER_LEN + block * 10 * 1024;
            assert_eq!(segment.offset_for_seq(seq), expected, "seq {seq}");
        }
        let time_cases = [(0, Some(0)), (300, Some(0)), (301, Some(4)), (901, None)];
        for (timestamp_ms, block) in time_cases {
            let expected = block.map(|block: u64| {
                let start = FILE_HEADER_LEN + block * 10 * 1024;
                (start, (start + 40 * 1024).min(segment.len))
            });
            assert_eq!(
                segment.block_for_time(timestamp_ms),
                expected,
                "{timestamp_ms}"
            );
        }
    }
}
