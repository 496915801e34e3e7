//! `svc completion bash|zsh|fish` (also `svcctl completion ...`): prints a completion script
//! for every name, subcommand and flag.
//!
//! The words come from each name's help as data (`helptext.rs`: argh definitions, and each
//! name's top level from the data its `--help` is printed from; nothing is run), read when the
//! script is generated, so a new command or flag is in the completions as soon as it is defined.
//! The scripts hold the tree as data (one `case` arm per command path) and share one small
//! walker per shell: it follows the words typed so far down the tree, skipping flags and the
//! values of flags that take one, and `svc NAME` / `svcctl NAME` continue in `svc-NAME`'s tree.

use std::fmt::Write as _;

use super::exit;
use super::helptext::{self, Help, Node};

const USAGE: &str = "Usage: completion bash|zsh|fish

Prints a shell completion script for svc and every name it answers to.
  bash:  source <(svcctl completion bash)   or install as /usr/share/bash-completion/completions/svc
  zsh:   source <(svcctl completion zsh)    or install as _svc in a directory of $fpath
  fish:  svcctl completion fish | source    or install as ~/.config/fish/completions/svc.fish
";

/// One command path with the words that may follow it.
#[derive(Debug, Default)]
pub struct Spec {
    /// `svcctl apikey`: the path joined by spaces.
    pub key: String,
    /// Subcommands with their one-line summaries.
    pub commands: Vec<(String, String)>,
    /// Flags: name, whether it takes a value, summary.
    pub flags: Vec<(String, bool, String)>,
}

/// The completion data: every command path, and the paths that continue in another tree.
#[derive(Debug, Default)]
pub struct Table {
    pub specs: Vec<Spec>,
    /// `svc events` → `svc-events`, `svc ctl` → `svcctl`, `svcctl secrets` → `svc-secrets`.
    pub aliases: Vec<(String, String)>,
    /// Every name the script registers for.
    pub names: Vec<String>,
}

/// Runs `completion SHELL` for `program` (`svc` or `svcctl`).
pub fn main(program: &str, args: &[String]) -> i32 {
    let shell = match args {
        [shell] if !shell.starts_with('-') => shell.as_str(),
        [flag] if flag == "-h" || flag == "--help" => {
            print!("{USAGE}");
            return exit::OK;
        }
        _ => {
            eprintln!("{program}: completion needs one shell: bash, zsh or fish");
            eprint!("{USAGE}");
            return exit::USAGE;
        }
    };
    let render: fn(&Table) -> String = match shell {
        "bash" => bash,
        "zsh" => zsh,
        "fish" => fish,
        other => {
            eprintln!("{program}: no completion for '{other}' (bash, zsh or fish)");
            return exit::USAGE;
        }
    };
    match table() {
        Ok(table) => {
            print!("{}", render(&table));
            exit::OK
        }
        Err(error) => {
            eprintln!("{program}: {error}");
            exit::FAILED
        }
    }
}

/// Reads every name's help as data and builds the table.
pub fn table() -> Result<Table, String> {
    let forest = helptext::forest()?;
    let svc = helptext::tree("svc")?.help.unwrap_or_default();
    Ok(build(&svc, &forest))
}

/// Flags of a help's option sections.
fn flags_of(help: &Help) -> Vec<(String, bool, String)> {
    help.options()
        .iter()
        .flat_map(|entry| {
            entry
                .flags
                .iter()
                .map(|flag| (flag.clone(), entry.takes_value, entry.about.clone()))
        })
        .collect()
}

/// Flags a CLI's own top help calls common: they are taken at any position, so they follow
/// every subcommand too.
fn common_flags(help: &Help) -> Vec<(String, bool, String)> {
    let only_common = Help {
        sections: help
            .sections
            .iter()
            .filter(|section| section.title.to_ascii_lowercase().contains("common"))
            .cloned()
            .collect(),
        ..Help::default()
    };
    flags_of(&only_common)
}

fn add_specs(node: &Node, inherited: &[(String, bool, String)], specs: &mut Vec<Spec>) {
    let mut flags: Vec<(String, bool, String)> =
        node.help.as_ref().map(flags_of).unwrap_or_default();
    for flag in inherited {
        if !flags.iter().any(|(name, ..)| *name == flag.0) {
            flags.push(flag.clone());
        }
    }
    let mut passed_on = inherited.to_vec();
    if let Some(help) = &node.help {
        for flag in common_flags(help) {
            if !passed_on.iter().any(|(name, ..)| *name == flag.0) {
                passed_on.push(flag);
            }
        }
    }
    specs.push(Spec {
        key: node.name(),
        commands: node
            .children
            .iter()
            .map(|child| {
                (
                    child.path.last().cloned().unwrap_or_default(),
                    child.about.clone(),
                )
            })
            .collect(),
        flags,
    });
    for child in &node.children {
        add_specs(child, &passed_on, specs);
    }
}

