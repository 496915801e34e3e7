//! CLIs whose features are not built yet: their help and subcommand lists, from one table.
//!
//! Each name parses `--help`/`--version` and knows its subcommands, so scripts and operators
//! can discover the surface today; running a subcommand exits 1 with
//! `NAME: 'SUB' is not implemented yet` — never a fake success. When a CLI is built it moves
//! out of this table into its own file.

use super::{exit, version_line, COMMON_HELP};

pub struct Planned {
    pub name: &'static str,
    pub about: &'static str,
    pub commands: &'static [(&'static str, &'static str)],
    /// What runs when no subcommand is given (daemons); None means "usage error".
    pub default: Option<&'static str>,
    /// Whether it talks to the server with the common client flags.
    pub is_client: bool,
    /// Commands that are built (handled by the CLI's own file); the rest are planned.
    pub built: &'static [&'static str],
}

pub const AGENT: Planned = Planned {
    name: "svc-agent",
    about: "Host daemon: enrols with the server, heartbeats, runs commands and applies state.\nWith no command it runs the daemon (--config PATH, default /etc/svc/agent.yaml).",
    commands: &[
        ("bootstrap", "enrol: interactive wizard, or --non-interactive --server URL --agent-id ID (--token T | --psk P) [--labels k=v,...]"),
        ("service", "manage the systemd unit: install | uninstall | status"),
        ("run", "run the daemon (the default): [--log-level LEVEL]"),
        ("jwt", "print this agent's JWT-SVID: --audience A [--ttl D] [-o json]"),
    ],
    default: Some("run"),
    is_client: false,
    built: &["bootstrap", "service", "run", "jwt"],
};

/// Every planned `svc-NAME` CLI.
/// Looks a CLI up by name.
pub fn find(name: &str) -> Option<&'static Planned> {
    TOOLS.iter().find(|tool| tool.name == name)
}

