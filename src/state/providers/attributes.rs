//! Mode, owner and group of files and directories: names resolved to ids on this host (the
//! agent's passwd and group databases, not the operator's), compared with what is on disk, and
//! set through an open descriptor rather than by path, so a path swapped for a symlink between
//! the check and the change cannot redirect a chmod or chown.

use std::ffi::CString;
use std::fs::{File, Metadata, Permissions};
use std::io;
use std::os::unix::fs::{fchown, MetadataExt, PermissionsExt};

use super::Planned;
use crate::state::validate;

/// A user or group as resolved here, with the text the resource gave for messages.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Account {
    pub id: u32,
    pub name: String,
}

/// What a resource wants of a path's metadata; `None` leaves that part alone.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Attributes {
    pub mode: Option<u32>,
    pub owner: Option<Account>,
    pub group: Option<Account>,
}

impl Attributes {
    /// `planned`: users and groups an earlier resource would create (check mode), which
    /// resolve to a placeholder id that differs from whatever is on disk.
    pub fn resolve(
        mode: Option<&str>,
        owner: Option<&str>,
        group: Option<&str>,
        planned: &Planned,
    ) -> Result<Self, String> {
        let planned_id = |name: &str, names: &std::collections::HashSet<String>| {
            names.contains(name).then(|| Account {
                id: u32::MAX,
                name: name.to_string(),
            })
        };
        Ok(Attributes {
            mode: mode.map(validate::parse_mode).transpose()?,
            owner: owner
                .map(|name| {
                    lookup(name, Database::Users)
                        .or_else(|e| planned_id(name, &planned.users).ok_or(e))
                })
                .transpose()?,
            group: group
                .map(|name| {
                    lookup(name, Database::Groups)
                        .or_else(|e| planned_id(name, &planned.groups).ok_or(e))
                })
                .transpose()?,
        })
    }

    /// These attributes, with what they leave alone taken from `current`: a replaced file keeps
    /// the mode and owner the resource does not manage.
    pub fn or_current(&self, current: &Metadata) -> Attributes {
        let keep = |id: u32| Account {
            id,
            name: id.to_string(),
        };
        Attributes {
            mode: Some(self.mode.unwrap_or(current.mode() & 0o7777)),
            owner: Some(self.owner.clone().unwrap_or_else(|| keep(current.uid()))),
            group: Some(self.group.clone().unwrap_or_else(|| keep(current.gid()))),
        }
    }

    /// What differs, for people: "mode 0600 -> 0644", "owner 0 -> www-data".
    pub fn differences(&self, current: &Metadata) -> Vec<String> {
        let mut differences = Vec::new();
        if let Some(mode) = self.mode {
            let current_mode = current.mode() & 0o7777;
            if current_mode != mode {
                differences.push(format!(
                    "mode {} -> {}",
                    validate::format_mode(current_mode),
                    validate::format_mode(mode)
                ));
            }
        }
        for (what, wanted, current_id) in [
            ("owner", &self.owner, current.uid()),
            ("group", &self.group, current.gid()),
        ] {
            if let Some(account) = wanted {
                if account.id != current_id {
                    differences.push(format!("{what} {current_id} -> {}", account.name));
                }
            }
        }
        differences
    }

