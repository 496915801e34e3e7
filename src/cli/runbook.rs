//! `svc-runbook list|test|execute|list-executions|status|audit|cancel|approve`
//! (RunbookService; `test FILE` offline, with no server; docs/runbooks.md).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use argh::FromArgs;
use serde_json::Value;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::{CliError, Common, Output};
use crate::proto::runbook_service_client::RunbookServiceClient;
use crate::proto::{self, RunbookDocument};
use crate::runbooks::definition;
use crate::store::ExecutionStatus;

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_table(program, args)
}

/// svc-runbook's commands, in help order: the one place each is named, read by running it and by
/// help, completions and man pages (`cli::args_info`).
pub const COMMANDS: &[super::Command] = &[
    command!("list", ListArgs, list),
    command!("test", TestArgs, test),
    command!("execute", ExecuteArgs, execute),
    command!("list-executions", ListExecutionsArgs, list_executions),
    command!("status", StatusArgs, status),
    command!("audit", IdArgs, audit, "The audit rows of an execution."),
    command!("cancel", IdArgs, cancel, "Stop an execution (operator)."),
    command!("approve", ApproveArgs, approve),
];

#[derive(FromArgs, argh::ArgsInfo)]
/// The runbooks the server loaded from runbook_dir.
#[argh(help_triggers("-h", "--help"))]
struct ListArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Load and validate a runbook (schema, needs, cycles) and print its plan: a FILE here with
/// no server, or a NAME the server loaded.
#[argh(help_triggers("-h", "--help"))]
struct TestArgs {
    /// a runbook file, or the name of a loaded runbook
    #[argh(positional)]
    runbook: String,
    /// a parameter value for the plan: k=v (repeatable)
    #[argh(option)]
    set: Vec<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Start an execution on the server (operator); it survives this command and a restart.
#[argh(help_triggers("-h", "--help"))]
struct ExecuteArgs {
    /// the runbook's name
    #[argh(positional)]
    name: String,
    /// a parameter value: k=v (repeatable)
    #[argh(option)]
    set: Vec<String>,
    /// print the plan and the agents each step would reach; start nothing
    #[argh(switch)]
    dry_run: bool,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Executions, newest first.
#[argh(help_triggers("-h", "--help"))]
struct ListExecutionsArgs {
    /// only this runbook's
    #[argh(option)]
    runbook: Option<String>,
    /// only in this status: running, succeeded, failed, cancelled
    #[argh(option)]
    status: Option<String>,
    /// at most this many (default 100)
    #[argh(option, default = "100")]
    limit: u32,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// An execution and the state of each step.
#[argh(help_triggers("-h", "--help"))]
struct StatusArgs {
    /// the execution id
    #[argh(positional)]
    id: String,
    /// keep printing changes until the execution ends
    #[argh(switch)]
    follow: bool,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// An execution by id.
#[argh(help_triggers("-h", "--help"))]
struct IdArgs {
    /// the execution id
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Approve a step waiting for approval (operator; not the key that started the execution).
#[argh(help_triggers("-h", "--help"))]
struct ApproveArgs {
    /// the execution id
    #[argh(positional)]
    id: String,
    /// the step id
    #[argh(positional)]
    step: String,
}

fn parse_set(items: &[String]) -> Result<BTreeMap<String, String>, CliError> {
    let mut values = BTreeMap::new();
    for item in items {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| CliError::usage(format!("--set '{item}': expected k=v")))?;
        values.insert(key.to_string(), value.to_string());
    }
    Ok(values)
}

async fn client(
    common: &Common,
) -> Result<RunbookServiceClient<tonic::transport::Channel>, CliError> {
    Ok(RunbookServiceClient::new(grpc_channel(common).await?))
}

fn parse_document(document: RunbookDocument) -> Result<Value, CliError> {
    serde_json::from_str(&document.json)
        .map_err(|e| CliError::failed(format!("the server's answer is not JSON: {e}")))
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

async fn list(common: Common, _: ListArgs) -> Result<(), CliError> {
    let list = client(&common)
        .await?
        .list(authorized(&common, proto::Empty {})?)
        .await?
        .into_inner();
    let list = parse_document(list)?;
    if common.output == Output::Json {
        return print_json(&list);
    }
    let rows: Vec<Vec<String>> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            vec![
                text(&r["name"]),
                text(&r["steps"]),
                text(&r["trigger"]),
                text(&r["description"]),
            ]
        })
        .collect();
    print_table(&["NAME", "STEPS", "TRIGGER", "DESCRIPTION"], &rows);
    Ok(())
}

async fn test(common: Common, args: TestArgs) -> Result<(), CliError> {
    let set = parse_set(&args.set)?;
    let looks_like_file = args.runbook.ends_with(".yaml")
        || args.runbook.ends_with(".yml")
        || args.runbook.contains('/')
        || Path::new(&args.runbook).exists();
    let runbook = if looks_like_file {
        definition::load_file(Path::new(&args.runbook))
            .map_err(|e| CliError::failed(e.to_string()))?
    } else {
        let document = client(&common)
            .await?
            .get(authorized(
                &common,
                proto::RunbookName {
                    name: args.runbook.clone(),
                },
            )?)
            .await?
            .into_inner();
        let runbook: definition::Runbook = serde_json::from_str(&document.json)
            .map_err(|e| CliError::failed(format!("the server's runbook: {e}")))?;
        definition::validate(&runbook).map_err(|e| CliError::failed(e.to_string()))?;
        runbook
    };
    let values =
        definition::parameters(&runbook, &set).map_err(|e| CliError::failed(e.to_string()))?;
    let plan = definition::plan_text(&runbook, &values);
    if common.output == Output::Json {
        return print_json(&serde_json::json!({
            "name": runbook.name, "valid": true, "parameters": values, "plan": plan,
        }));
    }
    println!("{}: valid ({} steps)", runbook.name, runbook.steps.len());
    println!("plan (steps of a wave run in parallel):");
    for line in plan {
        println!("  {line}");
    }
    Ok(())
}

async fn execute(common: Common, args: ExecuteArgs) -> Result<(), CliError> {
    let parameters = parse_set(&args.set)?.into_iter().collect();
    let request = proto::ExecuteRunbookRequest {
        name: args.name,
        parameters,
        dry_run: args.dry_run,
    };
    let started = client(&common)
        .await?
        .execute(authorized(&common, request)?)
        .await?
        .into_inner();
    let started = parse_document(started)?;
    if common.output == Output::Json {
        return print_json(&started);
    }
    if let Some(plan) = started["plan"].as_array() {
        println!("{}: dry run, nothing started", text(&started["runbook"]));
        for line in plan {
            println!("  {}", text(line));
        }
        if let Some(targets) = started["targets"].as_object() {
            for (step, agents) in targets {
                let agents: Vec<String> =
                    agents.as_array().into_iter().flatten().map(text).collect();
                println!(
                    "  {step} reaches: {}",
                    if agents.is_empty() {
                        "no agent".into()
                    } else {
                        agents.join(", ")
                    }
                );
            }
        }
        return Ok(());
    }
    println!("{}", text(&started["id"]));
    Ok(())
}

async fn list_executions(common: Common, args: ListExecutionsArgs) -> Result<(), CliError> {
    let request = proto::ListExecutionsRequest {
        runbook: args.runbook.unwrap_or_default(),
        status: args.status.unwrap_or_default(),
        limit: args.limit,
    };
    let list = client(&common)
        .await?
        .list_executions(authorized(&common, request)?)
        .await?
        .into_inner();
    let list = parse_document(list)?;
    if common.output == Output::Json {
        return print_json(&list);
    }
    let rows: Vec<Vec<String>> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            vec![
                text(&e["id"]),
                text(&e["runbook"]),
                text(&e["status"]),
                text(&e["started_by"]),
                text(&e["started_at"]),
                text(&e["finished_at"]),
            ]
        })
        .collect();
    print_table(
        &[
            "ID",
            "RUNBOOK",
            "STATUS",
            "STARTED_BY",
            "STARTED_AT",
            "FINISHED_AT",
        ],
        &rows,
    );
    Ok(())
}

fn print_status(common: &Common, view: &Value) -> Result<(), CliError> {
    if common.output == Output::Json {
        return print_json(view);
    }
    println!(
        "{}  {}  {}  started {} by {}",
        text(&view["id"]),
        text(&view["runbook"]),
        text(&view["status"]),
        text(&view["started_at"]),
        text(&view["started_by"])
    );
    let rows: Vec<Vec<String>> = view["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            vec![
                text(&s["id"]),
                text(&s["status"]),
                text(&s["attempts"]),
                text(&s["started_at"]),
                text(&s["finished_at"]),
                text(&s["error"]),
            ]
        })
        .collect();
    print_table(
        &[
            "STEP",
            "STATUS",
            "ATTEMPTS",
            "STARTED_AT",
            "FINISHED_AT",
            "ERROR",
        ],
        &rows,
    );
    Ok(())
}

