//! The embedded broker's monitoring endpoints, as nats-server serves them on its `-m` port:
//! `/varz`, `/connz`, `/subsz`, `/healthz`, `/routez`, `/jsz`, read-only JSON with
//! nats-server 2.9's field names and types, so nats-top, prometheus-nats-exporter and Surveyor
//! work unmodified. `tests/bus_differential.rs` compares every endpoint's key set and value
//! types with the real nats-server.
//!
//! Owns the HTTP/1 listener loop (hyper) and the JSON shapes; reads the broker only through
//! [`BrokerView`]. Knows nothing of API keys: the server passes a [`MonitorAuth`] when
//! `bus.monitor_auth` is set. No clustering, gateways, leaf nodes or JetStream: those
//! sections answer as a nats-server without them does (empty objects, `disabled: true`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::broker::{BrokerView, ConnectionView, SubscriptionView, NATS_VERSION};

/// nats-server's default page size for `/connz` and `/subsz`.
const DEFAULT_LIMIT: usize = 1024;
/// The one account every client is in (nats-server's global account).
const GLOBAL_ACCOUNT: &str = "$G";

/// Decides whether a monitoring request may be answered, from its `Authorization` header.
#[async_trait]
pub trait MonitorAuth: Send + Sync {
    /// `Ok` answers; `Err((status, message))` refuses (401 or 403).
    async fn check(&self, authorization: Option<&str>) -> Result<(), (u16, String)>;
}

struct Monitor {
    view: BrokerView,
    auth: Option<Arc<dyn MonitorAuth>>,
    http: SocketAddr,
    /// Requests per endpoint (`http_req_stats`).
    requests: Mutex<HashMap<&'static str, u64>>,
    /// The process CPU time and wall time at the last `/varz`, for its `cpu` percentage.
    cpu_sample: Mutex<(Duration, SystemTime)>,
}

/// Connections the monitoring listener holds at once: enough for a few tools and scrapers; a
/// flood past it is closed at once and takes nothing from the other listeners (it fits in the
/// descriptors `server::fds` keeps in reserve).
pub const MAX_CONNECTIONS: usize = 32;

/// Serves monitoring on `listener` until `stop` turns true. A connection that sends no
/// complete request header within 10 s is closed, like REST's.
pub async fn serve(
    view: BrokerView,
    listener: TcpListener,
    auth: Option<Arc<dyn MonitorAuth>>,
    mut stop: watch::Receiver<bool>,
) {
    let Ok(http) = listener.local_addr() else {
        return;
    };
    let started = view.started();
    let monitor = Arc::new(Monitor {
        view,
        auth,
        http,
        requests: Mutex::new(HashMap::new()),
        cpu_sample: Mutex::new((Duration::ZERO, started)),
    });
    tracing::info!(%http, "bus monitoring listening");
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10));
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => return,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "bus monitoring: connection refused, {MAX_CONNECTIONS} open");
            continue;
        };
        let monitor = monitor.clone();
        let service = service_fn(move |request| {
            let monitor = monitor.clone();
            async move { Ok::<_, Infallible>(monitor.handle(request).await) }
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            let _ = connection.await;
            drop(slot);
        });
    }
}

