//! The S3 client (`svc::backup::s3`) against a real S3 API: moto's server, one per test on an
//! ephemeral port, killed on drop. Without moto the tests say "skipped: no moto_server" and
//! pass, unless `CI` is set: then a missing moto fails them.

use std::path::Path;
use std::pin::Pin;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

mod common;

use common::moto::Moto;
use svc::backup::s3::{Addressing, S3Client, S3Config, MIN_PART_SIZE};
use svc::config::Secret;
use svc::Error;
use tokio::io::{AsyncRead, ReadBuf};

/// The client settings for a moto server (helpers local to these tests).
trait MotoClient {
    fn config(&self) -> S3Config;
    fn client(&self) -> S3Client;
}

impl MotoClient for Moto {
    fn config(&self) -> S3Config {
        config(&self.endpoint(), "test-access", "test-secret")
    }

    fn client(&self) -> S3Client {
        S3Client::new(self.config()).unwrap()
    }
}

fn config(endpoint: &str, access: &str, secret: &str) -> S3Config {
    S3Config {
        endpoint: Some(endpoint.to_string()),
        region: "us-east-1".into(),
        access_key: Secret(access.into()),
        secret_key: Secret(secret.into()),
        session_token: None,
        ssl: false,
        addressing: Addressing::Path,
        ca_file: None,
        part_size: MIN_PART_SIZE,
        list_page_size: 1000,
    }
}

/// Deterministic bytes that do not repeat with any short period.
fn data(length: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Every (done, total) a transfer reported.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(u64, u64)>>>);

