//! The .deb and the .rpm (scripts/packages, docs/release.md), built from the CI's portable
//! binary (SVC_PORTABLE_BIN, as in tests/portable.rs): lintian finds no error in the .deb,
//! both file lists are the expected set, and — as root with CI set — a real `dpkg -i`,
//! `svc-server --version`, `dpkg -r`, `dpkg -P` round trip on this machine.
//!
//! Without the binary or the tools (cargo-deb, rpmbuild, rpm, lintian, dpkg-deb, objcopy)
//! the package test prints why and passes; with CI set, .ci/run has installed them, so a
//! missing one fails it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PACKAGE: &str = "svc";

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn stdout(program: &str, args: &[&str]) -> String {
    let output = run(program, args);
    assert!(output.status.success(), "{program} {args:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// What is missing to build and check the packages, if anything.
fn missing_tools() -> Vec<&'static str> {
    let tools: &[(&str, &[&str])] = &[
        ("cargo", &["deb", "--version"]),
        ("rpmbuild", &["--version"]),
        ("rpm", &["--version"]),
        ("lintian", &["--version"]),
        ("dpkg-deb", &["--version"]),
        ("objcopy", &["--version"]),
    ];
    tools
        .iter()
        .filter(|(program, args)| {
            !Command::new(program)
                .args(*args)
                .output()
                .is_ok_and(|output| output.status.success())
        })
        .map(|(program, _)| {
            if *program == "cargo" {
                "cargo-deb"
            } else {
                program
            }
        })
        .collect()
}

/// The files both packages install besides the ones that differ (units, zsh, docs): every
/// name as a link to svc, completions for each name, a man page for svc and every name.
fn common_files(names: &[String]) -> BTreeSet<String> {
    let mut files: BTreeSet<String> = [
        "/usr/bin/svc",
        "/etc/svc/server.yaml",
        "/etc/svc/agent.yaml",
        "/usr/lib/sysusers.d/svc.conf",
        "/usr/lib/tmpfiles.d/svc.conf",
        "/usr/share/bash-completion/completions/svc",
        "/usr/share/fish/vendor_completions.d/svc.fish",
        "/usr/share/man/man1/svc.1.gz",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for name in names {
        files.insert(format!("/usr/bin/{name} -> svc"));
        files.insert(format!(
            "/usr/share/bash-completion/completions/{name} -> svc"
        ));
        files.insert(format!(
            "/usr/share/fish/vendor_completions.d/{name}.fish -> svc.fish"
        ));
        let section = if matches!(name.as_str(), "svc-server" | "svc-agent") {
            8
        } else {
            1
        };
        files.insert(format!("/usr/share/man/man{section}/{name}.{section}.gz"));
    }
    files
}

/// `dpkg-deb -c`: regular files and links (directories left out), with their modes.
fn deb_contents(deb: &Path) -> Vec<(String, String)> {
    stdout("dpkg-deb", &["-c", deb.to_str().unwrap()])
        .lines()
        .filter(|line| !line.starts_with('d'))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = fields[5..].join(" ");
            (
                fields[0].to_string(),
                format!("/{}", path.trim_start_matches("./")),
            )
        })
        .collect()
}

/// `rpm -qlpv`: every entry (directories included) as (mode, owner, group, path).
fn rpm_contents(rpm: &Path) -> Vec<(String, String, String, String)> {
    stdout("rpm", &["-qlpv", rpm.to_str().unwrap()])
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (
                fields[0].to_string(),
                fields[2].to_string(),
                fields[3].to_string(),
                fields[8..].join(" "),
            )
        })
        .collect()
}

