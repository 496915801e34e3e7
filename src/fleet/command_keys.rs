//! Command-key notices: a [`Work::CommandKeys`] command that tells an agent which
//! command-signing certificates to trust, after `svc-identity command-key rotate` or `retire`
//! (`crate::identity`). It is signed like any command, with the oldest key in force, and
//! travels on the agent's own `svc.agent.<id>.cmd`; the agent's executor checks it like any
//! command, checks that a certificate it did not trust yet chains to its root CA, and
//! rewrites its command-key file.
//!
//! Connected agents get it at once (`notify`, waited for); an agent that was away says at its
//! next (re)connection which set it trusts (`Heartbeat::command_keys`) and gets the notice
//! if that is not the server's (`on_heartbeat`).

use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

use super::jobs::{self, Delivery};
use super::protocol::{Command, ReplyOutcome, Work};
use crate::domain::Domain;
use crate::{ids, Result};

/// How long an agent has to answer a notice.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// How the agents sent a notice took it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Delivered {
    /// Now trust the server's set.
    pub updated: u64,
    /// Answered with a refusal (an agent that missed a whole grace: bootstrap it again).
    pub refused: u64,
    pub no_answer: u64,
    /// The notice could not be published.
    pub unreachable: u64,
}

/// Sends `agents` the server's command-key set and counts their answers.
pub async fn notify(domain: &Domain, agents: Vec<String>) -> Result<Delivered> {
    let mut delivered = Delivered::default();
    if agents.is_empty() {
        return Ok(delivered);
    }
    let keys = crate::identity::command_keys(domain).await?;
    let command = Command {
        job_id: ids::ulid(),
        timeout_ms: ANSWER_WITHIN.as_millis() as u64,
        agent_id: String::new(),
        issued_at_ms: 0,
        work: Work::CommandKeys {
            certificates: keys.certificates,
        },
    };
    let job_id = command.job_id.clone();
    let outgoing = jobs::Outgoing {
        commands: agents.into_iter().map(|id| (id, command.clone())).collect(),
        signer: Ok(keys.signer),
    };
    let (out, mut answers) = mpsc::channel(64);
    let sent = jobs::run(
        &domain.fleet,
        &job_id,
        ANSWER_WITHIN,
        outgoing,
        0,
        |_| {},
        out,
    );
    let counted = async {
        while let Some((agent_id, delivery)) = answers.recv().await {
            match delivery {
                Delivery::Answered(reply) => match reply.outcome {
                    ReplyOutcome::Exec(outcome) if outcome.exit_code == 0 => delivered.updated += 1,
                    ReplyOutcome::Exec(outcome) => {
                        let why = outcome.error.unwrap_or(outcome.stderr);
                        tracing::warn!(agent_id, %why, "command-key notice refused");
                        delivered.refused += 1;
                    }
                    // An agent that does not know notices (older than them) answers so.
                    ReplyOutcome::State(_) => delivered.refused += 1,
                },
                Delivery::NoAnswer => delivered.no_answer += 1,
                Delivery::NotSent(why) => {
                    tracing::warn!(agent_id, %why, "command-key notice not sent");
                    delivered.unreachable += 1;
                }
            }
        }
    };
    let (sent, ()) = tokio::join!(sent, counted);
    sent?;
    Ok(delivered)
}

/// After a heartbeat that names the set `agent_id` trusts: sends the notice when that is not
/// the server's, on a task of its own (the heartbeat listener must not wait on the store).
pub fn on_heartbeat(domain: &std::sync::Arc<Domain>, agent_id: &str, trusted: &str) {
    let (domain, agent_id, trusted) = (domain.clone(), agent_id.to_string(), trusted.to_string());
    tokio::spawn(async move {
        let pem = crate::identity::command_key_pem(domain.store.as_ref()).await;
        let current = match pem.and_then(|pem| super::signature::key_set_id(&pem)) {
            Ok(current) if current == trusted => return,
            Ok(current) => current,
            Err(error) => {
                tracing::warn!(%error, "command keys not read");
                return;
            }
        };
        tracing::info!(agent_id, trusted, current, "sending the command-key notice");
        match notify(&domain, vec![agent_id.clone()]).await {
            Ok(delivered) if delivered.updated == 1 => {}
            Ok(delivered) => tracing::warn!(agent_id, ?delivered, "command-key notice not taken"),
            Err(error) => tracing::warn!(agent_id, %error, "command-key notice not sent"),
        }
    });
}
