//! /health/live, /health/ready and /metrics: no key needed.

use http::{header, Response, StatusCode};

use super::{json_response, Body};
use crate::metrics::Exposition;
use crate::server::{health, Context};

/// The embedded broker's counters (absent with an external cluster, which has its own).
fn write_bus(context: &Context, out: &mut Exposition) {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(stats) = context.bus.with_stats(|s| {
        (
            s.connections.load(Relaxed),
            s.messages_in.load(Relaxed),
            s.messages_out.load(Relaxed),
            s.bytes_in.load(Relaxed),
            s.bytes_out.load(Relaxed),
            s.slow_consumers.load(Relaxed),
            s.logins_in_progress.load(Relaxed),
            s.logins_timed_out.load(Relaxed),
            s.publishes_throttled.load(Relaxed),
            s.logins_accepted.load(Relaxed),
            s.logins_refused.load(Relaxed),
        )
    }) else {
        return;
    };
    let (
        connections,
        messages_in,
        messages_out,
        bytes_in,
        bytes_out,
        slow,
        logins,
        timed_out,
        throttled,
        accepted,
        refused,
    ) = stats;
    let mut single = |name: &str, kind: &str, help: &str, value: u64| {
        out.family(name, kind, help);
        out.sample(name, &[], value as f64);
    };
    single(
        "svc_bus_connections",
        "gauge",
        "Client connections open on the embedded bus.",
        connections,
    );
    single(
        "svc_bus_logins_in_progress",
        "gauge",
        "New bus connections between accept and a verified CONNECT (bus.max_concurrent_logins).",
        logins,
    );
    single(
        "svc_bus_logins_timed_out_total",
        "counter",
        "New bus connections closed after waiting the login deadline for a login slot.",
        timed_out,
    );
    single(
        "svc_bus_publish_throttled_total",
        "counter",
        "Times a client connection waited for its credential's publish rate (bus.publish_rate_per_key).",
        throttled,
    );
    single(
        "svc_bus_slow_consumers_total",
        "counter",
        "Clients disconnected for not reading fast enough.",
        slow,
    );
    out.family(
        "svc_bus_logins_total",
        "counter",
        "Bus logins (CONNECT) by outcome: accepted or refused by the authenticator.",
    );
    out.sample(
        "svc_bus_logins_total",
        &[("outcome", "accepted")],
        accepted as f64,
    );
    out.sample(
        "svc_bus_logins_total",
        &[("outcome", "refused")],
        refused as f64,
    );
    out.family(
        "svc_bus_messages_total",
        "counter",
        "Client messages through the embedded bus (in = published by clients, out = delivered to clients).",
    );
    out.sample(
        "svc_bus_messages_total",
        &[("direction", "in")],
        messages_in as f64,
    );
    out.sample(
        "svc_bus_messages_total",
        &[("direction", "out")],
        messages_out as f64,
    );
    out.family(
        "svc_bus_bytes_total",
        "counter",
        "Client payload bytes through the embedded bus.",
    );
    out.sample(
        "svc_bus_bytes_total",
        &[("direction", "in")],
        bytes_in as f64,
    );
    out.sample(
        "svc_bus_bytes_total",
        &[("direction", "out")],
        bytes_out as f64,
    );
}

pub fn live() -> Response<Body> {
    json_response(StatusCode::OK, &serde_json::json!({"status": "ok"}))
}

pub async fn ready(context: &Context) -> Response<Body> {
    let readiness = health::readiness(context).await;
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, &readiness)
}

pub async fn metrics(context: &Context) -> Response<Body> {
    let readiness = health::readiness(context).await;
    let mut out = Exposition::default();
    out.family(
        "svc_health_ready",
        "gauge",
        "1 when the component is ready, 0 when not.",
    );
    for (name, component) in &readiness.components {
        let value = if component.is_ok() { 1.0 } else { 0.0 };
        out.sample("svc_health_ready", &[("component", name)], value);
    }
    out.family(
        "svc_uptime_seconds",
        "gauge",
        "Seconds since the server started.",
    );
    out.sample(
        "svc_uptime_seconds",
        &[],
        context.started.elapsed().as_secs_f64(),
    );
    context.metrics.write(&mut out);
    write_bus(context, &mut out);
    out.family(
        "svc_events_total",
        "counter",
        "Events emitted since start, by type.",
    );
    for (event_type, count) in context.domain.events.counts() {
        out.sample("svc_events_total", &[("type", &event_type)], count as f64);
    }
    out.family("svc_agents", "gauge", "Enrolled agents by state.");
    for (state, count) in context.domain.fleet.registry.counts() {
        out.sample("svc_agents", &[("state", state)], count as f64);
    }
    let (heartbeats, reconnects) = context.domain.fleet.registry.totals();
    out.family(
        "svc_agent_heartbeats_total",
        "counter",
        "Heartbeats received from enrolled agents (quarantined ones included).",
    );
    out.sample("svc_agent_heartbeats_total", &[], heartbeats as f64);
    out.family(
        "svc_agent_reconnects_total",
        "counter",
        "Agents heard from before that connected again after a disconnection.",
    );
    out.sample("svc_agent_reconnects_total", &[], reconnects as f64);
    context.domain.fleet.fan_outs.write(&mut out);
    out.family(
        "svc_agent_messages_forged_total",
        "counter",
        "Agent results and heartbeats dropped because they did not verify against the agent's key.",
    );
    for (kind, count) in context.domain.fleet.forgeries.totals() {
        let kind = kind.as_str();
        out.sample(
            "svc_agent_messages_forged_total",
            &[("kind", kind)],
            count as f64,
        );
    }
    Response::builder()
        .status(StatusCode::OK)
        .header(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )
        .body(super::full(out.finish()))
        .expect("static response parts are valid")
}
