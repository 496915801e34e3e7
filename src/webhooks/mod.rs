//! Outbound webhooks (issue 18, docs/webhooks.md): subscriptions to the events stream that
//! POST each matching event to a URL, signed the Standard Webhooks way.
//!
//! Owns the subscription rules (URL and filter validation, the SSRF check, the signing
//! secret sealed under master_key, roles and audit rows) and the delivery workers
//! (`delivery.rs`: one per subscription, driven by a durable cursor in the events stream).
//! Transports call the functions below with a `Principal`; nothing here knows which one.

pub mod delivery;
pub mod send;
pub mod sign;
pub mod target;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::{Serialize, Serializer};
use serde_json::json;

use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::config::WebhooksConfig;
use crate::domain::Domain;
use crate::events::{types, Severity};
use crate::secrets::crypto::AeadKey;
pub use crate::store::DeliveryStatus;
use crate::store::{DeliveryRow, Store, WebhookRow};
use crate::{clock, ids, Error, Result};

/// The webhooks part of the domain: settings, the HTTP client and the running workers.
pub struct Webhooks {
    config: WebhooksConfig,
    client: send::Client,
    workers: Mutex<HashMap<String, delivery::Worker>>,
}

impl Webhooks {
    pub fn new(config: &WebhooksConfig) -> Result<Webhooks> {
        Ok(Webhooks {
            config: config.clone(),
            client: send::Client::new(config)?,
            workers: Mutex::default(),
        })
    }

    pub fn config(&self) -> &WebhooksConfig {
        &self.config
    }
}

/// What `create` takes, as the caller gave it (checked inside the audit gate, so a refusal
/// is audited).
#[derive(Clone, Debug, Default)]
pub struct NewWebhook {
    pub url: String,
    pub event_types: Vec<String>,
    pub category: String,
    /// A severity name; empty: any severity.
    pub min_severity: String,
    pub description: String,
    /// `whsec_...`; empty: the server makes one.
    pub secret: String,
}

/// What `update` changes; None keeps the field.
#[derive(Clone, Debug, Default)]
pub struct WebhookChange {
    pub url: Option<String>,
    pub event_types: Option<Vec<String>>,
    pub category: Option<String>,
    pub min_severity: Option<String>,
    pub description: Option<String>,
    pub secret: Option<String>,
}

/// A subscription as every surface shows it. `secret` is set only in `create`'s answer.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WebhookView {
    pub id: String,
    /// The whole URL for operators and admins; only its origin for readonly keys.
    pub url: String,
    pub event_types: Vec<String>,
    pub category: String,
    /// None: any severity (written as `""`, as stored).
    #[serde(serialize_with = "severity_or_empty")]
    pub min_severity: Option<Severity>,
    pub description: String,
    pub created_by: String,
    pub created_at: String,
    pub updated_at: String,
    /// The last event sequence handled.
    pub cursor: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// A delivery as every surface shows it (never the body).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DeliveryView {
    pub id: String,
    pub webhook_id: String,
    pub event_id: String,
    pub event_seq: u64,
    pub event_type: String,
    pub status: DeliveryStatus,
    pub attempts: u64,
    pub created_at: String,
    pub next_attempt_at: String,
    pub deadline_at: String,
    pub last_attempt_at: Option<String>,
    pub response_status: Option<u16>,
    pub last_error: Option<String>,
}

impl From<DeliveryRow> for DeliveryView {
    fn from(row: DeliveryRow) -> Self {
        DeliveryView {
            id: row.id,
            webhook_id: row.webhook_id,
            event_id: row.event_id,
            event_seq: row.event_seq.max(0) as u64,
            event_type: row.event_type,
            status: row.status,
            attempts: row.attempts.max(0) as u64,
            created_at: row.created_at,
            next_attempt_at: row.next_attempt_at,
            deadline_at: row.deadline_at,
            last_attempt_at: row.last_attempt_at,
            response_status: row.response_status.map(|s| s as u16),
            last_error: row.last_error,
        }
    }
}

fn severity_or_empty<S: Serializer>(
    severity: &Option<Severity>,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    serializer.serialize_str(severity.map_or("", Severity::as_str))
}

