//! State files: YAML text → [`Plan`]. The only code in `state` that reads YAML, and it reads
//! it through one function, [`parse_yaml`] (serde_yaml_ng stays behind it, as in `config`).
//!
//! Errors name the line of the offending list item without a second YAML parser: the items are
//! deserialized by [`ItemSeed`], and every error about an item (unknown kind or key, bad value,
//! missing source) is raised inside the visitor of the item's mapping, where serde_yaml_ng
//! attaches the position of that mapping. That is also why sources are inlined during
//! deserialization rather than after it. A first pass checks only the syntax, so a syntax error
//! points at its own line instead of its item's.
//!
//! A file is either that list or a mapping `{vars: {...}, resources: [...]}`. After parsing,
//! ids are resolved and the resources sorted so that each comes after what it requires
//! (`order`); an error found then (an unknown id, a cycle) is put on its item's line by
//! parsing again with [`LineProbe`], which fails at that item.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs;
use std::path::Path;

use base64::Engine as _;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor,
};

use super::validate::{self, MAX_CONTENT_BYTES};
use super::{CompileError, FileResource, Links, Plan, Resource, Setting};

/// The resource kinds, as written in a state file.
const KINDS: &[&str] = &[
    "file",
    "directory",
    "symlink",
    "package",
    "service",
    "command",
    "tree",
    "user",
    "group",
    "cron",
    "sysctl",
    "line",
    "pkgrepo",
    "archive",
    "git",
];

pub(super) fn compile(
    yaml: &str,
    base_dir: &Path,
    settings: &[Setting],
) -> Result<Plan, CompileError> {
    let document: Option<IgnoredAny> = parse_yaml(yaml, std::marker::PhantomData)?;
    let (items, mut vars) = match document {
        None => (Vec::new(), BTreeMap::new()),
        Some(_) => {
            let mut content_bytes = 0;
            let document = parse_yaml(
                yaml,
                DocumentSeed {
                    base_dir,
                    content_bytes: &mut content_bytes,
                },
            )?;
            (document.items, document.vars)
        }
    };
    let mut secret_vars = Vec::new();
    for setting in settings {
        vars.insert(
            setting.name.clone(),
            serde_json::Value::String(setting.value.clone()),
        );
        if setting.secret {
            secret_vars.push(setting.name.clone());
        }
    }
    let at_item = |index: usize, message: String| CompileError {
        line: item_line(yaml, index),
        message,
    };
    let order = order(&items).map_err(|(index, message)| at_item(index, message))?;
    let has_links = items.iter().any(|(_, links)| !links.is_empty());
    let mut plan = Plan {
        vars,
        secret_vars,
        ..Plan::default()
    };
    for index in order {
        let (resource, links) = &items[index];
        if let Resource::File(file) = resource {
            check_template_names(file, &plan.vars)
                .map_err(|message| at_item(index, format!("file: {message}")))?;
        }
        plan.resources.push(resource.clone());
        if has_links {
            plan.links.push(links.clone());
        }
    }
    Ok(plan)
}

/// The run order: file order, except that a resource waits for every id it requires (or has
/// in `onchanges`). Among the resources that are ready, the earliest in the file goes first,
/// so a file already in order keeps its order. Errors carry the index of their item.
fn order(items: &[(Resource, Links)]) -> Result<Vec<usize>, (usize, String)> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (index, (_, links)) in items.iter().enumerate() {
        if let Some(id) = &links.id {
            if let Some(first) = ids.insert(id, index) {
                return Err((
                    index,
                    format!(
                        "id '{id}' is already the id of resource {} ({})",
                        first + 1,
                        items[first].0.label()
                    ),
                ));
            }
        }
    }
    let mut waits_for: Vec<Vec<usize>> = Vec::with_capacity(items.len());
    for (index, (_, links)) in items.iter().enumerate() {
        let mut prerequisites = Vec::new();
        for (key, list) in [("require", &links.require), ("onchanges", &links.onchanges)] {
            for id in list {
                match ids.get(id.as_str()) {
                    Some(&target) if target == index => {
                        return Err((
                            index,
                            format!("{key}: a resource cannot require itself ('{id}')"),
                        ))
                    }
                    Some(&target) => prerequisites.push(target),
                    None => return Err((index, format!("{key}: no resource has the id '{id}'"))),
                }
            }
        }
        waits_for.push(prerequisites);
    }
    let mut done = vec![false; items.len()];
    let mut order = Vec::with_capacity(items.len());
    while order.len() < items.len() {
        let ready = (0..items.len())
            .find(|&index| !done[index] && waits_for[index].iter().all(|&p| done[p]));
        match ready {
            Some(index) => {
                done[index] = true;
                order.push(index);
            }
            None => {
                let start = (0..items.len()).find(|&index| !done[index]).unwrap_or(0);
                return Err((start, cycle_message(items, &waits_for, &done, start)));
            }
        }
    }
    Ok(order)
}

