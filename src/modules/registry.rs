//! The module registry (`svc-registry serve`): an HTTP/1.1 server over a directory, and the
//! client `svc-module` uses to list, download and publish.
//!
//! Storage is `DIR/NAME/VERSION/module.zip` (+ `module.zip.sig` when published signed).
//! Versions are immutable: a version directory is created once (create_dir is the lock), so
//! re-publishing is 409 even under concurrent publishes, and a listing's SHA-256 is that of
//! bytes that never change. Publishing needs a bearer token: one of the lines of the
//! `--token-file` (compared by SHA-256 in constant time), or, with `--svc-url`, an svc API
//! key whose `GET /api/v1/whoami` role is operator or admin. Reads are open: modules are
//! verified by hash and signature, not by who served them.
//!
//! With a certificate and key the registry serves HTTPS only. Clients ([`Transport`]) verify
//! an `https://` registry's certificate against a CA file or the system's store, and send
//! plain `http://` only to this machine (loopback) unless told otherwise: a publish token or
//! API key would otherwise cross the network in clear, and a module's bytes could be swapped
//! for a version that no lock pins yet.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{sha256_hex, Module, MAX_TOTAL_BYTES};
use crate::version;
use crate::{Error, Result};

pub const SIGNATURE_HEADER: &str = "x-module-signature";
const TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VersionInfo {
    pub version: String,
    pub sha256: String,
    pub size: u64,
    pub signed: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModuleInfo {
    pub name: String,
    /// Oldest first.
    pub versions: Vec<VersionInfo>,
}

/// How a client reaches a registry (or `serve` its `--svc-url`): the roots an `https://`
/// certificate must chain to, and whether plain `http://` may leave this machine.
#[derive(Clone)]
pub struct Transport {
    tls: Arc<rustls::ClientConfig>,
    /// The flag that gives the CA file, named when a certificate does not verify.
    ca_hint: &'static str,
    /// The flag that allows plain HTTP to another host, named when it is refused.
    allow_hint: &'static str,
    allow_plain_http: bool,
}

impl Transport {
    /// Trusts the PEM bundle `ca_file`, else the system's CA store; only a bad `ca_file` is an
    /// error. The hints are the flags (or variables) errors tell the user to pass.
    pub fn new(
        ca_file: Option<&Path>,
        allow_plain_http: bool,
        (ca_hint, allow_hint): (&'static str, &'static str),
    ) -> Result<Transport> {
        let tls = crate::tls::client_config(ca_file, crate::tls::ALPN_REST)
            .map_err(|e| Error::Invalid(format!("{ca_hint}: {e}")))?;
        Ok(Transport {
            tls: Arc::new(tls),
            ca_hint,
            allow_hint,
            allow_plain_http,
        })
    }

    /// Refuses a URL that is neither `https://` nor `http://`, and plain `http://` to another
    /// machine unless allowed.
    pub fn check(&self, url: &str) -> Result<()> {
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(Error::Invalid(format!(
                "{url}: a registry URL is https://HOST[:PORT] (or http:// on this machine)"
            )));
        }
        match crate::tls::plaintext_remote_host(url) {
            Some(host) if !self.allow_plain_http => Err(Error::Invalid(format!(
                "refusing plain http:// to {host}: tokens and modules would cross the network \
                 unencrypted and unauthenticated; use https:// (svc-registry serve --tls-cert \
                 --tls-key), or pass {} to accept that",
                self.allow_hint
            ))),
            _ => Ok(()),
        }
    }
}

/// Who may publish.
#[derive(Clone, Default)]
pub struct Auth {
    /// SHA-256 of each accepted registry token.
    pub token_hashes: Vec<[u8; 32]>,
    /// An svc server's REST URL whose operator and admin keys may publish, and how to reach it.
    pub svc: Option<(String, Transport)>,
}

