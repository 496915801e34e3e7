//! The durable stream log: an append-only, checksummed, segmented log of records per stream
//! (`events` and `audit` live under `data_dir/jetstream/<stream>/`). The [`Stream`] trait
//! below is what the domain reads and writes through; in cluster mode its implementation is
//! a JetStream stream instead (`jetstream.rs`), and the rest of this header is the local log's.
//!
//! Owns the segment files of one directory and the in-memory view of them. Appends go through
//! one writer thread (`writer`) that groups concurrent appenders into one write and one
//! fdatasync and acknowledges nothing before that sync returns. Readers never block the writer
//! for longer than an index update: they copy what they need under a std `RwLock` (nothing
//! awaits while it is held) and read with `pread` on shared handles, only up to the durable
//! length, so a reader never sees a record that a crash could take back.
//!
//! Sequences start at 1 and are dense, except across damage found at open (below).
//!
//! Recovery, at [`StreamLog::open`]: every segment is scanned and every checksum verified
//! (`segment` explains why the index is rebuilt rather than stored). In the last segment, bad
//! bytes with no good record after them are a torn tail (a write that a crash cut short, never
//! acknowledged): they are truncated away with a warning and sequences continue from the last
//! good record; zeros from there to the end of the file are the space the writer allocates
//! ahead of its records (writer.rs), the end rather than a tear. Bad bytes *followed* by a
//! good record, in any segment, are damage: they are kept
//! on disk for forensics, logged as errors, listed by [`StreamLog::damaged_ranges`], and readers
//! step over them, so a reader sees a gap in sequences and never a corrupt record. A bad tail of
//! an older segment is treated the same way. Bytes that fail their checksum at read time (damage
//! that appeared after open) make that read fail with `Error::Internal`.
//!
//! The trade-off: keeping good records after bad bytes never throws away an acknowledged record,
//! but a power loss that persisted the pages of the last, unacknowledged batch out of order can
//! leave a hole followed by good records; that shows up as damage (a gap, an error in the log)
//! rather than as a quietly truncated tail.

mod crc32c;
mod frame;
pub mod jetstream;
mod segment;
mod writer;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use crate::clock;
use crate::{Error, Result};
use segment::{Cursor, HeaderState, Segment, Step};
use writer::{AppendRequest, Inbox, Writer};

pub use frame::MAX_PAYLOAD;
pub use jetstream::JetStreamLog;

/// What the events and audit streams are read and written through, whether they live in this
/// server's [`StreamLog`] or in a JetStream stream shared by a cluster ([`JetStreamLog`]).
///
/// The contract both keep: sequences start at 1, grow by one per record and are never reused;
/// retention only ever drops the oldest records, so `first_seq()..=last_seq()` is the kept
/// range. A record is acknowledged (its sequence returned) only once it is durable, and
/// [`Stream::subscribe`]'s value only moves to a sequence once `read` returns every record up
/// to it, which is what lets a reader replay, then follow live with no gap or duplicate.
#[async_trait::async_trait]
pub trait Stream: Send + Sync {
    /// The stream's name (`events`, `audit`), for messages and logs.
    fn name(&self) -> &str;

    /// Appends one record; returns its sequence once it is durable.
    async fn append(&self, timestamp_ms: i64, payload: Vec<u8>) -> Result<u64>;

    /// Appends records in order, all durable before it returns. The local log gives them
    /// consecutive sequences; a shared stream may interleave other writers' records.
    async fn append_batch(&self, items: Vec<(i64, Vec<u8>)>) -> Result<Vec<u64>>;

    /// Up to `max` records in sequence order from `from_seq` (or from the oldest kept, if
    /// retention dropped `from_seq`). Empty when `from_seq` is past the last durable record.
    async fn read(&self, from_seq: u64, max: usize) -> Result<Vec<Record>>;

    /// The first sequence whose timestamp is at or after `timestamp_ms`; `last_seq + 1` when
    /// no kept record is that recent.
    async fn seq_for_time(&self, timestamp_ms: i64) -> Result<u64>;

    /// The oldest kept sequence, or `last_seq + 1` when the stream holds no record.
    async fn first_seq(&self) -> Result<u64>;

    /// The last durable sequence; 0 before the first append.
    async fn last_seq(&self) -> Result<u64>;

