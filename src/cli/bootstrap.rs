//! `svc-bootstrap --seed FILE [--root DIR] [--force]`: the six phases in order (detect,
//! configure, validate, install, blueprints, verify), each reported with its name, status,
//! duration and what it did; the first failure stops the run (exit 1). The local phases are
//! in `crate::bootstrap`; blueprints and verify are clients of the seed's server.

use std::path::{Path, PathBuf};
use std::time::Instant;

use argh::FromArgs;
use http::Method;

use super::client::{authorized, grpc_channel, http_json};
use super::output::{print_json, print_table};
use super::{exit, CliError, Common, Output};
use crate::blueprint::{bundle, Blueprint};
use crate::bootstrap::{self, Seed};
use crate::proto;
use crate::proto::blueprint_service_client::BlueprintServiceClient;
use crate::proto::fleet_service_client::FleetServiceClient;

#[derive(FromArgs, argh::ArgsInfo)]
/// Set this host up from a seed file: detect, configure (server.yaml, agent.yaml; secrets
/// generated where absent, never overwritten without --force), validate (the --check-config
/// checks), install (binary, links, systemd units), blueprints (install and apply the seed's),
/// verify (/health/ready, the agent enrolled). Each phase is reported; the first failure stops
/// the run with exit 1. Re-running a completed seed changes nothing.
#[argh(help_triggers("-h", "--help"))]
struct Args {
    /// the seed file (YAML; see docs/blueprints.md)
    #[argh(option)]
    seed: PathBuf,
    /// treat DIR as / for every file it writes (default /)
    #[argh(option)]
    root: Option<PathBuf>,
    /// overwrite configuration files that differ from the seed
    #[argh(switch)]
    force: bool,
    /// log level or filter (default warn)
    #[argh(option, from_str_fn(super::values::log_filter))]
    log_level: Option<String>,
    /// table (default) or json
    #[argh(option, short = 'o', default = "Output::Table", from_str_fn(output))]
    output: Output,
}

/// svc-bootstrap's argh definition: what help, completions and man pages read
/// (`cli::top_help`).
pub fn args_info() -> argh::CommandInfoWithArgs {
    <Args as argh::ArgsInfo>::get_args_info()
}

fn output(text: &str) -> Result<Output, String> {
    text.parse::<Output>().map_err(|e| e.message)
}

#[derive(Clone, Debug, serde::Serialize)]
struct Report {
    phase: &'static str,
    /// ok | failed | skipped
    status: &'static str,
    duration_ms: u64,
    detail: String,
}

pub fn main(program: &str, args: Vec<String>) -> i32 {
    let parsed: Args = match super::parse_args(program, &args) {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    if let Some(level) = &parsed.log_level {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(level))
            .with_writer(std::io::stderr)
            .try_init();
    }
    super::run_async(program, run(parsed))
}

type Phase = &'static str;
const PHASES: [Phase; 6] = [
    "detect",
    "configure",
    "validate",
    "install",
    "blueprints",
    "verify",
];

