//! The embedded CA's cryptography: making the root and signing CAs, sealing their keys under
//! master_key, issuing agent certificates from CSRs, and checking an agent certificate
//! against the current signing CA.
//!
//! Pure functions over PEM text and bytes: no store, no I/O. Keys are ECDSA P-256 (rcgen's
//! default, signed with ring); agents use the same algorithm, so the bus can check a nonce
//! signature with ring alone.

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::{clock, Error, Result};

/// How long each certificate lives. The root outlives several signing CAs; an agent
/// re-bootstraps within a year (or at a rotation).
const ROOT_DAYS: i64 = 3650;
const SIGNING_DAYS: i64 = 730;
pub(crate) const AGENT_DAYS: i64 = 365;

/// The URI SAN every agent certificate carries.
pub fn spiffe_id(agent_id: &str) -> String {
    format!("spiffe://svc/agent/{agent_id}")
}

/// A freshly made certificate with its cleartext PKCS#8 key (sealed before it is stored).
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What `ca info` shows about one certificate.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CertificateInfo {
    pub subject: String,
    pub fingerprint: String,
    pub not_before: String,
    pub not_after: String,
}

fn rcgen_error(error: rcgen::Error) -> Error {
    Error::Internal(format!("certificate: {error}"))
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f; // a positive INTEGER
    SerialNumber::from_slice(&bytes)
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    // An hour of slack for clocks that are a little behind.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(days);
}

fn ca_params(common_name: &str, path_length: u8, days: i64) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "svc");
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(path_length));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(random_serial());
    validity(&mut params, days);
    params
}

/// A new self-signed root CA.
pub fn make_root() -> Result<Issued> {
    let key = KeyPair::generate().map_err(rcgen_error)?;
    let cert = ca_params("svc root CA", 1, ROOT_DAYS)
        .self_signed(&key)
        .map_err(rcgen_error)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The server's command-signing key (`crate::fleet::signature`): a certificate that is no CA,
/// self-signed for the first key, issued by the root CA for a rotated one (an agent learning
/// it from a notice checks that it chains to the root it trusts). Agents take only its
/// public key from it; its fingerprint and validity show in the `ca` table like the CA's.
pub fn make_command_key(root: Option<&Issued>) -> Result<Issued> {
    let key = KeyPair::generate().map_err(rcgen_error)?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "svc");
    name.push(DnType::CommonName, "svc command signing");
    params.distinguished_name = name;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.serial_number = Some(random_serial());
    validity(&mut params, ROOT_DAYS);
    let cert = match root {
        None => params.self_signed(&key),
        Some(root) => {
            let root_key = KeyPair::from_pem(&root.key_pem).map_err(rcgen_error)?;
            let issuer = Issuer::from_ca_cert_pem(&root.cert_pem, root_key).map_err(rcgen_error)?;
            params.signed_by(&key, &issuer)
        }
    }
    .map_err(rcgen_error)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The DER of each certificate in a PEM bundle, in order (other blocks are skipped).
pub fn pem_bundle(pem: &str) -> Result<Vec<Vec<u8>>> {
    let mut ders = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| Error::Invalid(format!("not PEM certificates: {e}")))?;
        if block.label == "CERTIFICATE" {
            ders.push(block.contents);
        }
    }
    Ok(ders)
}

/// Whether the certificate `der` carries a valid signature of `issuer_der`'s key, under its
/// name.
pub fn is_issued_by(der: &[u8], issuer_der: &[u8]) -> bool {
    let (Ok(cert), Ok(issuer)) = (parse(der), parse(issuer_der)) else {
        return false;
    };
    cert.issuer() == issuer.subject() && cert.verify_signature(Some(issuer.public_key())).is_ok()
}

