//! Server-signed commands: what lets an agent's executor trust a [`Command`] without trusting
//! the network-facing daemon or the bus that carried it.
//!
//! The server signs each command's exact JSON bytes (with `agent_id` and `issued_at_ms` set)
//! with its command-signing key (ECDSA P-256, kept sealed with the CA in the store,
//! `crate::identity`); the signature travels in the bus message's `Svc-Signature` header, so
//! the body keeps the shape older agents read. The public key reaches the agent at enrolment
//! (`command-key.pem`, a self-signed certificate) and is kept where the daemon cannot change it.
//!
//! [`Verifier::check`] is the one check every agent makes before running anything, in the
//! daemon (`executor: inline`) or in the privileged executor behind a unix socket: the
//! signature, the agent id, the freshness window and that the job id was not seen before.
//! Signatures are over `"svc-command-v1\0" ‖ bytes`, so no other signature made with the same
//! algorithm can pass for a command.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::signature::{
    EcdsaKeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING,
};

use super::protocol::Command;
use crate::{Error, Result};

/// The bus header that carries a command's signature (base64url, no padding).
pub const HEADER: &str = "Svc-Signature";
/// What a signature covers, before the command bytes.
const DOMAIN: &[u8] = b"svc-command-v1\0";
/// A command older than this when it reaches the agent is refused: it was delayed or replayed.
pub const MAX_AGE: Duration = Duration::from_secs(10 * 60);
/// How far ahead of the agent's clock a command may be issued (server clock ahead).
pub const MAX_AHEAD: Duration = Duration::from_secs(2 * 60);

/// Signs commands with the server's command key (PKCS#8 from the store, unsealed per job).
pub struct Signer {
    key: EcdsaKeyPair,
}

impl Signer {
    pub fn from_pkcs8_pem(pem: &str) -> Result<Signer> {
        let key = key_pair_from_pkcs8_pem(pem)
            .map_err(|why| Error::Internal(format!("command key: {why}")))?;
        Ok(Signer { key })
    }

    /// The bytes to publish for `command` addressed to `agent_id` now, and their signature.
    pub fn sign(&self, command: &Command, agent_id: &str) -> Result<(Vec<u8>, String)> {
        let mut command = command.clone();
        command.agent_id = agent_id.to_string();
        command.issued_at_ms = crate::clock::now_millis() as u64;
        let bytes = serde_json::to_vec(&command).map_err(Error::internal)?;
        let signature = self.sign_bytes(&bytes)?;
        Ok((bytes, signature))
    }

    fn sign_bytes(&self, bytes: &[u8]) -> Result<String> {
        sign_parts(&self.key, &[DOMAIN, bytes])
            .ok_or_else(|| Error::Internal("cannot sign the command".into()))
    }
}

/// A P-256 signing key from PKCS#8 PEM (the command key, an agent's `key.pem`), for fixed-size
/// signatures. Says what is wrong without naming the file (the caller does).
pub(crate) fn key_pair_from_pkcs8_pem(pem: &str) -> std::result::Result<EcdsaKeyPair, String> {
    let (_, parsed) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|_| "not PEM".to_string())?;
    EcdsaKeyPair::from_pkcs8(
        &ECDSA_P256_SHA256_FIXED_SIGNING,
        &parsed.contents,
        &ring::rand::SystemRandom::new(),
    )
    .map_err(|_| "not a PKCS#8 P-256 key".to_string())
}

/// The signature (base64url, no padding) of the concatenation of `parts`, whose first is the
/// domain that keeps one kind of signed message from passing for another.
pub(crate) fn sign_parts(key: &EcdsaKeyPair, parts: &[&[u8]]) -> Option<String> {
    let signature = key
        .sign(&ring::rand::SystemRandom::new(), &parts.concat())
        .ok()?;
    Some(URL_SAFE_NO_PAD.encode(signature.as_ref()))
}

