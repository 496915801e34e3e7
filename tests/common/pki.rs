//! A test PKI: a CA and a server certificate it issued for localhost and 127.0.0.1, as PEM
//! files in a temp directory (ca.pem, ca.key, server.pem, server.key, and other.key that
//! matches nothing), with the server.yaml lines that use them, and client certificates on
//! demand.

use std::path::PathBuf;

use rustls::pki_types::pem::PemObject;

/// A CA and a server certificate for localhost / 127.0.0.1 it issued, as PEM files.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "svc test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let server_cert = params.signed_by(&server_key, &issuer).unwrap();

        let other_key = KeyPair::generate().unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.pem", ca_cert.pem());
        write("ca.key", issuer.key().serialize_pem());
        write("server.pem", server_cert.pem());
        write("server.key", server_key.serialize_pem());
        write("other.key", other_key.serialize_pem());
        Pki { dir }
    }

    /// A TLS client certificate (clientAuth) with the URI SAN `uri`, issued by this CA:
    /// the certificate then the CA (a chain, DER) and its PKCS#8 key.
    pub fn client(
        &self,
        uri: &str,
    ) -> (
        Vec<rustls::pki_types::CertificateDer<'static>>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ) {
        use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, Issuer, KeyPair, SanType};
        let read = |name: &str| std::fs::read_to_string(self.path(name)).unwrap();
        let ca_key = KeyPair::from_pem(&read("ca.key")).unwrap();
        let issuer = Issuer::from_ca_cert_pem(&read("ca.pem"), ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer).unwrap();
        let ca = rustls::pki_types::CertificateDer::from_pem_slice(read("ca.pem").as_bytes());
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
        (vec![cert.der().clone(), ca.unwrap()], key.into())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `{ cert: PATH, key: PATH }` for files of this directory by name ("" stays empty).
    pub fn pair(&self, cert: &str, key: &str) -> String {
        let quoted = |name: &str| match name {
            "" => "\"\"".to_string(),
            name => self.path(name).display().to_string(),
        };
        format!("{{ cert: {}, key: {} }}", quoted(cert), quoted(key))
    }

    /// server.yaml lines setting `tls` (REST and gRPC).
    pub fn config_yaml(&self, cert: &str, key: &str) -> String {
        format!("tls: {}\n", self.pair(cert, key))
    }

    /// server.yaml lines setting `bus.tls` (the embedded broker).
    pub fn bus_config_yaml(&self, cert: &str, key: &str) -> String {
        format!("bus:\n  tls: {}\n", self.pair(cert, key))
    }
}