pub const TOOLS: &[Planned] = &[
    AGENT,
    Planned {
        name: "svc-audit",
        about: "Audit log: query, export, report, verify the hash chain.",
        commands: &[
            ("log", "paginated query: --since --until --user --action --resource-type --policy-id --min-severity --limit --cursor"),
            ("export", "stream the log redacted: --format json|jsonl|csv --since --output-file"),
            ("report", "compliance report: rate, top violations, trend"),
            ("stats", "headline counts over a window"),
            ("verify", "check the hash chain; names the first bad row"),
        ],
        default: None,
        is_client: true,
        built: &["log", "export", "report", "stats", "verify"],
    },
    Planned {
        name: "svc-events",
        about: "Event stream: list, fetch, emit, subscribe, watch and replay events.",
        commands: &[
            ("list", "paginated list: --type --category --since --until --min-severity --source --limit --cursor"),
            ("get", "fetch one event: ID"),
            ("emit", "publish and wait for the durable ack: --type T [--severity S] [--source S] [--payload JSON]"),
            ("subscribe", "replay from --since, then follow live"),
            ("watch", "live tail, one line per event"),
            ("replay", "history only: --since [--until] [--min-severity]"),
            ("stats", "counts by type and severity"),
            ("types", "the event types: category and default severity"),
        ],
        default: None,
        is_client: true,
        built: &["list", "get", "emit", "subscribe", "watch", "replay", "stats", "types"],
    },
    Planned {
        name: "svc-identity",
        about: "Embedded CA, join tokens and JWT-SVIDs.",
        commands: &[
            ("ca", "info | rotate-signing | export | encrypt"),
            ("status", "provider health, token counts, CA expiry"),
            ("psk", "print the bootstrap PSK of AGENT_ID"),
            ("token", "create [--ttl D] [--agent-id ID] | list [--unused] [--unexpired] | revoke ID | cleanup"),
            ("jwt", "JWT-SVIDs: issue --audience A [--ttl D] [--subject ID] | list | revoke ID | verify TOKEN --audience A [--jwks F | --ca-file F] [--revocations F]"),
        ],
        default: None,
        is_client: true,
        built: &["ca", "status", "psk", "token", "jwt"],
    },
    Planned {
        name: "svc-secrets",
        about: "Secrets: versioned KV, transit encryption, dynamic-secret leases.",
        commands: &[
            ("get", "read a secret: PATH [--field K] [--version N]"),
            ("put", "write a secret: PATH KEY=VALUE... [--from-file F]"),
            ("delete", "delete a secret: PATH [--versions N,...] [--destroy]"),
            ("list", "list secrets under a prefix (metadata only)"),
            ("leases", "list | show ID | renew ID [--increment D] | revoke ID | revoke --prefix P"),
            ("transit", "create-key | encrypt | decrypt | sign | verify | rotate | config | rewrap | list-keys"),
            ("rotate-master", "re-wrap every data key under a new master key (admin): --new-key-file F"),
            ("creds", "dynamic credentials with a lease: postgres [--ttl D]"),
        ],
        default: None,
        is_client: true,
        built: &["get", "put", "delete", "list", "leases", "transit", "rotate-master", "creds"],
    },
    Planned {
        name: "svc-policy",
        about: "Policies (audit mode): list, show, compliance, violations; eval and validate offline.",
        commands: &[
            ("list", "list policies (--policy-sets for sets)"),
            ("show", "show a policy: ID (--policy-set for a set)"),
            ("compliance", "compliance over an audit window"),
            ("violations", "denied audit entries"),
            ("create", "Unimplemented in v0.1"),
            ("update", "Unimplemented in v0.1"),
            ("delete", "Unimplemented in v0.1"),
            ("eval", "evaluate FILE --action A --principal P --resource R (no server)"),
            ("validate", "validate FILE (no server)"),
        ],
        default: None,
        is_client: true,
        built: &[
            "list",
            "show",
            "compliance",
            "violations",
            "create",
            "update",
            "delete",
            "eval",
            "validate",
        ],
    },
    Planned {
        name: "svc-cluster",
        about: "Cluster membership, leadership and snapshots (docs/cluster.md).",
        commands: &[
            ("status", "members, leader and term, health, quorum (PostgreSQL and NATS)"),
            ("members", "list members or show one: [ID]"),
            ("leader", "show the leader"),
            ("add", "passthrough; the server answers Unimplemented (members join by themselves)"),
            ("remove", "evict a member (admin): ID"),
            ("rebalance", "spread agent ownership over the live members now (admin)"),
            ("transfer-leader", "move the leader lease (admin): [TARGET | --to ID]"),
            ("backup", "stream a snapshot into a file: [--output FILE] [--encrypt]"),
            ("restore", "runs offline: svc-cluster-backup restore --input FILE [--force]"),
        ],
        default: None,
        is_client: true,
        built: &[
            "status",
            "members",
            "leader",
            "add",
            "remove",
            "rebalance",
            "transfer-leader",
            "backup",
            "restore",
        ],
    },
    Planned {
        name: "svc-cluster-backup",
        about: "Cluster snapshots: back up, restore, list and verify files (docs/backup.md).\nScheduled snapshots are deferred (not built): run backup from cron or a systemd timer.",
        commands: &[
            ("backup", "stream a snapshot into a file: --output FILE [--encrypt] [--passphrase-file F]"),
            ("restore", "offline: --input FILE [--force] [--config server.yaml] [--passphrase-file F]"),
            ("list", "list snapshot files in DIR (default .), no server"),
            ("verify", "check --input FILE completely (hashes, audit chain), no server"),
        ],
        default: None,
        is_client: true,
        built: &["backup", "restore", "list", "verify"],
    },
    Planned {
        name: "svc-files",
        about: "File service over the message bus (chunked, SHA-256 verified; docs/files.md).\nFlags on every command: --nats-url URL (env SVC_NATS_URL, default nats://localhost:4222) --cluster NAME (env SVC_CLUSTER, default `default`) --principal-id ID --principal-role ROLE --timeout D (default 1m0s) --log-level L --api-key KEY (env SVC_API_KEY) -o table|json.\nExit codes: 1 failed (a SHA-256 mismatch included), 3 bus unreachable, 4 refused, 5 no such remote path.",
        commands: &[
            ("put", "upload: LOCAL REMOTE"),
            ("get", "download: REMOTE LOCAL"),
            ("list", "list: [PREFIX]"),
            ("stat", "metadata: REMOTE"),
            ("delete", "delete: REMOTE"),
        ],
        default: None,
        is_client: false,
        built: &["put", "get", "list", "stat", "delete"],
    },
    Planned {
        name: "svc-backup",
        about: "Snapshots in S3-compatible object stores (the svc-cluster-backup format).\nS3 flags on every command: --bucket B (env SVC_BACKUP_BUCKET) --prefix P --s3-access-key --s3-secret-key --s3-endpoint --s3-region --s3-ssl (default true; env AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION).\nScheduled backups are deferred (not built): run create from cron or a systemd timer.",
        commands: &[
            ("create", "snapshot through the server, upload, prune: [--keep N] [--encrypt]"),
            ("list", "the snapshots under the prefix"),
            ("restore", "download and restore offline: --key K [--force] [--config F]"),
            ("verify", "download and check completely: --key K"),
        ],
        default: None,
        is_client: true,
        built: &["create", "list", "restore", "verify"],
    },
    Planned {
        name: "svc-blueprint",
        about: "Blueprints: parameterised state files, reproducible bundles (.tar.gz), the server's catalogue,\napply, applied and rollback through the state engine (docs/blueprints.md).\ninit, validate, lint, info (of a directory or bundle) and bundle need no server.",
        commands: &[
            ("init", "scaffold a blueprint: NAME [--dir DIR]"),
            ("validate", "check a blueprint: DIR|BUNDLE [--set k=v ...]"),
            ("lint", "warn on risky patterns: DIR|BUNDLE [--set k=v ...]"),
            ("info", "metadata and parameters: DIR|BUNDLE|NAME[@VERSION]"),
            ("bundle", "build a reproducible .tar.gz: DIR [-O FILE]"),
            ("install", "add to the catalogue: BUNDLE|DIR"),
            ("update", "install a newer version: BUNDLE|DIR"),
            ("remove", "delete from the catalogue: NAME [--force]"),
            ("list", "installed blueprints"),
            ("apply", "render and apply: NAME[@VERSION] [--target SEL] [--set k=v ...] [--dry-run]"),
            ("applied", "what is applied where: [--target SEL]"),
            ("rollback", "re-apply the previous version: NAME [--target SEL] [--to VERSION]"),
        ],
        default: None,
        is_client: true,
        built: &[
            "init", "validate", "lint", "info", "bundle", "install", "update", "remove", "list",
            "apply", "applied", "rollback",
        ],
    },
    Planned {
        name: "svc-bootstrap",
        about: "Bootstrap manager: --seed SEEDCONFIG.yaml [--root DIR] [--force] [--log-level L]; phases detect, configure, validate, install, blueprints, verify.",
        commands: &[],
        default: Some("run"),
        is_client: false,
        // Built: cli/bootstrap.rs parses its own flags (it has no subcommands).
        built: &["run"],
    },
    Planned {
        name: "svc-gitops",
        about: "GitOps: a git repository's gitops.yaml says what each target should be (state files,\nblueprints); verify compares it with the hosts, rollback applies the tree at a commit.",
        commands: &[
            ("verify", "differences between the repository and the hosts: --repo PATH|URL [--ref REF] [--path DIR]"),
            ("rollback", "apply the tree at a commit: --repo PATH|URL --to COMMIT [--path DIR]"),
        ],
        default: None,
        is_client: true,
        built: &["verify", "rollback"],
    },
    Planned {
        name: "svc-module",
        about: "Modules: Starlark that returns state resources, in reproducible ZIPs with a module.lock;\nsigned (ed25519), published to a registry, installed and run in a sandbox (docs/modules.md).\nNo command talks to svc-server; registries are given with --registry URL (env SVC_MODULE_REGISTRY).",
        commands: &[
            ("init", "start a module: NAME [--dir DIR]"),
            ("validate", "schema, sources parse, exports defined: [DIR|ZIP]"),
            ("build", "reproducible ZIP: [DIR] [-O FILE]"),
            ("test", "run *_test.star, TAP output: [DIR|ZIP]"),
            ("run", "call a function here and print the resources, or on agents with --target SEL (applied like state): MODULE FUNCTION [--arg k=v]..."),
            ("sign", "detached ed25519 signature: ZIP --key KEY"),
            ("verify", "check a signature: ZIP --pubkey PUB [--signature FILE]"),
            ("keygen", "make a key pair: [NAME] (NAME.key 0600, NAME.pub)"),
            ("resolve", "write module.lock from installed modules and registries: [DIR] [--registry URL]"),
            ("tree", "the dependency tree: [DIR|ZIP|NAME]"),
            ("install", "from a ZIP, a directory or NAME[@RANGE] of a registry, lock hashes checked"),
            ("update", "install a newer version: ZIP|DIR|NAME [--registry URL]"),
            ("list", "installed modules"),
            ("publish", "upload to a registry: ZIP --registry URL [--token T]"),
            ("clean", "remove build output: [DIR]"),
        ],
        default: None,
        is_client: false,
        built: &[
            "init", "validate", "build", "test", "run", "sign", "verify", "keygen", "resolve", "tree",
            "install", "update", "list", "publish", "clean",
        ],
    },
    Planned {
        name: "svc-registry",
        about: "Module registry HTTP server (docs/modules.md): modules, versions and SHA-256, ZIP and signature\ndownloads, token-checked publishing of immutable versions, GET /openapi.json.",
        commands: &[
            ("serve", "serve: [--listen ADDR] [--dir DIR] [--token-file F] [--svc-url URL]"),
            ("version", "print the registry version"),
        ],
        default: None,
        is_client: false,
        built: &["serve", "version"],
    },
    Planned {
        name: "svc-runbook",
        about: "Runbooks (*.yaml in the server's runbook_dir): test, execute, and follow executions (docs/runbooks.md).",
        commands: &[
            ("list", "the runbooks the server loaded"),
            ("test", "validate FILE (no server) or NAME: schema, needs, cycles; print the plan [--set k=v]"),
            ("execute", "start NAME on the server (operator): [--set k=v]... [--dry-run]"),
            ("list-executions", "executions: [--runbook NAME] [--status S] [--limit N]"),
            ("status", "an execution's steps: EXECUTION [--follow]"),
            ("audit", "the audit rows of an execution: EXECUTION"),
            ("cancel", "stop an execution (operator): EXECUTION"),
            ("approve", "approve a waiting step (operator, not the starter): EXECUTION STEP"),
        ],
        default: None,
        is_client: true,
        built: &["list", "test", "execute", "list-executions", "status", "audit", "cancel", "approve"],
    },
    Planned {
        name: "svc-webhook",
        about: "Outbound webhook subscriptions (docs/webhooks.md).",
        commands: &[("outbound", "create --url URL --events T[,T...]|--category C [--min-severity S] [--secret-file F] | list | show ID | update ID | delete ID | test ID | deliveries ID [--failed] | redeliver DELIVERY")],
        default: None,
        is_client: true,
        built: &["outbound"],
    },
];