/// `require cycle: a -> b -> a`: follows unmet prerequisites from `start` until one repeats.
fn cycle_message(
    items: &[(Resource, Links)],
    waits_for: &[Vec<usize>],
    done: &[bool],
    start: usize,
) -> String {
    let name = |index: usize| {
        items[index]
            .1
            .id
            .clone()
            .unwrap_or_else(|| items[index].0.label())
    };
    let mut path = vec![start];
    let mut current = start;
    while let Some(&next) = waits_for[current].iter().find(|&&p| !done[p]) {
        if let Some(at) = path.iter().position(|&seen| seen == next) {
            let mut cycle: Vec<String> = path[at..].iter().map(|&i| name(i)).collect();
            cycle.push(name(next));
            return format!("require cycle: {}", cycle.join(" -> "));
        }
        path.push(next);
        current = next;
    }
    format!("require cycle through '{}'", name(start))
}

/// The line of item `index` of the resource list, found by parsing again with a seed that
/// fails there (serde_yaml_ng puts the item's position on an error raised inside it).
fn item_line(yaml: &str, index: usize) -> Option<usize> {
    let error = parse_yaml(yaml, LineProbe { index }).err()?;
    // The message may carry the item's path (`resources[3]: line probe`).
    error
        .message
        .ends_with(LineProbe::MESSAGE)
        .then_some(error.line?)
}

/// A template's names must be known where it is rendered: `vars` (the file's and `--set`'s),
/// `facts`, or minijinja's own globals. Names inside `facts` are the host's to know, so the
/// agent's render is the check for those (strict undefined: it fails naming the line).
fn check_template_names(
    file: &FileResource,
    vars: &BTreeMap<String, serde_json::Value>,
) -> Result<(), String> {
    let (Some(name), Some(text)) = (&file.template, &file.content) else {
        return Ok(());
    };
    let env = crate::template::environment();
    let template = env
        .template_from_named_str(name, text)
        .map_err(|e| crate::template::error_message(name, &e))?;
    let globals: Vec<&str> = env.globals().map(|(name, _)| name).collect();
    let mut unknown: Vec<String> = template
        .undeclared_variables(false)
        .into_iter()
        .filter(|used| {
            used != "facts" && !vars.contains_key(used) && !globals.contains(&used.as_str())
        })
        .collect();
    unknown.sort();
    let Some(first) = unknown.first() else {
        return Ok(());
    };
    let line = text
        .lines()
        .position(|line| contains_word(line, first))
        .map(|at| format!(" line {}", at + 1))
        .unwrap_or_default();
    Err(format!(
        "{name}{line}: template: undefined name '{first}' (not in vars, --set or facts){}",
        if unknown.len() > 1 {
            format!("; also {}", unknown[1..].join(", "))
        } else {
            String::new()
        }
    ))
}

/// `word` in `line` with no identifier character on either side.
fn contains_word(line: &str, word: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
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

/// A parsed file: its items in file order, and its `vars:` block.
struct Document {
    items: Vec<(Resource, Links)>,
    vars: BTreeMap<String, serde_json::Value>,
}

/// The whole file: a list of items, or a mapping with `vars` and `resources`.
struct DocumentSeed<'a> {
    base_dir: &'a Path,
    content_bytes: &'a mut usize,
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_> {
    type Value = Document;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_> {
    type Value = Document;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a YAML list of resources (items such as `- file: {path: /etc/motd}`), or a \
             mapping with `vars:` and `resources:`",
        )
    }

    fn visit_seq<A: SeqAccess<'de>>(self, items: A) -> Result<Self::Value, A::Error> {
        let items = ItemsSeed {
            base_dir: self.base_dir,
            content_bytes: self.content_bytes,
        }
        .visit_seq(items)?;
        Ok(Document {
            items,
            vars: BTreeMap::new(),
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut document = Document {
            items: Vec::new(),
            vars: BTreeMap::new(),
        };
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "vars" => {
                    document.vars = map
                        .next_value::<Option<BTreeMap<String, serde_json::Value>>>()
                        .map_err(|e| {
                            let message = plain_message(&e.to_string());
                            let message = message.strip_prefix("vars: ").unwrap_or(&message);
                            de::Error::custom(format!(
                                "vars: {message} (a mapping of names to values)"
                            ))
                        })?
                        .unwrap_or_default();
                }
                "resources" => {
                    document.items = map
                        .next_value_seed(OptionalItems(ItemsSeed {
                            base_dir: self.base_dir,
                            content_bytes: &mut *self.content_bytes,
                        }))?
                        .unwrap_or_default();
                }
                other => {
                    return Err(de::Error::custom(format!(
                        "unknown key '{other}' at the top of the file (expected vars and \
                         resources, or a plain list of resources)"
                    )))
                }
            }
        }
        Ok(document)
    }
}

/// `resources:` may be empty (null).
struct OptionalItems<'a>(ItemsSeed<'a>);

impl<'de> DeserializeSeed<'de> for OptionalItems<'_> {
    type Value = Option<Vec<(Resource, Links)>>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for OptionalItems<'_> {
    type Value = Option<Vec<(Resource, Links)>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        self.0.deserialize(deserializer).map(Some)
    }
}

/// Fails inside item `index` of the resource list, so that the error carries its line.
struct LineProbe {
    index: usize,
}

impl LineProbe {
    const MESSAGE: &'static str = "line probe";
}

