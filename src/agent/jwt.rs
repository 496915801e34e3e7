//! An agent's own JWT-SVID (`spiffe://svc/agent/<id>`), asked for over the bus with the
//! agent's bus identity: `request` for code that already holds the agent's connection (the
//! daemon, or a workload helper), `svc-agent jwt --audience A` for a shell.
//!
//! The request goes to `svc.agent.<id>.jwt` with a reply subject under the agent's own
//! `svc.agent.<id>.jwt.reply.` (not an `_INBOX`, which operator keys may read); the broker
//! lets only this agent read there.

use std::path::PathBuf;
use std::time::Duration;

use argh::FromArgs;
use futures_util::StreamExt;

use crate::bus::subjects;
use crate::config;
use crate::identity::jwt::{AgentRequest, IssuedJwt};
use crate::program::{exit, parse_args, run_async, CliError};
use crate::{Error, Result};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Asks the server for this agent's JWT-SVID for `audience` (default lifetime when `ttl` is
/// None). `client` must be logged in as `agent_id`.
pub async fn request(
    client: &async_nats::Client,
    agent_id: &str,
    audience: Vec<String>,
    ttl: Option<String>,
) -> Result<IssuedJwt> {
    let reply = format!(
        "{}{}",
        subjects::agent_jwt_reply_prefix(agent_id),
        crate::ids::random_base62(22)
    );
    let unavailable = |what: &str, e: &dyn std::fmt::Display| {
        Error::Unavailable(format!("bus: cannot {what}: {e}"))
    };
    let mut answers = client
        .subscribe(reply.clone())
        .await
        .map_err(|e| unavailable("subscribe", &e))?;
    let body = serde_json::to_vec(&AgentRequest {
        audience,
        ttl: ttl.unwrap_or_default(),
    })
    .map_err(Error::internal)?;
    client
        .publish_with_reply(subjects::agent_jwt(agent_id), reply, body.into())
        .await
        .map_err(|e| unavailable("publish", &e))?;
    client.flush().await.map_err(|e| unavailable("flush", &e))?;
    let message = tokio::time::timeout(TIMEOUT, answers.next())
        .await
        .map_err(|_| Error::Unavailable(format!("no answer from the server within {TIMEOUT:?}")))?
        .ok_or_else(|| Error::Unavailable("the bus connection closed".into()))?;
    let answer: serde_json::Value = serde_json::from_slice(&message.payload)
        .map_err(|e| Error::Internal(format!("malformed answer: {e}")))?;
    if let Some(error) = answer.get("error") {
        let message = error["message"].as_str().unwrap_or("refused").to_string();
        return Err(match error["code"].as_str().unwrap_or_default() {
            "unauthenticated" => Error::Unauthenticated(message),
            "permission_denied" => Error::Forbidden(message),
            "invalid_argument" | "bad_request" => Error::Invalid(message),
            "not_found" => Error::NotFound(message),
            _ => Error::Unavailable(message),
        });
    }
    serde_json::from_value(answer).map_err(|e| Error::Internal(format!("malformed answer: {e}")))
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Print a JWT-SVID for this agent (spiffe://svc/agent/<id>), asked for over the bus with the
/// agent's own certificate (reads the agent config: nats.urls, nats.ca_file, state_dir).
#[argh(help_triggers("-h", "--help"))]
pub(super) struct Args {
    /// audience (repeat for several); required
    #[argh(option)]
    audience: Vec<String>,
    /// lifetime (default 1h, at most 24h): 30m, 1h
    #[argh(option)]
    ttl: Option<String>,
    /// output: token (default, the token alone) or json (id, subject, audience,
    /// expires_at, token)
    #[argh(option, short = 'o', default = "String::from(\"token\")")]
    output: String,
}

pub fn main(program: &str, config_path: Option<PathBuf>, args: &[String]) -> i32 {
    let args = match parse_args::<Args>(&format!("{program} jwt"), args) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let usage = |message: String| {
        eprintln!("{program} jwt: {message}");
        exit::USAGE
    };
    if args.audience.is_empty() {
        return usage("--audience is required".into());
    }
    if !matches!(args.output.as_str(), "token" | "json") {
        return usage(format!("-o must be token or json, not '{}'", args.output));
    }
    if let Some(ttl) = &args.ttl {
        if crate::clock::parse_duration(ttl).is_none() {
            return usage(format!("invalid --ttl '{ttl}' (e.g. 30m, 1h)"));
        }
    }
    let config = match super::load_config(program, config_path.as_deref()) {
        Ok(config) => config,
        Err(code) => return code,
    };
    run_async(program, run(config, args))
}

async fn run(config: config::AgentConfig, args: Args) -> std::result::Result<(), CliError> {
    let state_dir = &config.agent.state_dir;
    let failed = |e: Error| CliError::failed(e.to_string());
    let (cert_pem, _) = super::bus_credentials(state_dir).map_err(failed)?;
    let agent_id = crate::identity::ca::agent_id_in(&cert_pem).ok_or_else(|| {
        CliError::failed(format!(
            "{} holds no agent certificate: run bootstrap",
            state_dir.display()
        ))
    })?;
    if config.nats.urls.is_empty() {
        return Err(CliError::failed("nats.urls is empty"));
    }
    let ca_file = (!config.nats.ca_file.is_empty()).then(|| PathBuf::from(&config.nats.ca_file));
    let options = super::connect_options(state_dir)
        .map_err(failed)?
        .name(format!("svc-agent jwt {agent_id}"));
    let options = super::with_bus_tls(
        options,
        &config.nats.urls,
        ca_file.as_deref(),
        Some(state_dir),
    )
    .map_err(|e| CliError::failed(format!("nats.ca_file: {e}")))?;
    let unreachable = |detail: String| {
        CliError::new(
            exit::UNREACHABLE,
            format!("cannot reach the server: {detail}"),
        )
    };
    let client = tokio::time::timeout(TIMEOUT, options.connect(config.nats.urls.clone()))
        .await
        .map_err(|_| unreachable(format!("no bus connection within {TIMEOUT:?}")))?
        .map_err(|e| {
            unreachable(super::untrusted_bus_certificate(&e).unwrap_or_else(|| e.to_string()))
        })?;
    let issued = request(&client, &agent_id, args.audience, args.ttl)
        .await
        .map_err(|e| match e {
            Error::Unavailable(m) => unreachable(m),
            other => CliError::from(other),
        })?;
    if args.output == "json" {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "id": issued.svid.id, "subject": issued.svid.subject,
                "audience": issued.svid.audience, "expires_at": issued.svid.expires_at,
                "token": issued.token,
            }))
            .expect("JSON values serialize")
        );
    } else {
        println!("{}", issued.token);
    }
    Ok(())
}
