//! Host facts: what an agent reports about the machine it runs on (OS, architecture, kernel,
//! names, addresses, CPUs, memory, init system, virtualization).
//!
//! Owns the fact names ([`NAMES`]), their collection on this host ([`collect`]), the parsers
//! of the files read for them, and the shape a set of facts reported by someone else must
//! have ([`check`]). A leaf: nothing here uses the rest of the crate, so the agent (which
//! reports them), the server (registry, selectors, views) and the module sandbox
//! (`facts()`) share one definition.
//!
//! Cheap on purpose: a few small files and three system calls (uname, gethostname,
//! getifaddrs); no subprocess and no DNS lookup, so the agent can collect them again every
//! minute and a broken resolver never holds it up. Best effort: a fact that cannot be read
//! is empty (or 0), never an error, and nothing read here can panic. Every name is always
//! present, so the set has one shape on every host.
//!
//! The files are read as the unprivileged agent daemon sees them under its systemd unit
//! (`ProcSubset=pid` hides /proc/meminfo and /proc/cpuinfo, `ProtectProc=invisible` hides
//! pid 1): each has a fallback that needs no such file (sysinfo(2), the CPUID bit,
//! /run/systemd/container).

use std::collections::BTreeMap;
use std::io::{BufRead, Read};
use std::net::IpAddr;
use std::path::Path;

/// A set of facts: a flat JSON object whose values are strings, numbers or lists of strings.
/// Ordered, so its JSON text is the same for the same facts (the agent compares sets, the
/// server compares their text).
pub type Facts = BTreeMap<String, serde_json::Value>;

/// The facts every agent reports, in the order people read them.
pub const NAMES: &[&str] = &[
    "os",
    "os_family",
    "os_release",
    "arch",
    "kernel",
    "hostname",
    "fqdn",
    "ip_addresses",
    "cpus",
    "memory_mb",
    "init",
    "virtual",
];

/// Whether `name` is one of [`NAMES`].
pub fn is_fact_name(name: &str) -> bool {
    NAMES.contains(&name)
}

/// At most this many addresses are reported: a host with thousands (a router, a load
/// balancer with many VIPs) must not make every heartbeat carrying facts, and the server's
/// copy, that large.
const MAX_ADDRESSES: usize = 64;

/// Largest facts a server accepts from an agent, as JSON text. What this collector reports
/// is well under 2 KiB; the limit bounds what a misbehaving agent can make the server keep.
pub const MAX_TEXT_BYTES: usize = 8 * 1024;

/// Files larger than this are not read (an /etc/hosts of many megabytes is not worth it).
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// This host's facts.
pub fn collect() -> Facts {
    let release = read_text("/etc/os-release")
        .or_else(|| read_text("/usr/lib/os-release"))
        .map(|text| parse_os_release(&text))
        .unwrap_or_default();
    let id = release
        .get("ID")
        .map(|id| id.trim().to_ascii_lowercase())
        .filter(|id| !id.is_empty())
        // No os-release (a minimal container): the kernel's OS is all there is to say.
        .unwrap_or_else(|| std::env::consts::OS.to_string());
    let family = os_family(&id, release.get("ID_LIKE").map_or("", String::as_str));
    let (machine, kernel) = uname();
    let arch = if machine.is_empty() {
        std::env::consts::ARCH.to_string()
    } else {
        machine
    };
    let hostname = hostname();
    let hosts = read_text("/etc/hosts").unwrap_or_default();
    let fqdn = fqdn_from_hosts(&hostname, &hosts).unwrap_or_else(|| hostname.clone());
    let memory_mb = read_text("/proc/meminfo")
        .and_then(|text| parse_meminfo_total_kib(&text))
        .map(|kib| kib / 1024)
        .or_else(sysinfo_total_mib)
        .unwrap_or(0);

    let mut facts = Facts::new();
    let mut put = |name: &str, value: serde_json::Value| {
        facts.insert(name.to_string(), value);
    };
    put("os", id.into());
    put("os_family", family.into());
    put(
        "os_release",
        release
            .get("VERSION_ID")
            .cloned()
            .unwrap_or_default()
            .into(),
    );
    put("arch", arch.into());
    put("virtual", virtual_kind(&VirtualHints::read(&kernel)).into());
    put("kernel", kernel.into());
    put("hostname", hostname.into());
    put("fqdn", fqdn.into());
    put("ip_addresses", ip_addresses().into());
    put("cpus", cpus().into());
    put("memory_mb", memory_mb.into());
    put("init", init().into());
    facts
}

