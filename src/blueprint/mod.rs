//! Blueprints: a named, versioned, parameterised set of state files (docs/blueprints.md).
//!
//! Owns the model (`blueprint.yaml`), loading a blueprint from a directory or a bundle,
//! parameters (types, defaults, required, secret), rendering to one compiled
//! [`Plan`](crate::state::Plan) through minijinja with strict undefined, and lint. Does no
//! networking and knows nothing of the server: the catalogue (`catalogue.rs`) stores bundles
//! and applies rendered plans through the fleet's state path.
//!
//! Layout of a blueprint directory:
//!
//! ```text
//! blueprint.yaml      name, version, description, parameters, targets, requires
//! states/*.yaml       state files (contract §10), templates; applied in file-name order
//! templates/...       files rendered with the parameters, for `source: templates/...`
//! files/...           files used as they are, for `source: files/...`
//! ```

pub mod bundle;
pub mod catalogue;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::state::{Plan, Resource};
use crate::version;
use crate::{Error, Result};

pub const MANIFEST_FILE: &str = "blueprint.yaml";
/// Caps what a blueprint may hold, so a bundle always fits one gRPC message (the state
/// compiler caps a plan's inlined content on its own).
pub const MAX_TOTAL_BYTES: usize = 1024 * 1024;
const MAX_FILES: usize = 512;

/// `blueprint.yaml`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    /// Semantic version: MAJOR.MINOR.PATCH.
    pub version: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub parameters: BTreeMap<String, Parameter>,
    /// The selector `apply` uses when no --target is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<Requirement>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParameterType {
    #[default]
    String,
    Int,
    Bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parameter {
    #[serde(default, rename = "type")]
    pub kind: ParameterType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<serde_json::Value>,
    /// Required parameters have no default; a parameter without a default is required.
    #[serde(default)]
    pub required: bool,
    /// Its value is redacted in apply records, audit rows and `applied`.
    #[serde(default)]
    pub secret: bool,
    #[serde(default)]
    pub description: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    pub name: String,
    /// A range: `>=1.0.0, <2.0.0`, `^1.2`, `=1.2.3`, `*`.
    #[serde(default = "any_version")]
    pub version: String,
}

impl Parameter {
    /// Whether apply demands a value: it has no default (`resolve` reports it missing
    /// otherwise), whether or not the manifest says `required: true`.
    pub fn is_required(&self) -> bool {
        self.default.is_none()
    }
}

fn any_version() -> String {
    "*".into()
}

/// A blueprint in memory: its manifest and every file by relative path (`/`-separated).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Blueprint {
    pub manifest: Manifest,
    pub files: BTreeMap<String, Vec<u8>>,
}

/// The values a render uses, by parameter name.
pub type Values = BTreeMap<String, serde_json::Value>;

/// A lint finding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    pub file: String,
    pub resource: String,
    pub message: String,
}

/// Why parameters could not be resolved: missing required ones are a usage error at the CLI.
#[derive(Clone, Debug, PartialEq)]
pub enum ParameterError {
    Missing(Vec<String>),
    Bad(String),
}

impl std::fmt::Display for ParameterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParameterError::Missing(names) => {
                let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
                write!(
                    f,
                    "missing required parameter{} {} (give --set NAME=VALUE)",
                    if names.len() == 1 { "" } else { "s" },
                    quoted.join(", ")
                )
            }
            ParameterError::Bad(message) => f.write_str(message),
        }
    }
}

impl From<ParameterError> for Error {
    fn from(error: ParameterError) -> Self {
        Error::Invalid(error.to_string())
    }
}

impl Manifest {
    /// Parses and checks `blueprint.yaml`.
    pub fn parse(text: &str) -> Result<Manifest> {
        let manifest: Manifest = serde_yaml_ng::from_str(text)
            .map_err(|e| Error::Invalid(format!("{MANIFEST_FILE}: {e}")))?;
        manifest.check()?;
        Ok(manifest)
    }

