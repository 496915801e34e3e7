//! Where a webhook may be sent: URL parsing and the SSRF deny-list.
//!
//! Refused always: link-local (169.254/16, fe80::/10, where cloud metadata services live),
//! known metadata addresses and names, unspecified, multicast and broadcast addresses.
//! Refused unless `webhooks.allow_private`: loopback, private (10/8, 172.16/12, 192.168/16,
//! fc00::/7), shared (100.64/10) and `localhost`. The URL's host is checked when a
//! subscription is saved (literal addresses and names) and every resolved address again at
//! each attempt, which then connects to the address it checked (no second lookup to rebind).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::{Error, Result};

/// A parsed webhook URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub is_https: bool,
    /// Without brackets for IPv6.
    pub host: String,
    pub port: u16,
    /// Path and query, at least `/`.
    pub path: String,
}

impl Target {
    /// `scheme://host:port`, what readonly callers and audit rows see of a URL (its path
    /// may hold a token, as chat-service webhook URLs do).
    pub fn origin(&self) -> String {
        let scheme = if self.is_https { "https" } else { "http" };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("{scheme}://{host}:{}", self.port)
    }

    /// The Host header value.
    pub fn host_header(&self) -> String {
        let default = if self.is_https { 443 } else { 80 };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

/// Parses `http://` and `https://` URLs; no user information, no fragment.
pub fn parse(url: &str) -> Result<Target> {
    let invalid = |why: &str| Error::Invalid(format!("webhook URL '{url}': {why}"));
    let (is_https, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(invalid("must start with https:// or http://"));
    };
    if url.len() > 2048 || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid("too long or has spaces"));
    }
    if rest.contains('#') {
        return Err(invalid("a fragment is never sent; leave it out"));
    }
    let (authority, path) = match rest.find(['/', '?']) {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    if authority.contains('@') {
        return Err(invalid("credentials in the URL are not supported"));
    }
    let default_port = if is_https { 443 } else { 80 };
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| invalid("unclosed '['"))?;
        let port = match after.strip_prefix(':') {
            Some(port) => port.parse().map_err(|_| invalid("bad port"))?,
            None if after.is_empty() => default_port,
            None => return Err(invalid("bad host")),
        };
        (host.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (
                host.to_string(),
                port.parse().map_err(|_| invalid("bad port"))?,
            ),
            None => (authority.to_string(), default_port),
        }
    };
    if host.is_empty() || port == 0 {
        return Err(invalid("no host or port"));
    }
    Ok(Target {
        is_https,
        host: host.to_ascii_lowercase(),
        port,
        path,
    })
}

/// Names that are metadata services whatever they resolve to.
const METADATA_NAMES: &[&str] = &["metadata.google.internal", "metadata.goog", "metadata"];

/// Checks what can be checked without resolving: literal addresses and known names.
pub fn check_host(target: &Target, allow_private: bool) -> Result<()> {
    let host = target.host.trim_end_matches('.');
    if METADATA_NAMES.contains(&host) {
        return Err(denied(target, "a cloud metadata service"));
    }
    if (host == "localhost" || host.ends_with(".localhost")) && !allow_private {
        return Err(denied(
            target,
            "loopback (set webhooks.allow_private to allow)",
        ));
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        check_ip(ip, allow_private).map_err(|why| denied(target, why))?;
    }
    Ok(())
}

/// A refusal by rule (audited `denied`), answered as invalid input is.
fn denied(target: &Target, why: &str) -> Error {
    Error::Refused(format!(
        "webhook URL host '{}' is refused: {why}",
        target.host
    ))
}

/// Resolves the host and checks every address; returns them in resolver order.
pub async fn resolve(target: &Target, allow_private: bool) -> Result<Vec<SocketAddr>> {
    check_host(target, allow_private)?;
    let host = if target.host == "localhost" || target.host.ends_with(".localhost") {
        "localhost"
    } else {
        target.host.as_str()
    };
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, target.port))
        .await
        .map_err(|e| Error::Unavailable(format!("cannot resolve '{}': {e}", target.host)))?
        .collect();
    if addresses.is_empty() {
        return Err(Error::Unavailable(format!(
            "'{}' has no address",
            target.host
        )));
    }
    for address in &addresses {
        check_ip(address.ip(), allow_private)
            .map_err(|why| denied(target, &format!("it resolves to {} ({why})", address.ip())))?;
    }
    Ok(addresses)
}

