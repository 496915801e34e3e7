//! Downloads for `archive` resources with a `url`: an HTTP/1.1 GET over a new connection per
//! request, redirects followed, the body streamed to a file with a size cap and hashed on the
//! way. The pieces are webhook delivery's (src/webhooks/send.rs): hyper's client connection,
//! and for https:// rustls with ring and the system's roots (`tls::client_config`), so a
//! certificate is always verified. No SSRF filter: the URL comes from the operator's state
//! file, and internal mirrors on private addresses are the common case.
//!
//! Blocking, like every provider: it runs a single-threaded tokio runtime on a thread of its
//! own, which works whether or not the caller is inside a runtime (the agent calls providers
//! from the blocking pool, tests call them from plain threads).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};

/// The largest archive downloaded, unless the caller says otherwise: far above a release
/// tarball, far below filling a root file system by mistake.
const MAX_BYTES: u64 = 1 << 30;
/// A whole download, redirects included.
const TIMEOUT: Duration = Duration::from_secs(600);
/// Redirects followed before giving up (release hosts use one or two).
const MAX_REDIRECTS: usize = 5;

/// How downloads are made: what they may weigh, how long they may take, and which CA file
/// (None: the system's store) certificates must chain to.
pub(super) struct Downloads {
    pub ca_file: Option<PathBuf>,
    pub max_bytes: u64,
    pub timeout: Duration,
}

impl Default for Downloads {
    fn default() -> Self {
        Downloads {
            ca_file: None,
            max_bytes: MAX_BYTES,
            timeout: TIMEOUT,
        }
    }
}

/// What was written: its size and its SHA-256 (lowercase hex).
#[derive(Debug, PartialEq)]
pub(super) struct Fetched {
    pub bytes: u64,
    pub sha256: String,
}

impl Downloads {
    /// GETs `url` into a new file `to` (created 0600; it must not exist). On an error the file
    /// may hold part of the body: the caller removes it.
    pub fn fetch(&self, url: &str, to: &Path) -> Result<Fetched, String> {
        let tls = crate::tls::client_config(self.ca_file.as_deref(), crate::tls::ALPN_REST)?;
        let request = Request {
            url: url.to_string(),
            to: to.to_path_buf(),
            max_bytes: self.max_bytes,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
        };
        let timeout = self.timeout;
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| format!("cannot start the download: {error}"))?;
            runtime.block_on(async {
                match tokio::time::timeout(timeout, request.follow()).await {
                    Ok(result) => result,
                    Err(_) => Err(format!(
                        "GET {}: not complete within {}",
                        request.url,
                        crate::clock::format_duration(timeout)
                    )),
                }
            })
        })
        .join()
        .map_err(|_| "the download thread panicked".to_string())?
    }
}

struct Request {
    url: String,
    to: PathBuf,
    max_bytes: u64,
    tls: tokio_rustls::TlsConnector,
}

/// A URL split into what a request needs.
struct Target {
    is_https: bool,
    /// Without the brackets of an IPv6 address.
    host: String,
    port: u16,
    /// `host[:port]` as written, for the Host header.
    authority: String,
    path: String,
}