/// Whether `signature` (base64url) is `public_key`'s (an uncompressed P-256 point) over the
/// concatenation of `parts`.
pub(crate) fn verify_parts(public_key: &[u8], parts: &[&[u8]], signature: &str) -> bool {
    let Ok(raw) = URL_SAFE_NO_PAD.decode(signature.trim()) else {
        return false;
    };
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, public_key)
        .verify(&parts.concat(), &raw)
        .is_ok()
}

/// A short name for a set of command-signing certificates (PEM, in order): the first 16 hex
/// digits of SHA-256 over their DER. An agent reports its set's in heartbeats that carry
/// facts; the server sends a command-key notice when it is not the server's own.
pub fn key_set_id(pem: &str) -> Result<String> {
    let ders = crate::identity::ca::pem_bundle(pem)?;
    if ders.is_empty() {
        return Err(Error::Invalid("command key: no certificate".into()));
    }
    let mut id = crate::identity::ca::fingerprint(&ders.concat());
    id.truncate(16);
    Ok(id)
}

/// Why a command was not run: said back to the server in the command's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "command refused: {}", self.0)
    }
}

/// Checks commands for one agent against the server's public command keys: the current one
/// and, for a rotation's grace, the previous one (`crate::identity`, "command-key rotate").
/// The server uses it too, to know a command it issued when an agent shows it back
/// (`fleet::content`): the public keys are enough, so nothing sealed is opened per request.
pub struct Verifier {
    public_keys: Vec<Vec<u8>>,
    agent_id: String,
}

impl Verifier {
    /// From the certificates (PEM, current first) the agent got at enrolment or in a
    /// command-key notice (`command-key.pem`).
    pub fn from_certificate_pem(pem: &str, agent_id: &str) -> Result<Verifier> {
        let mut public_keys = Vec::new();
        for der in crate::identity::ca::pem_bundle(pem)? {
            let (_, cert) = <x509_parser::certificate::X509Certificate as x509_parser::prelude::FromDer<_>>::from_der(&der)
                .map_err(|_| Error::Invalid("command key: not an X.509 certificate".into()))?;
            public_keys.push(cert.public_key().subject_public_key.data.to_vec());
        }
        if public_keys.is_empty() {
            return Err(Error::Invalid("command key: no certificate".into()));
        }
        Ok(Verifier {
            public_keys,
            agent_id: agent_id.to_string(),
        })
    }

    /// The command in `bytes` when `signature` is the server's over them (who it is addressed
    /// to and when it was issued are [`check`](Self::check)'s, or the caller's).
    pub fn signed(&self, bytes: &[u8], signature: &str) -> Result<Command, Refused> {
        if signature.is_empty() {
            return Err(Refused("not signed by the server".into()));
        }
        URL_SAFE_NO_PAD
            .decode(signature.trim())
            .map_err(|_| Refused("malformed signature".into()))?;
        if !self
            .public_keys
            .iter()
            .any(|key| verify_parts(key, &[DOMAIN, bytes], signature))
        {
            return Err(Refused("the signature is not the server's".into()));
        }
        serde_json::from_slice(bytes).map_err(|e| Refused(format!("malformed command: {e}")))
    }

    /// The command in `bytes` when `signature` is the server's over them, it is addressed to
    /// this agent, and it was issued within the window around `now_ms`. Whether its job id
    /// was seen before is the caller's [`SeenJobs`].
    pub fn check(&self, bytes: &[u8], signature: &str, now_ms: u64) -> Result<Command, Refused> {
        let command = self.signed(bytes, signature)?;
        if command.agent_id != self.agent_id {
            return Err(Refused(format!(
                "addressed to agent '{}', this is '{}'",
                command.agent_id, self.agent_id
            )));
        }
        let (issued, now) = (command.issued_at_ms, now_ms);
        if issued + (MAX_AGE.as_millis() as u64) < now {
            return Err(Refused(format!(
                "issued {} s ago, more than the {} s allowed (delayed or replayed)",
                (now - issued) / 1000,
                MAX_AGE.as_secs()
            )));
        }
        if issued > now + MAX_AHEAD.as_millis() as u64 {
            return Err(Refused(format!(
                "issued {} s in this host's future (check both clocks)",
                (issued - now) / 1000
            )));
        }
        Ok(command)
    }
}

