//! `svc-agent service install|uninstall|status`: the systemd units of the split agent,
//! `svc-agent.service` (the bus side, user svc-agent) and `svc-agent-executor.service` (root,
//! runs the server-signed commands; docs/fleet.md).
//!
//! The unit texts are the ones in `systemd/` (embedded), with ExecStart pointed at this binary
//! and the agent's config. Starting them needs `agent.executor` set to the executor's socket
//! (an `inline` agent's daemon, as user svc-agent, could change nothing), and makes the
//! svc-agent user when it is missing. `--no-start` only writes the unit (images, chroots, tests); without
//! it systemctl must be there, and its absence is an error that says the unit was written.

use std::path::{Path, PathBuf};
use std::process::Command;

use argh::FromArgs;

use crate::program::{exit, parse_args, CliError, Output};

const UNIT_NAME: &str = "svc-agent.service";
const UNIT_TEMPLATE: &str = include_str!("../../systemd/svc-agent.service");
const EXECUTOR_UNIT_NAME: &str = "svc-agent-executor.service";
const EXECUTOR_UNIT_TEMPLATE: &str = include_str!("../../systemd/svc-agent-executor.service");
/// The user the bus side runs as (the unit's User=).
const AGENT_USER: &str = "svc-agent";
/// What the units' ExecStart lines start with in `systemd/`.
const TEMPLATE_COMMAND: &str = "/usr/bin/svc-agent --config /etc/svc/agent.yaml";
const DEFAULT_UNIT_DIR: &str = "/etc/systemd/system";