impl Recorder {
    fn record(&self) -> impl Fn(u64, u64) + Send + Sync + '_ {
        move |done, total| self.0.lock().unwrap().push((done, total))
    }
    fn calls(&self) -> Vec<(u64, u64)> {
        self.0.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn small_object_round_trip() {
    let Some(moto) = Moto::start() else { return };
    let client = moto.client();
    let dir = tempfile::tempdir().unwrap();
    client.create_bucket("small").await.unwrap();
    let bytes = data(1000);
    let source = write_file(dir.path(), "source", &bytes);

    let uploaded = Recorder::default();
    let key = "snapshots/2026 01 01+x.tar.gz";
    client
        .put_object("small", key, &source, Some(&uploaded.record()))
        .await
        .unwrap();
    assert_eq!(uploaded.calls(), [(1000, 1000)]);

    let info = client.head_object("small", key).await.unwrap();
    assert_eq!((info.key.as_str(), info.size), (key, 1000));
    assert!(info.last_modified > 1_700_000_000_000, "{info:?}");

    let dest = dir.path().join("restored.tar.gz");
    let downloaded = Recorder::default();
    let size = client
        .get_object("small", key, &dest, Some(&downloaded.record()))
        .await
        .unwrap();
    assert_eq!(size, 1000);
    assert_eq!(downloaded.calls().last(), Some(&(1000, 1000)));
    assert_eq!(sha256(&std::fs::read(&dest).unwrap()), sha256(&bytes));
    // Only the source and the renamed download: no temp file left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[tokio::test]
async fn multipart_round_trip() {
    let Some(moto) = Moto::start() else { return };
    let client = moto.client();
    let dir = tempfile::tempdir().unwrap();
    client.create_bucket("large").await.unwrap();
    let length = 20 * 1024 * 1024 + 123;
    let bytes = data(length);
    let source = write_file(dir.path(), "source", &bytes);

    let uploaded = Recorder::default();
    client
        .put_object("large", "big.tar.gz", &source, Some(&uploaded.record()))
        .await
        .unwrap();
    // One report per part: four of 5 MiB and the rest.
    let part = MIN_PART_SIZE;
    let total = length as u64;
    assert_eq!(
        uploaded.calls(),
        [
            (part, total),
            (2 * part, total),
            (3 * part, total),
            (4 * part, total),
            (total, total)
        ]
    );
    assert!(client
        .pending_uploads("large", "")
        .await
        .unwrap()
        .is_empty());

    let dest = dir.path().join("restored");
    let size = client
        .get_object("large", "big.tar.gz", &dest, None)
        .await
        .unwrap();
    assert_eq!(size, total);
    let restored = std::fs::read(&dest).unwrap();
    assert!(restored == bytes, "the restored bytes differ");
    assert_eq!(sha256(&restored), sha256(&bytes));
}

#[tokio::test]
async fn list_with_prefix_and_paging() {
    let Some(moto) = Moto::start() else { return };
    let client = S3Client::new(S3Config {
        list_page_size: 2,
        ..moto.config()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    client.create_bucket("listing").await.unwrap();
    let keys = [
        "snap/a", "snap/b", "snap/c", "snap/d", "snap/e", "other/x", "snapshot",
    ];
    for (index, key) in keys.iter().enumerate() {
        let source = write_file(dir.path(), "source", &data(index + 1));
        client
            .put_object("listing", key, &source, None)
            .await
            .unwrap();
    }

    let listed = client.list_objects("listing", "snap/").await.unwrap();
    let found: Vec<(&str, u64)> = listed.iter().map(|o| (o.key.as_str(), o.size)).collect();
    assert_eq!(
        found,
        [
            ("snap/a", 1),
            ("snap/b", 2),
            ("snap/c", 3),
            ("snap/d", 4),
            ("snap/e", 5)
        ]
    );
    assert!(listed.iter().all(|o| o.last_modified > 1_700_000_000_000));
    assert_eq!(client.list_objects("listing", "").await.unwrap().len(), 7);
    assert!(client
        .list_objects("listing", "none/")
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn delete_removes_the_object() {
    let Some(moto) = Moto::start() else { return };
    let client = moto.client();
    let dir = tempfile::tempdir().unwrap();
    client.create_bucket("deleting").await.unwrap();
    let source = write_file(dir.path(), "source", b"snapshot");
    client
        .put_object("deleting", "k", &source, None)
        .await
        .unwrap();

    client.delete_object("deleting", "k").await.unwrap();
    let missing = client.head_object("deleting", "k").await.unwrap_err();
    assert!(matches!(missing, Error::NotFound(_)), "{missing:?}");
    assert!(client
        .list_objects("deleting", "")
        .await
        .unwrap()
        .is_empty());
    // Deleting what is not there succeeds, as in S3.
    client.delete_object("deleting", "k").await.unwrap();
}

#[tokio::test]
async fn virtual_host_addressing() {
    let Some(moto) = Moto::start() else { return };
    // `bucket.localhost` names the bucket in the Host header (moto routes on it) and connects
    // to loopback; a path-style client then sees the same object.
    let virtual_host = S3Client::new(S3Config {
        addressing: Addressing::VirtualHost,
        ..config(&format!("http://localhost:{}", moto.port), "a", "s")
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    virtual_host.create_bucket("vhost").await.unwrap();
    let bytes = data(4096);
    let source = write_file(dir.path(), "source", &bytes);
    virtual_host
        .put_object("vhost", "dir/file", &source, None)
        .await
        .unwrap();

    let listed = moto.client().list_objects("vhost", "").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].key.as_str(), listed[0].size), ("dir/file", 4096));
    let listed = virtual_host.list_objects("vhost", "dir/").await.unwrap();
    assert_eq!(listed.len(), 1);

    let dest = dir.path().join("restored");
    virtual_host
        .get_object("vhost", "dir/file", &dest, None)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), bytes);
}

/// moto checks signatures once its auth is switched on (`POST /moto-api/reset-auth`), against
/// IAM users created through its IAM API (here with boto3, which moto depends on).
#[tokio::test]
async fn wrong_credentials_are_unauthenticated() {
    let Some(moto) = Moto::start() else { return };
    let script = format!(
        r#"
import boto3, json, urllib.request
iam = boto3.client("iam", endpoint_url="{endpoint}", region_name="us-east-1",
                   aws_access_key_id="setup", aws_secret_access_key="setup")
iam.create_user(UserName="backup")
iam.put_user_policy(UserName="backup", PolicyName="all", PolicyDocument=json.dumps(
    {{"Version": "2012-10-17", "Statement": [{{"Effect": "Allow", "Action": "*", "Resource": "*"}}]}}))
key = iam.create_access_key(UserName="backup")["AccessKey"]
# Auth from the next request on (the count of unauthenticated requests left: 0).
urllib.request.urlopen(urllib.request.Request("{endpoint}/moto-api/reset-auth", data=b"0",
                       method="POST", headers={{"Content-Type": "text/plain"}}))
print(key["AccessKeyId"], key["SecretAccessKey"])
"#,
        endpoint = moto.endpoint()
    );
    let output = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let (access, secret) = stdout.trim().split_once(' ').unwrap();

    let good = S3Client::new(config(&moto.endpoint(), access, secret)).unwrap();
    good.create_bucket("guarded").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let source = write_file(dir.path(), "source", b"snapshot");
    good.put_object("guarded", "k", &source, None)
        .await
        .unwrap();

    let wrong_secret = "wrong-secret-0123456789";
    let unknown_access = "AKIAUNKNOWNKEY000000";
    let cases = [
        (access, wrong_secret, "SignatureDoesNotMatch"),
        (unknown_access, secret, "InvalidAccessKeyId"),
    ];
    for (access_key, secret_key, code) in cases {
        let client = S3Client::new(config(&moto.endpoint(), access_key, secret_key)).unwrap();
        let errors = [
            client.list_objects("guarded", "").await.unwrap_err(),
            client
                .put_object("guarded", "k2", &source, None)
                .await
                .unwrap_err(),
            client
                .get_object("guarded", "k", &dir.path().join("out"), None)
                .await
                .unwrap_err(),
        ];
        for error in errors {
            assert!(
                matches!(error, Error::Unauthenticated(_)),
                "{code}: {error:?}"
            );
            assert!(error.to_string().contains(code), "{error}");
            for text in [
                error.to_string(),
                format!("{error:?}"),
                format!("{client:?}"),
            ] {
                for credential in [access_key, secret_key] {
                    assert!(!text.contains(credential), "{text} shows a credential");
                }
            }
        }
    }
    assert!(!dir.path().join("out").exists());
}

#[tokio::test]
async fn missing_bucket_is_not_found() {
    let Some(moto) = Moto::start() else { return };
    let client = moto.client();
    let dir = tempfile::tempdir().unwrap();
    let source = write_file(dir.path(), "source", b"snapshot");
    let dest = dir.path().join("out");
    let errors = [
        client.list_objects("absent", "").await.unwrap_err(),
        client
            .put_object("absent", "k", &source, None)
            .await
            .unwrap_err(),
        client
            .get_object("absent", "k", &dest, None)
            .await
            .unwrap_err(),
    ];
    for error in errors {
        assert!(matches!(error, Error::NotFound(_)), "{error:?}");
        assert!(
            error.to_string().contains("bucket 'absent' does not exist"),
            "{error}"
        );
    }
    client.create_bucket("present").await.unwrap();
    let missing_key = client
        .get_object("present", "k", &dest, None)
        .await
        .unwrap_err();
    assert!(matches!(missing_key, Error::NotFound(_)), "{missing_key:?}");
    // No partial or temp file from the failed downloads.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[tokio::test]
async fn unreachable_endpoint_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let client = S3Client::new(config(&format!("http://127.0.0.1:{port}"), "a", "s")).unwrap();
    let error = client.list_objects("bucket", "").await.unwrap_err();
    assert!(matches!(error, Error::Unavailable(_)), "{error:?}");
    assert!(
        error.to_string().contains(&format!("127.0.0.1:{port}")),
        "{error}"
    );
}

/// A source that serves `bytes` up to `limit`, and then does `then`.
struct BrokenSource {
    bytes: Vec<u8>,
    position: usize,
    limit: usize,
    then: Then,
}

enum Then {
    Fail,
    /// Never answers again (and never wakes its reader).
    Stall,
    End,
}

impl AsyncRead for BrokenSource {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.position >= self.limit {
            return match self.then {
                Then::Fail => Poll::Ready(Err(std::io::Error::other("disk read error"))),
                Then::Stall => Poll::Pending,
                Then::End => Poll::Ready(Ok(())),
            };
        }
        let end = self.limit.min(self.position + buf.remaining());
        let chunk = self.bytes[self.position..end].to_vec();
        buf.put_slice(&chunk);
        self.position = end;
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn failed_source_leaves_nothing_behind() {
    let Some(moto) = Moto::start() else { return };
    let client = moto.client();
    client.create_bucket("failing").await.unwrap();
    let length = 20 * 1024 * 1024;
    let source = BrokenSource {
        bytes: data(length),
        position: 0,
        limit: 12 * 1024 * 1024,
        then: Then::Fail,
    };
    let error = client
        .put_object_from_reader("failing", "k", source, length as u64, None)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("disk read error"), "{error}");
    assert!(client
        .pending_uploads("failing", "")
        .await
        .unwrap()
        .is_empty());
    assert!(client.list_objects("failing", "").await.unwrap().is_empty());

    // A source shorter than announced is a failure too, not a short object.
    let short = BrokenSource {
        bytes: data(length),
        position: 0,
        limit: length,
        then: Then::End,
    };
    let error = client
        .put_object_from_reader("failing", "k", short, length as u64 + 1, None)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("ended after"), "{error}");
    assert!(client
        .pending_uploads("failing", "")
        .await
        .unwrap()
        .is_empty());
    assert!(client.list_objects("failing", "").await.unwrap().is_empty());
}

#[tokio::test]
async fn dropped_upload_is_aborted() {
    let Some(moto) = Moto::start() else { return };
    let client = moto.client();
    client.create_bucket("dropping").await.unwrap();
    let length = 20 * 1024 * 1024;
    let source = BrokenSource {
        bytes: data(length),
        position: 0,
        limit: 7 * 1024 * 1024,
        then: Then::Stall,
    };
    let (first_part, stored) = tokio::sync::watch::channel(false);
    let progress = move |_: u64, _: u64| {
        let _ = first_part.send(true);
    };
    let mut upload = Box::pin(client.put_object_from_reader(
        "dropping",
        "k",
        source,
        length as u64,
        Some(&progress),
    ));
    let mut stored = stored;
    tokio::select! {
        outcome = &mut upload => panic!("the stalled upload finished: {outcome:?}"),
        _ = stored.wait_for(|stored| *stored) => {}
    }
    // A part is stored, yet no object is visible under the key.
    assert_eq!(
        client.pending_uploads("dropping", "").await.unwrap().len(),
        1
    );
    assert!(client
        .list_objects("dropping", "")
        .await
        .unwrap()
        .is_empty());
    assert!(client.head_object("dropping", "k").await.is_err());
    // Dropped mid-way, as on Ctrl-C or a timeout around it.
    drop(upload);

    // The abort runs in the background; wait for it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !client
        .pending_uploads("dropping", "")
        .await
        .unwrap()
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the multipart upload is still pending"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(client
        .list_objects("dropping", "")
        .await
        .unwrap()
        .is_empty());
    let missing = client.head_object("dropping", "k").await.unwrap_err();
    assert!(matches!(missing, Error::NotFound(_)), "{missing:?}");
}
