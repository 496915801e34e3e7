//! The server's side of the bus: the embedded broker (or an external NATS cluster), the
//! API-key authenticator, and the server's own client, which subsystems use exactly as they
//! would against an external cluster.
//!
//! With `bus.tls` the embedded broker requires TLS from every client (INFO `tls_required`),
//! and the server's own client connects over `tls://` trusting exactly the certificate the
//! broker serves (`crate::tls::pinned_client_config`). The broker then also requests (never
//! requires) a client certificate chaining to the embedded root CA (`server::cmd`): an agent
//! presenting its own is that agent, as nats-server's `verify_and_map` maps a certificate's
//! SAN to a user (contract §7), with no `jwt` or signature in CONNECT.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::auth;
use crate::bus::{
    subjects, AllowDeny, AuthRequest, Authenticator, Broker, BrokerConfig, BrokerHandle,
    Permissions,
};
use crate::config::ServerConfig;
use crate::store::Store;
use crate::{Error, Result};

/// API keys are bus credentials (contract §7): `auth_token` = key, or `user` = key id and
/// `pass` = key. No credentials: the enrolment permissions only. The server's own client
/// presents an internal token made at start.
pub struct ApiKeyAuthenticator {
    store: Arc<dyn Store>,
    internal_token: String,
}

#[async_trait]
impl Authenticator for ApiKeyAuthenticator {
    fn auth_required(&self) -> bool {
        true
    }

    /// Agents without a TLS client certificate sign the nonce.
    fn uses_nonce(&self) -> bool {
        true
    }

    async fn authenticate(&self, request: &AuthRequest<'_>) -> Option<Permissions> {
        if !request.has_credentials() {
            return Some(Permissions::enrolment());
        }
        if request.jwt.is_some() || request.peer_certificates.is_some() {
            return agent_permissions(self.store.as_ref(), request).await;
        }
        let key = match (request.auth_token, request.user, request.pass) {
            (Some(token), _, _) => {
                if crate::bus::broker::constant_time_eq(
                    token.as_bytes(),
                    self.internal_token.as_bytes(),
                ) {
                    return Some(Permissions::internal("server"));
                }
                token
            }
            (None, Some(_), Some(pass)) => pass,
            _ => return None,
        };
        let principal = auth::authenticate(self.store.as_ref(), key).await.ok()?;
        // user/pass must name the key's own id.
        if request.auth_token.is_none() && request.user != Some(principal.id.as_str()) {
            return None;
        }
        Some(auth::bus_permissions(
            principal.role,
            // The key's id names the connection (monitoring's `authorized_user`); never the key.
            principal.id.clone(),
        ))
    }
}

/// The running bus from the server's point of view.
pub struct Bus {
    /// The embedded broker; None when an external cluster is used (or after shutdown).
    broker: std::sync::Mutex<Option<BrokerHandle>>,
    pub is_embedded: bool,
    pub client: async_nats::Client,
    /// Where clients reach the bus (the embedded broker's address, or the external URLs).
    pub address: String,
    connected: Arc<AtomicBool>,
    /// The client's connection events, until `report_health` takes them.
    state_changes: std::sync::Mutex<Option<mpsc::UnboundedReceiver<async_nats::Event>>>,
}

impl Bus {
    /// Publishes into the embedded broker in process; None with an external bus.
    pub fn local_publisher(&self) -> Option<crate::bus::broker::LocalPublisher> {
        let broker = self.broker.lock().expect("bus lock");
        broker.as_ref().map(BrokerHandle::local_publisher)
    }

    /// Emits bus_healthy / bus_degraded as the server's own connection comes and goes (once;
    /// later calls do nothing).
    pub fn report_health(&self, events: Arc<crate::events::Events>) {
        let Some(mut state_changes) = self.state_changes.lock().expect("bus lock").take() else {
            return;
        };
        let flag = self.connected.clone();
        tokio::spawn(async move {
            while let Some(event) = state_changes.recv().await {
                let (healthy, detail) = match &event {
                    async_nats::Event::Connected => (true, "connected"),
                    async_nats::Event::Disconnected => (false, "disconnected"),
                    _ => continue,
                };
                if flag.swap(healthy, Ordering::Relaxed) != healthy {
                    let event_type = if healthy {
                        crate::events::EventKind::BusHealthy
                    } else {
                        crate::events::EventKind::BusDegraded
                    };
                    events
                        .emit_system(event_type, "server", serde_json::json!({"detail": detail}))
                        .await;
                }
            }
        });
    }

    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
            && self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Reads the embedded broker's counters (None for an external cluster).
    pub fn with_stats<T>(&self, read: impl FnOnce(&crate::bus::BrokerStats) -> T) -> Option<T> {
        let broker = self.broker.lock().expect("broker lock poisoned");
        broker.as_ref().map(|b| read(b.stats()))
    }

