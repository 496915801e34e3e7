//! Declarative state (contract §10): the resource model, the compiler that turns a state file
//! into a plan, and the providers that check and apply a plan on this host.
//!
//! Used by three parties: `svcctl state compile|check|apply` compiles a file on the operator's
//! machine (resolving `source:` there), the server validates the compiled plan again and sends
//! it to agents over the bus, and `svc-agent` runs it here with `run`.
//!
//! A state file is a YAML list; each item is a one-key mapping from the kind to its settings:
//!
//! ```yaml
//! - directory: {path: /srv/app, mode: "0750", owner: www-data, group: www-data}
//! - file:
//!     path: /srv/app/config.toml
//!     source: files/config.toml   # read on the operator's machine, inlined by compile
//!     mode: 640                   # octal, however written: 640, "0640", 0o640
//! - file: {path: /etc/motd, content: "managed by svc\n"}
//! - symlink: {path: /srv/current, target: app}
//! - package: {name: nginx}                      # installed (default) | absent
//! - package: {name: curl, version: 7.88.1-10+deb12u5}   # a pin
//! - service: {name: nginx, state: running, enabled: true}
//! - command: {run: make install, creates: /usr/local/bin/app, timeout: 5m}
//! - user: {name: app, uid: 1500, groups: [adm], shell: /bin/bash}
//! - group: {name: deploy, gid: 1600}
//! - cron: {name: backup, schedule: "0 3 * * *", run: /usr/local/bin/backup}
//! - sysctl: {name: net.ipv4.ip_forward, value: 1}
//! - line: {path: /etc/ssh/sshd_config, line: PermitRootLogin no, match: "^#?PermitRootLogin"}
//! - pkgrepo: {name: docker, apt: {uri: "https://download.docker.com/linux/debian",
//!     suite: bookworm, components: [stable], key_source: keys/docker.asc}}
//! - archive: {path: /opt/tool, url: "https://example.com/tool-1.2.tar.gz", sha256: 5f2b...}
//! - git: {path: /srv/site, repo: "https://git.example.com/site.git", rev: main}
//! ```
//!
//! Resources run in order, so a directory comes before the files in it. `file`, `directory`
//! and `symlink` also take `state: absent`, which removes only their own kind (a regular file,
//! an empty directory, a symlink) and never follows a link.
//!
//! Code map: this file owns the model (what travels on the bus as JSON) and the three entry
//! points. `compile.rs` reads YAML and inlines sources, `validate.rs` holds the value rules all
//! three parties share, and `providers/` has one file per resource kind, each checking and
//! applying its kind on this host. Only `compile.rs` touches YAML; only `providers/` touches
//! the host.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

mod compile;
mod providers;
mod validate;

/// A compiled state: resources in the order they are applied. Serialized as JSON on the bus.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// In the order they run: the file's order, except that a resource comes after every one
    /// it requires (`compile` sorts them, so the agent only follows the list).
    #[serde(deserialize_with = "resources_from_json")]
    pub resources: Vec<Resource>,
    /// Ids, requisites and triggers: one entry per resource (same index) when any resource of
    /// the plan has one, empty otherwise. A parallel list rather than fields of every kind, so
    /// the kinds keep their own unknown-key checks and an old plan reads unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Links>,
    /// Template parameters: the state file's `vars:` block with `--set` on top.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vars: BTreeMap<String, serde_json::Value>,
    /// Names of `vars` whose values are secret (`--set-secret`): the agent redacts them from
    /// diffs, and outcomes never quote a rendered file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_vars: Vec<String>,
}

/// How one resource relates to the others (YAML: `id`, `require`, `onchanges` beside its
/// settings).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Links {
    /// A name other resources use to refer to this one; unique in the plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Ids that run first; if one of them fails (or is skipped for a failure) this resource is
    /// not run and says why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub require: Vec<String>,
    /// Ids that run first; this resource runs only when at least one of them changed in this
    /// run (in check mode: would change). Implies `require`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub onchanges: Vec<String>,
}

impl Links {
    pub fn is_empty(&self) -> bool {
        self.id.is_none() && self.require.is_empty() && self.onchanges.is_empty()
    }

    /// Every id this resource waits for: its requisites, then its triggers.
    pub fn prerequisites(&self) -> impl Iterator<Item = &String> {
        self.require.iter().chain(&self.onchanges)
    }
}

impl Plan {
    /// A plan of these resources, with no links or vars.
    pub fn of(resources: Vec<Resource>) -> Plan {
        Plan {
            resources,
            ..Plan::default()
        }
    }

