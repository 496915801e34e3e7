//! `git`: a checkout of `repo` at a branch, tag or commit, through the `git` program with
//! explicit arguments (`git -C PATH ...`) and GIT_TERMINAL_PROMPT=0, so a repository that
//! wants a password fails instead of waiting for a terminal that is not there.
//!
//! Where the checkout should be is asked of the remote first, with `git ls-remote`, which
//! changes nothing locally, so check and apply take the same path: a branch is at the remote's
//! tip now (every run asks), a tag is at the commit it names, a commit id is itself (and needs
//! no remote at all once it is checked out). The checkout is in state when HEAD is that commit,
//! on that branch for a branch, with no change to a tracked file.
//!
//! Applying makes the checkout one step at a time, so a run that stops halfway is finished by
//! the next: `git init` and `git remote add origin` for a new one, a fetch of exactly the rev
//! (`--depth` when given), then `git checkout -B BRANCH origin/BRANCH` for a branch (the local
//! branch tracks the remote one) or `git checkout --detach COMMIT`. Changes to tracked files
//! are an error unless `force`, which checks out with `--force`; untracked files (logs, build
//! output) are left alone either way. Submodules are not managed.

use std::fs;
use std::io;
use std::path::Path;
use std::time::Duration;

use super::process::{self, Finished};
use super::{describe, require_parent, Planned, Report};
use crate::state::{validate, GitResource, Mode};

/// Cloning or fetching a large repository over a slow link.
const NETWORK_TIMEOUT: Duration = Duration::from_secs(600);
/// Questions about the local checkout.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(60);
/// Commit ids in messages.
const SHORT: usize = 12;

/// What the resource asks for, once the remote has said where it is.
#[derive(Debug, PartialEq)]
enum Rev {
    /// A branch, and the commit the remote has it at.
    Branch {
        name: String,
        commit: String,
    },
    /// A tag, and the commit it names (peeled).
    Tag {
        name: String,
        commit: String,
    },
    Commit(String),
}

impl Rev {
    fn commit(&self) -> &str {
        match self {
            Rev::Branch { commit, .. } | Rev::Tag { commit, .. } => commit,
            Rev::Commit(commit) => commit,
        }
    }

    /// "abcdef012345 (branch main)", for messages.
    fn describe(&self, commit: &str) -> String {
        let short = short(commit);
        match self {
            Rev::Branch { name, .. } => format!("{short} (branch {name})"),
            Rev::Tag { name, .. } => format!("{short} (tag {name})"),
            Rev::Commit(_) => short.to_string(),
        }
    }
}

/// What is at the path now.
enum Current {
    /// Nothing, or an empty directory: a checkout is made there.
    Nothing,
    Checkout(Checkout),
}

struct Checkout {
    origin: Option<String>,
    /// None before the first checkout (a run that stopped after `git init`).
    head: Option<String>,
    /// None when HEAD is detached.
    branch: Option<String>,
    /// Tracked files with changes, as `git status --porcelain` lists them.
    changes: Vec<String>,
}

pub(super) fn run(git: &GitResource, mode: Mode, planned: &mut Planned) -> Result<Report, String> {
    let program = process::find_program("git").ok_or("git is not installed")?;
    Git {
        program: &program,
        path: Path::new(&git.path),
    }
    .run_resource(git, mode, planned)
}

/// The git program and the checkout it works on.
struct Git<'a> {
    program: &'a Path,
    path: &'a Path,
}

