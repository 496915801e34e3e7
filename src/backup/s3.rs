//! S3 client: pushes snapshot files to an S3-compatible object store and pulls them back.
//!
//! Owns request signing (AWS Signature Version 4), path-style and virtual-host addressing, the
//! multipart upload of large files, the temp-file-then-rename download, the few XML answers it
//! reads, and the mapping of S3 errors onto [`Error`]. It is our own small client over hyper
//! and rustls (ring) rather than a crate: the ones that fit pull a second HTTP client stack
//! (reqwest, and with it webpki-roots, sysinfo, a sync HTTP client) or aws-lc, for the six
//! operations a backup needs.
//!
//! Credentials live in [`Secret`]s: never in `Debug` output, log lines or error messages. One
//! connection per request (TLS handshake included): a part is 8 MiB, so the handshake is noise,
//! and no pool means no idle connection to go stale between parts.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::Secret;
use crate::error::{Error, Result};
use crate::percent;

/// S3 refuses parts below 5 MiB (except the last one).
pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;
/// The default part size, and the size up to which a file goes up in one PUT.
pub const DEFAULT_PART_SIZE: u64 = 8 * 1024 * 1024;
/// S3 allows at most this many parts per upload; bigger files get bigger parts.
const MAX_PARTS: u64 = 10_000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Sending one part and getting its answer; 8 MiB in 5 minutes is ~28 KB/s.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// A download that receives nothing for this long is given up.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts per request when the network or the store fails transiently (5xx, SlowDown).
const ATTEMPTS: u32 = 3;
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// How buckets are addressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressing {
    /// `http://host/bucket/key`: what MinIO, Ceph and most self-hosted stores expect.
    Path,
    /// `http://bucket.host/key`: what AWS prefers (and requires for new features).
    VirtualHost,
    /// Virtual-host on AWS (no endpoint given) for bucket names that are valid host labels,
    /// path style otherwise and for every custom endpoint.
    Auto,
}

/// Where and as whom to connect.
#[derive(Clone, Debug)]
pub struct S3Config {
    /// `http(s)://host[:port]` or `host[:port]`; `None` is AWS (`s3.REGION.amazonaws.com`).
    pub endpoint: Option<String>,
    pub region: String,
    pub access_key: Secret,
    pub secret_key: Secret,
    /// Temporary credentials (`AWS_SESSION_TOKEN`).
    pub session_token: Option<Secret>,
    /// The scheme for an endpoint given without one, and for AWS. A scheme in `endpoint` wins.
    pub ssl: bool,
    pub addressing: Addressing,
    /// PEM CA bundle to trust instead of the system's store.
    pub ca_file: Option<PathBuf>,
    /// Files up to this size go up in one PUT, bigger ones in parts of this size. At least
    /// [`MIN_PART_SIZE`].
    pub part_size: u64,
    /// Keys per ListObjectsV2 page (S3's maximum, 1000, by default).
    pub list_page_size: u32,
}

/// The `--s3-*` flags as given (`None`: not given), before the environment fills the gaps.
#[derive(Clone, Debug, Default)]
pub struct S3Flags {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key: Option<Secret>,
    pub secret_key: Option<Secret>,
    pub ssl: Option<bool>,
    pub ca_file: Option<PathBuf>,
}

impl S3Config {
    /// Flags first, then `AWS_ENDPOINT_URL`, `AWS_REGION` (or `AWS_DEFAULT_REGION`, else
    /// `us-east-1`), `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`.
    /// Missing keys are `Unauthenticated`, naming the flag and the variable.
    pub fn from_env_and_flags(flags: S3Flags) -> Result<S3Config> {
        Self::from_lookup_and_flags(|name| std::env::var(name).ok(), flags)
    }

    /// [`from_env_and_flags`](Self::from_env_and_flags) with `lookup` as the environment.
    pub fn from_lookup_and_flags(
        lookup: impl Fn(&str) -> Option<String>,
        flags: S3Flags,
    ) -> Result<S3Config> {
        let lookup = |name: &str| lookup(name).filter(|value| !value.is_empty());
        let secret = |flag: Option<Secret>, variable: &str, name: &str| {
            flag.filter(|value| !value.is_empty())
                .or_else(|| lookup(variable).map(Secret))
                .ok_or_else(|| {
                    Error::Unauthenticated(format!(
                        "no S3 {name}: pass --s3-{} or set {variable}",
                        name.replace(' ', "-")
                    ))
                })
        };
        Ok(S3Config {
            endpoint: flags.endpoint.or_else(|| lookup("AWS_ENDPOINT_URL")),
            region: flags
                .region
                .or_else(|| lookup("AWS_REGION"))
                .or_else(|| lookup("AWS_DEFAULT_REGION"))
                .unwrap_or_else(|| "us-east-1".into()),
            access_key: secret(flags.access_key, "AWS_ACCESS_KEY_ID", "access key")?,
            secret_key: secret(flags.secret_key, "AWS_SECRET_ACCESS_KEY", "secret key")?,
            session_token: lookup("AWS_SESSION_TOKEN").map(Secret),
            ssl: flags.ssl.unwrap_or(true),
            addressing: Addressing::Auto,
            ca_file: flags.ca_file,
            part_size: DEFAULT_PART_SIZE,
            list_page_size: 1000,
        })
    }
}

/// One object in a listing, or what HEAD says of one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    /// Unix milliseconds (`crate::clock::format_rfc3339` prints them).
    pub last_modified: i64,
}

