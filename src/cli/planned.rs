//! What argh has no place for in each CLI that runs from a command list (`cli::run_listed`):
//! the line or paragraph its `--help` opens with, and whether it takes the common client
//! flags; and `svc`'s own help, whose lines `dispatch` answers. Its commands, their order and their one-line summaries come from the CLI's own
//! table (`COMMANDS` next to its argh structs) or argh enum: the first sentence of each
//! command's argh description, or the table's summary for a struct two words share.

use crate::program::planned::{Doc, DocSection};

/// One CLI's row.
pub struct Tool {
    pub name: &'static str,
    pub about: &'static str,
    /// Whether it talks to the server with the common client flags (`COMMON_FLAGS`).
    pub is_client: bool,
}

/// Looks a CLI up by name.
pub fn find(name: &str) -> Option<&'static Tool> {
    TOOLS.iter().find(|tool| tool.name == name)
}

/// Every CLI with a command list, in `svc --list` order.
pub const TOOLS: &[Tool] = &[
    Tool {
        name: "svc-audit",
        about: "Audit log: query, export, report, verify the hash chain.",
        is_client: true,
    },
    Tool {
        name: "svc-events",
        about: "Event stream: list, fetch, emit, subscribe, watch and replay events.",
        is_client: true,
    },
    Tool {
        name: "svc-identity",
        about: "Embedded CA, join tokens and JWT-SVIDs.",
        is_client: true,
    },
    Tool {
        name: "svc-secrets",
        about: "Secrets: versioned KV, transit encryption, dynamic-secret leases.",
        is_client: true,
    },
    Tool {
        name: "svc-policy",
        about: "Policies (audit mode): list, show, compliance, violations; eval and validate offline.",
        is_client: true,
    },
    Tool {
        name: "svc-cluster",
        about: "Cluster membership, leadership and snapshots (docs/cluster.md).",
        is_client: true,
    },
    Tool {
        name: "svc-cluster-backup",
        about: "Cluster snapshots: back up, restore, list and verify files (docs/backup.md).\nScheduled snapshots are deferred (not built): run backup from cron or a systemd timer.",
        is_client: true,
    },
    Tool {
        name: "svc-files",
        about: "File service over the message bus (chunked, SHA-256 verified; docs/files.md).\nFlags on every command: --nats-url URL (env SVC_NATS_URL, default nats://localhost:4222) --creds FILE (a NATS .creds file for a JWT-mode cluster; env SVC_NATS_CREDS) --cluster NAME (env SVC_CLUSTER, default `default`) --principal-id ID --principal-role ROLE --timeout D (default 1m0s) --log-level L --api-key KEY (env SVC_API_KEY) -o table|json.\nExit codes: 1 failed (a SHA-256 mismatch included), 3 bus unreachable, 4 refused, 5 no such remote path.",
        is_client: false,
    },
    Tool {
        name: "svc-backup",
        about: "Snapshots in S3-compatible object stores (the svc-cluster-backup format).\nS3 flags on every command: --bucket B (env SVC_BACKUP_BUCKET) --prefix P --s3-access-key --s3-secret-key --s3-endpoint --s3-region --s3-ssl (default true; env AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION).\nScheduled backups are deferred (not built): run create from cron or a systemd timer.",
        is_client: true,
    },
    Tool {
        name: "svc-blueprint",
        about: "Blueprints: parameterised state files, reproducible bundles (.tar.gz), the server's catalogue,\napply, applied and rollback through the state engine (docs/blueprints.md).\ninit, validate, lint, info (of a directory or bundle) and bundle need no server.",
        is_client: true,
    },
    Tool {
        name: "svc-gitops",
        about: "GitOps: a git repository's gitops.yaml says what each target should be (state files,\nblueprints); verify compares it with the hosts, rollback applies the tree at a commit.",
        is_client: true,
    },
    Tool {
        name: "svc-module",
        about: "Modules: Starlark that returns state resources, in reproducible ZIPs with a module.lock;\nsigned (ed25519), published to a registry, installed and run in a sandbox (docs/modules.md).\nNo command talks to svc-server; registries are given with --registry URL (env SVC_MODULE_REGISTRY):
https:// verified against --registry-ca FILE (env SVC_REGISTRY_CA) or the system's CA store; plain
http:// only to this machine unless --allow-plain-http.",
        is_client: false,
    },
    Tool {
        name: "svc-registry",
        about: "Module registry HTTPS (or HTTP) server (docs/modules.md): modules, versions and SHA-256, ZIP and\nsignature downloads, token-checked publishing of immutable versions, GET /openapi.json.",
        is_client: false,
    },
    Tool {
        name: "svc-runbook",
        about: "Runbooks (*.yaml in the server's runbook_dir): test, execute, and follow executions (docs/runbooks.md).",
        is_client: true,
    },
    Tool {
        name: "svc-webhook",
        about: "Outbound webhook subscriptions (docs/webhooks.md).",
        is_client: true,
    },
];

