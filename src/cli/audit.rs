//! `svc-audit`: query the audit log and verify its hash chain (PolicyService).

use argh::FromArgs;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::{exit, parse_args, run_async, CliError, Common, Output};
use crate::proto::policy_service_client::PolicyServiceClient;
use crate::proto::{self, AuditEntry};

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_partly_built(program, args, run)
}

fn run(program: &str, command: &str, common: Common, args: &[String]) -> i32 {
    let name = format!("{program} {command}");
    match command {
        "log" => match parse_args::<LogArgs>(&name, args) {
            Ok(parsed) => run_async(program, log(common, parsed)),
            Err(code) => code,
        },
        _ => match parse_args::<VerifyArgs>(&name, args) {
            Ok(_) => run_async(program, verify(common)),
            Err(code) => code,
        },
    }
}

#[derive(FromArgs)]
/// Query the audit log, newest first. Times are RFC 3339 or durations ago (24h, 7d).
#[argh(help_triggers("-h", "--help"))]
pub struct LogArgs {
    /// only entries at or after this time
    #[argh(option)]
    pub since: Option<String>,
    /// only entries before this time
    #[argh(option)]
    pub until: Option<String>,
    /// only this principal
    #[argh(option)]
    pub user: Option<String>,
    /// action glob, e.g. 'secret.*'
    #[argh(option)]
    pub action: Option<String>,
    /// only this resource type (apikey, secret, agent, ...)
    #[argh(option)]
    pub resource_type: Option<String>,
    /// only entries a policy decided on
    #[argh(option)]
    pub policy_id: Option<String>,
    /// low, medium, high or critical
    #[argh(option)]
    pub min_severity: Option<String>,
    /// page size (default 50, at most 1000)
    #[argh(option)]
    pub limit: Option<u32>,
    /// continue after a previous page (its next_cursor)
    #[argh(option)]
    pub cursor: Option<String>,
}

impl LogArgs {
    pub fn request(self) -> proto::AuditLogRequest {
        proto::AuditLogRequest {
            since: self.since.unwrap_or_default(),
            until: self.until.unwrap_or_default(),
            user: self.user.unwrap_or_default(),
            action: self.action.unwrap_or_default(),
            resource_type: self.resource_type.unwrap_or_default(),
            policy_id: self.policy_id.unwrap_or_default(),
            min_severity: self.min_severity.unwrap_or_default(),
            page: Some(proto::PageRequest {
                limit: self.limit.unwrap_or(0),
                cursor: self.cursor.unwrap_or_default(),
            }),
        }
    }
}

#[derive(FromArgs)]
/// Verify the audit hash chain; exits 1 and names the first bad row if any was altered,
/// removed or reordered.
#[argh(help_triggers("-h", "--help"))]
struct VerifyArgs {}

async fn log(common: Common, args: LogArgs) -> Result<(), CliError> {
    let mut client = PolicyServiceClient::new(grpc_channel(&common).await?);
    let page = client
        .audit_log(authorized(&common, args.request())?)
        .await?
        .into_inner();
    print_page(&common, page)
}

/// Prints a page of entries: a table, or `{"items": [...], "next_cursor": C|null}`.
pub fn print_page(common: &Common, page: proto::AuditLogResponse) -> Result<(), CliError> {
    let next = (!page.next_cursor.is_empty()).then_some(page.next_cursor);
    match common.output {
        Output::Json => {
            let items: Vec<serde_json::Value> = page.items.iter().map(entry_json).collect();
            print_json(&serde_json::json!({"items": items, "next_cursor": next}))
        }
        Output::Table => {
            let rows: Vec<Vec<String>> = page
                .items
                .iter()
                .map(|e| {
                    vec![
                        e.timestamp.clone(),
                        e.user.clone(),
                        e.action.clone(),
                        format!("{}:{}", e.resource_type, e.resource_id),
                        e.outcome.clone(),
                        e.severity.clone(),
                        if e.policy_id.is_empty() {
                            "-".into()
                        } else {
                            e.policy_id.clone()
                        },
                    ]
                })
                .collect();
            print_table(
                &[
                    "TIME", "USER", "ACTION", "RESOURCE", "OUTCOME", "SEVERITY", "POLICY",
                ],
                &rows,
            );
            if let Some(cursor) = next {
                eprintln!("more entries: --cursor {cursor}");
            }
            Ok(())
        }
    }
}

fn entry_json(entry: &AuditEntry) -> serde_json::Value {
    let detail: serde_json::Value =
        serde_json::from_str(&entry.detail_json).unwrap_or(serde_json::Value::Null);
    serde_json::json!({
        "id": entry.id, "timestamp": entry.timestamp, "user": entry.user, "action": entry.action,
        "resource_type": entry.resource_type, "resource_id": entry.resource_id,
        "outcome": entry.outcome,
        "policy_id": if entry.policy_id.is_empty() { None } else { Some(&entry.policy_id) },
        "severity": entry.severity, "detail": detail,
        "prev_hash": entry.prev_hash, "hash": entry.hash,
    })
}

async fn verify(common: Common) -> Result<(), CliError> {
    let mut client = PolicyServiceClient::new(grpc_channel(&common).await?);
    let result = client
        .audit_verify(authorized(&common, proto::Empty {})?)
        .await?
        .into_inner();
    match common.output {
        Output::Json => print_json(&serde_json::json!({
            "ok": result.ok, "rows": result.rows,
            "first_bad": if result.ok { None } else { Some(&result.first_bad_id) },
            "detail": if result.ok { None } else { Some(&result.detail) },
        }))?,
        Output::Table if result.ok => println!("audit chain intact: {} rows verified", result.rows),
        Output::Table => {}
    }
    if result.ok {
        Ok(())
    } else {
        Err(CliError::new(
            exit::FAILED,
            format!(
                "audit chain broken at entry {}: {}",
                result.first_bad_id, result.detail
            ),
        ))
    }
}