/// A multipart upload that was started and neither completed nor aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingUpload {
    pub key: String,
    pub upload_id: String,
}

/// Called with (bytes done, bytes total) as a transfer advances, for a progress bar.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Send + Sync);

/// A client for one endpoint and one set of credentials. Cheap to clone.
#[derive(Clone)]
pub struct S3Client {
    inner: Arc<Inner>,
}

struct Inner {
    config: S3Config,
    endpoint: Endpoint,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl fmt::Debug for S3Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Client")
            .field("config", &self.inner.config)
            .finish()
    }
}

/// The endpoint, parsed once.
#[derive(Clone, Debug)]
struct Endpoint {
    https: bool,
    host: String,
    port: u16,
    /// Whether the user named the endpoint (not AWS): decides `Addressing::Auto`.
    custom: bool,
}

/// One request's destination: the host to connect to and the canonical path.
struct Target {
    host: String,
    path: String,
}

impl S3Client {
    /// Checks the configuration and loads the CA bundle; connects to nothing yet.
    pub fn new(config: S3Config) -> Result<S3Client> {
        if config.part_size < MIN_PART_SIZE {
            return Err(Error::Invalid(format!(
                "S3 part size {} is below S3's minimum of {MIN_PART_SIZE} bytes",
                config.part_size
            )));
        }
        if config.list_page_size == 0 || config.list_page_size > 1000 {
            return Err(Error::Invalid("S3 list page size must be 1 to 1000".into()));
        }
        if config.region.is_empty() || !config.region.bytes().all(percent::unreserved) {
            return Err(Error::Invalid(format!(
                "S3 region '{}' is not valid",
                config.region
            )));
        }
        let endpoint = parse_endpoint(&config)?;
        let tls = if endpoint.https {
            let tls = crate::tls::client_config(config.ca_file.as_deref(), crate::tls::ALPN_REST)
                .map_err(|e| Error::Invalid(format!("--ca-file: {e}")))?;
            Some(tokio_rustls::TlsConnector::from(Arc::new(tls)))
        } else {
            None
        };
        Ok(S3Client {
            inner: Arc::new(Inner {
                config,
                endpoint,
                tls,
            }),
        })
    }

