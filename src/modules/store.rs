//! Installed modules, `module.lock`, and dependency resolution.
//!
//! The store is a directory (`--modules-dir`, env SVC_MODULES_DIR; default
//! /var/lib/svc/modules for root, else ~/.local/share/svc/modules) holding
//! `NAME/VERSION/module.zip` and its `module.zip.sig` when signed. A version, once installed,
//! is never replaced by different bytes: reinstalling the same bytes is a no-op, other bytes
//! are refused. The lock pins every dependency, transitive ones included, to one exact
//! version and the SHA-256 of its ZIP; installing or running a module with a lock checks
//! those hashes, so a changed dependency is refused rather than run.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::registry::{by_version, RegistryClient, Transport};
use super::{sha256_hex, Module, LOCK};
use crate::config::TrustPolicy;
use crate::version::{Range, Version};
use crate::{Error, Result};

/// `module.lock`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    pub lock_version: u32,
    /// Name → the exact version chosen, its ZIP's SHA-256 and where it came from.
    pub dependencies: BTreeMap<String, Locked>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Locked {
    pub version: String,
    pub sha256: String,
    /// `installed`, or the registry URL it was resolved from.
    pub source: String,
}

impl Lock {
    pub fn to_text(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a lock serializes");
        text.push('\n');
        text
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Installed {
    pub name: String,
    pub version: String,
    pub sha256: String,
    pub signed: bool,
}

pub struct Store {
    pub dir: PathBuf,
}

/// What `add` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    New,
    AlreadyInstalled,
}

impl Store {
    pub fn open(dir: Option<PathBuf>) -> Store {
        let dir = dir
            .or_else(|| {
                std::env::var_os("SVC_MODULES_DIR")
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
            })
            .unwrap_or_else(|| {
                // SAFETY: geteuid has no preconditions.
                if unsafe { libc::geteuid() } == 0 {
                    PathBuf::from("/var/lib/svc/modules")
                } else {
                    let home = std::env::var_os("HOME")
                        .map(PathBuf::from)
                        .unwrap_or_else(|| ".".into());
                    home.join(".local/share/svc/modules")
                }
            });
        Store { dir }
    }

    fn path(&self, name: &str, version: &str) -> PathBuf {
        self.dir.join(name).join(version).join("module.zip")
    }

    pub fn installed(&self) -> Result<Vec<Installed>> {
        let mut out = Vec::new();
        let Ok(names) = std::fs::read_dir(&self.dir) else {
            return Ok(out);
        };
        let mut names: Vec<String> = names
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        for name in names {
            for (version, sha256) in self.versions(&name) {
                out.push(Installed {
                    signed: self.signature(&name, &version.to_string()).is_some(),
                    name: name.clone(),
                    version: version.to_string(),
                    sha256,
                });
            }
        }
        Ok(out)
    }

    /// Installed versions of `name` with their SHA-256.
    pub fn versions(&self, name: &str) -> BTreeMap<Version, String> {
        let mut out = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir(self.dir.join(name)) else {
            return out;
        };
        for entry in entries.flatten() {
            let text = entry.file_name().to_string_lossy().to_string();
            if let (Ok(version), Ok(bytes)) = (
                Version::parse(&text),
                std::fs::read(entry.path().join("module.zip")),
            ) {
                out.insert(version, sha256_hex(&bytes));
            }
        }
        out
    }

    pub fn zip(&self, name: &str, version: &str) -> Result<Vec<u8>> {
        std::fs::read(self.path(name, version))
            .map_err(|_| Error::NotFound(format!("{name} {version} is not installed")))
    }