#[derive(FromArgs, argh::ArgsInfo)]
/// Manage the svc-agent systemd unit.
#[argh(help_triggers("-h", "--help"))]
pub(super) struct Args {
    #[argh(subcommand)]
    command: ServiceCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum ServiceCommand {
    Install(InstallArgs),
    Uninstall(UninstallArgs),
    Status(StatusArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Write both units, reload systemd, enable and start the executor and the agent.
#[argh(subcommand, name = "install", help_triggers("-h", "--help"))]
struct InstallArgs {
    /// where unit files go (default /etc/systemd/system)
    #[argh(option, default = "PathBuf::from(DEFAULT_UNIT_DIR)")]
    unit_dir: PathBuf,
    /// the svc-agent executable the unit runs (default: this program)
    #[argh(option)]
    binary: Option<PathBuf>,
    /// only write the unit; do not call systemctl
    #[argh(switch)]
    no_start: bool,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Stop and disable the agent and its executor and remove their units.
#[argh(subcommand, name = "uninstall", help_triggers("-h", "--help"))]
struct UninstallArgs {
    /// where unit files go (default /etc/systemd/system)
    #[argh(option, default = "PathBuf::from(DEFAULT_UNIT_DIR)")]
    unit_dir: PathBuf,
    /// only remove the unit; do not call systemctl
    #[argh(switch)]
    no_stop: bool,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Show whether the unit is installed, enabled and running (exit 0 only when running).
#[argh(subcommand, name = "status", help_triggers("-h", "--help"))]
struct StatusArgs {
    /// where unit files go (default /etc/systemd/system)
    #[argh(option, default = "PathBuf::from(DEFAULT_UNIT_DIR)")]
    unit_dir: PathBuf,
    /// table (default) or json
    #[argh(option, short = 'o', default = "Output::Table")]
    output: Output,
}

pub fn main(program: &str, config: Option<PathBuf>, args: &[String]) -> i32 {
    let parsed = match parse_args::<Args>(&format!("{program} service"), args) {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    let result = match parsed.command {
        ServiceCommand::Install(args) => install(config, args),
        ServiceCommand::Uninstall(args) => uninstall(args),
        ServiceCommand::Status(args) => status(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("{program}: {}", error.message);
            error.code
        }
    }
}

/// A unit's text (`template`) for `binary` and `config`.
fn unit_text(template: &str, binary: &Path, config: &Path) -> String {
    template
        .lines()
        .map(|line| match line.strip_prefix("ExecStart=") {
            Some(command) => {
                // current_exe() resolves the svc-agent symlink to the multi-call `svc`,
                // which needs the mode named: `svc agent`.
                let mode = if binary.file_name().is_some_and(|name| name == "svc-agent") {
                    ""
                } else {
                    " agent"
                };
                let rest = command.strip_prefix(TEMPLATE_COMMAND).unwrap_or("");
                format!(
                    "ExecStart={}{mode} --config {}{rest}",
                    binary.display(),
                    config.display()
                )
            }
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Why the split units cannot run the agent configured in `config`, if so.
fn split_problem(config: &Path) -> Option<String> {
    let loaded = crate::config::load_agent(Some(config), &[]).ok()?;
    (loaded.config.agent.executor.trim() == "inline").then(|| {
        format!(
            "{} has `executor: inline`, but svc-agent.service runs as user {AGENT_USER} and \
             hands commands to svc-agent-executor.service: set `agent.executor: \
             /run/svc-agent-executor/executor.sock` and `agent.command_key: \
             /etc/svc/command-key.pem`, then run `svc-agent bootstrap` again (docs/fleet.md)",
            config.display()
        )
    })
}

/// Makes the svc-agent system user when it is missing (the packages do it with sysusers.d).
fn ensure_agent_user() -> Result<(), CliError> {
    let exists = Command::new("getent")
        .args(["passwd", AGENT_USER])
        .output()
        .is_ok_and(|output| output.status.success());
    if exists {
        return Ok(());
    }
    let made = Command::new("useradd")
        .args([
            "--system",
            "--user-group",
            "--home-dir",
            "/var/lib/svc-agent",
        ])
        .args([
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            AGENT_USER,
        ])
        .status()
        .map_err(|e| CliError::failed(format!("cannot run useradd: {e}")))?;
    if made.success() {
        eprintln!("made the system user {AGENT_USER}");
        Ok(())
    } else {
        Err(CliError::failed(format!(
            "useradd {AGENT_USER} failed; make the user, then install again"
        )))
    }
}

/// Runs `systemctl ARGS`; Err when systemctl is missing or fails.
fn systemctl(args: &[&str]) -> Result<String, CliError> {
    let output = Command::new("systemctl").args(args).output().map_err(|e| {
        CliError::failed(if e.kind() == std::io::ErrorKind::NotFound {
            "systemctl not found: this host does not run systemd".to_string()
        } else {
            format!("cannot run systemctl: {e}")
        })
    })?;
    let text = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if output.status.success() {
        Ok(text)
    } else {
        Err(CliError::failed(format!(
            "systemctl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

fn install(config: Option<PathBuf>, args: InstallArgs) -> Result<i32, CliError> {
    let binary = match args.binary {
        Some(binary) => binary,
        None => std::env::current_exe()
            .map_err(|e| CliError::failed(format!("cannot find this program's path: {e}")))?,
    };
    let config = config.unwrap_or_else(|| PathBuf::from(super::DEFAULT_CONFIG));
    let config = std::path::absolute(&config).unwrap_or(config);
    std::fs::create_dir_all(&args.unit_dir)
        .map_err(|e| CliError::failed(format!("cannot create {}: {e}", args.unit_dir.display())))?;
    for (name, template) in [
        (EXECUTOR_UNIT_NAME, EXECUTOR_UNIT_TEMPLATE),
        (UNIT_NAME, UNIT_TEMPLATE),
    ] {
        let path = args.unit_dir.join(name);
        std::fs::write(&path, unit_text(template, &binary, &config))
            .map_err(|e| CliError::failed(format!("cannot write {}: {e}", path.display())))?;
        // Units are read by systemd as root and hold no secret: world-readable like any unit.
        let _ =
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644));
        eprintln!("wrote {}", path.display());
    }
    let problem = split_problem(&config);
    if args.no_start {
        if let Some(problem) = problem {
            eprintln!("warning: {problem}");
        }
        return Ok(exit::OK);
    }
    if let Some(problem) = problem {
        return Err(CliError::failed(problem));
    }
    ensure_agent_user()?;
    let started = systemctl(&["daemon-reload"])
        .and_then(|_| systemctl(&["enable", "--now", EXECUTOR_UNIT_NAME, UNIT_NAME]));
    match started {
        Ok(_) => {
            eprintln!("svc-agent-executor and svc-agent enabled and started");
            Ok(exit::OK)
        }
        Err(error) => Err(CliError::failed(format!(
            "{}; the units are written in {}, start them when systemd is available",
            error.message,
            args.unit_dir.display()
        ))),
    }
}

fn uninstall(args: UninstallArgs) -> Result<i32, CliError> {
    if !args.no_stop {
        systemctl(&["disable", "--now", UNIT_NAME, EXECUTOR_UNIT_NAME])?;
    }
    for name in [UNIT_NAME, EXECUTOR_UNIT_NAME] {
        let path = args.unit_dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => eprintln!("removed {}", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("{} was not installed", path.display())
            }
            Err(e) => {
                return Err(CliError::failed(format!(
                    "cannot remove {}: {e}",
                    path.display()
                )))
            }
        }
    }
    if !args.no_stop {
        systemctl(&["daemon-reload"])?;
    }
    Ok(exit::OK)
}

fn status(args: StatusArgs) -> Result<i32, CliError> {
    let path = args.unit_dir.join(UNIT_NAME);
    let installed = path.exists();
    // is-active / is-enabled print the state and exit non-zero when it is not "active" /
    // "enabled": the printed word is what matters.
    let query = |what: &str| -> String {
        match Command::new("systemctl").args([what, UNIT_NAME]).output() {
            Ok(output) => String::from_utf8_lossy(&output.stdout).trim().to_string(),
            Err(_) => "unknown (systemctl not found)".to_string(),
        }
    };
    let active = query("is-active");
    let enabled = query("is-enabled");
    match args.output {
        Output::Json => crate::program::output::print_json(&serde_json::json!({
            "unit": path, "installed": installed, "active": active, "enabled": enabled,
        }))?,
        Output::Table => crate::program::output::print_table(
            &["UNIT", "INSTALLED", "ENABLED", "ACTIVE"],
            &[vec![
                path.display().to_string(),
                installed.to_string(),
                enabled,
                active.clone(),
            ]],
        ),
    }
    Ok(if active == "active" {
        exit::OK
    } else {
        exit::FAILED
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_run_this_binary_with_the_config() {
        let binary = Path::new("/opt/svc/bin/svc-agent");
        let text = unit_text(UNIT_TEMPLATE, binary, Path::new("/etc/a.yaml"));
        assert!(text.contains("\nExecStart=/opt/svc/bin/svc-agent --config /etc/a.yaml\n"));
        assert_eq!(text.matches("ExecStart=").count(), 1);
        assert!(text.contains("[Install]"));
        let multi = unit_text(
            UNIT_TEMPLATE,
            Path::new("/usr/bin/svc"),
            Path::new("/etc/a.yaml"),
        );
        assert!(multi.contains("\nExecStart=/usr/bin/svc agent --config /etc/a.yaml\n"));
        let executor = unit_text(EXECUTOR_UNIT_TEMPLATE, binary, Path::new("/etc/a.yaml"));
        assert!(executor.contains(
            "\nExecStart=/opt/svc/bin/svc-agent --config /etc/a.yaml executor --socket \
             /run/svc-agent-executor/executor.sock --peer-user svc-agent\n"
        ));
    }
}