    fn check(&self) -> Result<()> {
        check_name(&self.name).map_err(|e| Error::Invalid(format!("{MANIFEST_FILE}: {e}")))?;
        version::Version::parse(&self.version)
            .map_err(|e| Error::Invalid(format!("{MANIFEST_FILE}: version: {e}")))?;
        for (name, parameter) in &self.parameters {
            check_parameter_name(name)
                .map_err(|e| Error::Invalid(format!("{MANIFEST_FILE}: {e}")))?;
            if let Some(default) = &parameter.default {
                typed(parameter.kind, default).map_err(|e| {
                    Error::Invalid(format!("{MANIFEST_FILE}: parameter '{name}': default {e}"))
                })?;
                if parameter.required {
                    return Err(Error::Invalid(format!(
                        "{MANIFEST_FILE}: parameter '{name}' is required and has a default; choose one"
                    )));
                }
            }
        }
        if let Some(targets) = &self.targets {
            crate::fleet::Selector::parse(targets)
                .map_err(|e| Error::Invalid(format!("{MANIFEST_FILE}: targets: {e}")))?;
        }
        for requirement in &self.requires {
            check_name(&requirement.name)
                .map_err(|e| Error::Invalid(format!("{MANIFEST_FILE}: requires: {e}")))?;
            version::Range::parse(&requirement.version).map_err(|e| {
                Error::Invalid(format!(
                    "{MANIFEST_FILE}: requires {}: {e}",
                    requirement.name
                ))
            })?;
        }
        Ok(())
    }

    /// The parameters given as `k=v` strings, typed and with defaults filled in.
    pub fn resolve(
        &self,
        given: &BTreeMap<String, String>,
    ) -> std::result::Result<Values, ParameterError> {
        let mut values = Values::new();
        for name in given.keys() {
            if !self.parameters.contains_key(name) {
                let known: Vec<&str> = self.parameters.keys().map(String::as_str).collect();
                return Err(ParameterError::Bad(format!(
                    "unknown parameter '{name}' (this blueprint has: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            }
        }
        let mut missing = Vec::new();
        for (name, parameter) in &self.parameters {
            let value = match (given.get(name), &parameter.default) {
                (Some(text), _) => parse_value(parameter.kind, text)
                    .map_err(|e| ParameterError::Bad(format!("parameter '{name}': {e}")))?,
                (None, Some(default)) => default.clone(),
                (None, None) => {
                    missing.push(name.clone());
                    continue;
                }
            };
            values.insert(name.clone(), value);
        }
        if !missing.is_empty() {
            return Err(ParameterError::Missing(missing));
        }
        Ok(values)
    }

    /// `values` with the secret parameters' values replaced, for records and audit.
    pub fn redact(&self, values: &Values) -> Values {
        values
            .iter()
            .map(|(name, value)| {
                let secret = self.parameters.get(name).is_some_and(|p| p.secret);
                let shown = if secret {
                    serde_json::Value::String("[REDACTED]".into())
                } else {
                    value.clone()
                };
                (name.clone(), shown)
            })
            .collect()
    }

    /// Values for validate and lint: defaults, and a stand-in for each required parameter
    /// not given (`string_stand_in`, 0, false).
    pub fn sample_values(
        &self,
        given: &BTreeMap<String, String>,
        string_stand_in: &str,
    ) -> Result<Values> {
        let mut filled = given.clone();
        for (name, parameter) in &self.parameters {
            if parameter.default.is_none() && !filled.contains_key(name) {
                let sample = match parameter.kind {
                    ParameterType::String => string_stand_in,
                    ParameterType::Int => "0",
                    ParameterType::Bool => "false",
                };
                filled.insert(name.clone(), sample.to_string());
            }
        }
        Ok(self.resolve(&filled)?)
    }
}

/// A render with stand-ins: the values used, the whole plan, and each state file's plan.
pub struct Sample {
    pub values: Values,
    pub plan: Plan,
    pub each: Vec<(String, Plan)>,
}

/// String stand-ins for required parameters validate and lint are not given: a plain word
/// first (names inside paths), then an absolute path (parameters that are a path's root).
pub const STAND_INS: [&str; 2] = ["example", "/example"];

impl Blueprint {
    /// Renders with `given` and stand-ins for the missing required parameters (each of
    /// [`STAND_INS`] in turn, the first that renders wins); the values used come back too.
    pub fn render_sample(&self, given: &BTreeMap<String, String>) -> Result<Sample> {
        let mut first_error = None;
        for stand_in in STAND_INS {
            let values = self.manifest.sample_values(given, stand_in)?;
            match self.render(&values) {
                Ok((plan, each)) => return Ok(Sample { values, plan, each }),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(first_error.expect("at least one stand-in was tried"))
    }
}

fn check_name(name: &str) -> std::result::Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name '{name}' must be 1-64 of a-z, 0-9, '-', '_', starting with a letter or digit"
        ))
    }
}

fn check_parameter_name(name: &str) -> std::result::Result<(), String> {
    let ok = !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "parameter name '{name}' must be letters, digits and '_', not starting with a digit"
        ))
    }
}