impl Monitor {
    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        if request.method() != hyper::Method::GET {
            return error(StatusCode::METHOD_NOT_ALLOWED, "only GET is served");
        }
        if let Some(auth) = &self.auth {
            let header = request
                .headers()
                .get(hyper::header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok());
            if let Err((status, message)) = auth.check(header).await {
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::UNAUTHORIZED);
                return error(status, &message);
            }
        }
        let query = parse_query(request.uri().query().unwrap_or(""));
        let path = request.uri().path().trim_end_matches('/');
        let name = match path {
            "/varz" => "/varz",
            "/connz" => "/connz",
            "/subsz" | "/subscriptionsz" => "/subsz",
            "/routez" => "/routez",
            "/jsz" => "/jsz",
            "/healthz" => "/healthz",
            _ => "",
        };
        if !name.is_empty() {
            self.count(name);
        }
        let result = match name {
            "/varz" => Ok(self.varz()),
            "/connz" => self.connz(&query),
            "/subsz" => self.subsz(&query),
            "/routez" => Ok(self.routez()),
            "/jsz" => Ok(self.jsz()),
            "/healthz" => return self.healthz(),
            _ => return error(StatusCode::NOT_FOUND, "not found"),
        };
        match result {
            Ok(value) => respond(StatusCode::OK, &value),
            Err(message) => error(StatusCode::BAD_REQUEST, &message),
        }
    }

    fn count(&self, name: &'static str) {
        let mut requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *requests.entry(name).or_default() += 1;
    }

    fn varz(&self) -> Value {
        let view = &self.view;
        let config = view.config();
        let stats = view.stats();
        let load = |counter: &std::sync::atomic::AtomicU64| {
            counter.load(std::sync::atomic::Ordering::Relaxed)
        };
        let now = SystemTime::now();
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let tls = config.tls.is_some();
        let requests: HashMap<&str, u64> = self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut varz = json!({
            "server_id": view.server_id(),
            "server_name": config.server_name,
            "version": NATS_VERSION,
            "proto": 1,
            "go": env!("BUILT_RUSTC_VERSION"),
            "host": view.host(),
            "port": view.port(),
            "max_connections": config.max_connections,
            "ping_interval": config.ping_interval.as_nanos() as u64,
            "ping_max": config.max_pings_out,
            "http_host": self.http.ip().to_string(),
            "http_port": self.http.port(),
            "http_base_path": "",
            "https_port": 0,
            "auth_timeout": config.auth_timeout.as_secs_f64(),
            "max_control_line": config.max_control_line,
            "max_payload": config.max_payload,
            "max_pending": config.max_pending_bytes,
            "cluster": {},
            "gateway": {},
            "leaf": {},
            "mqtt": {},
            "websocket": {},
            "jetstream": {},
            "tls_timeout": config.auth_timeout.as_secs_f64(),
            "write_deadline": config.write_deadline.as_nanos() as u64,
        });
        // Two literals: one would exceed json!'s macro recursion limit.
        let counters = json!({
            "start": rfc3339(view.started()),
            "now": rfc3339(now),
            "uptime": uptime(since(view.started(), now)),
            "mem": resident_bytes(),
            "cores": cores,
            "gomaxprocs": cores,
            "cpu": self.cpu_percent(now),
            "connections": load(&stats.connections),
            "total_connections": load(&stats.total_connections),
            "routes": 0,
            "remotes": 0,
            "leafnodes": 0,
            "in_msgs": load(&stats.messages_in),
            "out_msgs": load(&stats.messages_out),
            "in_bytes": load(&stats.bytes_in),
            "out_bytes": load(&stats.bytes_out),
            "slow_consumers": load(&stats.slow_consumers),
            "subscriptions": view.subscriptions().len(),
            "http_req_stats": requests,
            "config_load_time": rfc3339(view.started()),
        });
        if let (Value::Object(varz), Value::Object(counters)) = (&mut varz, counters) {
            varz.extend(counters);
        }
        if view.auth_required() {
            varz["auth_required"] = json!(true);
        }
        if tls {
            varz["tls_required"] = json!(true);
            if config.tls_verify {
                varz["tls_verify"] = json!(true);
            }
        }
        varz
    }

    /// Percent of one core used since the previous `/varz` (since start for the first).
    fn cpu_percent(&self, now: SystemTime) -> f64 {
        let Some(cpu) = process_cpu_time() else {
            return 0.0;
        };
        let mut sample = self.cpu_sample.lock().unwrap_or_else(|p| p.into_inner());
        let (last_cpu, last_wall) = *sample;
        *sample = (cpu, now);
        let wall = since(last_wall, now).as_secs_f64();
        if wall <= 0.0 {
            return 0.0;
        }
        let percent = cpu.saturating_sub(last_cpu).as_secs_f64() / wall * 100.0;
        (percent * 10.0).round() / 10.0
    }

    fn connz(&self, query: &HashMap<String, String>) -> Result<Value, String> {
        let now = SystemTime::now();
        let offset = number(query, "offset")?.unwrap_or(0);
        let limit = number(query, "limit")?.unwrap_or(DEFAULT_LIMIT);
        let subs = query.get("subs").map(String::as_str);
        let (subs_list, subs_detail) = match subs {
            None | Some("0" | "false" | "") => (false, false),
            Some("detail") => (false, true),
            Some(_) => (true, false),
        };
        let auth = flag(query, "auth");
        let mut connections = self.view.connections();
        if let Some(cid) = number(query, "cid")? {
            connections.retain(|connection| connection.cid == cid as u64);
        }
        if let Some(state) = query.get("state") {
            match state.as_str() {
                "open" | "any" | "all" => {}
                // Closed connections are not kept.
                "closed" => connections.clear(),
                other => return Err(format!("invalid connection state {other:?}")),
            }
        }
        sort_connections(
            &mut connections,
            query.get("sort").map_or("cid", String::as_str),
            now,
        )?;
        let total = connections.len();
        let page: Vec<Value> = connections
            .iter()
            .skip(offset)
            .take(limit)
            .map(|connection| connection_json(connection, now, subs_list, subs_detail, auth))
            .collect();
        Ok(json!({
            "server_id": self.view.server_id(),
            "now": rfc3339(now),
            "num_connections": page.len(),
            "total": total,
            "offset": offset,
            "limit": limit,
            "connections": page,
        }))
    }

    fn subsz(&self, query: &HashMap<String, String>) -> Result<Value, String> {
        let stats = self.view.index_stats();
        let subscriptions = self.view.subscriptions();
        let mut subsz = json!({
            "num_subscriptions": subscriptions.len(),
            "num_cache": stats.cache_len,
            "num_inserts": stats.inserts,
            "num_removes": stats.removes,
            "num_matches": stats.matches,
            "cache_hit_rate": stats.cache_hit_rate(),
            "max_fanout": stats.max_fanout,
            "avg_fanout": stats.avg_fanout,
        });
        if flag(query, "subs") {
            let offset = number(query, "offset")?.unwrap_or(0);
            let limit = number(query, "limit")?.unwrap_or(DEFAULT_LIMIT);
            let mut subscriptions = subscriptions;
            if let Some(test) = query.get("test") {
                subscriptions.retain(|subscription| {
                    crate::bus::subjects::subject_matches(&subscription.subject, test)
                });
            }
            crate::sort::sort_by(&mut subscriptions, |a, b| {
                (a.cid, &a.sid).cmp(&(b.cid, &b.sid))
            });
            let page: Vec<Value> = subscriptions
                .iter()
                .skip(offset)
                .take(limit)
                .map(|subscription| subscription_json(subscription, true))
                .collect();
            subsz["server_id"] = json!(self.view.server_id());
            subsz["now"] = json!(rfc3339(SystemTime::now()));
            subsz["total"] = json!(subscriptions.len());
            subsz["offset"] = json!(offset);
            subsz["limit"] = json!(limit);
            subsz["subscriptions_list"] = json!(page);
        }
        Ok(subsz)
    }

    fn routez(&self) -> Value {
        json!({
            "server_id": self.view.server_id(),
            "now": rfc3339(SystemTime::now()),
            "num_routes": 0,
            "routes": [],
        })
    }

    fn jsz(&self) -> Value {
        json!({
            "server_id": self.view.server_id(),
            "now": rfc3339(SystemTime::now()),
            "disabled": true,
            "config": {"max_memory": 0, "max_storage": 0},
            "memory": 0,
            "storage": 0,
            "reserved_memory": 0,
            "reserved_storage": 0,
            "accounts": 0,
            "ha_assets": 0,
            "api": {"total": 0, "errors": 0},
            "streams": 0,
            "consumers": 0,
            "messages": 0,
            "bytes": 0,
        })
    }

    /// 200 `{"status":"ok"}` while the broker accepts clients; 503 with the reason otherwise
    /// (lame duck, shutdown), as nats-server.
    fn healthz(&self) -> Response<Full<Bytes>> {
        if self.view.is_accepting() {
            return respond(StatusCode::OK, &json!({"status": "ok"}));
        }
        let reason = if self.view.is_lame_duck() {
            "lame duck mode: not accepting client connections"
        } else {
            "not accepting client connections"
        };
        respond(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "error", "error": reason}),
        )
    }
}

