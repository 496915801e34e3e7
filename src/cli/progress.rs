//! A progress bar on stderr for long CLI operations (contract §1: on a terminal only).
//!
//! On a terminal one line is redrawn in place (carriage return, then erase to the end of the
//! line), at most ten times a second so drawing never costs more than the work. Elsewhere (a
//! pipe, a file, journald) nothing is drawn; `line` still prints whole lines there, so logs
//! get one line per finished step instead of a stream of redraws.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const REDRAW_EVERY: Duration = Duration::from_millis(100);
const WIDTH: usize = 30;

pub struct Bar {
    is_terminal: bool,
    label: String,
    /// Units done before this step started (shown as done, not counted in the rate).
    before: u64,
    done: u64,
    total: u64,
    started: Instant,
    drawn_at: Option<Instant>,
    /// Whether a bar is on screen (to be erased before a line is printed).
    is_shown: bool,
    /// Counts bytes (with a rate in MB/s and an ETA) rather than rows.
    is_bytes: bool,
}

impl Bar {
    /// A bar on stderr, drawn only when stderr is a terminal.
    pub fn stderr() -> Bar {
        Bar {
            is_terminal: std::io::stderr().is_terminal(),
            label: String::new(),
            before: 0,
            done: 0,
            total: 0,
            started: Instant::now(),
            drawn_at: None,
            is_shown: false,
            is_bytes: false,
        }
    }

    /// A bar counting bytes: done/total, MB/s and the time left (file transfers).
    pub fn bytes(mut self) -> Bar {
        self.is_bytes = true;
        self
    }

    pub fn is_terminal(&self) -> bool {
        self.is_terminal
    }

    /// Starts a step: `before` of `total` units are already done.
    pub fn start(&mut self, label: &str, before: u64, total: u64) {
        self.label = label.to_string();
        self.before = before;
        self.done = 0;
        self.total = total;
        self.started = Instant::now();
        self.drawn_at = None;
        self.draw();
    }

    /// `done` units of this step are done; redraws when it is time to.
    pub fn set(&mut self, done: u64) {
        self.done = done;
        if self
            .drawn_at
            .is_none_or(|drawn| drawn.elapsed() >= REDRAW_EVERY)
        {
            self.draw();
        }
    }

    /// Draws the step's final state (however recently the bar was drawn).
    pub fn finish_step(&mut self) {
        self.draw();
    }

    /// Prints a whole line (the bar, if shown, is erased first and redrawn by the next step).
    pub fn line(&mut self, text: &str) {
        self.clear();
        eprintln!("{text}");
    }

    /// Erases the bar.
    pub fn clear(&mut self) {
        if self.is_shown {
            eprint!("\r\x1b[K");
            let _ = std::io::stderr().flush();
            self.is_shown = false;
        }
    }

    fn draw(&mut self) {
        if !self.is_terminal {
            return;
        }
        self.drawn_at = Some(Instant::now());
        let seconds = self.started.elapsed().as_secs_f64();
        let rate = if seconds > 0.0 {
            self.done as f64 / seconds
        } else {
            0.0
        };
        let text = if self.is_bytes {
            render_bytes(&self.label, self.before + self.done, self.total, rate)
        } else {
            render(&self.label, self.before + self.done, self.total, rate)
        };
        eprint!("\r{text}\x1b[K");
        let _ = std::io::stderr().flush();
        self.is_shown = true;
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.clear();
    }
}

/// `label  [#####-----]  done/total rows  rate rows/s`
fn render(label: &str, done: u64, total: u64, rate: f64) -> String {
    let filled = if total == 0 {
        WIDTH
    } else {
        ((done.min(total) as f64 / total as f64) * WIDTH as f64).round() as usize
    };
    format!(
        "{label:<22} [{}{}] {done}/{total} rows  {:.0} rows/s",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        rate
    )
}

fn filled(done: u64, total: u64) -> usize {
    if total == 0 {
        WIDTH
    } else {
        ((done.min(total) as f64 / total as f64) * WIDTH as f64).round() as usize
    }
}

/// `label  [#####-----]  12.0/100.0 MB  250.1 MB/s  ETA 1s`
fn render_bytes(label: &str, done: u64, total: u64, rate: f64) -> String {
    let filled = filled(done, total);
    let megabytes = |bytes: u64| bytes as f64 / 1_000_000.0;
    let eta = if rate > 0.0 {
        format!("{:.0}s", total.saturating_sub(done) as f64 / rate)
    } else {
        "-".into()
    };
    format!(
        "{label:<22} [{}{}] {:.1}/{:.1} MB  {:.1} MB/s  ETA {eta}",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        megabytes(done),
        megabytes(total),
        rate / 1_000_000.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_rendering() {
        let cases = [
            (0, 10, "[------------------------------] 0/10 rows"),
            (5, 10, "[###############---------------] 5/10 rows"),
            (10, 10, "[##############################] 10/10 rows"),
            (0, 0, "[##############################] 0/0 rows"),
        ];
        for (done, total, expected) in cases {
            let text = render("t", done, total, 12.4);
            assert!(text.contains(expected), "{text}");
            assert!(text.ends_with("12 rows/s"), "{text}");
        }
        let text = render_bytes("put", 5_000_000, 10_000_000, 2_500_000.0);
        assert!(text.contains("5.0/10.0 MB  2.5 MB/s  ETA 2s"), "{text}");
    }
}