async fn run(args: Args) -> Result<(), CliError> {
    let seed = Seed::load(&args.seed).map_err(CliError::usage)?;
    let root = args.root.clone().unwrap_or_else(|| PathBuf::from("/"));
    let mut reports = Vec::new();
    let mut failure = None;
    for phase in PHASES {
        let started = Instant::now();
        let outcome = match phase {
            "detect" => bootstrap::detect(&root, &seed).map(Some),
            "configure" => bootstrap::configure(&root, &seed, args.force).map(Some),
            "validate" => bootstrap::validate(&root, &seed).map(Some),
            "install" => bootstrap::install(&root, &seed).map(Some),
            "blueprints" => blueprints(&seed).await,
            _ => verify(&seed).await,
        };
        let (status, detail) = match outcome {
            Ok(Some(detail)) => ("ok", detail),
            Ok(None) => ("skipped", skipped_reason(phase)),
            Err(detail) => ("failed", detail),
        };
        let report = Report {
            phase,
            status,
            duration_ms: started.elapsed().as_millis() as u64,
            detail,
        };
        if args.output == Output::Table {
            // One line per phase as it finishes, so a slow phase is visible.
            eprintln!(
                "svc-bootstrap: {phase} {status} ({} ms)",
                report.duration_ms
            );
        }
        reports.push(report);
        if status == "failed" {
            failure = Some(phase);
            break;
        }
    }
    match args.output {
        Output::Json => print_json(&reports)?,
        Output::Table => {
            let rows: Vec<Vec<String>> = reports
                .iter()
                .map(|r| {
                    vec![
                        r.phase.to_string(),
                        r.status.to_string(),
                        format!("{} ms", r.duration_ms),
                        r.detail.clone(),
                    ]
                })
                .collect();
            print_table(&["PHASE", "STATUS", "DURATION", "DETAIL"], &rows);
        }
    }
    match failure {
        Some(phase) => {
            let detail = reports.last().map(|r| r.detail.clone()).unwrap_or_default();
            Err(CliError::new(
                exit::FAILED,
                format!("phase {phase} failed: {detail}"),
            ))
        }
        None => Ok(()),
    }
}

fn skipped_reason(phase: Phase) -> String {
    match phase {
        "blueprints" => "the seed lists no blueprints".into(),
        _ => "the seed has no connect section (no server to ask)".into(),
    }
}

/// The client flags for the seed's server.
fn common(seed: &Seed) -> Result<Option<Common>, String> {
    let Some(connect) = &seed.connect else {
        return Ok(None);
    };
    let api_key = match &connect.api_key_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => std::env::var("SVC_API_KEY").ok().filter(|k| !k.is_empty()),
    };
    Ok(Some(Common {
        server: connect.server.clone(),
        http_url: connect.http_url.clone(),
        api_key,
        ca_file: None,
        output: Output::Json,
    }))
}

fn text(error: CliError) -> String {
    error.message
}

