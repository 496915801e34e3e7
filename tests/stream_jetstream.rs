//! The JetStream-backed stream (`svc::stream::JetStreamLog`) against real nats-server 2.9.10
//! processes on loopback: what the local log's tests check where it applies (dense sequences,
//! reads, time lookups, batches, retention), two "servers" appending to one stream through two
//! different NATS nodes of a 3-node cluster, Events over it (emit on one, list/get/follow on
//! the other, the replay→live seam under concurrent emits), and a replicated stream that
//! loses a node to SIGKILL. Skipped (with a printed line) without nats-server.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::nats_cluster::NatsCluster;
use svc::events::{Event, Events, Filter, NewEvent};
use svc::stream::{JetStreamLog, Stream, StreamConfig};

async fn connect(urls: &[String]) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(urls)
        .await
        .unwrap()
}

async fn open(client: &async_nats::Client, name: &str, replicas: usize) -> Arc<JetStreamLog> {
    JetStreamLog::open(client.clone(), name, &StreamConfig::default(), replicas)
        .await
        .unwrap()
}

async fn read_all(log: &dyn Stream) -> Vec<svc::stream::Record> {
    let mut records = Vec::new();
    let mut next = 1;
    loop {
        let batch = log.read(next, 700).await.unwrap();
        let Some(last) = batch.last() else { break };
        next = last.seq + 1;
        records.extend(batch);
    }
    records
}

