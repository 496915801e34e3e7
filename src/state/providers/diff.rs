//! Unified diffs of a file's content for `svcctl state check --diff`.
//!
//! Line-based: the common head and tail are cut first, and the middle is aligned by a longest
//! common subsequence when it is small enough (configuration files are), or shown as replaced
//! whole when it is not, so a diff never costs more than a bounded amount of work. Secret
//! values are replaced before anything is compared, so a diff never carries one; a file that
//! is not UTF-8 text is a one-line summary.

/// Lines of context around each change, as `diff -u` gives.
const CONTEXT: usize = 3;

/// The largest middle (old lines × new lines) aligned line by line; past it the middle is
/// shown as removed and added whole.
const MAX_CELLS: usize = 4_000_000;

/// A diff's text is cut past this, so that a result still fits in one bus message.
const MAX_DIFF_BYTES: usize = 16 * 1024;

/// Files larger than this are summarised, not diffed.
pub(super) const MAX_FILE_BYTES: usize = 1024 * 1024;

/// Where a diff goes, and what it must not show.
pub(super) struct Request<'a> {
    pub secrets: &'a [String],
    pub slot: &'a mut Option<String>,
}

impl Request<'_> {
    /// Puts the diff from `old` (None: no file yet) to `new` for `path` in the slot.
    pub fn put(self, path: &str, old: Option<&[u8]>, new: &[u8]) {
        *self.slot = Some(unified(path, old, new, self.secrets));
    }

    /// Puts a one-line summary instead of a diff.
    pub fn summary(self, text: String) {
        *self.slot = Some(text);
    }
}

/// `--- path` / `+++ path` and `@@` hunks, or a summary for binary or large files.
pub(super) fn unified(path: &str, old: Option<&[u8]>, new: &[u8], secrets: &[String]) -> String {
    let old_bytes = old.unwrap_or_default();
    if old_bytes.len() > MAX_FILE_BYTES || new.len() > MAX_FILE_BYTES {
        return format!(
            "file too large to diff ({} -> {} bytes)",
            old_bytes.len(),
            new.len()
        );
    }
    let (Ok(old_text), Ok(new_text)) = (std::str::from_utf8(old_bytes), std::str::from_utf8(new))
    else {
        return format!(
            "binary file differs ({} -> {} bytes)",
            old_bytes.len(),
            new.len()
        );
    };
    let old_text = redact(old_text, secrets);
    let new_text = redact(new_text, secrets);
    let old_lines: Vec<&str> = old_text.split_inclusive('\n').collect();
    let new_lines: Vec<&str> = new_text.split_inclusive('\n').collect();
    let ops = align(&old_lines, &new_lines);
    let mut out = format!(
        "--- {}\n+++ {path}\n",
        if old.is_some() { path } else { "/dev/null" }
    );
    for hunk in hunks(&ops) {
        write_hunk(&mut out, &ops[hunk.0..hunk.1], &old_lines, &new_lines);
        if out.len() > MAX_DIFF_BYTES {
            let mut cut = MAX_DIFF_BYTES;
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
            out.push_str("\n... diff cut at 16 KiB\n");
            break;
        }
    }
    out
}

fn redact(text: &str, secrets: &[String]) -> String {
    secrets.iter().fold(text.to_string(), |text, secret| {
        text.replace(secret.as_str(), "<redacted>")
    })
}

/// One step of the alignment: a line kept (old index, new index), removed or added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Keep(usize, usize),
    Remove(usize),
    Add(usize),
}

fn align(old: &[&str], new: &[&str]) -> Vec<Op> {
    let head = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let tail = old[head..]
        .iter()
        .rev()
        .zip(new[head..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let (old_mid, new_mid) = (&old[head..old.len() - tail], &new[head..new.len() - tail]);
    let mut ops: Vec<Op> = (0..head).map(|i| Op::Keep(i, i)).collect();
    if old_mid.len().saturating_mul(new_mid.len()) <= MAX_CELLS {
        ops.extend(lcs(old_mid, new_mid).into_iter().map(|op| match op {
            Op::Keep(a, b) => Op::Keep(a + head, b + head),
            Op::Remove(a) => Op::Remove(a + head),
            Op::Add(b) => Op::Add(b + head),
        }));
    } else {
        ops.extend((0..old_mid.len()).map(|a| Op::Remove(a + head)));
        ops.extend((0..new_mid.len()).map(|b| Op::Add(b + head)));
    }
    let (old_tail, new_tail) = (old.len() - tail, new.len() - tail);
    ops.extend((0..tail).map(|i| Op::Keep(old_tail + i, new_tail + i)));
    ops
}

/// The classic dynamic programme, on the middle only: lengths of common subsequences of the
/// suffixes, then one walk from the start that prefers removals before additions.
fn lcs(old: &[&str], new: &[&str]) -> Vec<Op> {
    let (n, m) = (old.len(), new.len());
    let mut table = vec![0u32; (n + 1) * (m + 1)];
    let at = |i: usize, j: usize| i * (m + 1) + j;
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            table[at(i, j)] = if old[i] == new[j] {
                table[at(i + 1, j + 1)] + 1
            } else {
                table[at(i + 1, j)].max(table[at(i, j + 1)])
            };
        }
    }
    let (mut i, mut j, mut ops) = (0, 0, Vec::with_capacity(n + m));
    while i < n || j < m {
        if i < n && j < m && old[i] == new[j] {
            ops.push(Op::Keep(i, j));
            i += 1;
            j += 1;
        } else if i < n && (j == m || table[at(i + 1, j)] >= table[at(i, j + 1)]) {
            ops.push(Op::Remove(i));
            i += 1;
        } else {
            ops.push(Op::Add(j));
            j += 1;
        }
    }
    ops
}