/// A new signing CA under `root`. Its name carries the time it was made, so certificates
/// from different generations never share an issuer name.
pub fn make_signing(root: &Issued) -> Result<Issued> {
    let root_key = KeyPair::from_pem(&root.key_pem).map_err(rcgen_error)?;
    let issuer = Issuer::from_ca_cert_pem(&root.cert_pem, root_key).map_err(rcgen_error)?;
    let key = KeyPair::generate().map_err(rcgen_error)?;
    let name = format!("svc signing CA {}", clock::now_rfc3339());
    let cert = ca_params(&name, 0, SIGNING_DAYS)
        .signed_by(&key, &issuer)
        .map_err(rcgen_error)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Issues the certificate of `agent_id` for the public key in `csr_pem` (whose signature
/// proves the requester holds the key). Only the key is taken from the CSR; the name, SAN
/// and usages are ours.
pub fn issue_agent(signing: &Issued, agent_id: &str, csr_pem: &str) -> Result<String> {
    let csr = CertificateSigningRequestParams::from_pem(csr_pem)
        .map_err(|e| Error::Invalid(format!("invalid CSR: {e}")))?;
    let key = KeyPair::from_pem(&signing.key_pem).map_err(rcgen_error)?;
    let issuer = Issuer::from_ca_cert_pem(&signing.cert_pem, key).map_err(rcgen_error)?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "svc");
    name.push(DnType::CommonName, agent_id);
    params.distinguished_name = name;
    let uri = spiffe_id(agent_id)
        .try_into()
        .map_err(|_| Error::Invalid(format!("agent id '{agent_id}' is not ASCII")))?;
    params.subject_alt_names = vec![SanType::URI(uri)];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.serial_number = Some(random_serial());
    validity(&mut params, AGENT_DAYS);
    let cert = params
        .signed_by(&csr.public_key, &issuer)
        .map_err(rcgen_error)?;
    Ok(cert.pem())
}

/// The DER inside a PEM certificate.
pub fn pem_to_der(pem: &str) -> Result<Vec<u8>> {
    let (_, parsed) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|_| Error::Invalid("not a PEM certificate".into()))?;
    Ok(parsed.contents)
}

/// Hex SHA-256 of the DER.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>> {
    X509Certificate::from_der(der)
        .map(|(_, cert)| cert)
        .map_err(|_| Error::Invalid("not an X.509 certificate".into()))
}

/// Subject, fingerprint and validity of a PEM certificate.
pub fn describe(pem: &str) -> Result<CertificateInfo> {
    let der = pem_to_der(pem)?;
    let cert = parse(&der)?;
    let time = |t: &x509_parser::time::ASN1Time| clock::format_rfc3339(t.timestamp() * 1000);
    Ok(CertificateInfo {
        subject: cert.subject().to_string(),
        fingerprint: fingerprint(&der),
        not_before: time(&cert.validity().not_before),
        not_after: time(&cert.validity().not_after),
    })
}

/// An agent identity that checked out: who it is and the key that signed.
pub struct VerifiedAgent {
    pub agent_id: String,
    pub fingerprint: String,
}

/// Checks that `agent_der` was issued by `signing_pem` (the current signing CA), is within
/// its validity, names an agent in its spiffe SAN, and that `signature` over `nonce` was made
/// with its key. A certificate from a rotated-out signing CA fails the issuer check.
pub fn verify_agent(
    signing_pem: &str,
    agent_der: &[u8],
    nonce: &[u8],
    signature: Option<&[u8]>,
) -> Result<VerifiedAgent> {
    let denied = |why: &str| Error::Unauthenticated(format!("agent certificate: {why}"));
    let signing_der = pem_to_der(signing_pem)?;
    let signing = parse(&signing_der)?;
    let cert = parse(agent_der).map_err(|_| denied("not a certificate"))?;
    if cert.issuer() != signing.subject() {
        return Err(denied("not issued by the current signing CA"));
    }
    cert.verify_signature(Some(signing.public_key()))
        .map_err(|_| denied("bad issuer signature"))?;
    if !cert.validity().is_valid() {
        return Err(denied("expired or not yet valid"));
    }
    let agent_id = agent_id_of(&cert).ok_or_else(|| denied("no spiffe://svc/agent/ SAN"))?;
    if let Some(signature) = signature {
        let key = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_ASN1,
            cert.public_key().subject_public_key.data.as_ref(),
        );
        key.verify(nonce, signature)
            .map_err(|_| denied("nonce signature does not verify"))?;
    }
    Ok(VerifiedAgent {
        agent_id,
        fingerprint: fingerprint(agent_der),
    })
}

/// The agent id in a PEM certificate's `spiffe://svc/agent/<id>` SAN (what the bus will
/// take the holder to be).
pub fn agent_id_in(cert_pem: &str) -> Option<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    agent_id_of(&cert)
}

fn agent_id_of(cert: &X509Certificate<'_>) -> Option<String> {
    let names = cert.subject_alternative_name().ok()??;
    names
        .value
        .general_names
        .iter()
        .find_map(|name| match name {
            GeneralName::URI(uri) => uri
                .strip_prefix("spiffe://svc/agent/")
                .filter(|id| !id.is_empty())
                .map(str::to_string),
            _ => None,
        })
}

