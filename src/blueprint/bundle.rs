//! Blueprint bundles: a reproducible `.tar.gz` of a blueprint with a manifest.
//!
//! The same files give the same bytes: entries sorted by path (`MANIFEST.json` first), every
//! mtime 0, uid/gid 0 and no user names, mode 0644, GNU headers, and a gzip header with no
//! name and mtime 0 at a fixed compression level. `MANIFEST.json` lists each file's size and
//! SHA-256; reading a bundle checks them, the paths, and the size caps of a blueprint.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{check_relative, Blueprint, MAX_TOTAL_BYTES};
use crate::{Error, Result};

pub const BUNDLE_MANIFEST: &str = "MANIFEST.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BundleManifest {
    pub format: u32,
    pub name: String,
    pub version: String,
    pub files: Vec<BundleFile>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BundleFile {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The bundle of `blueprint`, as bytes.
pub fn write(blueprint: &Blueprint) -> Result<Vec<u8>> {
    let manifest = BundleManifest {
        format: 1,
        name: blueprint.manifest.name.clone(),
        version: blueprint.manifest.version.clone(),
        files: blueprint
            .files
            .iter()
            .map(|(path, bytes)| BundleFile {
                path: path.clone(),
                size: bytes.len() as u64,
                sha256: sha256_hex(bytes),
            })
            .collect(),
    };
    let manifest_bytes = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| Error::Internal(format!("bundle manifest: {e}")))?;
    let gzip = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::new(6));
    let mut tar = tar::Builder::new(gzip);
    tar.mode(tar::HeaderMode::Deterministic);
    let mut append = |path: &str, bytes: &[u8]| -> Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        tar.append_data(&mut header, path, bytes)
            .map_err(|e| Error::Internal(format!("bundle: {path}: {e}")))
    };
    append(BUNDLE_MANIFEST, &manifest_bytes)?;
    // BTreeMap iterates in byte order of the paths: sorted entries.
    for (path, bytes) in &blueprint.files {
        append(path, bytes)?;
    }
    let gzip = tar
        .into_inner()
        .map_err(|e| Error::Internal(format!("bundle: {e}")))?;
    let mut bytes = gzip
        .finish()
        .map_err(|e| Error::Internal(format!("bundle: {e}")))?;
    bytes.flush().ok();
    Ok(bytes)
}

/// Reads and checks a bundle.
pub fn read(bytes: &[u8]) -> Result<Blueprint> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let mut files = BTreeMap::new();
    let mut manifest: Option<BundleManifest> = None;
    let mut total = 0usize;
    let entries = archive
        .entries()
        .map_err(|e| Error::Invalid(format!("not a blueprint bundle: {e}")))?;
    for entry in entries {
        let mut entry =
            entry.map_err(|e| Error::Invalid(format!("not a blueprint bundle: {e}")))?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(Error::Invalid(
                "a blueprint bundle holds regular files only".into(),
            ));
        }
        let path = entry
            .path()
            .ok()
            .and_then(|p| p.to_str().map(str::to_string))
            .ok_or_else(|| Error::Invalid("bundle entry name is not UTF-8".into()))?;
        check_relative(&path)?;
        let size = entry.header().size().unwrap_or(u64::MAX);
        total = total.saturating_add(size as usize);
        if total > MAX_TOTAL_BYTES + 1024 * 1024 {
            return Err(Error::Invalid("the bundle is too large".into()));
        }
        let mut data = Vec::with_capacity(size as usize);
        entry
            .read_to_end(&mut data)
            .map_err(|e| Error::Invalid(format!("bundle: {path}: {e}")))?;
        if path == BUNDLE_MANIFEST {
            manifest = Some(
                serde_json::from_slice(&data)
                    .map_err(|e| Error::Invalid(format!("bundle {BUNDLE_MANIFEST}: {e}")))?,
            );
        } else if files.insert(path.clone(), data).is_some() {
            return Err(Error::Invalid(format!("bundle: {path} appears twice")));
        }
    }
    let Some(manifest) = manifest else {
        return Err(Error::Invalid(format!(
            "not a blueprint bundle: no {BUNDLE_MANIFEST}"
        )));
    };
    if manifest.files.len() != files.len() {
        return Err(Error::Invalid(format!(
            "bundle {BUNDLE_MANIFEST} lists {} files, the bundle holds {}",
            manifest.files.len(),
            files.len()
        )));
    }
    for listed in &manifest.files {
        let Some(data) = files.get(&listed.path) else {
            return Err(Error::Invalid(format!(
                "bundle: {} is listed but missing",
                listed.path
            )));
        };
        if sha256_hex(data) != listed.sha256 || data.len() as u64 != listed.size {
            return Err(Error::Invalid(format!(
                "bundle: {} does not match its SHA-256 in {BUNDLE_MANIFEST}",
                listed.path
            )));
        }
    }
    let blueprint = Blueprint::from_files(files)?;
    if blueprint.manifest.name != manifest.name || blueprint.manifest.version != manifest.version {
        return Err(Error::Invalid(format!(
            "bundle {BUNDLE_MANIFEST} names {}@{}, blueprint.yaml {}@{}",
            manifest.name, manifest.version, blueprint.manifest.name, blueprint.manifest.version
        )));
    }
    Ok(blueprint)
}

/// Whether `bytes` start like gzip (a bundle) rather than anything else.
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0x1f, 0x8b])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_input_same_bytes_and_round_trip() {
        let mut files = BTreeMap::new();
        files.insert(
            "blueprint.yaml".to_string(),
            b"name: a\nversion: 1.0.0\n".to_vec(),
        );
        files.insert("states/z.yaml".to_string(), b"[]\n".to_vec());
        files.insert("files/b".to_string(), vec![0, 1, 2]);
        let blueprint = Blueprint::from_files(files).unwrap();
        let one = write(&blueprint).unwrap();
        let two = write(&blueprint).unwrap();
        assert_eq!(sha256_hex(&one), sha256_hex(&two));
        assert!(is_gzip(&one));
        assert_eq!(read(&one).unwrap(), blueprint);
        assert!(read(b"not a bundle").is_err());
    }
}