impl Git<'_> {
    fn run_resource(
        &self,
        git: &GitResource,
        mode: Mode,
        planned: &mut Planned,
    ) -> Result<Report, String> {
        let force = git.force == Some(true);
        let current = self.inspect(planned)?;
        // No origin at all is a checkout this provider began (a run stopped after git init):
        // it is finished, not refused.
        if let Current::Checkout(Checkout {
            origin: Some(origin),
            ..
        }) = &current
        {
            if *origin != git.repo && !force {
                return Err(format!(
                    "{} is a checkout of {origin}, not {} (force: true repoints origin)",
                    self.path.display(),
                    git.repo
                ));
            }
        }
        let wanted = self.resolve(git)?;
        let checkout = match current {
            Current::Nothing => {
                let action = format!("clone {} at {}", git.repo, wanted.describe(wanted.commit()));
                if mode == Mode::Check {
                    planned.dirs.insert(self.path.to_path_buf());
                    return Ok(Report::changed(format!("would {action}")));
                }
                self.create(&git.repo)?;
                let head = self.update(git, &wanted, false)?;
                return Ok(Report::changed(format!(
                    "cloned {} at {}",
                    git.repo,
                    wanted.describe(&head)
                )));
            }
            Current::Checkout(checkout) => checkout,
        };
        let is_at_rev = checkout.head.as_deref() == Some(wanted.commit())
            && match &wanted {
                Rev::Branch { name, .. } => checkout.branch.as_deref() == Some(name.as_str()),
                Rev::Tag { .. } | Rev::Commit(_) => true,
            };
        let has_origin = checkout.origin.as_deref() == Some(git.repo.as_str());
        if is_at_rev && checkout.changes.is_empty() && has_origin {
            return Ok(Report::unchanged(format!(
                "already at {}",
                wanted.describe(wanted.commit())
            )));
        }
        if !checkout.changes.is_empty() && !force {
            return Err(format!(
                "local changes to {} tracked file(s) in {}: {} (commit or discard them, or set \
                 force: true)",
                checkout.changes.len(),
                self.path.display(),
                summarize(&checkout.changes)
            ));
        }
        // Each step as a check announces it and as an apply reports it.
        let mut would = Vec::new();
        let mut did = Vec::new();
        match &checkout.origin {
            None => {
                would.push(format!("add origin {}", git.repo));
                did.push(format!("added origin {}", git.repo));
            }
            Some(origin) if *origin != git.repo => {
                let what = format!("origin from {origin} to {}", git.repo);
                would.push(format!("repoint {what}"));
                did.push(format!("repointed {what}"));
            }
            Some(_) => {}
        }
        if !checkout.changes.is_empty() {
            let what = format!(
                "local changes to {} tracked file(s)",
                checkout.changes.len()
            );
            would.push(format!("discard {what}"));
            did.push(format!("discarded {what}"));
        }
        let from = checkout
            .head
            .as_deref()
            .map_or("nothing".to_string(), |head| match &checkout.branch {
                Some(branch) => format!("{} (branch {branch})", short(head)),
                None => short(head).to_string(),
            });
        if mode == Mode::Check {
            if !is_at_rev {
                would.push(format!(
                    "fetch and move from {from} to {}",
                    wanted.describe(wanted.commit())
                ));
            }
            return Ok(Report::changed(format!("would {}", would.join(", "))));
        }
        if checkout.origin.is_none() {
            self.git(&["remote", "add", "origin", &git.repo], LOCAL_TIMEOUT)?;
        } else if !has_origin {
            self.git(&["remote", "set-url", "origin", &git.repo], LOCAL_TIMEOUT)?;
        }
        let head = self.update(git, &wanted, force)?;
        if !is_at_rev || head != wanted.commit() {
            did.push(format!("moved from {from} to {}", wanted.describe(&head)));
        }
        Ok(Report::changed(did.join(", ")))
    }

    /// What is at the path: nothing (or an empty directory), a checkout whose top is the path,
    /// or an error for anything else, which is never touched.
    fn inspect(&self, planned: &Planned) -> Result<Current, String> {
        let path = self.path;
        match fs::symlink_metadata(path) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                require_parent(path, planned)?;
                return Ok(Current::Nothing);
            }
            Err(error) => return Err(format!("cannot inspect {}: {error}", path.display())),
            Ok(metadata) if !metadata.is_dir() => {
                return Err(format!(
                    "{} is {}, not a directory; refusing to replace it",
                    path.display(),
                    describe(metadata.file_type())
                ))
            }
            Ok(_) => {}
        }
        let mut entries =
            fs::read_dir(path).map_err(|error| format!("reading {}: {error}", path.display()))?;
        if entries.next().is_none() {
            return Ok(Current::Nothing);
        }
        if fs::symlink_metadata(path.join(".git")).is_err() {
            return Err(format!(
                "{} is not empty and not a git checkout; refusing to touch it",
                path.display()
            ));
        }
        let top = self.git(&["rev-parse", "--show-toplevel"], LOCAL_TIMEOUT)?;
        let canonical = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if Path::new(top.stdout.trim_end()) != canonical {
            return Err(format!(
                "{} is inside the checkout {}, not one of its own",
                path.display(),
                top.stdout.trim_end()
            ));
        }
        let origin = self.ask(&["config", "--get", "remote.origin.url"])?;
        let head = self.ask(&["rev-parse", "-q", "--verify", "HEAD^{commit}"])?;
        let branch = self.ask(&["symbolic-ref", "-q", "--short", "HEAD"])?;
        // Only tracked files: untracked ones are not the checkout's.
        let status = self.git(
            &["status", "--porcelain", "--untracked-files=no"],
            LOCAL_TIMEOUT,
        )?;
        Ok(Current::Checkout(Checkout {
            origin,
            branch: branch.filter(|_| head.is_some()),
            head,
            changes: status
                .stdout
                .lines()
                .filter(|line| !line.is_empty())
                .map(str::to_string)
                .collect(),
        }))
    }

    /// Where the resource wants the checkout, asking the remote unless the rev is a commit.
    fn resolve(&self, git: &GitResource) -> Result<Rev, String> {
        let repo = git.repo.as_str();
        let Some(rev) = &git.rev else {
            let listing = self.ls_remote(&["--symref", "--", repo, "HEAD"])?;
            let branch = listing.iter().find_map(|(object, name)| {
                (name == "HEAD")
                    .then(|| object.strip_prefix("ref: refs/heads/"))
                    .flatten()
            });
            let commit = listing
                .iter()
                .find(|(object, name)| name == "HEAD" && !object.starts_with("ref: "));
            return match (branch, commit) {
                (Some(branch), Some((commit, _))) => Ok(Rev::Branch {
                    name: branch.to_string(),
                    commit: commit.clone(),
                }),
                _ => Err(format!(
                    "{repo} does not say which branch is its default (an empty repository, or a \
                     server too old for --symref); give rev"
                )),
            };
        };
        if validate::is_commit_id(rev) {
            return Ok(Rev::Commit(rev.to_ascii_lowercase()));
        }
        let branch = format!("refs/heads/{rev}");
        let tag = format!("refs/tags/{rev}");
        let peeled = format!("{tag}^{{}}");
        // An annotated tag is listed as the tag object; its commit only when asked by name.
        let listing = self.ls_remote(&["--", repo, &branch, &tag, &peeled])?;
        let find = |wanted: &str| {
            listing
                .iter()
                .find(|(_, name)| name == wanted)
                .map(|(commit, _)| commit.clone())
        };
        // A branch wins over a tag of the same name, as `git clone --branch` decides.
        if let Some(commit) = find(&branch) {
            return Ok(Rev::Branch {
                name: rev.clone(),
                commit,
            });
        }
        match find(&peeled).or_else(|| find(&tag)) {
            Some(commit) => Ok(Rev::Tag {
                name: rev.clone(),
                commit,
            }),
            None => Err(format!("{repo} has no branch or tag '{rev}'")),
        }
    }

    /// `git ls-remote` as (object, ref name) pairs.
    fn ls_remote(&self, arguments: &[&str]) -> Result<Vec<(String, String)>, String> {
        let mut all = vec!["ls-remote"];
        all.extend_from_slice(arguments);
        let finished = self.run_git(None, &all, NETWORK_TIMEOUT)?;
        expect_success(self.program, &all, &finished)?;
        Ok(finished
            .stdout
            .lines()
            .filter_map(|line| line.split_once('\t'))
            .map(|(object, name)| (object.to_string(), name.to_string()))
            .collect())
    }

    /// `git init` and `origin`, one level of directory like a directory resource would make.
    fn create(&self, repo: &str) -> Result<(), String> {
        let path = self.path.to_string_lossy();
        self.run_git(None, &["init", "-q", "--", &path], LOCAL_TIMEOUT)
            .and_then(|finished| expect_success(self.program, &["init"], &finished))?;
        self.git(&["remote", "add", "origin", repo], LOCAL_TIMEOUT)?;
        Ok(())
    }

    /// Fetches the rev and checks it out; returns the commit HEAD is at afterwards (for a
    /// branch, the tip as fetched, which may be newer than what ls-remote said).
    fn update(&self, git: &GitResource, wanted: &Rev, force: bool) -> Result<String, String> {
        let depth = git.depth.map(|depth| format!("--depth={depth}"));
        let fetch = |refspec: &str| {
            let mut arguments = vec!["fetch", "-q", "--no-tags"];
            arguments.extend(depth.as_deref());
            arguments.extend(["origin", refspec]);
            self.git(&arguments, NETWORK_TIMEOUT)
        };
        let mut checkout = vec!["checkout", "-q"];
        if force {
            checkout.push("--force");
        }
        let tracking;
        let commit;
        match wanted {
            Rev::Branch { name, .. } => {
                tracking = format!("refs/remotes/origin/{name}");
                fetch(&format!("+refs/heads/{name}:{tracking}"))?;
                checkout.extend(["-B", name, &tracking]);
            }
            Rev::Tag { name, .. } => {
                fetch(&format!("+refs/tags/{name}:refs/tags/{name}"))?;
                commit = self
                    .git(
                        &[
                            "rev-parse",
                            "--verify",
                            &format!("refs/tags/{name}^{{commit}}"),
                        ],
                        LOCAL_TIMEOUT,
                    )?
                    .stdout
                    .trim_end()
                    .to_string();
                checkout.extend(["--detach", &commit]);
            }
            Rev::Commit(id) => {
                if !self.has_commit(id)? {
                    // Servers that refuse a want of a bare commit id still give their branches.
                    if fetch(id).is_err() {
                        fetch("+refs/heads/*:refs/remotes/origin/*")?;
                    }
                    if !self.has_commit(id)? {
                        return Err(format!("{} has no commit {id}", git.repo));
                    }
                }
                checkout.extend(["--detach", id.as_str()]);
            }
        }
        self.git(&checkout, NETWORK_TIMEOUT)?;
        let head = self.git(&["rev-parse", "--verify", "HEAD"], LOCAL_TIMEOUT)?;
        Ok(head.stdout.trim_end().to_string())
    }

    fn has_commit(&self, id: &str) -> Result<bool, String> {
        let object = format!("{id}^{{commit}}");
        let finished =
            self.run_git(Some(self.path), &["cat-file", "-e", &object], LOCAL_TIMEOUT)?;
        Ok(finished.is_success())
    }

    /// `git -C PATH ARGUMENTS`, which must succeed.
    fn git(&self, arguments: &[&str], timeout: Duration) -> Result<Finished, String> {
        let finished = self.run_git(Some(self.path), arguments, timeout)?;
        expect_success(self.program, arguments, &finished)?;
        Ok(finished)
    }

    /// A question whose "no" is exit 1 with nothing said: the trimmed answer, or None.
    fn ask(&self, arguments: &[&str]) -> Result<Option<String>, String> {
        let finished = self.run_git(Some(self.path), arguments, LOCAL_TIMEOUT)?;
        match finished.status.and_then(|status| status.code()) {
            Some(0) => Ok(Some(finished.stdout.trim_end().to_string())),
            Some(1) => Ok(None),
            _ => Err(failure(self.program, arguments, &finished)),
        }
    }

    fn run_git(
        &self,
        directory: Option<&Path>,
        arguments: &[&str],
        timeout: Duration,
    ) -> Result<Finished, String> {
        let directory = directory.map(|path| path.to_string_lossy().into_owned());
        let mut all: Vec<&str> = Vec::with_capacity(arguments.len() + 2);
        if let Some(directory) = &directory {
            all.extend(["-C", directory.as_str()]);
        }
        all.extend_from_slice(arguments);
        // No prompt for credentials: there is no terminal, and a run must end.
        process::run_program(self.program, &all, &[("GIT_TERMINAL_PROMPT", "0")], timeout)
    }
}

