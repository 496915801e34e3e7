//! Layers that only point down (docs/ARCHITECTURE.md, "Layers"): every top-level module of
//! `src/` is in one layer of [`LAYERS`], and a module uses only modules of its own layer or a
//! lower one. Inside a layer its modules may use each other, but without a cycle, except in
//! the domain layer: its modules take `&Domain` and call each other, the one deliberate ring.
//!
//! The source is read as text, in the manner of rust-analyzer's architecture tests, with no
//! parser: comments, strings and character literals are blanked first, then every `crate::`
//! path (each member of a `crate::{a, b::c}` group too) and every `super::` chain that climbs
//! out of its top-level module is a use of the module it names. Test code counts like any
//! other. A failure names the file, the line and the offending edge; docs/ARCHITECTURE.md's
//! table of layers must be the one below.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

struct Layer {
    name: &'static str,
    /// Members may use each other freely, cycles included (the domain ring).
    ring: bool,
    modules: &'static [&'static str],
}

/// Lowest first: a module may use its own layer and those above it in this list.
const LAYERS: &[Layer] = &[
    Layer {
        name: "leaf utilities",
        ring: false,
        modules: &[
            "clock", "codec", "error", "facts", "ids", "metrics", "percent", "program", "proto",
            "sort", "template", "version", "zip",
        ],
    },
    Layer {
        name: "store, stream, bus, config",
        ring: false,
        modules: &["bus", "config", "datadir", "store", "stream", "tls"],
    },
    Layer {
        name: "host engines",
        ring: false,
        modules: &["modules", "state"],
    },
    Layer {
        name: "domain",
        ring: true,
        modules: &[
            "audit",
            "auth",
            "backup",
            "blueprint",
            "cluster",
            "domain",
            "events",
            "files",
            "fleet",
            "identity",
            "runbooks",
            "secrets",
            "webhooks",
        ],
    },
    Layer {
        name: "transports and daemons",
        ring: false,
        modules: &["agent", "bootstrap", "preflight", "server"],
    },
    Layer {
        name: "CLIs",
        ring: false,
        modules: &["cli"],
    },
    Layer {
        name: "dispatch",
        ring: false,
        modules: &["dispatch"],
    },
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|layer| layer.modules.contains(&module))
}

/// The crate as text: its top-level modules and root re-exports (from `lib.rs`), and every
/// other source file, by path under `src/`.
struct Crate {
    modules: BTreeSet<String>,
    /// `pub use error::{Error, Result}` in lib.rs: `crate::Error` is a use of `error`.
    reexports: BTreeMap<String, String>,
    files: Vec<(String, String)>,
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        let mut files = Vec::new();
        collect(src, src, &mut files);
        files.retain(|(path, _)| path != "lib.rs" && path != "main.rs");
        Crate::new(&lib, files)
    }

    /// From the text of lib.rs (modules declared there, `pub use m::{A, B}` re-exports).
    fn new(lib: &str, files: Vec<(String, String)>) -> Crate {
        let lib = blank(lib);
        let mut modules = BTreeSet::new();
        let mut reexports = BTreeMap::new();
        for line in lib.lines() {
            let line = line.trim();
            let line = line.strip_prefix("pub ").unwrap_or(line);
            if let Some(rest) = line.strip_prefix("mod ") {
                let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
                modules.insert(name);
            } else if let Some(rest) = line.strip_prefix("use ") {
                let rest = rest.trim_end_matches(';');
                if let Some((module, items)) = rest.split_once("::") {
                    let items = items.trim_start_matches('{').trim_end_matches('}');
                    for item in items.split(',') {
                        let item = item.trim();
                        let name = item.rsplit(" as ").next().unwrap_or(item).trim();
                        if !name.is_empty() {
                            reexports.insert(name.to_string(), module.trim().to_string());
                        }
                    }
                }
            }
        }
        Crate {
            modules,
            reexports,
            files,
        }
    }

    /// Every use of another top-level module, in file order.
    fn uses(&self) -> Vec<Use> {
        let mut uses = Vec::new();
        for (path, text) in &self.files {
            for reference in references(path, text) {
                let target = self
                    .reexports
                    .get(&reference.item)
                    .cloned()
                    .unwrap_or(reference.item.clone());
                let from = top_module(path);
                if target != from {
                    uses.push(Use {
                        file: path.clone(),
                        line: reference.line,
                        source: text
                            .lines()
                            .nth(reference.line - 1)
                            .unwrap_or("")
                            .trim()
                            .to_string(),
                        from,
                        to: target,
                    });
                }
            }
        }
        uses
    }

    /// What breaks the layering, one line each (empty when nothing does).
    fn violations(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for module in &self.modules {
            if layer_of(module).is_none() {
                problems.push(format!(
                    "src/{module}: a top-level module in no layer; add it to LAYERS in \
                     tests/layers.rs and to docs/ARCHITECTURE.md"
                ));
            }
        }
        for layer in LAYERS {
            for module in layer.modules {
                if !self.modules.contains(*module) {
                    problems.push(format!(
                        "layer '{}' lists {module}, which is not a module of src/lib.rs",
                        layer.name
                    ));
                }
            }
        }
        let uses = self.uses();
        let mut edges: BTreeMap<(String, String), &Use> = BTreeMap::new();
        for used in &uses {
            if !self.modules.contains(&used.to) {
                problems.push(format!(
                    "src/{}:{}: crate::{} is neither a module nor a re-export of src/lib.rs \
                     (teach the scanner): {}",
                    used.file, used.line, used.to, used.source
                ));
                continue;
            }
            let (Some(from), Some(to)) = (layer_of(&used.from), layer_of(&used.to)) else {
                continue;
            };
            if to > from {
                problems.push(format!(
                    "src/{}:{}: {} ({}) uses {} ({}, a higher layer): {}",
                    used.file,
                    used.line,
                    used.from,
                    LAYERS[from].name,
                    used.to,
                    LAYERS[to].name,
                    used.source
                ));
            } else if to == from {
                edges
                    .entry((used.from.clone(), used.to.clone()))
                    .or_insert(used);
            }
        }
        // Inside a layer other than the ring: an edge a → b where b leads back to a is on
        // a cycle.
        for ((from, to), used) in &edges {
            let layer = &LAYERS[layer_of(from).unwrap()];
            if !layer.ring && reaches(&edges, to, from) {
                problems.push(format!(
                    "src/{}:{}: {from} uses {to}, and {to} leads back to {from}: a cycle inside \
                     '{}' (only the domain layer may have one): {}",
                    used.file, used.line, layer.name, used.source
                ));
            }
        }
        problems
    }
}