/// Checks a YAML/JSON value against a parameter type.
fn typed(kind: ParameterType, value: &serde_json::Value) -> std::result::Result<(), String> {
    let ok = match kind {
        ParameterType::String => value.is_string(),
        ParameterType::Int => value.is_i64(),
        ParameterType::Bool => value.is_boolean(),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{value} is not a {kind:?}").to_lowercase())
    }
}

/// A `--set` value as its parameter's type.
pub fn parse_value(
    kind: ParameterType,
    text: &str,
) -> std::result::Result<serde_json::Value, String> {
    match kind {
        ParameterType::String => Ok(serde_json::Value::String(text.to_string())),
        ParameterType::Int => text
            .parse::<i64>()
            .map(serde_json::Value::from)
            .map_err(|_| format!("'{text}' is not an int")),
        ParameterType::Bool => match text {
            "true" | "yes" | "1" => Ok(true.into()),
            "false" | "no" | "0" => Ok(false.into()),
            _ => Err(format!("'{text}' is not a bool (true or false)")),
        },
    }
}

/// `k=v` strings (from `--set`) as a map; a later one wins.
pub fn parse_sets(sets: &[String]) -> Result<BTreeMap<String, String>> {
    let mut given = BTreeMap::new();
    for set in sets {
        let Some((key, value)) = set.split_once('=') else {
            return Err(Error::Invalid(format!("--set '{set}' is not NAME=VALUE")));
        };
        given.insert(key.trim().to_string(), value.to_string());
    }
    Ok(given)
}

/// A relative path inside a blueprint: no `..`, not absolute, `/`-separated, UTF-8.
pub fn check_relative(path: &str) -> Result<()> {
    crate::modules::check_relative_inside(path, "blueprint")
}

impl Blueprint {
    /// Reads a blueprint directory (regular files only; symlinks and hidden files are skipped).
    pub fn load_dir(dir: &Path) -> Result<Blueprint> {
        let mut files = BTreeMap::new();
        let mut total = 0usize;
        read_tree(dir, "", &mut files, &mut total)?;
        Blueprint::from_files(files)
    }

    /// A blueprint from its files (checked: manifest present and valid, paths, sizes).
    pub fn from_files(files: BTreeMap<String, Vec<u8>>) -> Result<Blueprint> {
        if files.len() > MAX_FILES {
            return Err(Error::Invalid(format!(
                "a blueprint holds at most {MAX_FILES} files"
            )));
        }
        let total: usize = files.values().map(Vec::len).sum();
        if total > MAX_TOTAL_BYTES {
            return Err(Error::Invalid(format!(
                "a blueprint holds at most {MAX_TOTAL_BYTES} bytes, this one {total}"
            )));
        }
        for path in files.keys() {
            check_relative(path)?;
        }
        let Some(text) = files.get(MANIFEST_FILE) else {
            return Err(Error::Invalid(format!("no {MANIFEST_FILE}")));
        };
        let text = std::str::from_utf8(text)
            .map_err(|_| Error::Invalid(format!("{MANIFEST_FILE} is not UTF-8")))?;
        let manifest = Manifest::parse(text)?;
        Ok(Blueprint { manifest, files })
    }

