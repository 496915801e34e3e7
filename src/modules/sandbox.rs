//! Runs a module's Starlark: the sandbox, svc's builtins, and the step and memory limits.
//!
//! The sandbox is what the interpreter does not give: starlark-rust has no file, network,
//! process or clock access, and `load()` reaches only the module's own `.star` files and its
//! dependencies' (`load("@dep//lib.star", "f")`), served from memory. What a module gets
//! from svc are the builtins below: read-only host facts, constructors for the state
//! resources of contract §10 (values; nothing is applied here), its own data files, logging,
//! and assertions for tests. An exported function returns a list of resources; they are
//! checked against the state rules before anyone sees them.
//!
//! Limits: every statement executed counts one step (loop bodies included), and the heap's
//! allocated bytes are checked every 64 steps; past either, the run stops with
//! "step limit of N exceeded" / "memory limit of N bytes exceeded". A single expression
//! that never reaches a statement (a huge comprehension) is checked at the next statement
//! only, so the memory limit is a bound on live runs, not an allocation-time cap.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::OnceLock;

use serde::Serialize;
use starlark::any::ProvidesStaticType;
use starlark::codemap::FileSpanRef;
use starlark::environment::{
    FrozenModule, Globals, GlobalsBuilder, LibraryExtension, Module as Env,
};
use starlark::eval::{BeforeStmtFuncDyn, Evaluator, FileLoader};
use starlark::syntax::{AstModule, Dialect};
use starlark::values::dict::DictRef;
use starlark::values::none::NoneType;
use starlark::values::tuple::UnpackTuple;
use starlark::values::{Heap, Value};
use starlark::PrintHandler;

use super::{Module, MAIN};
use crate::state::{self, Plan, Resource};
use crate::{Error, Result};

/// How much one run may do.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Statements executed, over loading the files and the call.
    pub max_steps: u64,
    /// Bytes allocated on the Starlark heaps of a run.
    pub max_heap_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_steps: 10_000_000,
            max_heap_bytes: 256 * 1024 * 1024,
        }
    }
}

/// Read-only facts about the host a module runs on (`facts()` in Starlark): the agent's
/// facts (`crate::facts`, the same set the server shows and selects on).
pub use crate::facts::Facts;

/// `facts()` as modules see it: the host's facts, plus `family` (`unix`), which modules had
/// before agents reported facts and may still read.
fn module_facts(facts: &Facts) -> serde_json::Value {
    let mut view = serde_json::to_value(facts).unwrap_or_default();
    if let Some(object) = view.as_object_mut() {
        object
            .entry("family")
            .or_insert_with(|| std::env::consts::FAMILY.into());
    }
    view
}

/// What a call produced.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Run {
    pub resources: Vec<Resource>,
    pub logs: Vec<String>,
    pub steps: u64,
}

/// One test function's result.
#[derive(Clone, Debug, Serialize)]
pub struct TestResult {
    pub file: String,
    pub name: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// State shared by the builtins of one run, reached through `Evaluator::extra`.
#[derive(ProvidesStaticType)]
struct Ctx {
    facts: serde_json::Value,
    data: std::sync::Arc<BTreeMap<String, Vec<u8>>>,
    logs: RefCell<Vec<String>>,
    counters: Rc<Counters>,
    limits: Limits,
}

/// Shared by the context and the limiter (which starlark needs to own: 'static).
#[derive(Default)]
struct Counters {
    steps: Cell<u64>,
    /// Bytes of the heaps of files already loaded and frozen.
    frozen_bytes: Cell<usize>,
}

impl PrintHandler for Ctx {
    fn println(&self, text: &str) -> starlark::Result<()> {
        self.logs.borrow_mut().push(text.to_string());
        Ok(())
    }
}

/// Counts steps and checks the heap before each statement.
struct Limiter {
    counters: Rc<Counters>,
    limits: Limits,
}

impl<'a, 'e: 'a> BeforeStmtFuncDyn<'a, 'e> for Limiter {
    fn call<'v>(
        &mut self,
        _span: FileSpanRef,
        eval: &mut Evaluator<'v, 'a, 'e>,
    ) -> starlark::Result<()> {
        let steps = self.counters.steps.get() + 1;
        self.counters.steps.set(steps);
        let limits = self.limits;
        if steps > limits.max_steps {
            return Err(starlark::Error::new_other(anyhow::anyhow!(
                "step limit of {} exceeded",
                limits.max_steps
            )));
        }
        if steps % 64 == 0
            && eval.heap().allocated_bytes() + self.counters.frozen_bytes.get()
                > limits.max_heap_bytes
        {
            return Err(starlark::Error::new_other(anyhow::anyhow!(
                "memory limit of {} bytes exceeded",
                limits.max_heap_bytes
            )));
        }
        Ok(())
    }
}