impl<'de> DeserializeSeed<'de> for LineProbe {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for LineProbe {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a state file")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        for _ in 0..self.index {
            if items.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        items.next_element_seed(FailInside)?;
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == "resources" {
                return map.next_value_seed(LineProbe { index: self.index });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

struct FailInside;

impl<'de> DeserializeSeed<'de> for FailInside {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FailInside {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a resource")
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(LineProbe::MESSAGE))
    }
}

/// The items of the resource list.
struct ItemsSeed<'a> {
    base_dir: &'a Path,
    /// File contents inlined or written so far, as encoded in the plan.
    content_bytes: &'a mut usize,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = Vec<(Resource, Links)>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = Vec<(Resource, Links)>;

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
    type Value = (Resource, Links);

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_> {
    type Value = (Resource, Links);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a resource: a one-key mapping such as `file: {path: /etc/motd}`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut item: A) -> Result<Self::Value, A::Error> {
        let Some(kind) = item.next_key::<String>()? else {
            return Err(de::Error::custom(
                "empty item; expected a resource such as `file: {path: /etc/motd}`",
            ));
        };
        // Each arm: the kind's settings and the links written among them.
        let (mut resource, links) = match kind.as_str() {
            "file" => with(Resource::File, settings(&mut item, &kind, "path")?),
            "directory" => with(Resource::Directory, settings(&mut item, &kind, "path")?),
            "symlink" => with(Resource::Symlink, settings(&mut item, &kind, "path")?),
            "package" => with(Resource::Package, settings(&mut item, &kind, "name")?),
            "service" => with(Resource::Service, settings(&mut item, &kind, "name")?),
            "command" => with(Resource::Command, settings(&mut item, &kind, "run")?),
            "tree" => with(Resource::Tree, settings(&mut item, &kind, "path")?),
            "user" => with(Resource::User, settings(&mut item, &kind, "name")?),
            "group" => with(Resource::Group, settings(&mut item, &kind, "name")?),
            "cron" => with(Resource::Cron, settings(&mut item, &kind, "name")?),
            "sysctl" => with(Resource::Sysctl, settings(&mut item, &kind, "name")?),
            "line" => with(Resource::Line, settings(&mut item, &kind, "path")?),
            "pkgrepo" => with(Resource::Pkgrepo, settings(&mut item, &kind, "name")?),
            "archive" => with(Resource::Archive, settings(&mut item, &kind, "path")?),
            "git" => with(Resource::Git, settings(&mut item, &kind, "path")?),
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
        validate::check_links(&links).map_err(fail)?;
        if let Resource::File(file) = &mut resource {
            if file.template.is_some() && file.content.is_some() {
                return Err(fail(
                    "content and template are mutually exclusive; give one".into(),
                ));
            }
            let from = file.source.clone().or_else(|| file.template.clone());
            inline_source(file, self.base_dir).map_err(fail)?;
            inline_template(file, self.base_dir).map_err(fail)?;
            *self.content_bytes += validate::encoded_content_size(file);
            validate::check_content_budget(*self.content_bytes).map_err(|message| match from {
                Some(from) => fail(format!("source '{from}': {message}")),
                None => fail(message),
            })?;
        }
        if let Resource::Tree(tree) = &mut resource {
            let source = tree.source.clone().unwrap_or_default();
            inline_tree(tree, self.base_dir).map_err(fail)?;
            *self.content_bytes += validate::encoded_tree_size(tree);
            validate::check_content_budget(*self.content_bytes)
                .map_err(|message| fail(format!("source '{source}': {message}")))?;
            validate::check_compiled(&resource).map_err(fail)?;
        }
        inline_beside(&mut resource, self.base_dir).map_err(fail)?;
        *self.content_bytes += validate::encoded_inlined_size(&resource);
        validate::check_content_budget(*self.content_bytes).map_err(fail)?;
        Ok((resource, links))
    }
}

fn with<T>(variant: fn(T) -> Resource, (settings, links): (T, Links)) -> (Resource, Links) {
    (variant(settings), links)
}

/// One resource's settings: the kind's own, deserialized straight from the YAML (so scalars
/// keep their text: `mode: 0644`), with `id`, `require` and `onchanges` taken out on the way
/// into its links. serde's own messages name unknown and missing keys.
fn settings<'de, A: MapAccess<'de>, T: DeserializeOwned>(
    item: &mut A,
    kind: &str,
    required: &str,
) -> Result<(T, Links), A::Error> {
    let settings = item
        .next_value_seed(SettingsSeed::<T>(std::marker::PhantomData))
        .map_err(|error| {
            de::Error::custom(format!("{kind}: {}", plain_message(&error.to_string())))
        })?;
    settings.ok_or_else(|| de::Error::custom(format!("{kind}: missing field `{required}`")))
}

/// A kind's settings mapping (`None` when empty: `- command:`) and the links in it.
struct SettingsSeed<T>(std::marker::PhantomData<T>);

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for SettingsSeed<T> {
    type Value = Option<(T, Links)>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for SettingsSeed<T> {
    type Value = Option<(T, Links)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping of settings (`key: value`)")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let mut links = Links::default();
        let filter = LinkFilter {
            map,
            links: &mut links,
        };
        let settings = T::deserialize(de::value::MapAccessDeserializer::new(filter))?;
        Ok(Some((settings, links)))
    }
}

/// The settings mapping as the kind's struct sees it: every key but `id`, `require` and
/// `onchanges`, which go to `links`.
struct LinkFilter<'l, A> {
    map: A,
    links: &'l mut Links,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for LinkFilter<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        use serde::de::IntoDeserializer;
        loop {
            let Some(key) = self.map.next_key::<String>()? else {
                return Ok(None);
            };
            match key.as_str() {
                "id" => self.links.id = Some(self.map.next_value::<Ids>()?.one("id")?),
                "require" => self.links.require = self.map.next_value::<Ids>()?.0,
                "onchanges" => self.links.onchanges = self.map.next_value::<Ids>()?.0,
                _ => return seed.deserialize(key.into_deserializer()).map(Some),
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// An id, or a list of ids (`require: web-conf` is `require: [web-conf]`).
struct Ids(Vec<String>);

impl Ids {
    fn one<E: de::Error>(mut self, key: &str) -> Result<String, E> {
        match self.0.len() {
            1 => Ok(self.0.remove(0)),
            _ => Err(E::custom(format!("{key}: expected one id, not a list"))),
        }
    }
}

impl<'de> de::Deserialize<'de> for Ids {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IdsVisitor;
        impl<'de> Visitor<'de> for IdsVisitor {
            type Value = Ids;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an id or a list of ids")
            }

            fn visit_str<E: de::Error>(self, id: &str) -> Result<Ids, E> {
                Ok(Ids(vec![id.to_string()]))
            }

            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Ids, S::Error> {
                let mut ids = Vec::new();
                while let Some(id) = seq.next_element::<String>()? {
                    ids.push(id);
                }
                Ok(Ids(ids))
            }
        }
        deserializer.deserialize_any(IdsVisitor)
    }
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

/// Reads `template` (relative to the state file) into `content`, keeping the name for the
/// agent's messages. The syntax is checked here, so a typo fails on the operator's machine;
/// the names it uses are checked once the plan's vars are known (`check_template_names`).
fn inline_template(file: &mut FileResource, base_dir: &Path) -> Result<(), String> {
    let Some(name) = &file.template else {
        return Ok(());
    };
    let bytes = read_beside(name, base_dir, "template")?;
    let text =
        String::from_utf8(bytes).map_err(|_| format!("template '{name}' is not UTF-8 text"))?;
    crate::template::check_syntax(&crate::template::environment(), name, &text)?;
    file.content = Some(text);
    Ok(())
}

/// A file named relative to the state file's directory, refused before reading when it is
/// not a regular file or is larger than a plan may carry.
fn read_beside(name: &str, base_dir: &Path, what: &str) -> Result<Vec<u8>, String> {
    let path = base_dir.join(name);
    let unreadable = |error: std::io::Error| {
        format!(
            "{what} '{name}' ({}) cannot be read: {error}",
            path.display()
        )
    };
    let metadata = fs::metadata(&path).map_err(unreadable)?;
    if !metadata.is_file() {
        return Err(format!(
            "{what} '{name}' ({}) is not a regular file",
            path.display()
        ));
    }
    // Refuse before reading: a mistaken source could be a disk image.
    if metadata.len() > MAX_CONTENT_BYTES as u64 {
        return Err(format!(
            "{what} '{name}' is {} KiB, more than the {} a plan may carry; ship larger files \
             as an archive with a url",
            metadata.len().div_ceil(1024),
            validate::content_budget()
        ));
    }
    fs::read(&path).map_err(unreadable)
}

/// Reads a tree's `source` directory into `dirs` and `files` (sorted, so a plan is the same
/// for the same tree). Only directories and regular files: a symlink or a device in the source
/// is an error, because what it would mean on the host is a guess.
fn inline_tree(tree: &mut crate::state::TreeResource, base_dir: &Path) -> Result<(), String> {
    let Some(source) = tree.source.take() else {
        return Ok(());
    };
    let root = base_dir.join(&source);
    let metadata = fs::metadata(&root)
        .map_err(|e| format!("source '{source}' ({}) cannot be read: {e}", root.display()))?;
    if !metadata.is_dir() {
        return Err(format!(
            "source '{source}' ({}) is not a directory",
            root.display()
        ));
    }
    let mut pending = vec![(root.clone(), String::new())];
    let mut read_bytes = 0usize;
    while let Some((dir, prefix)) = pending.pop() {
        let mut entries = fs::read_dir(&dir)
            .and_then(|entries| entries.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("reading {}: {e}", dir.display()))?;
        crate::sort::sort_by_key(&mut entries, |entry| entry.file_name());
        for entry in entries {
            let name = entry.file_name().into_string().map_err(|name| {
                format!("{}: file names must be UTF-8", dir.join(name).display())
            })?;
            let relative = format!("{prefix}{name}");
            let file_type = entry
                .file_type()
                .map_err(|e| format!("reading {}: {e}", entry.path().display()))?;
            if file_type.is_dir() {
                tree.dirs.push(relative.clone());
                pending.push((entry.path(), format!("{relative}/")));
            } else if file_type.is_file() {
                let metadata = entry
                    .metadata()
                    .map_err(|e| format!("reading {}: {e}", entry.path().display()))?;
                read_bytes += metadata.len() as usize;
                // Refuse before reading: the whole tree must fit in a plan.
                if read_bytes > MAX_CONTENT_BYTES {
                    return Err(format!(
                        "source '{source}' holds more than the {} a plan may carry",
                        validate::content_budget()
                    ));
                }
                let bytes = fs::read(entry.path())
                    .map_err(|e| format!("reading {}: {e}", entry.path().display()))?;
                let (content, content_base64) = match String::from_utf8(bytes) {
                    Ok(text) => (Some(text), None),
                    Err(error) => (
                        None,
                        Some(base64::engine::general_purpose::STANDARD.encode(error.into_bytes())),
                    ),
                };
                use std::os::unix::fs::PermissionsExt;
                tree.files.push(crate::state::TreeFile {
                    path: relative,
                    content,
                    content_base64,
                    mode: validate::format_mode(metadata.permissions().mode() & 0o7777),
                });
            } else {
                return Err(format!(
                    "source '{source}': {} is not a regular file or a directory (symlinks and \
                     devices are not copied)",
                    entry.path().display()
                ));
            }
        }
    }
    // Parents first: the walk above pushes a directory before its children, but pops
    // siblings' subtrees in any order; sorting by path keeps parents before children.
    tree.dirs.sort();
    crate::sort::sort_by(&mut tree.files, |a, b| a.path.cmp(&b.path));
    Ok(())
}

/// Replaces `source` with the file's bytes: `content` when they are UTF-8, `content_base64`
/// otherwise, so binary files survive the JSON plan.
fn inline_source(file: &mut FileResource, base_dir: &Path) -> Result<(), String> {
    let Some(source) = file.source.take() else {
        return Ok(());
    };
    let bytes = read_beside(&source, base_dir, "source")?;
    match String::from_utf8(bytes) {
        Ok(text) => file.content = Some(text),
        Err(error) => {
            file.content_base64 =
                Some(base64::engine::general_purpose::STANDARD.encode(error.into_bytes()))
        }
    }
    Ok(())
}

/// Inlines the files other kinds than `file` name beside the state file: a pkgrepo's
/// `key_source` becomes its key text, an archive's `source` its `content_base64` (once its
/// SHA-256 is the one the resource gives, so a stale checksum fails here and not on every
/// agent).
fn inline_beside(resource: &mut Resource, base_dir: &Path) -> Result<(), String> {
    if let Resource::Archive(archive) = resource {
        if let Some(source) = archive.source.take() {
            let bytes = read_beside(&source, base_dir, "source")?;
            let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
            if !digest.eq_ignore_ascii_case(&archive.sha256) {
                return Err(format!(
                    "source '{source}' has sha256 {digest}, not the {} given",
                    archive.sha256
                ));
            }
            archive.content_base64 = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
        }
    }
    if let Resource::Pkgrepo(repo) = resource {
        if let Some(apt) = &mut repo.apt {
            if let Some(source) = apt.key_source.take() {
                apt.key = Some(read_key(&source, base_dir)?);
            }
        }
        if let Some(yum) = &mut repo.yum {
            if let Some(source) = yum.key_source.take() {
                yum.gpgkey = Some(read_key(&source, base_dir)?);
            }
        }
    }
    Ok(())
}

/// A signing key file: ASCII-armoured text, which apt's `.asc` keyrings and rpm both read.
fn read_key(name: &str, base_dir: &Path) -> Result<String, String> {
    let bytes = read_beside(name, base_dir, "key_source")?;
    match String::from_utf8(bytes) {
        Ok(text) if validate::is_armoured_key(&text) => Ok(text),
        _ => Err(format!(
            "key_source '{name}' is not an ASCII-armoured public key (-----BEGIN PGP PUBLIC KEY \
             BLOCK-----; `gpg --armor --export` writes one)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{
        CommandResource, DirectoryResource, PackageResource, ServiceResource, Setting,
        SymlinkResource,
    };

    fn compile_here(yaml: &str) -> Result<Plan, CompileError> {
        compile(yaml, Path::new("/nonexistent"), &[])
    }

    /// Each YAML fails to compile (sources relative to `base`) with a message that starts
    /// with the expected text.
    fn expect_errors_in<Y: AsRef<str>, E: AsRef<str>>(base: &Path, cases: &[(Y, E)]) {
        for (yaml, expected) in cases {
            let (yaml, expected) = (yaml.as_ref(), expected.as_ref());
            let message = compile(yaml, base, &[]).expect_err(yaml).to_string();
            assert!(
                message.starts_with(expected),
                "{yaml:?}\n got {message:?}\nwant {expected:?}"
            );
        }
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
            ..Plan::default()
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
                 symlink, package, service, command, ",
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
                "line 1: service: unknown variant `up`, expected one of `running`, `stopped`, \
                 `restarted`, `reloaded`",
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
                "line 1: unknown key 'path' at the top of the file (expected vars and \
                 resources, or a plain list of resources)",
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
        expect_errors_in(Path::new("/nonexistent"), &cases);
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
        let plan = compile(yaml, dir.path(), &[]).unwrap();
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
            &[],
        )
        .unwrap_err();
        assert_eq!(missing.line, Some(2));
        assert!(
            missing.message.starts_with("file: source 'nope.txt' (")
                && missing.message.contains("cannot be read"),
            "{missing}"
        );

        fs::write(dir.path().join("big"), vec![b'x'; MAX_CONTENT_BYTES + 1]).unwrap();
        let big = compile("- file: {path: /big, source: big}\n", dir.path(), &[]).unwrap_err();
        assert_eq!(big.line, Some(1));
        assert!(
            big.message
                .contains("source 'big' is 49153 KiB, more than the 48 MiB"),
            "{big}"
        );

        // Each source fits; together they do not.
        fs::write(
            dir.path().join("half"),
            vec![b'x'; MAX_CONTENT_BYTES / 2 + 1],
        )
        .unwrap();
        let yaml = "- file: {path: /1, source: half}\n- file: {path: /2, source: half}\n";
        let both = compile(yaml, dir.path(), &[]).unwrap_err();
        assert_eq!(both.line, Some(2));
        assert!(
            both.message
                .starts_with("file: source 'half': file contents total"),
            "{both}"
        );

        let directory = compile("- file: {path: /d, source: .}\n", dir.path(), &[]).unwrap_err();
        assert!(
            directory.message.contains("is not a regular file"),
            "{directory}"
        );
    }

    #[test]
    fn requisites_order_the_plan_and_keep_file_order_otherwise() {
        let yaml = "\
- service: {name: nginx, state: restarted, onchanges: [conf, site]}
- file: {path: /etc/motd, content: hi}
- file: {id: site, path: /etc/nginx/site, content: x, require: dir}
- directory: {id: dir, path: /etc/nginx}
- file: {id: conf, path: /etc/nginx/nginx.conf, content: y, require: [dir]}
";
        let plan = compile_here(yaml).unwrap();
        let labels: Vec<String> = plan.resources.iter().map(Resource::label).collect();
        assert_eq!(
            labels,
            [
                "file:/etc/motd",
                "directory:/etc/nginx",
                "file:/etc/nginx/site",
                "file:/etc/nginx/nginx.conf",
                "service:nginx",
            ]
        );
        assert_eq!(plan.links.len(), 5);
        assert_eq!(plan.links[2].require, ["dir"]);
        assert_eq!(plan.links[4].onchanges, ["conf", "site"]);
        assert_eq!(crate::state::validate(&plan), Ok(()));
        // The JSON round trip keeps the links; a plan without any has none.
        let back: Plan = serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();
        assert_eq!(back, plan);
        let plain = compile_here("- file: {path: /a}\n").unwrap();
        assert!(plain.links.is_empty());
        assert!(!serde_json::to_string(&plain).unwrap().contains("links"));
    }

    #[test]
    fn link_errors_name_the_line_and_the_cycle() {
        let cases = [
            (
                "- file: {path: /a}\n- file: {path: /b, require: [nope]}\n",
                "line 2: require: no resource has the id 'nope'",
            ),
            (
                "- file: {id: a, path: /a, require: b}\n- file: {id: b, path: /b, require: c}\n\
                 - file: {id: c, path: /c, onchanges: a}\n",
                "line 1: require cycle: a -> b -> c -> a",
            ),
            (
                "- file: {id: a, path: /a}\n- file: {id: a, path: /b}\n",
                "line 2: id 'a' is already the id of resource 1 (file:/a)",
            ),
            (
                "- file: {id: a, path: /a, require: a}\n",
                "line 1: require: a resource cannot require itself ('a')",
            ),
            (
                "- file: {id: 'a b', path: /a}\n",
                "line 1: file: id 'a b' is not an id",
            ),
            (
                "- file: {id: [a, b], path: /a}\n",
                "line 1: file: id: expected one id, not a list",
            ),
            (
                "- file: {path: /a, require: {x: 1}}\n",
                "line 1: file: invalid type: map, expected an id or a list of ids",
            ),
            (
                "vars: {a: 1}\nresources:\n  - file: {path: /a}\n  - file: {path: /b, require: x}\n",
                "line 4: require: no resource has the id 'x'",
            ),
            (
                "vars: [1]\n",
                "line 1: vars: invalid type: sequence",
            ),
            (
                "resource: []\n",
                "line 1: unknown key 'resource' at the top of the file",
            ),
        ];
        expect_errors_in(Path::new("/nonexistent"), &cases);
    }

    #[test]
    fn templates_are_inlined_with_their_names_checked_against_vars() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("nginx.conf.j2"),
            "# {{ facts.hostname }}\nlisten {{ port }};\nworkers {{ workers }};\n",
        )
        .unwrap();
        fs::write(dir.path().join("broken.j2"), "a\n{% if %}\n").unwrap();
        let yaml = "\
vars: {port: 80}
resources:
  - file: {path: /etc/nginx.conf, template: nginx.conf.j2}
";
        let missing = compile(yaml, dir.path(), &[]).unwrap_err();
        assert_eq!(missing.line, Some(3));
        assert_eq!(
            missing.message,
            "file: nginx.conf.j2 line 3: template: undefined name 'workers' (not in vars, --set \
             or facts)"
        );
        let set = |name: &str, value: &str, secret| Setting {
            name: name.into(),
            value: value.into(),
            secret,
        };
        let plan = compile(
            yaml,
            dir.path(),
            &[set("workers", "4", false), set("port", "8080", true)],
        )
        .unwrap();
        let Resource::File(file) = &plan.resources[0] else {
            panic!("{plan:?}");
        };
        assert_eq!(file.template.as_deref(), Some("nginx.conf.j2"));
        assert!(file.content.as_deref().unwrap().contains("{{ port }}"));
        assert_eq!(plan.vars["port"], "8080");
        assert_eq!(plan.vars["workers"], "4");
        assert_eq!(plan.secret_vars, ["port"]);
        assert_eq!(crate::state::validate(&plan), Ok(()));

        let broken =
            compile("- file: {path: /x, template: broken.j2}\n", dir.path(), &[]).unwrap_err();
        assert_eq!(broken.line, Some(1));
        assert!(
            broken
                .message
                .starts_with("file: broken.j2 line 2: template: syntax error"),
            "{broken}"
        );
        let both = compile(
            "- file: {path: /x, template: broken.j2, content: x}\n",
            dir.path(),
            &[],
        )
        .unwrap_err();
        assert!(
            both.message
                .contains("content and template are mutually exclusive"),
            "{both}"
        );
        let gone = compile("- file: {path: /x, template: nope.j2}\n", dir.path(), &[]).unwrap_err();
        assert!(
            gone.message.starts_with("file: template 'nope.j2' ("),
            "{gone}"
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
        expect_errors_in(Path::new("/nonexistent"), &cases);
    }

    const KEY: &str =
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\nmQINBGR0ZXN0\n-----END PGP PUBLIC KEY BLOCK-----\n";

    #[test]
    fn pkgrepo_key_sources_are_inlined() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("example.asc"), KEY).unwrap();
        let yaml = "\
- pkgrepo:
    name: example
    refresh: true
    apt:
      uri: https://deb.example.com/debian
      suite: bookworm
      components: [main]
      key_source: example.asc
    yum: {baseurl: https://rpm.example.com/el9/, key_source: example.asc, gpgcheck: false}
";
        let plan = compile(yaml, dir.path(), &[]).unwrap();
        let Resource::Pkgrepo(repo) = &plan.resources[0] else {
            panic!("{plan:?}");
        };
        let (apt, yum) = (repo.apt.as_ref().unwrap(), repo.yum.as_ref().unwrap());
        assert_eq!((apt.key.as_deref(), &apt.key_source), (Some(KEY), &None));
        assert_eq!((yum.gpgkey.as_deref(), &yum.key_source), (Some(KEY), &None));
        assert_eq!((repo.refresh, yum.gpgcheck), (Some(true), Some(false)));
        assert_eq!(plan.resources[0].label(), "pkgrepo:example");
        assert_eq!(crate::state::validate(&plan), Ok(()));
        let back: Plan = serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();
        assert_eq!(back, plan);
    }

    #[test]
    fn pkgrepo_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("binary.gpg"), [0x99u8, 0x01, 0x0d, 0xff]).unwrap();
        let apt =
            "apt: {uri: 'https://deb.example.com/debian', suite: bookworm, components: [main]";
        let cases = [
            (
                format!(
                    "- file: {{path: /a}}\n- pkgrepo: {{name: x, {apt}, key_source: nope.asc}}}}\n"
                ),
                "line 2: pkgrepo: key_source 'nope.asc' (",
            ),
            (
                format!("- pkgrepo: {{name: x, {apt}, key_source: binary.gpg}}}}\n"),
                "line 1: pkgrepo: key_source 'binary.gpg' is not an ASCII-armoured public key",
            ),
            (
                format!("- pkgrepo: {{name: x, {apt}, key: x, key_source: a.asc}}}}\n"),
                "line 1: pkgrepo: apt.key and key_source are mutually exclusive",
            ),
            (
                "- pkgrepo: {name: x}\n".to_string(),
                "line 1: pkgrepo: give an apt block, a yum block or both",
            ),
            (
                "\n- pkgrepo:\n    name: x\n    yum: {baseurl: https://x/, gpgkey: 5}\n"
                    .to_string(),
                "line 2: pkgrepo: yum.gpgkey must be an ASCII-armoured public key or a URL",
            ),
            (
                format!("- pkgrepo: {{name: x, {apt}, release: stable}}}}\n"),
                "line 1: pkgrepo: unknown field `release`, expected one of `uri`, `suite`",
            ),
            (
                format!("- pkgrepo: {{name: x, {apt}}}, state: removed}}\n"),
                "line 1: pkgrepo: unknown variant `removed`, expected `present` or `absent`",
            ),
            (
                "- pkgrepo: {name: x, apt: {uri: 'https://x/', suite: s, components: main}}\n"
                    .to_string(),
                "line 1: pkgrepo: invalid type: string \"main\", expected a sequence",
            ),
            (
                "- pkgrepo: {apt: {uri: 'https://x/', suite: s, components: [main]}}\n".to_string(),
                "line 1: pkgrepo: missing field `name`",
            ),
        ];
        expect_errors_in(dir.path(), &cases);
    }