impl Auth {
    pub fn load(token_file: Option<&Path>, svc: Option<(String, Transport)>) -> Result<Auth> {
        let mut token_hashes = Vec::new();
        if let Some(path) = token_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::NotFound(format!("cannot read {}: {e}", path.display())))?;
            for line in text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
            {
                token_hashes.push(Sha256::digest(line.as_bytes()).into());
            }
        }
        Ok(Auth { token_hashes, svc })
    }

    async fn check(&self, bearer: Option<&str>) -> Result<()> {
        let token = bearer.ok_or_else(|| {
            Error::Unauthenticated("publishing needs Authorization: Bearer TOKEN".into())
        })?;
        // Compared without an early exit, so the time taken says nothing about the token.
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if self.token_hashes.iter().any(|h| {
            h.iter()
                .zip(hash.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
        }) {
            return Ok(());
        }
        if let Some((url, transport)) = &self.svc {
            let (status, body) = http(
                transport,
                Method::GET,
                &format!("{}/api/v1/whoami", url.trim_end_matches('/')),
                Some(token),
                &[],
                Bytes::new(),
            )
            .await
            .map_err(|e| Error::Unavailable(format!("cannot check the key with {url}: {e}")))?;
            if status == StatusCode::OK {
                let who: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                return match who["role"].as_str() {
                    Some("operator" | "admin") => Ok(()),
                    role => Err(Error::Forbidden(format!(
                        "publishing needs an operator or admin key (this key's role: {})",
                        role.unwrap_or("unknown")
                    ))),
                };
            }
        }
        Err(Error::Unauthenticated(
            "unknown registry token or API key".into(),
        ))
    }
}

/// The registry's directory.
pub struct Registry {
    pub dir: PathBuf,
    pub auth: Auth,
}

fn version_dir(dir: &Path, name: &str, version: &str) -> Result<PathBuf> {
    // Names and versions come from URLs: only what a manifest may hold reaches the disk.
    super::check_name("module name", name)?;
    version::Version::parse(version).map_err(Error::Invalid)?;
    Ok(dir.join(name).join(version))
}

impl Registry {
    pub fn module(&self, name: &str) -> Result<ModuleInfo> {
        super::check_name("module name", name)?;
        let mut versions = Vec::new();
        let entries = std::fs::read_dir(self.dir.join(name))
            .map_err(|_| Error::NotFound(format!("no module {name}")))?;
        for entry in entries.flatten() {
            let version = entry.file_name().to_string_lossy().to_string();
            let zip = entry.path().join("module.zip");
            if version::Version::parse(&version).is_err() {
                continue;
            }
            let Ok(bytes) = std::fs::read(&zip) else {
                continue;
            };
            versions.push(VersionInfo {
                sha256: sha256_hex(&bytes),
                size: bytes.len() as u64,
                signed: entry.path().join("module.zip.sig").exists(),
                version,
            });
        }
        crate::sort::sort_by(&mut versions, |a, b| {
            version::compare(&a.version, &b.version)
        });
        if versions.is_empty() {
            return Err(Error::NotFound(format!("no module {name}")));
        }
        Ok(ModuleInfo {
            name: name.to_string(),
            versions,
        })
    }

    pub fn list(&self) -> Result<Vec<ModuleInfo>> {
        let mut out = Vec::new();
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .map_err(|e| Error::Internal(format!("{}: {e}", self.dir.display())))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        for name in names {
            if let Ok(info) = self.module(&name) {
                out.push(info);
            }
        }
        Ok(out)
    }

    pub fn file(&self, name: &str, version: &str, file: &str) -> Result<Vec<u8>> {
        let path = version_dir(&self.dir, name, version)?.join(file);
        std::fs::read(&path).map_err(|_| Error::NotFound(format!("no {file} for {name} {version}")))
    }

    /// Stores a new version; an existing one is a conflict, whatever its bytes.
    pub fn publish(&self, zip: &[u8], signature: Option<&str>) -> Result<VersionInfo> {
        let module = Module::from_zip(zip)?;
        if let Some(sig) = signature {
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, sig.trim())
                .ok()
                .filter(|s| s.len() == 64)
                .ok_or_else(|| Error::Invalid("the signature is not 64 bytes of base64".into()))?;
        }
        let (name, version) = (&module.manifest.name, &module.manifest.version);
        let dir = version_dir(&self.dir, name, version)?;
        std::fs::create_dir_all(dir.parent().expect("has a parent")).map_err(Error::internal)?;
        // Write beside, then rename into place: a reader never sees a half-written version.
        let staging = self.dir.join(format!(
            ".staging-{name}-{version}-{:016x}",
            rand::random::<u64>()
        ));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir(&staging).map_err(Error::internal)?;
        std::fs::write(staging.join("module.zip"), zip).map_err(Error::internal)?;
        if let Some(sig) = signature {
            std::fs::write(staging.join("module.zip.sig"), format!("{}\n", sig.trim()))
                .map_err(Error::internal)?;
        }
        // rename onto an existing non-empty directory fails: that is the immutability check.
        if dir.exists() || std::fs::rename(&staging, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(Error::Conflict(format!(
                "{name} {version} is already published; versions are immutable, publish a new version"
            )));
        }
        Ok(VersionInfo {
            version: version.clone(),
            sha256: sha256_hex(zip),
            size: zip.len() as u64,
            signed: signature.is_some(),
        })
    }
}