    /// The links of resource `index` (none when the plan has no links).
    pub fn links_of(&self, index: usize) -> Option<&Links> {
        self.links.get(index)
    }

    /// Adds a resource at the end, with no links.
    pub fn push(&mut self, resource: Resource) {
        if !self.links.is_empty() {
            self.links.push(Links::default());
        }
        self.resources.push(resource);
    }

    /// Appends `other`'s resources with their links, and its vars (an earlier plan's value of
    /// a var is kept); ids must stay unique, which `validate` checks.
    pub fn append(&mut self, other: Plan) {
        if !other.links.is_empty() && self.links.is_empty() {
            self.links = vec![Links::default(); self.resources.len()];
        }
        if !self.links.is_empty() {
            let mut links = other.links;
            links.resize(other.resources.len(), Links::default());
            self.links.extend(links);
        }
        self.resources.extend(other.resources);
        for (name, value) in other.vars {
            self.vars.entry(name).or_insert(value);
        }
        for name in other.secret_vars {
            if !self.secret_vars.contains(&name) {
                self.secret_vars.push(name);
            }
        }
    }
}

/// Reads a list of resources through a JSON value, whatever the format: [`Resource`]'s derived
/// deserializer (fifteen kinds, each struct's visitor inlined: about 50 KB of code) is then
/// compiled once, for `serde_json::Value`, instead of once per deserializer that reads a plan
/// (JSON text, bytes, a value, a buffered internally tagged command: 250 KB in all before).
/// The messages are serde_json's own; the JSON position of a malformed resource is not kept.
fn resources_from_json<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<Resource>, D::Error> {
    let value = serde_json::Value::deserialize(deserializer)?;
    serde_json::from_value(value).map_err(serde::de::Error::custom)
}

/// One resource of a state file. In YAML each list item is a one-key mapping:
/// `- file: {path: /etc/motd, content: "hi\n", mode: "0644"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Resource {
    File(FileResource),
    Directory(DirectoryResource),
    Symlink(SymlinkResource),
    Package(PackageResource),
    Service(ServiceResource),
    Command(CommandResource),
    Tree(TreeResource),
    User(UserResource),
    Group(GroupResource),
    Cron(CronResource),
    Sysctl(SysctlResource),
    Line(LineResource),
    Pkgrepo(PkgrepoResource),
    Archive(ArchiveResource),
    Git(GitResource),
}

/// Whether a file, directory or symlink should exist (wire names lowercase).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Presence {
    Present,
    Absent,
}

/// What a package should be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PackageState {
    Installed,
    Absent,
}

/// What a service should be doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceState {
    Running,
    Stopped,
    /// Restart it every run: meant for `onchanges` (restart when its configuration changed).
    Restarted,
    /// Reload it (`systemctl reload`) every run: meant for `onchanges`, like restarted.
    Reloaded,
}

impl ServiceState {
    /// Restarted and reloaded are actions, not states: they "change" every run they are run.
    pub fn is_action(self) -> bool {
        matches!(self, ServiceState::Restarted | ServiceState::Reloaded)
    }
}