fn connection_json(
    connection: &ConnectionView,
    now: SystemTime,
    subs_list: bool,
    subs_detail: bool,
    auth: bool,
) -> Value {
    let mut value = json!({
        "cid": connection.cid,
        "kind": "Client",
        "type": "nats",
        "ip": connection.ip,
        "port": connection.port,
        "start": rfc3339(connection.start),
        "last_activity": rfc3339(connection.last_activity),
        "rtt": go_duration(connection.rtt),
        "uptime": uptime(since(connection.start, now)),
        "idle": uptime(since(connection.last_activity, now)),
        "pending_bytes": connection.pending_bytes,
        "in_msgs": connection.in_msgs,
        "out_msgs": connection.out_msgs,
        "in_bytes": connection.in_bytes,
        "out_bytes": connection.out_bytes,
        "subscriptions": connection.subscriptions.len(),
    });
    // nats-server omits empty strings and lists.
    for (key, text) in [
        ("name", &connection.name),
        ("lang", &connection.lang),
        ("version", &connection.version),
    ] {
        if !text.is_empty() {
            value[key] = json!(text);
        }
    }
    if auth && !connection.authorized_user.is_empty() {
        value["authorized_user"] = json!(connection.authorized_user);
    }
    if !connection.subscriptions.is_empty() {
        let mut subscriptions: Vec<&SubscriptionView> = connection.subscriptions.iter().collect();
        crate::sort::sort_by(&mut subscriptions, |a, b| a.sid.cmp(&b.sid));
        if subs_list {
            let subjects: Vec<&str> = subscriptions
                .iter()
                .map(|subscription| subscription.subject.as_str())
                .collect();
            value["subscriptions_list"] = json!(subjects);
        }
        if subs_detail {
            let details: Vec<Value> = subscriptions
                .iter()
                .map(|subscription| subscription_json(subscription, false))
                .collect();
            value["subscriptions_list_detail"] = json!(details);
        }
    }
    value
}

