//! svc-bootstrap: set a host up from a seed file in six phases (docs/blueprints.md,
//! "Bootstrapping a host").
//!
//! This module owns the seed's shape and the four phases that touch only this host: detect,
//! configure, validate, install. Every path they touch is under `root` (`--root DIR`, `/` by
//! default), so tests run them in a temporary directory. The two phases that talk to a
//! server (blueprints, verify) are in `cli::bootstrap`, since they are clients. Each phase is
//! idempotent: run again on a host it already set up, it reports "unchanged" and writes
//! nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

/// The seed file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seed {
    /// server.yaml's contents (any of its keys); absent: no server on this host.
    #[serde(default)]
    pub server: Option<serde_yaml_ng::Mapping>,
    /// agent.yaml's contents; absent: no agent on this host.
    #[serde(default)]
    pub agent: Option<serde_yaml_ng::Mapping>,
    #[serde(default)]
    pub install: InstallSection,
    /// The server the blueprints and verify phases talk to.
    #[serde(default)]
    pub connect: Option<Connect>,
    #[serde(default)]
    pub blueprints: Vec<SeedBlueprint>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InstallSection {
    /// Where bin/svc goes (under the root).
    pub prefix: PathBuf,
    /// Whether the systemd units are written to etc/systemd/system (never enabled or started).
    pub systemd: bool,
}

impl Default for InstallSection {
    fn default() -> Self {
        InstallSection {
            prefix: PathBuf::from("/usr"),
            systemd: true,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Connect {
    /// gRPC address (as --server).
    pub server: String,
    /// REST base URL (as --http-url), for /health/ready.
    pub http_url: String,
    /// A file holding the API key (operator or admin); else env SVC_API_KEY.
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedBlueprint {
    /// A bundle or a blueprint directory (relative to the seed file).
    pub path: PathBuf,
    /// Apply it here; absent: install only.
    #[serde(default)]
    pub target: Option<String>,
    #[serde(default)]
    pub set: BTreeMap<String, String>,
}

impl Seed {
    pub fn load(path: &Path) -> Result<Seed, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut seed: Seed =
            serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        for blueprint in &mut seed.blueprints {
            if blueprint.path.is_relative() {
                blueprint.path = base.join(&blueprint.path);
            }
        }
        if seed.server.is_none() && seed.agent.is_none() {
            return Err(format!(
                "{}: the seed sets up neither a server nor an agent",
                path.display()
            ));
        }
        if !seed.blueprints.is_empty() && seed.connect.is_none() {
            return Err(format!(
                "{}: blueprints need connect: {{server, http_url}}",
                path.display()
            ));
        }
        Ok(seed)
    }
}

/// `root` joined with an absolute path as it would be on the host.
pub fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

pub fn server_config_path(root: &Path) -> PathBuf {
    under(root, Path::new(crate::config::DEFAULT_SERVER_CONFIG))
}

pub fn agent_config_path(root: &Path) -> PathBuf {
    under(root, Path::new(crate::config::DEFAULT_AGENT_CONFIG))
}

/// detect: what this host is. Never changes anything.
pub fn detect(root: &Path, seed: &Seed) -> Result<String, String> {
    if !root.is_dir() {
        return Err(format!("root {} is not a directory", root.display()));
    }
    let release = std::fs::read_to_string(under(root, Path::new("/etc/os-release")))
        .ok()
        .and_then(|text| {
            let field = |key: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("{key}=")))
                    .map(|v| v.trim_matches('"').to_string())
            };
            field("PRETTY_NAME").or_else(|| field("ID"))
        })
        .unwrap_or_else(|| "unknown OS (no etc/os-release)".into());
    let init = if under(root, Path::new("/run/systemd/system")).is_dir() {
        "systemd"
    } else {
        "no systemd"
    };
    let manager = [
        ("/usr/bin/apt-get", "apt"),
        ("/usr/bin/dnf", "dnf"),
        ("/usr/bin/yum", "yum"),
    ]
    .iter()
    .find(|(path, _)| under(root, Path::new(path)).exists())
    .map_or("no package manager", |(_, name)| name);
    let binary = under(root, &seed.install.prefix.join("bin/svc"));
    let installed = if binary.exists() {
        "svc installed"
    } else {
        "svc not installed"
    };
    Ok(format!(
        "{release}; {init}; {manager}; {}; {installed}",
        std::env::consts::ARCH
    ))
}

/// configure: writes server.yaml and agent.yaml from the seed. A missing `hmacsecret` or
/// `master_key` is generated (mode 0600 for server.yaml); an existing file is kept when it
/// says what the seed says (its secrets kept), and otherwise only replaced with `force`.
pub fn configure(root: &Path, seed: &Seed, force: bool) -> Result<String, String> {
    let mut done = Vec::new();
    if let Some(server) = &seed.server {
        let path = server_config_path(root);
        done.push(write_config(&path, server, true, force)?);
    }
    if let Some(agent) = &seed.agent {
        let path = agent_config_path(root);
        done.push(write_config(&path, agent, false, force)?);
    }
    Ok(done.join("; "))
}

const SECRET_KEYS: &[&str] = &["hmacsecret", "master_key"];