impl Request {
    async fn follow(&self) -> Result<Fetched, String> {
        let mut url = self.url.clone();
        for _ in 0..=MAX_REDIRECTS {
            let target = parse(&url)?;
            let response = self
                .get(&target)
                .await
                .map_err(|error| format!("GET {url}: {error}"))?;
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(hyper::header::LOCATION)
                    .and_then(|value| value.to_str().ok())
                    .ok_or_else(|| format!("GET {url}: {status} without a Location"))?;
                url = resolve(&target, location);
                continue;
            }
            if status != hyper::StatusCode::OK {
                return Err(format!("GET {url}: the server answered {status}"));
            }
            return self
                .save(response)
                .await
                .map_err(|error| format!("GET {url}: {error}"));
        }
        Err(format!(
            "GET {}: more than {MAX_REDIRECTS} redirects",
            self.url
        ))
    }

    async fn get(&self, target: &Target) -> Result<hyper::Response<Incoming>, String> {
        let socket = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|error| format!("connect to {}:{}: {error}", target.host, target.port))?;
        let request = hyper::Request::get(target.path.as_str())
            .header(hyper::header::HOST, target.authority.as_str())
            .header(
                hyper::header::USER_AGENT,
                concat!("svc-agent/", env!("CARGO_PKG_VERSION")),
            )
            .body(Empty::<Bytes>::new())
            .map_err(|error| format!("request: {error}"))?;
        if !target.is_https {
            return send(socket, request).await;
        }
        let name = rustls::pki_types::ServerName::try_from(target.host.clone())
            .map_err(|error| format!("'{}': {error}", target.host))?;
        let stream = self.tls.connect(name, socket).await.map_err(|error| {
            match crate::tls::untrusted_certificate(&error) {
                Some(why) => format!("TLS: the server's certificate is not trusted ({why})"),
                None => format!("TLS: {error}"),
            }
        })?;
        send(stream, request).await
    }

    /// Streams the body into the file, refusing it once it passes the cap (before reading at
    /// all when Content-Length says so).
    async fn save(&self, response: hyper::Response<Incoming>) -> Result<Fetched, String> {
        let too_large = || format!("larger than the {} bytes allowed", self.max_bytes);
        let announced = response
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        if announced.is_some_and(|length| length > self.max_bytes) {
            return Err(too_large());
        }
        let mut file =
            create(&self.to).map_err(|error| format!("creating {}: {error}", self.to.display()))?;
        let mut hasher = Sha256::new();
        let mut written = 0u64;
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|error| format!("reading the body: {error}"))?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            written += data.len() as u64;
            if written > self.max_bytes {
                return Err(too_large());
            }
            hasher.update(data);
            file.write_all(data)
                .map_err(|error| format!("writing {}: {error}", self.to.display()))?;
        }
        file.sync_all()
            .map_err(|error| format!("writing {}: {error}", self.to.display()))?;
        Ok(Fetched {
            bytes: written,
            sha256: hex::encode(hasher.finalize()),
        })
    }
}

fn create(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

async fn send<S>(
    stream: S,
    request: hyper::Request<Empty<Bytes>>,
) -> Result<hyper::Response<Incoming>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| format!("HTTP: {error}"))?;
    // The connection runs beside the body being read; it ends with the runtime.
    tokio::spawn(connection);
    sender
        .send_request(request)
        .await
        .map_err(|error| format!("HTTP: {error}"))
}

/// Splits an http:// or https:// URL; no credentials (they would show in every message).
fn parse(url: &str) -> Result<Target, String> {
    let invalid = |why: &str| format!("URL '{url}': {why}");
    let uri: hyper::Uri = url.parse().map_err(|error| invalid(&format!("{error}")))?;
    let is_https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(invalid("must start with https:// or http://")),
    };
    let authority = uri.authority().ok_or_else(|| invalid("no host"))?;
    if authority.as_str().contains('@') {
        return Err(invalid("credentials in the URL are not supported"));
    }
    let host = authority.host();
    Ok(Target {
        is_https,
        host: host
            .strip_prefix('[')
            .and_then(|host| host.strip_suffix(']'))
            .unwrap_or(host)
            .to_string(),
        port: authority
            .port_u16()
            .unwrap_or(if is_https { 443 } else { 80 }),
        authority: authority.as_str().to_string(),
        path: uri
            .path_and_query()
            .map_or("/".to_string(), |path| path.as_str().to_string()),
    })
}

/// Where a redirect points: an absolute URL, `//host/path`, `/path` or a path relative to the
/// current one.
fn resolve(current: &Target, location: &str) -> String {
    let scheme = if current.is_https { "https" } else { "http" };
    if location.starts_with("https://") || location.starts_with("http://") {
        location.to_string()
    } else if location.starts_with("//") {
        format!("{scheme}:{location}")
    } else if location.starts_with('/') {
        format!("{scheme}://{}{location}", current.authority)
    } else {
        let path = current.path.split('?').next().unwrap_or_default();
        let directory = &path[..path.rfind('/').map_or(0, |at| at + 1)];
        format!("{scheme}://{}{directory}{location}", current.authority)
    }
}

