//! `group`: a local group, present (with its gid, when the resource gives one) or absent.
//!
//! Read from /etc/group (see `accounts`), created with `groupadd`, renumbered with `groupmod
//! --gid`, removed with `groupdel`, and read again after every change. Membership is not managed
//! here: a user's `groups` says which groups it is in. groupdel refuses to remove the primary
//! group of an existing user; its message becomes the error.

use super::accounts::{self, GroupEntry};
use super::{Planned, Report};
use crate::state::{GroupResource, Mode, Presence};

/// `planned`: in check mode, a group that would be created is noted there (see `user::run`).
pub(super) fn run(
    group: &GroupResource,
    mode: Mode,
    planned: &mut Planned,
) -> Result<Report, String> {
    let name = group.name.as_str();
    let current = find(name)?;
    if group.state == Some(Presence::Absent) {
        return match current {
            None => Ok(Report::unchanged("already absent")),
            Some(_) if mode == Mode::Check => {
                Ok(Report::changed(format!("would remove group {name}")))
            }
            Some(_) => {
                accounts::run_tool("groupdel", &["--", name])?;
                if find(name)?.is_some() {
                    return Err(format!("groupdel exited 0 but group {name} is still there"));
                }
                Ok(Report::changed(format!("removed group {name}")))
            }
        };
    }
    let wanted_gid = group.gid.map(|gid| gid.to_string());
    let Some(current) = current else {
        let is_system = group.system == Some(true);
        let settings: Vec<String> = wanted_gid
            .iter()
            .map(|gid| format!("gid {gid}"))
            .chain(is_system.then(|| "system".to_string()))
            .collect();
        let settings = if settings.is_empty() {
            String::new()
        } else {
            format!(" ({})", settings.join(", "))
        };
        if mode == Mode::Check {
            planned.groups.insert(name.to_string());
            return Ok(Report::changed(format!(
                "would create group {name}{settings}"
            )));
        }
        let mut arguments = Vec::new();
        if is_system {
            arguments.push("--system");
        }
        if let Some(gid) = &wanted_gid {
            arguments.extend(["--gid", gid]);
        }
        arguments.extend(["--", name]);
        accounts::run_tool("groupadd", &arguments)?;
        let created = confirm(group, "groupadd")?;
        let system = if is_system { ", system" } else { "" };
        return Ok(Report::changed(format!(
            "created group {name} (gid {}{system})",
            created.gid
        )));
    };
    match (group.gid, &wanted_gid) {
        (Some(gid), Some(gid_text)) if gid != current.gid => {
            let detail = format!("gid {} -> {gid}", current.gid);
            if mode == Mode::Apply {
                accounts::run_tool("groupmod", &["--gid", gid_text, "--", name])?;
                confirm(group, "groupmod")?;
            }
            Ok(Report::changed(detail))
        }
        _ => Ok(Report::unchanged("already in state")),
    }
}

fn find(name: &str) -> Result<Option<GroupEntry>, String> {
    Ok(accounts::read_groups()?
        .into_iter()
        .find(|entry| entry.name == name))
}

/// Reads the group back after a tool changed it.
fn confirm(group: &GroupResource, tool: &str) -> Result<GroupEntry, String> {
    let entry = find(&group.name)?
        .ok_or_else(|| format!("{tool} exited 0 but group {} is not there", group.name))?;
    match group.gid {
        Some(gid) if gid != entry.gid => Err(format!(
            "{tool} exited 0 but group {} has gid {}, not {gid}",
            group.name, entry.gid
        )),
        _ => Ok(entry),
    }
}

#[cfg(test)]
mod tests {
    use super::super::accounts::testing::{self, Cleanup};
    use super::*;

    const TOOLS: &[&str] = &["groupadd", "groupmod", "groupdel", "useradd", "userdel"];

    /// Two gids no group has, from a range groupadd does not hand out by default.
    fn free_gids() -> (u32, u32) {
        let groups = accounts::read_groups().unwrap();
        let mut free = (42_000..43_000).filter(|gid| groups.iter().all(|group| group.gid != *gid));
        (free.next().unwrap(), free.next().unwrap())
    }