/// Ranges of `ops` that make one hunk each: the changes with up to CONTEXT kept lines around
/// them, joined when their context touches.
fn hunks(ops: &[Op]) -> Vec<(usize, usize)> {
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        if matches!(op, Op::Keep(..)) {
            continue;
        }
        let start = index.saturating_sub(CONTEXT);
        let end = (index + 1 + CONTEXT).min(ops.len());
        match hunks.last_mut() {
            Some(last) if start <= last.1 => last.1 = end,
            _ => hunks.push((start, end)),
        }
    }
    hunks
}

fn write_hunk(out: &mut String, ops: &[Op], old: &[&str], new: &[&str]) {
    let old_start = ops.iter().find_map(|op| match op {
        Op::Keep(a, _) | Op::Remove(a) => Some(*a),
        Op::Add(_) => None,
    });
    let new_start = ops.iter().find_map(|op| match op {
        Op::Keep(_, b) | Op::Add(b) => Some(*b),
        Op::Remove(_) => None,
    });
    let old_count = ops.iter().filter(|op| !matches!(op, Op::Add(_))).count();
    let new_count = ops.iter().filter(|op| !matches!(op, Op::Remove(_))).count();
    // diff -u numbers an empty side by the line before it.
    let position = |start: Option<usize>, count: usize| match (start, count) {
        (_, 0) => format!("{},0", start.unwrap_or(0)),
        (Some(start), count) => format!("{},{count}", start + 1),
        (None, count) => format!("1,{count}"),
    };
    out.push_str(&format!(
        "@@ -{} +{} @@\n",
        position(old_start, old_count),
        position(new_start, new_count)
    ));
    for op in ops {
        let (sign, line) = match *op {
            Op::Keep(a, _) => (' ', old[a]),
            Op::Remove(a) => ('-', old[a]),
            Op::Add(b) => ('+', new[b]),
        };
        out.push(sign);
        out.push_str(line);
        if !line.ends_with('\n') {
            out.push_str("\n\\ No newline at end of file\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_line_is_one_hunk_with_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nd\nE\nf\ng\nh\n";
        assert_eq!(
            unified("/etc/x", Some(old.as_bytes()), new.as_bytes(), &[]),
            "--- /etc/x\n+++ /etc/x\n@@ -2,7 +2,7 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n"
        );
    }

    #[test]
    fn new_files_secrets_and_binaries() {
        assert_eq!(
            unified("/n", None, b"one\ntwo", &[]),
            "--- /dev/null\n+++ /n\n@@ -0,0 +1,2 @@\n+one\n+two\n\\ No newline at end of file\n"
        );
        let diff = unified(
            "/s",
            Some(b"password = old\n"),
            b"password = hunter2\n",
            &["hunter2".to_string()],
        );
        assert!(diff.contains("+password = <redacted>\n"), "{diff}");
        assert!(!diff.contains("hunter2"), "{diff}");
        assert_eq!(
            unified("/b", Some(&[0xff, 0]), &[1, 2, 3], &[]),
            "binary file differs (2 -> 3 bytes)"
        );
    }

    #[test]
    fn distant_changes_are_separate_hunks() {
        let old: String = (0..20).map(|i| format!("{i}\n")).collect();
        let new = old.replace("2\n", "two\n").replace("17\n", "seventeen\n");
        let diff = unified("/f", Some(old.as_bytes()), new.as_bytes(), &[]);
        assert_eq!(diff.matches("@@ -").count(), 2, "{diff}");
        assert!(
            diff.contains("-2\n+two\n") && diff.contains("-17\n+seventeen\n"),
            "{diff}"
        );
    }
}