/// Why an address is refused, if it is.
pub fn check_ip(ip: IpAddr, allow_private: bool) -> std::result::Result<(), &'static str> {
    let ip = match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => check_v4(v4, allow_private),
        IpAddr::V6(v6) => check_v6(v6, allow_private),
    }
}

fn check_v4(ip: Ipv4Addr, allow_private: bool) -> std::result::Result<(), &'static str> {
    let octets = ip.octets();
    if ip.is_link_local() {
        return Err("link-local (cloud metadata lives here)");
    }
    // Alibaba Cloud's metadata service.
    if ip == Ipv4Addr::new(100, 100, 100, 200) {
        return Err("a cloud metadata service");
    }
    if ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() || octets[0] == 0 {
        return Err("not a unicast address");
    }
    let is_private =
        ip.is_loopback() || ip.is_private() || (octets[0] == 100 && (octets[1] & 0xc0) == 64);
    if is_private && !allow_private {
        return Err("loopback or private (set webhooks.allow_private to allow)");
    }
    Ok(())
}

fn check_v6(ip: Ipv6Addr, allow_private: bool) -> std::result::Result<(), &'static str> {
    let first = ip.segments()[0];
    if (first & 0xffc0) == 0xfe80 {
        return Err("link-local (cloud metadata lives here)");
    }
    // AWS's IPv6 metadata service.
    if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        return Err("a cloud metadata service");
    }
    if ip.is_unspecified() || ip.is_multicast() {
        return Err("not a unicast address");
    }
    let is_private = ip.is_loopback() || (first & 0xfe00) == 0xfc00;
    if is_private && !allow_private {
        return Err("loopback or private (set webhooks.allow_private to allow)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing() {
        let cases = [
            (
                "https://example.com/hook?a=1",
                Some((true, "example.com", 443, "/hook?a=1")),
            ),
            ("http://10.0.0.1:8080", Some((false, "10.0.0.1", 8080, "/"))),
            ("http://[::1]:9/x", Some((false, "::1", 9, "/x"))),
            (
                "https://Example.COM?x",
                Some((true, "example.com", 443, "/?x")),
            ),
            ("ftp://example.com/", None),
            ("https://user:pw@example.com/", None),
            ("https://example.com/#frag", None),
            ("https://:443/", None),
            ("https://example.com:0/", None),
        ];
        for (url, expected) in cases {
            let parsed = parse(url).ok();
            let got = parsed
                .as_ref()
                .map(|t| (t.is_https, t.host.as_str(), t.port, t.path.as_str()));
            assert_eq!(got, expected, "{url}");
        }
    }

    #[test]
    fn deny_list() {
        let cases = [
            ("169.254.169.254", true, false),
            ("fe80::1", true, false),
            ("fd00:ec2::254", true, false),
            ("100.100.100.200", true, false),
            ("0.0.0.0", true, false),
            ("224.0.0.1", true, false),
            ("::ffff:169.254.169.254", true, false),
            ("127.0.0.1", false, false),
            ("127.0.0.1", true, true),
            ("10.1.2.3", false, false),
            ("192.168.1.1", true, true),
            ("::1", false, false),
            ("fd12::1", true, true),
            ("100.64.0.1", false, false),
            ("93.184.216.34", false, true),
            ("2606:2800:220:1::", false, true),
        ];
        for (ip, allow_private, allowed) in cases {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(
                check_ip(ip, allow_private).is_ok(),
                allowed,
                "{ip} allow_private={allow_private}"
            );
        }
        let metadata = parse("http://metadata.google.internal/").unwrap();
        assert!(check_host(&metadata, true).is_err());
        let local = parse("http://localhost:8080/").unwrap();
        assert!(check_host(&local, false).is_err());
        assert!(check_host(&local, true).is_ok());
    }
}