    #[test]
    fn archive_sources_are_checked_and_inlined() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = [0x1fu8, 0x8b, 8, 0, 1, 2, 3];
        fs::write(dir.path().join("tool.tar.gz"), bytes).unwrap();
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes));
        let yaml = format!(
            "\
- archive:
    path: /opt/tool
    source: tool.tar.gz
    sha256: {}
    mkdir: true
- archive: {{path: /opt/other, url: 'https://example.com/o.zip', sha256: {digest}, creates: /opt/other/bin}}
",
            digest.to_uppercase()
        );
        let plan = compile(&yaml, dir.path(), &[]).unwrap();
        let Resource::Archive(inlined) = &plan.resources[0] else {
            panic!("{plan:?}");
        };
        assert_eq!(inlined.source, None);
        assert_eq!(
            validate::decode_base64(inlined.content_base64.as_deref().unwrap()).unwrap(),
            bytes
        );
        assert_eq!(inlined.mkdir, Some(true));
        assert_eq!(plan.resources[1].label(), "archive:/opt/other");
        assert_eq!(crate::state::validate(&plan), Ok(()));
        let back: Plan = serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();
        assert_eq!(back, plan);
    }

    #[test]
    fn archive_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("tool.tar"), b"tar bytes").unwrap();
        let actual = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"tar bytes"));
        let other = "0".repeat(64);
        fs::write(
            dir.path().join("big.tar"),
            vec![0u8; MAX_CONTENT_BYTES / 4 * 3 + 1024],
        )
        .unwrap();
        let big = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(vec![
            0u8;
            MAX_CONTENT_BYTES
                / 4
                * 3
                + 1024
        ]));
        let cases = [
            (
                format!("- file: {{path: /a}}\n- archive: {{path: /opt, source: tool.tar, sha256: {other}}}\n"),
                format!("line 2: archive: source 'tool.tar' has sha256 {actual}, not the {other} given"),
            ),
            (
                format!("- archive: {{path: /opt, source: gone.tar, sha256: {other}}}\n"),
                "line 1: archive: source 'gone.tar' (".to_string(),
            ),
            (
                "- archive: {path: /opt, url: 'https://example.com/a.tar'}\n".to_string(),
                "line 1: archive: missing field `sha256`".to_string(),
            ),
            (
                format!("- archive: {{path: /opt, sha256: {other}}}\n"),
                "line 1: archive: give source (an archive beside the state file) or url".to_string(),
            ),
            (
                format!("- archive: {{path: /opt, url: 'https://x/a.tar', source: tool.tar, sha256: {other}}}\n"),
                "line 1: archive: source and url are mutually exclusive; give one".to_string(),
            ),
            (
                format!("- archive: {{path: /opt, url: 'https://x/a.tar', sha256: {other}, strip: 1}}\n"),
                "line 1: archive: unknown field `strip`".to_string(),
            ),
            (
                format!("- archive: {{path: /opt, source: big.tar, sha256: {big}}}\n"),
                "line 1: archive: file contents total".to_string(),
            ),
        ];
        expect_errors_in(dir.path(), &cases);
    }

    #[test]
    fn git_compiles_and_errors_name_the_line() {
        let yaml = "\
- git: {path: /srv/site, repo: 'https://git.example.com/site.git'}
- git:
    path: /srv/tool
    repo: git@git.example.com:team/tool.git
    rev: v1.2.0
    depth: 1
    force: true
";
        let plan = compile_here(yaml).unwrap();
        let Resource::Git(tool) = &plan.resources[1] else {
            panic!("{plan:?}");
        };
        assert_eq!(
            (tool.rev.as_deref(), tool.depth, tool.force),
            (Some("v1.2.0"), Some(1), Some(true))
        );
        assert_eq!(plan.resources[0].label(), "git:/srv/site");
        assert_eq!(crate::state::validate(&plan), Ok(()));

        let cases = [
            (
                "- file: {path: /a}\n- git: {path: /srv/site}\n",
                "line 2: git: missing field `repo`",
            ),
            (
                "- git: {path: /srv/site, repo: 'https://h/s.git', rev: 'main~1'}\n",
                "line 1: git: rev 'main~1' is not a branch or tag name",
            ),
            (
                "- git: {path: /srv/site, repo: 'https://h/s.git', depth: -1}\n",
                "line 1: git: invalid type: integer `-1`, expected u32",
            ),
            (
                "- git: {path: /srv/site, repo: 'https://h/s.git', branch: main}\n",
                "line 1: git: unknown field `branch`, expected one of `path`, `repo`, `rev`",
            ),
            (
                "\n\n- git: {path: /srv/site, repo: site.git}\n",
                "line 3: git: repo 'site.git' must be a URL",
            ),
        ];
        expect_errors_in(Path::new("/nonexistent"), &cases);
    }
}
