//! The table of a program's commands and what is made from it: its help, and the answer to
//! a command not built yet (exit 1, `NAME: 'SUB' is not implemented yet`, never a fake
//! success). svc-agent's is made from its command table (`agent::with_planned`); a CLI's when its help is
//! asked for, from its row in `cli::planned` and its commands' argh definitions (`cli::run_listed`).
//!
//! Every help argh does not print is a [`Doc`]: these, svcctl's, svc-migrate's and `svc`'s.
//! Its text is rendered from the rows, and `cli::helptext` reads the same rows as data, so the
//! two cannot say different things.

use super::{exit, version_line};

pub struct Planned<'a> {
    pub name: &'a str,
    pub about: &'static str,
    /// Each command's word and one-line summary, in help order.
    pub commands: &'a [(&'a str, &'a str)],
    /// What runs when no subcommand is given (daemons); None means "usage error".
    pub default: Option<&'a str>,
    /// Whether it talks to the server with the common client flags.
    pub is_client: bool,
    /// Commands that are built (handled by the program's own code); the rest are planned.
    pub built: &'a [&'a str],
}

/// A hand-made help, as data: what every help not printed by argh is rendered from
/// ([`Doc::render`]), and what `cli::helptext` reads as the same `Help` without running
/// anything. A planned CLI's, svcctl's, svc-migrate's and `svc`'s helps are each one.
pub struct Doc {
    /// The usage line, after `Usage: `.
    pub usage: String,
    /// The paragraphs under it, separated by blank lines (lines within one are kept).
    pub about: &'static str,
    pub sections: Vec<DocSection>,
    /// Paragraphs after the sections ("" for none).
    pub notes: &'static str,
}

/// A block of `  TERM  TEXT` lines: a command list or options.
pub struct DocSection {
    /// `Commands`, `Options`, `Common options`; "" for a block without a title.
    pub title: &'static str,
    /// Each entry's term and text; a text's further lines (after `\n`) go under its first.
    pub rows: Vec<(String, String)>,
    /// The column the texts start at, less 4; None to fit the widest term.
    pub width: Option<usize>,
    /// Flags an entry's text names besides its term's (`-v, --version` on the `-h` line).
    pub more_flags: &'static [(&'static str, &'static [&'static str])],
}

impl DocSection {
    /// A section of rows given as string slices.
    pub fn new(title: &'static str, rows: &[(&str, &str)]) -> DocSection {
        DocSection {
            title,
            rows: rows
                .iter()
                .map(|(term, about)| (term.to_string(), about.to_string()))
                .collect(),
            width: None,
            more_flags: &[],
        }
    }

    /// The entries, one `  TERM  TEXT` line each: every term padded to the width (a longer
    /// one is followed by two spaces), a text's further lines indented under its first.
    pub fn render(&self) -> String {
        let width = self.width.unwrap_or_else(|| {
            self.rows
                .iter()
                .map(|(term, _)| term.len())
                .max()
                .unwrap_or(0)
        });
        let mut text = String::new();
        if !self.title.is_empty() {
            text.push_str(self.title);
            text.push_str(":\n");
        }
        for (term, about) in &self.rows {
            for (at, line) in about.split('\n').enumerate() {
                let term = if at == 0 { term.as_str() } else { "" };
                text.push_str(&format!("  {term:width$}  {line}\n"));
            }
        }
        text
    }
}

impl Doc {
    /// The help text: the usage, the paragraphs, each section, the notes, blank lines between.
    pub fn render(&self) -> String {
        let mut text = format!("Usage: {}\n\n{}\n", self.usage, self.about);
        for section in &self.sections {
            text.push('\n');
            text.push_str(&section.render());
        }
        if !self.notes.is_empty() {
            text.push('\n');
            text.push_str(self.notes);
            text.push('\n');
        }
        text
    }
}

/// The options of a program without the common client flags.
pub const OPTIONS: &[(&str, &str)] = &[
    ("-h, --help", "show help"),
    ("-v, --version", "show the version"),
];

/// What a planned program's help says when none of its commands is built.
const NOTHING_BUILT: &str = "Status: this command's features are not built yet; each command \
                             exits 1 with 'not implemented yet'.";

/// The help of a planned CLI, as data.
pub fn doc(planned: &Planned<'_>) -> Doc {
    let mut sections = Vec::new();
    if !planned.commands.is_empty() {
        let rows = planned
            .commands
            .iter()
            .map(|(name, about)| {
                let status = if planned.built.is_empty() || planned.built.contains(name) {
                    ""
                } else {
                    " (not implemented yet)"
                };
                (name.to_string(), format!("{about}{status}"))
            })
            .collect();
        sections.push(DocSection {
            rows,
            ..DocSection::new("Commands", &[])
        });
    }
    sections.push(if planned.is_client {
        super::common_section()
    } else {
        DocSection::new("Options", OPTIONS)
    });
    Doc {
        usage: if planned.commands.is_empty() {
            format!("{} [<options>]", planned.name)
        } else {
            format!("{} <command> [<args>]", planned.name)
        },
        about: planned.about,
        sections,
        notes: if planned.built.is_empty() {
            NOTHING_BUILT
        } else {
            ""
        },
    }
}