/// Checks facts reported by an agent: a flat object with at most [`MAX_TEXT_BYTES`] of JSON,
/// names of lowercase letters, digits and `_`, values that are strings, numbers, booleans
/// or lists of strings and numbers. The agent is not trusted to send what `collect` makes.
pub fn check(facts: &Facts) -> Result<(), String> {
    use serde_json::Value;
    let scalar = |value: &Value| matches!(value, Value::String(_) | Value::Number(_));
    for (name, value) in facts {
        let is_name = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !is_name {
            return Err(format!("invalid fact name {name:?}"));
        }
        let is_flat = match value {
            Value::Array(items) => items.iter().all(scalar),
            Value::Bool(_) => true,
            other => scalar(other),
        };
        if !is_flat {
            return Err(format!(
                "fact '{name}' is not a string, number, boolean or list of them"
            ));
        }
    }
    let size = serde_json::to_vec(facts).map_or(usize::MAX, |text| text.len());
    if size > MAX_TEXT_BYTES {
        return Err(format!(
            "facts are {size} bytes of JSON, more than {MAX_TEXT_BYTES}"
        ));
    }
    Ok(())
}

/// Facts from their JSON text (as stored); empty when the text is empty or not an object.
pub fn from_text(text: &str) -> Facts {
    serde_json::from_str(text).unwrap_or_default()
}

/// Whether `fact` has the value `wanted`, as a selector writes it (`cpus=4`, `os=debian`); a
/// list has it when one of its elements does.
pub fn has_value(fact: &serde_json::Value, wanted: &str) -> bool {
    use serde_json::Value;
    match fact {
        Value::String(text) => text == wanted,
        Value::Number(number) => number.to_string() == wanted,
        Value::Bool(flag) => (if *flag { "true" } else { "false" }) == wanted,
        Value::Array(items) => items.iter().any(|item| has_value(item, wanted)),
        Value::Null | Value::Object(_) => false,
    }
}

/// A fact's value as one line of text: lists joined with `, `.
pub fn display(fact: &serde_json::Value) -> String {
    use serde_json::Value;
    match fact {
        Value::String(text) => text.clone(),
        Value::Array(items) => items.iter().map(display).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// `KEY=value` lines of os-release(5): comments and blank lines skipped, one level of
/// quotes removed, and in double quotes the backslash escapes of `\"`, `\\`, `\$`, `` \` ``.
pub fn parse_os_release(text: &str) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        let value = if let Some(inner) = quoted(value, '"') {
            let mut unescaped = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                match (c, chars.clone().next()) {
                    ('\\', Some(next @ ('"' | '\\' | '$' | '`'))) => {
                        unescaped.push(next);
                        chars.next();
                    }
                    _ => unescaped.push(c),
                }
            }
            unescaped
        } else if let Some(inner) = quoted(value, '\'') {
            inner.to_string()
        } else {
            value.to_string()
        };
        fields.insert(key.trim().to_string(), value);
    }
    fields
}

fn quoted(value: &str, quote: char) -> Option<&str> {
    value
        .strip_prefix(quote)
        .and_then(|rest| rest.strip_suffix(quote))
}

/// The family of an os-release `ID`, or of the first word of `ID_LIKE` that has one; the ID
/// itself when neither does.
pub fn os_family(id: &str, id_like: &str) -> String {
    fn family(name: &str) -> Option<&'static str> {
        let name = name.to_ascii_lowercase();
        let family = match name.as_str() {
            "debian" | "ubuntu" | "linuxmint" | "raspbian" | "kali" | "pop" | "devuan" => "debian",
            "rhel" | "centos" | "fedora" | "rocky" | "almalinux" | "alma" | "ol" | "amzn" => {
                "redhat"
            }
            "suse" | "sles" | "sled" => "suse",
            name if name.starts_with("opensuse") => "suse",
            "arch" | "archarm" | "manjaro" | "endeavouros" => "arch",
            "alpine" => "alpine",
            _ => return None,
        };
        Some(family)
    }
    family(id)
        .or_else(|| id_like.split_whitespace().find_map(family))
        .map_or_else(|| id.to_string(), str::to_string)
}