    /// Creates `bucket` (in the configured region). An existing bucket of ours is fine.
    pub async fn create_bucket(&self, bucket: &str) -> Result<()> {
        let body = if self.inner.config.region == "us-east-1" {
            Bytes::new()
        } else {
            Bytes::from(format!(
                "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                 <LocationConstraint>{}</LocationConstraint></CreateBucketConfiguration>",
                self.inner.config.region
            ))
        };
        let call = Call::new(Method::PUT, bucket, "").body(body);
        match self.execute(&call).await {
            Ok(_) => Ok(()),
            Err(Error::Conflict(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Uploads the file `source` as `bucket/key`: in one PUT up to the part size, in parts
    /// above it. The object appears only once the whole file is stored; on any failure (or when
    /// this future is dropped) the started multipart upload is aborted, so nothing remains.
    pub async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        source: &Path,
        progress: Option<Progress<'_>>,
    ) -> Result<()> {
        let file = tokio::fs::File::open(source)
            .await
            .map_err(|e| local_error(source, e))?;
        let length = file
            .metadata()
            .await
            .map_err(|e| local_error(source, e))?
            .len();
        self.put_object_from_reader(bucket, key, file, length, progress)
            .await
    }

    /// [`put_object`](Self::put_object) from any reader that yields exactly `length` bytes.
    pub async fn put_object_from_reader(
        &self,
        bucket: &str,
        key: &str,
        mut source: impl AsyncRead + Unpin + Send,
        length: u64,
        progress: Option<Progress<'_>>,
    ) -> Result<()> {
        check_key(key)?;
        let report = |done| {
            if let Some(progress) = progress {
                progress(done, length)
            }
        };
        let part_size = self.inner.config.part_size.max(length.div_ceil(MAX_PARTS));
        if length <= part_size {
            let body = read_part(&mut source, length, 0, length).await?;
            self.execute(&Call::new(Method::PUT, bucket, key).body(body))
                .await?;
            report(length);
            return Ok(());
        }
        let upload = self.create_multipart_upload(bucket, key).await?;
        // Aborts the upload if this future is dropped between here and the end.
        let mut guard = AbortOnDrop {
            client: self.clone(),
            bucket: bucket.to_string(),
            key: key.to_string(),
            upload_id: Some(upload.clone()),
        };
        let outcome = async {
            let mut etags = Vec::new();
            let mut done = 0;
            while done < length {
                let size = part_size.min(length - done);
                let body = read_part(&mut source, size, done, length).await?;
                let number = etags.len() + 1;
                let call = Call::new(Method::PUT, bucket, key)
                    .query("partNumber", number.to_string())
                    .query("uploadId", upload.clone())
                    .body(body);
                let response = self.execute(&call).await?;
                let etag = response
                    .headers()
                    .get(header::ETAG)
                    .and_then(|value| value.to_str().ok())
                    .ok_or_else(|| Error::Unavailable("S3 answered a part without an ETag".into()))?
                    .to_string();
                etags.push(etag);
                done += size;
                report(done);
            }
            self.complete_multipart_upload(bucket, key, &upload, &etags)
                .await
        }
        .await;
        guard.upload_id = None;
        if outcome.is_err() {
            // Awaited here rather than left to the guard, so the store is clean when the
            // caller sees the error. A failed abort is logged, not retried.
            if let Err(e) = self.abort_upload(bucket, key, &upload).await {
                tracing::warn!(bucket, key, error = %e, "could not abort the multipart upload");
            }
        }
        outcome
    }

    async fn create_multipart_upload(&self, bucket: &str, key: &str) -> Result<String> {
        let call = Call::new(Method::POST, bucket, key).query("uploads", String::new());
        let body = read_body(self.execute(&call).await?).await?;
        xml_text(&body, "UploadId")
            .ok_or_else(|| Error::Unavailable("S3 started an upload without an UploadId".into()))
    }

    async fn complete_multipart_upload(
        &self,
        bucket: &str,
        key: &str,
        upload: &str,
        etags: &[String],
    ) -> Result<()> {
        let mut xml = String::from("<CompleteMultipartUpload>");
        for (index, etag) in etags.iter().enumerate() {
            xml.push_str(&format!(
                "<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>",
                index + 1,
                xml_escape(etag)
            ));
        }
        xml.push_str("</CompleteMultipartUpload>");
        let call = Call::new(Method::POST, bucket, key)
            .query("uploadId", upload.to_string())
            .body(Bytes::from(xml));
        let body = read_body(self.execute(&call).await?).await?;
        // S3 may answer 200 and still fail: the status is sent before the parts are joined.
        if body.contains("<Error>") {
            return Err(error_from_body(
                StatusCode::INTERNAL_SERVER_ERROR,
                &body,
                &call,
            ));
        }
        Ok(())
    }

    /// Aborts a multipart upload, deleting the parts stored so far.
    pub async fn abort_upload(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()> {
        let call = Call::new(Method::DELETE, bucket, key).query("uploadId", upload_id.to_string());
        self.execute(&call).await.map(drop)
    }

    /// Multipart uploads under `prefix` that were started and never completed or aborted
    /// (they cost storage until aborted). One page: up to 1000.
    pub async fn pending_uploads(&self, bucket: &str, prefix: &str) -> Result<Vec<PendingUpload>> {
        let call = Call::new(Method::GET, bucket, "")
            .query("uploads", String::new())
            .query("prefix", prefix.to_string());
        let body = read_body(self.execute(&call).await?).await?;
        Ok(xml_elements(&body, "Upload")
            .filter_map(|upload| {
                Some(PendingUpload {
                    key: xml_text(upload, "Key")?,
                    upload_id: xml_text(upload, "UploadId")?,
                })
            })
            .collect())
    }

    /// Downloads `bucket/key` into `dest`: into a temp file beside it first, renamed over
    /// `dest` once every byte is written and synced, so `dest` is never a partial object.
    /// Returns the number of bytes.
    pub async fn get_object(
        &self,
        bucket: &str,
        key: &str,
        dest: &Path,
        progress: Option<Progress<'_>>,
    ) -> Result<u64> {
        check_key(key)?;
        let response = self.execute(&Call::new(Method::GET, bucket, key)).await?;
        let total = content_length(response.headers());
        let temp = TempFile::create(dest).await?;
        let mut file =
            tokio::fs::File::from_std(temp.open().map_err(|e| local_error(&temp.path, e))?);
        let mut body = response.into_body();
        let mut done = 0u64;
        loop {
            let frame = tokio::time::timeout(STALL_TIMEOUT, body.frame())
                .await
                .map_err(|_| {
                    Error::Unavailable(format!(
                        "S3 sent nothing for {}s during the download of '{key}'",
                        STALL_TIMEOUT.as_secs()
                    ))
                })?;
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|e| {
                Error::Unavailable(format!(
                    "the download of '{key}' broke off after {done} bytes: {}",
                    causes(&e)
                ))
            })?;
            if let Ok(data) = frame.into_data() {
                file.write_all(&data)
                    .await
                    .map_err(|e| local_error(&temp.path, e))?;
                done += data.len() as u64;
                if let Some(progress) = progress {
                    progress(done, total.unwrap_or(done));
                }
            }
        }
        if let Some(total) = total.filter(|total| *total != done) {
            return Err(Error::Unavailable(format!(
                "the download of '{key}' ended after {done} of {total} bytes"
            )));
        }
        file.sync_all()
            .await
            .map_err(|e| local_error(&temp.path, e))?;
        drop(file);
        temp.persist(dest).await?;
        Ok(done)
    }

    /// Size and modification time of `bucket/key`. A missing object (or bucket: HEAD has no
    /// body to tell them apart) is `NotFound`.
    pub async fn head_object(&self, bucket: &str, key: &str) -> Result<ObjectInfo> {
        check_key(key)?;
        let response = self.execute(&Call::new(Method::HEAD, bucket, key)).await?;
        let headers = response.headers();
        Ok(ObjectInfo {
            key: key.to_string(),
            size: content_length(headers).unwrap_or(0),
            last_modified: headers
                .get(header::LAST_MODIFIED)
                .and_then(|value| value.to_str().ok())
                .and_then(parse_http_date)
                .unwrap_or(0),
        })
    }

    /// Every object whose key starts with `prefix`, in key order (ListObjectsV2, following
    /// continuation tokens page by page).
    pub async fn list_objects(&self, bucket: &str, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let mut objects = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut call = Call::new(Method::GET, bucket, "")
                .query("list-type", "2".into())
                .query("prefix", prefix.to_string())
                .query("max-keys", self.inner.config.list_page_size.to_string());
            if let Some(token) = token.take() {
                call = call.query("continuation-token", token);
            }
            let body = read_body(self.execute(&call).await?).await?;
            for entry in xml_elements(&body, "Contents") {
                let key = xml_text(entry, "Key").unwrap_or_default();
                let size = xml_text(entry, "Size").and_then(|size| size.parse().ok());
                let last_modified = xml_text(entry, "LastModified")
                    .and_then(|text| crate::clock::parse_rfc3339(&text));
                objects.push(ObjectInfo {
                    key,
                    size: size.unwrap_or(0),
                    last_modified: last_modified.unwrap_or(0),
                });
            }
            let truncated = xml_text(&body, "IsTruncated").as_deref() == Some("true");
            match xml_text(&body, "NextContinuationToken") {
                Some(next) if truncated && !next.is_empty() => token = Some(next),
                _ => return Ok(objects),
            }
        }
    }

    /// Deletes `bucket/key`. Deleting a key that does not exist succeeds (S3 says 204 too).
    pub async fn delete_object(&self, bucket: &str, key: &str) -> Result<()> {
        check_key(key)?;
        self.execute(&Call::new(Method::DELETE, bucket, key))
            .await
            .map(drop)
    }

    /// Sends `call`, retrying transient failures, and returns a 2xx response (its body not
    /// yet read) or the mapped error.
    async fn execute(&self, call: &Call<'_>) -> Result<Response<Incoming>> {
        let mut attempt = 1;
        loop {
            let outcome = match self.send(call).await {
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) => {
                    let status = response.status();
                    let body = read_body(response).await.unwrap_or_default();
                    Err(error_from_body(status, &body, call))
                }
                Err(e) => Err(e),
            };
            match outcome {
                Err(Error::Unavailable(message)) if attempt < ATTEMPTS && call.is_retryable() => {
                    tracing::debug!(attempt, %message, "S3 request failed; retrying");
                    tokio::time::sleep(Duration::from_millis(250) * 4u32.pow(attempt - 1)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// One signed request on its own connection.
    async fn send(&self, call: &Call<'_>) -> Result<Response<Incoming>> {
        let config = &self.inner.config;
        let target = self.target(call.bucket, call.key)?;
        let payload_hash = match call.body.is_empty() {
            true => EMPTY_SHA256.to_string(),
            false => hex::encode(ring::digest::digest(&ring::digest::SHA256, &call.body)),
        };
        let amz_date = amz_date(crate::clock::now_millis());
        let host = self.host_header(&target.host);
        let mut signed = vec![
            ("host", host.clone()),
            ("x-amz-content-sha256", payload_hash.clone()),
            ("x-amz-date", amz_date.clone()),
        ];
        if let Some(token) = &config.session_token {
            signed.push(("x-amz-security-token", token.expose().to_string()));
        }
        let pairs = encoded_query(&call.query);
        let query = canonical_query(&pairs);
        let authorization = authorization(
            &SigningInput {
                method: call.method.as_str(),
                path: &target.path,
                query: &query,
                headers: &signed,
                payload_hash: &payload_hash,
                amz_date: &amz_date,
            },
            &config.region,
            &config.access_key,
            &config.secret_key,
        );
        let path_and_query = match pairs.is_empty() {
            true => target.path.clone(),
            false => format!("{}?{}", target.path, request_query(&pairs)),
        };
        let mut builder = Request::builder()
            .method(call.method.clone())
            .uri(path_and_query)
            .header(header::CONTENT_LENGTH, call.body.len());
        for (name, value) in &signed {
            builder = builder.header(*name, value);
        }
        let request = builder
            .header(header::AUTHORIZATION, authorization)
            .body(Full::new(call.body.clone()))
            .map_err(|e| Error::Invalid(format!("cannot build the S3 request: {e}")))?;
        tracing::debug!(method = %call.method, bucket = call.bucket, key = call.key, "S3 request");
        let address = format!("{}:{}", target.host, self.inner.endpoint.port);
        let sent = tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.send_on_new_connection(&target.host, request),
        );
        let response = sent
            .await
            .map_err(|_| {
                Error::Unavailable(format!(
                    "S3 at {address} did not answer within {}s",
                    REQUEST_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| Error::Unavailable(format!("cannot reach S3 at {address}: {e}")))?;
        tracing::debug!(status = response.status().as_u16(), "S3 answer");
        Ok(response)
    }

    async fn send_on_new_connection(
        &self,
        host: &str,
        request: Request<Full<Bytes>>,
    ) -> std::result::Result<Response<Incoming>, String> {
        let port = self.inner.endpoint.port;
        // RFC 6761: names under `.localhost` are loopback. Resolvers disagree (glibc says no
        // such host), so they are answered here, as curl and browsers do; this is what lets
        // virtual-host addressing (`bucket.localhost`) work against a local store.
        let connect_host = if host == "localhost" || host.ends_with(".localhost") {
            "localhost"
        } else {
            without_brackets(host)
        };
        let socket =
            tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((connect_host, port)))
                .await
                .map_err(|_| "connect timed out".to_string())?
                .map_err(|e| e.to_string())?;
        let _ = socket.set_nodelay(true);
        match &self.inner.tls {
            Some(connector) => {
                let name =
                    rustls::pki_types::ServerName::try_from(without_brackets(host).to_string())
                        .map_err(|e| format!("'{host}': {e}"))?;
                let stream = connector.connect(name, socket).await.map_err(|e| {
                    match crate::tls::untrusted_certificate(&e) {
                        Some(why) => format!(
                            "TLS: the certificate is not trusted ({why}); pass the CA that \
                             issued it as the CA file"
                        ),
                        None => format!("TLS: {e}"),
                    }
                })?;
                exchange(stream, request).await
            }
            None => exchange(socket, request).await,
        }
    }

    /// The host to connect to and the path to request for `bucket` and `key` ("" for bucket
    /// operations).
    fn target(&self, bucket: &str, key: &str) -> Result<Target> {
        check_bucket(bucket)?;
        let endpoint = &self.inner.endpoint;
        let virtual_host = match self.inner.config.addressing {
            Addressing::Path => false,
            Addressing::VirtualHost => true,
            // Dots in the bucket name would not match the `*.s3...` wildcard certificate.
            Addressing::Auto => !endpoint.custom && !bucket.contains('.'),
        };
        Ok(match virtual_host {
            true => Target {
                host: format!("{bucket}.{}", endpoint.host),
                path: format!("/{}", encode_key(key)),
            },
            false if key.is_empty() => Target {
                host: endpoint.host.clone(),
                path: format!("/{bucket}"),
            },
            false => Target {
                host: endpoint.host.clone(),
                path: format!("/{bucket}/{}", encode_key(key)),
            },
        })
    }

    fn host_header(&self, host: &str) -> String {
        let endpoint = &self.inner.endpoint;
        match (endpoint.https, endpoint.port) {
            (true, 443) | (false, 80) => host.to_string(),
            (_, port) => format!("{host}:{port}"),
        }
    }
}

/// One S3 operation: method, bucket, key, query parameters and body.
struct Call<'a> {
    method: Method,
    bucket: &'a str,
    key: &'a str,
    query: Vec<(&'static str, String)>,
    body: Bytes,
}

impl<'a> Call<'a> {
    fn new(method: Method, bucket: &'a str, key: &'a str) -> Self {
        Call {
            method,
            bucket,
            key,
            query: Vec::new(),
            body: Bytes::new(),
        }
    }
    fn query(mut self, name: &'static str, value: String) -> Self {
        self.query.push((name, value));
        self
    }
    fn body(mut self, body: Bytes) -> Self {
        self.body = body;
        self
    }
    /// Everything but starting a multipart upload: if an answer is lost, sending that again
    /// would start a second upload and leave the first one pending.
    fn is_retryable(&self) -> bool {
        !(self.method == Method::POST && self.query.iter().any(|(name, _)| *name == "uploads"))
    }
}

/// Aborts the multipart upload in the background if dropped while still holding its id: the
/// caller dropped the upload's future (Ctrl-C, a timeout around it).
struct AbortOnDrop {
    client: S3Client,
    bucket: String,
    key: String,
    upload_id: Option<String>,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let Some(upload_id) = self.upload_id.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %self.key, "multipart upload left pending: no runtime to abort it");
            return;
        };
        let (client, bucket, key) = (self.client.clone(), self.bucket.clone(), self.key.clone());
        runtime.spawn(async move {
            if let Err(e) = client.abort_upload(&bucket, &key, &upload_id).await {
                tracing::warn!(bucket, key, error = %e, "could not abort the multipart upload");
            }
        });
    }
}

/// A temp file beside the destination, removed on drop unless persisted.
struct TempFile {
    path: PathBuf,
    persisted: bool,
}

impl TempFile {
    async fn create(dest: &Path) -> Result<TempFile> {
        let name = dest
            .file_name()
            .ok_or_else(|| Error::Invalid(format!("{}: not a file path", dest.display())))?;
        let random: u64 = rand::random();
        let path =
            dest.with_file_name(format!(".{}.{random:016x}.partial", name.to_string_lossy()));
        tokio::fs::File::create(&path)
            .await
            .map_err(|e| local_error(&path, e))?;
        Ok(TempFile {
            path,
            persisted: false,
        })
    }

    fn open(&self) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new().write(true).open(&self.path)
    }

    async fn persist(mut self, dest: &Path) -> Result<()> {
        tokio::fs::rename(&self.path, dest)
            .await
            .map_err(|e| local_error(dest, e))?;
        self.persisted = true;
        // The rename is durable only once the directory is synced.
        if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            if let Ok(directory) = std::fs::File::open(parent) {
                let _ = directory.sync_all();
            }
        }
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.persisted {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Sends `request` over `stream` with HTTP/1.1.
async fn exchange<S>(
    stream: S,
    request: Request<Full<Bytes>>,
) -> std::result::Result<Response<Incoming>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| causes(&e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "S3 connection ended with an error");
        }
    });
    sender.send_request(request).await.map_err(|e| causes(&e))
}

/// An error and its causes, joined by ": ".
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        let next = error.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = error.source();
    }
    text
}

