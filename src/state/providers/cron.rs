//! `cron`: one job, found again by its marker comment, in a user's crontab or a cron.d file.
//!
//! The entry is two lines: `# svc: NAME`, then the job (`SCHEDULE RUN`, or `SCHEDULE USER RUN`
//! in a cron.d file, whose lines name the user). Every other line stays as it was, so an
//! operator's own jobs survive; a second entry under the same marker (a hand-made copy) is
//! removed, since cron would run both.
//!
//! A user's crontab is read with `crontab -l -u USER` and installed with `crontab -u USER FILE`,
//! never written in the spool directly: crontab checks the syntax, sets the owner and tells the
//! daemon. A crontab that ends up empty is removed (`crontab -r`). A cron.d file is written
//! atomically (see `text`), created 0644 when missing (cron skips files others can write to)
//! and removed when its last line goes.

use std::fs;

use std::path::Path;
use std::time::Duration;

use super::attributes;
use super::{
    process, require_parent, temporary_path_beside, text, write_new_file, Planned, Report,
};
use crate::state::{CronResource, Mode, Presence};

const CRONTAB_TIMEOUT: Duration = Duration::from_secs(60);

pub(super) fn run(cron: &CronResource, mode: Mode, planned: &Planned) -> Result<Report, String> {
    let user = cron.user.as_deref().unwrap_or("root");
    let is_present = cron.state != Some(Presence::Absent);
    let schedule = cron
        .schedule
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    match &cron.file {
        Some(path) => {
            let wanted = is_present.then(|| format!("{schedule} {user} {}", cron.run));
            run_in_file(
                Path::new(path),
                &cron.name,
                wanted.as_deref(),
                mode,
                planned,
            )
        }
        None => {
            let wanted = is_present.then(|| format!("{schedule} {}", cron.run));
            run_in_crontab(user, &cron.name, wanted.as_deref(), mode)
        }
    }
}

fn run_in_crontab(
    user: &str,
    name: &str,
    wanted: Option<&str>,
    mode: Mode,
) -> Result<Report, String> {
    let place = format!("{user}'s crontab");
    let is_known = attributes::user_id(user)
        .map_err(|error| format!("looking up user '{user}': {error}"))?
        .is_some();
    if !is_known {
        // A user an earlier resource creates: check reports the entry, apply cannot add it.
        return match (wanted, mode) {
            (None, _) => Ok(Report::unchanged("already absent")),
            (Some(entry), Mode::Check) => Ok(Report::changed(format!(
                "would add to {place}: {entry} (user {user} does not exist yet)"
            ))),
            (Some(_), Mode::Apply) => Err(format!("unknown user '{user}' on this host")),
        };
    }
    let crontab = process::find_program("crontab")
        .ok_or("crontab not found (a user's cron jobs are installed with crontab; install cron)")?;
    let current = read_crontab(&crontab, user)?;
    let edited = edit(&current, name, wanted);
    if edited.changes.is_empty() {
        return Ok(Report::unchanged(already(wanted)));
    }
    let detail = edited.describe(&place, mode);
    if mode == Mode::Check {
        return Ok(Report::changed(detail));
    }
    if edited.text.is_empty() {
        crontab_call(&crontab, &["-r", "-u", user])?;
    } else {
        install_crontab(&crontab, user, &edited.text)?;
    }
    // crontab may rewrite what it installs; reading back proves the next run finds the entry.
    if !edit(&read_crontab(&crontab, user)?, name, wanted)
        .changes
        .is_empty()
    {
        return Err(format!(
            "crontab -u {user} exited 0 but the entry is not as written"
        ));
    }
    Ok(Report::changed(detail))
}

/// The user's crontab; empty when there is none.
fn read_crontab(crontab: &Path, user: &str) -> Result<String, String> {
    let finished = process::run_program(crontab, &["-l", "-u", user], &[], CRONTAB_TIMEOUT)?;
    if finished.is_success() {
        return Ok(finished.stdout);
    }
    // Every cron says "no crontab for USER" (exit 1) for a user without one.
    if finished.status.is_some() && finished.stderr.contains("no crontab for") {
        return Ok(String::new());
    }
    Err(format!(
        "crontab -l -u {user}: {}{}",
        finished.describe_status(),
        finished.output_suffix()
    ))
}

