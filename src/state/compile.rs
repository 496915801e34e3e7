//! State files: YAML text → [`Plan`]. The only code in `state` that reads YAML, and it reads
//! it through one function, [`parse_yaml`] (serde_yaml_ng stays behind it, as in `config`).
//!
//! Errors name the line of the offending list item without a second YAML parser: the items are
//! deserialized by [`ItemSeed`], and every error about an item (unknown kind or key, bad value,
//! missing source) is raised inside the visitor of the item's mapping, where serde_yaml_ng
//! attaches the position of that mapping. That is also why sources are inlined during
//! deserialization rather than after it. A first pass checks only the syntax, so a syntax error
//! points at its own line instead of its item's.

use std::fmt;
use std::fs;
use std::path::Path;

use base64::Engine as _;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor,
};

use super::validate::{self, MAX_CONTENT_BYTES};
use super::{CompileError, FileResource, Plan, Resource};

/// The resource kinds, as written in a state file.
const KINDS: &[&str] = &[
    "file",
    "directory",
    "symlink",
    "package",
    "service",
    "command",
    "user",
    "group",
    "cron",
    "sysctl",
    "line",
];

pub(super) fn compile(yaml: &str, base_dir: &Path) -> Result<Plan, CompileError> {
    let document: Option<IgnoredAny> = parse_yaml(yaml, std::marker::PhantomData)?;
    if document.is_none() {
        return Ok(Plan::default());
    }
    let mut content_bytes = 0;
    let resources = parse_yaml(
        yaml,
        ItemsSeed {
            base_dir,
            content_bytes: &mut content_bytes,
        },
    )?;
    Ok(Plan { resources })
}

/// Deserializes YAML text with a seed (`PhantomData<T>` for a plain `T`); errors keep the line
/// serde_yaml_ng reports, with its decorations moved out of the message.
fn parse_yaml<'de, S: DeserializeSeed<'de>>(
    text: &'de str,
    seed: S,
) -> Result<S::Value, CompileError> {
    seed.deserialize(serde_yaml_ng::Deserializer::from_str(text))
        .map_err(|error| CompileError {
            line: error.location().map(|location| location.line()),
            message: plain_message(&error.to_string()),
        })
}

/// serde_yaml_ng writes errors as `.[2].file: MESSAGE at line 7 column 3`; the path and the
/// positions are reported separately (as the item's line), so they are cut from the message.
fn plain_message(text: &str) -> String {
    let mut text = text;
    if text.starts_with(['.', '[']) {
        if let Some((_, rest)) = text.split_once(": ") {
            text = rest;
        }
    }
    let mut message = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(" at line ") {
        message.push_str(&rest[..at]);
        let after = &rest[at + " at line ".len()..];
        match position_length(after) {
            Some(length) => rest = &after[length..],
            None => {
                message.push_str(" at line ");
                rest = after;
            }
        }
    }
    message.push_str(rest);
    message
}

/// The length of `L column C` at the start of `text`, if it starts with one.
fn position_length(text: &str) -> Option<usize> {
    let digits = |text: &str| text.bytes().take_while(u8::is_ascii_digit).count();
    let line = digits(text);
    let after_line = text[line..].strip_prefix(" column ")?;
    let column = digits(after_line);
    (line > 0 && column > 0).then(|| text.len() - after_line.len() + column)
}

/// The whole file: a YAML list of items.
struct ItemsSeed<'a> {
    base_dir: &'a Path,
    /// File contents inlined or written so far, as encoded in the plan.
    content_bytes: &'a mut usize,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = Vec<Resource>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = Vec<Resource>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML list of resources (items such as `- file: {path: /etc/motd}`)")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Self::Value, A::Error> {
        let mut resources = Vec::new();
        loop {
            let seed = ItemSeed {
                base_dir: self.base_dir,
                content_bytes: &mut *self.content_bytes,
            };
            match items.next_element_seed(seed)? {
                Some(resource) => resources.push(resource),
                None => return Ok(resources),
            }
        }
    }
}

/// One list item: a one-key mapping `kind: {settings}`.
struct ItemSeed<'a> {
    base_dir: &'a Path,
    content_bytes: &'a mut usize,
}