async fn read_body(response: Response<Incoming>) -> Result<String> {
    let bytes = tokio::time::timeout(STALL_TIMEOUT, response.into_body().collect())
        .await
        .map_err(|_| Error::Unavailable("S3 did not finish its answer".into()))?
        .map_err(|e| Error::Unavailable(format!("the S3 answer broke off: {}", causes(&e))))?
        .to_bytes();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Reads the next `size` bytes of the source (at `offset` of `length`) into memory.
async fn read_part(
    source: &mut (impl AsyncRead + Unpin),
    size: u64,
    offset: u64,
    length: u64,
) -> Result<Bytes> {
    let mut buffer = Vec::with_capacity(size as usize);
    let read = source
        .take(size)
        .read_to_end(&mut buffer)
        .await
        .map_err(|e| Error::Invalid(format!("reading the upload source failed: {e}")))?;
    if (read as u64) < size {
        return Err(Error::Invalid(format!(
            "the upload source ended after {} of {length} bytes",
            offset + read as u64
        )));
    }
    Ok(Bytes::from(buffer))
}

fn local_error(path: &Path, error: std::io::Error) -> Error {
    match error.kind() {
        std::io::ErrorKind::NotFound => {
            Error::NotFound(format!("{}: no such file or directory", path.display()))
        }
        _ => Error::Invalid(format!("{}: {error}", path.display())),
    }
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
}

fn parse_endpoint(config: &S3Config) -> Result<Endpoint> {
    let (text, custom) = match &config.endpoint {
        Some(endpoint) if !endpoint.is_empty() => (endpoint.clone(), true),
        _ => (format!("s3.{}.amazonaws.com", config.region), false),
    };
    let with_scheme = match text.contains("://") {
        true => text.clone(),
        false if config.ssl => format!("https://{text}"),
        false => format!("http://{text}"),
    };
    let invalid = |why: &str| Error::Invalid(format!("S3 endpoint '{text}': {why}"));
    let uri: http::Uri = with_scheme.parse().map_err(|_| invalid("not a URL"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(invalid("the scheme must be http or https")),
    };
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(invalid("a path after the host is not supported"));
    }
    let host = uri
        .host()
        .ok_or_else(|| invalid("no host"))?
        .to_ascii_lowercase();
    Ok(Endpoint {
        https,
        port: uri.port_u16().unwrap_or(if https { 443 } else { 80 }),
        host,
        custom,
    })
}

fn without_brackets(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

/// S3's bucket naming rules, checked here so a bad name cannot reach a URL or a host name.
fn check_bucket(bucket: &str) -> Result<()> {
    let valid = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && bucket.as_bytes()[0].is_ascii_alphanumeric()
        && bucket.as_bytes()[bucket.len() - 1].is_ascii_alphanumeric();
    match valid {
        true => Ok(()),
        false => Err(Error::Invalid(format!(
            "'{bucket}' is not a valid S3 bucket name (3-63 lowercase letters, digits, '.', '-')"
        ))),
    }
}

fn check_key(key: &str) -> Result<()> {
    match !key.is_empty() && key.len() <= 1024 {
        true => Ok(()),
        false => Err(Error::Invalid("an S3 key must have 1 to 1024 bytes".into())),
    }
}

/// Maps an S3 error answer onto the domain error. Authentication failures get our own message:
/// S3's (and the `StringToSign` it may add) are not shown, so no credential detail can leak.
fn error_from_body(status: StatusCode, body: &str, call: &Call<'_>) -> Error {
    let code = xml_text(body, "Code").unwrap_or_default();
    let message = xml_text(body, "Message").unwrap_or_else(|| status.to_string());
    let object = match call.key {
        "" => format!("bucket '{}'", call.bucket),
        key => format!("'{key}' in bucket '{}'", call.bucket),
    };
    match code.as_str() {
        "InvalidAccessKeyId"
        | "SignatureDoesNotMatch"
        | "InvalidToken"
        | "ExpiredToken"
        | "TokenRefreshRequired"
        | "InvalidClientTokenId" => Error::Unauthenticated(format!(
            "S3 rejected the credentials ({code}); check the access key and secret key \
             (--s3-access-key, --s3-secret-key or AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
        )),
        "AccessDenied" | "AllAccessDisabled" | "AccountProblem" => {
            Error::Forbidden(format!("S3 denied access to {object}: {message}"))
        }
        "NoSuchBucket" => Error::NotFound(format!("bucket '{}' does not exist", call.bucket)),
        "NoSuchKey" => Error::NotFound(format!("object {object} not found")),
        "NoSuchUpload" => Error::NotFound(format!("no such multipart upload for {object}")),
        "BucketAlreadyOwnedByYou" => Error::Conflict(format!("bucket '{}' exists", call.bucket)),
        "SlowDown" | "ServiceUnavailable" | "InternalError" | "RequestTimeout" => {
            Error::Unavailable(format!("S3 is unavailable ({code}): {message}"))
        }
        "" if status == StatusCode::NOT_FOUND => Error::NotFound(format!(
            "object {object} not found (or the bucket does not exist)"
        )),
        "" if status == StatusCode::FORBIDDEN => Error::Forbidden(format!(
            "S3 refused {object} (403): wrong credentials or no permission"
        )),
        _ if status.is_server_error() => {
            Error::Unavailable(format!("S3 failed ({status} {code}): {message}"))
        }
        _ if status.is_redirection() => Error::Invalid(format!(
            "S3 redirected {object} ({code}): the bucket may be in another region than the \
             configured one"
        )),
        _ => Error::Invalid(format!("S3 refused {object} ({status} {code}): {message}")),
    }
}

/// The request parts that are signed.
struct SigningInput<'a> {
    method: &'a str,
    /// Already URI-encoded.
    path: &'a str,
    /// Already canonical (sorted, encoded).
    query: &'a str,
    /// Lower-case names.
    headers: &'a [(&'a str, String)],
    payload_hash: &'a str,
    /// `YYYYMMDDTHHMMSSZ`.
    amz_date: &'a str,
}

