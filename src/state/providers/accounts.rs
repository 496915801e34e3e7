//! The local account databases as `user` and `group` read them, and the shadow tools
//! (useradd, usermod, userdel, groupadd, groupmod, groupdel) that change them.
//!
//! /etc/passwd and /etc/group are read as files rather than through NSS (getent): the shadow
//! tools manage only these files, so they are what "already in state" must be judged by, and
//! enumerating groups over NSS can mean asking a directory server for all of them. They are
//! never written here: every change goes through a tool, which locks the files, keeps
//! /etc/shadow and /etc/gshadow in step and runs the distribution's hooks.

use std::time::Duration;

use super::process;

const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";

/// The shadow tools wait for the database lock (up to 15 s in glibc's lckpwdf); this bounds a
/// hook that hangs.
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// One line of /etc/passwd.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct UserEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub comment: String,
    pub home: String,
    pub shell: String,
}

/// One line of /etc/group.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct GroupEntry {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

pub(super) fn read_users() -> Result<Vec<UserEntry>, String> {
    Ok(parse_passwd(&read_database(PASSWD)?))
}

pub(super) fn read_groups() -> Result<Vec<GroupEntry>, String> {
    Ok(parse_group(&read_database(GROUP)?))
}

fn read_database(path: &str) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|error| format!("reading {path}: {error}"))?;
    // Only names and numbers are compared; a stray non-UTF-8 comment must not stop the run.
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Entries of /etc/passwd; lines that are not `name:password:uid:gid:comment:home:shell`
/// (NIS `+` lines, comments, damage) are skipped, as the C library skips them.
fn parse_passwd(text: &str) -> Vec<UserEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            let [name, _, uid, gid, comment, home, shell] = fields[..] else {
                return None;
            };
            if name.is_empty() || name.starts_with(['+', '-', '#']) {
                return None;
            }
            Some(UserEntry {
                name: name.to_string(),
                uid: uid.parse().ok()?,
                gid: gid.parse().ok()?,
                comment: comment.to_string(),
                home: home.to_string(),
                shell: shell.to_string(),
            })
        })
        .collect()
}

/// Entries of /etc/group (`name:password:gid:member,member`), skipping what the C library
/// skips.
fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            let [name, _, gid, members] = fields[..] else {
                return None;
            };
            if name.is_empty() || name.starts_with(['+', '-', '#']) {
                return None;
            }
            Some(GroupEntry {
                name: name.to_string(),
                gid: gid.parse().ok()?,
                members: members
                    .split(',')
                    .filter(|member| !member.is_empty())
                    .map(str::to_string)
                    .collect(),
            })
        })
        .collect()
}

/// Runs a shadow tool with explicit arguments; its exit code and output make the error.
pub(super) fn run_tool(name: &str, arguments: &[&str]) -> Result<(), String> {
    let program = process::find_program(name)
        .ok_or_else(|| format!("{name} not found (accounts are managed with the shadow tools)"))?;
    let finished = process::run_program(&program, arguments, &[], TOOL_TIMEOUT)?;
    if finished.is_success() {
        return Ok(());
    }
    // An empty argument (`--groups ''`) is shown as one.
    let shown: Vec<&str> = arguments
        .iter()
        .map(|argument| if argument.is_empty() { "''" } else { argument })
        .collect();
    Err(format!(
        "{name} {}: {}{}",
        shown.join(" "),
        finished.describe_status(),
        finished.output_suffix()
    ))
}