struct Use {
    file: String,
    line: usize,
    source: String,
    from: String,
    to: String,
}

/// Whether `to` is reachable from `from` over the same-layer edges.
fn reaches(edges: &BTreeMap<(String, String), &Use>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(module) = todo.pop() {
        if module == to {
            return true;
        }
        if seen.insert(module.clone()) {
            for (a, b) in edges.keys() {
                if *a == module {
                    todo.push(b.clone());
                }
            }
        }
    }
    false
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(root, &path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            files.push((relative, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// `store` for `store/sqlite/mod.rs` or `store.rs`.
fn top_module(path: &str) -> String {
    let first = path.split('/').next().unwrap();
    first.strip_suffix(".rs").unwrap_or(first).to_string()
}

/// The module path a file defines: `store/sqlite/mod.rs` → [store, sqlite].
fn file_module(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path.split('/').map(str::to_string).collect();
    let last = parts.pop().unwrap();
    if last != "mod.rs" {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The text with comments, strings and character literals replaced by spaces (newlines
/// kept), so that only code is left, at the same lines and columns.
fn blank(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank_to = |out: &mut String, from: usize, to: usize| {
        for &c in &chars[from..to.min(chars.len())] {
            out.push(if c == '\n' { '\n' } else { ' ' });
        }
    };
    let at = |i: usize, s: &str| {
        s.chars()
            .enumerate()
            .all(|(k, c)| chars.get(i + k) == Some(&c))
    };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let end = if at(i, "//") {
            (i..chars.len())
                .find(|&k| chars[k] == '\n')
                .unwrap_or(chars.len())
        } else if at(i, "/*") {
            let (mut depth, mut k) = (0, i);
            while k < chars.len() {
                if at(k, "/*") {
                    depth += 1;
                    k += 2;
                } else if at(k, "*/") {
                    depth -= 1;
                    k += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    k += 1;
                }
            }
            k
        } else if let Some((open, hashes)) = raw_string(&chars, i) {
            // r"...", r#"..."#, br"...": ends at the quote followed by as many #.
            let mut k = open + 1;
            while k < chars.len()
                && !(chars[k] == '"' && (1..=hashes).all(|h| chars.get(k + h) == Some(&'#')))
            {
                k += 1;
            }
            k + 1 + hashes
        } else if c == '"' {
            let mut k = i + 1;
            while k < chars.len() && chars[k] != '"' {
                k += if chars[k] == '\\' { 2 } else { 1 };
            }
            k + 1
        } else if c == '\'' && chars.get(i + 1) == Some(&'\\') {
            // An escaped character: '\n', '\'', '\u{1F600}'.
            (i + 3..chars.len())
                .find(|&k| chars[k] == '\'')
                .unwrap_or(i + 2)
                + 1
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i + 3
        } else {
            // Code, including a lifetime ('a, '_), which has no closing quote.
            out.push(c);
            i += 1;
            continue;
        };
        blank_to(&mut out, i, end);
        i = end;
    }
    out
}

/// A raw string starting at `i` (`r"`, `r#"`, `br"`, not the end of an identifier): the
/// index of its opening quote and its number of `#`.
fn raw_string(chars: &[char], i: usize) -> Option<(usize, usize)> {
    if i > 0 && is_ident(chars[i - 1]) {
        return None;
    }
    let start = match (chars.get(i), chars.get(i + 1)) {
        (Some('r'), _) => i + 1,
        (Some('b'), Some('r')) => i + 2,
        _ => return None,
    };
    let hashes = chars[start..].iter().take_while(|&&h| h == '#').count();
    (chars.get(start + hashes) == Some(&'"')).then_some((start + hashes, hashes))
}

struct Reference {
    line: usize,
    /// The first segment after `crate::` (a top-level module or a root re-export).
    item: String,
}

/// Every `crate::NAME` (and each member of `crate::{...}`) and every `super::` chain that
/// climbs to the crate root, in one file. `mod NAME { ... }` blocks count for `super`.
fn references(path: &str, text: &str) -> Vec<Reference> {
    let code: Vec<char> = blank(text).chars().collect();
    let newlines: Vec<usize> = (0..code.len()).filter(|&k| code[k] == '\n').collect();
    let line_at = |k: usize| 1 + newlines.partition_point(|&n| n < k);
    let skip_space = |mut k: usize| {
        while k < code.len() && code[k].is_whitespace() {
            k += 1;
        }
        k
    };
    let ident_at =
        |k: usize| -> String { code[k..].iter().take_while(|c| is_ident(**c)).collect() };
    let is_path_sep = |k: usize| code.get(k) == Some(&':') && code.get(k + 1) == Some(&':');
    let file_module = file_module(path);
    let mut found = Vec::new();
    let mut add = |heads: Vec<(usize, String)>| {
        for (at, item) in heads {
            found.push(Reference {
                line: line_at(at),
                item,
            });
        }
    };
    // The brace depth inside each inline `mod NAME {` block open here.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut pending_mod = false;
    let mut i = 0;
    while i < code.len() {
        let c = code[i];
        match c {
            '{' => {
                depth += 1;
                if pending_mod {
                    inline.push(depth);
                    pending_mod = false;
                }
            }
            '}' => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        if !is_ident(c) || (i > 0 && is_ident(code[i - 1])) {
            i += 1;
            continue;
        }
        let word = ident_at(i);
        let mut next = i + word.chars().count();
        let in_path = i >= 2 && is_path_sep(i - 2);
        match word.as_str() {
            "mod" => {
                let name_at = skip_space(next);
                let name = ident_at(name_at);
                let after = skip_space(name_at + name.chars().count());
                pending_mod = !name.is_empty() && code.get(after) == Some(&'{');
            }
            "crate" if !in_path && is_path_sep(next) => {
                add(path_heads(&code, skip_space(next + 2)))
            }
            "super" if !in_path && is_path_sep(next) => {
                let mut climbs = 0;
                let mut k = i;
                while ident_at(k) == "super" && is_path_sep(k + 5) {
                    climbs += 1;
                    k = skip_space(k + 7);
                }
                if climbs >= file_module.len() + inline.len() {
                    add(path_heads(&code, k));
                }
                // The chain's own `super` words are not paths of their own.
                next = k;
            }
            _ => {}
        }
        i = next;
    }
    found
}

/// The first segment (with where it starts) of the path at `start`, or of each member of a
/// `{...}` group there.
fn path_heads(code: &[char], start: usize) -> Vec<(usize, String)> {
    let ident = |k: usize| -> String { code[k..].iter().take_while(|c| is_ident(**c)).collect() };
    if code.get(start) != Some(&'{') {
        let name = ident(start);
        return if name.is_empty() {
            vec![]
        } else {
            vec![(start, name)]
        };
    }
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    let mut k = start;
    while k < code.len() {
        match code[k] {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expect_head = true,
            c if depth == 1 && expect_head && is_ident(c) => {
                let name = ident(k);
                let len = name.chars().count();
                if name != "self" {
                    heads.push((k, name));
                }
                expect_head = false;
                k += len;
                continue;
            }
            _ => {}
        }
        k += 1;
    }
    heads
}

/// The table docs/ARCHITECTURE.md must carry, made from [`LAYERS`].
fn layer_table() -> String {
    let mut table =
        String::from("| layer | modules of `src/` | inside the layer |\n| --- | --- | --- |\n");
    for (n, layer) in LAYERS.iter().enumerate() {
        let mut modules: Vec<&str> = layer.modules.to_vec();
        modules.sort();
        let modules: Vec<String> = modules.iter().map(|m| format!("`{m}`")).collect();
        let inside = if layer.ring {
            "may use each other freely: the domain ring"
        } else if layer.modules.len() == 1 {
            "one module"
        } else {
            "may use each other, without a cycle"
        };
        table.push_str(&format!(
            "| {} {} | {} | {inside} |\n",
            n + 1,
            layer.name,
            modules.join(" ")
        ));
    }
    table
}

#[test]
fn layers_only_point_down() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let krate = Crate::read(&root.join("src"));
    assert!(
        krate.files.len() > 100 && krate.modules.contains("domain"),
        "the scanner found too little under src/"
    );
    let problems = krate.violations();
    assert!(
        problems.is_empty(),
        "{} use(s) against the layers of docs/ARCHITECTURE.md:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_docs_carry_this_table() {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md"))
            .unwrap();
    let table = layer_table();
    assert!(
        docs.contains(&table),
        "docs/ARCHITECTURE.md's table of layers differs from tests/layers.rs; paste this:\n{table}"
    );
}

/// The scanner on a made-up crate: what it must see, what it must not, and what a failure
/// says.
#[test]
fn an_upward_use_is_named_with_its_file_and_line() {
    let lib = "pub mod clock;\npub mod config;\npub mod store;\npub mod server;\n\
               pub mod domain;\npub use error::{Error, Result};\npub mod error;\n";
    let file = |path: &str, text: &str| (path.to_string(), text.to_string());
    let krate = Crate::new(
        lib,
        vec![
            file(
                "store/mod.rs",
                "//! Not a use: crate::server in a comment.\n\
                 use crate::{clock, config::Secret};\n\
                 const TEXT: &str = \"crate::server::main\";\n\
                 const RAW: &str = r#\"crate::server\"#;\n\
                 fn f<'a>(x: &'a str) -> char { '\"' }\n\
                 use crate::server::Context;\n",
            ),
            file(
                "store/sqlite/mod.rs",
                "mod tests {\n    use super::super::super::domain::Domain;\n\
                 use super::super::Store;\n}\n",
            ),
            file(
                "config.rs",
                "fn g() -> crate::Result<()> {\n    crate::store::open()\n}\n",
            ),
            file(
                "clock.rs",
                "use crate::{\n    error::Error,\n    config,\n};\n",
            ),
        ],
    );
    let uses: Vec<String> = krate
        .uses()
        .iter()
        .map(|u| format!("{}:{} {}->{}", u.file, u.line, u.from, u.to))
        .collect();
    assert_eq!(
        uses,
        [
            "store/mod.rs:2 store->clock",
            "store/mod.rs:2 store->config",
            "store/mod.rs:6 store->server",
            "store/sqlite/mod.rs:2 store->domain",
            "config.rs:1 config->error",
            "config.rs:2 config->store",
            "clock.rs:2 clock->error",
            "clock.rs:3 clock->config",
        ]
    );
    let problems = krate.violations();
    let wanted = [
        "src/store/mod.rs:6: store (store, stream, bus, config) uses server (transports and \
         daemons, a higher layer): use crate::server::Context;",
        "src/store/sqlite/mod.rs:2: store (store, stream, bus, config) uses domain (domain, a \
         higher layer): use super::super::super::domain::Domain;",
        "src/clock.rs:3: clock (leaf utilities) uses config (store, stream, bus, config, a \
         higher layer): config,",
        "src/config.rs:2: config uses store, and store leads back to config: a cycle inside \
         'store, stream, bus, config' (only the domain layer may have one): \
         crate::store::open()",
    ];
    for want in wanted {
        assert!(
            problems.iter().any(|p| p == want),
            "missing: {want}\nin:\n{}",
            problems.join("\n")
        );
    }
}