/// The `Authorization` header of AWS Signature Version 4 for S3.
fn authorization(
    input: &SigningInput<'_>,
    region: &str,
    access: &Secret,
    secret: &Secret,
) -> String {
    let mut headers: Vec<(&str, &str)> = input
        .headers
        .iter()
        .map(|(name, value)| (*name, value.trim()))
        .collect();
    headers.sort();
    let signed_headers = headers
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(";");
    let mut canonical = format!("{}\n{}\n{}\n", input.method, input.path, input.query);
    for (name, value) in &headers {
        canonical.push_str(&format!("{name}:{value}\n"));
    }
    canonical.push_str(&format!("\n{signed_headers}\n{}", input.payload_hash));
    let date = &input.amz_date[..8];
    let scope = format!("{date}/{region}/s3/aws4_request");
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{scope}\n{}",
        input.amz_date,
        hex::encode(ring::digest::digest(
            &ring::digest::SHA256,
            canonical.as_bytes()
        ))
    );
    let hmac = |key: &[u8], data: &str| {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
        ring::hmac::sign(&key, data.as_bytes())
    };
    let mut key = hmac(format!("AWS4{}", secret.expose()).as_bytes(), date);
    for part in [region, "s3", "aws4_request"] {
        key = hmac(key.as_ref(), part);
    }
    let signature = hex::encode(hmac(key.as_ref(), &string_to_sign).as_ref());
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        access.expose()
    )
}

