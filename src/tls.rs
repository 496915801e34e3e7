//! rustls configurations for the REST and gRPC listeners (`tls: {cert, key}`), the embedded
//! bus listener (`bus.tls: {cert, key}`), and the clients that reach them: `https://` CLIs,
//! agents on `tls://`, and the server's own bus client.
//!
//! Owns PEM loading, the messages that name a bad key or file, and the choice of crypto
//! provider: ring, always, passed explicitly so nothing depends on a process-wide default (and
//! aws-lc-rs never enters the build). The server's per-connection handshakes are in
//! `server::tls` and `bus::broker`; the one client socket here is [`connect`] (and
//! [`send_http1`] over it), shared by the `https://` CLIs and the module registry client, which
//! make one connection per request and so need no TLS connector crate.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::config::TlsConfig;

/// ALPN for gRPC: HTTP/2 only.
pub const ALPN_GRPC: &[u8] = b"h2";
/// ALPN for REST: the server speaks HTTP/1.1 only.
pub const ALPN_REST: &[u8] = b"http/1.1";

/// The server configurations of both listeners; they differ only in ALPN.
#[derive(Clone)]
pub struct ServerTls {
    pub rest: Arc<rustls::ServerConfig>,
    pub grpc: Arc<rustls::ServerConfig>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads `tls.cert` and `tls.key`: `Ok(None)` when both are empty (plain TCP), an error naming
/// the key and the file otherwise. Used by `--check-config` and at start-up alike.
pub fn server_tls(config: &TlsConfig) -> Result<Option<ServerTls>, String> {
    let Some((config, _)) = load_server_config(config, ("tls.cert", "tls.key"), &[])? else {
        return Ok(None);
    };
    let with_alpn = |protocol: &[u8]| {
        let mut config = config.clone();
        config.alpn_protocols = vec![protocol.to_vec()];
        Arc::new(config)
    };
    Ok(Some(ServerTls {
        rest: with_alpn(ALPN_REST),
        grpc: with_alpn(ALPN_GRPC),
    }))
}

/// The embedded bus listener's TLS (`bus.tls`): the broker's configuration (no ALPN: NATS
/// clients offer none) and the leaf certificate, which the server's own bus client pins.
#[derive(Clone)]
pub struct BusTls {
    pub server: Arc<rustls::ServerConfig>,
    pub certificate: CertificateDer<'static>,
}

/// Loads `bus.tls.cert` and `bus.tls.key` like [`server_tls`] does `tls`: `Ok(None)` when both
/// are empty, an error naming `bus.tls.*` and the file otherwise.
///
/// With `client_roots` (the embedded root CA) the listener asks every client for a
/// certificate (mutual TLS, contract §7) without requiring one: API-key clients and enrolling
/// agents have none. A certificate that is presented must chain to one of the roots (the
/// agent sends the signing CA as intermediate) and be valid now, or the handshake fails.
/// Which identity it proves, and whether it is still current (signing CA, latest enrolment),
/// is the bus authenticator's decision at CONNECT. `--check-config`, which has no store,
/// passes none and only checks the files.
pub fn bus_server_tls(
    config: &TlsConfig,
    client_roots: &[CertificateDer<'static>],
) -> Result<Option<BusTls>, String> {
    Ok(
        load_server_config(config, ("bus.tls.cert", "bus.tls.key"), client_roots)?.map(
            |(server, certificate)| BusTls {
                server: Arc::new(server),
                certificate,
            },
        ),
    )
}

/// Client certificates chaining to `roots` are asked for but not required; none asked for
/// without roots.
fn client_verifier(
    roots: &[CertificateDer<'static>],
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
    if roots.is_empty() {
        return Ok(rustls::server::WebPkiClientVerifier::no_client_auth());
    }
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store
            .add(root.clone())
            .map_err(|e| format!("client certificate CA: {e}"))?;
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| format!("client certificate verifier: {e}"))
}

/// An HTTP/1.1 server configuration from `config`, whose two files errors call `names`
/// (`svc-registry serve`'s `--tls-cert` and `--tls-key`); `Ok(None)` when both are empty.
pub fn http_server_tls(
    config: &TlsConfig,
    names: (&str, &str),
) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
    Ok(
        load_server_config(config, names, &[])?.map(|(mut config, _)| {
            config.alpn_protocols = vec![ALPN_REST.to_vec()];
            Arc::new(config)
        }),
    )
}

/// The certificate chain and key of a `{cert, key}` pair that errors call `names`, as a
/// server configuration without ALPN (asking for client certificates chaining to
/// `client_roots`, if any), and its leaf certificate.
fn load_server_config(
    config: &TlsConfig,
    (cert_name, key_name): (&str, &str),
    client_roots: &[CertificateDer<'static>],
) -> Result<Option<(rustls::ServerConfig, CertificateDer<'static>)>, String> {
    let (cert_path, key_path) = match (config.cert.is_empty(), config.key.is_empty()) {
        (true, true) => return Ok(None),
        (false, true) => {
            return Err(format!(
                "{key_name} is missing: {cert_name} is set, and TLS needs both"
            ))
        }
        (true, false) => {
            return Err(format!(
                "{cert_name} is missing: {key_name} is set, and TLS needs both"
            ))
        }
        (false, false) => (Path::new(&config.cert), Path::new(&config.key)),
    };
    let chain = load_certificates(cert_path).map_err(|e| format!("{cert_name}: {e}"))?;
    let key = load_private_key(key_path).map_err(|e| format!("{key_name}: {e}"))?;
    let leaf = chain[0].clone();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_client_cert_verifier(client_verifier(client_roots)?)
        .with_single_cert(chain, key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => format!(
                "{key_name}: {} does not match the certificate in {}",
                key_path.display(),
                cert_path.display()
            ),
            other => format!(
                "{cert_name}: cannot use {} with {}: {other}",
                cert_path.display(),
                key_path.display()
            ),
        })?;
    Ok(Some((config, leaf)))
}

/// A client configuration trusting the PEM bundle `ca_file`, or the system's store without
/// one, and offering `alpn`. Only a bad `ca_file` is an error.
pub fn client_config(ca_file: Option<&Path>, alpn: &[u8]) -> Result<rustls::ClientConfig, String> {
    let mut config = bus_client_config(ca_file)?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

/// [`client_config`] without ALPN, for `tls://` bus connections (agents).
pub fn bus_client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    Ok(bus_client_builder(ca_file)?.with_no_client_auth())
}

/// [`bus_client_config`] that presents `chain` (leaf first, then its intermediates) and `key`
/// when the server asks for a client certificate: an agent's mutual-TLS identity.
pub fn bus_client_config_with_certificate(
    ca_file: Option<&Path>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<rustls::ClientConfig, String> {
    bus_client_builder(ca_file)?
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("cannot use the client certificate: {e}"))
}

fn bus_client_builder(
    ca_file: Option<&Path>,
) -> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for certificate in load_certificates(path)? {
                roots
                    .add(certificate)
                    .map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
            }
        }
        None => {
            // An empty or unreadable store is not an error here: the handshake then fails as
            // "not trusted", and that message points at --ca-file.
            let found = rustls_native_certs::load_native_certs();
            for error in &found.errors {
                tracing::debug!(%error, "system CA store");
            }
            roots.add_parsable_certificates(found.certs);
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots))
}

