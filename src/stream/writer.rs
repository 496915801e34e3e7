//! The writer thread: the only code that writes segment files, and where group commit happens.
//!
//! Appenders push their records into the `Inbox` and wait on a oneshot. The thread takes whatever
//! is queued, frames it into one buffer, writes it with one `write` and makes it durable with one
//! `fdatasync`, and only then publishes the new length to readers, moves the durable sequence
//! and answers every appender. One sync per batch is what makes throughput scale with the number
//! of concurrent appenders instead of being capped at one record per disk flush.
//!
//! It is a std thread, not a task, because it spends its life in blocking syscalls. After a
//! failed sync, or a write that failed for any reason but a full disk, it refuses everything:
//! what reached the disk is unknown, and a retried fsync can report success for pages the
//! kernel already dropped. Reopening the log (a restart) recovers from what is really on disk.
//!
//! Space ahead of the records is allocated in steps of `ALLOCATE_STEP` (fallocate, which
//! also extends the file's size), so most syncs find the size already committed and have
//! only the data and the extents' written state to make durable: on the disk measured
//! (bench/fsync_prealloc.py) that made an fdatasync after a small write about 30% cheaper.
//! The unwritten rest reads as zeros; recovery takes zeros up to the end of the last segment
//! for the end of its records (segment.rs), and a segment is cut back to its records, durably,
//! when it is sealed. Where fallocate is not supported or finds no space, the writer appends as before.
//!
//! The inbox is a queue under a mutex rather than a channel so the thread is woken once per
//! batch, not once per request: while a batch lingers for the appenders just acknowledged, a
//! channel woke it at each arrival, and on two cores every such wake-up takes CPU from the
//! appenders it is waiting for.
//!
//! A `write` refused for lack of space (ENOSPC, EDQUOT) is different: nothing of the batch was
//! synced, so the writer cuts the active segment back to its last durable length (dropping a
//! partial write), refuses that batch with `Error::StorageFull`, and takes the next batch as
//! usual. Sequences stay dense, because the refused records never got theirs. Once space is
//! freed, appends simply succeed again.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::frame;
use super::segment::{self, Segment};
use super::Shared;
use crate::{Error, Result};

/// How far ahead of its records the active segment's space is allocated, at most (never past
/// the segment's size): the space an idle stream holds beyond its records.
pub(super) const ALLOCATE_STEP: u64 = 4 * 1024 * 1024;

/// A batch stops growing at this size so one slow sync does not hold an unbounded buffer.
const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// How long a batch may wait for the appenders expected back, in durations of the last
/// commit. An appender acknowledged by a sync comes back only after its caller's own work
/// (an emit's audit row, its answer, the client's next request); measured with 16 gRPC
/// emitters on two cores (docs/performance.md, issue 21), that took longer than the half a
/// sync once allowed, so batches left with 5–6 of the 16 and each paid a sync of its own.
/// Four syncs let them gather (batches of about 10) and cut the server's CPU per emit by
/// about 15%; the wait ends as soon as they are all there.
const LINGER_SYNCS: u32 = 4;

/// The longest a batch waits for appenders expected back, whatever the sync took, so a slow
/// disk cannot stretch latency by more than this.
const MAX_LINGER: Duration = Duration::from_millis(1);

pub(super) struct AppendRequest {
    pub items: Vec<(i64, Vec<u8>)>,
    pub reply: oneshot::Sender<Result<Vec<u64>>>,
}

pub(super) struct Writer {
    pub dir: PathBuf,
    pub segment_bytes: u64,
    pub shared: Arc<Shared>,
    /// The last segment, opened for appending.
    pub active: File,
    pub active_len: u64,
    /// The active segment's size on disk: allocated, zero past `active_len`.
    pub allocated: u64,
    pub active_has_records: bool,
    pub next_seq: u64,
}

/// Where appenders leave requests for the writer thread.
#[derive(Default)]
pub(super) struct Inbox {
    state: Mutex<InboxState>,
    arrived: Condvar,
}

#[derive(Default)]
struct InboxState {
    requests: VecDeque<AppendRequest>,
    /// While the writer sleeps: how many queued requests wake it (0 while it is awake).
    wake_at: usize,
    /// No more requests are taken; the writer ends once the queue is empty.
    closed: bool,
}

impl Inbox {
    fn state(&self) -> MutexGuard<'_, InboxState> {
        // Nothing panics while holding it; if something did, the queue is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a request; gives it back if the log is closed.
    pub(super) fn push(&self, request: AppendRequest) -> Result<(), AppendRequest> {
        let mut state = self.state();
        if state.closed {
            return Err(request);
        }
        state.requests.push_back(request);
        if state.wake_at != 0 && state.requests.len() >= state.wake_at {
            state.wake_at = 0;
            self.arrived.notify_one();
        }
        Ok(())
    }

    /// Takes no more requests; the writer commits what is queued, then ends.
    pub(super) fn close(&self) {
        self.state().closed = true;
        self.arrived.notify_one();
    }