/// Installs `text` as the user's crontab, through a private temporary file.
fn install_crontab(crontab: &Path, user: &str, text: &str) -> Result<(), String> {
    let temporary = temporary_path_beside(&std::env::temp_dir().join(format!("crontab-{user}")));
    let written = write_new_file(&temporary, text.as_bytes()).and_then(|file| file.sync_all());
    let result = written
        .map_err(|error| format!("writing {}: {error}", temporary.display()))
        .and_then(|()| {
            let path = temporary.to_string_lossy();
            crontab_call(crontab, &["-u", user, &path])
        });
    let _ = fs::remove_file(&temporary);
    result
}

fn crontab_call(crontab: &Path, arguments: &[&str]) -> Result<(), String> {
    let finished = process::run_program(crontab, arguments, &[], CRONTAB_TIMEOUT)?;
    if finished.is_success() {
        return Ok(());
    }
    Err(format!(
        "crontab {}: {}{}",
        arguments.join(" "),
        finished.describe_status(),
        finished.output_suffix()
    ))
}

fn run_in_file(
    path: &Path,
    name: &str,
    wanted: Option<&str>,
    mode: Mode,
    planned: &Planned,
) -> Result<Report, String> {
    let place = path.display().to_string();
    // cron does not follow links in cron.d either; text::read refuses them.
    let found = text::read(path)?;
    if found.is_none() {
        if wanted.is_none() {
            return Ok(Report::unchanged("already absent"));
        }
        require_parent(path, planned)?;
    }
    let current = found.as_ref().map_or("", |found| found.text.as_str());
    let edited = edit(current, name, wanted);
    if edited.changes.is_empty() {
        return Ok(Report::unchanged(already(wanted)));
    }
    let detail = edited.describe(&place, mode);
    if mode == Mode::Check {
        return Ok(Report::changed(detail));
    }
    match &found {
        Some(_) if edited.text.is_empty() => {
            fs::remove_file(path).map_err(|error| format!("removing {place}: {error}"))?
        }
        _ => text::write(
            path,
            &edited.text,
            found.as_ref().map(|found| &found.metadata),
        )?,
    }
    Ok(Report::changed(detail))
}

fn already(wanted: Option<&str>) -> &'static str {
    if wanted.is_some() {
        "already in state"
    } else {
        "already absent"
    }
}

/// What an edit changes, for the report.
#[derive(Debug, PartialEq)]
enum Change {
    Add(String),
    Replace { old: String, new: String },
    Remove(String),
    RemoveDuplicates(usize),
}

#[derive(Debug, PartialEq)]
struct Edited {
    text: String,
    changes: Vec<Change>,
}

