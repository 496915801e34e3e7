//! `svc-gitops verify|rollback`: a git repository says what each target should be; verify
//! compares it with the hosts, rollback applies the tree at a commit (docs/blueprints.md,
//! "GitOps").
//!
//! The repository (at `--path DIR` inside it) holds `gitops.yaml`, a list of entries
//! `{target: SEL, state: FILE}` or `{target: SEL, blueprint: DIR, set: {k: v}}`. Git is the
//! system `git` (clone, checkout, rev-parse): no git library in the binary. Plans are
//! compiled or rendered here, as `svcctl state` and `svc-blueprint validate` do, and sent
//! through FleetService: verify is a state check (nothing changes; what would change is a
//! difference), rollback a state apply (audited and evented by the state path).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command as Process;

use argh::FromArgs;
use serde::Deserialize;

use super::client::{authorized, grpc_channel};
use super::fleet::{duration, print_state_result, state_json, Summary};
use super::output::{print_json, print_table};
use super::{CliError, Common, Output};
use crate::blueprint::Blueprint;
use crate::proto;
use crate::proto::blueprint_service_client::BlueprintServiceClient;
use crate::proto::fleet_service_client::FleetServiceClient;
use crate::state::{Plan, Resource};

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_subcommands::<Args, _>(program, args, body)
}

/// The argh definition of `Args`, whose subcommands are the commands `main` runs: what help,
/// completions and man pages read (`cli::args_info`, `cli::top_help`).
pub fn args_info() -> argh::CommandInfoWithArgs {
    <Args as argh::ArgsInfo>::get_args_info()
}