/// `MemTotal` of /proc/meminfo, in KiB.
pub fn parse_meminfo_total_kib(text: &str) -> Option<u64> {
    let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let amount: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => Some(amount),
        Some(_) => None,
    }
}

/// The host's fully qualified name as /etc/hosts gives it, without asking DNS (a resolver
/// that times out must not hold the agent up): the canonical (first) name of the first line
/// naming `hostname`, when it is `hostname.` followed by a domain, or such an alias on that
/// line. A hostname that already has a dot is its own FQDN. None when the file says nothing.
pub fn fqdn_from_hosts(hostname: &str, hosts: &str) -> Option<String> {
    if hostname.is_empty() {
        return None;
    }
    if hostname.contains('.') {
        return Some(hostname.to_string());
    }
    let prefix = format!("{}.", hostname.to_ascii_lowercase());
    let qualifies = |name: &str| {
        let name = name.to_ascii_lowercase();
        name.starts_with(&prefix) && name.len() > prefix.len()
    };
    for line in hosts.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        if fields.next().is_none() {
            continue;
        }
        let names: Vec<&str> = fields.collect();
        let names_host = names
            .iter()
            .any(|name| name.eq_ignore_ascii_case(hostname) || qualifies(name));
        if !names_host {
            continue;
        }
        if let Some(name) = names.iter().find(|name| qualifies(name)) {
            return Some(name.to_string());
        }
    }
    None
}

/// What `virtual` is decided from; read by `read`, given by tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VirtualHints {
    /// /run/systemd/container: what systemd found it runs in (`docker`, `lxc`, ...).
    pub systemd_container: Option<String>,
    /// `container=` in /proc/1/environ (readable by root only).
    pub pid1_container: Option<String>,
    /// /.dockerenv exists.
    pub has_dockerenv: bool,
    /// /run/.containerenv exists (podman).
    pub has_containerenv: bool,
    /// The kernel release (WSL's says `microsoft`).
    pub kernel: String,
    /// /sys/class/dmi/id/sys_vendor and product_name.
    pub sys_vendor: String,
    pub product_name: String,
    /// The CPU's hypervisor flag (/proc/cpuinfo, else CPUID on x86).
    pub has_hypervisor_flag: bool,
}

impl VirtualHints {
    fn read(kernel: &str) -> VirtualHints {
        let trimmed = |path: &str| read_text(path).map(|text| text.trim().to_string());
        let pid1_container = std::fs::read("/proc/1/environ").ok().and_then(|environ| {
            environ
                .split(|&b| b == 0)
                .find_map(|entry| entry.strip_prefix(b"container="))
                .map(|value| String::from_utf8_lossy(value).into_owned())
        });
        VirtualHints {
            systemd_container: trimmed("/run/systemd/container"),
            pid1_container,
            has_dockerenv: Path::new("/.dockerenv").exists(),
            has_containerenv: Path::new("/run/.containerenv").exists(),
            kernel: kernel.to_string(),
            sys_vendor: trimmed("/sys/class/dmi/id/sys_vendor").unwrap_or_default(),
            product_name: trimmed("/sys/class/dmi/id/product_name").unwrap_or_default(),
            has_hypervisor_flag: cpuinfo_hypervisor_flag().unwrap_or_else(cpuid_hypervisor_bit),
        }
    }
}