fn ctx<'a>(eval: &Evaluator<'_, 'a, '_>) -> anyhow::Result<&'a Ctx> {
    eval.extra
        .and_then(|extra| extra.downcast_ref::<Ctx>())
        .ok_or_else(|| anyhow::anyhow!("svc builtins need a module run"))
}

/// A resource constructor's value: `{"KIND": {KEY_FIELD: key, ...kwargs}}`, checked now so
/// the error points at the call.
fn resource<'v>(
    kind: &str,
    key_field: &str,
    key: &str,
    kwargs: DictRef<'v>,
    heap: &'v Heap,
) -> anyhow::Result<Value<'v>> {
    let mut fields = serde_json::Map::new();
    fields.insert(key_field.to_string(), key.into());
    for (name, value) in kwargs.iter() {
        let name = name.unpack_str().unwrap_or_default().to_string();
        fields.insert(name, value.to_json_value()?);
    }
    let json = serde_json::json!({ kind: fields });
    let parsed: Resource =
        serde_json::from_value(json.clone()).map_err(|e| anyhow::anyhow!("{kind}(): {e}"))?;
    check_resources(std::slice::from_ref(&parsed)).map_err(|e| anyhow::anyhow!("{kind}(): {e}"))?;
    Ok(heap.alloc(json))
}

fn check_resources(resources: &[Resource]) -> Result<()> {
    let plan = Plan::of(resources.to_vec());
    state::validate(&plan).map_err(Error::Invalid)?;
    if let Some(file) = plan.resources.iter().find_map(|r| match r {
        Resource::File(f) if f.source.is_some() => Some(f),
        _ => None,
    }) {
        return Err(Error::Invalid(format!(
            "file {}: source is not available to modules; use content = data(\"PATH\")",
            file.path
        )));
    }
    Ok(())
}

