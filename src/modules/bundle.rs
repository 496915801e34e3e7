//! A module on its way to agents (`svc-module run --target`): the ZIP with its dependencies,
//! packed by the server into the signed command, and opened and run by the agent.
//!
//! Two signatures protect it, for two different questions. The server signs the whole
//! command (`crate::fleet::signature`): this run was asked for by someone allowed to, for this
//! agent, now. The module's author signs the ZIP (`sign.rs`): this code is code the agent's
//! operator trusts. The agent checks both; with `modules.require_signature: true` in its
//! configuration, an unsigned module, or one signed by a key not in `modules.trusted_keys`,
//! is refused even though the server sent it.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};

use super::sandbox::{self, Limits};
use super::{sha256_hex, Module};
use crate::config::TrustPolicy;
use crate::state::{self, Mode, Plan, StateOutcome};
use crate::{Error, Result};

/// A module ZIP as it travels to an agent: its bytes (base64), their SHA-256, the author's
/// detached signature (checked against the agent's `modules.trusted_keys`), and the
/// dependencies it loads, each in the same shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModuleBundle {
    pub zip_base64: String,
    pub sha256: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<ModuleBundle>,
}

/// A ZIP and its signature, as the client sends them.
pub struct Packed<'a> {
    pub zip: &'a [u8],
    pub signature: Option<&'a str>,
}

impl<'a> Packed<'a> {
    pub fn new(zip: &'a [u8], signature: Option<&'a str>) -> Packed<'a> {
        Packed { zip, signature }
    }
}

/// Packs a module and its dependencies for the wire (SHA-256 of each computed here).
pub fn pack(root: Packed, dependencies: &[Packed]) -> ModuleBundle {
    let one = |p: &Packed| ModuleBundle {
        zip_base64: base64::engine::general_purpose::STANDARD.encode(p.zip),
        sha256: sha256_hex(p.zip),
        signature: p
            .signature
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty()),
        dependencies: Vec::new(),
    };
    let mut bundle = one(&root);
    bundle.dependencies = dependencies.iter().map(one).collect();
    bundle
}

/// A bundle opened and checked: the module, its dependencies by name.
pub struct Opened {
    pub module: Module,
    pub dependencies: BTreeMap<String, Module>,
}

/// Decodes every ZIP of `bundle`, checks each against the SHA-256 it was sent with, then
/// opens them as [`open_packed`] does (the agent's side).
pub fn open(bundle: &ModuleBundle, policy: &TrustPolicy) -> Result<Opened> {
    let root = decode(bundle, "the module")?;
    let dependencies = bundle
        .dependencies
        .iter()
        .map(|dep| decode(dep, "a dependency"))
        .collect::<Result<Vec<_>>>()?;
    let packed: Vec<Packed> = dependencies
        .iter()
        .zip(&bundle.dependencies)
        .map(|(zip, dep)| Packed::new(zip, dep.signature.as_deref()))
        .collect();
    open_packed(
        Packed::new(&root, bundle.signature.as_deref()),
        &packed,
        policy,
    )
}

/// Opens a module and its dependencies from their bytes: each checked against the signature
/// `policy`, the dependencies against the module's `module.lock` when it has one, none
/// missing or given twice (the server's side, before anything is encoded for the wire).
pub fn open_packed(root: Packed, dependencies: &[Packed], policy: &TrustPolicy) -> Result<Opened> {
    let module = open_one(&root, policy)?;
    let mut opened = BTreeMap::new();
    let mut hashes = BTreeMap::new();
    for dep in dependencies {
        let module = open_one(dep, policy)?;
        let name = module.manifest.name.clone();
        hashes.insert(name.clone(), sha256_hex(dep.zip));
        if opened.insert(name.clone(), module).is_some() {
            return Err(Error::Invalid(format!("dependency {name} is given twice")));
        }
    }
    if let Some(lock) = module.lock()? {
        for (name, locked) in &lock.dependencies {
            match opened.get(name) {
                None => {
                    return Err(Error::Invalid(format!(
                        "{name} {} (from module.lock) was not sent with the module",
                        locked.version
                    )))
                }
                Some(_) if hashes.get(name) == Some(&locked.sha256) => {}
                Some(m) => {
                    return Err(Error::Invalid(format!(
                        "{name} {} is not module.lock's {} (SHA-256 {}): refusing",
                        m.manifest.version, locked.version, locked.sha256
                    )))
                }
            }
        }
    }
    Ok(Opened {
        module,
        dependencies: opened,
    })
}

/// One ZIP of a bundle, base64-decoded and checked against its SHA-256.
fn decode(bundle: &ModuleBundle, what: &str) -> Result<Vec<u8>> {
    let zip = base64::engine::general_purpose::STANDARD
        .decode(bundle.zip_base64.as_bytes())
        .map_err(|e| Error::Invalid(format!("{what}'s ZIP is not base64: {e}")))?;
    let got = sha256_hex(&zip);
    if got != bundle.sha256 {
        return Err(Error::Invalid(format!(
            "{what}'s bytes have SHA-256 {got}, not the {} they were sent with: refusing",
            bundle.sha256
        )));
    }
    Ok(zip)
}