/// `physical`, or what the host runs in, named as systemd-detect-virt does: a container
/// (`docker`, `podman`, `lxc`, `systemd-nspawn`, `wsl`, or `container` when the kind is
/// unknown) before a hypervisor (`kvm`, `qemu`, `vmware`, `microsoft`, `oracle`, `xen`,
/// `amazon`, `google`, ..., or `vm` when only the CPU says so).
pub fn virtual_kind(hints: &VirtualHints) -> String {
    let named = |value: &Option<String>| {
        value
            .as_deref()
            .map(str::trim)
            .filter(|kind| !kind.is_empty())
            .map(str::to_ascii_lowercase)
    };
    if let Some(kind) = named(&hints.systemd_container).or_else(|| named(&hints.pid1_container)) {
        return if kind == "oci" {
            "container".into()
        } else {
            kind
        };
    }
    if hints.has_dockerenv {
        return "docker".into();
    }
    if hints.has_containerenv {
        return "podman".into();
    }
    let kernel = hints.kernel.to_ascii_lowercase();
    if kernel.contains("microsoft") || kernel.contains("wsl") {
        return "wsl".into();
    }
    // Prefixes of DMI's product name or system vendor, after systemd's table.
    const DMI: &[(&str, &str)] = &[
        ("KVM", "kvm"),
        ("OpenStack", "kvm"),
        ("KubeVirt", "kvm"),
        ("Amazon EC2", "amazon"),
        ("QEMU", "qemu"),
        ("VMware", "vmware"),
        ("VMW", "vmware"),
        ("innotek GmbH", "oracle"),
        ("VirtualBox", "oracle"),
        ("Xen", "xen"),
        ("Bochs", "bochs"),
        ("Parallels", "parallels"),
        ("BHYVE", "bhyve"),
        ("Hyper-V", "microsoft"),
        ("Google Compute Engine", "google"),
        ("Google", "google"),
    ];
    for field in [&hints.product_name, &hints.sys_vendor] {
        if let Some((_, kind)) = DMI.iter().find(|(prefix, _)| field.starts_with(prefix)) {
            return (*kind).into();
        }
    }
    if hints.sys_vendor.starts_with("Microsoft Corporation")
        && hints.product_name.starts_with("Virtual Machine")
    {
        return "microsoft".into();
    }
    if hints.has_hypervisor_flag {
        return "vm".into();
    }
    "physical".into()
}

/// Whether the first `flags` line of /proc/cpuinfo has `hypervisor`; None when unreadable.
fn cpuinfo_hypervisor_flag() -> Option<bool> {
    let file = std::fs::File::open("/proc/cpuinfo").ok()?;
    let reader = std::io::BufReader::new(file.take(MAX_FILE_BYTES));
    let flags = reader
        .lines()
        .map_while(Result::ok)
        .find(|line| line.starts_with("flags"))?;
    Some(cpuinfo_flags_have_hypervisor(&flags))
}

/// `flags\t\t: fpu vme ... hypervisor ...`: whether `hypervisor` is one of the flags.
pub fn cpuinfo_flags_have_hypervisor(line: &str) -> bool {
    line.split_once(':')
        .is_some_and(|(_, flags)| flags.split_whitespace().any(|flag| flag == "hypervisor"))
}

/// Bit 31 of CPUID leaf 1's ECX: set by every hypervisor that admits to being one.
#[cfg(target_arch = "x86_64")]
fn cpuid_hypervisor_bit() -> bool {
    // SAFETY: CPUID leaf 1 exists on every x86_64 processor; the instruction has no effects.
    // (Newer compilers consider the intrinsic safe; rust-version 1.85 does not.)
    #[allow(unused_unsafe)]
    let leaf = unsafe { std::arch::x86_64::__cpuid(1) };
    leaf.ecx & (1 << 31) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn cpuid_hypervisor_bit() -> bool {
    false
}

/// `systemd` when /run/systemd/system exists (how sd_booted(3) tells), else the name of
/// process 1 (empty when hidden from this process).
fn init() -> String {
    if Path::new("/run/systemd/system").is_dir() {
        return "systemd".into();
    }
    read_text("/proc/1/comm")
        .map(|name| name.trim().to_string())
        .unwrap_or_default()
}

/// Online CPUs of the host (not this process's share of them).
fn cpus() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if online > 0 {
        return online as u64;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

/// Total RAM from sysinfo(2), for when /proc/meminfo is hidden (`ProcSubset=pid`).
fn sysinfo_total_mib() -> Option<u64> {
    // SAFETY: sysinfo fills the zeroed struct it is given.
    let info = unsafe {
        let mut info: libc::sysinfo = std::mem::zeroed();
        if libc::sysinfo(&mut info) != 0 {
            return None;
        }
        info
    };
    let bytes = (info.totalram as u64).saturating_mul(u64::from(info.mem_unit.max(1)));
    Some(bytes / (1024 * 1024))
}

/// The machine (`x86_64`) and the kernel release (as `uname -m` and `uname -r`); empty when
/// uname fails.
fn uname() -> (String, String) {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated C strings.
    unsafe {
        let mut names: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut names) != 0 {
            return (String::new(), String::new());
        }
        let text = |field: &[libc::c_char]| {
            std::ffi::CStr::from_ptr(field.as_ptr())
                .to_string_lossy()
                .into_owned()
        };
        (text(&names.machine), text(&names.release))
    }
}

/// gethostname(2), not /proc/sys/kernel/hostname: the agent's unit hides /proc/sys
/// (`ProcSubset=pid`).
pub fn hostname() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most buffer.len() bytes into the buffer we own.
    if unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } != 0 {
        return String::new();
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).trim().to_string()
}