    /// Bytes the stream keeps (what `max_bytes` is compared to).
    async fn bytes(&self) -> Result<u64>;

    /// A watch of the last sequence `read` is sure to return, moving on every durable append
    /// (by any writer of the stream), so a reader waits on it once it has read everything.
    fn subscribe(&self) -> watch::Receiver<u64>;

    /// Applies `max_age`/`max_bytes`; returns how many records it dropped (0 where the
    /// storage applies retention by itself).
    async fn enforce_retention(&self) -> Result<u64>;

    /// `Err(Unavailable)` when appends or reads cannot be served.
    async fn health(&self) -> Result<()>;

    /// The local log, when this is one (snapshots copy its segment files directly).
    fn local(&self) -> Option<&StreamLog> {
        None
    }
}

#[async_trait::async_trait]
impl Stream for StreamLog {
    fn name(&self) -> &str {
        &self.shared.name
    }

    async fn append(&self, timestamp_ms: i64, payload: Vec<u8>) -> Result<u64> {
        StreamLog::append(self, timestamp_ms, payload).await
    }

    async fn append_batch(&self, items: Vec<(i64, Vec<u8>)>) -> Result<Vec<u64>> {
        StreamLog::append_batch(self, items).await
    }

    async fn read(&self, from_seq: u64, max: usize) -> Result<Vec<Record>> {
        StreamLog::read(self, from_seq, max)
    }

    async fn seq_for_time(&self, timestamp_ms: i64) -> Result<u64> {
        StreamLog::seq_for_time(self, timestamp_ms)
    }

    async fn first_seq(&self) -> Result<u64> {
        Ok(StreamLog::first_seq(self))
    }

    async fn last_seq(&self) -> Result<u64> {
        Ok(StreamLog::last_seq(self))
    }

    async fn bytes(&self) -> Result<u64> {
        Ok(StreamLog::bytes(self))
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        StreamLog::subscribe(self)
    }

    async fn enforce_retention(&self) -> Result<u64> {
        StreamLog::enforce_retention(self)
    }

    async fn health(&self) -> Result<()> {
        StreamLog::health(self)
    }

    fn local(&self) -> Option<&StreamLog> {
        Some(self)
    }
}

/// Copies the records `source` keeps, as they stand now, into a new local log in `dir` (which
/// must not exist), keeping their sequences and timestamps: how a snapshot takes a stream that
/// is not a local log. Records appended while it copies are left out.
pub async fn copy_to_local(source: &dyn Stream, dir: &Path) -> Result<Arc<StreamLog>> {
    let last = source.last_seq().await?;
    let mut next = source.first_seq().await?.max(1);
    // The first segment is named after the first kept sequence, so the copy numbers its
    // records as the source does even after retention dropped the oldest.
    fs::create_dir_all(dir)?;
    writer::create_segment(dir, &dir.join(segment::file_name(next)))?;
    let log = StreamLog::open(dir, StreamConfig::default())?;
    while next <= last {
        let batch = source.read(next, 1024).await?;
        let batch: Vec<Record> = batch.into_iter().filter(|r| r.seq <= last).collect();
        let Some(end) = batch.last().map(|r| r.seq) else {
            break;
        };
        if batch[0].seq != next {
            return Err(Error::internal(format!(
                "stream {}: copy expected sequence {next}, read {}",
                source.name(),
                batch[0].seq
            )));
        }
        let count = batch.len();
        let seqs = log
            .append_batch(
                batch
                    .into_iter()
                    .map(|r| (r.timestamp_ms, r.payload))
                    .collect(),
            )
            .await?;
        if seqs.last() != Some(&end) || seqs.len() != count {
            return Err(Error::internal(format!(
                "stream {}: the copy is not dense up to {end}",
                source.name()
            )));
        }
        next = end + 1;
    }
    Ok(log)
}

/// How one stream keeps its records.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Segments whose every record is older than this (by record timestamp) may be dropped.
    pub max_age: Option<Duration>,
    /// Oldest segments are dropped while the log holds more than this many bytes.
    pub max_bytes: Option<u64>,
    /// A segment is closed and a new one started before it would grow past this size.
    pub segment_bytes: u64,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            max_age: None,
            max_bytes: None,
            segment_bytes: 64 * 1024 * 1024,
        }
    }
}

