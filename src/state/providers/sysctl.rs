//! `sysctl`: a kernel parameter, now (/proc/sys) and at boot (a `name = value` line in a
//! sysctl.d file).
//!
//! The running value is read and written through /proc/sys directly, which is all
//! `sysctl -w` does, and read again after the write: the kernel may refuse a value (EINVAL,
//! the error) or keep another (clamped), which is an error rather than a change repeated on
//! every apply. The runtime value is set first, so a value the kernel refuses is never
//! persisted to be refused again at every boot.
//!
//! In the file, the first line setting the name is replaced in place and later ones (which
//! would win, being read later) are removed; other lines stay. Values are compared with runs of
//! whitespace as one space, as the kernel prints multi-value settings with tabs.
//! systemd-sysctl reads the files of /etc/sysctl.d in name order and the last setting wins, so
//! a later file (on Debian, 99-sysctl.conf, the link to /etc/sysctl.conf) overrides the default
//! 99-svc.conf.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use super::{require_parent, text, Planned, Report};
use crate::state::{Mode, SysctlResource};

const PROC_SYS: &str = "/proc/sys";
const DEFAULT_FILE: &str = "/etc/sysctl.d/99-svc.conf";

pub(super) fn run(
    sysctl: &SysctlResource,
    mode: Mode,
    planned: &Planned,
) -> Result<Report, String> {
    run_with(sysctl, mode, Path::new(PROC_SYS), planned)
}

/// The provider with /proc/sys elsewhere, so tests can set values without touching the kernel.
fn run_with(
    sysctl: &SysctlResource,
    mode: Mode,
    proc_sys: &Path,
    planned: &Planned,
) -> Result<Report, String> {
    let name = sysctl.name.as_str();
    let value = normalize(&sysctl.value);
    let mut changes = Vec::new();
    if sysctl.runtime != Some(false) {
        let path = proc_sys.join(name.replace('.', "/"));
        let current = read_runtime(&path, name)?;
        if current != value {
            if mode == Mode::Apply {
                write_runtime(&path, &value)
                    .map_err(|error| format!("setting {name} to '{value}': {error}"))?;
                let now = read_runtime(&path, name)?;
                if now != value {
                    return Err(format!(
                        "the kernel keeps {name} at '{now}' after '{value}' was written"
                    ));
                }
            }
            changes.push(format!("runtime {current} -> {value}"));
        }
    }
    let file = Path::new(sysctl.file.as_deref().unwrap_or(DEFAULT_FILE));
    if let Some(change) = persist(file, name, &value, mode, planned)? {
        changes.push(change);
    }
    if changes.is_empty() {
        return Ok(Report::unchanged("already in state"));
    }
    Ok(Report::changed(changes.join("; ")))
}