/// Addresses of this host's interfaces (getifaddrs(3)), IPv4 then IPv6, sorted, without
/// loopback and IPv6 link-local ones (`fe80::/10` means nothing without its interface and
/// exists on every link). Empty when the interfaces cannot be listed.
fn ip_addresses() -> Vec<String> {
    let mut addresses: Vec<IpAddr> = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates the list and points `list` at it; it is walked read-only
    // through ifa_next and given back to freeifaddrs exactly once. Each ifa_addr is checked
    // for null and read as the sockaddr type its family names.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return Vec::new();
        }
        let mut cursor = list;
        while let Some(entry) = cursor.as_ref() {
            cursor = entry.ifa_next;
            let is_loopback = entry.ifa_flags & (libc::IFF_LOOPBACK as libc::c_uint) != 0;
            let Some(address) = entry.ifa_addr.as_ref() else {
                continue;
            };
            if is_loopback {
                continue;
            }
            let ip = match i32::from(address.sa_family) {
                libc::AF_INET => {
                    let v4 = &*(entry.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::from(u32::from_be(v4.sin_addr.s_addr).to_be_bytes())
                }
                libc::AF_INET6 => {
                    let v6 = &*(entry.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::from(v6.sin6_addr.s6_addr)
                }
                _ => continue,
            };
            addresses.push(ip);
        }
        libc::freeifaddrs(list);
    }
    reportable_addresses(addresses)
}

/// Sorted, deduplicated, loopback and IPv6 link-local dropped, at most MAX_ADDRESSES.
fn reportable_addresses(mut addresses: Vec<IpAddr>) -> Vec<String> {
    addresses.retain(|ip| match ip {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_unspecified(),
        IpAddr::V6(v6) => {
            !v6.is_loopback() && !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80
        }
    });
    addresses.sort();
    addresses.dedup();
    addresses.truncate(MAX_ADDRESSES);
    addresses.iter().map(IpAddr::to_string).collect()
}

