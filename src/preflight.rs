//! The checks a server configuration passes before a server starts on it. `svc-server
//! --check-config`, the server's own start and svc-bootstrap's validate phase run this one
//! list, so what svc-bootstrap calls valid is what the server accepts, without the bootstrap
//! reaching into the server.

use std::net::SocketAddr;
use std::path::Path;

use crate::config::{self, ServerConfig};

/// What `svc-server --config PATH --check-config` reports, for svc-bootstrap's validate phase.
pub fn check_config_file(path: &Path) -> Vec<String> {
    match config::load_server(Some(path), &[]) {
        Ok(loaded) => check_config(&loaded.config, false),
        Err(errors) => errors.0,
    }
}

/// Every problem with a configuration, for `--check-config` and start-up; `dev`: the keys
/// may be missing (`--dev` generates them).
pub fn check_config(config: &ServerConfig, dev: bool) -> Vec<String> {
    let mut problems = Vec::new();
    for (key, value) in [
        ("listen.http", &config.listen.http),
        ("listen.grpc", &config.listen.grpc),
        ("listen.bus", &config.listen.bus),
    ] {
        if value.parse::<SocketAddr>().is_err() {
            problems.push(format!(
                "{key}: '{value}' is not a host:port socket address"
            ));
        }
    }
    // In dev mode the keys are generated at start when they are missing.
    if !dev {
        if config.hmacsecret.is_empty() {
            problems.push("hmacsecret is missing (required; derives agent bootstrap PSKs)".into());
        }
        if config.master_key.is_empty() {
            problems.push(
                "master_key is missing (required; base64 of 32 bytes, e.g. `openssl rand -base64 32`)"
                    .into(),
            );
        }
    }
    if !config.master_key.is_empty()
        && crate::datadir::decode_master_key(&config.master_key).is_none()
    {
        problems.push("master_key must be base64 of exactly 32 bytes".into());
    }
    if config.rate_limit.requests_per_second <= 0.0 || config.rate_limit.burst == 0 {
        problems.push("rate_limit: requests_per_second and burst must be positive".into());
    }
    if config.limits.max_connections == 0 || config.bus.max_connections == 0 {
        problems.push("limits.max_connections and bus.max_connections must be at least 1".into());
    }
    if config.limits.handshake_timeout.0.is_zero()
        || config.limits.max_grpc_streams == 0
        || config.limits.grpc_stream_stall.0.is_zero()
    {
        problems.push(
            "limits.handshake_timeout, limits.max_grpc_streams and limits.grpc_stream_stall \
             must be positive"
                .into(),
        );
    }
    if config.store.driver == crate::config::StoreDriver::Postgres {
        if let Err(e) = crate::store::postgres::Target::from_config(&config.store) {
            problems.push(e.to_string());
        }
    }
    if config.rate_limit.max_in_flight == 0 {
        problems.push("rate_limit.max_in_flight must be at least 1".into());
    }
    if config.limits.body_timeout.0.is_zero() {
        problems.push("limits.body_timeout must be longer than 0s (default 30s)".into());
    }
    if config.limits.idle_timeout.0.is_zero() {
        problems.push("limits.idle_timeout must be longer than 0s (default 10s)".into());
    }
    // Reads and parses the files: a missing, unreadable or mismatched file is a problem here
    // rather than a failure at the first handshake.
    if let Err(problem) = crate::tls::server_tls(&config.tls) {
        problems.push(problem);
    }
    let has_bus_tls = !config.bus.tls.cert.is_empty() || !config.bus.tls.key.is_empty();
    if has_bus_tls && !config.bus.external_urls.is_empty() {
        problems.push(
            "bus.tls configures the embedded broker's listener, which does not run when \
             bus.external_urls is set: configure TLS on that cluster and use tls:// URLs"
                .into(),
        );
    } else if let Err(problem) = crate::tls::bus_server_tls(&config.bus.tls, &[]) {
        problems.push(problem);
    }
    if config.bus.external_auth == crate::config::ExternalAuth::Jwt {
        if config.bus.external_urls.is_empty() {
            problems.push(
                "bus.external_auth: jwt is for an external NATS cluster: set bus.external_urls \
                 (the embedded broker checks agents itself)"
                    .into(),
            );
        }
        if !config.bus.external_token.expose().is_empty() {
            problems.push(
                "bus.external_auth: jwt and bus.external_token exclude each other: in operator \
                 mode every client logs in with a user JWT"
                    .into(),
            );
        }
    }
    if config.bus.ping_interval.0.is_zero() {
        problems
            .push("bus.ping_interval must be longer than 0s (nats-server's default: 2m)".into());
    }
    let monitor = config.listen.bus_monitor.trim();
    if !monitor.is_empty() && monitor.parse::<SocketAddr>().is_err() {
        problems.push(format!(
            "listen.bus_monitor: '{monitor}' is not a host:port socket address (empty: off)"
        ));
    }
    if config.bus.lame_duck_grace_period.0 >= config.bus.lame_duck_duration.0 {
        problems
            .push("bus.lame_duck_grace_period must be shorter than bus.lame_duck_duration".into());
    }
    if config.bus.max_pending_total < config.bus.effective_max_payload().max(1024 * 1024) {
        problems.push(format!(
            "bus.max_pending_total must be at least 1 MiB and bus.max_payload ({}); default 64 MiB",
            config.bus.effective_max_payload()
        ));
    }
    if config.bus.ping_max == 0 {
        problems.push("bus.ping_max must be at least 1 (nats-server's default: 2)".into());
    }
    if config.bus.server_name.trim().is_empty()
        || config.bus.server_name.contains(char::is_whitespace)
    {
        problems.push("bus.server_name must be non-empty and without spaces".into());
    }
    if config.store.driver == config::StoreDriver::Postgres && config.store.url.is_empty() {
        problems.push("store.url is required when store.driver is postgres".into());
    }
    problems.extend(crate::cluster::config_problems(config));
    problems
}