    /// Waits for a first request, then until `want` are queued or `linger_until` passes, and
    /// takes a batch of them (up to `MAX_BATCH_BYTES`, the first whatever its size). `None`
    /// once the inbox is closed and empty.
    fn take(&self, want: usize, linger_until: Instant) -> Option<Vec<AppendRequest>> {
        let mut state = self.state();
        loop {
            let queued = state.requests.len();
            if queued == 0 {
                if state.closed {
                    return None;
                }
                state.wake_at = 1;
                state = self
                    .arrived
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            let now = Instant::now();
            if queued >= want || state.closed || now >= linger_until {
                break;
            }
            state.wake_at = want;
            state = self
                .arrived
                .wait_timeout(state, linger_until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.wake_at = 0;
        let mut batch_bytes = 0;
        let mut batch = Vec::new();
        while let Some(request) = state.requests.front() {
            if !batch.is_empty() && batch_bytes >= MAX_BATCH_BYTES {
                break;
            }
            batch_bytes += request_bytes(request);
            batch.extend(state.requests.pop_front());
        }
        Some(batch)
    }

    fn queued(&self) -> usize {
        self.state().requests.len()
    }
}

/// Why a commit failed: for lack of space (the batch is refused, the log goes on), or
/// anything else (the log refuses every append until it is reopened).
enum Failure {
    NoSpace(std::io::Error),
    Fatal(Error),
}

/// A record framed into the batch buffer, remembered so readers can be told about it once it
/// is durable.
struct Framed {
    seq: u64,
    timestamp_ms: i64,
    offset: u64,
    len: u64,
}

impl Writer {
    pub fn run(mut self, inbox: &Inbox) {
        // What the last commit left behind, to decide how long the next batch may linger.
        // Appenders just acknowledged usually append again soon; a batch that left without
        // them would make them wait out a whole extra sync. So wait for the expected ones,
        // but never past `LINGER_SYNCS` syncs or `MAX_LINGER`.
        let mut expected_next = 1;
        let mut linger_until = Instant::now();
        while let Some(batch) = inbox.take(expected_next, linger_until) {
            expected_next = 1;
            if let Some(failure) = self.shared.failure() {
                reply_all(batch, &failure);
                continue;
            }
            let started = Instant::now();
            match self.commit(&batch) {
                Err(Failure::NoSpace(error)) => {
                    tracing::error!(stream = %self.shared.name, %error, "stream write refused: no space left; appends fail until space is freed");
                    // Records flushed before the failure (a batch that spanned a roll) are
                    // durable, only unacknowledged: publish them, and number on after them.
                    let durable = self.shared.segments().last().map_or(0, |s| s.last_seq);
                    self.next_seq = durable + 1;
                    self.shared.durable.send_replace(durable);
                    self.shared.set_no_space(Some(error.to_string()));
                    for request in batch {
                        let _ = request.reply.send(Err(Error::StorageFull(format!(
                            "stream {}: {error}",
                            self.shared.name
                        ))));
                    }
                }
                Err(Failure::Fatal(error)) => {
                    tracing::error!(stream = %self.shared.name, %error, "stream write failed; refusing appends until reopened");
                    let failure = format!("stream {} cannot write: {error}", self.shared.name);
                    self.shared.set_failure(failure.clone());
                    reply_all(batch, &failure);
                }
                Ok(seqs) => {
                    self.shared.set_no_space(None);
                    let linger = (started.elapsed() * LINGER_SYNCS).min(MAX_LINGER);
                    expected_next = inbox.queued() + batch.len();
                    self.shared.durable.send_replace(self.next_seq - 1);
                    for (request, seqs) in batch.into_iter().zip(seqs) {
                        // An appender that stopped waiting still has its records stored.
                        let _ = request.reply.send(Ok(seqs));
                    }
                    linger_until = Instant::now() + linger;
                }
            }
        }
    }

    /// Writes and syncs a batch, rolling segments as they fill. Returns each request's seqs.
    fn commit(&mut self, batch: &[AppendRequest]) -> Result<Vec<Vec<u64>>, Failure> {
        let mut buffer = Vec::with_capacity(batch.iter().map(request_bytes).sum());
        let mut framed = Vec::new();
        let mut seqs = Vec::with_capacity(batch.len());
        for request in batch {
            let mut request_seqs = Vec::with_capacity(request.items.len());
            for (timestamp_ms, payload) in &request.items {
                let len = frame::encoded_len(payload.len()) as u64;
                let segment_used = self.active_len + buffer.len() as u64;
                let has_records = self.active_has_records || !framed.is_empty();
                // A record larger than a whole segment still goes somewhere: alone in one.
                if has_records && segment_used + len > self.segment_bytes {
                    self.flush(&mut buffer, &mut framed)?;
                    self.roll()?;
                }
                let seq = self.next_seq;
                framed.push(Framed {
                    seq,
                    timestamp_ms: *timestamp_ms,
                    offset: self.active_len + buffer.len() as u64,
                    len,
                });
                frame::encode(&mut buffer, seq, *timestamp_ms, payload);
                self.next_seq += 1;
                request_seqs.push(seq);
            }
            seqs.push(request_seqs);
        }
        self.flush(&mut buffer, &mut framed)?;
        Ok(seqs)
    }

    /// Makes the buffered records durable in the active segment, then shows them to readers.
    fn flush(&mut self, buffer: &mut Vec<u8>, framed: &mut Vec<Framed>) -> Result<(), Failure> {
        if buffer.is_empty() {
            return Ok(());
        }
        let end = self.active_len + buffer.len() as u64;
        if end > self.allocated {
            self.allocate(end);
        }
        if let Err(error) = self.active.write_all_at(buffer, self.active_len) {
            if !crate::error::is_no_space(&error) {
                return Err(Failure::Fatal(error.into()));
            }
            // Part of the buffer may be in the file: cut it off, so the next write starts at
            // the last durable record's end. If even that fails, the file is in doubt.
            self.active
                .set_len(self.active_len)
                .map_err(|e| Failure::Fatal(e.into()))?;
            self.allocated = self.active_len;
            return Err(Failure::NoSpace(error));
        }
        // fdatasync: also persists the new file size, which is all the metadata a read needs.
        self.active
            .sync_data()
            .map_err(|e| Failure::Fatal(e.into()))?;
        self.active_len += buffer.len() as u64;
        self.active_has_records = true;
        let mut segments = self.shared.segments_mut();
        let segment = segments
            .last_mut()
            .expect("the log always has an active segment");
        for record in framed.iter() {
            segment.note_record(record.seq, record.timestamp_ms, record.offset, record.len);
        }
        buffer.clear();
        framed.clear();
        Ok(())
    }

    /// Allocates the active segment's space up to at least `end`: a step ahead, never past
    /// the segment's size unless one record is bigger. The size it sets is committed by the
    /// next sync. Best effort: without the space, writes extend the file as appends do.
    fn allocate(&mut self, end: u64) {
        let target = (self.active_len + ALLOCATE_STEP)
            .min(self.segment_bytes)
            .max(end);
        match allocate(&self.active, self.allocated, target) {
            Ok(()) => self.allocated = target,
            Err(error) => {
                tracing::debug!(stream = %self.shared.name, %error, "no space allocated ahead; appending");
                // Whatever a failed fallocate left is cut off again; a failure to cut is
                // harmless (zeros after the records), and the write below will tell.
                let _ = self.active.set_len(self.active_len);
                self.allocated = self.active_len;
            }
        }
    }

    /// Starts a new segment named after the next sequence. The file and its directory entry
    /// are synced before any record goes in, so recovery never meets a record in a file that
    /// might vanish. The sealed segment is first cut back to its records, durably: only the
    /// last segment may end in zeros (an older one's zeros are damage to recovery).
    fn roll(&mut self) -> Result<(), Failure> {
        if self.allocated > self.active_len {
            self.active
                .set_len(self.active_len)
                .and_then(|()| self.active.sync_data())
                .map_err(|e| Failure::Fatal(e.into()))?;
            self.allocated = self.active_len;
        }
        let path = self.dir.join(segment::file_name(self.next_seq));
        let (active, reader) = match create_segment(&self.dir, &path) {
            Ok(handles) => handles,
            Err(error) => {
                // No record is in it: remove it, so the next roll can create it again.
                let _ = std::fs::remove_file(&path);
                return Err(match error {
                    Error::StorageFull(message) => Failure::NoSpace(std::io::Error::other(message)),
                    other => Failure::Fatal(other),
                });
            }
        };
        self.active = active;
        self.active_len = segment::FILE_HEADER_LEN;
        self.allocated = segment::FILE_HEADER_LEN;
        self.active_has_records = false;
        let segment = Segment::empty(self.next_seq, path, Arc::new(reader));
        self.shared.segments_mut().push(segment);
        Ok(())
    }
}

/// Allocates `file`'s space from `from` to `to` (fallocate; the size becomes at least `to`).
fn allocate(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    if to <= from {
        return Ok(());
    }
    let (offset, len) = (
        libc::off_t::try_from(from).map_err(std::io::Error::other)?,
        libc::off_t::try_from(to - from).map_err(std::io::Error::other)?,
    );
    // SAFETY: fallocate on an open descriptor with a valid range; mode 0 allocates and
    // extends the size, it never touches existing data.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, offset, len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Creates an empty segment (magic only), durably. Returns a write handle and a read handle.
pub(super) fn create_segment(dir: &Path, path: &Path) -> Result<(File, File)> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)?;
    file.write_all(segment::MAGIC)?;
    file.sync_all()?;
    sync_dir(dir)?;
    let reader = File::open(path)?;
    Ok((file, reader))
}

/// Makes file creations and removals in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

fn request_bytes(request: &AppendRequest) -> usize {
    request
        .items
        .iter()
        .map(|(_, payload)| frame::encoded_len(payload.len()))
        .sum()
}

fn reply_all(batch: Vec<AppendRequest>, failure: &str) {
    for request in batch {
        let _ = request
            .reply
            .send(Err(Error::Unavailable(failure.to_string())));
    }
}