async fn wait_for(watch: &mut tokio::sync::watch::Receiver<u64>, seq: u64) {
    let reached = tokio::time::timeout(Duration::from_secs(20), watch.wait_for(|v| *v >= seq))
        .await
        .map(|r| r.map(|_| ()));
    match reached {
        Ok(result) => result.unwrap(),
        Err(_) => panic!("watch stuck at {} below {seq}", *watch.borrow()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_reads_and_time_lookups_on_one_node() {
    let Some(nats) = NatsCluster::start(1).await else {
        return;
    };
    let client = connect(&nats.urls()).await;
    let log = open(&client, "events", 1).await;
    let log: &dyn Stream = log.as_ref();
    assert_eq!(log.name(), "events");
    assert_eq!(log.last_seq().await.unwrap(), 0);
    assert_eq!(log.first_seq().await.unwrap(), 1);
    assert!(log.read(1, 10).await.unwrap().is_empty());
    assert_eq!(log.seq_for_time(0).await.unwrap(), 1);
    log.health().await.unwrap();

    let base = svc::clock::now_millis() - 60_000;
    for i in 1..=10u64 {
        let seq = log
            .append(base + i as i64 * 1000, format!("r{i}").into_bytes())
            .await
            .unwrap();
        assert_eq!(seq, i, "dense sequences from 1");
    }
    let records = log.read(1, 100).await.unwrap();
    assert_eq!(records.len(), 10);
    for (i, record) in records.iter().enumerate() {
        let n = i as u64 + 1;
        assert_eq!(record.seq, n);
        assert_eq!(
            record.timestamp_ms,
            base + n as i64 * 1000,
            "time from Svc-Ts"
        );
        assert_eq!(record.payload, format!("r{n}").into_bytes());
    }
    let middle = log.read(4, 3).await.unwrap();
    assert_eq!(
        middle.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![4, 5, 6]
    );
    assert!(log.read(11, 5).await.unwrap().is_empty());
    assert_eq!(log.first_seq().await.unwrap(), 1);
    assert_eq!(log.last_seq().await.unwrap(), 10);
    assert!(log.bytes().await.unwrap() > 0);
    // At or after: exact hits, between two records, before all, after all.
    assert_eq!(log.seq_for_time(base + 3000).await.unwrap(), 3);
    assert_eq!(log.seq_for_time(base + 3500).await.unwrap(), 4);
    assert_eq!(log.seq_for_time(base - 10_000_000).await.unwrap(), 1);
    assert_eq!(
        log.seq_for_time(svc::clock::now_millis() + 60_000)
            .await
            .unwrap(),
        11
    );

    // A batch keeps its order and, with one writer, consecutive sequences.
    let items: Vec<(i64, Vec<u8>)> = (0..1500)
        .map(|i| (svc::clock::now_millis(), format!("b{i}").into_bytes()))
        .collect();
    let seqs = log.append_batch(items).await.unwrap();
    assert_eq!(seqs, (11..=1510).collect::<Vec<_>>());
    // A long read (through a consumer) and the short ones agree.
    let all = read_all(log).await;
    assert_eq!(all.len(), 1510);
    assert!(all.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    assert_eq!(all[1509].payload, b"b1499".to_vec());
    assert_eq!(log.read(1505, 100).await.unwrap().len(), 6);

    let mut watch = log.subscribe();
    wait_for(&mut watch, 1510).await;
    assert_eq!(log.enforce_retention().await.unwrap(), 0);
    assert!(log.local().is_none());

    // Reopening finds the stream as it was.
    let again = open(&client, "events", 1).await;
    assert_eq!(again.last_seq().await.unwrap(), 1510);
    assert_eq!(*again.subscribe().borrow(), 1510);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_settings_become_the_stream_limits() {
    let Some(nats) = NatsCluster::start(1).await else {
        return;
    };
    let client = connect(&nats.urls()).await;
    let config = StreamConfig {
        max_age: Some(Duration::from_secs(7 * 24 * 3600)),
        max_bytes: Some(64 * 1024),
        ..StreamConfig::default()
    };
    let log = JetStreamLog::open(client.clone(), "audit", &config, 1)
        .await
        .unwrap();
    let info = log.info().await.unwrap();
    assert_eq!(info.config.name, "SVC_AUDIT");
    assert_eq!(info.config.subjects, vec!["svc.js.audit".to_string()]);
    assert_eq!(info.config.max_age, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(info.config.max_bytes, 64 * 1024);
    assert_eq!(
        info.config.storage,
        async_nats::jetstream::stream::StorageType::File
    );
    assert_eq!(
        info.config.discard,
        async_nats::jetstream::stream::DiscardPolicy::Old
    );
    assert_eq!(info.config.num_replicas, 1);

    // Over max_bytes the oldest go; reads from 1 start at the oldest kept.
    for i in 0..200u64 {
        log.append(
            svc::clock::now_millis(),
            vec![b'x'; 1000 + (i % 7) as usize],
        )
        .await
        .unwrap();
    }
    let first = log.first_seq().await.unwrap();
    assert!(first > 1, "max_bytes dropped nothing");
    assert!(log.bytes().await.unwrap() <= 64 * 1024);
    let kept = log.read(1, 1000).await.unwrap();
    assert_eq!(kept[0].seq, first);
    assert_eq!(kept.last().unwrap().seq, 200);
    // The short path (gets by sequence) also steps to the oldest kept.
    let kept_short = log.read(first - 1, 3).await.unwrap();
    assert_eq!(kept_short[0].seq, first);

    // A lone (unclustered) nats-server 2.9.10 takes R3 and reports it, with one copy: the
    // replicas asked for should come from the NATS cluster's size.
    let lone = JetStreamLog::open(client.clone(), "audit", &config, 3)
        .await
        .unwrap();
    assert_eq!(lone.info().await.unwrap().config.num_replicas, 3);

    // New settings update the stream in place.
    let looser = StreamConfig {
        max_age: None,
        max_bytes: None,
        ..StreamConfig::default()
    };
    let log = JetStreamLog::open(client, "audit", &looser, 1)
        .await
        .unwrap();
    let info = log.info().await.unwrap();
    assert_eq!(info.config.max_bytes, -1);
    assert_eq!(info.config.max_age, Duration::ZERO);
    assert_eq!(log.last_seq().await.unwrap(), 200);

    // A snapshot's copy of it keeps its sequences and timestamps.
    let dir = tempfile::tempdir().unwrap();
    let copy = svc::stream::copy_to_local(log.as_ref(), &dir.path().join("audit"))
        .await
        .unwrap();
    assert_eq!(copy.first_seq(), first);
    assert_eq!(copy.last_seq(), 200);
    let copied = copy.read(1, 1000).unwrap();
    assert_eq!(copied, kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_two_nodes_see_one_order() {
    let Some(nats) = NatsCluster::start(3).await else {
        return;
    };
    let a_client = connect(&[nats.url(0)]).await;
    let b_client = connect(&[nats.url(1)]).await;
    let a = open(&a_client, "events", 3).await;
    let b = open(&b_client, "events", 3).await;
    // More replicas than servers is refused at once, naming the stream.
    let started = std::time::Instant::now();
    let refused = JetStreamLog::open(a_client.clone(), "audit", &StreamConfig::default(), 5).await;
    let Err(svc::Error::Unavailable(message)) = refused else {
        panic!("R5 on three servers was not refused");
    };
    println!("{message}");
    assert!(message.contains("SVC_AUDIT"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "retried a permanent error"
    );
    let mut a_watch = a.subscribe();
    let mut b_watch = b.subscribe();
    let per_writer = 150u64;
    let mut tasks = Vec::new();
    for (tag, log) in [("a", a.clone()), ("b", b.clone())] {
        for task in 0..2 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let mut seqs = Vec::new();
                for i in 0..per_writer / 2 {
                    let payload = format!("{tag}{task}-{i}").into_bytes();
                    if i % 10 == 0 {
                        let batch = vec![(svc::clock::now_millis(), payload)];
                        seqs.extend(log.append_batch(batch).await.unwrap());
                    } else {
                        seqs.push(log.append(svc::clock::now_millis(), payload).await.unwrap());
                    }
                }
                seqs
            }));
        }
    }
    let mut acked = Vec::new();
    for task in tasks {
        let seqs = task.await.unwrap();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "one writer's order");
        acked.extend(seqs);
    }
    let total = 2 * per_writer;
    acked.sort_unstable();
    assert_eq!(
        acked,
        (1..=total).collect::<Vec<_>>(),
        "every ack its own seq"
    );
    // Both watches move to the end through appends by either side.
    wait_for(&mut a_watch, total).await;
    wait_for(&mut b_watch, total).await;
    let from_a = read_all(a.as_ref()).await;
    let from_b = read_all(b.as_ref()).await;
    assert_eq!(from_a.len() as u64, total);
    assert_eq!(from_a, from_b, "the same records in the same order on both");
    let distinct: BTreeSet<_> = from_a.iter().map(|r| r.payload.clone()).collect();
    assert_eq!(distinct.len() as u64, total, "no record twice");
}

fn new_event(n: usize, source: &str) -> NewEvent {
    NewEvent {
        event_type: "command_completed".into(),
        source: Some(source.into()),
        payload: Some(serde_json::json!({ "n": n })),
        ..NewEvent::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_emitted_on_one_server_reach_the_other() {
    let Some(nats) = NatsCluster::start(3).await else {
        return;
    };
    let a_client = connect(&[nats.url(0)]).await;
    let b_client = connect(&[nats.url(2)]).await;
    let (_stop, stopping) = tokio::sync::watch::channel(false);
    let a = Arc::new(Events::new(
        open(&a_client, "events", 3).await,
        stopping.clone(),
        None,
    ));
    let b = Arc::new(Events::new(
        open(&b_client, "events", 3).await,
        stopping.clone(),
        None,
    ));
    // History before the follower starts: replayed, then live with no seam.
    let mut emitted = Vec::new();
    for i in 0..20 {
        emitted.push(a.emit(new_event(i, "a"), "a").await.unwrap());
    }
    let (sender, mut received) = tokio::sync::mpsc::channel(64);
    let follower = {
        let b = b.clone();
        tokio::spawn(async move { b.stream(Filter::default(), true, sender).await })
    };
    // Concurrent emits on both servers while B's follower crosses from replay to live.
    let mut tasks = Vec::new();
    for (tag, events) in [("a", a.clone()), ("b", b.clone())] {
        for task in 0..2 {
            let events = events.clone();
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                for i in 0..60 {
                    let source = format!("{tag}{task}");
                    out.push(events.emit(new_event(i, &source), &source).await.unwrap());
                }
                out
            }));
        }
    }
    for task in tasks {
        emitted.extend(task.await.unwrap());
    }
    let total = emitted.len();
    let mut got: Vec<Event> = Vec::new();
    while got.len() < total {
        let event = tokio::time::timeout(Duration::from_secs(20), received.recv())
            .await
            .unwrap_or_else(|_| panic!("follower stuck after {} of {total}", got.len()))
            .unwrap()
            .unwrap();
        got.push(event);
    }
    // Nothing more arrives: no duplicates after the last one.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), received.recv())
            .await
            .is_err(),
        "an event arrived twice"
    );
    let seqs: Vec<u64> = got.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=total as u64).collect::<Vec<_>>(),
        "in order, no gap"
    );
    let mut ids: Vec<&str> = got.iter().map(|e| e.id.as_str()).collect();
    ids.sort_unstable();
    let mut expected: Vec<&str> = emitted.iter().map(|e| e.id.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(ids, expected, "exactly the emitted events");
    follower.abort();

    // An event emitted on A is listed and found on B at once.
    let last = a.emit(new_event(999, "a"), "a").await.unwrap();
    let (page, next) = b.list(&Filter::default(), 1000, None).await.unwrap();
    assert_eq!(page.len(), total + 1);
    assert_eq!(next, None);
    assert_eq!(page.last().unwrap().id, last.id);
    assert_eq!(b.get(&last.id).await.unwrap(), last);
    assert_eq!(b.get(&last.seq.to_string()).await.unwrap(), last);
    let (page, next) = b.list(&Filter::default(), 10, None).await.unwrap();
    assert_eq!(page.len(), 10);
    assert_eq!(next, Some(11));
    let stats = b.stats(&Filter::default()).await.unwrap();
    assert_eq!(stats.total as usize, total + 1);
    // A replay without follow ends at the last event durable when it started.
    let (sender, mut replayed) = tokio::sync::mpsc::channel(4096);
    b.stream(Filter::default(), false, sender).await;
    let mut count = 0;
    while let Some(event) = replayed.recv().await {
        count += 1;
        assert_eq!(event.unwrap().seq, count as u64);
    }
    assert_eq!(count, total + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_stream_survives_a_killed_node() {
    let Some(mut nats) = NatsCluster::start(3).await else {
        return;
    };
    let client = connect(&nats.urls()).await;
    let log = open(&client, "audit", 3).await;
    let info = log.info().await.unwrap();
    assert_eq!(info.config.num_replicas, 3);
    // Kill the stream's leader when it is not the node the client is on (else another one),
    // under a steady append load.
    let leader = info
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .expect("a stream leader");
    let victim = nats.index_of(&leader).unwrap();
    println!("killing the stream leader {leader}");
    let writer = {
        let log = log.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let until = tokio::time::Instant::now() + Duration::from_secs(8);
            let mut n = 0u64;
            let mut slowest = Duration::ZERO;
            while tokio::time::Instant::now() < until {
                let payload = format!("row-{n}").into_bytes();
                let started = tokio::time::Instant::now();
                match log.append(svc::clock::now_millis(), payload.clone()).await {
                    Ok(seq) => acked.push((seq, payload)),
                    Err(e) => panic!("append failed after {} acks: {e}", acked.len()),
                }
                slowest = slowest.max(started.elapsed());
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            println!("{} appends, the slowest took {slowest:?}", acked.len());
            acked
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    nats.kill(victim);
    let acked = writer.await.unwrap();
    assert!(acked.len() > 100, "too few appends: {}", acked.len());
    let records = read_all(log.as_ref()).await;
    assert!(
        records.windows(2).all(|w| w[1].seq == w[0].seq + 1),
        "dense after the kill"
    );
    for (seq, payload) in &acked {
        let record = &records[(*seq - 1) as usize];
        assert_eq!(record.seq, *seq);
        assert_eq!(&record.payload, payload, "acknowledged record {seq} lost");
    }
    let distinct: BTreeSet<_> = records.iter().map(|r| r.payload.clone()).collect();
    assert_eq!(
        distinct.len(),
        records.len(),
        "a retried publish stored twice"
    );
    // The follower's ordered consumer may have lost the killed leader (missed heartbeats);
    // it starts over by itself, so health comes back without anyone acting.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match log.health().await {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                println!("health while the follower recovers: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("the follower did not recover: {e}"),
        }
    }
    // The node comes back and the stream goes on.
    nats.restart(victim).await;
    let seq = log
        .append(svc::clock::now_millis(), b"after".to_vec())
        .await
        .unwrap();
    assert_eq!(seq, records.len() as u64 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_takes_a_jetstream_stream_like_a_local_one() {
    let Some(nats) = NatsCluster::start(1).await else {
        return;
    };
    let client = connect(&nats.urls()).await;
    let log = open(&client, "events", 1).await;
    for i in 0..25u64 {
        log.append(svc::clock::now_millis(), format!("e{i}").into_bytes())
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn svc::store::Store> =
        Arc::new(svc::store::SqliteStore::open(&dir.path().join("svc.db")).unwrap());
    let source = svc::backup::take::Source {
        store,
        data_dir: dir.path().to_path_buf(),
        streams: vec![("events", log.clone() as Arc<dyn Stream>)],
        policy_dir: dir.path().join("policies"),
        server_id: "test".into(),
    };
    let prepared = svc::backup::take::prepare_unaudited(&source).await.unwrap();
    // The temporary copy is gone already; its segments are read through open handles.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.contains(".stream.tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let (manifest, bytes) = prepared.write(Vec::new()).unwrap();
    assert_eq!(manifest.streams["events"], 25);
    let mut segment_bytes = 0;
    svc::backup::snapshot::read(bytes.as_slice(), |path, data| {
        let mut buffer = Vec::new();
        std::io::Read::read_to_end(data, &mut buffer).unwrap();
        if path.starts_with("streams/events/") {
            segment_bytes += buffer.len();
        }
        Ok(())
    })
    .unwrap();
    assert!(segment_bytes > 25 * 2, "the records are in the snapshot");

    // Readiness sees the NATS server go away, naming the stream.
    let mut nats = nats;
    nats.kill(0);
    let Err(svc::Error::Unavailable(message)) = log.health().await else {
        panic!("healthy without its NATS server");
    };
    assert!(message.contains("SVC_EVENTS"), "{message}");
}