#[starlark::starlark_module]
fn svc_builtins(builder: &mut GlobalsBuilder) {
    /// Read-only facts about the host: os, os_family, os_release, arch, kernel, hostname,
    /// fqdn, ip_addresses, cpus, memory_mb, init, virtual (and family, `unix`).
    fn facts<'v>(eval: &mut Evaluator<'v, '_, '_>) -> anyhow::Result<Value<'v>> {
        let facts = ctx(eval)?.facts.clone();
        Ok(eval.heap().alloc(facts))
    }

    /// Logs its arguments, joined by spaces.
    fn log<'v>(
        #[starlark(args)] args: UnpackTuple<Value<'v>>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> anyhow::Result<NoneType> {
        let line = args
            .items
            .iter()
            .map(|v| {
                v.unpack_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_repr())
            })
            .collect::<Vec<_>>()
            .join(" ");
        ctx(eval)?.logs.borrow_mut().push(line);
        Ok(NoneType)
    }

    /// A data file of the module, as text.
    fn data<'v>(path: &str, eval: &mut Evaluator<'v, '_, '_>) -> anyhow::Result<Value<'v>> {
        let ctx = ctx(eval)?;
        let bytes = ctx
            .data
            .get(path)
            .ok_or_else(|| anyhow::anyhow!("data(): the module has no file '{path}'"))?;
        let text = std::str::from_utf8(bytes)
            .map_err(|_| anyhow::anyhow!("data(): '{path}' is not UTF-8"))?;
        Ok(eval.heap().alloc(text))
    }

    fn file<'v>(
        path: &str,
        #[starlark(kwargs)] kwargs: DictRef<'v>,
        heap: &'v Heap,
    ) -> anyhow::Result<Value<'v>> {
        resource("file", "path", path, kwargs, heap)
    }

    fn directory<'v>(
        path: &str,
        #[starlark(kwargs)] kwargs: DictRef<'v>,
        heap: &'v Heap,
    ) -> anyhow::Result<Value<'v>> {
        resource("directory", "path", path, kwargs, heap)
    }

    fn symlink<'v>(
        path: &str,
        #[starlark(kwargs)] kwargs: DictRef<'v>,
        heap: &'v Heap,
    ) -> anyhow::Result<Value<'v>> {
        resource("symlink", "path", path, kwargs, heap)
    }

    fn package<'v>(
        name: &str,
        #[starlark(kwargs)] kwargs: DictRef<'v>,
        heap: &'v Heap,
    ) -> anyhow::Result<Value<'v>> {
        resource("package", "name", name, kwargs, heap)
    }

    fn service<'v>(
        name: &str,
        #[starlark(kwargs)] kwargs: DictRef<'v>,
        heap: &'v Heap,
    ) -> anyhow::Result<Value<'v>> {
        resource("service", "name", name, kwargs, heap)
    }

    fn command<'v>(
        run: &str,
        #[starlark(kwargs)] kwargs: DictRef<'v>,
        heap: &'v Heap,
    ) -> anyhow::Result<Value<'v>> {
        resource("command", "run", run, kwargs, heap)
    }

    /// The standard range, refused up front when it is longer than the steps left: a loop
    /// whose body has no statement (`for i in range(N): pass`) or a comprehension counts no
    /// steps, so this is what bounds them.
    fn range<'v>(
        #[starlark(require = pos)] a1: i32,
        #[starlark(require = pos)] a2: Option<i32>,
        #[starlark(require = pos, default = 1)] step: i32,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> anyhow::Result<Value<'v>> {
        let (start, stop) = match a2 {
            None => (0i64, a1 as i64),
            Some(stop) => (a1 as i64, stop as i64),
        };
        let step64 = step as i64;
        let len = match step64 {
            0 => 0,
            s if s > 0 => (stop - start + s - 1).max(0) / s,
            s => (start - stop - s - 1).max(0) / -s,
        } as u64;
        let ctx = ctx(eval)?;
        let max = ctx.limits.max_steps;
        let left = max.saturating_sub(ctx.counters.steps.get());
        if len > left {
            return Err(anyhow::anyhow!(
                "step limit of {max} exceeded: range() of {len} elements is more than the {left} steps left"
            ));
        }
        let standard = standard_range();
        // Always (start, stop, step): the standard range reads two arguments as start, stop.
        let args = [
            eval.heap().alloc(start as i32),
            eval.heap().alloc(stop as i32),
            eval.heap().alloc(step),
        ];
        eval.eval_function(standard.to_value(), &args, &[])
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Fails unless a == b.
    fn assert_eq<'v>(a: Value<'v>, b: Value<'v>) -> anyhow::Result<NoneType> {
        if a.equals(b).map_err(|e| anyhow::anyhow!("{e}"))? {
            Ok(NoneType)
        } else {
            Err(anyhow::anyhow!(
                "assert_eq: {} != {}",
                a.to_repr(),
                b.to_repr()
            ))
        }
    }

    /// Fails unless cond is true.
    fn assert_true<'v>(
        cond: Value<'v>,
        #[starlark(default = "assertion failed")] message: &str,
    ) -> anyhow::Result<NoneType> {
        if cond.to_bool() {
            Ok(NoneType)
        } else {
            Err(anyhow::anyhow!("assert_true: {message}"))
        }
    }
}

/// starlark's own `range`, which ours wraps.
fn standard_range() -> starlark::values::FrozenValue {
    static STANDARD: OnceLock<Globals> = OnceLock::new();
    STANDARD
        .get_or_init(Globals::standard)
        .iter()
        .find(|(name, _)| *name == "range")
        .map(|(_, value)| value)
        .expect("the standard globals have range")
}

fn globals() -> &'static Globals {
    static GLOBALS: OnceLock<Globals> = OnceLock::new();
    GLOBALS.get_or_init(|| {
        GlobalsBuilder::extended_by(&[
            LibraryExtension::StructType,
            LibraryExtension::Json,
            LibraryExtension::Map,
            LibraryExtension::Filter,
            LibraryExtension::Print,
        ])
        .with(svc_builtins)
        .build()
    })
}

fn dialect() -> Dialect {
    Dialect {
        enable_top_level_stmt: true,
        ..Dialect::Extended
    }
}

fn starlark_error(e: impl std::fmt::Display) -> Error {
    Error::Invalid(e.to_string())
}

/// Loads `.star` files: the module's own by path, a dependency's as `@NAME//PATH`.
struct Loader<'c> {
    root: &'c Module,
    deps: &'c BTreeMap<String, Module>,
    ctx: &'c Ctx,
    cache: RefCell<HashMap<String, FrozenModule>>,
    loading: RefCell<Vec<String>>,
    /// Which module the file being evaluated belongs to ("" = root), for relative loads.
    current: RefCell<String>,
}