/// Seals `plaintext` with AES-256-GCM: base64 of nonce ‖ ciphertext ‖ tag. `context` is bound
/// as associated data, so a sealed value cannot be moved to another row.
pub fn seal(key: &[u8; 32], context: &str, plaintext: &[u8]) -> Result<String> {
    use base64::Engine;
    let sealing = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).map_err(Error::internal)?);
    let nonce_bytes: [u8; NONCE_LEN] = rand::random();
    let mut data = plaintext.to_vec();
    sealing
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce_bytes),
            Aad::from(context.as_bytes()),
            &mut data,
        )
        .map_err(Error::internal)?;
    let mut out = nonce_bytes.to_vec();
    out.extend_from_slice(&data);
    Ok(base64::engine::general_purpose::STANDARD.encode(out))
}

/// Opens what [`seal`] made; fails when the key or context differ.
pub fn open(key: &[u8; 32], context: &str, sealed: &str) -> Result<Vec<u8>> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(sealed)
        .map_err(|_| Error::Internal("sealed value is not base64".into()))?;
    if bytes.len() < NONCE_LEN {
        return Err(Error::Internal("sealed value is too short".into()));
    }
    let (nonce, data) = bytes.split_at(NONCE_LEN);
    let opening = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).map_err(Error::internal)?);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(Error::internal)?;
    let mut data = data.to_vec();
    let plain = opening
        .open_in_place(nonce, Aad::from(context.as_bytes()), &mut data)
        .map_err(|_| {
            Error::Internal(format!(
                "cannot decrypt {context}: wrong master_key or damaged data"
            ))
        })?;
    Ok(plain.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_round_trip_and_context_binding() {
        let key = [7u8; 32];
        let sealed = seal(&key, "ca:root:1", b"secret key").unwrap();
        assert_eq!(open(&key, "ca:root:1", &sealed).unwrap(), b"secret key");
        assert!(open(&key, "ca:root:2", &sealed).is_err());
        assert!(open(&[8u8; 32], "ca:root:1", &sealed).is_err());
    }

    #[test]
    fn a_rotated_command_key_is_issued_by_the_root() {
        let root = make_root().unwrap();
        let other = make_root().unwrap();
        let first = make_command_key(None).unwrap();
        let rotated = make_command_key(Some(&root)).unwrap();
        let der = |issued: &Issued| pem_to_der(&issued.cert_pem).unwrap();
        assert!(is_issued_by(&der(&rotated), &der(&root)));
        assert!(!is_issued_by(&der(&rotated), &der(&other)));
        assert!(!is_issued_by(&der(&first), &der(&root)));
        assert!(!is_issued_by(b"junk", &der(&root)));
        let bundle = format!("{}{}", rotated.cert_pem, first.cert_pem);
        assert_eq!(pem_bundle(&bundle).unwrap(), [der(&rotated), der(&first)]);
    }

    #[test]
    fn issued_agent_verifies_against_its_signing_ca_only() {
        let root = make_root().unwrap();
        let signing = make_signing(&root).unwrap();
        let other = make_signing(&root).unwrap();
        let agent_key = KeyPair::generate().unwrap();
        let csr = CertificateParams::default()
            .serialize_request(&agent_key)
            .unwrap()
            .pem()
            .unwrap();
        let cert_pem = issue_agent(&signing, "web-01", &csr).unwrap();
        let der = pem_to_der(&cert_pem).unwrap();
        let signer = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &agent_key.serialize_der(),
            &ring::rand::SystemRandom::new(),
        )
        .unwrap();
        let signature = signer
            .sign(&ring::rand::SystemRandom::new(), b"nonce")
            .unwrap();
        let verified =
            verify_agent(&signing.cert_pem, &der, b"nonce", Some(signature.as_ref())).unwrap();
        assert_eq!(verified.agent_id, "web-01");
        assert!(verify_agent(&signing.cert_pem, &der, b"other", Some(signature.as_ref())).is_err());
        assert!(verify_agent(&other.cert_pem, &der, b"nonce", Some(signature.as_ref())).is_err());
        assert_eq!(
            describe(&root.cert_pem).unwrap().subject,
            "O=svc, CN=svc root CA"
        );
    }
}