fn expect_success(program: &Path, arguments: &[&str], finished: &Finished) -> Result<(), String> {
    if finished.is_success() {
        Ok(())
    } else {
        Err(failure(program, arguments, finished))
    }
}

fn failure(program: &Path, arguments: &[&str], finished: &Finished) -> String {
    format!(
        "{} {}: {}{}",
        program.display(),
        arguments.join(" "),
        finished.describe_status(),
        finished.output_suffix()
    )
}

fn short(commit: &str) -> &str {
    &commit[..SHORT.min(commit.len())]
}

/// The first few changed files, for an error message.
fn summarize(changes: &[String]) -> String {
    let shown: Vec<&str> = changes
        .iter()
        .take(5)
        .map(|line| line.get(3..).unwrap_or(line))
        .collect();
    let more = changes.len().saturating_sub(shown.len());
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::super::download::loopback::Server;
    use super::*;
    use std::path::PathBuf;

    /// A bare repository (`remote.git`) with two commits on main, an annotated tag `v1` on the
    /// first and a branch `other`, made through a work tree (`work`) the tests commit more to.
    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Option<Fixture> {
            process::find_program("git")?;
            let fixture = Fixture {
                dir: tempfile::tempdir().unwrap(),
            };
            fixture.git_in(".", &["init", "-q", "-b", "main", "work"]);
            fixture.commit("README", "one\n");
            fixture.git_in("work", &["tag", "-a", "v1", "-m", "version 1"]);
            fixture.commit("README", "two\n");
            fixture.git_in("work", &["branch", "other", "HEAD~1"]);
            fixture.git_in(".", &["clone", "-q", "--bare", "work", "remote.git"]);
            Some(fixture)
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        fn repo(&self) -> String {
            self.path("remote.git").to_str().unwrap().into()
        }

        /// git in `directory` (relative to the fixture), with a fixed identity; its stdout.
        fn git_in(&self, directory: &str, arguments: &[&str]) -> String {
            let output = std::process::Command::new("git")
                .args(["-c", "user.name=svc", "-c", "user.email=svc@example.com"])
                .args(arguments)
                .current_dir(self.path(directory))
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "git {arguments:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8(output.stdout)
                .unwrap()
                .trim_end()
                .to_string()
        }

        /// Commits `content` to `file` in the work tree; returns the commit.
        fn commit(&self, file: &str, content: &str) -> String {
            fs::write(self.path("work").join(file), content).unwrap();
            self.git_in("work", &["add", file]);
            self.git_in("work", &["commit", "-q", "-m", content.trim()]);
            self.git_in("work", &["rev-parse", "HEAD"])
        }

        fn push(&self) {
            self.git_in("work", &["push", "-q", "../remote.git", "main"]);
        }

        fn resource(&self, rev: Option<&str>) -> GitResource {
            GitResource {
                path: self.path("checkout").to_str().unwrap().into(),
                repo: self.repo(),
                rev: rev.map(str::to_string),
                ..GitResource::default()
            }
        }

        fn head(&self) -> String {
            self.git_in("checkout", &["rev-parse", "HEAD"])
        }
    }

    fn outcome(git: &GitResource, mode: Mode) -> Result<(bool, String), String> {
        run(git, mode, &mut Planned::default()).map(|report| (report.changed, report.detail))
    }

    #[test]
    fn clones_the_default_branch_then_follows_its_tip() {
        let Some(fixture) = Fixture::new() else {
            return;
        };
        let git = fixture.resource(None);
        let tip = fixture.git_in("work", &["rev-parse", "HEAD"]);
        let at_tip = format!("{} (branch main)", &tip[..12]);
        assert_eq!(
            outcome(&git, Mode::Check).unwrap(),
            (true, format!("would clone {} at {at_tip}", fixture.repo()))
        );
        assert!(!fixture.path("checkout").exists(), "check cloned");
        assert_eq!(
            outcome(&git, Mode::Apply).unwrap(),
            (true, format!("cloned {} at {at_tip}", fixture.repo()))
        );
        assert_eq!(
            fs::read_to_string(fixture.path("checkout/README")).unwrap(),
            "two\n"
        );
        assert_eq!(fixture.head(), tip);
        // On a local branch that tracks the remote one, as after a git clone.
        assert_eq!(
            fixture.git_in(
                "checkout",
                &["rev-parse", "--abbrev-ref", "main@{upstream}"]
            ),
            "origin/main"
        );
        for mode in [Mode::Apply, Mode::Check] {
            assert_eq!(
                outcome(&git, mode).unwrap(),
                (false, format!("already at {at_tip}"))
            );
        }

        // The remote moves on: a check says so and changes nothing, an apply follows.
        let newer = fixture.commit("README", "three\n");
        fixture.push();
        let moved = format!(
            "move from {} (branch main) to {} (branch main)",
            &tip[..12],
            &newer[..12]
        );
        assert_eq!(
            outcome(&git, Mode::Check).unwrap(),
            (true, format!("would fetch and {moved}"))
        );
        assert_eq!(fixture.head(), tip);
        assert_eq!(
            outcome(&git, Mode::Apply).unwrap(),
            (true, format!("{}d{}", &moved[..4], &moved[4..]))
        );
        assert_eq!(fixture.head(), newer);
        assert!(!outcome(&git, Mode::Apply).unwrap().0);
    }

    #[test]
    fn tags_and_commits_are_detached_checkouts() {
        let Some(fixture) = Fixture::new() else {
            return;
        };
        let first = fixture.git_in("work", &["rev-parse", "v1^{commit}"]);
        let tag = fixture.resource(Some("v1"));
        assert_eq!(
            outcome(&tag, Mode::Apply).unwrap(),
            (
                true,
                format!("cloned {} at {} (tag v1)", fixture.repo(), &first[..12])
            )
        );
        assert_eq!(fixture.head(), first);
        assert_eq!(
            fs::read_to_string(fixture.path("checkout/README")).unwrap(),
            "one\n"
        );
        assert!(!outcome(&tag, Mode::Apply).unwrap().0);

        // From the tag to a branch of the same commit, then to a commit id.
        let other = fixture.resource(Some("other"));
        assert_eq!(
            outcome(&other, Mode::Apply).unwrap().1,
            format!(
                "moved from {short} to {short} (branch other)",
                short = &first[..12]
            )
        );
        let second = fixture.git_in("work", &["rev-parse", "main"]);
        let commit = fixture.resource(Some(&second));
        assert_eq!(
            outcome(&commit, Mode::Check).unwrap(),
            (
                true,
                format!(
                    "would fetch and move from {} (branch other) to {}",
                    &first[..12],
                    &second[..12]
                )
            )
        );
        assert!(outcome(&commit, Mode::Apply).unwrap().0);
        assert_eq!(fixture.head(), second);
        // A commit id needs no remote once it is checked out.
        fs::rename(fixture.path("remote.git"), fixture.path("moved.git")).unwrap();
        assert_eq!(
            outcome(&commit, Mode::Apply).unwrap(),
            (false, format!("already at {}", &second[..12]))
        );
        let error = outcome(&other, Mode::Check).unwrap_err();
        assert!(error.contains("ls-remote"), "{error}");
    }

    #[test]
    fn local_changes_are_an_error_unless_forced() {
        let Some(fixture) = Fixture::new() else {
            return;
        };
        let git = fixture.resource(Some("main"));
        assert!(outcome(&git, Mode::Apply).unwrap().0);
        let checkout = fixture.path("checkout");
        // Untracked files are not the checkout's: still in state.
        fs::write(checkout.join("build.log"), "output\n").unwrap();
        assert!(!outcome(&git, Mode::Apply).unwrap().0);

        fs::write(checkout.join("README"), "edited\n").unwrap();
        let expected = format!(
            "local changes to 1 tracked file(s) in {}: README (commit or discard them, or set \
             force: true)",
            checkout.display()
        );
        for mode in [Mode::Check, Mode::Apply] {
            assert_eq!(outcome(&git, mode).unwrap_err(), expected);
        }
        assert_eq!(
            fs::read_to_string(checkout.join("README")).unwrap(),
            "edited\n"
        );

        let forced = GitResource {
            force: Some(true),
            ..git
        };
        assert_eq!(
            outcome(&forced, Mode::Check).unwrap(),
            (
                true,
                "would discard local changes to 1 tracked file(s)".into()
            )
        );
        assert_eq!(
            outcome(&forced, Mode::Apply).unwrap(),
            (true, "discarded local changes to 1 tracked file(s)".into())
        );
        assert_eq!(
            fs::read_to_string(checkout.join("README")).unwrap(),
            "two\n"
        );
        assert_eq!(
            fs::read_to_string(checkout.join("build.log")).unwrap(),
            "output\n"
        );
        assert!(!outcome(&forced, Mode::Apply).unwrap().0);
    }

    /// A run that stopped after `git init` (no origin, no commit) is finished by the next.
    #[test]
    fn a_checkout_begun_is_finished() {
        let Some(fixture) = Fixture::new() else {
            return;
        };
        fixture.git_in(".", &["init", "-q", "checkout"]);
        let git = fixture.resource(Some("main"));
        let tip = fixture.git_in("work", &["rev-parse", "main"]);
        let expected = format!(
            "add origin {}, fetch and move from nothing to {} (branch main)",
            fixture.repo(),
            &tip[..12]
        );
        assert_eq!(
            outcome(&git, Mode::Check).unwrap(),
            (true, format!("would {expected}"))
        );
        assert_eq!(
            outcome(&git, Mode::Apply).unwrap(),
            (
                true,
                format!(
                    "added origin {}, moved from nothing to {} (branch main)",
                    fixture.repo(),
                    &tip[..12]
                )
            )
        );
        assert_eq!(fixture.head(), tip);
        assert!(!outcome(&git, Mode::Apply).unwrap().0);

        // Repointing another repository's checkout takes force.
        let mirror = fixture.path("mirror.git");
        fixture.git_in(".", &["clone", "-q", "--bare", "remote.git", "mirror.git"]);
        let moved = GitResource {
            repo: mirror.to_str().unwrap().into(),
            force: Some(true),
            ..git
        };
        assert_eq!(
            outcome(&moved, Mode::Apply).unwrap(),
            (
                true,
                format!(
                    "repointed origin from {} to {}",
                    fixture.repo(),
                    mirror.display()
                )
            )
        );
        assert_eq!(
            fixture.git_in("checkout", &["config", "--get", "remote.origin.url"]),
            mirror.to_str().unwrap()
        );
        assert!(!outcome(&moved, Mode::Apply).unwrap().0);
    }

    #[test]
    fn depth_makes_a_shallow_checkout() {
        let Some(fixture) = Fixture::new() else {
            return;
        };
        let git = GitResource {
            depth: Some(1),
            ..fixture.resource(Some("main"))
        };
        assert!(outcome(&git, Mode::Apply).unwrap().0);
        assert_eq!(
            fixture.git_in("checkout", &["rev-list", "--count", "HEAD"]),
            "1"
        );
        assert_eq!(
            fixture.git_in("checkout", &["rev-parse", "--is-shallow-repository"]),
            "true"
        );
        assert!(!outcome(&git, Mode::Apply).unwrap().0);
        // An older commit, shallow too.
        let first = fixture.git_in("work", &["rev-parse", "v1^{commit}"]);
        assert!(
            outcome(&fixture.resource(Some(&first)), Mode::Apply)
                .unwrap()
                .0
        );
        assert_eq!(fixture.head(), first);
    }

    #[test]
    fn what_is_not_this_checkout_is_refused() {
        let Some(fixture) = Fixture::new() else {
            return;
        };
        let checkout = fixture.path("checkout");
        fs::create_dir(&checkout).unwrap();
        fs::write(checkout.join("precious"), "data").unwrap();
        let git = fixture.resource(None);
        assert_eq!(
            outcome(&git, Mode::Apply).unwrap_err(),
            format!(
                "{} is not empty and not a git checkout; refusing to touch it",
                checkout.display()
            )
        );
        assert_eq!(
            fs::read_to_string(checkout.join("precious")).unwrap(),
            "data"
        );

        // An empty directory is cloned into.
        fs::remove_file(checkout.join("precious")).unwrap();
        assert!(outcome(&git, Mode::Apply).unwrap().0);

        // Another repository's checkout.
        let elsewhere = GitResource {
            repo: "https://git.example.com/other.git".into(),
            ..git.clone()
        };
        assert_eq!(
            outcome(&elsewhere, Mode::Check).unwrap_err(),
            format!(
                "{} is a checkout of {}, not https://git.example.com/other.git (force: true \
                 repoints origin)",
                checkout.display(),
                fixture.repo()
            )
        );
        let cases = [
            (
                fixture.resource(Some("nope")),
                format!("{} has no branch or tag 'nope'", fixture.repo()),
            ),
            (
                GitResource {
                    path: fixture.path("missing/checkout").to_str().unwrap().into(),
                    ..git.clone()
                },
                "does not exist (add a directory resource before this one)".to_string(),
            ),
            (
                GitResource {
                    path: fixture.path("work/README").to_str().unwrap().into(),
                    ..git.clone()
                },
                "is a regular file, not a directory; refusing to replace it".to_string(),
            ),
        ];
        for (resource, expected) in cases {
            let error = outcome(&resource, Mode::Check).unwrap_err();
            assert!(error.ends_with(&expected), "{error}");
        }
    }

    /// A remote that wants a password fails at once instead of waiting for a terminal.
    #[test]
    fn no_prompt_for_credentials() {
        if process::find_program("git").is_none() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let unauthorized =
            b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\n\
            Content-Length: 0\r\nConnection: close\r\n\r\n"
                .to_vec();
        let server = Server::start(vec![unauthorized; 4], None);
        let git = GitResource {
            path: dir.path().join("checkout").to_str().unwrap().into(),
            repo: server.url("/private.git"),
            ..GitResource::default()
        };
        let started = std::time::Instant::now();
        let error = outcome(&git, Mode::Check).unwrap_err();
        assert!(error.contains("terminal prompts disabled"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(30));
        assert!(!server.requests().is_empty());
    }
}