    /// SIGUSR2: the embedded broker's lame duck (see `BrokerHandle::enter_lame_duck`); the
    /// server's own client is closed with the others. False without an embedded broker.
    pub fn enter_lame_duck(&self, duration: Duration, grace: Duration) -> bool {
        let broker = self.broker.lock().expect("broker lock poisoned");
        match broker.as_ref() {
            Some(broker) => {
                broker.enter_lame_duck(duration, grace);
                true
            }
            None => false,
        }
    }

    /// The embedded broker's monitoring view (None for an external cluster).
    pub fn broker_view(&self) -> Option<crate::bus::BrokerView> {
        let broker = self.broker.lock().expect("broker lock poisoned");
        broker.as_ref().map(|broker| broker.view())
    }

    /// Lame duck for the embedded broker; the server's client flushes first.
    pub async fn shutdown(&self, grace: Duration) {
        // Drain (flush, unsubscribe, close) the server's own client first: the broker's lame
        // duck waits for clients to leave, and this one otherwise never would.
        let _ = tokio::time::timeout(Duration::from_secs(2), self.client.drain()).await;
        let broker = self.broker.lock().expect("broker lock poisoned").take();
        if let Some(broker) = broker {
            broker.shutdown(grace).await;
        }
    }
}

/// The embedded broker's bound listener and, with `bus.tls`, its TLS.
pub struct EmbeddedListener {
    pub listener: TcpListener,
    pub tls: Option<crate::tls::BusTls>,
}

