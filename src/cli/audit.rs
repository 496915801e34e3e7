//! `svc-audit`: query, export, report on and count the audit log, and verify its hash chain
//! (PolicyService).

use argh::FromArgs;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::values::{audit_severity, export_format, time_or_ago};
use super::{exit, CliError, Common, Output};
use crate::proto::policy_service_client::PolicyServiceClient;
use crate::proto::{self, AuditEntry};

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_table(program, args)
}

/// svc-audit's commands, in help order: the one place each is named, read by running it and by
/// help, completions and man pages (`cli::args_info`).
pub const COMMANDS: &[super::Command] = &[
    command!("log", LogArgs, log),
    command!("export", ExportArgs, export),
    command!(
        "report",
        WindowArgs,
        report,
        "Compliance report over a window (default the last 30d): rate, top violations, trend."
    ),
    command!(
        "stats",
        WindowArgs,
        stats,
        "Headline counts over a window (default the last 24h)."
    ),
    command!("verify", VerifyArgs, |common, _| verify(common)),
];

#[derive(FromArgs, argh::ArgsInfo)]
/// Counts over a time window (stats: default the last 24h; report: the last 30d).
#[argh(help_triggers("-h", "--help"))]
pub struct WindowArgs {
    /// window start: RFC 3339 or a duration ago (24h, 7d)
    #[argh(option, from_str_fn(time_or_ago))]
    pub since: Option<String>,
    /// window end (default now)
    #[argh(option, from_str_fn(time_or_ago))]
    pub until: Option<String>,
}

impl WindowArgs {
    pub fn request(self) -> proto::AuditWindow {
        proto::AuditWindow {
            since: self.since.unwrap_or_default(),
            until: self.until.unwrap_or_default(),
        }
    }
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Export the audit log, redacted, in chain order (admin).
#[argh(help_triggers("-h", "--help"))]
struct ExportArgs {
    /// json, jsonl (default) or csv
    #[argh(
        option,
        default = "String::from(\"jsonl\")",
        from_str_fn(export_format)
    )]
    format: String,
    /// only entries at or after this time (RFC 3339 or a duration ago)
    #[argh(option, from_str_fn(time_or_ago))]
    since: Option<String>,
    /// only entries before this time
    #[argh(option, from_str_fn(time_or_ago))]
    until: Option<String>,
    /// write to this file (mode 0600) instead of stdout
    #[argh(option)]
    output_file: Option<std::path::PathBuf>,
}

