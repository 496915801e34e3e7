//! Output formats (contract §1): aligned tables with a header row, or one JSON document.

use std::str::FromStr;

use serde::Serialize;

use super::CliError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

impl FromStr for Output {
    type Err = CliError;
    fn from_str(text: &str) -> Result<Self, CliError> {
        match text {
            "table" => Ok(Output::Table),
            "json" => Ok(Output::Json),
            other => Err(CliError::usage(format!(
                "unknown output format '{other}' (expected table or json)"
            ))),
        }
    }
}

/// Whether log lines on stderr may carry ANSI colours: only on a terminal, and not when
/// `NO_COLOR` is set to anything but the empty string (no-color.org). Logs written to a file,
/// a pipe or journald stay plain text.
pub fn stderr_colour() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::failed(format!("cannot format JSON: {e}")))?;
    println!("{text}");
    Ok(())
}

/// Formats rows under a header with columns padded to the widest cell.
pub fn format_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(width) = widths.get_mut(i) {
                *width = (*width).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count() + 2;
                text.push_str(cell);
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        text.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    print!("{}", format_table(headers, rows));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_alignment() {
        let rows = vec![
            vec!["1".to_string(), "long name".to_string(), "x".to_string()],
            vec!["22".to_string(), "n".to_string(), "".to_string()],
        ];
        assert_eq!(
            format_table(&["ID", "NAME", "ROLE"], &rows),
            "ID  NAME       ROLE\n1   long name  x\n22  n\n"
        );
    }
}
