//! Modules (docs/modules.md): a directory with `module.yaml`, Starlark sources, tests
//! (`*_test.star`) and data files, built into a reproducible ZIP, signed, published to a
//! registry, installed, and run in a sandbox that returns state resources (contract §10).
//!
//! Code map: this file owns the manifest (`module.yaml`), the in-memory module (its files,
//! from a directory or a ZIP) and validation; the archive format is `crate::zip`. `sandbox.rs`
//! runs Starlark with svc's builtins and the step and memory limits, `sign.rs` is ed25519
//! signing, `store.rs` the installed modules, `module.lock` and dependency resolution, and
//! `registry.rs` the registry's HTTP server and its client, `bundle.rs` a module sent to agents
//! (`run --target`) and run there.

use std::collections::BTreeMap;
use std::path::{Component, Path};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::version::{Range, Version};
use crate::zip;
use crate::{Error, Result};

pub mod bundle;
pub mod registry;
pub mod sandbox;
pub mod sign;
pub mod store;

pub const MANIFEST: &str = "module.yaml";
pub const LOCK: &str = "module.lock";
/// The file whose top-level functions are the exports.
pub const MAIN: &str = "main.star";
/// Where `build` writes and what `clean` removes; never part of the module.
pub const BUILD_DIR: &str = "build";
pub const MAX_TOTAL_BYTES: usize = 16 * 1024 * 1024;
const MAX_FILES: usize = 1000;

/// `module.yaml`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    /// MAJOR.MINOR.PATCH.
    pub version: String,
    #[serde(default)]
    pub description: String,
    /// Module name → version range (`^1.2`, `>=1.0.0, <2.0.0`, `=1.2.3`, `*`).
    #[serde(default)]
    pub dependencies: BTreeMap<String, String>,
    /// Function name (a top-level `def` in main.star) → its parameters.
    #[serde(default)]
    pub exports: BTreeMap<String, Export>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Export {
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub parameters: BTreeMap<String, Parameter>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parameter {
    #[serde(rename = "type")]
    pub kind: ParamType,
    /// Used when the caller gives none; a parameter without a default is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<serde_json::Value>,
    #[serde(default)]
    pub description: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamType {
    String,
    Int,
    Bool,
    /// A list of strings (`--arg k=a,b,c`).
    List,
}

impl ParamType {
    fn name(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Int => "int",
            ParamType::Bool => "bool",
            ParamType::List => "list",
        }
    }

    /// Whether a JSON value has this type.
    fn accepts(self, value: &serde_json::Value) -> bool {
        match self {
            ParamType::String => value.is_string(),
            ParamType::Int => value.is_i64(),
            ParamType::Bool => value.is_boolean(),
            ParamType::List => value
                .as_array()
                .is_some_and(|items| items.iter().all(|i| i.is_string())),
        }
    }

    /// A command-line value (`--arg k=v`) as this type.
    fn parse(self, text: &str) -> std::result::Result<serde_json::Value, String> {
        match self {
            ParamType::String => Ok(text.into()),
            ParamType::Int => text
                .parse::<i64>()
                .map(Into::into)
                .map_err(|_| format!("'{text}' is not an int")),
            ParamType::Bool => match text {
                "true" => Ok(true.into()),
                "false" => Ok(false.into()),
                _ => Err(format!("'{text}' is not a bool (true or false)")),
            },
            ParamType::List if text.is_empty() => Ok(serde_json::json!([])),
            ParamType::List => Ok(text.split(',').collect::<Vec<_>>().into()),
        }
    }
}

/// A module in memory: its manifest and every file (relative '/' paths, sorted), whether it
/// came from a directory or a ZIP. Files are shared, so a loaded module is cheap to clone.
#[derive(Clone, Debug)]
pub struct Module {
    pub manifest: Manifest,
    pub files: Arc<BTreeMap<String, Vec<u8>>>,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && name.as_bytes()[0].is_ascii_lowercase();
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{what} '{name}' must be 1-64 of a-z, 0-9, '_', starting with a letter"
        )))
    }
}

/// A module's path must stay inside it: plain relative components, no backslashes.
pub fn check_relative(path: &str) -> Result<()> {
    check_relative_inside(path, "module")
}

/// `path` as a plain relative path (normal components only, no backslashes) inside an
/// archive of `what` (a blueprint, a module); `what` names it in the error.
pub fn check_relative_inside(path: &str, what: &str) -> Result<()> {
    let fine = !path.is_empty()
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
        && !path.contains('\\');
    if fine {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "'{path}' is not a plain relative path inside the {what}"
        )))
    }
}

impl Manifest {
    pub fn parse(yaml: &str) -> Result<Manifest> {
        let de = serde_yaml_ng::Deserializer::from_str(yaml);
        let manifest: Manifest = serde_path_to_error::deserialize(de)
            .map_err(|e| Error::Invalid(format!("{MANIFEST}: {e}")))?;
        manifest.check()?;
        Ok(manifest)
    }