/// The help text of a planned CLI.
pub fn help(planned: &Planned) -> String {
    let mut text = if planned.commands.is_empty() {
        format!("Usage: {} [<options>]\n\n{}\n", planned.name, planned.about)
    } else {
        format!(
            "Usage: {} <command> [<args>]\n\n{}\n\nCommands:\n",
            planned.name, planned.about
        )
    };
    let width = planned
        .commands
        .iter()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(0);
    for (name, about) in planned.commands {
        let status = if planned.built.is_empty() || planned.built.contains(name) {
            ""
        } else {
            " (not implemented yet)"
        };
        text.push_str(&format!("  {name:width$}  {about}{status}\n"));
    }
    text.push('\n');
    if planned.is_client {
        text.push_str(COMMON_HELP);
    } else {
        text.push_str("Options:\n  -h, --help     show help\n  -v, --version  show the version");
    }
    if planned.built.is_empty() {
        text.push_str("\n\nStatus: this command's features are not built yet; each command exits 1 with 'not implemented yet'.\n");
    } else {
        text.push('\n');
    }
    text
}

/// Runs a planned CLI: help and version work; every command says it is not built yet.
pub fn run(planned: &Planned, args: &[String]) -> i32 {
    let program = planned.name;
    let (error_prefix, command_prefix) = match program.split_once(' ') {
        Some((root, sub)) => (root, format!("{sub} ")),
        None => (program, String::new()),
    };
    if super::wants_version(args) {
        println!("{}", version_line(error_prefix));
        return exit::OK;
    }
    // The common flags take values; remove them so a value is never mistaken for a command.
    let mut args = args.to_vec();
    if let Err(error) = super::take_common(&mut args) {
        eprintln!("{error_prefix}: {error}");
        return error.code;
    }
    let mut command = None;
    for arg in &args {
        match arg.as_str() {
            "-h" | "--help" | "help" => {
                print!("{}", help(planned));
                return exit::OK;
            }
            "--" => break,
            flag if flag.starts_with('-') => {}
            word if command.is_none() => command = Some(word.to_string()),
            _ => {}
        }
    }
    let command = match (command, planned.default) {
        (Some(word), _) if planned.commands.iter().any(|(name, _)| *name == word) => word,
        (Some(word), None) => {
            eprintln!("{error_prefix}: unknown command '{command_prefix}{word}'");
            eprintln!("{error_prefix}: run '{program} --help' for the commands");
            return exit::USAGE;
        }
        (_, Some(default)) => default.to_string(),
        (None, None) => {
            eprintln!("{error_prefix}: missing command");
            eprint!("{}", help(planned));
            return exit::USAGE;
        }
    };
    // A command without subcommands (`svcctl exec`) is named by itself.
    let full = if planned.commands.is_empty() && !command_prefix.is_empty() {
        command_prefix.trim().to_string()
    } else {
        format!("{command_prefix}{command}")
    };
    eprintln!("{error_prefix}: '{full}' is not implemented yet");
    exit::FAILED
}