/// One stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub timestamp_ms: i64,
    pub payload: Vec<u8>,
}

/// One segment file as a snapshot takes it (see `StreamLog::snapshot`).
#[derive(Debug, Clone)]
pub struct SegmentCopy {
    /// The file name inside the stream's directory.
    pub name: String,
    pub file: Arc<File>,
    /// Bytes to copy: the durable, verified prefix.
    pub len: u64,
}

impl SegmentCopy {
    /// A reader of exactly the copied prefix (positioned reads: the handle is shared).
    pub fn reader(&self) -> impl std::io::Read + '_ {
        SegmentReader {
            copy: self,
            offset: 0,
        }
    }
}

struct SegmentReader<'a> {
    copy: &'a SegmentCopy,
    offset: u64,
}

impl std::io::Read for SegmentReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.copy.len.saturating_sub(self.offset);
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let read = self.copy.file.read_at(&mut buf[..want], self.offset)?;
        if read == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "stream segment shorter than its durable length",
            ));
        }
        self.offset += read as u64;
        Ok(read)
    }
}

/// Bytes found bad when the log opened, which readers skip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedRange {
    pub segment: PathBuf,
    pub offset: u64,
    pub length: u64,
    /// The last good sequence before the damage; the records right after it are lost.
    pub after_seq: u64,
    pub reason: &'static str,
}

/// State shared by the handle, the readers and the writer thread.
pub(crate) struct Shared {
    name: String,
    segments: RwLock<Vec<Segment>>,
    /// The last durable sequence; subscribers wait on it.
    durable: watch::Sender<u64>,
    failure: Mutex<Option<String>>,
    /// Set while the last append was refused for lack of space; cleared by the next append
    /// that succeeds, or by `health` once the filesystem has room again.
    no_space: Mutex<Option<String>>,
}

impl Shared {
    // A poisoned lock means a panic elsewhere mid-update; the data under it is still a
    // consistent prefix of durable records, so readers carry on rather than panic too.
    fn segments(&self) -> RwLockReadGuard<'_, Vec<Segment>> {
        self.segments.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn segments_mut(&self) -> RwLockWriteGuard<'_, Vec<Segment>> {
        self.segments
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_failure(&self, failure: String) {
        *self.failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(failure);
    }

    fn no_space(&self) -> Option<String> {
        self.no_space
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_no_space(&self, problem: Option<String>) {
        *self.no_space.lock().unwrap_or_else(PoisonError::into_inner) = problem;
    }
}

/// An open stream log. Dropping the last handle lets the writer finish what is queued, then
/// joins it, so the directory can be reopened right after.
pub struct StreamLog {
    shared: Arc<Shared>,
    config: StreamConfig,
    /// Where the last read stopped: (the next sequence, its segment's base, its offset). A
    /// follower at the tail reads from there instead of from the index block, which is up to
    /// `INDEX_INTERVAL` of records to decode and checksum again on every wake (issue 21: that
    /// was most of what an emit cost with the runbook trigger following the log). A segment's
    /// bytes never change while it exists, so the offset stays right as long as the segment
    /// does; a wrong one could only fail a checksum, never return another record.
    read_hint: Mutex<Option<(u64, u64, u64)>>,
    dir: PathBuf,
    inbox: Arc<Inbox>,
    writer: Option<JoinHandle<()>>,
}

impl StreamLog {
    /// Opens (creating if needed) the log in `dir`, recovering from whatever a crash left.
    ///
    /// Two processes must not open the same directory; nothing here stops them yet.
    pub fn open(dir: &Path, config: StreamConfig) -> Result<Arc<StreamLog>> {
        if config.segment_bytes == 0 {
            return Err(Error::Invalid("segment_bytes must be above zero".into()));
        }
        let name = dir
            .file_name()
            .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
        // Every directory this creates needs its entry in its parent made durable, or a crash
        // could lose the whole stream along with records acknowledged in it.
        let created: Vec<&Path> = dir.ancestors().take_while(|d| !d.is_dir()).collect();
        fs::create_dir_all(dir)?;
        for directory in created.into_iter().filter(|d| !d.as_os_str().is_empty()) {
            match directory.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => writer::sync_dir(parent)?,
                _ => writer::sync_dir(Path::new("."))?,
            }
        }
        let mut segments = recover(dir, &name)?;
        if segments.is_empty() {
            let path = dir.join(segment::file_name(1));
            let (_, reader) = writer::create_segment(dir, &path)?;
            segments.push(Segment::empty(1, path, Arc::new(reader)));
        }
        let active = segments.last().expect("an active segment was just ensured");
        let last_seq = active.last_seq;
        // Writes go at `active_len` (not O_APPEND): the file may hold allocated zeros past it.
        let active_file = OpenOptions::new().write(true).open(&active.path)?;
        let allocated = active_file.metadata()?.len().max(active.len);
        let writer_state = Writer {
            dir: dir.to_path_buf(),
            segment_bytes: config.segment_bytes,
            active: active_file,
            active_len: active.len,
            allocated,
            active_has_records: active.records > 0,
            next_seq: last_seq + 1,
            shared: Arc::new(Shared {
                name: name.clone(),
                segments: RwLock::new(segments),
                durable: watch::channel(last_seq).0,
                failure: Mutex::new(None),
                no_space: Mutex::new(None),
            }),
        };
        let shared = Arc::clone(&writer_state.shared);
        let inbox = Arc::new(Inbox::default());
        let writer_inbox = Arc::clone(&inbox);
        let writer = std::thread::Builder::new()
            .name(format!("stream-{name}"))
            .spawn(move || writer_state.run(&writer_inbox))?;
        tracing::info!(stream = %name, last_seq, "stream log open");
        Ok(Arc::new(StreamLog {
            shared,
            config,
            read_hint: Mutex::new(None),
            dir: dir.to_path_buf(),
            inbox,
            writer: Some(writer),
        }))
    }