#[test]
fn packages_have_the_expected_files_and_pass_lintian() {
    let Ok(binary) = std::env::var("SVC_PORTABLE_BIN") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "SVC_PORTABLE_BIN is not set: .ci/run builds the portable binary first"
        );
        eprintln!("SVC_PORTABLE_BIN not set: the .deb and .rpm are not built or checked");
        return;
    };
    let missing = missing_tools();
    if !missing.is_empty() {
        assert!(
            std::env::var_os("CI").is_none(),
            "missing {missing:?}: .ci/run installs them"
        );
        eprintln!("missing {missing:?}: the .deb and .rpm are not built or checked");
        return;
    }

    let out = tempfile::tempdir().unwrap();
    let built = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/packages"))
        .args(["--fast", &binary, out.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(built.status.success(), "scripts/packages: {built:?}");
    let paths: Vec<PathBuf> = String::from_utf8(built.stdout)
        .unwrap()
        .lines()
        .map(PathBuf::from)
        .collect();
    let [deb, rpm] = paths.as_slice() else {
        panic!("scripts/packages printed {paths:?}");
    };
    let names: Vec<String> = svc::dispatch::names()
        .iter()
        .map(|s| s.to_string())
        .collect();

    // lintian: errors fail, warnings are listed (the justified ones are overridden in
    // packaging/deb/lintian-overrides, so none are expected).
    let lintian = run("lintian", &[deb.to_str().unwrap()]);
    let report = String::from_utf8_lossy(&lintian.stdout).into_owned();
    let errors: Vec<&str> = report.lines().filter(|l| l.starts_with("E:")).collect();
    let warnings: Vec<&str> = report.lines().filter(|l| l.starts_with("W:")).collect();
    if !warnings.is_empty() {
        eprintln!("lintian warnings:\n{}", warnings.join("\n"));
    }
    assert!(errors.is_empty(), "lintian errors:\n{}", errors.join("\n"));
    assert!(
        lintian.status.success(),
        "lintian failed: {report}\n{}",
        String::from_utf8_lossy(&lintian.stderr)
    );

    // The .deb's files.
    let deb_files = deb_contents(deb);
    let mut expected = common_files(&names);
    for file in [
        "/lib/systemd/system/svc-server.service",
        "/lib/systemd/system/svc-agent.service",
        "/lib/systemd/system/svc-agent-executor.service",
        "/usr/share/zsh/vendor-completions/_svc",
        "/usr/share/doc/svc/copyright",
        "/usr/share/doc/svc/changelog.Debian.gz",
        "/usr/share/lintian/overrides/svc",
    ] {
        expected.insert(file.to_string());
    }
    let found: BTreeSet<String> = deb_files.iter().map(|(_, path)| path.clone()).collect();
    assert_eq!(found, expected, ".deb file list");
    let mode_of = |path: &str| {
        deb_files
            .iter()
            .find(|(_, p)| p == path)
            .map(|(mode, _)| mode.as_str())
            .unwrap()
    };
    assert_eq!(mode_of("/usr/bin/svc"), "-rwxr-xr-x");
    assert_eq!(mode_of("/etc/svc/server.yaml"), "-rw-r-----");
    let conffiles = stdout("dpkg-deb", &["-I", deb.to_str().unwrap(), "conffiles"]);
    assert_eq!(
        conffiles.lines().collect::<BTreeSet<_>>(),
        BTreeSet::from(["/etc/svc/server.yaml", "/etc/svc/agent.yaml"])
    );
    let control = stdout("dpkg-deb", &["-f", deb.to_str().unwrap()]);
    assert!(control.contains("Depends: libc6 (>= 2.17)"), "{control}");

    // The .rpm's files: the same, with Red Hat's unit and zsh directories, the state directory
    // owned by svc, and the templates as %config(noreplace).
    let rpm_files = rpm_contents(rpm);
    let mut expected = common_files(&names);
    for file in [
        "/usr/lib/systemd/system/svc-server.service",
        "/usr/lib/systemd/system/svc-agent.service",
        "/usr/lib/systemd/system/svc-agent-executor.service",
        "/usr/share/zsh/site-functions/_svc",
        "/usr/share/licenses/svc/LICENSE",
        "/etc/svc",
        "/var/lib/svc",
    ] {
        expected.insert(file.to_string());
    }
    let found: BTreeSet<String> = rpm_files.iter().map(|(.., path)| path.clone()).collect();
    assert_eq!(found, expected, ".rpm file list");
    let entry = |path: &str| {
        let (mode, user, group, _) = rpm_files.iter().find(|(.., p)| p == path).unwrap();
        format!("{mode} {user} {group}")
    };
    assert_eq!(entry("/var/lib/svc"), "drwxr-x--- svc svc");
    assert_eq!(entry("/etc/svc/server.yaml"), "-rw-r----- root svc");
    assert_eq!(entry("/usr/bin/svc"), "-rwxr-xr-x root root");
    let flags = stdout(
        "rpm",
        &[
            "-qp",
            "--qf",
            "[%{FILEFLAGS:fflags} %{FILENAMES}\n]",
            rpm.to_str().unwrap(),
        ],
    );
    let config: BTreeSet<&str> = flags
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(flags, _)| flags.contains('c'))
        .map(|(flags, path)| {
            assert!(flags.contains('n'), "{path} is %config without noreplace");
            path
        })
        .collect();
    assert_eq!(
        config,
        BTreeSet::from(["/etc/svc/server.yaml", "/etc/svc/agent.yaml"])
    );
    // Neither package's scripts enable or start a unit.
    never_enable_or_start(&stdout("rpm", &["-qp", "--scripts", rpm.to_str().unwrap()]));
    let control = tempfile::tempdir().unwrap();
    let extracted = run(
        "dpkg-deb",
        &[
            "-e",
            deb.to_str().unwrap(),
            control.path().to_str().unwrap(),
        ],
    );
    assert!(extracted.status.success(), "{extracted:?}");
    for script in ["preinst", "postinst", "prerm", "postrm"] {
        if let Ok(text) = std::fs::read_to_string(control.path().join(script)) {
            never_enable_or_start(&text);
        }
    }

    fish_autoloads_every_name(deb);

    if std::env::var_os("CI").is_some() && unsafe { libc::geteuid() } == 0 {
        dpkg_round_trip(deb);
    } else {
        eprintln!("not root with CI set: the dpkg -i / dpkg -r round trip is not run");
    }
}