    fn outcome(group: &GroupResource, mode: Mode) -> (bool, String) {
        let report = run(group, mode, &mut Planned::default()).unwrap();
        (report.changed, report.detail)
    }

    #[test]
    fn create_renumber_and_remove() {
        if let Some(reason) = testing::skip_reason(TOOLS) {
            eprintln!("skipped: {reason}");
            return;
        }
        let mut cleanup = Cleanup::new();
        let name = testing::unique_name('g');
        cleanup.groups.push(name.clone());
        let (first, second) = free_gids();
        let group = GroupResource {
            name: name.clone(),
            gid: Some(first),
            ..GroupResource::default()
        };

        let before = testing::snapshot();
        assert_eq!(
            outcome(&group, Mode::Check),
            (true, format!("would create group {name} (gid {first})"))
        );
        assert_eq!(testing::snapshot(), before, "check changed the databases");
        assert_eq!(
            outcome(&group, Mode::Apply),
            (true, format!("created group {name} (gid {first})"))
        );
        assert_eq!(find(&name).unwrap().unwrap().gid, first);
        for mode in [Mode::Apply, Mode::Check] {
            assert_eq!(outcome(&group, mode), (false, "already in state".into()));
        }
        // Without a gid any gid will do; `system` only matters at creation.
        let any_gid = GroupResource {
            name: name.clone(),
            system: Some(true),
            ..GroupResource::default()
        };
        assert_eq!(
            outcome(&any_gid, Mode::Check),
            (false, "already in state".into())
        );

        let renumbered = GroupResource {
            gid: Some(second),
            ..group.clone()
        };
        let before = testing::snapshot();
        let expected = format!("gid {first} -> {second}");
        assert_eq!(outcome(&renumbered, Mode::Check), (true, expected.clone()));
        assert_eq!(testing::snapshot(), before, "check changed the databases");
        assert_eq!(outcome(&renumbered, Mode::Apply), (true, expected));
        assert_eq!(find(&name).unwrap().unwrap().gid, second);
        assert!(
            !run(&renumbered, Mode::Apply, &mut Planned::default())
                .unwrap()
                .changed
        );

        let absent = GroupResource {
            name: name.clone(),
            state: Some(Presence::Absent),
            ..GroupResource::default()
        };
        let before = testing::snapshot();
        assert_eq!(
            outcome(&absent, Mode::Check),
            (true, format!("would remove group {name}"))
        );
        assert_eq!(testing::snapshot(), before, "check changed the databases");
        assert_eq!(
            outcome(&absent, Mode::Apply),
            (true, format!("removed group {name}"))
        );
        assert!(!testing::group_exists(&name));
        assert_eq!(
            outcome(&absent, Mode::Apply),
            (false, "already absent".into())
        );
    }

    #[test]
    fn a_system_group_gets_a_gid_and_tool_errors_pass_through() {
        if let Some(reason) = testing::skip_reason(TOOLS) {
            eprintln!("skipped: {reason}");
            return;
        }
        let mut cleanup = Cleanup::new();
        let name = testing::unique_name('g');
        let user = testing::unique_name('u');
        cleanup.users.push(user.clone());
        cleanup.groups.push(name.clone());
        let group = GroupResource {
            name: name.clone(),
            system: Some(true),
            ..GroupResource::default()
        };
        assert_eq!(
            outcome(&group, Mode::Check),
            (true, format!("would create group {name} (system)"))
        );
        let (changed, detail) = outcome(&group, Mode::Apply);
        let gid = find(&name).unwrap().unwrap().gid;
        assert_eq!(
            (changed, detail),
            (true, format!("created group {name} (gid {gid}, system)"))
        );

        // groupdel refuses to remove a user's primary group, and says so.
        accounts::run_tool(
            "useradd",
            &["--gid", &name, "--no-create-home", "--", &user],
        )
        .unwrap();
        let absent = GroupResource {
            name: name.clone(),
            state: Some(Presence::Absent),
            ..GroupResource::default()
        };
        let error = run(&absent, Mode::Apply, &mut Planned::default()).unwrap_err();
        assert!(
            error.starts_with(&format!("groupdel -- {name}: exit code"))
                && error.contains("primary group"),
            "{error}"
        );
        assert!(testing::group_exists(&name));
    }
}
