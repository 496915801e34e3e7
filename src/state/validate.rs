//! The value rules of a resource, shared by the three parties that handle a plan: `compile` on
//! the operator's machine, `validate` on the server (for a plan received as JSON) and `run` on
//! the agent, before it touches anything. Pure: no I/O, no YAML, no host lookups (user and
//! group names are resolved by the agent, on the host they belong to).

use base64::Engine as _;

#[cfg(test)]
use super::ServiceState;
use super::{
    ArchiveResource, CronResource, FileResource, GitResource, LineResource, Links, PkgrepoResource,
    Plan, Presence, Resource, SysctlResource, TreeResource, UserResource, YumRepository,
};

/// File contents a plan may carry in all, measured as encoded in the JSON plan. A plan past
/// 256 KiB does not travel in its command: the server stores it and agents fetch it by its
/// chunks' SHA-256 (`fleet::content`), up to 64 MiB of JSON; this leaves room in that for
/// the rest of the plan and for text that grows when escaped.
pub(super) const MAX_CONTENT_BYTES: usize = 48 * 1024 * 1024;

/// The budget as people read it: "48 MiB".
pub(super) fn content_budget() -> String {
    format!("{} MiB", MAX_CONTENT_BYTES / (1024 * 1024))
}

pub(super) fn validate(plan: &Plan) -> Result<(), String> {
    let mut content_bytes = 0;
    for (index, resource) in plan.resources.iter().enumerate() {
        let fail =
            |message: String| format!("resource {} ({}): {message}", index + 1, resource.label());
        check_compiled(resource).map_err(fail)?;
        if let Some(links) = plan.links_of(index) {
            check_links(links).map_err(fail)?;
        }
        match resource {
            Resource::File(file) => content_bytes += encoded_content_size(file),
            Resource::Tree(tree) => content_bytes += encoded_tree_size(tree),
            _ => {}
        }
        content_bytes += encoded_inlined_size(resource);
    }
    check_content_budget(content_bytes)?;
    check_order(plan)?;
    for name in &plan.secret_vars {
        if !plan.vars.contains_key(name) {
            return Err(format!("secret_vars names '{name}', which is not in vars"));
        }
    }
    Ok(())
}

/// A compiled plan's links: one per resource (or none at all), ids unique, and every id a
/// resource waits for belongs to an earlier resource — which the compiler's sort guarantees,
/// and which also rules out cycles in a plan that did not come from the compiler.
pub(super) fn check_order(plan: &Plan) -> Result<(), String> {
    if plan.links.is_empty() {
        return Ok(());
    }
    if plan.links.len() != plan.resources.len() {
        return Err(format!(
            "links has {} entries for {} resources",
            plan.links.len(),
            plan.resources.len()
        ));
    }
    let mut earlier = std::collections::HashSet::new();
    for (index, links) in plan.links.iter().enumerate() {
        for id in links.prerequisites() {
            if !earlier.contains(id.as_str()) {
                return Err(format!(
                    "resource {} ({}) waits for '{id}', which is not the id of an earlier \
                     resource (compile the state file with svcctl state)",
                    index + 1,
                    plan.resources[index].label()
                ));
            }
        }
        if let Some(id) = &links.id {
            if !earlier.insert(id.as_str()) {
                return Err(format!("id '{id}' is used twice"));
            }
        }
    }
    Ok(())
}

/// An id and the ids a resource refers to: short names, nothing a shell or a path could
/// misread.
pub(super) fn check_links(links: &Links) -> Result<(), String> {
    let check = |key: &str, id: &str| {
        let valid = !id.is_empty()
            && id.len() <= 128
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if valid {
            Ok(())
        } else {
            Err(format!(
                "{key} '{id}' is not an id (1-128 letters, digits, '-', '_', '.', ':')"
            ))
        }
    };
    if let Some(id) = &links.id {
        check("id", id)?;
    }
    for id in &links.require {
        check("require", id)?;
    }
    for id in &links.onchanges {
        check("onchanges", id)?;
    }
    Ok(())
}

/// The rules for a resource of a compiled plan: every value valid and no `source:` left (only
/// the operator's machine can read it).
pub(super) fn check_compiled(resource: &Resource) -> Result<(), String> {
    check_resource(resource)?;
    match resource {
        Resource::File(file) if file.source.is_some() => Err(
            "source must be compiled by svcctl state (`svcctl state compile` inlines it)".into(),
        ),
        Resource::Tree(tree) if tree.source.is_some() => Err(
            "source must be compiled by svcctl state (`svcctl state compile` reads the \
             directory)"
                .into(),
        ),
        Resource::File(file) if file.template.is_some() && file.content.is_none() => Err(
            "template must be compiled by svcctl state (`svcctl state compile` inlines it)".into(),
        ),
        Resource::Pkgrepo(repo) if has_key_source(repo) => Err(
            "key_source must be compiled by svcctl state (`svcctl state compile` inlines it)"
                .into(),
        ),
        Resource::Archive(archive) if archive.source.is_some() => Err(
            "source must be compiled by svcctl state (`svcctl state compile` inlines it)".into(),
        ),
        _ => Ok(()),
    }
}

/// The rules every resource obeys, compiled or not. Messages do not name the kind; callers
/// add it (`line 7: file: ...`, `resource 2 (file:/etc/motd): ...`).
pub(super) fn check_resource(resource: &Resource) -> Result<(), String> {
    match resource {
        Resource::File(file) => {
            check_path("path", &file.path)?;
            let is_absent = file.state == Some(Presence::Absent);
            // A compiled template is its name and its text (in `content`); the compiler
            // refuses `content` written beside `template`.
            let sources = [
                ("content", file.content.is_some() && file.template.is_none()),
                ("content_base64", file.content_base64.is_some()),
                ("source", file.source.is_some()),
                ("template", file.template.is_some()),
            ];
            let given: Vec<&str> = sources
                .iter()
                .filter(|(_, is_set)| *is_set)
                .map(|(name, _)| *name)
                .collect();
            if given.len() > 1 {
                return Err(format!(
                    "{} are mutually exclusive; give one",
                    given.join(" and ")
                ));
            }
            if let Some(encoded) = &file.content_base64 {
                decode_base64(encoded)?;
            }
            if file
                .template
                .as_deref()
                .is_some_and(|template| template.is_empty())
            {
                return Err("template must not be empty".into());
            }
            if file
                .source
                .as_deref()
                .is_some_and(|source| source.is_empty())
            {
                return Err("source must not be empty".into());
            }
            if is_absent {
                let managed = [
                    ("content", file.content.is_some()),
                    ("content_base64", file.content_base64.is_some()),
                    ("source", file.source.is_some()),
                    ("template", file.template.is_some()),
                    ("mode", file.mode.is_some()),
                    ("owner", file.owner.is_some()),
                    ("group", file.group.is_some()),
                ];
                refuse_with_absent(&managed)?;
            }
            check_attributes(
                file.mode.as_deref(),
                file.owner.as_deref(),
                file.group.as_deref(),
            )
        }
        Resource::Directory(directory) => {
            check_path("path", &directory.path)?;
            if directory.state == Some(Presence::Absent) {
                refuse_with_absent(&[
                    ("mode", directory.mode.is_some()),
                    ("owner", directory.owner.is_some()),
                    ("group", directory.group.is_some()),
                ])?;
            }
            check_attributes(
                directory.mode.as_deref(),
                directory.owner.as_deref(),
                directory.group.as_deref(),
            )
        }
        Resource::Symlink(symlink) => {
            check_path("path", &symlink.path)?;
            if symlink.state == Some(Presence::Absent) {
                refuse_with_absent(&[("target", !symlink.target.is_empty())])
            } else if symlink.target.is_empty() {
                Err("target is required (what the link points at)".into())
            } else if symlink.target.contains('\0') {
                Err("target must not contain NUL".into())
            } else {
                Ok(())
            }
        }
        Resource::Package(package) => {
            // Its state is an enum: YAML with another value does not parse.
            check_package_name(&package.name)?;
            if let Some(version) = &package.version {
                if package.state == Some(super::PackageState::Absent) {
                    return Err("version cannot go with state absent".into());
                }
                check_package_version(version)?;
            }
            Ok(())
        }
        Resource::Service(service) => {
            check_service_name(&service.name)?;
            if service.state.is_none() && service.enabled.is_none() {
                return Err("nothing to manage: set state (running|stopped|restarted|reloaded) and/or enabled".into());
            }
            Ok(())
        }
        Resource::Tree(tree) => check_tree(tree),
        Resource::Command(command) => {
            check_shell_text("run", &command.run)?;
            if let Some(unless) = &command.unless {
                check_shell_text("unless", unless)?;
            }
            if let Some(creates) = &command.creates {
                check_path("creates", creates)?;
            }
            if let Some(timeout) = &command.timeout {
                parse_timeout(timeout)?;
            }
            Ok(())
        }
        Resource::User(user) => check_user(user),
        Resource::Group(group) => {
            check_login_name("name", &group.name)?;
            if group.state == Some(Presence::Absent) {
                refuse_with_absent(&[
                    ("gid", group.gid.is_some()),
                    ("system", group.system.is_some()),
                ])
            } else if group.gid == Some(u32::MAX) {
                Err("gid 4294967295 is out of range (it means \"no group\")".into())
            } else {
                Ok(())
            }
        }
        Resource::Cron(cron) => check_cron(cron),
        Resource::Sysctl(sysctl) => check_sysctl(sysctl),
        Resource::Line(line) => check_line(line),
        Resource::Pkgrepo(repo) => check_pkgrepo(repo),
        Resource::Archive(archive) => check_archive(archive),
        Resource::Git(git) => check_git(git),
    }
}

