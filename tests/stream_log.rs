//! The stream log through its public API on real files: ordering, reopen, recovery from torn and
//! corrupt bytes, retention, time lookups, concurrent appenders, and a writer killed with
//! SIGKILL. Damage is made by editing segment files the way a crash or a bad disk would.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use svc::stream::{StreamConfig, StreamLog};

/// Payloads in the damage tests are this long, so record N of a segment sits at a known offset.
const PAYLOAD_LEN: usize = 40;
const RECORD_LEN: u64 = 24 + PAYLOAD_LEN as u64;
const FILE_HEADER_LEN: u64 = 8;
/// Four records per segment.
const SMALL_SEGMENT: u64 = FILE_HEADER_LEN + 4 * RECORD_LEN;

fn config(segment_bytes: u64) -> StreamConfig {
    StreamConfig {
        max_age: None,
        max_bytes: None,
        segment_bytes,
    }
}

fn payload(seq: u64) -> Vec<u8> {
    format!("{seq:0width$}", width = PAYLOAD_LEN).into_bytes()
}

/// Appends `count` records, the payload and timestamp derived from the expected sequence.
async fn fill(log: &StreamLog, count: u64) {
    for _ in 0..count {
        let seq = log.last_seq() + 1;
        assert_eq!(
            log.append(seq as i64 * 1000, payload(seq)).await.unwrap(),
            seq
        );
    }
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "seg"))
        .collect();
    files.sort();
    files
}

fn seqs_read(log: &StreamLog, from: u64, max: usize) -> Vec<u64> {
    let records = log.read(from, max).unwrap();
    for record in &records {
        assert_eq!(
            record.payload,
            payload(record.seq),
            "payload of {}",
            record.seq
        );
        assert_eq!(record.timestamp_ms, record.seq as i64 * 1000);
    }
    records.iter().map(|record| record.seq).collect()
}

