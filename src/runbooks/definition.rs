//! Runbook files: the YAML schema, validation (ids, kinds, `needs`, cycles), parameter
//! substitution and the plan (which steps run together). No I/O beyond reading a file, no
//! server: `svc-runbook test FILE` runs this in the CLI process.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{clock, Error, Result};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Runbook {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub parameters: Vec<Parameter>,
    /// Start on a stored event (a trigger).
    #[serde(default, rename = "on", skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    pub steps: Vec<Step>,
    /// Run in order when a step with `on_failure: rollback` fails.
    #[serde(default)]
    pub rollback: Vec<Step>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Parameter {
    pub name: String,
    #[serde(default)]
    pub default: Option<String>,
    #[serde(default)]
    pub description: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Trigger {
    pub event: String,
    /// `source`, `severity`, or `payload.KEY`: the event's value must equal this text.
    #[serde(default)]
    pub filter: BTreeMap<String, String>,
    /// Triggered executions of this runbook running at once; more are not started.
    #[serde(default = "one")]
    pub concurrency: u32,
}

fn one() -> u32 {
    1
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    #[default]
    Exec,
    State,
    WaitEvent,
    Emit,
    Approve,
    Sleep,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    #[default]
    Stop,
    Continue,
    Rollback,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub id: String,
    pub kind: Kind,
    #[serde(default)]
    pub needs: Vec<String>,
    /// exec, state: a --target selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// exec: the command, a list of arguments or one line split at spaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Value>,
    /// state: a state file, relative to runbook_dir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// wait_event, emit: the event type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// wait_event: as a trigger's filter.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub filter: BTreeMap<String, String>,
    /// emit: the payload object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// emit: the severity (default: the type's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<String>,
    /// sleep: how long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// approve: what the approver is asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default)]
    pub retries: u32,
    #[serde(default)]
    pub on_failure: OnFailure,
}

impl Step {
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout.as_deref().and_then(clock::parse_duration)
    }

    /// The exec command as arguments.
    pub fn argv(&self) -> Vec<String> {
        match &self.command {
            Some(Value::String(line)) => line.split_whitespace().map(str::to_string).collect(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Reads and validates a runbook file.
pub fn load_file(path: &Path) -> Result<Runbook> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Invalid(format!("cannot read {}: {e}", path.display())))?;
    parse(&text).map_err(|e| match e {
        Error::Invalid(why) => Error::Invalid(format!("{}: {why}", path.display())),
        other => other,
    })
}

/// Parses and validates runbook YAML.
pub fn parse(text: &str) -> Result<Runbook> {
    let deserializer = serde_yaml_ng::Deserializer::from_str(text);
    let runbook: Runbook = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let at = inner
            .location()
            .map(|l| format!("line {}: ", l.line()))
            .unwrap_or_default();
        Error::Invalid(format!("{at}{path}: {inner}"))
    })?;
    validate(&runbook)?;
    Ok(runbook)
}