/// Starts the embedded broker on `embedded` (or, without it, uses `bus.external_urls`) and
/// connects the server's client. API keys in CONNECT are checked against `store`. Call
/// [`Bus::report_health`] once the domain exists, so connection changes become events.
/// With `nats` (an external cluster in JWT mode) the client logs in with a member JWT.
pub async fn start(
    config: &ServerConfig,
    store: Arc<dyn Store>,
    embedded: Option<EmbeddedListener>,
    nats: Option<&crate::identity::nats::NatsKeys>,
) -> Result<Bus> {
    let connected = Arc::new(AtomicBool::new(false));
    let mut pinned_certificate = None;
    let (broker, urls, token) = match embedded {
        Some(EmbeddedListener { listener, tls }) => {
            let internal_token = crate::ids::random_base62(48);
            let authenticator = ApiKeyAuthenticator {
                store: store.clone(),
                internal_token: internal_token.clone(),
            };
            let scheme = if tls.is_some() { "tls" } else { "nats" };
            let broker_config = BrokerConfig {
                max_payload: config.bus.effective_max_payload() as usize,
                server_name: config.bus.server_name.clone(),
                ping_interval: config.bus.ping_interval.0,
                max_pings_out: config.bus.ping_max,
                max_connections: config.bus.max_connections,
                max_concurrent_logins: config.bus.max_concurrent_logins,
                max_pending_total: config.bus.max_pending_total as usize,
                tls: tls.as_ref().map(|tls| tls.server.clone()),
                // The file service authorizes by the key a request came with (server::files).
                sender_subjects: Some(subjects::FILES_ALL.into()),
                user_limits: Some(crate::bus::broker::UserLimits {
                    publish_rate: config.bus.publish_rate_per_key,
                    publish_burst: config.bus.publish_burst_per_key,
                    max_pending: config.bus.effective_max_pending_per_key() as usize,
                }),
                ..BrokerConfig::default()
            };
            pinned_certificate = tls.map(|tls| tls.certificate);
            let broker = Broker::start(broker_config, Arc::new(authenticator), listener)
                .await
                .map_err(|e| Error::Unavailable(format!("bus broker: {e}")))?;
            let url = format!("{scheme}://{}", broker.local_addr());
            (Some(broker), vec![url], Some(internal_token))
        }
        None => {
            let token = config.bus.external_token.expose().to_string();
            (
                None,
                config.bus.external_urls.clone(),
                (!token.is_empty()).then_some(token),
            )
        }
    };
    let address = urls.join(",");
    let (state_sender, state_changes) = mpsc::unbounded_channel();
    let login = match nats.filter(|_| broker.is_none()) {
        Some(keys) => {
            let member = if config.cluster.member_id.is_empty() {
                config.bus.server_name.as_str()
            } else {
                config.cluster.member_id.as_str()
            };
            Some(crate::identity::nats::member_login(keys, member)?)
        }
        None => None,
    };
    let mut options = match login {
        Some((jwt, key)) => crate::bus::natsjwt::connect_options(jwt, key),
        None => async_nats::ConnectOptions::new(),
    }
    .name("svc-server")
    .retry_on_initial_connect()
    .event_callback(move |event| {
        let sender = state_sender.clone();
        async move {
            let _ = sender.send(event);
        }
    });
    if let Some(token) = token {
        options = options.token(token);
    }
    if let Some(certificate) = pinned_certificate {
        options = options
            .require_tls(true)
            .tls_client_config(crate::tls::pinned_client_config(certificate));
    }
    let client = tokio::time::timeout(Duration::from_secs(10), options.connect(urls.clone()))
        .await
        .map_err(|_| Error::Unavailable(format!("bus: no connection to {address} within 10s")))?
        .map_err(|e| Error::Unavailable(format!("bus: cannot connect to {address}: {e}")))?;
    // retry_on_initial_connect returns before the first connection; wait for it briefly so
    // readiness is true from the start when the bus is there.
    for _ in 0..200 {
        if client.connection_state() == async_nats::connection::State::Connected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    connected.store(
        client.connection_state() == async_nats::connection::State::Connected,
        Ordering::Relaxed,
    );

    Ok(Bus {
        is_embedded: broker.is_some(),
        broker: std::sync::Mutex::new(broker),
        client,
        address,
        connected,
        state_changes: std::sync::Mutex::new(Some(state_changes)),
    })
}

/// What an enrolled agent may do on the bus (contract §7): publish only under its own
/// subjects — results go to `svc.agent.<id>.result`, never to a reply inbox, so the subject
/// proves the sender and no agent can answer for another — and subscribe to its own subjects
/// and its own private reply inbox.
pub fn agent_bus_permissions(agent_id: &str) -> Permissions {
    use crate::bus::SubjectRule;
    Permissions {
        user: format!("agent:{agent_id}"),
        publish: AllowDeny {
            allow: vec![SubjectRule::pattern(subjects::agent_all(agent_id))],
            deny: Vec::new(),
        },
        subscribe: AllowDeny {
            allow: vec![
                SubjectRule::pattern(subjects::agent_all(agent_id)),
                SubjectRule::private_inbox("_INBOX", 16),
            ],
            deny: Vec::new(),
        },
        internal: false,
        quota: true,
    }
}

/// An agent's CONNECT: its certificate from mutual TLS (the verified leaf; the handshake
/// proved the key, so CONNECT needs nothing more and its `jwt` is not looked at) or else from
/// `jwt` (PEM) with a signature of the nonce in `sig` or `pass` (base64url). Either way the
/// certificate must come from the current signing CA and be the agent's latest enrolment:
/// see `identity::authenticate_agent`.
async fn agent_permissions(store: &dyn Store, request: &AuthRequest<'_>) -> Option<Permissions> {
    use base64::Engine;
    let from_tls = request
        .peer_certificates
        .and_then(|chain| chain.first())
        .map(|leaf| leaf.as_ref().to_vec());
    let via = if from_tls.is_some() {
        "mutual TLS"
    } else {
        "signed nonce"
    };
    let (certificate, signature) = match from_tls {
        Some(der) => (der, None),
        None => {
            let der = crate::identity::ca::pem_to_der(request.jwt?).ok()?;
            let encoded = request.sig.or(request.pass)?;
            let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(encoded.trim_end_matches('='))
                .ok()?;
            (der, Some(signature))
        }
    };
    match crate::identity::authenticate_agent(
        store,
        &certificate,
        request.nonce.as_bytes(),
        signature.as_deref(),
    )
    .await
    {
        Ok(agent_id) => {
            tracing::debug!(%agent_id, via, client_ip = %request.client_ip, "agent logged in on the bus");
            Some(agent_bus_permissions(&agent_id))
        }
        Err(error) => {
            tracing::info!(%error, via, client_ip = %request.client_ip, "agent bus authentication refused");
            None
        }
    }
}