impl Loader<'_> {
    fn module(&self, name: &str) -> Result<&Module> {
        if name.is_empty() {
            return Ok(self.root);
        }
        self.deps.get(name).ok_or_else(|| {
            Error::NotFound(format!(
                "load(\"@{name}//...\"): {name} is not a dependency in module.yaml (or not installed)"
            ))
        })
    }

    /// Evaluates `path` of module `owner` ("" = root) and freezes it.
    fn eval_file(&self, owner: &str, path: &str) -> Result<FrozenModule> {
        let key = format!("@{owner}//{path}");
        if let Some(done) = self.cache.borrow().get(&key) {
            return Ok(done.clone());
        }
        if self.loading.borrow().contains(&key) {
            return Err(Error::Invalid(format!("load cycle through {path}")));
        }
        let source = self.module(owner)?.text(path)?.to_string();
        let ast = AstModule::parse(path, source, &dialect()).map_err(starlark_error)?;
        self.loading.borrow_mut().push(key.clone());
        let previous = self.current.replace(owner.to_string());
        let env = Env::new();
        let result = {
            let mut eval = Evaluator::new(&env);
            prepare(&mut eval, self.ctx, self)?;
            eval.eval_module(ast, globals()).map(|_| ())
        };
        self.current.replace(previous);
        self.loading.borrow_mut().pop();
        result.map_err(starlark_error)?;
        let frozen = &self.ctx.counters.frozen_bytes;
        frozen.set(frozen.get() + env.heap().allocated_bytes());
        let frozen = env
            .freeze()
            .map_err(|e| Error::Internal(format!("{e:?}")))?;
        self.cache.borrow_mut().insert(key, frozen.clone());
        Ok(frozen)
    }
}

impl FileLoader for Loader<'_> {
    fn load(&self, path: &str) -> starlark::Result<FrozenModule> {
        let (owner, file) = match path.strip_prefix('@').and_then(|p| p.split_once("//")) {
            Some((dep, file)) => (dep.to_string(), file.to_string()),
            None => (self.current.borrow().clone(), path.to_string()),
        };
        self.eval_file(&owner, &file)
            .map_err(|e| starlark::Error::new_other(anyhow::anyhow!("{e}")))
    }
}

/// The limiter, the loader, the print handler and the context, on one evaluator. The
/// limiter must be set before anything is compiled: starlark instruments statements only
/// when a hook exists at compile time.
fn prepare<'a>(
    eval: &mut Evaluator<'_, 'a, '_>,
    ctx: &'a Ctx,
    loader: &'a Loader<'a>,
) -> Result<()> {
    let limiter: Box<dyn BeforeStmtFuncDyn<'a, '_>> = Box::new(Limiter {
        counters: ctx.counters.clone(),
        limits: ctx.limits,
    });
    eval.before_stmt_for_dap(limiter.into());
    eval.set_loader(loader);
    eval.set_print_handler(ctx);
    eval.extra = Some(ctx);
    // Deep recursion would overflow the process's stack before any step limit.
    eval.set_max_callstack_size(200).map_err(starlark_error)?;
    Ok(())
}

fn new_ctx(module: &Module, facts: &Facts, limits: Limits) -> Ctx {
    Ctx {
        facts: module_facts(facts),
        data: module.files.clone(),
        logs: RefCell::new(Vec::new()),
        counters: Rc::new(Counters::default()),
        limits,
    }
}

/// Converts what an exported function returned into resources: a list of resource values,
/// one resource, or None.
fn to_resources(value: Value) -> Result<Vec<Resource>> {
    if value.is_none() {
        return Ok(Vec::new());
    }
    let json = value.to_json_value().map_err(|e| {
        Error::Invalid(format!(
            "the function must return resources (a list), not {}: {e}",
            value.get_type()
        ))
    })?;
    let items = match json {
        serde_json::Value::Array(items) => items,
        single @ serde_json::Value::Object(_) => vec![single],
        other => {
            return Err(Error::Invalid(format!(
                "the function must return a list of resources, not {other}"
            )))
        }
    };
    let resources = items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            serde_json::from_value::<Resource>(item)
                .map_err(|e| Error::Invalid(format!("returned resource {}: {e}", i + 1)))
        })
        .collect::<Result<Vec<_>>>()?;
    check_resources(&resources)?;
    Ok(resources)
}