/// The repository and revision become arguments of git: neither may start with `-`, and a
/// revision is a plain ref name or a full commit id (no `main~2`, `HEAD^` or ranges, which
/// would make "already at" ambiguous).
fn check_git(git: &GitResource) -> Result<(), String> {
    check_path("path", &git.path)?;
    check_word("repo", &git.repo)?;
    if git.repo.starts_with('-') {
        return Err(format!("repo '{}' must not start with -", git.repo));
    }
    if !git.repo.starts_with('/') && !git.repo.contains(':') {
        return Err(format!(
            "repo '{}' must be a URL, user@host:path or an absolute path",
            git.repo
        ));
    }
    if let Some(rev) = &git.rev {
        if !is_commit_id(rev) && !is_ref_name(rev) {
            return Err(format!(
                "rev '{rev}' is not a branch or tag name or a full commit id (40 or 64 hex \
                 digits)"
            ));
        }
    }
    if git.depth == Some(0) {
        return Err("depth must be at least 1".into());
    }
    Ok(())
}

/// A full commit id: SHA-1 (40 hex digits) or SHA-256 (64).
pub(super) fn is_commit_id(rev: &str) -> bool {
    matches!(rev.len(), 40 | 64) && rev.bytes().all(|b| b.is_ascii_hexdigit())
}

/// git check-ref-format's rules, for a branch or tag name.
fn is_ref_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('-')
        && !name.ends_with('/')
        && !name.ends_with('.')
        && !name.ends_with(".lock")
        && !name.contains("..")
        && !name.contains("@{")
        && name != "@"
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "~^:?*[\\".contains(c))
        && name
            .split('/')
            .all(|part| !part.is_empty() && !part.starts_with('.'))
}

fn check_archive(archive: &ArchiveResource) -> Result<(), String> {
    check_path("path", &archive.path)?;
    let origins = [
        ("source", archive.source.is_some()),
        ("content_base64", archive.content_base64.is_some()),
        ("url", archive.url.is_some()),
    ];
    let given: Vec<&str> = origins
        .iter()
        .filter(|(_, is_set)| *is_set)
        .map(|(name, _)| *name)
        .collect();
    match given.len() {
        0 => return Err("give source (an archive beside the state file) or url".into()),
        1 => {}
        _ => {
            return Err(format!(
                "{} are mutually exclusive; give one",
                given.join(" and ")
            ))
        }
    }
    if archive.source.as_deref().is_some_and(str::is_empty) {
        return Err("source must not be empty".into());
    }
    if let Some(encoded) = &archive.content_base64 {
        decode_base64(encoded)?;
    }
    if let Some(url) = &archive.url {
        check_download_url(url)?;
    }
    let is_digest =
        archive.sha256.len() == 64 && archive.sha256.bytes().all(|b| b.is_ascii_hexdigit());
    if !is_digest {
        return Err(format!(
            "sha256 '{}' is not a SHA-256 digest (64 hex digits, as sha256sum prints)",
            archive.sha256
        ));
    }
    if let Some(creates) = &archive.creates {
        check_path("creates", creates)?;
    }
    Ok(())
}

/// An http:// or https:// URL with a host and no credentials (they would be in every
/// outcome and log line).
fn check_download_url(url: &str) -> Result<(), String> {
    let invalid = |why: &str| Err(format!("url '{url}' {why}"));
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return invalid("must start with https:// or http://");
    }
    let Ok(uri) = url.parse::<http::Uri>() else {
        return invalid("is not a valid URL");
    };
    match uri.authority() {
        None => invalid("has no host"),
        Some(authority) if authority.as_str().contains('@') => {
            invalid("has credentials, which are not supported")
        }
        Some(_) => Ok(()),
    }
}

/// A repository's name is a file name in sources.list.d (where apt ignores names with other
/// characters) and a yum repository id.
fn check_pkgrepo(repo: &PkgrepoResource) -> Result<(), String> {
    let is_valid_name = repo.name.len() <= 100
        && repo
            .name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && repo
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !is_valid_name {
        return Err(format!(
            "name '{}' must start with a letter or digit and use only letters, digits and . _ - \
             (it names the repository's files)",
            repo.name
        ));
    }
    for (field, dir) in [("dir", &repo.dir), ("keyring_dir", &repo.keyring_dir)] {
        if let Some(dir) = dir {
            check_path(field, dir)?;
        }
    }
    if repo.state == Some(Presence::Absent) {
        return refuse_with_absent(&[
            ("apt", repo.apt.is_some()),
            ("yum", repo.yum.is_some()),
            ("refresh", repo.refresh.is_some()),
        ]);
    }
    if repo.apt.is_none() && repo.yum.is_none() {
        return Err(
            "give an apt block, a yum block or both (the host decides which applies)".into(),
        );
    }
    if repo.refresh == Some(true) && repo.apt.is_none() {
        return Err("refresh applies to apt sources only (dnf refreshes its own metadata)".into());
    }
    if let Some(apt) = &repo.apt {
        check_word("apt.uri", &apt.uri)?;
        if !apt.uri.contains(':') {
            return Err(format!(
                "apt.uri '{}' is not a URI such as https://deb.example.com/debian",
                apt.uri
            ));
        }
        check_word("apt.suite", &apt.suite)?;
        match (apt.suite.ends_with('/'), apt.components.is_empty()) {
            (true, false) => {
                return Err(format!(
                    "apt.suite '{}' is a flat repository (it ends in /), which has no components",
                    apt.suite
                ))
            }
            (false, true) => return Err("apt.components: give at least one, such as [main]".into()),
            _ => {}
        }
        for component in &apt.components {
            check_word("apt.components", component)?;
        }
        if let Some(arch) = &apt.arch {
            let is_valid = !arch.is_empty()
                && arch
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !is_valid {
                return Err(format!(
                    "apt.arch '{arch}' is not an architecture name such as amd64"
                ));
            }
        }
        check_key_fields("apt.key", apt.key.as_deref(), apt.key_source.as_deref())?;
        if let Some(key) = &apt.key {
            if !is_armoured_key(key) {
                return Err(
                    "apt.key must be an ASCII-armoured public key (-----BEGIN PGP PUBLIC KEY \
                     BLOCK-----; `gpg --armor --export` writes one)"
                        .into(),
                );
            }
        }
    }
    if let Some(yum) = &repo.yum {
        check_yum(yum)?;
    }
    Ok(())
}

fn has_key_source(repo: &PkgrepoResource) -> bool {
    let apt = repo.apt.as_ref().and_then(|apt| apt.key_source.as_ref());
    let yum = repo.yum.as_ref().and_then(|yum| yum.key_source.as_ref());
    apt.or(yum).is_some()
}

fn check_yum(yum: &YumRepository) -> Result<(), String> {
    check_word("yum.baseurl", &yum.baseurl)?;
    if !yum.baseurl.contains("://") {
        return Err(format!(
            "yum.baseurl '{}' is not a URL such as https://rpm.example.com/el9/",
            yum.baseurl
        ));
    }
    check_key_fields(
        "yum.gpgkey",
        yum.gpgkey.as_deref(),
        yum.key_source.as_deref(),
    )?;
    if let Some(key) = &yum.gpgkey {
        if !is_armoured_key(key) && !is_key_url(key) {
            return Err(
                "yum.gpgkey must be an ASCII-armoured public key or a URL (https://, http://, \
                 file://, ftp://) without spaces"
                    .into(),
            );
        }
    }
    Ok(())
}