    pub fn signature(&self, name: &str, version: &str) -> Option<String> {
        let mut path = self.path(name, version).into_os_string();
        path.push(".sig");
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// Installs the bytes of a module already checked by the caller.
    fn add(&self, module: &Module, zip: &[u8], signature: Option<&str>) -> Result<Added> {
        let (name, version) = (&module.manifest.name, &module.manifest.version);
        if let Ok(existing) = self.zip(name, version) {
            if existing == zip {
                return Ok(Added::AlreadyInstalled);
            }
            return Err(Error::Conflict(format!(
                "{name} {version} is already installed with other bytes (SHA-256 {}); a version never changes, so this ZIP ({}) is refused",
                sha256_hex(&existing),
                sha256_hex(zip)
            )));
        }
        let path = self.path(name, version);
        let dir = path.parent().expect("has a parent");
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Internal(format!("{}: {e}", dir.display())))?;
        let staging = dir.join(".module.zip.partial");
        std::fs::write(&staging, zip).map_err(Error::internal)?;
        if let Some(sig) = signature {
            std::fs::write(dir.join("module.zip.sig"), format!("{}\n", sig.trim()))
                .map_err(Error::internal)?;
        }
        std::fs::rename(&staging, &path).map_err(Error::internal)?;
        Ok(Added::New)
    }