impl<'de> DeserializeSeed<'de> for ItemSeed<'_> {
    type Value = Resource;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_> {
    type Value = Resource;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a resource: a one-key mapping such as `file: {path: /etc/motd}`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut item: A) -> Result<Self::Value, A::Error> {
        let Some(kind) = item.next_key::<String>()? else {
            return Err(de::Error::custom(
                "empty item; expected a resource such as `file: {path: /etc/motd}`",
            ));
        };
        let mut resource = match kind.as_str() {
            "file" => Resource::File(settings(&mut item, &kind, "path")?),
            "directory" => Resource::Directory(settings(&mut item, &kind, "path")?),
            "symlink" => Resource::Symlink(settings(&mut item, &kind, "path")?),
            "package" => Resource::Package(settings(&mut item, &kind, "name")?),
            "service" => Resource::Service(settings(&mut item, &kind, "name")?),
            "command" => Resource::Command(settings(&mut item, &kind, "run")?),
            "user" => Resource::User(settings(&mut item, &kind, "name")?),
            "group" => Resource::Group(settings(&mut item, &kind, "name")?),
            "cron" => Resource::Cron(settings(&mut item, &kind, "name")?),
            "sysctl" => Resource::Sysctl(settings(&mut item, &kind, "name")?),
            "line" => Resource::Line(settings(&mut item, &kind, "path")?),
            _ => {
                return Err(de::Error::custom(format!(
                    "unknown resource kind '{kind}' (expected one of {})",
                    KINDS.join(", ")
                )))
            }
        };
        if let Some(next) = item.next_key::<String>()? {
            return Err(de::Error::custom(format!(
                "{kind}: one resource per list item, but '{next}' follows '{kind}' (start it \
                 with its own '- ')"
            )));
        }
        let fail = |message: String| de::Error::custom(format!("{kind}: {message}"));
        validate::check_resource(&resource).map_err(fail)?;
        normalize_modes(&mut resource);
        if let Resource::File(file) = &mut resource {
            let source = file.source.clone();
            inline_source(file, self.base_dir).map_err(fail)?;
            *self.content_bytes += validate::encoded_content_size(file);
            validate::check_content_budget(*self.content_bytes).map_err(
                |message| match source {
                    Some(source) => fail(format!("source '{source}': {message}")),
                    None => fail(message),
                },
            )?;
        }
        Ok(resource)
    }
}

/// The settings of one resource; serde's own messages name unknown and missing keys.
fn settings<'de, A: MapAccess<'de>, T: DeserializeOwned>(
    item: &mut A,
    kind: &str,
    required: &str,
) -> Result<T, A::Error> {
    let settings: Option<T> = item.next_value().map_err(|error| {
        let mut message = plain_message(&error.to_string());
        // "expected struct FileResource" names a Rust type; say what to write instead.
        if let Some(at) = message.find(", expected struct ") {
            message.replace_range(at.., ", expected a mapping of settings (`key: value`)");
        }
        de::Error::custom(format!("{kind}: {message}"))
    })?;
    settings.ok_or_else(|| de::Error::custom(format!("{kind}: missing field `{required}`")))
}

/// Modes travel as four octal digits whatever the file said (644, "0644", 0o644).
fn normalize_modes(resource: &mut Resource) {
    let mode = match resource {
        Resource::File(file) => &mut file.mode,
        Resource::Directory(directory) => &mut directory.mode,
        _ => return,
    };
    if let Some(text) = mode {
        if let Ok(parsed) = validate::parse_mode(text) {
            *text = validate::format_mode(parsed);
        }
    }
}

