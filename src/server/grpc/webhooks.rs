//! WebhookService: outbound webhook subscriptions (docs/webhooks.md). Thin: unpack, call the
//! webhooks domain with the caller's principal, pack.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::principal;
use crate::proto;
use crate::server::Context;
use crate::webhooks::{self, DeliveryView, NewWebhook, WebhookChange, WebhookView};

pub struct Webhooks {
    pub context: Arc<Context>,
}

fn webhook_message(view: WebhookView) -> proto::Webhook {
    proto::Webhook {
        id: view.id,
        url: view.url,
        event_types: view.event_types,
        category: view.category,
        min_severity: view
            .min_severity
            .map_or("", |severity| severity.as_str())
            .to_string(),
        description: view.description,
        created_by: view.created_by,
        created_at: view.created_at,
        updated_at: view.updated_at,
        cursor: view.cursor,
        secret: view.secret.unwrap_or_default(),
    }
}

fn delivery_message(view: DeliveryView) -> proto::WebhookDelivery {
    proto::WebhookDelivery {
        id: view.id,
        webhook_id: view.webhook_id,
        event_id: view.event_id,
        event_seq: view.event_seq,
        event_type: view.event_type,
        status: view.status.as_str().to_string(),
        attempts: view.attempts,
        created_at: view.created_at,
        next_attempt_at: view.next_attempt_at,
        deadline_at: view.deadline_at,
        last_attempt_at: view.last_attempt_at.unwrap_or_default(),
        response_status: view.response_status.map(u32::from).unwrap_or_default(),
        last_error: view.last_error.unwrap_or_default(),
    }
}

#[tonic::async_trait]
impl proto::webhook_service_server::WebhookService for Webhooks {
    async fn create(
        &self,
        request: Request<proto::CreateWebhookRequest>,
    ) -> Result<Response<proto::Webhook>, Status> {
        let principal = principal(&request)?;
        let r = request.into_inner();
        let new = NewWebhook {
            url: r.url,
            event_types: r.event_types,
            category: r.category,
            min_severity: r.min_severity,
            description: r.description,
            secret: r.secret,
        };
        let view = webhooks::create(&self.context.domain, &principal, new).await?;
        Ok(Response::new(webhook_message(view)))
    }

    async fn list(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::ListWebhooksResponse>, Status> {
        let principal = principal(&request)?;
        let views = webhooks::list(&self.context.domain, &principal).await?;
        Ok(Response::new(proto::ListWebhooksResponse {
            webhooks: views.into_iter().map(webhook_message).collect(),
        }))
    }

    async fn get(
        &self,
        request: Request<proto::WebhookId>,
    ) -> Result<Response<proto::Webhook>, Status> {
        let principal = principal(&request)?;
        let view = webhooks::get(&self.context.domain, &principal, &request.get_ref().id).await?;
        Ok(Response::new(webhook_message(view)))
    }

    async fn update(
        &self,
        request: Request<proto::UpdateWebhookRequest>,
    ) -> Result<Response<proto::Webhook>, Status> {
        let principal = principal(&request)?;
        let r = request.into_inner();
        let change = WebhookChange {
            url: r.url,
            event_types: r.set_event_types.then_some(r.event_types),
            category: r.category,
            min_severity: r.min_severity,
            description: r.description,
            secret: r.secret,
        };
        let view = webhooks::update(&self.context.domain, &principal, &r.id, change).await?;
        Ok(Response::new(webhook_message(view)))
    }

    async fn delete(
        &self,
        request: Request<proto::WebhookId>,
    ) -> Result<Response<proto::Empty>, Status> {
        let principal = principal(&request)?;
        webhooks::delete(&self.context.domain, &principal, &request.get_ref().id).await?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn test(
        &self,
        request: Request<proto::WebhookId>,
    ) -> Result<Response<proto::WebhookDelivery>, Status> {
        let principal = principal(&request)?;
        let view = webhooks::test(&self.context.domain, &principal, &request.get_ref().id).await?;
        Ok(Response::new(delivery_message(view)))
    }

    async fn deliveries(
        &self,
        request: Request<proto::DeliveriesRequest>,
    ) -> Result<Response<proto::DeliveriesResponse>, Status> {
        let principal = principal(&request)?;
        let r = request.into_inner();
        let views = webhooks::deliveries(
            &self.context.domain,
            &principal,
            &r.id,
            r.failed,
            r.limit as usize,
        )
        .await?;
        Ok(Response::new(proto::DeliveriesResponse {
            deliveries: views.into_iter().map(delivery_message).collect(),
        }))
    }

    async fn redeliver(
        &self,
        request: Request<proto::RedeliverRequest>,
    ) -> Result<Response<proto::WebhookDelivery>, Status> {
        let principal = principal(&request)?;
        let view = webhooks::redeliver(
            &self.context.domain,
            &principal,
            &request.get_ref().delivery_id,
        )
        .await?;
        Ok(Response::new(delivery_message(view)))
    }
}