/// Query parameters encoded and sorted, as the signature wants them.
fn encoded_query(query: &[(&str, String)]) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = query
        .iter()
        .map(|(name, value)| {
            (
                percent::encode(name.as_bytes(), percent::unreserved),
                percent::encode(value.as_bytes(), percent::unreserved),
            )
        })
        .collect();
    pairs.sort();
    pairs
}

/// The query as signed: every parameter as `name=value`, `uploads=` included.
fn canonical_query(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// The query as sent: an empty value as a bare name (`?uploads`), as the SDKs send it; the
/// server signs that as `uploads=`, like `canonical_query`.
fn request_query(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(name, value)| match value.is_empty() {
            true => name.clone(),
            false => format!("{name}={value}"),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// An object key in a path, as SigV4 signs it: every byte but RFC 3986's unreserved ones
/// and `/` percent-encoded.
fn encode_key(key: &str) -> String {
    percent::encode(key.as_bytes(), percent::unreserved_or_slash)
}

/// `20130524T000000Z` (SigV4's ISO 8601 basic form, UTC) from Unix milliseconds; `time`'s
/// calendar, like `clock`.
fn amz_date(millis: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp(millis.div_euclid(1000))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// An HTTP date (`Wed, 21 Oct 2015 07:28:00 GMT`, what S3 sends) as Unix milliseconds.
fn parse_http_date(text: &str) -> Option<i64> {
    let time = httpdate::parse_http_date(text).ok()?;
    let since = time.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_millis()).ok()
}

/// The inner text of each `<tag>...</tag>` in `xml`, in order (raw, not unescaped). S3's
/// answers are flat enough that this is all the XML parsing the client needs.
fn xml_elements<'a>(xml: &'a str, tag: &str) -> impl Iterator<Item = &'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut rest = xml;
    std::iter::from_fn(move || {
        let start = rest.find(&open)? + open.len();
        let end = start + rest[start..].find(&close)?;
        let inner = &rest[start..end];
        rest = &rest[end + close.len()..];
        Some(inner)
    })
}

/// The unescaped text of the first `<tag>` in `xml`.
fn xml_text(xml: &str, tag: &str) -> Option<String> {
    xml_elements(xml, tag).next().map(xml_unescape)
}

fn xml_unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let Some(end) = rest.find(';') else { break };
        let entity = &rest[1..end];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .and_then(|hex| u32::from_str_radix(hex, 16).ok())
                .or_else(|| entity.strip_prefix('#').and_then(|dec| dec.parse().ok()))
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GET example of AWS's "Signature Calculations for the Authorization Header"
    /// (Signature Version 4, S3) documentation.
    #[test]
    fn signature_matches_the_aws_example() {
        let headers = [
            ("host", "examplebucket.s3.amazonaws.com".to_string()),
            ("range", "bytes=0-9".to_string()),
            ("x-amz-content-sha256", EMPTY_SHA256.to_string()),
            ("x-amz-date", "20130524T000000Z".to_string()),
        ];
        let input = SigningInput {
            method: "GET",
            path: "/test.txt",
            query: "",
            headers: &headers,
            payload_hash: EMPTY_SHA256,
            amz_date: "20130524T000000Z",
        };
        let header = authorization(
            &input,
            "us-east-1",
            &Secret("AKIAIOSFODNN7EXAMPLE".into()),
            &Secret("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into()),
        );
        assert_eq!(
            header,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn canonical_query_strings() {
        let cases: [(&[(&str, &str)], &str); 4] = [
            (&[], ""),
            (&[("uploads", "")], "uploads="),
            (&[("prefix", "J"), ("max-keys", "2")], "max-keys=2&prefix=J"),
            (
                &[("continuation-token", "a/b+c=="), ("list-type", "2")],
                "continuation-token=a%2Fb%2Bc%3D%3D&list-type=2",
            ),
        ];
        for (query, expected) in cases {
            let owned: Vec<(&str, String)> =
                query.iter().map(|(n, v)| (*n, v.to_string())).collect();
            assert_eq!(
                canonical_query(&encoded_query(&owned)),
                expected,
                "{query:?}"
            );
        }
    }

    #[test]
    fn key_encoding() {
        let cases = [
            ("snap/2026-01-01.tar.gz", "snap/2026-01-01.tar.gz"),
            ("a b+c", "a%20b%2Bc"),
            ("ü~", "%C3%BC~"),
        ];
        for (key, expected) in cases {
            assert_eq!(encode_key(key), expected, "{key}");
        }
    }

    #[test]
    fn environment_fills_what_flags_leave_out() {
        let env = |name: &str| match name {
            "AWS_ACCESS_KEY_ID" => Some("env-access".to_string()),
            "AWS_SECRET_ACCESS_KEY" => Some("env-secret".to_string()),
            "AWS_REGION" => Some("eu-west-1".to_string()),
            "AWS_ENDPOINT_URL" => Some("http://minio:9000".to_string()),
            _ => None,
        };
        let config = S3Config::from_lookup_and_flags(env, S3Flags::default()).unwrap();
        assert_eq!(config.access_key.expose(), "env-access");
        assert_eq!(config.region, "eu-west-1");
        assert_eq!(config.endpoint.as_deref(), Some("http://minio:9000"));
        assert!(config.ssl);

        let flags = S3Flags {
            access_key: Some(Secret("flag-access".into())),
            region: Some("us-west-2".into()),
            ssl: Some(false),
            ..S3Flags::default()
        };
        let config = S3Config::from_lookup_and_flags(env, flags).unwrap();
        assert_eq!(config.access_key.expose(), "flag-access");
        assert_eq!(config.secret_key.expose(), "env-secret");
        assert_eq!(config.region, "us-west-2");
        assert!(!config.ssl);

        let missing = S3Config::from_lookup_and_flags(|_| None, S3Flags::default()).unwrap_err();
        assert!(matches!(missing, Error::Unauthenticated(_)), "{missing:?}");
        assert!(
            missing.to_string().contains("AWS_ACCESS_KEY_ID"),
            "{missing}"
        );
    }

    #[test]
    fn addressing() {
        let client = |endpoint: Option<&str>, addressing| {
            S3Client::new(S3Config {
                endpoint: endpoint.map(str::to_string),
                region: "eu-west-1".into(),
                access_key: Secret("a".into()),
                secret_key: Secret("s".into()),
                session_token: None,
                ssl: true,
                addressing,
                ca_file: None,
                part_size: DEFAULT_PART_SIZE,
                list_page_size: 1000,
            })
            .unwrap()
        };
        let cases = [
            (
                None,
                Addressing::Auto,
                "backups",
                "backups.s3.eu-west-1.amazonaws.com",
                "/k%201",
            ),
            (
                None,
                Addressing::Auto,
                "my.backups",
                "s3.eu-west-1.amazonaws.com",
                "/my.backups/k%201",
            ),
            (
                Some("http://localhost:9000"),
                Addressing::Auto,
                "backups",
                "localhost",
                "/backups/k%201",
            ),
            (
                Some("minio:9000"),
                Addressing::VirtualHost,
                "backups",
                "backups.minio",
                "/k%201",
            ),
            (
                Some("minio:9000"),
                Addressing::Path,
                "backups",
                "minio",
                "/backups/k%201",
            ),
        ];
        for (endpoint, addressing, bucket, host, path) in cases {
            let target = client(endpoint, addressing).target(bucket, "k 1").unwrap();
            assert_eq!(
                (target.host.as_str(), target.path.as_str()),
                (host, path),
                "{endpoint:?} {bucket}"
            );
        }
        let aws = client(None, Addressing::Auto);
        assert_eq!(
            aws.host_header("backups.s3.eu-west-1.amazonaws.com"),
            "backups.s3.eu-west-1.amazonaws.com"
        );
        let local = client(Some("http://localhost:9000"), Addressing::Auto);
        assert_eq!(local.host_header("localhost"), "localhost:9000");
        assert!(matches!(
            aws.target("Bad_Bucket", "k"),
            Err(Error::Invalid(_))
        ));
    }

    #[test]
    fn debug_output_hides_credentials() {
        let config = S3Config::from_lookup_and_flags(
            |_| None,
            S3Flags {
                access_key: Some(Secret("AKIDVISIBLE".into())),
                secret_key: Some(Secret("very-secret-key".into())),
                ..S3Flags::default()
            },
        )
        .unwrap();
        let client = S3Client::new(config.clone()).unwrap();
        for text in [format!("{config:?}"), format!("{client:?}")] {
            assert!(
                !text.contains("AKIDVISIBLE") && !text.contains("very-secret-key"),
                "{text}"
            );
        }
    }

    #[test]
    fn xml_answers() {
        let body = "<ListBucketResult><IsTruncated>true</IsTruncated>\
            <Contents><Key>a&amp;b</Key><Size>3</Size></Contents>\
            <Contents><Key>c&#x2F;d</Key><Size>4</Size></Contents>\
            <NextContinuationToken>tok</NextContinuationToken></ListBucketResult>";
        let keys: Vec<String> = xml_elements(body, "Contents")
            .filter_map(|entry| xml_text(entry, "Key"))
            .collect();
        assert_eq!(keys, ["a&b", "c/d"]);
        assert_eq!(
            xml_text(body, "NextContinuationToken").as_deref(),
            Some("tok")
        );
        assert_eq!(xml_text(body, "Missing"), None);
    }

    #[test]
    fn dates() {
        assert_eq!(amz_date(1_369_353_600_000), "20130524T000000Z");
        assert_eq!(amz_date(1_795_248_902_123), "20261121T081502Z");
        assert_eq!(amz_date(951_868_799_999), "20000229T235959Z");
        assert_eq!(
            parse_http_date("Fri, 24 May 2013 00:00:00 GMT"),
            Some(1_369_353_600_000)
        );
        assert_eq!(parse_http_date("Fri, 31 Feb 2013 00:00:00 GMT"), None);
    }
}