impl Edited {
    /// "would add to root's crontab: 0 3 * * * backup", "/etc/cron.d/x: 'a' -> 'b'", ...
    fn describe(&self, place: &str, mode: Mode) -> String {
        let is_check = mode == Mode::Check;
        let pick = |would: &'static str, done: &'static str| if is_check { would } else { done };
        self.changes
            .iter()
            .map(|change| match change {
                Change::Add(entry) => {
                    format!("{} {place}: {entry}", pick("would add to", "added to"))
                }
                Change::Replace { old, new } => format!("{place}: '{old}' -> '{new}'"),
                Change::Remove(entry) => {
                    format!(
                        "{} {place}: {entry}",
                        pick("would remove from", "removed from")
                    )
                }
                Change::RemoveDuplicates(count) => format!(
                    "{} {count} more entr{} under the same marker",
                    pick("would remove", "removed"),
                    if *count == 1 { "y" } else { "ies" }
                ),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The content with the entry named `name` set to `wanted` (None: removed). A marker's entry is
/// the line after it, if that is a job (not blank, not a comment); the first marker keeps its
/// place, and further ones are removed with their jobs. A new entry goes at the end.
fn edit(content: &str, name: &str, wanted: Option<&str>) -> Edited {
    let marker = format!("# svc: {name}");
    let lines = text::split_lines(content);
    let mut output: Vec<&str> = Vec::with_capacity(lines.len() + 2);
    let mut first_job: Option<Option<&str>> = None;
    let mut duplicates = 0;
    let mut index = 0;
    while index < lines.len() {
        let line = lines[index];
        index += 1;
        if line.trim_end() != marker {
            output.push(line);
            continue;
        }
        let job = lines.get(index).copied().filter(|next| is_job(next));
        if job.is_some() {
            index += 1;
        }
        if first_job.is_some() {
            duplicates += 1;
            continue;
        }
        first_job = Some(job);
        if let Some(wanted) = wanted {
            output.extend([marker.as_str(), wanted]);
        }
    }
    let mut changes = Vec::new();
    match (first_job, wanted) {
        (None, Some(wanted)) => {
            output.extend([marker.as_str(), wanted]);
            changes.push(Change::Add(wanted.to_string()));
        }
        (Some(None), Some(wanted)) => changes.push(Change::Add(wanted.to_string())),
        (Some(Some(job)), Some(wanted)) if job != wanted => changes.push(Change::Replace {
            old: job.to_string(),
            new: wanted.to_string(),
        }),
        (Some(job), None) => changes.push(Change::Remove(job.unwrap_or(&marker).to_string())),
        _ => {}
    }
    if duplicates > 0 {
        changes.push(Change::RemoveDuplicates(duplicates));
    }
    // Every line ends with a newline: cron ignores a last line without one.
    Edited {
        text: text::join_lines(&output),
        changes,
    }
}

fn is_job(line: &str) -> bool {
    let line = line.trim();
    !line.is_empty() && !line.starts_with('#')
}

#[cfg(test)]
mod tests {
    use super::super::accounts::{self, testing};
    use super::*;

    /// The provider with nothing planned by earlier resources.
    fn run(cron: &CronResource, mode: Mode) -> Result<Report, String> {
        super::run(cron, mode, &Planned::default())
    }

    #[test]
    fn entries_are_found_by_their_marker() {
        let job = "0 3 * * * backup";
        let cases: [(&str, Option<&str>, &str, &str); 10] = [
            (
                "",
                Some(job),
                "# svc: b\n0 3 * * * backup\n",
                "would add to X: 0 3 * * * backup",
            ),
            (
                "MAILTO=ops\n5 4 * * * mine",
                Some(job),
                "MAILTO=ops\n5 4 * * * mine\n# svc: b\n0 3 * * * backup\n",
                "would add to X: 0 3 * * * backup",
            ),
            ("# svc: b\n0 3 * * * backup\n", Some(job), "", ""),
            // Trailing spaces after the marker (an editor's) do not hide it.
            ("# svc: b  \n0 3 * * * backup\n", Some(job), "", ""),
            (
                "a\n# svc: b\n@daily backup\nc\n",
                Some(job),
                "a\n# svc: b\n0 3 * * * backup\nc\n",
                "X: '@daily backup' -> '0 3 * * * backup'",
            ),
            // A marker whose job was deleted by hand gets it back in place.
            (
                "# svc: b\n# mine\n",
                Some(job),
                "# svc: b\n0 3 * * * backup\n# mine\n",
                "would add to X: 0 3 * * * backup",
            ),
            (
                "# svc: b\n0 3 * * * backup\nx\n# svc: b\n1 1 * * * copy\n",
                Some(job),
                "# svc: b\n0 3 * * * backup\nx\n",
                "would remove 1 more entry under the same marker",
            ),
            // Other markers are other entries.
            ("# svc: bb\n1 1 * * * other\n", None, "", ""),
            (
                "a\n# svc: b\n0 3 * * * backup\nc\n",
                None,
                "a\nc\n",
                "would remove from X: 0 3 * * * backup",
            ),
            (
                "# svc: b\n0 3 * * * backup\n",
                None,
                "",
                "would remove from X: 0 3 * * * backup",
            ),
        ];
        for (text, wanted, expected_text, expected_detail) in cases {
            let edited = edit(text, "b", wanted);
            let detail = edited.describe("X", Mode::Check);
            assert_eq!(detail, expected_detail, "{text:?}");
            if !edited.changes.is_empty() {
                assert_eq!(edited.text, expected_text, "{text:?}");
            }
        }
        assert_eq!(
            edit("", "b", Some(job)).describe("root's crontab", Mode::Apply),
            "added to root's crontab: 0 3 * * * backup"
        );
    }

    fn crontab_of(user: &str) -> String {
        let crontab = process::find_program("crontab").unwrap();
        read_crontab(&crontab, user).unwrap()
    }

    fn outcome(cron: &CronResource, mode: Mode) -> (bool, String) {
        let report = run(cron, mode).unwrap();
        (report.changed, report.detail)
    }

    #[test]
    fn a_users_crontab() {
        if let Some(reason) = testing::skip_reason(&["useradd", "userdel", "crontab"]) {
            eprintln!("skipped: {reason}");
            return;
        }
        let mut cleanup = testing::Cleanup::new();
        let user = testing::unique_name('c');
        cleanup.users.push(user.clone());
        cleanup.groups.push(user.clone());
        accounts::run_tool("useradd", &["--no-create-home", "--", &user]).unwrap();
        let crontab = process::find_program("crontab").unwrap();
        let theirs = "# their own\nMAILTO=\"\"\n5 4 * * * echo mine\n";
        install_crontab(&crontab, &user, theirs).unwrap();

        let cron = CronResource {
            name: "nightly backup".into(),
            user: Some(user.clone()),
            schedule: "0  3 * * *".into(),
            run: "/usr/bin/true backup".into(),
            ..CronResource::default()
        };
        let place = format!("{user}'s crontab");
        assert_eq!(
            outcome(&cron, Mode::Check),
            (
                true,
                format!("would add to {place}: 0 3 * * * /usr/bin/true backup")
            )
        );
        assert_eq!(crontab_of(&user), theirs, "check changed the crontab");
        assert_eq!(
            outcome(&cron, Mode::Apply),
            (
                true,
                format!("added to {place}: 0 3 * * * /usr/bin/true backup")
            )
        );
        let with_entry = format!("{theirs}# svc: nightly backup\n0 3 * * * /usr/bin/true backup\n");
        assert_eq!(crontab_of(&user), with_entry);
        for mode in [Mode::Apply, Mode::Check] {
            assert_eq!(outcome(&cron, mode), (false, "already in state".into()));
        }

        let daily = CronResource {
            schedule: "@daily".into(),
            ..cron.clone()
        };
        let expected =
            format!("{place}: '0 3 * * * /usr/bin/true backup' -> '@daily /usr/bin/true backup'");
        assert_eq!(outcome(&daily, Mode::Check), (true, expected.clone()));
        assert_eq!(crontab_of(&user), with_entry, "check changed the crontab");
        assert_eq!(outcome(&daily, Mode::Apply), (true, expected));
        assert!(!run(&daily, Mode::Apply).unwrap().changed);

        let absent = CronResource {
            name: cron.name.clone(),
            user: Some(user.clone()),
            state: Some(Presence::Absent),
            ..CronResource::default()
        };
        let expected = format!("removed from {place}: @daily /usr/bin/true backup");
        assert_eq!(
            outcome(&absent, Mode::Check),
            (true, expected.replace("removed from", "would remove from"))
        );
        assert_eq!(outcome(&absent, Mode::Apply), (true, expected));
        assert_eq!(crontab_of(&user), theirs);
        assert_eq!(
            outcome(&absent, Mode::Apply),
            (false, "already absent".into())
        );

        // A crontab holding only the entry goes with it.
        crontab_call(&crontab, &["-r", "-u", &user]).unwrap();
        assert!(run(&cron, Mode::Apply).unwrap().changed);
        assert!(run(&absent, Mode::Apply).unwrap().changed);
        let listing =
            process::run_program(&crontab, &["-l", "-u", &user], &[], CRONTAB_TIMEOUT).unwrap();
        assert!(listing.stderr.contains("no crontab for"), "{listing:?}");
    }

    #[test]
    fn a_user_that_does_not_exist_yet() {
        let user = "svct-no-such-user";
        let cron = CronResource {
            name: "x".into(),
            user: Some(user.into()),
            schedule: "@hourly".into(),
            run: "true".into(),
            ..CronResource::default()
        };
        assert_eq!(
            outcome(&cron, Mode::Check),
            (
                true,
                format!(
                    "would add to {user}'s crontab: @hourly true (user {user} does not exist yet)"
                )
            )
        );
        assert_eq!(
            run(&cron, Mode::Apply).unwrap_err(),
            format!("unknown user '{user}' on this host")
        );
        let absent = CronResource {
            name: "x".into(),
            user: Some(user.into()),
            state: Some(Presence::Absent),
            ..CronResource::default()
        };
        assert_eq!(
            outcome(&absent, Mode::Apply),
            (false, "already absent".into())
        );
    }

    #[test]
    fn a_cron_d_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backup");
        let cron = CronResource {
            name: "backup".into(),
            schedule: "30 2 * * 1-5".into(),
            run: "/usr/local/bin/backup --quiet".into(),
            file: Some(path.to_str().unwrap().into()),
            ..CronResource::default()
        };
        let place = path.display();
        assert_eq!(
            outcome(&cron, Mode::Check),
            (
                true,
                format!("would add to {place}: 30 2 * * 1-5 root /usr/local/bin/backup --quiet")
            )
        );
        assert!(!path.exists(), "check wrote the file");
        assert!(run(&cron, Mode::Apply).unwrap().changed);
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "# svc: backup\n30 2 * * 1-5 root /usr/local/bin/backup --quiet\n"
        );
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
            0o644
        );
        assert_eq!(
            outcome(&cron, Mode::Apply),
            (false, "already in state".into())
        );

        // Lines of others stay; the file's mode stays.
        fs::write(
            &path,
            "SHELL=/bin/sh\n# svc: backup\n30 2 * * 1-5 root /usr/local/bin/backup --quiet\n0 * * * * root hourly\n",
        )
        .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let as_backup = CronResource {
            user: Some("backup".into()),
            ..cron.clone()
        };
        let expected = format!(
            "{place}: '30 2 * * 1-5 root /usr/local/bin/backup --quiet' -> '30 2 * * 1-5 backup \
             /usr/local/bin/backup --quiet'"
        );
        assert_eq!(outcome(&as_backup, Mode::Check), (true, expected.clone()));
        assert_eq!(outcome(&as_backup, Mode::Apply), (true, expected));
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "SHELL=/bin/sh\n# svc: backup\n30 2 * * 1-5 backup /usr/local/bin/backup --quiet\n0 * * * * root hourly\n"
        );
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
            0o600
        );