/// A client configuration that trusts exactly one certificate, `leaf`, whatever name or
/// address it is reached at: the server's own bus client, which connects to its embedded
/// broker at the bound address (0.0.0.0 or a wildcard, for which no certificate has a name)
/// and knows the certificate it serves. The handshake signature is still verified against
/// that certificate's key, so only a peer holding the configured private key passes.
pub fn pinned_client_config(leaf: CertificateDer<'static>) -> rustls::ClientConfig {
    pinned_or_any(Some(leaf))
}

/// A client configuration that encrypts but accepts any server certificate (the handshake
/// signature is still checked against it): libpq's `sslmode=require`, for PostgreSQL servers
/// with self-signed certificates. It protects against passive eavesdropping only.
pub fn unverified_client_config() -> rustls::ClientConfig {
    pinned_or_any(None)
}

fn pinned_or_any(leaf: Option<CertificateDer<'static>>) -> rustls::ClientConfig {
    let provider = provider();
    let verifier = PinnedCertificate {
        leaf,
        algorithms: provider.signature_verification_algorithms,
    };
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth()
}

/// Accepts a server whose end-entity certificate is byte for byte `leaf` and whose handshake
/// is signed by its key. No expiry check: the server pins the certificate it is serving
/// itself, which it has just loaded; an expired one fails for other clients, not for it.
#[derive(Debug)]
struct PinnedCertificate {
    /// None: any certificate (see `unverified_client_config`).
    leaf: Option<CertificateDer<'static>>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if self
            .leaf
            .as_ref()
            .is_none_or(|leaf| end_entity.as_ref() == leaf.as_ref())
        {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, certificate, signature, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, certificate, signature, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// When `error` (or any error in its chain) is a server certificate this client does not
/// trust, says why in a line for people; None for every other error.
pub fn untrusted_certificate(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        // io::Error hides the error it wraps from `source()`; look inside it too.
        let wrapped = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        if let Some(rustls::Error::InvalidCertificate(reason)) =
            wrapped.or_else(|| error.downcast_ref::<rustls::Error>())
        {
            use rustls::CertificateError as Why;
            // Without the issuing CA among the roots, webpki reports whichever root it tried
            // last; all of these mean "not issued by a CA we trust".
            return Some(match reason {
                Why::UnknownIssuer
                | Why::BadSignature
                | Why::UnsupportedSignatureAlgorithmContext { .. }
                | Why::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => {
                    "not issued by a CA this client trusts".to_string()
                }
                other => other.to_string(),
            });
        }
        cause = error.source();
    }
    None
}

/// How long a client waits for a TCP connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The host `url` names when a connection to it would be plain TCP to another machine (not
/// https://, not a loopback address): what travels then can be read and changed on the
/// network. `host:port` without a scheme means plain `http://`.
pub fn plaintext_remote_host(url: &str) -> Option<String> {
    let uri: Uri = if url.contains("://") {
        url.parse().ok()?
    } else {
        format!("http://{url}").parse().ok()?
    };
    if uri.scheme_str() == Some("https") {
        return None;
    }
    let host = uri.host()?;
    let bare = without_brackets(host);
    let is_loopback = bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    (!is_loopback).then(|| host.to_string())
}

/// An IPv6 literal keeps its brackets in a URI's host; name checks and connects want the
/// address itself.
pub fn without_brackets(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Connects to `uri`'s host and port and completes a TLS handshake, verifying the server's
/// certificate for that host name (or IP address). An untrusted certificate is an error that
/// names the host and says to pass `ca_hint` (the flag that gives the CA file).
pub async fn connect(
    uri: &Uri,
    config: Arc<rustls::ClientConfig>,
    ca_hint: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    use std::io::{Error, ErrorKind};
    let host = uri
        .host()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "the address has no host"))?;
    let port = uri.port_u16().unwrap_or(443);
    let bare = without_brackets(host);
    let name = rustls::pki_types::ServerName::try_from(bare.to_string())
        .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("'{host}': {e}")))?;
    let socket = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((bare, port)))
        .await
        .map_err(|_| Error::new(ErrorKind::TimedOut, "connect timed out"))??;
    let _ = socket.set_nodelay(true);
    let connector = tokio_rustls::TlsConnector::from(config);
    connector.connect(name, socket).await.map_err(|e| {
        if let Some(why) = untrusted_certificate(&e) {
            return Error::other(format!(
                "TLS: the certificate of {host} is not trusted ({why}); pass {ca_hint} with \
                 the CA that issued it"
            ));
        }
        match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
            Some(other) => Error::other(format!("TLS: {other}")),
            None => e,
        }
    })
}

