//! Agent-signed results and heartbeats: the second proof of who sent one, beside the subject.
//!
//! The bus lets an agent publish only under its own `svc.agent.<id>.` (the embedded broker's
//! grant, or its user JWT on a JWT-mode cluster), so the subject already names the sender.
//! As defence in depth, and for clusters whose NATS enforces nothing (`external_auth: token`),
//! each agent also signs every result and heartbeat with its identity key (the P-256 key of
//! the certificate the embedded CA issued it), and the server drops what does not verify.
//!
//! The signature mirrors the server's on commands (`signature.rs`): ECDSA P-256, fixed-size,
//! base64url in the `Svc-Signature` header, over `"svc-agent-v1\0" ‖ subject ‖ "\0" ‖ the
//! exact payload bytes`. The subject binds the agent and the kind of message; a result's
//! `job_id` binds it to one job (a new job has a new id, so an old result cannot answer it);
//! a heartbeat's `sent_at_ms` must be within [`HEARTBEAT_WINDOW`] of the server's clock and
//! newer than the last one accepted from the agent.
//!
//! The public key is recorded at enrolment (`agents.public_key`, when the request says the
//! agent signs) and cached decoded in the registry, so the hot path costs one verification
//! and no store read. What is dropped is counted (`svc_agent_messages_forged_total`) and
//! audited by the agent's owner as `agent.result_forged` / `agent.heartbeat_forged`, outcome
//! `denied`: at most one row per agent and kind every [`AUDIT_EVERY`], carrying how many were
//! dropped since the last, so a flood of forgeries cannot flood the audit chain.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ring::signature::{EcdsaKeyPair, KeyPair};

use super::signature::{key_pair_from_pkcs8_pem, sign_parts, verify_parts};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::{Error, Result};

/// The header the signature travels in: the same as commands'.
pub use super::signature::HEADER;

/// What a signature covers, before the subject and payload.
const DOMAIN: &[u8] = b"svc-agent-v1\0";
/// How far a signed heartbeat's send time may be from the server's clock, either way.
pub const HEARTBEAT_WINDOW: Duration = super::signature::MAX_AHEAD;
/// At most one audit row per agent and kind this often; the ones in between are counted in
/// the next row.
pub const AUDIT_EVERY: Duration = Duration::from_secs(60);
/// After a message fails to verify, the agent's row is read again (it may have enrolled
/// again through another cluster member), at most this often.
const RELOAD_EVERY: Duration = Duration::from_secs(5);
/// Room a signature header takes in a bus message (`NATS/1.0`, the header line, CRLFs):
/// what the agent leaves free when it fits a message to `max_payload`.
pub const HEADER_ROOM: usize = 128;

/// Signs an agent's results and heartbeats with the key of its certificate (`key.pem`).
pub struct AgentSigner {
    key: EcdsaKeyPair,
}

impl AgentSigner {
    pub fn from_pkcs8_pem(pem: &str) -> Result<AgentSigner> {
        let key = key_pair_from_pkcs8_pem(pem)
            .map_err(|why| Error::Invalid(format!("key.pem: {why}")))?;
        Ok(AgentSigner { key })
    }

    /// The `Svc-Signature` value for `payload` published on `subject`.
    pub fn sign(&self, subject: &str, payload: &[u8]) -> Result<String> {
        sign_parts(&self.key, &[DOMAIN, subject.as_bytes(), b"\0", payload])
            .ok_or_else(|| Error::Internal("cannot sign the message".into()))
    }

    /// The public key (base64url of the P-256 point), as the server records it.
    pub fn public_key(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.key.public_key().as_ref())
    }

    /// Headers carrying the signature of `payload` on `subject`.
    pub fn headers(&self, subject: &str, payload: &[u8]) -> Result<async_nats::HeaderMap> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(HEADER, self.sign(subject, payload)?.as_str());
        Ok(headers)
    }
}

/// Whether `signature` is `public_key`'s over `payload` on `subject`.
pub fn verify(public_key: &[u8], subject: &str, payload: &[u8], signature: &str) -> bool {
    verify_parts(
        public_key,
        &[DOMAIN, subject.as_bytes(), b"\0", payload],
        signature,
    )
}

