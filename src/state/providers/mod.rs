//! Providers: one file per resource kind, each answering two questions about this host —
//! does it match the resource (check), and make it match (apply) — with the same code path, so
//! a check reports exactly what an apply would do.
//!
//! Shared rules: nothing is created implicitly (no parent directories), nothing that is not the
//! resource's own kind is replaced or removed (user data survives a wrong state file), and only
//! `command` resources use a shell; every other program is run with explicit arguments.

mod accounts;
mod archive;
mod attributes;
mod command;
mod cron;
mod diff;
mod directory;
mod download;
mod file;
mod git;
mod group;
mod line;
mod package;
mod pkgrepo;
mod process;
mod service;
mod symlink;
mod sysctl;
mod text;
mod tree;
mod user;

use std::collections::{HashMap, HashSet};
use std::fs::{self, FileType};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{validate, FileResource, Links, Mode, Outcome, Plan, Resource, RunOptions};

/// What a provider found (check) or did (apply).
#[derive(Debug)]
struct Report {
    changed: bool,
    detail: String,
}

impl Report {
    fn unchanged(detail: impl Into<String>) -> Self {
        Report {
            changed: false,
            detail: detail.into(),
        }
    }

    fn changed(detail: impl Into<String>) -> Self {
        Report {
            changed: true,
            detail: detail.into(),
        }
    }
}

/// What earlier resources of the plan would create: directories, users and groups. In check
/// mode they do not exist yet, and without this a file planned inside one, or owned by one,
/// would be reported as an error although the apply would succeed.
#[derive(Default)]
struct Planned {
    dirs: HashSet<PathBuf>,
    users: HashSet<String>,
    groups: HashSet<String>,
}

/// What a resource with an id did in this run, for the ones that wait for it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ran {
    Changed,
    Unchanged,
    /// Failed, or not run because something it required failed.
    Failed,
}

/// Whether a resource runs, given what its prerequisites did.
enum Gate {
    Run,
    /// A prerequisite failed: not run, and that is an error of its own.
    Blocked(String),
    /// `onchanges` and none of them changed: not run, nothing wrong.
    Quiet(String),
}

/// Everything a plan run shares: the template context, the options, and the directories
/// earlier resources would create.
struct Run<'a> {
    mode: Mode,
    options: &'a RunOptions,
    planned: Planned,
    /// `vars` at the top level and `facts`, as templates see them, and the engine, set up
    /// once for all the plan's templates.
    context: minijinja::Value,
    templates: minijinja::Environment<'static>,
    /// The values of the plan's secret vars, redacted from diffs.
    secrets: Vec<String>,
}

pub(super) fn run_plan(plan: &Plan, mode: Mode, options: &RunOptions) -> Vec<Outcome> {
    let mut context: serde_json::Map<String, serde_json::Value> =
        plan.vars.clone().into_iter().collect();
    context.insert("facts".into(), options.facts.clone());
    let secrets = plan
        .secret_vars
        .iter()
        .filter_map(|name| plan.vars.get(name))
        .map(|value| match value {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        })
        .filter(|text| !text.is_empty())
        .collect();
    let mut run = Run {
        mode,
        options,
        planned: Planned::default(),
        context: minijinja::Value::from_serialize(&context),
        templates: crate::template::environment(),
        secrets,
    };
    let mut ran: HashMap<&str, Ran> = HashMap::new();
    let no_links = Links::default();
    let mut diff_bytes = 0;
    plan.resources
        .iter()
        .enumerate()
        .map(|(index, resource)| {
            let links = plan.links_of(index).unwrap_or(&no_links);
            let (outcome, result) = match gate(links, &ran) {
                Gate::Run => {
                    let outcome = run_resource(resource, &mut run);
                    let result = match (&outcome.error, outcome.changed) {
                        (Some(_), _) => Ran::Failed,
                        (None, true) => Ran::Changed,
                        (None, false) => Ran::Unchanged,
                    };
                    (outcome, result)
                }
                Gate::Blocked(reason) => (
                    Outcome {
                        resource: resource.label(),
                        error: Some(reason),
                        ..Outcome::default()
                    },
                    Ran::Failed,
                ),
                Gate::Quiet(reason) => (
                    Outcome {
                        resource: resource.label(),
                        detail: reason,
                        ..Outcome::default()
                    },
                    Ran::Unchanged,
                ),
            };
            if let Some(id) = &links.id {
                ran.insert(id, result);
            }
            let mut outcome = outcome;
            bound_diffs(&mut outcome, &mut diff_bytes);
            outcome
        })
        .collect()
}