    /// Appends one record; returns its sequence once it is on disk (fdatasync'd).
    ///
    /// If the future is dropped after the call began, the record may still be stored.
    pub async fn append(&self, timestamp_ms: i64, payload: Vec<u8>) -> Result<u64> {
        let seqs = self.append_batch(vec![(timestamp_ms, payload)]).await?;
        seqs.first()
            .copied()
            .ok_or_else(|| Error::internal("stream writer acknowledged no sequence"))
    }

    /// Appends records with consecutive sequences, all durable before it returns.
    pub async fn append_batch(&self, items: Vec<(i64, Vec<u8>)>) -> Result<Vec<u64>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        if let Some((_, payload)) = items.iter().find(|(_, p)| p.len() > MAX_PAYLOAD) {
            return Err(Error::TooLarge(format!(
                "stream record of {} bytes is above the {MAX_PAYLOAD}-byte limit",
                payload.len()
            )));
        }
        let (reply, acknowledged) = oneshot::channel();
        let closed = || Error::Unavailable(format!("stream {} is closed", self.shared.name));
        self.inbox
            .push(AppendRequest { items, reply })
            .map_err(|_| closed())?;
        acknowledged.await.map_err(|_| closed())?
    }

    /// Up to `max` records in sequence order, starting at `from_seq` (or at the oldest record
    /// still kept, if retention dropped `from_seq`; compare the first `seq` to notice). Empty
    /// when `from_seq` is past the last durable record.
    pub fn read(&self, from_seq: u64, max: usize) -> Result<Vec<Record>> {
        let mut records: Vec<Record> = Vec::new();
        // The segment scanned last (its base) and the length it had then.
        let mut previous: Option<(u64, u64)> = None;
        let hint = *self
            .read_hint
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut stopped: Option<(u64, u64, u64)> = None;
        while records.len() < max {
            let next_seq = records.last().map_or(from_seq, |record| record.seq + 1);
            let picked = {
                let segments = self.shared.segments();
                match previous {
                    None => {
                        let position = segments
                            .partition_point(|s| s.base_seq <= next_seq)
                            .saturating_sub(1);
                        segments.get(position).map(|s| {
                            let start = match hint {
                                Some((seq, base, offset))
                                    if seq == next_seq && base == s.base_seq && offset <= s.len =>
                                {
                                    offset
                                }
                                _ => s.offset_for_seq(next_seq),
                            };
                            (SegmentView::of(s), start)
                        })
                    }
                    Some((base, scanned_len)) => {
                        let position = segments.partition_point(|s| s.base_seq <= base);
                        let grown = position
                            .checked_sub(1)
                            .and_then(|p| segments.get(p))
                            .filter(|s| s.base_seq == base && s.len > scanned_len);
                        match (grown, segments.get(position)) {
                            // The segment scanned last grew after its snapshot and the writer
                            // has since rolled to the next: finish it first, or the records
                            // appended to it in between would be skipped.
                            (Some(grown), Some(_)) => Some((SegmentView::of(grown), scanned_len)),
                            (_, next) => {
                                next.map(|s| (SegmentView::of(s), s.offset_for_seq(next_seq)))
                            }
                        }
                    }
                }
            };
            let Some((view, start)) = picked else {
                break;
            };
            let last = view.scan(
                &self.shared.name,
                start,
                view.len,
                |seq, timestamp_ms, payload| {
                    if seq >= next_seq {
                        records.push(Record {
                            seq,
                            timestamp_ms,
                            payload: payload.to_vec(),
                        });
                    }
                    records.len() < max
                },
            )?;
            if let Some((seq, end)) = last {
                stopped = Some((seq + 1, view.base_seq, end));
            }
            previous = Some((view.base_seq, view.len));
        }
        if stopped.is_some() {
            *self
                .read_hint
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = stopped;
        }
        Ok(records)
    }

    /// The first sequence whose timestamp is at or after `timestamp_ms`; `last_seq() + 1` (the
    /// next one to be written) when no kept record is that recent.
    pub fn seq_for_time(&self, timestamp_ms: i64) -> Result<u64> {
        let block = {
            let segments = self.shared.segments();
            segments.iter().find_map(|segment| {
                let (start, end) = segment.block_for_time(timestamp_ms)?;
                Some((SegmentView::of(segment), start, end))
            })
        };
        let Some((view, start, end)) = block else {
            return Ok(self.last_seq() + 1);
        };
        let mut found = None;
        view.scan(&self.shared.name, start, end, |seq, record_ms, _| {
            if record_ms >= timestamp_ms {
                found = Some(seq);
            }
            found.is_none()
        })?;
        // The block's maximum timestamp came from a record in it, so this is a lost invariant.
        found.ok_or_else(|| {
            Error::internal(format!(
                "stream {}: index promised a record at or after {timestamp_ms}",
                self.shared.name
            ))
        })
    }

    /// The oldest kept sequence, or `last_seq() + 1` when the log holds no record, so
    /// `first_seq()..=last_seq()` is always the kept range.
    pub fn first_seq(&self) -> u64 {
        let segments = self.shared.segments();
        segments
            .iter()
            .find_map(|segment| segment.first_seq)
            .unwrap_or_else(|| self.last_seq() + 1)
    }

    /// The last durable sequence; 0 before the first append.
    pub fn last_seq(&self) -> u64 {
        *self.shared.durable.borrow()
    }

    /// A consistent copy of the log as it stands, for snapshots: every kept segment's file
    /// name, a read handle and its durable length, taken under one lock, and the last sequence
    /// they hold. Segments are append-only and retention only unlinks whole files (the handles
    /// stay readable), so reading each handle up to its length later, while appends go on,
    /// still gives exactly this state.
    pub fn snapshot(&self) -> (u64, Vec<SegmentCopy>) {
        let segments = self.shared.segments();
        let copies = segments
            .iter()
            .map(|segment| SegmentCopy {
                name: segment::file_name(segment.base_seq),
                file: Arc::clone(&segment.file),
                len: segment.len,
            })
            .collect();
        let last = segments.last().map_or(0, |segment| segment.last_seq);
        (last, copies)
    }

    /// Bytes on disk in kept segments (headers included), what `max_bytes` is compared to.
    pub fn bytes(&self) -> u64 {
        self.shared.segments().iter().map(|s| s.len).sum()
    }

    /// The last durable sequence, updated after each group commit and only once the records up
    /// to it are readable, so a live reader that reads up to each new value sees no gap.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.durable.subscribe()
    }

    /// Drops whole segments from the front while the oldest one is entirely older than
    /// `max_age` or the log is larger than `max_bytes`. The segment being written is always
    /// kept, so an idle stream keeps its last records. Returns how many records were dropped.
    pub fn enforce_retention(&self) -> Result<u64> {
        let oldest_kept_ms = self
            .config
            .max_age
            .map(|age| clock::now_millis().saturating_sub(age.as_millis() as i64));
        let mut dropped = Vec::new();
        {
            let mut segments = self.shared.segments_mut();
            let mut total: u64 = segments.iter().map(|s| s.len).sum();
            while segments.len() > 1 {
                let oldest = &segments[0];
                let too_old = oldest_kept_ms.is_some_and(|kept| oldest.max_timestamp_ms < kept);
                let too_big = self.config.max_bytes.is_some_and(|max| total > max);
                if !too_old && !too_big {
                    break;
                }
                total -= oldest.len;
                dropped.push(segments.remove(0));
            }
        }
        if dropped.is_empty() {
            return Ok(0);
        }
        // Readers holding a handle keep reading an unlinked segment until they finish.
        for segment in &dropped {
            match fs::remove_file(&segment.path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    return Err(error.into())
                }
                _ => {}
            }
        }
        writer::sync_dir(&self.dir)?;
        let records = dropped.iter().map(|s| s.records).sum();
        tracing::info!(stream = %self.shared.name, segments = dropped.len(), records, "retention dropped segments");
        Ok(records)
    }

    /// Fails once the writer has hit an I/O error (appends are refused until a reopen) or is
    /// gone.
    pub fn health(&self) -> Result<()> {
        if let Some(failure) = self.shared.failure() {
            return Err(Error::Unavailable(failure));
        }
        if let Some(problem) = self.shared.no_space() {
            if has_room(&self.dir) {
                self.shared.set_no_space(None);
            } else {
                return Err(Error::StorageFull(format!(
                    "stream {}: {problem}",
                    self.shared.name
                )));
            }
        }
        if self.writer.as_ref().is_none_or(|w| w.is_finished()) {
            return Err(Error::Unavailable(format!(
                "stream {} writer stopped",
                self.shared.name
            )));
        }
        Ok(())
    }

    /// Damage found at open that readers step over (see the module comment).
    pub fn damaged_ranges(&self) -> Vec<DamagedRange> {
        let segments = self.shared.segments();
        segments
            .iter()
            .flat_map(|segment| {
                segment.damage.iter().map(|damage| DamagedRange {
                    segment: segment.path.clone(),
                    offset: damage.offset,
                    length: damage.resume_offset - damage.offset,
                    after_seq: damage.after_seq,
                    reason: damage.reason,
                })
            })
            .collect()
    }
}