fn is_id(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 64
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

/// Every rule a runbook must meet; the first broken one is the error.
pub fn validate(runbook: &Runbook) -> Result<()> {
    let invalid = |why: String| Err(Error::Invalid(why));
    if !is_id(&runbook.name) {
        return invalid(format!(
            "name '{}' must be 1-64 letters, digits, '-', '_' or '.'",
            runbook.name
        ));
    }
    if runbook.steps.is_empty() {
        return invalid("a runbook needs at least one step".into());
    }
    let mut seen = HashSet::new();
    for step in runbook.steps.iter().chain(&runbook.rollback) {
        if !is_id(&step.id) {
            return invalid(format!(
                "step id '{}' must be 1-64 letters, digits, '-', '_' or '.'",
                step.id
            ));
        }
        if !seen.insert(step.id.as_str()) {
            return invalid(format!("step id '{}' is used twice", step.id));
        }
        validate_step(step)?;
    }
    let ids: HashSet<&str> = runbook.steps.iter().map(|s| s.id.as_str()).collect();
    for step in &runbook.steps {
        for need in &step.needs {
            if !ids.contains(need.as_str()) {
                return invalid(format!(
                    "step '{}' needs '{need}', which is not a step",
                    step.id
                ));
            }
        }
    }
    for step in &runbook.rollback {
        if !step.needs.is_empty() {
            return invalid(format!(
                "rollback step '{}' has needs; rollback steps run in order",
                step.id
            ));
        }
    }
    if let Some(cycle) = find_cycle(&runbook.steps) {
        return invalid(format!("the steps form a cycle: {}", cycle.join(" -> ")));
    }
    if let Some(trigger) = &runbook.trigger {
        check_event_type(&trigger.event)?;
        check_filter(&trigger.filter)?;
        if trigger.concurrency == 0 {
            return invalid("on.concurrency must be at least 1".into());
        }
    }
    let names: HashSet<&str> = runbook.parameters.iter().map(|p| p.name.as_str()).collect();
    if names.len() != runbook.parameters.len() {
        return invalid("a parameter is declared twice".into());
    }
    Ok(())
}

fn check_event_type(name: &str) -> Result<()> {
    if crate::events::types::find(name).is_none() {
        return Err(Error::Invalid(format!(
            "unknown event type '{name}' (svc-events types lists them)"
        )));
    }
    Ok(())
}

fn check_filter(filter: &BTreeMap<String, String>) -> Result<()> {
    for key in filter.keys() {
        if !(key == "source" || key == "severity" || key.starts_with("payload.")) {
            return Err(Error::Invalid(format!(
                "filter key '{key}' is not source, severity or payload.KEY"
            )));
        }
    }
    Ok(())
}

fn validate_step(step: &Step) -> Result<()> {
    let missing = |field: &str| {
        Err(Error::Invalid(format!(
            "step '{}' ({:?}) needs '{field}'",
            step.id, step.kind
        )))
    };
    for (name, value) in [("timeout", &step.timeout), ("duration", &step.duration)] {
        if let Some(text) = value {
            if !text.contains("{{") && clock::parse_duration(text).is_none() {
                return Err(Error::Invalid(format!(
                    "step '{}': {name} '{text}' is not a duration like 30s or 5m",
                    step.id
                )));
            }
        }
    }
    match step.kind {
        Kind::Exec => {
            if step.target.is_none() {
                return missing("target");
            }
            if step.argv().is_empty() {
                return missing("command");
            }
        }
        Kind::State => {
            if step.target.is_none() {
                return missing("target");
            }
            if step.state.is_none() {
                return missing("state");
            }
        }
        Kind::WaitEvent | Kind::Emit => {
            let Some(event) = &step.event else {
                return missing("event");
            };
            check_event_type(event)?;
            check_filter(&step.filter)?;
            if let Some(payload) = &step.payload {
                if !payload.is_object() {
                    return Err(Error::Invalid(format!(
                        "step '{}': payload must be a mapping",
                        step.id
                    )));
                }
            }
        }
        Kind::Sleep => {
            if step.duration.is_none() {
                return missing("duration");
            }
        }
        Kind::Approve => {}
    }
    Ok(())
}

/// A cycle among the steps' `needs`, named from a step back to itself, if there is one.
pub fn find_cycle(steps: &[Step]) -> Option<Vec<String>> {
    let needs: HashMap<&str, &Vec<String>> =
        steps.iter().map(|s| (s.id.as_str(), &s.needs)).collect();
    // 0 unvisited, 1 on the path, 2 done.
    let mut state: HashMap<&str, u8> = HashMap::new();
    fn visit<'a>(
        id: &'a str,
        needs: &HashMap<&'a str, &'a Vec<String>>,
        state: &mut HashMap<&'a str, u8>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        state.insert(id, 1);
        path.push(id);
        for need in needs.get(id).map(|v| v.as_slice()).unwrap_or_default() {
            let need = need.as_str();
            match state.get(need).copied().unwrap_or(0) {
                1 => {
                    let start = path.iter().position(|p| *p == need).unwrap_or(0);
                    let mut cycle: Vec<String> =
                        path[start..].iter().map(|s| s.to_string()).collect();
                    cycle.push(need.to_string());
                    return Some(cycle);
                }
                0 if needs.contains_key(need) => {
                    if let Some(cycle) = visit(need, needs, state, path) {
                        return Some(cycle);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(id, 2);
        None
    }
    for step in steps {
        if state.get(step.id.as_str()).copied().unwrap_or(0) == 0 {
            let mut path = Vec::new();
            if let Some(cycle) = visit(&step.id, &needs, &mut state, &mut path) {
                return Some(cycle);
            }
        }
    }
    None
}

/// The steps in waves: each wave's steps need only steps of earlier waves, so a wave runs
/// in parallel. Assumes no cycle (validated).
pub fn waves(steps: &[Step]) -> Vec<Vec<String>> {
    let mut done: HashSet<&str> = HashSet::new();
    let mut waves = Vec::new();
    while done.len() < steps.len() {
        let wave: Vec<&str> = steps
            .iter()
            .filter(|s| !done.contains(s.id.as_str()))
            .filter(|s| s.needs.iter().all(|n| done.contains(n.as_str())))
            .map(|s| s.id.as_str())
            .collect();
        if wave.is_empty() {
            break;
        }
        done.extend(wave.iter().copied());
        waves.push(wave.into_iter().map(str::to_string).collect());
    }
    waves
}

/// The parameters with defaults applied and `set` over them; unknown or missing ones are
/// errors.
pub fn parameters(
    runbook: &Runbook,
    set: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>> {
    let mut values = BTreeMap::new();
    for name in set.keys() {
        if !runbook.parameters.iter().any(|p| p.name == *name) {
            return Err(Error::Invalid(format!(
                "runbook '{}' has no parameter '{name}'",
                runbook.name
            )));
        }
    }
    for parameter in &runbook.parameters {
        match set.get(&parameter.name).or(parameter.default.as_ref()) {
            Some(value) => {
                values.insert(parameter.name.clone(), value.clone());
            }
            None => {
                return Err(Error::Invalid(format!(
                    "parameter '{}' has no default: give --set {}=VALUE",
                    parameter.name, parameter.name
                )))
            }
        }
    }
    Ok(values)
}

/// `{{ name }}` replaced by the parameter's value in every string of the step.
pub fn substitute(step: &Step, values: &BTreeMap<String, String>) -> Step {
    let text = |s: &str| {
        let mut out = s.to_string();
        for (name, value) in values {
            out = out
                .replace(&format!("{{{{{name}}}}}"), value)
                .replace(&format!("{{{{ {name} }}}}"), value);
        }
        out
    };
    fn json(value: &Value, text: &dyn Fn(&str) -> String) -> Value {
        match value {
            Value::String(s) => Value::String(text(s)),
            Value::Array(items) => Value::Array(items.iter().map(|v| json(v, text)).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), json(v, text)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    let option = |s: &Option<String>| s.as_deref().map(text);
    Step {
        target: option(&step.target),
        command: step.command.as_ref().map(|v| json(v, &text)),
        state: option(&step.state),
        filter: step
            .filter
            .iter()
            .map(|(k, v)| (k.clone(), text(v)))
            .collect(),
        payload: step.payload.as_ref().map(|v| json(v, &text)),
        duration: option(&step.duration),
        message: option(&step.message),
        timeout: option(&step.timeout),
        ..step.clone()
    }
}

/// Whether an event matches a trigger's or wait_event's filter.
pub fn filter_matches(filter: &BTreeMap<String, String>, event: &crate::events::Event) -> bool {
    filter.iter().all(|(key, want)| {
        let got = match key.as_str() {
            "source" => Some(event.source.clone()),
            "severity" => Some(event.severity.to_string()),
            _ => key.strip_prefix("payload.").and_then(|k| {
                event.payload.get(k).map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
            }),
        };
        got.as_deref() == Some(want.as_str())
    })
}

/// What `test` and `execute --dry-run` print: the waves, with what each step would do.
pub fn plan_text(runbook: &Runbook, values: &BTreeMap<String, String>) -> Vec<String> {
    let by_id: HashMap<&str, &Step> = runbook.steps.iter().map(|s| (s.id.as_str(), s)).collect();
    let mut lines = Vec::new();
    for (index, wave) in waves(&runbook.steps).iter().enumerate() {
        for id in wave {
            let step = substitute(by_id[id.as_str()], values);
            lines.push(format!("{}  {}  {}", index + 1, step.id, describe(&step)));
        }
    }
    for step in &runbook.rollback {
        let step = substitute(step, values);
        lines.push(format!("rollback  {}  {}", step.id, describe(&step)));
    }
    lines
}

/// One line about what a step does.
pub fn describe(step: &Step) -> String {
    let target = step.target.as_deref().unwrap_or("");
    let what = match step.kind {
        Kind::Exec => format!("exec on '{target}': {}", step.argv().join(" ")),
        Kind::State => format!(
            "state {} on '{target}'",
            step.state.as_deref().unwrap_or("")
        ),
        Kind::WaitEvent => format!(
            "wait for {} {:?}",
            step.event.as_deref().unwrap_or(""),
            step.filter
        ),
        Kind::Emit => format!("emit {}", step.event.as_deref().unwrap_or("")),
        Kind::Approve => "wait for approval by another principal".to_string(),
        Kind::Sleep => format!("sleep {}", step.duration.as_deref().unwrap_or("")),
    };
    let mut extras = Vec::new();
    if let Some(timeout) = &step.timeout {
        extras.push(format!("timeout {timeout}"));
    }
    if step.retries > 0 {
        extras.push(format!("retries {}", step.retries));
    }
    if step.on_failure != OnFailure::Stop {
        extras.push(format!("on_failure {:?}", step.on_failure).to_lowercase());
    }
    if extras.is_empty() {
        what
    } else {
        format!("{what} ({})", extras.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIAMOND: &str = "
name: diamond
parameters: [{name: who, default: web-*}]
steps:
  - {id: a, kind: emit, event: command_completed}
  - {id: b, kind: sleep, duration: 1s, needs: [a]}
  - {id: c, kind: exec, target: '{{who}}', command: uptime, needs: [a]}
  - {id: d, kind: approve, needs: [b, c]}
";

    #[test]
    fn waves_of_a_diamond() {
        let runbook = parse(DIAMOND).unwrap();
        assert_eq!(
            waves(&runbook.steps),
            vec![vec!["a"], vec!["b", "c"], vec!["d"]]
        );
        let values = parameters(&runbook, &BTreeMap::new()).unwrap();
        let plan = plan_text(&runbook, &values);
        assert_eq!(plan[2], "2  c  exec on 'web-*': uptime");
    }

    #[test]
    fn errors() {
        let cases = [
            ("name: x\nsteps: []\n", "at least one step"),
            ("name: x\nsteps:\n  - {id: a, kind: sleep, duration: 1s, needs: [b]}\n", "needs 'b'"),
            (
                "name: x\nsteps:\n  - {id: a, kind: sleep, duration: 1s, needs: [c]}\n  - {id: b, kind: sleep, duration: 1s, needs: [a]}\n  - {id: c, kind: sleep, duration: 1s, needs: [b]}\n",
                "cycle: a -> c -> b -> a",
            ),
            ("name: x\nsteps:\n  - {id: a, kind: exec, target: web}\n", "needs 'command'"),
            ("name: x\nsteps:\n  - {id: a, kind: dance}\n", "unknown variant"),
            ("name: x\nsteps:\n  - {id: a, kind: emit, event: nope}\n", "unknown event type"),
            ("name: x\nsteps:\n  - {id: a, kind: sleep, duration: soon}\n", "not a duration"),
            ("name: x\nsteps:\n  - {id: a, kind: sleep, duration: 1s}\n  - {id: a, kind: sleep, duration: 1s}\n", "used twice"),
        ];
        for (yaml, expected) in cases {
            let error = parse(yaml).unwrap_err().to_string();
            assert!(error.contains(expected), "{yaml}: {error}");
        }
    }
}