/// Job ids already run, with their issue times: a replay of a signed command within its
/// freshness window is refused. Entries older than the window are forgotten (the window
/// refuses those anyway). With a file, the ids survive a restart of the executor.
pub struct SeenJobs {
    seen: std::collections::HashMap<String, u64>,
    file: Option<std::path::PathBuf>,
}

impl SeenJobs {
    /// Loads `file` (lines `ISSUED_AT_MS JOB_ID`) when given, keeping the entries still in the
    /// window, and rewrites it with those.
    pub fn open(file: Option<std::path::PathBuf>, now_ms: u64) -> Result<SeenJobs> {
        let mut seen = std::collections::HashMap::new();
        if let Some(path) = &file {
            match std::fs::read_to_string(path) {
                Ok(text) => {
                    for line in text.lines() {
                        if let Some((at, job)) = line.split_once(' ') {
                            if let Ok(at) = at.parse::<u64>() {
                                seen.insert(job.to_string(), at);
                            }
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::Invalid(format!(
                        "cannot read {}: {e}",
                        path.display()
                    )))
                }
            }
        }
        let mut jobs = SeenJobs { seen, file };
        jobs.forget_expired(now_ms);
        jobs.rewrite()?;
        Ok(jobs)
    }

    fn forget_expired(&mut self, now_ms: u64) {
        let oldest = now_ms.saturating_sub((MAX_AGE + MAX_AHEAD).as_millis() as u64);
        self.seen.retain(|_, at| *at >= oldest);
    }

    fn rewrite(&self) -> Result<()> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let text: String = self
            .seen
            .iter()
            .map(|(job, at)| format!("{at} {job}\n"))
            .collect();
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, text)
            .and_then(|()| std::fs::rename(&temporary, path))
            .map_err(|e| Error::Invalid(format!("cannot write {}: {e}", path.display())))
    }

    /// Records `command`'s job id; Refused when it was run before.
    pub fn admit(&mut self, command: &Command, now_ms: u64) -> Result<(), Refused> {
        if self.seen.contains_key(&command.job_id) {
            return Err(Refused(format!(
                "job '{}' was already run here (replayed)",
                command.job_id
            )));
        }
        if self.seen.len() > 10_000 {
            // The file is cut back with the memory, so neither grows without bound.
            self.forget_expired(now_ms);
            if let Err(error) = self.rewrite() {
                tracing::warn!(%error, "seen job ids not rewritten");
            }
        }
        self.seen
            .insert(command.job_id.clone(), command.issued_at_ms);
        if let Some(path) = &self.file {
            use std::io::Write;
            let appended = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut file| writeln!(file, "{} {}", command.issued_at_ms, command.job_id));
            if let Err(error) = appended {
                // Kept in memory still: only a restart inside the window could replay it.
                tracing::warn!(%error, path = %path.display(), "job id not recorded on disk");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::protocol::Work;

    fn command() -> Command {
        Command {
            job_id: "J1".into(),
            timeout_ms: 1000,
            agent_id: String::new(),
            issued_at_ms: 0,
            work: Work::Exec {
                argv: vec!["true".into()],
            },
        }
    }

    fn keys() -> (Signer, Verifier) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::default()
            .self_signed(&key)
            .unwrap();
        (
            Signer::from_pkcs8_pem(&key.serialize_pem()).unwrap(),
            Verifier::from_certificate_pem(&cert.pem(), "web-01").unwrap(),
        )
    }

    #[test]
    fn signed_commands_verify_and_forgeries_do_not() {
        let (signer, verifier) = keys();
        let now = crate::clock::now_millis() as u64;
        let (bytes, signature) = signer.sign(&command(), "web-01").unwrap();
        let checked = verifier.check(&bytes, &signature, now).unwrap();
        assert_eq!(
            (checked.job_id.as_str(), checked.agent_id.as_str()),
            ("J1", "web-01")
        );

        // Unsigned, tampered, for another agent, another key, stale, from the future.
        assert!(verifier.check(&bytes, "", now).is_err());
        let tampered = String::from_utf8(bytes.clone())
            .unwrap()
            .replace("true", "reboot");
        let refused = verifier.check(tampered.as_bytes(), &signature, now);
        assert_eq!(refused.unwrap_err().0, "the signature is not the server's");
        let (other, other_signature) = signer.sign(&command(), "web-02").unwrap();
        assert!(verifier
            .check(&other, &other_signature, now)
            .unwrap_err()
            .0
            .contains("addressed to agent 'web-02'"));
        let (stranger, _) = keys();
        let (_, forged) = stranger.sign(&command(), "web-01").unwrap();
        assert!(verifier.check(&bytes, &forged, now).is_err());
        let late = now + MAX_AGE.as_millis() as u64 + 1000;
        assert!(verifier.check(&bytes, &signature, late).is_err());
        let early = now - MAX_AHEAD.as_millis() as u64 - 1000;
        assert!(verifier.check(&bytes, &signature, early).is_err());
    }

    #[test]
    fn a_set_of_keys_verifies_with_any_of_them_and_has_an_id() {
        let pair = || {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::default()
                .self_signed(&key)
                .unwrap()
                .pem();
            (Signer::from_pkcs8_pem(&key.serialize_pem()).unwrap(), cert)
        };
        let ((new, new_pem), (old, old_pem), (stranger, _)) = (pair(), pair(), pair());
        let both = format!("{new_pem}{old_pem}");
        let verifier = Verifier::from_certificate_pem(&both, "web-01").unwrap();
        let now = crate::clock::now_millis() as u64;
        for signer in [&new, &old] {
            let (bytes, signature) = signer.sign(&command(), "web-01").unwrap();
            assert!(verifier.check(&bytes, &signature, now).is_ok());
        }
        let (bytes, signature) = stranger.sign(&command(), "web-01").unwrap();
        assert!(verifier.check(&bytes, &signature, now).is_err());
        // Retired: the set without the old key refuses what it signs.
        let (bytes, signature) = old.sign(&command(), "web-01").unwrap();
        let current = Verifier::from_certificate_pem(&new_pem, "web-01").unwrap();
        assert!(current.check(&bytes, &signature, now).is_err());

        let id = key_set_id(&both).unwrap();
        assert_eq!(id.len(), 16);
        assert_eq!(id, key_set_id(&format!("junk\n{both}")).unwrap());
        assert_ne!(id, key_set_id(&new_pem).unwrap());
        assert_ne!(id, key_set_id(&format!("{old_pem}{new_pem}")).unwrap());
        assert!(key_set_id("").is_err());
        assert!(Verifier::from_certificate_pem("", "web-01").is_err());
    }

    #[test]
    fn a_job_id_runs_once_even_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("seen-jobs");
        let now = crate::clock::now_millis() as u64;
        let mut command = command();
        command.issued_at_ms = now;
        let mut seen = SeenJobs::open(Some(file.clone()), now).unwrap();
        seen.admit(&command, now).unwrap();
        assert!(seen.admit(&command, now).is_err());
        let mut reopened = SeenJobs::open(Some(file.clone()), now).unwrap();
        assert!(reopened.admit(&command, now).is_err());
        // Past the window the entry is forgotten (the window refuses the command itself).
        let later = now + (MAX_AGE + MAX_AHEAD).as_millis() as u64 + 1;
        let mut much_later = SeenJobs::open(Some(file), later).unwrap();
        assert!(much_later.admit(&command, later).is_ok());
    }
}