/// Builds the table from `svc`'s own help and every name's tree.
pub fn build(svc: &Help, forest: &[Node]) -> Table {
    let mut table = Table {
        names: std::iter::once("svc".to_string())
            .chain(forest.iter().map(Node::name))
            .collect(),
        ..Table::default()
    };
    // `svc`: every name without its `svc-` prefix (`svc ctl` for svcctl), and the words of
    // its own help (`svc completion`, `svc man`; `svc NAME` is the placeholder just expanded).
    let mut top = Spec {
        key: "svc".to_string(),
        flags: flags_of(svc),
        ..Spec::default()
    };
    for node in forest {
        let name = node.name();
        let word = if name == "svcctl" {
            "ctl".to_string()
        } else {
            name.trim_start_matches("svc-").to_string()
        };
        table.aliases.push((format!("svc {word}"), name.clone()));
        top.commands.push((word, node.about.clone()));
    }
    for section in &svc.sections {
        for entry in &section.entries {
            let mut words = entry.term.split_whitespace();
            if let (Some("svc"), Some(word)) = (words.next(), words.next()) {
                let is_new = !top.commands.iter().any(|(known, _)| known == word);
                if is_new && !word.starts_with('-') && word == word.to_ascii_lowercase() {
                    top.commands.push((word.to_string(), entry.about.clone()));
                }
            }
        }
    }
    table.specs.push(top);
    for node in forest {
        add_specs(node, &[], &mut table.specs);
    }
    // `svcctl NAME` runs svc-NAME for every mode that is not one of svcctl's own commands
    // (`svcctl agent` is the fleet command, and the server is no CLI).
    if let Some(ctl) = table.specs.iter().position(|spec| spec.key == "svcctl") {
        for node in forest {
            let name = node.name();
            let Some(word) = name.strip_prefix("svc-") else {
                continue;
            };
            let own = table.specs[ctl]
                .commands
                .iter()
                .any(|(known, _)| known == word);
            if own || word == "server" {
                continue;
            }
            table.specs[ctl]
                .commands
                .push((word.to_string(), node.about.clone()));
            table.aliases.push((format!("svcctl {word}"), name));
        }
    }
    table
}

/// Whether a word may go into a script unquoted: names and flags only, never shell syntax.
fn is_plain(word: &str) -> bool {
    !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

fn words<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items.filter(|w| is_plain(w)).collect::<Vec<_>>().join(" ")
}

fn spec_words(spec: &Spec) -> (String, String, String) {
    let commands = words(spec.commands.iter().map(|(word, _)| word.as_str()));
    let flags = words(spec.flags.iter().map(|(flag, ..)| flag.as_str()));
    let value_flags = words(
        spec.flags
            .iter()
            .filter(|(_, value, _)| *value)
            .map(|(flag, ..)| flag.as_str()),
    );
    (commands, flags, value_flags)
}

fn header(shell: &str) -> String {
    format!(
        "# {shell} completion for svc and every name it answers to.\n\
         # Generated by `svc completion {shell}` ({}) from the help each name prints: do not edit.\n",
        super::version_line("svc")
    )
}

