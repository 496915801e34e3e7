//! Keeping the agent's NATS user JWT fresh (cluster mode with `bus.external_auth: jwt`).
//!
//! The JWT is short-lived (`agents.bus_jwt_ttl` on the server, a day by default) because
//! nats-server cannot take one back before it expires. At half its life the daemon asks for a
//! new one on `svc.enroll.renew`, over a connection made with the cluster's enrolment JWT, so
//! a renewal works even after the agent's own JWT has expired (a host that was off for a
//! week). The request is signed with the agent's identity key and carries its certificate:
//! the server renews only the latest enrolment of an agent that still exists.

use std::path::Path;
use std::time::Duration;

use base64::Engine;

use super::{BUS_JWT_FILE, BUS_NKEY_FILE, ENROL_JWT_FILE};
use crate::bus::subjects;
use crate::config::AgentConfig;
use crate::identity::nats::{renew_message, RenewRequest, Renewed};

const TIMEOUT: Duration = Duration::from_secs(15);
/// After a failed renewal, the next attempt (with the JWT still valid, or not).
const RETRY: Duration = Duration::from_secs(30);

/// Whether this agent logs in with a NATS JWT at all.
pub fn uses_jwt(state_dir: &Path) -> bool {
    state_dir.join(BUS_JWT_FILE).exists()
}

/// Seconds until the JWT in `state_dir` is past half its life (0: now), from its claims.
fn due_in(state_dir: &Path) -> Result<u64, String> {
    let file = state_dir.join(BUS_JWT_FILE);
    let jwt = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let claims = crate::bus::natsjwt::claims(jwt.trim()).map_err(|e| e.to_string())?;
    let (Some(issued), Some(expires)) = (claims["iat"].as_i64(), claims["exp"].as_i64()) else {
        return Ok(u64::MAX); // no expiry: nothing to renew
    };
    let due = issued + (expires - issued) / 2;
    let now = crate::clock::now_millis() / 1000;
    Ok(due.saturating_sub(now).max(0) as u64)
}

/// Renews the JWT now if it is past half its life; an error says why it could not be.
pub async fn renew_if_due(config: &AgentConfig) -> Result<(), String> {
    if due_in(&config.agent.state_dir)? == 0 {
        renew(config).await?;
    }
    Ok(())
}

/// Renews the JWT at half-life, for as long as the daemon runs.
pub async fn keep_renewed(config: AgentConfig) {
    loop {
        let wait = match due_in(&config.agent.state_dir) {
            Ok(u64::MAX) => return,
            Ok(seconds) => Duration::from_secs(seconds),
            Err(error) => {
                tracing::warn!(%error, "cannot read the bus JWT");
                RETRY
            }
        };
        tokio::time::sleep(wait).await;
        match renew(&config).await {
            Ok(()) => tracing::info!("bus JWT renewed"),
            Err(error) => {
                tracing::warn!(%error, "bus JWT not renewed; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

async fn renew(config: &AgentConfig) -> Result<(), String> {
    let state_dir = &config.agent.state_dir;
    let read = |name: &str| {
        std::fs::read_to_string(state_dir.join(name))
            .map(|text| text.trim().to_string())
            .map_err(|e| {
                format!(
                    "{}: {e} (run svc-agent bootstrap)",
                    state_dir.join(name).display()
                )
            })
    };
    let enrol_jwt = read(ENROL_JWT_FILE)?;
    let key = crate::bus::natsjwt::key_pair(&read(BUS_NKEY_FILE)?).map_err(|e| e.to_string())?;
    let (certificate, signer) = super::bus_credentials(state_dir).map_err(|e| e.to_string())?;
    let bus_nkey = key.public_key();
    let issued_at_ms = crate::clock::now_millis();
    let signature = signer
        .sign(
            &ring::rand::SystemRandom::new(),
            &renew_message(&bus_nkey, issued_at_ms),
        )
        .map_err(|_| "cannot sign the renewal".to_string())?;
    let request = RenewRequest {
        certificate,
        bus_nkey,
        issued_at_ms,
        signature: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature.as_ref()),
    };
    let ca_file =
        (!config.nats.ca_file.is_empty()).then(|| std::path::PathBuf::from(&config.nats.ca_file));
    let options = super::with_bus_tls(
        super::enrolment_options(Some(enrol_jwt)).name("svc-agent renew"),
        &config.nats.urls,
        ca_file.as_deref(),
        None,
    )?;
    let client = tokio::time::timeout(TIMEOUT, options.connect(config.nats.urls.clone()))
        .await
        .map_err(|_| "no bus connection in time".to_string())?
        .map_err(|e| format!("cannot connect: {e}"))?;
    let payload = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
    let reply = tokio::time::timeout(
        TIMEOUT,
        client.request(subjects::ENROLL_RENEW, payload.into()),
    )
    .await
    .map_err(|_| "no renewal answer in time".to_string())?
    .map_err(|e| format!("renewal: {e}"))?;
    let value: serde_json::Value = serde_json::from_slice(&reply.payload)
        .map_err(|e| format!("malformed renewal reply: {e}"))?;
    if let Some(error) = value.get("error") {
        return Err(format!(
            "renewal refused: {}",
            error["message"].as_str().unwrap_or("no reason given")
        ));
    }
    let renewed: Renewed =
        serde_json::from_value(value).map_err(|e| format!("malformed renewal reply: {e}"))?;
    super::bootstrap::write_file(
        &state_dir.join(BUS_JWT_FILE),
        renewed.bus_jwt.as_bytes(),
        0o600,
    )
    .map_err(|e| e.message)
}
