//! /health/live, /health/ready and /metrics: no key needed.

use http::{header, Response, StatusCode};

use super::{json_response, Body};
use crate::metrics::Exposition;
use crate::server::{health, Context};

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
    Response::builder()
        .status(StatusCode::OK)
        .header(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )
        .body(Body::new(out.finish().into()))
        .expect("static response parts are valid")
}