impl Drop for StreamLog {
    fn drop(&mut self) {
        // Closing the inbox ends the writer once the queue is drained.
        self.inbox.close();
        if let Some(writer) = self.writer.take() {
            if writer.join().is_err() {
                tracing::error!(stream = %self.shared.name, "stream writer panicked");
            }
        }
    }
}

/// What a reader copies out of a segment under the lock, so it reads after letting go.
struct SegmentView {
    file: Arc<std::fs::File>,
    base_seq: u64,
    path: PathBuf,
    len: u64,
    damage: Vec<segment::Damage>,
}

impl SegmentView {
    fn of(segment: &Segment) -> Self {
        SegmentView {
            file: Arc::clone(&segment.file),
            base_seq: segment.base_seq,
            path: segment.path.clone(),
            len: segment.len,
            damage: segment.damage.clone(),
        }
    }

    /// Calls `visit` with each record in `[start, end)`, stepping over damage known since open,
    /// until `visit` returns false. Returns the last visited record's sequence and the offset
    /// just past it.
    fn scan(
        &self,
        stream: &str,
        start: u64,
        end: u64,
        mut visit: impl FnMut(u64, i64, &[u8]) -> bool,
    ) -> Result<Option<(u64, u64)>> {
        let mut cursor = Cursor::new(&self.file, end);
        let mut offset = start;
        let mut last = None;
        loop {
            let reason = match cursor.decode_at(offset)? {
                Step::End => return Ok(last),
                Step::Record {
                    seq,
                    timestamp_ms,
                    payload,
                    len,
                } => {
                    let more = visit(seq, timestamp_ms, payload);
                    offset += len;
                    last = Some((seq, offset));
                    if !more {
                        return Ok(last);
                    }
                    continue;
                }
                Step::Incomplete => "record cut short",
                Step::Corrupt(reason) => reason,
            };
            match self.damage.iter().find(|damage| damage.offset == offset) {
                Some(damage) => offset = damage.resume_offset,
                None => {
                    return Err(Error::internal(format!(
                        "stream {stream}: {} offset {offset}: {reason}",
                        self.path.display()
                    )))
                }
            }
        }
    }
}

