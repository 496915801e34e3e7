//! Every name's help as data: the one source of the shell completions (`completion.rs`) and
//! the man pages (`manpage.rs`), so neither can drift from `--help`.
//!
//! Nothing is run to read it. A command defined with argh is read from its definition
//! (`ArgsInfo`, through `cli::args_info`): its flags, their values, positionals and
//! subcommands. Each name's top level comes from the data its `--help` is printed from
//! (`cli::top_help`): the argh definition of a name without commands (svc-server,
//! svc-bootstrap), or the hand-made help of the rest (`program::planned::Doc`: a CLI's
//! `planned.rs` row and its table or argh enum, svcctl's, svc-migrate's and svc-agent's
//! tables, `svc`'s words), read by `from_doc` as `parse` would read the printed text.
//! `parse` stays for that check: tests/completion.rs runs the binary under every name and holds
//! what it prints to the data, top levels and every command read from its definition.
use std::path::Path;
use std::process::{Command, Stdio};

/// One `--help` text, split into its parts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Help {
    /// The `Usage:` line without the word `Usage:`.
    pub usage: String,
    /// Free-text paragraphs (the description, trailing notes), each joined into one line.
    pub paragraphs: Vec<String>,
    pub sections: Vec<Section>,
}

/// A `Title:` block (`Commands`, `Options`, `Common options`, `Positional Arguments`), or an
/// indented block without a title (title empty).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Section {
    pub title: String,
    pub entries: Vec<Entry>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Entry {
    /// What the entry names: `agent`, `--server HOST:PORT`, `-h, --help`.
    pub term: String,
    /// Its description, continuation lines joined.
    pub about: String,
    /// The flags the entry defines (`-o`, `--output`); empty for commands.
    pub flags: Vec<String>,
    /// Whether those flags take a value (a placeholder follows them, or the usage line shows
    /// `--flag <value>`).
    pub takes_value: bool,
}

impl Section {
    pub fn is_commands(&self) -> bool {
        self.title.to_ascii_lowercase().contains("command")
    }
    pub fn is_options(&self) -> bool {
        self.title.to_ascii_lowercase().contains("option")
    }
}

impl Help {
    /// The subcommand names in the `Commands:` sections (placeholders such as `NAME` left out).
    pub fn commands(&self) -> Vec<&Entry> {
        self.sections
            .iter()
            .filter(|section| section.is_commands())
            .flat_map(|section| &section.entries)
            .filter(|entry| is_command_word(&entry.term))
            .collect()
    }

    /// Every flag entry of the option sections.
    pub fn options(&self) -> Vec<&Entry> {
        self.sections
            .iter()
            .filter(|section| section.is_options())
            .flat_map(|section| &section.entries)
            .filter(|entry| !entry.flags.is_empty())
            .collect()
    }

    /// The first paragraph: the one-line summary a man page's NAME section wants.
    pub fn summary(&self) -> &str {
        self.paragraphs.first().map(String::as_str).unwrap_or("")
    }
}