/// Calls `function` of `module` with `args` (already typed by `Manifest::arguments`).
pub fn call(
    module: &Module,
    deps: &BTreeMap<String, Module>,
    function: &str,
    args: &BTreeMap<String, serde_json::Value>,
    facts: &Facts,
    limits: Limits,
) -> Result<Run> {
    let loaded = Loaded::new(module, deps, facts, limits)?;
    loaded.call(function, args)
}

/// A module whose main.star is evaluated once, for many calls (the benchmark, `test`).
pub struct Loaded<'m> {
    module: &'m Module,
    deps: &'m BTreeMap<String, Module>,
    facts: Facts,
    limits: Limits,
    main: FrozenModule,
}

impl<'m> Loaded<'m> {
    pub fn new(
        module: &'m Module,
        deps: &'m BTreeMap<String, Module>,
        facts: &Facts,
        limits: Limits,
    ) -> Result<Loaded<'m>> {
        let main = eval_frozen(module, deps, facts, limits, MAIN)?.0;
        Ok(Loaded {
            module,
            deps,
            facts: facts.clone(),
            limits,
            main,
        })
    }

    pub fn call(&self, function: &str, args: &BTreeMap<String, serde_json::Value>) -> Result<Run> {
        let ctx = new_ctx(self.module, &self.facts, self.limits);
        let loader = new_loader(self.module, self.deps, &ctx);
        let f = self
            .main
            .get_option(function)
            .map_err(starlark_error)?
            .ok_or_else(|| Error::NotFound(format!("{MAIN} defines no '{function}'")))?;
        let env = Env::new();
        let resources = {
            let mut eval = Evaluator::new(&env);
            prepare(&mut eval, &ctx, &loader)?;
            let f = f.owned_value(env.frozen_heap());
            let named: Vec<(&str, Value)> = args
                .iter()
                .map(|(k, v)| (k.as_str(), env.heap().alloc(v.clone())))
                .collect();
            let value = eval
                .eval_function(f, &[], &named)
                .map_err(|e| Error::Invalid(format!("{function}: {e}")))?;
            to_resources(value)?
        };
        Ok(Run {
            resources,
            logs: ctx.logs.take(),
            steps: ctx.counters.steps.get(),
        })
    }
}

fn new_loader<'c>(
    module: &'c Module,
    deps: &'c BTreeMap<String, Module>,
    ctx: &'c Ctx,
) -> Loader<'c> {
    Loader {
        root: module,
        deps,
        ctx,
        cache: RefCell::new(HashMap::new()),
        loading: RefCell::new(Vec::new()),
        current: RefCell::new(String::new()),
    }
}

/// Evaluates one file of the root module, frozen, with the logs it wrote.
fn eval_frozen(
    module: &Module,
    deps: &BTreeMap<String, Module>,
    facts: &Facts,
    limits: Limits,
    path: &str,
) -> Result<(FrozenModule, Vec<String>)> {
    let ctx = new_ctx(module, facts, limits);
    let loader = new_loader(module, deps, &ctx);
    let frozen = loader.eval_file("", path)?;
    Ok((frozen, ctx.logs.take()))
}

/// `validate`: every source parses, main.star evaluates, every export is a function there.
pub fn check(module: &Module, deps: &BTreeMap<String, Module>) -> Result<()> {
    for path in module.sources().chain(module.tests()) {
        AstModule::parse(path, module.text(path)?.to_string(), &dialect())
            .map_err(starlark_error)?;
    }
    if !module.files.contains_key(MAIN) {
        return Err(Error::Invalid(format!("no {MAIN}")));
    }
    let (main, _) = eval_frozen(
        module,
        deps,
        &crate::facts::collect(),
        Limits::default(),
        MAIN,
    )?;
    for function in module.manifest.exports.keys() {
        let value = main
            .get_option(function)
            .map_err(starlark_error)?
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "exported function '{function}' is not defined in {MAIN}"
                ))
            })?;
        let kind = value.value().get_type();
        if kind != "function" {
            return Err(Error::Invalid(format!(
                "exported '{function}' is a {kind} in {MAIN}, not a function"
            )));
        }
    }
    Ok(())
}

