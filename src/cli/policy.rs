//! `svc-policy`: list and show policies, compliance and violations (PolicyService); create,
//! update and delete are sent and refused by the server (policies are files); eval and
//! validate run in-process on a file, with no server.

use std::path::PathBuf;

use argh::FromArgs;

use super::audit::{print_page, print_report, LogArgs, WindowArgs};
use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::{exit, CliError, Common, Output};
use crate::audit::policy::{self, Effect, LoadedPolicy, PolicySet};
use crate::auth::{Principal, Role};
use crate::proto;
use crate::proto::policy_service_client::PolicyServiceClient;

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_table(program, args)
}

/// svc-policy's commands, in help order: the one place each is named, read by running it and by
/// help, completions and man pages (`cli::args_info`).
pub const COMMANDS: &[super::Command] = &[
    command!("list", ListArgs, list),
    command!("show", ShowArgs, show),
    command!(
        "compliance",
        WindowArgs,
        compliance,
        "Compliance over an audit window: rate, top violations, trend."
    ),
    command!(
        "violations",
        LogArgs,
        violations,
        "Denied audit entries, newest first."
    ),
    command!("create", ChangeArgs, |c, a| change(c, "create".into(), a)),
    command!("update", ChangeArgs, |c, a| change(c, "update".into(), a)),
    command!("delete", ChangeArgs, |c, a| change(c, "delete".into(), a)),
    command!(offline "eval", EvalArgs, |c, a| eval(&c, a)),
    command!(offline "validate", ValidateArgs, |c, a| validate(&c, a)),
];