/// The help text of a planned CLI.
pub fn help(planned: &Planned<'_>) -> String {
    doc(planned).render()
}

/// Runs a planned CLI: help and version work; every command says it is not built yet.
pub fn run(planned: &Planned<'_>, args: &[String]) -> i32 {
    let program = planned.name;
    let (error_prefix, command_prefix) = match program.split_once(' ') {
        Some((root, sub)) => (root, format!("{sub} ")),
        None => (program, String::new()),
    };
    if super::wants_version(args) {
        println!("{}", version_line(error_prefix));
        return exit::OK;
    }
    // The common flags take values; remove them so a value is never mistaken for a command.
    let mut args = args.to_vec();
    if let Err(error) = super::take_common(&mut args) {
        eprintln!("{error_prefix}: {error}");
        return error.code;
    }
    let mut command = None;
    for arg in &args {
        match arg.as_str() {
            "-h" | "--help" | "help" => {
                print!("{}", help(planned));
                return exit::OK;
            }
            "--" => break,
            flag if flag.starts_with('-') => {}
            word if command.is_none() => command = Some(word.to_string()),
            _ => {}
        }
    }
    let command = match (command, planned.default) {
        (Some(word), _) if planned.commands.iter().any(|(name, _)| *name == word) => word,
        // An unknown word is a usage error even where a default command exists (svc-agent's
        // `run`): running, or blaming, the default for a typo would mislead.
        (Some(word), _) => {
            eprintln!("{error_prefix}: unknown command '{command_prefix}{word}'");
            eprintln!("{error_prefix}: run '{program} --help' for the commands");
            return exit::USAGE;
        }
        // No word, and flags the built default did not take (svc-agent's `-x`).
        (None, Some(default)) if planned.built.contains(&default) => {
            eprintln!("{error_prefix}: unrecognized arguments: {}", args.join(" "));
            eprintln!("{error_prefix}: run '{program} --help' for the commands");
            return exit::USAGE;
        }
        (None, Some(default)) => default.to_string(),
        (None, None) => {
            eprintln!("{error_prefix}: missing command");
            eprint!("{}", help(planned));
            return exit::USAGE;
        }
    };
    // A command without subcommands (`svcctl exec`) is named by itself.
    let full = if planned.commands.is_empty() && !command_prefix.is_empty() {
        command_prefix.trim().to_string()
    } else {
        format!("{command_prefix}{command}")
    };
    eprintln!("{error_prefix}: '{full}' is not implemented yet");
    exit::FAILED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_word_or_flag_is_a_usage_error_even_with_a_default_command() {
        let daemon = |built: &'static [&'static str]| Planned {
            name: "svc-daemon",
            about: "A daemon.",
            commands: &[("run", "run it")],
            default: Some("run"),
            is_client: false,
            built,
        };
        let args = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        assert_eq!(run(&daemon(&["run"]), &args(&["bogus"])), exit::USAGE);
        assert_eq!(run(&daemon(&["run"]), &args(&["-x"])), exit::USAGE);
        assert_eq!(run(&daemon(&[]), &args(&["bogus"])), exit::USAGE);
        // A default that is only planned still says so.
        assert_eq!(run(&daemon(&[]), &args(&["-x"])), exit::FAILED);
        assert_eq!(run(&daemon(&["run"]), &args(&["--help"])), exit::OK);
    }

    #[test]
    fn a_planned_help_lists_commands_then_options_or_the_common_ones() {
        let planned = Planned {
            name: "svc-x",
            about: "Does x.\nAnd y.",
            commands: &[("run", "run it"), ("status", "say how it is")],
            default: None,
            is_client: false,
            built: &["run"],
        };
        assert_eq!(
            help(&planned),
            "Usage: svc-x <command> [<args>]\n\nDoes x.\nAnd y.\n\nCommands:\n  \
             run     run it\n  status  say how it is (not implemented yet)\n\nOptions:\n  \
             -h, --help     show help\n  -v, --version  show the version\n"
        );
        let client = Planned {
            commands: &[],
            is_client: true,
            built: &[],
            ..planned
        };
        assert_eq!(
            help(&client),
            format!(
                "Usage: svc-x [<options>]\n\nDoes x.\nAnd y.\n\n{}\n\nStatus: this command's \
                 features are not built yet; each command exits 1 with 'not implemented yet'.\n",
                super::super::common_help()
            )
        );
    }
}