    /// The schema rules serde cannot say: names, versions, ranges, parameter types.
    pub fn check(&self) -> Result<()> {
        // Module names use '_' not '-' so that they read as Starlark identifiers in load().
        check_name("module name", &self.name)?;
        Version::parse(&self.version)
            .map_err(|e| Error::Invalid(format!("{MANIFEST}: version: {e}")))?;
        for (name, range) in &self.dependencies {
            check_name("dependency", name)?;
            if name == &self.name {
                return Err(Error::Invalid(format!(
                    "{MANIFEST}: a module cannot depend on itself"
                )));
            }
            Range::parse(range)
                .map_err(|e| Error::Invalid(format!("{MANIFEST}: dependency {name}: {e}")))?;
        }
        for (function, export) in &self.exports {
            check_name("exported function", function)?;
            for (param, spec) in &export.parameters {
                check_name("parameter", param)?;
                if let Some(default) = &spec.default {
                    if !spec.kind.accepts(default) {
                        return Err(Error::Invalid(format!(
                            "{MANIFEST}: {function}({param}): default {default} is not a {}",
                            spec.kind.name()
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn version(&self) -> Version {
        Version::parse(&self.version).expect("checked when parsed")
    }

    /// The arguments of a call of `function`: `--arg k=v` pairs parsed by the declared types,
    /// defaults filled in, unknown and missing parameters refused.
    pub fn arguments(
        &self,
        function: &str,
        given: &[(String, String)],
    ) -> Result<BTreeMap<String, serde_json::Value>> {
        let export = self.exports.get(function).ok_or_else(|| {
            Error::NotFound(format!(
                "module {} exports no function '{function}' (exports: {})",
                self.name,
                self.exports.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let mut out = BTreeMap::new();
        for (key, text) in given {
            let spec = export
                .parameters
                .get(key)
                .ok_or_else(|| Error::Invalid(format!("{function} has no parameter '{key}'")))?;
            let value = spec
                .kind
                .parse(text)
                .map_err(|e| Error::Invalid(format!("{function}({key}): {e}")))?;
            out.insert(key.clone(), value);
        }
        for (key, spec) in &export.parameters {
            if !out.contains_key(key) {
                match &spec.default {
                    Some(default) => {
                        out.insert(key.clone(), default.clone());
                    }
                    None => {
                        let kind = spec.kind.name();
                        let hint = format!("give --arg {key}=VALUE");
                        return Err(Error::Invalid(format!(
                            "{function}: parameter '{key}' ({kind}) is required: {hint}"
                        )));
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Splits `k=v` arguments.
pub fn parse_args(args: &[String]) -> Result<Vec<(String, String)>> {
    args.iter()
        .map(|arg| match arg.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(Error::Invalid(format!("--arg '{arg}' is not KEY=VALUE"))),
        })
        .collect()
}

impl Module {
    /// A module from its files; the manifest and paths are checked.
    pub fn from_files(files: BTreeMap<String, Vec<u8>>) -> Result<Module> {
        if files.len() > MAX_FILES {
            return Err(Error::TooLarge(format!("more than {MAX_FILES} files")));
        }
        let total: usize = files.values().map(Vec::len).sum();
        if total > MAX_TOTAL_BYTES {
            return Err(Error::TooLarge(format!(
                "{total} bytes of files (at most {MAX_TOTAL_BYTES})"
            )));
        }
        for path in files.keys() {
            check_relative(path)?;
        }
        let yaml = files
            .get(MANIFEST)
            .ok_or_else(|| Error::Invalid(format!("no {MANIFEST}")))?;
        let yaml = std::str::from_utf8(yaml)
            .map_err(|_| Error::Invalid(format!("{MANIFEST} is not UTF-8")))?;
        let manifest = Manifest::parse(yaml)?;
        Ok(Module {
            manifest,
            files: Arc::new(files),
        })
    }

    /// Reads a module directory: regular files only, hidden files and `build/` skipped,
    /// symlinks refused (a module's content is what is in it, never what a link points at).
    pub fn load_dir(dir: &Path) -> Result<Module> {
        let mut files = BTreeMap::new();
        walk(dir, dir, &mut files)?;
        Module::from_files(files)
    }

    /// A module from its ZIP (CRCs and paths checked; duplicate entries refused).
    pub fn from_zip(bytes: &[u8]) -> Result<Module> {
        let mut files = BTreeMap::new();
        for (name, data) in zip::read(bytes)? {
            if files.insert(name.clone(), data).is_some() {
                return Err(Error::Invalid(format!(
                    "'{name}' appears twice in the archive"
                )));
            }
        }
        Module::from_files(files)
    }

    /// From a directory or a .zip file.
    pub fn load(path: &Path) -> Result<Module> {
        if path.is_dir() {
            return Module::load_dir(path);
        }
        let bytes = std::fs::read(path)
            .map_err(|e| Error::NotFound(format!("cannot read {}: {e}", path.display())))?;
        Module::from_zip(&bytes)
    }

    /// The reproducible ZIP: entries sorted by path (the map's order), fixed timestamps.
    pub fn to_zip(&self) -> Result<Vec<u8>> {
        zip::write(self.files.iter().map(|(p, d)| (p.as_str(), d.as_slice())))
    }

    /// A file as text.
    pub fn text(&self, path: &str) -> Result<&str> {
        let bytes = self
            .files
            .get(path)
            .ok_or_else(|| Error::NotFound(format!("{}: no file {path}", self.manifest.name)))?;
        std::str::from_utf8(bytes).map_err(|_| Error::Invalid(format!("{path} is not UTF-8")))
    }

    /// `*.star` files that are not tests.
    pub fn sources(&self) -> impl Iterator<Item = &str> {
        self.files
            .keys()
            .map(String::as_str)
            .filter(|p| p.ends_with(".star") && !p.ends_with("_test.star"))
    }

    pub fn tests(&self) -> impl Iterator<Item = &str> {
        self.files
            .keys()
            .map(String::as_str)
            .filter(|p| p.ends_with("_test.star"))
    }

    pub fn lock(&self) -> Result<Option<store::Lock>> {
        match self.files.get(LOCK) {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(bytes)
                .map(Some)
                .map_err(|e| Error::Invalid(format!("{LOCK}: {e}"))),
        }
    }

    /// `NAME-VERSION`.
    pub fn id(&self) -> String {
        format!("{}-{}", self.manifest.name, self.manifest.version)
    }
}

fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) -> Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::NotFound(format!("cannot read {}: {e}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::Internal(e.to_string()))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let relative = path
            .strip_prefix(root)
            .map_err(|e| Error::Internal(e.to_string()))?
            .to_string_lossy()
            .replace(std::path::MAIN_SEPARATOR, "/");
        if dir == root && name == BUILD_DIR {
            continue;
        }
        let kind = entry
            .file_type()
            .map_err(|e| Error::Internal(e.to_string()))?;
        if kind.is_symlink() {
            return Err(Error::Invalid(format!(
                "{relative} is a symlink; a module holds regular files only"
            )));
        } else if kind.is_dir() {
            walk(root, &path, files)?;
        } else if kind.is_file() {
            let bytes = std::fs::read(&path)
                .map_err(|e| Error::Internal(format!("cannot read {}: {e}", path.display())))?;
            files.insert(relative, bytes);
        }
    }
    Ok(())
}

/// The files of a new module NAME (`svc-module init`).
pub fn scaffold(name: &str) -> Result<BTreeMap<&'static str, String>> {
    check_name("module name", name)?;
    let mut files = BTreeMap::new();
    files.insert(
        MANIFEST,
        format!(
            "name: {name}\nversion: 0.1.0\ndescription: What this module sets up.\n\
             # Other modules this one loads, with version ranges: base: \"^1.0\"\n\
             dependencies: {{}}\n\
             exports:\n  setup:\n    description: Write the message of the day.\n    parameters:\n      \
             message: {{type: string, default: \"managed by svc\"}}\n"
        ),
    );
    files.insert(
        MAIN,
        "# Exported functions return state resources (docs/modules.md); they cannot touch the\n\
         # host themselves.\n\
         def setup(message):\n    \
         log(\"motd for\", facts()[\"hostname\"])\n    \
         return [file(\"/etc/motd\", content = message + \"\\n\", mode = \"0644\")]\n"
            .to_string(),
    );
    files.insert(
        "main_test.star",
        "load(\"main.star\", \"setup\")\n\n\
         def test_setup_writes_motd():\n    \
         resources = setup(message = \"hi\")\n    \
         assert_eq(len(resources), 1)\n    \
         assert_eq(resources[0][\"file\"][\"content\"], \"hi\\n\")\n"
            .to_string(),
    );
    Ok(files)
}

/// Checks a module completely: manifest, every source parses, main.star exists and defines
/// each exported function with the declared parameters.
pub fn validate(module: &Module, deps: &BTreeMap<String, Module>) -> Result<()> {
    sandbox::check(module, deps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_rules() {
        let ok = "name: web\nversion: 1.2.3\ndependencies: {base: \"^1.0\"}\nexports:\n  site:\n    parameters:\n      port: {type: int, default: 80}\n";
        let m = Manifest::parse(ok).unwrap();
        let args = m.arguments("site", &[]).unwrap();
        assert_eq!(args["port"], 80);
        assert!(m.arguments("site", &[("port".into(), "x".into())]).is_err());
        assert!(Manifest::parse("name: Web\nversion: 1.0.0\n").is_err());
        assert!(Manifest::parse("name: web\nversion: 1.0\n").is_err());
        assert!(Manifest::parse("name: web\nversion: 1.0.0\nextra: 1\n").is_err());
        assert!(Manifest::parse("name: web\nversion: 1.0.0\ndependencies: {b: \"~x\"}\n").is_err());
    }
}