/// Sends one request over its own TLS connection (HTTP/1.1), in origin form with `Host`, as
/// hyper's pooled client does for plain HTTP.
pub async fn send_http1(
    mut request: Request<Full<Bytes>>,
    config: Arc<rustls::ClientConfig>,
    ca_hint: &str,
) -> Result<Response<Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let stream = connect(request.uri(), config, ca_hint).await?;
    if let Some(authority) = request.uri().authority() {
        let host = header::HeaderValue::from_str(authority.as_str())?;
        request.headers_mut().insert(header::HOST, host);
    }
    let origin_form = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str())
        .parse()?;
    *request.uri_mut() = origin_form;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "https connection ended with an error");
        }
    });
    Ok(sender.send_request(request).await?)
}

/// Every certificate in a PEM file; an error (naming the file) if there is none.
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let text = read(path)?;
    let certificates = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not valid PEM: {e}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!(
            "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) in the file",
            path.display()
        ));
    }
    Ok(certificates)
}

/// The first private key in a PEM file: PKCS#8, SEC1 (EC) or PKCS#1 (RSA).
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let text = read(path)?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => format!(
            "{}: no PEM private key (PKCS#8, SEC1/EC or PKCS#1/RSA) in the file",
            path.display()
        ),
        other => format!("{}: not a valid PEM private key: {other}", path.display()),
    })
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn new() -> Self {
            Files {
                dir: tempfile::tempdir().unwrap(),
            }
        }
        fn write(&self, name: &str, text: &str) -> String {
            let path = self.dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        }
    }

    fn certified() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn tls(cert: &str, key: &str) -> TlsConfig {
        TlsConfig {
            cert: cert.into(),
            key: key.into(),
        }
    }

    #[test]
    fn server_tls_accepts_a_matching_pair_and_names_every_problem() {
        let files = Files::new();
        let (cert_pem, key_pem) = certified();
        let (_, other_key_pem) = certified();
        let cert = files.write("cert.pem", &cert_pem);
        let key = files.write("key.pem", &key_pem);
        let other_key = files.write("other.pem", &other_key_pem);
        let junk = files.write("junk.pem", "not pem at all\n");
        let missing = files.dir.path().join("nope.pem").display().to_string();

        assert!(server_tls(&tls("", "")).unwrap().is_none());
        let loaded = server_tls(&tls(&cert, &key)).unwrap().unwrap();
        assert_eq!(loaded.grpc.alpn_protocols, vec![b"h2".to_vec()]);
        assert_eq!(loaded.rest.alpn_protocols, vec![b"http/1.1".to_vec()]);

        let cases: [(TlsConfig, &[&str]); 6] = [
            (tls(&cert, ""), &["tls.key is missing"]),
            (tls("", &key), &["tls.cert is missing"]),
            (tls(&missing, &key), &["tls.cert: cannot read", &missing]),
            (
                tls(&junk, &key),
                &["tls.cert:", &junk, "no PEM certificate"],
            ),
            (
                tls(&cert, &junk),
                &["tls.key:", &junk, "no PEM private key"],
            ),
            (
                tls(&cert, &other_key),
                &["tls.key:", &other_key, "does not match", &cert],
            ),
        ];
        for (config, expected) in cases {
            let message = server_tls(&config).err().expect("refused");
            for part in expected {
                assert!(message.contains(part), "{part:?} not in {message:?}");
            }
        }
    }

    #[test]
    fn bus_tls_names_its_own_keys_and_keeps_the_leaf() {
        let files = Files::new();
        let (cert_pem, key_pem) = certified();
        let cert = files.write("cert.pem", &cert_pem);
        let key = files.write("key.pem", &key_pem);
        assert!(bus_server_tls(&tls("", ""), &[]).unwrap().is_none());
        let loaded = bus_server_tls(&tls(&cert, &key), &[]).unwrap().unwrap();
        assert!(loaded.server.alpn_protocols.is_empty());
        assert_eq!(
            loaded.certificate,
            load_certificates(Path::new(&cert)).unwrap()[0]
        );
        let cases = [
            (tls(&cert, ""), "bus.tls.key is missing"),
            (tls("", &key), "bus.tls.cert is missing"),
            (tls(&key, &key), "bus.tls.cert:"),
            (tls(&cert, &cert), "bus.tls.key:"),
        ];
        for (config, expected) in cases {
            let message = bus_server_tls(&config, &[]).err().expect("refused");
            assert!(message.starts_with(expected), "{expected:?}: {message:?}");
        }
    }

    #[test]
    fn the_pinned_verifier_accepts_only_its_certificate() {
        use rustls::client::danger::ServerCertVerifier;
        let pinned = CertificateDer::from_pem_slice(certified().0.as_bytes()).unwrap();
        let other = CertificateDer::from_pem_slice(certified().0.as_bytes()).unwrap();
        let verifier = PinnedCertificate {
            leaf: Some(pinned.clone()),
            algorithms: provider().signature_verification_algorithms,
        };
        let name = rustls::pki_types::ServerName::try_from("0.0.0.0").unwrap();
        let now = rustls::pki_types::UnixTime::now();
        assert!(verifier
            .verify_server_cert(&pinned, &[], &name, &[], now)
            .is_ok());
        assert!(verifier
            .verify_server_cert(&other, &[pinned], &name, &[], now)
            .is_err());
    }

    #[test]
    fn client_config_needs_a_certificate_in_the_ca_file() {
        let files = Files::new();
        let (cert_pem, key_pem) = certified();
        let ca = files.write("ca.pem", &cert_pem);
        let key_only = files.write("key.pem", &key_pem);
        assert!(client_config(Some(Path::new(&ca)), ALPN_REST).is_ok());
        let message = client_config(Some(Path::new(&key_only)), ALPN_REST).unwrap_err();
        assert!(message.contains("no PEM certificate"), "{message}");
    }

    #[test]
    fn plaintext_remote_hosts() {
        for local in [
            "127.0.0.1:5397",
            "localhost:5397",
            "http://127.0.0.2:5397",
            "http://[::1]:5397",
            "http://LOCALHOST:8095",
            "https://svc.example:5397",
            "https://10.0.0.5:5397",
        ] {
            assert_eq!(plaintext_remote_host(local), None, "{local}");
        }
        for (remote, host) in [
            ("10.0.0.5:5397", "10.0.0.5"),
            ("http://svc.example:5397", "svc.example"),
            ("http://[2001:db8::1]:5397", "[2001:db8::1]"),
            // Only the loopback range is this machine; a name that merely starts so is not.
            ("http://localhost.example:8095", "localhost.example"),
        ] {
            assert_eq!(
                plaintext_remote_host(remote).as_deref(),
                Some(host),
                "{remote}"
            );
        }
    }
}