/// blueprints: install each listed blueprint (unless that version is installed with the same
/// bytes; a newer version is an update) and apply it where the seed says, unless every
/// targeted agent already has that version applied.
async fn blueprints(seed: &Seed) -> Result<Option<String>, String> {
    if seed.blueprints.is_empty() {
        return Ok(None);
    }
    let common = common(seed)?.expect("Seed::load requires connect with blueprints");
    let channel = grpc_channel(&common).await.map_err(text)?;
    let mut client = BlueprintServiceClient::new(channel);
    let mut done = Vec::new();
    for listed in &seed.blueprints {
        let bytes = bundle_of(&listed.path)?;
        let blueprint = bundle::read(&bytes).map_err(|e| e.to_string())?;
        let (name, version) = (&blueprint.manifest.name, &blueprint.manifest.version);
        let installed = client
            .get(
                authorized(
                    &common,
                    proto::GetBlueprintRequest {
                        name: name.clone(),
                        version: String::new(),
                    },
                )
                .map_err(text)?,
            )
            .await;
        let request = authorized(
            &common,
            proto::InstallBlueprintRequest {
                bundle: bytes.clone(),
            },
        )
        .map_err(text)?;
        match installed {
            Ok(info) => {
                let info = info.into_inner();
                if info.versions.contains(version) {
                    done.push(format!("{name} {version} already installed"));
                } else {
                    client.update(request).await.map_err(|s| text(s.into()))?;
                    done.push(format!("{name} updated to {version}"));
                }
            }
            Err(status) if status.code() == tonic::Code::NotFound => {
                client.install(request).await.map_err(|s| text(s.into()))?;
                done.push(format!("{name} {version} installed"));
            }
            Err(status) => return Err(text(status.into())),
        }
        let Some(target) = &listed.target else {
            continue;
        };
        let applied = client
            .applied(
                authorized(
                    &common,
                    proto::AppliedRequest {
                        target: target.clone(),
                    },
                )
                .map_err(text)?,
            )
            .await
            .map_err(|s| text(s.into()))?
            .into_inner()
            .applied;
        let mut fleet = FleetServiceClient::new(grpc_channel(&common).await.map_err(text)?);
        // Every page: the blueprint is current only when every targeted agent has it.
        let mut agents = Vec::new();
        let mut cursor = String::new();
        loop {
            let page = fleet
                .list_agents(
                    authorized(
                        &common,
                        proto::ListAgentsRequest {
                            target: target.clone(),
                            limit: crate::fleet::MAX_PAGE as u32,
                            cursor,
                            ..Default::default()
                        },
                    )
                    .map_err(text)?,
                )
                .await
                .map_err(|s| text(s.into()))?
                .into_inner();
            agents.extend(page.agents);
            if page.next_cursor.is_empty() {
                break;
            }
            cursor = page.next_cursor;
        }
        let is_current = !agents.is_empty()
            && agents.iter().all(|agent| {
                applied.iter().any(|a| {
                    a.name == *name
                        && a.agent_id == agent.id
                        && a.version == *version
                        && matches!(a.status.as_str(), "ok" | "changed")
                })
            });
        if is_current {
            done.push(format!("{name} {version} already applied on {target}"));
            continue;
        }
        let mut stream = client
            .apply(
                authorized(
                    &common,
                    proto::ApplyBlueprintRequest {
                        name: name.clone(),
                        version: version.clone(),
                        target: target.clone(),
                        parameters: listed.set.clone().into_iter().collect(),
                        dry_run: false,
                        timeout_ms: 0,
                    },
                )
                .map_err(text)?,
            )
            .await
            .map_err(|s| text(s.into()))?
            .into_inner();
        let mut failed = Vec::new();
        let mut count = 0;
        while let Some(result) = stream.message().await.map_err(|s| text(s.into()))? {
            count += 1;
            if !matches!(result.status.as_str(), "ok" | "changed") {
                failed.push(format!("{} {}", result.agent_id, result.status));
            }
        }
        if !failed.is_empty() {
            return Err(format!(
                "applying {name} {version} failed on {}",
                failed.join(", ")
            ));
        }
        done.push(format!("{name} {version} applied on {count} agents"));
    }
    Ok(Some(done.join("; ")))
}

fn bundle_of(path: &Path) -> Result<Vec<u8>, String> {
    if path.is_dir() {
        let blueprint = Blueprint::load_dir(path).map_err(|e| e.to_string())?;
        return bundle::write(&blueprint).map_err(|e| e.to_string());
    }
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// verify: the server answers /health/ready, and the seed's agent is enrolled.
async fn verify(seed: &Seed) -> Result<Option<String>, String> {
    let Some(common) = common(seed)? else {
        return Ok(None);
    };
    let mut done = Vec::new();
    let ready = http_json(&common, Method::GET, "/health/ready", None)
        .await
        .map_err(|e| format!("{} not ready: {}", common.http_url, e.message))?;
    done.push(format!(
        "server ready ({})",
        ready["status"].as_str().unwrap_or("ready")
    ));
    let agent_id = seed
        .agent
        .as_ref()
        .and_then(|a| a.get("agent"))
        .and_then(|a| a.get("id"))
        .and_then(|id| id.as_str());
    if let Some(id) = agent_id {
        let mut fleet = FleetServiceClient::new(grpc_channel(&common).await.map_err(text)?);
        let agent = fleet
            .get_agent(
                authorized(&common, proto::AgentRequest { id: id.to_string() }).map_err(text)?,
            )
            .await
            .map_err(|s| format!("agent {id} is not enrolled: {}", s.message()))?
            .into_inner();
        done.push(format!("agent {id} enrolled ({})", agent.state));
    }
    Ok(Some(done.join("; ")))
}
