//! /ui/: the web console, three static files compiled into the binary (no Node toolchain,
//! nothing fetched at run time, so it works air-gapped). The page is a client of the REST
//! API: it holds the API key in sessionStorage, sends it as the bearer token, and every call
//! is authorized by the server like any other; what it hides by role is only a convenience.
//!
//! Every response here carries a strict Content-Security-Policy (scripts and styles from
//! these files only: no inline script or style, no `eval`, no framing), `nosniff` and
//! `Referrer-Policy: no-referrer`; nothing here sets a cookie, so there is no CSRF surface.

use http::{header, Response, StatusCode};

use super::{full, Body};
use crate::{Error, Result};

const INDEX_HTML: &str = include_str!("ui/index.html");
const CONSOLE_JS: &str = include_str!("ui/console.js");
const CONSOLE_CSS: &str = include_str!("ui/console.css");

/// The policy of every /ui/ response. `connect-src 'self'` covers the fetch() calls (the
/// event tail included); images only from here (the chart is inline SVG made through the DOM).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The file at /ui/`name` ("" is the page itself).
pub fn asset(name: &str) -> Result<Response<Body>> {
    let (content_type, body) = match name {
        "" | "index.html" => ("text/html; charset=utf-8", INDEX_HTML),
        "console.js" => ("text/javascript; charset=utf-8", CONSOLE_JS),
        "console.css" => ("text/css; charset=utf-8", CONSOLE_CSS),
        other => return Err(Error::NotFound(format!("no console file '{other}'"))),
    };
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY)
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(header::REFERRER_POLICY, "no-referrer")
        .header(header::X_FRAME_OPTIONS, "DENY")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(full(body))
        .expect("static response parts are valid"))
}