type Body = Full<Bytes>;

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec_pretty(value).unwrap_or_default(),
        )))
        .expect("valid response")
}

fn error_response(error: &Error) -> Response<Body> {
    // The status and body svc-server's REST answers with (`error.rs`), so one client reads both.
    let status =
        StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Error::Internal(cause) = error {
        tracing::error!(%cause, "registry request failed");
    }
    json(status, &error.body())
}

/// The OpenAPI document of the routes below.
pub fn openapi() -> serde_json::Value {
    let version_info = serde_json::json!({"type": "object", "required": ["version", "sha256", "size", "signed"],
        "properties": {"version": {"type": "string"}, "sha256": {"type": "string"}, "size": {"type": "integer"}, "signed": {"type": "boolean"}}});
    let module_info = serde_json::json!({"type": "object", "required": ["name", "versions"],
        "properties": {"name": {"type": "string"}, "versions": {"type": "array", "items": {"$ref": "#/components/schemas/VersionInfo"}}}});
    let name = serde_json::json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}});
    let version = serde_json::json!({"name": "version", "in": "path", "required": true, "schema": {"type": "string"}});
    serde_json::json!({
        "openapi": "3.0.3",
        "info": {"title": "svc module registry", "version": env!("CARGO_PKG_VERSION")},
        "paths": {
            "/v1/modules": {
                "get": {"summary": "Every module with its versions and their SHA-256", "responses": {"200": {"description": "modules",
                    "content": {"application/json": {"schema": {"type": "object", "properties": {"modules": {"type": "array", "items": {"$ref": "#/components/schemas/ModuleInfo"}}}}}}}}},
                "post": {"summary": "Publish a module ZIP (name and version from its module.yaml); versions are immutable",
                    "security": [{"bearer": []}],
                    "parameters": [{"name": "X-Module-Signature", "in": "header", "required": false, "schema": {"type": "string"}, "description": "detached ed25519 signature, base64"}],
                    "requestBody": {"required": true, "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}}},
                    "responses": {"201": {"description": "published", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/VersionInfo"}}}},
                        "401": {"description": "no or unknown token"}, "403": {"description": "role may not publish"},
                        "409": {"description": "this version exists"}, "422": {"description": "not a valid module"}}}
            },
            "/v1/modules/{name}": {"get": {"summary": "A module's versions", "parameters": [name],
                "responses": {"200": {"description": "versions", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ModuleInfo"}}}}, "404": {"description": "no such module"}}}},
            "/v1/modules/{name}/{version}/module.zip": {"get": {"summary": "Download a version's ZIP", "parameters": [name, version],
                "responses": {"200": {"description": "the ZIP", "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}}}, "404": {"description": "no such version"}}}},
            "/v1/modules/{name}/{version}/module.zip.sig": {"get": {"summary": "Download a version's detached signature (base64)", "parameters": [name, version],
                "responses": {"200": {"description": "the signature", "content": {"text/plain": {"schema": {"type": "string"}}}}, "404": {"description": "unsigned or no such version"}}}},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3"}}}}
        },
        "components": {
            "schemas": {"VersionInfo": version_info, "ModuleInfo": module_info},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        }
    })
}

async fn handle(registry: Arc<Registry>, request: Request<Incoming>) -> Response<Body> {
    match route(&registry, request).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    }
}

fn bytes(content_type: &str, data: Vec<u8>) -> Response<Body> {
    Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(data)))
        .expect("valid response")
}

fn only(method: &Method, allowed: &[Method]) -> Result<()> {
    if allowed.contains(method) {
        return Ok(());
    }
    let allow = allowed
        .iter()
        .map(Method::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    Err(Error::MethodNotAllowed {
        message: format!("use {allow}"),
        allow,
    })
}

async fn route(registry: &Registry, request: Request<Incoming>) -> Result<Response<Body>> {
    let path = request.uri().path().to_string();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = request.method().clone();
    match parts.as_slice() {
        ["healthz"] => Ok(json(StatusCode::OK, &serde_json::json!({"status": "ok"}))),
        ["openapi.json"] => Ok(json(StatusCode::OK, &openapi())),
        ["v1", "modules"] if method == Method::POST => {
            let bearer = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_string);
            registry.auth.check(bearer.as_deref()).await?;
            let signature = request
                .headers()
                .get(SIGNATURE_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = Limited::new(request.into_body(), MAX_TOTAL_BYTES + 1024 * 1024)
                .collect()
                .await
                .map_err(|_| Error::TooLarge("the ZIP is too large (or the upload broke)".into()))?
                .to_bytes();
            let info = registry.publish(&body, signature.as_deref())?;
            tracing::info!(sha256 = %info.sha256, version = %info.version, "published");
            Ok(json(
                StatusCode::CREATED,
                &serde_json::to_value(&info).map_err(Error::internal)?,
            ))
        }
        ["v1", "modules"] => {
            only(&method, &[Method::GET, Method::POST])?;
            Ok(json(
                StatusCode::OK,
                &serde_json::json!({"modules": registry.list()?}),
            ))
        }
        ["v1", "modules", name] => {
            only(&method, &[Method::GET])?;
            Ok(json(
                StatusCode::OK,
                &serde_json::to_value(registry.module(name)?).map_err(Error::internal)?,
            ))
        }
        ["v1", "modules", name, version, "module.zip"] => {
            only(&method, &[Method::GET])?;
            Ok(bytes(
                "application/zip",
                registry.file(name, version, "module.zip")?,
            ))
        }
        ["v1", "modules", name, version, "module.zip.sig"] => {
            only(&method, &[Method::GET])?;
            Ok(bytes(
                "text/plain",
                registry.file(name, version, "module.zip.sig")?,
            ))
        }
        _ => Err(Error::NotFound(format!("no route {path}"))),
    }
}

/// Serves until the process ends, over TLS with `tls` (HTTPS only). Prints `listening on
/// URL` once bound (tests wait for it).
pub async fn serve(
    listen: SocketAddr,
    registry: Registry,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<()> {
    std::fs::create_dir_all(&registry.dir)
        .map_err(|e| Error::Internal(format!("{}: {e}", registry.dir.display())))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Error::Unavailable(format!("cannot listen on {listen}: {e}")))?;
    let local = listener.local_addr().map_err(Error::internal)?;
    println!(
        "svc-registry: listening on {}://{local} (modules in {})",
        if tls.is_some() { "https" } else { "http" },
        registry.dir.display()
    );
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let registry = Arc::new(registry);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = registry.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Some(acceptor) = acceptor else {
                return serve_connection(registry, stream).await;
            };
            // Bounded like the header read below: a client that never finishes its handshake
            // holds this task and socket only so long.
            match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => serve_connection(registry, stream).await,
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

async fn serve_connection<S>(registry: Arc<Registry>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        let registry = registry.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(registry, request).await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    if let Err(e) = connection.await {
        tracing::debug!(error = %e, "registry connection ended with an error");
    }
}

/// One request, over TLS for `https://`: (status, body). Refused before any connection when
/// `transport` does not allow the URL.
async fn http(
    transport: &Transport,
    method: Method,
    url: &str,
    bearer: Option<&str>,
    headers: &[(&str, String)],
    body: Bytes,
) -> Result<(StatusCode, Bytes)> {
    transport.check(url)?;
    let mut builder = Request::builder().method(method).uri(url);
    if let Some(token) = bearer {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    for (name, value) in headers {
        builder = builder.header(*name, value);
    }
    let request = builder
        .body(Full::new(body))
        .map_err(|e| Error::Invalid(format!("bad URL {url}: {e}")))?;
    let sent = async {
        if url.starts_with("https://") {
            crate::tls::send_http1(request, transport.tls.clone(), transport.ca_hint).await
        } else {
            let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
            Ok(client.request(request).await?)
        }
    };
    let unavailable = |e: String| Error::Unavailable(format!("cannot reach {url}: {e}"));
    let response = tokio::time::timeout(TIMEOUT, sent)
        .await
        .map_err(|_| unavailable(format!("no answer within {TIMEOUT:?}")))?
        .map_err(|e| unavailable(error_chain(e.as_ref())))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| unavailable(format!("connection lost: {e}")))?
        .to_bytes();
    Ok((status, body))
}

/// Every message in an error's chain (hyper hides the TLS error behind "client error").
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        let next = error.to_string();
        if !text.contains(&next) {
            text = format!("{text}: {next}");
        }
        cause = error.source();
    }
    text
}

/// The client side: a registry at `url`.
#[derive(Clone)]
pub struct RegistryClient {
    pub url: String,
    transport: Transport,
}

fn answer_error(status: StatusCode, body: &[u8]) -> Error {
    let value: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let message = value["error"]["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("registry answered {status}"));
    match status {
        StatusCode::NOT_FOUND => Error::NotFound(message),
        StatusCode::CONFLICT => Error::Conflict(message),
        StatusCode::UNAUTHORIZED => Error::Unauthenticated(message),
        StatusCode::FORBIDDEN => Error::Forbidden(message),
        _ => Error::Invalid(message),
    }
}

impl RegistryClient {
    pub fn new(url: &str, transport: &Transport) -> RegistryClient {
        RegistryClient {
            url: url.trim_end_matches('/').to_string(),
            transport: transport.clone(),
        }
    }

    async fn get(&self, path: &str) -> Result<Bytes> {
        let (status, body) = http(
            &self.transport,
            Method::GET,
            &format!("{}{path}", self.url),
            None,
            &[],
            Bytes::new(),
        )
        .await?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(answer_error(status, &body))
        }
    }

    pub async fn module(&self, name: &str) -> Result<ModuleInfo> {
        let body = self.get(&format!("/v1/modules/{name}")).await?;
        serde_json::from_slice(&body).map_err(|e| Error::Invalid(format!("registry listing: {e}")))
    }

    pub async fn list(&self) -> Result<Vec<ModuleInfo>> {
        #[derive(Deserialize)]
        struct Listing {
            modules: Vec<ModuleInfo>,
        }
        let body = self.get("/v1/modules").await?;
        let listing: Listing = serde_json::from_slice(&body)
            .map_err(|e| Error::Invalid(format!("registry listing: {e}")))?;
        Ok(listing.modules)
    }

    /// The ZIP of NAME VERSION, checked against `sha256`; and its signature if it has one.
    pub async fn download(
        &self,
        name: &str,
        version: &str,
        sha256: &str,
    ) -> Result<(Vec<u8>, Option<String>)> {
        let zip = self
            .get(&format!("/v1/modules/{name}/{version}/module.zip"))
            .await?
            .to_vec();
        let got = sha256_hex(&zip);
        if got != sha256 {
            return Err(Error::Invalid(format!(
                "{name} {version} from {}: SHA-256 {got} is not the expected {sha256}",
                self.url
            )));
        }
        let signature = match self
            .get(&format!("/v1/modules/{name}/{version}/module.zip.sig"))
            .await
        {
            Ok(sig) => Some(String::from_utf8_lossy(&sig).trim().to_string()),
            Err(Error::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        Ok((zip, signature))
    }

    pub async fn publish(
        &self,
        zip: Vec<u8>,
        signature: Option<&str>,
        token: &str,
    ) -> Result<VersionInfo> {
        let mut headers = vec![("content-type", "application/zip".to_string())];
        if let Some(sig) = signature {
            headers.push((SIGNATURE_HEADER, sig.trim().to_string()));
        }
        let (status, body) = http(
            &self.transport,
            Method::POST,
            &format!("{}/v1/modules", self.url),
            Some(token),
            &headers,
            Bytes::from(zip),
        )
        .await?;
        if !status.is_success() {
            return Err(answer_error(status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| Error::Invalid(format!("registry answer: {e}")))
    }
}

/// Versions of `name` in a listing, by version.
pub fn by_version(info: &ModuleInfo) -> BTreeMap<version::Version, VersionInfo> {
    info.versions
        .iter()
        .filter_map(|v| {
            version::Version::parse(&v.version)
                .ok()
                .map(|p| (p, v.clone()))
        })
        .collect()
}