        let absent = CronResource {
            name: "backup".into(),
            state: Some(Presence::Absent),
            file: cron.file.clone(),
            ..CronResource::default()
        };
        assert!(run(&absent, Mode::Apply).unwrap().changed);
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "SHELL=/bin/sh\n0 * * * * root hourly\n"
        );
        assert_eq!(
            outcome(&absent, Mode::Apply),
            (false, "already absent".into())
        );

        // A file holding only the entry goes with it; only our file was in the directory.
        fs::remove_file(&path).unwrap();
        assert!(run(&cron, Mode::Apply).unwrap().changed);
        assert!(run(&absent, Mode::Apply).unwrap().changed);
        assert!(!path.exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        assert_eq!(
            outcome(&absent, Mode::Apply),
            (false, "already absent".into())
        );
    }

    #[test]
    fn refuses_links_and_missing_directories() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, "user data\n").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let cases = [
            (
                link,
                "is a symlink, not a regular file; refusing to edit it",
            ),
            (dir.path().join("missing/file"), "does not exist"),
        ];
        for (path, expected) in cases {
            let cron = CronResource {
                name: "x".into(),
                schedule: "@daily".into(),
                run: "true".into(),
                file: Some(path.to_str().unwrap().into()),
                ..CronResource::default()
            };
            let error = run(&cron, Mode::Apply).unwrap_err();
            assert!(error.contains(expected), "{path:?}: {error}");
        }
        assert_eq!(fs::read_to_string(&target).unwrap(), "user data\n");
    }
}