/// All of a run's diffs together: the reply must still fit in one bus message with the
/// outcomes (each diff is already cut at 16 KiB; a plan may change many files).
const MAX_DIFF_BYTES_PER_RUN: usize = 256 * 1024;

/// Replaces a diff by a one-line note once the run's diffs pass [`MAX_DIFF_BYTES_PER_RUN`].
fn bound_diffs(outcome: &mut Outcome, total: &mut usize) {
    let Some(diff) = &outcome.diff else {
        return;
    };
    *total += diff.len();
    if *total > MAX_DIFF_BYTES_PER_RUN {
        outcome.diff = Some(format!(
            "diff left out: this run's diffs passed {} KiB (check fewer files to see it)",
            MAX_DIFF_BYTES_PER_RUN / 1024
        ));
    }
}

/// A resource runs when nothing it waits for failed, and, with `onchanges`, when at least one
/// of those changed (in check mode: would change). The compiler put every prerequisite
/// earlier in the plan, so each has already run.
fn gate(links: &Links, ran: &HashMap<&str, Ran>) -> Gate {
    let result = |id: &String| ran.get(id.as_str()).copied().unwrap_or(Ran::Failed);
    if let Some(failed) = links.prerequisites().find(|id| result(id) == Ran::Failed) {
        return Gate::Blocked(format!(
            "not run: it requires '{failed}', which failed or was not run"
        ));
    }
    if !links.onchanges.is_empty() && !links.onchanges.iter().any(|id| result(id) == Ran::Changed) {
        return Gate::Quiet(format!(
            "not run: no change in {}",
            links.onchanges.join(", ")
        ));
    }
    Gate::Run
}

/// Checks or applies one resource. The agent runs what the server validated, but the values are
/// checked again here because this is the last stop before the host is touched.
fn run_resource(resource: &Resource, run: &mut Run) -> Outcome {
    let (mode, planned) = (run.mode, &mut run.planned);
    let mut diff = None;
    let result = validate::check_compiled(resource).and_then(|()| match resource {
        Resource::File(resource) if resource.template.is_some() => {
            render(resource, &run.templates, &run.context).and_then(|rendered| {
                file::run(
                    &rendered,
                    mode,
                    planned,
                    diff_request(run.options, mode, &run.secrets, &mut diff),
                )
            })
        }
        Resource::File(resource) => file::run(
            resource,
            mode,
            planned,
            diff_request(run.options, mode, &run.secrets, &mut diff),
        ),
        Resource::Directory(resource) => directory::run(resource, mode, planned),
        Resource::Symlink(resource) => symlink::run(resource, mode, planned),
        Resource::Package(resource) => package::run(resource, mode),
        Resource::Service(resource) => service::run(resource, mode),
        Resource::Command(resource) => command::run(resource, mode),
        Resource::Tree(resource) => tree::run(resource, mode, planned),
        Resource::User(resource) => user::run(resource, mode, planned),
        Resource::Group(resource) => group::run(resource, mode, planned),
        Resource::Cron(resource) => cron::run(resource, mode, planned),
        Resource::Sysctl(resource) => sysctl::run(resource, mode, planned),
        Resource::Line(resource) => line::run(resource, mode, planned),
        Resource::Pkgrepo(resource) => pkgrepo::run(resource, mode, planned),
        Resource::Archive(resource) => archive::run(resource, mode, planned),
        Resource::Git(resource) => git::run(resource, mode, planned),
    });
    match result {
        Ok(report) => Outcome {
            resource: resource.label(),
            changed: report.changed,
            detail: report.detail,
            error: None,
            diff,
        },
        Err(error) => Outcome {
            resource: resource.label(),
            error: Some(error),
            ..Outcome::default()
        },
    }
}