impl std::fmt::Display for ServiceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ServiceState::Running => "running",
            ServiceState::Stopped => "stopped",
            ServiceState::Restarted => "restarted",
            ServiceState::Reloaded => "reloaded",
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileResource {
    pub path: String,
    /// present (default) | absent. Absent removes a regular file, never anything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Presence>,
    /// The whole file, as text. At most one of content, content_base64 and source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The whole file, base64 (standard alphabet, padded): how `compile` inlines a source
    /// that is not UTF-8, so binary files survive the JSON plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
    /// A file on the operator's machine, relative to the state file's directory; `compile`
    /// inlines it as `content` (or `content_base64`), so a plan never carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// A template file on the operator's machine, relative to the state file's directory
    /// (minijinja, as blueprints use). `compile` reads it into `content` and keeps this name
    /// for messages; the agent renders `content` with the host's `facts` and the plan's
    /// `vars` before comparing. At most one of template, source and content_base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Octal, as text: "0644" (compile writes it with four digits). A new file without a
    /// mode gets 0644; an existing one keeps its mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// A user name or a numeric uid; unset leaves the owner alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// A group name or a numeric gid; unset leaves the group alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// One directory level: the parent must exist (list parents first, each with its own mode).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectoryResource {
    pub path: String,
    /// present (default) | absent. Absent removes an empty directory only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Presence>,
    /// Octal, as text; a new directory without a mode gets 0755.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SymlinkResource {
    pub path: String,
    /// What the link points at, stored as written (it may be relative). Required unless
    /// `state: absent`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target: String,
    /// present (default) | absent. Absent removes a symlink, never what it points at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Presence>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackageResource {
    pub name: String,
    /// installed (default) | absent
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<PackageState>,
    /// A pin: this version installed (apt `name=version`, dnf `name-version`), up or down.
    /// apt compares it with the whole installed version (epoch included); dnf with as much as
    /// it gives ("2.4", "2.4-1.el9" or "1:2.4-1.el9"). Unset: any version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceResource {
    pub name: String,
    /// running | stopped; unset leaves it alone. At least one of state and enabled is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ServiceState>,
    /// Started at boot; unset leaves it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandResource {
    /// Run with /bin/sh -c.
    pub run: String,
    /// Skip when this command exits 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unless: Option<String>,
    /// Skip when this path exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creates: Option<String>,
    /// How long `run` (and `unless`) may take: "30s", "10m"; default 10m. On expiry the
    /// command's whole process group is killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// A directory tree copied from a directory beside the state file: every file and directory
/// of the source, with modes, and (with `purge`) nothing else.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreeResource {
    /// The destination directory; created (with `dir_mode`) when missing, its parent must
    /// exist.
    pub path: String,
    /// A directory on the operator's machine, relative to the state file's directory;
    /// `compile` reads it into `dirs` and `files`, so a plan never carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Directories below `path`, relative, parents first (compiled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<String>,
    /// Files below `path` (compiled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<TreeFile>,
    /// Every file's mode, instead of the source file's own (octal text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Every directory's mode; default 0755.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Remove what is under `path` and not in the source (files, symlinks, directories).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub purge: bool,
}

/// One file of a tree: its path below the tree, its bytes, its mode.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreeFile {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
    /// The source file's mode (octal text), unless the tree sets one for all.
    pub mode: String,
}

/// A local user account, changed only through useradd, usermod and userdel. Unset settings
/// are left alone (at creation, useradd's defaults apply).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserResource {
    pub name: String,
    /// present (default) | absent. Absent runs userdel, which keeps the home directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Presence>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The primary group: a group name or a numeric gid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<String>,
    /// Supplementary groups (names or gids), the exact set: the user leaves every other group.
    /// `[]` means none; unset leaves membership alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<String>>,
    /// The home directory as /etc/passwd records it; never created or moved (a `directory`
    /// resource makes it, with its mode and owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Created as a system account (useradd --system: a uid from the system range). Only
    /// matters at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<bool>,
    /// The GECOS field, usually the full name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// A local group, changed only through groupadd, groupmod and groupdel.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupResource {
    pub name: String,
    /// present (default) | absent
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Presence>,
    /// Unset: groupadd picks one at creation, and an existing group keeps its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// Created as a system group (groupadd --system). Only matters at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<bool>,
}

/// A cron job managed by name: one line in a user's crontab, or in a file of /etc/cron.d,
/// under the marker comment `# svc: NAME` that finds it again. Nothing else in the crontab or
/// file is touched.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CronResource {
    /// Identifies the entry (its marker comment): one line of text.
    pub name: String,
    /// present (default) | absent
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Presence>,
    /// Whose crontab (default root); with `file`, the user the job runs as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Five fields ("0 3 * * *") or a keyword (@daily, @reboot, ...). Required unless absent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub schedule: String,
    /// The command line, written as is (cron reads `%` as a newline unless escaped: `\%`).
    /// Required unless absent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub run: String,
    /// A cron.d-style file (absolute path, such as /etc/cron.d/backup) instead of the user's
    /// crontab; its lines name the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// A kernel parameter: its `name = value` line in a sysctl.d file (the setting at boot) and,
/// unless `runtime: false`, the running kernel's value under /proc/sys.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SysctlResource {
    /// Dotted: net.ipv4.ip_forward.
    pub name: String,
    /// Compared with runs of whitespace taken as one space: "4096 87380 6291456".
    pub value: String,
    /// The file that persists it (default /etc/sysctl.d/99-svc.conf); other lines stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Also set the value now (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<bool>,
}