/// nats-server's `SubDetail`; `/subsz` adds the account.
fn subscription_json(subscription: &SubscriptionView, with_account: bool) -> Value {
    let mut value = json!({
        "subject": subscription.subject,
        "sid": subscription.sid,
        "msgs": subscription.msgs,
        "cid": subscription.cid,
    });
    if with_account {
        value["account"] = json!(GLOBAL_ACCOUNT);
    }
    if let Some(queue) = &subscription.queue {
        value["qgroup"] = json!(queue);
    }
    value
}

/// nats-server's `sort=` options for open connections: `cid` and `start` ascending, the
/// others descending.
fn sort_connections(
    connections: &mut [ConnectionView],
    sort: &str,
    now: SystemTime,
) -> Result<(), String> {
    // One key function per option, all of one type, so that the sort below is compiled once
    // (each `sort_by_key` closure was its own copy of the key code).
    type Key = fn(&ConnectionView, SystemTime) -> u128;
    let (key, descending): (Key, bool) = match sort {
        "cid" | "" => (|c, _| c.cid.into(), false),
        "start" => (|c, _| since(UNIX_EPOCH, c.start).as_nanos(), false),
        "subs" => (|c, _| c.subscriptions.len() as u128, true),
        "pending" => (|c, _| c.pending_bytes as u128, true),
        "msgs_to" => (|c, _| c.out_msgs.into(), true),
        "msgs_from" => (|c, _| c.in_msgs.into(), true),
        "bytes_to" => (|c, _| c.out_bytes.into(), true),
        "bytes_from" => (|c, _| c.in_bytes.into(), true),
        "last" => (|c, _| since(UNIX_EPOCH, c.last_activity).as_nanos(), true),
        "idle" => (|c, now| since(c.last_activity, now).as_nanos(), true),
        "uptime" => (|c, now| since(c.start, now).as_nanos(), true),
        "rtt" => (|c, _| c.rtt.as_nanos(), true),
        other => {
            return Err(format!(
                "invalid sorting option {other:?} (cid, start, subs, pending, msgs_to, \
                 msgs_from, bytes_to, bytes_from, last, idle, uptime, rtt)"
            ))
        }
    };
    crate::sort::sort_by(connections, |a, b| {
        let (a_key, b_key) = (key(a, now), key(b, now));
        let order = if descending {
            b_key.cmp(&a_key)
        } else {
            a_key.cmp(&b_key)
        };
        order.then(a.cid.cmp(&b.cid))
    });
    Ok(())
}

fn parse_query(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) => (key.to_string(), value.to_string()),
            None => (pair.to_string(), String::new()),
        })
        .collect()
}

fn number(query: &HashMap<String, String>, key: &str) -> Result<Option<usize>, String> {
    match query.get(key) {
        None => Ok(None),
        Some(text) if text.is_empty() => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|_| format!("{key}: {text:?} is not a number")),
    }
}

fn flag(query: &HashMap<String, String>, key: &str) -> bool {
    query
        .get(key)
        .is_some_and(|value| !matches!(value.as_str(), "0" | "false"))
}