/// The stored `min_severity` (`""` is any severity, None).
pub(crate) fn stored_min_severity(row: &WebhookRow) -> Result<Option<Severity>> {
    if row.min_severity.is_empty() {
        return Ok(None);
    }
    Severity::parse(&row.min_severity).map(Some).ok_or_else(|| {
        Error::Internal(format!(
            "webhook {}: unknown stored min_severity '{}' (expected one of {})",
            row.id,
            row.min_severity,
            crate::events::SEVERITIES.join(", ")
        ))
    })
}

fn view(row: &WebhookRow, principal: &Principal) -> Result<WebhookView> {
    let url = if principal.role >= Role::Operator {
        row.url.clone()
    } else {
        target::parse(&row.url)
            .map(|t| format!("{}/…", t.origin()))
            .unwrap_or_else(|_| "[REDACTED]".into())
    };
    Ok(WebhookView {
        id: row.id.clone(),
        url,
        event_types: serde_json::from_str(&row.event_types).unwrap_or_default(),
        category: row.category.clone(),
        min_severity: stored_min_severity(row)?,
        description: row.description.clone(),
        created_by: row.created_by.clone(),
        created_at: row.created_at.clone(),
        updated_at: row.updated_at.clone(),
        cursor: row.cursor_seq.max(0) as u64,
        secret: None,
    })
}

/// The associated data binding a sealed secret to its subscription.
fn secret_aad(id: &str) -> Vec<u8> {
    format!("svc:webhook-secret:{id}").into_bytes()
}

fn master(domain: &Domain) -> Result<AeadKey> {
    let bytes = domain
        .secrets
        .current_master()
        .ok_or_else(|| Error::Unavailable("the secrets engine has no master key".into()))?;
    Ok(AeadKey::new(&bytes))
}

fn seal_secret(domain: &Domain, id: &str, secret: &str) -> Result<String> {
    Ok(master(domain)?.seal_text(secret.as_bytes(), &secret_aad(id)))
}

/// The HMAC key of a subscription.
pub(crate) fn open_secret(domain: &Domain, row: &WebhookRow) -> Result<Vec<u8>> {
    let plain = master(domain)?
        .open_text(&row.secret_sealed, &secret_aad(&row.id))
        .map_err(|_| {
            Error::Internal(format!(
                "webhook {}: sealed secret failed authentication",
                row.id
            ))
        })?;
    sign::secret_key(&String::from_utf8_lossy(&plain))
}

/// Re-seals every subscription's secret from master key `old` to `new` (master-key rotation,
/// beside the CA keys); returns how many.
pub async fn reseal_secrets(store: &dyn Store, old: &[u8; 32], new: &[u8; 32]) -> Result<u64> {
    let (old, new) = (AeadKey::new(old), AeadKey::new(new));
    let rows = store.webhooks().list_webhooks().await?;
    for row in &rows {
        let aad = secret_aad(&row.id);
        let plain = old
            .open_text(&row.secret_sealed, &aad)
            .map_err(|_| Error::Internal(format!("webhook {}: sealed secret", row.id)))?;
        let resealed = WebhookRow {
            secret_sealed: new.seal_text(&plain, &aad),
            ..row.clone()
        };
        store.webhooks().update_webhook(&resealed).await?;
    }
    Ok(rows.len() as u64)
}

/// The checked filter fields, as stored.
struct CheckedFilter {
    /// The type list as JSON text.
    event_types: String,
    /// The severity's name, or `""` for any.
    min_severity: &'static str,
}

/// Checks the filter fields.
fn check_filter(
    event_types: &[String],
    category: &str,
    min_severity: &str,
) -> Result<CheckedFilter> {
    for name in event_types {
        if types::find(name).is_none() {
            return Err(Error::Invalid(format!(
                "unknown event type '{name}' (svc-events types lists them)"
            )));
        }
    }
    if !category.is_empty() && !types::TYPES.iter().any(|t| t.category == category) {
        return Err(Error::Invalid(format!(
            "unknown event category '{category}'"
        )));
    }
    let min_severity = match min_severity {
        "" => "",
        name => Severity::parse(name)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "severity '{name}' is not one of {}",
                    crate::events::SEVERITIES.join(", ")
                ))
            })?
            .as_str(),
    };
    Ok(CheckedFilter {
        event_types: serde_json::to_string(event_types).map_err(Error::internal)?,
        min_severity,
    })
}