/// One line of a text file, or a block of lines between two marker lines; the rest of the
/// file stays as it is. The line form takes `line` and/or `match`; the block form takes `block`
/// (and optionally `marker`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineResource {
    pub path: String,
    /// present (default) | absent. Absent removes the lines equal to `line` or matching
    /// `match`, or the marked block whatever it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Presence>,
    /// The whole line, without its newline. Required when present, in the line form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<String>,
    /// A regular expression: every line it matches is replaced by `line`; with no match,
    /// `line` is appended (unless it is there already).
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// The lines kept between the BEGIN and END marker lines, replaced as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<String>,
    /// The marker lines, `{mark}` standing for BEGIN and END; default
    /// "# {mark} svc managed block". Two blocks in one file need two markers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marker: Option<String>,
    /// Create a missing file (mode 0644) rather than fail; default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<bool>,
}

/// A package repository: an apt source (deb822 `NAME.sources`, its key in a keyring file
/// that `Signed-By` names) or a yum/dnf repository (`NAME.repo`). The host decides which block
/// applies (apt-get present: apt; else dnf or yum), so one resource can carry both for a mixed
/// fleet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PkgrepoResource {
    /// The file name (`NAME.sources`, `NAME.repo`, `NAME.asc`) and the yum repository id.
    pub name: String,
    /// present (default) | absent. Absent removes the repository file and its key file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Presence>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apt: Option<AptRepository>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yum: Option<YumRepository>,
    /// Where the repository file goes: default /etc/apt/sources.list.d (apt) or
    /// /etc/yum.repos.d (yum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// Where the key file goes: default /etc/apt/keyrings (apt) or /etc/pki/rpm-gpg (yum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyring_dir: Option<String>,
    /// apt only: after a change, `apt-get update` for this source alone. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<bool>,
}

/// An apt source, written as one deb822 stanza.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AptRepository {
    /// `URIs:`, e.g. https://download.docker.com/linux/debian
    pub uri: String,
    /// `Suites:`, e.g. bookworm; a suite ending in `/` is a flat repository (no components).
    pub suite: String,
    /// `Components:`, e.g. [main, contrib].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<String>,
    /// `Architectures:`, e.g. amd64; unset: the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// The signing key, ASCII-armoured; written to `KEYRING_DIR/NAME.asc` and named by
    /// `Signed-By:`. At most one of key and key_source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A key file on the operator's machine, relative to the state file; `compile` inlines it
    /// as `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_source: Option<String>,
}

/// A yum/dnf repository, written as one `[NAME]` section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct YumRepository {
    pub baseurl: String,
    /// The signing key: ASCII-armoured text (written to `KEYRING_DIR/RPM-GPG-KEY-NAME` and
    /// named as a file:// URL) or a URL, written as it is. At most one of gpgkey and
    /// key_source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpgkey: Option<String>,
    /// A key file on the operator's machine, relative to the state file; `compile` inlines it
    /// as `gpgkey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_source: Option<String>,
    /// Default true: packages must be signed (import the key another way, or give one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpgcheck: Option<bool>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// An archive (tar, compressed tar or zip) extracted into a directory once: its SHA-256 is
/// checked before anything is extracted, and a marker file (or `creates`) says it was done.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveResource {
    /// The directory extracted into. It must exist (or be made by an earlier resource) unless
    /// `mkdir` is set.
    pub path: String,
    /// An archive on the operator's machine, relative to the state file's directory; `compile`
    /// checks its SHA-256 and inlines it as `content_base64`, within the plan's budget. One of
    /// source (content_base64 once compiled) and url.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The archive's bytes, base64: what `compile` makes of `source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
    /// An http:// or https:// URL the agent downloads (certificates verified against the
    /// system's roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The archive's SHA-256, 64 hex digits. Required: a mismatch is an error that extracts
    /// nothing.
    pub sha256: String,
    /// A path whose existence means "already extracted"; default: the marker file
    /// `.svc-archive-<first 16 digits of sha256>` that a successful extraction leaves in `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creates: Option<String>,
    /// Create `path` (one level, mode 0755) when it is missing. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mkdir: Option<bool>,
    /// Keep the owners stored in the archive (tar --same-owner, unzip -X). Default false: the
    /// files belong to the agent's user, whatever uid the archive's author had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_owner: Option<bool>,
}

/// A git checkout at a branch, tag or commit, through the `git` program.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitResource {
    /// The checkout (its work tree); the parent must exist.
    pub path: String,
    /// What `origin` is: a URL (https://, ssh://, git://, file://), `user@host:path`, or an
    /// absolute path on the agent.
    pub repo: String,
    /// A branch or tag of the remote, or a commit (40 or 64 hex digits). Default: the remote's
    /// default branch (what its HEAD names). A branch is "at the remote tip now": every run
    /// asks the remote where it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rev: Option<String>,
    /// Fetch only this many commits of history (`--depth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// Discard local changes to tracked files (and repoint a different origin). Default false:
    /// they are an error. Untracked files are never removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
}

