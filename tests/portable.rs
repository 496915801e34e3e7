//! The portable build (docs/release.md): the svc linked by zig against glibc 2.17 may need no
//! symbol version above GLIBC_2.17 and no shared library beyond glibc's own.
//!
//! .ci/run builds it (`cargo zigbuild --profile portable-check --target
//! x86_64-unknown-linux-gnu.2.17 --bin svc`) and names it in SVC_PORTABLE_BIN; scripts/dist
//! runs the same check on the release binary. The ELF is read with binutils (objdump, readelf).

use std::process::Command;

/// The libraries a glibc 2.17 system always has (old glibc splits pthread, dl and rt out).
const ALLOWED: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
];

/// (symbol, version) for every dynamic symbol that needs a GLIBC version above 2.17.
fn too_new(binary: &str) -> Vec<(String, String)> {
    let output = Command::new("objdump")
        .args(["-T", binary])
        .output()
        .unwrap();
    assert!(output.status.success(), "objdump -T {binary}: {output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut found = Vec::new();
    for line in text.lines() {
        let Some(start) = line.find("GLIBC_") else {
            continue;
        };
        let version: String = line[start + 6..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let parts: Vec<u32> = version.split('.').filter_map(|p| p.parse().ok()).collect();
        if parts.as_slice() > [2, 17].as_slice() {
            let symbol = line.split_whitespace().last().unwrap_or("").to_string();
            found.push((symbol, format!("GLIBC_{version}")));
        }
    }
    found
}

fn needed(binary: &str) -> Vec<String> {
    let output = Command::new("readelf")
        .args(["-d", binary])
        .output()
        .unwrap();
    assert!(output.status.success(), "readelf -d {binary}: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| Some(line.split('[').nth(1)?.trim_end_matches(']').to_string()))
        .collect()
}

#[test]
fn portable_binary_needs_nothing_newer_than_glibc_2_17() {
    let Ok(binary) = std::env::var("SVC_PORTABLE_BIN") else {
        // CI always gives it; a developer's `cargo test` has no zig build to read.
        assert!(
            std::env::var_os("CI").is_none(),
            "SVC_PORTABLE_BIN is not set: .ci/run builds the portable binary first"
        );
        eprintln!("SVC_PORTABLE_BIN not set: the portable binary is not checked");
        return;
    };
    assert_eq!(too_new(&binary), Vec::<(String, String)>::new());
    let needed = needed(&binary);
    assert!(needed.contains(&"libc.so.6".to_string()), "{needed:?}");
    for library in &needed {
        assert!(ALLOWED.contains(&library.as_str()), "NEEDED {library}");
    }
    // And it runs here.
    let version = server_version(&binary);
    assert!(version.starts_with("svc-server "), "{version}");
}

#[test]
fn the_check_catches_a_binary_linked_against_this_machines_glibc() {
    // The native build links against the host's glibc (2.36 on Debian 12), so the reader
    // must find its newer references (__libc_start_main@GLIBC_2.34 and the like).
    let native = env!("CARGO_BIN_EXE_svc");
    let found = too_new(native);
    assert!(
        !found.is_empty(),
        "no symbol above GLIBC_2.17 found in {native}"
    );
    assert!(needed(native).contains(&"libc.so.6".to_string()));
}

/// Runs the binary as `svc-server --version` (argv[0] picks the mode).
fn server_version(binary: &str) -> String {
    use std::os::unix::process::CommandExt;
    let output = Command::new(binary)
        .arg0("svc-server")
        .arg("--version")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}