    /// Sets what differs from `current` (the metadata of `file`).
    pub fn apply(&self, file: &File, current: &Metadata) -> io::Result<()> {
        let uid = self
            .owner
            .as_ref()
            .map(|a| a.id)
            .filter(|&id| id != current.uid());
        let gid = self
            .group
            .as_ref()
            .map(|a| a.id)
            .filter(|&id| id != current.gid());
        let is_chowned = uid.is_some() || gid.is_some();
        if is_chowned {
            fchown(file, uid, gid)?;
        }
        // After the chown, which clears setuid and setgid bits even for root.
        if let Some(mode) = self.mode {
            if is_chowned || current.mode() & 0o7777 != mode {
                file.set_permissions(Permissions::from_mode(mode))?;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Database {
    Users,
    Groups,
}

/// A name or a numeric id (used as is, like chown does, even if no entry has it).
fn lookup(name: &str, database: Database) -> Result<Account, String> {
    let account = |id| Account {
        id,
        name: name.to_string(),
    };
    if !name.is_empty() && name.bytes().all(|byte| byte.is_ascii_digit()) {
        return name
            .parse()
            .map(account)
            .map_err(|_| format!("id {name} is out of range"));
    }
    let (what, id) = match database {
        Database::Users => ("user", user_id(name)),
        Database::Groups => ("group", group_id(name)),
    };
    match id {
        Ok(Some(id)) => Ok(account(id)),
        Ok(None) => Err(format!("unknown {what} '{name}' on this host")),
        Err(error) => Err(format!("looking up {what} '{name}': {error}")),
    }
}

/// The reentrant libc lookups need a caller buffer; this grows it until the entry fits.
fn with_buffer<T>(
    mut call: impl FnMut(&mut [u8]) -> Result<Option<T>, i32>,
) -> io::Result<Option<T>> {
    let mut buffer = vec![0u8; 1024];
    loop {
        match call(&mut buffer) {
            Ok(found) => return Ok(found),
            Err(libc::ERANGE) if buffer.len() < 1 << 20 => buffer.resize(buffer.len() * 2, 0),
            Err(code) => return Err(io::Error::from_raw_os_error(code)),
        }
    }
}

fn c_name(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains NUL"))
}

pub(super) fn user_id(name: &str) -> io::Result<Option<u32>> {
    let name = c_name(name)?;
    with_buffer(|buffer| {
        // SAFETY: all-zero is a valid passwd (null pointers, zero ids); getpwnam_r only writes
        // into it and into `buffer`, whose length it is given.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; `name` is NUL-terminated.
        let code = unsafe {
            libc::getpwnam_r(
                name.as_ptr(),
                &mut entry,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                &mut result,
            )
        };
        match code {
            0 if result.is_null() => Ok(None),
            0 => Ok(Some(entry.pw_uid)),
            code => Err(code),
        }
    })
}

fn group_id(name: &str) -> io::Result<Option<u32>> {
    let name = c_name(name)?;
    with_buffer(|buffer| {
        // SAFETY: as in user_id, for struct group and getgrnam_r.
        let mut entry: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; `name` is NUL-terminated.
        let code = unsafe {
            libc::getgrnam_r(
                name.as_ptr(),
                &mut entry,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                &mut result,
            )
        };
        match code {
            0 if result.is_null() => Ok(None),
            0 => Ok(Some(entry.gr_gid)),
            code => Err(code),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_resolve() {
        let cases = [
            ("0", Database::Users, Ok(0)),
            ("1000", Database::Groups, Ok(1000)),
            ("root", Database::Users, Ok(0)),
            ("root", Database::Groups, Ok(0)),
            (
                "no-such-user-svc",
                Database::Users,
                Err("unknown user 'no-such-user-svc' on this host".to_string()),
            ),
            (
                "no-such-group-svc",
                Database::Groups,
                Err("unknown group 'no-such-group-svc' on this host".to_string()),
            ),
        ];
        for (name, database, expected) in cases {
            assert_eq!(
                lookup(name, database).map(|account| account.id),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn differences_are_listed_for_people() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, Permissions::from_mode(0o600)).unwrap();
        let metadata = std::fs::metadata(&path).unwrap();
        let wanted = Attributes {
            mode: Some(0o644),
            owner: Some(Account {
                id: metadata.uid() + 1,
                name: "someone".into(),
            }),
            group: Some(Account {
                id: metadata.gid(),
                name: "same".into(),
            }),
        };
        assert_eq!(
            wanted.differences(&metadata),
            [
                "mode 0600 -> 0644".to_string(),
                format!("owner {} -> someone", metadata.uid())
            ]
        );
        assert_eq!(
            Attributes::default().differences(&metadata),
            Vec::<String>::new()
        );
    }
}