#[derive(FromArgs, argh::ArgsInfo)]
/// List the loaded policies (or policy sets).
#[argh(help_triggers("-h", "--help"))]
struct ListArgs {
    /// list policy sets instead of policies
    #[argh(switch)]
    policy_sets: bool,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Show one policy (its YAML), or a policy set's members with --policy-set.
#[argh(help_triggers("-h", "--help"))]
struct ShowArgs {
    /// policy id (or set name with --policy-set)
    #[argh(positional)]
    id: String,
    /// ID names a policy set
    #[argh(switch)]
    policy_set: bool,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Policies are files in the server's policy_dir in v0.1: the server answers Unimplemented.
#[argh(help_triggers("-h", "--help"))]
struct ChangeArgs {
    /// a policy file (create, update) or id (delete)
    #[argh(positional)]
    target: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Evaluate a policy file for one action, offline. Prints the decision; exits 1 on deny.
#[argh(help_triggers("-h", "--help"))]
struct EvalArgs {
    /// policy file (YAML)
    #[argh(positional)]
    file: PathBuf,
    /// dotted action, e.g. secret.read
    #[argh(option)]
    action: String,
    /// who acts: role:NAME or user:NAME
    #[argh(option)]
    principal: String,
    /// what is acted on: TYPE:ID, e.g. secret:prod/db
    #[argh(option)]
    resource: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Validate a policy file offline; errors point at the line.
#[argh(help_triggers("-h", "--help"))]
struct ValidateArgs {
    /// policy file (YAML)
    #[argh(positional)]
    file: PathBuf,
}

async fn client(
    common: &Common,
) -> Result<PolicyServiceClient<tonic::transport::Channel>, CliError> {
    Ok(PolicyServiceClient::new(grpc_channel(common).await?))
}

async fn list(common: Common, args: ListArgs) -> Result<(), CliError> {
    let request = proto::ListPoliciesRequest {
        policy_sets: args.policy_sets,
    };
    let policies = client(&common)
        .await?
        .list_policies(authorized(&common, request)?)
        .await?
        .into_inner()
        .policies;
    match common.output {
        Output::Json => print_json(&policies.iter().map(policy_json).collect::<Vec<_>>()),
        Output::Table if args.policy_sets => {
            let rows = policies
                .iter()
                .map(|p| vec![p.id.clone(), p.source_yaml.lines().count().to_string()])
                .collect::<Vec<_>>();
            print_table(&["SET", "POLICIES"], &rows);
            Ok(())
        }
        Output::Table => {
            let rows = policies
                .iter()
                .map(|p| {
                    vec![
                        p.id.clone(),
                        p.severity.clone(),
                        if p.policy_set.is_empty() {
                            "-".into()
                        } else {
                            p.policy_set.clone()
                        },
                    ]
                })
                .collect::<Vec<_>>();
            print_table(&["ID", "SEVERITY", "SET"], &rows);
            Ok(())
        }
    }
}

fn policy_json(policy: &proto::Policy) -> serde_json::Value {
    serde_json::json!({"id": policy.id, "severity": policy.severity, "policy_set": policy.policy_set, "source": policy.source_yaml})
}

async fn show(common: Common, args: ShowArgs) -> Result<(), CliError> {
    let request = proto::GetPolicyRequest {
        id: args.id,
        policy_set: args.policy_set,
    };
    let policy = client(&common)
        .await?
        .get_policy(authorized(&common, request)?)
        .await?
        .into_inner();
    match common.output {
        Output::Json => print_json(&policy_json(&policy)),
        Output::Table => {
            print!("{}", policy.source_yaml);
            if !policy.source_yaml.ends_with('\n') {
                println!();
            }
            Ok(())
        }
    }
}

async fn violations(common: Common, args: LogArgs) -> Result<(), CliError> {
    let page = client(&common)
        .await?
        .violations(authorized(&common, args.request())?)
        .await?
        .into_inner();
    print_page(&common, page)
}

async fn compliance(common: Common, args: WindowArgs) -> Result<(), CliError> {
    let report = client(&common)
        .await?
        .compliance(authorized(&common, args.request())?)
        .await?
        .into_inner();
    print_report(&common, &report)
}

async fn change(common: Common, command: String, args: ChangeArgs) -> Result<(), CliError> {
    let mut client = client(&common).await?;
    let source = std::fs::read_to_string(&args.target).unwrap_or_default();
    let policy = proto::Policy {
        id: args.target.clone(),
        severity: String::new(),
        source_yaml: source,
        policy_set: String::new(),
    };
    match command.as_str() {
        "create" => client
            .create_policy(authorized(&common, policy)?)
            .await
            .map(|_| ())?,
        "update" => client
            .update_policy(authorized(&common, policy)?)
            .await
            .map(|_| ())?,
        _ => client
            .delete_policy(authorized(
                &common,
                proto::GetPolicyRequest {
                    id: args.target,
                    policy_set: false,
                },
            )?)
            .await
            .map(|_| ())?,
    }
    Ok(())
}

fn load_file(path: &PathBuf) -> Result<LoadedPolicy, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::new(exit::NOT_FOUND, format!("{}: {e}", path.display())))?;
    let policy =
        policy::parse(&text).map_err(|e| CliError::failed(format!("{}: {e}", path.display())))?;
    Ok(LoadedPolicy {
        policy,
        source: text,
        path: path.display().to_string(),
    })
}

fn validate(common: &Common, args: ValidateArgs) -> Result<(), CliError> {
    let loaded = load_file(&args.file)?;
    match common.output {
        Output::Json => print_json(
            &serde_json::json!({"file": loaded.path, "valid": true, "id": loaded.policy.id, "rules": loaded.policy.rules.len()}),
        ),
        Output::Table => {
            println!(
                "{}: valid (policy '{}', {} rules)",
                loaded.path,
                loaded.policy.id,
                loaded.policy.rules.len()
            );
            Ok(())
        }
    }
}

fn eval(common: &Common, args: EvalArgs) -> Result<(), CliError> {
    let loaded = load_file(&args.file)?;
    let principal = match args.principal.split_once(':') {
        Some(("role", role)) => Principal {
            id: format!("role:{role}"),
            name: String::new(),
            role: role
                .parse()
                .map_err(|e: crate::Error| CliError::usage(e.to_string()))?,
        },
        Some(("user", name)) => Principal {
            id: name.to_string(),
            name: name.to_string(),
            role: Role::Readonly,
        },
        _ => {
            return Err(CliError::usage(format!(
                "--principal '{}' must be role:NAME or user:NAME",
                args.principal
            )))
        }
    };
    let set = PolicySet {
        policies: vec![loaded],
    };
    let decision = set.evaluate(&args.action, &principal, &args.resource);
    let (word, policy_id) = match &decision {
        Some(d) if d.effect == Effect::Deny => ("deny", Some(d.policy_id.as_str())),
        Some(d) => ("allow", Some(d.policy_id.as_str())),
        None => ("no-match", None),
    };
    match common.output {
        Output::Json => print_json(&serde_json::json!({"decision": word, "policy_id": policy_id}))?,
        Output::Table => println!(
            "{word}{}",
            policy_id
                .map(|id| format!(" (policy {id})"))
                .unwrap_or_default()
        ),
    }
    if word == "deny" {
        return Err(CliError::failed(format!(
            "denied by policy {}",
            policy_id.unwrap_or("")
        )));
    }
    Ok(())
}