fn normalize(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn read_runtime(path: &Path, name: &str) -> Result<String, String> {
    match fs::read(path) {
        Ok(bytes) => Ok(normalize(&String::from_utf8_lossy(&bytes))),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Err(format!(
            "unknown kernel parameter {name} (no {}; a module may need loading first)",
            path.display()
        )),
        // A directory: a part of a name, such as net.ipv4.
        Err(error) if error.raw_os_error() == Some(libc::EISDIR) => Err(format!(
            "{name} is a group of parameters ({} is a directory), not one",
            path.display()
        )),
        Err(error) => Err(format!("reading {}: {error}", path.display())),
    }
}

fn write_runtime(path: &Path, value: &str) -> io::Result<()> {
    // One write of the whole value, as the kernel parses each write on its own. Truncation is
    // ignored by /proc and keeps a stand-in file in tests honest.
    let mut file = OpenOptions::new().write(true).truncate(true).open(path)?;
    file.write_all(format!("{value}\n").as_bytes())
}

/// Brings the file's setting to `value`; what changed (or would), for the report.
fn persist(
    path: &Path,
    name: &str,
    value: &str,
    mode: Mode,
    planned: &Planned,
) -> Result<Option<String>, String> {
    let found = text::read(path)?;
    if found.is_none() {
        require_parent(path, planned)?;
    }
    let current = found.as_ref().map_or("", |found| found.text.as_str());
    let Some(edited) = edit(current, name, value) else {
        return Ok(None);
    };
    if mode == Mode::Apply {
        text::write(
            path,
            &edited.text,
            found.as_ref().map(|found| &found.metadata),
        )?;
    }
    Ok(Some(format!(
        "{}: {}",
        path.display(),
        edited.describe(mode)
    )))
}

/// A sysctl.d file's text with one setting changed.
#[derive(Debug, PartialEq)]
struct Edited {
    text: String,
    /// The line added, when no line set the name.
    added: Option<String>,
    /// The value replaced in place.
    replaced: Option<String>,
    /// Later lines for the same name, removed.
    duplicates: usize,
    name: String,
    value: String,
}

impl Edited {
    /// "would add 'x = 1'" / "added 'x = 1'", "x 0 -> 1", "1 later line for x removed".
    fn describe(&self, mode: Mode) -> String {
        let mut parts = Vec::new();
        if let Some(line) = &self.added {
            let verb = if mode == Mode::Check {
                "would add"
            } else {
                "added"
            };
            parts.push(format!("{verb} '{line}'"));
        }
        if let Some(old) = &self.replaced {
            parts.push(format!("{} {old} -> {}", self.name, self.value));
        }
        if self.duplicates > 0 {
            parts.push(format!(
                "{} later line{} for {} {}",
                self.duplicates,
                if self.duplicates == 1 { "" } else { "s" },
                self.name,
                if mode == Mode::Check {
                    "would be removed"
                } else {
                    "removed"
                }
            ));
        }
        parts.join(", ")
    }
}

/// The content with `name = value` set: the first line for the name replaced in place, later
/// ones removed, a new line at the end; None when nothing changes.
fn edit(content: &str, name: &str, value: &str) -> Option<Edited> {
    let wanted = format!("{name} = {value}");
    let mut output: Vec<&str> = Vec::new();
    let mut first: Option<String> = None;
    let mut duplicates = 0;
    for line in text::split_lines(content) {
        let Some(current) = setting_of(line, name) else {
            output.push(line);
            continue;
        };
        if first.is_some() {
            duplicates += 1;
            continue;
        }
        first = Some(current);
        output.push(&wanted);
    }
    let (added, replaced) = match first {
        None => {
            output.push(&wanted);
            (Some(wanted.clone()), None)
        }
        Some(current) if current != value => (None, Some(current)),
        Some(_) => (None, None),
    };
    if added.is_none() && replaced.is_none() && duplicates == 0 {
        return None;
    }
    Some(Edited {
        text: text::join_lines(&output),
        added,
        replaced,
        duplicates,
        name: name.to_string(),
        value: value.to_string(),
    })
}

/// The value a sysctl.d line sets for `name`, normalized; None for other lines. Keys may use
/// `/` for `.` and a leading `-` (ignore errors), as systemd-sysctl and sysctl -p allow.
fn setting_of(line: &str, name: &str) -> Option<String> {
    let line = line.trim();
    if line.starts_with(['#', ';']) {
        return None;
    }
    let (key, value) = line.split_once('=')?;
    let key = key.trim().trim_start_matches('-').trim().replace('/', ".");
    (key == name).then(|| normalize(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The providers with nothing planned by earlier resources.
    fn run(sysctl: &SysctlResource, mode: Mode) -> Result<Report, String> {
        super::run(sysctl, mode, &Planned::default())
    }

    fn run_with(sysctl: &SysctlResource, mode: Mode, proc_sys: &Path) -> Result<Report, String> {
        super::run_with(sysctl, mode, proc_sys, &Planned::default())
    }

    #[test]
    fn the_file_gets_one_line_per_name() {
        let name = "net.ipv4.ip_forward";
        // The file's content, the value, and the new content with the change, if any.
        type Case = (
            &'static str,
            &'static str,
            Option<(&'static str, &'static str)>,
        );
        let cases: [Case; 8] = [
            (
                "",
                "1",
                Some((
                    "net.ipv4.ip_forward = 1\n",
                    "would add 'net.ipv4.ip_forward = 1'",
                )),
            ),
            (
                "# routing\nvm.swappiness = 10",
                "1",
                Some((
                    "# routing\nvm.swappiness = 10\nnet.ipv4.ip_forward = 1\n",
                    "would add 'net.ipv4.ip_forward = 1'",
                )),
            ),
            ("net.ipv4.ip_forward=1\n", "1", None),
            ("-net/ipv4/ip_forward =  1 \n", "1", None),
            (
                "# net.ipv4.ip_forward = 0\nnet.ipv4.ip_forward = 1\n",
                "1",
                None,
            ),
            (
                "a = 1\nnet.ipv4.ip_forward = 0\nb = 2\n",
                "1",
                Some((
                    "a = 1\nnet.ipv4.ip_forward = 1\nb = 2\n",
                    "net.ipv4.ip_forward 0 -> 1",
                )),
            ),
            (
                "net.ipv4.ip_forward = 1\nnet.ipv4.ip_forward = 0\n",
                "1",
                Some((
                    "net.ipv4.ip_forward = 1\n",
                    "1 later line for net.ipv4.ip_forward would be removed",
                )),
            ),
            // Other names that share a prefix are other settings.
            (
                "net.ipv4.ip_forward_use_pmtu = 0\n",
                "1",
                Some((
                    "net.ipv4.ip_forward_use_pmtu = 0\nnet.ipv4.ip_forward = 1\n",
                    "would add 'net.ipv4.ip_forward = 1'",
                )),
            ),
        ];
        for (content, value, expected) in cases {
            let edited = edit(content, name, value);
            let edited = edited
                .as_ref()
                .map(|edited| (edited.text.as_str(), edited.describe(Mode::Check)));
            let expected = expected.map(|(text, detail)| (text, detail.to_string()));
            assert_eq!(edited, expected, "{content:?}");
        }
        assert_eq!(
            edit(
                "net.ipv4.tcp_rmem = 4096\t87380   6291456\n",
                "net.ipv4.tcp_rmem",
                "4096 87380 6291456"
            ),
            None
        );
    }

    fn outcome(sysctl: &SysctlResource, mode: Mode, proc_sys: &Path) -> (bool, String) {
        let report = run_with(sysctl, mode, proc_sys).unwrap();
        (report.changed, report.detail)
    }

    #[test]
    fn persisted_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("99-svc.conf");
        let place = file.display();
        let sysctl = SysctlResource {
            name: "vm.swappiness".into(),
            value: "10".into(),
            file: Some(file.to_str().unwrap().into()),
            runtime: Some(false),
        };
        // No /proc/sys is read with runtime: false.
        let nowhere = dir.path().join("no-proc");
        assert_eq!(
            outcome(&sysctl, Mode::Check, &nowhere),
            (true, format!("{place}: would add 'vm.swappiness = 10'"))
        );
        assert!(!file.exists(), "check wrote the file");
        assert_eq!(
            outcome(&sysctl, Mode::Apply, &nowhere),
            (true, format!("{place}: added 'vm.swappiness = 10'"))
        );
        assert_eq!(fs::read_to_string(&file).unwrap(), "vm.swappiness = 10\n");
        for mode in [Mode::Apply, Mode::Check] {
            assert_eq!(
                outcome(&sysctl, mode, &nowhere),
                (false, "already in state".into())
            );
        }

        fs::write(&file, "# mine\nkernel.panic = 10\nvm.swappiness=60\n").unwrap();
        let expected = format!("{place}: vm.swappiness 60 -> 10");
        assert_eq!(
            outcome(&sysctl, Mode::Check, &nowhere),
            (true, expected.clone())
        );
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            "# mine\nkernel.panic = 10\nvm.swappiness=60\n"
        );
        assert_eq!(outcome(&sysctl, Mode::Apply, &nowhere), (true, expected));
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            "# mine\nkernel.panic = 10\nvm.swappiness = 10\n"
        );
        // Only the file: no temporary files left.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn runtime_through_a_stand_in_proc_sys() {
        let dir = tempfile::tempdir().unwrap();
        let proc_sys = dir.path().join("proc");
        fs::create_dir_all(proc_sys.join("net/ipv4")).unwrap();
        let forward = proc_sys.join("net/ipv4/ip_forward");
        fs::write(&forward, "0\n").unwrap();
        fs::write(
            proc_sys.join("net/ipv4/tcp_rmem"),
            "4096\t131072\t6291456\n",
        )
        .unwrap();
        let file = dir.path().join("99-svc.conf");
        fs::write(&file, "net.ipv4.ip_forward = 1\n").unwrap();
        let sysctl = SysctlResource {
            name: "net.ipv4.ip_forward".into(),
            value: "1".into(),
            file: Some(file.to_str().unwrap().into()),
            runtime: None,
        };
        assert_eq!(
            outcome(&sysctl, Mode::Check, &proc_sys),
            (true, "runtime 0 -> 1".into())
        );
        assert_eq!(fs::read_to_string(&forward).unwrap(), "0\n");
        assert_eq!(
            outcome(&sysctl, Mode::Apply, &proc_sys),
            (true, "runtime 0 -> 1".into())
        );
        assert_eq!(fs::read_to_string(&forward).unwrap(), "1\n");
        assert_eq!(
            outcome(&sysctl, Mode::Apply, &proc_sys),
            (false, "already in state".into())
        );

        // Both parts at once, and tabs against spaces.
        let rmem = SysctlResource {
            name: "net.ipv4.tcp_rmem".into(),
            value: "4096 131072  6291456".into(),
            ..sysctl.clone()
        };
        assert_eq!(
            outcome(&rmem, Mode::Apply, &proc_sys),
            (
                true,
                format!(
                    "{}: added 'net.ipv4.tcp_rmem = 4096 131072 6291456'",
                    file.display()
                )
            )
        );
        assert!(!run_with(&rmem, Mode::Apply, &proc_sys).unwrap().changed);

        let cases = [
            (
                "net.ipv4.nope",
                "unknown kernel parameter net.ipv4.nope (no ",
            ),
            ("net.ipv4", "net.ipv4 is a group of parameters"),
        ];
        for (name, expected) in cases {
            let unknown = SysctlResource {
                name: name.into(),
                ..sysctl.clone()
            };
            let error = run_with(&unknown, Mode::Check, &proc_sys).unwrap_err();
            assert!(error.starts_with(expected), "{error}");
        }
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            "net.ipv4.ip_forward = 1\nnet.ipv4.tcp_rmem = 4096 131072 6291456\n"
        );
    }

    /// The real /proc/sys, read only: a value it already has changes nothing, and check mode
    /// reports another without writing it. The host kernel's values are never changed.
    #[test]
    fn runtime_against_this_kernel() {
        let name = "kernel.pid_max";
        let Ok(current) = fs::read_to_string("/proc/sys/kernel/pid_max") else {
            eprintln!("skipped: no /proc/sys/kernel/pid_max");
            return;
        };
        let current = normalize(&current);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("99-svc.conf");
        fs::write(&file, format!("{name} = {current}\n")).unwrap();
        let same = SysctlResource {
            name: name.into(),
            value: current.clone(),
            file: Some(file.to_str().unwrap().into()),
            runtime: None,
        };
        for mode in [Mode::Check, Mode::Apply] {
            let report = run(&same, mode).unwrap();
            assert_eq!(
                (report.changed, report.detail.as_str()),
                (false, "already in state")
            );
        }
        let other = if current == "32768" { "32769" } else { "32768" };
        let different = SysctlResource {
            value: other.into(),
            ..same
        };
        let report = run(&different, Mode::Check).unwrap();
        assert_eq!(
            report.detail,
            format!(
                "runtime {current} -> {other}; {}: {name} {current} -> {other}",
                file.display()
            )
        );
        assert_eq!(
            normalize(&fs::read_to_string("/proc/sys/kernel/pid_max").unwrap()),
            current
        );
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            format!("{name} = {current}\n")
        );
    }
}