fn write_config(
    path: &Path,
    wanted: &serde_yaml_ng::Mapping,
    is_server: bool,
    force: bool,
) -> Result<String, String> {
    let key = |k: &str| serde_yaml_ng::Value::String(k.to_string());
    let existing: Option<serde_yaml_ng::Mapping> = match std::fs::read_to_string(path) {
        Ok(text) => Some(
            serde_yaml_ng::from_str::<Option<serde_yaml_ng::Mapping>>(&text)
                .map_err(|e| format!("{}: {e}", path.display()))?
                .unwrap_or_default(),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut desired = wanted.clone();
    let mut generated = Vec::new();
    if is_server {
        for name in SECRET_KEYS {
            if desired.contains_key(key(name)) {
                continue;
            }
            // Keep the secrets a previous run generated: re-running changes nothing.
            let kept = existing.as_ref().and_then(|e| e.get(key(name)).cloned());
            let value = match kept {
                Some(value) => value,
                None => {
                    generated.push(*name);
                    serde_yaml_ng::Value::String(generate_secret(name))
                }
            };
            desired.insert(key(name), value);
        }
    }
    if let Some(existing) = &existing {
        if *existing == desired {
            return Ok(format!("{} unchanged", path.display()));
        }
        if !force {
            return Err(format!(
                "{} exists and differs from the seed; --force overwrites it",
                path.display()
            ));
        }
    }
    let text = serde_yaml_ng::to_string(&desired).map_err(|e| format!("{e}"))?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    let mode = if is_server { 0o600 } else { 0o644 };
    write_atomically(path, text.as_bytes(), mode)?;
    let mut what = format!(
        "{} {}",
        if existing.is_some() {
            "replaced"
        } else {
            "wrote"
        },
        path.display()
    );
    if !generated.is_empty() {
        what.push_str(&format!(" (generated {})", generated.join(", ")));
    }
    Ok(what)
}

fn generate_secret(name: &str) -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    match name {
        "master_key" => base64::engine::general_purpose::STANDARD.encode(bytes),
        _ => hex::encode(bytes),
    }
}

fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let temporary = path.with_extension(format!("new.{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&temporary)
        .map_err(|e| format!("cannot write {}: {e}", temporary.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", temporary.display()))?;
    std::fs::rename(&temporary, path).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// validate: the `--check-config` checks of what configure wrote.
pub fn validate(root: &Path, seed: &Seed) -> Result<String, String> {
    let mut done = Vec::new();
    if seed.server.is_some() {
        let path = server_config_path(root);
        let problems = crate::preflight::check_config_file(&path);
        if !problems.is_empty() {
            return Err(format!("{}: {}", path.display(), problems.join("; ")));
        }
        done.push(format!("{} valid", path.display()));
    }
    if seed.agent.is_some() {
        let path = agent_config_path(root);
        let loaded = crate::config::load_agent(Some(&path), &[])
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if loaded.config.agent.id.is_empty() {
            return Err(format!("{}: agent.id is missing", path.display()));
        }
        done.push(format!("{} valid", path.display()));
    }
    Ok(done.join("; "))
}

const UNITS: &[(&str, &str)] = &[
    (
        "svc-server.service",
        include_str!("../../systemd/svc-server.service"),
    ),
    (
        "svc-agent.service",
        include_str!("../../systemd/svc-agent.service"),
    ),
];

/// install: what install.sh does (this binary as PREFIX/bin/svc, a symlink per name), and the
/// systemd units into etc/systemd/system (not enabled, not started).
pub fn install(root: &Path, seed: &Seed) -> Result<String, String> {
    let bindir = under(root, &seed.install.prefix.join("bin"));
    std::fs::create_dir_all(&bindir)
        .map_err(|e| format!("cannot create {}: {e}", bindir.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let binary = std::fs::read(&exe).map_err(|e| format!("cannot read {}: {e}", exe.display()))?;
    let target = bindir.join("svc");
    let mut changed = Vec::new();
    if std::fs::read(&target).ok().as_deref() != Some(binary.as_slice()) {
        write_atomically(&target, &binary, 0o755)?;
        changed.push(format!("{}", target.display()));
    }
    let mut links = 0;
    for name in crate::program::NAMES {
        let link = bindir.join(name);
        if std::fs::read_link(&link).ok().as_deref() == Some(Path::new("svc")) {
            continue;
        }
        if link.symlink_metadata().is_ok() {
            return Err(format!(
                "{} exists and is not a link to svc; not replacing it",
                link.display()
            ));
        }
        std::os::unix::fs::symlink("svc", &link)
            .map_err(|e| format!("cannot link {}: {e}", link.display()))?;
        links += 1;
    }
    if links > 0 {
        changed.push(format!("{links} links"));
    }
    if seed.install.systemd {
        let units = under(root, Path::new("/etc/systemd/system"));
        std::fs::create_dir_all(&units)
            .map_err(|e| format!("cannot create {}: {e}", units.display()))?;
        for (name, text) in UNITS {
            let path = units.join(name);
            if std::fs::read_to_string(&path).ok().as_deref() != Some(*text) {
                write_atomically(&path, text.as_bytes(), 0o644)?;
                changed.push(format!("{}", path.display()));
            }
        }
    }
    Ok(if changed.is_empty() {
        format!("{} and its links unchanged", target.display())
    } else {
        format!("installed {}", changed.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configure_generates_secrets_once_and_refuses_to_overwrite() {
        let root = tempfile::tempdir().unwrap();
        let seed: Seed = serde_yaml_ng::from_str(
            "server: {data_dir: /var/lib/svc}\nagent: {agent: {id: web-01}}\n",
        )
        .unwrap();
        let first = configure(root.path(), &seed, false).unwrap();
        assert!(
            first.contains("generated hmacsecret, master_key"),
            "{first}"
        );
        let path = server_config_path(root.path());
        let text = std::fs::read_to_string(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = configure(root.path(), &seed, false).unwrap();
        assert!(again.contains("unchanged"), "{again}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        let changed: Seed = serde_yaml_ng::from_str("server: {data_dir: /elsewhere}\n").unwrap();
        assert!(configure(root.path(), &changed, false).is_err());
        assert!(configure(root.path(), &changed, true).is_ok());
        assert!(validate(root.path(), &seed).is_ok());
    }
}
