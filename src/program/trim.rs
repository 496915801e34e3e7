//! A daemon's resident code kept to what it runs.
//!
//! svc is one executable and each daemon runs a small part of it. An idle agent measured
//! 14.3 MiB RSS, of which 1.6 MiB was its own memory and the rest pages of the executable
//! and of libc mapped into it: the kernel maps the 64 KiB around every page fault
//! (fault-around), and the start (configuration, argument parsing, TLS set-up, the first
//! connection) touches code that an idle or working agent never runs again. So once the agent
//! has settled (at the start, and whenever its last running job has ended; the server once,
//! after its start) it unmaps the pages
//! of its clean, read-only file mappings (`madvise(MADV_DONTNEED)`); what it runs next is
//! mapped again from the page cache by a minor fault. The page cache keeps those pages
//! whatever the agent does (shared with any other process of the same file, and the first
//! thing the kernel reclaims), so this changes what the agent holds, not what the host caches.
//!
//! Only mappings that are private, not writable and hold no page of their own (`Anonymous:
//! 0 kB` in smaps: no copy-on-write page, such as the relocated data of RELRO) are touched:
//! dropping their pages loses nothing, since every one of them is the file's.

use std::time::Duration;

/// How long the agent must have had nothing running before its code is trimmed.
pub const SETTLE: Duration = Duration::from_secs(1);

/// Unmaps the pages of every clean read-only file mapping of this process; returns the bytes
/// of the mappings it was applied to (not what was resident in them). Linux only; elsewhere,
/// or when /proc cannot be read, it does nothing.
pub fn release_code_pages() -> usize {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let mut released = 0;
    for mapping in clean_file_mappings(&smaps) {
        // SAFETY: the range is a whole mapping of this process that is private, read-only and
        // holds no anonymous (copy-on-write) page, so every page in it is the file's own and
        // MADV_DONTNEED only drops page-table entries; the next access maps the same bytes
        // from the page cache again. No Rust object lives in such a mapping as a mutable value.
        let done = unsafe {
            libc::madvise(
                mapping.start as *mut libc::c_void,
                mapping.end - mapping.start,
                libc::MADV_DONTNEED,
            )
        };
        if done == 0 {
            released += mapping.end - mapping.start;
        }
    }
    released
}

#[derive(Debug, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
}

/// The mappings of `smaps` (the text of /proc/PID/smaps) backed by a file (a path), private,
/// not writable, with no anonymous page.
fn clean_file_mappings(smaps: &str) -> Vec<Mapping> {
    let mut found = Vec::new();
    let mut current: Option<(Mapping, bool)> = None;
    for line in smaps.lines() {
        if let Some(header) = mapping_header(line) {
            if let Some((mapping, true)) = current.take() {
                found.push(mapping);
            }
            current = Some(header);
        } else if let Some(kib) = line.strip_prefix("Anonymous:") {
            if kib.trim().trim_end_matches("kB").trim() != "0" {
                if let Some((_, eligible)) = current.as_mut() {
                    *eligible = false;
                }
            }
        }
    }
    if let Some((mapping, true)) = current {
        found.push(mapping);
    }
    found
}

/// `start-end perms offset dev inode [path]`: the range, and whether its kind qualifies
/// (a file path, `r` without `w`, private).
fn mapping_header(line: &str) -> Option<(Mapping, bool)> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?.as_bytes();
    if perms.len() != 4 {
        return None;
    }
    let path = fields.nth(3);
    let eligible = perms[0] == b'r'
        && perms[1] == b'-'
        && perms[3] == b'p'
        && path.is_some_and(|p| p.starts_with('/'));
    Some((Mapping { start, end }, eligible))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_clean_private_read_only_file_mappings_are_chosen() {
        let smaps = "\
55d0a0000000-55d0a0100000 r--p 00000000 fd:01 123 /usr/bin/svc
Size:               1024 kB
Anonymous:             0 kB
55d0a0100000-55d0a0900000 r-xp 00100000 fd:01 123 /usr/bin/svc
Anonymous:             0 kB
55d0a0900000-55d0a0a00000 r--p 00900000 fd:01 123 /usr/bin/svc
Anonymous:           812 kB
55d0a0a00000-55d0a0a10000 rw-p 00a00000 fd:01 123 /usr/bin/svc
Anonymous:            64 kB
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
Anonymous:           100 kB
7f0000200000-7f0000300000 r-xs 00000000 fd:01 77 /dev/shm/shared
Anonymous:             0 kB
7fff00000000-7fff00002000 r-xp 00000000 00:00 0                          [vdso]
Anonymous:             0 kB
7f0000400000-7f0000500000 r-xp 00028000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
";
        assert_eq!(
            clean_file_mappings(smaps),
            [
                Mapping {
                    start: 0x55d0a0000000,
                    end: 0x55d0a0100000
                },
                Mapping {
                    start: 0x55d0a0100000,
                    end: 0x55d0a0900000
                },
                Mapping {
                    start: 0x7f0000400000,
                    end: 0x7f0000500000
                },
            ]
        );
    }

    #[test]
    fn this_process_keeps_running_after_its_code_is_released() {
        let released = release_code_pages();
        assert!(released > 0, "no clean mapping found in this test binary");
        // The code this test runs next comes back from the page cache.
        let text: String = (0..1000).map(|n| n.to_string()).collect();
        assert!(text.len() > 1000);
        assert!(release_code_pages() > 0);
    }
}