/// The public key of an agent certificate (PEM), base64url of its P-256 point: what enrolment
/// records.
pub fn public_key_of(certificate_pem: &str) -> Result<String> {
    use base64::Engine;
    let der = crate::identity::ca::pem_to_der(certificate_pem)?;
    let (_, cert) = <x509_parser::certificate::X509Certificate as x509_parser::prelude::FromDer<
        _,
    >>::from_der(&der)
    .map_err(|_| Error::Invalid("agent certificate: not X.509".into()))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(cert.public_key().subject_public_key.data.as_ref()))
}

/// What kind of message was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Result,
    Heartbeat,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Result => "result",
            Kind::Heartbeat => "heartbeat",
        }
    }

    fn action(self) -> &'static str {
        match self {
            Kind::Result => "agent.result_forged",
            Kind::Heartbeat => "agent.heartbeat_forged",
        }
    }
}

/// One message from an agent, as the server's subscription got it.
pub struct Incoming<'a> {
    pub agent_id: &'a str,
    pub subject: &'a str,
    pub payload: &'a [u8],
    /// The `Svc-Signature` header; empty when there is none.
    pub signature: &'a str,
    pub kind: Kind,
    /// A result's job id, for the audit row.
    pub job_id: Option<&'a str>,
    /// A heartbeat's `sent_at_ms`.
    pub sent_at_ms: Option<u64>,
}

/// Dropped messages: counts for the metric, and per agent and kind when the last audit row
/// was written and how many were dropped since. Keyed by enrolled agents only (a message
/// from an unknown agent is dropped before it is counted), so it is bounded by the fleet.
#[derive(Default)]
pub struct Forgeries {
    results: AtomicU64,
    heartbeats: AtomicU64,
    tallies: Mutex<HashMap<(String, Kind), Tally>>,
}

#[derive(Default)]
struct Tally {
    last_row: Option<Instant>,
    unreported: u64,
    last_reload: Option<Instant>,
}

impl Forgeries {
    /// Counts one dropped message; Some(how many to report) when an audit row is due.
    pub fn count(&self, agent_id: &str, kind: Kind, now: Instant) -> Option<u64> {
        match kind {
            Kind::Result => &self.results,
            Kind::Heartbeat => &self.heartbeats,
        }
        .fetch_add(1, Ordering::Relaxed);
        let mut tallies = self.tallies.lock().expect("forgeries lock poisoned");
        let tally = tallies.entry((agent_id.to_string(), kind)).or_default();
        tally.unreported += 1;
        if tally
            .last_row
            .is_some_and(|last| now.duration_since(last) < AUDIT_EVERY)
        {
            return None;
        }
        tally.last_row = Some(now);
        Some(std::mem::take(&mut tally.unreported))
    }

    /// Whether the agent's row may be read again from the store now (and notes that it is).
    fn may_reload(&self, agent_id: &str, kind: Kind, now: Instant) -> bool {
        let mut tallies = self.tallies.lock().expect("forgeries lock poisoned");
        let tally = tallies.entry((agent_id.to_string(), kind)).or_default();
        if tally
            .last_reload
            .is_some_and(|last| now.duration_since(last) < RELOAD_EVERY)
        {
            return false;
        }
        tally.last_reload = Some(now);
        true
    }

    /// Dropped results and heartbeats since start.
    pub fn totals(&self) -> [(Kind, u64); 2] {
        [
            (Kind::Result, self.results.load(Ordering::Relaxed)),
            (Kind::Heartbeat, self.heartbeats.load(Ordering::Relaxed)),
        ]
    }
}

/// Why a message is refused; None when it is accepted.
fn judge(
    public_key: Option<&[u8]>,
    accept_unsigned: bool,
    message: &Incoming<'_>,
    now_ms: u64,
) -> Option<String> {
    let Some(public_key) = public_key else {
        return (!accept_unsigned)
            .then(|| "the agent has no key on record and unsigned messages are refused".into());
    };
    if message.signature.is_empty() {
        return Some("not signed".into());
    }
    if !verify(
        public_key,
        message.subject,
        message.payload,
        message.signature,
    ) {
        return Some("the signature is not the agent's".into());
    }
    if message.kind == Kind::Heartbeat {
        let Some(sent) = message.sent_at_ms else {
            return Some("signed heartbeat without sent_at_ms".into());
        };
        let window = HEARTBEAT_WINDOW.as_millis() as u64;
        if sent + window < now_ms || sent > now_ms + window {
            return Some(format!(
                "sent at {sent}, more than {} s from this server's clock (replayed, or check both clocks)",
                HEARTBEAT_WINDOW.as_secs()
            ));
        }
    }
    None
}

