//! install.sh: copies the binary, links every name, and uninstalls only what it made.

use std::process::Command;

fn install(args: &[&str]) -> std::process::Output {
    Command::new("sh")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/install.sh"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn install_links_every_name_and_uninstall_removes_them() {
    let prefix = tempfile::tempdir().unwrap();
    let prefix_arg = prefix.path().to_str().unwrap();
    let output = install(&[
        "--prefix",
        prefix_arg,
        "--binary",
        env!("CARGO_BIN_EXE_svc"),
    ]);
    assert!(output.status.success(), "{output:?}");
    let bin = prefix.path().join("bin");
    assert!(bin.join("svc").is_file());
    for name in svc::dispatch::names() {
        let link = bin.join(name);
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            std::path::Path::new("svc"),
            "{name}"
        );
        let version = Command::new(&link).arg("--version").output().unwrap();
        assert!(
            String::from_utf8_lossy(&version.stdout).starts_with(name),
            "{name}"
        );
    }
    // Someone else's file with one of our names is left alone.
    std::fs::remove_file(bin.join("svc-webhook")).unwrap();
    std::fs::write(bin.join("svc-webhook"), "not ours").unwrap();

    let output = install(&["--prefix", prefix_arg, "--uninstall"]);
    assert!(output.status.success(), "{output:?}");
    let left: Vec<String> = std::fs::read_dir(&bin)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["svc-webhook"]);
}

#[test]
fn install_rejects_unknown_options_and_missing_binaries() {
    let output = install(&["--frobnicate"]);
    assert_eq!(output.status.code(), Some(2));
    let prefix = tempfile::tempdir().unwrap();
    let output = install(&[
        "--prefix",
        prefix.path().to_str().unwrap(),
        "--binary",
        "/nonexistent/svc",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no svc binary found"));
}