/// Whether the filesystem holding `dir` has room for appends again (1 MiB free), so readiness
/// can turn ok before the next append proves it.
fn has_room(dir: &Path) -> bool {
    const ROOM: u64 = 1024 * 1024;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statvfs fills the struct it is given; the path is a valid C string.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return false;
    }
    (stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64) >= ROOM
}

/// Opens every segment in `dir` in sequence order, verifying each and truncating a torn tail
/// off the last one (see the module comment for the policy).
fn recover(dir: &Path, name: &str) -> Result<Vec<Segment>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name();
        if let Some(base_seq) = file_name.to_str().and_then(segment::parse_file_name) {
            found.push((base_seq, entry.path()));
        }
    }
    found.sort_unstable();
    let count = found.len();
    let mut segments: Vec<Segment> = Vec::with_capacity(count);
    for (position, (base_seq, path)) in found.into_iter().enumerate() {
        let is_last = position + 1 == count;
        if segments
            .last()
            .is_some_and(|previous| base_seq <= previous.last_seq)
        {
            return Err(Error::internal(format!(
                "stream {name}: {} overlaps the segment before it",
                path.display()
            )));
        }
        let file = OpenOptions::new().read(true).write(is_last).open(&path)?;
        match segment::header_state(&file)? {
            HeaderState::Valid => {}
            HeaderState::Missing if is_last => {
                tracing::warn!(stream = %name, segment = %path.display(), "segment header torn by a crash; rewriting it");
                file.set_len(0)?;
                file.write_all_at(segment::MAGIC, 0)?;
                file.sync_all()?;
            }
            HeaderState::Missing => {
                // Created and then crashed before its first record: nothing in it was acknowledged.
                tracing::error!(stream = %name, segment = %path.display(), "segment has no header; skipping it");
                continue;
            }
            HeaderState::Foreign => {
                return Err(Error::internal(format!(
                    "stream {name}: {} is not a stream segment",
                    path.display()
                )))
            }
        }
        let file = Arc::new(file);
        let file_len = file.metadata()?.len();
        let scanned = segment::scan(base_seq, path.clone(), Arc::clone(&file), is_last)?;
        let mut segment = scanned.segment;
        if let Some((offset, reason)) = scanned.bad_tail {
            if is_last {
                tracing::warn!(
                    stream = %name,
                    segment = %path.display(),
                    offset,
                    dropped_bytes = file_len - offset,
                    reason,
                    last_seq = segment.last_seq,
                    "truncating the torn tail of the log"
                );
                file.set_len(offset)?;
                file.sync_all()?;
            } else {
                segment.damage.push(segment::Damage {
                    offset,
                    resume_offset: file_len,
                    after_seq: segment.last_seq,
                    reason,
                });
            }
        }
        for damage in &segment.damage {
            tracing::error!(
                stream = %name,
                segment = %path.display(),
                offset = damage.offset,
                length = damage.resume_offset - damage.offset,
                after_seq = damage.after_seq,
                reason = damage.reason,
                "damaged records in the log; readers skip them"
            );
        }
        segments.push(segment);
    }
    Ok(segments)
}