fn check_url(domain: &Domain, url: &str) -> Result<()> {
    let target = target::parse(url)?;
    target::check_host(&target, domain.webhooks.client.allow_private())
}

fn audit_detail(url: &str, event_types: &[String], category: &str) -> serde_json::Value {
    let origin = target::parse(url).map(|t| t.origin()).unwrap_or_default();
    json!({ "url": origin, "events": event_types, "category": category })
}

/// `svc-webhook outbound create` (operator): the answer carries the secret, this once.
pub async fn create(
    domain: &Arc<Domain>,
    principal: &Principal,
    new: NewWebhook,
) -> Result<WebhookView> {
    let id = ids::ulid();
    let action = Action::new("webhook.create", "webhook", id.clone()).detail(audit_detail(
        &new.url,
        &new.event_types,
        &new.category,
    ));
    let result = domain
        .auditor
        .gate(principal, action.clone(), async {
            principal.require(Role::Operator)?;
            let filter = check_filter(&new.event_types, &new.category, &new.min_severity)?;
            check_url(domain, &new.url)?;
            let secret = if new.secret.is_empty() {
                sign::generate_secret()
            } else {
                sign::secret_key(&new.secret)?;
                new.secret.trim().to_string()
            };
            let now = clock::now_rfc3339();
            let row = WebhookRow {
                id: id.clone(),
                url: new.url.clone(),
                event_types: filter.event_types,
                category: new.category.clone(),
                min_severity: filter.min_severity.to_string(),
                description: new.description.clone(),
                secret_sealed: seal_secret(domain, &id, &secret)?,
                created_by: principal.id.clone(),
                created_at: now.clone(),
                updated_at: now,
                // Events from now on: the cursor starts at the last durable one.
                cursor_seq: delivery::current_seq(domain).await? as i64,
            };
            domain.store.webhooks().insert_webhook(&row).await?;
            Ok(WebhookView {
                secret: Some(secret),
                ..view(&row, principal)?
            })
        })
        .await;
    domain.auditor.record(principal, action, &result).await;
    if result.is_ok() {
        delivery::sync(domain).await;
    }
    result
}

/// `svc-webhook outbound list` (any key; never secrets, URLs reduced to their origin for
/// readonly keys).
pub async fn list(domain: &Domain, principal: &Principal) -> Result<Vec<WebhookView>> {
    principal.require(Role::Readonly)?;
    let rows = domain.store.webhooks().list_webhooks().await?;
    rows.iter().map(|row| view(row, principal)).collect()
}

async fn find(domain: &Domain, id: &str) -> Result<WebhookRow> {
    domain
        .store
        .webhooks()
        .get_webhook(id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("webhook '{id}' not found")))
}

/// `svc-webhook outbound show ID` (any key).
pub async fn get(domain: &Domain, principal: &Principal, id: &str) -> Result<WebhookView> {
    principal.require(Role::Readonly)?;
    view(&find(domain, id).await?, principal)
}

/// `svc-webhook outbound update ID` (operator). A new secret is never echoed.
pub async fn update(
    domain: &Arc<Domain>,
    principal: &Principal,
    id: &str,
    change: WebhookChange,
) -> Result<WebhookView> {
    let action = Action::new("webhook.update", "webhook", id).detail(json!({
        "url": change.url.as_deref().map(|u| target::parse(u).map(|t| t.origin()).unwrap_or_default()),
        "events": change.event_types,
        "category": change.category,
        "min_severity": change.min_severity,
        "secret_changed": change.secret.is_some(),
    }));
    let result = domain
        .auditor
        .gate(principal, action.clone(), async {
            principal.require(Role::Operator)?;
            let mut row = find(domain, id).await?;
            let event_types = match change.event_types {
                Some(types) => types,
                None => serde_json::from_str(&row.event_types).unwrap_or_default(),
            };
            let category = change.category.unwrap_or(row.category.clone());
            let min_severity = change.min_severity.unwrap_or(row.min_severity.clone());
            let filter = check_filter(&event_types, &category, &min_severity)?;
            row.event_types = filter.event_types;
            row.category = category;
            row.min_severity = filter.min_severity.to_string();
            if let Some(url) = change.url {
                check_url(domain, &url)?;
                row.url = url;
            }
            if let Some(description) = change.description {
                row.description = description;
            }
            if let Some(secret) = change.secret {
                sign::secret_key(&secret)?;
                row.secret_sealed = seal_secret(domain, id, secret.trim())?;
            }
            row.updated_at = clock::now_rfc3339();
            if !domain.store.webhooks().update_webhook(&row).await? {
                return Err(Error::NotFound(format!("webhook '{id}' not found")));
            }
            view(&row, principal)
        })
        .await;
    domain.auditor.record(principal, action, &result).await;
    if result.is_ok() {
        delivery::sync(domain).await;
    }
    result
}