/// fish loads vendor_completions.d/NAME.fish when NAME is first completed, so the package's
/// link per name is what makes `svcctl ag<TAB>` work; checked on the unpacked .deb.
fn fish_autoloads_every_name(deb: &Path) {
    if !Command::new("fish")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("no fish: the packaged fish completions are not tried");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let unpacked = run(
        "dpkg-deb",
        &["-x", deb.to_str().unwrap(), root.path().to_str().unwrap()],
    );
    assert!(unpacked.status.success(), "{unpacked:?}");
    let usr = root.path().join("usr");
    let program = format!(
        "set -gx PATH '{}' $PATH; set -g fish_complete_path '{}' $fish_complete_path; \
         complete -C 'svcctl ag'; complete -C 'svc-secrets tr'",
        usr.join("bin").display(),
        usr.join("share/fish/vendor_completions.d").display()
    );
    let output = stdout("fish", &["--no-config", "-c", &program]);
    let words: Vec<&str> = output
        .lines()
        .filter_map(|l| l.split('\t').next())
        .collect();
    assert!(words.contains(&"agent"), "{output}");
    assert!(words.contains(&"transit"), "{output}");
}

/// Every systemctl / deb-systemd-invoke / deb-systemd-helper call in `scripts` reloads,
/// restarts what already runs, stops, disables or forgets: none enables, starts or presets.
fn never_enable_or_start(scripts: &str) {
    const TOOLS: &[&str] = &["systemctl", "deb-systemd-invoke", "deb-systemd-helper"];
    const ALLOWED: &[&str] = &["daemon-reload", "try-restart", "stop", "disable", "purge"];
    for line in scripts.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (at, word) in words.iter().enumerate() {
            // `command -v TOOL` only asks whether it is there.
            if !TOOLS.contains(word) || (at > 0 && words[at - 1] == "-v") {
                continue;
            }
            let verb = words[at + 1..].iter().find(|w| !w.starts_with('-'));
            assert!(
                verb.is_some_and(|verb| ALLOWED.contains(verb)),
                "maintainer script line {line:?}"
            );
        }
    }
}

/// Undoes the round trip whatever happens: purges the package and removes the svc user and
/// group if the test made them.
struct Cleanup {
    user_existed: bool,
    group_existed: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = dpkg(&["--purge", PACKAGE]);
        if !self.user_existed && exists("passwd", "svc") {
            let _ = run("userdel", &["svc"]);
        }
        if !self.group_existed && exists("group", "svc") {
            let _ = run("groupdel", &["svc"]);
        }
    }
}

fn exists(database: &str, key: &str) -> bool {
    run("getent", &[database, key]).status.success()
}

