//! The one template engine: minijinja as blueprints and state files use it. Leaf module: it
//! knows nothing of blueprints, plans or hosts, only how a template is set up and how its
//! errors read (`NAME line N: template: KIND: DETAIL`).
//!
//! Strict undefined (a missing name is an error, never an empty string), bounded work per
//! render (fuel), no auto-escaping (these are configuration files, not HTML), trailing newlines
//! kept, and no loader: a template can include nothing, and runs no code beyond minijinja's
//! expressions and filters.

/// Work one render may do: enough for any configuration file, and a bound on a template that
/// loops for ever or builds a huge output.
const FUEL: u64 = 1_000_000;

pub fn environment() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_keep_trailing_newline(true);
    env.set_fuel(Some(FUEL));
    env
}

/// Renders `text`, named `name` in errors.
pub fn render(
    env: &minijinja::Environment<'static>,
    name: &str,
    text: &str,
    context: &minijinja::Value,
) -> Result<String, String> {
    env.render_named_str(name, text, context)
        .map_err(|e| error_message(name, &e))
}

/// Checks that `text` parses, without rendering it (the names it uses are known only where it
/// is rendered).
pub fn check_syntax(
    env: &minijinja::Environment<'static>,
    name: &str,
    text: &str,
) -> Result<(), String> {
    env.template_from_named_str(name, text)
        .map(|_| ())
        .map_err(|e| error_message(name, &e))
}

/// `NAME line N: template: KIND: DETAIL`: the file and line an operator fixes.
pub fn error_message(name: &str, e: &minijinja::Error) -> String {
    let line = e.line().map(|l| format!(" line {l}")).unwrap_or_default();
    let detail = e.detail().map(|d| format!(": {d}")).unwrap_or_default();
    format!("{name}{line}: template: {}{detail}", e.kind())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undefined_names_and_syntax_errors_name_the_file_and_line() {
        let env = environment();
        let context = minijinja::context! { port => 80 };
        assert_eq!(
            render(&env, "a.conf", "listen {{ port }}\n", &context).unwrap(),
            "listen 80\n"
        );
        let undefined = render(&env, "a.conf", "x\nlisten {{ host }}\n", &context).unwrap_err();
        assert!(
            undefined.starts_with("a.conf line 2: template: undefined value"),
            "{undefined}"
        );
        let syntax = check_syntax(&env, "b.conf", "a\nb\n{% if %}\n").unwrap_err();
        assert!(
            syntax.starts_with("b.conf line 3: template: syntax error"),
            "{syntax}"
        );
        let endless = render(
            &env,
            "c",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            &context,
        )
        .unwrap_err();
        assert!(endless.contains("fuel"), "{endless}");
    }
}
