//! Declarative state (contract §10): the resource model, the compiler that turns a state file
//! into a plan, and the providers that check and apply a plan on this host.
//!
//! Used by three parties: `svcctl state compile|check|apply` compiles a file on the operator's
//! machine (resolving `source:` there), the server validates the compiled plan again and sends
//! it to agents over the bus, and `svc-agent` runs it here with `run`.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// A compiled state: resources in the order they are applied. Serialized as JSON on the bus.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub resources: Vec<Resource>,
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
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileResource {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A file on the operator's machine; `compile` inlines it as `content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Octal, as text: "0644".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectoryResource {
    pub path: String,
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
    pub target: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackageResource {
    pub name: String,
    /// installed (default) | absent
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceResource {
    pub name: String,
    /// running | stopped
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
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
}

/// Parses and validates a state file and inlines `source:` files (relative to `base_dir`).
pub fn compile(yaml: &str, base_dir: &Path) -> Result<Plan, CompileError> {
    let _ = (yaml, base_dir);
    Err(CompileError {
        line: None,
        message: "state compile: not implemented yet".into(),
    })
}

/// Checks a plan that arrived over the wire (already compiled): every value valid, no
/// `source:` left. The server calls this before dispatching to agents.
pub fn validate(plan: &Plan) -> Result<(), String> {
    let _ = plan;
    Err("state validate: not implemented yet".into())
}

/// Runs a plan on this host, in order; blocking (the agent calls it from spawn_blocking).
pub fn run(plan: &Plan, mode: Mode) -> Vec<Outcome> {
    let _ = mode;
    plan.resources
        .iter()
        .map(|_| Outcome {
            error: Some("not implemented yet".into()),
            ..Outcome::default()
        })
        .collect()
}