/// dpkg, waiting for its lock while another apt or dpkg (another build on this machine) has it.
fn dpkg(args: &[&str]) -> Output {
    for _ in 0..60 {
        let output = run("dpkg", args);
        if output.status.success() || !String::from_utf8_lossy(&output.stderr).contains("lock") {
            return output;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    run("dpkg", args)
}

/// Processes running /usr/bin/svc (started by the install if any): other tests on this machine
/// run svc too, but from their own target directories.
fn installed_svc_processes() -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(exe) = std::fs::read_link(entry.path().join("exe")) {
            if exe == Path::new("/usr/bin/svc") {
                found.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    found
}

fn dpkg_round_trip(deb: &Path) {
    use std::os::unix::fs::MetadataExt;
    let status = run("dpkg-query", &["-W", "-f", "${Status}", PACKAGE]);
    assert!(
        !String::from_utf8_lossy(&status.stdout).contains("installed"),
        "{PACKAGE} is already installed here: the round trip would remove it"
    );
    for path in ["/usr/bin/svc", "/etc/svc", "/var/lib/svc"] {
        assert!(
            !Path::new(path).exists(),
            "{path} exists (install.sh?): the round trip would overwrite or remove it"
        );
    }
    let _cleanup = Cleanup {
        user_existed: exists("passwd", "svc"),
        group_existed: exists("group", "svc"),
    };

    let installed = dpkg(&["-i", deb.to_str().unwrap()]);
    assert!(installed.status.success(), "dpkg -i: {installed:?}");
    let version = stdout("svc-server", &["--version"]);
    assert!(version.starts_with("svc-server "), "{version}");
    assert_eq!(
        std::fs::read_link("/usr/bin/svcctl").unwrap(),
        Path::new("svc")
    );

    // The user, its state directory and its configuration.
    let user = stdout("getent", &["passwd", "svc"]);
    let fields: Vec<&str> = user.trim().split(':').collect();
    let uid: u32 = fields[2].parse().unwrap();
    let gid: u32 = fields[3].parse().unwrap();
    assert!(uid < 1000, "not a system user: {user}");
    assert_eq!(fields[5], "/var/lib/svc", "{user}");
    let state = std::fs::metadata("/var/lib/svc").unwrap();
    assert!(state.is_dir());
    assert_eq!(
        (state.uid(), state.gid(), state.mode() & 0o7777),
        (uid, gid, 0o750)
    );
    let config = std::fs::metadata("/etc/svc/server.yaml").unwrap();
    assert_eq!(
        (config.uid(), config.gid(), config.mode() & 0o7777),
        (0, gid, 0o640)
    );

    // Installed, not enabled, not started.
    assert_eq!(installed_svc_processes(), Vec::<String>::new());
    for wants in std::fs::read_dir("/etc/systemd/system")
        .into_iter()
        .flatten()
        .flatten()
    {
        for unit in [
            "svc-server.service",
            "svc-agent.service",
            "svc-agent-executor.service",
        ] {
            assert!(
                !wants.path().join(unit).exists(),
                "{unit} enabled in {}",
                wants.path().display()
            );
        }
    }

    // An edited configuration survives a reinstall (dpkg's conffile handling).
    let mut edited = std::fs::read_to_string("/etc/svc/server.yaml").unwrap();
    edited.push_str("# edited by tests/packages.rs\n");
    std::fs::write("/etc/svc/server.yaml", &edited).unwrap();
    let reinstalled = dpkg(&["-i", deb.to_str().unwrap()]);
    assert!(
        reinstalled.status.success(),
        "dpkg -i again: {reinstalled:?}"
    );
    assert_eq!(
        std::fs::read_to_string("/etc/svc/server.yaml").unwrap(),
        edited
    );
    assert_eq!(installed_svc_processes(), Vec::<String>::new());

    // Remove keeps the configuration, purge takes it; the empty state directory goes too.
    let removed = dpkg(&["-r", PACKAGE]);
    assert!(removed.status.success(), "dpkg -r: {removed:?}");
    assert!(!Path::new("/usr/bin/svc").exists());
    assert!(!Path::new("/usr/bin/svc-server").exists());
    assert!(Path::new("/etc/svc/server.yaml").exists());
    let purged = dpkg(&["-P", PACKAGE]);
    assert!(purged.status.success(), "dpkg -P: {purged:?}");
    assert!(!Path::new("/etc/svc").exists());
    assert!(!Path::new("/var/lib/svc").exists());
}

#[test]
fn configuration_templates_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging");
    let check = |secrets: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_svc"));
        command
            .args(["server", "--config"])
            .arg(dir.join("server.yaml"))
            .arg("--check-config");
        for (key, _) in std::env::vars().filter(|(key, _)| key.starts_with("SVC_")) {
            command.env_remove(key);
        }
        command.envs(secrets.iter().copied()).output().unwrap()
    };
    // The server template is complete but for its two secrets, which it asks for.
    let output = check(&[]);
    assert!(!output.status.success());
    let problems = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(problems.lines().count(), 2, "{problems}");
    assert!(problems.contains("hmacsecret is missing"), "{problems}");
    assert!(problems.contains("master_key is missing"), "{problems}");
    let output = check(&[
        ("SVC_HMACSECRET", "0123456789abcdef0123456789abcdef"),
        (
            "SVC_MASTER_KEY",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        ),
    ]);
    assert!(output.status.success(), "{output:?}");

    let agent = svc::config::load_agent(Some(&dir.join("agent.yaml")), &[]).unwrap();
    assert_eq!(agent.config.nats.urls, ["nats://127.0.0.1:4222"]);
}
