//! Properties of the parsers that read files an operator writes: the server and agent
//! configuration, state files and audit policies. Any text: a clear error or a value, never
//! a panic. proptest, 256 cases each (the broker's parser, the subject index and the stream
//! log's recovery have theirs next to the code, in `mod prop`).

use std::path::Path;

use proptest::prelude::*;
use serde_yaml_ng::Value;

const CASES: u32 = 256;

/// Characters that mean something to YAML, to splice into valid documents.
fn yaml_noise() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(vec![
            ":",
            "- ",
            "\n",
            "  ",
            "\t",
            "{",
            "}",
            "[",
            "]",
            ",",
            "&a ",
            "*a",
            "!!str ",
            "!!binary ",
            "|",
            ">",
            "'",
            "\"",
            "#",
            "? ",
            "---\n",
            "...\n",
            "%YAML 1.2\n",
            "<<: *a\n",
            "~",
            "0x",
            "1e999",
            "-1",
            "18446744073709551616",
            ".nan",
            "\\u0000",
            "\u{feff}",
        ])
        .prop_map(String::from),
        any::<String>(),
    ]
}

/// A valid document with random edits: insertions of YAML syntax or arbitrary text, and cuts.
fn mutated(seed: &'static str) -> impl Strategy<Value = String> {
    proptest::collection::vec((0.0f64..1.0, yaml_noise(), 0usize..8), 0..6).prop_map(move |edits| {
        let mut text: Vec<char> = seed.chars().collect();
        for (at, insert, cut) in edits {
            let position = ((at * text.len() as f64) as usize).min(text.len());
            let end = (position + cut).min(text.len());
            text.splice(position..end, insert.chars());
        }
        text.into_iter().collect()
    })
}

/// Random YAML values, nested a few levels.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        any::<f64>().prop_map(|n| Value::Number(n.into())),
        "[a-z0-9 ./:*>-]{0,12}".prop_map(Value::String),
        Just(Value::String("10s".into())),
        Just(Value::String("0".into())),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Sequence),
            proptest::collection::vec(("[a-z_]{1,10}", inner), 0..4).prop_map(|pairs| {
                Value::Mapping(
                    pairs
                        .into_iter()
                        .map(|(key, value)| (Value::String(key), value))
                        .collect(),
                )
            }),
        ]
    })
}

/// Every dotted key of the server's defaults (the keys an operator can set).
fn server_keys() -> Vec<Vec<String>> {
    fn walk(value: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if let Value::Mapping(map) = value {
            for (key, child) in map {
                if let Some(key) = key.as_str() {
                    prefix.push(key.to_string());
                    out.push(prefix.clone());
                    walk(child, prefix, out);
                    prefix.pop();
                }
            }
        }
    }
    let defaults = serde_yaml_ng::to_value(svc::config::ServerConfig::default()).unwrap();
    let mut out = Vec::new();
    walk(&defaults, &mut Vec::new(), &mut out);
    out
}

/// A configuration that sets some real keys to random values.
fn server_config() -> impl Strategy<Value = String> {
    let keys = server_keys();
    proptest::collection::vec((proptest::sample::select(keys), value()), 0..8).prop_map(|sets| {
        let mut root = Value::Mapping(Default::default());
        for (path, value) in sets {
            let mut node = &mut root;
            for (depth, key) in path.iter().enumerate() {
                if !node.is_mapping() {
                    *node = Value::Mapping(Default::default());
                }
                let map = node.as_mapping_mut().unwrap();
                let key = Value::String(key.clone());
                if depth + 1 == path.len() {
                    map.insert(key, value.clone());
                    break;
                }
                node = map
                    .entry(key)
                    .or_insert_with(|| Value::Mapping(Default::default()));
            }
        }
        serde_yaml_ng::to_string(&root).unwrap()
    })
}

const SERVER_SEED: &str = "\
data_dir: /tmp/x
listen:
  http: 127.0.0.1:8080
  grpc: 127.0.0.1:9090
limits:
  idle_timeout: 10s
  max_request_body: 1048576
rate_limit:
  requests_per_second: 50
streams:
  events:
    max_age: 7d
";

const AGENT_SEED: &str = "\
agent:
  id: web-1
  server: 127.0.0.1:9090
  labels:
    role: web
";

const STATE_SEED: &str = "\
- file:
    path: /etc/motd
    content: \"hello\\n\"
    mode: 644