/// A subcommand word: lower case letters, digits and dashes (not `NAME`, not `<args>`).
fn is_command_word(word: &str) -> bool {
    !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !word.starts_with('-')
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// A flag token: `-o`, `--output`, `--min-severity` (a trailing comma allowed).
fn flag_token(token: &str) -> Option<&str> {
    let token = token.trim_end_matches(',');
    let name = token
        .strip_prefix("--")
        .or_else(|| token.strip_prefix('-'))?;
    let valid = !name.is_empty()
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    valid.then_some(token)
}

/// A value placeholder after a flag: `HOST:PORT`, `<path>`, `FORMAT`.
fn is_placeholder(token: &str) -> bool {
    (token.starts_with('<') && token.ends_with('>'))
        || (token.chars().any(|c| c.is_ascii_uppercase())
            && !token.chars().any(|c| c.is_ascii_lowercase()))
}

/// Splits `text` at runs of two or more spaces.
fn segments(text: &str) -> Vec<&str> {
    text.split("  ")
        .map(str::trim)
        .filter(|segment| !segment.is_empty())
        .collect()
}

/// Parses one entry line of an option section into its term, flags and the rest.
fn option_entry(line: &str) -> Entry {
    let text = line.trim();
    let mut flags = Vec::new();
    let mut takes_value = false;
    // The term is the leading run of flag tokens and their placeholders: argh puts a single
    // space after a term too long for its column, so two spaces cannot be relied on.
    let tokens: Vec<&str> = text.split(' ').collect();
    let mut used = 0;
    for token in &tokens {
        if let Some(flag) = flag_token(token) {
            flags.push(flag.to_string());
        } else if !flags.is_empty() && is_placeholder(token) {
            takes_value = true;
        } else {
            break;
        }
        used += 1;
    }
    let term = tokens[..used].join(" ");
    let about = tokens[used..].join(" ").trim().to_string();
    // A second flag pair on the same line (`-h, --help  show help;  -v, --version  ...`).
    for segment in segments(&about) {
        if segment.starts_with('-') {
            for token in segment.split(' ') {
                match flag_token(token) {
                    Some(flag) => flags.push(flag.to_string()),
                    None => break,
                }
            }
        }
    }
    Entry {
        term,
        about,
        flags,
        takes_value,
    }
}

/// Parses one entry line of any other section: the term runs to the first two spaces (or is
/// the first word, for argh's overflowing terms).
fn plain_entry(line: &str) -> Entry {
    let text = line.trim();
    let (term, about) = match text.split_once("  ") {
        Some((term, about)) => (term.trim(), about.trim()),
        None => text.split_once(' ').unwrap_or((text, "")),
    };
    Entry {
        term: term.to_string(),
        about: about.to_string(),
        ..Entry::default()
    }
}

/// Parses a help text (see the module comment for its shape).
pub fn parse(text: &str) -> Help {
    let mut help = Help::default();
    let blocks = text.split("\n\n").map(|block| block.trim_end_matches('\n'));
    for block in blocks {
        let lines: Vec<&str> = block.lines().collect();
        let Some(first) = lines.first() else {
            continue;
        };
        if first.trim().is_empty() {
            continue;
        }
        if let Some(usage) = first.strip_prefix("Usage:") {
            help.usage = usage.trim().to_string();
            continue;
        }
        let titled = indent_of(first) == 0
            && first.ends_with(':')
            && lines[1..].iter().all(|line| indent_of(line) >= 2);
        let body = if titled {
            &lines[1..]
        } else if indent_of(first) >= 2 {
            &lines[..]
        } else {
            help.paragraphs.push(lines.join(" "));
            continue;
        };
        let mut section = Section {
            title: if titled {
                first.trim_end_matches(':').to_string()
            } else {
                String::new()
            },
            entries: Vec::new(),
        };
        let entry_indent = body.iter().map(|line| indent_of(line)).min().unwrap_or(2);
        for line in body {
            if indent_of(line) > entry_indent {
                if let Some(entry) = section.entries.last_mut() {
                    entry.about = format!("{} {}", entry.about, line.trim());
                    entry.about = entry.about.trim().to_string();
                }
                continue;
            }
            let entry = if section.is_options() {
                option_entry(line)
            } else {
                plain_entry(line)
            };
            section.entries.push(entry);
        }
        help.sections.push(section);
    }
    // argh's usage line says which flags take a value: `[--config <config>]`.
    let usage_tokens: Vec<&str> = help.usage.split_whitespace().collect();
    for section in &mut help.sections {
        for entry in &mut section.entries {
            let shown_with_value = usage_tokens.windows(2).any(|pair| {
                let flag = pair[0].trim_start_matches('[');
                entry.flags.iter().any(|known| known == flag) && pair[1].starts_with('<')
            });
            entry.takes_value |= shown_with_value;
        }
    }
    help
}

/// A hand-made help as `parse` reads its printed text back, built from the data itself: each
/// entry's term and its lines joined; in an option section, the flags its term names (a
/// token that is no flag is the value placeholder) and the ones its text names besides.
pub fn from_doc(doc: &crate::program::planned::Doc) -> Help {
    let mut paragraphs = paragraphs_of(doc.about);
    paragraphs.extend(paragraphs_of(doc.notes));
    let sections = doc
        .sections
        .iter()
        .map(|from| {
            let mut section = Section {
                title: from.title.to_string(),
                entries: Vec::new(),
            };
            let is_options = section.is_options();
            for (term, about) in &from.rows {
                let mut entry = Entry {
                    term: term.clone(),
                    about: about
                        .split('\n')
                        .map(str::trim)
                        .collect::<Vec<_>>()
                        .join(" "),
                    ..Entry::default()
                };
                if is_options {
                    for token in term.split(' ') {
                        match token.trim_end_matches(',') {
                            flag if flag.starts_with('-') => entry.flags.push(flag.to_string()),
                            _ => entry.takes_value = true,
                        }
                    }
                    for (with, more) in from.more_flags {
                        if with == term {
                            entry.flags.extend(more.iter().map(|flag| flag.to_string()));
                        }
                    }
                }
                section.entries.push(entry);
            }
            section
        })
        .collect();
    Help {
        usage: doc.usage.clone(),
        paragraphs,
        sections,
    }
}

/// Paragraphs separated by blank lines, each joined into one line as `parse` joins them.
fn paragraphs_of(text: &str) -> Vec<String> {
    text.split("\n\n")
        .map(|block| block.lines().collect::<Vec<_>>().join(" "))
        .filter(|paragraph| !paragraph.is_empty())
        .collect()
}

/// A command's help from its argh definition (`ArgsInfo`), in the shape `parse` gives its
/// printed `--help`: the same usage, description, positionals, flags (with whether each takes a
/// value) and subcommands, read from the definition itself rather than from text.
pub fn from_args_info(path: &str, info: &argh::CommandInfoWithArgs) -> Help {
    use argh::{FlagInfoKind, Optionality};
    let mut usage = path.to_string();
    // As argh's usage line: the flags, then the positionals (`<id>`, `[<id>]`, `[<ids...>]`;
    // a greedy one bare: `[command...]`).
    let mut positional_usage = String::new();
    for positional in info.positionals.iter().filter(|p| !p.hidden) {
        let (open, close) = match positional.optionality {
            Optionality::Required => ("<", ">"),
            Optionality::Optional => ("[<", ">]"),
            Optionality::Repeating => ("[<", "...>]"),
            Optionality::Greedy => ("[", "...]"),
        };
        positional_usage.push_str(&format!(" {open}{}{close}", positional.name));
    }
    let mut options = Vec::new();
    for flag in info.flags.iter().filter(|f| !f.hidden) {
        // argh describes its help flag as --help alone; every svc command also takes -h.
        let short = match (flag.short, flag.long) {
            (Some(short), _) => Some(short),
            (None, "--help") => Some('h'),
            (None, _) => None,
        };
        let mut flags: Vec<String> = short.map(|c| format!("-{c}")).into_iter().collect();
        flags.push(flag.long.to_string());
        let takes_value = matches!(flag.kind, FlagInfoKind::Option { .. });
        if flag.long != "--help" {
            // argh's usage line names a flag by its short form when it has one (`[-o <output>]`).
            let named = match flag.short {
                Some(short) => format!("-{short}"),
                None => flag.long.to_string(),
            };
            // A repeated option is `[--set <set...>]`, a repeated switch plain `[--verbose]`.
            let repeats = matches!(
                flag.optionality,
                Optionality::Repeating | Optionality::Greedy
            );
            let shown = match flag.kind {
                FlagInfoKind::Option { arg_name } if repeats => format!("{named} <{arg_name}...>"),
                FlagInfoKind::Option { arg_name } => format!("{named} <{arg_name}>"),
                FlagInfoKind::Switch => named,
            };
            let word = match flag.optionality {
                Optionality::Required => format!(" {shown}"),
                _ => format!(" [{shown}]"),
            };
            usage.push_str(&word);
        }
        options.push(Entry {
            term: flags.join(", "),
            about: flag.description.to_string(),
            flags,
            takes_value,
        });
    }
    // argh lists its help flag first in the definition but prints it last.
    if let Some(at) = options
        .iter()
        .position(|entry| entry.flags.iter().any(|f| f == "--help"))
    {
        let help = options.remove(at);
        options.push(help);
    }
    // argh marks where positionals may start (`[--]`) when there are some and no subcommands.
    let has_positional = info
        .positionals
        .iter()
        .any(|p| !p.hidden && p.optionality != Optionality::Greedy);
    if has_positional && info.commands.is_empty() {
        usage.push_str(" [--]");
    }
    usage.push_str(&positional_usage);
    if !info.commands.is_empty() {
        usage.push_str(" <command> [<args>]");
    }
    let mut help = Help {
        usage,
        paragraphs: std::iter::once(info.description)
            .chain(info.notes.iter().copied())
            .map(|text| text.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|text| !text.is_empty())
            .collect(),
        sections: Vec::new(),
    };
    // As argh's help: a positional without a description, or a greedy one (the rest of the
    // line), is in the usage line only.
    let positionals: Vec<Entry> = info
        .positionals
        .iter()
        .filter(|p| !p.hidden && !p.description.is_empty())
        .filter(|p| p.optionality != Optionality::Greedy)
        .map(|p| Entry {
            term: p.name.to_string(),
            about: p.description.to_string(),
            ..Entry::default()
        })
        .collect();
    if !positionals.is_empty() {
        help.sections.push(Section {
            title: "Positional Arguments".into(),
            entries: positionals,
        });
    }
    help.sections.push(Section {
        title: "Options".into(),
        entries: options,
    });
    if !info.commands.is_empty() {
        help.sections.push(Section {
            title: "Commands".into(),
            entries: info
                .commands
                .iter()
                .map(|sub| Entry {
                    term: sub.name.to_string(),
                    about: sub.command.description.to_string(),
                    ..Entry::default()
                })
                .collect(),
        });
    }
    help
}

/// The node at `path` and everything under it, from its argh definition.
fn node_from_args_info(path: Vec<String>, about: String, info: &argh::CommandInfoWithArgs) -> Node {
    let help = from_args_info(&path.join(" "), info);
    let children = info
        .commands
        .iter()
        .map(|sub| {
            let mut child_path = path.clone();
            child_path.push(sub.name.to_string());
            node_from_args_info(
                child_path,
                sub.command.description.to_string(),
                &sub.command,
            )
        })
        .collect();
    Node {
        path,
        about,
        help: Some(help),
        children,
    }
}

/// A name or subcommand with its help and its subcommands.
#[derive(Clone, Debug)]
pub struct Node {
    /// `["svcctl", "apikey", "create"]`.
    pub path: Vec<String>,
    /// The summary its parent's `Commands:` list gives it.
    pub about: String,
    /// Its own help; None for a command without a definition of its own (`svcctl version`).
    pub help: Option<Help>,
    pub children: Vec<Node>,
}

impl Node {
    pub fn name(&self) -> String {
        self.path.join(" ")
    }
}

/// Runs `exe` as `path[0]` with the rest of `path` and `--help`; returns what it printed. Not
/// used to build the help: the tests that hold the data to what each name prints read it.
pub fn help_text(exe: &Path, path: &[String]) -> Result<String, String> {
    use std::os::unix::process::CommandExt;
    let output = Command::new(exe)
        .arg0(&path[0])
        .args(&path[1..])
        .arg("--help")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    if !output.status.success() {
        return Err(format!(
            "'{} --help' exited with {}",
            path.join(" "),
            output.status
        ));
    }
    String::from_utf8(output.stdout).map_err(|_| format!("'{}' help is not UTF-8", path[0]))
}

/// The tree under `name` (`svc` or a top-level name such as `svcctl`): its help from its data
/// (`cli::top_help`), and each command in it from its argh definition. A command without
/// one (`svcctl version`, `svcctl completion`: no flags, no subcommands) has no help of its
/// own; its parent's list says what it does.
pub fn tree(name: &str) -> Result<Node, String> {
    let help =
        crate::cli::top_help(name).ok_or_else(|| format!("no help is defined for {name}"))?;
    let children = help
        .commands()
        .iter()
        .map(|entry| {
            let path = vec![name.to_string(), entry.term.clone()];
            match crate::cli::args_info(&[name, entry.term.as_str()]) {
                Some(info) => node_from_args_info(path, entry.about.clone(), &info),
                None => Node {
                    path,
                    about: entry.about.clone(),
                    help: None,
                    children: Vec::new(),
                },
            }
        })
        .collect();
    Ok(Node {
        path: vec![name.to_string()],
        about: help.summary().to_string(),
        help: Some(help),
        children,
    })
}

/// Every top-level name's tree, in `svc --list` order.
pub fn forest() -> Result<Vec<Node>, String> {
    crate::program::NAMES
        .iter()
        .map(|name| tree(name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARGH: &str = "\
Usage: svcctl apikey create --name <name> [--ttl <ttl>] [--dry]

Create an API key and print it
(the only time it is shown).

Options:
  --name            a label for the key
  --non-interactive never prompt; fail on missing values
  --ttl             expiry as a duration from now (30d, 24h), not
                    --since
  --dry             only say what would happen
  -h, --help        display usage information

Commands:
  create            Create an API key.
  list-keys         List keys.
";

    #[test]
    fn argh_help_gives_flags_values_and_commands() {
        let help = parse(ARGH);
        assert_eq!(
            help.usage,
            "svcctl apikey create --name <name> [--ttl <ttl>] [--dry]"
        );
        assert_eq!(
            help.paragraphs,
            ["Create an API key and print it (the only time it is shown)."]
        );
        let options: Vec<(Vec<String>, bool)> = help
            .options()
            .iter()
            .map(|entry| (entry.flags.clone(), entry.takes_value))
            .collect();
        let flags = |names: &[&str], value| (names.iter().map(|s| s.to_string()).collect(), value);
        assert_eq!(
            options,
            [
                flags(&["--name"], true),
                flags(&["--non-interactive"], false),
                flags(&["--ttl"], true),
                flags(&["--dry"], false),
                flags(&["-h", "--help"], false),
            ]
        );
        assert_eq!(
            help.options()[2].about,
            "expiry as a duration from now (30d, 24h), not --since"
        );
        let commands: Vec<&str> = help.commands().iter().map(|e| e.term.as_str()).collect();
        assert_eq!(commands, ["create", "list-keys"]);
    }

    #[test]
    fn hand_written_help_gives_placeholders_and_second_flag_pairs() {
        let help = parse(&format!(
            "Usage: svcctl <command> [<args>]\n\nOperator CLI.\n\nCommands:\n  agent      agents\n  NAME       run svc-NAME\n             or a plugin\n\n{}\n",
            crate::cli::common_help()
        ));
        let commands: Vec<&str> = help.commands().iter().map(|e| e.term.as_str()).collect();
        assert_eq!(commands, ["agent"]);
        let server = help.options()[0];
        assert_eq!(server.term, "--server HOST:PORT");
        assert!(server.takes_value);
        let last = help.options().last().unwrap().flags.clone();
        assert_eq!(last, ["-h", "--help", "-v", "--version"]);
        let output = help
            .options()
            .into_iter()
            .find(|e| e.flags.contains(&"-o".to_string()))
            .unwrap();
        assert_eq!(output.flags, ["-o", "--output"]);
        assert!(output.takes_value);
    }
}
