//! Shell completions and man pages, as a user's shell and `man` see them.

use std::path::Path;
use std::process::Command;

const SVC: &str = env!("CARGO_BIN_EXE_svc");

fn run(args: &[&str]) -> std::process::Output {
    Command::new(SVC).args(args).output().unwrap()
}

/// What bash offers for `line` (the last word is being completed) with the script loaded.
fn bash_complete(script: &Path, line: &str) -> Vec<String> {
    let words: Vec<&str> = line.split(' ').collect();
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'\nCOMP_WORDS=({})\nCOMP_CWORD={}\n_svc_complete\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        script.display(),
        quoted.join(" "),
        words.len() - 1
    );
    let output = Command::new("bash")
        .args(["--norc", "-c", &program])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completion_completes_names_subcommands_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("svc.bash");
    // svcctl and svc print the same script.
    let from_ctl = Command::new(SVC)
        .arg("ctl")
        .args(["completion", "bash"])
        .output()
        .unwrap();
    assert!(from_ctl.status.success(), "{from_ctl:?}");
    let from_svc = run(&["completion", "bash"]);
    assert_eq!(from_ctl.stdout, from_svc.stdout);
    std::fs::write(&script, &from_svc.stdout).unwrap();

    let cases: &[(&str, &[&str])] = &[
        ("svcctl ag", &["agent"]),
        ("svc-secrets tr", &["transit"]),
        ("svcctl secrets transit en", &["encrypt"]),
        ("svc events li", &["list"]),
        ("svc ct", &["ctl"]),
        ("svc ctl apikey create --ro", &["--role"]),
        // Common flags follow every subcommand; a flag's value is no command.
        ("svcctl -o json apikey cr", &["create"]),
        ("svc-audit log --min-sev", &["--min-severity"]),
        ("/usr/bin/svc-server --check", &["--check-config"]),
    ];
    for (line, expected) in cases {
        assert_eq!(bash_complete(&script, line), *expected, "{line}");
    }
    // Every name is registered.
    let text = String::from_utf8(from_svc.stdout).unwrap();
    let registered = text
        .lines()
        .find(|line| line.starts_with("complete -F _svc_complete "))
        .unwrap();
    for name in svc::dispatch::names() {
        assert!(registered.split(' ').any(|w| w == name), "{name}");
    }
}

