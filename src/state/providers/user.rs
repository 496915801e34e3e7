//! `user`: a local user account, present with the settings the resource gives, or absent.
//!
//! The current account is read from /etc/passwd and /etc/group (see `accounts`); a missing one
//! is made with `useradd`, a different one is changed with one `usermod` call for everything
//! that differs, and `userdel` removes one. Settings the resource leaves unset are never
//! compared or changed. After a change the databases are read again, so a tool that exits 0
//! without reaching the state is an error rather than a change repeated on every apply.
//!
//! Nothing outside the account databases is created or removed: useradd gets
//! `--no-create-home` (the home directory is a `directory` resource, with its mode and
//! owner, as on every distribution, whatever its useradd defaults to), and userdel runs without
//! `--remove`, so the home directory and mail spool stay.

use std::collections::BTreeSet;

use super::accounts::{self, GroupEntry, UserEntry};
use super::{Planned, Report};
use crate::state::{Mode, Presence, UserResource};

/// `planned`: in check mode, a user that would be created is noted there, so that files a
/// later resource gives to it are checked as the apply would do them.
pub(super) fn run(
    user: &UserResource,
    mode: Mode,
    planned: &mut Planned,
) -> Result<Report, String> {
    let name = user.name.as_str();
    let current = accounts::read_users()?
        .into_iter()
        .find(|entry| entry.name == name);
    if user.state == Some(Presence::Absent) {
        return match current {
            None => Ok(Report::unchanged("already absent")),
            Some(_) if mode == Mode::Check => {
                Ok(Report::changed(format!("would remove user {name}")))
            }
            Some(_) => {
                accounts::run_tool("userdel", &["--", name])?;
                Ok(Report::changed(format!("removed user {name}")))
            }
        };
    }
    let groups = accounts::read_groups()?;
    let Some(current) = current else {
        if mode == Mode::Check {
            planned.users.insert(user.name.clone());
            // useradd makes a group of the user's name when none is given (USERGROUPS_ENAB,
            // the default of every current distribution).
            if user.gid.is_none() {
                planned.groups.insert(user.name.clone());
            }
        }
        return create(user, mode, &groups);
    };
    let differences = differences(user, &current, &groups);
    if differences.is_empty() {
        return Ok(Report::unchanged("already in state"));
    }
    let detail = describe(&differences);
    if mode == Mode::Check {
        return Ok(Report::changed(detail));
    }
    let mut arguments = Vec::new();
    for difference in &differences {
        arguments.extend([difference.option, difference.value.as_str()]);
    }
    arguments.extend(["--", name]);
    accounts::run_tool("usermod", &arguments)?;
    confirm(user, "usermod")?;
    Ok(Report::changed(detail))
}

fn create(user: &UserResource, mode: Mode, groups: &[GroupEntry]) -> Result<Report, String> {
    let name = user.name.as_str();
    let settings = given_settings(user);
    if mode == Mode::Check {
        let mut references: Vec<&str> = user.gid.iter().map(String::as_str).collect();
        references.extend(user.groups.iter().flatten().map(String::as_str));
        let note = missing_note(&references, groups);
        return Ok(Report::changed(if settings.is_empty() {
            format!("would create user {name}{note}")
        } else {
            format!("would create user {name} ({settings}){note}")
        }));
    }
    let uid = user.uid.map(|uid| uid.to_string());
    let joined_groups = user.groups.as_ref().map(|groups| groups.join(","));
    let mut arguments = Vec::new();
    if user.system == Some(true) {
        arguments.push("--system");
    }
    let options = [
        ("--uid", uid.as_deref()),
        ("--gid", user.gid.as_deref()),
        // An empty list is useradd's default already, and `--groups ''` is refused by some
        // versions.
        (
            "--groups",
            joined_groups.as_deref().filter(|list| !list.is_empty()),
        ),
        ("--home-dir", user.home.as_deref()),
        ("--shell", user.shell.as_deref()),
        ("--comment", user.comment.as_deref()),
    ];
    for (option, value) in options {
        if let Some(value) = value {
            arguments.extend([option, value]);
        }
    }
    arguments.extend(["--no-create-home", "--", name]);
    accounts::run_tool("useradd", &arguments)?;
    let created = confirm(user, "useradd")?;
    let uid_part = format!("uid {}", created.uid);
    let detail = match user.uid {
        // The uid is among the settings already.
        Some(_) => settings,
        None if settings.is_empty() => uid_part,
        None => format!("{uid_part}, {settings}"),
    };
    Ok(Report::changed(format!("created user {name} ({detail})")))
}

