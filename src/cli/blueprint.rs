//! `svc-blueprint`: init, validate, lint, info, bundle on this machine (no server); install,
//! update, remove, list, apply, applied, rollback through BlueprintService
//! (docs/blueprints.md).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use argh::FromArgs;

use super::client::{authorized, grpc_channel};
use super::fleet::{duration, print_state_result, state_json, Summary};
use super::output::{print_json, print_table};
use super::values::target;
use super::{CliError, Common, Output};
use crate::blueprint::{self, bundle, Blueprint, Manifest, ParameterError};
use crate::proto;
use crate::proto::blueprint_service_client::BlueprintServiceClient;

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_subcommands::<Args, _>(program, args, body)
}

/// The argh definition of `Args`, whose subcommands are the commands `main` runs: what help,
/// completions and man pages read (`cli::args_info`, `cli::top_help`).
pub fn args_info() -> argh::CommandInfoWithArgs {
    <Args as argh::ArgsInfo>::get_args_info()
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Blueprints.
#[argh(help_triggers("-h", "--help"))]
struct Args {
    #[argh(subcommand)]
    command: Command,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum Command {
    Init(InitArgs),
    Validate(ValidateArgs),
    Lint(LintArgs),
    Info(InfoArgs),
    Bundle(BundleArgs),
    Install(InstallArgs),
    Update(UpdateArgs),
    Remove(RemoveArgs),
    List(ListArgs),
    Apply(ApplyArgs),
    Applied(AppliedArgs),
    Rollback(RollbackArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Scaffold a blueprint in a new directory NAME (or --dir): blueprint.yaml, states/main.yaml,
/// templates/motd.
#[argh(subcommand, name = "init", help_triggers("-h", "--help"))]
struct InitArgs {
    /// the blueprint's name (a-z, 0-9, '-', '_')
    #[argh(positional)]
    name: String,
    /// where to write it (default: ./NAME); must not exist or be empty
    #[argh(option)]
    dir: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Check blueprint.yaml, the parameters, and that every state renders and compiles (required
/// parameters not given with --set get a stand-in value).
#[argh(subcommand, name = "validate", help_triggers("-h", "--help"))]
struct ValidateArgs {
    /// the blueprint directory or bundle
    #[argh(positional)]
    path: PathBuf,
    /// a parameter value NAME=VALUE (repeatable)
    #[argh(option)]
    set: Vec<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Warn about risky patterns: world-writable modes, commands without unless/creates,
/// unpinned packages, unused parameters, secrets with defaults. Exits 1 when it finds any.
#[argh(subcommand, name = "lint", help_triggers("-h", "--help"))]
struct LintArgs {
    /// the blueprint directory or bundle
    #[argh(positional)]
    path: PathBuf,
    /// a parameter value NAME=VALUE (repeatable)
    #[argh(option)]
    set: Vec<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Show a blueprint's metadata and parameters: a directory or bundle here, else NAME[@VERSION]
/// from the server's catalogue.
#[argh(subcommand, name = "info", help_triggers("-h", "--help"))]
struct InfoArgs {
    /// a blueprint directory, a bundle, or NAME[@VERSION]
    #[argh(positional)]
    blueprint: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Build a reproducible bundle (.tar.gz with MANIFEST.json): the same files always give the
/// same bytes and SHA-256. Prints the file and its SHA-256.
#[argh(subcommand, name = "bundle", help_triggers("-h", "--help"))]
struct BundleArgs {
    /// the blueprint directory
    #[argh(positional)]
    dir: PathBuf,
    /// the bundle to write (default: NAME-VERSION.tar.gz here)
    #[argh(option, short = 'O')]
    output_file: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Add a blueprint to the server's catalogue (operator; a directory is bundled first).
#[argh(subcommand, name = "install", help_triggers("-h", "--help"))]
struct InstallArgs {
    /// a bundle or a blueprint directory
    #[argh(positional)]
    path: PathBuf,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Install a newer version of an installed blueprint (operator); older versions stay for
/// rollback.
#[argh(subcommand, name = "update", help_triggers("-h", "--help"))]
struct UpdateArgs {
    /// a bundle or a blueprint directory
    #[argh(positional)]
    path: PathBuf,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Delete every version of a blueprint from the catalogue (operator). Refused while it is
/// applied somewhere, unless --force.
#[argh(subcommand, name = "remove", help_triggers("-h", "--help"))]
struct RemoveArgs {
    /// the blueprint's name
    #[argh(positional)]
    name: String,
    /// remove it even though agents have it applied (they keep what was applied)
    #[argh(switch)]
    force: bool,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List the installed blueprints (latest version, every version kept).
#[argh(subcommand, name = "list", help_triggers("-h", "--help"))]
struct ListArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Render a blueprint with its parameters and apply it on the targeted agents through the
/// state engine; results stream per agent. Exits 1 if any agent failed, 2 when a required
/// parameter is missing.
#[argh(subcommand, name = "apply", help_triggers("-h", "--help"))]
struct ApplyArgs {
    /// NAME or NAME@VERSION (default: the latest)
    #[argh(positional)]
    blueprint: String,
    /// which agents: * , id globs, a comma list, or labels and facts (default: the blueprint's targets)
    #[argh(option, short = 't', from_str_fn(target))]
    target: Option<String>,
    /// a parameter value NAME=VALUE (repeatable)
    #[argh(option)]
    set: Vec<String>,
    /// report what would change (state check); nothing is recorded
    #[argh(switch)]
    dry_run: bool,
    /// how long each agent may take (default 10m)
    #[argh(option, from_str_fn(super::values::duration))]
    timeout: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// What is applied where: blueprint, agent, version, last outcome.
#[argh(subcommand, name = "applied", help_triggers("-h", "--help"))]
struct AppliedArgs {
    /// only these agents: *, id globs, a comma list, or labels and facts
    #[argh(option, short = 't', from_str_fn(target))]
    target: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Re-apply the version recorded before the current one (or --to VERSION) on the targets,
/// removing files, symlinks and directories the newer version added.
#[argh(subcommand, name = "rollback", help_triggers("-h", "--help"))]
struct RollbackArgs {
    /// the blueprint's name
    #[argh(positional)]
    name: String,
    /// which agents (default: those of the last apply)
    #[argh(option, short = 't', from_str_fn(target))]
    target: Option<String>,
    /// the version to go back to
    #[argh(option)]
    to: Option<String>,
    /// how long each agent may take (default 10m)
    #[argh(option, from_str_fn(super::values::duration))]
    timeout: Option<String>,
}

async fn client(
    common: &Common,
) -> Result<BlueprintServiceClient<tonic::transport::Channel>, CliError> {
    Ok(BlueprintServiceClient::new(grpc_channel(common).await?)
        .max_decoding_message_size(8 * 1024 * 1024))
}

fn failed(error: crate::Error) -> CliError {
    CliError::failed(error.to_string())
}

/// A blueprint from a directory or a bundle file.
fn load(path: &Path) -> Result<Blueprint, CliError> {
    if path.is_dir() {
        return Blueprint::load_dir(path)
            .map_err(|e| CliError::failed(format!("{}: {e}", path.display())));
    }
    let bytes = std::fs::read(path)
        .map_err(|e| CliError::failed(format!("cannot read {}: {e}", path.display())))?;
    bundle::read(&bytes).map_err(|e| CliError::failed(format!("{}: {e}", path.display())))
}

/// The bytes to install: a bundle as it is, a directory bundled here.
fn bundle_bytes(path: &Path) -> Result<Vec<u8>, CliError> {
    if path.is_dir() {
        return bundle::write(&load(path)?).map_err(failed);
    }
    std::fs::read(path)
        .map_err(|e| CliError::failed(format!("cannot read {}: {e}", path.display())))
}

fn sets(sets: &[String]) -> Result<BTreeMap<String, String>, CliError> {
    blueprint::parse_sets(sets).map_err(|e| CliError::usage(e.to_string()))
}

/// Parameter problems found here are usage errors (exit 2): the flags were wrong.
fn parameter_error(error: ParameterError) -> CliError {
    CliError::usage(error.to_string())
}

async fn body(common: Common, args: Args) -> Result<(), CliError> {
    match args.command {
        Command::Init(a) => init(a),
        Command::Validate(a) => {
            let blueprint = load(&a.path)?;
            let given = sets(&a.set)?;
            // A bad --set (unknown name, wrong type) is a usage error, whatever the stand-ins.
            blueprint
                .manifest
                .sample_values(&given, blueprint::STAND_INS[0])
                .map_err(|e| CliError::usage(e.to_string()))?;
            let stand_ins: Vec<&str> = blueprint
                .manifest
                .parameters
                .iter()
                .filter(|(name, p)| p.default.is_none() && !given.contains_key(*name))
                .map(|(name, _)| name.as_str())
                .collect();
            let sample = blueprint.render_sample(&given).map_err(|e| match e {
                crate::Error::Invalid(_) if !stand_ins.is_empty() => CliError::failed(format!(
                    "{e} (rendered with stand-in values for {}; give them with --set)",
                    stand_ins.join(", ")
                )),
                e => failed(e),
            })?;
            match common.output {
                Output::Json => print_json(&serde_json::json!({
                    "name": blueprint.manifest.name, "version": blueprint.manifest.version,
                    "valid": true, "states": sample.each.len(), "resources": sample.plan.resources.len(),
                })),
                Output::Table => {
                    println!(
                        "{} {}: valid ({} state files, {} resources)",
                        blueprint.manifest.name,
                        blueprint.manifest.version,
                        sample.each.len(),
                        sample.plan.resources.len()
                    );
                    Ok(())
                }
            }
        }
        Command::Lint(a) => {
            let blueprint = load(&a.path)?;
            let findings = blueprint.lint(&sets(&a.set)?).map_err(failed)?;
            match common.output {
                Output::Json => print_json(&findings)?,
                Output::Table if findings.is_empty() => println!("no findings"),
                Output::Table => {
                    let rows: Vec<Vec<String>> = findings
                        .iter()
                        .map(|f| vec![f.file.clone(), f.resource.clone(), f.message.clone()])
                        .collect();
                    print_table(&["FILE", "RESOURCE", "WARNING"], &rows);
                }
            }
            if findings.is_empty() {
                Ok(())
            } else {
                Err(CliError::failed(format!(
                    "{} finding{}",
                    findings.len(),
                    if findings.len() == 1 { "" } else { "s" }
                )))
            }
        }
        Command::Info(a) => info(&common, &a.blueprint).await,
        Command::Bundle(a) => {
            let blueprint = load(&a.dir)?;
            let bytes = bundle::write(&blueprint).map_err(failed)?;
            let file = a.output_file.unwrap_or_else(|| {
                PathBuf::from(format!(
                    "{}-{}.tar.gz",
                    blueprint.manifest.name, blueprint.manifest.version
                ))
            });
            std::fs::write(&file, &bytes)
                .map_err(|e| CliError::failed(format!("cannot write {}: {e}", file.display())))?;
            let sha256 = bundle::sha256_hex(&bytes);
            match common.output {
                Output::Json => print_json(&serde_json::json!({
                    "file": file.display().to_string(), "sha256": sha256, "bytes": bytes.len(),
                    "name": blueprint.manifest.name, "version": blueprint.manifest.version,
                })),
                Output::Table => {
                    println!("{}  {sha256}", file.display());
                    Ok(())
                }
            }
        }
        Command::Install(a) => install(&common, &a.path, false).await,
        Command::Update(a) => install(&common, &a.path, true).await,
        Command::Remove(a) => {
            let mut client = client(&common).await?;
            let request = authorized(
                &common,
                proto::RemoveBlueprintRequest {
                    name: a.name.clone(),
                    force: a.force,
                },
            )?;
            let removed = client.remove(request).await?.into_inner();
            match common.output {
                Output::Json => print_json(&serde_json::json!({
                    "name": a.name, "versions_removed": removed.versions_removed,
                })),
                Output::Table => {
                    println!(
                        "removed {} ({} version{})",
                        a.name,
                        removed.versions_removed,
                        if removed.versions_removed == 1 {
                            ""
                        } else {
                            "s"
                        }
                    );
                    Ok(())
                }
            }
        }
        Command::List(_) => {
            let mut client = client(&common).await?;
            let request = authorized(&common, proto::ListBlueprintsRequest {})?;
            let listed = client.list(request).await?.into_inner().blueprints;
            match common.output {
                Output::Json => print_json(&listed.iter().map(info_json).collect::<Vec<_>>()),
                Output::Table => {
                    let rows: Vec<Vec<String>> = listed
                        .iter()
                        .map(|b| {
                            vec![
                                b.name.clone(),
                                b.version.clone(),
                                b.versions.join(","),
                                b.description.clone(),
                            ]
                        })
                        .collect();
                    print_table(&["NAME", "VERSION", "VERSIONS", "DESCRIPTION"], &rows);
                    Ok(())
                }
            }
        }
        Command::Apply(a) => apply(&common, a).await,
        Command::Applied(a) => {
            let mut client = client(&common).await?;
            let request = authorized(
                &common,
                proto::AppliedRequest {
                    target: a.target.unwrap_or_default(),
                },
            )?;
            let applied = client.applied(request).await?.into_inner().applied;
            match common.output {
                Output::Json => print_json(
                    &applied
                        .iter()
                        .map(|a| {
                            serde_json::json!({
                                "name": a.name, "agent_id": a.agent_id, "version": a.version,
                                "apply_id": a.apply_id, "status": a.status,
                                "applied_at": a.applied_at,
                            })
                        })
                        .collect::<Vec<_>>(),
                ),
                Output::Table => {
                    let rows: Vec<Vec<String>> = applied
                        .iter()
                        .map(|a| {
                            vec![
                                a.name.clone(),
                                a.agent_id.clone(),
                                a.version.clone(),
                                a.status.clone(),
                                a.applied_at.clone(),
                            ]
                        })
                        .collect();
                    print_table(
                        &["BLUEPRINT", "AGENT", "VERSION", "STATUS", "APPLIED"],
                        &rows,
                    );
                    Ok(())
                }
            }
        }
        Command::Rollback(a) => {
            let request = proto::RollbackBlueprintRequest {
                name: a.name,
                target: a.target.unwrap_or_default(),
                to_version: a.to.unwrap_or_default(),
                timeout_ms: duration(&a.timeout, "--timeout")?,
            };
            let mut client = client(&common).await?;
            let stream = client
                .rollback(authorized(&common, request)?)
                .await?
                .into_inner();
            print_stream(&common, stream, "apply").await
        }
    }
}

fn init(args: InitArgs) -> Result<(), CliError> {
    let files = blueprint::scaffold(&args.name).map_err(|e| CliError::usage(e.to_string()))?;
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&args.name));
    if dir.exists()
        && std::fs::read_dir(&dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(CliError::failed(format!(
            "{} exists and is not empty",
            dir.display()
        )));
    }
    for (path, text) in files {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| {
                CliError::failed(format!("cannot create {}: {e}", parent.display()))
            })?;
        }
        std::fs::write(&target, text)
            .map_err(|e| CliError::failed(format!("cannot write {}: {e}", target.display())))?;
    }
    println!("created {}", dir.display());
    Ok(())
}

/// The parameters as `info -o json` shows them: `required` is what apply enforces (no
/// default), not only what the manifest declares, as the table's "(required)" is.
fn parameters_json(parameters: &BTreeMap<String, blueprint::Parameter>) -> serde_json::Value {
    let mut shown = serde_json::Map::new();
    for (name, parameter) in parameters {
        let mut value = serde_json::to_value(parameter).unwrap_or_default();
        value["required"] = parameter.is_required().into();
        shown.insert(name.clone(), value);
    }
    serde_json::Value::Object(shown)
}

fn info_json(info: &proto::BlueprintInfo) -> serde_json::Value {
    let manifest: serde_json::Value = serde_json::from_str(&info.manifest_json).unwrap_or_default();
    let parameters = match manifest.get("parameters") {
        Some(raw) => serde_json::from_value(raw.clone())
            .map(|parameters| parameters_json(&parameters))
            .unwrap_or_else(|_| raw.clone()),
        None => serde_json::Value::Null,
    };
    serde_json::json!({
        "name": info.name, "version": info.version, "description": info.description,
        "sha256": info.sha256, "parameters": parameters,
        "targets": manifest.get("targets"), "requires": manifest.get("requires"),
        "installed_by": info.installed_by, "installed_at": info.installed_at,
        "versions": info.versions,
    })
}

fn print_manifest(manifest: &Manifest, extra: &[(&str, String)]) {
    println!("name:        {}", manifest.name);
    println!("version:     {}", manifest.version);
    println!("description: {}", manifest.description);
    if let Some(targets) = &manifest.targets {
        println!("targets:     {targets}");
    }
    for (label, value) in extra {
        println!("{:<12} {value}", format!("{label}:"));
    }
    for requirement in &manifest.requires {
        println!("requires:    {} {}", requirement.name, requirement.version);
    }
    if !manifest.parameters.is_empty() {
        let rows: Vec<Vec<String>> = manifest
            .parameters
            .iter()
            .map(|(name, p)| {
                vec![
                    name.clone(),
                    format!("{:?}", p.kind).to_lowercase(),
                    match (&p.default, p.secret) {
                        (Some(_), true) => "(secret)".into(),
                        (Some(value), false) => value.to_string(),
                        (None, _) => "(required)".into(),
                    },
                    p.description.clone(),
                ]
            })
            .collect();
        println!();
        print_table(&["PARAMETER", "TYPE", "DEFAULT", "DESCRIPTION"], &rows);
    }
}

async fn info(common: &Common, what: &str) -> Result<(), CliError> {
    let path = Path::new(what);
    if path.exists() {
        let blueprint = load(path)?;
        let mut files: Vec<String> = blueprint.files.keys().cloned().collect();
        files.sort();
        return match common.output {
            Output::Json => print_json(&serde_json::json!({
                "name": blueprint.manifest.name, "version": blueprint.manifest.version,
                "description": blueprint.manifest.description,
                "parameters": parameters_json(&blueprint.manifest.parameters),
                "targets": blueprint.manifest.targets, "requires": blueprint.manifest.requires,
                "files": files,
            })),
            Output::Table => {
                print_manifest(&blueprint.manifest, &[("files", files.join(", "))]);
                Ok(())
            }
        };
    }
    let (name, version) = split_name(what);
    let info = fetch(common, name, version).await?;
    match common.output {
        Output::Json => print_json(&info_json(&info)),
        Output::Table => {
            let manifest: Manifest = serde_json::from_str(&info.manifest_json)
                .map_err(|e| CliError::failed(format!("manifest: {e}")))?;
            print_manifest(
                &manifest,
                &[
                    ("sha256", info.sha256.clone()),
                    (
                        "installed",
                        format!("{} by {}", info.installed_at, info.installed_by),
                    ),
                    ("versions", info.versions.join(", ")),
                ],
            );
            Ok(())
        }
    }
}

fn split_name(text: &str) -> (&str, &str) {
    text.split_once('@').unwrap_or((text, ""))
}

async fn fetch(
    common: &Common,
    name: &str,
    version: &str,
) -> Result<proto::BlueprintInfo, CliError> {
    let mut client = client(common).await?;
    let request = authorized(
        common,
        proto::GetBlueprintRequest {
            name: name.to_string(),
            version: version.to_string(),
        },
    )?;
    Ok(client.get(request).await?.into_inner())
}

async fn install(common: &Common, path: &Path, is_update: bool) -> Result<(), CliError> {
    let bytes = bundle_bytes(path)?;
    let mut client = client(common).await?;
    let request = authorized(common, proto::InstallBlueprintRequest { bundle: bytes })?;
    let info = if is_update {
        client.update(request).await?
    } else {
        client.install(request).await?
    }
    .into_inner();
    match common.output {
        Output::Json => print_json(&info_json(&info)),
        Output::Table => {
            println!(
                "{} {} {} ({})",
                if is_update { "updated" } else { "installed" },
                info.name,
                info.version,
                info.sha256
            );
            Ok(())
        }
    }
}

async fn apply(common: &Common, args: ApplyArgs) -> Result<(), CliError> {
    let (name, version) = split_name(&args.blueprint);
    let given = sets(&args.set)?;
    // The parameters are checked here first, so a missing or mistyped one is a usage error
    // (exit 2) before anything runs; the server checks them again.
    let info = fetch(common, name, version).await?;
    let manifest: Manifest = serde_json::from_str(&info.manifest_json)
        .map_err(|e| CliError::failed(format!("manifest: {e}")))?;
    manifest.resolve(&given).map_err(parameter_error)?;
    let request = proto::ApplyBlueprintRequest {
        name: name.to_string(),
        version: info.version.clone(),
        target: args.target.unwrap_or_default(),
        parameters: given.into_iter().collect(),
        dry_run: args.dry_run,
        timeout_ms: duration(&args.timeout, "--timeout")?,
    };
    let mut client = client(common).await?;
    let stream = client
        .apply(authorized(common, request)?)
        .await?
        .into_inner();
    print_stream(common, stream, if args.dry_run { "check" } else { "apply" }).await
}

async fn print_stream(
    common: &Common,
    mut stream: tonic::Streaming<proto::StateResult>,
    operation: &str,
) -> Result<(), CliError> {
    let mut summary = Summary::default();
    let stdout = std::io::stdout();
    while let Some(result) = stream.message().await? {
        summary.add_agent(&result.agent_id, &result.status, &result.job_id);
        let mut out = stdout.lock();
        match common.output {
            Output::Json => {
                let _ = writeln!(out, "{}", state_json(&result));
            }
            Output::Table => print_state_result(&mut out, &result, operation),
        }
        let _ = out.flush();
    }
    summary.finish(common.output, &["failed", "timed_out", "unreachable"])
}
