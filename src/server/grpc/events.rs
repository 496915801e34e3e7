//! EventService: list, get, emit, subscribe, replay, stats, types (contract §8).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::principal;
use crate::auth::Role;
use crate::events::{self, Event, Filter, NewEvent};
use crate::proto;
use crate::server::Context;

pub struct Events {
    pub context: Arc<Context>,
}

impl From<Event> for proto::Event {
    fn from(event: Event) -> Self {
        proto::Event {
            id: event.id,
            seq: event.seq,
            r#type: event.event_type,
            category: event.category,
            severity: event.severity,
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

/// Serves a history-then-live (or history-only) stream from the log.
fn event_stream(
    context: &Arc<Context>,
    filter: Filter,
    follow: bool,
) -> tonic::codegen::BoxStream<proto::Event> {
    let (sender, receiver) = tokio::sync::mpsc::channel(256);
    let context = context.clone();
    tokio::spawn(async move { context.domain.events.stream(filter, follow, sender).await });
    use tokio_stream::StreamExt;
    Box::pin(
        tokio_stream::wrappers::ReceiverStream::new(receiver)
            .map(|item| item.map(Into::into).map_err(Status::from)),
    )
}

#[tonic::async_trait]
impl proto::event_service_server::EventService for Events {
    async fn list(
        &self,
        request: Request<proto::ListEventsRequest>,
    ) -> Result<Response<proto::ListEventsResponse>, Status> {
        principal(&request)?.require(Role::Readonly)?;
        let request = request.into_inner();
        let filter = filter_from(request.filter)?;
        let page = request.page.unwrap_or_default();
        let limit = if page.limit == 0 {
            100
        } else {
            page.limit.min(1000)
        } as usize;
        let cursor = match page.cursor.as_str() {
            "" => None,
            text => Some(
                text.parse::<u64>()
                    .map_err(|_| Status::invalid_argument(format!("invalid cursor '{text}'")))?,
            ),
        };
        let (items, next) = self.context.domain.events.list(&filter, limit, cursor)?;
        Ok(Response::new(proto::ListEventsResponse {
            items: items.into_iter().map(Into::into).collect(),
            next_cursor: next.map(|n| n.to_string()).unwrap_or_default(),
        }))
    }

    async fn get(
        &self,
        request: Request<proto::GetEventRequest>,
    ) -> Result<Response<proto::Event>, Status> {
        principal(&request)?.require(Role::Readonly)?;
        let event = self.context.domain.events.get(&request.into_inner().id)?;
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
                    .map_err(|e| Status::invalid_argument(format!("payload is not JSON: {e}")))?,
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
        principal(&request)?.require(Role::Readonly)?;
        let mut filter = filter_from(request.into_inner().filter)?;
        // Without --since a subscription starts now: live events only.
        if filter.since_ms.is_none() {
            filter.since_ms = Some(crate::clock::now_millis());
        }
        Ok(Response::new(event_stream(&self.context, filter, true)))
    }

    async fn replay(
        &self,
        request: Request<proto::ReplayEventsRequest>,
    ) -> Result<Response<tonic::codegen::BoxStream<proto::Event>>, Status> {
        principal(&request)?.require(Role::Readonly)?;
        let filter = filter_from(request.into_inner().filter)?;
        Ok(Response::new(event_stream(&self.context, filter, false)))
    }

    async fn stats(
        &self,
        request: Request<proto::EventStatsRequest>,
    ) -> Result<Response<proto::EventStatsResponse>, Status> {
        principal(&request)?.require(Role::Readonly)?;
        let request = request.into_inner();
        let since = if request.since.is_empty() {
            "24h".to_string()
        } else {
            request.since
        };
        let filter = Filter::parse(Vec::new(), "", &since, &request.until, "", "")?;
        let stats = self.context.domain.events.stats(&filter)?;
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
        principal(&request)?.require(Role::Readonly)?;
        Ok(Response::new(proto::EventTypesResponse {
            types: events::TYPES
                .iter()
                .map(|t| proto::EventType {
                    name: t.name.into(),
                    category: t.category.into(),
                    default_severity: t.severity.into(),
                })
                .collect(),
        }))
    }
}