/// A file resource with its template rendered into `content` (this host's facts, the plan's
/// vars). An error names the template file and line.
fn render(
    file: &FileResource,
    env: &minijinja::Environment<'static>,
    context: &minijinja::Value,
) -> Result<FileResource, String> {
    let name = file.template.as_deref().unwrap_or_default();
    let text = file.content.as_deref().unwrap_or_default();
    let rendered = crate::template::render(env, name, text, context)?;
    Ok(FileResource {
        content: Some(rendered),
        template: None,
        ..file.clone()
    })
}

/// Where the file provider puts a diff: only in check mode, and only when asked for.
fn diff_request<'a>(
    options: &RunOptions,
    mode: Mode,
    secrets: &'a [String],
    slot: &'a mut Option<String>,
) -> Option<diff::Request<'a>> {
    (options.diff && mode == Mode::Check).then_some(diff::Request { secrets, slot })
}

/// No implicit mkdir: a missing parent is the operator's to create (with a `directory`
/// resource, which says its mode and owner). In check mode, a parent that an earlier resource
/// would create counts as there.
fn require_parent(path: &Path, planned: &Planned) -> Result<(), String> {
    let Some(parent) = path.parent() else {
        return Err(format!("{} has no parent directory", path.display()));
    };
    if planned.dirs.contains(parent) {
        return Ok(());
    }
    match fs::metadata(parent) {
        Ok(metadata) if metadata.is_dir() => Ok(()),
        Ok(_) => Err(format!("{} is not a directory", parent.display())),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Err(format!(
            "parent directory {} does not exist (add a directory resource before this one)",
            parent.display()
        )),
        Err(error) => Err(format!("cannot inspect {}: {error}", parent.display())),
    }
}

/// A fresh name next to `path` for a file or link that is renamed over it: same directory, so
/// the rename is atomic; hidden, and unique per process and call.
fn temporary_path_beside(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
    // The clock keeps a restarted agent that got the same pid off a crashed run's leftovers.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    path.with_file_name(format!(
        ".{name}.svc-{}-{unique}-{nanos}",
        std::process::id()
    ))
}

/// A new private file (0600, never an existing one, never through a symlink) holding `bytes`:
/// the start of every atomic replacement. The caller gives it its attributes and syncs it.
fn write_new_file(path: &Path, bytes: &[u8]) -> io::Result<fs::File> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(bytes)?;
    Ok(file)
}

/// Makes a rename in `directory` durable: without this, a crash right after the rename can
/// bring back the old entry.
fn sync_directory(directory: &Path) -> io::Result<()> {
    fs::File::open(directory)?.sync_all()
}