#[derive(FromArgs, argh::ArgsInfo)]
/// GitOps.
#[argh(help_triggers("-h", "--help"))]
struct Args {
    #[argh(subcommand)]
    command: Command,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum Command {
    Verify(VerifyArgs),
    Rollback(RollbackArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Compare what the repository says (gitops.yaml: state files and blueprints per target) with
/// the hosts, as a state check that changes nothing, and with the blueprint versions applied.
/// Exits 1 with a table of differences.
#[argh(subcommand, name = "verify", help_triggers("-h", "--help"))]
struct VerifyArgs {
    /// the repository: a path or a URL git can clone
    #[argh(option)]
    repo: String,
    /// the commit, branch or tag to verify (default: HEAD)
    #[argh(option, long = "ref")]
    git_ref: Option<String>,
    /// the directory in the repository that holds gitops.yaml (default: its root)
    #[argh(option)]
    path: Option<String>,
    /// how long each agent may take (default 10m)
    #[argh(option, from_str_fn(super::values::duration))]
    timeout: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Apply the tree at COMMIT: every entry of its gitops.yaml on its targets (state apply).
/// Exits 1 if any agent failed.
#[argh(subcommand, name = "rollback", help_triggers("-h", "--help"))]
struct RollbackArgs {
    /// the repository: a path or a URL git can clone
    #[argh(option)]
    repo: String,
    /// the commit (or branch, tag) to apply
    #[argh(option)]
    to: String,
    /// the directory in the repository that holds gitops.yaml (default: its root)
    #[argh(option)]
    path: Option<String>,
    /// how long each agent may take (default 10m)
    #[argh(option, from_str_fn(super::values::duration))]
    timeout: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    target: String,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    blueprint: Option<String>,
    #[serde(default)]
    set: BTreeMap<String, String>,
}

/// A checked-out tree, removed on drop.
struct Checkout {
    dir: PathBuf,
    commit: String,
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn git(args: &[&str], cwd: Option<&Path>) -> Result<String, CliError> {
    let mut command = Process::new("git");
    command.args(args);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let output = command
        .output()
        .map_err(|e| CliError::failed(format!("cannot run git: {e}")))?;
    if !output.status.success() {
        return Err(CliError::failed(format!(
            "git {}: {}",
            args.first().unwrap_or(&""),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn checkout(repo: &str, git_ref: &str) -> Result<Checkout, CliError> {
    let dir = std::env::temp_dir().join(format!("svc-gitops-{}", crate::ids::ulid()));
    let dir_text = dir.display().to_string();
    git(
        &["clone", "--quiet", "--no-checkout", repo, &dir_text],
        None,
    )?;
    let mut checkout = Checkout {
        dir,
        commit: String::new(),
    };
    git(
        &["checkout", "--quiet", "--detach", git_ref],
        Some(&checkout.dir),
    )?;
    checkout.commit = git(&["rev-parse", "HEAD"], Some(&checkout.dir))?;
    Ok(checkout)
}

/// An entry of gitops.yaml with the plan it stands for.
struct Desired {
    entry: Entry,
    plan: Plan,
    /// A blueprint entry's (name, version).
    blueprint: Option<(String, String)>,
}

/// Each entry with the plan it stands for.
fn plans(tree: &Path, path: Option<&str>) -> Result<Vec<Desired>, CliError> {
    let base = match path {
        Some(path) => {
            crate::blueprint::check_relative(path).map_err(|e| CliError::usage(e.to_string()))?;
            tree.join(path)
        }
        None => tree.to_path_buf(),
    };
    let file = base.join("gitops.yaml");
    let text = std::fs::read_to_string(&file).map_err(|e| {
        CliError::failed(format!(
            "the repository has no gitops.yaml at {}: {e}",
            path.unwrap_or("its root")
        ))
    })?;
    let entries: Vec<Entry> = serde_yaml_ng::from_str(&text)
        .map_err(|e| CliError::failed(format!("gitops.yaml: {e}")))?;
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let (plan, blueprint) = match (&entry.state, &entry.blueprint) {
            (Some(state), None) => {
                crate::blueprint::check_relative(state)
                    .map_err(|e| CliError::failed(e.to_string()))?;
                let state_path = base.join(state);
                let text = std::fs::read_to_string(&state_path)
                    .map_err(|e| CliError::failed(format!("{state}: {e}")))?;
                let dir = state_path.parent().unwrap_or(&base).to_path_buf();
                let plan = crate::state::compile(&text, &dir)
                    .map_err(|e| CliError::failed(format!("{state}: {e}")))?;
                (plan, None)
            }
            (None, Some(dir)) => {
                crate::blueprint::check_relative(dir)
                    .map_err(|e| CliError::failed(e.to_string()))?;
                let blueprint = Blueprint::load_dir(&base.join(dir))
                    .map_err(|e| CliError::failed(format!("{dir}: {e}")))?;
                let values = blueprint
                    .manifest
                    .resolve(&entry.set)
                    .map_err(|e| CliError::failed(format!("{dir}: {e}")))?;
                let (plan, _) = blueprint
                    .render(&values)
                    .map_err(|e| CliError::failed(format!("{dir}: {e}")))?;
                let id = (
                    blueprint.manifest.name.clone(),
                    blueprint.manifest.version.clone(),
                );
                (plan, Some(id))
            }
            _ => {
                return Err(CliError::failed(format!(
                    "gitops.yaml: the entry for '{}' needs exactly one of state or blueprint",
                    entry.target
                )))
            }
        };
        out.push(Desired {
            entry,
            plan,
            blueprint,
        });
    }
    Ok(out)
}

fn unguarded(resource: &Resource) -> bool {
    matches!(resource, Resource::Command(c) if c.unless.is_none() && c.creates.is_none())
}

async fn body(common: Common, args: Args) -> Result<(), CliError> {
    match args.command {
        Command::Verify(a) => verify(&common, a).await,
        Command::Rollback(a) => rollback(&common, a).await,
    }
}

async fn verify(common: &Common, args: VerifyArgs) -> Result<(), CliError> {
    let git_ref = args.git_ref.as_deref().unwrap_or("HEAD");
    let tree = checkout(&args.repo, git_ref)?;
    let entries = plans(&tree.dir, args.path.as_deref())?;
    let timeout_ms = duration(&args.timeout, "--timeout")?;
    let mut fleet = FleetServiceClient::new(grpc_channel(common).await?);
    let mut catalogue = BlueprintServiceClient::new(grpc_channel(common).await?);
    // (target, agent, resource, difference)
    let mut differences: Vec<[String; 4]> = Vec::new();
    for Desired {
        entry,
        plan,
        blueprint,
    } in &entries
    {
        let plan_text =
            serde_json::to_string(plan).map_err(|e| CliError::failed(format!("plan: {e}")))?;
        let request = proto::StateRequest {
            target: entry.target.clone(),
            plan: plan_text,
            timeout_ms,
            concurrency: 0,
            diff: false,
        };
        let mut stream = fleet
            .state_check(authorized(common, request)?)
            .await?
            .into_inner();
        while let Some(result) = stream.message().await? {
            if !matches!(result.status.as_str(), "ok" | "changed") {
                differences.push([
                    entry.target.clone(),
                    result.agent_id.clone(),
                    "-".into(),
                    format!("{}: {}", result.status, result.error),
                ]);
                continue;
            }
            for (resource, outcome) in plan.resources.iter().zip(&result.outcomes) {
                if !outcome.error.is_empty() {
                    differences.push([
                        entry.target.clone(),
                        result.agent_id.clone(),
                        outcome.resource.clone(),
                        format!("error: {}", outcome.error),
                    ]);
                } else if outcome.changed && !unguarded(resource) {
                    differences.push([
                        entry.target.clone(),
                        result.agent_id.clone(),
                        outcome.resource.clone(),
                        outcome.detail.clone(),
                    ]);
                }
            }
        }
        if let Some((name, version)) = blueprint {
            let applied = catalogue
                .applied(authorized(
                    common,
                    proto::AppliedRequest {
                        target: entry.target.clone(),
                    },
                )?)
                .await?
                .into_inner()
                .applied;
            for row in applied
                .iter()
                .filter(|r| r.name == *name && r.version != *version)
            {
                differences.push([
                    entry.target.clone(),
                    row.agent_id.clone(),
                    format!("blueprint:{name}"),
                    format!("applied {}, repository {version}", row.version),
                ]);
            }
        }
    }
    match common.output {
        Output::Json => print_json(&serde_json::json!({
            "repo": args.repo, "ref": git_ref, "commit": tree.commit,
            "entries": entries.len(),
            "differences": differences.iter().map(|d| serde_json::json!({
                "target": d[0], "agent_id": d[1], "resource": d[2], "difference": d[3],
            })).collect::<Vec<_>>(),
        }))?,
        Output::Table => {
            println!("{} at {} ({git_ref})", args.repo, tree.commit);
            if differences.is_empty() {
                println!("no differences ({} entries)", entries.len());
            } else {
                let rows: Vec<Vec<String>> = differences.iter().map(|d| d.to_vec()).collect();
                print_table(&["TARGET", "AGENT", "RESOURCE", "DIFFERENCE"], &rows);
            }
        }
    }
    if differences.is_empty() {
        Ok(())
    } else {
        Err(CliError::failed(format!(
            "{} difference{} from {} at {}",
            differences.len(),
            if differences.len() == 1 { "" } else { "s" },
            args.repo,
            &tree.commit[..tree.commit.len().min(12)]
        )))
    }
}

async fn rollback(common: &Common, args: RollbackArgs) -> Result<(), CliError> {
    let tree = checkout(&args.repo, &args.to)?;
    let entries = plans(&tree.dir, args.path.as_deref())?;
    let timeout_ms = duration(&args.timeout, "--timeout")?;
    let mut fleet = FleetServiceClient::new(grpc_channel(common).await?);
    if common.output == Output::Table {
        eprintln!("applying {} at {}", args.repo, tree.commit);
    }
    let mut summary = Summary::default();
    let stdout = std::io::stdout();
    for Desired { entry, plan, .. } in &entries {
        let plan_text =
            serde_json::to_string(plan).map_err(|e| CliError::failed(format!("plan: {e}")))?;
        let request = proto::StateRequest {
            target: entry.target.clone(),
            plan: plan_text,
            timeout_ms,
            concurrency: 0,
            diff: false,
        };
        let mut stream = fleet
            .state_apply(authorized(common, request)?)
            .await?
            .into_inner();
        while let Some(result) = stream.message().await? {
            summary.add_agent(&result.agent_id, &result.status, &result.job_id);
            let mut out = stdout.lock();
            match common.output {
                Output::Json => {
                    use std::io::Write;
                    let _ = writeln!(out, "{}", state_json(&result));
                }
                Output::Table => print_state_result(&mut out, &result, "apply"),
            }
        }
    }
    summary.finish(common.output, &["failed", "timed_out", "unreachable"])
}
