//! `svc-events`: list, get, emit, subscribe, watch, replay, stats, types (EventService).
//!
//! Streams (subscribe, replay) print JSON Lines whatever `-o` says, as the seed specifies;
//! `watch` prints one compact line per event for people.

use argh::FromArgs;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::values::{event_category, event_severity, event_type, time_or_ago};
use super::{CliError, Common, Output};
use crate::proto::event_service_client::EventServiceClient;
use crate::proto::{self, Event};

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_table(program, args)
}

/// svc-events's commands, in help order: the one place each is named, read by running it and by
/// help, completions and man pages (`cli::args_info`).
pub const COMMANDS: &[super::Command] = &[
    command!("list", ListArgs, list),
    command!("get", GetArgs, get),
    command!("emit", EmitArgs, emit),
    command!(
        "subscribe",
        FilterArgs,
        |c, a| follow(c, a, false),
        "Replay the history from a time, then follow live events."
    ),
    command!(
        "watch",
        FilterArgs,
        |c, a| follow(c, a, true),
        "Live tail, one line per event."
    ),
    command!(
        "replay",
        FilterArgs,
        replay,
        "The history only, with no live events."
    ),
    command!("stats", StatsArgs, stats),
    command!("types", TypesArgs, types),
];

#[derive(FromArgs, argh::ArgsInfo)]
/// Filters shared by subscribe, watch and replay. Times are RFC 3339 or durations ago (1h).
#[argh(help_triggers("-h", "--help"))]
struct FilterArgs {
    /// only this type (repeatable)
    #[argh(option, long = "type", from_str_fn(event_type))]
    types: Vec<String>,
    /// only this category: agent, job, bus, policy, security, system
    #[argh(option, from_str_fn(event_category))]
    category: Option<String>,
    /// start here (subscribe/watch: replay history from here, then follow live)
    #[argh(option, from_str_fn(time_or_ago))]
    since: Option<String>,
    /// stop before this time
    #[argh(option, from_str_fn(time_or_ago))]
    until: Option<String>,
    /// debug, info, warning, error or critical
    #[argh(option, from_str_fn(event_severity))]
    min_severity: Option<String>,
    /// only events from this source (an agent id for job events)
    #[argh(option)]
    source: Option<String>,
}

