//! `svc-webhook outbound create|list|show|update|delete|test|deliveries|redeliver`
//! (WebhookService; docs/webhooks.md).

use std::path::PathBuf;

use argh::FromArgs;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::values::{event_category, event_severity};
use super::{CliError, Common, Output};
use crate::proto::webhook_service_client::WebhookServiceClient;
use crate::proto::{self, Webhook, WebhookDelivery};
use crate::store::DeliveryStatus;

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_table(program, args)
}

/// svc-webhook's commands, in help order: the one place each is named, read by running it and by
/// help, completions and man pages (`cli::args_info`).
pub const COMMANDS: &[super::Command] = &[command!("outbound", OutboundArgs, outbound)];

#[derive(FromArgs, argh::ArgsInfo)]
/// Outbound webhook subscriptions: matching events are POSTed to a URL, signed the Standard
/// Webhooks way (webhook-id, webhook-timestamp, webhook-signature: v1,<base64 HMAC-SHA256>).
#[argh(help_triggers("-h", "--help"))]
struct OutboundArgs {
    #[argh(subcommand)]
    command: OutboundCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum OutboundCommand {
    Create(CreateArgs),
    List(ListArgs),
    Show(ShowArgs),
    Update(UpdateArgs),
    Delete(DeleteArgs),
    Test(TestArgs),
    Deliveries(DeliveriesArgs),
    Redeliver(RedeliverArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Subscribe a URL to events (operator); the signing secret is printed this once.
#[argh(subcommand, name = "create", help_triggers("-h", "--help"))]
struct CreateArgs {
    /// the receiver: https://... (or http://)
    #[argh(option)]
    url: String,
    /// event types, comma-separated (svc-events types)
    #[argh(option)]
    events: Option<String>,
    /// every type of one category: agent, job, bus, policy, security, system
    #[argh(option, from_str_fn(event_category))]
    category: Option<String>,
    /// only events at least this severe
    #[argh(option, from_str_fn(event_severity))]
    min_severity: Option<String>,
    /// the secret to sign with (whsec_<base64>), first line of this file; default: a new one
    #[argh(option)]
    secret_file: Option<PathBuf>,
    /// a note for operators
    #[argh(option)]
    description: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List subscriptions (never secrets; readonly keys see URL origins only).
#[argh(subcommand, name = "list", help_triggers("-h", "--help"))]
struct ListArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Show one subscription.
#[argh(subcommand, name = "show", help_triggers("-h", "--help"))]
struct ShowArgs {
    /// the subscription id
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Change a subscription (operator); flags not given keep their value.
#[argh(subcommand, name = "update", help_triggers("-h", "--help"))]
struct UpdateArgs {
    /// the subscription id
    #[argh(positional)]
    id: String,
    /// a new URL
    #[argh(option)]
    url: Option<String>,
    /// new event types, comma-separated ("" for none)
    #[argh(option)]
    events: Option<String>,
    /// a new category ("" for none)
    #[argh(option)]
    category: Option<String>,
    /// a new minimum severity ("" for none)
    #[argh(option)]
    min_severity: Option<String>,
    /// a new signing secret from this file (whsec_<base64>)
    #[argh(option)]
    secret_file: Option<PathBuf>,
    /// a new description
    #[argh(option)]
    description: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Delete a subscription and its deliveries (operator).
#[argh(subcommand, name = "delete", help_triggers("-h", "--help"))]
struct DeleteArgs {
    /// the subscription id
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Send a webhook.ping message now, once (operator); exit 1 unless the receiver took it.
#[argh(subcommand, name = "test", help_triggers("-h", "--help"))]
struct TestArgs {
    /// the subscription id
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// A subscription's deliveries, newest first.
#[argh(subcommand, name = "deliveries", help_triggers("-h", "--help"))]
struct DeliveriesArgs {
    /// the subscription id
    #[argh(positional)]
    id: String,
    /// only dead-lettered ones and those still being retried
    #[argh(switch)]
    failed: bool,
    /// at most this many (default 100)
    #[argh(option, default = "100")]
    limit: u32,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Send a delivery again, with the same webhook-id (operator).
#[argh(subcommand, name = "redeliver", help_triggers("-h", "--help"))]
struct RedeliverArgs {
    /// the delivery id (from deliveries)
    #[argh(positional)]
    delivery_id: String,
}

fn read_secret(path: &PathBuf) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("cannot read {}: {e}", path.display())))?;
    Ok(text.lines().next().unwrap_or_default().trim().to_string())
}

fn split_types(text: &str) -> Result<Vec<String>, CliError> {
    let names: Vec<String> = text
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect();
    for name in &names {
        super::values::event_type(name).map_err(CliError::usage)?;
    }
    Ok(names)
}

fn webhook_json(w: &Webhook) -> serde_json::Value {
    let mut value = serde_json::json!({
        "id": w.id, "url": w.url, "event_types": w.event_types, "category": w.category,
        "min_severity": w.min_severity, "description": w.description,
        "created_by": w.created_by, "created_at": w.created_at, "updated_at": w.updated_at,
        "cursor": w.cursor,
    });
    if !w.secret.is_empty() {
        value["secret"] = w.secret.clone().into();
    }
    value
}

fn filter_text(w: &Webhook) -> String {
    let mut parts = Vec::new();
    if !w.event_types.is_empty() {
        parts.push(w.event_types.join(","));
    }
    if !w.category.is_empty() {
        parts.push(format!("category={}", w.category));
    }
    if !w.min_severity.is_empty() {
        parts.push(format!(">={}", w.min_severity));
    }
    if parts.is_empty() {
        "*".into()
    } else {
        parts.join(" ")
    }
}

fn print_webhooks(common: &Common, webhooks: &[Webhook]) -> Result<(), CliError> {
    if common.output == Output::Json {
        return print_json(&webhooks.iter().map(webhook_json).collect::<Vec<_>>());
    }
    let rows: Vec<Vec<String>> = webhooks
        .iter()
        .map(|w| {
            vec![
                w.id.clone(),
                w.url.clone(),
                filter_text(w),
                w.cursor.to_string(),
                w.created_at.clone(),
            ]
        })
        .collect();
    print_table(&["ID", "URL", "EVENTS", "CURSOR", "CREATED_AT"], &rows);
    Ok(())
}

fn delivery_json(d: &WebhookDelivery) -> serde_json::Value {
    let text = |s: &String| (!s.is_empty()).then(|| s.clone());
    serde_json::json!({
        "id": d.id, "webhook_id": d.webhook_id, "event_id": d.event_id,
        "event_seq": d.event_seq, "event_type": d.event_type, "status": d.status,
        "attempts": d.attempts, "created_at": d.created_at,
        "next_attempt_at": d.next_attempt_at, "deadline_at": d.deadline_at,
        "last_attempt_at": text(&d.last_attempt_at),
        "response_status": (d.response_status != 0).then_some(d.response_status),
        "last_error": text(&d.last_error),
    })
}

fn print_deliveries(common: &Common, deliveries: &[WebhookDelivery]) -> Result<(), CliError> {
    if common.output == Output::Json {
        return print_json(&deliveries.iter().map(delivery_json).collect::<Vec<_>>());
    }
    let rows: Vec<Vec<String>> = deliveries
        .iter()
        .map(|d| {
            vec![
                d.id.clone(),
                d.event_type.clone(),
                d.event_seq.to_string(),
                d.status.clone(),
                d.attempts.to_string(),
                if d.response_status == 0 {
                    "-".into()
                } else {
                    d.response_status.to_string()
                },
                d.last_attempt_at.clone(),
                d.last_error.clone(),
            ]
        })
        .collect();
    print_table(
        &[
            "ID",
            "TYPE",
            "SEQ",
            "STATUS",
            "ATTEMPTS",
            "HTTP",
            "LAST_ATTEMPT",
            "ERROR",
        ],
        &rows,
    );
    Ok(())
}

async fn outbound(common: Common, args: OutboundArgs) -> Result<(), CliError> {
    // Usage errors come before any connection.
    if let OutboundCommand::Create(create) = &args.command {
        if create.events.is_none() && create.category.is_none() {
            return Err(CliError::usage(
                "give --events TYPE[,TYPE...] or --category C",
            ));
        }
    }
    let mut client = WebhookServiceClient::new(grpc_channel(&common).await?);
    match args.command {
        OutboundCommand::Create(create) => {
            let request = proto::CreateWebhookRequest {
                url: create.url,
                event_types: split_types(create.events.as_deref().unwrap_or(""))?,
                category: create.category.unwrap_or_default(),
                min_severity: create.min_severity.unwrap_or_default(),
                description: create.description.unwrap_or_default(),
                secret: match &create.secret_file {
                    Some(path) => read_secret(path)?,
                    None => String::new(),
                },
            };
            let webhook = client
                .create(authorized(&common, request)?)
                .await?
                .into_inner();
            if common.output == Output::Json {
                return print_json(&webhook_json(&webhook));
            }
            println!("id:     {}", webhook.id);
            println!("url:    {}", webhook.url);
            println!("events: {}", filter_text(&webhook));
            println!("secret: {}", webhook.secret);
            eprintln!("the secret is shown only now: give it to the receiver to verify signatures");
            Ok(())
        }
        OutboundCommand::List(_) => {
            let list = client
                .list(authorized(&common, proto::Empty {})?)
                .await?
                .into_inner();
            print_webhooks(&common, &list.webhooks)
        }
        OutboundCommand::Show(show) => {
            let webhook = client
                .get(authorized(&common, proto::WebhookId { id: show.id })?)
                .await?
                .into_inner();
            if common.output == Output::Json {
                return print_json(&webhook_json(&webhook));
            }
            print_webhooks(&common, &[webhook])
        }
        OutboundCommand::Update(update) => {
            let event_types = match &update.events {
                Some(text) => Some(split_types(text)?),
                None => None,
            };
            let request = proto::UpdateWebhookRequest {
                id: update.id,
                url: update.url,
                set_event_types: event_types.is_some(),
                event_types: event_types.unwrap_or_default(),
                category: update.category,
                min_severity: update.min_severity,
                description: update.description,
                secret: match &update.secret_file {
                    Some(path) => Some(read_secret(path)?),
                    None => None,
                },
            };
            let webhook = client
                .update(authorized(&common, request)?)
                .await?
                .into_inner();
            if common.output == Output::Json {
                return print_json(&webhook_json(&webhook));
            }
            print_webhooks(&common, &[webhook])
        }
        OutboundCommand::Delete(delete) => {
            client
                .delete(authorized(
                    &common,
                    proto::WebhookId {
                        id: delete.id.clone(),
                    },
                )?)
                .await?;
            if common.output == Output::Json {
                return print_json(&serde_json::json!({ "deleted": delete.id }));
            }
            println!("deleted {}", delete.id);
            Ok(())
        }
        OutboundCommand::Test(test) => {
            let delivery = client
                .test(authorized(&common, proto::WebhookId { id: test.id })?)
                .await?
                .into_inner();
            print_deliveries(&common, std::slice::from_ref(&delivery))?;
            if delivery.status != DeliveryStatus::Delivered.as_str() {
                return Err(CliError::failed(format!(
                    "the ping was not delivered: {}",
                    delivery.last_error
                )));
            }
            Ok(())
        }
        OutboundCommand::Deliveries(list) => {
            let request = proto::DeliveriesRequest {
                id: list.id,
                failed: list.failed,
                limit: list.limit,
            };
            let deliveries = client
                .deliveries(authorized(&common, request)?)
                .await?
                .into_inner();
            print_deliveries(&common, &deliveries.deliveries)
        }
        OutboundCommand::Redeliver(redeliver) => {
            let request = proto::RedeliverRequest {
                delivery_id: redeliver.delivery_id,
            };
            let delivery = client
                .redeliver(authorized(&common, request)?)
                .await?
                .into_inner();
            print_deliveries(&common, &[delivery])
        }
    }
}