/// Reads the account back after a tool changed it: what still differs is an error.
fn confirm(user: &UserResource, tool: &str) -> Result<UserEntry, String> {
    let entry = accounts::read_users()?
        .into_iter()
        .find(|entry| entry.name == user.name)
        .ok_or_else(|| format!("{tool} exited 0 but user {} is not there", user.name))?;
    let remaining = differences(user, &entry, &accounts::read_groups()?);
    if !remaining.is_empty() {
        return Err(format!(
            "{tool} exited 0 but {} still differs: {}",
            user.name,
            describe(&remaining)
        ));
    }
    Ok(entry)
}

/// One setting that differs, as people read it and as usermod takes it.
struct Difference {
    text: String,
    option: &'static str,
    value: String,
}

fn describe(differences: &[Difference]) -> String {
    differences
        .iter()
        .map(|difference| difference.text.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

fn differences(user: &UserResource, current: &UserEntry, groups: &[GroupEntry]) -> Vec<Difference> {
    let mut differences = Vec::new();
    if let Some(uid) = user.uid.filter(|&uid| uid != current.uid) {
        differences.push(Difference {
            text: format!("uid {} -> {uid}", current.uid),
            option: "--uid",
            value: uid.to_string(),
        });
    }
    if let Some(wanted) = &user.gid {
        let found = find_group(wanted, groups);
        if found.map(|group| group.gid) != Some(current.gid) {
            let current_name = groups
                .iter()
                .find(|group| group.gid == current.gid)
                .map_or(current.gid.to_string(), |group| group.name.clone());
            differences.push(Difference {
                text: format!(
                    "gid {current_name} -> {wanted}{}",
                    missing_note(&[wanted.as_str()], groups)
                ),
                option: "--gid",
                value: wanted.clone(),
            });
        }
    }
    if let Some(wanted) = &user.groups {
        let wanted_names: BTreeSet<String> = wanted
            .iter()
            .map(|group| {
                find_group(group, groups).map_or(group.clone(), |found| found.name.clone())
            })
            .collect();
        let current_names: BTreeSet<String> = groups
            .iter()
            .filter(|group| group.members.contains(&current.name))
            .map(|group| group.name.clone())
            .collect();
        if wanted_names != current_names {
            let list = |names: &BTreeSet<String>| {
                format!("[{}]", names.iter().cloned().collect::<Vec<_>>().join(", "))
            };
            let wanted_texts: Vec<&str> = wanted.iter().map(String::as_str).collect();
            differences.push(Difference {
                text: format!(
                    "groups {} -> {}{}",
                    list(&current_names),
                    list(&wanted_names),
                    missing_note(&wanted_texts, groups)
                ),
                option: "--groups",
                value: wanted.join(","),
            });
        }
    }
    let texts = [
        ("home", "--home", &user.home, &current.home),
        ("shell", "--shell", &user.shell, &current.shell),
        ("comment", "--comment", &user.comment, &current.comment),
    ];
    for (what, option, wanted, current) in texts {
        if let Some(wanted) = wanted.as_ref().filter(|wanted| *wanted != current) {
            let text = if what == "comment" {
                format!("comment '{current}' -> '{wanted}'")
            } else {
                format!("{what} {current} -> {wanted}")
            };
            differences.push(Difference {
                text,
                option,
                value: wanted.clone(),
            });
        }
    }
    differences
}

/// A group as a user resource names it: a name, or a gid.
fn find_group<'a>(reference: &str, groups: &'a [GroupEntry]) -> Option<&'a GroupEntry> {
    match reference.parse::<u32>() {
        Ok(gid) => groups.iter().find(|group| group.gid == gid),
        Err(_) => groups.iter().find(|group| group.name == reference),
    }
}

/// " (no such group yet: x, y)" for groups not on this host: an earlier `group` resource may
/// create them, so check mode reports the change; apply fails in the tool if they are still
/// missing.
fn missing_note(references: &[&str], groups: &[GroupEntry]) -> String {
    let missing: Vec<&str> = references
        .iter()
        .copied()
        .filter(|reference| find_group(reference, groups).is_none())
        .collect();
    if missing.is_empty() {
        String::new()
    } else {
        format!(" (no such group yet: {})", missing.join(", "))
    }
}

