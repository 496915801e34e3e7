//! EventService: list, get, emit, subscribe, replay, stats, types (contract §8).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::principal;
use crate::events::{self, Event, Filter, NewEvent};
use crate::proto;
use crate::server::Context;
use crate::Error;

pub struct Events {
    pub context: Arc<Context>,
}

impl From<Event> for proto::Event {
    fn from(event: Event) -> Self {
        proto::Event {
            id: event.id,
            seq: event.seq,
            r#type: event.event_type.to_string(),
            category: event.category,
            severity: event.severity.to_string(),
            source: event.source,
            timestamp: event.timestamp,
            payload_json: event.payload.to_string(),
        }
    }
}

fn filter_from(filter: Option<proto::EventFilter>) -> Result<Filter, Status> {
    let f = filter.unwrap_or_default();
    Ok(Filter::parse(
        f.types,
        &f.category,
        &f.since,
        &f.until,
        &f.min_severity,
        &f.source,
    )?)
}

/// The domain's event channel as a gRPC stream (relayed: cut off when its client stops reading).
fn event_stream(
    relayed: tokio_stream::wrappers::ReceiverStream<crate::Result<Event>>,
) -> tonic::codegen::BoxStream<proto::Event> {
    use tokio_stream::StreamExt;
    Box::pin(relayed.map(|item| item.map(Into::into).map_err(Status::from)))
}

#[tonic::async_trait]
impl proto::event_service_server::EventService for Events {
    async fn list(
        &self,
        request: Request<proto::ListEventsRequest>,
    ) -> Result<Response<proto::ListEventsResponse>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let filter = filter_from(request.filter)?;
        let page = request.page.unwrap_or_default();
        let (items, next) = events::list(
            &self.context.domain,
            &caller,
            &filter,
            page.limit as usize,
            &page.cursor,
        )
        .await?;
        Ok(Response::new(proto::ListEventsResponse {
            items: items.into_iter().map(Into::into).collect(),
            next_cursor: next.map(|n| n.to_string()).unwrap_or_default(),
        }))
    }

    async fn get(
        &self,
        request: Request<proto::GetEventRequest>,
    ) -> Result<Response<proto::Event>, Status> {
        let caller = principal(&request)?;
        let event = events::get(&self.context.domain, &caller, &request.into_inner().id).await?;
        Ok(Response::new(event.into()))
    }

    async fn emit(
        &self,
        request: Request<proto::EmitEventRequest>,
    ) -> Result<Response<proto::Event>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let payload = match request.payload_json.trim() {
            "" => None,
            text => Some(
                serde_json::from_str(text)
                    .map_err(|e| Error::Invalid(format!("payload is not JSON: {e}")))?,
            ),
        };
        let new = NewEvent {
            event_type: request.r#type,
            severity: Some(request.severity),
            source: Some(request.source),
            payload,
        };
        let event = events::emit(&self.context.domain, &caller, new).await?;
        Ok(Response::new(event.into()))
    }

    async fn subscribe(
        &self,
        request: Request<proto::SubscribeEventsRequest>,
    ) -> Result<Response<tonic::codegen::BoxStream<proto::Event>>, Status> {
        let caller = principal(&request)?;
        let connection = super::connection(&request);
        let filter = filter_from(request.into_inner().filter)?;
        let receiver = events::open_stream(&self.context.domain, &caller, filter, true)?;
        let relayed = super::relay(&self.context, connection, "Subscribe", receiver);
        Ok(Response::new(event_stream(relayed)))
    }

    async fn replay(
        &self,
        request: Request<proto::ReplayEventsRequest>,
    ) -> Result<Response<tonic::codegen::BoxStream<proto::Event>>, Status> {
        let caller = principal(&request)?;
        let connection = super::connection(&request);
        let filter = filter_from(request.into_inner().filter)?;
        let receiver = events::open_stream(&self.context.domain, &caller, filter, false)?;
        let relayed = super::relay(&self.context, connection, "Replay", receiver);
        Ok(Response::new(event_stream(relayed)))
    }

    async fn stats(
        &self,
        request: Request<proto::EventStatsRequest>,
    ) -> Result<Response<proto::EventStatsResponse>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let since = if request.since.is_empty() {
            "24h".to_string()
        } else {
            request.since
        };
        let filter = Filter::parse(Vec::new(), "", &since, &request.until, "", "")?;
        let stats = events::stats(&self.context.domain, &caller, &filter).await?;
        let counts = |map: std::collections::BTreeMap<String, u64>| {
            map.into_iter()
                .map(|(key, count)| proto::EventCount { key, count })
                .collect()
        };
        Ok(Response::new(proto::EventStatsResponse {
            total: stats.total,
            by_type: counts(stats.by_type),
            by_severity: counts(stats.by_severity),
        }))
    }

    async fn types(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::EventTypesResponse>, Status> {
        let caller = principal(&request)?;
        Ok(Response::new(proto::EventTypesResponse {
            types: events::types(&caller)?
                .iter()
                .map(|t| proto::EventType {
                    name: t.name.into(),
                    category: t.category.into(),
                    default_severity: t.severity.to_string(),
                })
                .collect(),
        }))
    }
}
