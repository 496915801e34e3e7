//! Starts the embedded broker's monitoring listener (`listen.bus_monitor`, nats-server's
//! `-m` port; see `bus::monitor`) and, with `bus.monitor_auth`, requires an admin API key
//! as a bearer token. Off with an external NATS cluster or an empty `listen.bus_monitor`.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::auth::{self, Role};
use crate::bus::monitor::MonitorAuth;
use crate::config::ServerConfig;
use crate::domain::Domain;
use crate::store::Store;
use crate::Result;

/// Admin API keys only: the endpoints show every connection's address and key id.
struct AdminKeys {
    store: Arc<dyn Store>,
}

#[async_trait]
impl MonitorAuth for AdminKeys {
    async fn check(&self, authorization: Option<&str>) -> std::result::Result<(), (u16, String)> {
        let key = auth::bearer_token(authorization).map_err(|e| (401, e.to_string()))?;
        let principal = auth::authenticate(self.store.as_ref(), key)
            .await
            .map_err(|_| (401, "invalid API key".to_string()))?;
        if principal.role != Role::Admin {
            return Err((403, "bus monitoring requires an admin API key".into()));
        }
        Ok(())
    }
}

/// Binds and serves; returns the bound address, or None when monitoring is off.
pub async fn start(
    config: &ServerConfig,
    domain: &Domain,
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
            store: domain.store.clone(),
        }) as Arc<dyn MonitorAuth>
    });
    if auth.is_none() && !bound.ip().is_loopback() {
        tracing::warn!(%bound, "bus monitoring without authentication on a non-loopback address (set bus.monitor_auth: true)");
    }
    tokio::spawn(crate::bus::monitor::serve(view, listener, auth, stop));
    Ok(Some(bound))
}