/// Throwaway accounts for tests that run the real tools: unique names, one test at a time, and
/// a guard that removes whatever the test made even when an assertion fails.
#[cfg(test)]
pub(super) mod testing {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Mutex, MutexGuard};

    /// The shadow tools give up ("cannot lock /etc/passwd") when another holds the lock file,
    /// so the tests that change accounts take turns.
    static ACCOUNTS: Mutex<()> = Mutex::new(());

    /// The tools and privileges account tests need, or why they are skipped.
    pub fn skip_reason(tools: &[&str]) -> Option<String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some("needs root".into());
        }
        tools
            .iter()
            .find(|tool| super::process::find_program(tool).is_none())
            .map(|tool| format!("{tool} not found"))
    }

    /// `svct` + pid + a letter + a counter: unique on the host, a valid name, at most 20
    /// characters.
    pub fn unique_name(letter: char) -> String {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        format!("svct{}{letter}{count}", std::process::id())
    }

    /// Removes the named users (with their crontabs) and groups when dropped, ignoring what is
    /// already gone, and holds the accounts lock until then.
    pub struct Cleanup {
        pub users: Vec<String>,
        pub groups: Vec<String>,
        _turn: MutexGuard<'static, ()>,
    }

    impl Cleanup {
        pub fn new() -> Cleanup {
            Cleanup {
                users: Vec::new(),
                groups: Vec::new(),
                _turn: ACCOUNTS.lock().unwrap_or_else(|poison| poison.into_inner()),
            }
        }
    }

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let quiet = |program: &str, arguments: &[&str]| {
                let _ = std::process::Command::new(program)
                    .args(arguments)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
            };
            for user in &self.users {
                if super::process::find_program("crontab").is_some() {
                    quiet("crontab", &["-r", "-u", user]);
                }
                quiet("userdel", &["--", user]);
            }
            for group in &self.groups {
                quiet("groupdel", &["--", group]);
            }
        }
    }

    /// Whether a user or group by that name is in the local databases.
    pub fn user_exists(name: &str) -> bool {
        super::read_users()
            .unwrap()
            .iter()
            .any(|user| user.name == name)
    }

    pub fn group_exists(name: &str) -> bool {
        super::read_groups()
            .unwrap()
            .iter()
            .any(|group| group.name == name)
    }

    /// The databases as text, to show that a check changed nothing.
    pub fn snapshot() -> (String, String) {
        (
            super::read_database(super::PASSWD).unwrap(),
            super::read_database(super::GROUP).unwrap(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lines() {
        let text = "\
root:x:0:0:root:/root:/bin/bash
app:x:1500:1500:App Server,,,:/srv/app:/usr/sbin/nologin
+nisuser::::::
# comment
broken:x:notanumber:1::/:/bin/sh
short:x:1:1
";
        assert_eq!(
            parse_passwd(text),
            [
                UserEntry {
                    name: "root".into(),
                    uid: 0,
                    gid: 0,
                    comment: "root".into(),
                    home: "/root".into(),
                    shell: "/bin/bash".into(),
                },
                UserEntry {
                    name: "app".into(),
                    uid: 1500,
                    gid: 1500,
                    comment: "App Server,,,".into(),
                    home: "/srv/app".into(),
                    shell: "/usr/sbin/nologin".into(),
                },
            ]
        );
    }

    #[test]
    fn group_lines() {
        let text = "root:x:0:\nadm:x:4:syslog,app\n+:::\nweb:x:33:app,\n";
        let groups = parse_group(text);
        let summary: Vec<(&str, u32, Vec<&str>)> = groups
            .iter()
            .map(|group| {
                (
                    group.name.as_str(),
                    group.gid,
                    group.members.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("root", 0, vec![]),
                ("adm", 4, vec!["syslog", "app"]),
                ("web", 33, vec!["app"]),
            ]
        );
    }

    #[test]
    fn this_hosts_databases_parse() {
        assert!(read_users().unwrap().iter().any(|user| user.uid == 0));
        assert!(read_groups().unwrap().iter().any(|group| group.gid == 0));
    }

    #[test]
    fn a_failing_tool_says_why() {
        let error = run_tool("no-such-shadow-tool-svc", &["x"]).unwrap_err();
        assert_eq!(
            error,
            "no-such-shadow-tool-svc not found (accounts are managed with the shadow tools)"
        );
    }
}