/// Recovery over random damage (proptest, bounded cases): whatever happened to the bytes,
/// opening the log never panics and never drops a record whose bytes are still intact.
#[cfg(test)]
mod prop {
    use super::*;
    use proptest::prelude::*;

    /// Each segment file's base sequence and bytes.
    type Files = Vec<(u64, Vec<u8>)>;
    /// Each record's (file index, start offset, end offset).
    type Spans = Vec<(usize, u64, u64)>;

    /// Segment files holding records 1..=payloads.len(), the second starting at `split`;
    /// returns each file's bytes and each record's (file, byte range).
    fn segments(payloads: &[Vec<u8>], split: usize) -> (Files, Spans) {
        let mut files = vec![(1u64, segment::MAGIC.to_vec())];
        let mut spans = Vec::new();
        for (index, payload) in payloads.iter().enumerate() {
            let seq = index as u64 + 1;
            if index == split && index > 0 {
                files.push((seq, segment::MAGIC.to_vec()));
            }
            let file = files.len() - 1;
            let bytes = &mut files[file].1;
            let start = bytes.len() as u64;
            frame::encode(bytes, seq, seq as i64 * 1000, payload);
            spans.push((file, start, bytes.len() as u64));
        }
        (files, spans)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn recovery_keeps_every_intact_record(
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..40),
            split in 0usize..40,
            // (which file, position as a fraction of its length, xor mask); masks are non-zero.
            flips in proptest::collection::vec((0usize..2, 0.0f64..1.0, 1u8..=255), 0..6),
            // Overwrite a run with zeros, as a torn page would.
            zeroed in proptest::option::of((0usize..2, 0.0f64..1.0, 1usize..64)),
            // Cut the last file (a torn tail).
            cut in proptest::option::of(0.0f64..1.0),
        ) {
            let (mut files, spans) = segments(&payloads, split);
            // Damaged byte ranges per file (never the 8-byte magic: that is a different
            // failure, refused at open, covered by the segment tests).
            let mut damaged: Vec<Vec<(u64, u64)>> = vec![Vec::new(); files.len()];
            for (file, at, mask) in flips {
                let Some((_, bytes)) = files.get_mut(file) else { continue };
                let room = bytes.len() - segment::MAGIC.len();
                if room == 0 { continue; }
                let position = segment::MAGIC.len() + ((at * room as f64) as usize).min(room - 1);
                bytes[position] ^= mask;
                damaged[file].push((position as u64, position as u64 + 1));
            }
            if let Some((file, at, len)) = zeroed {
                if let Some((_, bytes)) = files.get_mut(file) {
                    let room = bytes.len() - segment::MAGIC.len();
                    if room > 0 {
                        let start = segment::MAGIC.len() + ((at * room as f64) as usize).min(room - 1);
                        let end = (start + len).min(bytes.len());
                        bytes[start..end].fill(0);
                        damaged[file].push((start as u64, end as u64));
                    }
                }
            }
            let last = files.len() - 1;
            if let Some(at) = cut {
                let bytes = &mut files[last].1;
                let keep = segment::MAGIC.len()
                    + ((at * (bytes.len() - segment::MAGIC.len()) as f64) as usize);
                let keep = keep.min(bytes.len());
                damaged[last].push((keep as u64, u64::MAX));
                bytes.truncate(keep);
            }
            let dir = tempfile::tempdir().unwrap();
            for (base_seq, bytes) in &files {
                fs::write(dir.path().join(segment::file_name(*base_seq)), bytes).unwrap();
            }
            let log = StreamLog::open(dir.path(), StreamConfig::default()).unwrap();
            let records = log.read(1, 10_000).unwrap();
            let by_seq: std::collections::HashMap<u64, &Record> =
                records.iter().map(|record| (record.seq, record)).collect();
            // Whatever comes back is a record that was written, unchanged, in order.
            for pair in records.windows(2) {
                prop_assert!(pair[0].seq < pair[1].seq);
            }
            for record in &records {
                let index = record.seq as usize - 1;
                prop_assert!(index < payloads.len());
                prop_assert_eq!(&record.payload, &payloads[index]);
            }
            // Every record whose bytes nothing touched is there.
            for (index, (file, start, end)) in spans.iter().enumerate() {
                let intact = damaged[*file]
                    .iter()
                    .all(|(from, to)| *to <= *start || *from >= *end);
                if intact {
                    prop_assert!(by_seq.contains_key(&(index as u64 + 1)), "lost record {}", index + 1);
                }
            }
            drop(log);
            // Recovery is stable: a second open sees the same records.
            let again = StreamLog::open(dir.path(), StreamConfig::default()).unwrap();
            let seqs: Vec<u64> = again.read(1, 10_000).unwrap().iter().map(|r| r.seq).collect();
            prop_assert_eq!(seqs, records.iter().map(|r| r.seq).collect::<Vec<_>>());
        }
    }
}