#[test]
fn zsh_and_fish_scripts_cover_the_same_words() {
    for shell in ["zsh", "fish"] {
        let output = run(&["completion", shell]);
        assert!(output.status.success(), "{shell}: {output:?}");
        let text = String::from_utf8(output.stdout).unwrap();
        for word in ["transit", "create-key", "--min-severity", "svc-server"] {
            assert!(text.contains(word), "{shell}: {word}");
        }
    }
    let output = run(&["completion", "tcsh"]);
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn man_pages_for_every_name_render_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(&["man", dir.path().to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    let mut pages = vec![("svc".to_string(), 1)];
    pages.extend(svc::dispatch::names().into_iter().map(|name| {
        let section = if name == "svc-server" || name == "svc-agent" {
            8
        } else {
            1
        };
        (name.to_string(), section)
    }));
    for (name, section) in pages {
        let path = dir.path().join(format!("{name}.{section}"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        for heading in [
            ".SH NAME",
            ".SH SYNOPSIS",
            ".SH \"EXIT STATUS\"",
            ".SH ENVIRONMENT",
            ".SH FILES",
        ] {
            assert!(text.contains(heading), "{name}: {heading}");
        }
        // `man --warnings` runs groff with -ww; anything on stderr is a warning.
        let rendered = Command::new("man")
            .args(["--warnings", "-l"])
            .arg(&path)
            .env("MANWIDTH", "80")
            .env("MANPAGER", "cat")
            .output()
            .expect("man (Debian man-db and groff) is needed; .ci/run installs it");
        assert!(rendered.status.success(), "{name}: {rendered:?}");
        assert_eq!(String::from_utf8_lossy(&rendered.stderr), "", "{name}");
        let shown = String::from_utf8_lossy(&rendered.stdout);
        assert!(shown.contains("EXIT STATUS"), "{name}");
    }
    let server = std::fs::read_to_string(dir.path().join("svc-server.8")).unwrap();
    assert!(server.contains("/etc/svc/server.yaml"));
    assert!(server.contains("\\-\\-check\\-config"));
    assert!(server.contains(".B SVC_LOG"));
    let secrets = std::fs::read_to_string(dir.path().join("svc-secrets.1")).unwrap();
    assert!(secrets.contains(".SS \"svc\\-secrets transit encrypt\""));
    assert!(secrets.contains(".B SVC_API_KEY"));
}

/// The commands that help, completions and man pages read from their argh definitions
/// (`svc::cli::args_info`) say what their printed `--help` says: the same flags, the same of
/// them taking a value, the same positionals and subcommands, at every level below them.
#[test]
fn argh_definitions_agree_with_the_printed_help() {
    use svc::cli::helptext;
    let exe = Path::new(SVC);
    let mut checked = 0;
    for name in svc::dispatch::names() {
        let top = helptext::parse(&helptext::help_text(exe, &[name.to_string()]).unwrap());
        for command in top.commands() {
            let Some(info) = svc::cli::args_info(&[name, command.term.as_str()]) else {
                continue;
            };
            checked += compare(&[name.to_string(), command.term.clone()], &info);
        }
    }
    // svcctl's own commands, svc-audit, svc-events, svc-blueprint, svc-gitops, svc-module,
    // svc-registry and svc-webhook, with their subcommands.
    assert!(checked >= 50, "{checked}");
}

/// Compares one command and everything under it; returns how many commands it compared.
fn compare(path: &[String], info: &argh::CommandInfoWithArgs) -> usize {
    use svc::cli::helptext::{self, Help};
    let printed = helptext::parse(&helptext::help_text(Path::new(SVC), path).unwrap());
    let data = helptext::from_args_info(&path.join(" "), info);
    let words = |help: &Help| {
        let mut flags: Vec<(Vec<String>, bool)> = help
            .options()
            .iter()
            .map(|entry| (entry.flags.clone(), entry.takes_value))
            .collect();
        flags.sort();
        let commands: Vec<String> = help.commands().iter().map(|e| e.term.clone()).collect();
        let positionals: Vec<String> = help
            .sections
            .iter()
            .filter(|s| s.title == "Positional Arguments")
            .flat_map(|s| s.entries.iter().map(|e| e.term.clone()))
            .collect();
        (flags, commands, positionals)
    };
    assert_eq!(words(&data), words(&printed), "{path:?}");
    let mut count = 1;
    for sub in &info.commands {
        let mut child = path.to_vec();
        child.push(sub.name.to_string());
        count += compare(&child, &sub.command);
    }
    count
}

/// Every name's help as completions and man pages read it, built from its definitions with
/// nothing run (`svc::cli::top_help`), is what the name prints for `--help`, read back.
#[test]
fn every_name_s_help_from_its_definitions_is_its_printed_help() {
    use svc::cli::helptext;
    let exe = Path::new(SVC);
    let names = std::iter::once("svc").chain(svc::dispatch::names());
    for name in names {
        let printed = helptext::parse(&helptext::help_text(exe, &[name.to_string()]).unwrap());
        let data = svc::cli::top_help(name).unwrap();
        assert_eq!(data, printed, "{name}");
    }
}

/// Below the top level, each command read from its definition has the usage line, the
/// options (in order, with their terms) and the commands it prints.
#[test]
fn every_command_s_usage_and_options_from_its_definition_are_printed() {
    use svc::cli::helptext::{self, Help, Node};
    // argh's `Notes:` are paragraphs in the definition, so only these sections are compared.
    fn shape(help: &Help) -> (String, Vec<(String, String)>) {
        let entries = help
            .sections
            .iter()
            .filter(|s| s.is_options() || s.is_commands() || s.title == "Positional Arguments")
            .flat_map(|section| {
                let title = section.title.clone();
                section
                    .entries
                    .iter()
                    .map(move |entry| (title.clone(), entry.term.clone()))
            })
            .collect();
        (help.usage.clone(), entries)
    }
    fn walk(node: &Node, checked: &mut usize) {
        for child in &node.children {
            if let Some(help) = &child.help {
                let text = helptext::help_text(Path::new(SVC), &child.path).unwrap();
                let printed = helptext::parse(&text);
                assert_eq!(shape(help), shape(&printed), "{:?}", child.path);
                *checked += 1;
            }
            walk(child, checked);
        }
    }
    let mut checked = 0;
    for name in svc::dispatch::names() {
        walk(&helptext::tree(name).unwrap(), &mut checked);
    }
    assert!(checked >= 100, "{checked}");
}