    /// The installed module NAME at VERSION, or the newest installed one matching the range.
    pub fn load(&self, name: &str, range: Option<&str>) -> Result<(Module, Vec<u8>)> {
        let versions = self.versions(name);
        let range = Range::parse(range.unwrap_or("*")).map_err(Error::Invalid)?;
        let version = versions
            .keys()
            .rev()
            .find(|v| range.matches(v))
            .ok_or_else(|| Error::NotFound(format!("no installed version of {name} matches")))?;
        let zip = self.zip(name, &version.to_string())?;
        Ok((Module::from_zip(&zip)?, zip))
    }
}

/// Installs a module ZIP: the signature policy, then every dependency its lock pins (from
/// the store, or downloaded from the lock's registry, reached by `transport`, or `registries`)
/// with the lock's SHA-256, then the module. Returns what was installed, dependencies first.
pub async fn install(
    store: &Store,
    zip: &[u8],
    signature: Option<&str>,
    policy: &TrustPolicy,
    registries: &[RegistryClient],
    transport: &Transport,
) -> Result<Vec<(Installed, Added)>> {
    let module = Module::from_zip(zip)?;
    policy.check(&module.id(), zip, signature)?;
    let mut done = Vec::new();
    if let Some(lock) = module.lock()? {
        for (name, locked) in &lock.dependencies {
            match store.zip(name, &locked.version) {
                Ok(bytes) => {
                    let got = sha256_hex(&bytes);
                    if got != locked.sha256 {
                        return Err(Error::Invalid(format!(
                            "{name} {} is installed with SHA-256 {got}, but {}'s {LOCK} says {}: refusing (a changed or tampered dependency)",
                            locked.version, module.manifest.name, locked.sha256
                        )));
                    }
                }
                Err(_) => {
                    let mut clients: Vec<RegistryClient> = Vec::new();
                    if locked.source.starts_with("http") {
                        clients.push(RegistryClient::new(&locked.source, transport));
                    }
                    clients.extend(registries.iter().cloned());
                    let mut fetched = None;
                    let mut last = Error::NotFound(format!(
                        "{name} {} is not installed and no registry was given (--registry)",
                        locked.version
                    ));
                    for client in &clients {
                        match client.download(name, &locked.version, &locked.sha256).await {
                            Ok(found) => {
                                fetched = Some(found);
                                break;
                            }
                            Err(e) => last = e,
                        }
                    }
                    let (dep_zip, dep_sig) = fetched.ok_or(last)?;
                    let dep = Module::from_zip(&dep_zip)?;
                    policy.check(&dep.id(), &dep_zip, dep_sig.as_deref())?;
                    let added = store.add(&dep, &dep_zip, dep_sig.as_deref())?;
                    done.push((installed(&dep, &dep_zip, dep_sig.is_some()), added));
                }
            }
        }
    }
    let added = store.add(&module, zip, signature)?;
    done.push((installed(&module, zip, signature.is_some()), added));
    Ok(done)
}

fn installed(module: &Module, zip: &[u8], signed: bool) -> Installed {
    Installed {
        name: module.manifest.name.clone(),
        version: module.manifest.version.clone(),
        sha256: sha256_hex(zip),
        signed,
    }
}

/// A candidate version of a dependency.
#[derive(Clone)]
struct Candidate {
    sha256: String,
    /// None: installed; Some: the registry it is in.
    registry: Option<usize>,
}

/// Resolves `module`'s dependencies, transitive ones included, against the installed
/// modules and `registries`: for each name, the newest version every range seen so far
/// accepts (installed bytes preferred for the same version). Versions picked from a
/// registry are downloaded (hash checked, signature policy applied) and installed, so the
/// module runs right after. One version per name.
pub async fn resolve(
    module: &Module,
    store: &Store,
    registries: &[RegistryClient],
    policy: &TrustPolicy,
) -> Result<Lock> {
    let mut constraints: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut chosen: BTreeMap<String, Locked> = BTreeMap::new();
    let mut candidates: BTreeMap<String, BTreeMap<Version, Candidate>> = BTreeMap::new();
    let mut queue: Vec<(String, String, String)> = module
        .manifest
        .dependencies
        .iter()
        .map(|(n, r)| (n.clone(), r.clone(), module.manifest.name.clone()))
        .collect();
    let mut rounds = 0;
    while let Some((name, range, by)) = queue.pop() {
        rounds += 1;
        if rounds > 10_000 {
            return Err(Error::Invalid(
                "dependency resolution does not settle".into(),
            ));
        }
        if name == module.manifest.name {
            return Err(Error::Invalid(format!(
                "{by} depends on {name}, the module itself: a cycle"
            )));
        }
        constraints
            .entry(name.clone())
            .or_default()
            .push((range.clone(), by.clone()));
        if !candidates.contains_key(&name) {
            let mut found: BTreeMap<Version, Candidate> = BTreeMap::new();
            for (i, registry) in registries.iter().enumerate().rev() {
                match registry.module(&name).await {
                    Ok(info) => {
                        for (version, v) in by_version(&info) {
                            found.insert(
                                version,
                                Candidate {
                                    sha256: v.sha256,
                                    registry: Some(i),
                                },
                            );
                        }
                    }
                    Err(Error::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            for (version, sha256) in store.versions(&name) {
                found.insert(
                    version,
                    Candidate {
                        sha256,
                        registry: None,
                    },
                );
            }
            candidates.insert(name.clone(), found);
        }
        let ranges = &constraints[&name];
        let parsed: Vec<Range> = ranges
            .iter()
            .map(|(r, _)| Range::parse(r).map_err(Error::Invalid))
            .collect::<Result<_>>()?;
        let available = &candidates[&name];
        let pick = available
            .iter()
            .rev()
            .find(|(v, _)| parsed.iter().all(|r| r.matches(v)));
        let Some((version, candidate)) = pick else {
            let wanted: Vec<String> = ranges
                .iter()
                .map(|(r, by)| format!("{r} (by {by})"))
                .collect();
            let have: Vec<String> = available.keys().map(Version::to_string).collect();
            return Err(Error::NotFound(format!(
                "no version of {name} satisfies {}; available: {}",
                wanted.join(", "),
                if have.is_empty() {
                    "none (not installed, not in any registry given)".into()
                } else {
                    have.join(", ")
                }
            )));
        };
        let version_text = version.to_string();
        if chosen.get(&name).is_some_and(|c| c.version == version_text) {
            continue;
        }
        let (dep_module, source) = match candidate.registry {
            None => (
                Module::from_zip(&store.zip(&name, &version_text)?)?,
                "installed".to_string(),
            ),
            Some(i) => {
                let registry = &registries[i];
                let (zip, sig) = registry
                    .download(&name, &version_text, &candidate.sha256)
                    .await?;
                let dep = Module::from_zip(&zip)?;
                policy.check(&dep.id(), &zip, sig.as_deref())?;
                store.add(&dep, &zip, sig.as_deref())?;
                (dep, registry.url.clone())
            }
        };
        chosen.insert(
            name.clone(),
            Locked {
                version: version_text.clone(),
                sha256: candidate.sha256.clone(),
                source,
            },
        );
        for (dep, range) in &dep_module.manifest.dependencies {
            queue.push((dep.clone(), range.clone(), format!("{name} {version_text}")));
        }
    }
    // A re-pick can leave a version chosen that a later range rules out: check them all.
    for (name, ranges) in &constraints {
        let version = Version::parse(&chosen[name].version).map_err(Error::Invalid)?;
        for (range, by) in ranges {
            if !Range::parse(range)
                .map_err(Error::Invalid)?
                .matches(&version)
            {
                return Err(Error::Invalid(format!(
                    "{name} {version} does not satisfy {range} (by {by})"
                )));
            }
        }
    }
    Ok(Lock {
        lock_version: 1,
        dependencies: chosen,
    })
}

/// The dependencies to run `module` with: its lock's exact versions from the store, hashes
/// checked; without a lock, the newest installed version of each range (transitively).
pub fn dependencies(module: &Module, store: &Store) -> Result<BTreeMap<String, Module>> {
    let mut out = BTreeMap::new();
    if let Some(lock) = module.lock()? {
        for (name, locked) in &lock.dependencies {
            let zip = store.zip(name, &locked.version).map_err(|_| {
                Error::NotFound(format!(
                    "{name} {} (from {LOCK}) is not installed: run svc-module install or resolve",
                    locked.version
                ))
            })?;
            let got = sha256_hex(&zip);
            if got != locked.sha256 {
                return Err(Error::Invalid(format!(
                    "{name} {}: installed SHA-256 {got} is not {LOCK}'s {}: refusing",
                    locked.version, locked.sha256
                )));
            }
            out.insert(name.clone(), Module::from_zip(&zip)?);
        }
        return Ok(out);
    }
    let mut queue: Vec<(String, String)> =
        module.manifest.dependencies.clone().into_iter().collect();
    while let Some((name, range)) = queue.pop() {
        if out.contains_key(&name) {
            continue;
        }
        let (dep, _) = store.load(&name, Some(&range)).map_err(|_| {
            Error::NotFound(format!(
                "dependency {name} {range} is not installed: run svc-module resolve"
            ))
        })?;
        queue.extend(dep.manifest.dependencies.clone());
        out.insert(name, dep);
    }
    Ok(out)
}

/// The dependency tree as JSON: {name, version, sha256?, dependencies: [...]}.
pub fn tree(
    module: &Module,
    deps: &BTreeMap<String, Module>,
    lock: Option<&Lock>,
) -> serde_json::Value {
    fn node(
        module: &Module,
        deps: &BTreeMap<String, Module>,
        lock: Option<&Lock>,
        path: &mut Vec<String>,
    ) -> serde_json::Value {
        let mut children = Vec::new();
        for (name, range) in &module.manifest.dependencies {
            let locked = lock.and_then(|l| l.dependencies.get(name));
            match deps.get(name) {
                Some(dep) if !path.contains(name) => {
                    path.push(name.clone());
                    let mut child = node(dep, deps, lock, path);
                    path.pop();
                    child["range"] = range.clone().into();
                    if let Some(locked) = locked {
                        child["sha256"] = locked.sha256.clone().into();
                    }
                    children.push(child);
                }
                _ => children
                    .push(serde_json::json!({"name": name, "range": range, "missing": true})),
            }
        }
        serde_json::json!({"name": module.manifest.name, "version": module.manifest.version, "dependencies": children})
    }
    node(module, deps, lock, &mut vec![module.manifest.name.clone()])
}