impl Resource {
    /// `kind:name` as outcomes report it: `file:/etc/motd`, `package:nginx`, `command:make`.
    pub fn label(&self) -> String {
        match self {
            Resource::File(file) => format!("file:{}", file.path),
            Resource::Directory(directory) => format!("directory:{}", directory.path),
            Resource::Symlink(symlink) => format!("symlink:{}", symlink.path),
            Resource::Package(package) => format!("package:{}", package.name),
            Resource::Service(service) => format!("service:{}", service.name),
            Resource::Command(command) => format!("command:{}", command.run),
            Resource::Tree(tree) => format!("tree:{}", tree.path),
            Resource::User(user) => format!("user:{}", user.name),
            Resource::Group(group) => format!("group:{}", group.name),
            Resource::Cron(cron) => format!("cron:{}", cron.name),
            Resource::Sysctl(sysctl) => format!("sysctl:{}", sysctl.name),
            Resource::Line(line) => format!("line:{}", line.path),
            Resource::Pkgrepo(repo) => format!("pkgrepo:{}", repo.name),
            Resource::Archive(archive) => format!("archive:{}", archive.path),
            Resource::Git(git) => format!("git:{}", git.path),
        }
    }
}

/// A state file that does not compile; `line` (1-based) points into the file when known.
#[derive(Clone, Debug, PartialEq)]
pub struct CompileError {
    pub line: Option<usize>,
    pub message: String,
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Check reports what would change; Apply changes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Check,
    Apply,
}

/// What one resource did (or would do, in check mode).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// `kind:name`, e.g. `file:/etc/motd`, `package:nginx`, `command:make install`.
    pub resource: String,
    /// Apply: it was changed. Check: it would be changed.
    pub changed: bool,
    /// What differs or what was done, for people: "mode 0600 -> 0644".
    pub detail: String,
    /// The resource failed; later resources still run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Check mode with diffs asked for: a unified diff of a file's content (secret values
    /// redacted; a binary file is a one-line summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

/// What a host reports of one state plan or module run (`svc.agent.<id>.result`): each
/// resource's outcome, and for a module run what the function returned and logged.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StateOutcome {
    pub outcomes: Vec<Outcome>,
    pub timed_out: bool,
    /// A module run: the resources the function returned (what was checked or applied).
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "resources_from_json"
    )]
    pub resources: Vec<Resource>,
    /// A module run: the lines it logged.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<String>,
    /// The plan could not run at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What `run` needs besides the plan.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// This host's facts, as templates see them (`{{ facts.os_family }}`): a JSON object.
    pub facts: serde_json::Value,
    /// Check mode: put a unified diff of each file that would change in its outcome.
    pub diff: bool,
}

/// A template parameter given on the command line: `--set NAME=VALUE` (or `--set-secret`,
/// whose value the agent redacts from diffs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub name: String,
    pub value: String,
    pub secret: bool,
}

/// Parses and validates a state file and inlines `source:` and `template:` files (relative to
/// `base_dir`); resources are sorted so each comes after what it requires. An empty file (or
/// one with only comments) is an empty plan.
pub fn compile(yaml: &str, base_dir: &Path) -> Result<Plan, CompileError> {
    compile::compile(yaml, base_dir, &[])
}

/// [`compile`] with template parameters from the command line, on top of the file's `vars:`.
pub fn compile_with(
    yaml: &str,
    base_dir: &Path,
    settings: &[Setting],
) -> Result<Plan, CompileError> {
    compile::compile(yaml, base_dir, settings)
}

/// Checks a plan that arrived over the wire (already compiled): every value valid, no
/// `source:` left. The server calls this before dispatching to agents.
pub fn validate(plan: &Plan) -> Result<(), String> {
    validate::validate(plan)
}

/// Runs a plan on this host, in order; blocking (the agent calls it from spawn_blocking).
/// One outcome per resource: a failing resource gets `error` and the next ones still run, so
/// one bad resource does not hide what the rest of the plan does. A resource that `require`s
/// a failed one is not run and says so; one with `onchanges` runs only when a trigger changed.
pub fn run(plan: &Plan, mode: Mode, options: &RunOptions) -> Vec<Outcome> {
    providers::run_plan(plan, mode, options)
}
