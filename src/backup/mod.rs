//! Snapshots and backups (issue 13): the snapshot file format (`snapshot`), taking and
//! restoring one, and where snapshot files go when they leave the host (`s3`).

pub mod s3;
pub mod snapshot;