/// `svc-webhook outbound delete ID` (operator): the subscription and its deliveries.
pub async fn delete(domain: &Arc<Domain>, principal: &Principal, id: &str) -> Result<()> {
    let action = Action::new("webhook.delete", "webhook", id);
    let result = domain
        .auditor
        .gate(principal, action.clone(), async {
            principal.require(Role::Operator)?;
            if !domain.store.webhooks().delete_webhook(id).await? {
                return Err(Error::NotFound(format!("webhook '{id}' not found")));
            }
            Ok(())
        })
        .await;
    domain.auditor.record(principal, action, &result).await;
    if result.is_ok() {
        delivery::sync(domain).await;
    }
    result
}

/// `svc-webhook outbound test ID` (operator): sends a `webhook.ping` message now, once
/// (no retries), and records it as a delivery.
pub async fn test(domain: &Arc<Domain>, principal: &Principal, id: &str) -> Result<DeliveryView> {
    let action = Action::new("webhook.test", "webhook", id);
    let result = domain
        .auditor
        .gate(principal, action.clone(), async {
            principal.require(Role::Operator)?;
            let row = find(domain, id).await?;
            let key = open_secret(domain, &row)?;
            delivery::ping(domain, &row, &key)
                .await
                .map(DeliveryView::from)
        })
        .await;
    domain.auditor.record(principal, action, &result).await;
    result
}

/// `svc-webhook outbound deliveries ID [--failed]` (any key), newest first.
pub async fn deliveries(
    domain: &Domain,
    principal: &Principal,
    id: &str,
    failed_only: bool,
    limit: usize,
) -> Result<Vec<DeliveryView>> {
    principal.require(Role::Readonly)?;
    find(domain, id).await?;
    let limit = if limit == 0 { 100 } else { limit.min(1000) };
    let rows = domain
        .store
        .webhooks()
        .list_deliveries(id, failed_only, limit)
        .await?;
    Ok(rows.into_iter().map(DeliveryView::from).collect())
}

/// `svc-webhook outbound redeliver DELIVERY` (operator): the delivery is sent again, with
/// the same `webhook-id`, as the subscription's next message, and retried as a new one.
pub async fn redeliver(
    domain: &Arc<Domain>,
    principal: &Principal,
    delivery_id: &str,
) -> Result<DeliveryView> {
    let action = Action::new("webhook.redeliver", "webhook_delivery", delivery_id);
    let result = domain
        .auditor
        .gate(principal, action.clone(), async {
            principal.require(Role::Operator)?;
            let mut row = domain
                .store
                .webhooks()
                .get_delivery(delivery_id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("delivery '{delivery_id}' not found")))?;
            let now = clock::now_millis();
            row.status = DeliveryStatus::Pending;
            row.next_attempt_at = clock::format_rfc3339(now);
            row.deadline_at = clock::format_rfc3339(
                now + domain.webhooks.config.max_retry_age.0.as_millis() as i64,
            );
            domain.store.webhooks().update_delivery(&row).await?;
            Ok(DeliveryView::from(row))
        })
        .await;
    domain.auditor.record(principal, action, &result).await;
    if let Ok(delivery) = &result {
        delivery::wake(domain, &delivery.webhook_id);
    }
    result
}