fn respond(status: StatusCode, value: &Value) -> Response<Full<Bytes>> {
    let mut body = serde_json::to_vec_pretty(value).unwrap_or_default();
    body.push(b'\n');
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts")
}

fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    respond(status, &json!({"error": message}))
}

fn since(earlier: SystemTime, now: SystemTime) -> Duration {
    now.duration_since(earlier).unwrap_or_default()
}

/// RFC 3339 in UTC with nanoseconds, as Go's `time.RFC3339Nano` (trailing zeros trimmed).
fn rfc3339(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = crate::clock::format_rfc3339(since_epoch.as_secs() as i64 * 1000);
    let whole = seconds.trim_end_matches(".000Z");
    let nanos = since_epoch.subsec_nanos();
    if nanos == 0 {
        return format!("{whole}Z");
    }
    let fraction = format!("{nanos:09}");
    format!("{whole}.{}Z", fraction.trim_end_matches('0'))
}

/// nats-server's uptime format: `45s`, `3m2s`, `1h0m5s`, `2d3h0m0s`, `1y2d0h0m0s`.
fn uptime(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let (minutes, hours, days) = (seconds / 60, seconds / 3600, seconds / 86_400);
    let years = days / 365;
    let (s, m, h) = (seconds % 60, minutes % 60, hours % 24);
    if years > 0 {
        format!("{years}y{}d{h}h{m}m{s}s", days % 365)
    } else if days > 0 {
        format!("{days}d{h}h{m}m{s}s")
    } else if hours > 0 {
        format!("{hours}h{m}m{s}s")
    } else if minutes > 0 {
        format!("{minutes}m{s}s")
    } else {
        format!("{seconds}s")
    }
}

/// Go's `time.Duration.String()`: `0s`, `812ns`, `438µs`, `5.999866ms`, `1.5s`, `2m3.5s`.
fn go_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    let fraction = |value: u128, unit: u128, suffix: &str| {
        let whole = value / unit;
        let rest = value % unit;
        if rest == 0 {
            return format!("{whole}{suffix}");
        }
        let digits = unit.to_string().len() - 1;
        let text = format!("{rest:0digits$}");
        format!("{whole}.{}{suffix}", text.trim_end_matches('0'))
    };
    if nanos == 0 {
        "0s".into()
    } else if nanos < 1_000 {
        format!("{nanos}ns")
    } else if nanos < 1_000_000 {
        fraction(nanos, 1_000, "µs")
    } else if nanos < 1_000_000_000 {
        fraction(nanos, 1_000_000, "ms")
    } else {
        let total_seconds = nanos / 1_000_000_000;
        let (hours, minutes) = (total_seconds / 3600, total_seconds / 60 % 60);
        let seconds = fraction(nanos % 60_000_000_000, 1_000_000_000, "s");
        match (hours, minutes) {
            (0, 0) => seconds,
            (0, _) => format!("{minutes}m{seconds}"),
            _ => format!("{hours}h{minutes}m{seconds}"),
        }
    }
}

/// Resident set size from /proc/self/statm (0 where there is no procfs).
fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|text| text.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page_size.max(0) as u64
}

/// User plus system CPU time of this process, from /proc/self/stat.
fn process_cpu_time() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let after_name = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_format_as_nats_server_does() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(812), "812ns"),
            (Duration::from_nanos(438_000), "438µs"),
            (Duration::from_nanos(5_999_866), "5.999866ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(123_500), "2m3.5s"),
            (Duration::from_secs(3605), "1h0m5s"),
        ];
        for (duration, expected) in cases {
            assert_eq!(go_duration(duration), expected);
        }
        assert_eq!(uptime(Duration::from_secs(45)), "45s");
        assert_eq!(uptime(Duration::from_secs(182)), "3m2s");
        assert_eq!(uptime(Duration::from_secs(3605)), "1h0m5s");
        assert_eq!(
            uptime(Duration::from_secs(2 * 86_400 + 3 * 3600)),
            "2d3h0m0s"
        );
        assert_eq!(uptime(Duration::from_secs(367 * 86_400)), "1y2d0h0m0s");
    }

    #[test]
    fn times_are_rfc3339_with_nanoseconds() {
        let time = UNIX_EPOCH + Duration::new(1_700_000_000, 646_642_300);
        assert_eq!(rfc3339(time), "2023-11-14T22:13:20.6466423Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            "2023-11-14T22:13:20Z"
        );
    }
}
