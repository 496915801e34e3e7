//! rustls configurations for the REST and gRPC listeners (`tls: {cert, key}`) and for the
//! clients that reach them over `https://`.
//!
//! Owns PEM loading and the choice of crypto provider: ring, always, passed explicitly so
//! nothing depends on a process-wide default (and aws-lc-rs never enters the build). No
//! sockets here: the server's per-connection handshakes are in `server::tls`, the clients'
//! in `cli::client`. The embedded bus has its own TLS settings (`bus::broker::BrokerConfig`);
//! this module does not configure it.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

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
    let (cert_path, key_path) = match (config.cert.is_empty(), config.key.is_empty()) {
        (true, true) => return Ok(None),
        (false, true) => {
            return Err("tls.key is missing: tls.cert is set, and TLS needs both".into())
        }
        (true, false) => {
            return Err("tls.cert is missing: tls.key is set, and TLS needs both".into())
        }
        (false, false) => (Path::new(&config.cert), Path::new(&config.key)),
    };
    let chain = load_certificates(cert_path).map_err(|e| format!("tls.cert: {e}"))?;
    let key = load_private_key(key_path).map_err(|e| format!("tls.key: {e}"))?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => format!(
                "tls.key: {} does not match the certificate in {}",
                key_path.display(),
                cert_path.display()
            ),
            other => format!(
                "tls: cannot use {} with {}: {other}",
                cert_path.display(),
                key_path.display()
            ),
        })?;
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

/// A client configuration trusting the PEM bundle `ca_file`, or the system's store without
/// one, and offering `alpn`. Only a bad `ca_file` is an error.
pub fn client_config(ca_file: Option<&Path>, alpn: &[u8]) -> Result<rustls::ClientConfig, String> {
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
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
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
    fn client_config_needs_a_certificate_in_the_ca_file() {
        let files = Files::new();
        let (cert_pem, key_pem) = certified();
        let ca = files.write("ca.pem", &cert_pem);
        let key_only = files.write("key.pem", &key_pem);
        assert!(client_config(Some(Path::new(&ca)), ALPN_REST).is_ok());
        let message = client_config(Some(Path::new(&key_only)), ALPN_REST).unwrap_err();
        assert!(message.contains("no PEM certificate"), "{message}");
    }
}
