//! `svc-module`: modules on this machine (docs/modules.md): init, validate, build, test, run,
//! sign, verify, keygen, resolve, tree, install, update, list, publish, clean. Only
//! `publish`, `resolve`, `install` and `update` with a registry talk to the network, and
//! `run --target` to svc-server (FleetService.ModuleRun), which sends the module to agents.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use argh::FromArgs;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::{CliError, Common, Output};
use crate::config::TrustPolicy;
use crate::modules::registry::{by_version, RegistryClient, Transport};
use crate::modules::sandbox::{self, Limits};
use crate::modules::sign;
use crate::modules::store::{self, Added, Store};
use crate::modules::{self, sha256_hex, Module, BUILD_DIR, LOCK};
use crate::proto::{self, fleet_service_client::FleetServiceClient};

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_subcommands::<Args, _>(program, args, body)
}

/// The argh definition of `Args`, whose subcommands are the commands `main` runs: what help,
/// completions and man pages read (`cli::args_info`, `cli::top_help`).
pub fn args_info() -> argh::CommandInfoWithArgs {
    <Args as argh::ArgsInfo>::get_args_info()
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Modules.
#[argh(help_triggers("-h", "--help"))]
struct Args {
    #[argh(subcommand)]
    command: Command,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum Command {
    Init(InitArgs),
    Validate(DirArgs),
    Build(BuildArgs),
    Test(TestArgs),
    Run(RunArgs),
    Sign(SignArgs),
    Verify(VerifyArgs),
    Keygen(KeygenArgs),
    Resolve(ResolveArgs),
    Tree(TreeArgs),
    Install(InstallArgs),
    Update(UpdateArgs),
    List(ListArgs),
    Publish(PublishArgs),
    Clean(CleanArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Start a module in a new directory NAME (or --dir): module.yaml, main.star with one
/// exported function, main_test.star.
#[argh(subcommand, name = "init", help_triggers("-h", "--help"))]
struct InitArgs {
    /// the module's name (a-z, 0-9, '_', starting with a letter)
    #[argh(positional)]
    name: String,
    /// where to write it (default: ./NAME); must not exist or be empty
    #[argh(option)]
    dir: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Check a module: module.yaml's schema, every .star parses, main.star evaluates (sandboxed)
/// and defines every exported function; dependencies come from module.lock or the installed
/// modules.
#[argh(subcommand, name = "validate", help_triggers("-h", "--help"))]
struct DirArgs {
    /// the module directory or ZIP (default: .)
    #[argh(positional, default = "PathBuf::from(\".\")")]
    path: PathBuf,
    /// installed modules (env SVC_MODULES_DIR)
    #[argh(option)]
    modules_dir: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Build a reproducible ZIP (entries sorted, fixed timestamps, stored): the same files always
/// give the same bytes and SHA-256. Writes DIR/build/NAME-VERSION.zip (or -O FILE) and prints
/// it with its SHA-256.
#[argh(subcommand, name = "build", help_triggers("-h", "--help"))]
struct BuildArgs {
    /// the module directory (default: .)
    #[argh(positional, default = "PathBuf::from(\".\")")]
    dir: PathBuf,
    /// the ZIP to write
    #[argh(option, short = 'O')]
    output_file: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Run the module's tests: every test_* function of every *_test.star, TAP output. Exits 1
/// if any fails.
#[argh(subcommand, name = "test", help_triggers("-h", "--help"))]
struct TestArgs {
    /// the module directory or ZIP (default: .)
    #[argh(positional, default = "PathBuf::from(\".\")")]
    path: PathBuf,
    /// installed modules (env SVC_MODULES_DIR)
    #[argh(option)]
    modules_dir: Option<PathBuf>,
    /// statements a test may execute (default 10000000)
    #[argh(option)]
    max_steps: Option<u64>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Call an exported function and print the resources it returns. MODULE is a directory, a
/// ZIP, or NAME[@RANGE] of an installed module. Without --target the call runs here and
/// nothing is applied. With --target the server sends the module, its dependencies and
/// their signatures (ZIP.sig beside a ZIP, or --signature) to the selected agents; each
/// checks the module's SHA-256 and signature (modules.require_signature in the agent's
/// config), calls the function with its own host's facts and applies the resources like
/// `svcctl state apply` (--check: only reports what would change). Exits 1 if any agent
/// failed.
#[argh(subcommand, name = "run", help_triggers("-h", "--help"))]
struct RunArgs {
    /// the module
    #[argh(positional)]
    module: String,
    /// the exported function
    #[argh(positional)]
    function: String,
    /// an argument KEY=VALUE, typed by module.yaml (repeatable; lists as a,b,c)
    #[argh(option)]
    arg: Vec<String>,
    /// run on these agents through svc-server: a selector (id, label=value, all)
    #[argh(option, short = 't')]
    target: Option<String>,
    /// with --target: report what would change, apply nothing
    #[argh(switch)]
    check: bool,
    /// with --target: the module's signature file (default: ZIP.sig beside a ZIP, the
    /// installed signature of an installed module)
    #[argh(option)]
    signature: Option<PathBuf>,
    /// with --target: how long each agent may take (default 10m)
    #[argh(option)]
    timeout: Option<String>,
    /// with --target: agents at once (default: all)
    #[argh(option)]
    concurrency: Option<u32>,
    /// statements the run may execute (default 10000000)
    #[argh(option)]
    max_steps: Option<u64>,
    /// bytes the run may allocate (default 268435456)
    #[argh(option)]
    max_memory: Option<usize>,
    /// installed modules (env SVC_MODULES_DIR)
    #[argh(option)]
    modules_dir: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Write a detached ed25519 signature of a ZIP: MODULE.zip.sig (or -O FILE).
#[argh(subcommand, name = "sign", help_triggers("-h", "--help"))]
struct SignArgs {
    /// the module ZIP
    #[argh(positional)]
    zip: PathBuf,
    /// the private key file (from keygen)
    #[argh(option)]
    key: PathBuf,
    /// the signature file (default: ZIP.sig)
    #[argh(option, short = 'O')]
    output_file: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Check a ZIP's detached signature (ZIP.sig, or --signature) against a public key. Exits 4
/// when it does not match.
#[argh(subcommand, name = "verify", help_triggers("-h", "--help"))]
struct VerifyArgs {
    /// the module ZIP
    #[argh(positional)]
    zip: PathBuf,
    /// the trusted public key file (from keygen)
    #[argh(option)]
    pubkey: PathBuf,
    /// the signature file (default: ZIP.sig)
    #[argh(option)]
    signature: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Make an ed25519 key pair: NAME.key (private, mode 0600) and NAME.pub.
#[argh(subcommand, name = "keygen", help_triggers("-h", "--help"))]
struct KeygenArgs {
    /// file name prefix (default: module-signing)
    #[argh(positional, default = "String::from(\"module-signing\")")]
    name: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Resolve dependencies against the installed modules and registries (the newest version
/// each range accepts), install what comes from a registry, and write module.lock with exact
/// versions and SHA-256.
#[argh(subcommand, name = "resolve", help_triggers("-h", "--help"))]
struct ResolveArgs {
    /// the module directory (default: .)
    #[argh(positional, default = "PathBuf::from(\".\")")]
    dir: PathBuf,
    /// a registry URL (repeatable; env SVC_MODULE_REGISTRY)
    #[argh(option)]
    registry: Vec<String>,
    /// PEM CA bundle an https:// registry's certificate must chain to (env SVC_REGISTRY_CA;
    /// default: the system's CA store)
    #[argh(option)]
    registry_ca: Option<PathBuf>,
    /// allow plain http:// to a registry on another host (this machine needs no flag); tokens
    /// and modules then cross the network unencrypted and unauthenticated
    #[argh(switch)]
    allow_plain_http: bool,
    /// installed modules (env SVC_MODULES_DIR)
    #[argh(option)]
    modules_dir: Option<PathBuf>,
    /// the module configuration (env SVC_MODULES_CONFIG)
    #[argh(option)]
    config: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Print the dependency tree (versions from module.lock, else the installed ones).
#[argh(subcommand, name = "tree", help_triggers("-h", "--help"))]
struct TreeArgs {
    /// the module directory or ZIP, or NAME of an installed one (default: .)
    #[argh(positional, default = "String::from(\".\")")]
    module: String,
    /// installed modules (env SVC_MODULES_DIR)
    #[argh(option)]
    modules_dir: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Install a module from a ZIP (its signature from ZIP.sig when present), a directory (built
/// first), or NAME[@RANGE] from a registry. The dependencies module.lock pins are installed
/// too, each checked against its SHA-256; with modules.require_signature every module needs a
/// signature by a trusted key.
#[argh(subcommand, name = "install", help_triggers("-h", "--help"))]
struct InstallArgs {
    /// a ZIP, a directory or NAME[@RANGE]
    #[argh(positional)]
    source: String,
    /// a registry URL (repeatable; env SVC_MODULE_REGISTRY)
    #[argh(option)]
    registry: Vec<String>,
    /// PEM CA bundle an https:// registry's certificate must chain to (env SVC_REGISTRY_CA;
    /// default: the system's CA store)
    #[argh(option)]
    registry_ca: Option<PathBuf>,
    /// allow plain http:// to a registry on another host (this machine needs no flag); tokens
    /// and modules then cross the network unencrypted and unauthenticated
    #[argh(switch)]
    allow_plain_http: bool,
    /// the signature file (default: ZIP.sig when it exists)
    #[argh(option)]
    signature: Option<PathBuf>,
    /// installed modules (env SVC_MODULES_DIR)
    #[argh(option)]
    modules_dir: Option<PathBuf>,
    /// the module configuration (env SVC_MODULES_CONFIG)
    #[argh(option)]
    config: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Update an installed module to a newer version: the same sources and checks as install.
#[argh(subcommand, name = "update", help_triggers("-h", "--help"))]
struct UpdateArgs {
    /// a ZIP, a directory or NAME[@RANGE]
    #[argh(positional)]
    source: String,
    /// a registry URL (repeatable; env SVC_MODULE_REGISTRY)
    #[argh(option)]
    registry: Vec<String>,
    /// PEM CA bundle an https:// registry's certificate must chain to (env SVC_REGISTRY_CA;
    /// default: the system's CA store)
    #[argh(option)]
    registry_ca: Option<PathBuf>,
    /// allow plain http:// to a registry on another host (this machine needs no flag); tokens
    /// and modules then cross the network unencrypted and unauthenticated
    #[argh(switch)]
    allow_plain_http: bool,
    /// the signature file (default: ZIP.sig when it exists)
    #[argh(option)]
    signature: Option<PathBuf>,
    /// installed modules (env SVC_MODULES_DIR)
    #[argh(option)]
    modules_dir: Option<PathBuf>,
    /// the module configuration (env SVC_MODULES_CONFIG)
    #[argh(option)]
    config: Option<PathBuf>,
}

impl From<UpdateArgs> for InstallArgs {
    // argh needs one struct per subcommand name; update takes exactly install's arguments.
    fn from(a: UpdateArgs) -> InstallArgs {
        InstallArgs {
            source: a.source,
            registry: a.registry,
            registry_ca: a.registry_ca,
            allow_plain_http: a.allow_plain_http,
            signature: a.signature,
            modules_dir: a.modules_dir,
            config: a.config,
        }
    }
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List the installed modules.
#[argh(subcommand, name = "list", help_triggers("-h", "--help"))]
struct ListArgs {
    /// installed modules (env SVC_MODULES_DIR)
    #[argh(option)]
    modules_dir: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Upload a ZIP (and ZIP.sig when present) to a registry. Needs a registry token or an
/// operator/admin API key (--token, env SVC_REGISTRY_TOKEN, else SVC_API_KEY).
#[argh(subcommand, name = "publish", help_triggers("-h", "--help"))]
struct PublishArgs {
    /// the module ZIP
    #[argh(positional)]
    zip: PathBuf,
    /// the registry URL (env SVC_MODULE_REGISTRY)
    #[argh(option)]
    registry: Option<String>,
    /// PEM CA bundle an https:// registry's certificate must chain to (env SVC_REGISTRY_CA;
    /// default: the system's CA store)
    #[argh(option)]
    registry_ca: Option<PathBuf>,
    /// allow plain http:// to a registry on another host (this machine needs no flag); tokens
    /// and modules then cross the network unencrypted and unauthenticated
    #[argh(switch)]
    allow_plain_http: bool,
    /// the token (env SVC_REGISTRY_TOKEN)
    #[argh(option)]
    token: Option<String>,
    /// the signature file (default: ZIP.sig when it exists)
    #[argh(option)]
    signature: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Remove the build output (DIR/build).
#[argh(subcommand, name = "clean", help_triggers("-h", "--help"))]
struct CleanArgs {
    /// the module directory (default: .)
    #[argh(positional, default = "PathBuf::from(\".\")")]
    dir: PathBuf,
}

fn read(path: &Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| {
        CliError::new(
            super::exit::NOT_FOUND,
            format!("cannot read {}: {e}", path.display()),
        )
    })
}

fn read_text(path: &Path) -> Result<String, CliError> {
    Ok(String::from_utf8_lossy(&read(path)?).trim().to_string())
}

fn sig_path(zip: &Path) -> PathBuf {
    let mut path = zip.as_os_str().to_owned();
    path.push(".sig");
    PathBuf::from(path)
}

/// `run --target`: the module's exact bytes and signature, and its dependencies' as
/// installed, sent to svc-server; the agents' results printed as `svcctl state apply` does.
async fn run_on_agents(common: &Common, a: RunArgs) -> Result<(), CliError> {
    let store = Store::open(a.modules_dir.clone());
    let path = Path::new(&a.module);
    let (module, zip, mut signature) = if path.is_file() {
        let zip = read(path)?;
        let module = Module::from_zip(&zip)
            .map_err(|e| CliError::failed(format!("{}: {e}", path.display())))?;
        let beside = sig_path(path);
        let signature = beside.exists().then(|| read_text(&beside)).transpose()?;
        (module, zip, signature)
    } else if path.exists() {
        let module = Module::load_dir(path)
            .map_err(|e| CliError::failed(format!("{}: {e}", path.display())))?;
        let zip = module.to_zip()?;
        (module, zip, None)
    } else {
        let (name, range) = name_and_range(&a.module);
        let (module, zip) = store.load(name, range)?;
        let signature = store.signature(name, &module.manifest.version);
        (module, zip, signature)
    };
    if let Some(file) = &a.signature {
        signature = Some(read_text(file)?);
    }
    let dependencies = store::dependencies(&module, &store)?
        .values()
        .map(|dep| {
            let (name, version) = (&dep.manifest.name, &dep.manifest.version);
            Ok(proto::ModuleZip {
                zip: store.zip(name, version)?,
                signature: store.signature(name, version).unwrap_or_default(),
            })
        })
        .collect::<Result<Vec<_>, crate::Error>>()?;
    let request = proto::ModuleRunRequest {
        target: a.target.unwrap_or_default(),
        module: Some(proto::ModuleZip {
            zip,
            signature: signature.map(|s| s.trim().to_string()).unwrap_or_default(),
        }),
        dependencies,
        function: a.function,
        args: a.arg,
        check: a.check,
        timeout_ms: super::fleet::duration(&a.timeout, "--timeout")?,
        concurrency: a.concurrency.unwrap_or(0),
        max_steps: a.max_steps.unwrap_or(0),
        max_memory: a.max_memory.unwrap_or(0) as u64,
    };
    let operation = if a.check { "check" } else { "apply" };
    let mut client = FleetServiceClient::new(grpc_channel(common).await?);
    let request = authorized(common, request)?;
    let stream = client.module_run(request).await?.into_inner();
    // Every result in full, as before job summaries (this command has no --verbose).
    let results = super::fleet::Results::new(common.output, true);
    super::fleet::print_state_stream(results, stream, operation).await
}

/// A module from a directory, a ZIP, or NAME[@RANGE] installed.
fn load(spec: &str, store: &Store) -> Result<Module, CliError> {
    let path = Path::new(spec);
    if path.exists() {
        return Module::load(path).map_err(|e| CliError::failed(format!("{spec}: {e}")));
    }
    let (name, range) = name_and_range(spec);
    Ok(store.load(name, range)?.0)
}

/// `NAME[@RANGE]`: a module by name, with an optional version range (installed or in a
/// registry).
fn name_and_range(spec: &str) -> (&str, Option<&str>) {
    match spec.split_once('@') {
        Some((name, range)) => (name, Some(range)),
        None => (spec, None),
    }
}

/// How registries are reached: `--registry-ca` (else SVC_REGISTRY_CA, else the system's CA
/// store) and `--allow-plain-http`.
fn transport(ca_file: Option<PathBuf>, allow_plain_http: bool) -> Result<Transport, CliError> {
    let ca_file = ca_file.or_else(|| {
        std::env::var_os("SVC_REGISTRY_CA")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    Transport::new(
        ca_file.as_deref(),
        allow_plain_http,
        (
            "--registry-ca FILE (or set SVC_REGISTRY_CA)",
            "--allow-plain-http",
        ),
    )
    .map_err(|e| CliError::usage(e.to_string()))
}

/// The registries of `--registry` (else SVC_MODULE_REGISTRY, comma-separated); a URL the
/// transport refuses is a usage error before anything is sent.
fn registries(given: &[String], transport: &Transport) -> Result<Vec<RegistryClient>, CliError> {
    let mut urls: Vec<String> = given.to_vec();
    if urls.is_empty() {
        if let Ok(url) = std::env::var("SVC_MODULE_REGISTRY") {
            urls.extend(url.split(',').filter(|u| !u.is_empty()).map(str::to_string));
        }
    }
    urls.iter().map(|url| registry(url, transport)).collect()
}

fn registry(url: &str, transport: &Transport) -> Result<RegistryClient, CliError> {
    transport
        .check(url)
        .map_err(|e| CliError::usage(e.to_string()))?;
    Ok(RegistryClient::new(url, transport))
}

async fn body(common: Common, args: Args) -> Result<(), CliError> {
    let json = common.output == Output::Json;
    match args.command {
        Command::Init(a) => init(a),
        Command::Validate(a) => {
            let store = Store::open(a.modules_dir);
            let module = load(&a.path.to_string_lossy(), &store)?;
            let deps = store::dependencies(&module, &store)?;
            modules::validate(&module, &deps)?;
            let m = &module.manifest;
            if json {
                print_json(
                    &serde_json::json!({"name": m.name, "version": m.version, "valid": true,
                    "exports": m.exports.keys().collect::<Vec<_>>(), "dependencies": m.dependencies}),
                )
            } else {
                println!(
                    "{} {}: valid ({} exported functions, {} dependencies)",
                    m.name,
                    m.version,
                    m.exports.len(),
                    m.dependencies.len()
                );
                Ok(())
            }
        }
        Command::Build(a) => {
            let module = Module::load_dir(&a.dir)
                .map_err(|e| CliError::failed(format!("{}: {e}", a.dir.display())))?;
            let zip = module.to_zip()?;
            let file = a
                .output_file
                .unwrap_or_else(|| a.dir.join(BUILD_DIR).join(format!("{}.zip", module.id())));
            if let Some(parent) = file.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .map_err(|e| CliError::failed(format!("{}: {e}", parent.display())))?;
            }
            std::fs::write(&file, &zip)
                .map_err(|e| CliError::failed(format!("cannot write {}: {e}", file.display())))?;
            let sha256 = sha256_hex(&zip);
            if json {
                print_json(
                    &serde_json::json!({"file": file.display().to_string(), "sha256": sha256, "bytes": zip.len(),
                    "name": module.manifest.name, "version": module.manifest.version}),
                )
            } else {
                println!("{}  {sha256}", file.display());
                Ok(())
            }
        }
        Command::Test(a) => {
            let store = Store::open(a.modules_dir);
            let module = load(&a.path.to_string_lossy(), &store)?;
            let deps = store::dependencies(&module, &store)?;
            let limits = Limits {
                max_steps: a.max_steps.unwrap_or(Limits::default().max_steps),
                ..Limits::default()
            };
            let results = sandbox::run_tests(&module, &deps, limits)?;
            let failed = results.iter().filter(|r| !r.ok).count();
            if json {
                print_json(
                    &serde_json::json!({"tests": results, "passed": results.len() - failed, "failed": failed}),
                )?;
            } else {
                println!("TAP version 13");
                println!("1..{}", results.len());
                for (i, r) in results.iter().enumerate() {
                    let status = if r.ok { "ok" } else { "not ok" };
                    println!("{status} {} - {}: {}", i + 1, r.file, r.name);
                    if let Some(error) = &r.error {
                        for line in error.lines() {
                            println!("  # {line}");
                        }
                    }
                }
                println!("# {} passed, {failed} failed", results.len() - failed);
            }
            if results.is_empty() {
                return Err(CliError::failed(
                    "no tests: add *_test.star files with test_* functions",
                ));
            }
            if failed > 0 {
                return Err(CliError::failed(format!(
                    "{failed} of {} tests failed",
                    results.len()
                )));
            }
            Ok(())
        }
        Command::Run(a) if a.target.is_some() => run_on_agents(&common, a).await,
        Command::Run(a) => {
            if a.check || a.signature.is_some() || a.timeout.is_some() || a.concurrency.is_some() {
                return Err(CliError::usage(
                    "--check, --signature, --timeout and --concurrency go with --target",
                ));
            }
            let store = Store::open(a.modules_dir);
            let module = load(&a.module, &store)?;
            let deps = store::dependencies(&module, &store)?;
            let given = modules::parse_args(&a.arg).map_err(|e| CliError::usage(e.to_string()))?;
            let arguments =
                module
                    .manifest
                    .arguments(&a.function, &given)
                    .map_err(|e| match e {
                        crate::Error::Invalid(m) => CliError::usage(m),
                        e => e.into(),
                    })?;
            let defaults = Limits::default();
            let limits = Limits {
                max_steps: a.max_steps.unwrap_or(defaults.max_steps),
                max_heap_bytes: a.max_memory.unwrap_or(defaults.max_heap_bytes),
            };
            let run = sandbox::call(
                &module,
                &deps,
                &a.function,
                &arguments,
                &crate::facts::collect(),
                limits,
            )?;
            if json {
                return print_json(&run);
            }
            for line in &run.logs {
                eprintln!("log: {line}");
            }
            let rows: Vec<Vec<String>> = run
                .resources
                .iter()
                .map(|r| {
                    let label = r.label();
                    let (kind, name) = label.split_once(':').unwrap_or((&label, ""));
                    let detail = serde_json::to_value(r)
                        .ok()
                        .and_then(|v| v.as_object().and_then(|o| o.values().next().cloned()))
                        .unwrap_or_default();
                    vec![kind.to_string(), name.to_string(), detail.to_string()]
                })
                .collect();
            print_table(&["KIND", "NAME", "SETTINGS"], &rows);
            Ok(())
        }
        Command::Sign(a) => {
            let zip = read(&a.zip)?;
            Module::from_zip(&zip)
                .map_err(|e| CliError::failed(format!("{}: {e}", a.zip.display())))?;
            let signature = sign::sign(&zip, &read_text(&a.key)?)?;
            let file = a.output_file.unwrap_or_else(|| sig_path(&a.zip));
            std::fs::write(&file, format!("{signature}\n"))
                .map_err(|e| CliError::failed(format!("cannot write {}: {e}", file.display())))?;
            if json {
                print_json(
                    &serde_json::json!({"signature_file": file.display().to_string(), "sha256": sha256_hex(&zip)}),
                )
            } else {
                println!("{}", file.display());
                Ok(())
            }
        }
        Command::Verify(a) => {
            let zip = read(&a.zip)?;
            let sig_file = a.signature.unwrap_or_else(|| sig_path(&a.zip));
            let signature = read_text(&sig_file)?;
            sign::verify(&zip, &signature, &read_text(&a.pubkey)?)?;
            if json {
                print_json(
                    &serde_json::json!({"file": a.zip.display().to_string(), "valid": true, "sha256": sha256_hex(&zip)}),
                )
            } else {
                println!("{}: good signature", a.zip.display());
                Ok(())
            }
        }
        Command::Keygen(a) => {
            let (private, public) = sign::keygen()?;
            let key = PathBuf::from(format!("{}.key", a.name));
            let pubkey = PathBuf::from(format!("{}.pub", a.name));
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&key)
                .map_err(|e| CliError::failed(format!("cannot create {}: {e}", key.display())))?;
            file.write_all(format!("{private}\n").as_bytes())
                .map_err(|e| CliError::failed(e.to_string()))?;
            std::fs::write(&pubkey, format!("{public}\n"))
                .map_err(|e| CliError::failed(e.to_string()))?;
            if json {
                print_json(
                    &serde_json::json!({"private_key": key.display().to_string(), "public_key": pubkey.display().to_string(), "public": public}),
                )
            } else {
                println!(
                    "private key {} (0600), public key {}: {public}",
                    key.display(),
                    pubkey.display()
                );
                Ok(())
            }
        }
        Command::Resolve(a) => {
            let store = Store::open(a.modules_dir);
            let module = Module::load_dir(&a.dir)
                .map_err(|e| CliError::failed(format!("{}: {e}", a.dir.display())))?;
            let policy = TrustPolicy::load(a.config.as_deref())?;
            let transport = transport(a.registry_ca, a.allow_plain_http)?;
            let registries = registries(&a.registry, &transport)?;
            let lock = store::resolve(&module, &store, &registries, &policy).await?;
            let file = a.dir.join(LOCK);
            std::fs::write(&file, lock.to_text())
                .map_err(|e| CliError::failed(format!("cannot write {}: {e}", file.display())))?;
            if json {
                return print_json(&lock);
            }
            let rows: Vec<Vec<String>> = lock
                .dependencies
                .iter()
                .map(|(n, l)| {
                    vec![
                        n.clone(),
                        l.version.clone(),
                        l.sha256.clone(),
                        l.source.clone(),
                    ]
                })
                .collect();
            print_table(&["NAME", "VERSION", "SHA256", "SOURCE"], &rows);
            println!("wrote {}", file.display());
            Ok(())
        }
        Command::Tree(a) => {
            let store = Store::open(a.modules_dir);
            let module = load(&a.module, &store)?;
            let deps = store::dependencies(&module, &store).unwrap_or_default();
            let lock = module.lock()?;
            let tree = store::tree(&module, &deps, lock.as_ref());
            if json {
                return print_json(&tree);
            }
            print_tree(&tree, "", true, true);
            Ok(())
        }
        Command::Install(a) => install(a, json, false).await,
        Command::Update(a) => install(a.into(), json, true).await,
        Command::List(a) => {
            let installed = Store::open(a.modules_dir).installed()?;
            if json {
                return print_json(&installed);
            }
            let rows: Vec<Vec<String>> = installed
                .iter()
                .map(|i| {
                    vec![
                        i.name.clone(),
                        i.version.clone(),
                        i.sha256.clone(),
                        i.signed.to_string(),
                    ]
                })
                .collect();
            print_table(&["NAME", "VERSION", "SHA256", "SIGNED"], &rows);
            Ok(())
        }
        Command::Publish(a) => {
            let url = a
                .registry
                .or_else(|| std::env::var("SVC_MODULE_REGISTRY").ok())
                .ok_or_else(|| {
                    CliError::usage("give --registry URL (or set SVC_MODULE_REGISTRY)")
                })?;
            let token = a
                .token
                .or_else(|| {
                    std::env::var("SVC_REGISTRY_TOKEN")
                        .ok()
                        .filter(|t| !t.is_empty())
                })
                .or(common.api_key.clone())
                .ok_or_else(|| {
                    CliError::new(
                        super::exit::DENIED,
                        "no token: give --token, or set SVC_REGISTRY_TOKEN or SVC_API_KEY",
                    )
                })?;
            let zip = read(&a.zip)?;
            let module = Module::from_zip(&zip)
                .map_err(|e| CliError::failed(format!("{}: {e}", a.zip.display())))?;
            let sig_file = a.signature.unwrap_or_else(|| sig_path(&a.zip));
            let signature = if sig_file.exists() {
                Some(read_text(&sig_file)?)
            } else {
                None
            };
            let transport = transport(a.registry_ca, a.allow_plain_http)?;
            let info = registry(&url, &transport)?
                .publish(zip, signature.as_deref(), &token)
                .await?;
            if json {
                print_json(&info)
            } else {
                println!(
                    "published {} {} ({}, {})",
                    module.manifest.name,
                    info.version,
                    info.sha256,
                    if info.signed { "signed" } else { "unsigned" }
                );
                Ok(())
            }
        }
        Command::Clean(a) => {
            let build = a.dir.join(BUILD_DIR);
            if !a.dir.join(modules::MANIFEST).exists() {
                return Err(CliError::failed(format!(
                    "{} is not a module directory (no {})",
                    a.dir.display(),
                    modules::MANIFEST
                )));
            }
            match std::fs::remove_dir_all(&build) {
                Ok(()) => println!("removed {}", build.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => println!("nothing to clean"),
                Err(e) => {
                    return Err(CliError::failed(format!(
                        "cannot remove {}: {e}",
                        build.display()
                    )))
                }
            }
            Ok(())
        }
    }
}

fn print_tree(node: &serde_json::Value, prefix: &str, last: bool, root: bool) {
    let mut line = format!(
        "{} {}",
        node["name"].as_str().unwrap_or("?"),
        node["version"].as_str().unwrap_or("")
    );
    if node["missing"] == true {
        line = format!(
            "{} {} (not installed)",
            node["name"].as_str().unwrap_or("?"),
            node["range"].as_str().unwrap_or("")
        );
    } else if let Some(sha) = node["sha256"].as_str() {
        line.push_str(&format!(" ({}…)", &sha[..sha.len().min(12)]));
    }
    let child_prefix = if root {
        println!("{line}");
        String::new()
    } else {
        println!("{prefix}{}{line}", if last { "└── " } else { "├── " });
        format!("{prefix}{}", if last { "    " } else { "│   " })
    };
    let children = node["dependencies"].as_array().cloned().unwrap_or_default();
    for (i, child) in children.iter().enumerate() {
        print_tree(child, &child_prefix, i + 1 == children.len(), false);
    }
}

async fn install(a: InstallArgs, json: bool, update: bool) -> Result<(), CliError> {
    let store = Store::open(a.modules_dir);
    let policy = TrustPolicy::load(a.config.as_deref())?;
    let transport = transport(a.registry_ca.clone(), a.allow_plain_http)?;
    let registries = registries(&a.registry, &transport)?;
    let path = Path::new(&a.source);
    let (zip, signature) = if path.is_dir() {
        let module = Module::load_dir(path)
            .map_err(|e| CliError::failed(format!("{}: {e}", path.display())))?;
        (module.to_zip()?, None)
    } else if path.exists() {
        let sig_file = a.signature.clone().unwrap_or_else(|| sig_path(path));
        let signature = if sig_file.exists() {
            Some(read_text(&sig_file)?)
        } else {
            None
        };
        (read(path)?, signature)
    } else {
        let (name, range) = name_and_range(&a.source);
        let range = crate::version::Range::parse(range.unwrap_or("*")).map_err(CliError::usage)?;
        if registries.is_empty() {
            return Err(CliError::usage(format!(
                "{} is not a file or directory; to install it from a registry give --registry URL",
                a.source
            )));
        }
        let mut best = None;
        for registry in &registries {
            match registry.module(name).await {
                Ok(info) => {
                    if let Some((version, v)) = by_version(&info)
                        .into_iter()
                        .rev()
                        .find(|(v, _)| range.matches(v))
                    {
                        if best
                            .as_ref()
                            .is_none_or(|(b, _, _): &(crate::version::Version, _, _)| version > *b)
                        {
                            best = Some((version, v, registry));
                        }
                    }
                }
                Err(crate::Error::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let (_, v, registry) = best.ok_or_else(|| {
            CliError::new(
                super::exit::NOT_FOUND,
                format!("no version of {} in the registries", a.source),
            )
        })?;
        registry.download(name, &v.version, &v.sha256).await?
    };
    if update {
        let module = Module::from_zip(&zip)?;
        let installed = store.versions(&module.manifest.name);
        match installed.keys().next_back() {
            None => {
                return Err(CliError::failed(format!(
                    "{} is not installed: use install",
                    module.manifest.name
                )))
            }
            Some(newest) if *newest >= module.manifest.version() => {
                return Err(CliError::failed(format!(
                    "{} {newest} is installed; {} is not newer",
                    module.manifest.name, module.manifest.version
                )))
            }
            Some(_) => {}
        }
    }
    let done = store::install(
        &store,
        &zip,
        signature.as_deref(),
        &policy,
        &registries,
        &transport,
    )
    .await?;
    if json {
        let rows: Vec<serde_json::Value> = done.iter().map(|(i, added)| serde_json::json!({"name": i.name, "version": i.version, "sha256": i.sha256, "signed": i.signed, "new": *added == Added::New})).collect();
        return print_json(&rows);
    }
    for (i, added) in &done {
        let what = if *added == Added::New {
            "installed"
        } else {
            "already installed"
        };
        println!("{what} {} {} ({})", i.name, i.version, i.sha256);
    }
    Ok(())
}

fn init(a: InitArgs) -> Result<(), CliError> {
    let files = modules::scaffold(&a.name).map_err(|e| CliError::usage(e.to_string()))?;
    let dir = a.dir.unwrap_or_else(|| PathBuf::from(&a.name));
    if dir.exists()
        && std::fs::read_dir(&dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(CliError::failed(format!(
            "{} exists and is not empty",
            dir.display()
        )));
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| CliError::failed(format!("cannot create {}: {e}", dir.display())))?;
    let mut written = BTreeMap::new();
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text)
            .map_err(|e| CliError::failed(format!("cannot write {}: {e}", path.display())))?;
        written.insert(name, path);
    }
    println!(
        "created module {} in {} (module.yaml, main.star, main_test.star)",
        a.name,
        dir.display()
    );
    Ok(())
}