- directory: {path: /srv/app, mode: \"0750\"}
- symlink: {path: /srv/current, target: app}
- package: {name: nginx, state: absent}
- service: {name: nginx, state: running, enabled: true}
- command:
    run: make install
    creates: /usr/local/bin/app
    timeout: 5m
";

const POLICY_SEED: &str = "\
id: no-prod-reads
severity: high
rules:
  - effect: deny
    actions: [\"secret.read\"]
    principals: [\"role:readonly\", \"user:ci-*\"]
    resources: [\"secret:prod/*\"]
";

fn load_server(text: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("server.yaml");
    std::fs::write(&path, text).unwrap();
    svc::config::load_server(Some(&path), &[])
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn load_agent(text: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.yaml");
    std::fs::write(&path, text).unwrap();
    svc::config::load_agent(Some(&path), &[])
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// An error an operator can act on: not empty, one or more lines of text.
fn assert_clear(result: Result<(), String>) -> Result<(), TestCaseError> {
    if let Err(message) = result {
        prop_assert!(!message.trim().is_empty(), "an empty error message");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn server_config_any_text(text in prop_oneof![mutated(SERVER_SEED), any::<String>()]) {
        assert_clear(load_server(&text))?;
    }

    #[test]
    fn server_config_real_keys_random_values(text in server_config()) {
        assert_clear(load_server(&text))?;
    }

    #[test]
    fn server_config_environment(
        pairs in proptest::collection::vec(
            (proptest::sample::select(server_keys()), "[ -~]{0,16}"),
            0..4,
        ),
    ) {
        // The SVC_* overlay: the same keys, as environment variables.
        let env: Vec<(String, String)> = pairs
            .into_iter()
            .map(|(path, value)| (format!("SVC_{}", path.join("__").to_uppercase()), value))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.yaml");
        std::fs::write(&path, SERVER_SEED).unwrap();
        let result = svc::config::load_server(Some(&path), &env).map(|_| ()).map_err(|e| e.to_string());
        assert_clear(result)?;
    }

    #[test]
    fn agent_config_any_text(text in prop_oneof![mutated(AGENT_SEED), any::<String>()]) {
        assert_clear(load_agent(&text))?;
    }

    #[test]
    fn state_file_any_text(text in prop_oneof![mutated(STATE_SEED), any::<String>()]) {
        let result = svc::state::compile(&text, Path::new("/nonexistent"))
            .map(|plan| {
                // Whatever compiles must also pass the check the server runs on the wire.
                svc::state::validate(&plan).unwrap();
            })
            .map_err(|e| e.to_string());
        assert_clear(result)?;
    }

    #[test]
    fn policy_any_text(text in prop_oneof![mutated(POLICY_SEED), any::<String>()]) {
        assert_clear(svc::audit::policy::parse(&text).map(|_| ()))?;
    }

    /// Policy globs against the textbook dynamic-programming matcher.
    #[test]
    fn policy_glob_agrees_with_the_reference(
        pattern in "[ab*.]{0,8}",
        text in "[ab.]{0,10}",
    ) {
        prop_assert_eq!(
            svc::audit::policy::glob_match(&pattern, &text),
            reference_glob(&pattern, &text),
            "{} vs {}", pattern, text
        );
    }
}

fn reference_glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // matches[i][j]: p[..i] matches t[..j].
    let mut matches = vec![vec![false; t.len() + 1]; p.len() + 1];
    matches[0][0] = true;
    for i in 1..=p.len() {
        for j in 0..=t.len() {
            matches[i][j] = if p[i - 1] == '*' {
                matches[i - 1][j] || (j > 0 && matches[i][j - 1])
            } else {
                j > 0 && p[i - 1] == t[j - 1] && matches[i - 1][j - 1]
            };
        }
    }
    matches[p.len()][t.len()]
}

/// Alias expansion ("billion laughs") must be refused or bounded, not exhaust memory.
#[test]
fn yaml_alias_bombs_are_bounded() {
    let mut bomb = String::from("a: &a [\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]\n");
    for level in b'b'..=b'j' {
        let previous = (level - 1) as char;
        let name = level as char;
        bomb.push_str(&format!(
            "{name}: &{name} [*{previous},*{previous},*{previous},*{previous},*{previous},*{previous},*{previous},*{previous},*{previous}]\n"
        ));
    }
    let started = std::time::Instant::now();
    assert!(load_server(&bomb).is_err());
    assert!(svc::audit::policy::parse(&bomb).is_err());
    assert!(svc::state::compile(&bomb, Path::new("/nonexistent")).is_err());
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}