fn check_key_fields(field: &str, key: Option<&str>, source: Option<&str>) -> Result<(), String> {
    if key.is_some() && source.is_some() {
        return Err(format!(
            "{field} and key_source are mutually exclusive; give one"
        ));
    }
    if source.is_some_and(str::is_empty) {
        return Err("key_source must not be empty".into());
    }
    if key.is_some_and(|key| key.contains('\0')) {
        return Err(format!("{field} must not contain NUL"));
    }
    Ok(())
}

/// A yum gpgkey that dnf fetches itself.
pub(super) fn is_key_url(key: &str) -> bool {
    ["https://", "http://", "file://", "ftp://"]
        .iter()
        .any(|scheme| key.starts_with(scheme))
        && !key.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// What apt reads from an `.asc` keyring, and what `rpm --import` takes.
pub(super) fn is_armoured_key(key: &str) -> bool {
    key.contains("-----BEGIN PGP PUBLIC KEY BLOCK-----")
}

/// One value of a line-oriented file (deb822, .repo): non-empty, and no space, newline or
/// other control character that would end it or start another field.
fn check_word(field: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{field} must not be empty"));
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{field} '{}' must not contain spaces or control characters",
            value.escape_debug()
        ));
    }
    Ok(())
}

/// Parses an octal mode: "0644", "644", "0o644" (YAML's own octal, kept as text by the
/// compiler) and a YAML integer such as 644, which the compiler also sees as the text "644".
pub(super) fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    let is_octal = !digits.is_empty()
        && digits.len() <= 6
        && digits.bytes().all(|byte| (b'0'..=b'7').contains(&byte));
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if is_octal && mode <= 0o7777 => Ok(mode),
        _ => Err(format!(
            "mode '{text}' is not an octal file mode such as 0644"
        )),
    }
}

/// A mode as a plan carries it and people read it: four octal digits.
pub(super) fn format_mode(mode: u32) -> String {
    format!("{mode:04o}")
}

/// A command's time limit: "30s", "10m", "500ms" or plain seconds.
pub(super) fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    match crate::clock::parse_duration(text) {
        Some(duration) if !duration.is_zero() => Ok(duration),
        _ => Err(format!(
            "timeout '{text}' is not a duration such as 30s or 10m"
        )),
    }
}

pub(super) fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("content_base64 is not valid base64: {e}"))
}

/// The bytes a file's content takes in the JSON plan (escapes and quotes included).
pub(super) fn encoded_content_size(file: &FileResource) -> usize {
    let encoded = |text: &Option<String>| {
        text.as_ref().map_or(0, |text| {
            serde_json::to_string(text).map_or(text.len(), |json| json.len())
        })
    };
    encoded(&file.content) + encoded(&file.content_base64)
}

/// The bytes inlined into other kinds than file (a pkgrepo's keys, an archive), as encoded in
/// the plan.
pub(super) fn encoded_inlined_size(resource: &Resource) -> usize {
    let encoded = |text: Option<&String>| {
        text.map_or(0, |text| {
            serde_json::to_string(text).map_or(text.len(), |json| json.len())
        })
    };
    match resource {
        Resource::Pkgrepo(repo) => {
            encoded(repo.apt.as_ref().and_then(|apt| apt.key.as_ref()))
                + encoded(repo.yum.as_ref().and_then(|yum| yum.gpgkey.as_ref()))
        }
        Resource::Archive(archive) => encoded(archive.content_base64.as_ref()),
        _ => 0,
    }
}

pub(super) fn check_content_budget(content_bytes: usize) -> Result<(), String> {
    if content_bytes <= MAX_CONTENT_BYTES {
        return Ok(());
    }
    Err(format!(
        "file contents total {} KiB once encoded, more than the {} a plan may carry; ship \
         larger files as an archive with a url",
        content_bytes.div_ceil(1024),
        content_budget()
    ))
}

/// A normalized absolute path: the label of an outcome is the path, so `/etc//motd` and
/// `/etc/./motd` are refused rather than reported as different resources.
fn check_path(field: &str, path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("{field} must be absolute, not '{path}'"));
    }
    if path.contains('\0') {
        return Err(format!("{field} must not contain NUL"));
    }
    let is_normalized = path[1..]
        .split('/')
        .all(|part| !part.is_empty() && part != "." && part != "..");
    if !is_normalized {
        return Err(format!(
            "{field} '{path}' must be normalized (no empty, . or .. parts, no trailing /)"
        ));
    }
    Ok(())
}

fn check_tree(tree: &TreeResource) -> Result<(), String> {
    check_path("path", &tree.path)?;
    check_attributes(
        tree.mode.as_deref(),
        tree.owner.as_deref(),
        tree.group.as_deref(),
    )?;
    if let Some(mode) = &tree.dir_mode {
        parse_mode(mode)?;
    }
    if tree.source.as_deref().is_some_and(str::is_empty) {
        return Err("source must not be empty".into());
    }
    let mut dirs = std::collections::HashSet::new();
    for dir in &tree.dirs {
        check_relative("dirs", dir)?;
        if let Some((parent, _)) = dir.rsplit_once('/') {
            if !dirs.contains(parent) {
                return Err(format!(
                    "dirs: '{dir}' comes before its parent '{parent}' (parents first)"
                ));
            }
        }
        if !dirs.insert(dir.as_str()) {
            return Err(format!("dirs: '{dir}' is listed twice"));
        }
    }
    let mut files = std::collections::HashSet::new();
    for file in &tree.files {
        check_relative("files", &file.path)?;
        if let Some((parent, _)) = file.path.rsplit_once('/') {
            if !dirs.contains(parent) {
                return Err(format!(
                    "files: the directory of '{}' is not in dirs",
                    file.path
                ));
            }
        }
        if dirs.contains(file.path.as_str()) || !files.insert(file.path.as_str()) {
            return Err(format!("files: '{}' is listed twice", file.path));
        }
        if file.content.is_some() && file.content_base64.is_some() {
            return Err(format!(
                "files: '{}' has both content and content_base64",
                file.path
            ));
        }
        if let Some(encoded) = &file.content_base64 {
            decode_base64(encoded).map_err(|e| format!("files: '{}': {e}", file.path))?;
        }
        parse_mode(&file.mode).map_err(|e| format!("files: '{}': {e}", file.path))?;
    }
    Ok(())
}

/// A path below a tree: relative, normalized, no NUL.
fn check_relative(field: &str, path: &str) -> Result<(), String> {
    let is_normalized = !path.is_empty()
        && !path.contains('\0')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if is_normalized {
        Ok(())
    } else {
        Err(format!(
            "{field}: '{path}' must be a relative path inside the tree (no empty, . or .. parts)"
        ))
    }
}

/// The bytes a tree's files take in the JSON plan, like [`encoded_content_size`].
pub(super) fn encoded_tree_size(tree: &TreeResource) -> usize {
    tree.files
        .iter()
        .map(|file| {
            let encoded = |text: &Option<String>| {
                text.as_ref().map_or(0, |text| {
                    serde_json::to_string(text).map_or(text.len(), |json| json.len())
                })
            };
            file.path.len() + encoded(&file.content) + encoded(&file.content_base64)
        })
        .sum()
}

fn refuse_with_absent(fields: &[(&str, bool)]) -> Result<(), String> {
    let given: Vec<&str> = fields
        .iter()
        .filter(|(_, is_set)| *is_set)
        .map(|(name, _)| *name)
        .collect();
    if given.is_empty() {
        return Ok(());
    }
    Err(format!("{} cannot go with state absent", given.join(", ")))
}

fn check_attributes(
    mode: Option<&str>,
    owner: Option<&str>,
    group: Option<&str>,
) -> Result<(), String> {
    if let Some(mode) = mode {
        parse_mode(mode)?;
    }
    for (field, name) in [("owner", owner), ("group", group)] {
        if let Some(name) = name {
            check_account_name(field, name)?;
        }
    }
    Ok(())
}

/// A user or group name, or a numeric id. u32::MAX is refused: to chown it means "leave as is".
fn check_account_name(field: &str, name: &str) -> Result<(), String> {
    if name.bytes().all(|byte| byte.is_ascii_digit()) && !name.is_empty() {
        return match name.parse::<u32>() {
            Ok(id) if id != u32::MAX => Ok(()),
            _ => Err(format!("{field} id {name} is out of range")),
        };
    }
    let is_valid = !name.is_empty()
        && !name.starts_with('-')
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == ':' || c == '/');
    if is_valid {
        Ok(())
    } else {
        Err(format!(
            "{field} '{name}' is not a valid name or numeric id"
        ))
    }
}

