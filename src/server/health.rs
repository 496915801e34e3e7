//! Readiness: one status per component, shared by /health/ready and /metrics.

use super::Context;

/// One component's state: `ok`, or another status with a detail saying why.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Component {
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Component {
    fn ok() -> Self {
        Component {
            status: "ok".into(),
            detail: None,
        }
    }

    fn failing(status: &str, detail: impl Into<String>) -> Self {
        Component {
            status: status.into(),
            detail: Some(detail.into()),
        }
    }

    pub fn is_ok(&self) -> bool {
        self.status == "ok"
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub components: std::collections::BTreeMap<&'static str, Component>,
}

/// How long readiness waits for the store's round trip, and for each stream's health (a
/// JetStream stream whose leader was on a node that just died answers only once another
/// node leads it: /metrics and /health/ready must not wait that long).
const STORE_PING_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Checks every component now (no caching: readiness is polled rarely and must be true).
pub async fn readiness(context: &Context) -> Readiness {
    let mut components = std::collections::BTreeMap::new();
    components.insert(
        "store",
        // Bounded: a PostgreSQL that stopped answering would otherwise hold the probe for the
        // pool's whole connect timeout, and load balancers give up on probes much sooner.
        match tokio::time::timeout(STORE_PING_LIMIT, context.domain.store.ping()).await {
            Ok(Ok(())) => Component::ok(),
            Ok(Err(e)) => Component::failing(
                "unavailable",
                format!("{} store: {e}", context.domain.store.driver()),
            ),
            Err(_) => Component::failing(
                "unavailable",
                format!(
                    "{} store: no answer within {STORE_PING_LIMIT:?}",
                    context.domain.store.driver()
                ),
            ),
        },
    );
    components.insert(
        "grpc",
        if context.is_grpc_serving() {
            Component::ok()
        } else {
            Component::failing("unavailable", "gRPC server is not accepting")
        },
    );
    components.insert(
        "bus",
        if context.bus.is_connected() {
            Component::ok()
        } else {
            let which = if context.bus.is_embedded {
                "embedded broker"
            } else {
                "external cluster"
            };
            Component::failing(
                "unavailable",
                format!(
                    "server not connected to the {which} at {}",
                    context.bus.address
                ),
            )
        },
    );
    let checks = context.streams.iter().map(|(name, log)| async move {
        match tokio::time::timeout(STORE_PING_LIMIT, log.health()).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("{name}: {e}")),
            Err(_) => Some(format!("{name}: no answer within {STORE_PING_LIMIT:?}")),
        }
    });
    let stream_problems: Vec<String> = futures_util::future::join_all(checks)
        .await
        .into_iter()
        .flatten()
        .collect();
    components.insert(
        "stream_store",
        if stream_problems.is_empty() {
            Component::ok()
        } else {
            Component::failing("unavailable", stream_problems.join("; "))
        },
    );
    components.insert(
        "audit",
        match context.domain.auditor.health().await {
            Ok(()) => Component::ok(),
            Err(e) => Component::failing("unavailable", e.to_string()),
        },
    );
    let ready = components.values().all(Component::is_ok);
    Readiness { ready, components }
}
