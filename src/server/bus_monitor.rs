//! Starts the embedded broker's monitoring listener (`listen.bus_monitor`, nats-server's
//! `-m` port; see `bus::monitor`) and, with `bus.monitor_auth`, requires an admin API key
//! as a bearer token. Off unless `listen.bus_monitor` is set (nats-server's `-m` is opt-in
//! too), and always with an external NATS cluster.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::auth::Role;
use crate::bus::monitor::MonitorAuth;
use crate::config::ServerConfig;
use crate::domain::Domain;
use crate::Result;

/// Admin API keys only: the endpoints show every connection's address and key id.
struct AdminKeys {
    domain: Arc<Domain>,
}

#[async_trait]
impl MonitorAuth for AdminKeys {
    async fn check(&self, authorization: Option<&str>) -> std::result::Result<(), (u16, String)> {
        let refused = |e: crate::Error| (e.http_status(), e.to_string());
        let principal = self
            .domain
            .authenticate(authorization)
            .await
            .map_err(refused)?;
        principal.require(Role::Admin).map_err(refused)
    }
}

/// Binds and serves; returns the bound address, or None when monitoring is off.
pub async fn start(
    config: &ServerConfig,
    domain: &Arc<Domain>,
    bus: &super::bus::Bus,
    stop: watch::Receiver<bool>,
) -> Result<Option<SocketAddr>> {
    let address = config.listen.bus_monitor.trim();
    let Some(view) = bus.broker_view() else {
        return Ok(None);
    };
    if address.is_empty() {
        return Ok(None);
    }
    let listener = tokio::net::TcpListener::bind(address).await.map_err(|e| {
        crate::Error::Unavailable(format!(
            "listen.bus_monitor: cannot listen on {address}: {e}"
        ))
    })?;
    let bound = listener.local_addr()?;
    let auth: Option<Arc<dyn MonitorAuth>> = config.bus.monitor_auth.then(|| {
        Arc::new(AdminKeys {
            domain: domain.clone(),
        }) as Arc<dyn MonitorAuth>
    });
    if auth.is_none() && !bound.ip().is_loopback() {
        tracing::warn!(%bound, "bus monitoring without authentication on a non-loopback address (set bus.monitor_auth: true)");
    }
    tokio::spawn(crate::bus::monitor::serve(view, listener, auth, stop));
    Ok(Some(bound))
}