/// A loopback HTTP(S) server for tests: answers each connection with the next of the raw
/// responses it was given (404 once they run out) and records the request lines.
#[cfg(test)]
pub(super) mod loopback {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::thread::JoinHandle;
    use std::time::Duration;

    pub struct Server {
        pub address: SocketAddr,
        is_https: bool,
        requests: Arc<Mutex<Vec<String>>>,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    /// `200 OK` with `body`.
    pub fn ok(body: &[u8]) -> Vec<u8> {
        let mut response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        response.extend_from_slice(body);
        response
    }

    pub fn redirect(location: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n"
        )
        .into_bytes()
    }

    impl Server {
        pub fn start(answers: Vec<Vec<u8>>, tls: Option<Arc<rustls::ServerConfig>>) -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.set_nonblocking(true).unwrap();
            let address = listener.local_addr().unwrap();
            let requests = Arc::new(Mutex::new(Vec::new()));
            let stop = Arc::new(AtomicBool::new(false));
            let is_https = tls.is_some();
            let thread = {
                let (requests, stop) = (Arc::clone(&requests), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut answers = answers.into_iter();
                    while !stop.load(Ordering::Relaxed) {
                        let Ok((socket, _)) = listener.accept() else {
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        };
                        socket.set_nonblocking(false).unwrap();
                        socket
                            .set_read_timeout(Some(Duration::from_secs(10)))
                            .unwrap();
                        let answer = answers.next().unwrap_or_else(|| {
                            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec()
                        });
                        let line = match &tls {
                            None => answer_one(socket, &answer),
                            Some(config) => {
                                let connection =
                                    rustls::ServerConnection::new(Arc::clone(config)).unwrap();
                                answer_one(rustls::StreamOwned::new(connection, socket), &answer)
                            }
                        };
                        if let Some(line) = line {
                            requests.lock().unwrap().push(line);
                        }
                    }
                })
            };
            Server {
                address,
                is_https,
                requests,
                stop,
                thread: Some(thread),
            }
        }

        /// A URL of this server; https:// ones name `localhost`, as test certificates do.
        pub fn url(&self, path: &str) -> String {
            match self.is_https {
                true => format!("https://localhost:{}{path}", self.address.port()),
                false => format!("http://{}{path}", self.address),
            }
        }

        /// The request lines so far: `GET /a.tar HTTP/1.1`.
        pub fn requests(&self) -> Vec<String> {
            self.requests.lock().unwrap().clone()
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }

    /// Reads one request's head and writes `answer`; None when the client went away first
    /// (a refused TLS handshake).
    fn answer_one(mut stream: impl Read + Write, answer: &[u8]) -> Option<String> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => return None,
            }
        }
        let _ = stream.write_all(answer);
        let _ = stream.flush();
        let head = String::from_utf8_lossy(&head);
        head.lines().next().map(str::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::loopback::{ok, redirect, Server};
    use super::*;

    fn fetch(downloads: &Downloads, url: &str) -> (Result<Fetched, String>, Option<Vec<u8>>) {
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("download");
        let result = downloads.fetch(url, &to);
        (result, std::fs::read(&to).ok())
    }

    #[test]
    fn streams_to_a_file_with_its_digest_following_redirects() {
        let body = b"archive bytes".to_vec();
        let server = Server::start(
            vec![
                redirect("/releases/v1.tar.gz"),
                redirect("v1-final.tar.gz"),
                ok(&body),
            ],
            None,
        );
        let (result, written) = fetch(&Downloads::default(), &server.url("/latest?os=linux"));
        assert_eq!(
            result.unwrap(),
            Fetched {
                bytes: body.len() as u64,
                sha256: hex::encode(Sha256::digest(&body)),
            }
        );
        assert_eq!(written.unwrap(), body);
        assert_eq!(
            server.requests(),
            [
                "GET /latest?os=linux HTTP/1.1",
                "GET /releases/v1.tar.gz HTTP/1.1",
                "GET /releases/v1-final.tar.gz HTTP/1.1",
            ]
        );
    }

    #[test]
    fn errors_say_what_went_wrong() {
        let small = Downloads {
            max_bytes: 10,
            ..Downloads::default()
        };
        let too_big = Server::start(vec![ok(&[b'x'; 11])], None);
        let (result, _) = fetch(&small, &too_big.url("/big"));
        assert_eq!(
            result.unwrap_err(),
            format!(
                "GET {}: larger than the 10 bytes allowed",
                too_big.url("/big")
            )
        );
        // Without Content-Length the cap is counted while reading.
        let chunked = Server::start(
            vec![b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n0123456789abc".to_vec()],
            None,
        );
        let (result, _) = fetch(&small, &chunked.url("/big"));
        assert!(result
            .unwrap_err()
            .ends_with("larger than the 10 bytes allowed"));

        let missing = Server::start(vec![], None);
        let (result, written) = fetch(&Downloads::default(), &missing.url("/gone"));
        assert_eq!(
            result.unwrap_err(),
            format!(
                "GET {}: the server answered 404 Not Found",
                missing.url("/gone")
            )
        );
        assert_eq!(written, None, "nothing is written for an error status");

        let looping = Server::start(vec![redirect("/again"); 6], None);
        let (result, _) = fetch(&Downloads::default(), &looping.url("/again"));
        assert!(result.unwrap_err().ends_with("more than 5 redirects"));

        for (url, expected) in [
            (
                "ftp://example.com/a.tar",
                "must start with https:// or http://",
            ),
            (
                "https://user:secret@example.com/a.tar",
                "credentials in the URL",
            ),
        ] {
            let (result, _) = fetch(&Downloads::default(), url);
            let error = result.unwrap_err();
            assert!(error.contains(expected), "{url}: {error}");
        }
    }

    /// https:// verifies the server's certificate: refused when no trusted CA issued it,
    /// accepted when it chains to the CA file.
    #[test]
    fn https_verifies_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let certificate = params.self_signed(&key).unwrap();
        let cert_path = dir.path().join("cert.pem");
        let key_path = dir.path().join("key.pem");
        std::fs::write(&cert_path, certificate.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        let server_tls = crate::tls::server_tls(&crate::config::TlsConfig {
            cert: cert_path.to_str().unwrap().into(),
            key: key_path.to_str().unwrap().into(),
        })
        .unwrap()
        .unwrap();

        let server = Server::start(vec![ok(b"secret")], Some(server_tls.rest.clone()));
        let (result, written) = fetch(&Downloads::default(), &server.url("/a.tar"));
        let error = result.unwrap_err();
        assert!(
            error.contains("TLS: the server's certificate is not trusted"),
            "{error}"
        );
        assert_eq!(written, None);
        assert_eq!(server.requests(), Vec::<String>::new());

        let server = Server::start(vec![ok(b"secret")], Some(server_tls.rest));
        let trusting = Downloads {
            ca_file: Some(cert_path),
            ..Downloads::default()
        };
        let (result, written) = fetch(&trusting, &server.url("/a.tar"));
        assert_eq!(result.unwrap().bytes, 6);
        assert_eq!(written.unwrap(), b"secret");
    }

    #[test]
    fn redirects_resolve_like_a_browser() {
        let current = parse("https://example.com:8443/a/b/c.tar?x=1").unwrap();
        let cases = [
            ("http://other/x", "http://other/x"),
            ("//cdn.example.com/x", "https://cdn.example.com/x"),
            ("/x", "https://example.com:8443/x"),
            ("d.tar", "https://example.com:8443/a/b/d.tar"),
        ];
        for (location, expected) in cases {
            assert_eq!(resolve(&current, location), expected, "{location}");
        }
        let ipv6 = parse("http://[::1]:8080").unwrap();
        assert_eq!(
            (ipv6.host.as_str(), ipv6.port, ipv6.path.as_str()),
            ("::1", 8080, "/")
        );
    }
}