async fn status(common: Common, args: StatusArgs) -> Result<(), CliError> {
    let mut client = client(&common).await?;
    let mut last = Value::Null;
    loop {
        let view = client
            .status(authorized(
                &common,
                proto::ExecutionId {
                    id: args.id.clone(),
                },
            )?)
            .await?
            .into_inner();
        let view = parse_document(view)?;
        if view != last {
            print_status(&common, &view)?;
            last = view;
        }
        if !args.follow || last["status"] != ExecutionStatus::Running.as_str() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn audit(common: Common, args: IdArgs) -> Result<(), CliError> {
    let rows = client(&common)
        .await?
        .audit(authorized(&common, proto::ExecutionId { id: args.id })?)
        .await?
        .into_inner();
    let rows = parse_document(rows)?;
    if common.output == Output::Json {
        return print_json(&rows);
    }
    let table: Vec<Vec<String>> = rows
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            vec![
                text(&r["timestamp"]),
                text(&r["user"]),
                text(&r["action"]),
                text(&r["outcome"]),
                text(&r["detail"]),
            ]
        })
        .collect();
    print_table(
        &["TIMESTAMP", "USER", "ACTION", "OUTCOME", "DETAIL"],
        &table,
    );
    Ok(())
}

async fn cancel(common: Common, args: IdArgs) -> Result<(), CliError> {
    let view = client(&common)
        .await?
        .cancel(authorized(&common, proto::ExecutionId { id: args.id })?)
        .await?
        .into_inner();
    print_status(&common, &parse_document(view)?)
}

async fn approve(common: Common, args: ApproveArgs) -> Result<(), CliError> {
    let request = proto::ApproveStepRequest {
        id: args.id,
        step: args.step,
    };
    let view = client(&common)
        .await?
        .approve(authorized(&common, request)?)
        .await?
        .into_inner();
    print_status(&common, &parse_document(view)?)
}