    /// The state files, in the order they are applied.
    pub fn state_files(&self) -> Vec<&str> {
        self.files
            .keys()
            .filter(|p| {
                p.starts_with("states/")
                    && (p.ends_with(".yaml") || p.ends_with(".yml"))
                    && !p["states/".len()..].contains('/')
            })
            .map(String::as_str)
            .collect()
    }

    /// Parses every template (state files and `templates/`) without rendering: what install
    /// checks, since the values only come with apply.
    pub fn check_templates(&self) -> Result<()> {
        let states = self.state_files();
        if states.is_empty() {
            return Err(Error::Invalid(
                "no state files (states/*.yaml) in the blueprint".into(),
            ));
        }
        let env = crate::template::environment();
        for (path, bytes) in &self.files {
            if path.starts_with("templates/") || states.contains(&path.as_str()) {
                let text = std::str::from_utf8(bytes)
                    .map_err(|_| Error::Invalid(format!("{path}: a template must be UTF-8")))?;
                crate::template::check_syntax(&env, path, text).map_err(Error::Invalid)?;
            }
        }
        Ok(())
    }

    /// Renders every state file (and `templates/`) with `values` and compiles them, in order,
    /// into one plan. Each file's plan is returned too, for lint.
    pub fn render(&self, values: &Values) -> Result<(Plan, Vec<(String, Plan)>)> {
        let states = self.state_files();
        if states.is_empty() {
            return Err(Error::Invalid(
                "no state files (states/*.yaml) in the blueprint".into(),
            ));
        }
        let env = crate::template::environment();
        let context = minijinja::Value::from_serialize(values);
        // compile() reads `source:` from disk, so the rendered tree goes to a private
        // temporary directory that is removed when this returns.
        let scratch = Scratch::new()?;
        for (path, bytes) in &self.files {
            let rendered = if path.starts_with("templates/") || states.contains(&path.as_str()) {
                let text = std::str::from_utf8(bytes)
                    .map_err(|_| Error::Invalid(format!("{path}: a template must be UTF-8")))?;
                render_text(&env, path, text, &context)?.into_bytes()
            } else {
                bytes.clone()
            };
            let target = scratch.path.join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Error::Internal(e.to_string()))?;
            }
            std::fs::write(&target, rendered).map_err(|e| Error::Internal(e.to_string()))?;
        }
        let mut whole = Plan::default();
        let mut each = Vec::new();
        for state in states {
            let text = std::fs::read_to_string(scratch.path.join(state))
                .map_err(|e| Error::Internal(e.to_string()))?;
            let plan = crate::state::compile(&text, &scratch.path)
                .map_err(|e| Error::Invalid(format!("{state}: {e}")))?;
            whole.append(plan.clone());
            each.push((state.to_string(), plan));
        }
        crate::state::validate(&whole).map_err(Error::Invalid)?;
        Ok((whole, each))
    }

    /// Risky patterns: world-writable modes, commands without a guard, packages that cannot
    /// be pinned, parameters no template uses, secrets with a default.
    pub fn lint(&self, given: &BTreeMap<String, String>) -> Result<Vec<Finding>> {
        let each = self.render_sample(given)?.each;
        let mut findings = Vec::new();
        for (file, plan) in &each {
            for resource in &plan.resources {
                let finding = |message: String| Finding {
                    file: file.clone(),
                    resource: resource.label(),
                    message,
                };
                match resource {
                    Resource::File(f) if world_writable(f.mode.as_deref()) => {
                        findings.push(finding(format!("world-writable mode {}", mode_text(&f.mode))))
                    }
                    Resource::Directory(d) if world_writable(d.mode.as_deref()) => {
                        findings.push(finding(format!("world-writable mode {}", mode_text(&d.mode))))
                    }
                    Resource::Command(c) if c.unless.is_none() && c.creates.is_none() => findings
                        .push(finding(
                            "command without unless or creates runs on every apply".into(),
                        )),
                    Resource::Package(p) if !p.name.contains('=') => findings.push(finding(
                        "package is not pinned to a version (the state engine installs whatever the repository has)"
                            .into(),
                    )),
                    _ => {}
                }
            }
        }
        let sources: String = self
            .files
            .iter()
            .filter(|(p, _)| p.starts_with("templates/") || p.starts_with("states/"))
            .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
            .collect();
        for (name, parameter) in &self.manifest.parameters {
            if !sources.contains(name.as_str()) {
                findings.push(Finding {
                    file: MANIFEST_FILE.into(),
                    resource: format!("parameter:{name}"),
                    message: "declared but not used by any template".into(),
                });
            }
            if parameter.secret && parameter.default.is_some() {
                findings.push(Finding {
                    file: MANIFEST_FILE.into(),
                    resource: format!("parameter:{name}"),
                    message: "a secret parameter with a default keeps the secret in the blueprint"
                        .into(),
                });
            }
        }
        Ok(findings)
    }
}