impl FilterArgs {
    fn filter(self) -> proto::EventFilter {
        proto::EventFilter {
            types: self.types,
            category: self.category.unwrap_or_default(),
            since: self.since.unwrap_or_default(),
            until: self.until.unwrap_or_default(),
            min_severity: self.min_severity.unwrap_or_default(),
            source: self.source.unwrap_or_default(),
        }
    }
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List stored events in stream order, a page at a time.
#[argh(help_triggers("-h", "--help"))]
struct ListArgs {
    /// only this type (repeatable)
    #[argh(option, long = "type", from_str_fn(event_type))]
    types: Vec<String>,
    /// only this category: agent, job, bus, policy, security, system
    #[argh(option, from_str_fn(event_category))]
    category: Option<String>,
    /// from this time (RFC 3339 or a duration ago)
    #[argh(option, from_str_fn(time_or_ago))]
    since: Option<String>,
    /// before this time
    #[argh(option, from_str_fn(time_or_ago))]
    until: Option<String>,
    /// debug, info, warning, error or critical
    #[argh(option, from_str_fn(event_severity))]
    min_severity: Option<String>,
    /// only this source
    #[argh(option)]
    source: Option<String>,
    /// page size (default 100, at most 1000)
    #[argh(option)]
    limit: Option<u32>,
    /// continue from a previous page's next_cursor
    #[argh(option)]
    cursor: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Fetch one event by id (or stream sequence number).
#[argh(help_triggers("-h", "--help"))]
struct GetArgs {
    /// event id
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Emit an event; prints it once it is durably stored.
#[argh(help_triggers("-h", "--help"))]
struct EmitArgs {
    /// one of the canonical types (svc-events types)
    #[argh(option, long = "type", from_str_fn(event_type))]
    event_type: String,
    /// severity (default: the type's): debug, info, warning, error or critical
    #[argh(option, from_str_fn(event_severity))]
    severity: Option<String>,
    /// source (default: your key's name)
    #[argh(option)]
    source: Option<String>,
    /// a JSON object
    #[argh(option)]
    payload: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Counts by type and severity over a window (default the last 24h).
#[argh(help_triggers("-h", "--help"))]
struct StatsArgs {
    /// window start (RFC 3339 or a duration ago)
    #[argh(option, from_str_fn(time_or_ago))]
    since: Option<String>,
    /// window end
    #[argh(option, from_str_fn(time_or_ago))]
    until: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// The canonical event types with category and default severity.
#[argh(help_triggers("-h", "--help"))]
struct TypesArgs {}

async fn client(
    common: &Common,
) -> Result<EventServiceClient<tonic::transport::Channel>, CliError> {
    Ok(EventServiceClient::new(grpc_channel(common).await?))
}

/// One event as a JSON value: the same document `json_line` writes for streams.
fn event_json(event: &Event) -> serde_json::Value {
    serde_json::from_str(&json_line(event)).unwrap_or(serde_json::Value::Null)
}

fn event_row(event: &Event) -> Vec<String> {
    vec![
        event.timestamp.clone(),
        event.r#type.clone(),
        event.severity.clone(),
        event.source.clone(),
        event.id.clone(),
    ]
}

const HEADERS: &[&str] = &["TIME", "TYPE", "SEVERITY", "SOURCE", "ID"];

async fn list(common: Common, args: ListArgs) -> Result<(), CliError> {
    let filter = FilterArgs {
        types: args.types,
        category: args.category,
        since: args.since,
        until: args.until,
        min_severity: args.min_severity,
        source: args.source,
    }
    .filter();
    let request = proto::ListEventsRequest {
        filter: Some(filter),
        page: Some(proto::PageRequest {
            limit: args.limit.unwrap_or(0),
            cursor: args.cursor.unwrap_or_default(),
        }),
    };
    let page = client(&common)
        .await?
        .list(authorized(&common, request)?)
        .await?
        .into_inner();
    let next = (!page.next_cursor.is_empty()).then_some(page.next_cursor);
    match common.output {
        Output::Json => {
            let items: Vec<_> = page.items.iter().map(event_json).collect();
            print_json(&serde_json::json!({"items": items, "next_cursor": next}))
        }
        Output::Table => {
            print_table(
                HEADERS,
                &page.items.iter().map(event_row).collect::<Vec<_>>(),
            );
            if let Some(cursor) = next {
                eprintln!("more events: --cursor {cursor}");
            }
            Ok(())
        }
    }
}

async fn get(common: Common, args: GetArgs) -> Result<(), CliError> {
    let event = client(&common)
        .await?
        .get(authorized(&common, proto::GetEventRequest { id: args.id })?)
        .await?
        .into_inner();
    show(&common, &event)
}

fn show(common: &Common, event: &Event) -> Result<(), CliError> {
    match common.output {
        Output::Json => print_json(&event_json(event)),
        Output::Table => {
            print_table(HEADERS, &[event_row(event)]);
            Ok(())
        }
    }
}

async fn emit(common: Common, args: EmitArgs) -> Result<(), CliError> {
    if let Some(payload) = &args.payload {
        let parsed: serde_json::Value = serde_json::from_str(payload)
            .map_err(|e| CliError::usage(format!("--payload is not JSON: {e}")))?;
        if !parsed.is_object() {
            return Err(CliError::usage("--payload must be a JSON object"));
        }
    }
    let request = proto::EmitEventRequest {
        r#type: args.event_type,
        severity: args.severity.unwrap_or_default(),
        source: args.source.unwrap_or_default(),
        payload_json: args.payload.unwrap_or_default(),
    };
    let event = client(&common)
        .await?
        .emit(authorized(&common, request)?)
        .await?
        .into_inner();
    show(&common, &event)
}

/// How a stream is printed.
#[derive(Clone, Copy, PartialEq)]
enum Style {
    /// One compact line per event, flushed at once (`watch`).
    Compact,
    /// JSON Lines, flushed per event so pipes see live events at once (`subscribe`).
    Live,
    /// JSON Lines through a buffer, flushed at the end (`replay`: throughput matters).
    Bulk,
}

/// One event as a JSON line. Written by hand around the payload, which is already JSON text,
/// so a replay does not parse and re-encode every payload.
fn json_line(event: &Event) -> String {
    let text = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let payload = if event.payload_json.is_empty() {
        "{}"
    } else {
        &event.payload_json
    };
    format!(
        "{{\"id\":{},\"seq\":{},\"type\":{},\"category\":{},\"severity\":{},\"source\":{},\"timestamp\":{},\"payload\":{}}}",
        text(&event.id),
        event.seq,
        text(&event.r#type),
        text(&event.category),
        text(&event.severity),
        text(&event.source),
        text(&event.timestamp),
        payload
    )
}

async fn print_stream(mut stream: tonic::Streaming<Event>, style: Style) -> Result<(), CliError> {
    use std::io::Write;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(256 * 1024, stdout.lock());
    let failed = |e: std::io::Error| CliError::failed(format!("stdout: {e}"));
    while let Some(event) = stream.message().await? {
        if style == Style::Compact {
            let payload = if event.payload_json == "{}" {
                String::new()
            } else {
                format!(" {}", event.payload_json)
            };
            writeln!(
                out,
                "{} {:<8} {:<26} source={}{}",
                event.timestamp, event.severity, event.r#type, event.source, payload
            )
            .map_err(failed)?;
        } else {
            writeln!(out, "{}", json_line(&event)).map_err(failed)?;
        }
        if style != Style::Bulk {
            out.flush().map_err(failed)?;
        }
    }
    out.flush().map_err(failed)
}

async fn follow(common: Common, args: FilterArgs, compact: bool) -> Result<(), CliError> {
    let request = proto::SubscribeEventsRequest {
        filter: Some(args.filter()),
    };
    let stream = client(&common)
        .await?
        .subscribe(authorized(&common, request)?)
        .await?
        .into_inner();
    print_stream(stream, if compact { Style::Compact } else { Style::Live }).await
}

async fn replay(common: Common, args: FilterArgs) -> Result<(), CliError> {
    if args.since.is_none() {
        return Err(CliError::usage(
            "replay needs --since (RFC 3339 or a duration ago, e.g. 24h)",
        ));
    }
    let request = proto::ReplayEventsRequest {
        filter: Some(args.filter()),
    };
    let stream = client(&common)
        .await?
        .replay(authorized(&common, request)?)
        .await?
        .into_inner();
    print_stream(stream, Style::Bulk).await
}

async fn stats(common: Common, args: StatsArgs) -> Result<(), CliError> {
    let request = proto::EventStatsRequest {
        since: args.since.unwrap_or_default(),
        until: args.until.unwrap_or_default(),
    };
    let stats = client(&common)
        .await?
        .stats(authorized(&common, request)?)
        .await?
        .into_inner();
    let map = |counts: &[proto::EventCount]| -> serde_json::Map<String, serde_json::Value> {
        counts
            .iter()
            .map(|c| (c.key.clone(), serde_json::json!(c.count)))
            .collect()
    };
    match common.output {
        Output::Json => print_json(
            &serde_json::json!({"total": stats.total, "by_type": map(&stats.by_type), "by_severity": map(&stats.by_severity)}),
        ),
        Output::Table => {
            println!("total: {}", stats.total);
            let mut rows: Vec<Vec<String>> = stats
                .by_severity
                .iter()
                .map(|c| vec!["severity".into(), c.key.clone(), c.count.to_string()])
                .collect();
            rows.extend(
                stats
                    .by_type
                    .iter()
                    .map(|c| vec!["type".into(), c.key.clone(), c.count.to_string()]),
            );
            print_table(&["BY", "KEY", "COUNT"], &rows);
            Ok(())
        }
    }
}

async fn types(common: Common, _: TypesArgs) -> Result<(), CliError> {
    let types = client(&common)
        .await?
        .types(authorized(&common, proto::Empty {})?)
        .await?
        .into_inner()
        .types;
    match common.output {
        Output::Json => print_json(
            &types
                .iter()
                .map(|t| serde_json::json!({"name": t.name, "category": t.category, "default_severity": t.default_severity}))
                .collect::<Vec<_>>(),
        ),
        Output::Table => {
            let rows: Vec<Vec<String>> = types.iter().map(|t| vec![t.name.clone(), t.category.clone(), t.default_severity.clone()]).collect();
            print_table(&["TYPE", "CATEGORY", "SEVERITY"], &rows);
            Ok(())
        }
    }
}