fn edit_file(path: &Path, edit: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(path).unwrap();
    edit(&mut bytes);
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn replay_order_across_segments_and_reopen_continues() {
    let dir = tempfile::tempdir().unwrap();
    let log = StreamLog::open(dir.path(), config(SMALL_SEGMENT)).unwrap();
    assert_eq!((log.first_seq(), log.last_seq()), (1, 0));
    fill(&log, 30).await;
    assert_eq!(segment_files(dir.path()).len(), 8);
    let cases: [(u64, usize, Vec<u64>); 7] = [
        (1, 1000, (1..=30).collect()),
        (0, 3, vec![1, 2, 3]),
        (4, 2, vec![4, 5]),
        (7, 6, (7..=12).collect()),
        (29, 10, vec![29, 30]),
        (31, 10, vec![]),
        (5, 0, vec![]),
    ];
    for (from, max, expected) in &cases {
        assert_eq!(
            &seqs_read(&log, *from, *max),
            expected,
            "read({from}, {max})"
        );
    }
    let bytes = log.bytes();
    drop(log);

    let log = StreamLog::open(dir.path(), config(SMALL_SEGMENT)).unwrap();
    assert_eq!(
        (log.first_seq(), log.last_seq(), log.bytes()),
        (1, 30, bytes)
    );
    for (from, max, expected) in &cases {
        assert_eq!(
            &seqs_read(&log, *from, *max),
            expected,
            "after reopen read({from}, {max})"
        );
    }
    fill(&log, 3).await;
    assert_eq!(seqs_read(&log, 29, 10), [29, 30, 31, 32, 33]);
    log.health().unwrap();
}

/// The writer allocates a segment's space ahead of its records: the zeros past them are the
/// end of the log on reopen (no damage, nothing truncated), and a sealed segment holds its
/// records only.
#[tokio::test]
async fn space_allocated_ahead_is_read_as_the_end_and_cut_at_a_roll() {
    let dir = tempfile::tempdir().unwrap();
    let segment_bytes = FILE_HEADER_LEN + 100 * RECORD_LEN;
    let log = StreamLog::open(dir.path(), config(segment_bytes)).unwrap();
    fill(&log, 10).await;
    let files = segment_files(dir.path());
    assert_eq!(files.len(), 1);
    let len = std::fs::metadata(&files[0]).unwrap().len();
    assert!(
        len > FILE_HEADER_LEN + 10 * RECORD_LEN && len <= segment_bytes,
        "{len}"
    );
    drop(log);

    let log = StreamLog::open(dir.path(), config(segment_bytes)).unwrap();
    assert_eq!(log.last_seq(), 10);
    assert!(log.damaged_ranges().is_empty());
    assert_eq!(log.bytes(), FILE_HEADER_LEN + 10 * RECORD_LEN);
    fill(&log, 150).await;
    let files = segment_files(dir.path());
    assert_eq!(files.len(), 2);
    assert_eq!(std::fs::metadata(&files[0]).unwrap().len(), segment_bytes);
    assert_eq!(seqs_read(&log, 1, 1000), (1..=160).collect::<Vec<_>>());
    drop(log);
    let log = StreamLog::open(dir.path(), config(segment_bytes)).unwrap();
    assert_eq!(seqs_read(&log, 1, 1000), (1..=160).collect::<Vec<_>>());
    assert!(log.damaged_ranges().is_empty());
}

#[tokio::test]
async fn batches_get_consecutive_sequences_and_limits_hold() {
    let dir = tempfile::tempdir().unwrap();
    let log = StreamLog::open(dir.path(), config(SMALL_SEGMENT)).unwrap();
    let items = (1..=10)
        .map(|seq| (seq as i64 * 1000, payload(seq)))
        .collect();
    assert_eq!(
        log.append_batch(items).await.unwrap(),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        log.append_batch(Vec::new()).await.unwrap(),
        Vec::<u64>::new()
    );
    let too_large = vec![0; svc::stream::MAX_PAYLOAD + 1];
    assert!(matches!(
        log.append(0, too_large).await,
        Err(svc::Error::TooLarge(_))
    ));
    // A record bigger than a segment gets a segment of its own.
    let big = vec![9; 4 * SMALL_SEGMENT as usize];
    assert_eq!(log.append(11_000, big.clone()).await.unwrap(), 11);
    assert_eq!(log.read(11, 1).unwrap()[0].payload, big);
    assert_eq!(seqs_read(&log, 1, 10), (1..=10).collect::<Vec<_>>());
    assert!(matches!(
        StreamLog::open(&dir.path().join("other"), config(0)),
        Err(svc::Error::Invalid(_))
    ));
}

#[tokio::test]
async fn torn_tail_is_truncated_and_sequences_continue() {
    // How the tail of the one segment is damaged after ten good records.
    type Damage = fn(&mut Vec<u8>);
    let cases: [(&str, Damage, u64); 7] = [
        ("last byte cut", |b| b.truncate(b.len() - 1), 9),
        (
            "cut inside the last header",
            |b| b.truncate(b.len() - 50),
            9,
        ),
        (
            "cut into the record before",
            |b| b.truncate(b.len() - 70),
            8,
        ),
        (
            "crash left zeros past the end",
            |b| b.extend_from_slice(&[0; 4096]),
            10,
        ),
        (
            "half a record of garbage",
            |b| b.extend_from_slice(&[0xA5; 30]),
            10,
        ),
        (
            "last payload byte flipped",
            |b| *b.last_mut().unwrap() ^= 1,
            9,
        ),
        (
            "torn record in allocated space",
            |b| {
                b.extend_from_slice(&[0xA5; 30]);
                b.extend_from_slice(&[0; 8192]);
            },
            10,
        ),
    ];
    for (name, damage, expected_last) in cases {
        let dir = tempfile::tempdir().unwrap();
        let log = StreamLog::open(dir.path(), config(1 << 20)).unwrap();
        fill(&log, 10).await;
        drop(log);
        let segment = &segment_files(dir.path())[0];
        // The writer allocates space ahead of its records (zeros); the damage is made to the
        // records, so cut that space off first.
        let records_end = FILE_HEADER_LEN + 10 * RECORD_LEN;
        assert!(
            std::fs::metadata(segment).unwrap().len() > records_end,
            "{name}: allocated ahead"
        );
        edit_file(segment, |b| b.truncate(records_end as usize));
        edit_file(segment, damage);

        let log = StreamLog::open(dir.path(), config(1 << 20)).unwrap();
        assert_eq!(log.last_seq(), expected_last, "{name}");
        assert_eq!(
            seqs_read(&log, 1, 100),
            (1..=expected_last).collect::<Vec<_>>(),
            "{name}"
        );
        assert!(log.damaged_ranges().is_empty(), "{name}");
        let expected_len = FILE_HEADER_LEN + expected_last * RECORD_LEN;
        assert_eq!(log.bytes(), expected_len, "{name}: the tail is truncated");
        fill(&log, 2).await;
        drop(log);

        let log = StreamLog::open(dir.path(), config(1 << 20)).unwrap();
        let all = (1..=expected_last + 2).collect::<Vec<_>>();
        assert_eq!(
            seqs_read(&log, 1, 100),
            all,
            "{name}: after appending past the repair"
        );
    }
}

#[tokio::test]
async fn crash_while_creating_a_segment() {
    // What the newest segment file holds when the crash came before its header was durable.
    let cases: [(&str, &[u8], bool); 4] = [
        ("empty file", b"", true),
        ("part of the magic", b"SVC", true),
        ("zeros", &[0; 8], true),
        ("someone else's file", b"GIF89a\x01\x02", false),
    ];
    for (name, content, recovers) in cases {
        let dir = tempfile::tempdir().unwrap();
        let log = StreamLog::open(dir.path(), config(1 << 20)).unwrap();
        fill(&log, 10).await;
        drop(log);
        std::fs::write(dir.path().join("00000000000000000011.seg"), content).unwrap();

        let opened = StreamLog::open(dir.path(), config(1 << 20));
        if !recovers {
            assert!(matches!(opened, Err(svc::Error::Internal(_))), "{name}");
            continue;
        }
        let log = opened.unwrap();
        assert_eq!(log.last_seq(), 10, "{name}");
        fill(&log, 2).await;
        drop(log);
        let log = StreamLog::open(dir.path(), config(1 << 20)).unwrap();
        assert_eq!(
            seqs_read(&log, 1, 100),
            (1..=12).collect::<Vec<_>>(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn damage_before_good_records_is_skipped_not_truncated() {
    // (record whose payload gets a flipped byte, segments holding 4 records each)
    let cases = [
        ("middle of an older segment", 2),
        ("first record of an older segment", 5),
        ("last record of an older segment", 8),
        ("middle of the last segment", 18),
    ];
    for (name, damaged_seq) in cases {
        let dir = tempfile::tempdir().unwrap();
        let log = StreamLog::open(dir.path(), config(SMALL_SEGMENT)).unwrap();
        fill(&log, 20).await;
        drop(log);
        let segment = (damaged_seq - 1) / 4;
        let offset = FILE_HEADER_LEN + (damaged_seq - 1) % 4 * RECORD_LEN + 30;
        edit_file(&segment_files(dir.path())[segment as usize], |b| {
            b[offset as usize] ^= 0x10
        });

        let log = StreamLog::open(dir.path(), config(SMALL_SEGMENT)).unwrap();
        let damage = log.damaged_ranges();
        assert_eq!(damage.len(), 1, "{name}");
        assert_eq!(damage[0].after_seq, damaged_seq - 1, "{name}");
        let expected: Vec<u64> = (1..=20).filter(|&seq| seq != damaged_seq).collect();
        assert_eq!(seqs_read(&log, 1, 100), expected, "{name}");
        assert_eq!(seqs_read(&log, damaged_seq, 1), [damaged_seq + 1], "{name}");
        assert_eq!(log.last_seq(), 20, "{name}");
        log.health().unwrap();
        fill(&log, 1).await;
        assert_eq!(seqs_read(&log, 20, 5), [20, 21], "{name}");
    }
}

#[tokio::test]
async fn corruption_found_by_a_read_is_an_error_not_a_record() {
    let dir = tempfile::tempdir().unwrap();
    let log = StreamLog::open(dir.path(), config(SMALL_SEGMENT)).unwrap();
    fill(&log, 8).await;
    // Bit rot after open: the first segment was verified already, so the read must catch it.
    edit_file(&segment_files(dir.path())[0], |b| {
        b[FILE_HEADER_LEN as usize + 30] ^= 1
    });
    assert!(matches!(log.read(1, 10), Err(svc::Error::Internal(_))));
    assert_eq!(seqs_read(&log, 5, 10), [5, 6, 7, 8]);
}

#[tokio::test]
async fn retention_by_age_drops_whole_old_segments() {
    let dir = tempfile::tempdir().unwrap();
    let hour = Duration::from_secs(3600);
    let retention = StreamConfig {
        max_age: Some(hour),
        ..config(SMALL_SEGMENT)
    };
    let log = StreamLog::open(dir.path(), retention).unwrap();
    let now = svc::clock::now_millis();
    let two_hours_ago = now - 2 * hour.as_millis() as i64;
    for i in 0..12 {
        let timestamp_ms = if i < 8 { two_hours_ago } else { now };
        log.append(timestamp_ms, payload(i + 1)).await.unwrap();
    }
    assert_eq!(segment_files(dir.path()).len(), 3);
    assert_eq!(log.enforce_retention().unwrap(), 8);
    assert_eq!(log.enforce_retention().unwrap(), 0);
    assert_eq!(segment_files(dir.path()).len(), 1);
    assert_eq!((log.first_seq(), log.last_seq()), (9, 12));
    let seqs: Vec<u64> = log.read(1, 100).unwrap().iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [9, 10, 11, 12]);
    assert_eq!(log.seq_for_time(0).unwrap(), 9);
}

#[tokio::test]
async fn retention_by_bytes_keeps_the_newest_segments() {
    // (max_bytes, records dropped, first seq kept); 20 records make 5 full segments.
    let cases = [
        (u64::MAX, 0, 1),
        (5 * SMALL_SEGMENT, 0, 1),
        (5 * SMALL_SEGMENT - 1, 4, 5),
        (2 * SMALL_SEGMENT + 10, 12, 13),
        (0, 16, 17),
    ];
    for (max_bytes, dropped, first) in cases {
        let dir = tempfile::tempdir().unwrap();
        let retention = StreamConfig {
            max_bytes: Some(max_bytes),
            ..config(SMALL_SEGMENT)
        };
        let log = StreamLog::open(dir.path(), retention).unwrap();
        fill(&log, 20).await;
        assert_eq!(
            log.enforce_retention().unwrap(),
            dropped,
            "max_bytes {max_bytes}"
        );
        assert_eq!(log.first_seq(), first, "max_bytes {max_bytes}");
        assert_eq!(
            log.bytes(),
            (20 - dropped) / 4 * SMALL_SEGMENT,
            "{max_bytes}"
        );
        assert_eq!(seqs_read(&log, 1, 1), [first], "max_bytes {max_bytes}");
        drop(log);
        let log = StreamLog::open(dir.path(), config(SMALL_SEGMENT)).unwrap();
        assert_eq!(
            (log.first_seq(), log.last_seq()),
            (first, 20),
            "{max_bytes} reopened"
        );
    }
}

#[tokio::test]
async fn read_from_time() {
    let dir = tempfile::tempdir().unwrap();
    // Small segments and enough records that lookups cross index blocks and segments.
    let log = StreamLog::open(dir.path(), config(64 * 1024)).unwrap();
    for chunk in (1..=3000u64).collect::<Vec<_>>().chunks(500) {
        let items = chunk
            .iter()
            .map(|&seq| (seq as i64 * 10, vec![1; 100]))
            .collect();
        log.append_batch(items).await.unwrap();
    }
    // A clock that stepped back: seq 3001 is older than everything before it.
    log.append(5, vec![2]).await.unwrap();
    let cases = [
        (i64::MIN, 1),
        (0, 1),
        (5, 1),
        (10, 1),
        (11, 2),
        (24_000, 2400),
        (24_001, 2401),
        (30_000, 3000),
        (30_001, 3002),
    ];
    for (timestamp_ms, expected) in cases {
        assert_eq!(
            log.seq_for_time(timestamp_ms).unwrap(),
            expected,
            "{timestamp_ms}"
        );
    }
    let from = log.seq_for_time(29_995).unwrap();
    let records = log.read(from, 10).unwrap();
    let times: Vec<i64> = records.iter().map(|r| r.timestamp_ms).collect();
    assert_eq!(times, [30_000, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appenders_get_dense_unique_sequences() {
    const TASKS: u64 = 16;
    const PER_TASK: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let log = StreamLog::open(dir.path(), config(16 * 1024)).unwrap();

    // A live reader that follows the durable sequence must see every record, in order.
    let mut durable = log.subscribe();
    let follower_log = Arc::clone(&log);
    let follower = tokio::spawn(async move {
        let mut seen = Vec::new();
        while (seen.len() as u64) < TASKS * PER_TASK {
            durable.changed().await.unwrap();
            let last = *durable.borrow_and_update();
            let next = seen.last().map_or(1, |seq| seq + 1);
            let records = follower_log.read(next, usize::MAX).unwrap();
            // Dense from where it left off: a gap would leave this loop waiting for ever.
            for (record, expected) in records.iter().zip(next..) {
                assert_eq!(record.seq, expected, "read from {next} skipped records");
            }
            // Everything up to the announced sequence is readable (more may be by now).
            let read_up_to = records.last().map_or(next - 1, |r| r.seq);
            assert!(
                read_up_to >= last,
                "announced {last}, read up to {read_up_to}"
            );
            seen.extend(records.iter().map(|r| r.seq));
        }
        seen
    });

    let appenders: Vec<_> = (0..TASKS)
        .map(|task| {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..PER_TASK {
                    let body = format!("task {task} record {i}").into_bytes();
                    acked.push((log.append(i as i64, body.clone()).await.unwrap(), body));
                }
                acked
            })
        })
        .collect();
    let mut acked = BTreeMap::new();
    for appender in appenders {
        for (seq, body) in appender.await.unwrap() {
            assert!(
                acked.insert(seq, body).is_none(),
                "seq {seq} acknowledged twice"
            );
        }
    }
    let total = TASKS * PER_TASK;
    assert_eq!(
        acked.keys().copied().collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>()
    );
    let stored = log.read(1, usize::MAX).unwrap();
    assert_eq!(stored.len() as u64, total);
    for record in stored {
        assert_eq!(acked[&record.seq], record.payload, "seq {}", record.seq);
    }
    assert_eq!(follower.await.unwrap(), (1..=total).collect::<Vec<_>>());
}

/// A reader racing the writer across segment rolls: every read from 1 is dense. The reader
/// snapshots one segment at a time, and the writer can append to that segment and roll to the
/// next before the reader moves on; those records must not be skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_segment_rolls_skip_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Small segments: a roll every few batches.
    let log = StreamLog::open(dir.path(), config(4 * 1024)).unwrap();
    let writer_log = Arc::clone(&log);
    let writer = tokio::spawn(async move {
        for round in 0..2000i64 {
            let batch = (0..8).map(|i| (round, payload(i as u64))).collect();
            writer_log.append_batch(batch).await.unwrap();
        }
    });
    // More readers than cores, so some are preempted between two segments of one read.
    let written = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let reader_log = Arc::clone(&log);
            let written = Arc::clone(&written);
            std::thread::spawn(move || {
                let mut reads = 0;
                loop {
                    let done = written.load(std::sync::atomic::Ordering::Acquire);
                    let last = reader_log.last_seq();
                    // From just behind the end, so most reads straddle the segment being written.
                    let from = last.saturating_sub(12).max(1);
                    let records = reader_log.read(from, usize::MAX).unwrap();
                    for (record, expected) in records.iter().zip(from..) {
                        assert_eq!(
                            record.seq, expected,
                            "read {reads} from {from} skipped records"
                        );
                    }
                    assert!(records.last().map_or(0, |r| r.seq) >= last);
                    reads += 1;
                    if done {
                        return reads;
                    }
                }
            })
        })
        .collect();
    let finished = writer.await;
    written.store(true, std::sync::atomic::Ordering::Release);
    finished.unwrap();
    for reader in readers {
        assert!(reader.join().unwrap() > 1);
    }
    assert_eq!(log.last_seq(), 8 * 2000);
}

/// Set in the child process of the SIGKILL test; names the log directory it writes to.
const CHILD_DIR_VAR: &str = "SVC_STREAM_TEST_KILL_CHILD_DIR";

/// The child side of `sigkill_loses_no_acknowledged_record`: does nothing in a normal test run.
/// With the variable set it appends from four tasks until killed, printing each acknowledgement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_child_writer() {
    let Some(dir) = std::env::var_os(CHILD_DIR_VAR) else {
        return;
    };
    let log = StreamLog::open(Path::new(&dir), config(64 * 1024)).unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|task| {
            let log = Arc::clone(&log);
            // Bounded so a child whose parent vanished cannot run forever; a closed stdout
            // also ends it, since println! panics then.
            tokio::spawn(async move {
                for i in 0..200_000u64 {
                    let seq = log.append(i as i64, child_payload(task, i)).await.unwrap();
                    println!("ack {seq} {task} {i}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

fn child_payload(task: u64, i: u64) -> Vec<u8> {
    format!("task {task} record {i} {}", "x".repeat((i % 97) as usize)).into_bytes()
}

#[tokio::test]
async fn sigkill_loses_no_acknowledged_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "sigkill_child_writer",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_VAR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut acked = BTreeMap::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        let Some(fields) = line.strip_prefix("ack ") else {
            continue;
        };
        let numbers: Vec<u64> = fields.split(' ').map(|n| n.parse().unwrap()).collect();
        acked.insert(numbers[0], (numbers[1], numbers[2]));
        if acked.len() >= 400 {
            break;
        }
    }
    // std's kill is SIGKILL: no destructor, flush or exit handler runs in the child.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(acked.len(), 400, "the child stopped acknowledging early");

    let log = StreamLog::open(dir.path(), config(64 * 1024)).unwrap();
    assert!(log.last_seq() >= *acked.keys().last().unwrap());
    for (&seq, &(task, i)) in &acked {
        let record = log.read(seq, 1).unwrap();
        assert_eq!(record[0].seq, seq);
        assert_eq!(record[0].payload, child_payload(task, i), "seq {seq}");
    }
    let everything = log.read(1, usize::MAX).unwrap();
    let seqs: Vec<u64> = everything.iter().map(|r| r.seq).collect();
    assert_eq!(
        seqs,
        (1..=log.last_seq()).collect::<Vec<_>>(),
        "dense after recovery"
    );
    let next = log.append(0, b"after the crash".to_vec()).await.unwrap();
    assert_eq!(next, log.last_seq());
    assert_eq!(next, seqs.len() as u64 + 1);
}

/// A snapshot taken while appends go on: its copies, written into a new directory, open as a
/// log holding exactly the records up to the snapshot's sequence, also after retention has
/// unlinked copied segments from the original.
#[tokio::test]
async fn a_snapshot_is_the_log_as_it_stood() {
    let dir = tempfile::tempdir().unwrap();
    let log = StreamLog::open(dir.path(), config(SMALL_SEGMENT)).unwrap();
    fill(&log, 18).await;
    let (last, copies) = log.snapshot();
    assert_eq!(last, 18);
    assert_eq!(copies.len(), 5, "four full segments and the active one");
    fill(&log, 10).await;
    // Retention unlinks the oldest files; the snapshot's handles still read them.
    for path in segment_files(dir.path()).iter().take(3) {
        std::fs::remove_file(path).unwrap();
    }

    let restored = tempfile::tempdir().unwrap();
    for copy in &copies {
        let mut out = std::fs::File::create(restored.path().join(&copy.name)).unwrap();
        let copied = std::io::copy(&mut copy.reader(), &mut out).unwrap();
        assert_eq!(copied, copy.len);
    }
    let reopened = StreamLog::open(restored.path(), config(SMALL_SEGMENT)).unwrap();
    assert_eq!((reopened.first_seq(), reopened.last_seq()), (1, 18));
    assert!(reopened.damaged_ranges().is_empty());
    assert_eq!(seqs_read(&reopened, 1, 100), (1..=18).collect::<Vec<_>>());
    // And it goes on from there.
    fill(&reopened, 2).await;
    assert_eq!(reopened.last_seq(), 20);
}

/// A follower at the tail (what a live subscriber does): every read continues where the last
/// one stopped (issue 21), through segment rolls, retention dropping the segment it stopped
/// in, damage right after where it stopped, and other readers moving the read position.
#[tokio::test]
async fn reads_that_continue_at_the_tail_see_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = config(SMALL_SEGMENT);
    settings.max_bytes = Some(3 * SMALL_SEGMENT);
    let log = StreamLog::open(dir.path(), settings).unwrap();
    let mut next = 1;
    for round in 0..40u64 {
        fill(&log, round % 3 + 1).await;
        // Another reader elsewhere in the log moves the read position in between.
        if round % 5 == 0 {
            let _ = log.read(log.first_seq(), 2).unwrap();
        }
        if round % 7 == 6 {
            log.enforce_retention().unwrap();
        }
        loop {
            let records = log.read(next, 1 + (round % 2) as usize).unwrap();
            let Some(last) = records.last() else { break };
            for record in &records {
                assert_eq!(record.seq, next, "round {round}");
                assert_eq!(record.payload, payload(record.seq));
                next += 1;
            }
            assert_eq!(last.seq, next - 1);
        }
        assert_eq!(next, log.last_seq() + 1, "round {round}");
    }
    // The position kept by a read must not outlive the segment it points into.
    let old_first = log.first_seq();
    assert!(old_first > 1, "retention dropped old segments");
    assert_eq!(seqs_read(&log, old_first, 2), [old_first, old_first + 1]);
    fill(&log, 12).await;
    assert!(log.enforce_retention().unwrap() > 0);
    let first = log.first_seq();
    assert!(first > old_first + 2, "{first}");
    assert_eq!(seqs_read(&log, old_first + 2, 1), [first]);

    // Damage just past where a read stopped: found at reopen, stepped over by the next read.
    // Segments hold 4 records from 1, 5, 9, ...: fill the newest one up, then damage its
    // second record, which good ones follow.
    fill(&log, 4 + (4 - log.last_seq() % 4) % 4).await;
    let last = log.last_seq();
    drop(log);
    let files = segment_files(dir.path());
    let newest = files.last().unwrap();
    assert_eq!(std::fs::metadata(newest).unwrap().len(), SMALL_SEGMENT);
    let damaged = last - 2;
    edit_file(newest, |b| {
        b[(FILE_HEADER_LEN + RECORD_LEN + 30) as usize] ^= 0x10
    });
    let log = StreamLog::open(dir.path(), config(SMALL_SEGMENT)).unwrap();
    let before = damaged - 1;
    assert_eq!(seqs_read(&log, before, 1), [before]);
    let rest: Vec<u64> = (damaged + 1..=last).collect();
    assert_eq!(seqs_read(&log, damaged, 100), rest);
}