/// Replaces `source` with the file's bytes: `content` when they are UTF-8, `content_base64`
/// otherwise, so binary files survive the JSON plan.
fn inline_source(file: &mut FileResource, base_dir: &Path) -> Result<(), String> {
    let Some(source) = file.source.take() else {
        return Ok(());
    };
    let path = base_dir.join(&source);
    let unreadable = |error: std::io::Error| {
        format!(
            "source '{source}' ({}) cannot be read: {error}",
            path.display()
        )
    };
    let metadata = fs::metadata(&path).map_err(unreadable)?;
    if !metadata.is_file() {
        return Err(format!(
            "source '{source}' ({}) is not a regular file",
            path.display()
        ));
    }
    // Refuse before reading: a mistaken source could be a disk image.
    if metadata.len() > MAX_CONTENT_BYTES as u64 {
        return Err(format!(
            "source '{source}' is {} KiB, more than the {} KiB a plan may carry (a plan travels \
             in one 1 MiB bus message); ship large files another way",
            metadata.len().div_ceil(1024),
            MAX_CONTENT_BYTES / 1024
        ));
    }
    let bytes = fs::read(&path).map_err(unreadable)?;
    match String::from_utf8(bytes) {
        Ok(text) => file.content = Some(text),
        Err(error) => {
            file.content_base64 =
                Some(base64::engine::general_purpose::STANDARD.encode(error.into_bytes()))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{
        CommandResource, DirectoryResource, PackageResource, ServiceResource, SymlinkResource,
    };

    fn compile_here(yaml: &str) -> Result<Plan, CompileError> {
        compile(yaml, Path::new("/nonexistent"))
    }

    fn error_text(yaml: &str) -> String {
        compile_here(yaml).expect_err(yaml).to_string()
    }

    #[test]
    fn every_kind_compiles() {
        let yaml = "\
# web servers
- file:
    path: /etc/motd
    content: \"hello\\n\"
    mode: 644
    owner: root
    group: \"0\"
- file: {path: /etc/issue, mode: 0o600}
- directory: {path: /srv/app, mode: \"0750\"}
- symlink: {path: /srv/current, target: app}
- package: {name: nginx}
- package: {name: telnet, state: absent}
- service: {name: nginx, state: running, enabled: true}
- command:
    run: make install
    creates: /usr/local/bin/app
    unless: test -e /etc/skip
    timeout: 5m
";
        let expected = Plan {
            resources: vec![
                Resource::File(FileResource {
                    path: "/etc/motd".into(),
                    content: Some("hello\n".into()),
                    mode: Some("0644".into()),
                    owner: Some("root".into()),
                    group: Some("0".into()),
                    ..FileResource::default()
                }),
                Resource::File(FileResource {
                    path: "/etc/issue".into(),
                    mode: Some("0600".into()),
                    ..FileResource::default()
                }),
                Resource::Directory(DirectoryResource {
                    path: "/srv/app".into(),
                    mode: Some("0750".into()),
                    ..DirectoryResource::default()
                }),
                Resource::Symlink(SymlinkResource {
                    path: "/srv/current".into(),
                    target: "app".into(),
                    state: None,
                }),
                Resource::Package(PackageResource {
                    name: "nginx".into(),
                    state: None,
                    version: None,
                }),
                Resource::Package(PackageResource {
                    name: "telnet".into(),
                    state: Some(crate::state::PackageState::Absent),
                    version: None,
                }),
                Resource::Service(ServiceResource {
                    name: "nginx".into(),
                    state: Some(crate::state::ServiceState::Running),
                    enabled: Some(true),
                }),
                Resource::Command(CommandResource {
                    run: "make install".into(),
                    unless: Some("test -e /etc/skip".into()),
                    creates: Some("/usr/local/bin/app".into()),
                    timeout: Some("5m".into()),
                }),
            ],
        };
        let plan = compile_here(yaml).unwrap();
        assert_eq!(plan, expected);
        // The plan travels as JSON and the server accepts it as it is.
        let json = serde_json::to_string(&plan).unwrap();
        let back: Plan = serde_json::from_str(&json).unwrap();
        assert_eq!(back, plan);
        assert_eq!(crate::state::validate(&back), Ok(()));
    }

    #[test]
    fn empty_files_are_empty_plans() {
        for yaml in ["", "\n\n", "# nothing yet\n", "---\n", "[]\n"] {
            assert_eq!(compile_here(yaml), Ok(Plan::default()), "{yaml:?}");
        }
    }

    #[test]
    fn errors_name_the_line_of_their_item() {
        let cases = [
            (
                "- file: {path: /a}\n\n- file:\n    path: etc/motd\n",
                "line 3: file: path must be absolute, not 'etc/motd'",
            ),
            (
                "- file: {path: /a}\n- file:\n    path: /b\n    bogus: 1\n",
                "line 2: file: unknown field `bogus`, expected one of",
            ),
            (
                "# header\n- files: {path: /a}\n",
                "line 2: unknown resource kind 'files' (expected one of file, directory, \
                 symlink, package, service, command, user, group, cron, sysctl, line)",
            ),
            (
                "- file: {path: /a}\n  directory: {path: /b}\n",
                "line 1: file: one resource per list item, but 'directory' follows 'file'",
            ),
            (
                "- package: {name: nginx}\n- package: {name: nginx, state: latest}\n",
                "line 2: package: unknown variant `latest`, expected `installed` or `absent`",
            ),
            (
                "- service: {name: x, state: up}\n",
                "line 1: service: unknown variant `up`, expected `running` or `stopped`",
            ),
            (
                "- service: {name: x, enabled: maybe}\n",
                "line 1: service: invalid type: string \"maybe\", expected a boolean",
            ),
            (
                "- command: {run: \"\"}\n",
                "line 1: command: run must not be empty",
            ),
            (
                "- command: {unless: \"true\"}\n",
                "line 1: command: missing field `run`",
            ),
            ("- command:\n", "line 1: command: missing field `run`"),
            (
                "- file: {path: /a, content: x, source: a.txt}\n",
                "line 1: file: content and source are mutually exclusive",
            ),
            (
                "- file: {path: /a, mode: 0999}\n",
                "line 1: file: mode '0999' is not an octal file mode such as 0644",
            ),
            (
                "- file: {path: /a, mode: 0x1f}\n",
                "line 1: file: mode '0x1f' is not an octal file mode",
            ),
            (
                "- 5\n",
                "line 1: invalid type: integer `5`, expected a resource",
            ),
            ("- {}\n", "line 1: empty item"),
            (
                "- file: [1]\n",
                "line 1: file: invalid type: sequence, expected a mapping of settings (`key: value`)",
            ),
            (
                "path: /a\n",
                "line 1: invalid type: map, expected a YAML list of resources",
            ),
            (
                "- file: {path: /a\n",
                "line 2: did not find expected ',' or '}', while parsing a flow mapping",
            ),
            (
                "- file: {path: /a}\n---\n- file: {path: /b}\n",
                "deserializing from YAML containing more than one document is not supported",
            ),
        ];
        for (yaml, expected) in cases {
            let message = error_text(yaml);
            assert!(
                message.starts_with(expected),
                "{yaml:?}\n got {message:?}\nwant {expected:?}"
            );
        }
    }

    #[test]
    fn sources_are_inlined_relative_to_the_base_dir() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("files")).unwrap();
        fs::write(dir.path().join("files/motd"), "welcome\n").unwrap();
        let binary = [0u8, 159, 146, 150, 255];
        fs::write(dir.path().join("files/logo.bin"), binary).unwrap();
        let yaml = "\
- file: {path: /etc/motd, source: files/motd}
- file: {path: /usr/share/logo.bin, source: files/logo.bin, mode: '0644'}
";
        let plan = compile(yaml, dir.path()).unwrap();
        assert_eq!(
            plan.resources[0],
            Resource::File(FileResource {
                path: "/etc/motd".into(),
                content: Some("welcome\n".into()),
                ..FileResource::default()
            })
        );
        let Resource::File(logo) = &plan.resources[1] else {
            panic!("not a file: {:?}", plan.resources[1]);
        };
        assert_eq!((&logo.content, &logo.source), (&None, &None));
        let decoded = validate::decode_base64(logo.content_base64.as_deref().unwrap()).unwrap();
        assert_eq!(decoded, binary);
        assert_eq!(crate::state::validate(&plan), Ok(()));
    }

    #[test]
    fn missing_and_oversized_sources_are_errors_on_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let missing = compile(
            "- file: {path: /a}\n- file: {path: /b, source: nope.txt}\n",
            dir.path(),
        )
        .unwrap_err();
        assert_eq!(missing.line, Some(2));
        assert!(
            missing.message.starts_with("file: source 'nope.txt' (")
                && missing.message.contains("cannot be read"),
            "{missing}"
        );

        fs::write(dir.path().join("big"), vec![b'x'; MAX_CONTENT_BYTES + 1]).unwrap();
        let big = compile("- file: {path: /big, source: big}\n", dir.path()).unwrap_err();
        assert_eq!(big.line, Some(1));
        assert!(
            big.message
                .contains("source 'big' is 513 KiB, more than the 512 KiB"),
            "{big}"
        );

        // Each source fits; together they do not.
        fs::write(
            dir.path().join("half"),
            vec![b'x'; MAX_CONTENT_BYTES / 2 + 1],
        )
        .unwrap();
        let yaml = "- file: {path: /1, source: half}\n- file: {path: /2, source: half}\n";
        let both = compile(yaml, dir.path()).unwrap_err();
        assert_eq!(both.line, Some(2));
        assert!(
            both.message
                .starts_with("file: source 'half': file contents total"),
            "{both}"
        );

        let directory = compile("- file: {path: /d, source: .}\n", dir.path()).unwrap_err();
        assert!(
            directory.message.contains("is not a regular file"),
            "{directory}"
        );
    }

    #[test]
    fn messages_lose_serde_decorations() {
        let cases = [
            (
                ".[1].file: unknown field `x` at line 4 column 5",
                "unknown field `x`",
            ),
            ("invalid type: map at line 1 column 1", "invalid type: map"),
            ("no position here", "no position here"),
            (
                "ends with at line x column 2",
                "ends with at line x column 2",
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(plain_message(input), expected);
        }
    }

    /// The kinds after the first six: each compiles, survives the JSON round trip, and its bad
    /// values are errors on the item's line.
    #[test]
    fn more_kinds_compile() {
        let yaml = "\
- user:
    name: app
    uid: 1500
    gid: 100
    groups: [adm, 27]
    home: /srv/app
    shell: /bin/bash
    system: true
    comment: App server
- user: {name: old, state: absent}
- group: {name: deploy, gid: 1600, system: false}
- group: {name: old, state: absent}
- cron: {name: backup, schedule: \"0 3 * * *\", run: /usr/local/bin/backup}
- cron:
    name: report
    user: www-data
    schedule: \"@daily\"
    run: /srv/app/report
    file: /etc/cron.d/app
- sysctl: {name: net.ipv4.ip_forward, value: 1}
- sysctl: {name: vm.swappiness, value: \"10\", file: /etc/sysctl.d/60-app.conf, runtime: false}
- line:
    path: /etc/ssh/sshd_config
    line: PermitRootLogin no
    match: ^#?PermitRootLogin
- package: {name: nginx, version: 1.22.1-9+deb12u1}
- line:
    path: /etc/hosts
    create: true
    block: |
      10.0.0.1 db
      10.0.0.2 cache
";
        let expected = vec![
            Resource::User(crate::state::UserResource {
                name: "app".into(),
                uid: Some(1500),
                gid: Some("100".into()),
                groups: Some(vec!["adm".into(), "27".into()]),
                home: Some("/srv/app".into()),
                shell: Some("/bin/bash".into()),
                system: Some(true),
                comment: Some("App server".into()),
                ..Default::default()
            }),
            Resource::User(crate::state::UserResource {
                name: "old".into(),
                state: Some(crate::state::Presence::Absent),
                ..Default::default()
            }),
            Resource::Group(crate::state::GroupResource {
                name: "deploy".into(),
                gid: Some(1600),
                system: Some(false),
                state: None,
            }),
            Resource::Group(crate::state::GroupResource {
                name: "old".into(),
                state: Some(crate::state::Presence::Absent),
                ..Default::default()
            }),
            Resource::Cron(crate::state::CronResource {
                name: "backup".into(),
                schedule: "0 3 * * *".into(),
                run: "/usr/local/bin/backup".into(),
                ..Default::default()
            }),
            Resource::Cron(crate::state::CronResource {
                name: "report".into(),
                user: Some("www-data".into()),
                schedule: "@daily".into(),
                run: "/srv/app/report".into(),
                file: Some("/etc/cron.d/app".into()),
                state: None,
            }),
            Resource::Sysctl(crate::state::SysctlResource {
                name: "net.ipv4.ip_forward".into(),
                value: "1".into(),
                ..Default::default()
            }),
            Resource::Sysctl(crate::state::SysctlResource {
                name: "vm.swappiness".into(),
                value: "10".into(),
                file: Some("/etc/sysctl.d/60-app.conf".into()),
                runtime: Some(false),
            }),
            Resource::Line(crate::state::LineResource {
                path: "/etc/ssh/sshd_config".into(),
                line: Some("PermitRootLogin no".into()),
                pattern: Some("^#?PermitRootLogin".into()),
                ..Default::default()
            }),
            Resource::Package(PackageResource {
                name: "nginx".into(),
                version: Some("1.22.1-9+deb12u1".into()),
                state: None,
            }),
            Resource::Line(crate::state::LineResource {
                path: "/etc/hosts".into(),
                create: Some(true),
                block: Some("10.0.0.1 db\n10.0.0.2 cache\n".into()),
                ..Default::default()
            }),
        ];
        let plan = compile_here(yaml).unwrap();
        assert_eq!(plan.resources, expected);
        let json = serde_json::to_string(&plan).unwrap();
        let back: Plan = serde_json::from_str(&json).unwrap();
        assert_eq!(back, plan);
        assert_eq!(crate::state::validate(&back), Ok(()));
    }

    #[test]
    fn more_kinds_errors_name_their_line() {
        let cases = [
            (
                "- user: {name: app}\n- user: {name: app, home: /a, bogus: 1}\n",
                "line 2: user: unknown field `bogus`, expected one of",
            ),
            (
                "- user: {name: -rf}\n",
                "line 1: user: name '-rf' is not a valid account name",
            ),
            (
                "- user: {name: app, uid: -1}\n",
                "line 1: user: invalid type: integer `-1`, expected u32",
            ),
            (
                "- user: {name: app, groups: adm}\n",
                "line 1: user: invalid type: string \"adm\", expected a sequence",
            ),
            ("- user: {uid: 1}\n", "line 1: user: missing field `name`"),
            (
                "- group: {name: deploy}\n- group: {name: \"a b\"}\n",
                "line 2: group: name 'a b' is not a valid account name",
            ),
            (
                "- group: {name: old, state: absent, gid: 5}\n",
                "line 1: group: gid cannot go with state absent",
            ),
            (
                "- group: {name: x, members: [a]}\n",
                "line 1: group: unknown field `members`",
            ),
            (
                "- cron: {name: b, schedule: \"@daily\", run: x}\n- cron:\n    name: b\n    schedule: \"61 * * * *\"\n    run: x\n",
                "line 2: cron: schedule '61 * * * *': minute '61' is not valid",
            ),
            (
                "- cron: {name: b, run: x}\n",
                "line 1: cron: schedule is required",
            ),
            (
                "- cron: {name: b, schedule: \"@daily\", run: x, when: now}\n",
                "line 1: cron: unknown field `when`",
            ),
            (
                "- sysctl: {name: vm.swappiness}\n",
                "line 1: sysctl: missing field `value`",
            ),
            (
                "- sysctl: {name: vm.swappiness, value: 10, runtime: yes please}\n",
                "line 1: sysctl: invalid type: string \"yes please\", expected a boolean",
            ),
            (
                "- sysctl: {name: ../../etc/passwd, value: 1}\n",
                "line 1: sysctl: name '../../etc/passwd' must be dotted parts",
            ),
            (
                "- line: {path: /etc/hosts, line: x}\n- line: {path: /etc/hosts, line: x, regex: y}\n",
                "line 2: line: unknown field `regex`, expected one of `path`, `state`, `line`, \
                 `match`, `block`, `marker`, `create`",
            ),
            (
                "- line:\n    path: /etc/motd\n    line: x\n    match: \"[\"\n",
                "line 1: line: match '[' is not a valid regex",
            ),
            (
                "- line: {path: /etc/motd, line: x, block: y}\n",
                "line 1: line: line and match cannot go with block or marker",
            ),
            (
                "- package: {name: nginx, version: \"1.22*\"}\n",
                "line 1: package: version '1.22*' must start with a letter or digit",
            ),
            (
                "- package: {name: nginx, state: absent, version: \"1\"}\n",
                "line 1: package: version cannot go with state absent",
            ),
        ];
        for (yaml, expected) in cases {
            let message = error_text(yaml);
            assert!(
                message.starts_with(expected),
                "{yaml:?}\n got {message:?}\nwant {expected:?}"
            );
        }
    }
}