/// Package names become arguments of apt-get and dnf: a leading `-` would be an option, and
/// version or glob syntax would make "installed?" ambiguous, so only plain names (with an
/// optional architecture: `libc6:amd64`, `glibc.x86_64`) are accepted.
fn check_package_name(name: &str) -> Result<(), String> {
    let is_valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+-_:".contains(c));
    if is_valid {
        Ok(())
    } else {
        Err(format!(
            "package name '{name}' must start with a letter or digit and use only letters, \
             digits and . + - _ :"
        ))
    }
}

/// A version pin becomes part of an argument (`name=version` for apt, `name-version` for dnf):
/// the characters of Debian and RPM versions only (epoch `:`, `~`, `^`, `+`), no globs, no
/// leading `-`.
fn check_package_version(version: &str) -> Result<(), String> {
    let is_valid = version
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+-_:~^".contains(c));
    if is_valid {
        Ok(())
    } else {
        Err(format!(
            "version '{version}' must start with a letter or digit and use only letters, digits \
             and . + - _ : ~ ^"
        ))
    }
}

/// Service names become arguments of systemctl: systemd unit name characters only, no
/// leading `-`.
fn check_service_name(name: &str) -> Result<(), String> {
    let is_valid = name.chars().next().is_some_and(|c| c != '-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ":-_.\\@".contains(c));
    if is_valid {
        Ok(())
    } else {
        Err(format!(
            "service name '{name}' must be a systemd unit name (letters, digits and : - _ . \\ @)"
        ))
    }
}

fn check_shell_text(field: &str, text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err(format!("{field} must not be empty"));
    }
    if text.contains('\0') {
        return Err(format!("{field} must not contain NUL"));
    }
    Ok(())
}

fn check_user(user: &UserResource) -> Result<(), String> {
    check_login_name("name", &user.name)?;
    if user.state == Some(Presence::Absent) {
        return refuse_with_absent(&[
            ("uid", user.uid.is_some()),
            ("gid", user.gid.is_some()),
            ("groups", user.groups.is_some()),
            ("home", user.home.is_some()),
            ("shell", user.shell.is_some()),
            ("system", user.system.is_some()),
            ("comment", user.comment.is_some()),
        ]);
    }
    if user.uid == Some(u32::MAX) {
        return Err("uid 4294967295 is out of range (it means \"no user\")".into());
    }
    if let Some(gid) = &user.gid {
        check_group_reference("gid", gid)?;
    }
    for group in user.groups.iter().flatten() {
        check_group_reference("groups", group)?;
    }
    if let Some(home) = &user.home {
        check_path("home", home)?;
    }
    if let Some(shell) = &user.shell {
        check_path("shell", shell)?;
    }
    if let Some(comment) = &user.comment {
        // The fields of /etc/passwd are separated by ':' and its entries by newlines.
        if comment.contains([':', '\n', '\r', '\0']) {
            return Err("comment must not contain ':', a newline or NUL".into());
        }
    }
    Ok(())
}

/// A user or group name as useradd and groupadd accept it everywhere: a letter or `_` first (so
/// it cannot be taken for an option or a numeric id), then letters, digits, `.`, `_` and `-`,
/// and an optional final `$` (Samba machine accounts); at most 32 characters.
pub(super) fn check_login_name(field: &str, name: &str) -> Result<(), String> {
    let body = name.strip_suffix('$').unwrap_or(name);
    let is_valid = name.len() <= 32
        && body
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && body
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if is_valid {
        Ok(())
    } else {
        Err(format!(
            "{field} '{name}' is not a valid account name (a letter or _ first, then letters, \
             digits, . _ -; at most 32 characters)"
        ))
    }
}

fn check_cron(cron: &CronResource) -> Result<(), String> {
    let name = cron.name.as_str();
    if name.trim().is_empty() || name.trim() != name || name.contains(['\n', '\r', '\0']) {
        return Err(format!(
            "name '{name}' must be one line of text without leading or trailing spaces (it is \
             the entry's marker comment)"
        ));
    }
    if let Some(user) = &cron.user {
        check_login_name("user", user)?;
    }
    if let Some(file) = &cron.file {
        check_path("file", file)?;
        // cron skips files of /etc/cron.d whose names have other characters (a dot, say),
        // which would make the entry silently dead.
        if let Some(file_name) = file.strip_prefix("/etc/cron.d/") {
            let is_run_parts_name = file_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !is_run_parts_name {
                return Err(format!(
                    "file '{file}': cron ignores files in /etc/cron.d whose names have \
                     characters other than letters, digits, _ and -"
                ));
            }
        }
    }
    if cron.state == Some(Presence::Absent) {
        return refuse_with_absent(&[
            ("schedule", !cron.schedule.is_empty()),
            ("run", !cron.run.is_empty()),
        ]);
    }
    if cron.schedule.trim().is_empty() {
        return Err("schedule is required (\"0 3 * * *\" or a keyword such as @daily)".into());
    }
    check_schedule(&cron.schedule)?;
    check_shell_text("run", &cron.run)?;
    if cron.run.contains(['\n', '\r']) {
        return Err("run must be one line (a crontab entry is a line)".into());
    }
    Ok(())
}

fn check_sysctl(sysctl: &SysctlResource) -> Result<(), String> {
    // The name becomes a path under /proc/sys: no empty, `.` or `..` parts can reach out of it.
    let name = sysctl.name.as_str();
    let is_valid = name.split('.').all(|part| {
        !part.is_empty()
            && !part.starts_with('-')
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    });
    if !is_valid {
        return Err(format!(
            "name '{name}' must be dotted parts of letters, digits, _ and - (net.ipv4.ip_forward)"
        ));
    }
    if sysctl.value.trim().is_empty() {
        return Err("value must not be empty".into());
    }
    if sysctl.value.contains(['\n', '\r', '\0']) {
        return Err("value must be one line".into());
    }
    if let Some(file) = &sysctl.file {
        check_path("file", file)?;
    }
    Ok(())
}

/// The marker of a `line` block without `marker:`.
pub(super) const DEFAULT_BLOCK_MARKER: &str = "# {mark} svc managed block";

/// The BEGIN and END lines of a block.
pub(super) fn block_markers(marker: Option<&str>) -> (String, String) {
    let marker = marker.unwrap_or(DEFAULT_BLOCK_MARKER);
    (
        marker.replace("{mark}", "BEGIN"),
        marker.replace("{mark}", "END"),
    )
}

fn check_line(line: &LineResource) -> Result<(), String> {
    check_path("path", &line.path)?;
    let is_absent = line.state == Some(Presence::Absent);
    if is_absent && line.create.is_some() {
        return Err("create cannot go with state absent".into());
    }
    let is_block = line.block.is_some() || line.marker.is_some();
    if is_block {
        if line.line.is_some() || line.pattern.is_some() {
            return Err(
                "line and match cannot go with block or marker (one resource is one line or \
                 one block)"
                    .into(),
            );
        }
        if let Some(marker) = &line.marker {
            if !marker.contains("{mark}") || marker.contains(['\n', '\r', '\0']) {
                return Err(format!(
                    "marker '{marker}' must be one line containing {{mark}} (BEGIN and END \
                     take its place)"
                ));
            }
        }
        let (begin, end) = block_markers(line.marker.as_deref());
        match &line.block {
            None if !is_absent => Err("block is required (the lines between the markers)".into()),
            Some(block) if block.contains('\0') => Err("block must not contain NUL".into()),
            Some(block) if block.lines().any(|text| text == begin || text == end) => {
                Err("block must not contain its own marker lines".into())
            }
            _ => Ok(()),
        }
    } else {
        if let Some(text) = &line.line {
            if text.is_empty() {
                return Err("line must not be empty".into());
            }
            if text.contains(['\n', '\0']) {
                return Err("line must be one line (block: takes several)".into());
            }
        }
        if let Some(pattern) = &line.pattern {
            if pattern.is_empty() {
                return Err("match must not be empty".into());
            }
            regex::Regex::new(pattern)
                .map_err(|error| format!("match '{pattern}' is not a valid regex: {error}"))?;
        }
        match (&line.line, &line.pattern) {
            (None, None) if is_absent => Err("give line or match (what to remove)".into()),
            (None, _) if !is_absent => {
                Err("line is required (or block, for a block of lines)".into())
            }
            _ => Ok(()),
        }
    }
}