/// A small file's text, or None (missing, unreadable, too large, not UTF-8).
fn read_text(path: &str) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_fields() {
        let text = "# comment\n\
                    PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n\
                    NAME='Debian GNU/Linux'\n\
                    VERSION_ID=\"12\"\n\
                    ID=debian\n\
                    \n\
                    ESCAPED=\"a \\\"quoted\\\" \\$word\\\\\"\n\
                    not a pair\n\
                    HOME_URL=\"https://www.debian.org/\"\n";
        let fields = parse_os_release(text);
        let cases = [
            ("ID", "debian"),
            ("VERSION_ID", "12"),
            ("NAME", "Debian GNU/Linux"),
            ("PRETTY_NAME", "Debian GNU/Linux 12 (bookworm)"),
            ("ESCAPED", "a \"quoted\" $word\\"),
            ("HOME_URL", "https://www.debian.org/"),
        ];
        for (key, expected) in cases {
            assert_eq!(fields.get(key).map(String::as_str), Some(expected), "{key}");
        }
        assert_eq!(fields.len(), cases.len());
        assert!(parse_os_release("").is_empty());
    }

    #[test]
    fn families() {
        let cases = [
            ("debian", "", "debian"),
            ("ubuntu", "debian", "debian"),
            ("linuxmint", "ubuntu debian", "debian"),
            ("someday", "ubuntu", "debian"),
            ("rhel", "fedora", "redhat"),
            ("centos", "rhel fedora", "redhat"),
            ("rocky", "rhel centos fedora", "redhat"),
            ("almalinux", "rhel centos fedora", "redhat"),
            ("fedora", "", "redhat"),
            ("amzn", "centos rhel fedora", "redhat"),
            ("opensuse-leap", "suse opensuse", "suse"),
            ("sles", "", "suse"),
            ("arch", "", "arch"),
            ("manjaro", "arch", "arch"),
            ("alpine", "", "alpine"),
            ("nixos", "", "nixos"),
            ("linux", "", "linux"),
        ];
        for (id, like, expected) in cases {
            assert_eq!(os_family(id, like), expected, "{id} like {like:?}");
        }
    }

    #[test]
    fn meminfo_total() {
        let text = "MemFree:         1234 kB\nMemTotal:       16318428 kB\nSwapTotal: 0 kB\n";
        let cases = [
            (text, Some(16_318_428)),
            ("MemTotal: 2048\n", Some(2048)),
            ("MemTotal: 2 MB\n", None),
            ("MemTotal: lots kB\n", None),
            ("MemTotal:\n", None),
            ("", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_meminfo_total_kib(text), expected, "{text:?}");
        }
    }

    #[test]
    fn fqdn_without_dns() {
        let hosts = "127.0.0.1\tlocalhost\n\
                     # 10.0.0.9 web1.wrong.example web1\n\
                     127.0.1.1 web1.example.com web1   # the Debian way\n\
                     ::1 localhost ip6-localhost\n";
        let cases = [
            ("web1", hosts, Some("web1.example.com")),
            ("WEB1", hosts, Some("web1.example.com")),
            ("web1.corp.example", "", Some("web1.corp.example")),
            ("web1", "10.0.0.9 web1 web1.lan\n", Some("web1.lan")),
            ("web1", "172.17.0.2\tweb1\n", None),
            (
                "web1",
                "127.0.0.1 localhost.localdomain localhost web1\n",
                None,
            ),
            ("web10", hosts, None),
            ("web", hosts, None),
            ("", hosts, None),
        ];
        for (hostname, hosts, expected) in cases {
            assert_eq!(
                fqdn_from_hosts(hostname, hosts).as_deref(),
                expected,
                "{hostname} in {hosts:?}"
            );
        }
    }

    #[test]
    fn virtualization() {
        let hints = |change: fn(&mut VirtualHints)| {
            let mut hints = VirtualHints::default();
            change(&mut hints);
            hints
        };
        let cases = [
            (hints(|_| {}), "physical"),
            (hints(|h| h.has_hypervisor_flag = true), "vm"),
            (hints(|h| h.sys_vendor = "QEMU".into()), "qemu"),
            (
                hints(|h| {
                    h.sys_vendor = "Red Hat".into();
                    h.product_name = "KVM".into();
                }),
                "kvm",
            ),
            (hints(|h| h.sys_vendor = "VMware, Inc.".into()), "vmware"),
            (hints(|h| h.product_name = "VirtualBox".into()), "oracle"),
            (
                hints(|h| {
                    h.sys_vendor = "Microsoft Corporation".into();
                    h.product_name = "Virtual Machine".into();
                }),
                "microsoft",
            ),
            (hints(|h| h.sys_vendor = "Amazon EC2".into()), "amazon"),
            (hints(|h| h.sys_vendor = "Dell Inc.".into()), "physical"),
            (
                hints(|h| {
                    h.has_dockerenv = true;
                    h.sys_vendor = "QEMU".into();
                }),
                "docker",
            ),
            (hints(|h| h.has_containerenv = true), "podman"),
            (hints(|h| h.pid1_container = Some("lxc".into())), "lxc"),
            (
                hints(|h| {
                    h.systemd_container = Some("systemd-nspawn\n".into());
                    h.has_dockerenv = true;
                }),
                "systemd-nspawn",
            ),
            (
                hints(|h| h.systemd_container = Some("oci".into())),
                "container",
            ),
            (
                hints(|h| h.kernel = "5.15.90.1-microsoft-standard-WSL2".into()),
                "wsl",
            ),
        ];
        for (hints, expected) in cases {
            assert_eq!(virtual_kind(&hints), expected, "{hints:?}");
        }
        assert!(cpuinfo_flags_have_hypervisor(
            "flags\t\t: fpu vme de hypervisor lahf_lm"
        ));
        assert!(!cpuinfo_flags_have_hypervisor(
            "flags\t\t: fpu vme hypervisors"
        ));
        assert!(!cpuinfo_flags_have_hypervisor("flags"));
    }

    #[test]
    fn addresses_reported() {
        let parse =
            |list: &[&str]| -> Vec<IpAddr> { list.iter().map(|a| a.parse().unwrap()).collect() };
        let addresses = parse(&[
            "fe80::1",
            "10.0.0.5",
            "127.0.0.1",
            "2001:db8::5",
            "::1",
            "192.168.1.2",
            "10.0.0.5",
            "0.0.0.0",
        ]);
        assert_eq!(
            reportable_addresses(addresses),
            ["10.0.0.5", "192.168.1.2", "2001:db8::5"]
        );
        let many: Vec<IpAddr> = (0..200u32)
            .map(|n| IpAddr::from((0x0a00_0000 + n).to_be_bytes()))
            .collect();
        assert_eq!(reportable_addresses(many).len(), MAX_ADDRESSES);
    }

    #[test]
    fn values_as_selectors_see_them() {
        let cases = [
            (serde_json::json!("debian"), "debian", true),
            (serde_json::json!("debian"), "Debian", false),
            (serde_json::json!(4), "4", true),
            (serde_json::json!(4), "4.0", false),
            (serde_json::json!(true), "true", true),
            (serde_json::json!(["10.0.0.5", "fd00::1"]), "fd00::1", true),
            (serde_json::json!(["10.0.0.5"]), "10.0.0.6", false),
            (serde_json::json!([]), "", false),
            (serde_json::json!(null), "", false),
            (serde_json::json!({"a": "b"}), "b", false),
        ];
        for (fact, wanted, expected) in cases {
            assert_eq!(has_value(&fact, wanted), expected, "{fact} = {wanted}");
        }
        assert_eq!(display(&serde_json::json!(["a", "b"])), "a, b");
        assert_eq!(display(&serde_json::json!(16)), "16");
        assert_eq!(display(&serde_json::json!("x")), "x");
    }

    #[test]
    fn reported_facts_are_checked() {
        let facts = |value: serde_json::Value| -> Facts { serde_json::from_value(value).unwrap() };
        let good = facts(serde_json::json!({
            "os": "debian", "cpus": 4, "ip_addresses": ["10.0.0.5"], "x_1": true,
        }));
        assert_eq!(check(&good), Ok(()));
        for bad in [
            serde_json::json!({"OS": "debian"}),
            serde_json::json!({"": "x"}),
            serde_json::json!({"os": {"id": "debian"}}),
            serde_json::json!({"os": [["debian"]]}),
            serde_json::json!({"os": null}),
            serde_json::json!({"os": "x".repeat(MAX_TEXT_BYTES)}),
        ] {
            assert!(check(&facts(bad.clone())).is_err(), "{bad}");
        }
        assert_eq!(from_text(r#"{"os":"debian"}"#)["os"], "debian");
        assert!(from_text("").is_empty());
        assert!(from_text("[1]").is_empty());
    }

    #[test]
    fn this_host_has_every_fact() {
        let facts = collect();
        assert_eq!(
            facts
                .keys()
                .map(String::as_str)
                .collect::<std::collections::BTreeSet<_>>(),
            NAMES.iter().copied().collect()
        );
        assert_eq!(check(&facts), Ok(()));
        assert!(facts["cpus"].as_u64().unwrap() >= 1, "{facts:?}");
        assert!(facts["memory_mb"].as_u64().unwrap() > 0, "{facts:?}");
        assert!(facts["ip_addresses"].is_array(), "{facts:?}");
        assert_eq!(facts["arch"], std::env::consts::ARCH, "{facts:?}");
        assert!(!facts["os"].as_str().unwrap().is_empty(), "{facts:?}");
        assert_eq!(facts["hostname"], hostname());
        assert!(
            facts["fqdn"].as_str().unwrap().starts_with(&hostname()),
            "{facts:?}"
        );
    }
}
