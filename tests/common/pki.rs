//! A test PKI: a CA and a server certificate it issued for localhost and 127.0.0.1, as PEM
//! files in a temp directory (ca.pem, server.pem, server.key, and other.key that matches
//! nothing), with the server.yaml lines that use them.

use std::path::PathBuf;

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
        write("server.pem", server_cert.pem());
        write("server.key", server_key.serialize_pem());
        write("other.key", other_key.serialize_pem());
        Pki { dir }
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