/// "a directory", "a symlink", ... for messages about what was found at a path.
fn describe(file_type: FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_file() {
        "a regular file"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symlink"
    } else if file_type.is_fifo() {
        "a fifo"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{
        run, CommandResource, DirectoryResource, FileResource, Plan, SymlinkResource,
    };

    /// The contract's promise: applying the same plan twice changes nothing the second time.
    #[test]
    fn a_second_apply_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let uid = unsafe { libc::getuid() }.to_string();
        let plan = Plan {
            resources: vec![
                Resource::Directory(DirectoryResource {
                    path: format!("{root}/app"),
                    mode: Some("0750".into()),
                    owner: Some(uid.clone()),
                    ..DirectoryResource::default()
                }),
                Resource::File(FileResource {
                    path: format!("{root}/app/config"),
                    content: Some("port = 80\n".into()),
                    mode: Some("0640".into()),
                    owner: Some(uid),
                    ..FileResource::default()
                }),
                Resource::File(FileResource {
                    path: format!("{root}/app/blob"),
                    content_base64: Some("AJ+SlgA=".into()),
                    ..FileResource::default()
                }),
                Resource::Symlink(SymlinkResource {
                    path: format!("{root}/current"),
                    target: "app".into(),
                    state: None,
                }),
                Resource::Command(CommandResource {
                    run: format!("echo built > {root}/app/built"),
                    creates: Some(format!("{root}/app/built")),
                    ..CommandResource::default()
                }),
            ],
            ..Plan::default()
        };
        // The files are checked inside a directory that does not exist yet but would be made.
        let check = run(&plan, Mode::Check, &RunOptions::default());
        for outcome in &check {
            assert!(outcome.changed && outcome.error.is_none(), "{outcome:?}");
        }
        assert!(!Path::new(root).join("app").exists());
        let first = run(&plan, Mode::Apply, &RunOptions::default());
        for outcome in &first {
            assert!(outcome.changed && outcome.error.is_none(), "{outcome:?}");
        }
        assert_eq!(
            fs::read(format!("{root}/app/blob")).unwrap(),
            [0, 159, 146, 150, 0]
        );
        let second = run(&plan, Mode::Apply, &RunOptions::default());
        for outcome in &second {
            assert!(!outcome.changed && outcome.error.is_none(), "{outcome:?}");
        }
        assert_eq!(second[0].resource, format!("directory:{root}/app"));
        assert_eq!(second[1].detail, "already in state");
        assert_eq!(run(&plan, Mode::Check, &RunOptions::default()), second);
    }

    #[test]
    fn a_failing_resource_does_not_stop_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let plan = Plan {
            resources: vec![
                Resource::File(FileResource {
                    path: format!("{root}/missing/file"),
                    ..FileResource::default()
                }),
                Resource::File(FileResource {
                    path: "relative".into(),
                    ..FileResource::default()
                }),
                // Planned directories only stand in for real ones in check mode.
                Resource::Directory(DirectoryResource {
                    path: format!("{root}/missing/sub"),
                    ..DirectoryResource::default()
                }),
                Resource::File(FileResource {
                    path: format!("{root}/file"),
                    ..FileResource::default()
                }),
            ],
            ..Plan::default()
        };
        let outcomes = run(&plan, Mode::Apply, &RunOptions::default());
        let errors: Vec<_> = outcomes.iter().map(|o| o.error.as_deref()).collect();
        assert!(errors[0].unwrap().contains("does not exist"), "{errors:?}");
        assert!(
            errors[1].unwrap().contains("must be absolute"),
            "{errors:?}"
        );
        assert!(errors[2].unwrap().contains("does not exist"), "{errors:?}");
        assert_eq!(errors[3], None);
        assert!(outcomes[3].changed);
        assert_eq!(fs::read(format!("{root}/file")).unwrap(), b"");
    }

    /// Compiles `yaml` (with `ROOT` replaced by `root`) from `dir`.
    fn plan_in(dir: &Path, root: &str, yaml: &str) -> Plan {
        crate::state::compile(&yaml.replace("ROOT", root), dir).unwrap()
    }

    fn summary(outcomes: &[Outcome]) -> Vec<(bool, String, Option<String>)> {
        outcomes
            .iter()
            .map(|o| (o.changed, o.detail.clone(), o.error.clone()))
            .collect()
    }

    /// The classic: a command stands in for "restart nginx", and runs exactly when the
    /// configuration it watches changed in this run (also in check mode, as "would run").
    #[test]
    fn onchanges_fires_exactly_when_a_watched_resource_changed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let yaml = |content: &str| {
            plan_in(
                dir.path(),
                root,
                &format!(
                    "\
- command: {{run: echo restart >> ROOT/restarts, onchanges: [conf, other]}}
- file: {{id: conf, path: ROOT/app.conf, content: \"{content}\"}}
- file: {{id: other, path: ROOT/other, content: same}}
"
                ),
            )
        };
        let restarts = || fs::read_to_string(dir.path().join("restarts")).unwrap_or_default();
        let options = RunOptions::default();
        let first = run(&yaml("port 80"), Mode::Apply, &options);
        assert!(
            first.iter().all(|o| o.changed && o.error.is_none()),
            "{first:?}"
        );
        // Sorted: the files first, then what watches them.
        assert_eq!(
            first[2].resource,
            format!("command:echo restart >> {root}/restarts")
        );
        assert_eq!(restarts(), "restart\n");

        let quiet = run(&yaml("port 80"), Mode::Apply, &options);
        assert_eq!(
            summary(&quiet)[2],
            (false, "not run: no change in conf, other".into(), None)
        );
        assert_eq!(restarts(), "restart\n");

        let check = run(&yaml("port 81"), Mode::Check, &options);
        assert_eq!(summary(&check)[2], (true, "would run".into(), None));
        assert_eq!(restarts(), "restart\n");
        let changed = run(&yaml("port 81"), Mode::Apply, &options);
        assert!(changed[0].changed && !changed[1].changed && changed[2].changed);
        assert_eq!(restarts(), "restart\nrestart\n");
    }

    #[test]
    fn a_failed_resource_skips_what_requires_it_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let plan = plan_in(
            dir.path(),
            root,
            "\
- file: {id: conf, path: ROOT/missing-dir/app.conf, content: x}
- command: {id: build, run: touch ROOT/built, require: conf}
- command: {run: touch ROOT/deployed, require: build}
- command: {run: touch ROOT/restarted, onchanges: conf}
- file: {path: ROOT/independent, content: y}
",
        );
        let outcomes = run(&plan, Mode::Apply, &RunOptions::default());
        let errors: Vec<Option<&str>> = outcomes.iter().map(|o| o.error.as_deref()).collect();
        assert!(errors[0].unwrap().contains("does not exist"), "{errors:?}");
        assert_eq!(
            errors[1..4],
            [
                Some("not run: it requires 'conf', which failed or was not run"),
                Some("not run: it requires 'build', which failed or was not run"),
                Some("not run: it requires 'conf', which failed or was not run"),
            ]
        );
        assert_eq!(errors[4], None);
        for never in ["built", "deployed", "restarted"] {
            assert!(!dir.path().join(never).exists(), "{never} ran");
        }
        assert!(dir.path().join("independent").exists());
    }

    #[test]
    fn templates_render_with_facts_and_vars_and_diffs_redact_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        fs::write(
            dir.path().join("app.conf.j2"),
            "host = {{ facts.hostname }}\nport = {{ port }}\npassword = {{ password }}\n",
        )
        .unwrap();
        let yaml = "vars: {port: 80}\nresources:\n  - file: {path: ROOT/app.conf, template: app.conf.j2}\n";
        let plan = crate::state::compile_with(
            &yaml.replace("ROOT", root),
            dir.path(),
            &[crate::state::Setting {
                name: "password".into(),
                value: "hunter2".into(),
                secret: true,
            }],
        )
        .unwrap();
        let options = RunOptions {
            facts: serde_json::json!({"hostname": "web-01"}),
            diff: true,
        };
        let check = run(&plan, Mode::Check, &options);
        let diff = check[0].diff.as_deref().unwrap();
        assert!(diff.starts_with("--- /dev/null\n"), "{diff}");
        assert!(
            diff.contains("+host = web-01\n+port = 80\n+password = <redacted>\n"),
            "{diff}"
        );
        assert!(!dir.path().join("app.conf").exists());
        let apply = run(&plan, Mode::Apply, &options);
        assert!(apply[0].changed && apply[0].diff.is_none(), "{apply:?}");
        assert_eq!(
            fs::read_to_string(dir.path().join("app.conf")).unwrap(),
            "host = web-01\nport = 80\npassword = hunter2\n"
        );
        assert!(!run(&plan, Mode::Apply, &options)[0].changed);
        // Another host renders another file: the check shows just that line.
        let elsewhere = RunOptions {
            facts: serde_json::json!({"hostname": "web-02"}),
            diff: true,
        };
        let check = run(&plan, Mode::Check, &elsewhere);
        let diff = check[0].diff.as_deref().unwrap();
        assert!(
            diff.contains("-host = web-01\n+host = web-02\n port = 80\n"),
            "{diff}"
        );
        // A fact the host does not have fails with the template's name and line.
        let bare = run(&plan, Mode::Apply, &RunOptions::default());
        let error = bare[0].error.as_deref().unwrap();
        assert!(
            error.starts_with("app.conf.j2 line 1: template: undefined value"),
            "{error}"
        );
    }

    /// pkgrepo, archive and git from a state file: compiled (key and archive inlined), checked
    /// inside a directory the plan would create, applied, and applied again without change.
    #[test]
    fn repositories_archives_and_checkouts_through_a_state_file() {
        let has_package_manager = ["apt-get", "dnf", "yum"]
            .iter()
            .any(|name| process::find_program(name).is_some());
        if !has_package_manager
            || process::find_program("git").is_none()
            || process::find_program("tar").is_none()
        {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let git = |arguments: &[&str]| {
            let status = std::process::Command::new("git")
                .args(["-c", "user.name=svc", "-c", "user.email=svc@example.com"])
                .args(arguments)
                .current_dir(dir.path())
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "git {arguments:?}");
        };
        git(&["init", "-q", "-b", "main", "site"]);
        fs::write(dir.path().join("site/index.html"), "hello\n").unwrap();
        git(&["-C", "site", "add", "index.html"]);
        git(&["-C", "site", "commit", "-q", "-m", "first"]);
        git(&["clone", "-q", "--bare", "site", "site.git"]);
        fs::create_dir(dir.path().join("payload")).unwrap();
        fs::write(dir.path().join("payload/tool"), "#!/bin/sh\n").unwrap();
        let tar = std::process::Command::new("tar")
            .args(["-czf", "tool.tar.gz", "-C", "payload", "tool"])
            .current_dir(dir.path())
            .status()
            .unwrap();
        assert!(tar.success());
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            fs::read(dir.path().join("tool.tar.gz")).unwrap(),
        ));
        fs::write(
            dir.path().join("example.asc"),
            "-----BEGIN PGP PUBLIC KEY BLOCK-----\nmQINBGR0ZXN0\n-----END PGP PUBLIC KEY BLOCK-----\n",
        )
        .unwrap();
        let yaml = format!(
            "\
- directory: {{path: ROOT/srv}}
- directory: {{path: ROOT/srv/repos}}
- pkgrepo:
    name: example
    dir: ROOT/srv/repos
    keyring_dir: ROOT/srv/repos
    apt: {{uri: 'https://deb.example.com/debian', suite: bookworm, components: [main], key_source: example.asc}}
    yum: {{baseurl: 'https://rpm.example.com/el9/', key_source: example.asc}}
- archive: {{path: ROOT/srv/tool, source: tool.tar.gz, sha256: {digest}, mkdir: true}}
- git: {{path: ROOT/srv/site, repo: ROOT/site.git}}
"
        );
        let plan = plan_in(dir.path(), root, &yaml);
        let options = RunOptions::default();
        let check = run(&plan, Mode::Check, &options);
        for outcome in &check {
            assert!(outcome.changed && outcome.error.is_none(), "{outcome:?}");
        }
        assert!(!dir.path().join("srv").exists());
        let first = run(&plan, Mode::Apply, &options);
        for outcome in &first {
            assert!(outcome.changed && outcome.error.is_none(), "{outcome:?}");
        }
        let repos: Vec<String> = fs::read_dir(dir.path().join("srv/repos"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(repos.len(), 2, "{repos:?}");
        assert_eq!(
            fs::read_to_string(dir.path().join("srv/tool/tool")).unwrap(),
            "#!/bin/sh\n"
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("srv/site/index.html")).unwrap(),
            "hello\n"
        );
        let labels: Vec<&str> = first.iter().map(|o| o.resource.as_str()).collect();
        assert_eq!(
            labels[2..],
            [
                "pkgrepo:example".to_string(),
                format!("archive:{root}/srv/tool"),
                format!("git:{root}/srv/site"),
            ]
        );
        for mode in [Mode::Apply, Mode::Check] {
            for outcome in run(&plan, mode, &options) {
                assert!(!outcome.changed && outcome.error.is_none(), "{outcome:?}");
            }
        }
    }

    /// Check mode counts directories the plan would create for every kind that writes a file
    /// into one, not only for files: the check of a new application's directory and its
    /// configuration succeeds and says what the apply would do.
    #[test]
    fn check_mode_sees_directories_an_earlier_resource_would_create() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let plan = plan_in(
            dir.path(),
            root,
            "\
- directory: {path: ROOT/etc}
- line: {path: ROOT/etc/app.conf, line: port = 80, create: true}
- cron: {name: svc-check-test, schedule: '@daily', run: /bin/true, file: ROOT/etc/cron-svc}
- sysctl: {name: vm.swappiness, value: '10', file: ROOT/etc/sysctl.conf, runtime: false}
",
        );
        let check = run(&plan, Mode::Check, &RunOptions::default());
        for outcome in &check {
            assert!(outcome.changed && outcome.error.is_none(), "{outcome:?}");
        }
        assert!(!dir.path().join("etc").exists(), "check changed the host");
        let apply = run(&plan, Mode::Apply, &RunOptions::default());
        assert!(
            apply.iter().all(|o| o.changed && o.error.is_none()),
            "{apply:?}"
        );
        let again = run(&plan, Mode::Apply, &RunOptions::default());
        assert!(
            again.iter().all(|o| !o.changed && o.error.is_none()),
            "{again:?}"
        );
    }

    /// Users and groups an earlier resource would create own files in check mode as they will
    /// in the apply (no account is created: check mode only reads /etc/passwd and /etc/group).
    #[test]
    fn check_mode_sees_users_and_groups_an_earlier_resource_would_create() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let plan = plan_in(
            dir.path(),
            root,
            "\
- group: {name: svc-chk-grp}
- user: {name: svc-chk-usr}
- directory: {path: ROOT/data, owner: svc-chk-usr, group: svc-chk-grp}
- file: {path: ROOT/app.conf, content: x, owner: svc-chk-usr, group: svc-chk-usr}
- file: {path: ROOT/other.conf, content: x, owner: svc-chk-nobody}
",
        );
        let check = run(&plan, Mode::Check, &RunOptions::default());
        for outcome in &check[..4] {
            assert!(outcome.changed && outcome.error.is_none(), "{outcome:?}");
        }
        // A user nothing creates is still an error, as the apply would find.
        let error = check[4].error.as_deref().unwrap_or_default();
        assert!(error.contains("unknown user 'svc-chk-nobody'"), "{check:?}");
        assert!(!dir.path().join("data").exists(), "check changed the host");
    }

    #[test]
    fn a_run_s_diffs_are_bounded_together() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        // 40 new files of 12 KiB each: every diff fits its own cap, all of them do not.
        let line = "x".repeat(100);
        let content: String = (0..120).map(|_| format!("{line}\\n")).collect();
        let yaml: String = (0..40)
            .map(|i| format!("- file: {{path: ROOT/f{i}, content: \"{content}\"}}\n"))
            .collect();
        let plan = plan_in(dir.path(), root, &yaml);
        let options = RunOptions {
            diff: true,
            ..RunOptions::default()
        };
        let check = run(&plan, Mode::Check, &options);
        let total: usize = check
            .iter()
            .filter_map(|o| o.diff.as_ref())
            .map(String::len)
            .sum();
        assert!(total <= MAX_DIFF_BYTES_PER_RUN + 40 * 100, "{total}");
        assert!(check[0]
            .diff
            .as_deref()
            .unwrap()
            .starts_with("--- /dev/null"));
        assert!(check[39]
            .diff
            .as_deref()
            .unwrap()
            .starts_with("diff left out"));
    }

    #[test]
    fn run_refuses_uncompiled_sources() {
        let plan = Plan {
            resources: vec![Resource::File(FileResource {
                path: "/tmp/never-written".into(),
                source: Some("motd".into()),
                ..FileResource::default()
            })],
            ..Plan::default()
        };
        let outcomes = run(&plan, Mode::Apply, &RunOptions::default());
        assert!(outcomes[0]
            .error
            .as_deref()
            .unwrap()
            .contains("source must be compiled"));
    }
}

/// Stand-ins for the host's tools (apt-get, rpm, systemctl), so the providers' apply paths run
/// for real in tests without changing the machine.
#[cfg(test)]
pub(super) mod fake {
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};

    /// Writes an executable `/bin/sh` script `name` in `dir`. A script answers `probe` with
    /// exit 0 before its `body` runs: the first run is a probe, retried while the kernel says
    /// "text file busy" — a child forked by another test thread while the file was open for
    /// writing holds that descriptor until it execs.
    pub fn program(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        let script = format!("#!/bin/sh\n[ \"$1\" = probe ] && exit 0\n{body}\n");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        for _ in 0..100 {
            match std::process::Command::new(&path).arg("probe").status() {
                Ok(status) if status.success() => return path,
                Err(error) if error.raw_os_error() == Some(libc::ETXTBSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => panic!("{}: {other:?}", path.display()),
            }
        }
        panic!("{} stayed busy", path.display());
    }
}