/// The bash script: `_svc_node KEY` sets the words after KEY, `_svc_complete` walks.
pub fn bash(table: &Table) -> String {
    let mut out = header("bash");
    out.push_str("_svc_node() {\n    case \"$1\" in\n");
    for spec in &table.specs {
        let (commands, flags, value_flags) = spec_words(spec);
        let _ = writeln!(
            out,
            "        '{}') _svc_cmds='{commands}'; _svc_flags='{flags}'; _svc_vflags='{value_flags}' ;;",
            spec.key
        );
    }
    out.push_str("        *) return 1 ;;\n    esac\n}\n\n_svc_alias() {\n    case \"$1\" in\n");
    for (from, to) in &table.aliases {
        let _ = writeln!(out, "        '{from}') _svc_key='{to}' ;;");
    }
    out.push_str(
        r#"    esac
}

_svc_complete() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev _svc_key _svc_cmds= _svc_flags= _svc_vflags= word i
    _svc_key=${COMP_WORDS[0]##*/}
    _svc_node "$_svc_key" || return 0
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        [[ $word == -* ]] && continue
        # The value of a flag that takes one is not a command.
        [[ " $_svc_vflags " == *" ${COMP_WORDS[i-1]} "* ]] && continue
        if [[ " $_svc_cmds " == *" $word "* ]]; then
            _svc_key="$_svc_key $word"
            _svc_alias "$_svc_key"
            _svc_node "$_svc_key" || { _svc_cmds=; _svc_flags=; _svc_vflags=; }
        fi
    done
    prev=${COMP_WORDS[COMP_CWORD-1]}
    if ((COMP_CWORD > 1)) && [[ " $_svc_vflags " == *" $prev "* ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
    elif [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$_svc_flags" -- "$cur"))
    elif [[ -n $_svc_cmds ]]; then
        COMPREPLY=($(compgen -W "$_svc_cmds" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}

"#,
    );
    let _ = writeln!(
        out,
        "complete -F _svc_complete {}",
        words(table.names.iter().map(String::as_str))
    );
    out
}

/// The zsh script: the same walk with zsh arrays; descriptions through `_describe`.
pub fn zsh(table: &Table) -> String {
    let names = words(table.names.iter().map(String::as_str));
    let mut out = format!("#compdef {names}\n");
    out.push_str(&header("zsh"));
    out.push_str("_svc_node() {\n    case \"$1\" in\n");
    for spec in &table.specs {
        let (_, _, value_flags) = spec_words(spec);
        let described = |items: Vec<(&str, &str)>| {
            items
                .into_iter()
                .filter(|(word, _)| is_plain(word))
                .map(|(word, about)| single_quote(&format!("{word}:{about}")))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let commands = described(
            spec.commands
                .iter()
                .map(|(word, about)| (word.as_str(), about.as_str()))
                .collect(),
        );
        let flags = described(
            spec.flags
                .iter()
                .map(|(flag, _, about)| (flag.as_str(), about.as_str()))
                .collect(),
        );
        let _ = writeln!(
            out,
            "        {}) cmds=({commands}); flags=({flags}); vflags=({value_flags}) ;;",
            single_quote(&spec.key)
        );
    }
    out.push_str("        (*) return 1 ;;\n    esac\n}\n\n_svc_alias() {\n    case \"$1\" in\n");
    for (from, to) in &table.aliases {
        let _ = writeln!(out, "        '{from}') key='{to}' ;;");
    }
    out.push_str(
        r#"    esac
}

_svc() {
    local key=${words[1]:t} word i
    local -a cmds flags vflags
    _svc_node "$key" || return 1
    for (( i = 2; i < CURRENT; i++ )); do
        word=${words[i]}
        [[ $word == -* ]] && continue
        (( ${vflags[(Ie)${words[i-1]}]} )) && continue
        if (( ${cmds[(I)${word}:*]} )); then
            key="$key $word"
            _svc_alias "$key"
            _svc_node "$key" || { cmds=(); flags=(); vflags=(); }
        fi
    done
    if (( CURRENT > 2 )) && (( ${vflags[(Ie)${words[CURRENT-1]}]} )); then
        _files
    elif [[ ${words[CURRENT]} == -* ]]; then
        _describe -t flags 'flag' flags
    elif (( $#cmds )); then
        _describe -t commands 'command' cmds
    else
        _files
    fi
}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _svc "$@"
else
"#,
    );
    let _ = writeln!(out, "    compdef _svc {names}\nfi");
    out
}

/// The fish script: `__svc_key` walks the command line; each path's words are offered when
/// the walk ends there.
pub fn fish(table: &Table) -> String {
    let mut out = header("fish");
    out.push_str("function __svc_child --argument-names key word\n    switch \"$key $word\"\n");
    for (from, to) in &table.aliases {
        let _ = writeln!(out, "        case '{from}'\n            echo '{to}'");
    }
    for spec in &table.specs {
        for (word, _) in &spec.commands {
            let path = format!("{} {word}", spec.key);
            if is_plain(word) && !table.aliases.iter().any(|(from, _)| *from == path) {
                let _ = writeln!(out, "        case '{path}'\n            echo '{path}'");
            }
        }
    }
    out.push_str("    end\nend\n\nfunction __svc_value_flag --argument-names key flag\n    switch \"$key $flag\"\n");
    for spec in &table.specs {
        for (flag, value, _) in &spec.flags {
            if *value && is_plain(flag) {
                let _ = writeln!(
                    out,
                    "        case '{} {flag}'\n            return 0",
                    spec.key
                );
            }
        }
    }
    out.push_str(
        r#"    end
    return 1
end

function __svc_key
    set -l words (commandline -opc)
    set -l key (string replace -r '.*/' '' -- $words[1])
    set -l previous ''
    for word in $words[2..-1]
        if not string match -q -- '-*' $word; and not __svc_value_flag $key $previous
            set -l next (__svc_child $key $word)
            if test -n "$next"
                set key $next
            end
        end
        set previous $word
    end
    echo $key
end

function __svc_at --argument-names key
    test (__svc_key) = "$key"
end

"#,
    );
    for spec in &table.specs {
        let root = spec.key.split(' ').next().unwrap_or("svc");
        let mut commands: Vec<&str> = vec![root];
        for via in ["svc", "svcctl"] {
            if !commands.contains(&via) {
                commands.push(via);
            }
        }
        let condition = format!("\"__svc_at '{}'\"", spec.key);
        let _ = writeln!(out, "for __svc_c in {}", commands.join(" "));
        for (word, about) in &spec.commands {
            if is_plain(word) {
                let _ = writeln!(
                    out,
                    "    complete -c $__svc_c -f -n {condition} -a {word} -d {}",
                    single_quote(about)
                );
            }
        }
        for (flag, value, about) in &spec.flags {
            if !is_plain(flag) {
                continue;
            }
            let option = match flag.strip_prefix("--") {
                Some(long) => format!("-l {long}"),
                None => format!("-s {}", flag.trim_start_matches('-')),
            };
            let takes = if *value { " -r -F" } else { "" };
            let _ = writeln!(
                out,
                "    complete -c $__svc_c -n {condition} {option}{takes} -d {}",
                single_quote(about)
            );
        }
        out.push_str("end\n");
    }
    out
}

/// `text` as one single-quoted word that bash, zsh and fish all read the same way.
fn single_quote(text: &str) -> String {
    // fish reads \' inside single quotes as a quote; bash and zsh end the string at any quote.
    // A description never needs one, so it becomes a typographic apostrophe in both.
    format!("'{}'", text.replace('\'', "’").replace('\\', ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(path: &[&str], about: &str, help: Option<&str>, children: Vec<Node>) -> Node {
        Node {
            path: path.iter().map(|s| s.to_string()).collect(),
            about: about.to_string(),
            help: help.map(helptext::parse),
            children,
        }
    }

    fn sample() -> Table {
        let ctl = node(
            &["svcctl"],
            "Operator CLI.",
            Some("Usage: svcctl <command>\n\nOperator CLI.\n\nCommands:\n  agent  agents\n\nCommon options:\n  --server HOST:PORT   address\n  -h, --help           show help\n"),
            vec![node(
                &["svcctl", "agent"],
                "agents",
                Some("Usage: svcctl agent <command>\n\nAgents.\n\nOptions:\n  --label           a label\n"),
                vec![],
            )],
        );
        let secrets = node(
            &["svc-secrets"],
            "Secrets.",
            Some("Usage: svc-secrets <command>\n\nSecrets.\n\nCommands:\n  transit  keys\n"),
            vec![node(&["svc-secrets", "transit"], "keys", None, vec![])],
        );
        let svc = helptext::parse("Usage: svc NAME\n\nsvc.\n\n  svc NAME ...         any CLI\n  svc completion SHELL  scripts\n\nOptions:\n  --list  names\n");
        build(&svc, &[ctl, secrets])
    }

    #[test]
    fn table_follows_svc_and_svcctl_into_each_tree_and_passes_common_flags_down() {
        let table = sample();
        let spec = |key: &str| table.specs.iter().find(|s| s.key == key).unwrap();
        let commands = |key: &str| -> Vec<String> {
            spec(key).commands.iter().map(|(w, _)| w.clone()).collect()
        };
        assert_eq!(commands("svc"), ["ctl", "secrets", "completion"]);
        assert_eq!(commands("svcctl"), ["agent", "secrets"]);
        assert_eq!(commands("svc-secrets"), ["transit"]);
        let flags: Vec<&str> = spec("svcctl agent")
            .flags
            .iter()
            .map(|(f, ..)| f.as_str())
            .collect();
        assert_eq!(flags, ["--label", "--server", "-h", "--help"]);
        assert!(table.aliases.contains(&("svc ctl".into(), "svcctl".into())));
        assert!(table
            .aliases
            .contains(&("svcctl secrets".into(), "svc-secrets".into())));
        assert_eq!(table.names, ["svc", "svcctl", "svc-secrets"]);
    }

    #[test]
    fn quoting_keeps_shell_syntax_out() {
        assert_eq!(single_quote("it's $(x)"), "'it’s $(x)'");
        assert!(!is_plain("a;b"));
        assert!(is_plain("--min-severity"));
    }
}