/// Whether the server takes `message`: true when it verifies against the agent's key on
/// record (or the agent has none and `agents.accept_unsigned` allows it). A message that does
/// not is dropped by the caller; here it is counted, logged and audited (rate-limited).
pub async fn admit(domain: &Arc<Domain>, message: Incoming<'_>) -> bool {
    let registry = &domain.fleet.registry;
    let agent_id = message.agent_id;
    let mut key = registry.public_key(agent_id);
    if key.is_none() {
        // Enrolled since the registry was loaded (or through another member): read it once.
        match domain.store.get_agent(agent_id).await {
            Ok(Some(row)) => {
                registry.update(row);
                key = registry.public_key(agent_id);
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(agent_id, %error, "cannot read agent"),
        }
    }
    let Some(mut key) = key else {
        tracing::warn!(
            agent_id,
            kind = message.kind.as_str(),
            "message from an agent that is not enrolled dropped"
        );
        return false;
    };
    let accept_unsigned = domain.fleet.accept_unsigned;
    let now_ms = crate::clock::now_millis() as u64;
    let mut refusal = judge(key.as_deref(), accept_unsigned, &message, now_ms);
    let forgeries = &domain.fleet.forgeries;
    if refusal.is_some() && forgeries.may_reload(agent_id, message.kind, Instant::now()) {
        // The agent may have enrolled again through another member, with a new key.
        if let Ok(Some(row)) = domain.store.get_agent(agent_id).await {
            registry.update(row);
            if let Some(fresh) = registry.public_key(agent_id) {
                if fresh != key {
                    key = fresh;
                    refusal = judge(key.as_deref(), accept_unsigned, &message, now_ms);
                }
            }
        }
    }
    if refusal.is_none() && key.is_some() && message.kind == Kind::Heartbeat {
        let sent = message.sent_at_ms.unwrap_or_default();
        if !registry.advance_heartbeat(agent_id, sent) {
            refusal = Some("not newer than the last heartbeat accepted (replayed)".into());
        }
    }
    let Some(reason) = refusal else {
        return true;
    };
    tracing::warn!(
        agent_id,
        kind = message.kind.as_str(),
        job_id = message.job_id.unwrap_or_default(),
        %reason,
        "forged {} dropped",
        message.kind.as_str()
    );
    // One row per cluster: a heartbeat is checked by every member and its row written by the
    // agent's owner; a result only by the member whose job waits for it (server/fleet.rs drops
    // the others' unread), which writes the row.
    let Some(count) = forgeries.count(agent_id, message.kind, Instant::now()) else {
        return false;
    };
    if message.kind == Kind::Heartbeat && !domain.cluster.owns(agent_id) {
        return false;
    }
    let principal = Principal {
        id: format!("agent:{agent_id}"),
        name: agent_id.to_string(),
        role: Role::Readonly,
    };
    let mut detail = serde_json::json!({
        "reason": reason,
        "subject": message.subject,
        "dropped": count,
        "window_seconds": AUDIT_EVERY.as_secs(),
    });
    if let Some(job_id) = message.job_id {
        detail["job_id"] = serde_json::json!(job_id);
    }
    let action = Action::new(message.kind.action(), "agent", agent_id).detail(detail);
    let domain = domain.clone();
    // Off the subscription's loop: the row waits for its group commit.
    tokio::spawn(async move {
        domain
            .auditor
            .record_failure(&principal, action, &Error::Unauthenticated(reason))
            .await;
    });
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> (AgentSigner, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let signer = AgentSigner::from_pkcs8_pem(&key.serialize_pem()).unwrap();
        (signer, key.public_key_raw().to_vec())
    }

    fn message<'a>(payload: &'a [u8], signature: &'a str, kind: Kind) -> Incoming<'a> {
        let subject = match kind {
            Kind::Result => "svc.agent.web-01.result",
            Kind::Heartbeat => "svc.agent.web-01.heartbeat",
        };
        Incoming {
            agent_id: "web-01",
            subject,
            payload,
            signature,
            kind,
            job_id: None,
            sent_at_ms: None,
        }
    }

    #[test]
    fn results_verify_only_with_the_agents_key_on_their_subject() {
        let (signer, public_key) = agent();
        let (stranger, _) = agent();
        let payload = br#"{"job_id":"J1","kind":"exec","exit_code":0}"#;
        let signature = signer.sign("svc.agent.web-01.result", payload).unwrap();
        let forged = stranger.sign("svc.agent.web-01.result", payload).unwrap();
        let elsewhere = signer.sign("svc.agent.web-02.result", payload).unwrap();
        let tampered = br#"{"job_id":"J1","kind":"exec","exit_code":1}"#;
        let now = crate::clock::now_millis() as u64;
        let cases: [(&[u8], &str, Option<&str>); 5] = [
            (payload, &signature, None),
            (payload, "", Some("not signed")),
            (payload, &forged, Some("the signature is not the agent's")),
            (
                payload,
                &elsewhere,
                Some("the signature is not the agent's"),
            ),
            (
                tampered,
                &signature,
                Some("the signature is not the agent's"),
            ),
        ];
        for (payload, signature, expected) in cases {
            let got = judge(
                Some(&public_key),
                true,
                &message(payload, signature, Kind::Result),
                now,
            );
            assert_eq!(got.as_deref(), expected, "{signature:?}");
        }
        // The signer's own public key is what enrolment records.
        use base64::Engine;
        let recorded = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(signer.public_key())
            .unwrap();
        assert_eq!(recorded, public_key);
    }

    #[test]
    fn agents_without_a_key_on_record_follow_the_setting() {
        let unsigned = message(b"{}", "", Kind::Result);
        assert_eq!(judge(None, true, &unsigned, 0), None);
        assert!(judge(None, false, &unsigned, 0).is_some());
    }

    #[test]
    fn heartbeats_must_be_fresh() {
        let (signer, public_key) = agent();
        let now = crate::clock::now_millis() as u64;
        let window = HEARTBEAT_WINDOW.as_millis() as u64;
        let cases = [
            (Some(now), true),
            (Some(now - window + 1000), true),
            (Some(now + window - 1000), true),
            (Some(now - window - 1000), false),
            (Some(now + window + 1000), false),
            (None, false),
        ];
        for (sent_at_ms, accepted) in cases {
            let payload = b"{\"version\":\"1\"}";
            let signature = signer.sign("svc.agent.web-01.heartbeat", payload).unwrap();
            let mut beat = message(payload, &signature, Kind::Heartbeat);
            beat.sent_at_ms = sent_at_ms;
            let got = judge(Some(&public_key), true, &beat, now);
            assert_eq!(got.is_none(), accepted, "{sent_at_ms:?}: {got:?}");
        }
    }

    #[test]
    fn audit_rows_are_one_per_agent_and_kind_per_window() {
        let forgeries = Forgeries::default();
        let start = Instant::now();
        let count =
            |agent: &str, kind, after: Duration| forgeries.count(agent, kind, start + after);
        assert_eq!(count("a", Kind::Result, Duration::ZERO), Some(1));
        assert_eq!(count("a", Kind::Result, Duration::from_secs(1)), None);
        assert_eq!(count("a", Kind::Result, Duration::from_secs(2)), None);
        assert_eq!(count("a", Kind::Heartbeat, Duration::from_secs(2)), Some(1));
        assert_eq!(count("b", Kind::Result, Duration::from_secs(2)), Some(1));
        // The two left out, and this one.
        assert_eq!(count("a", Kind::Result, AUDIT_EVERY), Some(3));
        let totals = forgeries.totals();
        assert_eq!(totals, [(Kind::Result, 5), (Kind::Heartbeat, 1)]);
    }

    #[test]
    fn the_public_key_of_a_certificate_is_its_keys() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::default()
            .self_signed(&key)
            .unwrap();
        let signer = AgentSigner::from_pkcs8_pem(&key.serialize_pem()).unwrap();
        assert_eq!(public_key_of(&cert.pem()).unwrap(), signer.public_key());
    }
}