/// The settings a new account gets, for "would create user x (uid 1500, shell /bin/sh)".
fn given_settings(user: &UserResource) -> String {
    let mut settings = Vec::new();
    if let Some(uid) = user.uid {
        settings.push(format!("uid {uid}"));
    }
    if let Some(gid) = &user.gid {
        settings.push(format!("gid {gid}"));
    }
    if let Some(list) = &user.groups {
        settings.push(format!("groups [{}]", list.join(", ")));
    }
    if let Some(home) = &user.home {
        settings.push(format!("home {home}"));
    }
    if let Some(shell) = &user.shell {
        settings.push(format!("shell {shell}"));
    }
    if let Some(comment) = &user.comment {
        settings.push(format!("comment '{comment}'"));
    }
    if user.system == Some(true) {
        settings.push("system".into());
    }
    settings.join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::accounts::testing::{self, Cleanup};
    use super::*;

    const TOOLS: &[&str] = &["useradd", "usermod", "userdel", "groupadd", "groupdel"];

    fn entry(name: &str) -> UserEntry {
        accounts::read_users()
            .unwrap()
            .into_iter()
            .find(|entry| entry.name == name)
            .unwrap_or_else(|| panic!("no user {name}"))
    }

    fn member_of(name: &str) -> Vec<String> {
        accounts::read_groups()
            .unwrap()
            .into_iter()
            .filter(|group| group.members.iter().any(|member| member == name))
            .map(|group| group.name)
            .collect()
    }

    /// A uid no account has, from a range useradd does not hand out by default.
    fn free_uid() -> u32 {
        let users = accounts::read_users().unwrap();
        (42_000..43_000)
            .find(|uid| users.iter().all(|user| user.uid != *uid))
            .expect("a free uid")
    }

    fn outcome(user: &UserResource, mode: Mode) -> (bool, String) {
        let report = run(user, mode, &mut Planned::default()).unwrap();
        (report.changed, report.detail)
    }

    #[test]
    fn create_change_and_remove() {
        if let Some(reason) = testing::skip_reason(TOOLS) {
            eprintln!("skipped: {reason}");
            return;
        }
        let mut cleanup = Cleanup::new();
        let name = testing::unique_name('u');
        let extra = testing::unique_name('g');
        cleanup.users.push(name.clone());
        // The user's own group (USERGROUPS_ENAB) goes with userdel; this removes it if not.
        cleanup.groups.extend([extra.clone(), name.clone()]);
        accounts::run_tool("groupadd", &["--", &extra]).unwrap();
        let uid = free_uid();
        let home = format!("/nonexistent/{name}");
        let user = UserResource {
            name: name.clone(),
            uid: Some(uid),
            groups: Some(vec![extra.clone()]),
            home: Some(home.clone()),
            shell: Some("/bin/sh".into()),
            comment: Some("Svc Test".into()),
            ..UserResource::default()
        };

        let before = testing::snapshot();
        assert_eq!(
            outcome(&user, Mode::Check),
            (
                true,
                format!(
                    "would create user {name} (uid {uid}, groups [{extra}], home {home}, \
                     shell /bin/sh, comment 'Svc Test')"
                )
            )
        );
        assert_eq!(testing::snapshot(), before, "check changed the databases");

        assert_eq!(
            outcome(&user, Mode::Apply),
            (
                true,
                format!(
                    "created user {name} (uid {uid}, groups [{extra}], home {home}, \
                     shell /bin/sh, comment 'Svc Test')"
                )
            )
        );
        let created = entry(&name);
        assert_eq!(
            (created.uid, created.home.as_str(), created.shell.as_str()),
            (uid, home.as_str(), "/bin/sh")
        );
        assert_eq!(created.comment, "Svc Test");
        assert_eq!(member_of(&name), [extra.as_str()]);
        assert!(!std::path::Path::new(&home).exists(), "no home is created");
        for mode in [Mode::Apply, Mode::Check] {
            assert_eq!(outcome(&user, mode), (false, "already in state".into()));
        }

        // Changes: the shell, and every supplementary group left.
        let changed = UserResource {
            groups: Some(vec![]),
            shell: Some("/bin/bash".into()),
            ..user.clone()
        };
        let expected = format!("groups [{extra}] -> []; shell /bin/sh -> /bin/bash");
        let before = testing::snapshot();
        assert_eq!(outcome(&changed, Mode::Check), (true, expected.clone()));
        assert_eq!(testing::snapshot(), before, "check changed the databases");
        assert_eq!(outcome(&changed, Mode::Apply), (true, expected));
        assert_eq!(entry(&name).shell, "/bin/bash");
        assert_eq!(member_of(&name), Vec::<String>::new());
        assert_eq!(
            outcome(&changed, Mode::Apply),
            (false, "already in state".into())
        );
        // Unset settings are left alone: a resource with the name only matches.
        let name_only = UserResource {
            name: name.clone(),
            ..UserResource::default()
        };
        assert_eq!(
            outcome(&name_only, Mode::Check),
            (false, "already in state".into())
        );

        // The primary group, by name, then by number.
        let by_name = UserResource {
            gid: Some(extra.clone()),
            ..name_only.clone()
        };
        assert_eq!(
            outcome(&by_name, Mode::Apply),
            (true, format!("gid {name} -> {extra}"))
        );
        let extra_gid = entry(&name).gid;
        let by_number = UserResource {
            gid: Some(extra_gid.to_string()),
            ..name_only.clone()
        };
        assert_eq!(
            outcome(&by_number, Mode::Check),
            (false, "already in state".into())
        );

        let absent = UserResource {
            state: Some(Presence::Absent),
            ..name_only
        };
        let before = testing::snapshot();
        assert_eq!(
            outcome(&absent, Mode::Check),
            (true, format!("would remove user {name}"))
        );
        assert_eq!(testing::snapshot(), before, "check changed the databases");
        assert_eq!(
            outcome(&absent, Mode::Apply),
            (true, format!("removed user {name}"))
        );
        assert!(!testing::user_exists(&name));
        assert_eq!(
            outcome(&absent, Mode::Apply),
            (false, "already absent".into())
        );
    }

    #[test]
    fn a_missing_group_is_reported_by_check_and_fails_apply() {
        if let Some(reason) = testing::skip_reason(TOOLS) {
            eprintln!("skipped: {reason}");
            return;
        }
        let mut cleanup = Cleanup::new();
        let name = testing::unique_name('u');
        let missing = testing::unique_name('m');
        cleanup.users.push(name.clone());
        cleanup.groups.push(name.clone());
        let user = UserResource {
            name: name.clone(),
            groups: Some(vec![missing.clone()]),
            system: Some(true),
            ..UserResource::default()
        };
        assert_eq!(
            outcome(&user, Mode::Check),
            (
                true,
                format!(
                    "would create user {name} (groups [{missing}], system) (no such group yet: \
                     {missing})"
                )
            )
        );
        let error = run(&user, Mode::Apply, &mut Planned::default()).unwrap_err();
        assert!(
            error.starts_with(&format!(
                "useradd --system --groups {missing} --no-create-home -- {name}: exit code"
            )) && error.contains(&missing),
            "{error}"
        );
        assert!(!testing::user_exists(&name));
    }

    #[test]
    fn differences_are_read_from_the_databases() {
        let groups = [
            GroupEntry {
                name: "app".into(),
                gid: 1500,
                members: vec![],
            },
            GroupEntry {
                name: "adm".into(),
                gid: 4,
                members: vec!["app".into()],
            },
            GroupEntry {
                name: "web".into(),
                gid: 33,
                members: vec!["other".into()],
            },
        ];
        let current = UserEntry {
            name: "app".into(),
            uid: 1500,
            gid: 1500,
            comment: String::new(),
            home: "/srv/app".into(),
            shell: "/bin/sh".into(),
        };
        let user = |edit: fn(&mut UserResource)| {
            let mut user = UserResource {
                name: "app".into(),
                ..UserResource::default()
            };
            edit(&mut user);
            user
        };
        let cases: [(UserResource, &str, &[&str]); 7] = [
            (user(|_| {}), "", &[]),
            (
                user(|u| {
                    u.uid = Some(1500);
                    u.gid = Some("1500".into());
                    u.groups = Some(vec!["4".into()]);
                }),
                "",
                &[],
            ),
            (
                user(|u| u.uid = Some(1600)),
                "uid 1500 -> 1600",
                &["--uid", "1600"],
            ),
            (
                user(|u| u.gid = Some("web".into())),
                "gid app -> web",
                &["--gid", "web"],
            ),
            (
                user(|u| u.groups = Some(vec!["33".into(), "adm".into()])),
                "groups [adm] -> [adm, web]",
                &["--groups", "33,adm"],
            ),
            (
                user(|u| u.groups = Some(vec!["nope".into()])),
                "groups [adm] -> [nope] (no such group yet: nope)",
                &["--groups", "nope"],
            ),
            (
                user(|u| {
                    u.home = Some("/home/app".into());
                    u.comment = Some("App".into());
                }),
                "home /srv/app -> /home/app; comment '' -> 'App'",
                &["--home", "/home/app", "--comment", "App"],
            ),
        ];
        for (user, text, options) in cases {
            let found = differences(&user, &current, &groups);
            let arguments: Vec<&str> = found
                .iter()
                .flat_map(|difference| [difference.option, difference.value.as_str()])
                .collect();
            assert_eq!((describe(&found).as_str(), &arguments[..]), (text, options));
        }
    }
}