/// The keywords cron takes instead of five fields.
const CRON_KEYWORDS: &[&str] = &[
    "@reboot",
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
];

/// Five fields (minute hour day-of-month month day-of-week), each a list of `*`, values and
/// ranges with optional `/step`, or one keyword. Names (jan, mon) are taken in the last two.
pub(super) fn check_schedule(schedule: &str) -> Result<(), String> {
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    if let [keyword] = fields[..] {
        if keyword.starts_with('@') {
            if CRON_KEYWORDS.contains(&keyword) {
                return Ok(());
            }
            return Err(format!(
                "schedule '{schedule}': unknown keyword (expected one of {})",
                CRON_KEYWORDS.join(", ")
            ));
        }
    }
    if fields.len() != 5 {
        return Err(format!(
            "schedule '{schedule}' must have 5 fields (minute hour day-of-month month \
             day-of-week) or be a keyword such as @daily"
        ));
    }
    const MONTHS: &[&str] = &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    const DAYS: &[&str] = &["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
    let limits: [(&str, u32, u32, &[&str]); 5] = [
        ("minute", 0, 59, &[]),
        ("hour", 0, 23, &[]),
        ("day of month", 1, 31, &[]),
        ("month", 1, 12, MONTHS),
        ("day of week", 0, 7, DAYS),
    ];
    for (field, (what, low, high, names)) in fields.iter().zip(limits) {
        let is_valid = field.split(',').all(|item| {
            let (range, step) = match item.split_once('/') {
                Some((range, step)) => (range, Some(step)),
                None => (item, None),
            };
            let value = |text: &str| -> Option<u32> {
                let number = match text.parse::<u32>() {
                    Ok(number) => number,
                    // Names count from the first: jan is 1, sun is 0.
                    Err(_) => {
                        let index = names
                            .iter()
                            .position(|name| name.eq_ignore_ascii_case(text))?;
                        index as u32 + low
                    }
                };
                (low..=high).contains(&number).then_some(number)
            };
            let is_range_valid = match range.split_once('-') {
                _ if range == "*" => true,
                Some((first, last)) => {
                    matches!((value(first), value(last)), (Some(a), Some(b)) if a <= b)
                }
                None => value(range).is_some(),
            };
            let is_step_valid =
                step.is_none_or(|step| step.parse::<u32>().is_ok_and(|step| step >= 1));
            is_range_valid && is_step_valid
        });
        if !is_valid {
            return Err(format!(
                "schedule '{schedule}': {what} '{field}' is not valid (values {low}-{high}, \
                 *, ranges a-b, lists a,b and steps /n)"
            ));
        }
    }
    Ok(())
}

/// A group as a user's gid or groups names it: a group name or a numeric gid.
fn check_group_reference(field: &str, text: &str) -> Result<(), String> {
    if !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()) {
        return match text.parse::<u32>() {
            Ok(id) if id != u32::MAX => Ok(()),
            _ => Err(format!("{field}: gid {text} is out of range")),
        };
    }
    check_login_name(field, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each case passes `check_resource` (None) or fails with a message containing the text.
    fn expect_rules<T: Clone + std::fmt::Debug>(
        cases: Vec<(T, Option<&str>)>,
        resource: fn(T) -> Resource,
    ) {
        for (case, expected) in cases {
            let result = check_resource(&resource(case.clone()));
            match expected {
                None => assert_eq!(result, Ok(()), "{case:?}"),
                Some(part) => {
                    let message = result.expect_err(part);
                    assert!(message.contains(part), "{message:?} lacks {part:?}");
                }
            }
        }
    }
    use crate::state::GroupResource;
    use crate::state::{
        CommandResource, DirectoryResource, PackageResource, ServiceResource, SymlinkResource,
    };

    #[test]
    fn modes() {
        let cases = [
            ("0644", Some(0o644)),
            ("644", Some(0o644)),
            ("0o755", Some(0o755)),
            ("4755", Some(0o4755)),
            ("0", Some(0)),
            ("007777", Some(0o7777)),
            ("8", None),
            ("0x1f", None),
            ("", None),
            ("0o", None),
            ("17777", None),
            ("+644", None),
            ("rw-r--r--", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_mode(text).ok(), expected, "{text}");
        }
        assert_eq!(format_mode(0o644), "0644");
        assert_eq!(format_mode(0o4755), "4755");
    }

    fn file(path: &str) -> FileResource {
        FileResource {
            path: path.into(),
            ..FileResource::default()
        }
    }

    #[test]
    fn resource_rules() {
        let cases: Vec<(Resource, Option<&str>)> = vec![
            (Resource::File(file("/etc/motd")), None),
            (
                Resource::File(file("etc/motd")),
                Some("path must be absolute"),
            ),
            (
                Resource::File(file("/etc//motd")),
                Some("must be normalized"),
            ),
            (
                Resource::File(file("/etc/../motd")),
                Some("must be normalized"),
            ),
            (
                Resource::File(file("/etc/motd/")),
                Some("must be normalized"),
            ),
            (Resource::File(file("/")), Some("must be normalized")),
            (
                Resource::File(FileResource {
                    content: Some("a".into()),
                    source: Some("a.txt".into()),
                    ..file("/a")
                }),
                Some("content and source are mutually exclusive"),
            ),
            (
                Resource::File(FileResource {
                    content_base64: Some("not base64!".into()),
                    ..file("/a")
                }),
                Some("not valid base64"),
            ),
            (
                Resource::File(FileResource {
                    mode: Some("0999".into()),
                    ..file("/a")
                }),
                Some("mode '0999' is not an octal file mode"),
            ),
            (
                Resource::File(FileResource {
                    owner: Some("1000".into()),
                    group: Some("www-data".into()),
                    ..file("/a")
                }),
                None,
            ),
            (
                Resource::File(FileResource {
                    owner: Some("4294967295".into()),
                    ..file("/a")
                }),
                Some("out of range"),
            ),
            (
                Resource::File(FileResource {
                    group: Some("a b".into()),
                    ..file("/a")
                }),
                Some("group 'a b' is not a valid name"),
            ),
            (
                Resource::File(FileResource {
                    state: Some(Presence::Absent),
                    mode: Some("0644".into()),
                    ..file("/a")
                }),
                Some("mode cannot go with state absent"),
            ),
            (
                Resource::Directory(DirectoryResource {
                    path: "/srv/app".into(),
                    mode: Some("750".into()),
                    ..DirectoryResource::default()
                }),
                None,
            ),
            (
                Resource::Symlink(SymlinkResource {
                    path: "/a".into(),
                    ..SymlinkResource::default()
                }),
                Some("target is required"),
            ),
            (
                Resource::Symlink(SymlinkResource {
                    path: "/a".into(),
                    target: "../relative/is/fine".into(),
                    state: None,
                }),
                None,
            ),
            (
                Resource::Symlink(SymlinkResource {
                    path: "/a".into(),
                    target: "/b".into(),
                    state: Some(Presence::Absent),
                }),
                Some("target cannot go with state absent"),
            ),
            (
                Resource::Package(PackageResource {
                    name: "libc6:amd64".into(),
                    state: Some(super::super::PackageState::Absent),
                    version: None,
                }),
                None,
            ),
            (
                Resource::Package(PackageResource {
                    name: "-y".into(),
                    state: None,
                    version: None,
                }),
                Some("package name '-y'"),
            ),
            (
                Resource::Package(PackageResource {
                    name: "nginx".into(),
                    state: None,
                    version: Some("1:1.22.1-9+deb12u1~bpo".into()),
                }),
                None,
            ),
            (
                Resource::Package(PackageResource {
                    name: "nginx".into(),
                    state: None,
                    version: Some("-1".into()),
                }),
                Some("version '-1' must start with a letter or digit"),
            ),
            (
                Resource::Package(PackageResource {
                    name: "nginx".into(),
                    state: None,
                    version: Some("1 2".into()),
                }),
                Some("version '1 2'"),
            ),
            (
                Resource::Package(PackageResource {
                    name: "nginx".into(),
                    state: Some(super::super::PackageState::Absent),
                    version: Some("1".into()),
                }),
                Some("version cannot go with state absent"),
            ),
            (
                Resource::Service(ServiceResource {
                    name: "nginx".into(),
                    state: Some(ServiceState::Running),
                    enabled: None,
                }),
                None,
            ),
            (
                Resource::Service(ServiceResource {
                    name: "getty@tty1.service".into(),
                    state: None,
                    enabled: Some(true),
                }),
                None,
            ),
            (
                Resource::Service(ServiceResource {
                    name: "nginx".into(),
                    state: None,
                    enabled: None,
                }),
                Some("nothing to manage"),
            ),
            (
                Resource::Command(CommandResource {
                    run: "  ".into(),
                    ..CommandResource::default()
                }),
                Some("run must not be empty"),
            ),
            (
                Resource::Command(CommandResource {
                    run: "make".into(),
                    creates: Some("build/out".into()),
                    ..CommandResource::default()
                }),
                Some("creates must be absolute"),
            ),
            (
                Resource::Command(CommandResource {
                    run: "make".into(),
                    timeout: Some("soon".into()),
                    ..CommandResource::default()
                }),
                Some("timeout 'soon'"),
            ),
            (
                Resource::Command(CommandResource {
                    run: "make".into(),
                    unless: Some("test -e /x".into()),
                    timeout: Some("90s".into()),
                    creates: Some("/x".into()),
                }),
                None,
            ),
        ];
        for (resource, expected) in cases {
            let result = check_resource(&resource);
            match expected {
                None => assert_eq!(result, Ok(()), "{resource:?}"),
                Some(part) => {
                    let message = result.expect_err(part);
                    assert!(message.contains(part), "{message:?} lacks {part:?}");
                }
            }
        }
    }

    #[test]
    fn validate_rejects_leftover_source() {
        let plan = Plan {
            resources: vec![
                Resource::File(file("/etc/hosts")),
                Resource::File(FileResource {
                    source: Some("motd.txt".into()),
                    ..file("/etc/motd")
                }),
            ],
            ..Plan::default()
        };
        assert_eq!(
            validate(&plan),
            Err(
                "resource 2 (file:/etc/motd): source must be compiled by svcctl state \
                 (`svcctl state compile` inlines it)"
                    .into()
            )
        );
    }

    #[test]
    fn validate_accepts_an_empty_plan_and_caps_contents() {
        assert_eq!(validate(&Plan::default()), Ok(()));
        let half = "x".repeat(MAX_CONTENT_BYTES / 2);
        let plan = Plan {
            resources: vec![
                Resource::File(FileResource {
                    content: Some(half.clone()),
                    ..file("/a")
                }),
                Resource::File(FileResource {
                    content: Some(half),
                    ..file("/b")
                }),
            ],
            ..Plan::default()
        };
        let error = validate(&plan).unwrap_err();
        assert!(error.contains("more than the 48 MiB"), "{error}");
    }

    #[test]
    fn json_escapes_count_against_the_budget() {
        let quotes = FileResource {
            content: Some("\"".repeat(10)),
            ..file("/a")
        };
        assert_eq!(encoded_content_size(&quotes), 22);
    }

    #[test]
    fn user_rules() {
        let user = |name: &str| UserResource {
            name: name.into(),
            ..UserResource::default()
        };
        let cases: Vec<(UserResource, Option<&str>)> = vec![
            (user("app"), None),
            (user("_apt"), None),
            (user("svc.web-1"), None),
            (user("machine$"), None),
            (user("-r"), Some("name '-r' is not a valid account name")),
            (
                user("1000"),
                Some("name '1000' is not a valid account name"),
            ),
            (user("a b"), Some("not a valid account name")),
            (user("a:b"), Some("not a valid account name")),
            (user(""), Some("not a valid account name")),
            (user(&"a".repeat(33)), Some("at most 32 characters")),
            (
                UserResource {
                    uid: Some(1500),
                    gid: Some("100".into()),
                    groups: Some(vec!["adm".into(), "27".into()]),
                    home: Some("/srv/app".into()),
                    shell: Some("/bin/bash".into()),
                    system: Some(true),
                    comment: Some("App, Room 1".into()),
                    ..user("app")
                },
                None,
            ),
            (
                UserResource {
                    gid: Some("-g".into()),
                    ..user("app")
                },
                Some("gid '-g' is not a valid account name"),
            ),
            (
                UserResource {
                    groups: Some(vec!["adm,sudo".into()]),
                    ..user("app")
                },
                Some("groups 'adm,sudo' is not a valid account name"),
            ),
            (
                UserResource {
                    uid: Some(u32::MAX),
                    ..user("app")
                },
                Some("uid 4294967295 is out of range"),
            ),
            (
                UserResource {
                    home: Some("home/app".into()),
                    ..user("app")
                },
                Some("home must be absolute"),
            ),
            (
                UserResource {
                    shell: Some("bash".into()),
                    ..user("app")
                },
                Some("shell must be absolute"),
            ),
            (
                UserResource {
                    comment: Some("a:b".into()),
                    ..user("app")
                },
                Some("comment must not contain ':'"),
            ),
            (
                UserResource {
                    state: Some(Presence::Absent),
                    shell: Some("/bin/sh".into()),
                    uid: Some(1),
                    ..user("app")
                },
                Some("uid, shell cannot go with state absent"),
            ),
        ];
        expect_rules(cases, Resource::User);
    }

    #[test]
    fn group_rules() {
        let group = |name: &str| GroupResource {
            name: name.into(),
            ..GroupResource::default()
        };
        let cases: Vec<(GroupResource, Option<&str>)> = vec![
            (group("deploy"), None),
            (
                GroupResource {
                    gid: Some(1600),
                    system: Some(true),
                    ..group("deploy")
                },
                None,
            ),
            (
                group("--help"),
                Some("name '--help' is not a valid account name"),
            ),
            (
                GroupResource {
                    gid: Some(u32::MAX),
                    ..group("deploy")
                },
                Some("gid 4294967295 is out of range"),
            ),
            (
                GroupResource {
                    state: Some(Presence::Absent),
                    system: Some(true),
                    ..group("deploy")
                },
                Some("system cannot go with state absent"),
            ),
        ];
        expect_rules(cases, Resource::Group);
    }

    #[test]
    fn schedules() {
        let cases = [
            ("0 3 * * *", None),
            ("*/15 * * * *", None),
            ("0 8-18/2 1,15 jan-jun mon-fri", None),
            ("0 0 * * 7", None),
            ("0 0 * DEC Sun", None),
            ("@daily", None),
            ("@reboot", None),
            ("@fortnightly", Some("unknown keyword")),
            ("0 3 * *", Some("must have 5 fields")),
            ("0 3 * * * *", Some("must have 5 fields")),
            ("60 * * * *", Some("minute '60' is not valid")),
            ("* 24 * * *", Some("hour '24' is not valid")),
            ("* * 0 * *", Some("day of month '0' is not valid")),
            ("* * * 13 *", Some("month '13' is not valid")),
            ("* * * * 8", Some("day of week '8' is not valid")),
            ("5-1 * * * *", Some("minute '5-1' is not valid")),
            ("*/0 * * * *", Some("minute '*/0' is not valid")),
            ("1,,2 * * * *", Some("minute '1,,2' is not valid")),
            ("* * * * mon-", Some("day of week 'mon-' is not valid")),
            ("* * * * monday", Some("day of week 'monday' is not valid")),
            ("* * jan * *", Some("day of month 'jan' is not valid")),
        ];
        for (schedule, expected) in cases {
            match (check_schedule(schedule), expected) {
                (Ok(()), None) => {}
                (Err(message), Some(part)) if message.contains(part) => {}
                (result, _) => panic!("{schedule:?}: {result:?}, want {expected:?}"),
            }
        }
    }

    #[test]
    fn cron_rules() {
        let cron = |name: &str| CronResource {
            name: name.into(),
            schedule: "@daily".into(),
            run: "/usr/local/bin/backup".into(),
            ..CronResource::default()
        };
        let absent = |name: &str| CronResource {
            name: name.into(),
            state: Some(Presence::Absent),
            ..CronResource::default()
        };
        let cases: Vec<(CronResource, Option<&str>)> = vec![
            (cron("nightly backup"), None),
            (
                CronResource {
                    user: Some("www-data".into()),
                    file: Some("/etc/cron.d/app_backup-1".into()),
                    ..cron("b")
                },
                None,
            ),
            (absent("b"), None),
            (cron(""), Some("name '' must be one line")),
            (cron(" b"), Some("without leading or trailing spaces")),
            (cron("a\nb"), Some("must be one line")),
            (
                CronResource {
                    schedule: String::new(),
                    ..cron("b")
                },
                Some("schedule is required"),
            ),
            (
                CronResource {
                    run: String::new(),
                    ..cron("b")
                },
                Some("run must not be empty"),
            ),
            (
                CronResource {
                    run: "a\nb".into(),
                    ..cron("b")
                },
                Some("run must be one line"),
            ),
            (
                CronResource {
                    user: Some("-u".into()),
                    ..cron("b")
                },
                Some("user '-u' is not a valid account name"),
            ),
            (
                CronResource {
                    file: Some("cron.d/b".into()),
                    ..cron("b")
                },
                Some("file must be absolute"),
            ),
            (
                CronResource {
                    file: Some("/etc/cron.d/backup.cron".into()),
                    ..cron("b")
                },
                Some("cron ignores files in /etc/cron.d"),
            ),
            (
                CronResource {
                    schedule: "@daily".into(),
                    ..absent("b")
                },
                Some("schedule cannot go with state absent"),
            ),
        ];
        expect_rules(cases, Resource::Cron);
    }

    #[test]
    fn sysctl_rules() {
        let sysctl = |name: &str, value: &str| SysctlResource {
            name: name.into(),
            value: value.into(),
            ..SysctlResource::default()
        };
        let cases: Vec<(SysctlResource, Option<&str>)> = vec![
            (sysctl("net.ipv4.ip_forward", "1"), None),
            (sysctl("net.ipv4.conf.eth-0.rp_filter", "2"), None),
            (sysctl("net.ipv4.tcp_rmem", "4096 87380 6291456"), None),
            (
                SysctlResource {
                    file: Some("/etc/sysctl.d/60-app.conf".into()),
                    runtime: Some(false),
                    ..sysctl("vm.swappiness", "10")
                },
                None,
            ),
            (
                sysctl("net..ipv4", "1"),
                Some("name 'net..ipv4' must be dotted parts"),
            ),
            (sysctl("net.ipv4.", "1"), Some("must be dotted parts")),
            (
                sysctl("net/ipv4/ip_forward", "1"),
                Some("must be dotted parts"),
            ),
            (sysctl("-w", "1"), Some("must be dotted parts")),
            (
                sysctl("net.ipv4.ip_forward", " "),
                Some("value must not be empty"),
            ),
            (
                sysctl("net.ipv4.ip_forward", "1\n2"),
                Some("value must be one line"),
            ),
            (
                SysctlResource {
                    file: Some("sysctl.conf".into()),
                    ..sysctl("vm.swappiness", "10")
                },
                Some("file must be absolute"),
            ),
        ];
        expect_rules(cases, Resource::Sysctl);
    }

    #[test]
    fn line_rules() {
        let form = |line: Option<&str>, pattern: Option<&str>| LineResource {
            path: "/etc/ssh/sshd_config".into(),
            line: line.map(str::to_string),
            pattern: pattern.map(str::to_string),
            ..LineResource::default()
        };
        let block = |text: &str| LineResource {
            path: "/etc/hosts".into(),
            block: Some(text.into()),
            ..LineResource::default()
        };
        let absent = |resource: LineResource| LineResource {
            state: Some(Presence::Absent),
            ..resource
        };
        let cases: Vec<(LineResource, Option<&str>)> = vec![
            (form(Some("PermitRootLogin no"), None), None),
            (
                form(Some("PermitRootLogin no"), Some("^#?PermitRootLogin\\s")),
                None,
            ),
            (absent(form(None, Some("^PermitRootLogin"))), None),
            (absent(form(Some("PermitRootLogin yes"), None)), None),
            (block("10.0.0.1 db\n10.0.0.2 cache\n"), None),
            (
                LineResource {
                    marker: Some("; {mark} app".into()),
                    ..block("")
                },
                None,
            ),
            (absent(block("anything")), None),
            (
                LineResource {
                    create: Some(true),
                    ..block("x")
                },
                None,
            ),
            (form(None, None), Some("line is required")),
            (form(None, Some("^x")), Some("line is required")),
            (absent(form(None, None)), Some("give line or match")),
            (form(Some(""), None), Some("line must not be empty")),
            (form(Some("a\nb"), None), Some("line must be one line")),
            (form(Some("a"), Some("")), Some("match must not be empty")),
            (
                form(Some("a"), Some("(unclosed")),
                Some("match '(unclosed' is not a valid regex"),
            ),
            (
                LineResource {
                    line: Some("a".into()),
                    ..block("b")
                },
                Some("line and match cannot go with block or marker"),
            ),
            (
                LineResource {
                    marker: Some("# svc".into()),
                    ..block("b")
                },
                Some("marker '# svc' must be one line containing {mark}"),
            ),
            (
                LineResource {
                    marker: Some("# {mark}".into()),
                    ..LineResource {
                        path: "/etc/hosts".into(),
                        ..LineResource::default()
                    }
                },
                Some("block is required"),
            ),
            (
                block("a\n# END svc managed block\n"),
                Some("block must not contain its own marker lines"),
            ),
            (
                LineResource {
                    create: Some(false),
                    ..absent(form(Some("a"), None))
                },
                Some("create cannot go with state absent"),
            ),
            (
                LineResource {
                    path: "etc/hosts".into(),
                    ..block("x")
                },
                Some("path must be absolute"),
            ),
        ];
        expect_rules(cases, Resource::Line);
    }

    const KEY: &str =
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\nmQINBGR0ZXN0\n-----END PGP PUBLIC KEY BLOCK-----\n";

    fn apt() -> crate::state::AptRepository {
        crate::state::AptRepository {
            uri: "https://deb.example.com/debian".into(),
            suite: "bookworm".into(),
            components: vec!["main".into()],
            ..Default::default()
        }
    }

    fn yum() -> YumRepository {
        YumRepository {
            baseurl: "https://rpm.example.com/el9/".into(),
            ..Default::default()
        }
    }

    #[test]
    fn pkgrepo_rules() {
        let repo = |apt: Option<crate::state::AptRepository>, yum: Option<YumRepository>| {
            PkgrepoResource {
                name: "example".into(),
                apt,
                yum,
                ..PkgrepoResource::default()
            }
        };
        let cases: Vec<(PkgrepoResource, Option<&str>)> =
            vec![
            (repo(Some(apt()), None), None),
            (repo(None, Some(yum())), None),
            (repo(Some(apt()), Some(yum())), None),
            (repo(None, None), Some("give an apt block, a yum block or both")),
            (
                PkgrepoResource {
                    name: "../etc/passwd".into(),
                    ..repo(Some(apt()), None)
                },
                Some("name '../etc/passwd' must start with a letter or digit"),
            ),
            (
                PkgrepoResource {
                    name: "a b".into(),
                    ..repo(Some(apt()), None)
                },
                Some("name 'a b'"),
            ),
            (
                PkgrepoResource {
                    dir: Some("etc/apt".into()),
                    ..repo(Some(apt()), None)
                },
                Some("dir must be absolute"),
            ),
            (
                PkgrepoResource {
                    keyring_dir: Some("/etc/apt/keyrings/".into()),
                    ..repo(Some(apt()), None)
                },
                Some("keyring_dir '/etc/apt/keyrings/' must be normalized"),
            ),
            (
                PkgrepoResource {
                    state: Some(Presence::Absent),
                    ..repo(None, None)
                },
                None,
            ),
            (
                PkgrepoResource {
                    state: Some(Presence::Absent),
                    refresh: Some(true),
                    ..repo(Some(apt()), None)
                },
                Some("apt, refresh cannot go with state absent"),
            ),
            (
                PkgrepoResource {
                    refresh: Some(true),
                    ..repo(None, Some(yum()))
                },
                Some("refresh applies to apt sources only"),
            ),
            (
                repo(
                    Some(crate::state::AptRepository {
                        uri: "https://x/ bookworm main\nTypes: deb-src".into(),
                        ..apt()
                    }),
                    None,
                ),
                Some("apt.uri 'https://x/ bookworm main\\nTypes: deb-src' must not contain spaces"),
            ),
            (
                repo(
                    Some(crate::state::AptRepository {
                        uri: "deb.example.com".into(),
                        ..apt()
                    }),
                    None,
                ),
                Some("apt.uri 'deb.example.com' is not a URI"),
            ),
            (
                repo(
                    Some(crate::state::AptRepository {
                        components: vec![],
                        ..apt()
                    }),
                    None,
                ),
                Some("apt.components: give at least one"),
            ),
            (
                repo(
                    Some(crate::state::AptRepository {
                        suite: "./".into(),
                        ..apt()
                    }),
                    None,
                ),
                Some("apt.suite './' is a flat repository"),
            ),
            (
                repo(
                    Some(crate::state::AptRepository {
                        suite: "./".into(),
                        components: vec![],
                        ..apt()
                    }),
                    None,
                ),
                None,
            ),
            (
                repo(
                    Some(crate::state::AptRepository {
                        components: vec!["main contrib".into()],
                        ..apt()
                    }),
                    None,
                ),
                Some("apt.components 'main contrib' must not contain spaces"),
            ),
            (
                repo(
                    Some(crate::state::AptRepository {
                        arch: Some("AMD64".into()),
                        ..apt()
                    }),
                    None,
                ),
                Some("apt.arch 'AMD64' is not an architecture name"),
            ),
            (
                repo(
                    Some(crate::state::AptRepository {
                        key: Some(KEY.into()),
                        arch: Some("arm64".into()),
                        ..apt()
                    }),
                    None,
                ),
                None,
            ),
            (
                repo(
                    Some(crate::state::AptRepository {
                        key: Some("mQINBGR0ZXN0".into()),
                        ..apt()
                    }),
                    None,
                ),
                Some("apt.key must be an ASCII-armoured public key"),
            ),
            (
                repo(
                    Some(crate::state::AptRepository {
                        key: Some(KEY.into()),
                        key_source: Some("key.asc".into()),
                        ..apt()
                    }),
                    None,
                ),
                Some("apt.key and key_source are mutually exclusive"),
            ),
            (
                repo(
                    None,
                    Some(YumRepository {
                        baseurl: "rpm.example.com".into(),
                        ..yum()
                    }),
                ),
                Some("yum.baseurl 'rpm.example.com' is not a URL"),
            ),
            (
                repo(
                    None,
                    Some(YumRepository {
                        gpgkey: Some("https://rpm.example.com/key.asc".into()),
                        ..yum()
                    }),
                ),
                None,
            ),
            (
                repo(
                    None,
                    Some(YumRepository {
                        gpgkey: Some("RPM-GPG-KEY-example".into()),
                        ..yum()
                    }),
                ),
                Some("yum.gpgkey must be an ASCII-armoured public key or a URL"),
            ),
        ];
        expect_rules(cases, Resource::Pkgrepo);
    }

    #[test]
    fn pkgrepo_keys_are_compiled_and_counted() {
        let uncompiled = PkgrepoResource {
            name: "example".into(),
            yum: Some(YumRepository {
                key_source: Some("key.asc".into()),
                ..yum()
            }),
            ..PkgrepoResource::default()
        };
        let plan = Plan::of(vec![Resource::Pkgrepo(uncompiled)]);
        assert_eq!(
            validate(&plan),
            Err(
                "resource 1 (pkgrepo:example): key_source must be compiled by svcctl state \
                 (`svcctl state compile` inlines it)"
                    .into()
            )
        );
        let big = PkgrepoResource {
            name: "example".into(),
            apt: Some(crate::state::AptRepository {
                key: Some(format!("{KEY}{}", "x".repeat(MAX_CONTENT_BYTES))),
                ..apt()
            }),
            ..PkgrepoResource::default()
        };
        let error = validate(&Plan::of(vec![Resource::Pkgrepo(big)])).unwrap_err();
        assert!(error.contains("more than the 48 MiB"), "{error}");
    }

    #[test]
    fn archive_rules() {
        let digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let archive = |url: Option<&str>| ArchiveResource {
            path: "/opt/tool".into(),
            url: url.map(str::to_string),
            sha256: digest.into(),
            ..ArchiveResource::default()
        };
        let cases: Vec<(ArchiveResource, Option<&str>)> = vec![
            (archive(Some("https://example.com/tool-1.2.tar.gz")), None),
            (archive(Some("http://10.0.0.5:8080/tool.zip?v=2")), None),
            (
                ArchiveResource {
                    content_base64: Some("AAEC".into()),
                    sha256: digest.to_uppercase(),
                    ..archive(None)
                },
                None,
            ),
            (
                archive(None),
                Some("give source (an archive beside the state file) or url"),
            ),
            (
                ArchiveResource {
                    source: Some("tool.tar.gz".into()),
                    ..archive(Some("https://example.com/tool.tar.gz"))
                },
                Some("source and url are mutually exclusive"),
            ),
            (
                ArchiveResource {
                    source: Some(String::new()),
                    ..archive(None)
                },
                Some("source must not be empty"),
            ),
            (
                ArchiveResource {
                    content_base64: Some("not base64!".into()),
                    ..archive(None)
                },
                Some("not valid base64"),
            ),
            (
                archive(Some("ftp://example.com/tool.tar")),
                Some("url 'ftp://example.com/tool.tar' must start with https:// or http://"),
            ),
            (
                archive(Some("https://user:secret@example.com/tool.tar")),
                Some("has credentials, which are not supported"),
            ),
            (
                archive(Some("https://exa mple.com/tool.tar")),
                Some("is not a valid URL"),
            ),
            (
                ArchiveResource {
                    sha256: "abc".into(),
                    ..archive(Some("https://example.com/a.tar"))
                },
                Some("sha256 'abc' is not a SHA-256 digest"),
            ),
            (
                ArchiveResource {
                    sha256: format!("{}g", &digest[1..]),
                    ..archive(Some("https://example.com/a.tar"))
                },
                Some("is not a SHA-256 digest"),
            ),
            (
                ArchiveResource {
                    creates: Some("bin/tool".into()),
                    ..archive(Some("https://example.com/a.tar"))
                },
                Some("creates must be absolute"),
            ),
            (
                ArchiveResource {
                    path: "/opt/tool/".into(),
                    ..archive(Some("https://example.com/a.tar"))
                },
                Some("path '/opt/tool/' must be normalized"),
            ),
        ];
        expect_rules(cases, Resource::Archive);

        let uncompiled = ArchiveResource {
            source: Some("tool.tar.gz".into()),
            ..archive(None)
        };
        assert_eq!(
            validate(&Plan::of(vec![Resource::Archive(uncompiled)])),
            Err(
                "resource 1 (archive:/opt/tool): source must be compiled by svcctl state \
                 (`svcctl state compile` inlines it)"
                    .into()
            )
        );
        // Inlined archives count against the plan's budget, with files.
        let half =
            base64::engine::general_purpose::STANDARD.encode(vec![0u8; MAX_CONTENT_BYTES / 2]);
        let plan = Plan::of(vec![
            Resource::Archive(ArchiveResource {
                content_base64: Some(half),
                ..archive(None)
            }),
            Resource::File(FileResource {
                content: Some("x".repeat(MAX_CONTENT_BYTES / 2)),
                ..file("/a")
            }),
        ]);
        let error = validate(&plan).unwrap_err();
        assert!(error.contains("more than the 48 MiB"), "{error}");
    }

    #[test]
    fn git_rules() {
        let git = |repo: &str, rev: Option<&str>| GitResource {
            path: "/srv/site".into(),
            repo: repo.into(),
            rev: rev.map(str::to_string),
            ..GitResource::default()
        };
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let cases: Vec<(GitResource, Option<&str>)> = vec![
            (git("https://git.example.com/site.git", None), None),
            (git("git@git.example.com:team/site.git", Some("main")), None),
            (git("/srv/repos/site.git", Some("release/2.x")), None),
            (git("file:///srv/repos/site.git", Some(commit)), None),
            (git("ssh://git@host/site.git", Some(&"a".repeat(64))), None),
            (git("https://h/s.git", Some("v1.2.3")), None),
            (git("", None), Some("repo must not be empty")),
            (
                git("-uhttps://h/s.git", None),
                Some("must not start with -"),
            ),
            (
                git("repos/site.git", None),
                Some("must be a URL, user@host:path or an absolute path"),
            ),
            (
                git("https://h/s.git", Some("-b")),
                Some("rev '-b' is not a branch or tag name"),
            ),
            (git("https://h/s.git", Some("main~2")), Some("rev 'main~2'")),
            (git("https://h/s.git", Some("HEAD^")), Some("rev 'HEAD^'")),
            (git("https://h/s.git", Some("a..b")), Some("rev 'a..b'")),
            (git("https://h/s.git", Some("a b")), Some("rev 'a b'")),
            (
                git("https://h/s.git", Some("main.lock")),
                Some("rev 'main.lock'"),
            ),
            (
                git("https://h/s.git", Some(".hidden")),
                Some("rev '.hidden'"),
            ),
            (git("https://h/s.git", Some("")), Some("rev ''")),
            (
                GitResource {
                    depth: Some(0),
                    ..git("https://h/s.git", None)
                },
                Some("depth must be at least 1"),
            ),
            (
                GitResource {
                    path: "srv/site".into(),
                    ..git("https://h/s.git", None)
                },
                Some("path must be absolute"),
            ),
        ];
        expect_rules(cases, Resource::Git);
    }
}