fn mode_text(mode: &Option<String>) -> String {
    mode.clone().unwrap_or_default()
}

fn world_writable(mode: Option<&str>) -> bool {
    mode.and_then(|m| u32::from_str_radix(m, 8).ok())
        .is_some_and(|m| m & 0o002 != 0)
}

fn render_text(
    env: &minijinja::Environment<'static>,
    path: &str,
    text: &str,
    context: &minijinja::Value,
) -> Result<String> {
    crate::template::render(env, path, text, context).map_err(Error::Invalid)
}

fn read_tree(
    dir: &Path,
    prefix: &str,
    files: &mut BTreeMap<String, Vec<u8>>,
    total: &mut usize,
) -> Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::Invalid(format!("cannot read {}: {e}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::Invalid(e.to_string()))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            return Err(Error::Invalid(format!(
                "{}: file names must be UTF-8",
                dir.display()
            )));
        };
        if name.starts_with('.') {
            continue;
        }
        let relative = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        };
        let kind = entry
            .file_type()
            .map_err(|e| Error::Invalid(e.to_string()))?;
        if kind.is_dir() {
            read_tree(&entry.path(), &relative, files, total)?;
        } else if kind.is_file() {
            let bytes = std::fs::read(entry.path())
                .map_err(|e| Error::Invalid(format!("cannot read {relative}: {e}")))?;
            *total += bytes.len();
            if *total > MAX_TOTAL_BYTES {
                return Err(Error::Invalid(format!(
                    "a blueprint holds at most {MAX_TOTAL_BYTES} bytes"
                )));
            }
            files.insert(relative, bytes);
        }
    }
    Ok(())
}

/// A private temporary directory, removed on drop.
struct Scratch {
    path: std::path::PathBuf,
}