fn counts_json(counts: &[proto::AuditCount]) -> serde_json::Value {
    counts
        .iter()
        .map(|c| (c.key.clone(), serde_json::json!(c.count)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn print_counts(title: &str, counts: &[proto::AuditCount]) {
    println!("\n{title}:");
    let rows: Vec<Vec<String>> = counts
        .iter()
        .map(|c| {
            vec![
                format!("  {}", if c.key.is_empty() { "-" } else { &c.key }),
                c.count.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        super::output::format_table(&["", ""], &rows)
            .split_once('\n')
            .map(|(_, rest)| rest)
            .unwrap_or("")
    );
}

async fn stats(common: Common, args: WindowArgs) -> Result<(), CliError> {
    let mut client = PolicyServiceClient::new(grpc_channel(&common).await?);
    let stats = client
        .audit_stats(authorized(&common, args.request())?)
        .await?
        .into_inner();
    match common.output {
        Output::Json => print_json(&serde_json::json!({
            "total": stats.total,
            "by_outcome": counts_json(&stats.by_outcome),
            "by_severity": counts_json(&stats.by_severity),
            "by_action": counts_json(&stats.by_action),
            "by_user": counts_json(&stats.by_user),
        })),
        Output::Table => {
            println!("total: {}", stats.total);
            print_counts("by outcome", &stats.by_outcome);
            print_counts("by severity", &stats.by_severity);
            print_counts("top actions", &stats.by_action);
            print_counts("top users", &stats.by_user);
            Ok(())
        }
    }
}

/// Prints a compliance report (shared with `svc-policy compliance`).
pub fn print_report(common: &Common, report: &proto::AuditReportResponse) -> Result<(), CliError> {
    match common.output {
        Output::Json => print_json(&serde_json::json!({
            "since": report.since,
            "until": if report.until.is_empty() { None } else { Some(&report.until) },
            "total": report.total,
            "violations": report.violations,
            "refused": report.refused,
            "compliance_rate": report.compliance_rate,
            "top_violations": counts_json(&report.top_violations),
            "trend": report.trend.iter().map(|d| serde_json::json!({"day": d.day, "total": d.total, "violations": d.violations})).collect::<Vec<_>>(),
        })),
        Output::Table => {
            println!(
                "window:          {} .. {}",
                report.since,
                if report.until.is_empty() {
                    "now"
                } else {
                    &report.until
                }
            );
            println!("audited actions: {}", report.total);
            println!(
                "violations:      {} (policy deny, recorded in audit mode)",
                report.violations
            );
            println!("refused:         {} (denied by role)", report.refused);
            println!("compliance rate: {:.2}%", report.compliance_rate * 100.0);
            print_counts("top violations (policy)", &report.top_violations);
            println!("\ntrend:");
            let rows: Vec<Vec<String>> = report
                .trend
                .iter()
                .map(|d| {
                    vec![
                        format!("  {}", d.day),
                        d.total.to_string(),
                        d.violations.to_string(),
                    ]
                })
                .collect();
            super::output::print_table(&["  DAY", "TOTAL", "VIOLATIONS"], &rows);
            Ok(())
        }
    }
}

async fn report(common: Common, args: WindowArgs) -> Result<(), CliError> {
    let mut client = PolicyServiceClient::new(grpc_channel(&common).await?);
    let report = client
        .audit_report(authorized(&common, args.request())?)
        .await?
        .into_inner();
    print_report(&common, &report)
}

async fn export(common: Common, args: ExportArgs) -> Result<(), CliError> {
    use std::io::Write;
    if !matches!(args.format.as_str(), "json" | "jsonl" | "csv") {
        return Err(CliError::usage(format!(
            "--format '{}' is not json, jsonl or csv",
            args.format
        )));
    }
    let mut client = PolicyServiceClient::new(grpc_channel(&common).await?);
    let request = proto::AuditExportRequest {
        format: args.format,
        since: args.since.unwrap_or_default(),
        until: args.until.unwrap_or_default(),
    };
    let mut stream = client
        .audit_export(authorized(&common, request)?)
        .await?
        .into_inner();
    // A file is written beside its final name and renamed at the end, so a failed export
    // never leaves a truncated file that looks complete.
    let (mut sink, temp): (Box<dyn Write>, Option<std::path::PathBuf>) = match &args.output_file {
        Some(path) => {
            use std::os::unix::fs::OpenOptionsExt;
            let temp = path.with_extension("partial");
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&temp)
                .map_err(|e| CliError::failed(format!("cannot write {}: {e}", temp.display())))?;
            (Box::new(std::io::BufWriter::new(file)), Some(temp))
        }
        None => (Box::new(std::io::stdout().lock()), None),
    };
    let write_error = |e: std::io::Error| CliError::failed(format!("cannot write the export: {e}"));
    while let Some(chunk) = stream.message().await? {
        sink.write_all(&chunk.data).map_err(write_error)?;
    }
    sink.flush().map_err(write_error)?;
    drop(sink);
    if let (Some(temp), Some(path)) = (temp, args.output_file) {
        std::fs::rename(&temp, &path)
            .map_err(|e| CliError::failed(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Query the audit log, newest first. Times are RFC 3339 or durations ago (24h, 7d).
#[argh(help_triggers("-h", "--help"))]
pub struct LogArgs {
    /// only entries at or after this time
    #[argh(option, from_str_fn(time_or_ago))]
    pub since: Option<String>,
    /// only entries before this time
    #[argh(option, from_str_fn(time_or_ago))]
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
    #[argh(option, from_str_fn(audit_severity))]
    pub min_severity: Option<String>,
    /// success, denied, error or attempt (a change's request, written before it ran, whose
    /// outcome is missing)
    #[argh(option)]
    pub outcome: Option<String>,
    /// also list the attempt row every change writes before it runs (hidden once the
    /// change's outcome row is written)
    #[argh(switch)]
    pub attempts: bool,
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
            outcome: self.outcome.unwrap_or_default(),
            attempts: self.attempts,
            page: Some(proto::PageRequest {
                limit: self.limit.unwrap_or(0),
                cursor: self.cursor.unwrap_or_default(),
            }),
        }
    }
}

#[derive(FromArgs, argh::ArgsInfo)]
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