fn open_one(packed: &Packed, policy: &TrustPolicy) -> Result<Module> {
    let module = Module::from_zip(packed.zip)?;
    policy.check(&module.id(), packed.zip, packed.signature)?;
    Ok(module)
}

/// What to run: the function, its `KEY=VALUE` arguments, the sandbox's limits.
pub struct Call<'a> {
    pub function: &'a str,
    pub args: &'a [String],
    pub limits: Limits,
}

/// Types `KEY=VALUE` arguments of `function` by the module's manifest (unknown, missing and
/// mistyped ones refused).
pub fn arguments(
    module: &Module,
    function: &str,
    args: &[String],
) -> Result<BTreeMap<String, serde_json::Value>> {
    module
        .manifest
        .arguments(function, &super::parse_args(args)?)
}

/// On the agent (blocking: run it off the async threads): opens the bundle, calls the
/// function with this host's facts, then checks or applies the resources it returned.
/// Every failure is the outcome's error; nothing is applied unless the module ran cleanly.
pub fn run_on_host(
    bundle: &ModuleBundle,
    policy: &TrustPolicy,
    call: &Call,
    mode: Mode,
) -> StateOutcome {
    let failed = |e: Error| StateOutcome {
        error: Some(e.to_string()),
        ..StateOutcome::default()
    };
    let opened = match open(bundle, policy) {
        Ok(opened) => opened,
        Err(e) => return failed(e),
    };
    // One reading of the host for the module and for the templates of what it returns.
    let facts = crate::facts::collect();
    let run = arguments(&opened.module, call.function, call.args).and_then(|args| {
        sandbox::call(
            &opened.module,
            &opened.dependencies,
            call.function,
            &args,
            &facts,
            call.limits,
        )
    });
    let run = match run {
        Ok(run) => run,
        Err(e) => return failed(e),
    };
    let plan = Plan::of(run.resources);
    if let Err(e) = state::validate(&plan) {
        return failed(Error::Invalid(format!(
            "{} returned resources that are not a valid state: {e}",
            call.function
        )));
    }
    let options = state::RunOptions {
        facts: serde_json::to_value(&facts).unwrap_or_default(),
        diff: false,
    };
    let outcomes = state::run(&plan, mode, &options);
    StateOutcome {
        outcomes,
        resources: plan.resources,
        logs: run.logs,
        ..StateOutcome::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(name: &str, version: &str, deps: &str, main: &str) -> Vec<u8> {
        let mut files = BTreeMap::new();
        files.insert(
            "module.yaml".to_string(),
            format!("name: {name}\nversion: {version}\n{deps}exports:\n  f:\n    parameters:\n      path: {{type: string}}\n")
                .into_bytes(),
        );
        files.insert("main.star".to_string(), main.as_bytes().to_vec());
        Module::from_files(files).unwrap().to_zip().unwrap()
    }

    #[test]
    fn tampered_or_unsigned_bundles_are_refused() {
        let zip = module(
            "m",
            "1.0.0",
            "",
            "def f(path):\n    return [file(path, content = 'x')]\n",
        );
        let mut bundle = pack(
            Packed {
                zip: &zip,
                signature: None,
            },
            &[],
        );
        open(&bundle, &TrustPolicy::default()).unwrap();

        let strict = TrustPolicy {
            require_signature: true,
            trusted_keys: vec![super::super::sign::keygen().unwrap().1],
        };
        let e = open(&bundle, &strict).err().unwrap().to_string();
        assert!(e.contains("not signed"), "{e}");

        bundle.sha256 = "0".repeat(64);
        let e = open(&bundle, &TrustPolicy::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("SHA-256"), "{e}");
    }

    #[test]
    fn runs_and_checks_what_the_function_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let zip = module(
            "m",
            "1.0.0",
            "",
            "def f(path):\n    return [file(path, content = 'hi\\n')]\n",
        );
        let bundle = pack(
            Packed {
                zip: &zip,
                signature: None,
            },
            &[],
        );
        let args = [format!("path={}", path.display())];
        let call = Call {
            function: "f",
            args: &args,
            limits: Limits::default(),
        };
        let checked = run_on_host(&bundle, &TrustPolicy::default(), &call, Mode::Check);
        assert_eq!(checked.error, None);
        assert!(checked.outcomes[0].changed);
        assert!(!path.exists());
        let applied = run_on_host(&bundle, &TrustPolicy::default(), &call, Mode::Apply);
        assert_eq!(applied.resources.len(), 1);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "hi\n");

        let bad = [String::from("nope=1")];
        let call = Call { args: &bad, ..call };
        let e = run_on_host(&bundle, &TrustPolicy::default(), &call, Mode::Apply)
            .error
            .unwrap();
        assert!(e.contains("no parameter 'nope'"), "{e}");
    }
}