impl Scratch {
    fn new() -> Result<Scratch> {
        let path = std::env::temp_dir().join(format!("svc-blueprint-{}", crate::ids::ulid()));
        let mut builder = std::fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(&path)
            .map_err(|e| Error::Internal(format!("cannot make {}: {e}", path.display())))?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The files `init NAME` writes: a small working example.
pub fn scaffold(name: &str) -> Result<Vec<(&'static str, String)>> {
    check_name(name).map_err(Error::Invalid)?;
    Ok(vec![
        (
            MANIFEST_FILE,
            format!(
                "name: {name}\nversion: 0.1.0\ndescription: \"{name}: what it sets up\"\n\
                 targets: \"*\"\nparameters:\n  greeting:\n    type: string\n    default: hello\n\
                 \x20   description: what motd says\n"
            ),
        ),
        (
            "states/main.yaml",
            "# State files are minijinja templates: {{ greeting }} is a parameter.\n\
             - file: {path: /etc/motd, source: templates/motd, mode: \"0644\"}\n"
                .to_string(),
        ),
        ("templates/motd", "{{ greeting }} from svc\n".to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blueprint(manifest: &str, files: &[(&str, &str)]) -> Result<Blueprint> {
        let mut map = BTreeMap::new();
        map.insert(MANIFEST_FILE.to_string(), manifest.as_bytes().to_vec());
        for (path, text) in files {
            map.insert(path.to_string(), text.as_bytes().to_vec());
        }
        Blueprint::from_files(map)
    }

    #[test]
    fn parameters_resolve_with_types_defaults_and_required() {
        let manifest = Manifest::parse(
            "name: web\nversion: 1.0.0\nparameters:\n  port: {type: int, default: 80}\n  \
             host: {type: string}\n  tls: {type: bool, default: false}\n",
        )
        .unwrap();
        let given = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            manifest.resolve(&given(&[])),
            Err(ParameterError::Missing(vec!["host".into()]))
        );
        let values = manifest
            .resolve(&given(&[("host", "a"), ("port", "8080")]))
            .unwrap();
        assert_eq!(values["port"], 8080);
        assert_eq!(values["tls"], false);
        assert!(matches!(
            manifest.resolve(&given(&[("host", "a"), ("port", "x")])),
            Err(ParameterError::Bad(_))
        ));
        assert!(matches!(
            manifest.resolve(&given(&[("host", "a"), ("nope", "1")])),
            Err(ParameterError::Bad(_))
        ));
    }

    #[test]
    fn manifest_errors() {
        let cases = [
            "name: Web\nversion: 1.0.0\n",
            "name: web\nversion: one\n",
            "name: web\nversion: 1.0.0\nparameters:\n  p: {type: int, default: x}\n",
            "name: web\nversion: 1.0.0\nextra: 1\n",
            "name: web\nversion: 1.0.0\nrequires: [{name: base, version: \"~~1\"}]\n",
        ];
        for case in cases {
            assert!(Manifest::parse(case).is_err(), "{case}");
        }
    }

    #[test]
    fn render_is_strict_and_lint_finds_risks() {
        let bp = blueprint(
            "name: web\nversion: 1.0.0\nparameters:\n  dir: {type: string, default: /tmp/x}\n  \
             unused: {type: int, default: 1}\n",
            &[
                (
                    "states/a.yaml",
                    "- file: {path: \"{{ dir }}/a\", source: templates/a, mode: \"0666\"}\n\
                     - command: {run: \"true\"}\n- package: {name: nginx}\n",
                ),
                ("templates/a", "dir={{ dir }}\n"),
            ],
        )
        .unwrap();
        let values = bp.manifest.resolve(&BTreeMap::new()).unwrap();
        let (plan, _) = bp.render(&values).unwrap();
        assert_eq!(bp.render_sample(&BTreeMap::new()).unwrap().plan, plan);
        match &plan.resources[0] {
            Resource::File(f) => {
                assert_eq!(f.path, "/tmp/x/a");
                assert_eq!(f.content.as_deref(), Some("dir=/tmp/x\n"));
            }
            other => panic!("{other:?}"),
        }
        let findings = bp.lint(&BTreeMap::new()).unwrap();
        let messages: Vec<&str> = findings.iter().map(|f| f.resource.as_str()).collect();
        assert_eq!(
            messages,
            [
                "file:/tmp/x/a",
                "command:true",
                "package:nginx",
                "parameter:unused"
            ]
        );
        let strict = blueprint(
            "name: web\nversion: 1.0.0\n",
            &[("states/a.yaml", "- file: {path: \"{{ nope }}\"}\n")],
        )
        .unwrap();
        let error = strict.render(&Values::new()).unwrap_err().to_string();
        assert!(error.contains("undefined"), "{error}");
    }

    #[test]
    fn paths_must_stay_inside() {
        for bad in ["../x", "/etc/x", "a/../b", ""] {
            assert!(check_relative(bad).is_err(), "{bad}");
        }
        assert!(check_relative("states/a.yaml").is_ok());
    }
}