/// `test`: every `test_*` function of every `*_test.star`, in order of file then name.
pub fn run_tests(
    module: &Module,
    deps: &BTreeMap<String, Module>,
    limits: Limits,
) -> Result<Vec<TestResult>> {
    let facts = crate::facts::collect();
    let mut results = Vec::new();
    for file in module.tests() {
        let frozen = match eval_frozen(module, deps, &facts, limits, file) {
            Ok((frozen, _)) => frozen,
            Err(e) => {
                results.push(TestResult {
                    file: file.to_string(),
                    name: "(load)".into(),
                    ok: false,
                    error: Some(e.to_string()),
                });
                continue;
            }
        };
        let mut names: Vec<String> = frozen
            .names()
            .map(|n| n.as_str().to_string())
            .filter(|n| n.starts_with("test_"))
            .collect();
        names.sort();
        for name in names {
            let ctx = new_ctx(module, &facts, limits);
            let loader = new_loader(module, deps, &ctx);
            let env = Env::new();
            let outcome = (|| -> Result<()> {
                let f = frozen
                    .get_option(&name)
                    .map_err(starlark_error)?
                    .ok_or_else(|| Error::Internal(name.clone()))?;
                let mut eval = Evaluator::new(&env);
                prepare(&mut eval, &ctx, &loader)?;
                let f = f.owned_value(env.frozen_heap());
                eval.eval_function(f, &[], &[]).map_err(starlark_error)?;
                Ok(())
            })();
            results.push(TestResult {
                file: file.to_string(),
                name,
                ok: outcome.is_ok(),
                error: outcome.err().map(|e| e.to_string()),
            });
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(main: &str) -> Module {
        let mut files = BTreeMap::new();
        files.insert(
            "module.yaml".to_string(),
            b"name: t\nversion: 1.0.0\nexports:\n  f: {}\n".to_vec(),
        );
        files.insert("main.star".to_string(), main.as_bytes().to_vec());
        Module::from_files(files).unwrap()
    }

    #[test]
    fn resources_and_logs() {
        let m = module("def f():\n    log('hi', 1)\n    assert_eq(list(range(3)), [0, 1, 2])\n    assert_eq(list(range(1, 7, 2)), [1, 3, 5])\n    return [file('/tmp/x', content = 'a'), package('nginx')]\n");
        let run = call(
            &m,
            &BTreeMap::new(),
            "f",
            &BTreeMap::new(),
            &crate::facts::collect(),
            Limits::default(),
        )
        .unwrap();
        assert_eq!(run.resources.len(), 2);
        assert_eq!(run.logs, vec!["hi 1".to_string()]);
    }

    #[test]
    fn facts_are_the_agents_and_the_old_names_still_read() {
        let m = module("def f():\n    log(json.encode(facts()))\n");
        let facts = crate::facts::collect();
        let run = call(
            &m,
            &BTreeMap::new(),
            "f",
            &BTreeMap::new(),
            &facts,
            Limits::default(),
        )
        .unwrap();
        let seen: serde_json::Value = serde_json::from_str(&run.logs[0]).unwrap();
        for name in crate::facts::NAMES {
            assert_eq!(seen[name], facts[*name], "{name}");
        }
        // The names modules had before facts: hostname, os, arch, family, kernel, cpus.
        assert_eq!(seen["family"], "unix");
        for name in ["hostname", "os", "arch", "kernel", "cpus"] {
            assert!(!seen[name].is_null(), "{name}: {seen}");
        }
    }

    #[test]
    fn step_limit_stops_a_loop() {
        let m = module("def f():\n    for i in range(1000000000):\n        pass\n");
        let limits = Limits {
            max_steps: 10_000,
            ..Limits::default()
        };
        let error = call(
            &m,
            &BTreeMap::new(),
            "f",
            &BTreeMap::new(),
            &crate::facts::collect(),
            limits,
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("step limit of 10000 exceeded"),
            "{error}"
        );
    }

    #[test]
    fn memory_limit_stops_growth() {
        let m = module("def f():\n    x = []\n    for i in range(1000000000):\n        x.append('abcdefgh' * 100)\n");
        let limits = Limits {
            max_steps: u64::MAX,
            max_heap_bytes: 8 * 1024 * 1024,
        };
        let error = call(
            &m,
            &BTreeMap::new(),
            "f",
            &BTreeMap::new(),
            &crate::facts::collect(),
            limits,
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("memory limit of 8388608 bytes exceeded"),
            "{error}"
        );
    }

    #[test]
    fn bad_resource_is_refused() {
        let m = module("def f():\n    return [file('/tmp/x', colour = 'red')]\n");
        let error = call(
            &m,
            &BTreeMap::new(),
            "f",
            &BTreeMap::new(),
            &crate::facts::collect(),
            Limits::default(),
        )
        .unwrap_err();
        assert!(error.to_string().contains("colour"), "{error}");
    }
}