/// A line of `svc`'s help: how it is called and what that does; for a word `svc` answers
/// itself rather than a name's (`svc completion`, `svc man`), the entry that runs it.
pub struct SvcWord {
    /// `svc man DIR`: the word is its second part.
    pub term: &'static str,
    pub summary: &'static str,
    pub run: Option<fn(&str, &[String]) -> i32>,
}

impl SvcWord {
    pub fn word(&self) -> &'static str {
        self.term.split(' ').nth(1).unwrap_or("")
    }
}

/// `svc`'s usage line (after `Usage: `) and the paragraph under it.
pub const SVC_USAGE: &str =
    "svc NAME [<args>]      (or run it as svc-NAME, svcctl, ... through a symlink)";
pub const SVC_ABOUT: &str =
    "svc: a runtime operations control plane for Linux fleets, in one executable.";

/// What `svc` is called with, in help order.
pub const SVC_WORDS: &[SvcWord] = &[
    SvcWord {
        term: "svc server ...",
        summary: "the control-plane daemon (svc-server)",
        run: None,
    },
    SvcWord {
        term: "svc agent ...",
        summary: "the host daemon (svc-agent)",
        run: None,
    },
    SvcWord {
        term: "svc ctl ...",
        summary: "the operator CLI (svcctl)",
        run: None,
    },
    SvcWord {
        term: "svc NAME ...",
        summary: "any svc-NAME CLI: audit, events, identity, secrets, policy, cluster, ...",
        run: None,
    },
    SvcWord {
        term: "svc completion SHELL",
        summary: "print the completion script for bash, zsh or fish",
        run: Some(super::completion::main),
    },
    SvcWord {
        term: "svc man DIR",
        summary: "write the man pages (roff) into DIR",
        run: Some(super::manpage::main),
    },
];

/// `svc`'s options, each answered by `dispatch`.
pub const SVC_OPTIONS: &[(&str, &str)] = &[
    ("--list", "every name this binary answers to"),
    ("-h, --help", "show help"),
    ("-v, --version", "show the version"),
];

/// The column less 4 that `svc`'s help aligns its texts at (`svc completion SHELL` runs past
/// it).
const SVC_WIDTH: usize = 15;

/// `svc`'s help, as data.
pub fn svc_doc() -> Doc {
    let words: Vec<(&str, &str)> = SVC_WORDS.iter().map(|w| (w.term, w.summary)).collect();
    let mut words = DocSection::new("", &words);
    let mut options = DocSection::new("Options", SVC_OPTIONS);
    words.width = Some(SVC_WIDTH);
    options.width = Some(SVC_WIDTH);
    Doc {
        usage: SVC_USAGE.to_string(),
        about: SVC_ABOUT,
        sections: vec![words, options],
        notes: "",
    }
}

/// `svc --help`.
pub fn svc_help() -> String {
    svc_doc().render()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `svc`'s help as it was written by hand before its table.
    const WRITTEN_SVC_HELP: &str = "\
Usage: svc NAME [<args>]      (or run it as svc-NAME, svcctl, ... through a symlink)

svc: a runtime operations control plane for Linux fleets, in one executable.

  svc server ...   the control-plane daemon (svc-server)
  svc agent ...    the host daemon (svc-agent)
  svc ctl ...      the operator CLI (svcctl)
  svc NAME ...     any svc-NAME CLI: audit, events, identity, secrets, policy, cluster, ...
  svc completion SHELL  print the completion script for bash, zsh or fish
  svc man DIR      write the man pages (roff) into DIR

Options:
  --list           every name this binary answers to
  -h, --help       show help
  -v, --version    show the version
";

    #[test]
    fn svc_help_is_rendered_from_its_words_as_written() {
        assert_eq!(svc_help(), WRITTEN_SVC_HELP);
        let run: Vec<&str> = SVC_WORDS
            .iter()
            .filter(|word| word.run.is_some())
            .map(|word| word.word())
            .collect();
        assert_eq!(run, ["completion", "man"]);
    }
}
